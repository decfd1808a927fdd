"""The `lumos-sim` command line. Each sub-command lives in `lumos_sim/commands/<name>.py` and exposes
`register(subparsers)`, which adds its parser and sets `func` to a handler `(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading

from chakra_schema.errors import TraceInputError
from replay.engine import ReplayError

# Order is the order of `lumos-sim --help`.
COMMANDS = ["convert", "inspect", "jsonize", "collect", "replay", "check", "bench", "whatif", "sweep", "report",
            "calibrate", "list"]


DESCRIPTION = """\
Simulate LLM training steps from PyTorch traces, and ask what-if questions about
hardware and parallelism.

Typical use:
  lumos-sim convert --kineto 'device.{rank}.json.gz' --et 'host.{rank}.json.gz' -o out/job
  lumos-sim replay out/job                        predicted vs measured step time per rank
  lumos-sim replay out/job --timing model --hardware h100-sxm
  lumos-sim whatif parallelism --model llama3-8b --gpus 64 --tp 8 --seq-len 8192 --global-batch 512
  lumos-sim list models | hardware                names you can pass to --model / --hardware

Run `lumos-sim COMMAND --help` for the options of one command. Bad input ends
with a one-line error and exit status 2; `check` exits 1 on an accuracy
regression."""

# Commands that read trace files take the decompressed-size limit of `chakra_schema.safe_io`.
_READS_TRACES = ("convert", "inspect", "jsonize", "replay", "check")


def add_input_limit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-input-size", metavar="SIZE", type=_byte_size,
                        help="refuse an input file that decompresses to more than SIZE "
                             "(default 4GiB, or $LUMOS_SIM_MAX_INPUT_SIZE)")


def _byte_size(text: str) -> int:
    from chakra_schema.safe_io import parse_byte_size
    try:
        return parse_byte_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help as wide as the output (`lumos_sim.tables.output_width`: the terminal, $COLUMNS, else 80).
    A paragraph of prose (unindented lines) reflows to that width; an indented line (an example
    command) keeps its author's line break and, when wider, wraps at spaces with its continuation
    indented four more, so examples stay readable at 80 columns."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 30,
                 width: int | None = None) -> None:
        from lumos_sim.tables import output_width
        super().__init__(prog, indent_increment, max_help_position, width or output_width() - 2)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap
        out: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                out.extend(textwrap.wrap(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent,
                                         break_long_words=False, break_on_hyphens=False))
                prose.clear()

        for line in text.splitlines():
            lead = line[:len(line) - len(line.lstrip())]
            if line.strip() and not lead:
                prose.append(line.strip())   # a paragraph of prose reflows as a whole
                continue
            flush()
            if len(indent + line) <= width or not line.strip():
                out.append(indent + line)
                continue
            out.extend(textwrap.wrap(line.strip(), width, initial_indent=indent + lead,
                                     subsequent_indent=indent + lead + "    ", break_long_words=False,
                                     break_on_hyphens=False))
        flush()
        return "\n".join(out)


_LONG_CHOICES = 30  # a {a,b,c} list longer than this would not wrap in the usage line: named instead


def _use_formatter(parser: argparse.ArgumentParser) -> None:
    """Every parser and sub-parser (nested ones too) formats its help with `HelpFormatter`; an option
    with a long list of choices shows a name in the usage and lists the choices in its help (which
    wraps), so usage lines fit the width."""
    parser.formatter_class = HelpFormatter
    _one_line_errors(parser)
    for action in parser._actions:
        if action.choices and action.option_strings and action.metavar is None \
                and not isinstance(action, argparse._SubParsersAction) \
                and len(",".join(map(str, action.choices))) > _LONG_CHOICES:
            action.metavar = action.dest.upper()
            listed = ", ".join(map(str, action.choices))
            action.help = f"{action.help} (one of: {listed})" if action.help else f"one of: {listed}"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _use_formatter(sub)


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A bad flag (unknown, missing, not one of its choices) is one line and exit 2, like every other bad
    input; the usage it would print is a `--help` away."""
    def error(message: str) -> None:
        parser.exit(2, f"{parser.prog}: error: {message} (see --help)\n")
    parser.error = error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lumos-sim", description=DESCRIPTION, formatter_class=HelpFormatter)
    from lumos_sim import __version__
    parser.add_argument("--version", action="version", version=f"lumos-sim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"lumos_sim.commands.{name}")
        except ModuleNotFoundError as e:  # a command not written yet must not break the others
            if e.name == f"lumos_sim.commands.{name}":
                continue
            raise
        module.register(sub)
    for name in _READS_TRACES:
        if name in sub.choices:
            add_input_limit_option(sub.choices[name])
    _use_formatter(parser)
    return parser


def _warnings_to_stderr(command: str):
    """Library warnings (logging, e.g. a repaired trace) as one line each: `lumos-sim CMD: warning: ...`.
    Returns the function that undoes it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"lumos-sim {command}: warning: %(message)s"))
    loggers = [logging.getLogger(name) for name in ("chakra_schema", "replay", "estimators", "lumos_sim")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False

    def undo() -> None:
        for logger in loggers:
            logger.removeHandler(handler)
            logger.propagate = True
    return undo


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every `finally` removes its temporary files."""


def _terminate(signum, frame):
    raise Terminated


def _quiet_broken_pipe() -> int:
    """The reader of our output went away (`| head`): stop quietly, as Unix tools do."""
    try:  # further writes (and the interpreter's final flush) would raise again: point stdout at nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from chakra_schema.safe_io import set_max_input_bytes
    warnings = _warnings_to_stderr(args.command)
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    try:
        set_max_input_bytes(getattr(args, "max_input_size", None))
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except (TraceInputError, ReplayError) as e:
        print(f"lumos-sim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except OSError as e:
        # A file the user named that the OS refuses (a name past NAME_MAX: pathlib's is_file / exists raise
        # ENAMETOOLONG rather than answer False, at every place a NAME|PATH argument is probed): bad input.
        # An OSError naming no file is not about the user's input and keeps its traceback.
        if e.filename is None:
            raise
        print(f"lumos-sim {args.command}: error: {TraceInputError(e.filename, e.strerror or str(e))}", file=sys.stderr)
        return 2
    except Terminated:
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        return 130
    finally:
        warnings()
        set_max_input_bytes(None)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
