"""Coverage-guided fuzzing (atheris / libFuzzer) for a bounded time of four targets: the trace readers
(`tests/fuzz/readers_target.py`), the MoE routing readers (`routing_target.py`: .npy, parquet, JSON
lines, gzip), the sweep / suite TOML loaders (`specs_target.py`) and the model / config.json / hardware
preset / failure-model loaders (`configs_target.py`). A target fails on any exception
other than a one-line TraceInputError, and libFuzzer fails on an input that takes more than 2 GB or
10 s. LUMOS_SIM_FUZZ_SECONDS sets the time per target (default 20 for the trace readers, half that for
the others), LUMOS_SIM_FUZZ_SEED the seed (default 1). Inputs that once crashed a target are kept in
tests/fuzz/crashes/ (named `routing-*` / `spec-*` / `config-*` for the new targets) and start its corpus
(tests/test_fuzz_regressions.py replays them without atheris)."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys

import pytest

from conftest import ROOT

if importlib.util.find_spec("atheris") is None:
    # CI (LUMOS_SIM_REQUIRE_SHARED=1) installs the dev extra, which has atheris on Linux x86_64: there a
    # missing atheris is a broken install, not a reason to skip the fuzzing
    if os.environ.get("LUMOS_SIM_REQUIRE_SHARED") == "1" and (platform.system(), platform.machine()) == ("Linux", "x86_64"):
        pytest.fail("atheris is not installed (pip install -e '.[dev]')", pytrace=False)
    pytest.skip("atheris (the dev extra) is not installed", allow_module_level=True)

FUZZ = ROOT / "tests" / "fuzz"
CRASH_PREFIXES = {"routing": ("routing-",), "specs": ("spec-",), "configs": ("config-",)}

KINETO = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20,
     "args": {"Record function id": 1, "External id": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 5,
     "args": {"correlation": 7, "External id": 1}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
     "args": {"device": 0, "stream": 7, "correlation": 7}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]}


def _attrs(rf_id: int, schema: str) -> list[dict]:
    return [{"name": "rf_id", "type": "uint64", "value": rf_id}, {"name": "fw_parent", "type": "uint64", "value": 0},
            {"name": "seq_id", "type": "int64", "value": -1}, {"name": "scope", "type": "uint64", "value": 0},
            {"name": "tid", "type": "uint64", "value": 1}, {"name": "fw_tid", "type": "uint64", "value": 0},
            {"name": "op_schema", "type": "string", "value": schema}]


EXECUTION_TRACE = {"schema": "1.0.1", "pid": 1, "time": "x", "start_ts": 0, "finish_ts": 10, "nodes": [
    {"id": 1, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 0,
     "inputs": {"values": [], "shapes": [], "types": []}, "outputs": {"values": [], "shapes": [], "types": []},
     "attrs": _attrs(0, "")},
    {"id": 2, "name": "aten::mm", "ctrl_deps": 1,
     "inputs": {"values": [[1, 2, 0, 4, 4, "cpu"], [3, 4, 0, 4, 4, "cpu"]], "shapes": [[2, 2], [2, 2]],
                "types": ["Tensor(float)", "Tensor(float)"]},
     "outputs": {"values": [[5, 6, 0, 4, 4, "cpu"]], "shapes": [[2, 2]], "types": ["Tensor(float)"]},
     "attrs": _attrs(1, "aten::mm(Tensor self, Tensor mat2) -> Tensor")}]}


def crash_target(name: str) -> str:
    """The target a kept crash input belongs to, from its name."""
    for target, prefixes in CRASH_PREFIXES.items():
        if name.startswith(prefixes):
            return target
    return "readers"


def _crashes(directory, target: str) -> None:
    for crash in (FUZZ / "crashes").iterdir():  # what broke a target once, as a start
        if crash_target(crash.name) == target:
            (directory / f"crash-{crash.name}").write_bytes(crash.read_bytes())


def _seed_readers(directory) -> None:
    """One valid small input per reader (the target's first byte picks the reader)."""
    from chakra_schema.graph_io import write_graph
    from chakra_schema.pytorch.converter import RankInputs, convert_rank

    kineto = directory / "kineto.json"
    kineto.write_text(json.dumps(KINETO))
    write_graph(convert_rank(RankInputs(None, str(kineto))), directory / "seed.et")
    (directory / "seed-et").write_bytes(bytes([0]) + (directory / "seed.et").read_bytes())
    (directory / "seed-kineto").write_bytes(bytes([2]) + json.dumps(KINETO).encode())
    (directory / "seed-execution-trace").write_bytes(bytes([4]) + json.dumps(EXECUTION_TRACE).encode())
    kineto.unlink()
    (directory / "seed.et").unlink()


def _seed_routing(directory) -> None:
    """A valid routing input per format (first byte: 0 npy, 1 parquet, 2 jsonl, 3 jsonl.gz, 4 json)."""
    import gzip
    import io

    import numpy as np
    buf = io.BytesIO()
    np.save(buf, np.arange(24, dtype=np.int16).reshape(3, 2, 4) % 8)
    (directory / "seed-npy").write_bytes(bytes([0]) + buf.getvalue())
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        sink = io.BytesIO()
        pq.write_table(pa.table({"indices": pa.array([[1, 2], [3, 4]], pa.list_(pa.int16())),
                                 "domain": pa.array(["code", "math"]), "phase": pa.array(["prefill", "decode"])}), sink)
        (directory / "seed-parquet").write_bytes(bytes([1]) + sink.getvalue())
    except ImportError:
        pass
    megatron = b"\n".join(json.dumps({"step": 0, "layer": layer, "rank": 0, "num_tokens": 2, "topk": 2,
                                       "top_indices": [[1, 2], [3, 4]]}).encode() for layer in (0, 1))
    tokens = b"\n".join(json.dumps({"layer": 0, "token_idx": t, "experts": [t, t + 1], "gating_probs": [0.6, 0.4],
                                     "domain": "code"}).encode() for t in range(3))
    (directory / "seed-megatron").write_bytes(bytes([2]) + megatron)
    (directory / "seed-tokens").write_bytes(bytes([4]) + tokens)
    (directory / "seed-gz").write_bytes(bytes([3]) + gzip.compress(tokens, mtime=0))


def _seed_specs(directory) -> None:
    """A sweep spec with every static axis kind (first byte 0) and a check suite (first byte 1)."""
    spec = (b'[sweep]\nname = "s"\n[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h100-sxm"\n'
            b'plan = { tp = 8, dp = 1, seq_len = 4096, global_batch = 8 }\n'
            b'[axes.nic]\ngrid = { "hardware.network.nic_gbps" = [200, 400] }\n'
            b'[axes.tp]\nzip = { "plan.tp" = [8, 4], "plan.dp" = [1, 2] }\n'
            b'[axes.mb]\nlist = [{ "plan.micro_batch" = 1, label = "mb1" }]\n')
    (directory / "seed-sweep").write_bytes(bytes([0]) + spec)
    suite = (b'[suite]\nname = "x"\n[[case]]\nname = "a"\ninputs = ["{suite_dir}/t.json"]\ntiming = "trace"\n'
             b'tolerance = 0.05\nmean_tolerance = 0.02\nmeasured_ms = { "ProfilerStep#1" = 5.0 }\n'
             b'steps = ["ProfilerStep#1"]\nranks = [0]\n')
    (directory / "seed-suite").write_bytes(bytes([1]) + suite)


def _seed_configs(directory) -> None:
    """A valid file per loader (first byte: 0 model TOML, 1 config.json, 2 hardware preset, 3 failure model)."""
    (directory / "seed-model").write_bytes(bytes([0]) + (ROOT / "estimators" / "zoo" / "deepseek-v3.toml").read_bytes())
    hf = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 32,
          "num_key_value_heads": 4, "vocab_size": 151936, "intermediate_size": 6144, "moe_intermediate_size": 768,
          "num_experts": 128, "num_experts_per_tok": 8, "layer_types": ["full_attention"] * 4}
    (directory / "seed-hf").write_bytes(bytes([1]) + json.dumps(hf).encode())
    preset = ROOT / "replay" / "hardware" / "presets" / "h100-sxm-roofline.toml"
    (directory / "seed-preset").write_bytes(bytes([2]) + preset.read_bytes())
    failures = ROOT / "estimators" / "failures" / "presets" / "llama3-405b.toml"
    (directory / "seed-failures").write_bytes(bytes([3]) + failures.read_bytes())


# target -> (file, corpus seeder, default seconds)
TARGETS = {"readers": ("readers_target.py", _seed_readers, 20), "routing": ("routing_target.py", _seed_routing, 10),
           "specs": ("specs_target.py", _seed_specs, 10), "configs": ("configs_target.py", _seed_configs, 10)}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzzing_finds_no_crash(tmp_path, target):
    script, seed_corpus, default_seconds = TARGETS[target]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seed_corpus(corpus)
    _crashes(corpus, target)
    seconds = int(os.environ.get("LUMOS_SIM_FUZZ_SECONDS", str(default_seconds)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # a fixed seed: CI explores the same inputs each run (a prefix of them on a slower machine), so a
    # new finding shows up in a fuzzing campaign (tests/fuzz/readers_target.py), not as a flaky CI run
    seed = os.environ.get("LUMOS_SIM_FUZZ_SEED", "1")
    p = subprocess.run([sys.executable, str(FUZZ / script), f"-seed={seed}", f"-max_total_time={seconds}", "-rss_limit_mb=2048",
                        "-timeout=10", "-max_len=4096", f"-artifact_prefix={tmp_path}/", str(corpus)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=seconds + 120)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]
    runs = re.search(r"Done (\d+) runs in (\d+) second", log)
    assert runs, log[-2000:]
    print(f"atheris: {runs.group(1)} executions in {runs.group(2)} s")
    assert int(runs.group(1)) > 100   # the target ran, rather than dying at start-up
