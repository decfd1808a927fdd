"""Regression tests for issue 21 (hardening, third pass) and two items of issue 22: the new surfaces (MoE
routing readers, sweeps, check) keep the promise that bad input is a one-line error naming the file
(exit 2), memory is bounded, and nothing is lost. One test per defect, named after the behaviour; each
failed on the code before the fix."""
from __future__ import annotations

import fcntl
import gzip
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.safe_io import set_max_input_bytes
from conftest import DATA, ROOT
from lumos_sim.cli import main

CPU_DDP = DATA / "cpu_ddp"
SPEC = """[scenario]
whatif = "parallelism"
model = "llama3-8b"
hardware = "h100-sxm"
plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }
"""


def cli(*argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return int(e.code)


def one_line_error(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def run_cli(*argv, cwd=None, timeout=120, env=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "lumos_sim", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def read_routing(path):
    """Load a routing trace and stream every chunk (errors may come from either)."""
    from estimators.moe.routing import load_routing
    src = load_routing(path)
    for _ in src.chunks():
        pass
    return src


def write_layers(folder: Path, columns_per_layer: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder.mkdir(exist_ok=True)
    for n, cols in enumerate(columns_per_layer):
        pq.write_table(pa.table(cols), folder / f"layer_{n}.parquet")
    return folder


def jsonl(path: Path, records: list, gz: bool = False) -> Path:
    text = "\n".join(json.dumps(r) if not isinstance(r, str) else r for r in records).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


# ------------------------------------------------------------------------------------- defect 1
def test_routing_ids_that_would_wrap_truncate_or_parse_are_errors_naming_file_layer_and_row(tmp_path):
    """4294967299 was read as 3 (int32 cast), 3.9 as 3, "7" as 7: silently wrong loads."""
    pa = pytest.importorskip("pyarrow")
    big = write_layers(tmp_path / "big", [{"indices": pa.array([[0, 1], [2, 4294967299]], pa.list_(pa.int64()))}])
    with pytest.raises(TraceInputError, match=r"layer 0 row 1: expert id 4294967299") as e:
        read_routing(big)
    assert str(big / "layer_0.parquet") in str(e.value)
    meg = jsonl(tmp_path / "m.jsonl", [{"step": 0, "layer": 3, "rank": 0, "num_tokens": 1, "topk": 2,
                                        "top_indices": [[1, 3.9]]}])
    with pytest.raises(TraceInputError, match=r"record 1 \(layer 3\): expert ids must be integers") as e:
        read_routing(meg)
    assert str(meg) in str(e.value)
    tok = jsonl(tmp_path / "t.jsonl", [{"layer": 0, "token_idx": 0, "experts": [1, "7"]}])
    with pytest.raises(TraceInputError, match=r"record 1 \(layer 0, token 0\): expert ids must be integers"):
        read_routing(tok)
    layer_str = jsonl(tmp_path / "l.jsonl", [{"layer": "7", "token_idx": 0, "experts": [1, 2]}])
    with pytest.raises(TraceInputError, match=r"record 1: 'layer' must be an integer"):
        read_routing(layer_str)


# ------------------------------------------------------------------------------------- defect 3
def test_gzip_routing_goes_through_the_bounded_reader(tmp_path):
    """A .jsonl.gz of blank lines past the input limit is refused (it used to spin through every line);
    a line longer than the line limit is refused before it is accumulated (it was a MemoryError)."""
    blank = tmp_path / "blank.jsonl.gz"
    blank.write_bytes(gzip.compress(b"\n" * (48 << 20), compresslevel=1))
    set_max_input_bytes(16 << 20)
    try:
        t0 = time.perf_counter()
        with pytest.raises(TraceInputError, match="decompresses to more than 16 MiB"):
            read_routing(blank)
        assert time.perf_counter() - t0 < 10
    finally:
        set_max_input_bytes(None)
    long_line = tmp_path / "long.jsonl.gz"
    long_line.write_bytes(gzip.compress(b'{"layer": 0, "token_idx": 0, "experts": [' + b"1," * (40 << 20) + b"1]}",
                                        compresslevel=1))
    with pytest.raises(TraceInputError, match="line 1 is longer than 64 MiB"):
        read_routing(long_line)


# ------------------------------------------------------------------------------------- defect 4
_PEAK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from bench_input_memory import peak_kib, reset_peak
from chakra_schema.safe_io import read_input_bytes
from chakra_schema.pytorch.execution_trace import load_execution_trace
base = reset_peak()
n = len(read_input_bytes(sys.argv[2])) if sys.argv[3] == "bytes" else len(load_execution_trace(sys.argv[2]).ids)
print(json.dumps({"mib": (peak_kib() - base) / 1024, "n": n}))
"""


def test_a_big_input_is_held_once_not_twice(tmp_path):
    """Peak RSS of reading a 192 MiB (decompressed) gzip input: the bytes once (blocks were joined: the
    list and the joined copy, 2x), and the Execution Trace reader parses node by node from a window
    (it held the bytes and their decoded text: 2x). benchmarks/bench_input_memory.py runs it at 3 GiB."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_input_memory import write_padded_trace
    finally:
        sys.path.pop(0)
    size = 192 << 20
    path = tmp_path / "padded_et.json.gz"
    write_padded_trace(path, size, nodes=256)

    def peak(what: str) -> dict:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'benchmarks'}")
        p = subprocess.run([sys.executable, "-c", _PEAK, str(ROOT), str(path), what], capture_output=True,
                           text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    whole = peak("bytes")
    assert abs(whole["n"] - size) < 1024 and 0.9 * size / (1 << 20) < whole["mib"] < 1.3 * size / (1 << 20), whole
    parsed = peak("et")
    assert parsed["n"] == 256 and parsed["mib"] < 64, parsed


# ------------------------------------------------------------------------------------- defect 5
def _npy_header_only(path: Path, shape) -> Path:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<i4", "fortran_order": False, "shape": shape})
        f.write(b"\0" * 64)
    return path


def _bad_routing_inputs(tmp_path: Path):
    import pyarrow as pa
    yield "corrupt parquet", _corrupt_parquet(tmp_path)
    yield "string index", write_layers(tmp_path / "s", [{"indices": pa.array([["1", "2"]])}])
    yield "null index row", write_layers(tmp_path / "n", [{"indices": pa.array([[1, 2], None], pa.list_(pa.int32()))}])
    yield "null index id", write_layers(tmp_path / "n2", [{"indices": pa.array([[1, None]], pa.list_(pa.int32()))}])
    yield "float index", write_layers(tmp_path / "f", [{"indices": pa.array([[1.5, 2.0]])}])
    yield "empty top-k", write_layers(tmp_path / "e", [{"indices": pa.array([[]], pa.list_(pa.int32()))}])
    for name, experts in (("experts null", None), ("experts number", 5), ("experts dict", {"a": 1})):
        yield name, jsonl(tmp_path / f"{name.replace(' ', '_')}.jsonl", [{"layer": 0, "token_idx": 0, "experts": experts}])
    yield "gating_probs length", jsonl(tmp_path / "g.jsonl", [{"layer": 0, "token_idx": 0, "experts": [1, 2],
                                                              "gating_probs": [0.5]}])
    yield "topk=0", jsonl(tmp_path / "k.jsonl", [{"layer": 0, "topk": 0, "top_indices": [1, 2]}])
    yield ">64-bit id", jsonl(tmp_path / "b.jsonl", ['{"layer": 0, "token_idx": 0, "experts": [1, 123456789012345678901234567890]}'])
    yield ">64-bit layer", jsonl(tmp_path / "bl.jsonl", ['{"layer": 123456789012345678901234567890, "token_idx": 0, "experts": [1]}'])
    gz = gzip.compress(b'{"layer": 0, "token_idx": 0, "experts": [1, 2]}\n' * 1000)
    (tmp_path / "trunc.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    yield "truncated gzip", tmp_path / "trunc.jsonl.gz"
    (tmp_path / "fake.jsonl.gz").write_bytes(b"\x1f\x8bnot really gzip at all")
    yield "not really gzip", tmp_path / "fake.jsonl.gz"
    yield "npy claiming 10^15 tokens", _npy_header_only(tmp_path / "huge.npy", (10**15, 58, 8))
    yield "npy claiming 10^9 layers", _npy_header_only(tmp_path / "wide.npy", (4, 10**9, 8))


def _corrupt_parquet(tmp_path: Path) -> Path:
    folder = tmp_path / "corrupt"
    folder.mkdir()
    (folder / "layer_0.parquet").write_bytes(b"PAR1" + os.urandom(200) + b"PAR1")
    return folder


def test_malformed_routing_inputs_are_one_line_errors_naming_the_file(tmp_path):
    pytest.importorskip("pyarrow")
    tracebacks = []
    for name, path in _bad_routing_inputs(tmp_path):
        try:
            read_routing(path)
            tracebacks.append(f"{name}: accepted")
        except TraceInputError as e:
            if str(path) not in str(e) or "\n" in str(e):
                tracebacks.append(f"{name}: {e}")
        except Exception as e:  # noqa: BLE001 -- any other exception is the defect
            tracebacks.append(f"{name}: {type(e).__name__}: {e}"[:200])
    assert not tracebacks, tracebacks


# ------------------------------------------------------------------------------------- defect 6
def test_a_second_sweep_on_the_same_results_file_is_refused(tmp_path, capsys):
    """Two sweeps on one results file both exited 0 and rows were lost: the results file is locked."""
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC + "[[axes]]\ngrid = { 'plan.micro_batch' = [1, 2] }\n")
    out = tmp_path / "r.parquet"
    fd = os.open(tmp_path / "r.parquet.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a first sweep holds the file
        one_line_error(capsys, cli("sweep", spec, "-o", out), "another sweep is writing this results file", str(out))
        assert not out.exists()
    finally:
        os.close(fd)
    assert cli("sweep", spec, "-o", out, "--json") == 0   # released: the next sweep runs


# ------------------------------------------------------------------------------------- defect 7
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys):
    from chakra_schema.inputs import load_graphs
    from chakra_schema.graph_io import write_graphs
    graphs = load_graphs([str(CPU_DDP / "device.{rank}.json.gz")], et_pattern=str(CPU_DDP / "host.{rank}.json.gz"))
    prefix = tmp_path / "job"
    write_graphs(graphs, prefix)
    et0 = tmp_path / "job.0.et"
    before = et0.read_bytes()
    one_line_error(capsys, cli("jsonize", et0, "-o", et0), "is the input")
    one_line_error(capsys, cli("replay", prefix, "--timeline", et0), "is the input")
    assert et0.read_bytes() == before
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    results = tmp_path / "r.parquet"
    assert cli("sweep", spec, "-o", results, "--json") == 0
    capsys.readouterr()
    table = results.read_bytes()
    one_line_error(capsys, cli("report", results, "-o", results), "is the input")
    assert results.read_bytes() == table


# ------------------------------------------------------------------------------------- defect 9
def test_sizes_past_their_caps_are_refused_before_any_work(tmp_path, capsys):
    t0 = time.perf_counter()
    one_line_error(capsys, cli("bench", "collective", "--concurrent", 10_000_000), "--concurrent")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    one_line_error(capsys, cli("sweep", spec, "-o", tmp_path / "r.parquet", "--workers", 100_000), "--workers must be at most")
    search = tmp_path / "search.toml"
    search.write_text(SPEC + "[[axes]]\nsearch = { gpus = [1000000000000] }\n")
    one_line_error(capsys, cli("sweep", search, "-o", tmp_path / "r.parquet"), "search.gpus", "1,048,576")
    from estimators.moe.synthetic import SyntheticSpec
    with pytest.raises(TraceInputError, match="tokens must be at most"):
        SyntheticSpec.parse("synthetic:tokens=1e12")
    assert time.perf_counter() - t0 < 20
    assert not (tmp_path / "r.parquet").exists()


def test_a_billion_point_grid_is_counted_not_expanded(tmp_path, capsys):
    """--dry-run of a 10^9-point grid answered nothing for 90 s (10,000 points took 95 s to list)."""
    values = ", ".join(str(v) for v in range(1, 1001))
    spec = tmp_path / "huge.toml"
    spec.write_text(SPEC + f"[[axes]]\ngrid = {{ 'hardware.network.nic_gbps' = [{values}], "
                           f"'plan.micro_batch' = [{values}], 'plan.global_batch' = [{values}] }}\n")
    t0 = time.perf_counter()
    assert cli("sweep", spec, "-o", tmp_path / "r.parquet", "--dry-run") == 2   # more than a table holds
    captured = capsys.readouterr()
    assert "1,000,000,000 points" in captured.err and len(captured.out.splitlines()) == 100
    one_line_error(capsys, cli("sweep", spec, "-o", tmp_path / "r.parquet"), "1,000,000,000 points")
    assert time.perf_counter() - t0 < 30
    assert not (tmp_path / "r.parquet").exists()


# ------------------------------------------------------------------------------------- defect 11
def test_sweep_results_never_use_a_predictable_temp_name(tmp_path):
    """The sweep wrote `.NAME.PID.tmp`: anything already at that name (here a folder) broke the write."""
    from lumos_sim.sweeps import sweep
    out = tmp_path / "r.parquet"
    (tmp_path / f".r.parquet.{os.getpid()}.tmp").mkdir()
    df = sweep(load_spec_dict(), output=out, progress=False)
    assert len(df) == 1 and out.is_file()


def load_spec_dict() -> dict:
    return {"scenario": {"whatif": "parallelism", "model": "llama3-8b", "hardware": "h100-sxm",
                         "plan": {"tp": 8, "dp": 1, "seq_len": 4096, "global_batch": 8}}}


def test_calibrate_to_a_folder_is_refused_before_the_fit(tmp_path, capsys, monkeypatch):
    import replay.hardware.calibration as calibration

    def no_fit(*a, **k):
        raise AssertionError("the fit ran before the output was checked")
    monkeypatch.setattr(calibration, "calibrate_traces", no_fit)
    folder = tmp_path / "out.toml"
    folder.mkdir()
    one_line_error(capsys, cli("calibrate", CPU_DDP, "--hardware", "h100-sxm", "-o", folder), "is a directory")


# ------------------------------------------------------------------------------------- defect 12
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("kind", ["sweep", "suite", "model", "hardware", "set"])
def test_deeply_nested_files_and_set_values_are_one_line(tmp_path, capsys, kind):
    f = tmp_path / "deep.toml"
    f.write_text(f"x = {DEEP}\n")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC + "[[axes]]\ngrid = { 'plan.micro_batch' = [1] }\n")
    argv = {"sweep": ["sweep", f, "-o", tmp_path / "r.parquet"],
            "suite": ["check", f],
            "model": ["whatif", "parallelism", "--model", f, "--gpus", 8, "--seq-len", 8, "--global-batch", 8],
            "hardware": ["bench", "gemm", "--hardware", f, "--m", 8, "--n", 8, "--k", 8],
            "set": ["sweep", spec, "-o", tmp_path / "r.parquet", "--set", f"axes.0.grid.plan.micro_batch={DEEP}"]}[kind]
    one_line_error(capsys, cli(*argv))


# ------------------------------------------------------------------------------------- defect 13
@pytest.mark.parametrize("case, needle", [
    ('inputs = ["{suite_dir}/missing.json"]', "case 'a'"),
    ('inputs = ["%s"]\nsteps = "abc"' % (CPU_DDP / "device.0.json.gz"), "'steps' of case 'a' must be a list"),
    ('inputs = ["%s"]\nsteps = ["abc"]' % (CPU_DDP / "device.0.json.gz"), "'steps' of case 'a'"),
    ('inputs = ["%s"]\ntiming = "model"\nhardware = "{suite_dir}/hw.toml"' % (CPU_DDP / "device.0.json.gz"), "case 'a'"),
])
def test_check_says_bad_input_with_exit_2_naming_the_case(tmp_path, capsys, case, needle):
    """It was a failed accuracy case (exit 1), and `steps = "abc"` was silently accepted."""
    (tmp_path / "hw.toml").write_text("name = 'x'\n[gpu\n")
    suite = tmp_path / "suite.toml"
    suite.write_text(f'[[case]]\nname = "a"\n{case}\n')
    one_line_error(capsys, cli("check", suite), needle)


# ------------------------------------------------------------------------------------- defect 14
def test_a_ray_start_failure_is_one_line_and_leaves_no_results_file(tmp_path, capsys, monkeypatch):
    ray = pytest.importorskip("ray")

    def fail(*a, **k):
        raise TimeoutError("the raylet did not start in time")
    monkeypatch.setattr(ray, "init", fail)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = tmp_path / "r.parquet"
    one_line_error(capsys, cli("sweep", spec, "-o", out, "--executor", "ray"), "could not start a local Ray instance")
    assert not out.exists()   # a table of pending rows would claim work that nothing does


def test_ray_address_from_the_environment_connects_without_a_cpu_count(tmp_path, capsys, monkeypatch):
    """With RAY_ADDRESS set and no --ray-address, ray.init(num_cpus=...) failed ("num_cpus and num_gpus
    must not be provided" when connecting to a cluster)."""
    ray = pytest.importorskip("ray")
    calls = []

    def init(*a, **k):
        calls.append(k)
        raise ConnectionError("no cluster here")
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = tmp_path / "r.parquet"
    one_line_error(capsys, cli("sweep", spec, "-o", out, "--executor", "ray", "--workers", 2), "auto")
    assert calls and calls[0].get("address") == "auto" and "num_cpus" not in calls[0]
    assert not out.exists()


# ------------------------------------------------------------------------------------- defect 15
def test_a_spec_level_error_fails_the_sweep_instead_of_every_point(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.replace('whatif = "parallelism"', 'whatif = "bogus"')
                    + "[[axes]]\ngrid = { 'plan.micro_batch' = [1, 2] }\n")
    out = tmp_path / "r.parquet"
    one_line_error(capsys, cli("sweep", spec, "-o", out), "unknown what-if 'bogus'", str(spec))
    assert not out.exists()


def test_routing_paths_in_a_sweep_spec_resolve_from_the_spec_folder(tmp_path, monkeypatch):
    from lumos_sim.sweeps import load_spec
    sub = tmp_path / "specs"
    sub.mkdir()
    (sub / "spec.toml").write_text(
        '[scenario]\nwhatif = "moe"\nmodel = "deepseek-v3"\nhardware = "h100-sxm"\n'
        '[scenario.moe]\nrouting = "routing/r.npy"\n'
        '[[axes]]\ngrid = { "moe.expert_load" = ["loads.json"] }\n'
        '[[axes]]\nlist = [{ "moe.routing" = "other.npy" }, { "moe.routing" = "synthetic:skew=1" }]\n')
    monkeypatch.chdir(tmp_path)   # not the spec's folder
    points = load_spec(sub / "spec.toml", ["axes.0.grid.moe.expert_load=['cwd.json']"]).points()
    assert [p.scenario.moe.routing for p in points] == [str(sub / "other.npy"), "synthetic:skew=1"]
    assert points[0].scenario.moe.expert_load == "cwd.json"   # a --set value is the user's, from here
    base = load_spec(sub / "spec.toml").base
    assert base.moe.routing == str(sub / "routing" / "r.npy")


# ------------------------------------------------------------------------------------- issue 22
def test_calibrated_presets_and_moe_reports_get_the_umask_permissions(tmp_path, monkeypatch):
    """mkstemp's 0600 was left on calibrate presets and moe.html: they are ordinary files (0644)."""
    import replay.hardware.calibration as calibration
    sys.path.insert(0, str(ROOT / "examples" / "sweeps"))
    try:
        import moe_placement
    finally:
        sys.path.pop(0)
    old = os.umask(0o022)
    try:
        monkeypatch.setattr(calibration, "preset_toml", lambda result, name, tool: 'name = "mine"\nextends = "h100-sxm"\n')
        preset = calibration.write_preset(None, tmp_path / "mine.toml")
        import plotly.graph_objects as go
        moe_placement.write_html(go.Figure(), tmp_path / "moe.html")
    finally:
        os.umask(old)
    for f in (preset, tmp_path / "moe.html"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp file left


def test_named_sweep_axes_are_set_by_name_or_by_position(tmp_path):
    from lumos_sim.sweeps import load_spec
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC + "[axes.nic]\ngrid = { 'hardware.network.nic_gbps' = [200, 400] }\n"
                           "[axes.mb]\ngrid = { 'plan.micro_batch' = [1, 2] }\n")
    pts = load_spec(spec).points()
    assert [(p.scenario.hardware.network.nic_gbps, p.scenario.plan.micro_batch) for p in pts] == \
        [(200, 1), (200, 2), (400, 1), (400, 2)]
    by_name = load_spec(spec, ["axes.nic.grid.hardware.network.nic_gbps=[800]"]).points()
    by_position = load_spec(spec, ["axes.0.grid.hardware.network.nic_gbps=[800]"]).points()
    assert [p.key for p in by_name] == [p.key for p in by_position]
    assert {p.scenario.hardware.network.nic_gbps for p in by_name} == {800} and len(by_name) == 2
    with pytest.raises(TraceInputError, match="not an axis index"):
        load_spec(spec, ["axes.5.grid.plan.tp=[1]"])


def _routing_npy(tmp_path: Path, tokens: int = 256) -> Path:
    """A small DeepSeek-V3-shaped routing trace: [tokens, 58 MoE layers, top-8 of 256 experts]."""
    rng = np.random.default_rng(0)
    ids = np.argsort(rng.random((tokens, 58, 256)), axis=2)[:, :, :8].astype(np.int32)
    path = tmp_path / "routing.npy"
    np.save(path, ids)
    return path


@pytest.mark.parametrize("tokens", [1_000_000_000, 10**20])
def test_routed_tokens_beyond_a_gpus_memory_are_refused_before_any_work(tmp_path, capsys, tokens):
    """Issue 21 item 9: --tokens 1e9 with trace routing. 1e9 tokens x 7168 hidden x 1 byte = 7,168 GB, more
    than an H100's 80 GB: refused as one line (10**20 overflowed int64 and printed a different tokens/s)."""
    t0 = time.perf_counter()
    code = cli("whatif", "moe", "--model", "deepseek-v3", "--ep", 64, "--routing", _routing_npy(tmp_path),
               "--tokens", tokens)
    one_line_error(capsys, code, f"{tokens:,} routed tokens per GPU", "7168 x 1 byte", "80 GB")
    assert time.perf_counter() - t0 < 20


def test_the_largest_batch_that_fits_still_runs(capsys):
    """80 GB / 7168 B = 11,160,714 tokens per GPU fit (at one byte per hidden unit); one more token does not."""
    base = ["whatif", "moe", "--model", "deepseek-v3", "--ep", 64, "--routing", "synthetic:tokens=4096",
            "--set", "moe.sampled_window=4096", "--phase", "prefill", "--json"]
    one_line_error(capsys, cli(*base, "--tokens", 11_160_715), "11,160,715 routed tokens")
    assert cli(*base, "--tokens", 11_160_714) == 0
    assert json.loads(capsys.readouterr().out)["tokens_per_gpu"] == 11_160_714


def test_huge_redundant_expert_counts_are_refused_before_any_work(capsys):
    """Issue 21 item 9: --redundant-experts 100000000 gives 1,562,504 slots per GPU, more than the 256
    experts (at most 256 x 64 - 256 = 16128 redundant on EP64); 1e8 is not an integer (argparse's usage
    and one error line, exit 2, as for every integer flag)."""
    t0 = time.perf_counter()
    argv = ["whatif", "moe", "--model", "deepseek-v3", "--ep", 64, "--placement", "eplb", "--redundant-experts"]
    one_line_error(capsys, cli(*argv, 100_000_000), "1562504 slots per GPU", "at most 16128 redundant on EP64")
    assert cli(*argv, "1e8") == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()   # a bad flag is one line like every other bad input (no usage dump)
    assert "Traceback" not in err and len(lines) == 1 and "--redundant-experts: invalid int value: '1e8'" in lines[0]
    assert time.perf_counter() - t0 < 20


def test_tokens_with_phase_train_are_refused_not_ignored(capsys):
    """Training routes micro-batch x seq-len tokens per rank: a --tokens given with it was silently dropped."""
    code = cli("whatif", "moe", "--model", "deepseek-v3", "--ep", 64, "--phase", "train", "--tokens", 64)
    one_line_error(capsys, code, "tokens does not apply to phase train")


@pytest.mark.parametrize("loader,what", [("estimators.model_config:load_model_file", "model file"),
                                         ("estimators.moe.deployment:load_deployment", "deployment file"),
                                         ("lumos_sim.check:load_suite", "suite file")])
def test_toml_loaders_share_one_reader_with_one_line_errors(tmp_path, loader, what):
    """Model, deployment and suite files go through chakra_schema.errors.read_toml: a missing file, a folder and
    a deeply nested document are each a one-line error naming the path and the kind of file."""
    import importlib
    module, name = loader.split(":")
    load = getattr(importlib.import_module(module), name)
    nested = tmp_path / "deep.toml"
    nested.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    for path, needle in [(tmp_path / "none.toml", f"{what} not found"), (folder, f"is a directory, not a {what}"),
                         (nested, "nested too deeply")]:
        with pytest.raises(TraceInputError) as e:
            load(path)
        assert str(path) in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)
