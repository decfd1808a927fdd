"""Where sweep points are evaluated: one registry of executors, each a context manager whose
`imap(tasks)` yields `(point index, result columns)` as points finish, in any order.

- `local`: this process (1 worker) or a pool of spawned worker processes (the what-ifs are CPU-bound
  Python; spawn, not fork, so no thread or lock of the parent is copied into a worker).
- `ray`: Ray tasks on an existing cluster (`address`, e.g. "ray://head:10001" or "auto"; without one,
  the RAY_ADDRESS environment variable as Ray itself reads it) or on a local Ray instance started for
  the sweep with `workers` CPUs. Needs the optional extra: pip install -e '.[ray]'.
  The cluster's workers must have the same lumos-sim installed.

A new executor is one class with `__enter__`/`__exit__`/`imap` and one `@register_executor` line.
"""
from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import signal
import socket
from typing import Any, Callable, Iterator

from chakra_schema.errors import TraceInputError

STATUS_OK, STATUS_ERROR, STATUS_PENDING = "ok", "error", "pending"   # a sweep row's `status`


def evaluate_point(scenario) -> dict[str, Any]:
    """Status plus prediction columns of one point; any failure is recorded, never raised (a sweep goes on)."""
    from estimators.registry import evaluate

    try:
        p = evaluate(scenario)
    except Exception as e:  # noqa: BLE001 -- a failing point records its error in its row
        msg = e.problem if isinstance(e, TraceInputError) else f"{type(e).__name__}: {e}"
        return {"status": STATUS_ERROR, "error": " ".join(str(msg).split())}
    return {"status": STATUS_OK, "error": "", **p.to_row()}


def _evaluate_task(task: tuple[int, Any]) -> tuple[int, dict[str, Any]]:
    index, scenario = task
    return index, evaluate_point(scenario)

Task = tuple[int, Any]          # (point index, Scenario)
MAX_WORKERS = 1024              # processes of a local pool / CPUs of a local Ray instance
_EXECUTORS: dict[str, Callable[..., Any]] = {}


def register_executor(name: str):
    def deco(cls):
        _EXECUTORS[name] = cls
        return cls
    return deco


def executors() -> list[str]:
    return sorted(_EXECUTORS)


def check_executor(name: str, workers: int, address: str | None = None) -> None:
    """One-line errors for a bad executor name, worker count or address, before anything is written."""
    if name not in _EXECUTORS:
        raise TraceInputError(None, f"unknown executor '{name}' (known: {', '.join(executors())})")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise TraceInputError(None, f"--workers must be an integer >= 1, got {workers!r}")
    if workers > MAX_WORKERS:
        raise TraceInputError(None, f"--workers must be at most {MAX_WORKERS:,} (processes on this machine), got "
                                    f"{workers:,}; for more, run on a Ray cluster (--executor ray --ray-address)")
    _EXECUTORS[name].preflight(address)


def get_executor(name: str, workers: int = 1, address: str | None = None):
    check_executor(name, workers, address)
    return _EXECUTORS[name](workers=workers, address=address)


def _ray_address(address: str | None) -> str | None:
    """--ray-address, else RAY_ADDRESS (connecting to a cluster takes no CPU count: Ray refuses one)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the parent saves the results and stops the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@register_executor("local")
class LocalExecutor:
    @staticmethod
    def preflight(address: str | None) -> None:
        if address:
            raise TraceInputError(None, "--ray-address needs --executor ray")

    def __init__(self, workers: int = 1, address: str | None = None):
        self.workers = workers
        self.pool = None

    def __enter__(self) -> "LocalExecutor":
        if self.workers > 1:
            self.pool = multiprocessing.get_context("spawn").Pool(self.workers, initializer=_worker_init)
        return self

    def imap(self, tasks: list[Task]) -> Iterator[tuple[int, dict[str, Any]]]:
        if self.pool is None:
            return map(_evaluate_task, tasks)
        return self.pool.imap_unordered(_evaluate_task, tasks, chunksize=1)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is None:
            return
        if exc_type is None:
            self.pool.close()
        else:  # interrupted: running points are abandoned (they were never recorded)
            self.pool.terminate()
        self.pool.join()


@register_executor("ray")
class RayExecutor:
    @staticmethod
    def preflight(address: str | None) -> None:
        """Ray importable; a HOST:PORT address answers (Ray itself retries an unreachable one for minutes)."""
        try:
            importlib.import_module("ray")
        except ImportError:
            raise TraceInputError(None, "the ray executor needs Ray: pip install -e '.[ray]' "
                                        "(or pip install 'ray[default]')") from None
        address = _ray_address(address)
        host, sep, port = (address or "").rpartition(":")
        if not sep or "://" in address or not port.isdigit():
            return  # none (a local instance), "auto", or ray://... (the Ray client times out by itself)
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as e:
            raise TraceInputError(None, f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None

    def __init__(self, workers: int = 1, address: str | None = None):
        import ray

        self.ray = ray
        self.workers = workers
        self.address = _ray_address(address)
        self.started = False

    def __enter__(self) -> "RayExecutor":
        ray = self.ray
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                                      configure_logging=True)
            try:
                if self.address:
                    ray.init(address=self.address, **kw)
                else:
                    ray.init(num_cpus=self.workers, **kw)
            except Exception as e:  # noqa: BLE001 -- Ray raises many types (ConnectionError, TimeoutError, RaySystemError...)
                where = f"connect to the Ray cluster at {self.address}" if self.address else "start a local Ray instance"
                raise TraceInputError(None, f"could not {where}: {type(e).__name__}: "
                                            f"{' '.join(str(e).split())[:300]}") from None
            self.started = True
        return self

    def imap(self, tasks: list[Task]) -> Iterator[tuple[int, dict[str, Any]]]:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=1)(_evaluate_task)
        in_flight_cap = max(4 * int(ray.cluster_resources().get("CPU", self.workers)), 8)
        pending: list[Any] = []
        self._pending = pending
        queue = iter(tasks)
        for task in queue:
            pending.append(remote.remote(task))
            if len(pending) >= in_flight_cap:
                break
        while pending:
            done, rest = ray.wait(pending, num_returns=1)
            pending[:] = rest
            for task in queue:  # keep the cluster busy without queueing every point at once
                pending.append(remote.remote(task))
                break
            yield ray.get(done[0])

    def __exit__(self, exc_type, exc, tb) -> None:
        for ref in getattr(self, "_pending", []):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 -- best effort on the way out
                pass
        if self.started:
            self.ray.shutdown()
