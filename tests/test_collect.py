"""Trace collection: profile_steps writes linked ET + Kineto traces; the committed CPU DDP traces are usable."""
from __future__ import annotations

import gzip
import importlib.util
import sys

import orjson
import pytest

from conftest import DATA
from lumos_sim.collect import TorchMissingError, link_report, require_torch

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed (optional 'collect' extra)")
CPU_DDP = DATA / "cpu_ddp"


def _load(path):
    with gzip.open(path, "rb") as f:
        return orjson.loads(f.read())


@needs_torch
def test_profile_steps_writes_linked_host_and_device_traces(tmp_path):
    import torch

    from lumos_sim.collect import profile_steps

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    calls = []

    def train_step(step: int) -> None:
        calls.append(step)
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    result = profile_steps(train_step, tmp_path / "out", rank=5, warmup=1, steps=3)

    assert calls == [0, 1, 2, 3]
    assert result.host_path == tmp_path / "out" / "host.5.json.gz"
    assert result.device_path == tmp_path / "out" / "device.5.json.gz"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["device.5.json.gz", "host.5.json.gz"]

    kineto = _load(result.device_path)
    steps = sorted(e["name"] for e in kineto["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]  # the warm-up step 0 is not recorded

    et = _load(result.host_path)
    et_steps = sorted(n["name"] for n in et["nodes"] if n["name"].startswith("ProfilerStep#"))
    assert et_steps == steps  # both traces cover the same iterations
    assert any(n["name"] == "aten::addmm" for n in et["nodes"])

    link = link_report(result.host_path, result.device_path)
    assert link == result.link
    assert link.et_rf_ids > 50
    assert link.linked == link.et_rf_ids  # every ET op has its Kineto twin


def test_require_torch_says_how_to_install_when_torch_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(TorchMissingError, match=r"lumos-sim\[collect\]"):
        require_torch()


def test_collect_cli_rejects_bad_invocations_with_one_line_errors(tmp_path, capsys):
    from lumos_sim.cli import main

    assert main(["collect", str(tmp_path / "missing.py"), "-o", str(tmp_path / "out")]) == 2
    assert "no such script file" in capsys.readouterr().err
    script = tmp_path / "no_step.py"
    script.write_text("x = 1\n")
    assert main(["collect", str(script)]) == 2
    assert "-o/--out OUT_DIR is required" in capsys.readouterr().err
    if HAS_TORCH:
        assert main(["collect", str(script), "-o", str(tmp_path / "out")]) == 2
        assert "defines no train_step" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("rank", [0, 1])
def test_committed_cpu_ddp_traces_have_profiler_steps_and_gloo_collectives(rank):
    host, device = CPU_DDP / f"host.{rank}.json.gz", CPU_DDP / f"device.{rank}.json.gz"
    kineto, et = _load(device), _load(host)

    assert kineto["distributedInfo"]["rank"] == rank
    assert kineto["distributedInfo"]["world_size"] == 2
    events = kineto["traceEvents"]
    steps = [e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 3
    assert all(s["dur"] > 10_000 for s in steps)  # tens of ms each: timing noise stays small

    main_tid = steps[0]["tid"]
    launches = [e for e in events if e.get("name") == "c10d::allreduce_"]
    runs = [e for e in events if e.get("name") == "gloo:all_reduce"]
    assert len(launches) == len(runs) == 9  # 3 DDP buckets x 3 steps
    assert all(e["tid"] == main_tid for e in launches)
    assert all(e["tid"] != main_tid for e in runs)  # gloo runs them on its worker threads

    assert et["schema"].startswith("1.")
    assert sum(n["name"] == "c10d::allreduce_" for n in et["nodes"]) == 9
    link = link_report(host, device)
    assert link.profiler_steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert link.linked == link.et_rf_ids > 1000
