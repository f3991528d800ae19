"""Valid assignments of an sGraph's symbols: candidate values and a backtracking enumeration.

Candidates for a symbol are the divisors of the sizes it splits (DESIGN.md §6 level 2); the
enumeration assigns symbols one at a time and checks each constraint as soon as all of its
symbols have values, in exact integer arithmetic, so invalid branches are cut early.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from math import gcd

from superopt.sgraph import Constraint, SGraph
from superopt.sizes import Size
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


def _compile(c: Constraint, target: Target) -> Callable[[Mapping[str, int]], bool]:
    terms = [(coeff.numerator, coeff.denominator, mono) for mono, coeff in c.expr.terms]

    def value(v: Mapping[str, int]) -> tuple[int, int]:
        num, den = 0, 1
        for cn, cd, mono in terms:
            tn, td = cn, cd
            for s, e in mono:
                if e > 0:
                    tn *= v[s] ** e
                else:
                    td *= v[s] ** -e
            num, den = num * td + tn * den, den * td
        return num, den

    if c.kind == "divides":
        return lambda v: (lambda nd: nd[0] % nd[1] == 0 and nd[0] >= nd[1])(value(v))
    limit = target.max_blocks if c.kind == "blocks" else target.smem_per_block
    return lambda v: (lambda nd: nd[0] <= limit * nd[1])(value(v))


def enumerate_assignments(
    sg: SGraph, target: Target, cands: Mapping[str, list[int]] | None = None, limit: int | None = None,
    symbols: frozenset[str] | None = None,
) -> Iterator[dict[str, int]]:
    """Every assignment (from the candidates) that meets all constraints, in a stable order.
    With `symbols`, assign only those, checking the constraints that mention nothing else."""
    cands = cands or candidates(sg)
    chosen = sg.symbols if symbols is None else symbols
    order = sorted(chosen, key=lambda s: (len(cands[s]), s))
    checks: dict[int, list[Callable[[Mapping[str, int]], bool]]] = {}
    for c in sg.info.constraints:
        if not c.expr.symbols <= chosen:
            continue
        if c.expr.is_const():
            if not _compile(c, target)({}):
                return
            continue
        last = max(order.index(s) for s in c.expr.symbols)
        checks.setdefault(last, []).append(_compile(c, target))
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
    hides a wrong map), cheap to interpret, and as different from each other as possible."""
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
    chosen = [ranked[0]]
    # Diversity within a cost cap: the most different values are often the largest, and the
    # interpreter's time grows with block-iterations (a check of 512 took 0.4 s, of 16 0.02 s).
    cap = CHECK_COST_RATIO * max(cost[id(ranked[0])], 1)
    budget = [v for v in ranked[: max(k * 20, 50)] if cost[id(v)] <= cap]
    while len(chosen) < min(k, len(cands)):
        best = max(
            (v for v in budget if v not in chosen),
            key=lambda v: (min(sum(v[s] != c[s] for s in syms) for c in chosen), -sum(v[s] == 1 for s in syms)),
            default=None,
        )
        if best is None:
            break
        chosen.append(best)
    return chosen
