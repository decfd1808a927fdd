"""`whatif parallelism --search` honours the plan flags given with it (--zero, --tp, --pp, --cp, --dp, --ep,
--vp, --recompute, --micro-batch, --no-sequence-parallel) as constraints, and only those; the options it does
not search (--moe-a2a, --moe-capacity-factor, ...) hold for every plan it ranks."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from estimators.model_config import load_model
from estimators.parallelism.search import SearchSpace, enumerate_candidates


def _search(*args):
    return subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "parallelism", "--model", "llama3-8b",
                           "--gpus", "16", "--seq-len", "4096", "--global-batch", "64", "--search", "--top-k", "3",
                           "--json", *args], capture_output=True, text=True, timeout=600)


def test_zero_1_given_with_search_returns_only_zero_1_plans():
    """The reported bug: `--zero 1` (also the default value) was ignored and ZeRO-3 plans came back."""
    p = _search("--zero", "1")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and all(r["plan"]["zero"] == 1 for r in rows)


def test_layout_and_option_flags_are_all_honoured():
    p = _search("--tp", "2", "--pp", "2", "--micro-batch", "2", "--recompute", "full", "--zero", "3")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows
    for r in rows:
        plan = r["plan"]
        assert (plan["tp"], plan["pp"], plan["dp"], plan["micro_batch"], plan["recompute"], plan["zero"]) == \
            (2, 2, 4, 2, "full", 3)


def test_per_op_checkpointing_and_fsdp2_options_given_with_search_hold_for_every_plan():
    """`--recompute op` (not in the default space: a PyTorch policy) is searched when asked for, and the FSDP2
    options ride along with every ZeRO-3 plan ranked."""
    p = _search("--recompute", "op", "--zero", "3", "--fsdp", "fsdp2", "--fsdp-reduce-dtype", "bf16")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows
    for r in rows:
        plan = r["plan"]
        assert (plan["recompute"], plan["zero"], plan["fsdp"], plan["fsdp_reduce_dtype"]) == ("op", 3, "fsdp2", "bf16")
    free = enumerate_candidates(load_model("llama3-8b"), 16, 4096, 64)
    from estimators.parallelism.plan import RECOMPUTE
    assert "op" not in {RECOMPUTE[i] for i in free["recompute"].tolist()}


@pytest.mark.parametrize("setting,field,value", [("plan.recompute=op", "recompute", "op"), ("plan.zero=1", "zero", 1),
                                                 ("plan.tp=2", "tp", 2)])
def test_set_plan_fields_hold_the_search_as_their_flags_do(setting, field, value):
    """`--set plan.zero=1` was ignored by the search (ZeRO-3 plans came back) while `--zero 1` held it."""
    p = _search("--set", setting)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and all(r["plan"][field] == value for r in rows)


def test_a_constraint_no_plan_meets_is_a_one_line_error_naming_it():
    p = _search("--tp", "16")     # TP stays inside an 8-GPU node
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--tp 16" in p.stderr, p.stderr
    p = _search("--recompute", "sometimes")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--recompute" in p.stderr, p.stderr


@pytest.mark.parametrize("fixed", [dict(zero=1), dict(tp=4), dict(pp=2, vp=2), dict(cp=2, micro_batch=1),
                                   dict(recompute="none", zero=3), dict(ep=8, dp=16)])
def test_constrained_space_is_the_unconstrained_one_filtered(fixed):
    """Every plan of the constrained search is a plan of the free search with those values, and every plan
    of the free search with those values (where no equivalent duplicate was dropped) is kept."""
    model = load_model("llama4-scout" if "ep" in fixed else "llama3-8b")
    free = enumerate_candidates(model, 64, 8192, 256)
    con = enumerate_candidates(model, 64, 8192, 256, space=SearchSpace.constrained(**fixed))
    assert len(con["tp"]) > 0

    def value(cols, key):
        from estimators.parallelism.plan import RECOMPUTE
        return cols[key] if key != "recompute" else np.array(RECOMPUTE)[cols[key]]

    for key, v in fixed.items():
        assert np.all(value(con, key) == v)
    names = sorted(free)
    rows = lambda c: {tuple(int(c[k][i]) for k in names) for i in range(len(c["tp"]))}  # noqa: E731
    mask = np.ones(len(free["tp"]), bool)
    for key, v in fixed.items():
        mask &= value(free, key) == v
    # ZeRO stages without a DP group are one plan; the free search keeps ZeRO-0 for it, a constraint its stage
    mask &= (free["dp"] * free["cp"] > 1) | ("zero" not in fixed)
    kept = rows({k: v[mask] for k, v in free.items()})
    assert kept <= rows(con)
    assert rows(con) - rows(free) <= {r for r in rows(con) if r[names.index("dp")] * r[names.index("cp")] == 1}


def test_bad_constraint_values_are_one_line_errors():
    for kw in (dict(zero=4), dict(tp=0), dict(recompute="some"), dict(micro_batch=True)):
        with pytest.raises(TraceInputError):
            SearchSpace.constrained(**kw)


def test_moe_options_given_with_search_hold_for_every_ranked_and_simulated_plan():
    """--moe-capacity-factor, --moe-a2a (and --set plan.moe_a2a_overlap=...) are not searched: every plan the
    search ranks and simulates takes them as given, instead of the dropless NCCL all-to-all default."""
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "parallelism", "--model", "qwen3-30b-a3b",
                        "--gpus", "16", "--seq-len", "4096", "--global-batch", "64", "--search", "--top-k", "2",
                        "--json", "--moe-capacity-factor", "1", "--moe-a2a", "deepep",
                        "--set", "plan.moe_a2a_overlap=true"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows
    for r in rows:
        assert (r["plan"]["moe_capacity_factor"], r["plan"]["moe_a2a"], r["plan"]["moe_a2a_overlap"]) == \
            (1.0, "deepep", True)
        assert r["moe_sync_wait_us"] == 0                   # token drop: no token-count sync


def test_the_analytic_ranking_prices_the_carried_moe_options():
    from estimators.parallelism.plan import ParallelPlan
    from estimators.parallelism.search import carried_options, rank_plans
    from estimators.parallelism.workload import MOE_SYNC_IDLE_US
    model = load_model("qwen3-30b-a3b")
    # whole-iteration CUDA graphs on both: no host-bound layer wait, only the dropless sync sets them apart
    space = SearchSpace(micro_batches=(1,), recompute=("none",), zero=(1,), hsdp=False, overlap_modes=False,
                        tp=(1,), pp=(1,), cp=(1,), ep=(16,), carry=carried_options(ParallelPlan(cuda_graphs=True)))
    dropless = rank_plans(model, "h100-sxm", 16, 4096, 32, "bf16", space)
    drop = rank_plans(model, "h100-sxm", 16, 4096, 32, "bf16",
                      SearchSpace(**{**space.__dict__,
                                     "carry": carried_options(ParallelPlan(moe_capacity_factor=1.0, cuda_graphs=True))}))
    i, j = int(dropless.order[0]), int(drop.order[0])
    assert drop.plan(j).moe_capacity_factor == 1.0 and dropless.plan(i).moe_capacity_factor == 0
    # the dropless plan waits for the host once per MoE layer forward: 48 layers x 2 micro-batches
    assert dropless.step_s[i] - drop.step_s[j] == pytest.approx(48 * 2 * MOE_SYNC_IDLE_US / 1e6, rel=0.25)
