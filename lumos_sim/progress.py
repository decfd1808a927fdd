"""Progress bars on stderr for long work, silent when stderr is not a terminal or the job is small."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

ProgressCallback = Callable[[int, int], None]  # (done, total)


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[ProgressCallback]:
    """Yields a callback `(done, total)`; renders a rich progress bar on stderr while it is used."""
    if not enabled or not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
