"""The abstract-expression oracle that prunes the search (Mirage's rule, our implementation).

Every tensor of a candidate has an abstract expression: tiling erased (parts, concatenations and
broadcasts are identities), `matmul -> sum(mul)`, every sum or mean reduction -> `sum`, constants
one atom `c` that multiplication and division by absorb (the program's own constants each a leaf
of its own), signs kept, no sizes, one-operand elementwise composites (gelu, silu, sigmoid) whole
(`OPAQUE`). A reduction
records the *dim class* it reduces (superopt.dimclasses; symbolic dimension matching), so a sum
over the wrong dim is not a subexpression of the target. An accumulator adds nothing: a sum of
partial sums over the dim its loop walks is that same sum. The target program's abstract
expression is saturated once in an e-graph with the
equality axioms (commutativity and associativity of + and *, factoring x y + x z into x (y + z),
moving * through /, sums of sums, sums distributing over + and out of / and past an input
constant along the summed class (`FREEDOM`: a product's row sums taken on its weights),
exp(a) exp(b) = exp(a + b), sqrt(a) sqrt(b) = sqrt(a b), a sign taken before or after a product, a quotient or a
sum; no cancellation axioms, which would make everything a
subexpression of everything). Distributivity is applied in the factoring direction only: expanding
products over sums blows the e-graph up (a target with a few nested sums reached 29,000 e-nodes
without saturating) and admits pointless prefixes such as H + H; a schedule that expands a
product is never cheaper than one that factors it.
A prefix survives only if each of its new expressions is present in that e-graph: a lookup in a
hash-cons read back from the saturated e-graph, not a solver call.

Directed simplifications (sum of a sum, sums over + and /, constants) are applied when an
expression is built, so candidates arrive in the normal form the saturated target also holds.
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from egglog import EGraph, Expr, String, StringLike, birewrite, i64, i64Like, ne, relation, rewrite, ruleset, var, vars_
from egglog import union as union_of

from superopt.dimclasses import NO_CLASS, dim_classes, input_classes
from superopt.ops import Op
from superopt.primitives import Algebra, apply
from superopt.program import Program
from superopt.verifier.egraph import dropped_here
from superopt.verifier.reach import REDUCTIONS, Reach

AE = tuple[Any, ...]  # ("inp", name) | ("c",) | ("k", factor) | ("sum" | "max", dim class, x) | (op, *children)
AV = tuple[AE, tuple[int, ...]]  # an abstract value: expression, and the dim class of each dim
C: AE = ("c",)
UNIT = NO_CLASS


def mk(op: str, *kids: Any) -> AE:
    """Build an abstract expression in normal form for the directed simplifications."""
    if op == Op.NEG:
        (x,) = kids
        return x[1] if x[0] == Op.NEG else C if x == C else (Op.NEG, x)
    if op == Op.MUL:
        a, b = kids
        if a == C:
            return b
        if b == C:
            return a
    if op == Op.DIV and kids[1] == C:
        return kids[0]
    if op == Op.SUM:
        cls, x = kids
        if x == C:
            return C
        if x[0] == Op.ADD:
            return mk(Op.ADD, mk(Op.SUM, cls, x[1]), mk(Op.SUM, cls, x[2]))
        if x[0] == Op.DIV:
            return mk(Op.DIV, mk(Op.SUM, cls, x[1]), x[2])
        if x[0] == Op.SUM:
            if x[1] == cls:
                return x  # a sum of partial sums over the same dim is that sum
            if x[1] < cls:
                return (Op.SUM, x[1], mk(Op.SUM, cls, x[2]))  # nested sums in class order
    if op in (Op.ADD, Op.EXP, Op.SQRT, Op.RELU, *OPAQUE) and all(k == C for k in kids):
        return C
    return (op, *kids)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else UNIT
        y = b[-i] if i <= len(b) else UNIT
        out.append(y if x == UNIT else x)
    return tuple(reversed(out))


class AbstractAlgebra(Algebra[AV]):
    """Abstract values: tiling erased, matmul -> sum over its contraction class of mul,
    reductions -> sum (max stays max) over the class of the reduced dim, constants one atom —
    except the program's own constants (`constants_of`), each a leaf ("k", value) of its own.
    Absorbing a factor (x * 0.25 is x) would make the scaled value look like a recomputation of
    the unscaled one, so the scaling could never be generated; one atom for every added constant
    would make x + 0.5 and x + eps (a norm's) one value, so only the first generated could be
    kept. As leaves, the oracle admits a constant exactly where the target's forms carry it."""

    def __init__(self, constants: frozenset[float] = frozenset()) -> None:
        self.constants = constants

    def const(self, value: float) -> AV:
        return (("k", repr(float(value))) if float(value) in self.constants else C), ()

    def _binary(self, op: str, a: AV, b: AV) -> AV:
        return mk(op, a[0], b[0]), _broadcast(a[1], b[1])

    def add(self, a: AV, b: AV) -> AV:
        return self._binary(Op.ADD, a, b)

    def sub(self, a: AV, b: AV) -> AV:
        return self._binary(Op.ADD, a, self.neg(b))

    def mul(self, a: AV, b: AV) -> AV:
        return self._binary(Op.MUL, a, b)

    def div(self, a: AV, b: AV) -> AV:
        return self._binary(Op.DIV, a, b)

    def neg(self, a: AV) -> AV:
        return mk(Op.NEG, a[0]), a[1]

    def exp(self, a: AV) -> AV:
        return mk(Op.EXP, a[0]), a[1]

    def sqrt(self, a: AV) -> AV:
        return mk(Op.SQRT, a[0]), a[1]

    def relu(self, a: AV) -> AV:
        return mk(Op.RELU, a[0]), a[1]

    def _reduce(self, op: str, a: AV, dim: int, keepdim: bool) -> AV:
        dims = a[1]
        d = dim % len(dims)
        out = (*dims[:d], UNIT, *dims[d + 1 :]) if keepdim else (*dims[:d], *dims[d + 1 :])
        return mk(op, dims[d], a[0]), out

    def sum(self, a: AV, dim: int, keepdim: bool) -> AV:
        return self._reduce(Op.SUM, a, dim, keepdim)

    def max(self, a: AV, dim: int, keepdim: bool) -> AV:
        return self._reduce(Op.MAX, a, dim, keepdim)

    def mean(self, a: AV, dim: int, keepdim: bool, n: Any) -> AV:
        return self._reduce(Op.SUM, a, dim, keepdim)

    def matmul(self, a: AV, b: AV) -> AV:
        return mk(Op.SUM, a[1][-1], mk(Op.MUL, a[0], b[0])), (*a[1][:-1], b[1][-1])

    def transpose(self, a: AV, perm: Sequence[int]) -> AV:
        return a[0], tuple(a[1][p] for p in perm)

    def reshape(self, a: AV, shape: Sequence[int]) -> AV:
        return a[0], tuple(RESHAPED if s != 1 else UNIT for s in shape)

    def apply(self, op: str, args: Sequence[AV], attrs: Mapping[str, Any], shapes: Sequence[Any]) -> AV:
        """`primitives.apply`, except that an elementwise composite of one operand (`OPAQUE`) is a
        function symbol of its own, not its definition: gelu's is a polynomial under a sigmoid,
        and every subterm of its saturated forms would be a value a block graph may compute
        (x*x, x*x*x, x + c*x*x*x, ... of every sum it is applied to), each a rearrangement no
        cheaper than the composite itself, which fuses whole."""
        if op in OPAQUE:
            return mk(op, args[0][0]), args[0][1]
        return apply(self, op, args, attrs, shapes)


# Elementwise composites the abstract values keep whole (`AbstractAlgebra.apply`): none holds a
# reduction a fused schedule must split, and computing one from its definition is never cheaper.
OPAQUE = (Op.GELU, Op.SILU, Op.SIGMOID)
RESHAPED = -2  # dims out of a reshape: the classes do not follow them (reductions over them match any)


def constants_of(program: Program) -> frozenset[float]:
    """The values of the program's constants (scalar operands of its ops)."""
    return frozenset(float(n.attrs["value"]) for n in program.nodes.values() if n.op == Op.CONST)


def abstract_program(program: Program) -> dict[str, AV]:
    """Each node's abstract value. A reshape's dims take the program's dim classes
    (`dim_classes`: those its later ops tie them to), which the algebra cannot know; a schedule's
    reshape of the same value gets them too (`KernelSearch._reshapes`)."""
    alg = AbstractAlgebra(constants_of(program))
    values: dict[str, AV] = {}
    classes = dim_classes(program)
    for n in program.topological():
        if n.op == "input":
            values[n.id] = ("inp", n.id), tuple(classes[(n.id, d)] for d in range(len(n.shape)))
        else:
            args = [values[i] for i in n.inputs]
            ae, dims = alg.apply(n.op, args, n.attrs, [program.nodes[i].shape for i in n.inputs])
            if n.op == Op.RESHAPE:
                dims = tuple(classes[(n.id, d)] for d in range(len(n.shape)))
            values[n.id] = ae, dims
    return values


class Abs(Expr):
    @classmethod
    def inp(cls, name: StringLike) -> Abs: ...
    @classmethod
    def c(cls) -> Abs: ...
    @classmethod
    def k(cls, value: StringLike) -> Abs: ...
    def __add__(self, other: Abs) -> Abs: ...
    def __mul__(self, other: Abs) -> Abs: ...
    def __truediv__(self, other: Abs) -> Abs: ...
    def __neg__(self) -> Abs: ...
    def exp(self) -> Abs: ...
    def sqrt(self) -> Abs: ...
    def relu(self) -> Abs: ...
    def gelu(self) -> Abs: ...
    def silu(self) -> Abs: ...
    def sigmoid(self) -> Abs: ...
    def sum(self, cls: i64Like) -> Abs: ...
    def max(self, cls: i64Like) -> Abs: ...


def _axioms() -> Any:
    x, y, z = vars_("x y z", Abs)
    c, d = vars_("c d", i64)
    return ruleset(
        rewrite(x + y).to(y + x),
        birewrite(x + (y + z)).to((x + y) + z),
        rewrite(x * y).to(y * x),
        birewrite(x * (y * z)).to((x * y) * z),
        rewrite(x * y + x * z).to(x * (y + z)),
        birewrite(x * (y / z)).to((x * y) / z),
        birewrite((x / y) / z).to(x / (y * z)),
        birewrite(x.exp() * y.exp()).to((x + y).exp()),
        birewrite(x.sqrt() * y.sqrt()).to((x * y).sqrt()),
        rewrite(x.sum(c).sum(c)).to(x.sum(c)),
        rewrite(x.sum(c).sum(d)).to(x.sum(d).sum(c), ne(c).to(d)),
        rewrite((x + y).sum(c)).to(x.sum(c) + y.sum(c)),
        rewrite((x / y).sum(c)).to(x.sum(c) / y),
        # A sign may be taken before or after a product, a quotient or a sum: both forms are kept,
        # so a schedule that negates early or late finds its prefixes.
        birewrite(-x * y).to(-(x * y)),
        birewrite(-x / y).to(-(x / y)),
        birewrite(x / -y).to(-(x / y)),
        birewrite((-x).sum(c)).to(-x.sum(c)),
        rewrite(x * Abs.c()).to(x),
        rewrite(x / Abs.c()).to(x),
        name="abstract_axioms",
    )


AXIOMS = _axioms()
# free(X, c): program input X is constant along dim class c (it has no dim of that class)
free = relation("free", Abs, i64)


def _freedom() -> Any:
    """A sum over c of X y, X an input constant along c, is X times the sum of y: a sum of a
    product's columns is the product with the right operand's columns summed first (X @ rowsum(W):
    a matrix-vector product, W read once), a value the search may compute. Only inputs, and only
    that direction: with any factor constant along the sum (a softmax's exp(-max) is one), the
    forms it admits multiplied attention's block spaces by ten."""
    y = var("y", Abs)
    n = var("n", String)
    c = var("c", i64)
    x = Abs.inp(n)
    return ruleset(rewrite((x * y).sum(c)).to(x * y.sum(c), free(x, c)), name="freedom")


FREEDOM = _freedom()


def _free_leaves(program: Program) -> list[Any]:
    """The facts of `free`: an input is constant along each class it has no dim of."""
    classes = dim_classes(program)
    every = sorted({c for c in classes.values() if c >= 0})
    return [free(Abs.inp(n.id), i64(c)) for n in program.inputs for c in every
            if c not in {classes[(n.id, i)] for i in range(len(n.shape))}]


# The abstract ops written as operators on `Abs`, and the names egglog gives those operators.
_OPERATORS: dict[str, Callable[..., Abs]] = {
    Op.ADD: operator.add, Op.MUL: operator.mul, Op.DIV: operator.truediv, Op.NEG: operator.neg,
}
_SPELLED = {"· + ·": Op.ADD, "· * ·": Op.MUL, "· / ·": Op.DIV, "-·": Op.NEG}


def to_egg(e: AE, memo: dict[AE, Abs] | None = None) -> Abs:
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    if e[0] == "inp":
        out = Abs.inp(e[1])
    elif e[0] == "c":
        out = Abs.c()
    elif e[0] == "k":
        out = Abs.k(e[1])
    elif e[0] in REDUCTIONS:
        out = getattr(to_egg(e[2], memo), e[0])(e[1])
    else:
        kids = [to_egg(k, memo) for k in e[1:]]
        out = _OPERATORS[e[0]](*kids) if e[0] in _OPERATORS else getattr(kids[0], e[0])(*kids[1:])
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
    """Answers `contains(expr)`: is expr a subexpression of an A_eq-equivalent form of the target?

    The target is saturated once with egglog; the saturated e-graph is then read back into a
    hash-cons (e-node -> e-class), so a query walks the expression bottom-up with dictionary
    lookups: an expression is in the e-graph exactly when each of its e-nodes is (congruence makes
    the children's classes determine the node). This answers what `check_bool(expr)` answers on
    the same e-graph, in microseconds instead of a solver round trip per query."""

    def __init__(self, program: Program, iterations: int = 12, node_limit: int = 20_000,
                 forms: Sequence[Program] = ()) -> None:
        """`forms`: programs the search claims equal to `program` (same inputs and outputs), each
        output taken as one more form of the target's: the search may then build their values.
        Admission only: a candidate is proved against `program`, so a wrong form is refused there."""
        t0 = time.perf_counter()
        values = abstract_program(program)
        # Not kept: egglog's e-graph may only be dropped by the thread that made it (`dropped_here`),
        # and an oracle can outlive its thread (a service's search). The hash-cons below is all
        # that queries need.
        outputs = [values[o][0] for o in program.outputs]
        with dropped_here() as egraph:
            for i, e in enumerate(outputs):
                egraph.let(f"target{i}", to_egg(e))
            # The program's own values, as their ops compute them: built in normal form, a sum
            # distributes over the + it reads, so sum(sigmoid(X) + S) holds no sigmoid(X) + S,
            # the value an elementwise chain computes whole before that sum.
            inner = [n for n in program.topological()
                     if n.op not in ("input", Op.CONST) and n.id not in program.outputs]
            for k, n in enumerate(inner):
                egraph.let(f"value{k}", to_egg(values[n.id][0]))
            for form in forms:
                other = abstract_program(form)
                if [other[o][1] for o in form.outputs] == [values[o][1] for o in program.outputs] and \
                        all(other.get(n.id, (None, None))[1] == values[n.id][1] for n in program.inputs):
                    egraph.register(*(union_of(to_egg(e)).with_(to_egg(other[o][0]))
                                      for e, o in zip(outputs, form.outputs, strict=True)))
            if facts := _free_leaves(program):
                egraph.register(*facts)
            it, saturated = 0, False
            while it < iterations:
                report = egraph.run(AXIOMS + FREEDOM)
                it += 1
                if not report.updated:
                    saturated = True
                    break
                if sum(n for _, n in egraph.all_function_sizes()) > node_limit:
                    break
            enodes = sum(n for _, n in egraph.all_function_sizes())
            self._nodes = _hashcons(egraph)
        self.alg = AbstractAlgebra(constants_of(program))  # for the search's abstract values
        self._classes: dict[AE, str | None] = {}
        self._targets = [self.class_of(e) for e in outputs]
        self.stats = OracleStats((time.perf_counter() - t0) * 1e3, enodes, it, saturated)
        self._memo: dict[AE, bool] = {}

    def class_of(self, e: AE) -> str | None:
        """The e-class holding `e`, or None when the e-graph does not contain it."""
        if e in self._classes:
            return self._classes[e]
        if e[0] in ("inp", "c", "k"):
            key: tuple[Any, ...] = e
        elif e[0] in REDUCTIONS:
            key = (e[0], self.class_of(e[2]), e[1])
        else:
            key = (e[0], *(self.class_of(k) for k in e[1:]))
        found = None if None in key else self._nodes.get(key)
        self._classes[e] = found
        return found

    def output_class(self, output: int) -> str | None:
        """The e-class of program output `output`."""
        return self._targets[output]

    @cached_property
    def reach(self) -> Reach:
        """What a kernel can compute from the values it reads (`Reach`), on this e-graph."""
        return Reach(self._nodes)

    def is_output(self, e: AE) -> bool:
        """Is e equal (under the axioms) to some program output's abstract expression?"""
        found = self.class_of(e)
        return found is not None and found in self._targets

    def equivalent(self, e: AE, output: int) -> bool:
        """Is e equal (under the axioms) to the abstract expression of program output `output`?"""
        found = self.class_of(e)
        return found is not None and found == self._targets[output]

    def contains(self, e: AE) -> bool:
        hit = self._memo.get(e)
        if hit is None:
            self.stats.queries += 1
            hit = e == C or self.class_of(e) is not None
            self._memo[e] = hit
        else:
            self.stats.hits += 1
        return hit


def _hashcons(egraph: EGraph) -> dict[tuple[Any, ...], str]:
    """Every e-node of `egraph` as (op, child e-classes or literal arguments) -> its e-class, in
    the key layout `Oracle.class_of` builds (method calls put the receiver first)."""
    nodes = json.loads(egraph._serialize().to_json())["nodes"]

    def argument(node_id: str) -> Any:
        node = nodes[node_id]
        if node_id.startswith("primitive-"):
            return json.loads(node["op"])  # a string or i64 literal, as the abstract expression holds it
        return node["eclass"]

    table: dict[tuple[Any, ...], str] = {}
    for node_id, node in nodes.items():
        op = _SPELLED.get(node["op"]) or node["op"].rsplit(".", 1)[-1]
        if not node_id.startswith("primitive-") and op != "free":  # facts, not values
            table[(op, *(argument(c) for c in node["children"]))] = node["eclass"]
    return table


def abstract_sgraph(sg: Any, program: Program) -> list[tuple[str, str, AE]]:
    """(kernel id, tensor id, abstract expression) for every tensor an sGraph computes."""
    from superopt.sgraph import LibraryKernel

    alg = AbstractAlgebra(constants_of(program))
    values: dict[str, AV] = {d.id: (("inp", d.id), cls) for d, cls in
                             zip(sg.inputs, input_classes(program).values(), strict=True)}
    out: list[tuple[str, str, AE]] = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            values[k.output] = alg.apply(k.op, [values[i] for i in k.inputs], k.attrs, [])
            out.append((k.id, k.output, values[k.output][0]))
            continue
        b = k.block
        bv: dict[str, AV] = {i.id: values[i.tensor] for i in b.inputs}
        for op in b.body:
            bv[op.id] = alg.apply(op.op, [bv[i] for i in op.inputs], op.attrs, [])
            out.append((k.id, op.id, bv[op.id][0]))
        for a in b.accumulators:
            bv[a.id] = bv[a.source]
            out.append((k.id, a.id, bv[a.id][0]))
        for op in b.post:
            bv[op.id] = alg.apply(op.op, [bv[i] for i in op.inputs], op.attrs, [])
            out.append((k.id, op.id, bv[op.id][0]))
        for o in b.outputs:
            values[o.tensor] = bv[o.source]
    return out
