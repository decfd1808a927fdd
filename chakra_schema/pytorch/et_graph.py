"""Build an `ExecutionGraph` from an Execution Trace alone (no Kineto: no times, no GPU kernels).

    execution_trace_to_graph(et, rank=None) -> ExecutionGraph

What becomes a node (node id = ET id, so ids stay traceable to the source file):
- every ET node except the process / thread roots and `## process_group:init ##` (its groups go to
  `metadata["process_groups"]`), on the CPU thread resource (pid, ET tid), in ET id order (= start
  order), parent = ET ctrl_deps parent (-1 when the parent is a skipped root or absent, except that an
  op of a step whose parent link leads nowhere goes back under its step: `_adopt_orphans`);
- record_function ranges (RecordScope USER_SCOPE, `ProfilerStep#N`, `## forward ##`) are ANNOTATIONs;
- communication, one COMM node per collective (not one per layer of the c10d::op -> record_param_comms
  -> nccl:op stack): the transfer node is the `nccl:*` / `gloo:*` node (a synthetic one when a
  record_param_comms has no such child). It moves off the host thread to a per-process-group resource
  so it can overlap host work: a GPU stream (device from the tensors, index 1000 + group number) for
  CUDA tensors, a CPU worker thread (index 1000 + group number) for CPU tensors (gloo). Its issuer gets a
  COLLECTIVE edge to it: the record_param_comms above it, or, in ETs without record_param_comms (gloo),
  the oldest c10d op of the same collective type still without a transfer. A `record_param_comms`
  named "wait" is a COLL_WAIT with a SYNC edge from the collective of the same sequence number.
- comm attrs: comm_type, coll_name, comm_size, dtype, pg_name, pg_ranks, pg_size (comm_src / comm_dst
  for send / recv when the c10d op names the peer). `comm_size` follows nccl-tests' "size": the larger of
  the input and output buffers (in_msg_nelems x dtype size vs out_msg_nelems x dtype size), i.e. the
  whole output of an all-gather, the whole input of a reduce-scatter, the buffer of an all-reduce /
  broadcast / reduce, the total send buffer of an all-to-all. Without msg_nelems attrs (schema 1.0.2)
  the element counts are summed from the op's tensors.

Edges (all from an earlier to a later node in ET order = node index order, so acyclic by construction):
- DATA: tensor producer -> consumer between TOP-LEVEL ops only (an op with no op ancestor; annotations
  do not count), tensors keyed by (tensor_id, storage_id); the producer is the last earlier top-level op
  (or collective, for the tensors a collective writes) with the tensor among its outputs. Nested ops
  are covered by their top-level ancestor, which keeps the graph small.
- COLLECTIVE and SYNC as above.

Durations are 0 (unknown) unless the ET carries `ts` / `dur` (Chakra's trace linker output). Steps:
every `ProfilerStep#N` annotation, else one synthetic step.
"""
from __future__ import annotations

import bisect
import logging
from typing import Any

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import CommType, EdgeKind, ExecutionGraph, GraphBuilder, NodeType, OpKind, ResourceKind
from chakra_schema.pytorch.execution_trace import (PG_INIT, RECORD_FUNCTION_SCOPE_USER, ExecutionTrace,
                                                   is_root_name, op_attrs, record_param_comms_args)

log = logging.getLogger(__name__)

# Collective names seen in ETs and Kineto (c10d op names, record_param_comms names, nccl:/gloo: names),
# normalized by `_norm` (lower case, no "_" / prefix) -> CommType. Send / recv are handled apart.
_COMM_TYPES: dict[str, CommType] = {}
for _ct, _names in (
    (CommType.ALL_REDUCE, ("allreduce", "allreducecoalesced", "allreducesparse")),
    (CommType.REDUCE, ("reduce",)),
    (CommType.ALL_GATHER, ("allgather", "allgatherbase", "allgatherintotensor", "allgathercoalesced",
                           "allgatherintotensorcoalesced", "allgathertensorcoalesced")),
    (CommType.GATHER, ("gather",)),
    (CommType.SCATTER, ("scatter",)),
    (CommType.BROADCAST, ("broadcast", "broadcastcoalesced")),
    (CommType.ALL_TO_ALL, ("alltoall", "alltoallbase", "alltoallsingle", "alltoallv")),
    (CommType.REDUCE_SCATTER, ("reducescatter", "reducescattertensor", "reducescatterbase",
                               "reducescattertensorcoalesced")),
    (CommType.BARRIER, ("barrier",)),
):
    for _n in _names:
        _COMM_TYPES[_n] = _ct
_P2P = {"send": OpKind.SEND, "isend": OpKind.SEND, "recv": OpKind.RECV, "irecv": OpKind.RECV,
        "recvanysource": OpKind.RECV}

# bytes per element of the dtype names record_param_comms uses (c10::ScalarType names)
DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
               "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1,
               "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "complexfloat": 8, "complexdouble": 16}

COMM_STREAM_BASE = 1000  # resource index of the per-process-group communication streams


def _norm(name: str) -> str:
    s = name.lower()
    for prefix in ("nccl:", "gloo:", "c10d::", "mpi:", "ucc:"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s.replace("_", "").replace(" ", "")


def collective_kind(name: str) -> tuple[int, int | None] | None:
    """(OpKind, CommType or None) of a collective name, None when it is not a known collective."""
    key = _norm(name)
    if key in _P2P:
        return int(_P2P[key]), None
    ct = _COMM_TYPES.get(key)
    return (int(OpKind.COLLECTIVE), int(ct)) if ct is not None else None


def _tensors(values: Any, types: Any) -> list[list]:
    """Tensor values [tensor_id, storage_id, offset, numel, itemsize, device] in an input/output list."""
    out: list[list] = []
    if not isinstance(values, list) or not isinstance(types, list):
        return out
    for v, ty in zip(values, types):
        if isinstance(ty, str) and "Tensor" in ty:
            _collect(v, out)
    return out


def _collect(v: Any, out: list) -> None:
    if isinstance(v, list):
        if len(v) == 6 and isinstance(v[0], int) and isinstance(v[1], int) and isinstance(v[5], str):
            out.append(v)
        else:
            for x in v:
                _collect(x, out)


def _device_index(device: str) -> int | None:
    if isinstance(device, str) and ":" in device and device.split(":", 1)[0] in ("cuda", "hip", "xpu", "mtia"):
        try:
            return int(device.split(":", 1)[1])
        except ValueError:
            return None
    return None


def comm_attrs(et: ExecutionTrace, rpc: int, fallback_name: str = "") -> dict[str, Any]:
    """Comm attrs of the collective recorded by `record_param_comms` node `rpc` (or by a bare nccl:/gloo:
    node), from its attrs when present, else from its positional inputs and tensors."""
    c = et.comm.get(rpc, {})
    pos = record_param_comms_args(et, rpc) if et.names[rpc] == "record_param_comms" else {}
    coll = str(c.get("collective_name") or pos.get("collective_name") or fallback_name or et.names[rpc])
    a: dict[str, Any] = {"coll_name": coll.split(":", 1)[-1] if ":" in coll else coll}
    kind = collective_kind(coll)
    if kind is not None and kind[1] is not None:
        a["comm_type"] = kind[1]
    ins = _tensors(et.in_values[rpc], et.in_types[rpc])
    outs = _tensors(et.out_values[rpc], et.out_types[rpc])
    itemsize = next((t[4] for t in ins + outs if isinstance(t[4], int) and t[4] > 0), None)
    dtype = c.get("dtype")
    size = DTYPE_BYTES.get(str(dtype).lower()) if dtype else None
    if size is None:
        size = itemsize
    if dtype:
        a["dtype"] = str(dtype)
    n_in = c.get("in_msg_nelems")
    n_out = c.get("out_msg_nelems")
    if n_in is None:
        n_in = sum(int(t[3]) for t in ins)
    if n_out is None:
        n_out = sum(int(t[3]) for t in outs)
    if size:
        a["comm_size"] = int(max(int(n_in or 0), int(n_out or 0)) * int(size))
    pg_name = c.get("pg_name", pos.get("pg_name"))
    if pg_name is None and isinstance(pos.get("pg"), int):  # schema 1.0.2: a backend id
        pg_name = next((str(pg.get("pg_name")) for pg in et.process_groups if pg.get("backend_id") == pos["pg"]),
                       None)
    a["pg_name"] = str(pg_name) if pg_name not in (None, "") else "0"
    pg_size = c.get("pg_size", pos.get("pg_size"))
    start = c.get("global_rank_start", pos.get("global_rank_start"))
    stride = c.get("global_rank_stride", pos.get("global_rank_stride"))
    ranks = None
    if isinstance(pg_size, int) and pg_size > 0 and isinstance(start, int) and isinstance(stride, int) \
            and start >= 0 and stride > 0:
        ranks = [start + k * stride for k in range(pg_size)]
    if ranks is None:
        ranks = et.pg_ranks(a["pg_name"])
    if ranks is None and isinstance(pg_size, int) and pg_size > 0:
        ranks = list(range(pg_size))
    if ranks is not None:
        a["pg_ranks"] = ranks
        a["pg_size"] = len(ranks)
    if isinstance(pos.get("seq"), int):
        a["comm_seq"] = pos["seq"]
    return a


def kernel_hints(et: ExecutionTrace, i: int) -> dict[str, Any]:
    """What model mode needs to infer an op's GPU kernels from the ET alone (replay/et_kernels.py) that the
    shapes do not say: the device of its tensors, whether its outputs only alias its inputs (a view
    launches nothing), and its scalar arguments (is_causal, dims)."""
    ins = _tensors(et.in_values[i], et.in_types[i])
    outs = _tensors(et.out_values[i], et.out_types[i])
    a: dict[str, Any] = {}
    devices = {str(t[5]).split(":", 1)[0] for t in ins + outs if t[5]}
    if devices:
        a["tensor_devices"] = sorted(devices)
        if len(devices) > 1:  # a copy between devices: which side is which (copy_(self=dst, src))
            a["input_devices"] = [str(t[5]).split(":", 1)[0] for t in ins]
            a["output_devices"] = [str(t[5]).split(":", 1)[0] for t in outs]
    in_storage = {t[1] for t in ins}
    if outs and all(t[1] in in_storage for t in outs):
        a["outputs_alias_inputs"] = True
    values = et.in_values[i]
    types = et.in_types[i]
    if isinstance(values, list) and isinstance(types, list):
        scalars = [v if isinstance(ty, str) and ty in ("Bool", "Int", "Double") else None
                   for v, ty in zip(values, types)]
        if any(v is not None for v in scalars):
            a["scalar_inputs"] = scalars
    return a


def _reject_parent_cycles(et: ExecutionTrace, parent_of: list[int]) -> None:
    """ctrl_deps form a forest: a node that is its own ancestor through other nodes is a corrupt trace,
    refused rather than replayed with steps cut short. A node naming itself as parent is a root (the
    process root does; an op that does is an orphan: `_adopt_orphans`)."""
    state = [0] * len(parent_of)          # 0 unseen, 1 on the current walk, 2 known to reach a root
    for start in range(len(parent_of)):
        walk, i = [], start
        while i >= 0 and state[i] == 0 and parent_of[i] != i:
            state[i] = 1
            walk.append(i)
            i = parent_of[i]
        if i >= 0 and state[i] == 1:
            raise TraceInputError(et.path, f"node {int(et.ids[i])} ({et.names[i]}) is its own ancestor through "
                                           "its parent links (ctrl_deps; 'parent' in the 1.0.1 schema): a "
                                           "corrupt trace")
        for j in walk:
            state[j] = 2


def _adopt_orphans(et: ExecutionTrace, parent_of: list[int]) -> tuple[int, str]:
    """Ops whose parent link leads nowhere -- an id absent from the trace (a truncated or edited file), the
    op itself, or an op that started later -- would be top-level ops outside every ProfilerStep, and their
    time would leave their step without a word. ET ids are assigned as ops start, so such an op, on its
    step's thread and within the step's ids (up to the next step's; for the last step, up to its last
    descendant), goes back under that step, in place in `parent_of` -- unless its absent parent started
    outside those ids: before the step (it enclosed the step, as a `record_function` around the training
    loop does) or after it (an unwritten step the ET stopped in). Steps themselves stay where they are.
    Returns how many were put under a step, and the first of them, for the warning."""
    names = et.names
    n = len(parent_of)
    steps = [i for i in range(n) if names[i].startswith("ProfilerStep#")]
    if not steps:
        return 0, ""        # the whole trace is one step: nothing can leave it
    last = list(range(n))   # the largest index in each node's subtree (linked descendants)
    for i in range(n - 1, -1, -1):
        p = parent_of[i]
        if 0 <= p < i and last[i] > last[p]:
            last[p] = last[i]
    ids = et.ids.tolist()
    pids = et.parent_ids.tolist()
    tids = et.tid.tolist()
    adopted, first = 0, ""
    for i in range(steps[0] + 1, n):
        p = parent_of[i]
        if (p < 0 and pids[i] == 0) or 0 <= p < i or is_root_name(names[i]) or names[i].startswith(
                ("nccl:", "gloo:", "ProfilerStep#")):
            # no parent recorded, a real call-stack parent, a root, a step, or a collective's transfer (a
            # gloo transfer on its worker thread can start before its c10d op: the main loop finds its issuer)
            continue
        k = bisect.bisect_left(steps, i) - 1          # the last step that started before the op
        s = steps[k]
        end = ids[steps[k + 1]] if k + 1 < len(steps) else ids[last[s]] + 1   # ids [step, end) are the step's
        inside = ids[s] < ids[i] < end and (p >= 0 or ids[s] < pids[i] < end)
        if tids[i] != tids[s] or not inside:
            continue
        parent_of[i] = s
        adopted += 1
        if not first:
            first = f"node {ids[i]} ({names[i]}) names parent {pids[i]}"
    return adopted, first


def execution_trace_to_graph(et: ExecutionTrace, rank: int | None = None) -> ExecutionGraph:
    """Convert an Execution Trace into an ExecutionGraph (see the module docstring)."""
    r = rank if rank is not None else (et.rank if et.rank is not None else 0)
    ws = et.world_size if et.world_size else max(r + 1, 1)
    b = GraphBuilder(rank=r, world_size=ws)
    n = len(et)
    names = et.names
    parent_of = et.parent_index().tolist()
    _reject_parent_cycles(et, parent_of)
    orphans, first_orphan = _adopt_orphans(et, parent_of)
    scope = et.scope.tolist()
    tids = et.tid.tolist()
    ids = et.ids.tolist()
    next_id = (max(ids) if ids else 0) + 1

    skip = [is_root_name(nm) or nm == PG_INIT for nm in names]
    node_of = [-1] * n           # ET index -> graph node index
    has_children: set[int] = set()   # graph nodes that are some node's parent
    stack_of = [-1] * n          # ET index -> graph node its ET children take as call-stack parent
    is_op = [False] * n          # a real operator (not an annotation, not skipped)
    under_op = [False] * n       # has an operator ancestor

    # ---- communication: which ET node is the transfer of which record_param_comms
    rpc_of_transfer: dict[int, int] = {}   # nccl:/gloo: ET index -> its record_param_comms ET index
    transfer_of_rpc: dict[int, int] = {}
    for i in range(n):
        nm = names[i]
        if nm.startswith(("nccl:", "gloo:")):
            p = parent_of[i]
            if p >= 0 and names[p] == "record_param_comms":
                rpc_of_transfer[i] = p
                transfer_of_rpc.setdefault(p, i)

    comm_streams: dict[str, int] = {}
    gpu_backend = any("nccl" in str(pg.get("backend_config", "")) for pg in et.process_groups)

    def comm_resource(pg_name: str, tensors: list[list]) -> int:
        """Where a collective's transfer runs: a GPU stream of the tensors' device (NCCL), or, for CPU
        tensors (gloo), a worker thread of the process."""
        k = comm_streams.setdefault(pg_name, len(comm_streams))
        device = tensors[0][5] if tensors else ("cuda" if gpu_backend else "cpu")
        if str(device).startswith("cpu"):
            return b.resource(ResourceKind.CPU_THREAD, et.pid, COMM_STREAM_BASE + k, f"comm worker pg {pg_name}")
        dev = _device_index(device)
        dev = r if dev is None else dev
        return b.resource(ResourceKind.GPU_STREAM, dev, COMM_STREAM_BASE + k, f"gpu{dev}/comm pg {pg_name}")

    # A wait names the sequence number of its collective but not the group (its pg slot is empty), so
    # collectives are found by sequence number alone, the latest one winning.
    collective_by_seq: dict[int, int] = {}                 # seq -> graph node of the collective
    pending_by_thread: dict[int, list[int]] = {}           # collectives issued and not yet waited
    waited: set[int] = set()
    producer: dict[tuple[int, int], int] = {}              # tensor key -> graph node that wrote it last
    pending_transfer: dict[int, dict] = {}                # record_param_comms ET index -> comm attrs
    steps: list[tuple[str, int, float, float]] = []
    end_us = 0.0
    unknown_collectives: set[str] = set()

    # c10d ops that issued a collective whose transfer has not been seen yet, by (kind, CommType): an ET
    # without record_param_comms (gloo) records the gloo:* transfer later, not always under its c10d op
    c10d_waiting: dict[tuple, list[int]] = {}

    def add_transfer(issuer_et: int, src: int, attrs: dict, name: str, node_id: int, transfer_et: int) -> int:
        """The collective's transfer node; `issuer_et` (ET index or -1) gets a COLLECTIVE edge to it,
        `src` is the ET node whose tensors the collective reads and writes."""
        kind_ct = collective_kind(attrs.get("coll_name", name))
        kind = kind_ct[0] if kind_ct else int(OpKind.COLLECTIVE)
        ntype = {int(OpKind.SEND): NodeType.COMM_SEND_NODE, int(OpKind.RECV): NodeType.COMM_RECV_NODE}.get(
            kind, NodeType.COMM_COLL_NODE)
        tensors = _tensors(et.in_values[transfer_et], et.in_types[transfer_et]) or \
            _tensors(et.in_values[src], et.in_types[src])
        res = comm_resource(attrs["pg_name"], tensors)
        g = b.add_node(name, ntype, kind, res, 0.0, 0.0, -1, node_id, attrs)
        if issuer_et >= 0 and node_of[issuer_et] >= 0:
            b.add_dep(node_of[issuer_et], g, EdgeKind.COLLECTIVE)
        for q in c10d_waiting.values():  # the issuer's c10d ancestor has its transfer now
            p = parent_of[issuer_et] if issuer_et >= 0 else -1
            for c in (issuer_et, p):
                if c in q:
                    q.remove(c)
        seq = attrs.get("comm_seq")
        if isinstance(seq, int):
            collective_by_seq[seq] = g
        pending_by_thread.setdefault(tids[src], []).append(g)
        # the transfer writes the collective's output tensors (and in-place inputs)
        for t in _tensors(et.out_values[src], et.out_types[src]) or _tensors(et.in_values[src], et.in_types[src]):
            producer[(t[0], t[1])] = g
        return g

    def p2p_peer(rpc: int) -> dict[str, Any]:
        """c10d::send_(tensors, pg, dstRank, tag) / c10d::recv_(tensors, pg, srcRank, tag): the peer."""
        p = parent_of[rpc]
        if p < 0 or not names[p].startswith("c10d::"):
            return {}
        ints = [v for v, ty in zip(et.in_values[p], et.in_types[p]) if ty == "Int"]
        if not ints:
            return {}
        key = "comm_dst" if "send" in names[p] else "comm_src"
        out = {key: int(ints[0])}
        if len(ints) > 1:
            out["comm_tag"] = int(ints[1])
        return out

    for i in range(n):
        if skip[i]:
            continue
        nm = names[i]
        p = parent_of[i]
        if p >= i:  # an ET parent must have started first; anything else is not a call stack
            p = -1
        gp = stack_of[p] if p >= 0 else -1

        transfer: int | None = None
        if i in rpc_of_transfer and rpc_of_transfer[i] in pending_transfer:
            rpc = rpc_of_transfer[i]
            transfer = add_transfer(rpc, rpc, pending_transfer.pop(rpc), nm, ids[i], i)
        elif nm.startswith(("nccl:", "gloo:")) and i not in rpc_of_transfer:
            # a bare transfer (gloo ETs have no record_param_comms): its issuer is the oldest c10d op of
            # the same collective still without a transfer, else its own c10d parent
            ca = comm_attrs(et, i, nm)
            ck = collective_kind(ca["coll_name"])
            if ck is not None:
                q = c10d_waiting.get(ck)
                issuer = q.pop(0) if q else (p if p >= 0 and names[p].startswith("c10d::") else -1)
                transfer = add_transfer(issuer, i, ca, nm, ids[i], i)
            else:
                unknown_collectives.add(ca["coll_name"])
        if transfer is not None:
            node_of[i] = transfer
            stack_of[i] = gp  # anything nested in the transfer stays on the host, under the issuer
            is_op[i] = under_op[i] = True
            continue  # a transfer has no call-stack parent and no data deps of its own

        res = b.resource(ResourceKind.CPU_THREAD, et.pid, tids[i], f"thread{tids[i]}")
        annotation = scope[i] == RECORD_FUNCTION_SCOPE_USER or nm.startswith("ProfilerStep#")
        kind = OpKind.ANNOTATION if annotation else OpKind.CPU_OP
        attrs: dict[str, Any] = {"tid": tids[i]}
        if et.rf_id[i] >= 0:
            attrs["rf_id"] = int(et.rf_id[i])
        if et.seq_id[i] >= 0:
            attrs["seq_id"] = int(et.seq_id[i])
        attrs.update(op_attrs(et, i))
        attrs.update(kernel_hints(et, i))
        extra = et.extra.get(i)
        start = dur = 0.0
        if extra and "dur" in extra:
            start, dur = float(extra.get("ts") or 0.0), float(extra.get("dur") or 0.0)

        wait_of: list[int] = []
        synthetic: dict[str, Any] | None = None
        if nm.startswith("c10d::"):
            ck = collective_kind(nm)
            if ck is not None:
                c10d_waiting.setdefault(ck, []).append(i)
        if nm == "record_param_comms":
            ca = comm_attrs(et, i, nm)
            ck = collective_kind(ca["coll_name"])
            if _norm(ca["coll_name"]) == "wait":
                kind = OpKind.COLL_WAIT
                seq = ca.get("comm_seq")
                hit = collective_by_seq.get(seq) if isinstance(seq, int) else None
                if hit is not None:
                    wait_of = [hit]
                else:  # no sequence number: everything this thread issued and nobody waited for yet
                    wait_of = [g for g in pending_by_thread.get(tids[i], []) if g not in waited]
                waited.update(wait_of)
                pending_by_thread[tids[i]] = [g for g in pending_by_thread.get(tids[i], []) if g not in waited]
            elif ck is None:
                unknown_collectives.add(ca["coll_name"])
            else:
                if ck[0] != OpKind.COLLECTIVE:
                    ca.update(p2p_peer(i))
                if i in transfer_of_rpc:
                    pending_transfer[i] = ca   # the nccl:/gloo: child becomes the transfer node
                else:
                    synthetic = ca             # no child: a synthetic transfer node follows this one
        g = b.add_node(nm, NodeType.COMP_NODE, kind, res, start, dur, gp, ids[i], attrs)
        node_of[i] = stack_of[i] = g
        has_children.add(gp)
        end_us = max(end_us, start + dur)
        if kind == OpKind.ANNOTATION and nm.startswith("ProfilerStep#"):
            steps.append((nm, g, start, dur))
        for src in wait_of:
            b.add_dep(src, g, EdgeKind.SYNC)

        # ---- data deps between top-level ops
        is_op[i] = kind != OpKind.ANNOTATION
        under_op[i] = p >= 0 and (is_op[p] or under_op[p])
        if is_op[i] and not under_op[i]:
            for t in _tensors(et.in_values[i], et.in_types[i]):
                src = producer.get((t[0], t[1]))
                if src is not None:  # an earlier node: edges only point back, the graph stays acyclic
                    b.add_dep(src, g, EdgeKind.DATA)
            for t in _tensors(et.out_values[i], et.out_types[i]):
                producer[(t[0], t[1])] = g
        if synthetic is not None:
            # after the op's own inputs are resolved: the transfer writes them (in place), it does not feed them
            add_transfer(i, i, synthetic, f"{synthetic['coll_name']} (transfer)", next_id, i)
            next_id += 1

    # A ProfilerStep with nothing in it is no step (a 0 ms step would pull the mean down): an ET started
    # before the profiler and stopped after it records the profiler's closing one so. When every step is
    # empty (a step body that ran on another thread), the whole trace is one step.
    if not any(is_op):
        raise TraceInputError(et.path, "records no operator (only its root and annotations): nothing to replay")
    empty = []
    for step in steps:
        if step[1] in has_children:
            b.add_step(*step)
        else:
            empty.append(step[0])
    if empty:
        b.metadata["empty_steps_dropped"] = empty
    if not b.steps:
        b.add_step("step", -1, 0.0, end_us)

    b.metadata.update({
        "source": "execution_trace", "source_path": et.path, "et_schema": et.schema,
        "durations_known": end_us > 0, "recorded_world_size": et.world_size or 0,
    })
    if orphans:
        b.metadata["orphan_ops"] = orphans
        log.warning("%s: %s not an earlier op of the trace (first: %s); each is replayed under the "
                    "ProfilerStep its id falls in", et.path,
                    "1 op names a parent that is" if orphans == 1 else f"{orphans:,} ops name a parent that is",
                    first_orphan)
    if et.process_groups:
        b.metadata["process_groups"] = et.process_groups
    if unknown_collectives:
        b.metadata["unknown_collectives"] = sorted(unknown_collectives)
    return b.build()
