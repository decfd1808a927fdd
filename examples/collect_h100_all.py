"""Run every GPU ground-truth collection in one go: device properties, the kernel sweep, the Llama
training step and the MoE layer; write them into OUT_DIR and (optionally) pack them into a few .tar files.

    python examples/collect_h100_all.py OUT_DIR [--small] [--tar-dir DIR] [--budget 480]

Each section runs as its own process with a time limit, so a crash or a hang in one (an out-of-memory
shape, a backend that rejects a dtype) loses only that section; sections write their results as they
finish. A summary table (section, status, seconds, bytes) ends the output, and OUT_DIR/run_summary.json
keeps it. --small (implied without a GPU) runs tiny shapes everywhere; the test suite uses it on CPU.
--tar-dir packs OUT_DIR's sub-folders into at most 7 uncompressed tars of <= 15 MB each (the traces are
gzipped already), for carrying results off a machine that returns only a few files.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAR_LIMIT = 15 * 2 ** 20


def device_info(out_dir: Path) -> dict:
    """torch / CUDA versions, device properties and `nvidia-smi -q` (full text and clocks) as JSON."""
    import torch
    info: dict = {"collected_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "python": platform.python_version(), "platform": platform.platform(),
                  "torch": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                  "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["device"] = {k: (getattr(p, k) if isinstance(getattr(p, k), (int, float, str, bool)) else str(getattr(p, k)))
                          for k in dir(p) if not k.startswith("_") and not callable(getattr(p, k))}
        info["capability"] = list(torch.cuda.get_device_capability(0))
    queries = {"smi_q": ["nvidia-smi", "-q"], "smi_clocks": ["nvidia-smi", "-q", "-d", "CLOCK,POWER,PERFORMANCE"],
               "smi_csv": ["nvidia-smi", "--format=csv", "--query-gpu=name,driver_version,pci.bus_id,memory.total,"
                           "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,clocks.applications.graphics,"
                           "power.limit,persistence_mode,compute_mode,temperature.gpu"]}
    for key, cmd in queries.items():
        try:
            info[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as e:
            info[key] = f"unavailable: {e}"
    (out_dir / "device_info.json").write_text(json.dumps(info, indent=1))
    return {"torch": info["torch"], "cuda": info["cuda"], "device": info.get("device", {}).get("name", "cpu")}


def run_section(name: str, cmd: list[str], timeout: float, log_dir: Path) -> dict:
    t0 = time.perf_counter()
    log = log_dir / f"log_{name}.txt"
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
            status = "ok" if rc == 0 else f"rc={rc}"
        except subprocess.TimeoutExpired:
            status = f"timeout>{timeout:.0f}s"
    # Echo the section's own JSON lines (its per-shape results) so they show in the caller's log too.
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            print(f"  [{name}] {line[:400]}", flush=True)
    return {"section": name, "status": status, "seconds": round(time.perf_counter() - t0, 1)}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pack(out_dir: Path, tar_dir: Path) -> list[Path]:
    """Greedy-pack OUT_DIR's entries into tars of <= TAR_LIMIT (a bigger single entry gets its own)."""
    tar_dir.mkdir(parents=True, exist_ok=True)
    entries = sorted(out_dir.iterdir(), key=lambda p: p.name)
    bins: list[list[Path]] = []
    sizes: list[int] = []
    for e in entries:
        size = dir_bytes(e) if e.is_dir() else e.stat().st_size
        for i, s in enumerate(sizes):
            if s + size <= TAR_LIMIT:
                bins[i].append(e)
                sizes[i] += size
                break
        else:
            bins.append([e])
            sizes.append(size)
    tars = []
    for i, group in enumerate(bins):
        path = tar_dir / f"h100_part{i}.tar"
        with tarfile.open(path, "w") as tar:
            for e in group:
                tar.add(e, arcname=e.name)
        tars.append(path)
    return tars


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--tar-dir", type=Path, default=None)
    ap.add_argument("--sections", default="kernels,llama,moe")
    ap.add_argument("--kernels-timeout", type=float, default=220)
    ap.add_argument("--llama-timeout", type=float, default=150)
    ap.add_argument("--moe-timeout", type=float, default=90)
    args = ap.parse_args(argv)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    small = ["--small"] if args.small else []
    py = sys.executable
    t0 = time.perf_counter()
    rows = []
    try:
        print("device:", json.dumps(device_info(out)), flush=True)
        rows.append({"section": "device_info", "status": "ok", "seconds": round(time.perf_counter() - t0, 1)})
    except Exception as e:  # noqa: BLE001
        rows.append({"section": "device_info", "status": f"error: {e}"[:200], "seconds": 0.0})
    commands = {
        "kernels": ([py, str(HERE / "collect_gpu_kernels.py"), str(out), *small,
                     "--time-budget", str(args.kernels_timeout - 50)], args.kernels_timeout),
        "llama": ([py, str(HERE / "collect_llama_step.py"), str(out), *small], args.llama_timeout),
        "moe": ([py, str(HERE / "collect_moe_layer.py"), str(out), *small], args.moe_timeout),
    }
    for name in args.sections.split(","):
        cmd, timeout = commands[name]
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        rows.append(run_section(name, cmd, timeout, out))
    (out / "run_summary.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'section':<12} {'status':<16} {'seconds':>8}")
    for r in rows:
        print(f"{r['section']:<12} {r['status']:<16} {r['seconds']:>8}")
    print(f"\n{'entry':<28} {'bytes':>12}")
    for e in sorted(out.iterdir()):
        print(f"{e.name:<28} {dir_bytes(e) if e.is_dir() else e.stat().st_size:>12}")
    if args.tar_dir:
        for t in pack(out, args.tar_dir):
            print(f"tar {t.name}: {t.stat().st_size} bytes", flush=True)
    print(f"total {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
