"""The in-memory execution graph: one rank's nodes in columnar arrays.

Every producer (the PyTorch converter, the `.et` reader, the workload generator) builds an
`ExecutionGraph` through `GraphBuilder`; every consumer (the replay engine, the estimators, the
`.et` writer) reads the frozen columns. Node *indices* (0..N-1) are what the hot paths use; Chakra node
*ids* are kept only to round-trip files.

Replay contract (what producers must get right, see replay/engine.py):
- Every node runs on one resource (a CPU thread or a GPU device+stream). A resource serves its nodes in
  ascending node-index order, so producers add nodes in recorded start order (parents before children on
  a thread: sort by (start, -duration)).
- `parent` is the call-stack parent (Chakra ctrl_deps). CPU ops nest; the ProfilerStep annotation is a
  CPU node and the parent of the ops of its step.
- `deps` are execution dependencies (Chakra data_deps) with a kind. Every kind except SYNC constrains the
  start of the destination; SYNC (a CPU synchronize waiting for GPU work, a `wait` for an async
  collective) constrains its end.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterator, Sequence

import numpy as np


class NodeType(IntEnum):
    """Chakra `NodeType` (same numbers as the wire format)."""

    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CommType(IntEnum):
    """Chakra `CollectiveCommType` (same numbers as the wire format)."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


class OpKind(IntEnum):
    """What a node is, finer than Chakra's NodeType; the replay and the hardware models dispatch on it.

    Stored in `.et` files as the `lumos_kind` int64 attr so it survives a round trip.
    """

    CPU_OP = 0          # host operator (aten::*, autograd, python function)
    ANNOTATION = 1      # user annotation / ProfilerStep / record_function range
    RUNTIME = 2         # CUDA/HIP runtime call that is not a launch or sync
    LAUNCH = 3          # cudaLaunchKernel, cudaMemcpyAsync, ... (source of a LAUNCH edge)
    SYNC = 4            # stream/event/device synchronize (CPU blocks on GPU work)
    EVENT_RECORD = 5    # cudaEventRecord
    STREAM_WAIT = 6     # cudaStreamWaitEvent
    KERNEL = 7          # GPU compute kernel
    MEMCPY = 8          # GPU memcpy
    MEMSET = 9          # GPU memset
    COLLECTIVE = 10     # a collective's transfer (NCCL kernel, gloo worker op, generated coll)
    SEND = 11
    RECV = 12
    COLL_WAIT = 13      # CPU op that waits for an async collective (c10d wait)


class EdgeKind(IntEnum):
    """Why a data dependency exists. Only SYNC constrains the destination's end."""

    DATA = 0            # tensor/data dependency from an Execution Trace or a generator
    THREAD_ORDER = 1    # (rarely needed: a resource already serializes its nodes)
    STREAM_ORDER = 2    # previous op on the same GPU stream
    LAUNCH = 3          # runtime launch call -> the GPU op it launched
    CROSS_STREAM = 4    # event recorded on one stream waited on by another (cudaStreamWaitEvent)
    SYNC = 5            # GPU work (or async collective) -> the CPU call that waits for it
    INTER_THREAD = 6    # work handed from one CPU thread to another (autograd, gloo/NCCL workers)
    COLLECTIVE = 7      # host op that issues a collective -> the collective node


class ResourceKind(IntEnum):
    CPU_THREAD = 0
    GPU_STREAM = 1


@dataclass(frozen=True)
class Resource:
    """A serial processor: a CPU thread (`device` = pid, `index` = tid) or a GPU stream
    (`device` = GPU ordinal, `index` = stream id)."""

    kind: ResourceKind
    device: int
    index: int
    name: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.kind == ResourceKind.GPU_STREAM

    def label(self) -> str:
        if self.name:
            return self.name
        if self.is_gpu:
            return f"gpu{self.device}/stream{self.index}"
        return f"thread{self.index}"


@dataclass(frozen=True)
class Step:
    """A `ProfilerStep#N` (or a whole trace without annotations): `node` is the annotation's index,
    -1 when the step is synthetic (then the step spans all nodes)."""

    name: str
    node: int
    start_us: float
    duration_us: float


class GraphError(ValueError):
    """A graph violates its invariants (duplicate ids, dangling deps, cycles)."""


@dataclass
class ExecutionGraph:
    """Columnar execution graph of one rank. Build it with `GraphBuilder`; treat columns as read-only."""

    rank: int
    world_size: int
    node_id: np.ndarray            # int64 [N] Chakra ids (unique; >= 0, ours start at 1)
    name: list[str]                # [N]
    node_type: np.ndarray          # int8 [N] NodeType
    kind: np.ndarray               # int8 [N] OpKind
    resource: np.ndarray           # int32 [N] index into `resources`
    start_us: np.ndarray           # float64 [N] recorded start (0 when unknown)
    duration_us: np.ndarray        # float64 [N] recorded (inclusive) duration
    parent: np.ndarray             # int32 [N] call-stack parent index, -1 for none (Chakra ctrl_deps)
    dep_ptr: np.ndarray            # int64 [N+1] CSR row pointers of data deps (incoming edges)
    dep_src: np.ndarray            # int32 [E] source node index of each dep
    dep_kind: np.ndarray           # int8 [E] EdgeKind
    resources: list[Resource]
    steps: list[Step]
    attrs: dict[int, dict[str, Any]] = field(default_factory=dict)   # sparse: node index -> attrs
    metadata: dict[str, Any] = field(default_factory=dict)           # GlobalMetadata attrs, source info

    # ---------------------------------------------------------------- basics
    def __len__(self) -> int:
        return len(self.node_id)

    @property
    def num_edges(self) -> int:
        return len(self.dep_src)

    def deps_of(self, i: int) -> np.ndarray:
        return self.dep_src[self.dep_ptr[i]:self.dep_ptr[i + 1]]

    def dep_kinds_of(self, i: int) -> np.ndarray:
        return self.dep_kind[self.dep_ptr[i]:self.dep_ptr[i + 1]]

    def attr(self, i: int, key: str, default: Any = None) -> Any:
        a = self.attrs.get(i)
        return default if a is None else a.get(key, default)

    def index_of_id(self) -> dict[int, int]:
        return {int(nid): i for i, nid in enumerate(self.node_id)}

    @property
    def trace_origin(self) -> str | None:
        """What a graph converted from PyTorch traces was made from: "kineto" (a Kineto trace, linked to
        its Execution Trace or not) or "execution_trace" (an ET alone); None for other graphs (a Chakra /
        ASTRA-sim .et, a generated workload). The trace readers say so in metadata["source"]; an .et file
        read back has the file's path there instead and the origin as "trace_origin" (its writer stores it;
        an .et written before it did: the keys the converter stores tell it)."""
        meta = self.metadata or {}
        for key in ("trace_origin", "source"):
            if meta.get(key) in ("kineto", "execution_trace"):
                return meta[key]
        if meta.get("source_kineto"):
            return "kineto"
        if meta.get("et_schema") or meta.get("source_et"):
            return "execution_trace"
        return None

    def is_gpu(self) -> np.ndarray:
        """bool [N]: node runs on a GPU stream."""
        gpu_res = np.array([r.is_gpu for r in self.resources], dtype=bool)
        return gpu_res[self.resource] if len(self.resources) else np.zeros(len(self), bool)

    def nodes_on(self, r: int) -> np.ndarray:
        """Indices of the nodes served by resource `r`, in serving order."""
        return np.flatnonzero(self.resource == r)

    def edges(self) -> Iterator[tuple[int, int, int]]:
        """(src, dst, kind) for every data dep."""
        dst = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.dep_ptr))
        for s, d, k in zip(self.dep_src.tolist(), dst.tolist(), self.dep_kind.tolist()):
            yield s, d, k

    def collectives(self) -> np.ndarray:
        """Indices of communication nodes (collectives, send, recv)."""
        t = self.node_type
        return np.flatnonzero((t == NodeType.COMM_COLL_NODE) | (t == NodeType.COMM_SEND_NODE)
                              | (t == NodeType.COMM_RECV_NODE))

    def without_edges(self, kinds: Sequence[int]) -> "ExecutionGraph":
        """A copy without the data deps of the given EdgeKinds (what-if: ignore synchronization)."""
        keep = ~np.isin(self.dep_kind, np.asarray(list(kinds), np.int8))
        counts = np.diff(self.dep_ptr)
        dst = np.repeat(np.arange(len(self)), counts)[keep]
        ptr = np.zeros(len(self) + 1, np.int64)
        np.add.at(ptr, dst + 1, 1)
        return dataclasses.replace(self, dep_ptr=np.cumsum(ptr), dep_src=self.dep_src[keep].copy(),
                                   dep_kind=self.dep_kind[keep].copy())

    # ------------------------------------------------------------ validation
    def validate(self) -> list[str]:
        """Return a list of problems (empty when valid): duplicate ids, dangling deps or parents, and
        one cycle in the data deps with the ids of its nodes."""
        problems: list[str] = []
        n = len(self)
        ids = self.node_id
        uniq, counts = np.unique(ids, return_counts=True)
        dup = uniq[counts > 1]
        if len(dup):
            problems.append(f"duplicate node ids: {dup[:10].tolist()}")
        if len(self.dep_src) and (self.dep_src.min() < 0 or self.dep_src.max() >= n):
            bad = self.dep_src[(self.dep_src < 0) | (self.dep_src >= n)]
            problems.append(f"dangling data deps: {bad[:10].tolist()}")
            return problems
        bad_parent = (self.parent < -1) | (self.parent >= n)
        if bad_parent.any():
            problems.append(f"dangling ctrl deps at node ids {ids[bad_parent][:10].tolist()}")
        cycle = self.find_cycle()
        if cycle:
            problems.append("cycle in data deps through node ids " + " -> ".join(str(int(ids[c])) for c in cycle))
        return problems

    def find_cycle(self) -> list[int]:
        """Node indices of one cycle in data deps (first repeated at the end), or [] when acyclic."""
        order = self.topological_order()
        if order is not None:
            return []
        # Kahn's algorithm left some nodes; walk back along deps inside the remainder until a repeat.
        n = len(self)
        indeg = np.diff(self.dep_ptr).astype(np.int64)
        remaining = self._kahn_remainder(indeg)
        in_rem = np.zeros(n, bool)
        in_rem[remaining] = True
        node = int(remaining[0])
        seen: dict[int, int] = {}
        path: list[int] = []
        while node not in seen:
            seen[node] = len(path)
            path.append(node)
            nxt = [int(s) for s in self.deps_of(node) if in_rem[s]]
            node = nxt[0]
        cyc = path[seen[node]:]
        cyc.reverse()  # deps point backwards; report in execution order
        return cyc + [cyc[0]]

    def _successors_csr(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.dep_ptr))
        order = np.argsort(self.dep_src, kind="stable")
        succ = dst[order]
        ptr = np.zeros(n + 1, np.int64)
        np.add.at(ptr, self.dep_src.astype(np.int64) + 1, 1)
        return np.cumsum(ptr), succ

    def _kahn_remainder(self, indeg: np.ndarray) -> np.ndarray:
        ptr, succ = self._successors_csr()
        indeg = indeg.copy()
        stack = np.flatnonzero(indeg == 0).tolist()
        done = np.zeros(len(self), bool)
        ptr_l, succ_l = ptr.tolist(), succ.tolist()
        deg = indeg.tolist()
        while stack:
            u = stack.pop()
            done[u] = True
            for v in succ_l[ptr_l[u]:ptr_l[u + 1]]:
                deg[v] -= 1
                if deg[v] == 0:
                    stack.append(v)
        return np.flatnonzero(~done)

    def topological_order(self) -> np.ndarray | None:
        """Indices in an order where every dep precedes its dependant; None when there is a cycle."""
        n = len(self)
        ptr, succ = self._successors_csr()
        deg = np.diff(self.dep_ptr).tolist()
        ptr_l, succ_l = ptr.tolist(), succ.tolist()
        ready = [i for i in range(n) if deg[i] == 0]
        out: list[int] = []
        while ready:
            u = ready.pop()
            out.append(u)
            for v in succ_l[ptr_l[u]:ptr_l[u + 1]]:
                deg[v] -= 1
                if deg[v] == 0:
                    ready.append(v)
        return np.asarray(out, np.int64) if len(out) == n else None

    def check(self, source: str = "graph") -> None:
        problems = self.validate()
        if problems:
            raise GraphError(f"{source}: {problems[0]}")


class GraphBuilder:
    """Appends nodes and edges in Python lists, then freezes them into an `ExecutionGraph`.

    Producers add nodes in serving order per resource (see the module docstring). Edges may reference
    nodes added later; `build()` sorts them into CSR form.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank = rank
        self.world_size = world_size
        self._id: list[int] = []
        self._name: list[str] = []
        self._type: list[int] = []
        self._kind: list[int] = []
        self._res: list[int] = []
        self._start: list[float] = []
        self._dur: list[float] = []
        self._parent: list[int] = []
        self._esrc: list[int] = []
        self._edst: list[int] = []
        self._ekind: list[int] = []
        self._res_index: dict[Resource, int] = {}
        self.resources: list[Resource] = []
        self.steps: list[Step] = []
        self.attrs: dict[int, dict[str, Any]] = {}
        self.metadata: dict[str, Any] = {}
        self._next_id = 1  # Chakra ids start at 1: id 0 with nothing else would serialize to zero bytes

    def __len__(self) -> int:
        return len(self._id)

    # Live views of the columns built so far, for producers that patch nodes they already added
    # (e.g. to re-type a node once a later event explains it). Index them; do not append.
    @property
    def starts(self) -> list[float]:
        return self._start

    @property
    def durations(self) -> list[float]:
        return self._dur

    @property
    def parents(self) -> list[int]:
        return self._parent

    @property
    def kinds(self) -> list[int]:
        return self._kind

    @property
    def node_types(self) -> list[int]:
        return self._type

    @property
    def names(self) -> list[str]:
        return self._name

    @property
    def resource_of(self) -> list[int]:
        return self._res

    def resource(self, kind: ResourceKind, device: int, index: int, name: str = "") -> int:
        key = Resource(ResourceKind(kind), int(device), int(index), name)
        r = self._res_index.get(key)
        if r is None:
            r = self._res_index[key] = len(self.resources)
            self.resources.append(key)
        return r

    def add_node(self, name: str, node_type: int, kind: int, resource: int, start_us: float = 0.0,
                 duration_us: float = 0.0, parent: int = -1, node_id: int | None = None,
                 attrs: dict[str, Any] | None = None) -> int:
        i = len(self._id)
        if node_id is None:
            node_id = self._next_id
        self._next_id = max(self._next_id, int(node_id) + 1)
        self._id.append(int(node_id))
        self._name.append(name)
        self._type.append(int(node_type))
        self._kind.append(int(kind))
        self._res.append(resource)
        self._start.append(float(start_us))
        self._dur.append(float(duration_us))
        self._parent.append(parent)
        if attrs:
            self.attrs[i] = attrs
        return i

    def add_dep(self, src: int, dst: int, kind: int = EdgeKind.DATA) -> None:
        """`dst` depends on `src` (both node indices)."""
        self._esrc.append(src)
        self._edst.append(dst)
        self._ekind.append(int(kind))

    def add_deps(self, srcs: Sequence[int], dst: int, kind: int = EdgeKind.DATA) -> None:
        for s in srcs:
            self.add_dep(s, dst, kind)

    def add_edges(self, srcs: Sequence[int], dsts: Sequence[int], kinds: Sequence[int] | int) -> None:
        """Bulk form of add_dep: `dsts[k]` depends on `srcs[k]` (arrays or lists of node indices)."""
        srcs = np.asarray(srcs, np.int64).tolist()
        dsts = np.asarray(dsts, np.int64).tolist()
        if len(srcs) != len(dsts):
            raise ValueError("add_edges: srcs and dsts differ in length")
        self._esrc.extend(srcs)
        self._edst.extend(dsts)
        if isinstance(kinds, (int, np.integer)):
            self._ekind.extend([int(kinds)] * len(srcs))
        else:
            self._ekind.extend(np.asarray(kinds, np.int64).tolist())

    def set_attr(self, i: int, key: str, value: Any) -> None:
        self.attrs.setdefault(i, {})[key] = value

    def add_step(self, name: str, node: int, start_us: float, duration_us: float) -> None:
        self.steps.append(Step(name, node, float(start_us), float(duration_us)))

    def build(self, dedupe_edges: bool = True) -> ExecutionGraph:
        n = len(self._id)
        src = np.asarray(self._esrc, np.int64)
        dst = np.asarray(self._edst, np.int64)
        kind = np.asarray(self._ekind, np.int8)
        if len(src):
            keep = src != dst  # a self-edge carries no information and would be a 1-cycle
            src, dst, kind = src[keep], dst[keep], kind[keep]
        if dedupe_edges and len(src):
            # one edge per (src, dst); keep the first kind recorded
            key = dst * (n + 1) + src
            _, first = np.unique(key, return_index=True)
            first.sort()
            src, dst, kind = src[first], dst[first], kind[first]
        order = np.lexsort((src, dst))
        src, dst, kind = src[order], dst[order], kind[order]
        ptr = np.zeros(n + 1, np.int64)
        if len(dst):
            np.add.at(ptr, dst + 1, 1)
        ptr = np.cumsum(ptr)
        return ExecutionGraph(
            rank=self.rank, world_size=self.world_size,
            node_id=np.asarray(self._id, np.int64),
            name=list(self._name),
            node_type=np.asarray(self._type, np.int8),
            kind=np.asarray(self._kind, np.int8),
            resource=np.asarray(self._res, np.int32),
            start_us=np.asarray(self._start, np.float64),
            duration_us=np.asarray(self._dur, np.float64),
            parent=np.asarray(self._parent, np.int32),
            dep_ptr=ptr, dep_src=src.astype(np.int32), dep_kind=kind,
            resources=list(self.resources), steps=list(self.steps),
            attrs=dict(self.attrs), metadata=dict(self.metadata),
        )


def whole_trace_step(g: ExecutionGraph) -> Step:
    """The synthetic single step used for a trace without ProfilerStep annotations."""
    if len(g) == 0:
        return Step("step", -1, 0.0, 0.0)
    end = float(np.max(g.start_us + g.duration_us))
    start = float(np.min(g.start_us))
    return Step("step", -1, start, end - start)

