"""`lumos-sim collect`: profile a few steps of a user's training script into host/device traces."""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from chakra_schema.errors import TraceInputError

HELP = "profile N training steps of a script into host.<rank>.json.gz + device.<rank>.json.gz"

DESCRIPTION = """\
Profile a few steps of a training script with PyTorch's Execution Trace observer and Kineto
profiler, writing OUT_DIR/host.<rank>.json.gz (Execution Trace) and OUT_DIR/device.<rank>.json.gz
(Kineto chrome trace) for `lumos-sim convert`. Needs PyTorch: pip install 'lumos-sim[collect]'.

SCRIPT is a Python file that defines:
  train_step(step: int) -> None
      one training iteration (forward, backward, optimizer step)
  setup() -> None
      optional; called once before profiling (build the model, init
      torch.distributed from the torchrun environment, ...)

The script is loaded with __name__ != "__main__", so its `if __name__ == "__main__":` block does not
run; it sees sys.argv = [SCRIPT, *SCRIPT_ARGS]. The first WARMUP steps run unrecorded, then STEPS
steps are recorded. The rank in the file names is torch.distributed's rank once setup() has
initialized a process group, else 0. One process per rank: for several ranks launch with torchrun,
e.g.:
  torchrun --nproc-per-node 2 -m lumos_sim.cli collect train.py -o traces/

With --routing, no profiler runs: forward hooks on the MoE routers of the script's global `model`
(modules named `gate` / `router`, or --router-pattern) record each token's top-k experts and gate
probabilities over the STEPS steps into OUT_DIR/layer_<i>.parquet (indices, scores), the routing form
`lumos-sim whatif moe --routing OUT_DIR` reads.
"""


def _option_parser(parser: argparse.ArgumentParser, defaults: bool) -> None:
    parser.add_argument("-o", "--out", type=Path, metavar="OUT_DIR", help="output directory (required)",
                        **({} if defaults else {"default": argparse.SUPPRESS}))
    parser.add_argument("--steps", type=int, metavar="N", help="profiled steps (default 3)",
                        **({"default": 3} if defaults else {"default": argparse.SUPPRESS}))
    parser.add_argument("--warmup", type=int, metavar="W", help="unrecorded warm-up steps first (default 1)",
                        **({"default": 1} if defaults else {"default": argparse.SUPPRESS}))
    parser.add_argument("--routing", action="store_true", help="record MoE router top-k into parquet instead",
                        **({"default": False} if defaults else {"default": argparse.SUPPRESS}))
    parser.add_argument("--top-k", type=int, metavar="K", help="--routing: experts per token (default: the model's)",
                        **({"default": None} if defaults else {"default": argparse.SUPPRESS}))
    parser.add_argument("--router-pattern", metavar="REGEX", help="--routing: names of router modules",
                        **({"default": None} if defaults else {"default": argparse.SUPPRESS}))


def register(subparsers) -> None:
    p = subparsers.add_parser("collect", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              usage="lumos-sim collect SCRIPT.py [--steps N] [--warmup W] -o OUT_DIR\n"
                                    "                         [-- SCRIPT_ARGS...]")
    _option_parser(p, defaults=True)
    p.add_argument("script", type=Path, metavar="SCRIPT.py", help="defines train_step(step) (and setup())")
    # argparse cannot mix options after a positional with a `--` tail, so everything after SCRIPT is
    # taken raw here and split in `run`: our options before `--`, the script's arguments after it.
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _split_rest(args: argparse.Namespace) -> list[str]:
    rest = list(args.rest)
    ours, script_args = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    if ours:
        tail = argparse.ArgumentParser(prog="lumos-sim collect", add_help=False)
        _option_parser(tail, defaults=False)
        tail.parse_args(ours, namespace=args)  # unknown options exit 2 with argparse's one-line error
    return script_args


def _error(message: str) -> int:
    print(f"lumos-sim collect: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    script_args = _split_rest(args)
    if args.out is None:
        return _error("-o/--out OUT_DIR is required")
    if args.steps < 1 or args.warmup < 0:
        return _error(f"need --steps >= 1 and --warmup >= 0 (got {args.steps}, {args.warmup})")
    script = args.script
    if not script.is_file():
        raise TraceInputError(script, "no such script file")

    from lumos_sim.collect import TorchMissingError, profile_steps, require_torch
    try:
        require_torch()  # fail before running the user's script when torch is absent
    except TorchMissingError as e:
        return _error(str(e))

    saved_argv = sys.argv
    sys.argv = [str(script), *script_args]
    script_dir = str(script.resolve().parent)
    sys.path.insert(0, script_dir)  # let the script import its neighbours, as `python SCRIPT` would
    try:
        namespace = runpy.run_path(str(script), run_name="__lumos_collect__")
        train_step = namespace.get("train_step")
        if not callable(train_step):
            raise TraceInputError(script, "defines no train_step(step) function")
        setup = namespace.get("setup")
        if callable(setup):
            setup()
        if args.routing:
            return _record_routing(args, script, train_step)
        result = profile_steps(train_step, args.out, warmup=args.warmup, steps=args.steps)
    finally:
        sys.argv = saved_argv
        if script_dir in sys.path:
            sys.path.remove(script_dir)

    link = result.link
    durations = ", ".join(f"{d / 1000:.1f}" for d in link.step_durations_us)
    print(f"rank {result.rank}: {len(link.profiler_steps)} profiler steps ({durations} ms); "
          f"{link.linked}/{link.et_rf_ids} ET ops linked to Kineto events\n"
          f"  {result.host_path}\n  {result.device_path}")
    if not link.fully_linked:
        print("lumos-sim collect: warning: some ET ops have no Kineto event with the same rf_id", file=sys.stderr)
    return 0


def _record_routing(args: argparse.Namespace, script: Path, train_step) -> int:
    """Run warm-up steps, then STEPS steps with router hooks on the script's `model`; write parquet."""
    from lumos_sim.collect_routing import DEFAULT_PATTERN, RoutingRecorder
    model = train_step.__globals__.get("model")  # the script's live globals: setup() may have built it
    if model is None or not hasattr(model, "named_modules"):
        raise TraceInputError(script, "--routing needs a global `model` (a torch.nn.Module) in the script")
    for step in range(args.warmup):
        train_step(step)
    recorder = RoutingRecorder(model, args.top_k, args.router_pattern or DEFAULT_PATTERN)
    with recorder:
        for step in range(args.warmup, args.warmup + args.steps):
            train_step(step)
    paths = recorder.save(args.out)
    tokens = sum(len(a) for a in recorder.indices[0])
    print(f"{len(paths)} MoE layers x {tokens} tokens, top-{recorder.top_k}: {args.out}/layer_*.parquet")
    return 0
