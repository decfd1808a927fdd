"""Timing pieces of the MoE what-if: the non-uniform all-to-all and grouped expert GEMMs agree with the
uniform / batched models where they should, and per-pair sizes reach the network model from the graph."""
from __future__ import annotations

import numpy as np
import pytest

from chakra_schema.graph import CommType
from estimators.model_config import load_model
from estimators.parallelism.plan import ParallelPlan
from estimators.parallelism.workload import MoELoads, generate
from replay.hardware.compute import ComputeModel
from replay.hardware.network import NetworkModel


@pytest.mark.parametrize("n", [8, 16, 64])
def test_uniform_all_to_all_v_equals_the_uniform_all_to_all(n):
    net = NetworkModel("h100-sxm")
    size = 32e6
    assert net.all_to_all_v_us(np.full((n, n), size / n), range(n)) == pytest.approx(
        net.collective_us(CommType.ALL_TO_ALL, size, range(n)), rel=1e-9)


def test_skewed_all_to_all_v_is_held_up_by_the_hot_receiver():
    net = NetworkModel("h100-sxm")
    even = np.full((16, 16), 1e6)
    hot = even.copy()
    hot[:, 3] *= 4
    hot *= even.sum() / hot.sum()                    # same total bytes, one GPU receives 4x
    assert net.all_to_all_v_us(hot, range(16)) > 1.5 * net.all_to_all_v_us(even, range(16))


def test_grouped_gemm_of_equal_groups_is_the_batched_gemm():
    c = ComputeModel("h100-sxm")
    assert c.grouped_gemm([512] * 4, 4096, 7168).time_us == c.gemm(512, 4096, 7168, batch=4).time_us
    uneven = c.grouped_gemm([1024, 512, 512, 0], 4096, 7168).time_us
    assert uneven == pytest.approx(c.gemm(1024, 4096, 7168).time_us + c.gemm(512, 4096, 7168, batch=2).time_us)
    assert c.grouped_gemm([0, 0], 10, 10).time_us == c.grouped_gemm([], 10, 10).time_us


def test_workload_carries_measured_pair_sizes_and_expert_tokens_per_micro_batch():
    model = load_model("deepseek-v3")
    import dataclasses
    model = dataclasses.replace(model, layers=5)
    plan = ParallelPlan(ep=8, dp=8, seq_len=1024, global_batch=16)
    rng = np.random.default_rng(0)
    loads = MoELoads(rng.integers(1, 100, (2, 2, 8, 8)).astype(float), rng.integers(1, 500, (2, 2, 8, 32)))
    g = generate(model, plan, moe_loads=loads)[0]
    a2a = [i for i in range(len(g)) if (g.attrs.get(i) or {}).get("comm_pair_bytes") is not None]
    experts = [g.attrs[i] for i in range(len(g)) if (g.attrs.get(i) or {}).get("op") == "grouped_gemm"]
    assert len(a2a) == 2 * 2 * 4                    # micro-batches x MoE layers x (2 fwd + 2 bwd)
    assert {len(a["ms"]) for a in experts} == {32}
    plain = generate(model, plan)[0]
    assert not any((plain.attrs.get(i) or {}).get("op") == "grouped_gemm" for i in range(len(plain)))
    with pytest.raises(ValueError, match="MoE layers on EP8"):
        generate(dataclasses.replace(model, layers=6), plan, moe_loads=loads)
