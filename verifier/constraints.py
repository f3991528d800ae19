"""z3 over symbolic sizes: satisfiability of an sGraph's constraints, and the index lemmas.

`satisfiable(sg, target)` decides whether any instantiation exists (and gives one), from the
constraints alone: each `divides` constraint n / (product of symbols) becomes n = k * product with
k a positive integer, the block cap and shared-memory limit become polynomial inequalities after
clearing denominators: a cross-check of the fast enumerator the search uses
(superopt.assignments: `first_assignment` drops a symbolic sGraph no size can realize before a
proof is spent on it), as is `assignments`, which enumerates models.

`tile_map_lemmas()` proves, for symbolic sizes, the index arithmetic that the layout rules rest
on: the map from (tile index, offset) to an element index is in bounds, one-to-one and onto, for
one split and for a grid split followed by a loop split of the same dim. z3 does no induction,
so sums are not split directly; the bijection plus the reindexing of a finite sum gives the rules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3

from superopt.sgraph import SGraph
from superopt.sizes import Size
from superopt.targets import Target


def _encode(sg: SGraph, target: Target, bound: int) -> tuple[z3.Solver, dict[str, z3.ArithRef]]:
    syms = {s: z3.Int(s) for s in sorted(sg.symbols)}
    s = z3.Solver()
    s.set(timeout=30_000)  # gqa's reference takes 0.2 s, its first check in a process 3 s: slack for loaded machines
    for v in syms.values():
        s.add(v >= 1, v <= bound)
    for i, c in enumerate(sg.info.constraints):
        num, den = _polynomial(c.expr, syms)
        if c.kind == "divides":
            k = z3.Int(f"k{i}")
            s.add(k >= 1, num == k * den)
        else:
            limit = target.max_blocks if c.kind == "blocks" else target.smem_per_block
            s.add(num <= limit * den)
    return s, syms


def _polynomial(expr: Size, syms: dict[str, z3.ArithRef]) -> tuple[z3.ArithRef, z3.ArithRef]:
    """expr = num / den with num, den polynomials (den a monomial clearing every denominator)."""
    neg: dict[str, int] = {}
    den_const = 1
    for mono, coeff in expr.terms:
        den_const = den_const * coeff.denominator // _gcd(den_const, coeff.denominator)
        for name, e in mono:
            if e < 0:
                neg[name] = max(neg.get(name, 0), -e)
    den: z3.ArithRef = z3.IntVal(den_const)
    for name, e in neg.items():
        den = den * syms[name] ** e if e > 1 else den * syms[name]
    num: z3.ArithRef = z3.IntVal(0)
    for mono, coeff in expr.terms:
        term: z3.ArithRef = z3.IntVal(int(coeff * den_const))
        powers = dict(mono)
        for name in set(powers) | set(neg):
            e = powers.get(name, 0) + neg.get(name, 0)
            for _ in range(e):
                term = term * syms[name]
        num = num + term
    return num, den


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _bound(sg: SGraph) -> int:
    dims = [d for t in sg.inputs for d in t.shape]
    return max(dims) if dims else 1


def satisfiable(sg: SGraph, target: Target) -> tuple[bool | None, dict[str, int] | None]:
    """(True, an assignment) | (False, None) | (None, None) when z3 gives up."""
    if not sg.symbols:
        return True, {}
    s, syms = _encode(sg, target, _bound(sg))
    r = s.check()
    if r == z3.sat:
        m = s.model()
        return True, {n: m.eval(v).as_long() for n, v in syms.items()}
    return (False, None) if r == z3.unsat else (None, None)


def assignments(sg: SGraph, target: Target, limit: int = 10_000) -> list[dict[str, int]]:
    """Every valid assignment, found by z3 with blocking clauses (for cross-checks; slow)."""
    if not sg.symbols:
        return [{}]
    s, syms = _encode(sg, target, _bound(sg))
    out: list[dict[str, int]] = []
    while len(out) < limit and s.check() == z3.sat:
        m = s.model()
        values = {n: m.eval(v).as_long() for n, v in syms.items()}
        out.append(values)
        s.add(z3.Or([v != values[n] for n, v in syms.items()]))
    return out


@dataclass
class Lemma:
    name: str
    proved: bool
    ms: float


def _prove(name: str, claim: z3.BoolRef) -> Lemma:
    s = z3.Solver()
    s.set(timeout=10_000)
    s.add(z3.Not(claim))
    t0 = time.perf_counter()
    r = s.check()
    return Lemma(name, r == z3.unsat, (time.perf_counter() - t0) * 1e3)


def tile_map_lemmas() -> list[Lemma]:
    """The index facts behind part / cat_over / sum_over rules, over symbolic sizes."""
    k, w, i, j, i2, j2, e = z3.Ints("k w i j i2 j2 e")
    g, f, bl, it, bl2, it2, m, r = z3.Ints("g f bl it bl2 it2 m r")
    pos = z3.And(k >= 1, w >= 1)
    tile = lambda a, b: z3.And(a >= 0, a < k, b >= 0, b < w)
    lemmas = [
        _prove("split: in bounds", z3.Implies(z3.And(pos, tile(i, j)), z3.And(i * w + j >= 0, i * w + j < k * w))),
        _prove("split: one-to-one", z3.Implies(
            z3.And(pos, tile(i, j), tile(i2, j2), i * w + j == i2 * w + j2), z3.And(i == i2, j == j2))),
        _prove("split: onto", z3.Implies(
            z3.And(pos, e >= 0, e < k * w), z3.And(tile(e / w, e % w), (e / w) * w + e % w == e))),
    ]
    # Grid outer, loop inner: element = bl*(f*w) + it*w + j for a dim of size g*f*w.
    nested = lambda b, t, x: b * (f * w) + t * w + x
    inside = lambda b, t, x: z3.And(b >= 0, b < g, t >= 0, t < f, x >= 0, x < w)
    sizes = z3.And(g >= 1, f >= 1, w >= 1)
    lemmas += [
        _prove("grid then loop: in bounds", z3.Implies(
            z3.And(sizes, inside(bl, it, j)), z3.And(nested(bl, it, j) >= 0, nested(bl, it, j) < g * f * w))),
        _prove("grid then loop: one-to-one", z3.Implies(
            z3.And(sizes, inside(bl, it, j), inside(bl2, it2, j2), nested(bl, it, j) == nested(bl2, it2, j2)),
            z3.And(bl == bl2, it == it2, j == j2))),
        # Onto: the Euclidean decomposition of any element index (e = bl*m + r, r = it*w + j,
        # which exists for every e) lands inside the (block, iteration, offset) space.
        _prove("grid then loop: onto", z3.Implies(
            z3.And(sizes, m == f * w, e >= 0, e < g * m, e == bl * m + r, r >= 0, r < m,
                   r == it * w + j, j >= 0, j < w),
            z3.And(inside(bl, it, j), nested(bl, it, j) == e))),
        # A tile of a concatenation over the same axis is the piece it came from (part-of-cat).
        _prove("concat then split: same piece", z3.Implies(
            z3.And(pos, tile(i, j)), z3.And((i * w + j) / w == i, (i * w + j) % w == j))),
    ]
    return lemmas


def ragged_split_counterexample() -> dict[str, int] | None:
    """A tiling that does not divide misses elements: z3 finds such sizes (sanity of the encoding)."""
    n, w, e = z3.Ints("n w e")
    s = z3.Solver()
    s.add(n >= 1, w >= 1, e >= 0, e < n, z3.Not(e / w < n / w))
    if s.check() != z3.sat:
        return None
    m = s.model()
    return {"n": m[n].as_long(), "w": m[w].as_long(), "e": m[e].as_long()}
