"""DeepSeek's EPLB, exactly: the published README example (github.com/deepseek-ai/EPLB) and cases derived
by hand from the algorithm's definition (balanced packing, replication by load per copy, hierarchical /
global policy), through the module, the placement registry and the CLI (`--expert-load`)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from estimators.moe.eplb import gpu_loads, pack_evenly, rebalance, replicate
from estimators.moe.placement import PlacementOptions, RoutingStats, fit_placement
from lumos_sim.cli import main

# github.com/deepseek-ai/EPLB README, "Interface and Example": 2 layers x 12 experts, 16 replicas, 4 groups,
# 2 nodes, 8 GPUs; the printed phy2log. (logical counts: how often each expert appears in that map)
README_WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def test_readme_example_gives_the_published_map_and_counts():
    r = rebalance(np.array(README_WEIGHT), 16, 4, 2, 8)
    assert r.policy == "hierarchical"
    assert r.physical_to_logical.tolist() == README_PHY2LOG
    counts = [np.bincount(row, minlength=12).tolist() for row in README_PHY2LOG]
    assert r.logical_count.tolist() == counts
    # replica ranks number each expert's copies 0, 1, ... in slot order within a GPU's pack
    for layer in range(2):
        for e in range(12):
            ranks = sorted(r.replica_rank[layer, r.physical_to_logical[layer] == e].tolist())
            assert ranks == list(range(counts[layer][e]))


def test_placement_registry_and_per_gpu_loads_match_the_readme_map():
    w = np.array(README_WEIGHT, float)
    stats = RoutingStats(w, np.zeros((2, 2, 12)), None, 0, gpus=8, gpus_per_node=4)
    p = fit_placement("eplb", stats, PlacementOptions(redundant_experts=4, groups=4))
    assert p.slot_expert.tolist() == README_PHY2LOG
    # GPU 0 of layer 0 holds experts 5 and 6: 165 / 2 (expert 5 has two copies) + 39
    loads = gpu_loads(np.array(README_PHY2LOG), np.array([np.bincount(r, minlength=12) for r in README_PHY2LOG]), w, 8)
    assert loads[0, 0] == pytest.approx(165 / 2 + 39)


def test_global_policy_by_hand():
    # weights [10, 1, 1, 1], 6 slots on 2 GPUs. Replication: expert 0 twice more (10 > 1, then 5 > 1):
    # slots [0,1,2,3,0,0], per-copy loads [10/3, 1, 1, 1, 10/3, 10/3]. Packing 3 per GPU, heaviest first,
    # equal loads by index, ties to the lower GPU: slot0->G0, slot4->G1, slot5->G0 (tie), slot1->G1,
    # slot2->G1 (4.33 < 6.67), slot3->G0 (G1 full). GPU0 = slots 0,5,3, GPU1 = slots 4,1,2.
    r = rebalance(np.array([[10.0, 1, 1, 1]]), slots=6, groups=1, nodes=1, gpus=2)
    assert r.physical_to_logical.tolist() == [[0, 0, 3, 0, 1, 2]]
    assert r.logical_count.tolist() == [[3, 1, 1, 1]]
    assert r.replica_rank.tolist() == [[0, 2, 0, 1, 0, 0]]
    loads = gpu_loads(r.physical_to_logical, r.logical_count, np.array([[10.0, 1, 1, 1]]), 2)
    assert loads[0].tolist() == pytest.approx([10 / 3 + 10 / 3 + 1, 10 / 3 + 1 + 1])


def test_hierarchical_policy_on_equal_loads_is_not_the_contiguous_layout():
    # 8 experts of load 1 in 4 groups on 2 nodes x 2 GPUs, no redundancy. Groups onto nodes by equal sums:
    # g0->N0, g1->N1, g2->N0 (tie to the lower node), g3->N1; node 0 holds experts 0,1,4,5, node 1 2,3,6,7;
    # within a node the 4 equal experts alternate over its 2 GPUs: [0,4 | 1,5 | 2,6 | 3,7]. EPLB deploys
    # this even though the contiguous layout is just as balanced.
    r = rebalance(np.ones((1, 8)), slots=8, groups=4, nodes=2, gpus=4)
    assert r.physical_to_logical.tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    stats = RoutingStats(np.ones((1, 8)), np.zeros((1, 2, 8)), None, 0, gpus=4, gpus_per_node=2)
    assert fit_placement("eplb", stats, PlacementOptions(groups=4)).slot_expert.tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]


def test_groups_that_the_nodes_do_not_divide_use_the_global_policy():
    # DeepSeek-V3 decode: 8 groups on 18 nodes (EP144) -> global, the same map as one group on one node
    w = np.random.default_rng(3).integers(1, 1000, (3, 256)).astype(float)
    r = rebalance(w, 288, 8, 18, 144)
    g = rebalance(w, 288, 1, 1, 144)
    assert r.policy == "global" and (r.physical_to_logical == g.physical_to_logical).all()
    assert r.physical_to_logical.shape == (3, 288)
    assert (np.bincount(r.physical_to_logical[0], minlength=256) >= 1).all()


def test_packing_and_replication_steps_by_hand():
    pack, rank = pack_evenly(np.array([[5.0, 5, 3, 1]]), 2)
    # 5 (item 0) -> P0, 5 (item 1) -> P1, 3 -> P0 (5 = 5: lower pack), 1 -> P1
    assert pack.tolist() == [[0, 1, 0, 1]] and rank.tolist() == [[0, 0, 1, 1]]
    slot, rk, cnt = replicate(np.array([[6.0, 4, 3]]), 5)
    # copies: 6 -> expert 0 (per copy 3), then max(3, 4, 3) = expert 1
    assert slot.tolist() == [[0, 1, 2, 0, 1]] and cnt.tolist() == [[2, 2, 1]] and rk.tolist() == [[0, 0, 0, 1, 1]]


def test_float32_arithmetic_decides_near_ties_as_the_original():
    # 16777217 is not a float32: it rounds to 16777216, a tie with expert 1, which the first index wins
    slot, _, _ = replicate(np.array([[16777216.0, 16777217.0]]), 3)
    assert slot.tolist() == [[0, 1, 0]]


@pytest.mark.parametrize("args,message", [
    ((12, 15, 4, 2, 8), "15 physical expert slots do not divide over 8 GPUs"),
    ((12, 16, 5, 1, 8), "5 expert groups do not divide the 12 experts"),
    ((12, 8, 4, 2, 8), "fewer than the 12 experts"),
])
def test_inputs_eplb_rejects_are_one_line_errors(args, message):
    E, slots, groups, nodes, gpus = args
    with pytest.raises(TraceInputError, match=message):
        rebalance(np.ones((1, E)), slots, groups, nodes, gpus)


def test_cli_expert_load_is_balanced_as_given(tmp_path, capsys):
    # DeepSeek-V3 (8 groups) cut to 2 MoE layers, EP16 on 2 nodes, 16 redundant: hierarchical policy on the
    # loads themselves (not on tokens sampled from them)
    w = np.random.default_rng(7).integers(1, 10_000, (2, 256))
    (tmp_path / "loads.json").write_text(json.dumps(w.tolist()))
    code = main(["whatif", "moe", "--model", "deepseek-v3", "--ep", "16", "--set", "model.layers=5",
                 "--expert-load", str(tmp_path / "loads.json"), "--placement", "eplb", "--redundant-experts", "16",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    want = rebalance(w.astype(float), 272, 8, 2, 16)
    assert out["physical_to_logical"] == want.physical_to_logical.tolist()
    loads = gpu_loads(want.physical_to_logical, want.logical_count, w, 16)
    assert out["max_over_mean_gpu_load_per_layer"] == pytest.approx((loads.max(1) / loads.mean(1)).tolist(), rel=1e-3)


def test_eplb_and_eplb_fallback_are_reported_side_by_side(tmp_path, capsys):
    w = np.random.default_rng(11).integers(900, 1100, (2, 256))     # nearly flat loads
    (tmp_path / "loads.json").write_text(json.dumps(w.tolist()))
    code = main(["whatif", "moe", "--model", "deepseek-v3", "--ep", "16", "--set", "model.layers=5",
                 "--expert-load", str(tmp_path / "loads.json"), "--placement", "eplb", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    exact = rebalance(w.astype(float), 256, 8, 2, 16)
    loads = gpu_loads(exact.physical_to_logical, exact.logical_count, w, 16)
    assert d["fit_max_over_mean_gpu_load_eplb"] == pytest.approx(float((loads.max(1) / loads.mean(1)).mean()))
    assert d["fit_max_over_mean_gpu_load_eplb_fallback"] <= d["fit_max_over_mean_gpu_load_eplb"] + 1e-12
    assert 0 <= d["eplb_fallback_layers_changed"] <= 2
