"""`lumos-sim convert`: {rank} patterns with wildcards over a 2-rank set, --json output, and bad input
ending in exit 2 with one stderr line naming the file and no output left behind."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.pytorch.converter import discover_inputs
from conftest import DATA, ROOT, require_shared
from lumos_sim.cli import main
from wire_decoder import decode_et

CPU_DDP = DATA / "cpu_ddp"


def _two_rank_set(tmp_path):
    """tests/data/cpu_ddp (real 2-rank gloo DDP, ET + Kineto with Record function ids) when present,
    else the shared simple_add pair copied under two rank names."""
    if (CPU_DDP / "host.1.json.gz").exists() and (CPU_DDP / "device.1.json.gz").exists():
        return str(CPU_DDP / "host.{rank}.json*"), str(CPU_DDP / "device.{rank}.*gz"), "rf_id"
    src = tmp_path / "in"
    src.mkdir()
    for r in (0, 1):
        shutil.copy(require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz"),
                    src / f"host.{r}.json.gz")
        shutil.copy(require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz"),
                    src / f"device.{r}.json.gz")
    return str(src / "host.{rank}.json*"), str(src / "device.{rank}.*gz"), "name_sequence"


def _run(argv, capsys):
    rc = main(["convert", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_rank_pattern_with_wildcard_json(tmp_path, capsys):
    et_pat, k_pat, key = _two_rank_set(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, out, err = _run(["--et", et_pat, "--kineto", k_pat, "-o", str(out_dir / "ddp"), "--json"], capsys)
    assert rc == 0, err
    summaries = json.loads(out)
    assert [s["rank"] for s in summaries] == [0, 1]
    for s in summaries:
        assert s["et"].endswith(f"host.{s['rank']}.json.gz") and s["kineto"].endswith(f"device.{s['rank']}.json.gz")
        assert s["link"]["key"] == key and s["link"]["fraction"] >= 0.9
        assert s["nodes"] == sum(s["nodes_by_kind"].values())
        meta, nodes = decode_et(s["output"])
        assert len(nodes) == s["nodes"]
        assert meta["attrs"]["rank"] == s["rank"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["ddp.0.et", "ddp.1.et"]


def test_table_output_and_et_only(tmp_path, capsys):
    out = tmp_path / "g"
    rc, text, err = _run(["--et", str(require_shared("traces", "chakra", "1.0.2-chakra.0.0.4.tgz")), "-o", str(out)],
                         capsys)
    assert rc == 0, err
    assert "lumos-sim convert" in text and "COLLECTIVE" in text
    assert (tmp_path / "g.0.et").exists()


def test_ranks_converted_together_share_the_job_world_size(tmp_path, capsys):
    """An Execution Trace alone may record no world size: four rank files converted together are a
    4-rank job (not rank r of r + 1)."""
    src = tmp_path / "in"
    src.mkdir()
    for r in range(4):
        shutil.copy(require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz"),
                    src / f"host.{r}.json.gz")
    rc, out, err = _run(["--et", str(src / "host.{rank}.json.gz"), "-o", str(tmp_path / "job"), "--json"], capsys)
    assert rc == 0, err
    assert [(s["rank"], s["world_size"]) for s in json.loads(out)] == [(r, 4) for r in range(4)]
    for r in range(4):
        assert decode_et(str(tmp_path / f"job.{r}.et"))[0]["attrs"]["world_size"] == 4


def test_entry_point_runs(tmp_path):
    """The installed console script path: python -m lumos_sim."""
    et = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz")
    k = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz")
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "convert", "--et", str(et), "--kineto", str(k),
                        "-o", str(tmp_path / "sa"), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["link"]["matched_et"] == 36


def test_discover_rejects_missing_rank_and_duplicate_claims(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    et = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz")
    k = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz")
    for r in (0, 1):
        shutil.copy(et, src / f"host.{r}.json.gz")
    shutil.copy(k, src / "device.0.json.gz")
    with pytest.raises(TraceInputError, match="no Kineto trace for rank 1"):
        discover_inputs(str(src / "host.{rank}.json.gz"), str(src / "device.{rank}.json.gz"))
    # two Kineto files without {rank} that both say rank 0
    shutil.copy(k, src / "device.x.json.gz")
    with pytest.raises(TraceInputError, match="claims rank 0"):
        discover_inputs(None, str(src / "device.*.json.gz"))
    # one un-patterned file: its own rank
    assert list(discover_inputs(None, str(src / "device.0.json.gz"))) == [0]


# ------------------------------------------------------------------------------------ bad input
def _bad_cases(tmp_path):
    et = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_et.json.gz")
    k = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz")
    bad = tmp_path / "bad"
    bad.mkdir()
    empty = bad / "empty.json"
    empty.write_bytes(b"")
    trunc = bad / "trunc.json.gz"
    trunc.write_bytes(k.read_bytes()[:1500])
    invalid = bad / "invalid.json"
    invalid.write_bytes(gzip.decompress(et.read_bytes())[:-40])
    other = require_shared("traces", "param", "linear_kineto.json.gz")
    return [
        (["--kineto", str(empty)], empty, "empty"),
        (["--et", str(empty)], empty, "empty"),
        (["--kineto", str(trunc)], trunc, "gzip"),
        (["--et", str(trunc)], trunc, "gzip"),
        (["--et", str(invalid)], invalid, "JSON"),
        (["--kineto", str(invalid)], invalid, "JSON"),
        (["--kineto", str(et)], et, "Execution Trace"),         # ET given as Kineto
        (["--et", str(k)], k, "Kineto trace"),                   # Kineto given as ET
        (["--et", str(et), "--kineto", str(other)], et, "different runs"),
        (["--et", str(tmp_path / "nope.json")], tmp_path / "nope.json", "no such file"),
    ]


def test_bad_input_exit_2_one_line_no_output(tmp_path, capsys):
    for argv, path, fragment in _bad_cases(tmp_path):
        out_dir = tmp_path / "out"
        out_dir.mkdir(exist_ok=True)
        rc, out, err = _run([*argv, "-o", str(out_dir / "x")], capsys)
        assert rc == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert str(path) in lines[0] and fragment in lines[0], (fragment, lines[0])
        assert "Traceback" not in err and out == ""
        assert list(out_dir.iterdir()) == [], argv


def test_ranks_crossed_are_not_a_pair(tmp_path, capsys):
    """Two ranks of one seeded program share op names and Record function ids: the pid tells them apart."""
    if not (CPU_DDP / "host.0.json.gz").exists():
        pytest.skip("tests/data/cpu_ddp not present")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, out, err = _run(["--et", str(CPU_DDP / "host.0.json.gz"), "--kineto", str(CPU_DDP / "device.1.json.gz"),
                         "-o", str(out_dir / "x")], capsys)
    assert rc == 2
    assert "different processes" in err and "host.0.json.gz" in err and "device.1.json.gz" in err
    assert len(err.strip().splitlines()) == 1 and list(out_dir.iterdir()) == []


def test_failure_on_one_rank_leaves_no_file_of_any_rank(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    k = require_shared("traces", "hta", "execution_trace_benchmark_simple_add_trace.json.gz")
    shutil.copy(k, src / "device.0.json.gz")
    (src / "device.1.json.gz").write_bytes(k.read_bytes()[:800])  # rank 1 truncated
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, out, err = _run(["--kineto", str(src / "device.{rank}.json.gz"), "-o", str(out_dir / "x")], capsys)
    assert rc == 2 and "device.1.json.gz" in err
    assert list(out_dir.iterdir()) == []
