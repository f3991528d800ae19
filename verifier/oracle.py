"""The abstract-expression oracle that prunes the search (Mirage's rule, our implementation).

Every tensor of a candidate has an abstract expression: tiling erased (parts, concatenations and
broadcasts are identities), `matmul -> sum(mul)`, every reduction and sum/mean accumulator ->
`sum`, constants one atom `c` that multiplication and division by absorb, signs dropped, no sizes
or dims. The target program's abstract expression is saturated once in an e-graph with the
equality axioms (commutativity and associativity of + and *, distributivity, moving * through /,
sums of sums, sums distributing over + and out of /, exp(a) exp(b) = exp(a + b), sqrt(a) sqrt(b)
= sqrt(a b); no cancellation axioms, which would make everything a subexpression of everything).
A prefix survives only if each of its new expressions is present in that e-graph: a lookup, not
a solver call.

Directed simplifications (sum of a sum, sums over + and /, constants) are applied when an
expression is built, so candidates arrive in the normal form the saturated target also holds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egglog import EGraph, Expr, StringLike, birewrite, expr_fact, rewrite, ruleset, vars_

from superopt.primitives import Algebra, apply
from superopt.program import Program

AE = tuple[Any, ...]  # ("inp", name) | ("c",) | (op, *children)
C: AE = ("c",)


def mk(op: str, *kids: AE) -> AE:
    """Build an abstract expression in normal form for the directed simplifications."""
    if op == "mul":
        a, b = kids
        if a == C:
            return b
        if b == C:
            return a
    if op == "div" and kids[1] == C:
        return kids[0]
    if op == "sum":
        (x,) = kids
        if x[0] == "sum":
            return x
        if x[0] == "add":
            return mk("add", mk("sum", x[1]), mk("sum", x[2]))
        if x[0] == "div":
            return mk("div", mk("sum", x[1]), x[2])
        if x == C:
            return C
    if op in ("add", "exp", "sqrt", "relu", "max") and all(k == C for k in kids):
        return C
    return (op, *kids)


class AbstractAlgebra(Algebra[AE]):
    def const(self, value: float) -> AE:
        return C

    def add(self, a: AE, b: AE) -> AE:
        return mk("add", a, b)

    sub = add  # signs are dropped

    def mul(self, a: AE, b: AE) -> AE:
        return mk("mul", a, b)

    def div(self, a: AE, b: AE) -> AE:
        return mk("div", a, b)

    def neg(self, a: AE) -> AE:
        return a

    def exp(self, a: AE) -> AE:
        return mk("exp", a)

    def sqrt(self, a: AE) -> AE:
        return mk("sqrt", a)

    def relu(self, a: AE) -> AE:
        return mk("relu", a)

    def sum(self, a: AE, dim: int, keepdim: bool) -> AE:
        return mk("sum", a)

    def max(self, a: AE, dim: int, keepdim: bool) -> AE:
        return mk("max", a)

    def mean(self, a: AE, dim: int, keepdim: bool, n: Any) -> AE:
        return mk("sum", a)

    def matmul(self, a: AE, b: AE) -> AE:
        return mk("sum", mk("mul", a, b))

    def transpose(self, a: AE, perm: Sequence[int]) -> AE:
        return a

    def reshape(self, a: AE, shape: Sequence[int]) -> AE:
        return a


def abstract_program(program: Program) -> dict[str, AE]:
    alg = AbstractAlgebra()
    values: dict[str, AE] = {}
    for n in program.topological():
        if n.op == "input":
            values[n.id] = ("inp", n.id)
        else:
            args = [values[i] for i in n.inputs]
            values[n.id] = apply(alg, n.op, args, n.attrs, [program.nodes[i].shape for i in n.inputs])
    return values


class Abs(Expr):
    @classmethod
    def inp(cls, name: StringLike) -> Abs: ...
    @classmethod
    def c(cls) -> Abs: ...
    def add(self, other: Abs) -> Abs: ...
    def mul(self, other: Abs) -> Abs: ...
    def div(self, other: Abs) -> Abs: ...
    def exp(self) -> Abs: ...
    def sqrt(self) -> Abs: ...
    def relu(self) -> Abs: ...
    def sum(self) -> Abs: ...
    def max(self) -> Abs: ...


def _axioms() -> Any:
    x, y, z = vars_("x y z", Abs)
    return ruleset(
        rewrite(x.add(y)).to(y.add(x)),
        birewrite(x.add(y.add(z))).to(x.add(y).add(z)),
        rewrite(x.mul(y)).to(y.mul(x)),
        birewrite(x.mul(y.mul(z))).to(x.mul(y).mul(z)),
        birewrite(x.mul(y.add(z))).to(x.mul(y).add(x.mul(z))),
        birewrite(x.mul(y.div(z))).to(x.mul(y).div(z)),
        birewrite(x.div(y).div(z)).to(x.div(y.mul(z))),
        birewrite(x.exp().mul(y.exp())).to(x.add(y).exp()),
        birewrite(x.sqrt().mul(y.sqrt())).to(x.mul(y).sqrt()),
        rewrite(x.sum().sum()).to(x.sum()),
        rewrite(x.add(y).sum()).to(x.sum().add(y.sum())),
        rewrite(x.div(y).sum()).to(x.sum().div(y)),
        rewrite(x.mul(Abs.c())).to(x),
        rewrite(x.div(Abs.c())).to(x),
        name="abstract_axioms",
    )


AXIOMS = _axioms()


def to_egg(e: AE, memo: dict[AE, Abs] | None = None) -> Abs:
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    if e[0] == "inp":
        out = Abs.inp(e[1])
    elif e[0] == "c":
        out = Abs.c()
    else:
        kids = [to_egg(k, memo) for k in e[1:]]
        out = getattr(kids[0], e[0])(*kids[1:])
    memo[e] = out
    return out


@dataclass
class OracleStats:
    saturate_ms: float
    enodes: int
    iterations: int
    saturated: bool
    queries: int = 0
    hits: int = 0


class Oracle:
    """Answers `contains(expr)`: is expr a subexpression of an A_eq-equivalent form of the target?"""

    def __init__(self, program: Program, iterations: int = 12, node_limit: int = 20_000) -> None:
        t0 = time.perf_counter()
        values = abstract_program(program)
        self.egraph = EGraph()
        for i, o in enumerate(program.outputs):
            self.egraph.let(f"target{i}", to_egg(values[o]))
        it, saturated = 0, False
        while it < iterations:
            report = self.egraph.run(AXIOMS)
            it += 1
            if not report.updated:
                saturated = True
                break
            if sum(n for _, n in self.egraph.all_function_sizes()) > node_limit:
                break
        enodes = sum(n for _, n in self.egraph.all_function_sizes())
        self.stats = OracleStats((time.perf_counter() - t0) * 1e3, enodes, it, saturated)
        self._memo: dict[AE, bool] = {}
        self._egg: dict[AE, Abs] = {}

    def contains(self, e: AE) -> bool:
        hit = self._memo.get(e)
        if hit is None:
            self.stats.queries += 1
            hit = e == C or self.egraph.check_bool(expr_fact(to_egg(e, self._egg)))
            self._memo[e] = hit
        else:
            self.stats.hits += 1
        return hit


def accumulate(kind: str, x: AE, walks_loop: bool) -> AE:
    """Abstract expression of an accumulator: a sum over the loop when the value changes with the
    iteration; the value itself (up to a constant factor) when it does not, or for a concat."""
    if kind == "concat" or not walks_loop:
        return x
    return mk("sum", x)


def abstract_sgraph(sg: Any) -> list[tuple[str, str, AE]]:
    """(kernel id, tensor id, abstract expression) for every tensor an sGraph computes."""
    from superopt.sgraph import LibraryKernel

    alg = AbstractAlgebra()
    values: dict[str, AE] = {d.id: ("inp", d.id) for d in sg.inputs}
    out: list[tuple[str, str, AE]] = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            values[k.output] = apply(alg, k.op, [values[i] for i in k.inputs], k.attrs, [])
            out.append((k.id, k.output, values[k.output]))
            continue
        b = k.block
        looping = not (b.loop.size.is_const() and b.loop.size.const_value() == 1)
        bv: dict[str, AE] = {}
        walks: dict[str, bool] = {}
        for i in b.inputs:
            bv[i.id], walks[i.id] = values[i.tensor], looping and i.fmap is not None
        for op in b.body:
            bv[op.id] = apply(alg, op.op, [bv[i] for i in op.inputs], op.attrs, [])
            walks[op.id] = any(walks[i] for i in op.inputs)
            out.append((k.id, op.id, bv[op.id]))
        for a in b.accumulators:
            bv[a.id] = accumulate(a.kind, bv[a.source], walks[a.source])
            out.append((k.id, a.id, bv[a.id]))
        for op in b.post:
            bv[op.id] = apply(alg, op.op, [bv[i] for i in op.inputs], op.attrs, [])
            out.append((k.id, op.id, bv[op.id]))
        for o in b.outputs:
            values[o.tensor] = bv[o.source]
    return out
