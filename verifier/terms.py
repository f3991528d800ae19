"""The term language of the prover: tensor algebra plus size-free layout operators.

A term is a `Node(op, children, params)`. Tensor ops: `inp(name)`, `const(value)`, `add sub mul
div`, `neg exp sqrt relu`, `sum mean max` (over a dim, keeping it), `squeeze` (drop a size-1 dim),
`matmul` (batched; contracts dim -1 of the left with dim -2 of the right), `transpose`,
`reshape`, and `bcast(E, d)`, a marker that E has size 1 along d and is broadcast there (every
broadcast is explicit, so elementwise rules need no shape guards). Dims count from the end
(-1 is the last), so they survive the rank differences of numpy broadcasting.

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

from dataclasses import dataclass
from typing import Union

Param = Union[int, float, str, "DimVar", "AxisVar", "ConstVar", "PermVar", "Ext", "ExtVar"]


@dataclass(frozen=True)
class Var:
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
class Node:
    op: str
    children: tuple[Term, ...] = ()
    params: tuple[Param, ...] = ()

    def __str__(self) -> str:
        items = [str(c) for c in self.children] + [repr(p) if isinstance(p, str) else str(p) for p in self.params]
        return f"{self.op}({', '.join(items)})"


Term = Node | Var

# op -> (number of tensor children, kinds of params) ; the e-graph and the evaluator follow this.
SIGNATURES: dict[str, tuple[int, tuple[str, ...]]] = {
    "inp": (0, ("str",)),
    "const": (0, ("float",)),
    "add": (2, ()), "sub": (2, ()), "mul": (2, ()), "div": (2, ()),
    "neg": (1, ()), "exp": (1, ()), "sqrt": (1, ()), "relu": (1, ()),
    "sum": (1, ("dim", "ext")), "mean": (1, ("dim", "ext")), "max": (1, ("dim",)),
    "squeeze": (1, ("dim",)), "bcast": (1, ("dim",)),
    "matmul": (2, ("ext",)),
    "transpose": (1, ("str",)), "reshape": (1, ("str",)),
    "part": (1, ("dim", "axis")),
    "sum_over": (1, ("axis",)), "mean_over": (1, ("axis",)),
    "cat_over": (1, ("dim", "axis")),
}
ELEMENTWISE_BINARY = ("add", "sub", "mul", "div")
ELEMENTWISE_UNARY = ("neg", "exp", "sqrt", "relu")
REDUCTIONS = ("sum", "mean", "max")
EXTENT_REDUCTIONS = ("sum", "mean")  # the reductions whose value depends on the reduced extent


def node(op: str, *children: Term, params: tuple[Param, ...] = ()) -> Node:
    n_children, kinds = SIGNATURES[op]
    assert len(children) == n_children and len(params) == len(kinds), (op, children, params)
    return Node(op, tuple(children), tuple(params))


# -- builders (readable rule and lowering code) -------------------------------------------------


def inp(name: str) -> Node:
    return node("inp", params=(name,))


def const(value: float | ConstVar) -> Node:
    return node("const", params=(value if isinstance(value, ConstVar) else float(value),))


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
    return node("matmul", a, b, params=(k,))


def transpose(a: Term, perm: str | PermVar) -> Node:
    return node("transpose", a, params=(perm,))


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
