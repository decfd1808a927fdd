"""Every command of the README's fenced bash blocks runs, verbatim, from a checkout: each `&&` step of
each line is run through a shell in a scratch folder that sees the checkout's `tests/` (so outputs such
as `out/job` do not land in the checkout), with `lumos-sim` being this interpreter's `-m lumos_sim`.
The steps that cannot run here are listed in SKIPPED with the reason."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

README = ROOT / "README.md"

# step prefix -> why it is not run by this test
SKIPPED = {
    "python3 -m venv": "creates a virtual environment: CI's .ci/run does this itself",
    ". .venv/bin/activate": "activates that environment (the test runs in the current one)",
    "pip install": "installs from PyPI (network); CI's .ci/run runs the README's install verbatim",
    "python -m pytest": "the whole test suite, which this test is part of (CI runs it verbatim)",
    "lumos-sim check tests/accuracy": "the accuracy suites (minutes): CI runs this command verbatim first",
    "command -v chromium": "installs Debian's chromium when missing (root, package registry): .ci/run runs it verbatim",
    "apt-get install": "the second half of the chromium install line above",
    "lumos-sim sweep examples/sweeps/llama3_70b_scaling.toml": "the 200-point example sweep (minutes); "
                                                               "tests/test_examples_sweeps.py runs it on a reduced grid",
    "lumos-sim report scaling.parquet": "reports the 200-point sweep above; tests/test_examples_sweeps.py and "
                                        "tests/test_report_html.py render reports of reduced grids",
    "python examples/sweeps/best_plan_per_gpu_count.py": "the same 200-point sweep through the Python API; "
                                                         "tests/test_examples_sweeps.py runs it on a reduced grid",
    "python examples/sweeps/moe_placement.py": "a 1.5-minute sweep; tests/test_example_moe_sweep.py runs "
                                               "the example's code on a smaller grid",
    "lumos-sim collect train_moe.py": "profiles the reader's own training script (needs torch); not in the checkout",
    "lumos-sim whatif moe --model deepseek-v3 --routing routing.npy": "reads the routing.npy that the "
                                                                      "collect line above writes from that script",
}


def readme_steps() -> list[str]:
    """The `&&` steps of every line of every ```bash block, comments dropped, in order."""
    steps = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():   # a trailing backslash continues the line
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            code = line.split("  #")[0].strip()      # trailing comments: "cmd   # what it does"
            steps.extend(part.strip() for part in code.split(" && "))
    return steps


def _skip_reason(step: str) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if step.startswith(prefix)), None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder that sees the checkout's tests/, examples/, benchmarks/ and docs/, with `lumos-sim` and
    `python` on PATH running this interpreter on this checkout."""
    d = tmp_path_factory.mktemp("readme")
    for name in ("tests", "examples", "benchmarks", "docs"):
        if (ROOT / name).exists():
            (d / name).symlink_to(ROOT / name)
    bin_dir = d / "bin"
    bin_dir.mkdir()
    for name, run in (("lumos-sim", "-m lumos_sim"), ("python", "")):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {run} \"$@\"\n")
        shim.chmod(0o755)
    return d


def test_readme_has_commands_and_every_skip_names_a_real_step():
    steps = readme_steps()
    assert any(s.startswith("lumos-sim convert") for s in steps)
    for prefix in SKIPPED:
        assert any(s.startswith(prefix) for s in steps), f"SKIPPED lists '{prefix}', which the README lacks"


@pytest.mark.parametrize("step", [s for s in readme_steps() if _skip_reason(s) is None])
def test_readme_command_runs_verbatim(scratch, step):
    env = dict(os.environ, PATH=f"{scratch / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT))
    p = subprocess.run(step, shell=True, cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{step}\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr
