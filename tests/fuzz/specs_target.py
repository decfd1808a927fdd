"""Coverage-guided fuzz target (atheris) for the TOML loaders of sweeps and accuracy suites: a sweep spec
(`lumos_sim.sweeps.load_spec`, then its point count and first points) and a `check` suite
(`lumos_sim.check.load_suite`). Any input must load or end in a one-line `TraceInputError`.

    python tests/fuzz/specs_target.py -max_total_time=600 -rss_limit_mb=2048 [CORPUS_DIR]

`fuzz_one(data)`: the first byte picks the loader, the rest is the TOML file. Points are expanded only
for grid / zip / list axes (a search axis ranks plans: seconds per GPU count, not a parsing question).
"""
from __future__ import annotations

import itertools
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from atheris_main import load_as_file, run_atheris  # noqa: E402

_DIR = tempfile.mkdtemp(prefix="lumos-fuzz-specs-")


def _sweep(path: str) -> None:
    from lumos_sim.sweeps import SearchAxis, load_spec
    spec = load_spec(path)
    spec.count()
    if not any(isinstance(a, SearchAxis) for a in spec.axes):
        for _ in itertools.islice(spec.iter_points(), 3):
            pass


def _suite(path: str) -> None:
    from lumos_sim.check import load_suite
    load_suite(path)


LOADERS = ((_sweep, "spec.toml"), (_suite, "spec.toml"))


def fuzz_one(data: bytes) -> None:
    load_as_file(data, LOADERS, _DIR)


def main(argv: list[str]) -> None:
    run_atheris(argv, fuzz_one, [
        "chakra_schema.errors",
        "estimators.scenario",
        "lumos_sim.check",
        "lumos_sim.sweeps",
    ])


if __name__ == "__main__":
    main(sys.argv)
