"""Collect the two PyTorch traces lumos-sim replays, for a few steps of a user's training loop.

`profile_steps` runs `train_step(i)` for `warmup + steps` iterations under `torch.profiler.profile`
with an `ExecutionTraceObserver` attached, so that both traces cover exactly the same `steps` iterations:

    host.<rank>.json.gz    Execution Trace (host op graph: call stack, tensor ids, shapes)
    device.<rank>.json.gz  Kineto chrome trace (timed host ops, kernels, ProfilerStep#N annotations)

The profiler starts and stops the observer itself at the edges of its active window, and both record
the same RecordFunction calls, so every ET node's `rf_id` attr equals the `args["Record function id"]`
of the matching Kineto event; `link_report` counts how many do.

torch is an optional dependency (the 'collect' extra): it is imported only inside the functions here.
"""
from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson


class TorchMissingError(RuntimeError):
    """torch is not installed; the message is one line saying how to get it."""


def require_torch():
    """Import and return torch, or raise TorchMissingError with a one-line install hint."""
    try:
        import torch
        import torch.profiler  # noqa: F401  (submodule, imported for its side effect on `torch`)
    except ImportError as e:
        raise TorchMissingError(
            f"trace collection needs PyTorch, which is not installed ({e}); "
            "install the optional extra: pip install 'lumos-sim[collect]'") from None
    return torch


@dataclass(frozen=True)
class LinkReport:
    """How the two traces of one rank line up (see `link_report`)."""
    profiler_steps: list[str]  # ProfilerStep#N names in the Kineto trace, in time order
    step_durations_us: list[float]
    et_nodes: int
    et_rf_ids: int  # distinct rf_ids of real ET ops (synthetic roots and pg init excluded)
    kineto_rf_ids: int  # Kineto events carrying args["Record function id"]
    linked: int  # ET rf_ids found among Kineto record function ids

    @property
    def fully_linked(self) -> bool:
        return self.et_rf_ids > 0 and self.linked == self.et_rf_ids


@dataclass(frozen=True)
class CollectResult:
    rank: int
    host_path: Path
    device_path: Path
    link: LinkReport


def current_rank(rank: int | None = None) -> int:
    """`rank` if given, else the torch.distributed rank when a process group is up, else 0."""
    if rank is not None:
        return rank
    torch = require_torch()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def profile_steps(train_step: Callable[[int], None], out_dir: str | os.PathLike, rank: int | None = None,
                  warmup: int = 1, steps: int = 3, record_shapes: bool = True) -> CollectResult:
    """Run `train_step(i)` for i in 0..warmup+steps-1, profiling the last `steps` calls.

    Warm-up iterations run under the profiler but are not recorded (they absorb one-off costs: lazy
    init, allocator growth, the first DDP bucket rebuild). Writes host.<rank>.json.gz and
    device.<rank>.json.gz into `out_dir` atomically (temp file + rename): never a half-written file.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps} warmup={warmup}")
    torch = require_torch()
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    rank = current_rank(rank)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    host_path, device_path = out / f"host.{rank}.json.gz", out / f"device.{rank}.json.gz"

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)

    # Work files live in a private temp dir beside the outputs, so the final rename stays on one filesystem.
    work = Path(tempfile.mkdtemp(prefix=f".collect.{rank}.", dir=out))
    try:
        et_raw, kineto_tmp = work / "host.json", work / "device.json.gz"
        et = ExecutionTraceObserver().register_callback(str(et_raw))
        saved = []

        def on_trace_ready(prof) -> None:
            prof.export_chrome_trace(str(kineto_tmp))  # a .gz suffix makes torch compress it
            saved.append(True)

        with profile(activities=activities, record_shapes=record_shapes,
                     schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                     on_trace_ready=on_trace_ready, execution_trace_observer=et) as prof:
            for i in range(warmup + steps):
                train_step(i)
                prof.step()  # closes ProfilerStep#i, advances the schedule, opens ProfilerStep#i+1
        # Leaving the profiler unregisters the observer, which finalizes et_raw.
        if not saved or not et_raw.exists():
            raise RuntimeError("the profiler did not produce both traces")

        host_tmp = work / "host.json.gz"
        with open(et_raw, "rb") as src, gzip.open(host_tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        link = link_report(host_tmp, kineto_tmp)
        os.replace(host_tmp, host_path)
        os.replace(kineto_tmp, device_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return CollectResult(rank, host_path, device_path, link)


def _load_json(path: str | os.PathLike) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return orjson.loads(data)


def link_report(host_path: str | os.PathLike, device_path: str | os.PathLike) -> LinkReport:
    """Count ProfilerSteps in the Kineto trace and how many ET rf_ids have a Kineto event (no torch needed)."""
    et, kineto = _load_json(host_path), _load_json(device_path)
    et_rf = set()
    for node in et.get("nodes", []):
        name = node.get("name", "")
        if name.startswith("[pytorch|profiler|execution_trace|") or name == "## process_group:init ##":
            # Synthetic roots (rf_id 0) and the process-group record the observer writes when it starts,
            # just before Kineto starts: neither can have a Kineto twin.
            continue
        for attr in node.get("attrs", []):
            if attr.get("name") == "rf_id":
                et_rf.add(int(attr["value"]))
                break
    k_rf = set()
    steps = []
    for ev in kineto.get("traceEvents", []):
        args = ev.get("args") or {}
        if "Record function id" in args:
            k_rf.add(int(args["Record function id"]))
        if (ev.get("ph") == "X" and ev.get("cat") != "gpu_user_annotation"
                and str(ev.get("name", "")).startswith("ProfilerStep#")):
            steps.append((float(ev["ts"]), ev["name"], float(ev.get("dur", 0.0))))
    steps.sort()
    return LinkReport(profiler_steps=[s[1] for s in steps], step_durations_us=[s[2] for s in steps],
                      et_nodes=len(et.get("nodes", [])), et_rf_ids=len(et_rf), kineto_rf_ids=len(k_rf),
                      linked=len(et_rf & k_rf))
