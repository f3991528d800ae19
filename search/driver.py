"""The search loop: generate candidates, verify them, instantiate and rank the verified ones.

The search runs depth by depth (kernel count); each depth is cut into shards — the choices of the
first kernel, optionally split further into parts of its block graphs (`Shard`) — that an
executor runs: in this process one after another (`run_search`), or as Ray tasks
(`superopt.search.distributed`). A shard's verified candidates do not depend on which process
ran it, and the merge sorts them by a total order, so any number of workers returns the same
verified set and winner. Between depths the driver decides whether deeper kernel graphs can still
win (launch overhead alone bounds them).

Anytime: when the time or state budget runs out, the search stops and returns what it has verified
so far (the unfused baseline, verified first, is always among it). Results are deterministic for the
same program and options: ties break by estimated time, then kernel count, then the sGraph's text.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from superopt import costmodel
from superopt.assignments import first_assignment
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.program import Program
from superopt.result import SearchStats, Verdict
from superopt.search.instantiation import Ranked, rank
from superopt.search.kernel import BudgetExhausted, FirstChoice, KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import SGraph
from superopt.targets import Target
from superopt.verifier.oracle import Oracle
from superopt.verifier.verify import verify

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Verified:
    sgraph: SGraph
    verdict: Verdict
    ranked: list[Ranked]  # best instantiations, best first

    @property
    def best(self) -> Ranked:
        return self.ranked[0]

    def sort_key(self) -> tuple[float, int, str]:
        return (self.best.estimate.time_s, len(self.sgraph.kernels), self.sgraph.dumps())


@dataclass
class Outcome:
    verified: list[Verified]
    stats: SearchStats
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (sGraph name, why), for reports

    @property
    def best(self) -> Verified:
        return min(self.verified, key=Verified.sort_key)


@dataclass(frozen=True)
class Shard:
    depth: int
    choice: FirstChoice
    part: tuple[int, int] = (1, 0)  # (parts, index) of the first kernel's block graphs


@dataclass
class ShardResult:
    shard: Shard
    verified: list[Verified]
    rejected: list[tuple[str, str]]
    states: int
    pruned: int
    exhausted: bool


class Searcher:
    """Everything one job's shards share in a process: the oracle, the kernel search (with its
    memoized block graphs) and the verification of candidates. A Ray worker keeps one per job."""

    def __init__(self, program: Program, target: Target, config: SearchConfig,
                 on_state: Callable[[KernelSearch], None] | None = None) -> None:
        self.program, self.target, self.config = program, target, config
        self.search = KernelSearch(program, space_of(program), Oracle(program), config, on_state=on_state)
        self.decided: dict[str, Verified | str] = {}  # candidate text -> its verification, or why not

    def consider(self, sg: SGraph, verified: list[Verified], rejected: list[tuple[str, str]]) -> None:
        """Verify a candidate and rank its instantiations (or record why it was dropped). The
        decision is remembered: a worker re-running a job's shard does not verify twice."""
        text = sg.dumps()
        if text not in self.decided:
            self.decided[text] = self._decide(sg)
        decision = self.decided[text]
        if isinstance(decision, Verified):
            verified.append(decision)
        else:
            rejected.append((sg.name, decision))

    def _decide(self, sg: SGraph) -> Verified | str:
        if first_assignment(sg, self.target) is None:
            return "no valid instantiation at the program's shapes"
        verdict = verify(self.program, sg, target=self.target)
        if not verdict.proved:
            return _why(verdict)
        ranked = rank(sg, self.target, deadline=self.search.deadline)
        return Verified(sg, verdict, ranked) if ranked else "no instantiation ranked"

    def run(self, shard: Shard, deadline: float, max_states: int | None) -> ShardResult:
        ks = self.search
        states0, pruned0 = ks.total_states, ks.total_pruned
        ks.deadline = deadline
        ks.max_states = None if max_states is None else states0 + max_states
        verified: list[Verified] = []
        rejected: list[tuple[str, str]] = []
        exhausted = False
        try:
            for cand in ks.candidates_in(shard.depth, shard.choice, shard.part):
                self.consider(cand, verified, rejected)
        except BudgetExhausted:
            exhausted = True
        return ShardResult(shard, verified, rejected, ks.total_states - states0, ks.total_pruned - pruned0, exhausted)


# An executor runs a depth's shards and yields their results (in any order).
Executor = Callable[[list[Shard], float, "int | None"], Iterable[ShardResult]]


def run_search(
    program: Program, target: Target, config: SearchConfig, *, budget_s: float | None = None,
    max_states: int | None = None, progress: Progress | None = None, executor: Executor | None = None,
    parts: int = 1, stats: SearchStats | None = None,
) -> Outcome:
    """Search depth by depth; `executor` runs each depth's shards (default: in this process),
    `parts` splits every shard's first block space that many ways (for more, smaller shards)."""
    t0 = time.monotonic()
    stats = stats or SearchStats(symbolic=not config.concrete)
    deadline = time.time() + budget_s if budget_s else float("inf")
    outcome = Outcome([], stats)
    seen: set[str] = set()
    last = [0.0]

    def report(phase: str, live_states: int = 0, live_pruned: int = 0) -> None:
        stats.seconds = time.monotonic() - t0
        if progress is not None:
            best = min((v.best.estimate.time_us for v in outcome.verified), default=None)
            progress({
                "phase": phase, "states": stats.states + live_states, "pruned": stats.pruned + live_pruned,
                "verified": stats.verified, "best_time_us": best, "seconds": round(stats.seconds, 2),
            })

    def tick(ks: KernelSearch) -> None:
        now = time.monotonic()
        if now - last[0] > 0.5:
            last[0] = now
            report("search", ks.total_states - base_states[0], ks.total_pruned - base_pruned[0])

    base_states, base_pruned = [0], [0]
    local = Searcher(program, target, config, on_state=tick)

    def merge(result: ShardResult) -> None:
        stats.states += result.states
        stats.pruned += result.pruned
        outcome.rejected.extend(result.rejected)
        stats.rejected += len(result.rejected)
        for v in result.verified:
            text = v.sgraph.dumps()
            if text not in seen:
                seen.add(text)
                outcome.verified.append(v)
                stats.verified += 1
        stats.budget_exhausted |= result.exhausted

    baseline: list[Verified] = []
    local.consider(unfused_baseline(program), baseline, outcome.rejected)
    merge(ShardResult(Shard(0, ("baseline", None)), baseline, [], 0, 0, False))

    def in_process(shards: list[Shard], deadline: float, states_left: int | None) -> Iterator[ShardResult]:
        for shard in shards:
            base_states[0], base_pruned[0] = local.search.total_states, local.search.total_pruned
            yield local.run(shard, deadline, None if max_states is None else max(0, max_states - stats.states))

    run = executor or in_process
    floor_s = costmodel.floor(program, target).time_s
    for depth in range(1, config.max_kernel_ops + 1):
        # Any schedule of `depth` kernels pays that many launches over the program's physical floor:
        # once the best verified schedule is at least that fast, deeper kernel graphs cannot win.
        best = min((v.best.estimate.time_s for v in outcome.verified), default=None)
        if best is not None and best <= floor_s + depth * target.launch_overhead_s:
            break
        shards = [Shard(depth, choice, (parts, i)) for choice in local.search.first_choices(depth)
                  for i in range(parts if choice[0] == "graph" else 1)]
        for result in run(shards, deadline, None if max_states is None else max_states - stats.states):
            merge(result)
            report("verify")
        if stats.budget_exhausted:
            break
        stats.depth = depth
    stats.seconds = time.monotonic() - t0
    stats.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report("done")
    return outcome


def _why(v: Verdict) -> str:
    failed = next((layer for layer in v.layers if not layer["passed"]), None)
    return f"{failed['layer']} refuted it" if failed else v.egraph_reason or "not proved"
