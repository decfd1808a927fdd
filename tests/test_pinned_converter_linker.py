"""Execution Trace <-> Kineto linking on tiny hand-built traces (fast: the mutation target
`linker-dependencies` runs this file for every mutant).

Which Kineto host op takes which ET node's attrs is counted by hand from the few ops of each test,
following chakra_schema/pytorch/linker.py's docstring (record-function id first, else per-thread name
sequences; 90% agreement required). LCS lengths are the textbook values (Cormen et al., "Introduction
to Algorithms", 3rd ed., section 15.4: LCS(ABCBDAB, BDCABA) = 4).
"""
from __future__ import annotations

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.pytorch.kineto import HostOp, KinetoTrace
from chakra_schema.pytorch.linker import _align, _occurrences, lcs_length, link, link_with_report
from test_pinned_converter_et_graph import ROOTS, T, op, rpc_args
from chakra_schema.pytorch.execution_trace import execution_trace_from_json


def et_of(nodes, pid=7):
    return execution_trace_from_json({"schema": "1.1.1", "pid": pid, "nodes": ROOTS + nodes}, "et.json")


def kineto_of(ops):
    """ops: (name, ts, dur, tid, rf_id, pid) tuples (tid 1, rf None, pid 7 by default)."""
    t = KinetoTrace(path="kineto.json", rank=None, world_size=None, pg_config=None, host_ops=[])
    for o in ops:
        name, ts, dur, tid, rf, pid = (tuple(o) + (1, None, 7)[len(o) - 3:])[:6]
        t.host_ops.append(HostOp(len(t.host_ops), name, pid, tid, float(ts), float(dur), "cpu_op", rf, None, None, {}))
    return t


def seq_et(names, tid=1, first_id=3):
    return [op(first_id + k, nm, tid=tid) for k, nm in enumerate(names)]


# ------------------------------------------------------------------ record function ids
def test_rf_id_links_ops_with_the_same_id_and_name():
    et = et_of([op(3, "aten::mm", rf=10, scope=0, ins=[T(1, 1, 6, 4)], schema="aten::mm(Tensor, Tensor)"),
                op(4, "aten::add", rf=11), op(5, "aten::relu", rf=12), op(6, "aten::noid")])
    k = kineto_of([("aten::mm", 0, 5, 1, 10), ("aten::add", 10, 5, 1, 11), ("x", 20, 1, 1, 99), ("y", 30, 1),
                   ("aten::relu", 40, 1, 1, 12)])
    info, rep = link_with_report(et, k)
    assert sorted(info) == [0, 1, 4]
    # the ET's shapes, schema and the kernel hints model mode infers a CPU run's kernels from (its tensors'
    # device)
    assert info[0] == {"et_id": 3, "rf_id": 10, "scope": 0, "op_schema": "aten::mm(Tensor, Tensor)",
                       "input_shapes": [[6]], "input_types": ["Tensor"], "tensor_devices": ["cuda"]}
    assert info[1] == {"et_id": 4, "rf_id": 11} and info[4] == {"et_id": 5, "rf_id": 12}
    assert (rep.key, rep.et_ops, rep.kineto_ops, rep.matched_et, rep.matched_kineto) == ("rf_id", 4, 5, 3, 3)
    assert rep.detail == "3 of 3 Kineto host ops with an ET rf_id agree by name"
    assert rep.fraction == 3 / 4
    assert rep.as_dict() == {"key": "rf_id", "et_ops": 4, "kineto_ops": 5, "matched_et": 3, "matched_kineto": 3,
                             "fraction": 0.75, "detail": rep.detail, "threads": []}
    assert link(et, k) == info


def test_rf_id_needs_nine_in_ten_names_to_agree():
    et = et_of([op(3 + i, f"op{i}", rf=100 + i) for i in range(10)])
    nine = kineto_of([(f"op{i}" if i else "other", 10 * i, 1, 1, 100 + i) for i in range(10)])
    info, rep = link_with_report(et, nine)
    assert len(info) == 9 and rep.detail == "9 of 10 Kineto host ops with an ET rf_id agree by name"
    eight = kineto_of([(f"op{i}" if i > 1 else "other", 10 * i, 1, 1, 100 + i) for i in range(10)])
    with pytest.raises(TraceInputError, match="only 80% of 10 host ops"):
        link(et, eight)


def test_rf_id_with_no_shared_id_is_another_run():
    et = et_of([op(3, "a", rf=1)])
    with pytest.raises(TraceInputError, match="none of the Kineto 'Record function id's"):
        link(et, kineto_of([("a", 0, 1, 1, 2)]))
    # rf_id 0 is an id like any other
    et = et_of([op(3, "a", rf=0)])
    assert link(et, kineto_of([("a", 0, 1, 1, 0)])) == {0: {"et_id": 3, "rf_id": 0}}


def test_link_needs_ops_on_both_sides_and_the_same_process():
    with pytest.raises(TraceInputError, match="no operators"):
        link(et_of([]), kineto_of([("a", 0, 1)]))
    with pytest.raises(TraceInputError, match="no host ops"):
        link(et_of([op(3, "a")]), kineto_of([]))
    with pytest.raises(TraceInputError, match="recorded by pid 7, the Kineto host ops by pid 8, 9, 10"):
        link(et_of([op(3, "a", rf=1)]), kineto_of([("a", 0, 1, 1, 1, 8), ("b", 0, 1, 2, 5, 9),
                                                   ("c", 0, 1, 2, 5, 10), ("d", 0, 1, 2, 5, 11)]))
    # pid 0: the ET does not say; the pid check is skipped
    assert link(et_of([op(3, "a", rf=1)], pid=0), kineto_of([("a", 0, 1, 1, 1, 8)])) == {0: {"et_id": 3, "rf_id": 1}}
    # the process-group init record is not an operator
    with pytest.raises(TraceInputError, match="no operators"):
        link(et_of([op(3, "## process_group:init ##", parent=1)]), kineto_of([("a", 0, 1)]))


def test_kineto_ids_all_zero_are_no_key_and_ops_link_by_name_sequence():
    # a profiler that did not record ids writes 'Record function id': 0 on every op (seen in a 1.0.2 ET pair
    # and in MTIA traces): that is no evidence of another run, the name sequences link the files
    et = et_of([op(3, "a", rf=11), op(4, "b", rf=12), op(5, "c", rf=13)])
    info, rep = link_with_report(et, kineto_of([("a", 0, 1, 1, 0), ("b", 2, 1, 1, 0), ("c", 4, 1, 1, 0)]))
    assert rep.key != "rf_id" and {h: a["et_id"] for h, a in info.items()} == {0: 3, 1: 4, 2: 5}


# ------------------------------------------------------------------ name sequences
def test_name_sequence_links_every_exact_occurrence_without_rf_ids():
    et = et_of(seq_et(["a", "b", "c"]))
    # Kineto thread: x a b c y a b c (two iterations of the ET's ops); "b" and "a" at 10 start together:
    # the longer (a, the parent) comes first
    k = kineto_of([("x", 0, 1), ("b", 10, 2), ("a", 10, 5), ("c", 20, 1), ("y", 30, 1),
                   ("a", 40, 1), ("b", 50, 1), ("c", 60, 1)])
    info, rep = link_with_report(et, k)
    assert {h: a["et_id"] for h, a in info.items()} == {2: 3, 1: 4, 3: 5, 5: 3, 6: 4, 7: 5}
    assert all("rf_id" not in a for a in info.values())
    assert (rep.key, rep.matched_et, rep.matched_kineto) == ("name_sequence", 3, 6)
    assert rep.threads == [{"et_tid": 1, "kineto_tid": 1, "method": "exact", "matched": 3, "et_ops": 3,
                            "et_coverage": 1.0, "kineto_window_coverage": 1.0, "occurrences": 2, "linked": True}]
    assert rep.detail == "ET tid 1 -> Kineto tid 1: exact, 3/3 ops x2"


def test_name_sequence_pairs_threads_by_matched_count():
    et = et_of(seq_et(["a", "b", "c"], tid=1) + seq_et(["p", "q"], tid=2, first_id=10))
    k = kineto_of([("p", 0, 1, 5), ("q", 1, 1, 5), ("a", 0, 1, 6), ("b", 1, 1, 6), ("c", 2, 1, 6)])
    info, rep = link_with_report(et, k)
    assert {h: a["et_id"] for h, a in info.items()} == {0: 10, 1: 11, 2: 3, 3: 4, 4: 5}
    assert [(th["et_tid"], th["kineto_tid"]) for th in rep.threads] == [(1, 6), (2, 5)]
    assert rep.detail == "ET tid 1 -> Kineto tid 6: exact, 3/3 ops x1; ET tid 2 -> Kineto tid 5: exact, 2/2 ops x1"


def test_name_sequence_kineto_window_of_the_et():
    names = [f"o{i}" for i in range(10)]
    et = et_of(seq_et(names))
    k = kineto_of([(nm, i, 1) for i, nm in enumerate(names[1:])])      # 9 of the 10 ET ops
    info, rep = link_with_report(et, k)
    assert {h: a["et_id"] for h, a in info.items()} == {i: 4 + i for i in range(9)}
    assert rep.threads[0]["et_coverage"] == 0.9 and rep.threads[0]["method"] == "exact"
    k = kineto_of([(nm, i, 1) for i, nm in enumerate(names[2:])])      # 8 of 10: too few
    with pytest.raises(TraceInputError, match="only 80% of 10 ET ops match"):
        link(et, k)


def test_name_sequence_approximate_alignment():
    names = [f"o{i}" for i in range(10)]
    et = et_of(seq_et(names))
    # Kineto: 5 unrelated ops, the ET's ops with o4 missing and an extra op after o7, 5 more unrelated ops.
    # Windows of 15 ops every 5: LCS 9 at 0 and at 5 (the first wins); difflib pairs o0-o3, o5-o7, o8-o9
    # (9 of 10 ET ops) over a span of 10 Kineto ops (o0 .. o9 with the extra): 0.9 and 0.9, linked.
    kseq = [f"z{i}" for i in range(5)] + names[:4] + names[5:8] + ["extra"] + names[8:] + [f"w{i}" for i in range(5)]
    info, rep = link_with_report(et, kineto_of([(nm, i, 1) for i, nm in enumerate(kseq)]))
    assert {h: a["et_id"] for h, a in info.items()} == {5: 3, 6: 4, 7: 5, 8: 6, 9: 8, 10: 9, 11: 10, 13: 11, 14: 12}
    assert rep.threads == [{"et_tid": 1, "kineto_tid": 1, "method": "lcs", "matched": 9, "et_ops": 10,
                            "et_coverage": 0.9, "kineto_window_coverage": 0.9, "occurrences": 1, "linked": True}]
    # a second extra op inside the span: 9 matches over 11 Kineto ops (0.82): not linked
    kseq2 = kseq[:7] + ["extra2"] + kseq[7:]
    with pytest.raises(TraceInputError, match="only 90% of 10 ET ops match"):
        link(et, kineto_of([(nm, i, 1) for i, nm in enumerate(kseq2)]))


def test_name_sequence_alignment_checks_the_last_window():
    names = [f"o{i}" for i in range(10)]
    et = et_of(seq_et(names))
    # 13 unrelated ops then the ET's ops without o4 (22 ops): windows of 15 at 0 and 5 see at most 7 of
    # them; the last window (7 .. 21) sees all 9, over a span of 9 Kineto ops
    kseq = [f"z{i}" for i in range(13)] + names[:4] + names[5:]
    info, rep = link_with_report(et, kineto_of([(nm, i, 1) for i, nm in enumerate(kseq)]))
    assert {h: a["et_id"] for h, a in info.items()} == {13: 3, 14: 4, 15: 5, 16: 6, 17: 8, 18: 9, 19: 10, 20: 11,
                                                        21: 12}
    assert rep.threads[0]["kineto_window_coverage"] == 1.0 and rep.threads[0]["et_coverage"] == 0.9


def test_name_sequence_with_too_little_in_common_is_another_run():
    names = [f"o{i}" for i in range(10)]
    et = et_of(seq_et(names))
    kseq = names[:3] + ["x", "y"] + names[5:8] + ["q"]      # LCS 6 of 10: below 9, not worth pairing
    with pytest.raises(TraceInputError, match="only 60% of 10 ET ops match"):
        link(et, kineto_of([(nm, i, 1) for i, nm in enumerate(kseq)]))
    with pytest.raises(TraceInputError, match="only 0% of 10 ET ops match"):
        link(et, kineto_of([("zz", 0, 1)]))


def test_lcs_length_textbook_values():
    s = lambda text: [ord(c) for c in text]
    assert lcs_length(s("ABCBDAB"), s("BDCABA")) == 4        # CLRS 15.4
    assert lcs_length(s("BDCABA"), s("ABCBDAB")) == 4
    assert lcs_length(s("AGGTAB"), s("GXTXAYB")) == 4        # GTAB
    assert lcs_length(s("ABC"), s("ABC")) == 3 and lcs_length(s("ABC"), s("XYZ")) == 0
    assert lcs_length([], s("A")) == 0 and lcs_length(s("A"), []) == 0


def test_occurrences_are_non_overlapping_and_element_aligned():
    assert _occurrences([1, 2], [1, 2, 1, 2, 1]) == [0, 2]
    assert _occurrences([1, 1], [1, 1, 1]) == [0]
    assert _occurrences([1, 1], [1, 1, 1, 1]) == [0, 2]
    # 256 is bytes 00 01 00 00; [2**24, 0] holds them at byte 2, which is not an element boundary
    assert _occurrences([256], [2 ** 24, 0]) == []
    assert _occurrences([256], [2 ** 24, 0, 256]) == [2]
    assert _occurrences([], [1]) == [] and _occurrences([1, 2], [1]) == []
    assert _align([], [1])["method"] == "none" and _align([1], [])["matched"] == 0


def test_comm_and_autograd_attrs_travel_with_the_link():
    v, t = rpc_args(4, ["0", ""], 0, "allreduce", tail=(2,))
    w, tw = rpc_args(4, ["", ""], -1, "wait")
    et = et_of([op(3, "c10d::allreduce_", rf=19),
                op(4, "record_param_comms", parent=3, rf=20, ins=[[T(1, 1, 8, 4)]] + v[1:],
                   in_types=["GenericList[Tensor]"] + t[1:], comm={"dtype": "Float"}),
                op(5, "nccl:all_reduce", parent=4, rf=21),
                op(6, "record_param_comms", rf=22, ins=w, in_types=tw),
                op(7, "autograd::engine::evaluate_function: MmBackward0", rf=23, tid=2,
                   comm={"fw_parent": 40, "fw_tid": 1}),
                op(8, "gloo:all_reduce", rf=24, tid=3, ins=[T(2, 2, 4, 4, "cpu")])])
    k = kineto_of([("c10d::allreduce_", 0, 10, 1, 19), ("record_param_comms", 1, 8, 1, 20),
                   ("nccl:all_reduce", 2, 5, 1, 21), ("record_param_comms", 20, 1, 1, 22),
                   ("autograd::engine::evaluate_function: MmBackward0", 30, 1, 2, 23),
                   ("gloo:all_reduce", 40, 1, 3, 24)])
    info = link(et, k)
    comm = {"coll_name": "allreduce", "comm_type": 1, "dtype": "Float", "comm_size": 8 * 4, "pg_name": "0",
            "pg_ranks": [0, 1], "pg_size": 2}
    from chakra_schema.graph import CommType
    comm["comm_type"] = int(CommType.ALL_REDUCE)
    assert {k_: info[1][k_] for k_ in comm} == comm and "comm_seq" not in info[1]
    # the transfer takes the attrs of its record_param_comms parent, named by the transfer
    assert {k_: info[2][k_] for k_ in comm if k_ != "coll_name"} == {k_: comm[k_] for k_ in comm if k_ != "coll_name"}
    assert info[2]["coll_name"] == "allreduce"
    assert "comm_type" not in info[3] and "coll_name" not in info[3]     # a wait is not a collective
    assert "coll_name" not in info[0]
    assert info[4] == {"et_id": 7, "rf_id": 23, "fw_parent": 40, "fw_tid": 1}
    assert info[5]["coll_name"] == "all_reduce" and info[5]["comm_size"] == 4 * 4
    assert info[5]["comm_type"] == int(CommType.ALL_REDUCE)


def test_report_fraction_and_rounding():
    from chakra_schema.pytorch.linker import LinkReport
    assert LinkReport("rf_id", 0, 5, 0, 0).fraction == 0.0
    r = LinkReport("rf_id", 3, 5, 1, 1)
    assert r.fraction == 1 / 3 and r.as_dict()["fraction"] == 0.3333


def test_et_attrs_of_a_transfer_without_a_parent_table():
    from chakra_schema.pytorch.linker import _et_attrs
    v, t = rpc_args(4, ["0", ""], 0, "allreduce", tail=(2,))
    et = et_of([op(3, "record_param_comms", rf=20, ins=[[T(1, 1, 8, 4)]] + v[1:],
                   in_types=["GenericList[Tensor]"] + t[1:], comm={"dtype": "Float"}),
                op(4, "nccl:all_reduce", parent=3, rf=21),
                op(5, "nccl:all_reduce", rf=22, ins=[T(2, 2, 3, 4)])])
    a = _et_attrs(et, 3)
    assert a["et_id"] == 4 and a["rf_id"] == 21 and a["comm_size"] == 8 * 4 and a["pg_ranks"] == [0, 1]
    b = _et_attrs(et, 4, with_rf=False)
    assert "rf_id" not in b and b["comm_size"] == 3 * 4 and b["coll_name"] == "all_reduce"


def test_link_error_names_the_et_file():
    with pytest.raises(TraceInputError, match="et.json"):
        link(et_of([op(3, "a", rf=1)]), kineto_of([("a", 0, 1, 1, 2)]))


def test_name_sequence_counts_every_et_op_against_the_threshold():
    # thread 1: 9 ops linked exactly; thread 2: 2 ops found nowhere: 9 of 11 (82%) is too few
    et = et_of(seq_et([f"o{i}" for i in range(9)]) + seq_et(["u", "v"], tid=2, first_id=50))
    k = kineto_of([(f"o{i}", i, 1) for i in range(9)] + [("w", 0, 1, 2)])
    with pytest.raises(TraceInputError, match=r"only 82% of 11 ET ops match Kineto host ops by name sequence "
                                              r"\(need 90%\)"):
        link(et, k)


def test_name_sequence_pairs_each_thread_once():
    # two ET threads with the same ops, one Kineto thread: only one ET thread is linked (3 of 6)
    et = et_of(seq_et(["a", "b", "c"]) + seq_et(["a", "b", "c"], tid=2, first_id=10))
    with pytest.raises(TraceInputError, match="only 50% of 6"):
        link(et, kineto_of([("a", 0, 1), ("b", 1, 1), ("c", 2, 1)]))
    # one ET thread matching two Kineto threads: linked to the first; the next candidate pair still links
    et = et_of(seq_et(["a", "b", "c"]) + seq_et(["p", "q"], tid=2, first_id=10))
    k = kineto_of([("a", 0, 1, 5), ("b", 1, 1, 5), ("c", 2, 1, 5), ("a", 3, 1, 6), ("b", 4, 1, 6), ("c", 5, 1, 6),
                   ("p", 6, 1, 7), ("q", 7, 1, 7)])
    info, rep = link_with_report(et, k)
    assert {h: a["et_id"] for h, a in info.items()} == {0: 3, 1: 4, 2: 5, 6: 10, 7: 11}
    assert (rep.et_ops, rep.kineto_ops) == (5, 8)


def test_single_op_threads_link_and_lcs_of_one():
    info = link(et_of([op(3, "only")]), kineto_of([("only", 0, 1)]))
    assert info == {0: {"et_id": 3}}
    assert lcs_length([5], [5]) == 1 and lcs_length([1, 2], [2, 2]) == 1


def test_report_lists_unlinked_thread_pairs_with_rounded_coverage():
    names = [f"o{i}" for i in range(10)]
    big = [f"b{i}" for i in range(200)]
    et = et_of(seq_et(big) + seq_et(names, tid=2, first_id=500) + seq_et(["x", "y", "z"], tid=3, first_id=600))
    kseq = [f"z{i}" for i in range(5)] + names[:4] + names[5:7] + ["extra2"] + names[7:8] + ["extra"] + names[8:]
    kseq += [f"w{i}" for i in range(5)]
    k = kineto_of([(nm, i, 1) for i, nm in enumerate(big)] + [(nm, i, 1, 2) for i, nm in enumerate(kseq)]
                  + [("x", 0, 1, 3), ("w", 1, 1, 3)])
    info, rep = link_with_report(et, k)
    assert len(info) == 200 and rep.fraction == 200 / 213
    # 9 of the 10 ops over a span of 11 Kineto ops: 9/11 = 0.8182, not linked
    assert rep.threads[1] == {"et_tid": 2, "kineto_tid": 2, "method": "lcs", "matched": 9, "et_ops": 10,
                              "et_coverage": 0.9, "kineto_window_coverage": 0.8182, "occurrences": 1,
                              "linked": False}
    # LCS 1 of 3 (below 90%): not aligned further, no window coverage
    assert rep.threads[2] == {"et_tid": 3, "kineto_tid": 3, "method": "lcs", "matched": 1, "et_ops": 3,
                              "et_coverage": 0.3333, "kineto_window_coverage": 0.0, "occurrences": 0,
                              "linked": False}


def test_occurrences_are_found_in_order():
    assert _occurrences([1, 2], [1, 2, 1, 2, 1, 2]) == [0, 2, 4]
    assert _occurrences([256], [2 ** 24, 0, 256, 0, 256]) == [2, 4]


def test_align_results_in_full():
    assert _align([], [1]) == {"matched": 0, "et_cov": 0.0, "k_cov": 0.0, "pairs": [], "method": "none",
                               "occurrences": 0}
    # the Kineto thread is a window of the ET thread: 2 of 4 ET ops, all of the Kineto ones
    assert _align([1, 2, 3, 4], [2, 3]) == {"matched": 2, "et_cov": 0.5, "k_cov": 1.0, "pairs": [(1, 0), (2, 1)],
                                            "method": "exact", "occurrences": 1}
    # an element-aligned match right after a misaligned one (bytes 01 01 01 01 at offsets 3 and 4)
    assert _occurrences([16843009], [16777216, 16843009]) == [1]


def test_transfer_under_the_first_et_node_takes_its_record_param_comms_attrs():
    from chakra_schema.pytorch.linker import _et_attrs
    et = execution_trace_from_json({"schema": "1.1.1", "pid": 7, "nodes": [
        op(1, "record_param_comms", parent=0, comm={"dtype": "Float", "in_msg_nelems": 5}),
        op(2, "nccl:all_reduce", parent=1)]}, "et.json")
    a = _et_attrs(et, 1, parent_of=[-1, 0])
    # the record_param_comms names no collective: the transfer's own name does
    assert a["coll_name"] == "all_reduce" and a["comm_size"] == 5 * 4 and a["dtype"] == "Float"


def test_link_error_messages_in_full():
    with pytest.raises(TraceInputError, match=r": the Execution Trace has no operators$"):
        link(et_of([]), kineto_of([("a", 0, 1)]))
    with pytest.raises(TraceInputError, match=r": the Kineto trace has no host ops \(cpu_op / user_annotation\)$"):
        link(et_of([op(3, "a")]), kineto_of([]))
    with pytest.raises(TraceInputError, match=r"by pid 8, 9, 10 \(another rank"):
        link(et_of([op(3, "a", rf=1)]), kineto_of([("a", 0, 1, 1, 1, 8), ("b", 0, 1, 2, 5, 9),
                                                   ("c", 0, 1, 2, 5, 10), ("d", 0, 1, 2, 5, 11)]))


def test_name_sequence_links_carry_no_rf_id():
    info = link(et_of([op(3, "a", rf=5), op(4, "b", rf=6)]), kineto_of([("a", 0, 1), ("b", 1, 1)]))
    assert info == {0: {"et_id": 3}, 1: {"et_id": 4}}
