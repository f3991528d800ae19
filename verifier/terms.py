"""The term language of the prover: tensor algebra plus size-free layout operators.

A term is a `Node(op, children, params)`. Tensor ops: `inp(name)`, `const(value)`, `add sub mul
div`, `neg exp sqrt relu`, `sum mean max` (over a dim, keeping it), `squeeze` (drop a size-1 dim),
`matmul` (batched; contracts dim -1 of the left with dim -2 of the right), `transpose`,
`reshape`, and `bcast(E, d)`, a marker that E has size 1 along d and is broadcast there (every
broadcast is explicit, so elementwise rules need no shape guards). Dims count from the end
(-1 is the last), so they survive the rank differences of numpy broadcasting. The composites
`sigmoid silu gelu` are symbols of their own (`spell_out` replaces them by their definitions).

Layout operators, over named axes (a grid axis or a loop axis of an sGraph):
- `part(E, d, a)`: the tile of E along dim d for the index of axis a (E split into |a| parts);
- `sum_over(E, a)`, `mean_over(E, a)`: the sum / mean of E over the indices of a;
- `cat_over(E, d, a)`: the concatenation of E along d over the indices of a.
A term with a free axis denotes a function of that axis' index.

Extents. A rule that names no size is not thereby true for every size: `sum(X + 1, -1)` is
`sum(X, -1) + 64` for X of width 64, and a width-free `sum(1, -1)` would let associativity move X's
64 next to a sum over a width of 32. So every op whose value depends on the extent of the dim it
reduces (`sum`, `mean`, `matmul`'s contraction) carries that extent as an `Ext`: a symbol for one
of the program's dim classes (dims the program ties share it; untied dims never do), divided by
the axes a tile map splits it over (`per`), or multiplied back by those a concatenation gathers
(`times`). The sum of a term constant along the reduced dim is the term times the extent (`term_eval` evaluates it so).
An equality proved between terms then holds for every assignment of the extent symbols and axis
sizes that meets the divisibility constraints.

Patterns (for rules) use `Var` (a tensor), `DimVar`, `AxisVar` and `ExtVar` in place of
subterms/params.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from superopt.ops import BINARY, REDUCE, Op
from superopt.primitives import Algebra, apply

Param = Union[int, float, str, "DimVar", "AxisVar", "ConstVar", "PermVar", "Ext", "ExtVar"]


class Operators:
    """Operators on terms, so that rules read as the mathematics they state: `A + B`, `c * A` (a
    number or `ConstVar` is a constant), `-A`, `A.matmul(B, n)` (contracting an extent n),
    `A.sum(d, n)`, `A.bcast(d)`, `A.part(d, a)`, ..."""

    def __add__(self, other: Operand) -> Node:
        return binary(Op.ADD, _term(self), _term(other))

    def __radd__(self, other: Operand) -> Node:
        return binary(Op.ADD, _term(other), _term(self))

    def __sub__(self, other: Operand) -> Node:
        return binary(Op.SUB, _term(self), _term(other))

    def __rsub__(self, other: Operand) -> Node:
        return binary(Op.SUB, _term(other), _term(self))

    def __mul__(self, other: Operand) -> Node:
        return binary(Op.MUL, _term(self), _term(other))

    def __rmul__(self, other: Operand) -> Node:
        return binary(Op.MUL, _term(other), _term(self))

    def __truediv__(self, other: Operand) -> Node:
        return binary(Op.DIV, _term(self), _term(other))

    def __rtruediv__(self, other: Operand) -> Node:
        return binary(Op.DIV, _term(other), _term(self))

    def __neg__(self) -> Node:
        return unary(Op.NEG, _term(self))

    def apply(self, op: str) -> Node:
        """A one-operand elementwise op by name (`ELEMENTWISE_UNARY`, `COMPOSITES`)."""
        return unary(op, _term(self))

    def exp(self) -> Node:
        return unary(Op.EXP, _term(self))

    def reduce(self, op: str, d: int | DimVar, n: Ext | ExtVar | None = None) -> Node:
        return reduce(op, _term(self), d, n)

    def sum(self, d: int | DimVar, n: Ext | ExtVar) -> Node:
        return reduce(Op.SUM, _term(self), d, n)

    def mean(self, d: int | DimVar, n: Ext | ExtVar) -> Node:
        return reduce(Op.MEAN, _term(self), d, n)

    def matmul(self, other: Term, k: Ext | ExtVar) -> Node:
        return matmul(_term(self), other, k)

    def bcast(self, d: int | DimVar) -> Node:
        return bcast(_term(self), d)

    def squeeze(self, d: int | DimVar) -> Node:
        return squeeze(_term(self), d)

    def transpose(self, perm: str | PermVar) -> Node:
        return transpose(_term(self), perm)

    def part(self, d: int | DimVar, axis: str | AxisVar) -> Node:
        return part(_term(self), d, axis)

    def sum_over(self, axis: str | AxisVar) -> Node:
        return sum_over(_term(self), axis)

    def mean_over(self, axis: str | AxisVar) -> Node:
        return mean_over(_term(self), axis)

    def over(self, op: str, axis: str | AxisVar) -> Node:
        """A reduction over an axis by name (`sum_over`, `mean_over`)."""
        return node(op, _term(self), params=(axis,))

    def cat_over(self, d: int | DimVar, axis: str | AxisVar) -> Node:
        return cat_over(_term(self), d, axis)


@dataclass(frozen=True)
class Var(Operators):
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class DimVar:
    """A dim in a pattern; `offset` makes `d + 1` (a dim renumbered by a squeeze)."""

    name: str
    offset: int = 0

    def __str__(self) -> str:
        return self.name if not self.offset else f"{self.name}{self.offset:+d}"

    def __add__(self, k: int) -> DimVar:
        return DimVar(self.name, self.offset + k)


@dataclass(frozen=True)
class AxisVar:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ConstVar:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class PermVar:
    """A transpose's permutation in a pattern (its text, as the lowering writes it)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ExtVar:
    """An extent in a pattern."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Ext:
    """An extent: `sym(name)`, `per(ext, axis)` (divided by the axis' size) or `times(ext, axis)`."""

    kind: str
    args: tuple[Ext | ExtVar | AxisVar | str, ...]

    def __str__(self) -> str:
        if self.kind == "sym":
            return str(self.args[0])
        sign = "/" if self.kind == "per" else "*"
        return f"({self.args[0]}{sign}{self.args[1]})"


def ext_sym(name: str) -> Ext:
    return Ext("sym", (name,))


def per(n: Ext | ExtVar, axis: str | AxisVar) -> Ext:
    """n divided by the axis' size; a tile of what a concatenation over the axis gathered is what
    was gathered (`times` undone)."""
    return _undone(n, "times", axis) or Ext("per", (n, axis))


def times(n: Ext | ExtVar, axis: str | AxisVar) -> Ext:
    """n times the axis' size; the extent a concatenation over the axis gathers (`per` undone)."""
    return _undone(n, "per", axis) or Ext("times", (n, axis))


def _undone(n: Ext | ExtVar, kind: str, axis: str | AxisVar) -> Ext | None:
    """What n was before a `kind` over this axis (None where it was not one)."""
    if isinstance(n, Ext) and n.kind == kind and n.args[1] == axis and isinstance(n.args[0], Ext):
        return n.args[0]
    return None


ONE = ext_sym("1")  # a dim of size 1 (what a reduction keeps, what a broadcast starts from)


@dataclass(frozen=True)
class Node(Operators):
    op: str
    children: tuple[Term, ...] = ()
    params: tuple[Param, ...] = ()

    def __str__(self) -> str:
        items = [str(c) for c in self.children] + [repr(p) if isinstance(p, str) else str(p) for p in self.params]
        return f"{self.op}({', '.join(items)})"


Term = Node | Var
Operand = Union[Term, float, "ConstVar"]  # a number or a ConstVar is a constant


def _term(x: Operators | Operand) -> Term:
    if isinstance(x, Node | Var):
        return x
    if isinstance(x, ConstVar | int | float):
        return const(x)
    raise TypeError(f"not a term: {x!r}")

# op -> (number of tensor children, kinds of params) ; the e-graph and the evaluator follow this.
SIGNATURES: dict[str, tuple[int, tuple[str, ...]]] = {
    "inp": (0, ("str",)),
    Op.CONST: (0, ("float",)),
    Op.ADD: (2, ()), Op.SUB: (2, ()), Op.MUL: (2, ()), Op.DIV: (2, ()),
    Op.NEG: (1, ()), Op.EXP: (1, ()), Op.SQRT: (1, ()), Op.RELU: (1, ()),
    Op.SIGMOID: (1, ()), Op.SILU: (1, ()), Op.GELU: (1, ()),
    Op.SUM: (1, ("dim", "ext")), Op.MEAN: (1, ("dim", "ext")), Op.MAX: (1, ("dim",)),
    "squeeze": (1, ("dim",)), "bcast": (1, ("dim",)),
    Op.MATMUL: (2, ("ext",)),
    Op.TRANSPOSE: (1, ("str",)), Op.RESHAPE: (1, ("str",)),
    "part": (1, ("dim", "axis")),
    "sum_over": (1, ("axis",)), "mean_over": (1, ("axis",)),
    "cat_over": (1, ("dim", "axis")),
}
ELEMENTWISE_BINARY = BINARY
ELEMENTWISE_UNARY = (Op.NEG, Op.EXP, Op.SQRT, Op.RELU)
# One-operand elementwise composites, lowered whole: each a function symbol of its operand, so two
# sides that apply one to equal operands are equal without its definition (`spell_out` gives it).
COMPOSITES = (Op.SIGMOID, Op.SILU, Op.GELU)
REDUCTIONS = REDUCE
EXTENT_REDUCTIONS = (Op.SUM, Op.MEAN)  # the reductions whose value depends on the reduced extent


def node(op: str, *children: Term, params: tuple[Param, ...] = ()) -> Node:
    n_children, kinds = SIGNATURES[op]
    assert len(children) == n_children and len(params) == len(kinds), (op, children, params)
    return Node(op, tuple(children), tuple(params))


# -- builders (readable rule and lowering code) -------------------------------------------------


def inp(name: str) -> Node:
    return node("inp", params=(name,))


def const(value: float | ConstVar) -> Node:
    return node(Op.CONST, params=(value if isinstance(value, ConstVar) else float(value),))


def binary(op: str, a: Term, b: Term) -> Node:
    return node(op, a, b)


def unary(op: str, a: Term) -> Node:
    return node(op, a)


def reduce(op: str, a: Term, d: int | DimVar, n: Ext | ExtVar | None = None) -> Node:
    """A reduction over dim d of extent n (sum and mean need n; max ignores it)."""
    if op in EXTENT_REDUCTIONS:
        assert n is not None, f"{op} needs the extent it reduces"
        return node(op, a, params=(d, n))
    return node(op, a, params=(d,))


def bcast(a: Term, d: int | DimVar) -> Node:
    return node("bcast", a, params=(d,))


def squeeze(a: Term, d: int | DimVar) -> Node:
    return node("squeeze", a, params=(d,))


def matmul(a: Term, b: Term, k: Ext | ExtVar) -> Node:
    """a @ b contracting an extent k (a product of two broadcasts is k times their product)."""
    return node(Op.MATMUL, a, b, params=(k,))


def transpose(a: Term, perm: str | PermVar) -> Node:
    return node(Op.TRANSPOSE, a, params=(perm,))


def part(a: Term, d: int | DimVar, axis: str | AxisVar) -> Node:
    return node("part", a, params=(d, axis))


def sum_over(a: Term, axis: str | AxisVar) -> Node:
    return node("sum_over", a, params=(axis,))


def mean_over(a: Term, axis: str | AxisVar) -> Node:
    return node("mean_over", a, params=(axis,))


def cat_over(a: Term, d: int | DimVar, axis: str | AxisVar) -> Node:
    return node("cat_over", a, params=(d, axis))


def size(t: Term) -> int:
    """Number of nodes (shared subterms counted each time)."""
    return 1 if isinstance(t, Var) else 1 + sum(size(c) for c in t.children)


def free_axes(t: Term) -> frozenset[str]:
    """Axes a ground term depends on (syntactically)."""
    if isinstance(t, Var):
        return frozenset()
    inner = frozenset().union(*(free_axes(c) for c in t.children)) if t.children else frozenset()
    if t.op == "part":
        return inner | {str(t.params[1])}
    if t.op in ("sum_over", "mean_over"):
        return inner - {str(t.params[0])}
    if t.op == "cat_over":
        return inner - {str(t.params[1])}
    return inner


class _Elementwise(Algebra[Term]):
    """Terms of the elementwise primitives, as the lowering writes them for a tile's operands of
    one shape (constants broadcast implicitly): `spelled` writes a composite out with it."""

    def const(self, value: float) -> Term:
        return const(value)

    def add(self, a: Term, b: Term) -> Term:
        return binary(Op.ADD, a, b)

    def sub(self, a: Term, b: Term) -> Term:
        return binary(Op.SUB, a, b)

    def mul(self, a: Term, b: Term) -> Term:
        return binary(Op.MUL, a, b)

    def div(self, a: Term, b: Term) -> Term:
        return binary(Op.DIV, a, b)

    def neg(self, a: Term) -> Term:
        return unary(Op.NEG, a)

    def exp(self, a: Term) -> Term:
        return unary(Op.EXP, a)

    def sqrt(self, a: Term) -> Term:
        return unary(Op.SQRT, a)

    def relu(self, a: Term) -> Term:
        return unary(Op.RELU, a)

    def sum(self, a: Term, dim: int, keepdim: bool) -> Term:
        raise ValueError("a composite of elementwise primitives reduces nothing")

    def max(self, a: Term, dim: int, keepdim: bool) -> Term:
        raise ValueError("a composite of elementwise primitives reduces nothing")

    def matmul(self, a: Term, b: Term) -> Term:
        raise ValueError("a composite of elementwise primitives multiplies no matrices")

    def transpose(self, a: Term, perm: Sequence[int]) -> Term:
        raise ValueError("a composite of elementwise primitives moves no dims")

    def reshape(self, a: Term, shape: Sequence[int]) -> Term:
        raise ValueError("a composite of elementwise primitives moves no dims")


def spelled(op: str, x: Term) -> Term:
    """The composite `op` (one of `COMPOSITES`) of x, in primitives (`superopt.primitives`)."""
    return apply(_Elementwise(), op, [x], {}, [])


def spell_out(terms: Sequence[Term]) -> list[Term]:
    """The terms with every composite replaced by its definition (shared subterms stay shared:
    each is rewritten once)."""
    done: dict[int, Term] = {}

    def walk(term: Term) -> Term:
        if isinstance(term, Var):
            return term
        if id(term) not in done:
            kids = tuple(walk(k) for k in term.children)
            done[id(term)] = spelled(term.op, kids[0]) if term.op in COMPOSITES else \
                Node(term.op, kids, term.params) if kids != term.children else term
        return done[id(term)]

    return [walk(term) for term in terms]
