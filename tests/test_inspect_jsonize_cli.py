"""`lumos-sim jsonize` and `lumos-sim inspect` on real files, and their behaviour on bad input
(exit 2, one stderr line, no output file)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from chakra_schema.graph import CommType, EdgeKind, GraphBuilder, NodeType, OpKind, ResourceKind
from chakra_schema.graph_io import write_graph
from conftest import ROOT, require_shared
from test_et_format import bad_inputs
from wire_decoder import decode_et


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumos_sim", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


# ------------------------------------------------------------------ jsonize


def test_jsonize_writes_one_json_document(chakra_et, tmp_path):
    out = tmp_path / "chakra.json"
    proc = run_cli("jsonize", chakra_et, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    doc = json.loads(out.read_text())
    md, nodes = decode_et(chakra_et)
    assert doc["metadata"]["attrs"]["schema"] == "1.0.1"
    assert len(doc["nodes"]) == len(nodes) == 3664
    assert [n["id"] for n in doc["nodes"]] == [n["id"] for n in nodes]
    assert [n["data_deps"] for n in doc["nodes"]] == [n["data_deps"] for n in nodes]
    assert Counter(n["type"] for n in doc["nodes"]) == {"COMP_NODE": 3643, "COMM_COLL_NODE": 21}
    coll = next(n for n in doc["nodes"] if "comm_size" in n["attrs"])
    assert coll["attr_types"]["comm_size"] == "int64_val" and coll["attr_types"]["is_cpu_op"] == "bool_val"
    assert coll["inputs"]["shapes"] == next(n for n in nodes if n["id"] == coll["id"])["inputs"]["shapes"]
    assert [p.name for p in tmp_path.iterdir()] == ["chakra.json"]


def test_jsonize_to_stdout_and_gzip_input(tmp_path):
    src = require_shared("traces", "astra-sim", "custom_ring_allreduce_8npus", "custom_allreduce.3.et")
    proc = run_cli("jsonize", src)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["metadata"]["attrs"]["collective"] == "allreduce"
    sends = [n for n in doc["nodes"] if n["type"] == "COMM_SEND_NODE"]
    assert len(sends) == 14 and {n["attrs"]["comm_dst"] for n in sends} == {4}
    assert {n["attr_types"]["comm_dst"] for n in sends} == {"int32_val"}
    # the same file gzipped gives the same document
    import gzip
    gz = tmp_path / "custom_allreduce.3.et.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    proc2 = run_cli("jsonize", gz)
    assert proc2.returncode == 0 and json.loads(proc2.stdout) == doc


# ------------------------------------------------------------------ inspect


def test_inspect_json_on_an_astra_sim_set():
    prefix = require_shared("traces", "astra-sim", "all_reduce_8npus_1MB") / "all_reduce"
    proc = run_cli("inspect", prefix, "--json")
    assert proc.returncode == 0, proc.stderr
    ranks = json.loads(proc.stdout)["ranks"]
    assert [r["rank"] for r in ranks] == list(range(8))
    for r in ranks:
        assert r["world_size"] == 8 and r["valid"] and r["nodes"] == 1
        assert r["collectives"] == [{"comm_type": "ALL_REDUCE", "pg_name": "", "count": 1, "bytes": 1 << 20}]


def test_inspect_json_on_the_chakra_file(chakra_et):
    proc = run_cli("inspect", chakra_et, "--json")
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads(proc.stdout)["ranks"]
    assert r["node_types"] == {"COMP_NODE": 3643, "COMM_COLL_NODE": 21}
    assert r["valid"] and r["problems"] == []
    # the collectives counted independently from the wire: GPU-side COMM_COLL nodes by comm_type
    _md, nodes = decode_et(chakra_et)
    expect: Counter = Counter()
    size: Counter = Counter()
    for n in nodes:
        if n["type"] == NodeType.COMM_COLL_NODE and not n["attrs"].get("is_cpu_op"):
            name = CommType(n["attrs"]["comm_type"]).name
            expect[name] += 1
            size[name] += n["attrs"]["comm_size"]
    got = {c["comm_type"]: (c["count"], c["bytes"]) for c in r["collectives"]}
    assert got == {k: (expect[k], size[k]) for k in expect}
    assert sum(r["op_kinds"].values()) == 3664


def test_inspect_table_and_validation_problems(tmp_path):
    b = GraphBuilder(rank=0, world_size=2)
    cpu = b.resource(ResourceKind.CPU_THREAD, 1, 1)
    a = b.add_node("ProfilerStep#3", NodeType.COMP_NODE, OpKind.ANNOTATION, cpu, 0.0, 100.0, node_id=11)
    c = b.add_node("x", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 1.0, 2.0, parent=a, node_id=12)
    d = b.add_node("y", NodeType.COMP_NODE, OpKind.CPU_OP, cpu, 4.0, 2.0, parent=a, node_id=13)
    b.add_dep(c, d)
    b.add_dep(d, c, EdgeKind.SYNC)  # a cycle: 12 -> 13 -> 12
    b.add_step("ProfilerStep#3", a, 0.0, 100.0)
    write_graph(b.build(), tmp_path / "cyc.0.et")
    proc = run_cli("inspect", tmp_path / "cyc", "--json")
    assert proc.returncode == 0, proc.stderr
    (r,) = json.loads(proc.stdout)["ranks"]
    assert not r["valid"] and "12" in r["problems"][0] and "13" in r["problems"][0]
    assert r["steps"] == [{"name": "ProfilerStep#3", "start_us": 0.0, "duration_ms": 0.1}]
    table = run_cli("inspect", tmp_path / "cyc.0.et")
    assert table.returncode == 0
    assert "COMP_NODE" in table.stdout and "ProfilerStep#3" in table.stdout and "cycle" in table.stdout


# ------------------------------------------------------------------ bad input


def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, capsys):
    from lumos_sim.cli import main

    inputs = tmp_path / "in"
    inputs.mkdir()
    outdir = tmp_path / "out"
    outdir.mkdir()
    for name, path in bad_inputs(inputs).items():
        for args in (("jsonize", path, "-o", outdir / f"{name}.json"), ("jsonize", path), ("inspect", path),
                     ("inspect", path, "--json")):
            rc = main([str(a) for a in args])
            out, err = capsys.readouterr()
            assert rc == 2, (name, args, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and str(path) in lines[0], (name, args, err)
            assert out == "", (name, args)
        assert list(outdir.iterdir()) == [], name
    # and through a real process: exit status, nothing on stdout, no file
    bad = inputs / "truncated_gz.et"
    proc = run_cli("jsonize", bad, "-o", outdir / "x.json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr
    assert list(outdir.iterdir()) == []
    proc = run_cli("inspect", tmp_path / "no_such_prefix")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
