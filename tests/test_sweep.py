"""Sweeps: spec parsing and expansion, one row per point, failing points, the results file as a cache
(resume after SIGINT / SIGTERM computes only the missing points), local vs Ray executors."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from chakra_schema.errors import TraceInputError
from lumos_sim.cli import main as cli_main
from lumos_sim.sweeps import load_spec, sweep

ROOT = Path(__file__).resolve().parent.parent

# llama3-8b on 8 GPUs: each point takes ~0.05 s
BASE = {"whatif": "parallelism", "model": "llama3-8b", "hardware": "h100-sxm",
        "plan": {"tp": 8, "dp": 1, "seq_len": 4096, "global_batch": 8}}


def spec_20_points() -> dict:
    """5 x 2 x 2 = 20 points, every one valid."""
    return {"sweep": {"name": "twenty"}, "scenario": BASE,
            "axes": [{"grid": {"hardware.network.nic_gbps": [100, 200, 400, 800, 1600]}},
                     {"zip": {"plan.tp": [8, 4], "plan.dp": [1, 2]}},
                     {"list": [{"plan.micro_batch": 1, "label": "mb1"}, {"plan.micro_batch": 2}]}]}


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def without_timing(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["wall_s"])


# ---------------------------------------------------------------------------------------- spec
def test_axes_combine_by_product_in_order_with_labels():
    pts = load_spec(spec_20_points()).points()
    assert len(pts) == 20
    assert [p.index for p in pts] == list(range(20))
    assert pts[0].label == "nic_gbps=100, tp=8 dp=1, mb1"
    assert pts[1].label == "nic_gbps=100, tp=8 dp=1, micro_batch=2"
    assert pts[2].scenario.plan.tp == 4 and pts[2].scenario.plan.dp == 2
    assert pts[19].scenario.hardware.network.nic_gbps == 1600
    assert len({p.key for p in pts}) == 20


def test_toml_dotted_keys_in_a_grid_are_one_key(tmp_path):
    spec = write_spec(tmp_path / "s.toml", """
[scenario]
model = "llama3-8b"
hardware = "h100-sxm"
plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }
[[axes]]
grid = { hardware.network.nic_gbps = [200, 400] }
""")
    pts = load_spec(spec).points()
    assert [p.scenario.hardware.network.nic_gbps for p in pts] == [200, 400]


def test_search_axis_gives_the_ranked_plans_of_each_gpu_count():
    from estimators.model_config import load_model
    from estimators.parallelism.evaluate import rank_candidate_plans
    from replay.hardware.config import get_hardware

    spec = {"scenario": {**BASE, "model": "llama3-70b", "plan": {"seq_len": 8192, "global_batch": 512}},
            "axes": [{"search": {"gpus": [64, 128], "max_plans": 3}}]}
    pts = load_spec(spec).points()
    expected = [p for g in (64, 128) for p in rank_candidate_plans(load_model("llama3-70b"), get_hardware("h100-sxm"),
                                                                    g, 8192, 512, "bf16", 3)]
    assert [p.scenario.plan for p in pts] == expected
    assert pts[0].label.startswith("64 GPUs TP")
    every = load_spec({**spec, "axes": [{"search": {"gpus": [64]}}]}).points()
    assert len(every) > 3  # no max_plans: every valid plan that fits


def test_set_edits_the_axes_or_the_base_scenario():
    data = spec_20_points()
    spec = load_spec(data, ["axes.0.grid.hardware.network.nic_gbps=[200,400]", "plan.seq_len=2048",
                            "axes.1.zip={\"plan.tp\" = [8], \"plan.dp\" = [1]}"])
    pts = spec.points()
    assert len(pts) == 2 * 1 * 2
    assert all(p.scenario.plan.seq_len == 2048 for p in pts)
    assert data == spec_20_points()  # the caller's dict is not edited


@pytest.mark.parametrize("text, problem", [
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\ngrid = { 'plan.tp' = 4 }", "non-empty list"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\ngird = { 'plan.tp' = [4] }", "unknown axis kind 'gird' in axes[0] (did you mean 'grid'?)"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\nzip = { 'plan.tp' = [4, 8], 'plan.dp' = [1] }", "zip lists differ in length"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\ngrid = { 'plan.tpp' = [4] }", "unknown key 'plan.tpp'"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\ngrid = { 'plan.tp' = ['four'] }", "plan.tp: expected int"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\nsearch = { gpus = [64], max_plans = 0 }", "max_plans must be an integer in [1, 1,000]"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\nsearch = { gpus = 'all' }", "search.gpus must be a list"),
    ("[scenario]\nmodel = 'llama3-8b'\n[axes]\ngrid = {}", "'axes' must be an array of tables"),
    ("[sweep]\nname = 'x'\n", "needs a [scenario] table"),
    ("[scenario\n", "not a valid TOML file"),
    ("[scenario]\nmodel = 'llama3-8b'\n[[axes]]\ngrid = { 'plan.tp' = [4] }\nzip = { 'plan.dp' = [1] }", "exactly one of"),
])
def test_bad_spec_is_one_line_and_exit_2(tmp_path, capsys, text, problem):
    spec = write_spec(tmp_path / "bad.toml", text)
    out = tmp_path / "r.parquet"
    assert cli_main(["sweep", str(spec), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(spec) in err and problem in err, err
    assert not out.exists()


def test_missing_spec_and_bad_output_are_one_line_errors(tmp_path, capsys):
    assert cli_main(["sweep", str(tmp_path / "nope.toml"), "-o", str(tmp_path / "r.parquet")]) == 2
    assert "sweep spec not found" in capsys.readouterr().err
    spec = write_spec(tmp_path / "s.toml", "[scenario]\nmodel = 'llama3-8b'\n")
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "r.txt")]) == 2
    assert "must end in .parquet or .csv" in capsys.readouterr().err
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "no" / "r.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "r.parquet"), "--workers", "0"]) == 2
    assert "--workers must be an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "r.parquet").exists()


def test_dry_run_lists_the_points_and_evaluates_nothing(tmp_path, capsys):
    spec = write_spec(tmp_path / "s.toml", "[scenario]\nmodel = 'llama3-8b'\nhardware = 'h100-sxm'\n"
                                           "[[axes]]\ngrid = { 'plan.tp' = [1, 2, 4] }\n")
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "r.parquet"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[2].endswith("tp=4")
    assert not (tmp_path / "r.parquet").exists()


# ---------------------------------------------------------------------------------------- rows
def test_one_row_per_point_with_inputs_and_predictions_and_a_failing_point(tmp_path):
    spec = {"scenario": BASE, "axes": [{"list": [{"plan.tp": 8}, {"plan.tp": 3, "label": "bad tp"}, {"plan.tp": 4, "plan.dp": 2}]}]}
    df = sweep(spec, output=tmp_path / "r.parquet", csv=True, progress=False)
    assert list(df["point"]) == [0, 1, 2]
    assert list(df["status"]) == ["ok", "error", "ok"]
    assert "not divisible by tp 3" in df.loc[1, "error"]
    assert df.loc[1, "label"] == "bad tp" and df.loc[1, "plan.tp"] == 3
    for col in ("plan.tp", "hardware.network.nic_gbps", "model.layers", "scenario_key", "step_time_s",
                "tokens_per_s", "breakdown.compute_us", "metrics.memory_weights_gib"):
        assert col in df.columns, col
    assert df.loc[0, "step_time_s"] > 0 and pd.isna(df.loc[1, "step_time_s"])
    assert df.attrs["sweep"]["failed"] == 1 and df.attrs["sweep"]["computed"] == 3
    back = pd.read_parquet(tmp_path / "r.parquet")
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    csv = pd.read_csv(tmp_path / "r.csv")
    assert list(csv["status"]) == ["ok", "error", "ok"] and csv.loc[2, "plan.tp"] == 4


def test_rerun_reads_the_results_file_and_computes_nothing(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text("""
[scenario]
model = "llama3-8b"
hardware = "h100-sxm"
plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }
[[axes]]
grid = { "plan.micro_batch" = [1, 2], "plan.tp" = [8, 3] }
""")
    out = tmp_path / "r.parquet"
    assert cli_main(["sweep", str(spec), "-o", str(out), "--json"]) == 0
    first = _json(capsys.readouterr().out)
    assert (first["points"], first["computed"], first["cached"], first["failed"]) == (4, 4, 0, 2)
    assert cli_main(["sweep", str(spec), "-o", str(out), "--json", "--set", "axes.0.grid.plan.micro_batch=[1,2,4]"]) == 0
    second = _json(capsys.readouterr().out)
    assert (second["points"], second["computed"], second["cached"]) == (6, 2, 4)  # the failing points are kept too
    assert cli_main(["sweep", str(spec), "-o", str(out), "--json", "--fresh"]) == 0
    assert _json(capsys.readouterr().out)["computed"] == 4


def _json(text: str) -> dict:
    import json
    return json.loads(text.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------- interrupt and resume
SLOW_SPEC = """
[scenario]
model = "llama3-70b"
hardware = "h100-sxm"
simulation = "symmetric"   # the whole-step replay: points slow enough to be killed half-way
plan = {{ seq_len = 8192, global_batch = 512 }}
[[axes]]
search = {{ gpus = [64, 128], max_plans = {n} }}
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_killed_sweep_leaves_a_readable_file_and_the_rerun_computes_only_the_missing_points(tmp_path, sig, code):
    spec = write_spec(tmp_path / "s.toml", SLOW_SPEC.format(n=12))
    out = tmp_path / "r.parquet"
    cmd = [sys.executable, "-m", "lumos_sim", "sweep", str(spec), "-o", str(out), "--workers", "2", "--json",
           "--flush-every", "0.2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # SIGINT as a terminal's Ctrl-C delivers it: a shell's background job (a CI runner's `cmd &`) starts with
    # SIGINT ignored, which Python and so the sweep would inherit
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # killed at the first finished point: 24 points leave room on a loaded machine, where the sweep runs on
    # while this process polls
    done = _wait_for_points(out, proc, at_least=1, timeout=120)
    os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)  # Ctrl-C reaches the group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "re-run the same command" in err and "Traceback" not in err
    df = pd.read_parquet(out)  # readable after the kill, one row per point
    assert len(df) == 24 and set(df["status"]) <= {"ok", "pending"}
    finished = int((df["status"] == "ok").sum())
    assert done <= finished < 24
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    summary = _json(rerun.stdout)
    assert summary["cached"] == finished and summary["computed"] == 24 - finished
    final = pd.read_parquet(out)
    assert (final["status"] == "ok").all()
    kept = df[df["status"] == "ok"].set_index("point")
    pd.testing.assert_series_equal(final.set_index("point").loc[kept.index, "step_time_s"], kept["step_time_s"])


def _wait_for_points(out: Path, proc, at_least: int, timeout: float) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"sweep ended before it could be interrupted: {proc.stderr.read()}")
        if out.exists():  # writes are atomic (temp file + rename): each version is whole
            try:
                n = int((pd.read_parquet(out)["status"] == "ok").sum())
            except OSError:   # pyarrow opened the path twice and a rename landed in between: poll again
                n = -1
            if n >= at_least:
                return n
        time.sleep(0.2)
    pytest.fail("sweep made no progress")


# ---------------------------------------------------------------------------------------- executors
def test_local_pool_and_ray_give_identical_frames_on_20_points(monkeypatch):
    if os.environ.get("LUMOS_SIM_REQUIRE_SHARED") != "1":  # CI installs the ray extra: there it must run
        pytest.importorskip("ray")
    # a local Ray instance of 2 CPUs, not the cluster a RAY_ADDRESS in the environment would join
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    serial = sweep(spec_20_points(), progress=False)
    pool = sweep(spec_20_points(), workers=2, progress=False)
    ray_df = sweep(spec_20_points(), executor="ray", workers=2, progress=False)
    assert len(serial) == 20 and (serial["status"] == "ok").all()
    # wall_s is the time each evaluation took: the one column that is not a result
    pd.testing.assert_frame_equal(without_timing(pool), without_timing(serial))
    pd.testing.assert_frame_equal(without_timing(ray_df), without_timing(serial))


def test_missing_ray_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    spec = write_spec(tmp_path / "s.toml", "[scenario]\nmodel = 'llama3-8b'\nhardware = 'h100-sxm'\n"
                                           "plan = { tp = 8, seq_len = 4096, global_batch = 8 }\n")
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "r.parquet"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install -e '.[ray]'" in err
    assert not (tmp_path / "r.parquet").exists()


def test_unreachable_ray_cluster_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    if os.environ.get("LUMOS_SIM_REQUIRE_SHARED") != "1":
        pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)   # the address tried is --ray-address's alone
    spec = write_spec(tmp_path / "s.toml", "[scenario]\nmodel = 'llama3-8b'\nhardware = 'h100-sxm'\n")
    args = ["sweep", str(spec), "-o", str(tmp_path / "r.parquet"), "--executor", "ray", "--ray-address", "127.0.0.1:1"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot reach the Ray cluster at 127.0.0.1:1" in err
    assert not (tmp_path / "r.parquet").exists()
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "r.parquet"), "--ray-address", "127.0.0.1:1"]) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err


TWO_POINTS = """
[scenario]
model = "llama3-8b"
hardware = "h100-sxm"
plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }
[[axes]]
grid = { "plan.micro_batch" = [1, 2] }
"""


class WorkerSpy:
    """Records the worker count each sweep asks its executor for (`asked`) and the processes its local
    pool started (`started`). A count above `refuse_above` fails before any process starts (a broken cap
    must not start 64 processes on a small test machine); with `run_serially` the points are evaluated on
    1 worker, where only the count asked for is under test."""

    def __init__(self, monkeypatch, refuse_above: int, run_serially: bool = False):
        import lumos_sim.sweeps as sweeps_module
        from lumos_sim.sweep_executors import LocalExecutor

        self.refuse_above, self.run_serially = refuse_above, run_serially
        self.asked: list[int] = []
        self.started: list[int] = []
        get_executor, enter = sweeps_module.get_executor, LocalExecutor.__enter__

        def spy_get_executor(name, workers=1, address=None):
            self.asked.append(workers)
            assert workers <= self.refuse_above, f"the sweep asked for {workers} workers"
            return get_executor(name, 1 if self.run_serially else workers, address)

        def spy_enter(executor):
            out = enter(executor)
            self.started.append(0 if executor.pool is None else len(executor.pool._pool))
            return out

        monkeypatch.setattr(sweeps_module, "get_executor", spy_get_executor)
        monkeypatch.setattr(LocalExecutor, "__enter__", spy_enter)


def test_default_workers_are_capped_at_the_points_to_run(tmp_path, monkeypatch, capsys):
    """On a host of 64 CPUs a 2-point sweep starts 2 worker processes, not 64."""
    from lumos_sim.commands import sweep as sweep_command

    monkeypatch.setattr(sweep_command, "cpu_count", lambda: 64)
    spy = WorkerSpy(monkeypatch, refuse_above=2)
    spec, out = write_spec(tmp_path / "s.toml", TWO_POINTS), tmp_path / "r.parquet"
    assert cli_main(["sweep", str(spec), "-o", str(out), "--json"]) == 0
    assert _json(capsys.readouterr().out)["computed"] == 2
    assert (spy.asked, spy.started) == ([2], [2])
    assert list(pd.read_parquet(out)["status"]) == ["ok", "ok"]


def test_default_workers_of_a_resumed_sweep_count_only_the_points_left(tmp_path, monkeypatch, capsys):
    """Adding a third point to a finished 2-point sweep runs 1 point: 1 worker, in this process."""
    from lumos_sim.commands import sweep as sweep_command

    spec, out = write_spec(tmp_path / "s.toml", TWO_POINTS), tmp_path / "r.parquet"
    assert cli_main(["sweep", str(spec), "-o", str(out), "--workers", "1", "--json"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sweep_command, "cpu_count", lambda: 64)
    spy = WorkerSpy(monkeypatch, refuse_above=1)
    three = ["--set", "axes.0.grid.plan.micro_batch=[1,2,4]"]
    assert cli_main(["sweep", str(spec), "-o", str(out), "--json", *three]) == 0
    summary = _json(capsys.readouterr().out)
    assert (summary["points"], summary["computed"], summary["cached"]) == (3, 1, 2)
    assert (spy.asked, spy.started) == ([1], [0])
    # --fresh ignores the cache: all 3 points run again
    spy.refuse_above, spy.run_serially = 3, True
    assert cli_main(["sweep", str(spec), "-o", str(out), "--json", "--fresh", *three]) == 0
    assert _json(capsys.readouterr().out)["computed"] == 3 and spy.asked == [1, 3]


def test_explicit_workers_beyond_the_points_are_capped_too(tmp_path, monkeypatch, capsys):
    """--workers 3 on 2 points starts 2: a third worker would have no point to evaluate."""
    spy = WorkerSpy(monkeypatch, refuse_above=2)
    spec, out = write_spec(tmp_path / "s.toml", TWO_POINTS), tmp_path / "r.parquet"
    assert cli_main(["sweep", str(spec), "-o", str(out), "--workers", "3", "--json"]) == 0
    assert (spy.asked, spy.started) == ([2], [2])


def test_sweep_of_scenario_objects_and_the_top_level_api():
    import lumos_sim
    from estimators.scenario import Scenario

    base = Scenario.from_dict(BASE)
    df = lumos_sim.sweep([base, base.override({"plan.micro_batch": 2})], progress=False)
    assert list(df["status"]) == ["ok", "ok"] and df.loc[1, "plan.micro_batch"] == 2


def test_resumed_table_equals_an_uninterrupted_one(tmp_path):
    """Points left pending by an interrupted run are computed on the re-run; the finished table has the
    same values and dtypes as one computed in one go (nullable integers survive the pending rows)."""
    out = tmp_path / "r.parquet"
    fresh = sweep(spec_20_points(), output=out, progress=False)
    assert str(fresh["plan.tp"].dtype) == "Int64" and str(fresh["gpus_used"].dtype) == "Int64"
    cut = pd.read_parquet(out)
    pred_cols = [c for c in cut.columns if c in ("step_time_s", "tokens_per_s", "gpus_used", "wall_s")]
    cut.loc[cut["point"] % 3 == 0, pred_cols] = None
    cut.loc[cut["point"] % 3 == 0, "status"] = "pending"
    cut.to_parquet(out)
    resumed = sweep(spec_20_points(), output=out, progress=False)
    assert resumed.attrs["sweep"]["computed"] == 7 and resumed.attrs["sweep"]["cached"] == 13
    pd.testing.assert_frame_equal(without_timing(resumed), without_timing(fresh))
    pd.testing.assert_frame_equal(without_timing(pd.read_parquet(out)), without_timing(fresh))


def test_search_axis_keeps_the_scenarios_given_options_and_refuses_what_the_hardware_cannot_run():
    """A search axis ranks candidates with the scenario's FP8 recipe (and dispatcher, CUDA graphs, ...), as
    `whatif parallelism --search` does; before, every candidate silently fell back to delayed scaling. An
    MXFP8 scenario on an H100 is refused at expansion, a one-line input error."""
    spec = {"scenario": {**BASE, "model": "llama3-8b",
                         "plan": {"seq_len": 8192, "global_batch": 128, "precision": "fp8", "fp8_recipe": "tensorwise"}},
            "axes": [{"search": {"gpus": [8], "max_plans": 3}}]}
    pts = load_spec(spec).points()
    assert len(pts) == 3 and all(p.scenario.plan.fp8_recipe == "tensorwise" for p in pts)
    spec["scenario"]["plan"]["fp8_recipe"] = "mxfp8"
    with pytest.raises(TraceInputError) as e:
        load_spec(spec).points()
    assert "mxfp8 recipe needs tensor cores with MX block scaling" in str(e.value) and "\n" not in str(e.value)
