"""The model zoo: architectures as data (TOML files in `estimators/zoo/`, shipped as package data) plus
user TOML files. The typed `ModelConfig` lives in `estimators.model_config` because estimators may not
import lumos_sim; this module is the CLI-facing loader."""
from __future__ import annotations

from estimators.model_config import (ZOO_DIR, MLAConfig, ModelConfig, MoEConfig, load_model,
                                     load_model_file, model_from_dict, zoo_names)

__all__ = ["ZOO_DIR", "MLAConfig", "ModelConfig", "MoEConfig", "load_model", "load_model_file",
           "model_from_dict", "zoo_names", "zoo_table"]


def zoo_table() -> list[dict]:
    """One row per zoo model: name, layers, hidden, total and active parameters (billions)."""
    rows = []
    for name in zoo_names():
        m = load_model(name)
        rows.append({"name": m.name, "display_name": m.display_name, "layers": m.layers, "hidden": m.hidden,
                     "params_b": m.param_count() / 1e9, "active_params_b": m.active_param_count() / 1e9})
    return rows
