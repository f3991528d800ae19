"""The worker (`superopt worker`): claims jobs from the queue, runs the optimizer, stores results.

CPU-heavy search runs here, never in the HTTP service. While a job runs, a heartbeat thread renews
its lease and records the latest progress the optimizer reported; when the heartbeat learns that
the job is no longer this worker's (cancelled, or re-queued after a stall), the next progress call
raises JobAborted and the search stops. The worker owns the cache for the jobs it runs: it looks
the answer up before searching (unless the job says `force`) and stores the candidates and the
winner together with the job's completion, in one transaction.

The worker outlives the database: each of its calls (claim, cache lookup, finish, fail) is
retried through an outage with backoff (superopt.db.engine.Retry, logged) for up to `db_retry_s`
seconds, so a job's end is written when the database returns; the heartbeat keeps trying
meanwhile. A worker that cannot write its job's end in time gives up, exits, and leaves the job
to the next worker's claim once its lease has expired. Opening the database at start is not
retried: a worker started during an outage exits at once with the reason, as one given a wrong
URL does, for its supervisor to restart.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from superopt.config import DB_RETRY_S, LEASE_S, POLL_S
from superopt.core.errors import ClusterUnreachable
from superopt.core.result import Result
from superopt.db.cache import KernelCache
from superopt.db.engine import Database, DatabaseUnavailable, Retry, reason, unavailable
from superopt.db.errors import RequestError
from superopt.db.jobs import Claim, JobQueue, JobView, resolve_fingerprint
from superopt.db.keys import CacheKey
from superopt.limits import printable

Optimize = Callable[..., Result]


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


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self, db: Database, *, optimize: Optimize | None = None, worker_id: str | None = None,
        lease_s: float = LEASE_S, poll_s: float = POLL_S, ray_address: str | None = None,
        workers: int | None = None, db_retry_s: float = DB_RETRY_S,
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
        self.retry = Retry(window_s=db_retry_s, log=self.log)

    def run(self, *, once: bool = False, only: Collection[int] | None = None,
            stop: threading.Event | None = None) -> int:
        """Work until `stop` is set (or, with `once`, until no job is left); returns jobs handled."""
        stop = stop or threading.Event()
        self.retry.stop = stop  # a stop asked during an outage ends the retrying
        done = 0
        while not stop.is_set():
            try:
                handled = self.run_one(only)
            except DatabaseUnavailable:
                if stop.is_set():  # asked to stop while the database was away: not a failure
                    break
                raise
            if handled is not None:
                done += 1
            elif once:
                break
            else:
                stop.wait(self.poll_s)
        return done

    def run_one(self, only: Collection[int] | None = None) -> JobView | None:
        """Claim and run one job and return how it ended; None when no job was waiting.

        DatabaseUnavailable when the database stayed unreachable for the whole retry window."""
        claim = self.retry("claim", lambda: self.queue.claim(self.id, only))
        if claim is None:
            return None
        try:
            view = self._run(claim)
        except KeyboardInterrupt:
            self._stopped_with(claim)
            raise
        except JobAborted:
            view = None
        except DatabaseUnavailable:
            self.log(f"job {claim.job_id}: not ended here; it returns to the queue when its lease expires")
            raise
        except ClusterUnreachable:  # this worker's fault, not the job's: given back, and the worker stops
            self._stopped_with(claim)
            raise
        except Exception as e:  # the search failed: the job reports why, the worker goes on
            error = f"{type(e).__name__}: {e}"
            view = self.retry("fail", lambda: self.queue.fail(claim, error))
        if view is None:  # cancelled or taken over meanwhile: nothing of this worker's was written
            view = self.retry("read", lambda: self.queue.get(claim.job_id))
            self.log(f"job {view.id} left to its new owner or state: {view.state.value}")
        else:
            self.log(describe(view))
        return view

    def _stopped_with(self, claim: Claim) -> None:
        """Give the job back on a stop (SIGTERM, Ctrl-C), trying once: a stop is not held up by an
        outage, and the job's lease hands it back then."""
        try:
            if self.queue.release(claim):
                self.log(f"job {claim.job_id} given back to the queue")
            else:  # stopped once the job had ended (its result written): it keeps its state
                self.log(describe(self.queue.get(claim.job_id)))
        except SQLAlchemyError as e:
            if not unavailable(e):
                raise
            self.log(f"job {claim.job_id} not given back ({reason(e)}): it returns to the queue when its lease "
                     "expires")

    def _run(self, claim: Claim) -> JobView | None:
        if not claim.force:
            key = CacheKey.of(claim.program, resolve_fingerprint(claim.target), claim.config)
            hit = self.retry("cache lookup", lambda: self.cache.hit(key, budget_s=claim.budget_s,
                                                                    max_states=claim.max_states))
            if hit is not None:
                return self.retry("finish", lambda: self.queue.finish_cached(claim, hit))
        beat = _Heartbeat(self.queue, claim, self.heartbeat_s, self.log)

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
        return self.retry("finish", lambda: self.queue.finish(claim, result))


class _Heartbeat(threading.Thread):
    """Renews a claim's lease and records progress every `interval` seconds while a search runs.

    While the database is unreachable it keeps trying at that pace (each try fails fast or within
    the connect timeout), logging the first failure and the recovery: the search goes on, and
    once the database is back the lease is the job's again, unless it expired meanwhile and
    another worker took the job, which the next renewal finds (the search then stops)."""

    def __init__(self, queue: JobQueue, claim: Claim, interval: float, log: Callable[[str], None]) -> None:
        super().__init__(name=f"heartbeat-{claim.job_id}", daemon=True)
        self.queue, self.claim, self.interval, self.log = queue, claim, interval, log
        self.latest: dict[str, Any] | None = None
        self.lost = threading.Event()
        self._done = threading.Event()

    def run(self) -> None:
        failing = False
        while not self._done.wait(self.interval):
            try:
                ours = self.queue.heartbeat(self.claim, self.latest)
            except SQLAlchemyError as e:
                if not failing:
                    self.log(f"job {self.claim.job_id}: lease not renewed ({reason(e)}); retrying")
                failing = True
                continue
            if failing:
                self.log(f"job {self.claim.job_id}: lease renewed again")
                failing = False
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
    """One log line for a finished job (its error as stored text: `printable`)."""
    if view.error:
        return f"job {view.id} {view.state.value}: {printable(view.error)}"
    if not view.result:
        return f"job {view.id} {view.state.value}"
    r = view.result
    if view.cache_hit:
        return f"job {view.id} {view.state.value} from the cache (kernel {r.get('kernel_id')})"
    speedup = r.get("speedup")
    gain = f", {speedup:.2f}x over unfused" if isinstance(speedup, float) else ""
    return (f"job {view.id} {view.state.value}: {r.get('time_us', 0.0):.2f} us ({r.get('time_source')}){gain}, "
            f"kernel {r.get('kernel_id')}, {cache_note(r)}")
