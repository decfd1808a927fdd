"""Build an `ExecutionGraph` from a parsed Kineto trace (see kineto.py).

    kineto_to_graph(trace, host_info=None, rank=None) -> ExecutionGraph
    kineto_to_graph_with_map(...) -> (ExecutionGraph, host_node)   # host_node[HostOp.index] = node index

- `host_info`: {HostOp.index: {attr: value}} merged into that host op's node attrs (the Execution Trace
  linker gives input_shapes, input_types, op_schema, rf_id, comm attrs). A collective node lacking comm
  attrs takes them from the host_info / Kineto args of its launching host op or that op's ancestors.
- `rank`: overrides the trace's distributedInfo rank (0 when unknown).

What becomes a node (recorded start and inclusive duration kept as is; times are relative to the
earliest event, the absolute origin is `metadata["time_origin_us"]`):
- every `cpu_op` / `user_annotation` (CPU_OP / ANNOTATION; `gloo:*` annotations are COLLECTIVE nodes on
  their worker thread; c10d wait ops COLL_WAIT) and every runtime call (LAUNCH when its correlation
  matches a GPU op, SYNC, EVENT_RECORD, STREAM_WAIT, else RUNTIME: cudaEventQuery does not block, so it
  is RUNTIME with no edge) on resource (pid, tid), nested by
  time (parent = enclosing op on the thread);
- every `kernel` / `gpu_memcpy` / `gpu_memset` on resource (device, stream); NCCL kernels are
  COLLECTIVE / SEND / RECV with comm attrs. `python_function`, `gpu_user_annotation`, spans, metadata
  and instant events are not nodes.

Edges (every one is checked against the recorded times and dropped when the recording contradicts it,
so that a replay of recorded durations reproduces the trace; dropped counts are in
`metadata["dropped_edges"]`):
- LAUNCH: runtime call -> GPU op with the same `correlation`.
- STREAM_ORDER: previous GPU op on the same stream.
- CROSS_STREAM: cudaStreamWaitEvent. The recording stream and the record call come from the `cuda_sync`
  "Stream Wait Event" event when the trace has one; otherwise they are INFERRED: the record call is the
  latest cudaEventRecord on the waiting call's thread, the recording stream is the stream of that
  thread's latest launch before the record call, and the waiting stream is the stream of that thread's
  next launch after the wait call. Edge: last GPU op launched on the recording stream before the record
  call -> first GPU op launched on the waiting stream after the wait call.
- SYNC (constrains the end): a blocking copy call (the synchronous API, or a copy to or from pageable
  host memory) <- its own copy, when the call returned after the copy ended;
  cudaStreamSynchronize <- last op launched on that stream before the call
  (stream from cuda_sync, else inferred as the stream of the thread's latest launch);
  cudaEventSynchronize <- last op launched on the event's stream before its record call (cuda_sync or
  the same inference); cudaDeviceSynchronize <- last op launched before it on every stream; a main
  thread op named like a backward call ("## backward ##", autograd::backward...) <- the last top-level
  op of each other thread of the process inside its window; c10d wait <- the gloo collective it waits on.
- INTER_THREAD: `fwdbwd` flows (forward op -> backward op).
- COLLECTIVE: c10d collective op -> the gloo collective it issued on a worker thread (matched in order
  by collective type).
"""
from __future__ import annotations

import logging
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any

import numpy as np

from chakra_schema.graph import (CommType, EdgeKind, ExecutionGraph, GraphBuilder, NodeType, OpKind,
                                 ResourceKind)
from chakra_schema.op_names import keeps_values
from chakra_schema.pytorch.kineto import KinetoTrace

log = logging.getLogger(__name__)

# Recorded-time tolerance (us) for edge consistency: timestamps are rounded to 1 us in old traces and
# CUPTI / host clocks differ by a few hundred ns.
TIME_TOL_US = 2.0

SYNC_CALLS = frozenset(("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
                        "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize"))
STREAM_SYNC = frozenset(("cudaStreamSynchronize", "cuStreamSynchronize", "hipStreamSynchronize"))
DEVICE_SYNC = frozenset(("cudaDeviceSynchronize", "cuCtxSynchronize", "hipDeviceSynchronize"))
EVENT_SYNC = frozenset(("cudaEventSynchronize", "cuEventSynchronize", "hipEventSynchronize"))
EVENT_RECORD_CALLS = frozenset(("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord",
                                "cuEventRecordWithFlags", "hipEventRecord", "hipEventRecordWithFlags"))
STREAM_WAIT_CALLS = frozenset(("cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"))
# host calls that run the autograd engine and block until its worker threads finish
BLOCKING_BACKWARD = frozenset(("autograd::backward", "torch::autograd::backward", "autograd::engine::execute",
                               "torch.autograd.backward", "aten::backward"))
WAIT_OPS = frozenset(("c10d::wait", "aten::wait", "_c10d_functional::wait_tensor",
                      "c10d_functional::wait_tensor"))

# Element sizes for the dtype names Kineto writes (c10 ScalarType names, and C type names on gloo ops).
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "int": 4, "int32": 4, "long": 8, "long int": 8, "int64": 8,
    "short": 2, "int16": 2, "char": 1, "int8": 1, "signed char": 1, "byte": 1, "uint8": 1,
    "unsigned char": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}

# (substring of the normalized collective name, CommType); order matters ("reducescatter" before "reduce").
_COMM_NAMES = (
    ("reducescatter", CommType.REDUCE_SCATTER), ("allreduce", CommType.ALL_REDUCE),
    ("allgather", CommType.ALL_GATHER), ("alltoall", CommType.ALL_TO_ALL),
    ("broadcast", CommType.BROADCAST), ("barrier", CommType.BARRIER), ("gather", CommType.GATHER),
    ("scatter", CommType.SCATTER), ("reduce", CommType.REDUCE),
)

# Implicit waits (see _link_gloo): the issuing thread was idle for at least IMPLICIT_WAIT_MIN_IDLE_US
# before a collective ended and resumed at most IMPLICIT_WAIT_RESUME_US after it (wake-up latency is
# milliseconds when ranks and gloo threads share few cores, as in tests/data/cpu_ddp).
IMPLICIT_WAIT_RESUME_US = 10_000.0
IMPLICIT_WAIT_MIN_IDLE_US = 20.0

_GPU_KIND = {"kernel": OpKind.KERNEL, "gpu_memcpy": OpKind.MEMCPY, "gpu_memset": OpKind.MEMSET}
# copy calls of the synchronous API: cudaMemcpy / cudaMemcpy2D / 3D, cuMemcpyDtoH_v2, hipMemcpy ... (not *Async,
# not hipMemcpyWithStream)
_SYNC_COPY_CALL = re.compile(r"^(cuda|cu|hip)Memcpy(?!.*(Async|WithStream|Peer))")


def blocking_copy(call: str, copy: str) -> bool:
    """A copy that holds its calling thread until it is done: a synchronous copy call, or a copy to or
    from pageable host memory (Kineto's copy names say "Pageable"), which the driver runs synchronously."""
    return bool(_SYNC_COPY_CALL.match(call)) or "Pageable" in copy


def comm_type_of(name: str) -> int | None:
    """CommType for a collective name ("allreduce", "nccl:all_reduce", "_allgather_base",
    "ncclKernel_ReduceScatter_...", ...), None for send/recv/unknown. SendRecv kernels map to None."""
    s = name.lower().replace("_", "").replace(" ", "")
    for key, ct in _COMM_NAMES:
        if key in s:
            return int(ct)
    return None


def is_nccl_kernel(name: str) -> bool:
    """NCCL / RCCL device kernels: ncclKernel_AllReduce_..., ncclDevKernel_SendRecv(...), ..."""
    return name.startswith(("ncclKernel", "ncclDevKernel", "rcclKernel", "ncclDevFunc"))


def dtype_bytes(dtype: Any) -> int | None:
    if not isinstance(dtype, str):
        return None
    return DTYPE_BYTES.get(dtype.strip().lower())


def _parse_ranks(v: Any) -> list[int] | None:
    """`Process Group Ranks` is written as a string "[0, 1]" (or a list)."""
    if isinstance(v, list):
        return [int(x) for x in v]
    if isinstance(v, str) and v.startswith("["):
        body = v.strip("[] ")
        try:
            return [int(x) for x in body.split(",") if x.strip()] if body else []
        except ValueError:
            return None
    return None


def comm_attrs_from_args(args: dict) -> dict[str, Any]:
    """Comm attrs from Kineto NCCL / record_param_comms args (empty when they carry no collective)."""
    out: dict[str, Any] = {}
    coll = args.get("Collective name")
    if not coll:
        return out
    out["coll_name"] = str(coll)
    ct = comm_type_of(str(coll))
    if ct is not None:
        out["comm_type"] = ct
    size = dtype_bytes(args.get("dtype"))
    nin, nout = args.get("In msg nelems"), args.get("Out msg nelems")
    if size is not None and (nin is not None or nout is not None):
        # comm_size = the larger buffer: the output of an all-gather, the input of a reduce-scatter,
        # the (equal) buffers of all-reduce / broadcast / all-to-all.
        out["comm_size"] = int(max(int(nin or 0), int(nout or 0)) * size)
        out["dtype"] = str(args.get("dtype"))
    if args.get("Process Group Name") is not None:
        out["pg_name"] = str(args["Process Group Name"])
    ranks = _parse_ranks(args.get("Process Group Ranks"))
    if ranks is not None:
        out["pg_ranks"] = ranks
    if args.get("Group size") is not None:
        out["pg_size"] = int(args["Group size"])
    for key, attr in (("Src Rank", "comm_src"), ("Dst Rank", "comm_dst"), ("Seq", "comm_tag")):
        if args.get(key) is not None and int(args[key]) >= 0:
            out[attr] = int(args[key])
    return out


def _gloo_attrs(name: str, args: dict) -> dict[str, Any]:
    """Comm attrs of a `gloo:*` worker annotation: type from its name, size from its input tensors."""
    out = comm_attrs_from_args(args)
    out.setdefault("coll_name", name.split(":", 1)[-1])
    ct = comm_type_of(name)
    if ct is not None:
        out.setdefault("comm_type", ct)
    if "comm_size" not in out:
        dims, types = args.get("Input Dims"), args.get("Input type")
        if isinstance(dims, list) and isinstance(types, list):
            total = 0
            for d, ty in zip(dims, types):
                sz = dtype_bytes(ty)
                if sz and isinstance(d, list) and d:
                    total += int(np.prod(d)) * sz
            if total:
                out["comm_size"] = total
    return out


def _host_attrs(op, info: dict | None) -> dict[str, Any]:
    a: dict[str, Any] = {"tid": op.tid}
    if op.rf_id is not None:
        a["rf_id"] = op.rf_id
    if op.external_id is not None:
        a["external_id"] = op.external_id
    if op.seq is not None and op.seq >= 0:
        a["seq_id"] = op.seq
    args = op.args
    dims = args.get("Input Dims")
    if dims is not None:
        a["input_shapes"] = dims
        if args.get("Input type") is not None:
            a["input_types"] = args["Input type"]
        # a convolution's stride / padding / dilation / groups, an attention's is_causal: PyTorch 2.x records
        # them as concrete inputs
        concrete = args.get("Concrete Inputs")
        if isinstance(concrete, list) and keeps_values(op.name):
            a["input_values"] = concrete
    if "Collective name" in args:
        a.update(comm_attrs_from_args(args))
    if info:
        a.update(info)
    return a


def kineto_to_graph(trace: KinetoTrace, host_info: dict[int, dict] | None = None,
                    rank: int | None = None) -> ExecutionGraph:
    """Convert one rank's Kineto trace into an ExecutionGraph (see the module docstring)."""
    return kineto_to_graph_with_map(trace, host_info, rank)[0]


def kineto_to_graph_with_map(trace: KinetoTrace, host_info: dict[int, dict] | None = None,
                             rank: int | None = None) -> tuple[ExecutionGraph, np.ndarray]:
    """`kineto_to_graph`, also returning `host_node`: int64 [len(trace.host_ops)], the graph node index
    of each HostOp (by HostOp.index), for callers that add edges between host ops (e.g. Execution
    Trace data deps)."""
    host_info = host_info or {}
    r = rank if rank is not None else (trace.rank if trace.rank is not None else 0)
    ws = trace.world_size if trace.world_size else max(r + 1, 1)
    b = GraphBuilder(rank=r, world_size=ws)
    hops = trace.host_ops
    H, R, G = len(hops), trace.num_runtime, trace.num_gpu_ops

    # ---- one global order: (start, -duration, host before runtime before GPU) -> parents first
    ts = np.concatenate([np.fromiter((h.ts for h in hops), np.float64, H),
                         np.asarray(trace.rt_ts, np.float64), np.asarray(trace.gpu_ts, np.float64)])
    dur = np.concatenate([np.fromiter((h.dur for h in hops), np.float64, H),
                          np.asarray(trace.rt_dur, np.float64), np.asarray(trace.gpu_dur, np.float64)])
    src = np.concatenate([np.zeros(H, np.int8), np.ones(R, np.int8), np.full(G, 2, np.int8)])
    origin = float(ts.min()) if len(ts) else 0.0
    order = np.lexsort((src, -dur, ts))
    rel = (ts - origin).tolist()
    dur_l = dur.tolist()

    # correlation maps (runtime <-> GPU)
    rt_corr, gpu_corr = trace.rt_corr, trace.gpu_corr
    rt_of_corr: dict[int, int] = {}
    for i, c in enumerate(rt_corr):
        if c >= 0:
            rt_of_corr[c] = i
    launch_of_gpu = [rt_of_corr.get(c, -1) if c >= 0 else -1 for c in gpu_corr]
    is_launch = bytearray(R)
    for lr in launch_of_gpu:
        if lr >= 0:
            is_launch[lr] = 1

    # PyTorch 1.8/1.9 recorded ProfilerStep#N as an operator ("Operator" category): in a trace with no
    # ProfilerStep annotation, those operators are the steps
    operator_steps = not any(h.cat == "user_annotation" and h.name.startswith("ProfilerStep#") for h in hops)

    # ---- nodes
    node_of = np.empty(H + R + G, np.int64)
    names = trace.rt_name
    thread_res: dict[tuple, int] = {}
    stacks: dict[int, list] = defaultdict(list)      # resource -> [(end, node)]
    stream_res: dict[tuple[int, int], int] = {}
    nested_overlaps = 0
    tn = trace.thread_names
    order_l = order.tolist()
    for k in order_l:
        kind_src = 0 if k < H else (1 if k < H + R else 2)
        start, d = rel[k], dur_l[k]
        if kind_src == 2:
            g = k - H - R
            key = (trace.gpu_device[g], trace.gpu_stream[g])
            res = stream_res.get(key)
            if res is None:
                res = stream_res[key] = b.resource(ResourceKind.GPU_STREAM, key[0], key[1])
            name = trace.gpu_name[g]
            args = trace.gpu_args[g]
            attrs: dict[str, Any] = {"stream": key[1], "device": key[0]}
            if gpu_corr[g] >= 0:
                attrs["correlation"] = gpu_corr[g]
            for a in ("grid", "block"):
                if a in args:
                    attrs[a] = args[a]
            smem = args.get("shared memory")  # per CTA: how much data a tiled kernel stages (kernel_models)
            if isinstance(smem, int) and 0 < smem < 2**31:
                attrs["shared_memory"] = smem
            if "bytes" in args:
                attrs["bytes"] = int(args["bytes"])
            gkind, gtype = _GPU_KIND[trace.gpu_cat[g]], NodeType.COMP_NODE
            if trace.gpu_cat[g] == "kernel" and is_nccl_kernel(name):
                gkind, gtype = OpKind.COLLECTIVE, NodeType.COMM_COLL_NODE
                attrs.update(comm_attrs_from_args(args))
            node_of[k] = b.add_node(name, gtype, gkind, res, start, d, -1, attrs=attrs)
            continue
        if kind_src == 0:
            op = hops[k]
            pid, tid, name = op.pid, op.tid, op.name
        else:
            i = k - H
            pid, tid, name = trace.rt_pid[i], trace.rt_tid[i], names[i]
        res = thread_res.get((pid, tid))
        if res is None:
            res = thread_res[(pid, tid)] = b.resource(ResourceKind.CPU_THREAD, pid, tid, tn.get((pid, tid), ""))
        stack = stacks[res]
        while stack and stack[-1][0] <= start:
            stack.pop()
        parent = stack[-1][1] if stack else -1
        if stack and start + d > stack[-1][0] + TIME_TOL_US:
            nested_overlaps += 1
        if kind_src == 0:
            if op.cat == "user_annotation" or (operator_steps and name.startswith("ProfilerStep#")):
                if name.startswith("gloo:"):
                    kind, ntype = OpKind.COLLECTIVE, NodeType.COMM_COLL_NODE
                else:
                    kind, ntype = OpKind.ANNOTATION, NodeType.COMP_NODE
            elif name in WAIT_OPS:
                kind, ntype = OpKind.COLL_WAIT, NodeType.COMP_NODE
            else:
                kind, ntype = OpKind.CPU_OP, NodeType.COMP_NODE
            attrs = _host_attrs(op, host_info.get(k))
            if kind == OpKind.COLLECTIVE:
                for key_, v in _gloo_attrs(name, op.args).items():
                    attrs.setdefault(key_, v)
        else:
            if is_launch[i]:
                kind = OpKind.LAUNCH
            elif name in SYNC_CALLS:
                kind = OpKind.SYNC
            elif name in EVENT_RECORD_CALLS:
                kind = OpKind.EVENT_RECORD
            elif name in STREAM_WAIT_CALLS:
                kind = OpKind.STREAM_WAIT
            else:
                kind = OpKind.RUNTIME
            ntype = NodeType.COMP_NODE
            attrs = {"tid": tid}
            if rt_corr[i] >= 0:
                attrs["correlation"] = rt_corr[i]
        n = b.add_node(name, ntype, kind, res, start, d, parent, attrs=attrs)
        node_of[k] = n
        stack.append((start + d, n))
    host_node = node_of[:H]
    rt_node = node_of[H:H + R]
    gpu_node = node_of[H + R:]

    st = b.starts     # recorded starts / durations by node index (builder lists)
    du = b.durations
    dropped: dict[str, int] = defaultdict(int)

    def add(src_n: int, dst_n: int, kind: EdgeKind) -> bool:
        """Add src -> dst when the recorded times allow it (see module docstring)."""
        if src_n < 0 or dst_n < 0 or src_n == dst_n:
            return False
        end = st[src_n] + du[src_n]
        limit = st[dst_n] + du[dst_n] if kind == EdgeKind.SYNC else st[dst_n]
        if end > limit + TIME_TOL_US:
            dropped[kind.name] += 1
            return False
        b.add_dep(src_n, dst_n, kind)
        return True

    # ---- LAUNCH edges and per-stream launch order
    streams: dict[tuple[int, int], list[int]] = defaultdict(list)   # (device, stream) -> gpu indices
    for g in np.argsort(np.asarray(trace.gpu_ts, np.float64), kind="stable").tolist():
        streams[(trace.gpu_device[g], trace.gpu_stream[g])].append(g)
    thread_nodes: dict[int, list[int]] = defaultdict(list)     # CPU resource -> its nodes in order
    res_l = b.resource_of
    for n in range(len(b)):
        thread_nodes[res_l[n]].append(n)
    pos_in_thread = {}
    for nl in thread_nodes.values():
        for p_, n in enumerate(nl):
            pos_in_thread[n] = p_
    proxies = 0

    def latest_done(n: int, t: float) -> int:
        """Stand-in source for an edge n -> (something starting at t) when n itself ended after t: the
        last-ending node on n's thread that had ended by t, among n's descendants (work done inside n
        before it handed off) or else the nodes just before n. -1 when none within 64 nodes."""
        nl = thread_nodes[res_l[n]]
        p0 = pos_in_thread[n]
        n_end = st[n] + du[n]
        best, best_end = -1, -1.0
        for q in range(p0 + 1, min(p0 + 4096, len(nl))):
            m = nl[q]
            if st[m] >= n_end or st[m] > t + TIME_TOL_US:
                break
            e = st[m] + du[m]
            if e <= t + TIME_TOL_US and e > best_end:
                best, best_end = m, e
        if best >= 0:
            return best
        for q in range(p0 - 1, max(p0 - 64, -1), -1):
            m = nl[q]
            if st[m] + du[m] <= t + TIME_TOL_US:
                return m
        return -1
    for g, lr in enumerate(launch_of_gpu):
        if lr < 0:
            continue
        ln, gn = int(rt_node[lr]), int(gpu_node[g])
        if st[ln] + du[ln] <= st[gn] + TIME_TOL_US:
            b.add_dep(ln, gn, EdgeKind.LAUNCH)
            continue
        # The launch call returned after its GPU op had started (CUPTI records the call's full span):
        # an edge from the call would delay the op in a replay. Keep the CPU -> GPU dependency from the
        # thread's latest node that had ended by the op's start instead (usually the previous runtime
        # call under the same host op).
        m = latest_done(ln, st[gn])
        if m >= 0:
            b.add_dep(m, gn, EdgeKind.LAUNCH)
            proxies += 1
        else:
            dropped["LAUNCH"] += 1
    # A blocking copy holds the host until it has finished: the synchronous API (cudaMemcpy, cuMemcpyDtoH,
    # hipMemcpy), or an asynchronous call whose host side is pageable memory (the driver runs it
    # synchronously; Kineto names it "Memcpy DtoH (Device -> Pageable)"). Its call's end waits for the
    # copy, so a copy that runs earlier in a replay (a faster GPU) lets the host go on earlier instead of
    # keeping the recorded wait. An asynchronous copy that merely finished quickly does not block.
    for g, lr in enumerate(launch_of_gpu):
        if lr < 0 or trace.gpu_cat[g] != "gpu_memcpy" or not blocking_copy(names[lr], trace.gpu_name[g]):
            continue
        ln, gn = int(rt_node[lr]), int(gpu_node[g])
        call_end = st[ln] + du[ln]
        # the copy ran while the call was still in it (so the call is not its LAUNCH source) and had
        # ended by the time the call returned
        if st[gn] + TIME_TOL_US < call_end and st[gn] + du[gn] <= call_end + TIME_TOL_US:
            add(gn, ln, EdgeKind.SYNC)
    rt_ts_l = trace.rt_ts
    # launch time of each GPU op (its own start when the launch is missing, e.g. sampled traces),
    # made monotone along the stream so "last op launched before T" is a bisection.
    stream_launch_ts: dict[tuple[int, int], list[float]] = {}
    for key, gl in streams.items():
        prev = None
        lts = []
        for g in gl:
            n = int(gpu_node[g])
            if prev is not None:
                add(prev, n, EdgeKind.STREAM_ORDER)
            prev = n
            lr = launch_of_gpu[g]
            lts.append(rt_ts_l[lr] if lr >= 0 else trace.gpu_ts[g])
        stream_launch_ts[key] = np.maximum.accumulate(np.asarray(lts, np.float64)).tolist() if lts else []

    def last_before(key, t: float) -> int:
        """Node of the last GPU op on stream `key` launched before time t (absolute), -1 if none."""
        lts = stream_launch_ts.get(key)
        if not lts:
            return -1
        j = bisect_left(lts, t) - 1
        return int(gpu_node[streams[key][j]]) if j >= 0 else -1

    def first_after(key, t: float) -> int:
        lts = stream_launch_ts.get(key)
        if not lts:
            return -1
        j = bisect_right(lts, t)
        return int(gpu_node[streams[key][j]]) if j < len(lts) else -1

    # per thread: runtime calls in time order, and the stream of each launch
    rt_by_thread: dict[tuple, list[int]] = defaultdict(list)
    for i in np.argsort(np.asarray(rt_ts_l, np.float64), kind="stable").tolist():
        rt_by_thread[(trace.rt_pid[i], trace.rt_tid[i])].append(i)
    launch_stream: dict[int, tuple[int, int]] = {}
    for g, lr in enumerate(launch_of_gpu):
        if lr >= 0:
            launch_stream[lr] = (trace.gpu_device[g], trace.gpu_stream[g])
    prev_stream = [None] * R      # stream of the thread's latest launch before call i
    next_stream = [None] * R      # stream of the thread's next launch after call i
    prev_record = [-1] * R        # thread's latest event-record call before call i
    for calls in rt_by_thread.values():
        cur, rec = None, -1
        for i in calls:
            prev_stream[i], prev_record[i] = cur, rec
            if i in launch_stream:
                cur = launch_stream[i]
            elif names[i] in EVENT_RECORD_CALLS:
                rec = i
        nxt = None
        for i in reversed(calls):
            next_stream[i] = nxt
            if i in launch_stream:
                nxt = launch_stream[i]

    has_records = any(nm in EVENT_RECORD_CALLS for nm in names)
    sync_of_corr = {c: j for j, c in enumerate(trace.sync_corr) if c >= 0}

    def device_of(i: int) -> int:
        s = prev_stream[i] or next_stream[i]
        return s[0] if s else 0

    for i in range(R):
        name = names[i]
        if name not in SYNC_CALLS and name not in STREAM_WAIT_CALLS:
            continue
        j = sync_of_corr.get(rt_corr[i], -1) if rt_corr[i] >= 0 else -1
        dst = int(rt_node[i])
        t_call = rt_ts_l[i]
        if name in DEVICE_SYNC:
            for key in streams:
                add(last_before(key, t_call), dst, EdgeKind.SYNC)
        elif name in STREAM_SYNC:
            if j >= 0 and trace.sync_stream[j] >= 0:
                key = (device_of(i), trace.sync_stream[j])
                if key not in streams:   # device unknown on the call: find the stream on any device
                    key = next((k2 for k2 in streams if k2[1] == trace.sync_stream[j]), key)
            elif "stream" in trace.rt_args[i]:
                key = (device_of(i), int(trace.rt_args[i]["stream"]))
            else:
                key = prev_stream[i]
            if key is not None:
                add(last_before(key, t_call), dst, EdgeKind.SYNC)
        else:   # event sync or stream wait: find the record call and the recording stream
            rec, rec_key = -1, None
            if j >= 0 and trace.sync_record_corr[j] >= 0:
                rec = rt_of_corr.get(trace.sync_record_corr[j], -1)
                if trace.sync_wait_stream[j] >= 0:
                    sid = trace.sync_wait_stream[j]
                    rec_key = next((k2 for k2 in streams if k2[1] == sid), None)
            if rec < 0 and j < 0:
                rec = prev_record[i]
                if rec < 0 and not has_records:
                    # the trace dropped every event-record call: the event was recorded at the latest
                    # just before this wait, on the stream of the thread's latest launch
                    rec = i
            if rec >= 0 and rec_key is None:
                rec_key = prev_stream[rec]
            if rec < 0 or rec_key is None:
                continue
            src_n = last_before(rec_key, rt_ts_l[rec])
            if name in EVENT_SYNC:
                add(src_n, dst, EdgeKind.SYNC)
                continue
            if j >= 0 and trace.sync_stream[j] >= 0:
                sid = trace.sync_stream[j]
                wait_key = next((k2 for k2 in streams if k2[1] == sid), None)
            else:
                wait_key = next_stream[i]
            if wait_key is None or wait_key == rec_key:
                continue
            add(src_n, first_after(wait_key, t_call), EdgeKind.CROSS_STREAM)

    # ---- fwdbwd flows: forward op -> backward op (first = outermost host op starting at the flow's ts)
    if trace.flows:
        at: dict[tuple, int] = {}
        for h in range(H):
            op = hops[h]
            key = (op.pid, op.tid, op.ts)
            n = int(host_node[h])
            if key not in at or n < at[key]:
                at[key] = n
        ends: dict[int, list] = defaultdict(lambda: [-1, -1])
        for fid, ph, pid, tid, t in trace.flows:
            n = at.get((pid, tid, t), -1)
            ends[fid][0 if ph == "s" else 1] = n
        for s_n, f_n in ends.values():
            add(s_n, f_n, EdgeKind.INTER_THREAD)

    parent = b.parents
    kinds = b.kinds
    # ---- a main-thread backward call waits for the worker threads' work inside its window
    top_by_thread: dict[int, list[int]] = defaultdict(list)
    for h in range(H):
        n = int(host_node[h])
        if parent[n] == -1:
            top_by_thread[res_l[n]].append(n)
    for n_list in top_by_thread.values():
        n_list.sort()
    top_starts = {r_: [st[n] for n in nl] for r_, nl in top_by_thread.items()}
    for h in range(H):
        op = hops[h]
        low = op.name.lower()
        if not (low in BLOCKING_BACKWARD or (op.cat == "user_annotation" and "backward" in low)):
            continue
        x = int(host_node[h])
        x0, x1 = st[x], st[x] + du[x]
        for r_, nl in top_by_thread.items():
            if r_ == res_l[x] or b.resources[r_].device != op.pid:
                continue
            starts = top_starts[r_]
            lo, hi = bisect_left(starts, x0), bisect_right(starts, x1)
            inside = [n for n in nl[lo:hi] if st[n] + du[n] <= x1 + TIME_TOL_US
                      and kinds[n] != OpKind.COLLECTIVE]
            if inside:
                add(max(inside, key=lambda n: st[n] + du[n]), x, EdgeKind.SYNC)

    # ---- gloo: c10d op -> gloo collective on a worker thread; c10d wait <- the collective
    _link_gloo(b, trace, host_node, add, latest_done)

    # ---- collectives lacking comm attrs: take them from the launching host op or its ancestors
    attrs_all = b.attrs
    missing_comm = 0
    for g in range(G):
        n = int(gpu_node[g])
        if kinds[n] != OpKind.COLLECTIVE:
            continue
        a = attrs_all.setdefault(n, {})
        lr = launch_of_gpu[g]
        p = parent[int(rt_node[lr])] if lr >= 0 else -1
        inherited_name = None
        while p >= 0 and not ("comm_type" in a and "comm_size" in a):
            pa = attrs_all.get(p, {})
            for key_ in ("comm_type", "comm_size", "pg_name", "pg_ranks", "pg_size", "coll_name", "dtype",
                         "comm_src", "comm_dst", "comm_tag"):
                if key_ in pa and key_ not in a:
                    a[key_] = pa[key_]
            nm = b.names[p]
            if inherited_name is None and (nm.startswith("nccl:") or nm.startswith("c10d::")):
                inherited_name = nm.split(":", 2)[-1]
            p = parent[p]
        if "coll_name" not in a and inherited_name:
            a["coll_name"] = inherited_name
        if "comm_type" not in a:
            ct = comm_type_of(a.get("coll_name", "")) if a.get("coll_name") else None
            ct = ct if ct is not None else comm_type_of(b.names[n].split("(")[0])
            coll = a.get("coll_name", "")
            if ct is None and coll in ("send", "recv"):
                kinds[n] = OpKind.SEND if coll == "send" else OpKind.RECV
                b.node_types[n] = NodeType.COMM_SEND_NODE if coll == "send" else NodeType.COMM_RECV_NODE
            elif ct is None and "sendrecv" in b.names[n].lower():
                # a SendRecv kernel with no collective context: PyTorch issues these for all_to_all (NCCL's
                # generic kernel, ncclDevKernel_Generic, says nothing: its type stays unknown)
                ct = int(CommType.ALL_TO_ALL)
            if ct is not None:
                a["comm_type"] = ct
        if "comm_size" not in a:
            missing_comm += 1
    _default_pg(b, trace, [n for n in range(len(b)) if kinds[n] in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)])

    # ---- steps: ProfilerStep#N annotations, else the whole trace
    for h in range(H):
        op = hops[h]
        if op.name.startswith("ProfilerStep#") and (op.cat == "user_annotation" or operator_steps):
            n = int(host_node[h])
            b.add_step(op.name, n, st[n], du[n])
    b.steps.sort(key=lambda s: s.start_us)
    _warn_overlapping_steps(trace.path, b.steps)
    if not b.steps and len(b):
        end = max(s + d for s, d in zip(st, du))
        b.add_step("step", -1, 0.0, end)

    b.metadata.update({
        "source": "kineto", "source_path": trace.path, "time_origin_us": origin,
        "dropped_edges": dict(dropped), "launch_proxies": proxies, "nested_overlaps": nested_overlaps,
        "collectives_without_size": missing_comm, "recorded_world_size": trace.world_size or 0,
    })
    if trace.pg_config is not None:
        b.metadata["pg_config"] = trace.pg_config
    # which GPU recorded the trace: hardware translation and model timing start from it
    props = trace.metadata.get("deviceProperties")
    if isinstance(props, list) and props:
        keep = ("id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "numSms")
        b.metadata["deviceProperties"] = [{k: p[k] for k in keep if k in p} for p in props if isinstance(p, dict)]
    return b.build(), host_node.copy()


def _warn_overlapping_steps(path, steps) -> None:
    """ProfilerSteps of one rank follow each other; one that begins before the last has ended (an edited or
    merged trace) makes both measured step times count the shared span: say so rather than score them."""
    for prev, cur in zip(steps, steps[1:]):
        over = prev.start_us + prev.duration_us - cur.start_us
        if over > TIME_TOL_US:    # recorded timestamps round to 1 us
            log.warning("%s: %s begins %.3f ms before %s ends: overlapping steps are measured over their "
                        "recorded spans, which count the overlap twice", path, cur.name, over / 1000, prev.name)
            return


def _default_pg(b: GraphBuilder, trace: KinetoTrace, comm_nodes: list[int]) -> None:
    """A collective without process-group attrs in a trace with a single process group ran on it."""
    pgs = trace.pg_config or []
    if len(pgs) != 1 or not isinstance(pgs[0], dict):
        return
    pg = pgs[0]
    for n in comm_nodes:
        a = b.attrs.setdefault(n, {})
        if "pg_name" not in a and pg.get("pg_name") is not None:
            a["pg_name"] = str(pg["pg_name"])
        if "pg_ranks" not in a and isinstance(pg.get("ranks"), list):
            a["pg_ranks"] = [int(x) for x in pg["ranks"]]


def _link_gloo(b: GraphBuilder, trace: KinetoTrace, host_node: np.ndarray, add, latest_done) -> None:
    """CPU collectives: a `c10d::<coll>` op enqueues the work for a gloo worker thread, which records it
    as a `gloo:<coll>` annotation (possibly later, when the worker is free).

    Pairing: by Record function id when both carry one (the worker's annotation is created while the
    c10d op runs, so its id is the next one after the issuing op's: pick the unpaired issue of the same
    type with the largest id below it); otherwise in time order (the first unpaired issue of the same
    type that started before the worker op). Edge: issue -COLLECTIVE-> worker op.

    Waiting: an explicit c10d wait on the issuing thread gets a SYNC edge from the earliest unwaited
    collective of that thread that ended before it. Without a wait op (DDP waits inside the reducer,
    which records nothing), the issuing thread's work that resumes right after the collective ends,
    after an idle gap that contains the end, depends on the collective (INTER_THREAD): the thread was
    blocked on it."""
    hops = trace.host_ops
    gloo = [h for h, op in enumerate(hops) if op.cat == "user_annotation" and op.name.startswith("gloo:")]
    if not gloo:
        return
    issues = [h for h, op in enumerate(hops) if op.name.startswith("c10d::") and op.name not in WAIT_OPS
              and comm_type_of(op.name) is not None]
    waits = [h for h, op in enumerate(hops) if op.name in WAIT_OPS]
    st, du = b.starts, b.durations
    gloo.sort(key=lambda h: hops[h].ts)
    issues.sort(key=lambda h: hops[h].ts)
    unpaired: dict[int, list[int]] = defaultdict(list)     # comm type -> issues not yet paired, by time
    for h in issues:
        unpaired[comm_type_of(hops[h].name)].append(h)
    pairs: list[tuple[int, int]] = []                       # (issue host index, gloo host index)
    for gh in gloo:
        cands = unpaired.get(comm_type_of(hops[gh].name), [])
        g_rf = hops[gh].rf_id or 0
        gn = int(host_node[gh])
        pick = -1
        if g_rf > 0:
            below = [p for p, h in enumerate(cands) if 0 < (hops[h].rf_id or 0) < g_rf]
            if below:
                pick = max(below, key=lambda p: hops[cands[p]].rf_id)
        if pick < 0:
            pick = next((p for p, h in enumerate(cands) if st[int(host_node[h])] <= st[gn] + TIME_TOL_US), -1)
        if pick >= 0:
            pairs.append((cands.pop(pick), gh))
    issued_by: dict[tuple, list[int]] = defaultdict(list)   # issuing thread -> gloo nodes in issue order
    for h, gh in sorted(pairs, key=lambda x: hops[x[0]].ts):
        ni, gn = int(host_node[h]), int(host_node[gh])
        if st[ni] + du[ni] > st[gn] + TIME_TOL_US:
            # the worker started while the c10d op was still running: depend on what it had done by then
            src_n = latest_done(ni, st[gn])
            b.add_dep(src_n, gn, EdgeKind.COLLECTIVE) if src_n >= 0 else add(ni, gn, EdgeKind.COLLECTIVE)
        else:
            add(ni, gn, EdgeKind.COLLECTIVE)
        issued_by[(hops[h].pid, hops[h].tid)].append((ni, gn))
        for key_, v in b.attrs.get(ni, {}).items():   # ET / record_param_comms attrs of the issuer
            if key_.startswith(("comm_", "pg_")) or key_ in ("coll_name", "dtype"):
                b.attrs.setdefault(gn, {}).setdefault(key_, v)
    waits.sort(key=lambda h: hops[h].ts)
    for h in waits:
        wn = int(host_node[h])
        pending = issued_by.get((hops[h].pid, hops[h].tid), [])
        for pos, (_, gn) in enumerate(pending):
            if st[gn] + du[gn] <= st[wn] + du[wn] + TIME_TOL_US and st[gn] <= st[wn] + du[wn]:
                del pending[pos]
                add(gn, wn, EdgeKind.SYNC)
                break
    if waits:
        return
    # implicit waits: per issuing thread, the leaf timeline (annotations excluded: a ProfilerStep or a
    # module annotation spans the wait) and the first op that resumes after each collective's end
    kinds, res_l = b.kinds, b.resource_of
    for (pid, tid), gnodes in issued_by.items():
        rres = res_l[int(host_node[next(h for h, _ in pairs if hops[h].tid == tid and hops[h].pid == pid)])]
        ops = [n for n in range(len(b)) if res_l[n] == rres and kinds[n] != OpKind.ANNOTATION]
        starts = [st[n] for n in ops]
        ends = np.maximum.accumulate(np.asarray([st[n] + du[n] for n in ops], np.float64)).tolist()
        for ni, gn in gnodes:
            e = st[gn] + du[gn]
            # first op starting at/after the end (-tol) and after the issuing op: a collective shorter than
            # the tolerance must not make its own issuer wait for it (a 2-cycle)
            j = max(bisect_left(starts, e - TIME_TOL_US), bisect_right(starts, st[ni]))
            if j >= len(ops) or starts[j] - e > IMPLICIT_WAIT_RESUME_US:
                continue
            busy_until = ends[j - 1] if j > 0 else -1.0
            if busy_until < e - IMPLICIT_WAIT_MIN_IDLE_US:   # idle across the end: it was waiting
                add(gn, ops[j], EdgeKind.INTER_THREAD)
