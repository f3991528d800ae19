"""The worker (`superopt worker`): claims jobs from the queue, runs the optimizer, stores results.

CPU-heavy search runs here, never in the HTTP service. While a job runs, a heartbeat thread renews
its lease and records the latest progress the optimizer reported; when the heartbeat learns that
the job is no longer this worker's (cancelled, or re-queued after a stall), the next progress call
raises JobAborted and the search stops. The worker owns the cache for the jobs it runs: it looks
the answer up before searching (unless the job says `force`) and stores the candidates and the
winner together with the job's completion, in one transaction.
"""

from __future__ import annotations

import functools
import importlib
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from superopt.db.cache import KernelCache
from superopt.db.engine import Database
from superopt.db.errors import RequestError
from superopt.db.jobs import DEFAULT_LEASE_S, Claim, JobQueue, JobView
from superopt.db.keys import CacheKey
from superopt.result import Result
from superopt.targets import fingerprint as costmodel_fingerprint
from superopt.targets import target as costmodel_target

Optimize = Callable[..., Result]
AUTO_FALLBACK = "h100"  # what "auto" means without a GPU (the optimizer's rule: local GPU, else h100 estimates)


class JobAborted(BaseException):
    """Raised from the progress callback to stop a search whose job this worker no longer holds.

    A BaseException, like KeyboardInterrupt, so that a search which catches the errors of single
    candidates does not swallow it."""


def default_optimize(program: Any, **options: Any) -> Result:
    """superopt.api.optimize, imported when first called (the worker module does not need it to load)."""
    from superopt.api import optimize

    # The worker looks the cache up and stores the result with the job's completion itself.
    return optimize(program, cache=False, **options)


def load_optimizer(spec: str | None) -> Optimize:
    """'package.module:function' (a test double, a custom search), or None for superopt.api.optimize."""
    if not spec:
        return default_optimize
    module, _, name = spec.partition(":")
    if not module or not name:
        raise RequestError("optimizer", f"{spec!r} must be written module:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise RequestError("optimizer", f"cannot load {spec!r}: {e}") from None
    if not callable(fn):
        raise RequestError("optimizer", f"{spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


def resolve_fingerprint(target: str) -> str:
    """The cache identity of a job's target on this worker: a named cost-model target, or for "auto"
    the local GPU when there is one, else the fallback cost-model target."""
    if target != "auto":
        return costmodel_fingerprint(costmodel_target(target))
    return _auto_fingerprint()


@functools.cache
def _auto_fingerprint() -> str:
    """Looked up once per process: the GPU a worker drives does not change under it."""
    from superopt.runtime import GpuUnavailable, device_fingerprint, fingerprint_text

    try:
        return fingerprint_text(device_fingerprint())
    except GpuUnavailable:
        return costmodel_fingerprint(costmodel_target(AUTO_FALLBACK))


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self, db: Database, *, optimize: Optimize | None = None, worker_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S, poll_s: float = 1.0, ray_address: str | None = None,
        workers: int | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.queue = JobQueue(db, lease_s=lease_s)
        self.cache = KernelCache(db)
        self.optimize = optimize or default_optimize
        self.id = worker_id or new_worker_id()
        self.heartbeat_s = min(1.0, lease_s / 4)
        self.poll_s = poll_s
        self.ray_address = ray_address
        self.workers = workers
        self.log = log or (lambda _line: None)

    def run(self, *, once: bool = False, only: Collection[int] | None = None,
            stop: threading.Event | None = None) -> int:
        """Work until `stop` is set (or, with `once`, until no job is left); returns jobs handled."""
        stop = stop or threading.Event()
        done = 0
        while not stop.is_set():
            if self.run_one(only) is not None:
                done += 1
            elif once:
                break
            else:
                stop.wait(self.poll_s)
        return done

    def run_one(self, only: Collection[int] | None = None) -> JobView | None:
        """Claim and run one job and return how it ended; None when no job was waiting."""
        claim = self.queue.claim(self.id, only)
        if claim is None:
            return None
        try:
            view = self._run(claim)
        except KeyboardInterrupt:
            if self.queue.release(claim):
                self.log(f"job {claim.job_id} given back to the queue")
            else:  # stopped once the job had ended (its result written): it keeps its state
                self.log(describe(self.queue.get(claim.job_id)))
            raise
        except JobAborted:
            view = None
        except Exception as e:  # the search failed: the job reports why, the worker goes on
            view = self.queue.fail(claim, f"{type(e).__name__}: {e}")
        if view is None:  # cancelled or taken over meanwhile: nothing of this worker's was written
            view = self.queue.get(claim.job_id)
            self.log(f"job {view.id} left to its new owner or state: {view.state.value}")
        else:
            self.log(describe(view))
        return view

    def _run(self, claim: Claim) -> JobView | None:
        fingerprint = resolve_fingerprint(claim.target)
        if not claim.force:
            hit = self.cache.hit(CacheKey.of(claim.program, fingerprint, claim.config), budget_s=claim.budget_s,
                                 max_states=claim.max_states)
            if hit is not None:
                return self.queue.finish_cached(claim, hit)
        beat = _Heartbeat(self.queue, claim, self.heartbeat_s)

        def progress(update: dict[str, Any]) -> None:
            beat.latest = dict(update)
            if beat.lost.is_set():
                raise JobAborted

        extra: dict[str, Any] = {"ray_address": self.ray_address} if self.ray_address else {}
        if self.workers:
            extra["workers"] = self.workers
        beat.start()
        try:
            result = self.optimize(
                claim.program, target=claim.target, budget_s=claim.budget_s, max_states=claim.max_states,
                config=claim.config, force=claim.force, progress=progress, **extra,
            )
        finally:
            beat.stop()
        if beat.lost.is_set():
            raise JobAborted
        return self.queue.finish(claim, result)


class _Heartbeat(threading.Thread):
    """Renews a claim's lease and records progress every `interval` seconds while a search runs."""

    def __init__(self, queue: JobQueue, claim: Claim, interval: float) -> None:
        super().__init__(name=f"heartbeat-{claim.job_id}", daemon=True)
        self.queue, self.claim, self.interval = queue, claim, interval
        self.latest: dict[str, Any] | None = None
        self.lost = threading.Event()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                ours = self.queue.heartbeat(self.claim, self.latest)
            except SQLAlchemyError:
                continue  # the database was briefly unreachable: the lease has slack, try again
            if not ours:
                self.lost.set()
                return

    def stop(self) -> None:
        self._done.set()
        self.join()


def cache_note(result: dict[str, Any]) -> str:
    """Whether a searched job's kernel became its key's cached winner, and if not why."""
    if result.get("cached"):
        return "cached"
    return "not cached: a faster proved winner is" if result.get("proved") else "not cached: not proved"


def describe(view: JobView) -> str:
    """One log line for a finished job."""
    if view.error:
        return f"job {view.id} {view.state.value}: {view.error}"
    if not view.result:
        return f"job {view.id} {view.state.value}"
    r = view.result
    if view.cache_hit:
        return f"job {view.id} {view.state.value} from the cache (kernel {r.get('kernel_id')})"
    speedup = r.get("speedup")
    gain = f", {speedup:.2f}x over unfused" if isinstance(speedup, float) else ""
    return (f"job {view.id} {view.state.value}: {r.get('time_us', 0.0):.2f} us ({r.get('time_source')}){gain}, "
            f"kernel {r.get('kernel_id')}, {cache_note(r)}")
