"""`lumos-sim calibrate TRACE... --hardware BASE -o my-gpu.toml`: fit the per-class kernel models on your
own traces and write a hardware preset that extends BASE with them (see replay/hardware/kernel_models.py).
Prints the cross-validated per-class error (folds by trace and by step) next to the uncalibrated model's."""
from __future__ import annotations

import sys

import orjson

from chakra_schema.errors import TraceInputError
from chakra_schema.inputs import load_graphs
from lumos_sim.progress import progress_bar


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit kernel models on your traces; write a preset extending --hardware",
                       description="Fit per-class kernel models (fixed cost, roofline efficiency, launch-geometry "
                                   "regression) on GPU traces and write a hardware preset that extends BASE.")
    p.add_argument("inputs", nargs="+", metavar="TRACE",
                   help="traces of one GPU type: Kineto files, .et files / prefixes, or directories holding "
                        "NAME.<rank>.json.gz Kineto + Execution Trace pairs")
    p.add_argument("--hardware", required=True, metavar="BASE", help="preset the traces' GPU is (name or TOML)")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="OUT.toml", help="calibrated preset to write")
    out.add_argument("--install", metavar="NAME",
                     help="install the calibrated preset as NAME in the user preset folder ($LUMOS_SIM_HOME/hardware, "
                          "else ~/.config/lumos-sim/hardware): `--hardware NAME` and `lumos-sim list hardware` find it")
    p.add_argument("--name", help="preset name (default: the output file's stem)")
    p.add_argument("--json", action="store_true", help="print the fit and cross-validation as JSON")
    p.set_defaults(func=main)


def _load_one(path: str):
    """One trace set: a file / .et prefix / pattern as `replay` takes it, or a directory holding a Kineto
    and an Execution Trace file per rank (NAME.<rank>.json.gz), linked together."""
    import os
    import re
    from glob import glob

    from chakra_schema.inputs import sniff_trace_kind

    if not os.path.isdir(path):
        return load_graphs([path])
    patterns: dict[str, str] = {}
    for f in sorted(glob(os.path.join(path, "*.json*"))):
        if re.search(r"\.\d+\.json(\.gz)?$", f):
            patterns.setdefault(sniff_trace_kind(f), re.sub(r"\.\d+\.json", ".{rank}.json", f))
    if not patterns:
        raise TraceInputError(path, "directory holds no NAME.<rank>.json(.gz) trace files")
    return load_graphs([], et_pattern=patterns.get("et"), kineto_pattern=patterns.get("kineto"))


def load_labelled(inputs, progress=None):
    """(label, graph) of every rank of every input: one trace per input file and rank."""
    from pathlib import Path

    out = []
    for n, path in enumerate(inputs):
        for g in _load_one(path):
            out.append((Path(path).name + (f"#rank{g.rank}" if g.world_size > 1 else ""), g))
        if progress:
            progress(n + 1, len(inputs))
    return out


def main(args) -> int:
    from lumos_sim import __version__
    from lumos_sim.tables import console as make_console
    from replay.hardware.calibration import calibrate_traces, write_preset
    from replay.hardware.config import get_hardware

    if args.install:
        args.output, args.name = install_path(args.install), args.install
    elif args.name is not None and not args.name.strip():
        raise TraceInputError(None, "--name must name the preset (empty given); leave it out to use the file's stem")
    if not str(args.output).endswith(".toml"):
        raise TraceInputError(args.output, "the calibrated preset must be a .toml file")
    from chakra_schema.safe_io import prepare_output, refuse_overwriting_inputs
    prepare_output(args.output)   # a folder or an unwritable place is said now, not after the whole fit
    refuse_overwriting_inputs(args.output, [*args.inputs, args.hardware])
    hw = get_hardware(args.hardware)
    with progress_bar("reading traces") as cb:
        graphs = load_labelled(args.inputs, cb)
    check_same_gpu(graphs, hw)
    result = calibrate_traces(graphs, hw)
    samples = result.samples
    classes, unknown_share, unknown = kernel_report(graphs)
    out = write_preset(result, args.output, args.name, tool=f"lumos-sim {__version__} calibrate")
    if args.json:
        report = {"classes": classes, "unclassified_share": unknown_share,
                  "unclassified": [u.__dict__ for u in unknown]}
        sys.stdout.write(orjson.dumps(result.to_json() | {"output": str(out), "kernels": report}).decode() + "\n")
        return 0
    print_classes(classes, unknown_share, unknown)
    print_accuracy(result.by_trace, result.by_step)
    if result.sustained_tensor_fraction is not None:
        make_console().print(f"sustained tensor throughput: {result.sustained_tensor_fraction:.3f} of dense peak "
              f"(preset {hw.name}: {hw.compute.sustained_tensor_fraction:.3f})")
    make_console().print(f"wrote {out}: {len(result.models)} kernel models from {len(samples)} kernels of "
          f"{len(samples.trace_names)} trace(s), extends {hw.name}")
    return 0


def install_path(name: str):
    """Where `--install NAME` writes: the user preset folder; a built-in name or a path is refused."""
    import re

    from replay.hardware.config import is_builtin_preset, user_preset_dir

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or name.endswith(".toml"):
        raise TraceInputError(name, "--install takes a preset name (letters, digits, '.', '_', '-'), not a path")
    if is_builtin_preset(name.lower()):
        raise TraceInputError(name, "is a built-in preset name: install the calibration under another name")
    return user_preset_dir() / f"{name}.toml"


def check_same_gpu(graphs, hw) -> None:
    """A fit only means something on the GPU the traces ran on: refuse a trace recorded on another one."""
    from replay.hardware.config import trace_hardware

    for label, g in graphs:
        got = trace_hardware(g.metadata)
        if got is not None and (got.gpu.sm_count, got.gpu.peak_tflops) != (hw.gpu.sm_count, hw.gpu.peak_tflops):
            raise TraceInputError(label, f"recorded on {got.gpu.model}, not on --hardware {hw.name} "
                                         f"({hw.gpu.model}): calibrate each GPU type on its own traces")


def kernel_report(graphs):
    """Per kernel class: kernels, GPU time, libraries seen; plus the kernels no class covers."""
    from collections import Counter, defaultdict

    import numpy as np

    from replay.hardware.compute import launching_op
    from replay.hardware.kernel_classes import classify_kernel, unclassified_report

    triples = []
    for _, g in graphs:
        for i in np.flatnonzero(g.is_gpu()).tolist():
            host = launching_op(g, i)
            triples.append((g.name[i], g.name[host] if host >= 0 else "", float(g.duration_us[i])))
    stats: dict = defaultdict(lambda: {"kernels": 0, "time_us": 0.0, "libraries": Counter(), "by_op": 0})
    for name, op, dur in triples:
        k = classify_kernel(name, op)
        st = stats[k.cls]
        st["kernels"] += 1
        st["time_us"] += dur
        st["libraries"][k.library] += 1
        st["by_op"] += int(k.by_op)
    classes = {c: {**v, "libraries": dict(v["libraries"].most_common())} for c, v in sorted(stats.items())}
    share, unknown = unclassified_report(triples)
    return classes, share, unknown


def print_classes(classes, unknown_share, unknown) -> None:
    from lumos_sim.tables import console as make_console, table

    total = sum(c["time_us"] for c in classes.values()) or 1.0
    numbers = ("kernels", "GPU time", "share", "by op")
    t = table("GPU kernels by class (by name, else by launching op)", ("class",) + numbers + ("libraries",),
              right=numbers, whole=("class",) + numbers)
    for c, v in classes.items():
        t.add_row(c, str(v["kernels"]), f"{v['time_us'] / 1e3:.1f} ms", f"{100 * v['time_us'] / total:.1f}%",
                  str(v["by_op"]), ", ".join(f"{k} {n}" for k, n in list(v["libraries"].items())[:4]))
    console = make_console()
    console.print(t)
    console.print(f"unclassified kernels: {100 * unknown_share:.2f}% of GPU time")
    for u in unknown[:10]:
        console.print(f"  {u.count:>5} x {u.total_us / 1e3:8.2f} ms  {u.name[:90]}  (launched by {u.host_op or '?'})")


def print_accuracy(by_trace, by_step, title: str = "cross-validated per-class GMAE") -> None:
    """One table per kind of fold: held-out kernels, GMAE before / after calibration, after split into
    kernels that ran alone and under communication (own models), and the repeat floor."""
    from lumos_sim.tables import console as make_console, table

    console = make_console()
    cols = ("class", "held\nout", "before", "timed\nafter", "after", "after\nalone", "after\nunder\ncomm",
            "under\ncomm\nn", "repeat\nfloor")
    for label, rows in (("by trace", by_trace), ("by step", by_step)):
        if not rows:
            continue
        t = table(f"{title}, folds {label}", cols, right=cols[1:], whole=cols)
        for r in rows:
            t.add_row(r.kernel_class, str(r.kernels), _pct(r.before_gmae), str(r.after_kernels), _pct(r.after_gmae),
                      _pct(r.isolated_gmae), _pct(r.contended_gmae), str(r.contended_kernels), _pct(r.floor_gmae))
        console.print(t)
    console.print("before / after: the preset's physics vs the fitted kernel models on held-out kernels ('timed "
                  "after': those a fitted model times; replay keeps the others' recorded time); 'under comm': "
                  "kernels that ran while communication did (fitted on their own, per communication kernel); "
                  "repeat floor: identical kernels of the other folds predicting each other; '2.5x': a GMAE of "
                  "150%")


def _pct(x: float) -> str:
    if x != x:
        return "-"
    if x < 1:
        return f"{100 * x:.1f}%"
    return f"{x + 1:.1f}x" if x < 99 else f"{x + 1:.0f}x"  # GMAE of 100% or more: the factor it is off by
