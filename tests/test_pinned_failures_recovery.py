"""Recovery strategies, job failure rates, cold restart and the hot-spare tail, pinned by hand.

References:
- A job of N nodes fails at N x rate / 1,000 per day (estimators/failures/model.py docstring):
  Llama 3 405B's 3.79 per 1,000 node-days on 2,048 nodes = 7.76 / day = 0.323 / h (MTBF ~3.1 h).
- Synchronous cold restart (Salpekar et al. 2026, FT-HSDP on 100,000 GPUs, arXiv:2602.00277): ~200 s at
  16K GPUs, ~300 s at 22K, ~600 s at 64K, ~900 s at 98K; piecewise power law through them.
- FT-HSDP (same paper): a replica failure stalls the job ~60 s timeout + ~20 s redo + ~100 s rejoin and the
  job runs at (R - k) / R for the ~7 min replica restart.
- Hot spares: nodes in repair N ~ Poisson(rate x repair); P(no spare free) = P(N >= spares)
  = 1 - sum_{n < spares} e^-a a^n / n!.
"""
from __future__ import annotations

import math

import pytest

from chakra_schema.errors import TraceInputError
from estimators.failures import recovery as rec
from estimators.failures.model import FailureComponent, FailureModel
from estimators.failures.recovery import (DEFAULTS, SOURCES, FailureClass, Job, RecoveryTimes, cold_restart_s,
                                          failure_classes, register_strategy, spare_unavailable_probability,
                                          strategies)

TIMES = RecoveryTimes(detection=1 / 60, restart=5 / 60, checkpoint_load=3 / 60, ft_reconfigure=0.0,
                      ft_redo_step=20 / 3600, ft_rejoin=100 / 3600, replica_restart=7 / 60)


def _model(*components: FailureComponent) -> FailureModel:
    return FailureModel("test", tuple(components))


# ---------------------------------------------------------------------- job rates
def test_a_job_fails_at_its_node_count_times_the_per_node_rate():
    """2,048 nodes x 3.79 / 1,000 / 24 = 0.3234 / h."""
    job = Job(gpus=16384, gpus_per_node=8)
    assert job.nodes == 2048
    assert job.rate_per_h(3.79) == pytest.approx(2048 * 3.79 / 1000 / 24, rel=1e-15)
    assert job.rate_per_h(24.0) == pytest.approx(2.048, rel=1e-15)


def test_a_job_on_part_of_a_node_counts_the_whole_node():
    assert Job(gpus=9, gpus_per_node=8).nodes == 2
    assert Job(gpus=4, gpus_per_node=8).nodes == 1
    assert Job(gpus=16, gpus_per_node=8).nodes == 2


def test_a_class_stall_is_the_sum_of_its_parts():
    c = FailureClass("x", 1.0, {"detection": 0.25, "restart": 0.5, "checkpoint_load": 0.125}, rollback=True)
    assert c.stall_h == 0.875
    assert (c.degraded_h, c.degraded_fraction, c.spare_wait_stalls) == (0.0, 0.0, True)


# ---------------------------------------------------------------------- sync
def test_sync_stops_the_whole_job_for_detection_restart_and_checkpoint_load():
    """100 nodes at 2.4 per 1,000 node-days: 100 x 2.4 / 24,000 = 0.01 / h; one rollback class."""
    model = _model(FailureComponent("gpu", 1.6), FailureComponent("nic", 0.8, "job"))
    [c] = failure_classes("sync", Job(gpus=800, gpus_per_node=8), model, TIMES)
    assert c.name == "job restart" and c.rollback is True
    assert c.rate_per_h == pytest.approx(0.01, rel=1e-14)
    assert c.stall == {"detection": 1 / 60, "restart": 5 / 60, "checkpoint_load": 3 / 60}
    assert (c.degraded_h, c.degraded_fraction) == (0.0, 0.0)


def test_a_user_stall_scales_the_parts_keeping_their_proportions():
    """Parts 1 : 5 : 3 min scaled to 18 min total: 2, 10, 6 min."""
    times = RecoveryTimes(**{**TIMES.__dict__, "stall_override": 18 / 60})
    [c] = failure_classes("sync", Job(gpus=800, gpus_per_node=8), _model(FailureComponent("gpu", 2.4)), times)
    assert c.stall["detection"] == pytest.approx(2 / 60, rel=1e-14)
    assert c.stall["restart"] == pytest.approx(10 / 60, rel=1e-14)
    assert c.stall["checkpoint_load"] == pytest.approx(6 / 60, rel=1e-14)


def test_a_user_stall_with_all_parts_zero_goes_to_the_first_part():
    times = RecoveryTimes(detection=0.0, restart=0.0, checkpoint_load=0.0, ft_reconfigure=0.0, ft_redo_step=0.0,
                          ft_rejoin=0.0, replica_restart=0.0, stall_override=0.3)
    [c] = failure_classes("sync", Job(gpus=8, gpus_per_node=8), _model(FailureComponent("gpu", 2.4)), times)
    assert c.stall == {"detection": 0.3, "restart": 0.0, "checkpoint_load": 0.0}


def test_a_failure_model_with_no_rate_gives_no_failure_classes():
    assert failure_classes("sync", Job(gpus=800, gpus_per_node=8), _model(FailureComponent("gpu", 0.0)), TIMES) == []


def test_an_unknown_strategy_is_a_one_line_error_naming_the_known_ones():
    with pytest.raises(TraceInputError, match=r"^unknown recovery strategy 'nope' \(known: ft-hsdp, sync\)$"):
        failure_classes("nope", Job(gpus=8, gpus_per_node=8), _model(FailureComponent("gpu", 1.0)), TIMES)
    assert strategies() == ["ft-hsdp", "sync"]


def test_a_registered_strategy_is_used_by_its_name():
    @register_strategy("test-none")
    def _none(job, model, times):
        return [FailureClass("a", 0.0, {}, False), FailureClass("b", 0.5, {}, False)]
    try:
        assert [c.name for c in failure_classes("test-none", Job(8, 8), _model(FailureComponent("g", 1.0)), TIMES)] \
            == ["b"]
    finally:
        del rec._STRATEGIES["test-none"]


# ---------------------------------------------------------------------- FT-HSDP
def test_ft_hsdp_single_node_failures_take_one_replica_and_software_bugs_take_the_job():
    """12 replicas of 100 nodes: node components (2.0 + 0.4 on 2-node domains) hit 1 replica, a
    software bug (scope job, 0.6) every replica; rates x 1,200 nodes / 24,000."""
    model = _model(FailureComponent("gpu", 2.0), FailureComponent("switch", 0.4, nodes=2),
                   FailureComponent("software", 0.6, "job"))
    classes = failure_classes("ft-hsdp", Job(gpus=9600, gpus_per_node=8, replicas=12), model, TIMES)
    assert [c.name for c in classes] == ["1 of 12 replicas", "whole job"]
    one, whole = classes
    assert one.rate_per_h == pytest.approx(2.4 * 1200 / 24000, rel=1e-14)
    assert one.rollback is False and one.spare_wait_stalls is False
    assert one.degraded_h == 7 / 60 and one.degraded_fraction == pytest.approx(1 / 12, rel=1e-15)
    assert one.stall == pytest.approx({"detection": 1 / 60, "restart": 100 / 3600, "recompute": 20 / 3600})
    assert whole.rate_per_h == pytest.approx(0.6 * 1200 / 24000, rel=1e-14)
    assert whole.rollback is True and whole.spare_wait_stalls is True
    assert whole.stall == {"detection": 1 / 60, "restart": 5 / 60, "checkpoint_load": 3 / 60}


def test_ft_hsdp_failure_domains_larger_than_a_replica_take_several():
    """4 replicas of 2 nodes: a 3-node domain spans ceil(3 / 2) = 2 replicas, a 2-node one exactly 1,
    an 8-node one all 4 (a whole-job failure)."""
    model = _model(FailureComponent("rack3", 1.0, nodes=3), FailureComponent("rack2", 2.0, nodes=2),
                   FailureComponent("row", 3.0, nodes=8))
    classes = failure_classes("ft-hsdp", Job(gpus=64, gpus_per_node=8, replicas=4), model, TIMES)
    by = {c.name: c for c in classes}
    assert set(by) == {"1 of 4 replicas", "2 of 4 replicas", "whole job"}
    assert by["1 of 4 replicas"].rate_per_h == pytest.approx(8 * 2.0 / 24000, rel=1e-14)
    assert by["2 of 4 replicas"].rate_per_h == pytest.approx(8 * 1.0 / 24000, rel=1e-14)
    assert by["2 of 4 replicas"].degraded_fraction == 0.5
    assert by["whole job"].rate_per_h == pytest.approx(8 * 3.0 / 24000, rel=1e-14)
    assert [c.name for c in classes] == ["1 of 4 replicas", "2 of 4 replicas", "whole job"]


def test_ft_hsdp_replicas_smaller_than_a_node_all_go_with_the_node():
    """8 replicas on 2 nodes (a quarter node each): one node failure takes ceil(1 / 0.25) = 4 replicas."""
    classes = failure_classes("ft-hsdp", Job(gpus=16, gpus_per_node=8, replicas=8),
                              _model(FailureComponent("gpu", 2.0)), TIMES)
    assert [c.name for c in classes] == ["4 of 8 replicas"]
    assert classes[0].degraded_fraction == 0.5


def test_ft_hsdp_user_stall_scales_the_replica_stall_not_the_whole_job_restart():
    times = RecoveryTimes(**{**TIMES.__dict__, "stall_override": 0.1})
    model = _model(FailureComponent("gpu", 2.0), FailureComponent("software", 0.6, "job"))
    one, whole = failure_classes("ft-hsdp", Job(gpus=9600, gpus_per_node=8, replicas=12), model, times)
    assert one.stall_h == pytest.approx(0.1, rel=1e-14)
    assert one.stall["detection"] == pytest.approx(0.1 * 60 / 180, rel=1e-14)       # 60 s of 180 s
    assert whole.stall == {"detection": 1 / 60, "restart": 5 / 60, "checkpoint_load": 3 / 60}


# ---------------------------------------------------------------------- cold restart
@pytest.mark.parametrize("gpus, seconds", [(16_000, 200.0), (22_000, 300.0), (64_000, 600.0), (98_000, 900.0)])
def test_cold_restart_passes_through_the_published_points(gpus, seconds):
    assert cold_restart_s(gpus) == pytest.approx(seconds, rel=1e-12)


def test_cold_restart_between_points_is_log_log_linear():
    """Geometric midpoints: sqrt(16K x 22K) -> sqrt(200 x 300); sqrt(22K x 64K) -> sqrt(300 x 600);
    sqrt(64K x 98K) -> sqrt(600 x 900)."""
    assert cold_restart_s(math.sqrt(16e3 * 22e3)) == pytest.approx(math.sqrt(200 * 300), rel=1e-12)
    assert cold_restart_s(math.sqrt(22e3 * 64e3)) == pytest.approx(math.sqrt(300 * 600), rel=1e-12)
    assert cold_restart_s(math.sqrt(64e3 * 98e3)) == pytest.approx(math.sqrt(600 * 900), rel=1e-12)


def test_cold_restart_outside_the_points_extends_the_end_segments():
    """Below 16K: slope ln(300/200) / ln(22/16); 8K = 16K / 2 -> 200 x 2^-slope. Above 98K: slope
    ln(900/600) / ln(98/64); 196K -> 900 x 2^slope. One GPU: the first segment down to 1."""
    lo = math.log(1.5) / math.log(22 / 16)
    hi = math.log(1.5) / math.log(98 / 64)
    assert cold_restart_s(8_000) == pytest.approx(200 * 2 ** -lo, rel=1e-12)
    assert cold_restart_s(196_000) == pytest.approx(900 * 2 ** hi, rel=1e-12)
    assert cold_restart_s(1) == pytest.approx(200 * 16_000 ** -lo, rel=1e-12)
    assert cold_restart_s(0) == cold_restart_s(1)


def test_cold_restart_takes_other_points():
    pts = ((10.0, 1.0), (100.0, 10.0), (1000.0, 1000.0))
    assert cold_restart_s(31.622776601683793, pts) == pytest.approx(math.sqrt(10), rel=1e-12)
    assert cold_restart_s(10_000.0, pts) == pytest.approx(100_000.0, rel=1e-12)


# ---------------------------------------------------------------------- hot spares
def _tail(a: float, spares: int) -> float:
    """P(Poisson(a) >= spares), summed directly."""
    return 1.0 - sum(math.exp(-a) * a ** n / math.factorial(n) for n in range(spares))


@pytest.mark.parametrize("rate, repair, spares", [(0.05, 24.0, 1), (0.05, 24.0, 2), (0.1, 24.0, 5),
                                                  (0.5, 24.0, 10), (1.0, 24.0, 30), (0.05, 24.0, 0)])
def test_spare_pool_empty_probability_is_the_poisson_tail(rate, repair, spares):
    assert spare_unavailable_probability(rate, repair, spares) == pytest.approx(_tail(rate * repair, spares),
                                                                                rel=1e-10, abs=1e-15)


def test_a_large_repair_backlog_uses_the_window_around_the_mean():
    """a = 2,000 nodes in repair: 12 sigma + 40 = 577 either side; P(N >= 2,000) ~ 1/2 + P(N = 2000) / 2,
    P(N >= 2,045) = the tail at +1 sigma by direct log-space sum in the test."""
    a = 2000.0

    def tail(s: int) -> float:
        logp = [-a + n * math.log(a) - math.lgamma(n + 1) for n in range(s)]
        return 1.0 - sum(math.exp(x) for x in logp)
    for s in (1500, 2000, 2045, 2100):
        assert spare_unavailable_probability(a, 1.0, s) == pytest.approx(tail(s), rel=1e-9, abs=1e-14)
    assert spare_unavailable_probability(a, 1.0, 1000) == 1.0       # below the window: certain
    assert spare_unavailable_probability(a, 1.0, 3000) == 0.0       # above it: never


def test_spare_edge_cases():
    assert spare_unavailable_probability(0.5, 24.0, None) == 0.0
    assert spare_unavailable_probability(0.0, 24.0, 3) == 0.0
    assert spare_unavailable_probability(0.0, 24.0, 0) == 1.0
    assert spare_unavailable_probability(0.5, 0.0, 0) == 1.0


# ---------------------------------------------------------------------- documented defaults
def test_documented_defaults_are_the_published_figures():
    """Salpekar et al. 2026: 60 s timeout, 0 s reconfigure, 20 s redo, 100 s rejoin, 7 min replica restart;
    ZeRO: 14 B per parameter; Llama 3: 2 TB/s; assumptions: 5 min write, 24 h repair, 30 min replacement."""
    assert DEFAULTS.detection_s == 60.0 and DEFAULTS.ft_reconfigure_s == 0.0
    assert DEFAULTS.ft_redo_step_s == 20.0 and DEFAULTS.ft_rejoin_s == 100.0 and DEFAULTS.replica_restart_s == 420.0
    assert DEFAULTS.cold_restart_points == ((16_000, 200.0), (22_000, 300.0), (64_000, 600.0), (98_000, 900.0))
    assert DEFAULTS.checkpoint_bytes_per_param == 2 + 4 + 4 + 4 and DEFAULTS.storage_write_gbs == 2000.0
    assert DEFAULTS.checkpoint_write_min_without_model == 5.0
    assert DEFAULTS.node_repair_h == 24.0 and DEFAULTS.replacement_min == 30.0
    assert rec.H_PER_S == 1 / 3600


def test_every_default_names_its_source_first():
    assert DEFAULTS.sources == SOURCES and DEFAULTS.sources is not SOURCES
    assert set(SOURCES) == {"detection_s", "cold_restart_points", "ft_reconfigure_s", "ft_redo_step_s", "ft_rejoin_s",
                            "replica_restart_s", "checkpoint_bytes_per_param", "storage_write_gbs",
                            "checkpoint_write_min_without_model", "node_repair_h", "replacement_min"}
    for key, text in SOURCES.items():
        assert text.startswith(("Salpekar et al. 2026", "ZeRO paper", "Llama 3 paper", "assumption")), key


def test_cold_restart_between_inner_points_of_a_longer_table_uses_their_segment():
    """Five points 1 -> 1, 10 -> 10, 100 -> 1,000, 1,000 -> 10,000, 10,000 -> 1,000,000: at 316.23 (between
    the third and fourth) the segment of slope 1 gives 1,000 x 10^0.5; at 31.62, slope 2: 10 x 10^1."""
    pts = ((1.0, 1.0), (10.0, 10.0), (100.0, 1000.0), (1000.0, 10_000.0), (10_000.0, 1_000_000.0))
    assert cold_restart_s(10 ** 2.5, pts) == pytest.approx(1000 * 10 ** 0.5, rel=1e-12)
    assert cold_restart_s(10 ** 1.5, pts) == pytest.approx(100.0, rel=1e-12)
    assert cold_restart_s(10 ** 3.5, pts) == pytest.approx(100_000.0, rel=1e-12)


def test_a_spare_pool_with_no_failures_is_empty_only_without_spares():
    assert spare_unavailable_probability(0.0, 24.0, 1) == 0.0
    assert spare_unavailable_probability(0.0, 24.0, 2) == 0.0


@pytest.mark.parametrize("a, spares", [(0.5, 1), (0.5, 2), (1.0, 1), (0.01, 1)])
def test_less_than_one_node_in_repair_still_empties_a_small_pool_sometimes(a, spares):
    """a = 0.5: P(N >= 1) = 1 - e^-0.5 = 0.3935; P(N >= 2) = 1 - 1.5 e^-0.5 = 0.0902."""
    assert spare_unavailable_probability(a, 1.0, spares) == pytest.approx(_tail(a, spares), rel=1e-12)
