"""Coverage-guided fuzz target (atheris) for the configuration files the what-ifs read: a model TOML
(`estimators.model_config.load_model_file`), a Hugging Face config.json (`load_hf_config`), a hardware
preset TOML (`replay.hardware.config.load_hardware_file`, then one GEMM and one all-reduce on it) and a
failure-model TOML (`estimators.failures.model.load_failure_model_file`). Any input must load (and its
model count its parameters, its preset time the two ops) or end in a one-line `TraceInputError`.

    python tests/fuzz/configs_target.py -max_total_time=600 -rss_limit_mb=2048 [CORPUS_DIR]

`fuzz_one(data)`: the first byte picks the loader, the rest is the file.
"""
from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from atheris_main import load_as_file, run_atheris  # noqa: E402

_DIR = tempfile.mkdtemp(prefix="lumos-fuzz-configs-")


def _model_toml(path: str) -> None:
    from estimators.model_config import load_model_file
    m = load_model_file(path)
    m.param_count(), m.model_flops_per_token(4096)


def _hf_config(path: str) -> None:
    from estimators.model_config import load_hf_config
    m = load_hf_config(path)
    m.param_count(), m.model_flops_per_token(4096)


def _hardware(path: str) -> None:
    from chakra_schema.graph import CommType
    from replay.hardware.compute import ComputeModel
    from replay.hardware.config import load_hardware_file
    from replay.hardware.network import NetworkModel
    hw = load_hardware_file(path)
    ComputeModel(hw).gemm(4096, 4096, 4096, dtype="bf16")
    NetworkModel(hw).estimate(CommType.ALL_REDUCE, 1 << 20, range(16))


def _failure_model(path: str) -> None:
    from estimators.failures.model import load_failure_model_file
    load_failure_model_file(path)


LOADERS = ((_model_toml, "model.toml"), (_hf_config, "config.json"), (_hardware, "hw.toml"),
           (_failure_model, "failures.toml"))


def fuzz_one(data: bytes) -> None:
    load_as_file(data, LOADERS, _DIR)


def main(argv: list[str]) -> None:
    run_atheris(argv, fuzz_one, [
        "chakra_schema.errors",
        "estimators.hf_config",
        "estimators.model_config",
        "estimators.failures.model",
        "replay.hardware.config",
    ])


if __name__ == "__main__":
    main(sys.argv)
