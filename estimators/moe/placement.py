"""Expert placements: which GPU serves which experts, per MoE layer (a registry).

A `Placement` maps physical expert slots to logical experts per layer (`slot_expert` [layers, slots]);
slot p sits on GPU p // slots_per_gpu. Without redundant experts there is one slot per expert; EPLB adds
redundant slots for hot experts, and traffic to a replicated expert goes to a replica on the token's
own node when there is one, else is split evenly over the replicas.

Placements are fitted on `RoutingStats` of one part of a trace (per-expert loads, loads by source node,
co-activation) and evaluated on another (`estimators.moe.evaluate`).

- `contiguous`: experts [g*E/G, (g+1)*E/G) on GPU g (Megatron's default).
- `round-robin`: expert e on GPU e mod G.
- `balanced`: greedy largest-first packing of experts by load onto GPUs, equal expert count per GPU
  (kept only where it beats contiguous on the fit data).
- `eplb`: DeepSeek's EPLB exactly (`estimators.moe.eplb`): hierarchical (expert groups packed onto nodes,
  redundant copies of hot experts within each node, replicas packed onto the node's GPUs) when the nodes
  divide the groups, else the global policy (one group, one node).
- `eplb-fallback`: EPLB, with a per-layer fallback (global policy, then contiguous) where EPLB's layout
  loads a GPU more unevenly than contiguous; a different answer from EPLB on those layers.
- `locality`: experts partitioned onto nodes (capacity E/nodes experts, and a node token load within
  10% of the mean so no node's links become the hot spot) to maximise (token, expert) pairs whose
  expert sits on the token's own node, with co-activated experts (a networkx co-activation graph) kept
  together as the second objective; then balanced packing onto the node's GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from chakra_schema.errors import TraceInputError
from estimators.moe.eplb import _inverse as _inverse_perm
from estimators.moe.eplb import pack_evenly, rebalance as eplb_rebalance, replicate
from estimators.moe.eplb import rebalance_hierarchical as _eplb_hierarchical


@dataclass(frozen=True)
class RoutingStats:
    """What placements are fitted on: (token, expert) pair counts of a part of a trace."""

    load: np.ndarray                   # [L, E] pairs per expert
    node_load: np.ndarray              # [L, nodes, E] pairs from tokens held on each node
    coactivation: np.ndarray | None    # [L, E, E] tokens choosing both experts (sampled), or None
    tokens: int
    gpus: int
    gpus_per_node: int

    @property
    def layers(self) -> int:
        return self.load.shape[0]

    @property
    def experts(self) -> int:
        return self.load.shape[1]

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


@dataclass(frozen=True)
class PlacementOptions:
    redundant_experts: int = 0         # eplb: extra physical slots for hot experts
    groups: int = 0                    # eplb: expert groups (0: one group, i.e. no node-limited routing)
    coactivation_weight: float = 0.1   # locality: weight of keeping co-activated experts together
    locality_load_slack: float = 0.1   # locality: node token load at most (1 + slack) x the mean


@dataclass(frozen=True)
class Placement:
    name: str
    slot_expert: np.ndarray            # [L, S] logical expert of each physical slot
    gpus: int
    gpus_per_node: int
    experts: int
    note: str = ""

    @property
    def slots(self) -> int:
        return self.slot_expert.shape[1]

    @property
    def slots_per_gpu(self) -> int:
        return self.slots // self.gpus

    def gpu_of_slot(self) -> np.ndarray:
        return np.arange(self.slots) // self.slots_per_gpu

    def routes(self, layer: int) -> np.ndarray:
        """[nodes, E, G]: share of the pairs from a token on node n to expert e that GPU g serves."""
        spread, multi, local = self.route_parts(layer)
        out = np.repeat(spread[None], self.gpus // self.gpus_per_node, axis=0)
        out[:, multi] = local
        return out

    def route_parts(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`routes` in parts: (spread [E, G]: even split over the expert's replicas, the experts with
        replicas on more than one GPU [R], their routes from each node [nodes, R, G]: the replicas on
        the token's own node when it has any, else the spread)."""
        spread, multi, has, block = self.route_blocks(layer)
        nodes, gpn = self.gpus // self.gpus_per_node, self.gpus_per_node
        full = np.zeros((nodes, len(multi), nodes, gpn))
        idx = np.arange(nodes)
        full[idx, :, idx, :] = block
        local = np.where(has[:, :, None], full.reshape(nodes, len(multi), self.gpus), spread[multi][None])
        return spread, multi, local

    def route_blocks(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`route_parts` without the dense [nodes, R, G]: (spread, multi, has [nodes, R]: the node holds a
        replica of the expert, block [nodes, R, gpn]: share of the node's own GPUs in its tokens' pairs
        to the expert where it has one, else 0)."""
        nodes, gpn, E, G = self.gpus // self.gpus_per_node, self.gpus_per_node, self.experts, self.gpus
        on = np.bincount(self.slot_expert[layer].astype(np.int64) * G + self.gpu_of_slot(),
                         minlength=E * G).reshape(E, G).astype(float)
        spread = on / on.sum(1, keepdims=True)
        multi = np.flatnonzero((on > 0).sum(1) > 1)
        sub = on[multi].reshape(len(multi), nodes, gpn)
        local_sum = sub.sum(2)                                        # [R, nodes]
        has = (local_sum > 0).T                                       # [nodes, R]
        with np.errstate(invalid="ignore", divide="ignore"):
            block = np.where(has[:, :, None], (sub / local_sum[:, :, None]).transpose(1, 0, 2), 0.0)
        return spread, multi, has, block

    def slot_share(self, layer: int) -> np.ndarray:
        """[S]: share of its expert's pairs each slot serves (1 / replicas, before locality)."""
        se = self.slot_expert[layer]
        return 1.0 / np.bincount(se, minlength=self.experts)[se]


PlacementFn = Callable[[RoutingStats, PlacementOptions], Placement]
PLACEMENTS: dict[str, PlacementFn] = {}
SLOTTED = ("eplb", "eplb-fallback")    # placements with redundant slots (the others: one slot per expert)


def register_placement(name: str) -> Callable[[PlacementFn], PlacementFn]:
    def deco(fn: PlacementFn) -> PlacementFn:
        PLACEMENTS[name] = fn
        return fn
    return deco


def fit_placement(name: str, stats: RoutingStats, options: PlacementOptions = PlacementOptions()) -> Placement:
    if name not in PLACEMENTS:
        raise TraceInputError(None, f"unknown placement '{name}' (known: {', '.join(PLACEMENTS)})")
    if stats.experts % stats.gpus and name not in SLOTTED:  # eplb needs its slots (with redundancy) to divide
        raise TraceInputError(None, f"{stats.experts} experts do not divide evenly over EP{stats.gpus}")
    if stats.gpus % stats.gpus_per_node:
        raise TraceInputError(None, f"EP{stats.gpus} is not a multiple of {stats.gpus_per_node} GPUs per node")
    return PLACEMENTS[name](stats, options)


def _placement(name: str, slot_expert: np.ndarray, stats: RoutingStats, note: str = "") -> Placement:
    return Placement(name, slot_expert.astype(np.int32), stats.gpus, stats.gpus_per_node, stats.experts, note)


# ------------------------------------------------------------------------------------- simple ones
@register_placement("contiguous")
def contiguous(stats: RoutingStats, options: PlacementOptions) -> Placement:
    return _placement("contiguous", np.tile(np.arange(stats.experts), (stats.layers, 1)), stats)


@register_placement("round-robin")
def round_robin(stats: RoutingStats, options: PlacementOptions) -> Placement:
    E, G = stats.experts, stats.gpus
    per = E // G
    order = (np.arange(G)[:, None] + G * np.arange(per)[None, :]).reshape(-1)
    return _placement("round-robin", np.tile(order, (stats.layers, 1)), stats)


def max_over_mean(loads_per_gpu: np.ndarray) -> np.ndarray:
    mean = loads_per_gpu.mean(-1)
    return np.where(mean > 0, loads_per_gpu.max(-1) / np.where(mean > 0, mean, 1), 1.0)


def gpu_loads(p: Placement, load: np.ndarray) -> np.ndarray:
    """[L, G] pairs per GPU for per-expert loads [L, E] (replicas share their expert's load)."""
    out = np.zeros((p.slot_expert.shape[0], p.gpus))
    gpu = p.gpu_of_slot()
    for layer in range(out.shape[0]):
        np.add.at(out[layer], gpu, load[layer, p.slot_expert[layer]] * p.slot_share(layer))
    return out


@register_placement("balanced")
def balanced(stats: RoutingStats, options: PlacementOptions) -> Placement:
    pack, rank = balanced_packing(stats.load, stats.gpus)
    slot_expert = _inverse(pack * (stats.experts // stats.gpus) + rank)
    # largest-first is a heuristic: keep Megatron's layout for layers where it is already better
    base = np.tile(np.arange(stats.experts), (stats.layers, 1))
    p = _placement("balanced", slot_expert, stats)
    worse = max_over_mean(gpu_loads(p, stats.load)) > max_over_mean(gpu_loads(_placement("", base, stats), stats.load))
    if worse.any():
        slot_expert[worse] = base[worse]
        p = _placement("balanced", slot_expert, stats, note=f"{int(worse.sum())} layers kept contiguous")
    return p


# ------------------------------------------------------------------------------------------- EPLB
# the packing steps other placements reuse; the algorithm itself lives in estimators.moe.eplb
balanced_packing = pack_evenly
replicate_experts = replicate
_inverse = _inverse_perm


def rebalance_hierarchical(weight: np.ndarray, slots: int, groups: int, nodes: int, gpus: int) -> np.ndarray:
    """DeepSeek EPLB's hierarchical policy -> physical-to-logical map [L, slots] (see estimators.moe.eplb)."""
    return _eplb_hierarchical(weight, slots, groups, nodes, gpus).physical_to_logical


def _eplb(stats: RoutingStats, options: PlacementOptions):
    groups = options.groups or 1
    return eplb_rebalance(stats.load, stats.experts + options.redundant_experts, groups, stats.nodes, stats.gpus)


@register_placement("eplb")
def eplb(stats: RoutingStats, options: PlacementOptions) -> Placement:
    """DeepSeek's EPLB exactly: the same physical-to-logical map as the published algorithm."""
    r = _eplb(stats, options)
    note = (f"hierarchical: {options.groups or 1} groups on {stats.nodes} nodes" if r.policy == "hierarchical"
            else "global policy")
    return _placement("eplb", r.physical_to_logical, stats, note=note)


@register_placement("eplb-fallback")
def eplb_fallback(stats: RoutingStats, options: PlacementOptions) -> Placement:
    """EPLB, then per layer where its GPU load max/mean is worse than Megatron's contiguous layout (packing
    whole groups onto nodes can lose on nearly flat loads): EPLB's global policy, and without redundant
    slots the contiguous layout itself where that is still better. Never loads a GPU more unevenly than
    contiguous; differs from what EPLB deploys on those layers (it says how many)."""
    E, G = stats.experts, stats.gpus
    r = _eplb(stats, options)
    slots = E + options.redundant_experts
    slot_expert = r.physical_to_logical.copy()
    note = f"{r.policy} policy"
    if E % G:  # no contiguous layout to compare with
        return _placement("eplb-fallback", slot_expert, stats, note=note)
    base = np.tile(np.arange(E), (stats.layers, 1))
    contiguous_ratio = max_over_mean(gpu_loads(_placement("", base, stats), stats.load))
    fallbacks = [eplb_rebalance(stats.load, slots, 1, 1, G).physical_to_logical]
    if slots == E:
        fallbacks.append(base)
    replaced = np.zeros(stats.layers, bool)
    for alt in fallbacks:
        ratio = max_over_mean(gpu_loads(_placement("", slot_expert, stats), stats.load))
        worse = ratio > contiguous_ratio + 1e-12
        slot_expert[worse] = alt[worse]
        replaced |= worse
    if replaced.any():
        note += f"; {int(replaced.sum())} layers fell back (global policy / contiguous)"
    return _placement("eplb-fallback", slot_expert, stats, note=note)


# --------------------------------------------------------------------------------------- locality
def coactivation_graph(coact: np.ndarray, neighbours: int = 16):
    """networkx graph of experts, an edge to each expert's `neighbours` most co-activated experts,
    weighted by how many tokens chose both."""
    import networkx as nx
    E = coact.shape[0]
    g = nx.Graph()
    g.add_nodes_from(range(E))
    top = np.argsort(-coact, axis=1)[:, :neighbours]
    for a in range(E):
        for b in top[a]:
            w = float(coact[a, b])
            if w > 0 and a != b:
                g.add_edge(a, int(b), weight=w)
    return g


def partition_onto_nodes(affinity: np.ndarray, coact: np.ndarray, weight: float, load: np.ndarray,
                         slack: float = 0.1, max_swaps: int = 64) -> np.ndarray:
    """Experts -> nodes with E/nodes experts each, maximising sum affinity[node(e), e] + weight x
    co-activation inside nodes, with each node's token load kept within (1 + slack) x the mean (or not
    made worse where the greedy start exceeds it): greedy assignment by affinity, then best-improvement
    swaps."""
    nodes, E = affinity.shape
    part = _greedy_partition(affinity, load, (1 + slack) * load.sum() / nodes)
    node_load = np.bincount(part, weights=load, minlength=nodes)
    limit = (1 + slack) * load.sum() / nodes
    inside = coact @ np.eye(nodes)[part]                   # co-activation of e with each node's experts
    for _ in range(max_swaps):
        own_aff = affinity[part, np.arange(E)]
        moved = affinity[part]                             # [b, a]: affinity of expert a to b's node
        gain = moved.T + moved - own_aff[:, None] - own_aff[None, :]
        own_in = inside[np.arange(E), part]
        to_other = inside[:, part]                         # [a, b]: a's co-activation with b's node
        gain += weight * (to_other - own_in[:, None] + to_other.T - own_in[None, :] - 2 * coact)
        gain[part[:, None] == part[None, :]] = -np.inf
        # node loads after swapping a (node pa) and b (node pb) must stay within the limit
        delta = load[None, :] - load[:, None]              # [a, b]: pa gains b, loses a
        after_a = node_load[part][:, None] + delta
        after_b = node_load[part][None, :] - delta
        allowed = np.maximum(limit, np.maximum(node_load[part][:, None], node_load[part][None, :]))
        gain[np.maximum(after_a, after_b) > allowed + 1e-9] = -np.inf
        a, b = np.unravel_index(int(np.argmax(gain)), gain.shape)
        if gain[a, b] <= 1e-9:
            break
        pa, pb = part[a], part[b]
        part[a], part[b] = pb, pa
        node_load[pa] += load[b] - load[a]
        node_load[pb] += load[a] - load[b]
        inside[:, pa] += coact[:, b] - coact[:, a]
        inside[:, pb] += coact[:, a] - coact[:, b]
    return part


def _greedy_partition(affinity: np.ndarray, load: np.ndarray, limit: float) -> np.ndarray:
    """(node, expert) pairs by affinity, best first: the expert joins the node while the node has room
    (E/nodes experts) and stays under the load limit; experts left over go to the least loaded node
    with room."""
    nodes, E = affinity.shape
    part = np.full(E, -1)
    room = np.full(nodes, E // nodes)
    node_load = np.zeros(nodes)
    for flat in np.argsort(-affinity, axis=None, kind="stable"):
        n, e = divmod(int(flat), E)
        if part[e] < 0 and room[n] > 0 and node_load[n] + load[e] <= limit:
            part[e], room[n], node_load[n] = n, room[n] - 1, node_load[n] + load[e]
    for e in np.flatnonzero(part < 0)[np.argsort(-load[part < 0], kind="stable")]:
        n = int(np.argmin(np.where(room > 0, node_load, np.inf)))
        part[e], room[n], node_load[n] = n, room[n] - 1, node_load[n] + load[e]
    return part


@register_placement("locality")
def locality(stats: RoutingStats, options: PlacementOptions) -> Placement:
    import networkx as nx
    E, G, gpn, nodes = stats.experts, stats.gpus, stats.gpus_per_node, stats.nodes
    per_gpu = E // G
    slot_expert = np.empty((stats.layers, E), np.int64)
    for layer in range(stats.layers):
        aff = stats.node_load[layer].astype(float)
        scale = aff.sum() or 1.0
        coact = np.zeros((E, E))
        if stats.coactivation is not None:
            g = coactivation_graph(stats.coactivation[layer])
            coact = nx.to_numpy_array(g, nodelist=range(E), weight="weight")
            coact *= (stats.load[layer].sum() or 1.0) / (coact.sum() or 1.0)
        part = partition_onto_nodes(aff / scale, coact / scale, options.coactivation_weight,
                                    stats.load[layer].astype(float), options.locality_load_slack) if nodes > 1 \
            else np.zeros(E, np.int64)
        for n in range(nodes):
            members = np.flatnonzero(part == n)
            pack, rank = balanced_packing(stats.load[layer, members][None, :], gpn)
            slot_expert[layer, (n * gpn + pack[0]) * per_gpu + rank[0]] = members
    return _placement("locality", slot_expert, stats, note=f"{nodes} nodes")
