"""`lumos-sim replay`: replay the graphs of all ranks and report predicted vs measured step times."""
from __future__ import annotations

import sys

import orjson

from chakra_schema.inputs import load_graphs
from lumos_sim.progress import progress_bar
from chakra_schema.safe_io import prepare_output, refuse_overwriting_inputs
from lumos_sim.replay_run import TIMING_MODES, check_replay_arguments, print_result, run_replay
from replay.engine import ALIGN_MODES


def register(sub) -> None:
    p = sub.add_parser("replay", help="replay traces or .et graphs of all ranks and predict step times",
                       description="Replay execution graphs of all ranks. INPUT is an .et file, an .et prefix "
                                   "(PREFIX.<rank>.et), or raw Kineto / Execution Trace files ({rank} patterns and "
                                   "wildcards allowed), converted on the fly.")
    p.add_argument("inputs", nargs="*", metavar="INPUT", help=".et file(s) or PREFIX, or raw trace patterns")
    p.add_argument("--et", help="Execution Trace pattern (raw input)")
    p.add_argument("--kineto", help="Kineto trace pattern (raw input)")
    p.add_argument("--timing", choices=TIMING_MODES, default="trace",
                   help="trace: recorded durations (translated when --hardware is given); model: hardware models")
    p.add_argument("--hardware", help="target hardware preset name or TOML path")
    p.add_argument("--source-hardware", help="GPU the trace was recorded on (guessed from the trace when absent)")
    p.add_argument("--align", choices=ALIGN_MODES, default="recorded",
                   help="recorded (default): keep the recorded offsets between ranks when their clocks agree "
                        "(checked on their shared collectives; falls back to start with a note); start: every "
                        "rank starts at its own first event")
    p.add_argument("--steps", type=int, help="report only the first N steps")
    p.add_argument("--timeline", metavar="OUT.json", help="write the simulated run as a Perfetto/chrome trace")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--report", metavar="OUT.html", help="write an HTML report (per-rank step times, critical path)")
    p.set_defaults(func=main)


def main(args) -> int:
    if not args.inputs and not args.et and not args.kineto:
        print("lumos-sim replay: error: give at least one INPUT (or --et/--kineto)", file=sys.stderr)
        return 2
    # wrong arguments are reported before seconds of conversion, not after
    hardware, source_hardware = check_replay_arguments(args.timing, args.hardware, args.source_hardware, args.steps)
    for out in (args.timeline, args.report):
        if out:
            prepare_output(out)
            refuse_overwriting_inputs(out, [*args.inputs, args.et, args.kineto, args.hardware])
    with progress_bar("converting") as cb:
        graphs = load_graphs(args.inputs, et_pattern=args.et, kineto_pattern=args.kineto, progress=cb)
    with progress_bar("replaying") as cb:
        result = run_replay(graphs, args.timing, hardware, source_hardware, args.steps, progress=cb,
                            align=args.align)
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_json(), option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    else:
        print_result(result)
        for rank, rep in result.inference:   # model mode from an ET alone: say what was inferred
            for line in rep.lines():
                print(f"rank {rank}: {line}")
    if args.timeline:  # after the result: a failed write must not lose it
        from replay.timeline import write_timeline
        sys.stdout.flush()
        write_timeline(result.run, args.timeline)
        print(f"wrote timeline {args.timeline} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.report:
        from lumos_sim.report import write_replay_report
        write_replay_report(result, args.report)
    return 0
