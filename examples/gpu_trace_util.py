"""Shared helpers for the GPU collection scripts (collect_gpu_kernels.py, collect_llama_step.py,
collect_moe_layer.py).

Self-contained on purpose: these scripts also run on bare GPU machines that have torch but not
lumos-sim's own dependencies (orjson etc.), so nothing here imports lumos_sim. The layout written is the
one `lumos-sim convert` reads (see lumos_sim/collect.py, which does the same for a user's own loop):

    OUT/host.0.json.gz    Execution Trace (host op graph with shapes)
    OUT/device.0.json.gz  Kineto chrome trace (timed host ops, kernels, ProfilerStep#N annotations)
"""
from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def sync(device: torch.device) -> None:
    """Wait for the GPU so that a ProfilerStep ends after its kernels, not after their launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_loop(step_fn: Callable[[int], None], out_dir: str | os.PathLike, *, steps: int,
                 wait: int = 0, warmup: int = 0, rank: int = 0) -> dict:
    """Run step_fn(i) for wait + warmup + steps iterations under torch.profiler with an ET observer.

    Only the last `steps` iterations are recorded (ProfilerStep#N, N counting from 0 at the first call).
    Outputs are written to a temp dir beside OUT and renamed into place: never a half-written file.
    Returns a small summary (file sizes, wall time).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    work = Path(tempfile.mkdtemp(prefix=".collect.", dir=out))
    t0 = time.perf_counter()
    try:
        et_raw, kineto_tmp = work / "host.json", work / "device.json.gz"
        et = ExecutionTraceObserver().register_callback(str(et_raw))
        saved = []

        def on_trace_ready(prof) -> None:
            prof.export_chrome_trace(str(kineto_tmp))  # .gz suffix: torch compresses it
            saved.append(True)

        with profile(activities=activities, record_shapes=True,
                     schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
                     on_trace_ready=on_trace_ready, execution_trace_observer=et) as prof:
            for i in range(wait + warmup + steps):
                step_fn(i)
                prof.step()
        if not saved or not et_raw.exists():
            raise RuntimeError("the profiler did not produce both traces")
        host_tmp = work / "host.json.gz"
        with open(et_raw, "rb") as src, gzip.open(host_tmp, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        host_path, device_path = out / f"host.{rank}.json.gz", out / f"device.{rank}.json.gz"
        os.replace(host_tmp, host_path)
        os.replace(kineto_tmp, device_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"out": str(out), "seconds": round(time.perf_counter() - t0, 2),
            "host_bytes": host_path.stat().st_size, "device_bytes": device_path.stat().st_size}
