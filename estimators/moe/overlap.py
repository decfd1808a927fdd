"""How a serving forward overlaps its expert all-to-alls with compute: one registry of overlap schedules.

Two-micro-batch overlap (DeepSeek's inference design, which SGLang implements as "operations strategies")
does not hide every all-to-all behind any compute. Each micro-batch runs its layer as a fixed list of
operations cut into stages at yield points; the GPU runs the two micro-batches' stages in turn on one stream
(the second starting `delta` stages behind), and an all-to-all sent in one stage of a micro-batch is only
hidden by what runs until that micro-batch receives it: the other micro-batch's next stage(s). Where that
compute is shorter than the transfer, the stream waits.

Published schedules (SGLang `operations_strategy.py`, `_compute_moe_deepseek_blog_decode` / `_prefill`,
named after DeepSeek's design; DeepSeek's profile-data README describes the same two micro-batches):
- decode, 5 stages, the second micro-batch 2 stages behind: [attention prepare] | [attention core, router] |
  [dispatch send, shared experts] | [dispatch receive, routed experts, combine send] | [combine receive].
  The dispatch hides behind the shared experts and the other micro-batch's attention prepare; the combine
  behind the other's attention core. DeepEP's low-latency kernels free the SMs once the RDMA is issued.
- prefill, 3 stages, no lag: [attention, router, dispatch send] | [dispatch receive, routed experts, combine
  send] | [shared experts, combine receive] (+ the next layer's first stage). The dispatch hides behind the
  other micro-batch's attention, the combine behind its routed experts and the shared experts. DeepEP's
  normal-mode kernels keep their SMs for the whole overlapped forward, so the compute runs on the rest
  (DeepSeek's prefill profile: 108 SMs compute, 24 communicate; SGLang launches DeepGEMM on the SMs DeepEP
  leaves): every compute part takes 1 / (1 - `comm_sm_share`) as long.

The router GEMM is timed with the shared experts (`LayerTimer.shared_us`): a few microseconds in decode,
about 2% of attention in prefill. An attention TP all-reduce blocks the stream where it runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class LayerWork:
    """One transformer layer of one micro-batch, in us (a dense layer has no experts or all-to-all)."""
    attn_prepare: float               # norms, Q/KV projections (MLA decode: the absorbed q_nope -> latent)
    attn_core: float                  # the attention kernel and output projection
    tp_allreduce: float = 0.0         # the attention output all-reduce of a TP attention group (on the stream)
    moe: bool = False                 # an MoE layer (routed experts, all-to-all) rather than a dense one
    ffn: float = 0.0                  # a dense layer's FFN
    shared: float = 0.0               # router + shared experts
    experts: float = 0.0              # the slowest GPU's routed experts
    dispatch: float = 0.0
    combine: float = 0.0

    @property
    def compute(self) -> float:
        return self.attn_prepare + self.attn_core + self.ffn + self.shared + self.experts

    @property
    def communication(self) -> float:
        """The all-to-alls (the attention all-reduce blocks the stream: `tp_allreduce`)."""
        return self.dispatch + self.combine


# one operation of a micro-batch's stage list
YIELD = ("yield",)


def _compute(us: float) -> tuple:
    return ("compute", us)


class OverlapSchedule:
    """A forward's time from its layers' parts (each LayerWork one micro-batch's)."""
    name: str = ""
    micro_batches: int = 1

    def forward_us(self, layers: Sequence[LayerWork], comm_sm_share: float = 0.0) -> float:
        raise NotImplementedError


class Sequential(OverlapSchedule):
    """One batch; every all-to-all on the critical path."""
    name = "none"

    def forward_us(self, layers, comm_sm_share=0.0):
        return sum(w.compute + w.tp_allreduce + w.communication for w in layers)


class IdealDualBatch(OverlapSchedule):
    """Two micro-batches, every all-to-all hidden behind any compute of the other: a layer takes max(both
    communications, both computes on the SMs the communication leaves), with no pipeline fill. A bound on
    what overlap can buy, no schedule's time."""
    name = "dual-batch-ideal"
    micro_batches = 2

    def forward_us(self, layers, comm_sm_share=0.0):
        stretch = _stretch(comm_sm_share)
        return sum(max(2 * w.communication, 2 * (w.compute * stretch + w.tp_allreduce)) for w in layers)


class StagedDualBatch(OverlapSchedule):
    """Two micro-batches run stage by stage (module docstring): a small event loop over one compute stream
    and one all-to-all channel (transfers one at a time, in the order sent)."""
    micro_batches = 2

    def __init__(self, name: str, moe_ops, dense_ops, delta_stages: int):
        self.name, self._moe_ops, self._dense_ops, self.delta = name, moe_ops, dense_ops, delta_stages

    def stages(self, layers: Sequence[LayerWork]) -> list[list[tuple]]:
        ops: list[tuple] = []
        for i, w in enumerate(layers):
            ops += (self._moe_ops if w.moe else self._dense_ops)(w, i)
        out, cur = [], []
        for op in ops:
            if op == YIELD:
                out.append(cur)
                cur = []
            else:
                cur.append(op)
        return out + [cur]

    def forward_us(self, layers, comm_sm_share=0.0):
        stages = self.stages(layers)
        n, d = len(stages), min(self.delta, len(stages))
        order = [(0, s) for s in range(d)]
        for s in range(n - d):
            order += [(0, s + d), (1, s)]
        order += [(1, s) for s in range(n - d, n)]
        return _run(((mb, stages[s]) for mb, s in order), comm_sm_share)


def _stretch(comm_sm_share: float) -> float:
    """How much longer compute takes on the SMs the communication kernels leave."""
    if not 0.0 <= comm_sm_share < 1.0:
        raise ValueError(f"the communication's share of the SMs must be in [0, 1), not {comm_sm_share}")
    return 1.0 / (1.0 - comm_sm_share)


def _run(stage_order: Iterable[tuple[int, list[tuple]]], comm_sm_share: float) -> float:
    """Time of the stream: compute ops run in order on the SMs the communication leaves (1 - comm_sm_share),
    `block` ops (a TP all-reduce) hold the stream as they are; `send` starts a transfer on the channel when
    the stream reaches it and the channel is free; `recv` waits for it."""
    stretch = _stretch(comm_sm_share)
    t = free = 0.0
    done: dict = {}
    for mb, ops in stage_order:
        for op in ops:
            kind = op[0]
            if kind == "compute":
                t += op[1] * stretch
            elif kind == "block":
                t += op[1]
            elif kind == "send":
                free = max(t, free) + op[2]
                done[(mb, op[1])] = free
            else:                                                   # recv
                t = max(t, done.pop((mb, op[1]), t))
    return t


def _decode_moe(w: LayerWork, i: int) -> list[tuple]:
    return [_compute(w.attn_prepare), YIELD,
            _compute(w.attn_core), ("block", w.tp_allreduce), YIELD,
            ("send", ("dispatch", i), w.dispatch), _compute(w.shared), YIELD,
            ("recv", ("dispatch", i)), _compute(w.experts), ("send", ("combine", i), w.combine), YIELD,
            ("recv", ("combine", i)), YIELD]


def _prefill_moe(w: LayerWork, i: int) -> list[tuple]:
    return [_compute(w.attn_prepare + w.attn_core), ("block", w.tp_allreduce), ("send", ("dispatch", i), w.dispatch),
            YIELD,
            ("recv", ("dispatch", i)), _compute(w.experts), ("send", ("combine", i), w.combine), YIELD,
            _compute(w.shared), ("recv", ("combine", i))]


def _dense(w: LayerWork, i: int) -> list[tuple]:
    return [_compute(w.attn_prepare + w.attn_core), ("block", w.tp_allreduce), _compute(w.ffn + w.shared)]


SCHEDULES: dict[str, OverlapSchedule] = {s.name: s for s in (
    Sequential(), IdealDualBatch(),
    StagedDualBatch("dual-batch-decode", _decode_moe, _dense, delta_stages=2),
    StagedDualBatch("dual-batch-prefill", _prefill_moe, _dense, delta_stages=0),
)}

# what `--overlap` accepts: "dual-batch" is the published schedule of the phase
OVERLAP_CHOICES = ("none", "dual-batch", "dual-batch-ideal")


def schedule_for(overlap: str, phase: str) -> OverlapSchedule:
    if overlap not in OVERLAP_CHOICES:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_CHOICES)}, not {overlap!r}")
    if overlap == "dual-batch" and phase not in ("prefill", "decode"):
        raise ValueError(f"two-micro-batch overlap is a serving schedule (prefill or decode), not {phase!r}")
    return SCHEDULES[f"dual-batch-{phase}" if overlap == "dual-batch" else overlap]
