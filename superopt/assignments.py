"""Valid assignments of an sGraph's symbols: candidate values and a backtracking enumeration.

Candidates for a symbol are the divisors of the sizes it splits (DESIGN.md §6 level 2); the
enumeration assigns symbols one at a time and checks each constraint as soon as all of its
symbols have values, in exact integer arithmetic, so invalid branches are cut early.
`assignment_table` builds the same assignments as numpy columns, a symbol at a time, for the
cost model to estimate all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from math import gcd
from typing import Any

import numpy as np

from superopt.sgraph import Constraint, SGraph
from superopt.sizes import Size, compile_ratio
from superopt.targets import Target


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def candidates(sg: SGraph, unbounded: int = 64) -> dict[str, list[int]]:
    """Per symbol, the divisors of every constant size it must divide (powers of two up to
    `unbounded` for a symbol no constraint bounds)."""
    bound = _bounds(sg)
    out: dict[str, list[int]] = {}
    for s in sorted(sg.symbols):
        out[s] = divisors(bound[s]) if s in bound else [2**i for i in range(unbounded.bit_length())]
    return out


def bounded_candidates(sg: SGraph) -> dict[str, list[int]] | None:
    """Every value each symbol can take in this sGraph or any sGraph that contains it (more
    constraints only remove divisors), or None when a symbol is unbounded here."""
    bound = _bounds(sg)
    if not sg.symbols <= bound.keys():
        return None
    return {s: divisors(bound[s]) for s in sorted(sg.symbols)}


def _bounds(sg: SGraph) -> dict[str, int]:
    """Per symbol, the gcd of the constant sizes it must divide."""
    bound: dict[str, int] = {}
    for c in sg.info.constraints:
        if c.kind != "divides":
            continue
        for mono, coeff in c.expr.terms:
            if any(e > 0 for _, e in mono) or coeff.denominator != 1:
                continue  # satisfiable through a symbol in the numerator: no bound from here
            for s, e in mono:
                if e < 0:
                    bound[s] = gcd(bound.get(s, 0), coeff.numerator)
    return bound


def _compile(c: Constraint, target: Target) -> Callable[[Mapping[str, Any]], Any]:
    """The constraint as a test of values: ints, or numpy columns (one element per assignment;
    the test is then a boolean column). Exact: the expression as numerator and denominator."""
    ratio = compile_ratio(c.expr)
    limit = 1 if c.kind == "divides" else target.max_blocks if c.kind == "blocks" else target.smem_per_block
    positive = all(coeff > 0 for _, coeff in c.expr.terms)

    def fits_int64(v: Mapping[str, Any]) -> bool:
        """Sizes have positive terms, so the ratio at the largest values bounds every row's."""
        if not positive:
            return False
        num, den = ratio({s: int(np.max(v[s])) for s in c.expr.symbols})
        return max(num, den * limit) < 2**62

    def test(v: Mapping[str, Any]) -> Any:
        if any(isinstance(x, np.ndarray) for x in v.values()) and not fits_int64(v):
            v = {s: np.asarray(x).astype(object) for s, x in v.items()}  # Python ints: exact
        num, den = ratio(v)
        if c.kind == "divides":
            return (num % den == 0) & (num >= den)
        return num <= limit * den

    return test


def _checks(
    sg: SGraph, target: Target, order: list[str],
) -> dict[int, list[Callable[[Mapping[str, Any]], Any]]] | None:
    """The constraints on symbols of `order` alone, each at the position of its last symbol;
    None when a constant constraint fails (no assignment is valid)."""
    checks: dict[int, list[Callable[[Mapping[str, Any]], Any]]] = {}
    for c in sg.info.constraints:
        if not c.expr.symbols <= set(order):
            continue
        if c.expr.is_const():
            if not _compile(c, target)({}):
                return None
            continue
        last = max(order.index(s) for s in c.expr.symbols)
        checks.setdefault(last, []).append(_compile(c, target))
    return checks


def _order(chosen: frozenset[str], cands: Mapping[str, list[int]]) -> list[str]:
    return sorted(chosen, key=lambda s: (len(cands[s]), s))


def enumerate_assignments(
    sg: SGraph, target: Target, cands: Mapping[str, list[int]] | None = None, limit: int | None = None,
    symbols: frozenset[str] | None = None,
) -> Iterator[dict[str, int]]:
    """Every assignment (from the candidates) that meets all constraints, in a stable order.
    With `symbols`, assign only those, checking the constraints that mention nothing else."""
    cands = cands or candidates(sg)
    order = _order(sg.symbols if symbols is None else symbols, cands)
    checks = _checks(sg, target, order)
    if checks is None:
        return
    found = 0
    values: dict[str, int] = {}

    def walk(i: int) -> Iterator[dict[str, int]]:
        nonlocal found
        if i == len(order):
            found += 1
            yield dict(values)
            return
        s = order[i]
        for v in cands[s]:
            values[s] = v
            if all(chk(values) for chk in checks.get(i, [])):
                yield from walk(i + 1)
                if limit is not None and found >= limit:
                    return
        values.pop(s, None)

    yield from walk(0)


@dataclass(frozen=True)
class Table:
    """Assignments as columns: symbol -> int64 values, one per assignment (row)."""

    columns: dict[str, np.ndarray]
    rows: int

    def row(self, i: int) -> dict[str, int]:
        return {s: int(c[i]) for s, c in self.columns.items()}


def assignment_table(
    sg: SGraph, target: Target, cands: Mapping[str, list[int]] | None = None,
    symbols: frozenset[str] | None = None,
) -> Table:
    """What `enumerate_assignments` yields, in the same order, as columns built a symbol at a
    time (each constraint filters the rows as soon as its symbols are in): the cost model then
    estimates every assignment in a few array operations."""
    cands = cands or candidates(sg)
    order = _order(sg.symbols if symbols is None else symbols, cands)
    checks = _checks(sg, target, order)
    none = Table({s: np.zeros(0, np.int64) for s in order}, 0)
    if checks is None:
        return none
    columns: dict[str, np.ndarray] = {}
    rows = 1
    for i, s in enumerate(order):
        values = np.asarray(cands[s], dtype=np.int64)
        columns = {t: np.repeat(c, len(values)) for t, c in columns.items()}
        columns[s] = np.tile(values, rows)
        for check in checks.get(i, []):
            if not len(columns[s]):
                return none
            keep = np.asarray(check(columns), dtype=bool)
            columns = {t: c[keep] for t, c in columns.items()}
        rows = len(columns[s])
        if not rows:
            return none
    return Table(columns, rows)


def first_assignment(sg: SGraph, target: Target) -> dict[str, int] | None:
    """The first valid assignment (the same one the full enumeration meets first), or None.
    Symbols that share no constraint are independent, so each group is solved on its own: a
    kernel whose constraints no values meet fails at once instead of after a walk over the
    product of every other kernel's candidates."""
    out: dict[str, int] = {}
    for group in independent_groups(sg) or [frozenset()]:  # no symbols: the constant constraints alone
        found = next(enumerate_assignments(sg, target, limit=1, symbols=group), None)
        if found is None:
            return None
        out.update(found)
    return out


def independent_groups(sg: SGraph) -> list[frozenset[str]]:
    """The symbols split into groups that no constraint connects (connected components)."""
    parent = {s: s for s in sg.symbols}

    def find(s: str) -> str:
        while parent[s] != s:
            s = parent[s]
        return s

    for c in sg.info.constraints:
        names = sorted(c.expr.symbols)
        for s in names[1:]:
            parent[find(s)] = find(names[0])
    groups: dict[str, set[str]] = {}
    for s in sg.symbols:
        groups.setdefault(find(s), set()).add(s)
    return [frozenset(g) for _, g in sorted(groups.items())]


def size_of(expr: Size, values: Mapping[str, int]) -> int:
    return expr.int_value(values)


def interpretation_cost(sg: SGraph, values: Mapping[str, int]) -> int:
    """Block-iterations the interpreter runs for these values (what numeric checks cost)."""
    total = 0
    for k in sg.graph_kernels:
        blocks = 1
        for a in k.block.grid:
            blocks *= a.size.int_value(values)
        total += blocks * k.block.loop.size.int_value(values)
    return total


CHECK_COST_RATIO = 16  # checked assignments cost at most this many times the cheapest one


def pick_for_checks(sg: SGraph, target: Target, k: int = 3, pool: int = 4000) -> list[dict[str, int]]:
    """k valid assignments for numeric checks: every symbol above 1 where possible (a split by 1
    hides a wrong map), cheap to interpret, and as different from each other as possible. The
    first keeps every symbol away from 1 and 2 where the sizes allow (`_away_from_small`)."""
    full = candidates(sg)
    small = {s: sorted({1, *[v for v in vs if v > 1][:3]}) for s, vs in full.items()}
    cands = list(enumerate_assignments(sg, target, small, limit=pool))
    if not cands:
        cands = list(enumerate_assignments(sg, target, full, limit=pool))
    if not cands:
        return []
    syms = sorted(sg.symbols)
    cost = {id(v): interpretation_cost(sg, v) for v in cands}
    ranked = sorted(cands, key=lambda v: (sum(v[s] == 1 for s in syms), cost[id(v)]))
    away = _away_from_small(sg, target, full, pool)
    chosen = [away or ranked[0]]
    # Diversity within a cost cap: the most different values are often the largest, and the
    # interpreter's time grows with block-iterations (a check of 512 took 0.4 s, of 16 0.02 s).
    cap = CHECK_COST_RATIO * max(cost[id(ranked[0])], 1)
    budget = [v for v in ranked[: max(k * 20, 50)] if cost[id(v)] <= cap]
    while len(chosen) < k:
        best = max(
            (v for v in budget if v not in chosen),
            key=lambda v: (min(sum(v[s] != c[s] for s in syms) for c in chosen), -sum(v[s] == 1 for s in syms)),
            default=None,
        )
        if best is None:
            break
        chosen.append(best)
    return chosen


def _away_from_small(sg: SGraph, target: Target, full: Mapping[str, list[int]], pool: int) -> dict[str, int] | None:
    """The cheapest valid assignment with every symbol above 2 that can be (a schedule that
    doubles a loop's partial result is right only at F = 2, one that ignores a split only at 1),
    from each symbol's three smallest such values; None when the sizes leave no such assignment."""
    above = {s: [v for v in vs if v > 2][:3] or vs for s, vs in full.items()}
    found = list(enumerate_assignments(sg, target, above, limit=pool))
    return min(found, key=lambda v: interpretation_cost(sg, v), default=None)
