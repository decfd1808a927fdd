"""Every PyTorch trace in shared/traces converts through the top-level API (`converter.convert`) to a
`.et` file that an independent decoder reads back, with no dangling deps and acyclic data deps; the
pairs that cannot be linked fail with the promised one-line reason and leave no file."""
from __future__ import annotations

import random
from collections import defaultdict

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.pytorch.converter import convert
from chakra_schema.pytorch.linker import lcs_length
from conftest import SHARED, require_shared
from wire_decoder import decode_et, decode_metadata, decode_node, iter_fields, read_bytes, split_messages

FULL_DECODE_LIMIT = 12000  # nodes; above it every node's ids/deps are decoded, and a sample in full

HTA_KINETO = [
    "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "critical_path_alexnet_trace.json.gz",
    "critical_path_cuda_event_sync_event_sync_trace.json.gz",
    "critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz",
    "execution_trace_benchmark_simple_add_trace.json.gz",
    "nccl_parser_config_nccl_data.json.gz",
    "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "trace_diff_control_control.json.gz",
    "trace_filter_sampled_rank-0.json.gz",
    "trace_filter_sampled_rank-1.json.gz",
]
ET_ONLY = [
    "hta/execution_trace_benchmark_simple_add_et.json.gz",
    "param/linear_et.json.gz",
    "param/resnet_et.json.gz",
    "param/1.1.0-chakra.0.0.4_resnet_2gpu_et.json.gz",
    "param/hf_GPT2_et.json.tar.gz",
    "chakra/1.0.2-chakra.0.0.4.tgz",
]
KINETO_ONLY = [f"hta/{f}" for f in HTA_KINETO] + ["param/linear_kineto.json.gz", "param/resnet_kineto.json.gz"]
# (ET, Kineto, expected rank, None when the pair links / the start of the promised error)
PAIRS = [
    ("hta/execution_trace_benchmark_simple_add_et.json.gz", "hta/execution_trace_benchmark_simple_add_trace.json.gz",
     None),
    ("param/linear_et.json.gz", "param/linear_kineto.json.gz", None),
    # the README lists these as a pair, but the ET (2024, DDP, ProfilerStep#4..6) and the Kineto trace
    # (2023, no DDP, DataLoader) do not come from one run
    ("param/resnet_et.json.gz", "param/resnet_kineto.json.gz", "ET and Kineto come from different runs"),
    # deliberately mismatched: no Record function id, different op sequences
    ("hta/execution_trace_benchmark_simple_add_et.json.gz", "param/linear_kineto.json.gz",
     "ET and Kineto come from different runs: no Record function id in Kineto and op sequences differ"),
    # deliberately mismatched, and the ranks named inside differ (the ET's all-reduces say rank 1)
    ("param/1.1.0-chakra.0.0.4_resnet_2gpu_et.json.gz", "hta/nccl_parser_config_nccl_data.json.gz",
     "the Execution Trace is rank 1 but the Kineto trace"),
]


def _shared(rel: str) -> str:
    return str(require_shared("traces", *rel.split("/")))


def _light_node(buf: bytes) -> dict:
    """id, ctrl_deps and data_deps of a node message, with the independent decoder's field walker
    (attrs are skipped: decoding them all is what makes a full decode of a 75k-node file take 20 s)."""
    node = {"id": 0, "ctrl_deps": [], "data_deps": []}
    for field, wtype, value in iter_fields(buf):
        if field == 1:
            node["id"] = value
        elif field in (4, 5):
            key = "ctrl_deps" if field == 4 else "data_deps"
            if wtype == 2:
                pos = 0
                while pos < len(value):  # packed varints
                    v = 0
                    shift = 0
                    while True:
                        b = value[pos]
                        pos += 1
                        v |= (b & 0x7F) << shift
                        shift += 7
                        if not b & 0x80:
                            break
                    node[key].append(v)
            else:
                node[key].append(value)
    return node


def _decode(path) -> tuple[dict, list[dict]]:
    """decode_et for small files; for big ones ids/deps of every node plus a full decode of a sample."""
    messages = split_messages(read_bytes(path))
    if len(messages) - 1 <= FULL_DECODE_LIMIT:
        return decode_et(path)
    meta = decode_metadata(messages[0])
    body = messages[1:]
    step = max(len(body) // 2000, 1)
    for k in list(range(0, len(body), step)) + list(range(max(len(body) - 200, 0), len(body))):
        full = decode_node(body[k])
        light = _light_node(body[k])
        assert (full["id"], full["ctrl_deps"], full["data_deps"]) == (light["id"], light["ctrl_deps"],
                                                                     light["data_deps"])
    return meta, [_light_node(m) for m in body]


def _check_et_file(path, summary) -> None:
    """Decode with the independent decoder; no dangling data/ctrl deps; data deps acyclic (own Kahn)."""
    meta, nodes = _decode(path)
    assert len(nodes) == summary["nodes"] > 0
    ids = [n["id"] for n in nodes]
    idset = set(ids)
    assert len(idset) == len(ids), "duplicate node ids"
    succ = defaultdict(list)
    indeg = dict.fromkeys(ids, 0)
    edges = 0
    for n in nodes:
        for d in n["ctrl_deps"]:
            assert d in idset, f"node {n['id']} has dangling ctrl dep {d}"
        for d in n["data_deps"]:
            assert d in idset, f"node {n['id']} has dangling data dep {d}"
            succ[d].append(n["id"])
            indeg[n["id"]] += 1
            edges += 1
    assert edges == summary["edges"] + summary["order_deps"]  # the graph's deps + thread/stream order
    ready = [i for i, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    assert seen == len(ids), f"data deps have a cycle through {len(ids) - seen} nodes"


@pytest.mark.parametrize("rel", ET_ONLY)
def test_execution_trace_converts(rel, tmp_path):
    [s] = convert(_shared(rel), None, tmp_path / "out")
    assert s["et"] and s["kineto"] is None
    _check_et_file(s["output"], s)
    assert s["edges_by_kind"].get("DATA", 0) > 0


@pytest.mark.parametrize("rel", KINETO_ONLY)
def test_kineto_trace_converts(rel, tmp_path):
    [s] = convert(None, _shared(rel), tmp_path / "out")
    assert s["kineto"] and s["et"] is None
    _check_et_file(s["output"], s)


@pytest.mark.parametrize("et_rel,k_rel,error", PAIRS, ids=[f"{e.split('/')[-1]}+{k.split('/')[-1]}"
                                                          for e, k, _ in PAIRS])
def test_pair_links_or_says_why(et_rel, k_rel, error, tmp_path):
    out = tmp_path / "out"
    if error is None:
        [s] = convert(_shared(et_rel), _shared(k_rel), out)
        _check_et_file(s["output"], s)
        link = s["link"]
        assert link["key"] == "name_sequence" and link["fraction"] >= 0.9
        assert link["matched_kineto"] > 0
        if et_rel == "param/linear_et.json.gz":
            # the ET records one iteration; Kineto holds it 39 times: each occurrence is linked
            assert link["matched_et"] == link["et_ops"] == 928
            assert {t["occurrences"] for t in link["threads"]} == {39}
            assert all(t["method"] == "exact" for t in link["threads"])
    else:
        with pytest.raises(TraceInputError) as ei:
            convert(_shared(et_rel), _shared(k_rel), out)
        msg = str(ei.value)
        assert error in msg and "\n" not in msg
        assert et_rel.split("/")[-1] in msg and k_rel.split("/")[-1] in msg  # names both files
        assert list(tmp_path.iterdir()) == []


def test_record_function_ids_that_disagree_by_name_are_rejected():
    """Both files have record-function ids, which overlap, but the ops behind them differ."""
    from chakra_schema.pytorch.execution_trace import load_execution_trace
    from chakra_schema.pytorch.kineto import load_kineto
    from chakra_schema.pytorch.linker import link

    et = load_execution_trace(_shared("param/1.1.0-chakra.0.0.4_resnet_2gpu_et.json.gz"))
    kineto = load_kineto(_shared("hta/nccl_parser_config_nccl_data.json.gz"))
    with pytest.raises(TraceInputError) as ei:
        link(et, kineto)
    msg = str(ei.value)
    assert "ET and Kineto come from different runs: only" in msg and "share a Record function id" not in msg
    assert "resnet_2gpu_et" in msg and "nccl_parser_config_nccl_data" in msg and "\n" not in msg


def test_shared_dir_holds_what_this_test_lists():
    """A new trace in shared/traces must be added here (this test would not notice it otherwise)."""
    require_shared("traces")
    listed = {f.split("/")[-1] for f in ET_ONLY + KINETO_ONLY}
    for sub in ("hta", "param"):
        for p in (SHARED / "traces" / sub).iterdir():
            assert p.name in listed, f"{sub}/{p.name} is not covered"


def test_lcs_length_matches_dynamic_programming():
    rng = random.Random(7)

    def dp(a, b):
        prev = [0] * (len(b) + 1)
        for x in a:
            cur = [0]
            for j, y in enumerate(b):
                cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
            prev = cur
        return prev[-1]

    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        b = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        assert lcs_length(a, b) == dp(a, b)
