"""The e-graph prover: equality saturation (egglog) over the term language of `terms`.

`prove(lhs_terms, rhs_terms)` inserts both sides, derives the `indep(E, a)` facts (E does not
depend on axis a: inputs and constants depend on no axis, an op is independent of a when all its
operands are, `part(E, d, b)` adds b, the binders `sum_over`/`mean_over`/`cat_over` remove their
axis), applies the rules of `superopt.verifier.rules` one round at a time and stops as soon as
every pair of sides is in one e-class (proved), or when nothing changes (saturated without proof),
or at the iteration, node or time limit. Because no rule mentions a size, a proof holds for every
instantiation that meets the sGraph's divisibility constraints.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from egglog import (
    EGraph,
    Expr,
    Fact,
    String,
    StringLike,
    f64,
    f64Like,
    i64,
    i64Like,
    ne,
    relation,
    rule,
    ruleset,
    union,
    var,
)
from egglog import eq as egg_eq

from superopt.ops import Op
from superopt.verifier.rules import RULES, Indep, Le, Lt, Ne, Rule, permutation_rules
from superopt.verifier.terms import (
    SIGNATURES,
    AxisVar,
    ConstVar,
    DimVar,
    Ext,
    ExtVar,
    Node,
    PermVar,
    Term,
    Var,
    spell_out,
)


class X(Expr):
    """Extents (see superopt.verifier.terms.Ext)."""

    @classmethod
    def sym(cls, name: StringLike) -> X: ...
    def per(self, axis: StringLike) -> X: ...
    def times(self, axis: StringLike) -> X: ...


class T(Expr):
    """Tensor terms (see superopt.verifier.terms for the meaning of each constructor)."""

    @classmethod
    def inp(cls, name: StringLike) -> T: ...
    @classmethod
    def const(cls, value: f64Like) -> T: ...
    def add(self, other: T) -> T: ...
    def sub(self, other: T) -> T: ...
    def mul(self, other: T) -> T: ...
    def div(self, other: T) -> T: ...
    def neg(self) -> T: ...
    def exp(self) -> T: ...
    def sqrt(self) -> T: ...
    def relu(self) -> T: ...
    def sigmoid(self) -> T: ...
    def silu(self) -> T: ...
    def gelu(self) -> T: ...
    def sum(self, d: i64Like, n: X) -> T: ...
    def mean(self, d: i64Like, n: X) -> T: ...
    def max(self, d: i64Like) -> T: ...
    def squeeze(self, d: i64Like) -> T: ...
    def bcast(self, d: i64Like) -> T: ...
    def matmul(self, other: T, k: X) -> T: ...
    def transpose(self, perm: StringLike) -> T: ...
    def reshape(self, shape: StringLike) -> T: ...
    def part(self, d: i64Like, axis: StringLike) -> T: ...
    def sum_over(self, axis: StringLike) -> T: ...
    def mean_over(self, axis: StringLike) -> T: ...
    def cat_over(self, d: i64Like, axis: StringLike) -> T: ...


indep = relation("indep", T, String)
axis_fact = relation("axis", String)


class _Converter:
    """Terms (ground or patterns) to egglog expressions; pattern variables become egglog vars."""

    def __init__(self) -> None:
        self.vars: dict[str, Any] = {}
        self.memo: dict[Node, T] = {}

    def _var(self, name: str, sort: Any) -> Any:
        key = f"{sort.__name__}:{name}"
        if key not in self.vars:
            self.vars[key] = var(name, sort)
        return self.vars[key]

    def param(self, p: object) -> Any:
        if isinstance(p, DimVar):
            v = self._var(p.name, i64)
            return v + p.offset if p.offset else v
        if isinstance(p, AxisVar | PermVar):
            return self._var(p.name, String)
        if isinstance(p, ConstVar):
            return self._var(p.name, f64)
        if isinstance(p, ExtVar):
            return self._var(p.name, X)
        if isinstance(p, Ext):
            if p.kind == "sym":
                return X.sym(str(p.args[0]))
            inner, axis = self.param(p.args[0]), self.param(p.args[1])
            return inner.per(axis) if p.kind == "per" else inner.times(axis)
        return p

    def term(self, t: Term) -> T:
        if isinstance(t, Var):
            return self._var(t.name, T)
        if t in self.memo:
            return self.memo[t]
        kids = [self.term(c) for c in t.children]
        params = [self.param(p) for p in t.params]
        # Leaves are class methods of T; every other op is a method of its first operand.
        out = getattr(T, t.op)(*params) if not kids else getattr(kids[0], t.op)(*kids[1:], *params)
        self.memo[t] = out
        return out


def _conditions(conv: _Converter, r: Rule) -> list[Any]:
    facts: list[Any] = []
    for cond in r.conds:
        match cond:
            case Indep():
                facts.append(indep(conv.term(cond.e), conv.param(cond.a)))
            case Ne():
                facts.append(ne(conv.param(cond.x)).to(conv.param(cond.y)))
            case Lt():
                facts.append(conv.param(cond.x) < conv.param(cond.y))
            case Le():
                facts.append(conv.param(cond.x) <= i64(cond.k))
    return facts


def _compiled(rules: Sequence[Rule]) -> list[Any]:
    out = []
    for r in rules:
        conv = _Converter()
        root = var("root__", T)
        out.append(rule(egg_eq(root).to(conv.term(r.lhs)), *_conditions(conv, r), name=r.name)
                   .then(union(root).with_(conv.term(r.rhs))))
    return out


@functools.cache
def _rewrites(perms: tuple[str, ...]) -> Any:
    """The rules, with those of each permutation the proof's terms transpose by (`permutation_rules`)."""
    extra = [r for perm in perms for r in permutation_rules(perm)]
    return ruleset(*_BASE, *_compiled(extra), name="rewrites" + "".join(f"[{p}]" for p in perms))


def _perms(terms: Sequence[Term]) -> tuple[str, ...]:
    """The permutations these terms transpose by (terms share subterms: each is visited once)."""
    found: set[str] = set()
    stack, visited = list(terms), set()
    while stack:
        term = stack.pop()
        if not isinstance(term, Node) or id(term) in visited:
            continue
        visited.add(id(term))
        if term.op == Op.TRANSPOSE:
            found.add(str(term.params[0]))
        stack.extend(term.children)
    return tuple(sorted(found))


def _analysis_rules() -> Any:
    """Derive indep(E, a) bottom-up for every constructor."""
    out = []
    x, e, f = var("x__", T), var("e__", T), var("f__", T)
    a, b = var("a__", String), var("b__", String)
    d, name = var("d__", i64), var("n__", String)
    for op, (n_kids, kinds) in SIGNATURES.items():
        if op == "inp":
            out.append(rule(egg_eq(x).to(T.inp(name)), axis_fact(a)).then(indep(x, a)))
            continue
        if op == Op.CONST:
            out.append(rule(egg_eq(x).to(T.const(var("v__", f64))), axis_fact(a)).then(indep(x, a)))
            continue
        params: list[Any] = []
        for k in kinds:
            params.append({"dim": d, "axis": b, "str": name, "ext": var("n__", X)}[k])
        kids = [e, f][:n_kids]
        shape = getattr(kids[0], op)(*kids[1:], *params)
        if op in ("sum_over", "mean_over", "cat_over"):
            out.append(rule(egg_eq(x).to(shape)).then(indep(x, b)))
            out.append(rule(egg_eq(x).to(shape), indep(e, a), ne(a).to(b)).then(indep(x, a)))
        elif op == "part":
            out.append(rule(egg_eq(x).to(shape), indep(e, a), ne(a).to(b)).then(indep(x, a)))
        else:
            out.append(rule(egg_eq(x).to(shape), *[indep(k, a) for k in kids]).then(indep(x, a)))
    return ruleset(*out, name="indep")


_BASE = _compiled(RULES)
ANALYSIS = _analysis_rules()


@dataclass
class Limits:
    """How far one proof may go. A rule rewrites what the e-graph held when its round began, so a
    rewrite needed at every level of a term (a tile map pushed through a chain of 40 ops) takes a
    round per level: the rounds allowed are at least the deepest side's depth plus `DEPTH_ROUNDS`
    (`_prove_pairs`), whatever `iterations` says. The node and time limits hold the work."""

    iterations: int = 40
    nodes: int = 60_000
    seconds: float = 20.0


DEPTH_ROUNDS = 8  # rounds beyond the deepest side's depth (the rules after the level-by-level ones)


@dataclass
class ProofResult:
    proved: bool
    reason: str  # "proved" | "saturated" | "iteration limit" | "node limit" | "time limit"
    iterations: int
    enodes: int
    seconds: float
    rule_matches: dict[str, int] = field(default_factory=dict)
    spelled: bool = False  # proved (or refused) with the composites spelled out (`prove`)

    def certificate(self) -> dict[str, Any]:
        fired = {k: v for k, v in sorted(self.rule_matches.items()) if v}
        return {
            "reason": self.reason,
            "iterations": self.iterations,
            "enodes": self.enodes,
            "ms": round(self.seconds * 1e3, 2),
            "rule_applications": sum(fired.values()),
            "rules_fired": fired,
            "composites": "spelled" if self.spelled else "whole",
        }


@contextmanager
def dropped_here() -> Iterator[EGraph]:
    """A new e-graph whose engine is dropped when the block ends, by the thread that made it.
    egglog's engine may only be dropped by its own thread, but its Python state sits in
    reference cycles that the garbage collector frees on whichever thread it runs (a job
    worker's heartbeat, a service's request thread): the engine then leaks with a RuntimeError
    printed. (The state's engine field is egglog's own; nothing else reaches it.)"""
    egraph = EGraph()
    try:
        yield egraph
    finally:
        egraph._state.egraph = None  # type: ignore[assignment]


class _Kept:
    """This thread's e-graph, with the rulesets registered once: each proof runs on it between a
    push and a pop. A new e-graph per proof translated its ~100 rules to egglog again, a third of
    a small proof's time (rmsnorm_matmul's search made three proofs). Held by a thread-local, not in
    a reference cycle: when the thread ends, its locals go and the engine is dropped there (see
    `dropped_here`)."""

    def __init__(self) -> None:
        self.egraph = EGraph()
        self.registered: set[Any] = set()  # the idents of the rulesets registered
        self.proofs = 0

    def __del__(self) -> None:
        self.egraph._state.egraph = None  # type: ignore[assignment]

    @contextmanager
    def pushed(self, rulesets: Sequence[Any]) -> Iterator[EGraph]:
        """The kept e-graph, with these rulesets registered; what the block adds is popped after it."""
        for rs in rulesets:
            if rs.ident not in self.registered:
                self.egraph.run(rs * 0)  # registers the ruleset, runs nothing
                self.registered.add(rs.ident)
        self.egraph.push()
        try:
            yield self.egraph
        finally:
            pushed = self.egraph._state  # a copy that shares the engine: popped, it must not hold it
            self.egraph.pop()
            pushed.egraph = None  # type: ignore[assignment]


_kept = threading.local()
# Proofs on one kept e-graph: each push and pop leaves something behind inside egglog (150 proofs
# grew the process by 15 MiB and each proof by some 7%), so it is made anew after this many.
KEPT_PROOFS = 100


def prove(pairs: Sequence[tuple[Term, Term]], axes: Sequence[str], limits: Limits | None = None) -> ProofResult:
    """Decide whether each (lhs, rhs) pair is equal under the rules (one proof for all pairs).
    First with the composites whole (a composite is a function of its operand: equal operands
    make equal values, whatever it computes), then, if that fails, with them spelled out (a
    schedule may compute one from its definition, or share a part of it). Both together keep
    to the time limit."""
    limits = limits or Limits()
    whole = _prove_pairs(pairs, axes, limits)
    if whole.proved:
        return whole
    flat = spell_out([side for pair in pairs for side in pair])
    spelled = list(zip(flat[::2], flat[1::2], strict=True))
    if spelled == list(pairs):
        return whole
    out = _prove_pairs(spelled, axes, replace(limits, seconds=max(0.0, limits.seconds - whole.seconds)))
    out.seconds += whole.seconds
    out.spelled = True
    return out


def _prove_pairs(pairs: Sequence[tuple[Term, Term]], axes: Sequence[str], limits: Limits) -> ProofResult:
    """One proof. Pairs of identical terms (the unfused baseline lowers to the program's own)
    need no e-graph."""
    if all(lhs == rhs for lhs, rhs in pairs):
        return ProofResult(True, "proved", 0, 0, 0.0)
    if getattr(_kept, "prover", None) is None or _kept.prover.proofs >= KEPT_PROOFS:
        _kept.prover = _Kept()  # the one before goes here, on its own thread
    _kept.prover.proofs += 1
    sides = [side for pair in pairs for side in pair]
    rounds = max(limits.iterations, max(map(_depth, sides)) + DEPTH_ROUNDS)
    rewrites = _rewrites(_perms(sides))
    with _kept.prover.pushed([ANALYSIS, rewrites]) as egraph:
        return _prove(egraph, pairs, axes, rewrites, replace(limits, iterations=rounds))


def _depth(term: Term) -> int:
    """Levels from the term's root to its deepest leaf (a shared subterm measured once)."""
    depths: dict[int, int] = {}

    def walk(t: Term) -> int:
        if (d := depths.get(id(t))) is None:
            d = depths[id(t)] = 1 + max(map(walk, t.children), default=0) if isinstance(t, Node) else 1
        return d

    return walk(term)


def _prove(egraph: EGraph, pairs: Sequence[tuple[Term, Term]], axes: Sequence[str], rewrites: Any,
           limits: Limits) -> ProofResult:
    t0 = time.perf_counter()
    conv = _Converter()
    if axes:
        egraph.register(*(axis_fact(String(x)) for x in sorted(set(axes))))
    goals: list[Fact] = []
    for i, (lhs, rhs) in enumerate(pairs):
        lhs_e = egraph.let(f"lhs{i}", conv.term(lhs))
        rhs_e = egraph.let(f"rhs{i}", conv.term(rhs))
        goals.append(egg_eq(lhs_e).to(rhs_e))
    matches: Counter[str] = Counter()
    reason, it = "iteration limit", 0
    # One run per round, the rewrites then the analysis they call for: each run re-hashes every
    # rule of its rulesets and converts a report (half of a small proof's time, run twice a round).
    egraph.run(ANALYSIS.saturate())
    step = rewrites + ANALYSIS.saturate()
    while not egraph.check_bool(*goals):
        if it == limits.iterations:
            break
        report = egraph.run(step)
        it += 1
        for decl, n in report.num_matches_per_rule.items():
            if name := getattr(decl, "name", None):  # the rewrites (the analysis rules have no name)
                matches[name] += n
        if not report.updated:
            reason = "saturated"
            break
        if _size(egraph) > limits.nodes:
            reason = "node limit"
            break
        if time.perf_counter() - t0 > limits.seconds:
            reason = "time limit"
            break
    else:
        reason = "proved"
    return ProofResult(reason == "proved", reason, it, _size(egraph), time.perf_counter() - t0, dict(matches))


def _size(egraph: EGraph) -> int:
    return sum(n for _, n in egraph.all_function_sizes())
