"""Held-out H100 check: model-mode step error of the uncalibrated roofline (h100-sxm-roofline) and of the
default h100-sxm preset (calibrated on tests/data/h100, not on heldout/), on two training steps of other
models that no fit has seen (tests/data/h100/heldout, see its README).

    python benchmarks/h100_heldout.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chakra_schema.inputs import load_graphs  # noqa: E402
from lumos_sim.replay_run import run_replay  # noqa: E402

H100 = ROOT / "tests" / "data" / "h100"
PRESETS = {"h100-sxm-roofline (uncalibrated)": "h100-sxm-roofline", "h100-sxm (default, calibrated)": "h100-sxm"}


def main() -> int:
    print(f"{'trace':28s} {'preset':32s} step errors (model mode vs measured)")
    for folder in sorted((H100 / "heldout").glob("llama_*")):
        graphs = load_graphs([str(folder / "device.{rank}.json.gz")], et_pattern=str(folder / "host.{rank}.json.gz"))
        for label, preset in PRESETS.items():
            result = run_replay(graphs, "model", preset)
            errors = ", ".join(f"{100 * s.error:+.1f}%" for s in result.steps if s.error is not None)
            print(f"{folder.name:28s} {label:32s} {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
