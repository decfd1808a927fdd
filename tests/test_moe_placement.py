"""Expert placements: the public EPLB reference case, load balance never worse than Megatron's layout,
and locality + domain grouping cutting inter-node all-to-all bytes on domain-clustered routing."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_shared
from estimators.moe.evaluate import Layout, evaluate_placements, fit_stats
from estimators.moe.placement import (PLACEMENTS, PlacementOptions, RoutingStats, fit_placement, gpu_loads,
                                      max_over_mean, rebalance_hierarchical)
from estimators.moe.synthetic import SyntheticSource, SyntheticSpec


def _eplb_reference_case():
    """(loads, physical-to-logical map) of the EPLB README example, as moe.md quotes it."""
    text = require_shared("reference", "moe.md").read_text()
    arrays = re.findall(r"`(\[\[[\d,\s\[\]]+\]\])`", text)
    loads, expected = (np.array(eval(a)) for a in arrays[:2])  # noqa: S307 (digits, commas, brackets only)
    return loads.astype(float), expected


def test_eplb_hierarchical_policy_reproduces_the_published_map():
    loads, expected = _eplb_reference_case()
    got = rebalance_hierarchical(loads, slots=16, groups=4, nodes=2, gpus=8)
    assert got.tolist() == expected.tolist()


def test_eplb_placement_registry_entry_gives_the_published_map():
    loads, expected = _eplb_reference_case()
    stats = RoutingStats(loads, np.zeros((2, 2, 12)), None, 0, gpus=8, gpus_per_node=4)
    p = fit_placement("eplb", stats, PlacementOptions(redundant_experts=4, groups=4))
    assert p.slot_expert.tolist() == expected.tolist()
    assert p.slots_per_gpu == 2 and "hierarchical" in p.note


def _stats(seed: int, skew: float, E=64, G=16, gpn=4, L=2) -> RoutingStats:
    rng = np.random.default_rng(seed)
    load = np.stack([rng.permutation(np.arange(1, E + 1.0) ** -skew * 1e4).round() + rng.integers(0, 50, E)
                     for _ in range(L)])
    return RoutingStats(load, np.zeros((L, G // gpn, E)), None, 0, G, gpn)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), skew=st.floats(0.0, 2.0), redundant=st.sampled_from([0, 16]))
def test_balanced_and_eplb_fallback_never_load_a_gpu_more_unevenly_than_contiguous(seed, skew, redundant):
    # exact EPLB (`eplb`) can lose to contiguous on nearly flat loads (seed 940469, skew 0.1875): the
    # guarantee belongs to the policy with the fallback
    stats = _stats(seed, skew)
    contiguous = max_over_mean(gpu_loads(fit_placement("contiguous", stats), stats.load))
    for name, opts in (("balanced", PlacementOptions()),
                       ("eplb-fallback", PlacementOptions(redundant_experts=redundant))):
        ratio = max_over_mean(gpu_loads(fit_placement(name, stats, opts), stats.load))
        assert (ratio <= contiguous + 1e-9).all(), name


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_every_placement_puts_each_expert_somewhere_with_equal_slots_per_gpu(name):
    src = SyntheticSource(SyntheticSpec(tokens=4096, layers=2, experts=32, top_k=4, domains=2))
    stats = fit_stats(src, 0, 4096, Layout(8, 4, 128), 32)
    p = fit_placement(name, stats, PlacementOptions(redundant_experts=8 if name.startswith("eplb") else 0))
    for layer in range(2):
        assert set(p.slot_expert[layer].tolist()) == set(range(32))
        routes = p.routes(layer)
        assert np.allclose(routes.sum(-1), 1.0)
    assert p.slots == (40 if name.startswith("eplb") else 32)


# DeepSeek-V3 shape: 256 experts, top-8, EP64 on 8 nodes; one domain per node, half of a token's experts
# from its domain's co-activation clusters
DSV3 = dict(layers=3, experts=256, top_k=8, domains=8, cluster_affinity=0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_locality_with_domain_grouping_cuts_inter_node_bytes_by_15_percent(seed):
    src = SyntheticSource(SyntheticSpec(tokens=2 * 64 * 512, seed=seed, **DSV3))
    half = src.tokens // 2
    grouped, plain = Layout(64, 8, 512, "domain"), Layout(64, 8, 512)
    local = fit_placement("locality", fit_stats(src, 0, half, grouped, 256))
    contiguous = fit_placement("contiguous", fit_stats(src, 0, half, plain, 256, coactivation_tokens=0))
    after = evaluate_placements(src, half, src.tokens, grouped, 256, [local], None)[0]
    before = evaluate_placements(src, half, src.tokens, plain, 256, [contiguous], None)[0]
    reduction = 1 - after.a2a_bytes_inter_node.sum() / before.a2a_bytes_inter_node.sum()
    assert reduction >= 0.15, reduction


def test_locality_without_domain_structure_saves_nothing_worth_claiming():
    src = SyntheticSource(SyntheticSpec(tokens=2 * 64 * 256, layers=2, experts=256, top_k=8, balanced=1))
    half = src.tokens // 2
    lay = Layout(64, 8, 256, "none")
    stats = fit_stats(src, 0, half, lay, 256)
    costs = evaluate_placements(src, half, src.tokens, lay, 256,
                                [fit_placement("locality", stats), fit_placement("contiguous", stats)], None)
    assert costs[0].a2a_bytes_inter_node.sum() == pytest.approx(costs[1].a2a_bytes_inter_node.sum(), rel=0.02)
