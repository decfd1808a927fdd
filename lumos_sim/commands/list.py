"""`lumos-sim list models | hardware`: the names `--model` and `--hardware` accept."""
from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("list", help="list the model zoo or the hardware presets (names for --model / --hardware)",
                       description="List the names that --model (the model zoo) and --hardware (the "
                                   "hardware presets) accept, with their headline figures.")
    p.add_argument("what", choices=("models", "hardware"), help="models: the model zoo; hardware: the presets")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.what == "hardware":
        from lumos_sim.commands.bench import _presets
        from replay.hardware.config import user_preset_dir
        rc = _presets(args)
        if not args.json:
            print(f"user presets (calibrate --install NAME): {user_preset_dir()}")
        return rc
    from estimators.model_config import ZOO_DIR, load_model_file, zoo_names
    rows = []
    for name in zoo_names():
        m = load_model_file(ZOO_DIR / f"{name}.toml")
        rows.append({"name": name, "display_name": m.display_name or m.name, "params_b": m.param_count() / 1e9,
                     "active_params_b": m.active_param_count() / 1e9, "layers": m.layers, "hidden": m.hidden,
                     "experts": m.moe.num_experts if m.moe else 0})
    if args.json:
        sys.stdout.write(json.dumps(rows, sort_keys=True) + "\n")
        return 0
    from lumos_sim.tables import console, table
    t = table("model zoo (lumos-sim whatif parallelism --model NAME)",
              ("name", "model", "params (B)", "active (B)", "layers", "hidden", "experts"),
              right=("params (B)", "active (B)", "layers", "hidden", "experts"), whole=("name",))
    for r in rows:
        t.add_row(r["name"], r["display_name"], f"{r['params_b']:,.1f}", f"{r['active_params_b']:,.1f}",
                  str(r["layers"]), f"{r['hidden']:,}", str(r["experts"] or "-"))
    console().print(t)
    return 0
