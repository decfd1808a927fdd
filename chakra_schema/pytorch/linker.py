"""Link an Execution Trace to the Kineto trace of the same run: which Kineto host op is which ET node.

    link(et, kineto) -> host_info: {HostOp.index: {attr: value}}   (for kineto_to_graph)
    link_with_report(et, kineto) -> (host_info, LinkReport)

Keys, in order of trust:
1. Record function id: Kineto `args["Record function id"]` == ET `rf_id` (PyTorch >= 2.1 writes both).
   The names of the pairs must agree; when fewer than MIN_FRACTION of the Kineto host ops whose id is
   in the ET carry the same name, the files come from different runs.
2. Name sequence, for Kineto traces without Record function ids: per thread, the ET ops in id order
   (= start order) against the Kineto host ops in (start, -duration) order. Exact occurrences of the
   whole ET thread sequence in the Kineto thread (a Kineto trace often records several iterations and the
   ET one of them: every occurrence is linked), else the best alignment inside a window of the Kineto
   thread about the ET's length (bit-parallel LCS to find the window, difflib to pair the ops). An
   alignment counts only when it covers >= MIN_FRACTION of the ET ops AND of the Kineto ops inside the
   aligned span; ET threads are paired with Kineto threads greedily by matched count.
The ET's `pid` must also be the pid of the Kineto host ops: the ranks of one SPMD program (or two runs)
share op sequences and record-function ids, so only the process id tells them apart.
When no key works, TraceInputError names both files and says why.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.pytorch.et_graph import collective_kind, comm_attrs, kernel_hints
from chakra_schema.pytorch.execution_trace import PG_INIT, ExecutionTrace, is_root_name, op_attrs

MIN_FRACTION = 0.9


@dataclass
class LinkReport:
    key: str                      # "rf_id" | "name_sequence"
    et_ops: int                   # ET ops considered (roots excluded)
    kineto_ops: int               # Kineto host ops
    matched_et: int               # ET ops linked to at least one Kineto op
    matched_kineto: int           # Kineto host ops given ET attrs
    detail: str = ""
    threads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.matched_et / self.et_ops if self.et_ops else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "et_ops": self.et_ops, "kineto_ops": self.kineto_ops,
                "matched_et": self.matched_et, "matched_kineto": self.matched_kineto,
                "fraction": round(self.fraction, 4), "detail": self.detail, "threads": self.threads}


def link(et: ExecutionTrace, kineto) -> dict[int, dict]:
    return link_with_report(et, kineto)[0]


def _pair_error(et: ExecutionTrace, kineto, why: str) -> TraceInputError:
    return TraceInputError(et.path, f"cannot link with {kineto.path}: {why}")


def link_with_report(et: ExecutionTrace, kineto) -> tuple[dict[int, dict], LinkReport]:
    et_ops = [i for i, nm in enumerate(et.names) if not is_root_name(nm) and nm != PG_INIT]
    hops = kineto.host_ops
    if not et_ops:
        raise _pair_error(et, kineto, "the Execution Trace has no operators")
    if not hops:
        raise _pair_error(et, kineto, "the Kineto trace has no host ops (cpu_op / user_annotation)")
    # ids are unique per op: a Kineto trace whose ops all carry one id (0: the profiler did not record
    # them) has no key
    ids = [op.rf_id for op in hops if op.rf_id is not None]
    if ids and (len(ids) == 1 or len(set(ids)) > 1):
        pairs, report = _link_by_rf_id(et, kineto, et_ops)
    else:
        pairs, report = _link_by_name_sequence(et, kineto, et_ops)
    # Ranks of an SPMD program (or two runs of it) record the same ops, ids and all; the process id
    # tells them apart. Checked after the content so that each check has its own message.
    k_pids = sorted({op.pid for op in hops})
    if et.pid and et.pid not in k_pids:
        raise _pair_error(et, kineto, f"ET and Kineto come from different processes: the Execution Trace was "
                                      f"recorded by pid {et.pid}, the Kineto host ops by pid "
                                      f"{', '.join(map(str, k_pids[:3]))} (another rank or run of the same program?)")
    info_cache: dict[int, dict] = {}
    host_info: dict[int, dict] = {}
    parent_of = et.parent_index().tolist()
    for e, h in pairs:
        a = info_cache.get(e)
        if a is None:
            a = info_cache[e] = _et_attrs(et, e, report.key == "rf_id", parent_of)
        host_info[h] = dict(a)
    report.matched_et = len({e for e, _ in pairs})
    report.matched_kineto = len(host_info)
    return host_info, report


# ------------------------------------------------------------------------------------ key 1: rf_id
def _link_by_rf_id(et: ExecutionTrace, kineto, et_ops: list[int]) -> tuple[list[tuple[int, int]], LinkReport]:
    by_rf = {int(et.rf_id[i]): i for i in et_ops if et.rf_id[i] >= 0}
    shared = agree = 0
    pairs: list[tuple[int, int]] = []
    for op in kineto.host_ops:
        if op.rf_id is None:
            continue
        e = by_rf.get(int(op.rf_id))
        if e is None:
            continue
        shared += 1
        if et.names[e] == op.name:
            agree += 1
            pairs.append((e, op.index))
    report = LinkReport("rf_id", len(et_ops), len(kineto.host_ops), 0, 0)
    if shared == 0:
        raise _pair_error(et, kineto, "ET and Kineto come from different runs: none of the Kineto "
                                      "'Record function id's is an rf_id of the Execution Trace")
    if agree < MIN_FRACTION * shared:
        raise _pair_error(et, kineto, f"ET and Kineto come from different runs: only {100 * agree / shared:.0f}% "
                                      f"of {shared} host ops sharing a Record function id have the same name")
    report.detail = f"{agree} of {shared} Kineto host ops with an ET rf_id agree by name"
    return pairs, report


# ---------------------------------------------------------------------------- key 2: name sequence
def _link_by_name_sequence(et: ExecutionTrace, kineto, et_ops: list[int]) -> tuple[list[tuple[int, int]], LinkReport]:
    vocab: dict[str, int] = {}

    def code(name: str) -> int:
        c = vocab.get(name)
        if c is None:
            c = vocab[name] = len(vocab)
        return c

    et_threads: dict[int, list[int]] = {}
    for i in et_ops:
        et_threads.setdefault(int(et.tid[i]), []).append(i)
    k_threads: dict[tuple[int, int], list[int]] = {}
    for op in sorted(kineto.host_ops, key=lambda o: (o.ts, -o.dur)):
        k_threads.setdefault((op.pid, op.tid), []).append(op.index)
    hops = kineto.host_ops
    et_seq = {t: [code(et.names[i]) for i in ix] for t, ix in et_threads.items()}
    k_seq = {t: [code(hops[h].name) for h in ix] for t, ix in k_threads.items()}

    # score every (ET thread, Kineto thread) pair, then pair threads greedily by matched count
    cands = []
    for t, a in et_seq.items():
        for kt, bseq in k_seq.items():
            res = _align(a, bseq)
            cands.append((res["matched"], t, kt, res))
    cands.sort(key=lambda c: -c[0])
    used_et: set[int] = set()
    used_k: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int]] = []
    threads = []
    total_et = len(et_ops)
    matched_et = 0
    for matched, t, kt, res in cands:
        if t in used_et or kt in used_k or matched == 0:
            continue
        used_et.add(t)
        used_k.add(kt)
        ok = res["et_cov"] >= MIN_FRACTION and res["k_cov"] >= MIN_FRACTION
        threads.append({"et_tid": t, "kineto_tid": kt[1], "method": res["method"], "matched": matched,
                        "et_ops": len(et_seq[t]), "et_coverage": round(res["et_cov"], 4),
                        "kineto_window_coverage": round(res["k_cov"], 4), "occurrences": res["occurrences"],
                        "linked": ok})
        if ok:
            ix, kx = et_threads[t], k_threads[kt]
            pairs.extend((ix[a_i], kx[b_i]) for a_i, b_i in res["pairs"])
            matched_et += len({a_i for a_i, _ in res["pairs"]})
    report = LinkReport("name_sequence", total_et, len(hops), 0, 0, threads=threads)
    frac = matched_et / total_et if total_et else 0.0
    if frac < MIN_FRACTION:
        best = sum(th["matched"] for th in threads)
        raise _pair_error(et, kineto, f"ET and Kineto come from different runs: no Record function id in Kineto "
                                      f"and op sequences differ: only {100 * min(best, total_et) / total_et:.0f}% of "
                                      f"{total_et} ET ops match Kineto host ops by name sequence "
                                      f"(need {100 * MIN_FRACTION:.0f}%)")
    report.detail = "; ".join(f"ET tid {th['et_tid']} -> Kineto tid {th['kineto_tid']}: {th['method']}, "
                              f"{th['matched']}/{th['et_ops']} ops x{th['occurrences']}" for th in threads)
    return pairs, report


def _occurrences(a: list[int], b: list[int]) -> list[int]:
    """Start positions of non-overlapping exact occurrences of sequence `a` in `b`."""
    if not a or len(a) > len(b):
        return []
    pat = np.asarray(a, np.int32).tobytes()
    hay = np.asarray(b, np.int32).tobytes()
    out: list[int] = []
    pos = hay.find(pat)
    while pos >= 0:
        if pos % 4 == 0:
            out.append(pos // 4)
            pos = hay.find(pat, pos + len(pat))
        else:
            pos = hay.find(pat, pos + 1)
    return out


def lcs_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common subsequence, bit-parallel over `a` (Hyyro's formulation)."""
    m = len(a)
    if m == 0 or not b:
        return 0
    mask = (1 << m) - 1
    pm: dict[int, int] = {}
    for i, c in enumerate(a):
        pm[c] = pm.get(c, 0) | (1 << i)
    v = mask
    for c in b:
        bits = pm.get(c)
        if bits is None:
            continue
        u = v & bits
        v = ((v + u) | (v - u)) & mask
    return m - v.bit_count()


def _align(a: list[int], b: list[int]) -> dict[str, Any]:
    """Align ET thread sequence `a` with Kineto thread sequence `b` (see the module docstring)."""
    none = {"matched": 0, "et_cov": 0.0, "k_cov": 0.0, "pairs": [], "method": "none", "occurrences": 0}
    if not a or not b:
        return none
    occ = _occurrences(a, b)
    if occ:
        pairs = [(k, s + k) for s in occ for k in range(len(a))]
        return {"matched": len(a), "et_cov": 1.0, "k_cov": 1.0, "pairs": pairs, "method": "exact",
                "occurrences": len(occ)}
    occ = _occurrences(b, a)  # the Kineto thread is one window of the ET thread
    if occ:
        s = occ[0]
        return {"matched": len(b), "et_cov": len(b) / len(a), "k_cov": 1.0,
                "pairs": [(s + k, k) for k in range(len(b))], "method": "exact", "occurrences": 1}
    # approximate: the window of b (about a's length) with the longest common subsequence
    m = len(a)
    width = max(int(1.5 * m), 1)
    step = max(m // 2, 1)
    best, best_lo = -1, 0
    for lo in range(0, max(len(b) - width, 0) + 1, step):
        score = lcs_length(a, b[lo:lo + width])
        if score > best:
            best, best_lo = score, lo
    if len(b) > width and (len(b) - width) % step:
        lo = len(b) - width
        score = lcs_length(a, b[lo:])
        if score > best:
            best, best_lo = score, lo
    res = dict(none, matched=max(best, 0), et_cov=max(best, 0) / m, method="lcs")
    if best < MIN_FRACTION * m:
        return res  # not worth pairing: it will be rejected
    window = b[best_lo:best_lo + width]
    blocks = [blk for blk in difflib.SequenceMatcher(None, a, window, autojunk=False).get_matching_blocks()
              if blk.size]
    pairs = [(blk.a + k, best_lo + blk.b + k) for blk in blocks for k in range(blk.size)]
    if not pairs:
        return res
    span = pairs[-1][1] - pairs[0][1] + 1
    return {"matched": len(pairs), "et_cov": len(pairs) / m, "k_cov": len(pairs) / span, "pairs": pairs,
            "method": "lcs", "occurrences": 1}


# ------------------------------------------------------------------------------------ ET attrs
def _et_attrs(et: ExecutionTrace, i: int, with_rf: bool = True,
              parent_of: list[int] | None = None) -> dict[str, Any]:
    """What an ET node adds to its Kineto host op: shapes, types, schema, ids (et_id, rf_id, scope, fw_parent,
    fw_tid), comm attrs. (`rf_id` only
    when linked by it: a name-sequence link may give one ET node to several Kineto iterations.)"""
    a: dict[str, Any] = {"et_id": int(et.ids[i])}
    if with_rf and et.rf_id[i] >= 0:
        a["rf_id"] = int(et.rf_id[i])
    # the ET's RecordScope and the forward op / thread of an autograd op, as Chakra's converter keeps them
    if et.scope[i] >= 0:
        a["scope"] = int(et.scope[i])
    extra = et.extra.get(i)
    if extra:
        for key in ("fw_parent", "fw_tid"):
            if key in extra:
                a[key] = int(extra[key])
    a.update(op_attrs(et, i))
    # what model mode needs to infer a CPU run's GPU kernels from the linked ops (replay/et_kernels.py)
    a.update(kernel_hints(et, i))
    nm = et.names[i]
    if nm == "record_param_comms" or nm.startswith(("nccl:", "gloo:")):
        src = i
        if nm != "record_param_comms":  # a transfer node: its record_param_comms parent holds the attrs
            p = int(et.parent_index()[i]) if parent_of is None else parent_of[i]
            if p >= 0 and et.names[p] == "record_param_comms":
                src = p
        ca = comm_attrs(et, src, nm)
        if collective_kind(ca["coll_name"]) is not None:
            ca.pop("comm_seq", None)
            a.update(ca)
    return a
