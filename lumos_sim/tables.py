"""The one output layer for the terminal: width, tables and wrapped text.

- Width: the terminal's, else `$COLUMNS`, else 80 columns (`output_width`); no command picks its own.
- Tables never cut a cell with "..." (that would cut numbers and the names users must type) and never
  split a word across lines: a table whose columns cannot all hold their longest word at this width is
  printed as stacked records instead ("column: value" per line, one block per row).
- Text printed through the console wraps at spaces.

Every command gets this by printing through `console()`; a rich `Table` given to its `print` goes
through `fit_table`."""
from __future__ import annotations

import os
import sys
from typing import Any, Sequence, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

DEFAULT_WIDTH = 80
MIN_WIDTH = 20


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def output_width(stream: TextIO | None = None) -> int:
    """Columns to fill: the terminal's (when `stream` is one), else $COLUMNS, else 80."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return max(MIN_WIDTH, int(env))
    out = stream or sys.stdout
    if _isatty(out):
        try:
            return max(MIN_WIDTH, os.get_terminal_size(out.fileno()).columns)
        except (OSError, ValueError, AttributeError):
            pass
    return DEFAULT_WIDTH


class _Console(Console):
    """A Console whose `print` fits tables to the width (see `fit_table`)."""

    def print(self, *objects: Any, **kwargs) -> None:  # type: ignore[override]
        super().print(*(fit_table(o, self) if isinstance(o, Table) else o for o in objects), **kwargs)


def console(file: TextIO | None = None) -> Console:
    """The Console every command prints through (stdout unless `file`), `output_width` columns wide."""
    out = file or sys.stdout
    return _Console(file=out, width=output_width(out), soft_wrap=False)


def table(title: str | None, columns: Sequence[str], right: Sequence[str] = (), whole: Sequence[str] = (),
          **kwargs) -> Table:
    """A Table whose columns wrap at spaces; the columns named in `right` align right. `whole` is kept
    for callers: with `fit_table` no column ever breaks a word."""
    t = Table(title=title, box=box.SIMPLE_HEAD, **kwargs)
    for name in columns:
        t.add_column(name, justify="right" if name in right else "left", overflow="fold")
    return t


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain
    return ""


def _longest_words(t: Table) -> list[int]:
    """Per column: its longest word, header included (a word must never be split)."""
    return [max([col.min_width or 0, 1, *(len(w) for c in (col.header, *col._cells) for w in _plain(c).split())])
            for col in t.columns]


def _natural_widths(t: Table) -> list[int]:
    """Per column: its longest line (the width it takes when nothing wraps)."""
    return [max([1, *(len(line) for c in (col.header, *col._cells) for line in _plain(c).splitlines())])
            for col in t.columns]


def _chrome(t: Table) -> int:
    """Columns the table spends on cell padding and the box's vertical lines."""
    n = len(t.columns)
    pad = (t.padding[3] + t.padding[1]) * n
    if not t.pad_edge:
        pad -= t.padding[3] + t.padding[1]
    return pad + (2 if t.box and t.show_edge else 0) + (n - 1 if t.box else 0)


def column_widths(words: Sequence[int], natural: Sequence[int], room: int) -> list[int] | None:
    """Content widths that fit `room` columns: every column at least its longest word, the space left
    shared in proportion to what each column would still use; None when the words alone do not fit."""
    if sum(natural) <= room:
        return list(natural)
    if sum(words) > room:
        return None
    # water-filling: the highest cap such that every column at min(natural, max(word, cap)) fits, so
    # narrow columns keep their whole lines and the widest ones wrap
    def total(cap: int) -> int:
        return sum(min(n, max(w, cap)) for n, w in zip(natural, words))
    lo, hi = 0, max(natural)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total(mid) <= room else (lo, mid - 1)
    widths = [min(n, max(w, lo)) for n, w in zip(natural, words)]
    spare = room - sum(widths)
    for i in sorted(range(len(widths)), key=lambda i: widths[i] - natural[i]):   # the leftover columns
        if spare <= 0:
            break
        add = min(spare, natural[i] - widths[i])
        widths[i] += add
        spare -= add
    return widths


def fit_table(t: Table, con: Console) -> Any:
    """`t` with fixed column widths that fit the console and hold every word whole; the same data as
    stacked records when even its longest words do not fit side by side."""
    widths = column_widths(_longest_words(t), _natural_widths(t), con.width - _chrome(t))
    if widths is None:
        return stacked(t)
    for col, w in zip(t.columns, widths):
        col.width = w          # rich wraps the cells at spaces within it; a word never exceeds it
        col.overflow = "fold"
    return t


def stacked(t: Table) -> Text:
    """The table as records: the title, then per row one "header: value" line per non-empty cell."""
    out = Text()
    if t.title:
        out.append(Text.from_markup(str(t.title)) if isinstance(t.title, str) else t.title)
        out.append("\n")
    headers = [Text.from_markup(c.header).plain if isinstance(c.header, str) else str(c.header)
               for c in t.columns]
    headers = [" ".join(h.split()) for h in headers]
    label_w = min(max((len(h) for h in headers), default=0), 24)
    rows = max((len(c._cells) for c in t.columns), default=0)
    for r in range(rows):
        out.append("\n" if r else "")
        for h, col in zip(headers, t.columns):
            cell = col._cells[r] if r < len(col._cells) else ""
            text = Text.from_markup(cell) if isinstance(cell, str) else cell if isinstance(cell, Text) else Text(str(cell))
            if not text.plain.strip():
                continue
            lines = text.split("\n")
            head = (h or "-").ljust(label_w)
            for k, line in enumerate(lines):
                out.append(f"  {head if k == 0 else ' ' * len(head)}  ")
                out.append(line)
                out.append("\n")
    return out


def say(text: str, file: TextIO | None = None) -> None:
    """A status line (`wrote PATH`) on stderr, wrapped at spaces to the output width; a word (a path)
    longer than the width stays whole on its own line."""
    import textwrap

    out = file or sys.stderr
    width = output_width(out)
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    print("\n".join(lines), file=out)
