"""Issue 27 item 5: an Execution Trace alone in trace mode is an input error, and `{rank}` patterns
given to `replay --et` number the ranks exactly as `convert` does."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.inputs import load_graphs
from lumos_sim.replay_run import run_replay

ROOT = Path(__file__).resolve().parents[1]
CPU_DDP = ROOT / "tests" / "data" / "cpu_ddp"
ET_PATTERN = str(CPU_DDP / "host.{rank}.json.gz")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumos_sim", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_et_without_durations_in_trace_mode_is_a_one_line_error_with_exit_2():
    p = _cli("replay", "--et", str(CPU_DDP / "host.0.json.gz"))
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert "no durations" in lines[0] and "--kineto" in lines[0] and "--timing model" in lines[0]
    assert "Traceback" not in p.stderr


def test_run_replay_refuses_an_et_only_graph_in_trace_mode():
    graphs = load_graphs([], et_pattern=str(CPU_DDP / "host.0.json.gz"))
    with pytest.raises(TraceInputError, match="no durations"):
        run_replay(graphs, "trace")


def test_replay_et_rank_pattern_keeps_the_ranks_apart_like_convert(tmp_path):
    # the gloo ET names no rank in its content: only the {rank} position tells 0 from 1
    graphs = load_graphs([], et_pattern=ET_PATTERN)
    assert [g.rank for g in graphs] == [0, 1]
    from chakra_schema.pytorch.converter import convert
    summaries = convert(ET_PATTERN, None, tmp_path / "job")
    assert [s["rank"] for s in summaries] == [0, 1]
    assert [s["nodes"] for s in summaries] == [len(g) for g in graphs]


def test_replay_with_an_et_rank_pattern_as_positional_input_keeps_ranks_apart():
    graphs = load_graphs([ET_PATTERN])
    assert [g.rank for g in graphs] == [0, 1]
    assert all(g.world_size == 2 for g in graphs)
