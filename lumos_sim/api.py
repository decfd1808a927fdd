"""Public Python API: the same jobs as the CLI, returning objects instead of printing.

    from lumos_sim.api import load, replay_traces
    result = replay_traces(["out/job"])                 # .et prefix, .et file or raw traces
    print(result.step_time_us, result.to_json()["ranks"])
"""
from __future__ import annotations

from typing import Sequence

from chakra_schema.graph import ExecutionGraph
from chakra_schema.inputs import load_graphs
from lumos_sim.replay_run import make_timing, run_replay
from replay.results import ReplayResult


def load(inputs: Sequence[str], et: str | None = None, kineto: str | None = None) -> list[ExecutionGraph]:
    """Execution graphs of every rank named by `inputs` (see `lumos-sim replay --help`)."""
    return load_graphs(inputs, et_pattern=et, kineto_pattern=kineto)


def replay_traces(inputs: Sequence[str], timing: str = "trace", hardware: str | None = None,
                  source_hardware: str | None = None, et: str | None = None,
                  kineto: str | None = None, align: str = "recorded") -> ReplayResult:
    """Load and replay; `timing`/`hardware`/`align` as in `lumos-sim replay`."""
    return run_replay(load(inputs, et, kineto), timing, hardware, source_hardware, align=align)


__all__ = ["load", "make_timing", "replay_traces", "run_replay"]
