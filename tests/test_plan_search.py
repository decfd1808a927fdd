"""The fast plan search (estimators/parallelism/search.py): its candidate space is exactly the valid plans
(up to equivalent duplicates), its vectorized memory equals `estimate_memory`, its closed-form
collectives equal the network model, its estimate ranks plans as the replay does, and simulating its top
few finds the plan a brute-force simulation of every plan finds."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType
from estimators.parallelism.memory import estimate_memory
from estimators.model_config import load_model, model_from_dict
from estimators.parallelism.plan import RECOMPUTE, ParallelPlan, validate_plan
from estimators.parallelism.search import (CollectiveLine, SearchSpace, enumerate_candidates, memory_gib, plan_of_row,
                                    rank_plans)
from estimators.parallelism.evaluate import predict, rank_candidate_plans
from replay.hardware.network import NetworkModel

SMALL = model_from_dict(dict(name="small", layers=8, hidden=1024, heads=16, kv_heads=4, ffn=3584, vocab=32000))
MOE = model_from_dict(dict(name="moe", layers=4, hidden=512, heads=8, ffn=0, vocab=8000,
                           moe=dict(num_experts=8, top_k=2, expert_ffn=1024)))
# DeepSeek-like: a dense first layer, a shared expert, an MTP module on the last stage
DEEP = model_from_dict(dict(name="deep", layers=5, hidden=512, heads=8, ffn=2048, vocab=8000, mtp_layers=1,
                            moe=dict(num_experts=8, top_k=2, expert_ffn=512, shared_experts=1, first_dense_layers=1)))
GPT = model_from_dict(dict(name="gpt", layers=6, hidden=1024, heads=16, ffn=4096, vocab=50257, activation="gelu",
                           norm="layernorm", position="learned", max_seq=2048, tied_embeddings=True, bias=True))


def _ranks(x) -> np.ndarray:
    return np.argsort(np.argsort(np.asarray(x)))


def spearman(a, b) -> float:
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def _rows(cols) -> set[tuple]:
    return set(zip(*(cols[k].tolist() for k in sorted(cols))))


def test_candidates_are_exactly_the_valid_plans_up_to_equivalent_duplicates():
    """Brute force over the same option grid with validate_plan, each plan mapped to its representative
    (SP without TP, selective recompute under flash attention, ZeRO without a DP group, p2p overlap
    without a pipeline, async TP where SP already overlaps are no-ops), equals the enumeration."""
    space = SearchSpace(micro_batches=(1, 2), max_cp=4, min_cp_tokens=512)
    gpus, seq, gb = 8, 2048, 16
    cols = enumerate_candidates(SMALL, gpus, seq, gb, 8, space)
    brute = set()
    for tp, cp, pp in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8)):
        if gpus % (tp * cp * pp):
            continue
        dp = gpus // (tp * cp * pp)
        for vp, mb, rc, z, g, sp, ogr, op2p, atp in itertools.product(
                range(1, 9), (1, 2), space.recompute, (0, 1, 2, 3), (0, 2, 4), (True, False), (0, 1), (0, 1), (0, 1)):
            plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=dp, vp=vp, seq_len=seq, global_batch=gb, micro_batch=mb,
                                recompute=rc, zero=z, dp_shard=g, sequence_parallel=sp)
            try:
                validate_plan(SMALL, plan, gpus)
            except TraceInputError:
                continue
            if g and g >= dp:
                continue  # a shard group of all DP ranks is plain ZeRO-3
            rc_i = RECOMPUTE.index(rc)
            if rc == "selective":
                continue  # flash attention keeps no scores: selective recompute is "none"
            if tp == 1:
                sp = True
            if dp * cp == 1:
                z, ogr = 0, 1
            if pp == 1:
                op2p = 1
            if not (tp > 1 and not sp):
                atp = 1
            brute.add((atp, cp, dp, g, 1, mb, ogr, op2p, pp, rc_i, int(sp), tp, vp, z))
    assert sorted(cols) == sorted(("async_tp_comm", "cp", "dp", "dp_shard", "ep", "micro_batch",
                                   "overlap_grad_reduce", "overlap_p2p", "pp", "recompute", "sequence_parallel",
                                   "tp", "vp", "zero"))
    assert len(cols["tp"]) == len(_rows(cols)) == len(brute)
    assert _rows(cols) == brute


@pytest.mark.parametrize("model,gpus,seq,gb", [(load_model("llama3-70b"), 256, 8192, 256), (MOE, 16, 1024, 32),
                                               (GPT, 16, 2048, 32), (DEEP, 16, 1024, 32)])
def test_vectorized_memory_equals_estimate_memory(model, gpus, seq, gb):
    space = SearchSpace(attention="unfused") if model is GPT else SearchSpace()
    cols = enumerate_candidates(model, gpus, seq, gb, 8, space)
    mem = memory_gib(model, cols, seq, gb, space.attention)
    rows = np.random.default_rng(1).choice(len(mem), 40, replace=False)
    if model is DEEP:   # every ZeRO-3 plan too: the gathered working layers (experts by EP, a dense first layer)
        rows = np.union1d(rows, np.flatnonzero(cols["zero"] == 3))
    for i in rows:
        plan = plan_of_row(cols, int(i), seq, gb, "bf16", 8, space.attention)
        assert mem[i] == pytest.approx(estimate_memory(model, plan).total_gib, rel=1e-9), plan


@pytest.mark.parametrize("comm,ranks", [
    (CommType.ALL_REDUCE, tuple(range(8))), (CommType.ALL_REDUCE, tuple(range(0, 256, 8))),
    (CommType.REDUCE_SCATTER, tuple(range(0, 64, 2))), (CommType.ALL_GATHER, tuple(range(16))),
    (CommType.ALL_TO_ALL, tuple(range(0, 32, 4)))])
def test_collective_lines_equal_the_network_model(comm, ranks):
    net = NetworkModel("h100-sxm")
    line = CollectiveLine(net, comm, ranks)
    sizes = np.array([4096.0, 1e6, 3.3e7, 8e8])
    want = [net.collective_us(comm, s, ranks) for s in sizes]
    assert line.time_us(sizes) == pytest.approx(want, rel=1e-9)


def test_analytic_estimate_ranks_plans_like_the_simulation():
    """20 plans spread over the ranked order of llama3-8b on 16 GPUs, estimate against replay."""
    m = load_model("llama3-8b")
    r = rank_plans(m, "h100-sxm", 16, 4096, 64)
    rows = r.order[np.linspace(0, r.fitting - 1, 20).astype(int)]
    est, sim = [], []
    for i in rows:
        est.append(r.step_s[i])
        sim.append(predict(m, r.plan(int(i)), r.hardware).step_time_s)
    est, sim = np.array(est), np.array(sim)
    assert spearman(est, sim) >= 0.9
    assert np.all(np.abs(est / sim - 1) < 0.15)


def test_best_of_simulated_top_10_is_within_2_percent_of_brute_force_best():
    """Every fitting plan of a 4-layer model on 8 GPUs simulated (~260 plans, a few seconds)."""
    tiny = model_from_dict(dict(name="tiny", layers=4, hidden=1024, heads=16, kv_heads=4, ffn=3584, vocab=32000))
    space = SearchSpace(micro_batches=(1, 2), recompute=("none", "full"), zero=(1, 3), hsdp=False, overlap_modes=False)
    r = rank_plans(tiny, "h100-sxm", 8, 4096, 32, space=space)
    assert r.fitting > 200
    sim = {int(i): predict(tiny, r.plan(int(i)), r.hardware).step_time_s for i in r.order}
    best_all = min(sim.values())
    best_top = min(sim[int(i)] for i in r.order[:10])
    assert best_top <= best_all * 1.02
    assert spearman([r.step_s[i] for i in sim], list(sim.values())) >= 0.9


def test_search_covers_recompute_zero_micro_batch_and_sp_options_and_returns_plans_that_fit():
    m = load_model("llama3-8b")
    r = rank_plans(m, "h100-sxm", 8, 8192, 32, space=SearchSpace(attention="unfused"))
    assert 0 < r.fitting < r.candidates  # some plans do not fit in 80 GB
    c = {k: set(v[r.order].tolist()) for k, v in r.columns.items()}
    assert c["recompute"] == {0, 1, 2}
    assert c["zero"] == {0, 1, 2, 3} and len(c["dp_shard"]) > 1
    assert {1, 2, 4} <= c["micro_batch"]
    assert c["sequence_parallel"] == {0, 1} and c["overlap_grad_reduce"] == {0, 1} and c["overlap_p2p"] == {0, 1}
    assert len(c["cp"]) > 1 and len(c["vp"]) > 1
    plans = rank_candidate_plans(m, "h100-sxm", 8, 8192, 32, max_plans=None)
    assert len(plans) == rank_plans(m, "h100-sxm", 8, 8192, 32).fitting
    cap = 80e9 / 1024 ** 3
    for p in plans[:: max(1, len(plans) // 50)]:
        validate_plan(m, p, 8)
        assert not estimate_memory(m, p, cap).oom
    assert len(rank_candidate_plans(m, "h100-sxm", 8, 8192, 32)) == 24


def test_cli_search_reports_candidates_and_speed():
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "parallelism", "--model", "llama3-8b",
                        "--gpus", "16", "--seq-len", "4096", "--global-batch", "64", "--search", "--top-k", "3",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert len(rows) == 3 and all("analytic_step_time_s" in r and "step_time_s" in r for r in rows)
    assert "candidate plans" in p.stderr and "plans/s" in p.stderr


def test_top_k_skips_plans_whose_estimate_and_memory_repeat_a_better_one():
    import dataclasses
    r = rank_plans(load_model("llama3-8b"), "h100-sxm-roofline", 64, 8192, 512)
    # make the 2nd and 4th ranked plans repeat the 1st one's estimate and memory exactly
    step, mem = r.step_s.copy(), r.memory_gib.copy()
    for j in (1, 3):
        step[r.order[j]], mem[r.order[j]] = step[r.order[0]], mem[r.order[0]]
    r = dataclasses.replace(r, step_s=step, memory_gib=mem)
    top = r.top(10)
    assert top[0] == r.order[0] and len(top) == 10
    assert r.order[1] not in top and r.order[3] not in top and r.order[2] in top
    keys = {(round(float(r.step_s[i]), 9), round(float(r.memory_gib[i]), 6)) for i in top}
    assert len(keys) == 10
    positions = [int(np.flatnonzero(r.order == i)[0]) for i in top]
    assert positions == sorted(positions)
    assert list(r.top(10, distinct=False)) == list(r.order[:10])


def test_search_table_shows_every_plan_at_80_columns(capsys):
    """Piped output is 80 columns wide: the plan column must survive (it once shrank to nothing)."""
    from lumos_sim.cli import main as cli_main
    assert cli_main(["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "16", "--seq-len", "4096",
                     "--global-batch", "64", "--search", "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert sum(line.lstrip().startswith(f"{i} ") and "TP" in line for i in (1, 2, 3) for line in out.splitlines()) == 3
