"""Multi-rank replay on a shared clock: recorded rank skew, job-level step time, the balance what-if.

Ground truth: tests/data/ddp4 (4-rank CPU gloo DDP; `late`: rank 1 enters every step 40 ms late,
`heavy`: rank 3 computes 2x more, `balanced`: the re-collection with equal ranks)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import lru_cache

import pytest

from conftest import DATA, ROOT
from replay.api import replay

SETS = DATA / "ddp4"


@lru_cache(maxsize=None)
def _graphs(name: str) -> tuple:
    from chakra_schema.inputs import load_graphs

    return tuple(load_graphs([], et_pattern=str(SETS / name / "host.{rank}.json.gz"),
                             kineto_pattern=str(SETS / name / "device.{rank}.json.gz")))


@pytest.mark.parametrize("name", ["late", "heavy", "balanced"])
def test_every_rank_every_step_within_2_percent_on_the_recorded_clock(name):
    res = replay(list(_graphs(name)), critical_path=False)
    assert res.alignment.used == "recorded" and res.alignment.clock_skew_us < 2000
    assert len(res.steps) == 12
    worst = max(abs(s.error) for s in res.steps)
    assert worst <= 0.02, [(s.rank, s.name, round(100 * s.error, 2)) for s in res.steps]
    # the job-level step (first rank's start to last rank's end) is measured on the same clock
    assert res.measured_job_step_time_us is not None
    assert abs(res.job_step_time_us / res.measured_job_step_time_us - 1) <= 0.02
    for j in res.job_steps:
        assert j.ranks == 4 and abs(j.error) <= 0.02


def test_late_rank_steps_start_later_and_the_job_step_spans_the_skew():
    res = replay(list(_graphs("late")), critical_path=False)
    first = {s.rank: s for s in res.steps if s.name == "ProfilerStep#2"}
    # rank 1 slept 40 ms before the step: it enters ~40 ms after the others, in the replay as recorded
    assert first[1].start_us - first[0].start_us == pytest.approx(40_000, abs=3_000)
    job = res.job_steps[0]
    assert job.predicted_us == pytest.approx(first[1].start_us + first[1].predicted_us - first[0].start_us)
    assert job.predicted_us > max(s.predicted_us for s in first.values()) + 30_000


def test_align_start_reproduces_the_old_per_rank_origin():
    """`align="start"` is the engine before recorded alignment: every rank starts at its own first event,
    which moves rank 1's lateness onto the others' first step (the -18% errors it used to give)."""
    graphs = list(_graphs("late"))
    res = replay(graphs, align="start", critical_path=False)
    assert res.alignment.used == "start"
    assert list(res.run.origin_us) == [float(g.start_us.min()) for g in graphs]
    err = {(s.rank, s.name): s.error for s in res.steps}
    # figures of the replay engine before this change, on the same set
    assert err[(0, "ProfilerStep#2")] == pytest.approx(-0.1914, abs=5e-4)
    assert err[(2, "ProfilerStep#2")] == pytest.approx(-0.1816, abs=5e-4)
    assert err[(3, "ProfilerStep#2")] == pytest.approx(-0.1800, abs=5e-4)
    assert res.measured_job_step_time_us is None  # no shared frame for the measured job step


def test_clocks_that_disagree_fall_back_to_start_with_a_note():
    graphs = list(_graphs("late"))
    moved = graphs[:]
    g = moved[2]
    moved[2] = replace(g, metadata={**g.metadata, "time_origin_us": g.metadata["time_origin_us"] + 5e6})
    res = replay(moved, critical_path=False)
    assert res.alignment.requested == "recorded" and res.alignment.used == "start"
    assert "clocks disagree" in res.alignment.note and "rank 2" in res.alignment.note
    same = replay(graphs, align="start", critical_path=False)
    assert [s.predicted_us for s in res.steps] == [s.predicted_us for s in same.steps]


def test_balancing_the_heavy_rank_predicts_the_measured_speedup_within_5_percent():
    from estimators.trace.balance import balance_ranks

    heavy = list(_graphs("heavy"))
    what = balance_ranks(heavy)
    assert list(what.changes["balanced_ranks"]) == ["3"]  # found the slow rank by itself
    measured_heavy = replay(heavy, critical_path=False).measured_job_step_time_us
    measured_balanced = replay(list(_graphs("balanced")), critical_path=False).measured_job_step_time_us
    measured_speedup = measured_heavy / measured_balanced
    assert measured_speedup > 1.8
    assert abs(what.speedup / measured_speedup - 1) <= 0.05, (what.speedup, measured_speedup)


def test_scaled_compute_with_factor_one_changes_nothing():
    from estimators.trace.balance import ScaledCompute, scale_compute
    from replay.trace_timing import TraceTiming

    graphs = list(_graphs("heavy"))
    base = replay(graphs, critical_path=False)
    same = replay([scale_compute(g, 1.0) for g in graphs], ScaledCompute(TraceTiming(), {3: 1.0}),
                  critical_path=False)
    assert [s.predicted_us for s in same.steps] == [s.predicted_us for s in base.steps]


def test_cli_replay_align_flag_and_job_step_in_json():
    pat = ["--et", str(SETS / "late" / "host.{rank}.json.gz"), "--kineto", str(SETS / "late" / "device.{rank}.json.gz")]
    out = {}
    for align in ("recorded", "start"):
        p = subprocess.run([sys.executable, "-m", "lumos_sim", "replay", "--json", "--align", align, *pat],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert p.returncode == 0, p.stderr
        out[align] = json.loads(p.stdout)
    rec, start = out["recorded"], out["start"]
    assert rec["alignment"]["used"] == "recorded" and start["alignment"]["used"] == "start"
    assert rec["job_step_time_us"] == pytest.approx(rec["measured_job_step_time_us"], rel=0.02)
    assert [j["name"] for j in rec["job_steps"]] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    worst = max(abs(s["error"]) for s in start["steps"])
    assert worst > 0.15  # the old behaviour, kept behind --align start


def test_balance_whatif_from_the_cli_finds_the_slow_rank_and_predicts_the_speedup(capsys):
    from lumos_sim.cli import main as cli_main
    heavy = SETS / "heavy"
    args = ["whatif", "trace", str(heavy / "device.{rank}.json.gz"), "--et", str(heavy / "host.{rank}.json.gz")]
    assert cli_main(args + ["--balance", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["change"]["balanced_ranks"]) == ["3"]
    measured = (replay(list(_graphs("heavy")), critical_path=False).measured_job_step_time_us
                / replay(list(_graphs("balanced")), critical_path=False).measured_job_step_time_us)
    assert out["speedup"] == pytest.approx(measured, rel=0.05)
    # naming the rank gives the same answer; balancing is not combined with other edits
    assert cli_main(args + ["--balance", "--balance-ranks", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speedup"] == pytest.approx(out["speedup"], rel=1e-9)
    assert cli_main(args + ["--balance", "--dp", "8"]) == 2
    assert "ask for it alone" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("balance", "yes"), ("balance_ranks", [-1]), ("balance_ranks", 3),
                                          ("balance_threshold", -0.1), ("balance_threshold", True)])
def test_balance_fields_are_checked_like_every_scenario_value(field, value):
    from chakra_schema.errors import TraceInputError
    from estimators.scenario import TraceSpec
    with pytest.raises(TraceInputError, match=f"trace.{field}"):
        TraceSpec(inputs=("x.et",), **{field: value})
