"""Execution Trace -> ExecutionGraph dependency passes on tiny hand-written ETs (fast: the mutation target
`et-dependencies` runs this file for every mutant).

Every expected edge, parent, node and attribute is counted by hand from the few nodes of the ET in the
test, following chakra_schema/pytorch/et_graph.py's docstring: DATA edges between top-level ops keyed
by (tensor_id, storage_id), one transfer node per collective with a COLLECTIVE edge from its issuer,
SYNC from a collective to the wait that names its sequence number. comm_size follows nccl-tests'
"size": the larger buffer, elements x bytes per element.
"""
from __future__ import annotations

import json

import pytest

from chakra_schema.graph import CommType, EdgeKind, NodeType, OpKind, Step
from chakra_schema.pytorch.et_graph import (_device_index, collective_kind, comm_attrs,
                                            execution_trace_to_graph)
from chakra_schema.pytorch.execution_trace import PG_INIT, ROOT_PROCESS, ROOT_THREAD, execution_trace_from_json

D, CO, SY = "DATA", "COLLECTIVE", "SYNC"


def T(tensor_id, storage_id, numel=4, itemsize=4, device="cuda:0"):
    """An ET tensor value: [tensor_id, storage_id, offset, numel, itemsize, device]."""
    return [tensor_id, storage_id, 0, numel, itemsize, device]


def op(id_, name, parent=2, tid=1, ins=(), in_types=None, outs=(), out_types=None, scope=-1, rf=-1, seq=-1,
       comm=None, ts=None, dur=None, schema=""):
    ins, outs = list(ins), list(outs)
    in_types = in_types or ["Tensor" if isinstance(v, list) else "Int" for v in ins]
    out_types = out_types or ["Tensor" for _ in outs]
    attrs = [{"name": "tid", "value": tid}, {"name": "rf_id", "value": rf}, {"name": "seq_id", "value": seq},
             {"name": "scope", "value": scope}, {"name": "op_schema", "value": schema}]
    attrs += [{"name": k, "value": v} for k, v in (comm or {}).items()]
    n = {"id": id_, "name": name, "ctrl_deps": parent, "attrs": attrs,
         "inputs": {"values": ins, "shapes": [[v[3]] if isinstance(v, list) and len(v) == 6 else [] for v in ins],
                    "types": in_types},
         "outputs": {"values": outs, "shapes": [[v[3]] for v in outs], "types": out_types}}
    if dur is not None:
        n["ts"], n["dur"] = ts, dur
    return n


ROOTS = [op(1, ROOT_PROCESS, parent=0), op(2, ROOT_THREAD, parent=1)]


def pg_init(id_, groups):
    return op(id_, PG_INIT, parent=1, ins=[json.dumps(groups)], in_types=["String"])


def rpc_args(seq, pg, rank, name, tail=(1,)):
    """record_param_comms positional inputs: tensors, seq, pg, rank, name, in_split, out_split, tail."""
    values = [[], seq, pg, rank, name, [], [], *tail]
    types = ["GenericList[Tensor]", "Int", "Tuple[String,String]", "Int", "String", "GenericList[Int]",
             "GenericList[Int]", *["Int"] * len(tail)]
    return values, types


def graph(nodes, pid=7, **kw):
    et = execution_trace_from_json({"schema": "1.1.1-chakra.0.0.4", "pid": pid, "nodes": nodes}, "hand.json")
    return execution_trace_to_graph(et, **kw)


def edges(g) -> set[tuple[str, str, str]]:
    return {(g.name[s], g.name[d], EdgeKind(k).name) for s, d, k in g.edges()}


def at(g, node_id) -> int:
    return g.index_of_id()[node_id]


# ------------------------------------------------------------------ data dependencies
def test_data_edges_join_top_level_ops_through_their_tensors():
    g = graph(ROOTS + [
        op(3, "ProfilerStep#1"),
        op(4, "aten::mm", parent=3, ins=[T(10, 100), T(11, 101)], outs=[T(12, 102)]),
        op(5, "aten::addmm", parent=4, ins=[T(10, 100)], outs=[T(13, 103)]),      # nested: no edges
        op(6, "aten::relu", parent=3, ins=[T(12, 102)], outs=[T(14, 104)]),
        op(7, "aten::add", parent=3, ins=[T(13, 103), T(14, 104), T(12, 102)]),
        op(8, "## forward ##", parent=3, scope=7, outs=[T(20, 200)]),              # an annotation
        op(9, "aten::neg", parent=8, ins=[T(20, 200), T(14, 104)]),
        op(10, "aten::sum", parent=2, tid=2, ins=[T(14, 104), T(14, 999)]),       # other storage: none
        op(11, "aten::late_parent", parent=12),                                     # parent after it: none
        op(12, "aten::x", parent=2),
    ])
    assert g.name == ["ProfilerStep#1", "aten::mm", "aten::addmm", "aten::relu", "aten::add", "## forward ##",
                      "aten::neg", "aten::sum", "aten::late_parent", "aten::x"]
    assert g.node_id.tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert edges(g) == {("aten::mm", "aten::relu", D), ("aten::mm", "aten::add", D), ("aten::relu", "aten::add", D),
                        ("aten::relu", "aten::neg", D), ("aten::relu", "aten::sum", D)}
    assert g.parent.tolist() == [-1, 0, 1, 0, 0, 0, 5, -1, -1, -1]
    assert [OpKind(int(k)).name for k in g.kind.tolist()] == [
        "ANNOTATION", "CPU_OP", "CPU_OP", "CPU_OP", "CPU_OP", "ANNOTATION", "CPU_OP", "CPU_OP", "CPU_OP", "CPU_OP"]
    assert [(r.kind, r.device, r.index, r.name) for r in g.resources] == [(0, 7, 1, "thread1"), (0, 7, 2, "thread2")]
    assert g.steps == [Step("ProfilerStep#1", 0, 0.0, 0.0)]
    assert g.metadata["durations_known"] is False and g.metadata["source"] == "execution_trace"
    assert g.metadata["source_path"] == "hand.json" and g.metadata["et_schema"] == "1.1.1-chakra.0.0.4"
    assert "process_groups" not in g.metadata and "unknown_collectives" not in g.metadata
    assert (g.rank, g.world_size) == (0, 1)


def test_node_attrs_from_the_et():
    g = graph(ROOTS + [
        op(3, "aten::copy_", ins=[T(1, 1, device="cuda:0"), T(2, 2, device="cpu"), True],
           in_types=["Tensor", "Tensor", "Bool"], outs=[T(1, 1, device="cuda:0")], rf=5, seq=9,
           schema="aten::copy_(Tensor self, Tensor src, bool non_blocking) -> Tensor"),
        op(4, "aten::view", ins=[T(3, 3), [2, 2]], in_types=["Tensor", "GenericList[Int]"], outs=[T(4, 3)],
           rf=0, seq=0),
        op(5, "aten::empty", outs=[T(5, 5)], rf=-1, seq=-1),
    ])
    a = g.attrs[0]
    assert a["tid"] == 1 and a["rf_id"] == 5 and a["seq_id"] == 9
    assert a["op_schema"].startswith("aten::copy_") and a["input_shapes"] == [[4], [4], []]
    assert a["tensor_devices"] == ["cpu", "cuda"]
    assert a["input_devices"] == ["cuda", "cpu"] and a["output_devices"] == ["cuda"]
    assert a["outputs_alias_inputs"] is True and a["scalar_inputs"] == [None, None, True]
    b = g.attrs[1]
    assert b["rf_id"] == 0 and b["seq_id"] == 0 and b["tensor_devices"] == ["cuda"]
    assert "input_devices" not in b and b["outputs_alias_inputs"] is True and "scalar_inputs" not in b
    c = g.attrs[2]
    assert "rf_id" not in c and "seq_id" not in c and "outputs_alias_inputs" not in c


def test_times_from_a_linked_et_and_the_whole_trace_step():
    g = graph(ROOTS + [op(3, "aten::a", ts=100, dur=50), op(4, "aten::b", ts=160, dur=40), op(5, "aten::c")])
    assert g.start_us.tolist() == [100, 160, 0] and g.duration_us.tolist() == [50, 40, 0]
    assert g.steps == [Step("step", -1, 0.0, 200.0)]
    assert g.metadata["durations_known"] is True


def test_rank_and_world_size():
    g = graph(ROOTS + [op(3, "aten::a")], rank=3)
    assert (g.rank, g.world_size) == (3, 4)
    g = graph(ROOTS + [pg_init(3, [{"pg_name": "0", "group_size": 8, "ranks": []}]), op(4, "aten::a")], rank=2)
    assert (g.rank, g.world_size) == (2, 8)
    assert g.metadata["process_groups"] == [{"pg_name": "0", "group_size": 8, "ranks": []}]
    assert g.name == ["aten::a"]


# ------------------------------------------------------------------ collectives
NCCL_PG = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": [0, 1, 2, 3],
            "group_size": 4}]


def test_nccl_collective_moves_to_a_comm_stream_and_its_wait_syncs_on_it():
    v, t = rpc_args(5, ["0", "default_pg"], 1, "allreduce", tail=(4,))
    wv, wt = rpc_args(5, ["", ""], -1, "wait", tail=(4,))
    g = graph(ROOTS + [
        pg_init(3, NCCL_PG),
        op(4, "c10d::allreduce_", ins=[[T(30, 300, numel=1024, itemsize=2)]], in_types=["GenericList[Tensor]"]),
        op(5, "record_param_comms", parent=4, ins=[[T(30, 300, 1024, 2)]] + v[1:], in_types=t,
           comm={"collective_name": "allreduce", "dtype": "BFloat16", "in_msg_nelems": 1024,
                 "out_msg_nelems": 1024, "pg_name": "0", "pg_size": 4}),
        op(6, "nccl:all_reduce", parent=5, ins=[[T(30, 300, 1024, 2)]], in_types=["GenericList[Tensor]"]),
        op(7, "aten::mul", ins=[T(30, 300, 1024, 2)]),
        op(8, "record_param_comms", ins=wv, in_types=wt),
    ])
    assert g.name == ["c10d::allreduce_", "record_param_comms", "nccl:all_reduce", "aten::mul", "record_param_comms"]
    assert edges(g) == {("record_param_comms", "nccl:all_reduce", CO), ("nccl:all_reduce", "aten::mul", D),
                        ("nccl:all_reduce", "record_param_comms", SY)}
    assert {(s, d) for s, d, _ in g.edges()} == {(1, 2), (2, 3), (2, 4)}
    x = at(g, 6)
    assert g.kind[x] == OpKind.COLLECTIVE and g.node_type[x] == NodeType.COMM_COLL_NODE and g.parent[x] == -1
    r = g.resources[g.resource[x]]
    assert (r.kind, r.device, r.index, r.name) == (1, 0, 1000, "gpu0/comm pg 0")
    assert g.attrs[x] == {"coll_name": "allreduce", "comm_type": int(CommType.ALL_REDUCE), "dtype": "BFloat16",
                          "comm_size": 1024 * 2, "pg_name": "0", "pg_ranks": [0, 1, 2, 3], "pg_size": 4,
                          "comm_seq": 5}
    assert g.kind[at(g, 8)] == OpKind.COLL_WAIT and g.kind[at(g, 5)] == OpKind.CPU_OP
    assert g.parent[at(g, 5)] == at(g, 4)
    assert (g.rank, g.world_size) == (1, 4)


def test_record_param_comms_without_a_transfer_child_gets_a_synthetic_one_on_a_cpu_worker():
    g = graph(ROOTS + [
        op(3, "c10d::_allgather_base_"),
        op(4, "record_param_comms", parent=3, ins=[T(40, 400, 8, 4, "cpu")], outs=[T(41, 401, 32, 4, "cpu")],
           comm={"collective_name": "_allgather_base", "pg_name": "tp", "pg_size": 2, "global_rank_start": 4,
                 "global_rank_stride": 2}),
        op(5, "aten::copy_", ins=[T(41, 401, 32, 4, "cpu")]),
        op(6, "c10d::broadcast_"),
        op(7, "record_param_comms", parent=6, ins=[T(42, 402, 3, 4, "cpu")],
           comm={"collective_name": "broadcast", "pg_name": "dp"}),
        op(8, "aten::neg", ins=[T(42, 402, 3, 4, "cpu")]),
    ])
    assert g.name == ["c10d::_allgather_base_", "record_param_comms", "_allgather_base (transfer)", "aten::copy_",
                      "c10d::broadcast_", "record_param_comms", "broadcast (transfer)", "aten::neg"]
    assert g.node_id.tolist() == [3, 4, 9, 5, 6, 7, 10, 8]     # synthetic ids continue after the largest (8)
    assert edges(g) == {("record_param_comms", "_allgather_base (transfer)", CO),
                        ("_allgather_base (transfer)", "aten::copy_", D),
                        ("record_param_comms", "broadcast (transfer)", CO),
                        ("broadcast (transfer)", "aten::neg", D)}
    assert {(s, d) for s, d, _ in g.edges()} == {(1, 2), (2, 3), (5, 6), (6, 7)}
    a = g.attrs[2]
    assert a == {"coll_name": "_allgather_base", "comm_type": int(CommType.ALL_GATHER), "comm_size": 32 * 4,
                 "pg_name": "tp", "pg_ranks": [4, 6], "pg_size": 2}
    r0, r1 = g.resources[g.resource[2]], g.resources[g.resource[6]]
    assert (r0.kind, r0.device, r0.index, r0.name) == (0, 7, 1000, "comm worker pg tp")
    assert (r1.kind, r1.device, r1.index, r1.name) == (0, 7, 1001, "comm worker pg dp")
    assert g.attrs[6]["comm_size"] == 3 * 4 and "pg_ranks" not in g.attrs[6]
    assert g.parent[2] == -1 and g.parent[1] == 0


def test_top_level_record_param_comms_without_transfer_child_stays_acyclic():
    g = graph(ROOTS + [op(3, "record_param_comms", ins=[T(42, 402, 3, 4, "cpu")],
                          comm={"collective_name": "broadcast"})])
    assert g.find_cycle() == []


def test_wait_without_sequence_number_waits_for_everything_its_thread_issued():
    g = graph(ROOTS + [
        op(3, "record_param_comms", ins=[T(1, 1)], comm={"collective_name": "allreduce", "dtype": "Float"}),
        op(4, "record_param_comms", tid=2, ins=[T(2, 2)], comm={"collective_name": "allreduce"}),
        op(5, "record_param_comms", ins=[T(3, 3)], comm={"collective_name": "broadcast"}),
        op(6, "record_param_comms", comm={"collective_name": "wait"}),
        op(7, "record_param_comms", comm={"collective_name": "wait"}),
    ])
    assert g.node_id.tolist() == [3, 8, 4, 9, 5, 10, 6, 7]
    assert {(s, d, k) for s, d, k in g.edges() if k == EdgeKind.SYNC} == {(1, 6, EdgeKind.SYNC),
                                                                         (5, 6, EdgeKind.SYNC)}
    assert g.kind[6] == OpKind.COLL_WAIT and g.kind[7] == OpKind.COLL_WAIT


def test_wait_by_sequence_number_takes_the_latest_collective_with_it():
    v1, t1 = rpc_args(1, ["0", ""], 0, "allreduce")
    v2, t2 = rpc_args(2, ["0", ""], 0, "allreduce")
    v3, t3 = rpc_args(1, ["0", ""], 0, "broadcast")
    w2, tw2 = rpc_args(2, ["", ""], -1, "wait")
    w9, tw9 = rpc_args(9, ["", ""], -1, "wait")
    g = graph(ROOTS + [
        op(3, "record_param_comms", ins=v1, in_types=t1), op(4, "record_param_comms", ins=v2, in_types=t2),
        op(5, "record_param_comms", ins=v3, in_types=t3),
        op(6, "record_param_comms", ins=w2, in_types=tw2), op(7, "record_param_comms", ins=w9, in_types=tw9),
        op(8, "record_param_comms", ins=w2, in_types=tw2),
    ])
    # transfers: 3 -> node 1 (seq 1), 4 -> node 3 (seq 2), 5 -> node 5 (seq 1 again: it wins for seq 1)
    sync = sorted((s, d) for s, d, k in g.edges() if k == EdgeKind.SYNC)
    # wait seq 2 (node 6) <- node 3; wait seq 9 (node 7): unknown seq, so every unwaited collective of its
    # thread (nodes 1 and 5); the second wait of seq 2 (node 8) still finds seq 2's collective
    assert sync == [(1, 7), (3, 6), (3, 8), (5, 7)]


def test_gloo_transfers_pair_with_the_oldest_c10d_op_of_their_type():
    g = graph(ROOTS + [
        op(3, "c10d::allreduce_", ins=[T(50, 500, 16, 4, "cpu")]),
        op(4, "c10d::broadcast_", ins=[T(51, 501, 16, 4, "cpu")]),
        op(5, "gloo:all_reduce", tid=3, ins=[T(50, 500, 16, 4, "cpu")]),
        op(6, "gloo:broadcast", parent=4, ins=[T(51, 501, 8, 4, "cpu")], outs=[T(52, 502, 16, 4, "cpu")]),
        op(7, "gloo:barrier", parent=2),
        op(8, "gloo:frob", parent=2),
        op(9, "aten::add", ins=[T(50, 500, 16, 4, "cpu"), T(52, 502, 16, 4, "cpu")]),
        op(10, "c10d::frob_"),
        op(11, "gloo:reduce", parent=10),
        op(12, "c10d::allreduce_", ins=[T(60, 600, 16, 4, "cpu")]),
        op(13, "c10d::allreduce_", ins=[T(61, 601, 16, 4, "cpu")]),
        op(14, "gloo:allreduce", tid=3, parent=13),
        op(15, "gloo:allreduce", tid=3),
    ])
    assert edges(g) == {("c10d::allreduce_", "gloo:all_reduce", CO), ("c10d::broadcast_", "gloo:broadcast", CO),
                        ("gloo:all_reduce", "aten::add", D), ("gloo:broadcast", "aten::add", D),
                        ("c10d::frob_", "gloo:reduce", CO), ("c10d::allreduce_", "gloo:allreduce", CO)}
    co = sorted((int(g.node_id[s]), int(g.node_id[d])) for s, d, k in g.edges() if k == EdgeKind.COLLECTIVE)
    # 14 is under 13 but the oldest unpaired all-reduce is 12; 15 then takes 13
    assert co == [(3, 5), (4, 6), (10, 11), (12, 14), (13, 15)]
    a = g.attrs[at(g, 5)]
    assert a == {"coll_name": "all_reduce", "comm_type": int(CommType.ALL_REDUCE), "comm_size": 16 * 4,
                 "pg_name": "0"}
    assert g.attrs[at(g, 6)]["comm_size"] == 16 * 4           # the larger buffer: the 16-element output
    assert g.kind[at(g, 7)] == OpKind.COLLECTIVE and g.attrs[at(g, 7)]["comm_type"] == int(CommType.BARRIER)
    assert "comm_size" not in g.attrs[at(g, 7)]
    r = g.resources[g.resource[at(g, 5)]]
    assert (r.kind, r.device, r.index) == (0, 7, 1000)
    assert g.metadata["unknown_collectives"] == ["frob"]
    assert g.kind[at(g, 8)] == OpKind.CPU_OP


def test_send_and_recv_take_their_peer_from_the_c10d_op():
    sv, st_ = rpc_args(3, ["0", ""], 0, "send")
    rv, rt_ = rpc_args(4, ["0", ""], 0, "recv")
    g = graph(ROOTS + [
        op(3, "c10d::send", ins=[[T(1, 1)], "pg", 3, 7],
           in_types=["GenericList[Tensor]", "__torch__.ProcessGroup", "Int", "Int"]),
        op(4, "record_param_comms", parent=3, ins=[[T(1, 1)]] + sv[1:], in_types=st_,
           comm={"collective_name": "send", "dtype": "Float", "in_msg_nelems": 4, "out_msg_nelems": 0}),
        op(5, "c10d::recv_", ins=[[T(2, 2)], "pg", 1], in_types=["GenericList[Tensor]", "__torch__.PG", "Int"]),
        op(6, "record_param_comms", parent=5, ins=[[T(2, 2)]] + rv[1:], in_types=rt_,
           comm={"collective_name": "recv", "dtype": "Float"}),
        op(7, "nccl:recv", parent=6),
        op(8, "record_param_comms", parent=2, ins=[[T(3, 3)]] + sv[1:], in_types=st_,
           comm={"collective_name": "send"}),
        op(9, "c10d::send", ins=[[T(4, 4)]], in_types=["GenericList[Tensor]"]),
        op(10, "record_param_comms", parent=9, comm={"collective_name": "send"}),
    ])
    s = g.name.index("send (transfer)")
    assert g.kind[s] == OpKind.SEND and g.node_type[s] == NodeType.COMM_SEND_NODE
    assert g.attrs[s]["comm_dst"] == 3 and g.attrs[s]["comm_tag"] == 7 and "comm_type" not in g.attrs[s]
    assert g.attrs[s]["comm_size"] == 4 * 4 and g.attrs[s]["comm_seq"] == 3
    rx = at(g, 7)
    assert g.kind[rx] == OpKind.RECV and g.node_type[rx] == NodeType.COMM_RECV_NODE
    assert g.attrs[rx]["comm_src"] == 1 and "comm_tag" not in g.attrs[rx]
    # a send under no c10d op, and one whose c10d op names no peer: no peer attrs
    sends = [i for i, nm in enumerate(g.name) if nm == "send (transfer)"]
    assert len(sends) == 3
    assert all("comm_dst" not in g.attrs[i] for i in sends[1:])


def test_comm_attrs_from_positional_inputs_of_schema_1_0_2():
    v, t = rpc_args(11, 3, 0, "reduce_scatter_tensor", tail=(0, 1, 4))
    g = graph(ROOTS + [
        pg_init(3, [{"pg_name": "5", "backend_id": 3, "ranks": [], "group_size": 4}]),
        op(4, "record_param_comms", ins=[[T(1, 1, 64, 2), T(2, 2, 16, 2)]] + v[1:],
           in_types=["GenericList[Tensor]"] + t[1:], outs=[T(2, 2, 16, 2)]),
    ])
    a = g.attrs[1]
    # name and pg from the positional inputs; the group's ranks from the init record (start 0, stride 1,
    # size 4 give the same ranks); no dtype: bytes per element from the tensors (2); size: the larger of
    # in (64 + 16 elements) and out (16)
    assert a == {"coll_name": "reduce_scatter_tensor", "comm_type": int(CommType.REDUCE_SCATTER),
                 "comm_size": (64 + 16) * 2, "pg_name": "5", "pg_ranks": [0, 1, 2, 3], "pg_size": 4,
                 "comm_seq": 11}


def test_comm_attrs_group_ranks():
    def attrs(comm, pgs=None, pos_tail=None):
        nodes = ROOTS + ([pg_init(3, pgs)] if pgs else [])
        if pos_tail is not None:
            v, t = rpc_args(0, ["g", ""], 0, "allreduce", tail=pos_tail)
            nodes.append(op(4, "record_param_comms", ins=v, in_types=t, comm=comm))
        else:
            nodes.append(op(4, "record_param_comms", comm=comm))
        g = graph(nodes)
        return g.attrs[g.name.index("allreduce (transfer)")]

    assert attrs({"collective_name": "allreduce", "pg_size": 3})["pg_ranks"] == [0, 1, 2]
    assert "pg_ranks" not in attrs({"collective_name": "allreduce", "pg_size": 0})
    assert "pg_ranks" not in attrs({"collective_name": "allreduce", "pg_size": 0, "global_rank_start": 0,
                                    "global_rank_stride": 1})
    assert attrs({"collective_name": "allreduce", "pg_size": 1})["pg_ranks"] == [0]
    assert attrs({"collective_name": "allreduce", "pg_name": "g", "pg_size": 3},
                 [{"pg_name": "g", "ranks": [5, 9]}])["pg_ranks"] == [5, 9]
    assert attrs({"collective_name": "allreduce", "pg_name": "g", "pg_size": 2, "global_rank_start": 0,
                  "global_rank_stride": 3})["pg_ranks"] == [0, 3]
    # a negative start or a zero stride is not a rank layout: fall back to the group size
    assert attrs({"collective_name": "allreduce", "pg_size": 2, "global_rank_start": -1,
                  "global_rank_stride": 1})["pg_ranks"] == [0, 1]
    assert attrs({"collective_name": "allreduce", "pg_size": 2, "global_rank_start": 2,
                  "global_rank_stride": 0})["pg_ranks"] == [0, 1]
    assert attrs({"collective_name": "allreduce", "pg_size": 1, "global_rank_start": 2,
                  "global_rank_stride": 1})["pg_ranks"] == [2]
    # positional: pg name from the (name, desc) tuple, start / stride / size from the tail
    a = attrs({}, pos_tail=(6, 2, 2))
    assert a["pg_name"] == "g" and a["pg_ranks"] == [6, 8] and a["pg_size"] == 2
    assert attrs({"collective_name": "allreduce", "pg_name": ""})["pg_name"] == "0"
    assert attrs({"collective_name": "allreduce", "pg_name": 0})["pg_name"] == "0"


def test_comm_size_from_dtype_and_element_counts():
    def size(comm, ins=(), outs=()):
        g = graph(ROOTS + [op(4, "record_param_comms", ins=list(ins), outs=list(outs),
                              comm={"collective_name": "alltoall", **comm})])
        return g.attrs[g.name.index("alltoall (transfer)")].get("comm_size")

    assert size({"dtype": "Half", "in_msg_nelems": 10, "out_msg_nelems": 30}) == 60
    assert size({"dtype": "double", "in_msg_nelems": 10}, outs=[T(1, 1, 50, 8)]) == 50 * 8
    assert size({"dtype": "weird", "out_msg_nelems": 7}, ins=[T(1, 1, 3, 2)]) == 7 * 2
    assert size({"in_msg_nelems": 7}, ins=[T(1, 1, 3, 0), T(2, 2, 3, 4)]) == 7 * 4
    assert size({"in_msg_nelems": 7}) is None
    assert size({"dtype": "Float", "in_msg_nelems": None, "out_msg_nelems": 0}) == 0


def test_collective_kind_and_device_index():
    assert collective_kind("nccl:all_reduce") == (int(OpKind.COLLECTIVE), int(CommType.ALL_REDUCE))
    assert collective_kind("c10d::Reduce Scatter") == (int(OpKind.COLLECTIVE), int(CommType.REDUCE_SCATTER))
    assert collective_kind("gloo:irecv") == (int(OpKind.RECV), None)
    assert collective_kind("mpi:isend") == (int(OpKind.SEND), None)
    assert collective_kind("ucc:barrier") == (int(OpKind.COLLECTIVE), int(CommType.BARRIER))
    assert collective_kind("aten::mm") is None
    assert _device_index("cuda:3") == 3 and _device_index("hip:1") == 1 and _device_index("cpu:0") is None
    assert _device_index("cuda") is None and _device_index("cuda:x") is None and _device_index(3) is None
    assert _device_index("mtia:2") == 2 and _device_index("xpu:0") == 0


def test_transfer_device_from_tensors_else_the_backend():
    g = graph(ROOTS + [op(3, "record_param_comms", ins=[T(1, 1, device="cuda:2")],
                          comm={"collective_name": "allreduce", "pg_name": "a"}),
                       op(4, "record_param_comms", comm={"collective_name": "allreduce", "pg_name": "b"}),
                       op(5, "record_param_comms", ins=[T(2, 2, device="meta")],
                          comm={"collective_name": "allreduce", "pg_name": "a"})], rank=5)
    res = [g.resources[g.resource[g.node_id.tolist().index(i)]] for i in (6, 7, 8)]
    assert [(r.kind, r.device, r.index) for r in res] == [(1, 2, 1000), (0, 7, 1001), (1, 5, 1000)]
    g = graph(ROOTS + [pg_init(3, NCCL_PG), op(4, "record_param_comms", comm={"collective_name": "allreduce"})],
              rank=1)
    r = g.resources[g.resource[g.name.index("allreduce (transfer)")]]
    assert (r.kind, r.device, r.index, r.name) == (1, 1, 1000, "gpu1/comm pg 0")


def test_c10d_op_paired_with_a_record_param_comms_transfer_is_not_reused_by_gloo():
    g = graph(ROOTS + [
        op(3, "c10d::allreduce_"),
        op(4, "record_param_comms", parent=3, comm={"collective_name": "allreduce"}),
        op(5, "nccl:all_reduce", parent=4),
        op(6, "gloo:all_reduce", tid=3),
        op(7, "c10d::broadcast_"),
        op(8, "record_param_comms", parent=7, comm={"collective_name": "broadcast"}),   # synthetic
        op(9, "gloo:broadcast", tid=3),
        op(10, "record_param_comms", parent=2, comm={"collective_name": "frob"}),
    ])
    co = sorted((int(g.node_id[s]), int(g.node_id[d])) for s, d, k in g.edges() if k == EdgeKind.COLLECTIVE)
    assert co == [(4, 5), (8, 11)]
    assert g.metadata["unknown_collectives"] == ["frob"]


def test_comm_attrs_names_and_byte_sizes():
    et = execution_trace_from_json({"schema": "1.1.1", "pid": 7, "nodes": ROOTS + [
        op(3, "gloo:all_reduce:v2"),
        op(4, "record_param_comms", ins=[T(1, 1, 10, 1, "cpu")]),
        op(5, "gloo:all_reduce", ins=[T(2, 2, 8, 4, "cpu"), 1, 2, 3, "named"],
           in_types=["Tensor", "Int", "Int", "Int", "String"]),
    ]}, "hand.json")
    assert comm_attrs(et, 2)["coll_name"] == "all_reduce:v2"       # only the backend prefix goes
    a = comm_attrs(et, 3)
    # no collective name anywhere: the node's own name; one byte per element from the int8 tensor
    assert a["coll_name"] == "record_param_comms" and a["comm_size"] == 10
    # positional inputs are only read on record_param_comms nodes
    assert comm_attrs(et, 4, "gloo:all_reduce")["coll_name"] == "all_reduce"
    assert _device_index("cuda:1:2") is None


def test_positional_backend_id_without_an_init_record_is_the_default_group():
    v, t = rpc_args(1, 9, 0, "allreduce", tail=(2,))
    g = graph(ROOTS + [pg_init(3, [{"pg_name": "5", "backend_id": 3, "ranks": [0, 1]}]),
                       op(4, "record_param_comms", ins=v, in_types=t)])
    a = g.attrs[g.name.index("allreduce (transfer)")]
    assert a["pg_name"] == "0" and a["pg_ranks"] == [0, 1] and a["pg_size"] == 2


def test_scalar_inputs_and_odd_device_names():
    g = graph(ROOTS + [op(3, "aten::softmax", ins=[T(1, 1, device="cuda:0:x"), 2, 0.5, "s"],
                          in_types=["Tensor", "Int", "Double", "String"], outs=[T(2, 2, device="cpu")])])
    a = g.attrs[0]
    assert a["scalar_inputs"] == [None, 2, 0.5, None]
    assert a["tensor_devices"] == ["cpu", "cuda"] and a["input_devices"] == ["cuda"] and a["output_devices"] == ["cpu"]


def test_gloo_child_of_record_param_comms_is_its_transfer():
    g = graph(ROOTS + [op(3, "c10d::allreduce_"),
                       op(4, "record_param_comms", parent=3, ins=[T(1, 1, 4, 4, "cpu")],
                          comm={"collective_name": "allreduce"}),
                       op(5, "gloo:all_reduce", parent=4)])
    assert g.name == ["c10d::allreduce_", "record_param_comms", "gloo:all_reduce"]
    assert edges(g) == {("record_param_comms", "gloo:all_reduce", CO)}


def test_record_param_comms_as_the_first_et_node():
    et = execution_trace_from_json({"schema": "1.1.1", "pid": 7, "nodes": [
        op(1, "record_param_comms", parent=0, comm={"collective_name": "allreduce"}),
        op(2, "nccl:all_reduce", parent=1)]}, "hand.json")
    g = execution_trace_to_graph(et)
    assert g.name == ["record_param_comms", "nccl:all_reduce"]
    assert edges(g) == {("record_param_comms", "nccl:all_reduce", CO)}


def test_each_process_group_has_its_own_gpu_comm_stream():
    g = graph(ROOTS + [op(3, "record_param_comms", ins=[T(1, 1)], comm={"collective_name": "allreduce", "pg_name": "a"}),
                       op(4, "record_param_comms", ins=[T(2, 2)], comm={"collective_name": "allreduce", "pg_name": "b"})])
    res = [g.resources[g.resource[g.name.index("allreduce (transfer)", k)]] for k in (0, 2)]
    assert [(r.kind, r.device, r.index) for r in res] == [(1, 0, 1000), (1, 0, 1001)]


def test_transfer_device_from_its_own_tensors_else_its_issuers():
    g = graph(ROOTS + [
        op(3, "record_param_comms", comm={"collective_name": "allreduce", "pg_name": "a"}),
        op(4, "nccl:all_reduce", parent=3, ins=[T(1, 1, device="cuda:2")]),
        op(5, "record_param_comms", ins=[T(2, 2, device="cuda:3")], comm={"collective_name": "allreduce", "pg_name": "b"}),
        op(6, "nccl:all_reduce", parent=5)])
    res = [g.resources[g.resource[at(g, i)]] for i in (4, 6)]
    assert [(r.kind, r.device, r.index) for r in res] == [(1, 2, 1000), (1, 3, 1001)]
    assert g.start_us[at(g, 4)] == 0.0 and g.duration_us[at(g, 4)] == 0.0


def test_a_transfer_without_issuer_releases_no_c10d_op():
    et = execution_trace_from_json({"schema": "1.1.1", "pid": 7, "nodes": [
        op(1, "aten::start", parent=0), op(2, "c10d::allreduce_", parent=0),
        op(3, "gloo:barrier", parent=0), op(4, "gloo:all_reduce", parent=0, tid=3),
        op(5, "aten::x", parent=2)]}, "hand.json")
    g = execution_trace_to_graph(et)
    assert edges(g) == {("c10d::allreduce_", "gloo:all_reduce", CO)}


def _et(nodes):
    return execution_trace_to_graph(execution_trace_from_json({"schema": "1.1.1", "pid": 7, "nodes": nodes}, "h.json"))


def test_et_without_root_nodes_keeps_call_stacks_issuers_and_ids():
    g = _et([op(10, "c10d::foo_", parent=0), op(20, "gloo:all_reduce", parent=10), op(30, "aten::child", parent=10),
             op(40, "gloo:broadcast", parent=60), op(50, "aten::late", parent=60), op(60, "aten::x", parent=0),
             op(70, "aten::wrap", parent=0), op(80, "gloo:reduce", parent=70), op(90, "nccl:all_gather", parent=0)])
    assert g.name == ["c10d::foo_", "gloo:all_reduce", "aten::child", "gloo:broadcast", "aten::late", "aten::x",
                      "aten::wrap", "gloo:reduce", "nccl:all_gather"]
    assert g.node_id.tolist() == [10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert g.parent.tolist() == [-1, -1, 0, -1, -1, -1, -1, -1, -1]
    # the bare gloo op under a c10d op that issued no known collective: that op is its issuer; one
    # under a later or a non-c10d parent has none
    assert edges(g) == {("c10d::foo_", "gloo:all_reduce", CO)}
    assert g.kind[8] == OpKind.COLLECTIVE and g.node_type[8] == NodeType.COMM_COLL_NODE


def test_p2p_peer_only_from_a_c10d_parent():
    g = _et([op(1, "c10d::send", parent=0, ins=[[T(1, 1)], "pg", 3],
                in_types=["GenericList[Tensor]", "__torch__.PG", "Int"]),
             op(2, "record_param_comms", parent=1, comm={"collective_name": "send"}),
             op(3, "my_send", parent=0, ins=[5], in_types=["Int"]),
             op(4, "record_param_comms", parent=3, comm={"collective_name": "send"})])
    sends = [i for i, nm in enumerate(g.name) if nm == "send (transfer)"]
    assert g.attrs[sends[0]]["comm_dst"] == 3 and "comm_dst" not in g.attrs[sends[1]]


def test_an_op_that_is_its_own_parent_is_top_level():
    g = graph(ROOTS + [op(3, "aten::mm", outs=[T(1, 1)]), op(4, "aten::relu", parent=4, ins=[T(1, 1)])])
    assert edges(g) == {("aten::mm", "aten::relu", D)} and g.parent.tolist() == [-1, -1]


def test_ops_nested_in_a_transfer_stay_on_the_host_under_the_issuer():
    g = graph(ROOTS + [
        op(3, "aten::fill_", outs=[T(1, 1)]),
        op(4, "record_param_comms", comm={"collective_name": "allreduce"}),
        op(5, "nccl:all_reduce", parent=4),
        op(6, "aten::copy_", parent=5, ins=[T(1, 1)])])
    c = at(g, 6)
    assert g.parent[c] == at(g, 4) and g.kind[c] == OpKind.CPU_OP
    assert ("aten::fill_", "aten::copy_", D) not in edges(g)        # nested: no data deps of its own


def test_zero_times_from_a_linked_et():
    g = graph(ROOTS + [op(3, "aten::a", ts=0, dur=0), op(4, "aten::b", ts=None, dur=None)])
    assert g.start_us.tolist() == [0.0, 0.0] and g.duration_us.tolist() == [0.0, 0.0]
    assert g.metadata["durations_known"] is False


def test_wait_on_a_thread_that_issued_nothing_waits_for_nothing():
    g = graph(ROOTS + [op(3, "record_param_comms", tid=5, comm={"collective_name": "wait"})])
    assert g.num_edges == 0 and g.kind[0] == OpKind.COLL_WAIT


def test_collectives_take_no_peer_from_their_c10d_op():
    g = graph(ROOTS + [op(3, "c10d::allreduce_", ins=[[T(1, 1)], 4], in_types=["GenericList[Tensor]", "Int"]),
                       op(4, "record_param_comms", parent=3, comm={"collective_name": "allreduce"})])
    a = g.attrs[g.name.index("allreduce (transfer)")]
    assert "comm_dst" not in a and "comm_src" not in a


def test_child_of_the_first_et_node_has_no_data_deps():
    g = _et([op(1, "aten::outer", parent=0, outs=[T(1, 1)]), op(2, "aten::inner", parent=1, ins=[T(1, 1)])])
    assert g.num_edges == 0 and g.parent.tolist() == [-1, 0]


def test_only_tensor_typed_values_are_tensors_and_short_times_count():
    from chakra_schema.pytorch.et_graph import _tensors
    assert _tensors([[1, 2, 0, 4, 4, "cpu"]], ["Tuple[Int,Int,Int,Int,Int,String]"]) == []
    assert _tensors([[1, 2, 0, 4, 4, "cpu"]], ["Tensor"]) == [[1, 2, 0, 4, 4, "cpu"]]
    assert graph(ROOTS + [op(3, "aten::a", ts=0, dur=0.5)]).metadata["durations_known"] is True
