"""The `lumos-sim` command line. Each sub-command lives in `lumos_sim/commands/<name>.py` and exposes
`register(subparsers)`, which adds its parser and sets `func` to a handler `(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import sys

from chakra_schema.errors import TraceInputError
from replay.engine import ReplayError

# Order is the order of `lumos-sim --help`.
COMMANDS = ["convert", "inspect", "jsonize", "collect", "replay", "check", "bench", "whatif", "sweep", "report",
            "calibrate"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lumos-sim", description=__doc__.splitlines()[0] if __doc__ else None)
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (TraceInputError, ReplayError) as e:
        print(f"lumos-sim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
