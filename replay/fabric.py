"""The network backend the replay engine hands its transfers to (ASTRA-sim's network API in spirit).

The engine knows when a transfer (a collective once its last member arrived, an eager send, a collective
whose other members are not simulated) starts and how long the timing source says it takes on an idle
network; a `Fabric` says when it ends. Engine code never looks at links or algorithms.

- `IdealFabric`: every transfer alone on the network (end = start + alone time). Used with recorded
  timing, whose collectives already hold the contention of the run that recorded them.
- `SharedLinkFabric`: transfers in flight at the same time share the links of `NetworkModel`'s topology
  max-min fairly (`shared_transfer_times`; a transfer waits for the one before it on its GPU stream,
  so a stream of sends slowed by sharing queues instead of piling up). The engine computes node times
  as far as their inputs are known rather than in global time order, so it cannot know, when a
  transfer starts, which others will overlap it; the fabric therefore works in passes: a pass replays
  with the contended durations of the previous pass, the fabric re-shares the links over the transfers
  that pass saw, and the engine replays again until no transfer's duration moves by more than
  `tolerance_us` or `relative_tolerance` of the simulated span (or `max_passes`). A transfer whose
  correction flips direction between passes (two overlap patterns taking turns) then moves only part
  of the way (`relaxation`).
  A run without overlapping transfers settles after its first pass.

A fabric is chosen by the timing source (`TimingSource.fabric()`, optional), so a new network backend
is a new class here, not a branch in the engine.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Hashable, Protocol, Sequence

import numpy as np

from chakra_schema.graph import ExecutionGraph, OpKind


class Fabric(Protocol):
    def begin_pass(self) -> None:
        """A replay pass starts (forget the transfers of the previous one, keep what was learned)."""
        ...

    def transfer_end(self, key: Hashable, start_us: float, alone_us: float, graph: ExecutionGraph, node: int,
                     group_ranks: Sequence[int]) -> float:
        """End time of transfer `key` (one per collective instance, the same on every member) of
        `node` on `graph`'s rank over `group_ranks`, started at `start_us`, `alone_us` long on an
        idle network."""
        ...

    def settled(self) -> bool:
        """After a pass: True when its transfer times are final, False to replay once more."""
        ...


class IdealFabric:
    """No contention: a transfer takes its alone time."""

    passes = 1

    def begin_pass(self) -> None:
        pass

    def transfer_end(self, key, start_us, alone_us, graph, node, group_ranks) -> float:
        return start_us + alone_us

    def settled(self) -> bool:
        return True


@dataclass
class SharedLinkFabric:
    """Concurrent transfers share NVLink / NIC / spine links max-min fairly (see module doc)."""

    network: "object"                 # replay.hardware.network.NetworkModel
    max_passes: int = 6
    tolerance_us: float = 1.0
    relative_tolerance: float = 1e-4  # of the span the transfers cover: a long run settles sooner
    relaxation: float = 0.5
    passes: int = 0
    residual_us: float = 0.0
    _contended: dict = field(default_factory=dict)   # key -> contended duration from the last pass
    _seen: dict = field(default_factory=dict)        # key -> (start, alone, paths) of this pass
    _stream: dict = field(default_factory=dict)      # key -> (rank, GPU stream) it was first seen on
    _used: dict = field(default_factory=dict)        # key -> duration this pass used
    _last_step: dict = field(default_factory=dict)   # key -> the correction of the previous pass
    _damped: set = field(default_factory=set)        # keys whose corrections oscillated
    # Kept across passes and across the replays on one network model (the same transfers recur every pass,
    # and the same groups in every stage sample of an estimate): each transfer's path list, by its ends or
    # group, and the speeds of each mix of path lists in flight (`shared_transfer_times`' cache, keyed by
    # the path lists' ids, which `_path_lists` keeps alive: the two always travel together).
    _path_lists: dict = field(default_factory=dict)
    _share_cache: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._path_lists, self._share_cache = _shared_state(self.network)

    def begin_pass(self) -> None:
        self.passes += 1
        self._seen = {}
        self._stream = {}
        self._used = {}

    def transfer_end(self, key, start_us, alone_us, graph, node, group_ranks) -> float:
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = (start_us, alone_us, self._paths(graph, node, group_ranks))
            self._stream[key] = (graph.rank, int(graph.resource[node]))
        elif start_us < seen[0]:  # the same collective seen from another member that started it earlier
            self._seen[key] = (start_us, seen[1], seen[2])
        dur = self._contended.get(key, alone_us)
        self._used[key] = dur
        return start_us + dur

    def settled(self) -> bool:
        from replay.hardware.network import shared_transfer_times

        keys = list(self._seen)
        if not keys:
            return True
        starts = [self._seen[k][0] for k in keys]
        alone = [self._seen[k][1] for k in keys]
        paths = [self._seen[k][2] for k in keys]
        begins, ends = shared_transfer_times(starts, alone, paths, self.network.topology.capacity,
                                             self._stream_predecessors(keys, starts), cache=self._share_cache)
        moved = 0.0
        for k, s, e in zip(keys, begins.tolist(), ends.tolist()):
            d = e - s
            used = self._used.get(k, d)
            step = d - used
            moved = max(moved, abs(step))
            # A transfer stretched in one pass ends later, which moves what overlaps it in the next; when
            # a transfer's correction flips direction the passes oscillate between two overlap patterns,
            # so from then on it moves only part of the way (under-relaxation).
            last = self._last_step.get(k, 0.0)
            if last * step < 0:
                self._damped.add(k)
            self._last_step[k] = step
            self._contended[k] = used + (self.relaxation * step if k in self._damped else step)
        self.residual_us = moved
        span = float(np.max(ends) - min(starts))
        tolerance = max(self.tolerance_us, self.relative_tolerance * span)
        return moved <= tolerance or self.passes >= self.max_passes

    def _stream_predecessors(self, keys: list, starts: list[float]) -> list[int]:
        """Per transfer, the one before it on its GPU stream (-1: first): stream order makes it wait for
        that one's contended end, so the fluid model must not start it at this pass's (earlier) time."""
        after = [-1] * len(keys)
        last: dict = {}
        for i in sorted(range(len(keys)), key=starts.__getitem__):
            stream = self._stream[keys[i]]
            after[i] = last.get(stream, -1)
            last[stream] = i
        return after

    def _paths(self, graph: ExecutionGraph, node: int, group_ranks: Sequence[int]) -> list:
        kind = int(graph.kind[node])
        if kind in (OpKind.SEND, OpKind.RECV):
            a = graph.attrs.get(node) or {}
            me = graph.rank
            src = me if kind == OpKind.SEND else int(a.get("comm_src", me))
            dst = int(a.get("comm_dst", me)) if kind == OpKind.SEND else me
            key = ("p2p", src, dst)
            hit = self._path_lists.get(key)
            if hit is None:
                hit = self._path_lists[key] = self.network.p2p_paths(src, dst)
            return hit
        key = tuple(group_ranks)
        hit = self._path_lists.get(key)
        if hit is None:
            hit = self._path_lists[key] = self.network.transfer_paths(group_ranks)
        return hit


_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_STATE_LIMIT = 50_000   # cached mixes and path lists of one network model before they start afresh


def _shared_state(network) -> tuple[dict, dict]:
    """The (path lists, mix speeds) caches of `network`'s fabrics. Past `_STATE_LIMIT` entries a new pair
    replaces the old one (a fabric still using the old pair keeps it: never cleared under its feet)."""
    try:
        state = _STATE.get(network)
    except TypeError:   # not weak-referenceable / hashable: a cache of its own
        return {}, {}
    if state is None or len(state[0]) + len(state[1]) > _STATE_LIMIT:
        state = _STATE[network] = ({}, {})
    return state


def fabric_for(timing) -> Fabric:
    """The fabric a timing source asks for (`timing.fabric()`), else the ideal one."""
    make = getattr(timing, "fabric", None)
    return make() if callable(make) else IdealFabric()


def contention_summary(fabric: Fabric) -> dict:
    """What the fabric did, for reports and tests: passes, how many transfers links sharing stretched,
    the largest stretch (contended / alone time) overall and per process group kind ("tp", "dp", ...,
    from the group names of transfers whose other members were not simulated; "collective" otherwise)."""
    contended = getattr(fabric, "_contended", None) or {}
    seen = getattr(fabric, "_seen", None) or {}
    by_kind: dict[str, float] = {}
    stretched = 0
    for key, (_, alone, _) in seen.items():
        if key not in contended or alone <= 0:
            continue
        ratio = contended[key] / alone
        if ratio > 1.0 + 1e-9:
            stretched += 1
            kind = str(key[1]).split(":")[0] if key[0] == "pg" else "collective"
            by_kind[kind] = max(by_kind.get(kind, 1.0), ratio)
    return {"passes": getattr(fabric, "passes", 1), "transfers": len(seen), "stretched": stretched,
            "max_stretch": max(by_kind.values(), default=1.0), "max_stretch_by_kind": by_kind,
            "residual_us": float(getattr(fabric, "residual_us", 0.0))}
