"""Write the GPU's identity and state to JSON: torch device properties, versions, and what `nvidia-smi`
reports (clocks, power limit, temperature, ECC) at the moment of the call.

    python examples/device_info.py OUT.json
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

SMI_FIELDS = ("name,driver_version,pci.bus_id,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
              "clocks.applications.graphics,power.draw,power.limit,enforced.power.limit,temperature.gpu,"
              "pstate,ecc.mode.current,compute_mode,mig.mode.current")


def smi(*args: str) -> str | None:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def main(path: str) -> int:
    info: dict = {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                  "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["device"] = {k: getattr(p, k) for k in ("name", "major", "minor", "total_memory",
                                                     "multi_processor_count", "L2_cache_size")
                          if hasattr(p, k)}
        query = smi(f"--query-gpu={SMI_FIELDS}", "--format=csv")
        if query:
            head, *rows = [line.split(", ") for line in query.strip().splitlines()]
            info["nvidia_smi"] = dict(zip(head, rows[0])) if rows else {}
        info["nvidia_smi_q"] = smi("-q")
    with open(path, "w") as f:
        json.dump(info, f, indent=1, default=str)
    print({k: v for k, v in info.items() if k != "nvidia_smi_q"}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
