"""The prover's rewrite rules, as data: each with its side conditions and a concrete example.

No rule mentions a size, but every sum, mean and matmul names the extent it reduces (`n`, `m`):
a sum of a term constant along its dim is the term times that extent, so a rule that dropped or
moved an extent would be true only where two extents are equal. Rules are written with the
operators of `terms` (`(A / S.bcast(-1)).matmul(B, n)` is `A / S` broadcast along the last dim,
times B, contracting an extent n), so each reads as the identity it states. Side conditions are
typed: about dims (`Ne(d, d2)`, `Lt(d, d2)`, `Le(d, -3)`) and about axes: `Indep(E, a)` (E does
not depend on axis a; derived syntactically in the e-graph) and `Ne(a, b)`. Rules move layout
operators outward (from the inputs where the lowering puts them toward the accumulators and
outputs where they cancel), so saturation stays small.

`example(rng)` builds concrete bindings for a rule (tensors of random sizes, axes of pairwise
distinct sizes, the extents of the dims it reduces, operands constant along a dim wherever the rule
allows a broadcast, tile families that depend on an axis wherever the rule allows it); the test
suite evaluates both sides in float64 on several of them (`superopt.verifier.term_eval`) before
any proof is trusted.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np

from superopt.ops import Op
from superopt.verifier import terms as t
from superopt.verifier.term_eval import Bindings, TensorValue
from superopt.verifier.terms import AxisVar, ConstVar, DimVar, ExtVar, Operand, PermVar, Term, Var

A, B, E, S = Var("A"), Var("B"), Var("E"), Var("S")
d, d2 = DimVar("d"), DimVar("d2")
n, m = ExtVar("n"), ExtVar("m")
a, b = AxisVar("a"), AxisVar("b")
c = ConstVar("c")
p = PermVar("p")

OPERATOR: dict[str, Callable[[Operand, Operand], Term]] = {
    Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul, Op.DIV: operator.truediv,
}  # an elementwise binary op by name, for rules stated once per op


@dataclass(frozen=True)
class _Relation:
    """x <symbol> y, printed as mathematics."""

    symbol: ClassVar[str]

    def __str__(self) -> str:
        x, y = (getattr(self, f.name) for f in fields(self))
        return f"{x} {self.symbol} {y}"


@dataclass(frozen=True)
class Ne(_Relation):
    """x != y: two dims, or two axes."""

    symbol: ClassVar[str] = "!="
    x: DimVar | AxisVar
    y: DimVar | AxisVar


@dataclass(frozen=True)
class Lt(_Relation):
    """Dim x is left of dim y (dims count from the end: -3 < -2)."""

    symbol: ClassVar[str] = "<"
    x: DimVar
    y: DimVar


@dataclass(frozen=True)
class Le(_Relation):
    """Dim x is at or left of the k-th dim from the end."""

    symbol: ClassVar[str] = "<="
    x: DimVar
    k: int


@dataclass(frozen=True)
class Indep:
    """Tensor e does not depend on axis a (derived syntactically in the e-graph)."""

    e: Var
    a: AxisVar

    def __str__(self) -> str:
        return f"indep({self.e}, {self.a})"


Cond = Ne | Lt | Le | Indep


@dataclass(frozen=True)
class Rule:
    name: str
    lhs: Term
    rhs: Term
    conds: tuple[Cond, ...] = ()
    example: Callable[[np.random.Generator], Bindings] = field(default=lambda rng: Bindings(), compare=False)
    free: tuple[str, ...] = ()  # AxisVar names free on both sides (checked at every index)


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape) + 0.1


def _family(rng: np.random.Generator, axes: list[str], sizes: dict[str, int], shape: tuple[int, ...]):
    """A tile family: a different random array for every index of `axes`."""
    table: dict[tuple[int, ...], np.ndarray] = {}

    def value(idx: dict[str, int]) -> np.ndarray:
        key = tuple(idx[x] for x in axes)
        if key not in table:
            table[key] = _rand(rng, *shape)
        return table[key]

    for x in axes:
        assert x in sizes
    return value


def _axes(rng: np.random.Generator, *names: str) -> dict[str, int]:
    """Axis sizes, pairwise distinct (a rule true only where two axes have one size fails)."""
    return dict(zip(names, (int(x) for x in rng.permutation([2, 3, 5])[: len(names)]), strict=True))


def _ex_part_commute(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x", "y")
    shape = (sizes["x"] * 2, sizes["y"] * 3)
    return Bindings(tensors={"E": _family(rng, ["x", "y"], sizes, shape)}, dims={"d": -2, "d2": -1},
                    axes={"a": "x", "b": "y"}, sizes=sizes)


def _ex_cat_part(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"E": _rand(rng, 3, sizes["x"] * 2)}, dims={"d": -1}, axes={"a": "x"}, sizes=sizes)


def _ex_part_cat(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"E": _family(rng, ["x"], sizes, (2, 3))}, dims={"d": -2}, axes={"a": "x"}, sizes=sizes)


def _ex_cat_commute(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x", "y")
    return Bindings(tensors={"E": _family(rng, ["x", "y"], sizes, (2, 3))}, dims={"d": -2, "d2": -1},
                    axes={"a": "x", "b": "y"}, sizes=sizes)


def _ex_binary_parts(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    shape = (sizes["x"] * 2, 3)
    return Bindings(tensors={"A": _family(rng, ["x"], sizes, shape), "B": _family(rng, ["x"], sizes, shape)},
                    dims={"d": -2}, axes={"a": "x"}, sizes=sizes)


def _ex_binary_bcast(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    a_family, b_family = _family(rng, ["x"], sizes, (3, sizes["x"] * 2)), _family(rng, ["x"], sizes, (3, 1))
    return Bindings(tensors={"A": a_family, "B": b_family},
                    dims={"d": -1}, axes={"a": "x"}, sizes=sizes)


def _ex_binary_const(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"A": _family(rng, ["x"], sizes, (sizes["x"] * 2, 3))}, dims={"d": -2},
                    axes={"a": "x"}, consts={"c": float(rng.uniform(0.5, 2.0))}, sizes=sizes)


def _ex_unary(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"A": lambda idx, f=_family(rng, ["x"], sizes, (sizes["x"] * 2, 3)): np.abs(f(idx))},
                    dims={"d": -2}, axes={"a": "x"}, sizes=sizes)


def _ex_reduce_other(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"E": _family(rng, ["x"], sizes, (2, sizes["x"] * 2, 5))}, dims={"d": -2, "d2": -1},
                    axes={"a": "x"}, sizes=sizes, extents={"n": 5})


def _ex_bcast_other(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"E": _family(rng, ["x"], sizes, (sizes["x"] * 2, 1))}, dims={"d": -2, "d2": -1},
                    axes={"a": "x"}, sizes=sizes)


def _ex_squeeze(before: bool) -> Callable[[np.random.Generator], Bindings]:
    def make(rng: np.random.Generator) -> Bindings:
        sizes = _axes(rng, "x")
        shape = (sizes["x"] * 2, 1, 3) if before else (3, 1, sizes["x"] * 2)
        return Bindings(tensors={"E": _family(rng, ["x"], sizes, shape)},
                        dims={"d": -3 if before else -1, "d2": -2}, axes={"a": "x"}, sizes=sizes)
    return make


def _ex_bcast_commute(rng: np.random.Generator) -> Bindings:
    return Bindings(tensors={"E": _rand(rng, 1, 1)}, dims={"d": -2, "d2": -1})


def _ex_matmul(kind: str) -> Callable[[np.random.Generator], Bindings]:
    def make(rng: np.random.Generator) -> Bindings:
        sizes = _axes(rng, "x")
        k = sizes["x"]
        shapes = {
            "rows": ((2, 2 * k, 3), (2, 3, 4)), "cols": ((2, 2, 3), (2, 3, 2 * k)),
            "batch": ((2 * k, 2, 3), (2 * k, 3, 4)), "contract": ((2, 2, 3 * k), (2, 3 * k, 4)),
        }[kind]
        fam = kind != "contract"
        ta = _family(rng, ["x"], sizes, shapes[0]) if fam else _rand(rng, *shapes[0])
        tb = _family(rng, ["x"], sizes, shapes[1]) if fam else _rand(rng, *shapes[1])
        return Bindings(tensors={"A": ta, "B": tb}, dims={"d": -3}, axes={"a": "x"}, sizes=sizes,
                        extents={"n": shapes[0][-1]})
    return make


def _ex_row_scale(rng: np.random.Generator) -> Bindings:
    scale = np.abs(_rand(rng, 2, 4, 1)) + 0.5
    return Bindings(tensors={"A": _rand(rng, 2, 4, 3), "S": scale, "B": _rand(rng, 2, 3, 5)}, extents={"n": 3})


def _ex_col_scale(rng: np.random.Generator) -> Bindings:
    scale = np.abs(_rand(rng, 2, 1, 5)) + 0.5
    return Bindings(tensors={"A": _rand(rng, 2, 4, 3), "S": scale, "B": _rand(rng, 2, 3, 5)}, extents={"n": 3})


def _ex_const_scale(rng: np.random.Generator) -> Bindings:
    return Bindings(tensors={"A": _rand(rng, 2, 4, 3), "B": _rand(rng, 2, 3, 5)},
                    consts={"c": float(rng.uniform(0.5, 2.0))}, extents={"n": 3})


def _ex_matmul_reduced(dim: int) -> Callable[[np.random.Generator], Bindings]:
    """A (.., 2, 3) @ B (.., 3, 5), reduced over the product's rows (dim -2) or columns (-1)."""

    def make(rng: np.random.Generator) -> Bindings:
        batch = [int(x) for x in rng.integers(2, 4, int(rng.integers(0, 2)))]
        return Bindings(tensors={"A": _rand(rng, *batch, 2, 3), "B": _rand(rng, *batch, 3, 5)},
                        extents={"n": 3, "m": 5 if dim == -1 else 2})

    return make


def _ex_matmul_chain(rng: np.random.Generator) -> Bindings:
    """A (.., 2, 3) @ B (.., 3, 4) @ C (.., 4, 5), batched or not."""
    batch = [int(x) for x in rng.integers(2, 4, int(rng.integers(0, 2)))]
    return Bindings(tensors={"A": _rand(rng, *batch, 2, 3), "B": _rand(rng, *batch, 3, 4),
                             "S": _rand(rng, *batch, 4, 5)}, extents={"n": 3, "m": 4})


def _ex_matmul_sum(side: str) -> Callable[[np.random.Generator], Bindings]:
    """A (2, 3) and B, S of the other side's shape, either of them possibly a broadcast (size 1
    along a dim: a bias row, a column scale)."""

    def make(rng: np.random.Generator) -> Bindings:
        shape = [3, 4] if side == "right" else [2, 3]
        s_shape = list(shape)
        if rng.random() < 0.5:
            s_shape[int(rng.integers(0, 2))] = 1
        a_shape = (2, 3) if side == "right" else (3, 4)
        return Bindings(tensors={"A": _rand(rng, *a_shape), "B": _rand(rng, *shape), "S": _rand(rng, *s_shape)},
                        extents={"n": 3})

    return make


def _ex_over_reduce(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"E": _rand(rng, 3, sizes["x"] * 2)}, dims={"d": -1}, axes={"a": "x"}, sizes=sizes,
                    extents={"n": sizes["x"] * 2})


def _ex_over_part_other(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x", "y")
    return Bindings(tensors={"E": _family(rng, ["x", "y"], sizes, (sizes["y"] * 2, 3))}, dims={"d": -2},
                    axes={"a": "x", "b": "y"}, sizes=sizes)


def _ex_over_add(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"A": _family(rng, ["x"], sizes, (2, 3)), "B": _family(rng, ["x"], sizes, (2, 3))},
                    axes={"a": "x"}, sizes=sizes)


def _ex_over_linear(kind: str) -> Callable[[np.random.Generator], Bindings]:
    def make(rng: np.random.Generator) -> Bindings:
        sizes = _axes(rng, "x")
        varying, fixed = {"left": ((2, 3), (3, 4)), "right": ((3, 4), (2, 3))}.get(kind, ((2, 3), (2, 3)))
        tensors: dict[str, TensorValue] = {"A": _family(rng, ["x"], sizes, varying), "B": _rand(rng, *fixed)}
        if kind == "divide":  # a divisor away from 0
            tensors["B"] = np.abs(tensors["B"]) + 0.5
        if kind == "right":
            tensors = {"A": _rand(rng, *fixed), "B": _family(rng, ["x"], sizes, varying)}
        return Bindings(tensors=tensors, axes={"a": "x"}, sizes=sizes, extents={"n": 3})
    return make


def _ex_over_dim(unit: bool) -> Callable[[np.random.Generator], Bindings]:
    """A tile family over axis x, reduced (or squeezed: then of size 1 there) along dim d."""

    def make(rng: np.random.Generator) -> Bindings:
        sizes = _axes(rng, "x")
        dim = int(rng.choice([-1, -2]))
        shape = [3, 4]
        if unit:
            shape[dim] = 1
        return Bindings(tensors={"E": _family(rng, ["x"], sizes, tuple(shape))}, dims={"d": dim}, axes={"a": "x"},
                        sizes=sizes, extents={"n": shape[dim]})

    return make


def _ex_two_dims(rng: np.random.Generator) -> Bindings:
    dims = [int(x) for x in rng.permutation([-1, -2, -3])[:2]]
    shape = (3, 4, 5)
    return Bindings(tensors={"E": _rand(rng, *shape)}, dims={"d": dims[0], "d2": dims[1]},
                    extents={"n": shape[dims[0]], "m": shape[dims[1]]})


def _ex_same_shape(rng: np.random.Generator) -> Bindings:
    """A and B of one shape, or B constant along d (a broadcast: the extent of its sum is A's)."""
    dim = int(rng.choice([-1, -2]))
    b_shape = [3, 4]
    if rng.random() < 0.5:
        b_shape[dim] = 1
    return Bindings(tensors={"A": _rand(rng, 3, 4), "B": _rand(rng, *b_shape)}, dims={"d": dim},
                    extents={"n": (3, 4)[dim]})


def _ex_scaled_reduction(rng: np.random.Generator) -> Bindings:
    dim = int(rng.choice([-1, -2]))
    return Bindings(tensors={"A": _rand(rng, 3, 4)}, dims={"d": dim}, consts={"c": float(rng.uniform(0.5, 2.0))},
                    extents={"n": (3, 4)[dim]})


def _ex_unit_pair(rng: np.random.Generator) -> Bindings:
    """Positive A and B of size 1 along d (what a broadcast takes)."""
    dim = int(rng.choice([-1, -2]))
    shape = [3, 4]
    shape[dim] = 1
    return Bindings(tensors={"A": np.abs(_rand(rng, *shape)) + 0.5, "B": np.abs(_rand(rng, *shape)) + 0.5},
                    dims={"d": dim}, consts={"c": float(rng.uniform(0.5, 2.0))})


def _ex_constant_along(rng: np.random.Generator) -> Bindings:
    """A term constant along the reduced dim (size 1 there) and an extent away from 1 and 2."""
    dim = int(rng.choice([-1, -2]))
    shape = [3, 4]
    shape[dim] = 1
    return Bindings(tensors={"S": _rand(rng, *shape)}, dims={"d": dim}, consts={"c": float(rng.uniform(0.5, 2.0))},
                    extents={"n": int(rng.integers(3, 9))})


def _ex_reduced_scale(rng: np.random.Generator) -> Bindings:
    dim = int(rng.choice([-1, -2]))
    shape = [3, 4]
    shape[dim] = 1
    return Bindings(tensors={"A": _rand(rng, 3, 4), "S": np.abs(_rand(rng, *shape)) + 0.5}, dims={"d": dim},
                    extents={"n": (3, 4)[dim]})


def _ex_bcast_reduced(rng: np.random.Generator) -> Bindings:
    """E broadcast along one dim (size 1 there) and reduced along another, of its own extent."""
    dims = [int(x) for x in rng.permutation([-1, -2, -3])[:2]]
    shape = [3, 4, 5]
    shape[dims[1]] = 1
    return Bindings(tensors={"E": _rand(rng, *shape)}, dims={"d": dims[0], "d2": dims[1]},
                    extents={"n": shape[dims[0]]})


def _ex_indep(rng: np.random.Generator) -> Bindings:
    sizes = _axes(rng, "x")
    return Bindings(tensors={"E": _rand(rng, 2, 3)}, axes={"a": "x"}, sizes=sizes)


def _ex_field(rng: np.random.Generator) -> Bindings:
    # B and S broadcast against A (row scales), as in the schedules that rearrange them.
    return Bindings(tensors={"A": _rand(rng, 3, 4), "B": np.abs(_rand(rng, 3, 1)) + 0.5, "S": _rand(rng, 3, 4) + 3.0})


def _ex_comm(rng: np.random.Generator) -> Bindings:
    return Bindings(tensors={"A": _rand(rng, 2, 3), "B": _rand(rng, 2, 3)})


def _binary_rules() -> list[Rule]:
    out: list[Rule] = []
    for op, f in OPERATOR.items():
        out.append(Rule(f"part-{op}", f(A.part(d, a), B.part(d, a)), f(A, B).part(d, a),
                        example=_ex_binary_parts, free=("a",)))
        out.append(Rule(f"part-{op}-bcast-right", f(A.part(d, a), B.bcast(d)), f(A, B.bcast(d)).part(d, a),
                        example=_ex_binary_bcast, free=("a",)))
        out.append(Rule(f"part-{op}-const-right", f(A.part(d, a), c), f(A, c).part(d, a),
                        example=_ex_binary_const, free=("a",)))
        if op in (Op.SUB, Op.DIV):  # add and mul reach the left-hand forms by commutativity
            out.append(Rule(f"part-{op}-bcast-left", f(B.bcast(d), A.part(d, a)), f(B.bcast(d), A).part(d, a),
                            example=_ex_binary_bcast, free=("a",)))
            out.append(Rule(f"part-{op}-const-left", f(c, A.part(d, a)), f(c, A).part(d, a),
                            example=_ex_binary_const, free=("a",)))
    return out



def _ex_transposed(rng: np.random.Generator) -> Bindings:
    """Positive tensors (sqrt, division) of one shape and a random permutation of its dims."""
    perm = ",".join(map(str, rng.permutation(3)))
    return Bindings(tensors={n: np.abs(_rand(rng, 2, 3, 4)) + 0.5 for n in ("A", "B")}, perms={"p": perm},
                    consts={"c": float(rng.uniform(0.5, 2.0))})


def _transpose_rules() -> list[Rule]:
    """Elementwise ops of transposed operands are the transpose of the op (a kernel may compute
    the op and leave the transpose to a view of its output)."""
    out = [Rule(f"transpose-{op}", A.transpose(p).apply(op), A.apply(op).transpose(p), (), _ex_transposed)
           for op in t.ELEMENTWISE_UNARY]
    for op, f in OPERATOR.items():
        out.append(Rule(f"transpose-{op}", f(A.transpose(p), B.transpose(p)), f(A, B).transpose(p), (),
                        _ex_transposed))
        out.append(Rule(f"transpose-{op}-const-right", f(A.transpose(p), c), f(A, c).transpose(p), (),
                        _ex_transposed))
        if op in (Op.SUB, Op.DIV):  # add and mul reach the left-hand form by commutativity
            out.append(Rule(f"transpose-{op}-const-left", f(c, A.transpose(p)), f(c, A).transpose(p), (),
                            _ex_transposed))
    return out



RULES: list[Rule] = [
    # -- layout -----------------------------------------------------------------------------
    Rule("part-commute", E.part(d, a).part(d2, b), E.part(d2, b).part(d, a), (Ne(d, d2),), _ex_part_commute,
         ("a", "b")),
    Rule("cat-of-parts", E.part(d, a).cat_over(d, a), E, (Indep(E, a),), _ex_cat_part),
    Rule("part-of-cat", E.cat_over(d, a).part(d, a), E, (), _ex_part_cat, ("a",)),
    Rule("cat-commute", E.cat_over(d, a).cat_over(d2, b), E.cat_over(d2, b).cat_over(d, a), (Ne(d, d2), Ne(a, b)),
         _ex_cat_commute),
    Rule("bcast-commute", E.bcast(d).bcast(d2), E.bcast(d2).bcast(d), (Ne(d, d2),), _ex_bcast_commute),
    Rule("part-bcast-other", E.part(d, a).bcast(d2), E.bcast(d2).part(d, a), (Ne(d, d2),), _ex_bcast_other, ("a",)),
    Rule("part-squeeze-after", E.part(d, a).squeeze(d2), E.squeeze(d2).part(d, a), (Lt(d2, d),),
         _ex_squeeze(before=False), ("a",)),
    Rule("part-squeeze-before", E.part(d, a).squeeze(d2), E.squeeze(d2).part(d + 1, a), (Lt(d, d2),),
         _ex_squeeze(before=True), ("a",)),
    # -- elementwise ops move tile maps outward -------------------------------------------------
    *_binary_rules(),
    # a composite is one symbol (`terms.COMPOSITES`): a part moves out of it in one step, not one
    # per primitive of its definition (gelu has ten)
    *[Rule(f"part-{op}", A.part(d, a).apply(op), A.apply(op).part(d, a), (), _ex_unary, ("a",))
      for op in (*t.ELEMENTWISE_UNARY, *t.COMPOSITES)],
    *[Rule(f"part-{op}-other-dim", E.part(d, a).reduce(op, d2, n), E.reduce(op, d2, n).part(d, a), (Ne(d, d2),),
           _ex_reduce_other, ("a",)) for op in t.REDUCTIONS],
    *_transpose_rules(),
    # -- matmul -----------------------------------------------------------------------------
    Rule("matmul-rows", A.part(-2, a).matmul(B, n), A.matmul(B, n).part(-2, a), (), _ex_matmul("rows"), ("a",)),
    Rule("matmul-cols", A.matmul(B.part(-1, a), n), A.matmul(B, n).part(-1, a), (), _ex_matmul("cols"), ("a",)),
    Rule("matmul-batch", A.part(d, a).matmul(B.part(d, a), n), A.matmul(B, n).part(d, a), (Le(d, -3),),
         _ex_matmul("batch"), ("a",)),
    Rule("matmul-contract", A.part(-1, a).matmul(B.part(-2, a), t.per(n, a)).sum_over(a), A.matmul(B, n),
         (Indep(A, a), Indep(B, a)), _ex_matmul("contract")),
    Rule("matmul-row-scale-div", (A / S.bcast(-1)).matmul(B, n), A.matmul(B, n) / S.bcast(-1), (), _ex_row_scale),
    Rule("matmul-const-left", (A * c).matmul(B, n), A.matmul(B, n) * c, (), _ex_const_scale),
    Rule("matmul-const-right", A.matmul(B * c, n), A.matmul(B, n) * c, (), _ex_const_scale),
    Rule("matmul-row-scale-mul", (A * S.bcast(-1)).matmul(B, n), A.matmul(B, n) * S.bcast(-1), (), _ex_row_scale),
    # a column scale of a product is a column scale of its right operand (moved in, where a sum of
    # the product's columns can then take the weight's: X @ rowsum(W * s))
    *[Rule(f"matmul-col-scale-{op}", OPERATOR[op](A.matmul(B, n), S.bcast(-2)),
           A.matmul(OPERATOR[op](B, S.bcast(-2)), n), (), _ex_col_scale) for op in (Op.MUL, Op.DIV)],
    # products regroup and distribute over sums: X @ (A @ B) is (X @ A) @ B, a low-rank update
    # X @ (W + A @ B) is X @ W + (X @ A) @ B; each product keeps the extent it contracts
    Rule("matmul-assoc", A.matmul(B, n).matmul(S, m), A.matmul(B.matmul(S, m), n), (), _ex_matmul_chain),
    Rule("matmul-distribute-right", A.matmul(B + S, n), A.matmul(B, n) + A.matmul(S, n), (),
         _ex_matmul_sum("right")),
    Rule("matmul-distribute-left", (B + S).matmul(A, n), B.matmul(A, n) + S.matmul(A, n), (),
         _ex_matmul_sum("left")),
    # -- reductions over an axis --------------------------------------------------------------
    Rule("sum-over-tile-sums", E.part(d, a).sum(d, t.per(n, a)).sum_over(a), E.sum(d, n), (Indep(E, a),),
         _ex_over_reduce),
    Rule("mean-over-tile-means", E.part(d, a).mean(d, t.per(n, a)).mean_over(a), E.mean(d, n), (Indep(E, a),),
         _ex_over_reduce),
    Rule("sum-over-part-other", E.part(d, b).sum_over(a), E.sum_over(a).part(d, b), (Ne(a, b),), _ex_over_part_other,
         ("b",)),
    Rule("mean-over-part-other", E.part(d, b).mean_over(a), E.mean_over(a).part(d, b), (Ne(a, b),),
         _ex_over_part_other, ("b",)),
    Rule("sum-over-add", (A + B).sum_over(a), A.sum_over(a) + B.sum_over(a), (), _ex_over_add),
    Rule("sum-over-matmul-left", A.matmul(B, n).sum_over(a), A.sum_over(a).matmul(B, n), (Indep(B, a),),
         _ex_over_linear("left")),
    Rule("sum-over-matmul-right", A.matmul(B, n).sum_over(a), A.matmul(B.sum_over(a), n), (Indep(A, a),),
         _ex_over_linear("right")),
    # a sum or mean of a product's columns (rows) is the product with the right operand's columns
    # (the left operand's rows) summed first: a matrix-vector product instead of the matmul
    *[Rule(f"{op}-of-matmul-cols", A.matmul(B, n).reduce(op, -1, m), A.matmul(B.reduce(op, -1, m), n), (),
           _ex_matmul_reduced(-1)) for op in (Op.SUM, Op.MEAN)],
    *[Rule(f"{op}-of-matmul-rows", A.matmul(B, n).reduce(op, -2, m), A.reduce(op, -2, m).matmul(B, n), (),
           _ex_matmul_reduced(-2)) for op in (Op.SUM, Op.MEAN)],
    Rule("sum-over-scale", (A * B).sum_over(a), A.sum_over(a) * B, (Indep(B, a),), _ex_over_linear("scale")),
    Rule("sum-over-divide", (A / B).sum_over(a), A.sum_over(a) / B, (Indep(B, a),), _ex_over_linear("divide")),
    Rule("mean-over-invariant", E.mean_over(a), E, (Indep(E, a),), _ex_indep),
    # a sum or mean over loop iterations commutes with a sum or mean over a dim, and a squeeze
    # (a one-block kernel walking X's rows sums each iteration's column sums: sum(sum(X)))
    *[Rule(f"{over}-{op}", E.reduce(op, d, n).over(over, a), E.over(over, a).reduce(op, d, n), (),
           _ex_over_dim(unit=False)) for over in ("sum_over", "mean_over") for op in (Op.SUM, Op.MEAN)],
    *[Rule(f"{over}-squeeze", E.squeeze(d).over(over, a), E.over(over, a).squeeze(d), (), _ex_over_dim(unit=True))
      for over in ("sum_over", "mean_over")],
    # -- signs move outward: a schedule may negate before or after a linear op ------------------
    Rule("neg-neg", -(-A), A, (), _ex_comm),  # noqa: B002 (a negation negated, not a decrement)
    Rule("matmul-neg-left", (-A).matmul(B, n), -(A.matmul(B, n)), (), _ex_row_scale),
    Rule("matmul-neg-right", A.matmul(-B, n), -(A.matmul(B, n)), (), _ex_row_scale),
    *[Rule(f"{op}-neg-left", OPERATOR[op](-A, B), -OPERATOR[op](A, B), (), _ex_comm) for op in (Op.MUL, Op.DIV)],
    *[Rule(f"{op}-neg", (-E).reduce(op, d, n), -(E.reduce(op, d, n)), (), _ex_over_reduce) for op in (Op.SUM, Op.MEAN)],
    Rule("sub-swap", A - B, -(B - A), (), _ex_comm),
    Rule("sum-over-neg", (-A).sum_over(a), -(A.sum_over(a)), (), _ex_over_add),
    Rule("mean-over-neg", (-A).mean_over(a), -(A.mean_over(a)), (), _ex_over_add),
    # -- algebra ------------------------------------------------------------------------------
    # sums and means over dims are linear: they commute (a kernel may reduce the columns first)
    # and distribute over + and - (sum(X + Y) as sum(X) + sum(Y)); exp(A + B) is exp(A) exp(B).
    # The oracle admits all of these, so the search builds such schedules.
    *[Rule(f"{inner}-{outer}-commute", E.reduce(inner, d, n).reduce(outer, d2, m),
           E.reduce(outer, d2, m).reduce(inner, d, n), (Ne(d, d2),), _ex_two_dims)
      for inner in (Op.SUM, Op.MEAN) for outer in (Op.SUM, Op.MEAN)],
    *[Rule(f"{op}-of-{bop}", OPERATOR[bop](A, B).reduce(op, d, n),
           OPERATOR[bop](A.reduce(op, d, n), B.reduce(op, d, n)), (), _ex_same_shape)
      for op in (Op.SUM, Op.MEAN) for bop in (Op.ADD, Op.SUB)],
    # a term constant along the reduced dim (a constant, a broadcast) is its own mean, whatever
    # the extent (its sum would be it times the extent: no schedule needs that rule yet)
    # a reduction along one dim of a broadcast along another is the broadcast of the reduction (a
    # row sum of X @ W + b, b broadcast along the rows: sum(b) once, then broadcast)
    *[Rule(f"{op}-of-bcast-other", E.bcast(d2).reduce(op, d, n), E.reduce(op, d, n).bcast(d2), (Ne(d, d2),),
           _ex_bcast_reduced) for op in (Op.SUM, Op.MEAN)],
    Rule("mean-of-const", t.const(c).mean(d, n), t.const(c), (), _ex_constant_along),
    Rule("mean-of-bcast", S.bcast(d).mean(d, n), S, (), _ex_constant_along),
    # a scale broadcast along the reduced dim comes out of the reduction (the sum of a normalized
    # row is the row's sum over its norm)
    *[Rule(f"{op}-of-{bop}-by-bcast", OPERATOR[bop](A, S.bcast(d)).reduce(op, d, n),
           OPERATOR[bop](A.reduce(op, d, n), S), (), _ex_reduced_scale)
      for op in (Op.SUM, Op.MEAN) for bop in (Op.MUL, Op.DIV)],
    Rule("exp-of-add", (A + B).exp(), A.exp() * B.exp(), (), _ex_same_shape),
    Rule("exp-of-sub", (A - B).exp(), A.exp() / B.exp(), (), _ex_same_shape),
    # a quotient of two quotients by one exponential (never 0) is the quotient: a softmax whose
    # row maximum is subtracted from the exponent, and one where it is not
    Rule("div-cancel-exp", (A / S.exp()) / (B / S.exp()), A / B, (), _ex_field),
    Rule("sub-as-add-neg", A - B, A + -B, (), _ex_comm),
    Rule("mul-one", A * 1.0, A, (), _ex_comm),
    # a sum or mean of a term scaled by a constant is the scaled sum or mean
    *[Rule(f"{op}-of-mul-const", (A * c).reduce(op, d, n), A.reduce(op, d, n) * c, (), _ex_scaled_reduction)
      for op in (Op.SUM, Op.MEAN)],
    # a broadcast of an op is the op of broadcasts (1 / S broadcast along the columns is 1 over the
    # broadcast S: an rsqrt written as a quotient meets the norm it scales)
    *[Rule(f"bcast-{op}", OPERATOR[op](A, B).bcast(d), OPERATOR[op](A.bcast(d), B.bcast(d)), (), _ex_unit_pair)
      for op in (Op.ADD, Op.MUL, Op.DIV)],
    *[Rule(f"bcast-{op}-const-left", OPERATOR[op](c, A).bcast(d), OPERATOR[op](c, A.bcast(d)), (), _ex_unit_pair)
      for op in (Op.ADD, Op.MUL, Op.DIV)],
    *[Rule(f"bcast-{op}-const-right", OPERATOR[op](A, c).bcast(d), OPERATOR[op](A.bcast(d), c), (), _ex_unit_pair)
      for op in (Op.ADD, Op.MUL)],
    *[Rule(f"bcast-{op}", A.apply(op).bcast(d), A.bcast(d).apply(op), (), _ex_unit_pair)
      for op in (Op.NEG, Op.EXP, Op.SQRT)],
    *[Rule(f"{op}-of-bcast", A.bcast(d).apply(op), A.apply(op).bcast(d), (), _ex_unit_pair)
      for op in (Op.NEG, Op.EXP, Op.SQRT)],
    Rule("add-comm", A + B, B + A, (), _ex_comm),
    Rule("mul-comm", A * B, B * A, (), _ex_comm),
    Rule("mul-assoc", (A * B) * S, A * (B * S), (), _ex_field),
    # sums regroup too: (X + 2) - X is (X - X) + 2 (the oracle admits every grouping)
    Rule("add-assoc", (A + B) + S, A + (B + S), (), _ex_field),
    Rule("sub-of-add", (A + B) - S, (A - S) + B, (), _ex_field),
    Rule("div-times", (A / B) * S, (A * S) / B, (), _ex_field),
    Rule("div-div", (A / B) / S, A / (B * S), (), _ex_field),
]

RULES_BY_NAME = {r.name: r for r in RULES}
assert len(RULES_BY_NAME) == len(RULES), "rule names must be unique"


def permutation_rules(perm: str) -> list[Rule]:
    """Rules about one permutation, made for each permutation a proof meets (ground in it: no
    pattern can compute `perm[d]` or the inverse permutation).

    A reduction (or a broadcast) over dim d of a tensor transposed by `perm` is the transpose of
    the same op over the dim `perm` takes d from (softmax over the rows of A^T is the softmax
    over the columns of A, transposed; keepdim reductions keep the rank, so `perm` stays the
    same). A transpose undoes its inverse, also across an elementwise op whose other operand is
    transposed by the inverse (a kernel computing exp(X W) * Y^T, whose output is viewed
    transposed, computes exp((X W)^T) * Y). And where `perm` swaps the last two dims, B^T A^T is
    (A B)^T (a kernel reading X^T and W^T as views computes (X W)^T)."""
    order = [int(x) for x in perm.split(",")]
    rank = len(order)
    inverse = ",".join(str(order.index(i)) for i in range(rank))
    out = []
    for i, src in enumerate(order):
        dim, from_dim = i - rank, src - rank
        out += [Rule(f"transpose-{op}[{perm}]{dim}", A.transpose(perm).reduce(op, dim, n),
                     A.reduce(op, from_dim, n).transpose(perm), (), _ex_permuted(order, None, reduced=src))
                for op in t.REDUCTIONS]
        out.append(Rule(f"transpose-bcast[{perm}]{dim}", A.transpose(perm).bcast(dim),
                        A.bcast(from_dim).transpose(perm), (), _ex_permuted(order, src)))
    out.append(Rule(f"transpose-inverse[{perm}]", A.transpose(inverse).transpose(perm), A, (),
                    _ex_permuted(order, None)))
    if rank >= 2 and order == [*range(rank - 2), rank - 1, rank - 2]:  # the last two dims swapped
        out.append(Rule(f"transpose-matmul[{perm}]", B.transpose(perm).matmul(A.transpose(perm), n),
                        A.matmul(B, n).transpose(perm), (), _ex_matmul_transposed(rank)))
    for op, f in OPERATOR.items():
        out.append(Rule(f"transpose-{op}-into-right[{perm}]", f(A, B.transpose(inverse)).transpose(perm),
                        f(A.transpose(perm), B), (), _ex_permuted(order, None, b="permuted")))
        out.append(Rule(f"transpose-{op}-into-left[{perm}]", f(A.transpose(inverse), B).transpose(perm),
                        f(A, B.transpose(perm)), (), _ex_permuted(order, None, a="permuted")))
    return out


def _ex_matmul_transposed(rank: int) -> Callable[[np.random.Generator], Bindings]:
    """A (.., m, k) and B (.., k, n) of distinct sizes: B^T A^T is (A B)^T."""

    def example(rng: np.random.Generator) -> Bindings:
        batch = [int(x) for x in rng.integers(2, 4, rank - 2)]
        return Bindings(tensors={"A": _rand(rng, *batch, 3, 4), "B": _rand(rng, *batch, 4, 5)}, extents={"n": 4})

    return example


def _ex_permuted(order: list[int], unit: int | None, a: str = "base", b: str = "base", reduced: int | None = None,
                 ) -> Callable[[np.random.Generator], Bindings]:
    """Positive tensors A and B whose dims all differ in size (a dim taken for another changes
    the shape), of size 1 along `unit` (what a broadcast needs); "permuted" ones have the base
    shape permuted by `order`."""

    def example(rng: np.random.Generator) -> Bindings:
        base = [int(x) for x in rng.permutation(np.arange(2, 2 + len(order)))]
        if unit is not None:
            base[unit] = 1
        shapes = {"base": base, "permuted": [base[i] for i in order]}
        extents = {} if reduced is None else {"n": base[reduced]}
        return Bindings(tensors={"A": np.abs(_rand(rng, *shapes[a])) + 0.5, "B": np.abs(_rand(rng, *shapes[b])) + 0.5},
                        extents=extents)

    return example
