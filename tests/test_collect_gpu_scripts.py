"""The H100 collection scripts (examples/collect_*.py) run end to end on a CPU with tiny shapes, and what
they write converts and replays: the same scripts produced tests/data/h100 on a GPU."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

def _needs_torch() -> None:
    pytest.importorskip("torch", reason="the collection scripts need PyTorch (optional 'collect' extra)")


def _run(*args: str) -> str:
    _needs_torch()
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "'error'" not in p.stdout, p.stdout
    return p.stdout


def _replays_exactly(folder) -> None:
    from chakra_schema.inputs import load_graphs
    from replay.api import replay

    graphs = load_graphs([str(folder / "device.{rank}.json.gz")], et_pattern=str(folder / "host.{rank}.json.gz"))
    result = replay(graphs)
    assert result.steps and max(result.errors()) < 0.02


def test_kernel_sweep_script_writes_linked_trace_pairs_per_section(tmp_path):
    out = _run("examples/collect_gpu_kernels.py", str(tmp_path), "--small", "--sections", "gemm_bf16,norm,gemm_fp8",
               "--reps", "1")
    assert "needs cuda" in out  # fp8 is GPU-only and says so instead of failing
    for section in ("gemm_bf16", "norm"):
        folder = tmp_path / f"kernels_{section}"
        assert (folder / "device.0.json.gz").exists() and (folder / "host.0.json.gz").exists()
        _replays_exactly(folder)


def test_llama_step_and_moe_layer_scripts_record_steps_and_routing(tmp_path):
    _run("examples/collect_llama_step.py", str(tmp_path), "--small", "--warmup", "1", "--steps", "2")
    _run("examples/collect_moe_layer.py", str(tmp_path), "--small", "--warmup", "1", "--steps", "2")
    _replays_exactly(tmp_path / "llama_small_b2_s32")
    routing = np.load(tmp_path / "moe_t64" / "routing.npy")
    assert routing.shape == (2, 64, 2) and routing.min() >= 0 and routing.max() < 8


def test_the_committed_h100_set_is_what_the_scripts_write():
    h100 = ROOT / "tests" / "data" / "h100"
    for folder in ("kernels_gemm_bf16", "kernels_gemm_fp8", "kernels_attention", "llama_d2048_l16_b8_s2048",
                   "moe_t4096"):
        assert (h100 / folder / "device.0.json.gz").exists() and (h100 / folder / "host.0.json.gz").exists()
    r = np.load(h100 / "moe_t4096" / "routing.npy")
    assert r.shape == (3, 4096, 4) and r.max() < 32
