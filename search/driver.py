"""The search loop: generate candidates, verify them, instantiate and rank the verified ones.

`run_search` is anytime: when the time or state budget runs out it stops and returns what it has
verified so far (the unfused baseline, verified first, is always among the results). Results are
deterministic for the same program and options: enumeration order is canonical, ranking breaks
ties by estimated time, then kernel count, then the sGraph's text.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from superopt import costmodel
from superopt.assignments import first_assignment
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.program import Program
from superopt.result import SearchStats, Verdict
from superopt.search.instantiation import Ranked, rank
from superopt.search.kernel import BudgetExhausted, KernelSearch
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


def run_search(
    program: Program, target: Target, config: SearchConfig, *, budget_s: float | None = None,
    max_states: int | None = None, progress: Progress | None = None,
) -> Outcome:
    t0 = time.monotonic()
    stats = SearchStats(symbolic=not config.concrete)
    deadline = t0 + budget_s if budget_s else float("inf")
    verified: list[Verified] = []
    outcome = Outcome(verified, stats)
    best_us: list[float] = []

    def report(phase: str, ks: KernelSearch | None = None) -> None:
        if ks is not None:
            stats.states, stats.pruned = ks.total_states, ks.total_pruned
        stats.seconds = time.monotonic() - t0
        if progress is not None:
            progress({
                "phase": phase, "states": stats.states, "pruned": stats.pruned, "verified": stats.verified,
                "best_time_us": min(best_us) if best_us else None, "seconds": round(stats.seconds, 2),
            })

    def consider(sg: SGraph) -> None:
        if first_assignment(sg, target) is None:
            outcome.rejected.append((sg.name, "no valid instantiation at the program's shapes"))
            return
        verdict = verify(program, sg, target=target)
        if not verdict.proved:
            stats.rejected += 1
            outcome.rejected.append((sg.name, _why(verdict)))
            return
        ranked = rank(sg, target)
        if not ranked:
            outcome.rejected.append((sg.name, "no instantiation ranked"))
            return
        stats.verified += 1
        verified.append(Verified(sg, verdict, ranked))
        best_us.append(ranked[0].estimate.time_us)

    consider(unfused_baseline(program))
    space = space_of(program)
    oracle = Oracle(program)
    last = [0.0]

    def tick(ks: KernelSearch) -> None:
        now = time.monotonic()
        if now - last[0] > 0.5:
            last[0] = now
            report("search", ks)

    # Any schedule of d kernels pays d launches on top of the program's physical floor: once the
    # best verified schedule is at least that fast, deeper kernel graphs cannot win.
    floor_s = costmodel.floor(program, target).time_s

    def deepen(depth: int) -> bool:
        return not best_us or min(best_us) * 1e-6 > floor_s + depth * target.launch_overhead_s

    ks = KernelSearch(program, space, oracle, config, deadline=deadline, max_states=max_states, on_state=tick,
                      deepen=deepen)
    seen: set[str] = set()
    try:
        for cand in ks.candidates():
            text = cand.dumps()
            if text in seen:
                continue
            seen.add(text)
            consider(cand)
            report("verify", ks)
    except BudgetExhausted:
        stats.budget_exhausted = True
    stats.states, stats.pruned = ks.total_states, ks.total_pruned
    stats.seconds = time.monotonic() - t0
    stats.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report("done", ks)
    return outcome


def _why(v: Verdict) -> str:
    failed = next((layer for layer in v.layers if not layer["passed"]), None)
    return f"{failed['layer']} refuted it" if failed else v.egraph_reason or "not proved"
