"""Every command documented in README.md, docs/*.md and examples/ runs verbatim from a checkout.

Where commands are found:
- fenced code blocks of README.md, docs/*.md and examples/**/*.md (```bash, ```sh, or no language);
- comment and docstring lines of examples/**/*.py and *.toml whose text starts with `lumos-sim ` or
  `python ` (the usage lines at the top of each example).
A trailing backslash continues a line, `  # ...` ends it, `&&` separates steps; `VAR=...` lines of a
block are run before each command of that block (`SEED=...` then `lumos-sim ... $SEED`).

How they run: each step through a shell in a scratch folder of its own that sees the checkout's tests/,
examples/, benchmarks/ and docs/ (outputs do not land in the checkout), with `lumos-sim` and `python`
being this interpreter on this checkout. A step passes with exit status 0 and no traceback.
- A step that reads what an earlier step of the same document writes (`lumos-sim inspect out/job` after
  `... convert ... -o out/job`) first runs that step (and what it needs in turn) in its folder, as a reader
  following the document does: every case stands alone, in any order and on any pytest-xdist worker. What a
  step writes is the value of its output options (OUTPUT_OPTIONS); what it reads, any other word of it that
  names such a path or a file under it (`out/job.0.et` under `out/job`).
- Steps that need PyTorch (`lumos-sim collect`, the collect_*.py examples, train_moe.py) run too: with
  torch installed they must succeed, without it they must end in a one-line "needs PyTorch" error
  (exit 2), never a traceback.
- Long steps run with the cap in CAPS appended (fewer points of the same sweep), said there.
- A usage synopsis (`OUT_DIR`, `[--steps 3]` placeholders) is not a command and is not run.
- SKIPPED lists the steps that cannot run here, each with its reason.

Marking a documented command as not-for-this-test: put `# doc-test: skip (REASON)` at the end of its
line (after two spaces), or add its prefix and reason to SKIPPED below."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

# step prefix -> why it is not run by this test
SKIPPED = {
    "python3 -m venv": "creates a virtual environment: CI's .ci/run does this itself",
    ". .venv/bin/activate": "activates that environment (the test runs in the current one)",
    "pip install": "installs from PyPI (network); CI's .ci/run runs the README's install verbatim",
    "python -m pytest": "the whole test suite, which this test is part of (CI runs it verbatim)",
    "lumos-sim check tests/accuracy": "the accuracy suites (minutes): CI runs this command verbatim first",
    "command -v chromium": "installs Debian's chromium when missing (root, package registry): .ci/run runs it verbatim",
    "apt-get install": "the second half of the chromium install line above",
    "lumos-sim collect train.py": "train.py stands for the reader's own training script "
                                  "(examples/train_moe.py is the runnable one)",
}
# Until the README names the shipped samples (the lead's README update replaces these lines by
# examples/routing/deepseek-v3.npy and examples/train_moe.py), the old lines name files that do not exist.

# step prefix -> arguments appended so a long step runs in seconds (the same command on fewer points)
CAPS = {
    "lumos-sim sweep examples/sweeps/llama3_70b_scaling.toml": "--set 'axes.0.search.gpus=[64,128]' "
                                                               "--set axes.0.search.max_plans=2",
    "python examples/sweeps/best_plan_per_gpu_count.py": "--set 'axes.0.search.gpus=[64]' "
                                                         "--set axes.0.search.max_plans=2",
    "lumos-sim sweep examples/sweeps/failures_ettr.toml": "--set 'axes.0.zip.plan.gpus=[1024]' "
                                                          "--set 'axes.0.zip.plan.global_batch=[128]' "
                                                          "--set 'axes.1.grid.failure.checkpoint_interval_min=[30]' "
                                                          "--set failure.trials=20",
    "python examples/sweeps/failures_ettr.py": "--gpus 1024 --intervals 30 --trials 20",
    "lumos-sim sweep examples/sweeps/moe_placement.toml": "--set 'axes.1.zip.plan.ep=[16]' "
                                                          "--set 'axes.1.zip.plan.dp=[16]' "
                                                          "--set 'axes.2.grid.moe.tokens=[32]' "
                                                          "--set moe.synthetic_tokens=1024",
    "python examples/sweeps/moe_placement.py": "--quick",
    "lumos-sim whatif parallelism --model llama3-8b --gpus 64 --seq-len 8192 --global-batch 512 --search": "--top-k 2",
    "lumos-sim sweep examples/sweeps/nic_bandwidth.toml": "--set 'axes.1.grid.hardware.network.nic_gbps=[200,800]'",
}

# step prefix -> the defect that makes it fail today; run as a strict xfail, so the test fails (and this
# entry must go) once it is fixed
KNOWN_BROKEN: dict[str, str] = {}

# options whose value is a path the step writes (in its working folder)
OUTPUT_OPTIONS = ("-o", "--out", "--output", "--report", "--csv", "--timeline")
# steps whose output file is also their cache (a sweep skips the points its results file holds): they read
# what an earlier step wrote there too
CACHED_OUTPUT = ("lumos-sim sweep", "python examples/sweeps/")

NEEDS_TORCH = ("lumos-sim collect", "python examples/collect_", "python $C", "python examples/train_moe.py")
_MARK = re.compile(r"#\s*doc-test:\s*skip\s*\((.*)\)")
_PLACEHOLDER = re.compile(r"(?<![-\w$.{/])[A-Z][A-Z0-9]*_?[A-Z0-9_]*(?![\w=}])|\s\[--")
_ASSIGN = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass(frozen=True)
class Step:
    source: str          # file:line
    command: str         # the step as documented
    prelude: str = ""    # assignments of its block
    marked_skip: str = ""

    @property
    def id(self) -> str:
        return f"{self.source}: {self.command[:70]}"


def _fenced_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, body) of each shell-like fenced block (```bash, ```sh, or no language),
    indented ones (inside list items) included, their indentation removed."""
    out, body, lang, start, indent = [], [], None, 0, 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                lang, start, body = stripped[3:].strip(), n + 1, []
                indent = len(line) - len(line.lstrip())
        elif stripped.startswith("```"):
            if lang in ("", "bash", "sh", "shell", "console"):
                out.append((start, "\n".join(body)))
            lang = None
        else:
            body.append(line[indent:] if line[:indent].isspace() else line)
    return out


def _logical_lines(body: str, first: int) -> list[tuple[int, str]]:
    lines, buf, start = [], "", first
    for n, raw in enumerate(body.splitlines(), first):
        if not buf:
            start = n
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        lines.append((start, buf + raw))
        buf = ""
    if buf:
        lines.append((start, buf))
    return lines


def _steps_of_block(source: str, first: int, body: str) -> list[Step]:
    steps, prelude = [], []
    for n, line in _logical_lines(body, first):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        mark = _MARK.search(line)
        code = line.split("  #")[0].strip()
        if _ASSIGN.match(code) and not code.startswith(("lumos-sim", "python")):
            prelude.append(code)
            continue
        for part in code.split(" && "):
            steps.append(Step(f"{source}:{n}", part.strip(), "; ".join(prelude), mark.group(1) if mark else ""))
    return steps


def _comment_commands(path: Path) -> list[Step]:
    """Usage lines in an example's comments / docstring: text starting with `lumos-sim ` or `python `."""
    steps = []
    rel = path.relative_to(ROOT).as_posix()
    raw = path.read_text().splitlines()
    for n, line in enumerate(raw, 1):
        text = line.strip().lstrip("#").strip()
        if not text.startswith(("lumos-sim ", "python ")):
            continue
        while text.rstrip().endswith("\\") and n < len(raw):   # continued on the next line(s)
            text = text.rstrip().rstrip("\\") + " " + raw[n].strip().lstrip("#").strip()
            n += 1
        mark = _MARK.search(text)
        steps.append(Step(f"{rel}:{n}", text.split("  #")[0].strip(), "", mark.group(1) if mark else ""))
    return steps


def documented_steps() -> list[Step]:
    steps: list[Step] = []
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
    for md in docs:
        if md.exists():
            for first, body in _fenced_blocks(md.read_text()):
                steps += _steps_of_block(md.relative_to(ROOT).as_posix(), first, body)
    for ex in sorted((ROOT / "examples").rglob("*")):
        if ex.suffix in (".py", ".toml") and ex.is_file():
            steps += _comment_commands(ex)
    return steps


def _skip_reason(step: Step) -> str | None:
    if step.marked_skip:
        return step.marked_skip
    reason = next((why for prefix, why in SKIPPED.items() if step.command.startswith(prefix)), None)
    if reason:
        return reason
    if _PLACEHOLDER.search(step.command) and not step.prelude:
        return "a usage synopsis with placeholders, not a command"
    return None


STEPS = documented_steps()
RUN = [s for s in STEPS if _skip_reason(s) is None]


def _words(command: str) -> list[str]:
    """Shell words, with `--option=value` as two words."""
    try:
        words = shlex.split(command)
    except ValueError:   # an unbalanced quote: a step split at `&&` inside a subshell
        words = command.split()
    return [part for w in words for part in (w.split("=", 1) if w.startswith("--") and "=" in w else [w])]


def _step_words(step: Step) -> list[str]:
    """The words of the step and the values its block's `VAR=...` lines give it."""
    values = [a.split("=", 1)[1] for a in step.prelude.split("; ") if "=" in a]
    return _words(step.command) + [w for v in values for w in _words(v)]


def _path(word: str) -> str:
    return word.removeprefix("./").rstrip("/")


def _writes(step: Step, options: tuple[str, ...] = OUTPUT_OPTIONS) -> set[str]:
    """Paths the step writes: the values of its output options (`options`: only these)."""
    words = _words(step.command)
    return {_path(value) for option, value in zip(words, words[1:])
            if option in options and not value.startswith("-") and _path(value)}


def _reads(step: Step, written: str) -> bool:
    """Whether a word of the step (not one of its own outputs, unless they are its cache) is `written` or a
    path under / beside it."""
    # a sweep's results file (-o / --output) is the one output it also reads
    own = _writes(step) - (_writes(step, ("-o", "--output")) if step.command.startswith(CACHED_OUTPUT) else set())
    return any(w not in own and (w == written or w.startswith((written + "/", written + ".")))
               for w in map(_path, _step_words(step)))


def _dependencies(step: Step, steps: list[Step]) -> list[Step]:
    """The run steps of the same document before `step` whose outputs it reads (for each output, the last
    step before it that writes it), with their own dependencies first, in document order."""
    doc = step.source.rpartition(":")[0]
    earlier = [s for s in steps[:steps.index(step)] if s.source.rpartition(":")[0] == doc and _skip_reason(s) is None]
    needed: list[Step] = []
    for written in sorted({w for s in earlier for w in _writes(s)}):
        if _reads(step, written):
            producer = [s for s in earlier if written in _writes(s)][-1]
            needed += [s for s in [*_dependencies(producer, steps), producer] if s not in needed]
    return sorted(needed, key=steps.index)


@pytest.fixture
def scratch(tmp_path):
    """A folder of this case's own that sees the checkout's tests/, examples/, benchmarks/ and docs/, with
    `lumos-sim` and `python` on PATH running this interpreter on this checkout."""
    d = tmp_path / "documented"
    d.mkdir()
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


def test_documentation_has_commands_and_every_skip_and_cap_names_a_real_step():
    commands = [s.command for s in STEPS]
    assert any(c.startswith("lumos-sim convert") for c in commands)
    assert any(s.source.startswith("docs/") for s in STEPS) and any(s.source.startswith("examples/") for s in STEPS)
    for prefix in [*SKIPPED, *CAPS, *KNOWN_BROKEN]:
        assert any(c.startswith(prefix) for c in commands), f"'{prefix}' is listed here but documented nowhere"


def test_a_synopsis_is_told_apart_from_a_command():
    assert _PLACEHOLDER.search("python examples/collect_cpu_ddp.py OUT_DIR [--steps 3]")
    assert _PLACEHOLDER.search("lumos-sim sweep SPEC -o results.parquet")
    for command in ("lumos-sim whatif failures $SEED --strategy sync", "lumos-sim replay out/job --json",
                    "lumos-sim convert --kineto 'tests/data/cpu_ddp/device.{rank}.json.gz' -o out/job",
                    "lumos-sim bench gemm --hardware h100-sxm --m 8192 --dtype bf16",
                    "lumos-sim whatif moe --routing synthetic:domains=8 --ep 64 --phase decode --json"):
        assert not _PLACEHOLDER.search(command), command


def _param(step: Step):
    broken = next((why for prefix, why in KNOWN_BROKEN.items() if step.command.startswith(prefix)), None)
    marks = [pytest.mark.xfail(reason=broken, strict=True)] if broken else []
    return pytest.param(step, id=step.id, marks=marks)


def test_a_step_that_reads_an_earlier_steps_output_runs_that_step_first():
    body = "\n".join([
        "lumos-sim convert --kineto 'k.{rank}.json' -o out/job",
        "lumos-sim inspect out/job            # counts",
        "lumos-sim jsonize out/job.0.et -o job0.json",
        "lumos-sim sweep examples/s.toml -o r.parquet && lumos-sim report r.parquet -o r.html",
        "lumos-sim sweep examples/t.toml -o r.parquet --report ./t.html",
        "lumos-sim report r.parquet -o r2.html",
        "python check.py job0.json r2.html",
        "lumos-sim list models",
        "lumos-sim inspect out/jobs",
    ])
    steps = [*_steps_of_block("doc.md", 1, body), *_steps_of_block("other.md", 1, "lumos-sim inspect out/job")]
    convert, inspect, jsonize, sweep_s, report_s, sweep_t, report_t, check, listing, jobs, other = steps
    assert _writes(convert) == {"out/job"} and _writes(sweep_t) == {"r.parquet", "t.html"}

    def deps(step):
        return _dependencies(step, steps)

    assert deps(convert) == [] and deps(listing) == [] and deps(jobs) == []
    assert deps(inspect) == [convert] and deps(jsonize) == [convert]
    assert deps(report_s) == [sweep_s]
    assert deps(sweep_t) == [sweep_s]                  # r.parquet is its cache: it reads it too
    _, sweep_with_report = steps_4 = _steps_of_block(
        "fourth.md", 1, "python p.py -o s.html\nlumos-sim sweep t.toml -o s.parquet --report s.html")
    assert _dependencies(sweep_with_report, steps_4) == []   # its --report is written, not read
    assert deps(report_t) == [sweep_s, sweep_t]        # the last step before it that wrote r.parquet
    assert deps(check) == [convert, jsonize, sweep_s, sweep_t, report_t]
    assert _dependencies(other, steps) == []           # another document's out/job is not this one's
    # `--option=value`, and a path given through the block's `VAR=...` line
    collect, place, summary = _steps_of_block("third.md", 1, "python c.py --out=routes\n"
                                              "lumos-sim whatif moe --routing routes/a.parquet\n"
                                              "R=routes/a.parquet\npython s.py $R")
    assert _writes(collect) == {"routes"}
    assert _dependencies(place, [collect, place, summary]) == [collect]
    assert _dependencies(summary, [collect, place, summary]) == [collect]


def _script(step: Step) -> str:
    cap = next((extra for prefix, extra in CAPS.items() if step.command.startswith(prefix)), "")
    command = f"{step.command} {cap}".strip()
    return f"{step.prelude}; {command}" if step.prelude else command


def _run_step(step: Step, scratch: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{scratch / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT), COLUMNS="80")
    return subprocess.run(_script(step), shell=True, cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=600)


def _needs_torch(step: Step) -> bool:
    return step.command.startswith(NEEDS_TORCH) or "train_moe.py" in step.command


@pytest.mark.parametrize("step", [_param(s) for s in RUN])
def test_documented_command_runs_verbatim(scratch, step):
    have_torch = importlib.util.find_spec("torch") is not None
    for before in _dependencies(step, STEPS):   # what the step reads, written as the document does
        p = _run_step(before, scratch)
        if _needs_torch(before) and not have_torch:
            pytest.skip(f"reads what {before.source} writes ({before.command}), which needs PyTorch")
        assert p.returncode == 0 and "Traceback" not in p.stderr, \
            f"{before.source}: {_script(before)} (run first: {step.source} reads what it writes)\n{p.stderr[-3000:]}"
    command = _script(step)
    p = _run_step(step, scratch)
    assert "Traceback" not in p.stderr, f"{step.source}: {command}\n{p.stderr[-3000:]}"
    if _needs_torch(step) and not have_torch:
        err = p.stderr.strip()
        assert p.returncode == 2 and err.count("\n") == 0 and "torch" in err.lower(), \
            f"{step.source}: {command}: without torch expected a one-line error, got {p.returncode}: {err[-2000:]}"
        return
    assert p.returncode == 0, f"{step.source}: {command}\n{p.stderr[-3000:]}"
