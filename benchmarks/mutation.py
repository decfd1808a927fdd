"""Mutation campaign over the predictor's core modules with mutmut (issue 25).

Each module is mutated on its own, in a scratch copy of the project (the checkout is never touched), and
every mutant runs the fast, targeted test files listed for it below (the ones that pin that module's
quantities); the score per module is the share of mutants killed. Survivors are printed by name, with
their diff under `--show-survivors`, to be classed as equivalent (no observable change) or killed by a
new test.

    pip install mutmut                                    # 3.x
    python benchmarks/mutation.py                         # every module (hours on 2 cores)
    python benchmarks/mutation.py --module memory         # one module
    python benchmarks/mutation.py --module memory --functions layer_activation_bytes   # some functions
    python benchmarks/mutation.py --module workload --sample 300 --seed 1   # a uniform random sample
    python benchmarks/mutation.py --list                  # the modules and their test files

Scores are printed as killed / (mutants - equivalent): the equivalent mutants of each module are listed
in its file under benchmarks/mutation_targets/ with the reason (the README carries the latest figures).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["chakra_schema", "replay", "estimators", "lumos_sim"]


@dataclass(frozen=True)
class Target:
    path: str                      # module to mutate
    tests: tuple[str, ...]         # fast test files that pin its quantities


TARGET_DIR = Path(__file__).resolve().parent / "mutation_targets"


def load_targets() -> tuple[dict[str, Target], dict[str, dict[str, str]]]:
    """One TOML file per target in mutation_targets/: the module, its test files, and its equivalent
    mutants (mutmut name -> why nothing observable changes), which are left out of the score."""
    targets: dict[str, Target] = {}
    equivalent: dict[str, dict[str, str]] = {}
    for f in sorted(TARGET_DIR.glob("*.toml")):
        spec = tomllib.loads(f.read_text())
        targets[f.stem] = Target(spec["module"], tuple(spec["tests"]))
        equivalent[f.stem] = dict(spec.get("equivalent", {}))
    return targets, equivalent


TARGETS, EQUIVALENT = load_targets()

STATUSES = ("killed", "survived", "timeout", "no tests", "suspicious", "skipped", "segfault", "not checked",
            "check was interrupted by user", "caught by type check")


def scratch_copy(dest: Path) -> None:
    """The project's tracked and untracked (not ignored) files, without .git."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def setup_cfg(target: Target) -> str:
    lines = ["[mutmut]", "source_paths =", *[f"    {p}" for p in PACKAGES],
             "only_mutate =", f"    {target.path}",
             "pytest_add_cli_args_test_selection =", *[f"    {t}" for t in target.tests],
             "pytest_add_cli_args =", "    -p no:cacheprovider", "    -q", "    -x",
             "mutate_only_covered_lines = false", ""]
    return "\n".join(lines)


def mutant_glob(module: str, function: str) -> str:
    """mutmut 3's mutant names: module.x_function__mutmut_N, module.xǁClassǁmethod__mutmut_N."""
    if "." in function:
        cls, meth = function.split(".", 1)
        return f"{module}.xǁ{cls}ǁ{meth}__mutmut_*"
    return f"{module}.x_{function}__mutmut_*"


def sampled_names(work: Path, target: Target, env: dict, sample: int, seed: int) -> list[str]:
    """A uniform random sample of the module's mutants: mutmut generates them all (and runs none, as no
    name matches the placeholder), then `sample` names are drawn with `random.Random(seed)` from the
    sorted list, so the same seed gives the same sample on any machine."""
    subprocess.run(["nice", "-n", "19", sys.executable, "-m", "mutmut", "run", "no_such_mutant__mutmut_0"], cwd=work,
                   env=env, capture_output=True, text=True)
    meta = json.loads((work / "mutants" / (target.path + ".meta")).read_text())
    names = sorted(meta["exit_code_by_key"])
    return sorted(random.Random(seed).sample(names, min(sample, len(names))))


def run_target(name: str, target: Target, workdir: Path, functions: list[str], children: int,
               sample: int = 0, seed: int = 0) -> dict:
    work = workdir / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    scratch_copy(work)
    (work / "setup.cfg").write_text(setup_cfg(target))
    env = dict(os.environ, LUMOS_SIM_SHARED=os.environ.get("LUMOS_SIM_SHARED", str(ROOT.parent / "shared")))
    module = target.path[:-3].replace("/", ".")
    names = [mutant_glob(module, f) for f in functions]
    if sample:
        names = sampled_names(work, target, env, sample, seed)
    t0 = time.perf_counter()
    cmd = ["nice", "-n", "19", sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    res = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, env=env,
                         capture_output=True, text=True)
    status: dict[str, str] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
        if m and m.group(1).startswith(module + "."):
            status[m.group(1)] = m.group(2).strip()
    if names:
        pats = [re.compile(re.escape(n).replace(r"\*", ".*") + "$") for n in names]
        status = {k: v for k, v in status.items() if any(p.match(k) for p in pats)}
    if proc.returncode not in (0, 1) and not status:
        raise SystemExit(f"mutmut failed on {name} (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    equivalent = EQUIVALENT.get(name, {})
    counts = {s: sum(1 for v in status.values() if v == s) for s in set(status.values())}
    scored = [k for k in status if k not in equivalent]
    killed = sum(1 for k in scored if status[k] in ("killed", "timeout", "segfault", "caught by type check"))
    survivors = sorted(k for k in scored if status[k] not in ("killed", "timeout", "segfault", "caught by type check"))
    return {"module": target.path, "tests": list(target.tests), "functions": functions, "mutants": len(status),
            "equivalent": sum(1 for k in status if k in equivalent), "killed": killed,
            "score": killed / len(scored) if scored else float("nan"), "counts": counts, "survivors": survivors,
            "seconds": seconds, "workdir": str(work)}


def show(work: str, mutant: str) -> str:
    return subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], cwd=work, capture_output=True,
                          text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", action="append", choices=sorted(TARGETS), help="only these modules (repeatable)")
    ap.add_argument("--functions", nargs="*", default=[], help="only the mutants of these functions "
                    "(Class.method for methods)")
    ap.add_argument("--children", type=int, default=2, help="parallel mutant runs (default 2)")
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="score a uniform random sample of N mutants per module (a large module takes hours)")
    ap.add_argument("--seed", type=int, default=0, help="seed of --sample's draw (default 0)")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one, kept)")
    ap.add_argument("--show-survivors", action="store_true", help="print each survivor's diff")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for name, t in TARGETS.items():
            print(f"{name:22s} {t.path:42s} {' '.join(t.tests)}")
        return 0
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="lumos-mutation-"))
    rows = []
    for name in args.module or list(TARGETS):
        row = run_target(name, TARGETS[name], workdir, args.functions, args.children, args.sample, args.seed)
        rows.append(row)
        print(f"{name:22s} {row['module']:42s} {row['killed']:5d} / {row['mutants'] - row['equivalent']:5d} killed "
              f"= {100 * row['score']:5.1f}%  ({row['equivalent']} equivalent left out; {row['seconds']:.0f} s; "
              f"{json.dumps(row['counts'])})", flush=True)
        for s in row["survivors"]:
            print(f"    survived: {s}")
            if args.show_survivors:
                print("      " + show(row["workdir"], s).replace("\n", "\n      "))
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
