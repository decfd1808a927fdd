"""What a placement costs on a routing trace: all-to-all bytes, GPU load, expert GEMM and all-to-all
times, MoE layer latency.

Layout: EP ranks 0..G-1 on nodes of `gpus_per_node`; each rank holds `tokens_per_gpu` routed tokens per
forward (one batch). Consecutive windows of G x tokens_per_gpu tokens of the trace are the batches; a
window's tokens go to ranks in arrival order, or grouped by domain (`group_by="domain"`: requests of one
domain batched together, i.e. a window sorted by domain, so each node sees few domains).

Per (window, layer), `counts[g, e]` = (token, expert) pairs from rank g to expert e. With a placement's
routes, `pairs[g, h]` = pairs rank g sends to rank h: dispatch sends hidden x dispatch_bytes per pair,
combine returns the same pairs (hidden x combine_bytes). Bytes between different ranks are the
all-to-all bytes (a rank's pairs to itself never leave the GPU), split intra-node / inter-node.
Times: the all-to-all from its per-pair sizes (`NetworkModel.all_to_all_v_us`), each rank's expert
GEMMs from its per-expert token counts (`ComputeModel.gemm`, one GEMM per local expert and matrix),
layer latency = dispatch + slowest rank's experts + combine + router and shared expert. Times are
averaged over up to `timed_windows` windows spread over the evaluated part; bytes and loads use all
whole windows (a trailing partial batch is left out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from chakra_schema.errors import TraceInputError
from estimators.moe.placement import Placement, RoutingStats
from estimators.moe.routing import CHUNK_TOKENS, RoutingSource, check_ids

Progress = Callable[[int, int], None] | None


@dataclass(frozen=True)
class Layout:
    gpus: int
    gpus_per_node: int
    tokens_per_gpu: int
    group_by: str = "none"            # "none" | "domain"

    @property
    def window(self) -> int:
        return self.gpus * self.tokens_per_gpu

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


def source_gpus(layout: Layout, domain: np.ndarray | None) -> np.ndarray:
    """EP rank holding each token of a part (windows of `layout.window` tokens from its start)."""
    n = len(domain) if domain is not None else 0
    return _source_gpus(layout, n, domain)


def _source_gpus(layout: Layout, n: int, domain: np.ndarray | None) -> np.ndarray:
    W, G = layout.window, layout.gpus
    pos = np.arange(n)
    win = pos // W
    within = pos - win * W
    if layout.group_by == "domain" and domain is not None and n:
        within = _grouped_positions(domain, win, W)
    size = np.minimum(W, n - win * W)                # the last window may be short
    per = -(-size // G)
    return (within // per).astype(np.int32)


def _grouped_positions(domain: np.ndarray, win: np.ndarray, W: int) -> np.ndarray:
    """Position in its window of each token when requests are batched by domain: every domain owns a
    fixed range of each window, in proportion to its share of the part (so a domain keeps the same
    ranks and nodes from batch to batch); a domain with more tokens than its range in some window
    spills into the next range."""
    n = len(domain)
    d = domain.astype(np.int64)
    share = np.bincount(d) / n
    anchor = np.concatenate([[0.0], np.cumsum(share)[:-1]]) * W
    order = np.lexsort((np.arange(n), d, win))
    sd, sw = d[order], win[order]
    first = np.ones(n, bool)
    first[1:] = (sd[1:] != sd[:-1]) | (sw[1:] != sw[:-1])
    group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    desired = np.empty(n)
    desired[order] = anchor[sd] + (np.arange(n) - group_start)
    # the tokens of a window take its positions in the order of their desired positions
    final = np.lexsort((np.arange(n), desired, win))
    within = np.empty(n, np.int64)
    window_start = np.searchsorted(win[final], win[final], side="left")
    within[final] = np.arange(n) - window_start
    return within


def part_gpus(src: RoutingSource, start: int, stop: int, layout: Layout) -> np.ndarray:
    if layout.group_by == "domain" and src.domain is None:
        raise TraceInputError(src.path, "--group-by domain needs a routing trace with request domains")
    dom = src.domain[start:stop] if src.domain is not None else None
    return _source_gpus(layout, stop - start, dom)


def aligned_chunks(src: RoutingSource, start: int, stop: int, size: int):
    """(first token, ids) chunks of exactly `size` tokens (the last one shorter), whatever the source yields."""
    buf, first = [], start
    have = 0
    for _, ids in src.chunks(start, stop, size):
        buf.append(ids)
        have += len(ids)
        while have >= size:
            cat = np.concatenate(buf) if len(buf) > 1 else buf[0]
            yield first, cat[:size]
            buf, first, have = [cat[size:]], first + size, have - size
    if have:
        yield first, np.concatenate(buf)


# ----------------------------------------------------------------------------------------- fitting
def fit_stats(src: RoutingSource, start: int, stop: int, layout: Layout, experts: int,
              coactivation_tokens: int = 32768, progress: Progress = None) -> RoutingStats:
    """Per-expert loads, loads by source node and sampled co-activation over tokens [start, stop)."""
    L, E, nodes = src.layers, experts, layout.nodes
    gpus = part_gpus(src, start, stop, layout)
    node_load = np.zeros((L, nodes, E), np.int64)
    coact = np.zeros((L, E * E), np.int64) if coactivation_tokens else None
    k = src.top_k
    ii, jj = np.triu_indices(k, 1)
    for first, ids in aligned_chunks(src, start, stop, CHUNK_TOKENS):
        check_ids(ids, E, src.path, first)
        node_base = (gpus[first - start:first - start + len(ids)] // layout.gpus_per_node * E)[:, None]
        for layer in range(L):
            e = ids[:, layer, :]
            node_load[layer] += np.bincount((node_base + e).ravel(), minlength=nodes * E).reshape(nodes, E)
            if coact is not None and first - start < coactivation_tokens:
                s = e[:coactivation_tokens - (first - start)].astype(np.int64)
                coact[layer] += np.bincount((s[:, ii] * E + s[:, jj]).ravel(), minlength=E * E)
        if progress:
            progress(first + len(ids) - start, stop - start)
    load = node_load.sum(axis=1)
    co = None
    if coact is not None:
        co = coact.reshape(L, E, E)
        co = co + co.transpose(0, 2, 1)
    return RoutingStats(load, node_load, co, stop - start, layout.gpus, layout.gpus_per_node)


# ---------------------------------------------------------------------------------------- costing
@dataclass(frozen=True)
class NodeForwarding:
    """The all-to-all sends a token once per destination node and forwards it there over NVLink (DeepEP's
    normal mode, what DeepSeek's and SGLang's prefill run: estimators.moe.a2a.node_forwarded_legs);
    without it (DeepEP's low-latency mode in decode, a plain all-to-all) every (token, expert) pair
    travels on its own."""
    top_k: int
    node_limit: int = 0               # node-limited routing: at most this many nodes per token (0: none;
                                      # estimators.moe.a2a.node_limit)


# DeepEP's low-latency kernels (decode) cost a fixed time a call beyond the link model's latency and drain:
# the send phase signals a token count to every expert and the receive phase polls every local expert's
# counter before the tokens can be used. Least-squares offset between the plain all-to-all model on H800 and
# DeepEP's published low-latency table (deepseek-ai/DeepEP docs/legacy.md, H800 + CX7, 128 tokens, hidden
# 7168, top-8, FP8 dispatch / BF16 combine: dispatch 118 / 155 / 173 / 192 / 194 us and combine 195 / 273 /
# 314 / 369 / 360 us at EP16 / 32 / 64 / 128 / 256): 15 us; with it every figure reads within 7%. EP8 is
# left out: its V1 kernels send intra-node tokens over RDMA as well, which the model sends over NVLink.
LOW_LATENCY_CALL_US = 15.0


@dataclass(frozen=True)
class ExpertShape:
    hidden: int
    expert_ffn: int
    gated: bool                       # SwiGLU: up and gate projections (2 x expert_ffn wide)
    shared_experts: int
    experts: int
    dtype: str = "bf16"
    dispatch_bytes: int = 2           # per element sent to the experts (1 with FP8 dispatch)
    combine_bytes: int = 2
    shared_ffn: int = 0               # width of a shared expert (0: expert_ffn)

    @property
    def up_width(self) -> int:
        return 2 * self.expert_ffn if self.gated else self.expert_ffn


_MODELS: dict = {}


def hardware_models(hardware):
    """(ComputeModel, NetworkModel) of a hardware preset, kept per preset: their kernel-time caches
    belong to the instance, and a sweep or a repeated estimate asks the same shapes again."""
    from replay.hardware.compute import ComputeModel
    from replay.hardware.network import NetworkModel
    got = _MODELS.get(id(hardware))
    if got is None or got[0] is not hardware:       # the same preset object (kept alive here)
        if len(_MODELS) > 8:
            _MODELS.clear()
        from replay.hardware.config import for_generated_ops   # generated ops: no recorded-kernel models
        timed = for_generated_ops(hardware)
        got = _MODELS[id(hardware)] = (hardware, ComputeModel(timed), NetworkModel(timed))
    return got[1], got[2]


class LayerTimer:
    """Expert GEMM and all-to-all times of one EP group on one hardware preset."""

    def __init__(self, shape: ExpertShape, hardware, layout: Layout, forwarding: NodeForwarding | None = None,
                 call_overhead_us: float = 0.0):
        self.shape, self.layout, self.forwarding = shape, layout, forwarding
        self.call_overhead_us = call_overhead_us       # fixed cost of one all-to-all call (LOW_LATENCY_CALL_US)
        self.compute, self.network = hardware_models(hardware)
        self.ranks = list(range(layout.gpus))
        self._expert_memo: dict[int, float] = {}
        self._gpu_memo: dict[tuple, float] = {}
        self._a2a = None
        self.comparison: dict = {}        # figures of other placements, side by side (eplb vs eplb-fallback)

    def expert_us(self, tokens: int, ffn: int = 0) -> float:
        """One expert's FFN on `tokens` tokens: up(+gate) GEMM, activation, down GEMM."""
        key = (tokens, ffn)
        t = self._expert_memo.get(key)
        if t is None:
            s, c = self.shape, self.compute
            f = ffn or s.expert_ffn
            up = 2 * f if s.gated else f
            if tokens <= 0:
                t = 0.0
            else:
                t = (c.gemm(tokens, up, s.hidden, dtype=s.dtype).time_us
                     + c.memory_op(tokens * f * 2 * 3).time_us
                     + c.gemm(tokens, s.hidden, f, dtype=s.dtype).time_us)
            self._expert_memo[key] = t
        return t

    def gpu_experts_us(self, slot_tokens) -> float:
        """A GPU's routed experts as grouped GEMMs (one group per expert slot with its own token count:
        up(+gate), activation, down); slots without tokens cost nothing."""
        key = tuple(sorted(int(x) for x in slot_tokens if x > 0))
        t = self._gpu_memo.get(key)
        if t is None:
            s, c = self.shape, self.compute
            t = 0.0
            if key:
                # ComputeModel.grouped_gemm's rule (equal sizes as one batched GEMM, distinct sizes one
                # after another) on the sizes directly: this runs for every GPU of every layer
                sizes: dict[int, int] = {}
                for m in key:
                    sizes[m] = sizes.get(m, 0) + 1
                t = c.memory_op(sum(key) * s.expert_ffn * 2 * 3).time_us
                for m, n in sizes.items():
                    t += (c.gemm(m, s.up_width, s.hidden, batch=n, dtype=s.dtype).time_us
                          + c.gemm(m, s.hidden, s.expert_ffn, batch=n, dtype=s.dtype).time_us)
            if len(self._gpu_memo) > 1 << 16:
                self._gpu_memo.clear()
            self._gpu_memo[key] = t
        return t

    def shared_us(self, tokens: float) -> float:
        """Per layer and rank, independent of the placement: router GEMM and shared experts on the
        rank's own tokens."""
        s, c = self.shape, self.compute
        T = max(1, int(round(tokens)))
        t = c.gemm(T, s.experts, s.hidden, dtype="bf16").time_us
        for _ in range(s.shared_experts):
            t += self.expert_us(T, s.shared_ffn)
        return t

    def fixed_us(self) -> float:
        return self.shared_us(self.layout.tokens_per_gpu)

    def a2a_us(self, pairs: np.ndarray, elem_bytes: int, scale: float = 1.0, combine: bool = False) -> float:
        """All-to-all of `pairs` (token pairs rank -> rank, the dispatch's) x scale, `elem_bytes` per hidden
        element; `combine`: the way back (`NetworkModel.all_to_all_v_us`'s model through
        `estimators.moe.a2a`, fast at EP320)."""
        lat, drain = self.a2a_parts(pairs, elem_bytes, combine)
        return float((lat + scale * drain).min()) if drain.any() or lat.any() else 0.0

    def a2a_parts(self, pairs: np.ndarray, elem_bytes: int, combine: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(latency, drain) per protocol of the dispatch of `pairs` (rank -> rank), or of its combine
        (time = min of latency + drain). With node forwarding (DeepEP's normal mode) the NVLink leg forwards
        what the RDMA leg brings while it brings more (DeepEP's forwarder warps work chunk by chunk): a chunk
        pays both legs' latencies, and the exchange drains at the slower leg's pace. So timed, DeepEP's
        published normal-kernel bandwidths on H800 come out within 4% (tests/test_moe_node_forwarding.py);
        legs one after the other read 1.7x too slow."""
        if self._a2a is None:
            from estimators.moe.a2a import all_to_all_timer
            self._a2a = all_to_all_timer(self.network, self.ranks)
        per = self.shape.hidden * elem_bytes
        f = self.forwarding
        if f is None or self.layout.nodes <= 1:
            lat, drain = self._a2a.parts((pairs.T if combine else pairs) * per)
            return lat + (self.call_overhead_us if drain.any() else 0.0), drain
        from estimators.moe.a2a import node_forwarded_legs
        legs = node_forwarded_legs(pairs, self.layout.gpus_per_node, f.top_k, f.node_limit)
        parts = [self._a2a.parts((leg.T if combine else leg) * per) for leg in legs]
        return parts[0][0] + parts[1][0], np.maximum(parts[0][1], parts[1][1])


def slowest_gpu_us(timer: LayerTimer, slot_tokens: np.ndarray) -> float:
    """The slowest GPU's routed experts, slot_tokens [G, slots per GPU]. Large groups time only the GPUs
    that can be the slowest: with one slot per GPU the one with most tokens (GEMM time never falls as its
    rows grow); else the 8 GPUs with most tokens, most tokens in one slot, and most busy slots."""
    G = slot_tokens.shape[0]
    if G > 32:
        if slot_tokens.shape[1] == 1:
            return timer.gpu_experts_us(slot_tokens[int(np.argmax(slot_tokens[:, 0]))])
        top = lambda v: np.argsort(-v, kind="stable")[:8]           # noqa: E731
        rows = set(top(slot_tokens.sum(1)).tolist()) | set(top(slot_tokens.max(1)).tolist()) \
            | set(top((slot_tokens > 0).sum(1)).tolist())
        return max(timer.gpu_experts_us(slot_tokens[r]) for r in rows)
    return max(timer.gpu_experts_us(row) for row in slot_tokens)


def moe_layer_parts(cost: "PlacementCost", timer: LayerTimer, scale: float = 1.0):
    """Per MoE layer, averaged over the timed batches, for `scale` x the batch's tokens (0.5: one of two
    micro-batches): (slowest GPU's routed experts, dispatch, combine, router + shared experts) in us."""
    P = cost.pair_tokens
    W, L = P.shape[0], P.shape[1]
    experts, dispatch, combine = np.zeros(L), np.zeros(L), np.zeros(L)
    for w in range(W):
        for layer in range(L):
            slots = np.rint(cost.slot_tokens[w, layer] * scale).astype(np.int64)
            experts[layer] += slowest_gpu_us(timer, slots)
            if cost.a2a_parts is not None:   # latency + scale x drain, per protocol, as costed
                lat_d, drain_d, lat_c, drain_c = cost.a2a_parts[w][layer]
                dispatch[layer] += float((lat_d + scale * drain_d).min())
                combine[layer] += float((lat_c + scale * drain_c).min())
            else:
                dispatch[layer] += timer.a2a_us(P[w, layer], timer.shape.dispatch_bytes, scale)
                combine[layer] += timer.a2a_us(P[w, layer], timer.shape.combine_bytes, scale, combine=True)
    shared = np.full(L, timer.shared_us(timer.layout.tokens_per_gpu * scale))
    n = max(W, 1)
    return experts / n, dispatch / n, combine / n, shared


@dataclass
class PlacementCost:
    """Costs of one placement on the evaluated part, per MoE layer (arrays [L])."""

    placement: Placement
    windows: int = 0
    a2a_bytes: np.ndarray = None              # dispatch + combine bytes between ranks, per window
    a2a_bytes_inter_node: np.ndarray = None
    max_over_mean: np.ndarray = None          # per-rank received pairs, max/mean, mean over windows
    dispatch_us: np.ndarray = None
    combine_us: np.ndarray = None
    expert_us: np.ndarray = None              # slowest rank's expert GEMMs
    layer_us: np.ndarray = None
    timed_windows: int = 0
    pair_tokens: np.ndarray = None            # [timed windows, L, G, G] pairs rank -> rank
    slot_tokens: np.ndarray = None            # [timed windows, L, G, slots per GPU] tokens per expert slot
    a2a_parts: list = None                    # [timed window][layer] (dispatch latency, drain, combine ...)

    @property
    def moe_latency_us(self) -> float:
        return float(self.layer_us.sum())


def evaluate_placements(src: RoutingSource, start: int, stop: int, layout: Layout, experts: int,
                        placements: list[Placement], timer: LayerTimer | None, timed_windows: int = 4,
                        progress: Progress = None) -> list[PlacementCost]:
    """Stream tokens [start, stop) once, costing every placement on each batch window."""
    L, G, E, W = src.layers, layout.gpus, experts, layout.window
    n_win = (stop - start) // W
    if n_win < 1:
        raise TraceInputError(src.path, f"the evaluated part has {stop - start} tokens, fewer than one batch "
                                        f"(EP{G} x {layout.tokens_per_gpu} tokens per GPU): give a longer trace "
                                        f"or fewer tokens per GPU")
    stop = start + n_win * W                         # whole batches only
    gpus = part_gpus(src, start, stop, layout)
    chosen = sorted(set(np.linspace(0, n_win - 1, min(timed_windows, n_win)).round().astype(int).tolist())) if timer else []
    timed = {w: i for i, w in enumerate(chosen)}
    routes = [[p.route_blocks(layer) for layer in range(L)] for p in placements]
    costs = [PlacementCost(p, a2a_bytes=np.zeros(L), a2a_bytes_inter_node=np.zeros(L), max_over_mean=np.zeros(L),
                           dispatch_us=np.zeros(L), combine_us=np.zeros(L), expert_us=np.zeros(L),
                           layer_us=np.zeros(L), pair_tokens=np.zeros((len(timed), L, G, G)),
                           slot_tokens=np.zeros((len(timed), L, G, p.slots_per_gpu), np.int64)) for p in placements]
    shape = timer.shape if timer else None
    per_pair = (shape.dispatch_bytes + shape.combine_bytes) * shape.hidden if shape else 4
    size = W * max(1, CHUNK_TOKENS // W)
    fixed = timer.fixed_us() if timer else 0.0
    for first, ids in aligned_chunks(src, start, stop, size):
        check_ids(ids, E, src.path, first)
        rel = first - start
        g = gpus[rel:rel + len(ids)].astype(np.int64)
        win = np.arange(rel, rel + len(ids)) // W
        w0 = int(win[0])
        nw = int(win[-1]) - w0 + 1
        for layer in range(L):
            e = ids[:, layer, :].astype(np.int64)
            key = (((win - w0) * G + g)[:, None] * E + e).ravel()
            counts = np.bincount(key, minlength=nw * G * E).reshape(nw, G, E).astype(float)
            for pc, rt in zip(costs, routes):
                _cost_windows(pc, rt[layer], counts, layer, w0, timed, timer, per_pair, layout, fixed)
        if progress:
            progress(rel + len(ids), stop - start)
    for pc in costs:
        pc.windows = n_win
        for name in ("a2a_bytes", "a2a_bytes_inter_node", "max_over_mean"):
            setattr(pc, name, getattr(pc, name) / n_win)
        if pc.timed_windows:
            t = pc.timed_windows / L
            for name in ("dispatch_us", "combine_us", "expert_us", "layer_us"):
                setattr(pc, name, getattr(pc, name) / t)
    return costs


def evaluate_expected(loads: np.ndarray, top_k: int, layout: Layout, placements: list[Placement],
                      timer: LayerTimer | None) -> list[PlacementCost]:
    """Costs on the expected counts of per-layer expert loads [L, E] (no sampling): every rank routes
    tokens_per_gpu x top_k pairs, shared over the experts in proportion to the layer's loads. One batch,
    timed."""
    L, E = loads.shape
    G, T = layout.gpus, layout.tokens_per_gpu
    costs = [PlacementCost(p, a2a_bytes=np.zeros(L), a2a_bytes_inter_node=np.zeros(L), max_over_mean=np.zeros(L),
                           dispatch_us=np.zeros(L), combine_us=np.zeros(L), expert_us=np.zeros(L),
                           layer_us=np.zeros(L), pair_tokens=np.zeros((1, L, G, G)),
                           slot_tokens=np.zeros((1, L, G, p.slots_per_gpu), np.int64)) for p in placements]
    shape = timer.shape if timer else None
    per_pair = (shape.dispatch_bytes + shape.combine_bytes) * shape.hidden if shape else 4
    fixed = timer.fixed_us() if timer else 0.0
    share = pick_shares(loads, top_k)
    for layer in range(L):
        counts = np.broadcast_to(T * top_k * share[layer], (1, G, E))       # a view: rows alike
        for pc in costs:
            _cost_windows(pc, pc.placement.route_blocks(layer), counts, layer, 0, {0: 0} if timer else {}, timer,
                          per_pair, layout, fixed)
    for pc in costs:
        pc.windows = 1
        if pc.timed_windows:
            t = pc.timed_windows / L
            for name in ("dispatch_us", "combine_us", "expert_us", "layer_us"):
                setattr(pc, name, getattr(pc, name) / t)
    return costs


def pick_shares(loads: np.ndarray, top_k: int) -> np.ndarray:
    """Per layer of loads [L, E], each expert's share of the layer's top_k picks per token: in proportion to
    its load, but at most 1 / top_k (a token picks an expert once, so no expert serves more tokens than there
    are); what the cap removes goes to the other experts in proportion to their loads, evenly among the
    experts without load once the loaded ones are all capped (a top-8 router over 4 loaded experts still
    picks 8 distinct ones)."""
    share = loads / loads.sum(1, keepdims=True)
    cap = 1.0 / top_k
    for _ in range(loads.shape[1]):
        over = share > cap * (1 + 1e-12)
        if not over.any():
            break
        excess = np.where(over, share - cap, 0.0).sum(1, keepdims=True)
        share = np.minimum(share, cap)
        room = np.where(share < cap, share, 0.0)
        free = room.sum(1, keepdims=True)
        empty = (share == 0.0)
        even = np.where(empty, 1.0, 0.0) / np.maximum(empty.sum(1, keepdims=True), 1)
        share = share + excess * np.where(free > 0, room / np.where(free > 0, free, 1.0), even)
    return share


def _served(counts: np.ndarray, routes, gpn: int) -> np.ndarray:
    """Tokens each GPU serves of each expert [E, G] in one window (`routes` as `Placement.route_blocks`):
    the spread, except that tokens of a node holding replicas of the expert go to those."""
    spread, multi, has, block = routes
    served = counts.sum(0)[:, None] * spread
    if len(multi):
        nodes, R = has.shape
        local = counts[:, multi].reshape(nodes, gpn, R).sum(1) * has           # [nodes, R] served on-node
        sm = served[multi] - local.sum(0)[:, None] * spread[multi]
        sm = sm.reshape(R, nodes, gpn) + np.einsum("nr,nrj->rnj", local, block)
        served[multi] = sm.reshape(R, nodes * gpn)
    return served


def _rows_times(stack: np.ndarray, m: np.ndarray) -> np.ndarray:
    """`stack @ m` for a [windows, rows, k] stack as one 2-D product: numpy's stacked matmul runs one small
    product per window, tens of times slower when the windows are many and small (1 token per GPU)."""
    nw, rows, k = stack.shape
    return (np.ascontiguousarray(stack).reshape(nw * rows, k) @ m).reshape(nw, rows, m.shape[1])


def _cost_windows(pc: PlacementCost, routes: np.ndarray, counts: np.ndarray, layer: int, w0: int, timed: dict,
                  timer: LayerTimer | None, per_pair: float, layout: Layout, fixed: float) -> None:
    p = pc.placement
    gpn = layout.gpus_per_node
    spread, multi, has, block = routes
    nw, G = counts.shape[0], counts.shape[1]
    nodes = G // gpn
    if counts.strides[1] == 0:                                # every rank routes alike (expected counts)
        every = np.repeat(counts[:, :1] @ spread, G, axis=1)
    else:
        every = _rows_times(counts, spread)                   # [windows, G, G] pairs rank -> rank
    if len(multi):            # pairs to replicated experts a node holds stay on the node's replicas
        local = counts[:, :, multi].reshape(nw, nodes, gpn, len(multi)) * has[None, :, None, :]
        every -= _rows_times(local.reshape(nw, G, len(multi)), spread[multi])
        idx = np.arange(nodes)
        ev = every.reshape(nw, nodes, gpn, nodes, gpn)
        ev[:, idx, :, idx, :] += np.einsum("wngr,nrj->nwgj", local, block)
    total = float(every.sum())
    blocks = every.reshape(nw, nodes, gpn, nodes, gpn)
    intra = float(np.einsum("wninj->", blocks))             # the node-diagonal blocks
    pc.a2a_bytes[layer] += (total - float(np.trace(every, axis1=1, axis2=2).sum())) * per_pair
    pc.a2a_bytes_inter_node[layer] += max(0.0, total - intra) * per_pair      # not round-off below 0
    recv = every.sum(1)
    mean = recv.mean(1)
    pc.max_over_mean[layer] += float(np.where(mean > 0, recv.max(1) / np.where(mean > 0, mean, 1), 1.0).sum())
    for j in range(counts.shape[0]):
        if timer is None or (w0 + j) not in timed:
            continue
        pairs, served = every[j], _served(counts[j], routes, gpn)
        gpu = p.gpu_of_slot()
        se = p.slot_expert[layer]
        mult = np.bincount(se * p.gpus + gpu, minlength=p.experts * p.gpus)[se * p.gpus + gpu]
        slot_tok = np.rint(served[se, gpu] / mult).astype(np.int64)
        slowest = slowest_gpu_us(timer, slot_tok.reshape(p.gpus, p.slots_per_gpu))
        dparts = timer.a2a_parts(pairs, timer.shape.dispatch_bytes)
        cparts = timer.a2a_parts(pairs, timer.shape.combine_bytes, combine=True)
        d, c = float((dparts[0] + dparts[1]).min()), float((cparts[0] + cparts[1]).min())
        if pc.a2a_parts is None:
            pc.a2a_parts = [[None] * pc.pair_tokens.shape[1] for _ in range(pc.pair_tokens.shape[0])]
        pc.a2a_parts[timed[w0 + j]][layer] = (*dparts, *cparts)
        pc.dispatch_us[layer] += d
        pc.combine_us[layer] += c
        pc.expert_us[layer] += slowest
        pc.layer_us[layer] += d + slowest + c + fixed
        pc.timed_windows += 1
        k = timed[w0 + j]
        pc.pair_tokens[k, layer] = pairs
        pc.slot_tokens[k, layer] = slot_tok.reshape(p.gpus, p.slots_per_gpu)
