"""Level 2: choose the sizes of a verified symbolic sGraph for a target, ranked by the cost model.

Candidate values per symbol are the powers of two that divide what the symbol splits, and that
size itself (DESIGN.md §6); `superopt.costmodel.rank` estimates every combination that meets the
sGraph's constraints and breaks ties by the values, so the choice is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

from superopt import costmodel
from superopt.assignments import candidates as divisor_candidates
from superopt.sgraph import SGraph
from superopt.targets import Target


@dataclass
class Ranked:
    params: dict[str, int]
    estimate: costmodel.Estimate


def candidate_values(sg: SGraph) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for sym, divs in divisor_candidates(sg).items():
        top = max(divs)
        out[sym] = sorted({d for d in divs if d & (d - 1) == 0} | {top})
    return out


def rank(sg: SGraph, target: Target, keep: int = 5, deadline: float | None = None) -> list[Ranked]:
    """The `keep` best instantiations of `sg` by estimated time (empty when none is valid)."""
    return [
        Ranked(values, est)
        for values, est in costmodel.rank(sg, target, candidate_values(sg), keep, deadline)
    ]
