"""The failure what-if: failure models, Young/Daly intervals, closed form vs Monte Carlo, recovery
strategies, the published FT-HSDP figures, and bad input."""
from __future__ import annotations

import dataclasses
import math
import re
import time

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from conftest import require_shared
from estimators.failures import FailureOptions, HealthyJob, estimate, resolve
from estimators.failures.checkpoint import daly_interval, plan_checkpoints, young_interval
from estimators.failures.closed_form import closed_form
from estimators.failures.model import failure_model_from_dict, get_failure_model, list_failure_models
from estimators.failures.montecarlo import draw_failures, run_simpy, run_vector, simulate
from estimators.failures.recovery import FailureClass, Job, RecoveryTimes, cold_restart_s, failure_classes
from estimators.model_config import load_model
from estimators.scenario import Scenario
from estimators.registry import evaluate, whatifs


def _run(**kw):
    return estimate(resolve(FailureOptions(**kw)))


# ---------------------------------------------------------------------- checkpoint intervals
@pytest.mark.parametrize("mttf_h, expected_min", [(24, 116.7), (6, 56.7), (0.25, 9.14)])
def test_daly_interval_matches_the_worked_numbers(mttf_h, expected_min):
    # reliability.md: delta = 5 min; M = 24 h -> ~117 min, 6 h -> ~57 min, 15 min -> ~9.1 min
    assert daly_interval(5 / 60, mttf_h) * 60 == pytest.approx(expected_min, abs=0.1)


def test_young_interval_is_sqrt_2wm_and_daly_converges_to_it_for_small_writes():
    assert young_interval(5 / 60, 24) * 60 == pytest.approx(120.0)          # sqrt(2 x 5 x 1440) = 120 min
    assert young_interval(1 / 60, 24) * 60 == pytest.approx(53.666, abs=1e-3)
    for w_min in (0.05, 0.5, 1.0):                                          # W / M <= 7e-4
        young, daly = young_interval(w_min / 60, 24), daly_interval(w_min / 60, 24)
        assert abs(daly - young) / young < 0.02
    # where W / M is not small the higher-order terms matter: 9.1 min vs Young's 12.2 min
    assert young_interval(5 / 60, 0.25) * 60 == pytest.approx(12.25, abs=0.01)
    assert abs(daly_interval(5 / 60, 0.25) - young_interval(5 / 60, 0.25)) * 60 > 3.0


def test_daly_interval_is_the_mttf_when_the_write_exceeds_twice_it():
    assert daly_interval(3.0, 1.0) == 1.0


def test_auto_interval_is_dalys_for_the_job_mttf():
    e = _run(gpus=16384, checkpoint_write_min=5, trials=0)
    assert e.checkpoint.interval == pytest.approx(daly_interval(5 / 60, e.closed.rollback_mttf_h))
    assert e.checkpoint.policy == "optimal"
    # the optimum is a maximum of the closed form: +-20% intervals do worse
    for factor in (0.8, 1.2):
        other = _run(gpus=16384, checkpoint_write_min=5, trials=0,
                     checkpoint_interval_min=e.checkpoint.interval * 60 * factor)
        assert other.closed.ettr < e.closed.ettr


def test_an_asynchronous_write_costs_less_than_a_blocking_one():
    blocking = _run(gpus=16384, checkpoint_write_min=5, trials=0)
    background = _run(gpus=16384, checkpoint_write_min=5, checkpoint_async=True, trials=0)
    assert background.closed.ettr > blocking.closed.ettr
    assert background.closed.time_lost_h["checkpoint_writes"] == 0.0


# ---------------------------------------------------------------------- failure models
def test_llama3_preset_rate_is_419_interruptions_over_2048_nodes_and_54_days():
    m = get_failure_model("llama3-405b")
    assert m.rate_per_1000_node_days == pytest.approx(419 / (2048 * 54) * 1000)   # 3.79
    gpu = next(c for c in m.components if c.name == "gpu")
    assert gpu.rate_per_1000_node_days == pytest.approx(m.rate_per_1000_node_days * 148 / 419)
    assert {c.name for c in m.components if c.scope == "job"} == {"software"}
    assert next(c for c in m.components if c.name == "switch_cable").nodes == 2
    # the job MTBF the reference quotes: ~3.1 h on 2,048 nodes
    assert _run(gpus=16384, trials=0).closed.mttf_h == pytest.approx(3.1, abs=0.05)


def test_every_preset_names_a_source_for_its_numbers():
    for name in list_failure_models():
        m = get_failure_model(name)
        assert "observation" in m.sources and any(k.startswith("components") for k in m.sources), name


def test_llama3_405b_on_16k_gpus_keeps_effective_training_time_above_90_percent():
    # reported: effective training time stayed above 90% (sync restarts, checkpoints sized from the model)
    healthy = HealthyJob(params=load_model("llama3-405b").param_count())
    e = estimate(resolve(FailureOptions(gpus=16384, trials=200), healthy), healthy)
    assert e.closed.ettr > 0.9 and e.mc.mean > 0.9


def test_llama3_405b_job_with_its_model_and_plan_keeps_ettr_above_90_percent_from_the_cli(capsys):
    # Dubey et al. 2024 (Llama 3, sec. 3.3.4): 419 unexpected interruptions in 54 days on 16K H100, effective
    # training time above 90%; the checkpoint (405B x 14 B = 5.7 TB at 2 TB/s) is sized from the model
    import json
    from lumos_sim.cli import main
    rc = main(["whatif", "failures", "--gpus", "16384", "--model", "llama3-405b", "--tp", "8", "--pp", "16",
               "--seq-len", "8192", "--global-batch", "2048", "--recompute", "full", "--trials", "200", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ettr"] > 0.9 and out["ettr_mc"] > 0.9
    assert out["checkpoint_write_min"] == pytest.approx(405e9 * 14 / 2000e9 / 60, rel=0.05)
    assert out["goodput_tokens_per_s"] == pytest.approx(out["tokens_per_s"] * out["ettr"])


def test_a_failure_domain_takes_all_its_nodes_replicas_with_it():
    model = failure_model_from_dict({"rate_per_1000_node_days": 4.0,
                                     "components": {"rack": {"count": 1, "nodes": 4}}})
    job = Job(gpus=64, gpus_per_node=8, replicas=8)                        # one node per replica
    (cls,) = failure_classes("ft-hsdp", job, model, _times())                # no whole-job failures
    assert cls.degraded_fraction == pytest.approx(4 / 8) and not cls.rollback
    wide = failure_model_from_dict({"rate_per_1000_node_days": 4.0,
                                    "components": {"pod": {"count": 1, "nodes": 8}}})
    classes = failure_classes("ft-hsdp", job, wide, _times())
    assert [c.name for c in classes] == ["whole job"] and classes[0].rollback


def test_cold_restart_follows_the_published_points_and_grows_with_scale():
    for gpus, seconds in ((16_000, 200), (22_000, 300), (64_000, 600), (98_000, 900)):
        assert cold_restart_s(gpus) == pytest.approx(seconds)
    assert cold_restart_s(1024) < cold_restart_s(8192) < 200 < cold_restart_s(131072)


# ---------------------------------------------------------------------- estimators agree
def test_published_ft_hsdp_figures_from_the_documented_seed_defaults():
    # Salpekar et al. 2026 (FT-HSDP, arXiv:2602.00277): at O(100K) GPUs a failure every 18 min (6.4 per 1,000
    # node-days on 12,500 nodes); synchronous recovery stalls 10 min -> ETTR 44%, FT-HSDP 3 min + 7 min at 11/12
    # throughput -> 80%. Their accounting charges every failure its whole stall: the `queue` semantics.
    seed = dict(gpus=100_000, failure_model="ft-hsdp-100k", rate_per_1000_node_days=6.4, checkpoint_write_min=0,
                trials=300, restart_semantics="queue")
    sync = _run(strategy="sync", stall_min=10, **seed)
    ft = _run(strategy="ft-hsdp", stall_min=3, **seed)
    assert sync.closed.mttf_h * 60 == pytest.approx(18.0)
    assert sync.closed.ettr == pytest.approx(1 - 10 / 18, abs=1e-3) and abs(sync.mc.mean - 0.444) < 0.01
    # running 1 - 3/18; a replica (1 of 12, hit every 18 x 12 min) out 7 min costs 1/12 while the job runs
    ft_expected = (1 - 3 / 18) * math.exp(-7 / (18 * 12))
    assert ft.closed.ettr == pytest.approx(ft_expected, abs=1e-3) and abs(ft.closed.ettr - 0.80) < 0.01
    assert abs(ft.mc.mean - ft_expected) < 0.005
    assert ft.inputs.job.replicas == 12 and ft.inputs.times.replica_restart * 60 == pytest.approx(7.0)


def test_restart_over_semantics_runs_the_job_a_fraction_exp_minus_rate_times_stall():
    # a failure inside a restart starts it over: the job is down iff a failure fell in the last u, so it runs
    # e^(-lambda u) of the time: 10-min stalls every 18 min -> e^(-10/18) = 0.574 (queue: 0.444)
    seed = dict(gpus=100_000, failure_model="ft-hsdp-100k", rate_per_1000_node_days=6.4, checkpoint_write_min=0,
                trials=300)
    sync = _run(strategy="sync", stall_min=10, **seed)
    ft = _run(strategy="ft-hsdp", stall_min=3, **seed)
    assert sync.inputs.options.restart_semantics == "restart-over"
    assert sync.closed.ettr == pytest.approx(math.exp(-10 / 18), abs=1e-3)
    assert abs(sync.mc.mean - math.exp(-10 / 18)) < 0.01
    assert ft.closed.ettr == pytest.approx(math.exp(-3 / 18) * math.exp(-7 / (18 * 12)), abs=1e-3)
    assert abs(ft.mc.mean - ft.closed.ettr) < 0.005


def test_kokolis_16k_gpu_ettr_at_60_and_5_minute_checkpoints():
    # Kokolis et al. 2025 (HPCA, "Revisiting Reliability in Large-Scale ML Research Clusters"): a 16K-GPU job at
    # RSC-1's 6.5 failures per 1,000 node-days (MTTF 1.8 h), 5-min restarts, free checkpoint writes: ETTR ~0.70
    # with hourly checkpoints, ~0.93 with 5-minute ones (their first-order formula 1 - (u + C/2) / MTTF gives
    # 0.68 / 0.93)
    runs = [_run(gpus=16384, rate_per_1000_node_days=6.5, restart_min=5, detection_min=0, checkpoint_write_min=0,
                 checkpoint_interval_min=c, trials=300) for c in (60, 5)]
    assert runs[0].closed.mttf_h == pytest.approx(1.8, abs=0.05)
    assert abs(runs[0].closed.ettr - 0.70) < 0.03 and abs(runs[1].closed.ettr - 0.93) < 0.01
    for e in runs:
        assert abs(e.mc.mean - e.closed.ettr) < 0.01


_GRID_CASES = (("sync", "restart-over"), ("sync", "queue"), ("ft-hsdp", "restart-over"))


@pytest.mark.parametrize("strategy, semantics", _GRID_CASES)
def test_closed_form_and_monte_carlo_agree_within_0_01_over_the_acceptance_grid(strategy, semantics):
    # the grid: 1K-131K GPUs, 1-10 per 1,000 node-days, intervals 5-180 min, writes 0-5 min, restarts
    # 5-30 min; CI takes 12 points per case (every value of each axis appears), the full grid is
    # benchmarks/bench_failures.py
    points = [(g, r, c, w, u) for g in (1024, 16384, 131072) for r in (1.0, 10.0)
              for (c, w, u) in (((5.0, 0.0, 30.0), (180.0, 5.0, 5.0)) if g != 16384 else
                                ((30.0, 5.0, 30.0), (180.0, 0.0, 15.0)))]
    for g, r, c, w, u in points:
        failures = g / 8 * r / 1000 * 30
        e = _run(gpus=g, rate_per_1000_node_days=r, checkpoint_interval_min=c, checkpoint_write_min=w, restart_min=u,
                 strategy=strategy, restart_semantics=semantics, trials=int(max(60, min(400, 2e5 / failures))),
                 seed=g + int(r) + int(c))
        assert abs(e.closed.ettr - e.mc.mean) < 0.01, (g, r, c, w, u, e.closed.ettr, e.mc.mean)


def test_ft_hsdp_with_many_replicas_down_counts_each_replica_once_and_only_while_the_job_runs():
    # 12 replicas, a failure every 6 min, 3-min stalls, 30-min replica restarts: a replica is hit every 72 min,
    # so replicas are often down together and hit again while restarting.
    # Job running: e^(-3/6) = 0.607; a replica up while the job runs: e^(-30/72) = 0.659 -> ETTR 0.400
    # (subtracting 1 - 3/6 - 30/72 = 0.083 charges overlapping restarts twice, and stalled time too)
    e = _run(gpus=96 * 12 * 8, gpus_per_node=8, failure_model="ft-hsdp-100k", strategy="ft-hsdp", replicas=12,
             rate_per_1000_node_days=1440 / 6 / (96 * 12) * 1000, stall_min=3, restart_min=30,
             checkpoint_write_min=0, trials=200)
    expected = math.exp(-3 / 6) * math.exp(-30 / 72)
    assert e.closed.ettr == pytest.approx(expected, abs=1e-3)
    assert abs(e.mc.mean - expected) < 0.01


def test_an_interval_longer_than_the_horizon_is_priced_not_turned_into_zero():
    # no checkpoint completes in 2 days at a 3-day interval; 1e-3 failures per 1,000 node-days on 2,048 nodes is
    # 0.004 failures in 2 days: nearly every trial keeps all its work (the old closed form said 0.0)
    e = _run(gpus=16384, rate_per_1000_node_days=1e-3, checkpoint_interval_min=3 * 24 * 60, horizon_days=2,
             trials=400)
    assert e.checkpoint.interval * 60 == pytest.approx(3 * 24 * 60)
    assert e.closed.ettr > 0.99 and abs(e.closed.ettr - e.mc.mean) < 0.01


def test_a_tiny_failure_rate_gives_an_ettr_near_one():
    e = _run(gpus=16384, rate_per_1000_node_days=1e-5, trials=200)
    assert e.closed.ettr > 0.999 and e.mc.mean > 0.999


def test_a_job_on_part_of_a_node_fails_at_the_whole_nodes_rate():
    one, eight = (_run(gpus=g, trials=0) for g in (1, 8))
    assert one.inputs.job.nodes == 1 and one.closed.mttf_h == pytest.approx(eight.closed.mttf_h)
    assert any("failures are per node" in w for w in one.inputs.warnings)


def test_values_outside_their_sources_range_print_a_warning():
    e = _run(gpus=1_000_000, rate_per_1000_node_days=20, strategy="ft-hsdp", trials=0)
    text = " ".join(e.inputs.warnings)
    assert "extrapolated beyond the published points (16,000-98,000 GPUs" in text
    assert "outside the published 2.3-6.5" in text and "replicas is the FT-HSDP paper's count" in text
    assert "checkpoint write time is an assumption" in text


def test_a_rollback_inside_a_replica_stall_is_counted_by_the_closed_form():
    # many short non-rollback stalls + rare long rollback ones: rollbacks also land inside the short stalls
    classes = [FailureClass("replica", 6.0, {"restart": 0.05}, rollback=False),
               FailureClass("job", 0.9, {"restart": 0.43}, rollback=True)]
    ckpt = plan_checkpoints(1.0, 5 / 60, False, 1.0)
    cf, mc = closed_form(classes, ckpt, 720), simulate(classes, ckpt, 720, trials=300)
    assert abs(cf.ettr - mc.mean) < 0.005


def test_queued_stalls_past_saturation_leave_no_training_time():
    e = _run(gpus=131072, rate_per_1000_node_days=10, trials=50, restart_semantics="queue")
    assert e.closed.ettr == 0.0 and e.mc.mean < 0.01
    assert sum(e.closed.time_lost_h.values()) == pytest.approx(e.inputs.horizon_h, rel=1e-6)


def test_time_lost_adds_up_to_the_horizon_times_one_minus_ettr():
    for strategy in ("sync", "ft-hsdp"):
        e = _run(gpus=32768, strategy=strategy, trials=0)
        assert sum(e.closed.time_lost_h.values()) == pytest.approx(e.inputs.horizon_h * (1 - e.closed.ettr))


def test_simpy_engine_gives_the_vector_engines_ettrs_on_the_same_draws():
    e = _run(gpus=16384, strategy="ft-hsdp", spares=1, node_repair_h=2.0, trials=0)
    draws = draw_failures(list(e.classes), 720.0, 40, np.random.default_rng(3), times=e.inputs.times)
    assert np.allclose(run_vector(list(e.classes), e.checkpoint, 720.0, draws),
                       run_simpy(list(e.classes), e.checkpoint, 720.0, draws), atol=1e-9)


def test_monte_carlo_of_1000_trials_of_a_30_day_16k_gpu_job_takes_under_10_s():
    inputs = resolve(FailureOptions(gpus=16384, trials=1000, horizon_days=30))
    t0 = time.perf_counter()
    e = estimate(inputs)
    assert time.perf_counter() - t0 < 10.0
    assert e.mc.failures.mean() == pytest.approx(e.closed.expected_failures, rel=0.02)
    assert e.mc.p05 < e.mc.mean < e.mc.p95


def test_weibull_failures_keep_the_mean_rate():
    e = _run(gpus=16384, distribution="weibull", weibull_shape=0.7, trials=300)
    assert e.mc.failures.mean() == pytest.approx(e.closed.expected_failures, rel=0.05)


def test_hot_spares_closed_form_matches_monte_carlo_and_more_spares_help():
    runs = [_run(gpus=16384, spares=k, node_repair_h=12.0, replacement_min=30, trials=300) for k in (2, 4, 8)]
    for e in runs:
        assert abs(e.closed.ettr - e.mc.mean) < 0.01
    assert runs[0].closed.ettr < runs[1].closed.ettr < runs[2].closed.ettr
    assert runs[0].closed.time_lost_h["spare_wait"] > 0


def test_ft_hsdp_beats_sync_at_scale():
    sync, ft = (_run(gpus=65536, strategy=s, trials=0) for s in ("sync", "ft-hsdp"))
    assert ft.closed.ettr > sync.closed.ettr
    assert ft.closed.time_lost_h["degraded"] > 0 and sync.closed.time_lost_h["degraded"] == 0


# ---------------------------------------------------------------------- the what-if on the spine
def _model_scenario(**failure) -> Scenario:
    return Scenario.build(model="llama3-8b", hardware="h100-sxm", whatif="failures",
                          plan=dict(tp=8, dp=8, seq_len=4096, global_batch=64),
                          failure=FailureOptions(trials=100, **failure))


def test_whatif_is_registered_and_turns_the_healthy_step_into_effective_step_and_goodput():
    assert "failures" in whatifs()
    s = _model_scenario(rate_per_1000_node_days=50.0)
    p = evaluate(s)
    healthy = evaluate(dataclasses.replace(s, whatif="parallelism", failure=None))
    m = p.metrics
    assert m["step_time_s"] == pytest.approx(healthy.step_time_s)
    assert m["effective_step_time_s"] == pytest.approx(healthy.step_time_s / m["ettr"])
    assert m["goodput_tokens_per_s"] == pytest.approx(healthy.tokens_per_s * m["ettr"])
    assert p.tokens_per_s == m["goodput_tokens_per_s"] and p.baseline_step_time_s == healthy.step_time_s
    assert p.gpus == 64 and m["gpus"] == 64
    for key in ("mttf_h", "ettr", "ettr_mc", "ettr_p05", "ettr_p95", "checkpoint_interval_min",
                "optimal_checkpoint_interval_min", "expected_failures", "time_lost_detection_h",
                "time_lost_recompute_h", "time_lost_degraded_h", "time_lost_checkpoint_writes_h"):
        assert key in p.to_row().keys() or f"metrics.{key}" in p.to_row()


def test_failure_options_are_a_scenario_section_with_dotted_overrides():
    s = Scenario(whatif="failures").override_strings(["failure.gpus=2048", "failure.strategy=ft-hsdp",
                                                      "failure.trials=0"])
    assert isinstance(s.failure, FailureOptions) and s.failure.gpus == 2048
    assert s.flatten()["failure.strategy"] == "ft-hsdp"
    p = evaluate(s)
    assert p.metrics["strategy"] == "ft-hsdp" and p.metrics["ettr_mc"] is None and math.isnan(p.step_time_s)
    t = Scenario.from_dict({"whatif": "failures", "failure": {"gpus": 1024, "trials": 0}})
    assert evaluate(t).metrics["gpus"] == 1024
    # without a model the plan still sizes the job (a sweep over plan.gpus)
    u = Scenario(whatif="failures", failure=FailureOptions(trials=0, strategy="ft-hsdp")).override({"plan.gpus": 4096})
    assert evaluate(u).metrics["gpus"] == 4096 and evaluate(u).metrics["replicas"] == 4096


def test_a_node_failure_takes_every_replica_on_the_node():
    model = get_failure_model("ft-hsdp-100k")
    (cls,) = failure_classes("ft-hsdp", Job(gpus=64, gpus_per_node=8, replicas=64), model, _times())
    assert cls.degraded_fraction == pytest.approx(8 / 64)


@pytest.mark.parametrize("field, value, message", [
    ("rate_per_1000_node_days", -1.0, "failure.rate_per_1000_node_days must be >= 0"),
    ("checkpoint_interval_min", 0.0, "failure.checkpoint_interval_min must be > 0"),
    ("checkpoint_write_min", -5.0, "failure.checkpoint_write_min must be >= 0"),
    ("replicas", 0, "failure.replicas must be an integer >= 1"),
    ("strategy", "elastic", "failure.strategy must be one of sync, ft-hsdp"),
    ("horizon_days", 0.0, "failure.horizon_days must be > 0"),
    ("checkpoint_interval_min", math.inf, "failure.checkpoint_interval_min must be > 0 and <= "),
    ("rate_per_1000_node_days", math.inf, "failure.rate_per_1000_node_days must be >= 0 and <= "),
    ("rate_per_1000_node_days", 1e308, "failure.rate_per_1000_node_days must be >= 0 and <= "),
    ("horizon_days", 1e308, "failure.horizon_days must be > 0 and <= 3650"),
    ("checkpoint_write_min", 1e308, "failure.checkpoint_write_min must be >= 0 and <= "),
    ("seed", -1, "failure.seed must be an integer from 0"),
    ("trials", 10 ** 8, "failure.trials must be an integer from 0 to 1,000,000"),
    ("restart_semantics", "lazy", "failure.restart_semantics must be one of restart-over, queue"),
])
def test_bad_failure_options_are_one_line_errors(field, value, message):
    with pytest.raises(TraceInputError, match=message):
        FailureOptions(gpus=1024, **{field: value})


def test_a_job_of_10_to_the_12_gpus_is_a_one_line_error():
    with pytest.raises(TraceInputError, match="failure.gpus must be an integer >= 1 and <= 1,048,576"):
        FailureOptions(gpus=10 ** 12)


def test_the_cli_refuses_overflowing_values_with_exit_2(capsys):
    from lumos_sim.cli import main
    for argv in (["--gpus", "1024", "--failure-rate", "inf"], ["--gpus", "1024", "--failure-rate", "1e308"],
                 ["--gpus", "1024", "--horizon-days", "1e308"], ["--gpus", "1024", "--seed", "-1"],
                 ["--gpus", "1024", "--checkpoint-write-min", "1e308"], ["--gpus", "1024", "--checkpoint-interval-min", "inf"],
                 ["--gpus", "1000000000000"]):
        assert main(["whatif", "failures", "--trials", "0", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], (argv, err)


def test_more_replicas_than_data_parallel_ranks_is_an_error():
    with pytest.raises(TraceInputError, match="exceeds the plan's data-parallel degree DP=8"):
        evaluate(_model_scenario(strategy="ft-hsdp", replicas=16))
    with pytest.raises(TraceInputError, match="exceeds the job's 1024 GPUs"):
        FailureOptions(gpus=1024, replicas=2000)


def test_a_bad_failure_model_file_names_itself(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[components.gpu]\ncount = -3\n')
    with pytest.raises(TraceInputError, match="bad.toml"):
        get_failure_model(str(bad))
    typo = tmp_path / "typo.toml"
    typo.write_text('rate_per_1000_node_days = 3\n[components.gpu]\ncount = 1\nscop = "job"\n')
    with pytest.raises(TraceInputError, match="did you mean 'components.gpu.scope'"):
        get_failure_model(str(typo))


def _times() -> RecoveryTimes:
    return RecoveryTimes(detection=1 / 60, restart=0.1, checkpoint_load=0.05, ft_reconfigure=0.0,
                         ft_redo_step=20 / 3600, ft_rejoin=100 / 3600, replica_restart=7 / 60)


def test_presets_and_worked_numbers_match_the_shared_reliability_reference():
    text = require_shared("reference", "reliability.md").read_text()
    causes = re.search(r"Causes \(count\):(.*?)\.\s", text, re.S).group(1)
    counts = [int(n) for n in re.findall(r"(\d+)(?:,|$)", " ".join(causes.split()))]
    preset = [c for c in get_failure_model("llama3-405b").components if c.name != "other"]
    assert len(counts) == len(preset) == 12
    m = get_failure_model("llama3-405b")
    total = m.rate_per_1000_node_days
    assert [round(c.rate_per_1000_node_days / total * 419) for c in preset] == counts
    assert "419 unexpected" in text and "54-day" in text and "16K H100" in text
    for hours, minutes in re.findall(r"M = (\d+) h -> ~(\d+) min", text):
        assert daly_interval(5 / 60, float(hours)) * 60 == pytest.approx(float(minutes), abs=0.5)


@pytest.mark.parametrize("a,spares", [(3.0, 5), (0.5, 1), (80.0, 90), (1000.0, 1000), (1000.0, 1100)])
def test_spare_pool_empty_probability_is_the_poisson_tail(a, spares):
    """P(N >= K), N ~ Poisson(a), summed term by term here (each term in log space, so e^-1000 does not
    underflow: the old product loop gave 1.0 at a = 1000, K = 1000, where the tail is 0.508)."""
    from estimators.failures.recovery import spare_unavailable_probability
    tail = math.fsum(math.exp(-a + n * math.log(a) - math.lgamma(n + 1)) for n in range(spares, int(3 * a) + 60))
    assert spare_unavailable_probability(a, 1.0, spares) == pytest.approx(tail, rel=1e-9, abs=1e-15)


def test_a_trillion_spares_answer_at_once(capsys):
    """--spares 1e12 looped a trillion times (the CLI hung); the pool is never empty."""
    import time
    from estimators.failures.recovery import spare_unavailable_probability
    from lumos_sim.cli import main
    t0 = time.perf_counter()
    assert spare_unavailable_probability(3.3, 24.0, 10**12) == 0.0
    assert main(["whatif", "failures", "--gpus", "16384", "--spares", str(10**12), "--trials", "0", "--json"]) == 0
    assert time.perf_counter() - t0 < 20
