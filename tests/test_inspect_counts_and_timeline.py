"""`inspect` and `convert` report the dependencies a `.et` file stores (counted here from the raw
protobuf messages, not through our reader), and the Perfetto timeline carries categories, readable
args and one launch -> GPU-op flow per GPU op that the Kineto trace links to a runtime call."""
from __future__ import annotations

import gzip
import json

import orjson

from chakra_schema.et_io import iter_et
from conftest import DATA
from lumos_sim.cli import main as cli_main

CPU_DDP = DATA / "cpu_ddp"
H100 = DATA / "h100" / "llama_b8_s1024"


def _stored_deps(path) -> tuple[int, int]:
    """(data_deps, ctrl_deps) summed over the file's Node messages, straight from protobuf."""
    data = ctrl = 0
    messages = iter_et(path)
    next(messages)  # GlobalMetadata
    for node in messages:
        data += len(node.data_deps)
        ctrl += len(node.ctrl_deps)
    return data, ctrl


def test_inspect_and_convert_report_the_dependencies_stored_in_the_file(tmp_path, capsys):
    prefix = tmp_path / "job"
    assert cli_main(["convert", "--kineto", str(CPU_DDP / "device.{rank}.json.gz"),
                     "--et", str(CPU_DDP / "host.{rank}.json.gz"), "-o", str(prefix), "--json"]) == 0
    converted = {s["rank"]: s for s in json.loads(capsys.readouterr().out)}
    for rank in (0, 1):
        data, ctrl = _stored_deps(f"{prefix}.{rank}.et")
        assert data > 10 * converted[rank]["edges"] and ctrl > 7000    # far more than the graph's edges
        assert converted[rank]["edges"] + converted[rank]["order_deps"] == data
        assert converted[rank]["ctrl_deps"] == ctrl
        assert cli_main(["inspect", f"{prefix}.{rank}.et", "--json"]) == 0
        s = json.loads(capsys.readouterr().out)["ranks"][0]
        assert (s["file_data_deps"], s["file_ctrl_deps"]) == (data, ctrl)
        assert sum(s["edges_by_kind"].values()) == s["edges"]
        assert cli_main(["inspect", f"{prefix}.{rank}.et"]) == 0
        assert f"{data:,} data deps, {ctrl:,} ctrl deps" in capsys.readouterr().out


def test_timeline_has_categories_readable_args_and_launch_flows(tmp_path):
    out = tmp_path / "t.json"
    assert cli_main(["replay", str(H100 / "device.0.json.gz"), "--et", str(H100 / "host.0.json.gz"),
                     "--timeline", str(out)]) == 0
    events = orjson.loads(out.read_bytes())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e.get("cat") for e in slices)
    assert {"kernel", "cpu_op", "runtime"} <= {e["cat"] for e in slices}
    assert all(isinstance(e["args"]["kind"], str) for e in slices)          # a name, not an int
    assert any("input shapes" in e["args"] for e in slices if e["cat"] == "cpu_op")

    # independent count: Kineto GPU ops whose correlation id a CUDA runtime / driver call carries
    kineto = json.load(gzip.open(H100 / "device.0.json.gz"))["traceEvents"]
    host = {e["args"]["correlation"] for e in kineto
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    launched = [e for e in kineto if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                and e.get("args", {}).get("correlation") in host]
    starts = [e for e in events if e["ph"] == "s" and e["cat"] == "launch"]
    ends = [e for e in events if e["ph"] == "f" and e["cat"] == "launch"]
    assert len(starts) == len(ends) == len(launched) == 4356
    assert all(s["tid"] < 100000 <= f["tid"] for s, f in zip(starts, ends))  # CPU track -> GPU track


def test_timeline_names_collectives_and_their_bytes(tmp_path):
    out = tmp_path / "t.json"
    assert cli_main(["replay", str(CPU_DDP / "device.{rank}.json.gz"), "--et", str(CPU_DDP / "host.{rank}.json.gz"),
                     "--timeline", str(out)]) == 0
    events = orjson.loads(out.read_bytes())["traceEvents"]
    colls = [e for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    assert len(colls) == 24                                   # 12 per rank (9 all-reduces, 3 broadcasts)
    assert {e["args"]["comm type"] for e in colls} == {"ALL_REDUCE", "BROADCAST"}
    # the first broadcast sends a 16,384-float tensor: 65,536 bytes
    bcast = min((e for e in colls if e["args"]["comm type"] == "BROADCAST"), key=lambda e: e["ts"])
    assert bcast["args"]["bytes"] == 16384 * 4 and bcast["args"]["input shapes"] == [[16384]]
