"""Distributed search on Ray: a depth's shards run as Ray tasks; the driver merges their results.

Each task runs one shard (`superopt.search.driver.Shard`): the last depth's tied candidates to
prove (`settle`), a part of the loop bodies of a first kernel's block space (walked first, one
part per worker: a walk's parts are uneven, and more of them repeat more of its first levels), or
the first kernel's choice and a part of its block graphs, given the loop bodies of that part
(which also returns that part's first kernels of deeper graphs), or a share of those first
kernels, dealt out. A worker process keeps one `Searcher` per job (the oracle is saturated once
and the memoized block graphs are reused by every shard of that job the worker runs) and forgets
the last job's when a new one comes. Shards are submitted two per worker ahead, each made with
the proofs merged so far. Results merge in a total order, so 1 and N workers return the same
verified set and winner. A worker that dies mid-shard costs a retry (Ray re-runs the task,
`max_retries`); a shard that raises fails the search with its error (`ShardFailed` names the
shard), never silently.

Ray starts locally on demand (dashboard off, `num_cpus` = workers) unless an address is given
(`ray start --head` elsewhere, then `--ray-address HOST:PORT` or `auto`). A job that is small by an
estimate (few program ops and inputs) runs in-process: starting Ray costs seconds.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from superopt.config import SearchConfig
from superopt.core.errors import ClusterUnreachable
from superopt.core.progress import Progress
from superopt.core.result import SearchStats
from superopt.program import Program
from superopt.search.driver import Outcome, Searcher, Shard, ShardResult, rare_full_collections, run_search
from superopt.search.space import space_of
from superopt.targets import Target

SMALL_JOB = 6  # block ops x program inputs at or below which Ray is not worth starting
PARTS_PER_WORKER = 2  # a first kernel's block graphs in parts per worker, taken as workers free up (parts are uneven)
IN_FLIGHT_PER_WORKER = 2  # shards submitted ahead per worker: one running, one queued
CONNECT_TIMEOUT_S = 5.0  # to reach a Ray cluster's address before handing it to ray.init
FAULT_KILL_ONCE = "SUPEROPT_FAULT_KILL_ONCE"  # test equipment: a file path; see _maybe_die


class ShardFailed(RuntimeError):
    """A shard raised: the search cannot claim to have covered its space."""


def is_small(program: Program) -> bool:
    return len(space_of(program).block_ops) * len(program.inputs) <= SMALL_JOB


def run_distributed(
    program: Program, target: Target, config: SearchConfig, *, budget_s: float | None = None,
    max_states: int | None = None, progress: Progress | None = None, workers: int | None = None,
    address: str | None = None, contenders: int = 1,
) -> Outcome:
    workers = workers or os.cpu_count() or 1
    if is_small(program) and address is None:
        stats = SearchStats(symbolic=not config.concrete, executor="in-process (small job)")
        return run_search(program, target, config, budget_s=budget_s, max_states=max_states, progress=progress,
                          stats=stats, contenders=contenders)
    ray = _ray(workers, address)
    task = ray.remote(max_retries=3)(_run_shard)
    program_ref = ray.put(program.to_json())
    job = uuid.uuid4().hex  # a rerun of the same program is a new job: it starts from a fresh Searcher
    env_fault = os.environ.get(FAULT_KILL_ONCE)

    def executor(shards: Iterator[Shard], deadline: float, states_left: int | None) -> Iterator[ShardResult]:
        pending: dict[Any, Shard] = {}

        def submit() -> None:  # a shard is taken only now: it starts with the proofs merged so far
            shard = next(shards, None)
            if shard is not None:
                pending[task.remote(job, program_ref, target, config, shard, deadline, states_left, env_fault)] = shard

        for _ in range(workers * IN_FLIGHT_PER_WORKER):
            submit()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            shard = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as e:
                # The shards still in flight are left to finish (within the deadline), their results
                # dropped: cancelling them raced with their completion inside Ray and aborted this
                # process (Ray 2.60, task_manager.cc: "Tried to complete task that was not pending").
                raise ShardFailed(f"shard {_describe(shard)} failed: {e.cause!r}") from None
            yield result  # merged by the driver before the next shard is taken
            submit()

    stats = SearchStats(symbolic=not config.concrete, workers=workers, executor="ray")
    return run_search(program, target, config, budget_s=budget_s, max_states=max_states, progress=progress,
                      executor=executor, parts=workers * PARTS_PER_WORKER, walk_parts=workers, stats=stats,
                      contenders=contenders)


def _ray(workers: int, address: str | None) -> Any:
    import ray

    if not ray.is_initialized():
        if address:
            _reachable(address)  # before ray.init, which retries for minutes
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:  # something answers, not a Ray head
                raise ClusterUnreachable(f"ray address {address}: {e}") from None
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return ray


def _reachable(address: str) -> None:
    """Refuse at once a HOST:PORT that nothing answers: `ray.init` retries it for minutes, its
    own log lines the only sign ('auto' and ray:// addresses are Ray's to resolve)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachable(f"ray address {address!r}: expected HOST:PORT, 'auto' or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ClusterUnreachable(f"ray address {address}: no Ray cluster answers there ({e.strerror or e})") from None


def _describe(shard: Shard) -> str:
    if shard.settle:
        return f"proving {len(shard.settle)} tied candidates of depth {shard.depth - 1}"
    kind, what = shard.choice
    parts = f", part {shard.part[1] + 1}/{shard.part[0]}" if shard.part[0] > 1 else ""
    walk = " (loop bodies)" if shard.walk else ""
    return f"depth {shard.depth}, first kernel {kind} {what}{parts}{walk}"


_SEARCHERS: dict[str, Searcher] = {}  # per worker process: the Searcher of the job it last ran


def _run_shard(
    job: str, program_json: dict[str, Any], target: Target, config: SearchConfig, shard: Shard,
    deadline: float, max_states: int | None, fault_file: str | None,
) -> ShardResult:
    """Run one shard in a Ray worker, reusing this process's Searcher for the job."""
    searcher = _SEARCHERS.get(job)
    if searcher is None:
        for old in _SEARCHERS.values():  # one job at a time per worker process: keep memory bounded
            old.forget()  # freed by reference counting when dropped: no full collection to wait for
        _SEARCHERS.clear()
        rare_full_collections()  # for good: this process keeps a search's memo between its shards
        searcher = _SEARCHERS[job] = Searcher(Program.from_json(program_json), target, config)
    _maybe_die(fault_file, shard)
    return searcher.run(shard, deadline, max_states)


def _maybe_die(fault_file: str | None, shard: Shard) -> None:
    """Test equipment for fault tolerance: when FAULT_KILL_ONCE names a file that does not exist
    yet, the first graph shard to get here creates it and kills its own worker process, as a
    crash would; Ray then retries the shard on a live worker."""
    if not fault_file or shard.choice[0] != "graph":
        return
    marker = Path(fault_file)
    try:
        with marker.open("x") as f:
            f.write(_describe(shard))
    except FileExistsError:
        return
    os._exit(1)
