"""Deployment files: an expert-parallel serving layout as published, in TOML (examples/deployments/).

One `[deployment]` table; every key is optional except `model` and `ep`, and mirrors a
`lumos-sim whatif moe` flag (a flag given on the command line wins over the file):

    model, hardware, ep, gpus_per_node, placement, redundant_experts, groups, groups_per_token, phase,
    tokens, context, precision, kv_dtype, attention_tp, overlap, mtp_acceptance, mtp_acceptance_length,
    mtp_draft_tokens, routing, expert_load, group_by, fit

plus statements of the published layout that are checked, not assumed (a mismatch is an error):
`routed_slots_per_gpu` ((experts + redundant) / ep), `shared_experts_per_gpu` (the model's shared
experts, replicated on every GPU), `attention_dp` (ep / attention_tp); and free text `source`,
`description`. Paths (`expert_load`, a routing file) resolve from the file's folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from chakra_schema.errors import TraceInputError, read_toml
from estimators.moe.options import MAX_DRAFT_TOKENS


FIELDS: dict[str, type] = {
    "model": str, "hardware": str, "ep": int, "gpus_per_node": int, "placement": str, "redundant_experts": int,
    "groups": int, "groups_per_token": int, "phase": str, "tokens": int, "context": int, "precision": str,
    "attention_tp": int, "overlap": str, "mtp_acceptance": float, "routing": str, "expert_load": str,
    "group_by": str, "fit": str, "kv_dtype": str, "mtp_acceptance_length": float, "mtp_draft_tokens": int,
}
FLOAT_RANGES = {"mtp_acceptance_length": (0.0, 1.0 + MAX_DRAFT_TOKENS)}   # other numbers are rates in [0, 1]
CHECKS = ("routed_slots_per_gpu", "shared_experts_per_gpu", "attention_dp")
TEXT = ("source", "description")
MAX_INT = 1 << 20


def load_deployment(path: str | Path) -> dict[str, Any]:
    """The file's settings (FIELDS keys) plus its stated checks (CHECKS keys), typed and range-checked."""
    p = Path(path)
    data = read_toml(p, "deployment file")
    table = data.get("deployment")
    if not isinstance(table, dict) or set(data) - {"deployment"}:
        raise TraceInputError(p, "a deployment file has one [deployment] table and nothing else")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in TEXT:
            if not isinstance(value, str):
                raise TraceInputError(p, f"'{key}' must be a string")
            continue
        want = FIELDS.get(key, int if key in CHECKS else None)
        if want is None:
            raise TraceInputError(p, f"unknown key '{key}' (known: {', '.join([*FIELDS, *CHECKS, *TEXT])})")
        if want is int and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT):
            raise TraceInputError(p, f"'{key}' must be an integer in [0, {MAX_INT}], got {value!r}")
        if want is float:
            lo, hi = FLOAT_RANGES.get(key, (0.0, 1.0))
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
                raise TraceInputError(p, f"'{key}' must be a number in [{lo:g}, {hi:g}], got {value!r}")
            value = float(value)
        if want is str and not isinstance(value, str):
            raise TraceInputError(p, f"'{key}' must be a string, got {value!r}")
        out[key] = value
    for key in ("model", "ep"):
        if key not in out:
            raise TraceInputError(p, f"missing key '{key}'")
    for key in ("model", "routing"):
        if key in out and not str(out[key]).strip():
            raise TraceInputError(p, f"'{key}' must not be empty")
    for key in ("expert_load", "routing"):
        v = out.get(key)
        if v and not v.startswith("synthetic") and not Path(v).is_absolute():
            out[key] = str((p.parent / v))
    model = out["model"]
    if not Path(model).is_absolute() and (p.parent / model).is_file():   # a config file beside the deployment
        out["model"] = str(p.parent / model)
    return out


def check_stated_layout(path: str | Path, stated: dict[str, Any], model, ep: int, redundant: int,
                        attention_tp: int) -> None:
    """The layout a file states must be the one its settings give."""
    E = model.moe.num_experts
    derived = {"routed_slots_per_gpu": (E + redundant) / ep, "shared_experts_per_gpu": model.moe.shared_experts,
               "attention_dp": ep / attention_tp}
    for key in CHECKS:
        if key in stated and stated[key] != derived[key]:
            raise TraceInputError(path, f"states {key} = {stated[key]}, but {E} experts + {redundant} redundant on "
                                        f"EP{ep} (attention TP{attention_tp}) give {derived[key]:g}")
