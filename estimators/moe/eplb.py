"""DeepSeek's expert-parallel load balancer (EPLB), reimplemented in numpy to give the same answer.

What the published algorithm (github.com/deepseek-ai/EPLB, `eplb.py`) computes, re-derived here:

- `pack_evenly(weight, packs)`: per row, items in order of decreasing weight each go to the lightest
  pack that still has room (every pack holds items / packs items); one item per pack is the identity.
- `replicate(weight, slots)`: one slot per logical expert, then each further slot copies the expert
  whose load per copy is largest.
- `rebalance_hierarchical(weight, slots, groups, nodes, gpus)`: expert groups packed onto nodes by group
  load; on each node, the node's experts replicated into slots / nodes slots; each node's replicas
  (load / copies) packed onto its GPUs; physical slot p sits on GPU p // (slots / gpus).
- `rebalance(...)`: the hierarchical policy when the groups divide by the nodes, else the global policy
  (the hierarchical one with one group on one node).

Arithmetic follows the original: loads are cast to float32 and group sums, loads per copy and pack
totals are float32 sums, so near-ties break as they do there. Tie order: a maximum / minimum takes the
lowest index (as the original's `max(dim)` and Python `min` do); equal loads are sorted in index order
(the original's sort does not promise an order for equal loads; index order is what a stable sort
gives).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chakra_schema.errors import TraceInputError


@dataclass(frozen=True)
class EPLBResult:
    physical_to_logical: np.ndarray   # [L, slots] logical expert of each physical slot
    replica_rank: np.ndarray          # [L, slots] which copy of its expert each slot is (0, 1, ...)
    logical_count: np.ndarray         # [L, E] copies of each logical expert
    policy: str                       # "hierarchical" | "global"


def pack_evenly(weight: np.ndarray, packs: int) -> tuple[np.ndarray, np.ndarray]:
    """(pack of each item, its position in the pack), both [rows, items]."""
    rows, n = weight.shape
    per = n // packs
    if per == 1:
        return np.tile(np.arange(n, dtype=np.int64), (rows, 1)), np.zeros((rows, n), np.int64)
    w = np.asarray(weight, dtype=np.float32)
    order = np.argsort(-w, axis=1, kind="stable")       # heaviest first, equal loads by index
    pack = np.empty((rows, n), np.int64)
    rank = np.empty((rows, n), np.int64)
    for r in range(rows):
        totals = np.zeros(packs, np.float32)
        count = np.zeros(packs, np.int64)
        wr = w[r]
        for item in order[r]:
            p = int(np.argmin(np.where(count < per, totals, np.float32(np.inf))))
            pack[r, item], rank[r, item] = p, count[p]
            totals[p] += wr[item]
            count[p] += 1
    return pack, rank


def replicate(weight: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot -> logical expert [rows, slots], replica rank of each slot, copies per expert [rows, n])."""
    rows, n = weight.shape
    w = np.asarray(weight, dtype=np.float32)
    slot_expert = np.tile(np.arange(slots, dtype=np.int64), (rows, 1))
    rank = np.zeros((rows, slots), np.int64)
    copies = np.ones((rows, n), np.int64)
    r = np.arange(rows)
    for s in range(n, slots):
        hot = np.argmax(w / copies.astype(np.float32), axis=1)   # float32 division, first maximum
        slot_expert[:, s] = hot
        rank[:, s] = copies[r, hot]
        copies[r, hot] += 1
    return slot_expert, rank, copies


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def rebalance_hierarchical(weight: np.ndarray, slots: int, groups: int, nodes: int,
                           gpus: int) -> EPLBResult:
    L, E = weight.shape
    w = np.asarray(weight, dtype=np.float32)
    group_size, groups_per_node = E // groups, groups // nodes
    per_node, per_gpu = E // nodes, slots // gpus
    # 1. groups onto nodes; experts renumbered node-major ("m" order): node, group in node, expert in group
    group_pack, group_rank = pack_evenly(w.reshape(L, groups, group_size).sum(-1, dtype=np.float32), nodes)
    log_to_m = (((group_pack * groups_per_node + group_rank) * group_size)[:, :, None]
                + np.arange(group_size)).reshape(L, E)
    m_to_log = _inverse(log_to_m)
    # 2. replicate each node's experts into its slots
    node_w = np.take_along_axis(w, m_to_log, axis=1).reshape(L * nodes, per_node)
    phy_to_m, phy_rank, m_count = replicate(node_w, slots // nodes)
    # 3. each node's replicas onto its GPUs by load per copy
    per_copy = np.take_along_axis(node_w / m_count.astype(np.float32), phy_to_m, axis=1)
    pack, rank = pack_evenly(per_copy, gpus // nodes)
    placed_to_phy = _inverse(pack * per_gpu + rank)
    placed_to_m = np.take_along_axis(phy_to_m, placed_to_phy, axis=1).reshape(L, nodes, -1)
    placed_to_m = (placed_to_m + (np.arange(nodes) * per_node)[None, :, None]).reshape(L, -1)
    placed_rank = np.take_along_axis(phy_rank, placed_to_phy, axis=1).reshape(L, -1)
    count = np.take_along_axis(m_count.reshape(L, -1), log_to_m, axis=1)
    return EPLBResult(np.take_along_axis(m_to_log, placed_to_m, axis=1), placed_rank, count, "hierarchical")


def check_eplb_shape(experts: int, slots: int, groups: int, nodes: int, gpus: int) -> None:
    """The inputs EPLB accepts, as one-line errors (it asserts them)."""
    if slots < experts:
        raise TraceInputError(None, f"eplb: {slots} physical slots are fewer than the {experts} experts")
    if slots % gpus:
        raise TraceInputError(None, f"eplb: {slots} physical expert slots do not divide over {gpus} GPUs")
    if groups < 1 or experts % groups:
        raise TraceInputError(None, f"eplb: {groups} expert groups do not divide the {experts} experts")
    if nodes < 1 or gpus % nodes:
        raise TraceInputError(None, f"eplb: {gpus} GPUs are not a whole number per node over {nodes} nodes")


def rebalance(weight: np.ndarray, slots: int, groups: int, nodes: int, gpus: int) -> EPLBResult:
    """EPLB's entry point: hierarchical when the nodes divide the groups, else global."""
    L, E = np.shape(weight)
    check_eplb_shape(E, slots, groups, nodes, gpus)
    if groups % nodes == 0:
        return rebalance_hierarchical(weight, slots, groups, nodes, gpus)
    r = rebalance_hierarchical(weight, slots, 1, 1, gpus)
    return EPLBResult(r.physical_to_logical, r.replica_rank, r.logical_count, "global")


def gpu_loads(physical_to_logical: np.ndarray, logical_count: np.ndarray, weight: np.ndarray,
              gpus: int) -> np.ndarray:
    """[L, gpus] load per GPU: each slot serves its expert's load / copies."""
    L, S = physical_to_logical.shape
    share = np.take_along_axis(np.asarray(weight, float) / logical_count, physical_to_logical, axis=1)
    return share.reshape(L, gpus, S // gpus).sum(-1)
