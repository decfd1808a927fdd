"""Progress on stderr for long work: a rich bar on a terminal, plain-text lines otherwise (a CI log
shows a long sweep advancing), nothing for small jobs or when disabled.

The callback takes `(done, total)`; a total of 0 or None means "not known yet" and is never printed
(no `0/None`). Plain lines come at most every `LUMOS_SIM_PROGRESS_SECONDS` seconds (default 10),
plus one when the work completes, and only once the work has run that long: a 2-second command prints
nothing."""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

ProgressCallback = Callable[[int, int], None]  # (done, total)

DEFAULT_INTERVAL_S = 10.0


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("LUMOS_SIM_PROGRESS_SECONDS", DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_line(description: str, done: int, total: int | None, elapsed_s: float) -> str:
    """`description: 12/200 (6%), 30 s` or, with no known total, `description: 12 done, 30 s`."""
    if total:
        return f"{description}: {done}/{total} ({100 * done / total:.0f}%), {elapsed_s:.0f} s"
    return f"{description}: {done} done, {elapsed_s:.0f} s"


@contextmanager
def _plain_lines(description: str, interval: float) -> Iterator[ProgressCallback]:
    t0 = time.monotonic()
    last = [t0]

    def update(done: int, total: int | None) -> None:
        now = time.monotonic()
        finished = bool(total) and done >= (total or 0)
        if now - t0 < interval or (now - last[0] < interval and not finished):
            return
        last[0] = now
        print(progress_line(description, done, total, now - t0), file=sys.stderr, flush=True)

    yield update


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[ProgressCallback]:
    """Yields a callback `(done, total)`: a rich bar on a terminal, plain lines when stderr is not one."""
    if not enabled:
        yield lambda done, total: None
        return
    if not _isatty(sys.stderr):
        with _plain_lines(description, _interval()) as update:
            yield update
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # MofN shows "12/200" and only "12" while the total is unknown (never "12/None")
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total or None)

        yield update
