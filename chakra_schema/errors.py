"""One error type for bad input files, so the CLI can print one line and exit 2."""
from __future__ import annotations

import os


class TraceInputError(ValueError):
    """A file could not be used: `path` names it, `problem` says why, in one line."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = " ".join(str(problem).split())  # always one line
        super().__init__(f"{self.path}: {self.problem}" if self.path else self.problem)
