"""Tables for the terminal: as wide as the terminal, 80 columns when piped, never an ellipsis.

Rich shortens a cell that does not fit with "...", which would cut numbers and the names users must
type (`h100-s...`). Every column here folds instead (the text continues on the next line), and the
light `SIMPLE_HEAD` box leaves more of the 80 columns to the data."""
from __future__ import annotations

import sys
from typing import Sequence, TextIO

from rich import box
from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 80


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console(file: TextIO | None = None) -> Console:
    """A Console on `file` (stdout): the terminal's width, or 80 columns when it is not a terminal."""
    out = file or sys.stdout
    return Console(file=out, width=None if _isatty(out) else PIPE_WIDTH)


def table(title: str | None, columns: Sequence[str], right: Sequence[str] = (), whole: Sequence[str] = (),
          **kwargs) -> Table:
    """A Table whose columns fold rather than truncate; the columns named in `right` align right, those
    in `whole` (names users type) are never broken across lines."""
    t = Table(title=title, box=box.SIMPLE_HEAD, **kwargs)
    for name in columns:
        t.add_column(name, justify="right" if name in right else "left", overflow="fold",
                     no_wrap=name in whole)
    return t
