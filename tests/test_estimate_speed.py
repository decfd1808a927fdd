"""The composed estimate (simulation mode "fast", estimators.parallelism.compose): it agrees with the full
event-level replay ("symmetric") within 2% on plans small enough to replay whole, its schedule is Megatron's,
its schedule simulation reproduces the 1F1B / interleaved 1F1B step formulas, and its work does not grow with
the pipeline depth or the micro-batch count."""
from __future__ import annotations

import time

import numpy as np
import pytest

from estimators.model_config import load_model, model_from_dict
from estimators.parallelism.compose import p2p_boundaries, schedule_arrays, simulate_schedule
from estimators.parallelism.evaluate import predict
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import pipeline_schedule

SMALL = model_from_dict(dict(name="small", layers=8, hidden=1024, heads=16, kv_heads=4, ffn=3584, vocab=32000))
DEEP = model_from_dict(dict(name="deep", layers=16, hidden=1024, heads=16, kv_heads=4, ffn=3584, vocab=32000))
GPT = model_from_dict(dict(name="gpt", layers=8, hidden=1024, heads=16, ffn=4096, vocab=51200, activation="gelu",
                           norm="layernorm", tied_embeddings=True, position="learned", max_seq=2048, bias=True))
MOE = model_from_dict(dict(name="moe", layers=4, hidden=512, heads=8, ffn=0, vocab=8000,
                           moe=dict(num_experts=8, top_k=2, expert_ffn=1024)))
# DeepSeek-V3-like: a dense first layer, shared expert, an MTP module; GPT-OSS-like: alternating sliding windows
DSV3ISH = model_from_dict(dict(name="dsv3ish", layers=7, hidden=512, heads=8, ffn=1536, vocab=8000, mtp_layers=1,
                               moe=dict(num_experts=8, top_k=2, expert_ffn=512, shared_experts=1,
                                        first_dense_layers=1)))
WINDOWED = model_from_dict(dict(name="windowed", layers=8, hidden=1024, heads=16, kv_heads=4, ffn=3584,
                                vocab=32000, sliding_window=512, window_pattern="SF"))
MEGATRON_2021 = dict(zero=0, sequence_parallel=False, attention="unfused", overlap_grad_reduce=False,
                     overlap_p2p=False, async_tp_comm=False, grad_accum_fusion=False, recompute="full")

AGREEMENT = [  # (model, plan): PP 1/2/4/8, with and without virtual stages, TP/CP/DP/EP, ZeRO 0/1/3, recompute
    (SMALL, ParallelPlan(pp=1, dp=8, seq_len=2048, global_batch=32)),
    (SMALL, ParallelPlan(tp=2, pp=2, cp=2, dp=2, seq_len=4096, global_batch=16, zero=3)),
    (SMALL, ParallelPlan(tp=2, pp=4, dp=2, seq_len=2048, global_batch=16)),
    (SMALL, ParallelPlan(tp=2, pp=4, dp=2, vp=2, seq_len=2048, global_batch=16)),
    (SMALL, ParallelPlan(tp=2, pp=8, dp=1, seq_len=2048, global_batch=16, recompute="full")),
    (DEEP, ParallelPlan(tp=1, pp=8, dp=2, vp=2, seq_len=2048, global_batch=32, recompute="selective")),
    (SMALL, ParallelPlan(tp=4, pp=2, dp=2, seq_len=2048, global_batch=16, zero=3, recompute="full")),
    (MOE, ParallelPlan(tp=2, pp=2, dp=4, ep=4, seq_len=1024, global_batch=16, zero=3)),
    (MOE, ParallelPlan(tp=1, pp=4, dp=4, ep=2, vp=1, seq_len=1024, global_batch=32, zero=1, precision="fp8")),
    (GPT, ParallelPlan(tp=2, pp=2, dp=2, vp=2, seq_len=2048, global_batch=16, **MEGATRON_2021)),
    # layouts of Megatron-Core recipes: expert grid (ETP), uneven first / last stages, MTP, partial recompute
    (DSV3ISH, ParallelPlan(tp=2, pp=2, dp=4, ep=4, etp=2, seq_len=1024, global_batch=16, first_stage_layers=3,
                           recompute="full", recompute_layers=1)),
    (WINDOWED, ParallelPlan(tp=2, pp=4, dp=1, vp=2, seq_len=2048, global_batch=8, zero=1)),
    # deep interleaving with a DP group across nodes: every chunk's gradient reduction queues in time order
    (DEEP, ParallelPlan(tp=2, pp=2, dp=8, vp=4, seq_len=2048, global_batch=16)),
]


@pytest.mark.parametrize("model,plan", AGREEMENT,
                         ids=[f"{m.name}-tp{p.tp}pp{p.pp}vp{p.vp}cp{p.cp}dp{p.dp}ep{p.ep}z{p.zero}-{p.recompute}"
                              for m, p in AGREEMENT])
def test_fast_estimate_agrees_with_the_full_replay_within_2_percent(model, plan):
    fast = predict(model, plan, "h100-sxm", mode="fast", extrapolate=False)
    full = predict(model, plan, "h100-sxm", mode="symmetric", extrapolate=False)
    assert fast.extra["simulation"] == "fast" and full.extra["simulation"] == "symmetric"
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=0.02)
    # the breakdown (with the GPU waiting for the host) adds up to the step on every stage, and computes as
    # much as the replay
    for b in fast.breakdown.per_stage:
        assert b.compute_us + b.exposed_comm_us + b.host_wait_us + b.idle_us == pytest.approx(b.window_us, rel=1e-9)
    assert fast.breakdown.mean.compute_us == pytest.approx(full.breakdown.mean.compute_us, rel=0.03)
    assert fast.breakdown.mean.host_wait_us == pytest.approx(full.breakdown.mean.host_wait_us, rel=0.03)


def test_many_micro_batches_are_extrapolated_like_the_full_replay():
    plan = ParallelPlan(tp=2, pp=4, dp=1, vp=2, seq_len=2048, global_batch=64)
    fast = predict(SMALL, plan, "h100-sxm")
    full = predict(SMALL, plan, "h100-sxm", mode="symmetric")
    assert fast.extra["extrapolated_from_micro_batches"] == full.extra["extrapolated_from_micro_batches"] == [4, 8]
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=0.02)


@pytest.mark.parametrize("pp,m,vp", [(1, 3, 1), (4, 2, 1), (4, 8, 1), (8, 8, 2), (4, 12, 3), (2, 4, 4)])
def test_schedule_arrays_are_the_generators_pipeline_schedule(pp, m, vp):
    sa = schedule_arrays(pp, m, vp)
    for s in range(pp):
        order = [(bool(f), int(b), int(c)) for f, b, c in zip(sa.fwd[s], sa.mb[s], sa.chunk[s])]
        assert order == pipeline_schedule(pp, s, m, vp)
    # every pass but the first chunk's forwards and the last chunk's backwards reads its input from the
    # same micro-batch and direction on a neighbouring stage
    K = sa.K
    for s in range(pp):
        for k in range(K):
            src = sa.src[s, k]
            g = sa.chunk[s, k] * pp + s
            if (sa.fwd[s, k] and g == 0) or (not sa.fwd[s, k] and g == pp * vp - 1):
                assert src == -1
                continue
            ps, pk = divmod(int(src), K)
            assert sa.mb[ps, pk] == sa.mb[s, k] and sa.fwd[ps, pk] == sa.fwd[s, k]
            assert sa.chunk[ps, pk] * pp + ps == (g - 1 if sa.fwd[s, k] else g + 1)


@pytest.mark.parametrize("pp,m,vp", [(4, 8, 1), (8, 16, 1), (16, 16, 1), (4, 8, 2), (8, 16, 4)])
def test_schedule_simulation_gives_the_1f1b_step_formula(pp, m, vp):
    """Equal stages, forward f and backward 2f per chunk, no transfer time: 1F1B takes (m + p - 1)(F + B)
    and the interleaved schedule (m v + p - 1)(F + B) / v for a whole-model forward F and backward B
    (Narayanan et al. 2021, Sec. 2.2)."""
    sa = schedule_arrays(pp, m, vp)
    f = 10.0
    body = np.where(sa.fwd, f, 2 * f)
    zero = np.zeros(body.shape)
    pos = np.broadcast_to(np.arange(sa.K), body.shape).copy()
    r = simulate_schedule(body, zero, sa.src, pos, pos.copy(), zero)
    F, B = f * vp, 2 * f * vp
    assert r.end.max() == pytest.approx((m * vp + pp - 1) * (F + B) / vp, rel=1e-12)


def _longest_paths_one_pass_at_a_time(body, gap, src, post, wpos, latency, iso):
    """The schedule recurrence evaluated pass by pass, every pass once its inputs are known (a reference
    for the vectorized solver)."""
    pp, K = body.shape
    end = np.full((pp, K), np.nan)
    nxt = [0] * pp
    while any(k < K for k in nxt):
        progressed = False
        for s in range(pp):
            while nxt[s] < K:
                k = nxt[s]
                ready = -np.inf
                ok = True
                for j in range(K):   # the inputs this pass waits for
                    if src[s, j] >= 0 and wpos[s, j] == k:
                        ps, pk = divmod(int(src[s, j]), K)
                        e = end[ps, post[ps, pk]]
                        if np.isnan(e):
                            ok = False
                            break
                        ready = max(ready, e + latency[s, j])
                if not ok:
                    break
                prev = end[s, k - 1] if k else 0.0
                end[s, k] = max(prev + gap[s, k] + body[s, k], ready + iso[s, k])
                nxt[s] += 1
                progressed = True
        assert progressed, "deadlock"
    return end


@pytest.mark.parametrize("pp,m,vp,batched", [(4, 8, 1, False), (3, 6, 2, False), (4, 8, 2, True), (2, 4, 3, True)])
def test_schedule_solver_equals_evaluating_pass_by_pass(pp, m, vp, batched):
    """Random bodies, gaps, transfer times; with `batched`, blocking send/recv in the generator's batches:
    sends leave at the next batch boundary, the receives of a batch are all waited for by its first pass."""
    rng = np.random.default_rng(pp * 100 + m * 10 + vp)
    sa = schedule_arrays(pp, m, vp)
    shape = sa.fwd.shape
    body = rng.uniform(5, 20, shape)
    iso = body * rng.uniform(0.8, 1.0, shape)
    gap = rng.uniform(0, 2, shape)
    latency = rng.uniform(0, 5, shape)
    pos = np.broadcast_to(np.arange(sa.K), shape).copy()
    post, wpos = pos.copy(), pos.copy()
    if batched:
        bnd = p2p_boundaries(sa, vp)
        for s in range(pp):
            b = np.flatnonzero(bnd[s])
            post[s] = b[np.searchsorted(b, pos[s])]                       # the next boundary at or after
            wpos[s] = np.r_[0, b + 1][np.searchsorted(b, pos[s])]         # after the boundary before
    r = simulate_schedule(body, gap, sa.src, post, wpos, latency, iso)
    ref = _longest_paths_one_pass_at_a_time(body, gap, sa.src, post, wpos, latency, iso)
    np.testing.assert_allclose(r.end, ref, rtol=1e-12)


def test_estimate_work_does_not_grow_with_pipeline_depth_or_micro_batches():
    """Llama 3 405B on TP8: PP16 and PP64 (1,024 x 8 GPUs, 2 x PP micro-batches; the full replay took 11 s and
    111 s on the development machine) replay a few stage samples of about the same size."""
    model = load_model("llama3-405b")
    nodes = {}
    for pp in (16, 64):
        plan = ParallelPlan(tp=8, pp=pp, dp=1024 // pp, seq_len=8192, global_batch=2048)
        t0 = time.perf_counter()
        r = predict(model, plan, "h100-sxm")
        wall = time.perf_counter() - t0
        nodes[pp] = r.num_nodes
        assert r.simulated_ranks <= 3 and wall < 10.0, (pp, r.simulated_ranks, wall)
    # layers per stage fall 4x from PP16 to PP64, and so do the replayed nodes; 2 x PP micro-batches do not count
    assert nodes[64] < nodes[16] / 2


def test_cli_simulation_flag_picks_the_mode():
    import json
    import subprocess
    import sys

    def run(*extra):
        p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "parallelism", "--model", "llama3-8b",
                            "--gpus", "16", "--tp", "4", "--pp", "2", "--seq-len", "4096", "--global-batch", "32",
                            "--json", *extra], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    fast, full = run(), run("--simulation", "symmetric")
    assert (fast["simulation"], full["simulation"]) == ("fast", "symmetric")
    assert fast["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.02)


# ------------------------------------------------------------------ repeated work removed, answers kept
SHARED_LINKS = [   # plans whose samples share links (TP / EP / DP / CP traffic, several fabric passes)
    (DSV3ISH, ParallelPlan(tp=2, pp=2, dp=4, ep=4, etp=2, seq_len=1024, global_batch=16, first_stage_layers=3)),
    (SMALL, ParallelPlan(tp=2, pp=2, cp=2, dp=2, seq_len=4096, global_batch=16, zero=3)),
    (DEEP, ParallelPlan(tp=2, pp=2, dp=8, vp=4, seq_len=2048, global_batch=16)),
]


@pytest.mark.parametrize("model,plan", SHARED_LINKS, ids=["dsv3ish-ep", "small-cp-zero3", "deep-vp4-dp8"])
def test_timing_each_distinct_op_once_gives_every_nodes_own_time(model, plan, monkeypatch):
    """The stage samples ask the timing source once per distinct generated op (the template ops of every
    layer share their attrs): the durations, and so the estimate, are exactly those of asking for every node."""
    import estimators.parallelism.compose as compose
    from replay.model_timing import ModelTiming

    asked = []
    whole = ModelTiming.node_durations

    def counting(self, graph):
        asked.append(len(graph))
        return whole(self, graph)

    monkeypatch.setattr(ModelTiming, "node_durations", counting)
    fast = predict(model, plan, "h100-sxm")
    distinct = sum(asked)
    asked.clear()
    monkeypatch.setattr(compose, "_distinct_node_durations", lambda timing, graph: timing.node_durations(graph))
    every = predict(model, plan, "h100-sxm")
    assert fast.step_time_s == every.step_time_s
    assert fast.breakdown.mean.compute_us == every.breakdown.mean.compute_us
    assert fast.num_nodes == every.num_nodes and distinct < sum(asked) / 3


@pytest.mark.parametrize("model,plan", SHARED_LINKS, ids=["dsv3ish-ep", "small-cp-zero3", "deep-vp4-dp8"])
def test_link_sharing_reused_across_passes_and_samples_gives_the_same_step(model, plan, monkeypatch):
    """The fabric keeps the max-min shares of each mix of groups in flight across its passes and across the
    stage samples of an estimate; solving every mix afresh in every pass gives the same step, with more work."""
    import replay.fabric as fabric
    import replay.hardware.network as network

    solved = []
    of = network.FlowIncidence.of_transfers

    def counting(transfers, capacity):
        solved.append(len(transfers))
        return of(transfers, capacity)

    monkeypatch.setattr(network.FlowIncidence, "of_transfers", staticmethod(counting))
    kept = predict(model, plan, "h100-sxm")
    reused = len(solved)
    solved.clear()
    share = network.shared_transfer_times
    monkeypatch.setattr(fabric, "_shared_state", lambda network: ({}, {}))
    monkeypatch.setattr(network, "shared_transfer_times",
                        lambda *args, cache=None, **kw: share(*args, **kw))   # a fresh cache every pass
    fresh = predict(model, plan, "h100-sxm")
    assert kept.step_time_s == fresh.step_time_s
    assert kept.extra.get("stage_kinds") == fresh.extra.get("stage_kinds")
    assert 0 < reused < len(solved)


def test_p2p_time_is_the_same_when_asked_again():
    """Point-to-point times are memoized per (bytes, source, destination): asking again, or after other
    pairs, gives the first answer, and a different size or direction its own."""
    from replay.hardware.network import NetworkModel

    fresh = NetworkModel("h100-sxm")
    net = NetworkModel("h100-sxm")
    first = net.p2p_us(4 << 20, 0, 8)
    net.p2p_us(4 << 20, 8, 0)
    net.p2p_us(1 << 20, 0, 8)
    assert net.p2p_us(4 << 20, 0, 8) == first == fresh.p2p_us(4 << 20, 0, 8)
    assert net.p2p_us(1 << 20, 0, 8) < first
    assert net.p2p_us(4 << 20, 0, 1) < first   # NVLink inside a node beats the NIC
