"""Black-box driver for the CLI's newer input surfaces: runs `lumos_sim.cli.main` in process on many
malformed inputs and reports every run that does not end cleanly. A clean end is exit 0, or exit 2 with
one stderr line; anything else -- an exception, another exit code, a run past --limit seconds, an
output file left behind by a failed run -- is printed and counted.

    python tests/fuzz/cli_driver.py [--family NAME ...] [--limit 20] [--examples 40]

Families: `set` (every `--set` key of a MoE scenario x hostile values), `flags` (the numeric flags of
whatif parallelism / failures / moe x hostile values), `hf` (hypothesis-generated config.json objects),
`search` (--search with hostile constraints). Memory is capped (RLIMIT_AS, 4 GiB) so a runaway
allocation is a MemoryError in the report, not the OOM killer. Not a test: a tool for a hardening pass
(tests/test_hardening_fourth_pass.py holds the regressions it found)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HOSTILE = ["nan", "inf", "-inf", "-1", "0", "1e400", "9" * 30, "abc", "", "[", "[" * 3000, "true", "1.5",
           "[1e400]", "{}", '{"a": 1}']
MOE_MODEL = ("--model", "mixtral-8x7b", "--gpus", "16", "--tp", "2", "--ep", "8", "--seq-len", "4096",
             "--global-batch", "32")


class Overtime(BaseException):
    """Raised by the alarm: a run past its limit (BaseException, so the CLI's handlers do not take it)."""


def _alarm(*_):
    raise Overtime()


@dataclasses.dataclass
class Driver:
    limit: int
    bad: list = dataclasses.field(default_factory=list)
    runs: int = 0

    def run(self, argv, label: str, outputs=()) -> None:
        from lumos_sim.cli import main
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        signal.alarm(self.limit)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
        except BaseException as e:  # noqa: BLE001 -- any other exception is a finding
            code = f"{type(e).__name__}: {str(e)[:160]}"
            err.write(traceback.format_exc()[-1200:])
        finally:
            signal.alarm(0)
        self.runs += 1
        lines = [x for x in err.getvalue().splitlines() if x.strip()]
        left = [o for o in outputs if os.path.exists(o)]
        clean = code == 0 or (code == 2 and len(lines) == 1)
        if not clean or (code != 0 and left):
            self.bad.append(label)
            print(f"[{label}] exit={code} {time.perf_counter() - t0:.1f}s left={left} :: {lines[-1][:200] if lines else ''}",
                  flush=True)


def family_set(d: Driver) -> None:
    from estimators.failures.options import FailureOptions
    from estimators.parallelism.plan import ParallelPlan
    from estimators.scenario import Scenario
    s = Scenario.build(model="mixtral-8x7b", hardware="h100-sxm", plan=ParallelPlan(tp=2, dp=8, ep=8, seq_len=4096,
                                                                                     global_batch=32))
    keys = [k for k in s.flatten() if "/" not in k and not k.startswith("hardware.calibration")]
    for k in keys:
        for v in HOSTILE:
            d.run(["whatif", "parallelism", *MOE_MODEL, "--set", f"{k}={v}"], f"set {k}={v[:20]}")
    for f in dataclasses.fields(FailureOptions):
        for v in HOSTILE:
            d.run(["whatif", "failures", "--model", "llama3-8b", "--gpus", 16, "--tp", 8, "--seq-len", 4096,
                   "--global-batch", 32, "--trials", 50, "--set", f"failure.{f.name}={v}"], f"set failure.{f.name}={v[:20]}")


def family_flags(d: Driver) -> None:
    values = ["nan", "inf", "-1", "0", "1e400", "9" * 20, "4294967296", "abc", "", "1.5"]
    par = ["--gpus", "--tp", "--pp", "--cp", "--dp", "--ep", "--etp", "--vp", "--seq-len", "--global-batch",
           "--micro-batch", "--dp-shard", "--first-stage-layers", "--last-stage-layers", "--pipeline-layout",
           "--recompute-layers", "--moe-capacity-factor", "--packed-doc-len", "--lora-rank"]
    moe = ["--ep", "--gpus-per-node", "--redundant-experts", "--groups", "--groups-per-token", "--tokens",
           "--context", "--attention-tp", "--mtp-acceptance"]
    fail = ["--gpus", "--gpus-per-node", "--failure-rate", "--replicas", "--detection-min", "--restart-min",
            "--stall-min", "--checkpoint-interval-min", "--checkpoint-write-min", "--spares", "--trials",
            "--horizon-days", "--seed"]
    for flag in par:
        for v in values:
            d.run(["whatif", "parallelism", *MOE_MODEL, flag, v], f"parallelism {flag}={v}")
    for flag in moe:
        for v in values:
            d.run(["whatif", "moe", "--model", "qwen3-30b-a3b", "--ep", 8, "--routing", "synthetic:tokens=2048",
                   "--tokens", 64, flag, v], f"moe {flag}={v}")
    for flag in fail:
        for v in values:
            d.run(["whatif", "failures", "--gpus", 16, "--trials", 50, flag, v], f"failures {flag}={v}")


def family_search(d: Driver) -> None:
    base = ["whatif", "parallelism", "--search", "--model", "llama3-8b", "--gpus", 64, "--top-k", 2]
    sizes = {"--seq-len": 4096, "--global-batch": 64}
    for flag in ("--seq-len", "--global-batch", "--micro-batch", "--tp", "--pp", "--vp", "--dp-shard"):
        for v in ("0", "-1", "9" * 20, str(2 ** 31), "3"):
            argv = dict(sizes, **{flag: v})
            d.run(base + [x for kv in argv.items() for x in kv], f"search {flag}={v}")


def family_hf(d: Driver, examples: int) -> None:
    from hypothesis import HealthCheck, given, settings, strategies as st
    folder = tempfile.mkdtemp(prefix="lumos-cli-driver-")
    fields = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "intermediate_size", "head_dim", "sliding_window", "layer_types", "architectures",
              "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "swiglu_limit", "text_config"]
    value = st.one_of(st.integers(min_value=-2, max_value=10 ** 30), st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from(["llama", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "nemotron", ""]),
                      st.none(), st.booleans(), st.lists(st.integers(-1, 8), max_size=4), st.just({}),
                      st.lists(st.sampled_from(["sliding_attention", "full_attention", 1]), max_size=4))
    base = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 512}

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.dictionaries(st.sampled_from(fields), value, max_size=4))
    def one(changes):
        path = os.path.join(folder, "config.json")
        with open(path, "w") as f:
            json.dump({**base, **changes}, f)
        d.run(["whatif", "parallelism", "--model", path, "--gpus", 4, "--tp", 4, "--seq-len", 256,
               "--global-batch", 4], f"hf {json.dumps(changes)[:120]}")

    one()


FAMILIES = {"set": family_set, "flags": family_flags, "search": family_search, "hf": family_hf}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", action="append", choices=sorted(FAMILIES))
    p.add_argument("--limit", type=int, default=20, help="seconds per run")
    p.add_argument("--examples", type=int, default=40, help="hypothesis examples (family hf)")
    args = p.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    signal.signal(signal.SIGALRM, _alarm)
    d = Driver(args.limit)
    for name in args.family or sorted(FAMILIES):
        fn = FAMILIES[name]
        fn(d, args.examples) if name == "hf" else fn(d)
    print(f"{d.runs} runs, {len(d.bad)} not clean")
    return 1 if d.bad else 0


if __name__ == "__main__":
    sys.exit(main())
