"""The prover's rewrite rules, as data: each with its side conditions and a concrete example.

No rule mentions a size, but every sum, mean and matmul names the extent it reduces (`n`, `m`):
a sum of a term constant along its dim is the term times that extent, so a rule that dropped or
moved an extent would be true only where two extents are equal. Side conditions are about dims
(`d != d2`, `d <= -3`) and about axes: `indep(E, a)` (E does not depend on axis a; derived
syntactically in the e-graph) and `a != b`. Rules move layout operators outward (from the inputs
where the lowering puts them toward the accumulators and outputs where they cancel), so
saturation stays small.

`example(rng)` builds concrete bindings for a rule (tensors of random sizes, axes of pairwise
distinct sizes, the extents of the dims it reduces, operands constant along a dim wherever the rule
allows a broadcast, tile families that depend on an axis wherever the rule allows it); the test
suite evaluates both sides in float64 on several of them (`superopt.verifier.term_eval`) before any proof is trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from superopt.primitives import Algebra, apply
from superopt.verifier import terms as t
from superopt.verifier.term_eval import Bindings, TensorValue
from superopt.verifier.terms import AxisVar, ConstVar, DimVar, ExtVar, PermVar, Term, Var

A, B, E, S = Var("A"), Var("B"), Var("E"), Var("S")
d, d2 = DimVar("d"), DimVar("d2")
n, m = ExtVar("n"), ExtVar("m")
a, b = AxisVar("a"), AxisVar("b")
c = ConstVar("c")
p = PermVar("p")

# A side condition: ("indep", tensor var, axis var) | ("ne_dim", d, d2) | ("le_dim", d, int)
# | ("ne_axis", a, b) | ("lt_dim", d, d2)
Cond = tuple[str, object, object]


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
    for op in t.ELEMENTWISE_BINARY:
        out.append(Rule(f"part-{op}", t.binary(op, t.part(A, d, a), t.part(B, d, a)), t.part(t.binary(op, A, B), d, a),
                        example=_ex_binary_parts, free=("a",)))
        out.append(Rule(f"part-{op}-bcast-right", t.binary(op, t.part(A, d, a), t.bcast(B, d)),
                        t.part(t.binary(op, A, t.bcast(B, d)), d, a), example=_ex_binary_bcast, free=("a",)))
        out.append(Rule(f"part-{op}-const-right", t.binary(op, t.part(A, d, a), t.const(c)),
                        t.part(t.binary(op, A, t.const(c)), d, a), example=_ex_binary_const, free=("a",)))
        if op in ("sub", "div"):  # add and mul reach the left-hand forms by commutativity
            out.append(Rule(f"part-{op}-bcast-left", t.binary(op, t.bcast(B, d), t.part(A, d, a)),
                            t.part(t.binary(op, t.bcast(B, d), A), d, a), example=_ex_binary_bcast, free=("a",)))
            out.append(Rule(f"part-{op}-const-left", t.binary(op, t.const(c), t.part(A, d, a)),
                            t.part(t.binary(op, t.const(c), A), d, a), example=_ex_binary_const, free=("a",)))
    return out


class _Elementwise(Algebra[Term]):
    """Terms of the elementwise primitives, as the lowering writes them for a tile's operands of
    one shape (constants broadcast implicitly): `composite` spells a composite op out with it."""

    def const(self, value: float) -> Term:
        return t.const(value)

    def add(self, a: Term, b: Term) -> Term:
        return t.binary("add", a, b)

    def sub(self, a: Term, b: Term) -> Term:
        return t.binary("sub", a, b)

    def mul(self, a: Term, b: Term) -> Term:
        return t.binary("mul", a, b)

    def div(self, a: Term, b: Term) -> Term:
        return t.binary("div", a, b)

    def neg(self, a: Term) -> Term:
        return t.unary("neg", a)

    def exp(self, a: Term) -> Term:
        return t.unary("exp", a)

    def sqrt(self, a: Term) -> Term:
        return t.unary("sqrt", a)

    def relu(self, a: Term) -> Term:
        return t.unary("relu", a)

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


def composite(op: str, x: Term) -> Term:
    """A one-operand elementwise composite (sigmoid, silu, gelu) of x, in primitives."""
    return apply(_Elementwise(), op, [x], {}, [])


# One-operand elementwise composites: a part moves out of each in one step, not one per primitive
# (gelu has ten). A chain of activations is one kernel's work; the prover's iterations bound the
# depth it can move a part through, and sixteen ops of a chain spelled out took more than forty.
COMPOSITES = ("sigmoid", "silu", "gelu")


def _ex_transposed(rng: np.random.Generator) -> Bindings:
    """Positive tensors (sqrt, division) of one shape and a random permutation of its dims."""
    perm = ",".join(map(str, rng.permutation(3)))
    return Bindings(tensors={n: np.abs(_rand(rng, 2, 3, 4)) + 0.5 for n in ("A", "B")}, perms={"p": perm},
                    consts={"c": float(rng.uniform(0.5, 2.0))})


def _transpose_rules() -> list[Rule]:
    """Elementwise ops of transposed operands are the transpose of the op (a kernel may compute
    the op and leave the transpose to a view of its output)."""
    out = [Rule(f"transpose-{op}", t.unary(op, t.transpose(A, p)), t.transpose(t.unary(op, A), p), (),
                _ex_transposed) for op in t.ELEMENTWISE_UNARY]
    for op in t.ELEMENTWISE_BINARY:
        out.append(Rule(f"transpose-{op}", t.binary(op, t.transpose(A, p), t.transpose(B, p)),
                        t.transpose(t.binary(op, A, B), p), (), _ex_transposed))
        out.append(Rule(f"transpose-{op}-const-right", t.binary(op, t.transpose(A, p), t.const(c)),
                        t.transpose(t.binary(op, A, t.const(c)), p), (), _ex_transposed))
        if op in ("sub", "div"):  # add and mul reach the left-hand form by commutativity
            out.append(Rule(f"transpose-{op}-const-left", t.binary(op, t.const(c), t.transpose(A, p)),
                            t.transpose(t.binary(op, t.const(c), A), p), (), _ex_transposed))
    return out


RULES: list[Rule] = [
    # -- layout -----------------------------------------------------------------------------
    Rule("part-commute", t.part(t.part(E, d, a), d2, b), t.part(t.part(E, d2, b), d, a), (("ne_dim", d, d2),),
         _ex_part_commute, ("a", "b")),
    Rule("cat-of-parts", t.cat_over(t.part(E, d, a), d, a), E, (("indep", E, a),), _ex_cat_part),
    Rule("part-of-cat", t.part(t.cat_over(E, d, a), d, a), E, (), _ex_part_cat, ("a",)),
    Rule("cat-commute", t.cat_over(t.cat_over(E, d, a), d2, b), t.cat_over(t.cat_over(E, d2, b), d, a),
         (("ne_dim", d, d2), ("ne_axis", a, b)), _ex_cat_commute),
    Rule("bcast-commute", t.bcast(t.bcast(E, d), d2), t.bcast(t.bcast(E, d2), d), (("ne_dim", d, d2),),
         _ex_bcast_commute),
    Rule("part-bcast-other", t.bcast(t.part(E, d, a), d2), t.part(t.bcast(E, d2), d, a), (("ne_dim", d, d2),),
         _ex_bcast_other, ("a",)),
    Rule("part-squeeze-after", t.squeeze(t.part(E, d, a), d2), t.part(t.squeeze(E, d2), d, a), (("lt_dim", d2, d),),
         _ex_squeeze(before=False), ("a",)),
    Rule("part-squeeze-before", t.squeeze(t.part(E, d, a), d2), t.part(t.squeeze(E, d2), DimVar("d", 1), a),
         (("lt_dim", d, d2),), _ex_squeeze(before=True), ("a",)),
    # -- elementwise ops move tile maps outward -------------------------------------------------
    *_binary_rules(),
    *[Rule(f"part-{op}", t.unary(op, t.part(A, d, a)), t.part(t.unary(op, A), d, a), (), _ex_unary, ("a",))
      for op in t.ELEMENTWISE_UNARY],
    *[Rule(f"part-{op}", composite(op, t.part(A, d, a)), t.part(composite(op, A), d, a), (), _ex_unary, ("a",))
      for op in COMPOSITES],
    *[Rule(f"part-{op}-other-dim", t.reduce(op, t.part(E, d, a), d2, n), t.part(t.reduce(op, E, d2, n), d, a),
           (("ne_dim", d, d2),), _ex_reduce_other, ("a",)) for op in t.REDUCTIONS],
    *_transpose_rules(),
    # -- matmul -----------------------------------------------------------------------------
    Rule("matmul-rows", t.matmul(t.part(A, -2, a), B, n), t.part(t.matmul(A, B, n), -2, a), (), _ex_matmul("rows"),
         ("a",)),
    Rule("matmul-cols", t.matmul(A, t.part(B, -1, a), n), t.part(t.matmul(A, B, n), -1, a), (), _ex_matmul("cols"),
         ("a",)),
    Rule("matmul-batch", t.matmul(t.part(A, d, a), t.part(B, d, a), n), t.part(t.matmul(A, B, n), d, a),
         (("le_dim", d, -3),), _ex_matmul("batch"), ("a",)),
    Rule("matmul-contract", t.sum_over(t.matmul(t.part(A, -1, a), t.part(B, -2, a), t.per(n, a)), a),
         t.matmul(A, B, n), (("indep", A, a), ("indep", B, a)), _ex_matmul("contract")),
    Rule("matmul-row-scale-div", t.matmul(t.binary("div", A, t.bcast(S, -1)), B, n),
         t.binary("div", t.matmul(A, B, n), t.bcast(S, -1)), (), _ex_row_scale),
    Rule("matmul-const-left", t.matmul(t.binary("mul", A, t.const(c)), B, n),
         t.binary("mul", t.matmul(A, B, n), t.const(c)), (), _ex_const_scale),
    Rule("matmul-const-right", t.matmul(A, t.binary("mul", B, t.const(c)), n),
         t.binary("mul", t.matmul(A, B, n), t.const(c)), (), _ex_const_scale),
    Rule("matmul-row-scale-mul", t.matmul(t.binary("mul", A, t.bcast(S, -1)), B, n),
         t.binary("mul", t.matmul(A, B, n), t.bcast(S, -1)), (), _ex_row_scale),
    # products regroup and distribute over sums: X @ (A @ B) is (X @ A) @ B, a low-rank update
    # X @ (W + A @ B) is X @ W + (X @ A) @ B; each product keeps the extent it contracts
    Rule("matmul-assoc", t.matmul(t.matmul(A, B, n), S, m), t.matmul(A, t.matmul(B, S, m), n), (),
         _ex_matmul_chain),
    Rule("matmul-distribute-right", t.matmul(A, t.binary("add", B, S), n),
         t.binary("add", t.matmul(A, B, n), t.matmul(A, S, n)), (), _ex_matmul_sum("right")),
    Rule("matmul-distribute-left", t.matmul(t.binary("add", B, S), A, n),
         t.binary("add", t.matmul(B, A, n), t.matmul(S, A, n)), (), _ex_matmul_sum("left")),
    # -- reductions over an axis --------------------------------------------------------------
    Rule("sum-over-tile-sums", t.sum_over(t.reduce("sum", t.part(E, d, a), d, t.per(n, a)), a),
         t.reduce("sum", E, d, n), (("indep", E, a),), _ex_over_reduce),
    Rule("mean-over-tile-means", t.mean_over(t.reduce("mean", t.part(E, d, a), d, t.per(n, a)), a),
         t.reduce("mean", E, d, n), (("indep", E, a),), _ex_over_reduce),
    Rule("sum-over-part-other", t.sum_over(t.part(E, d, b), a), t.part(t.sum_over(E, a), d, b), (("ne_axis", a, b),),
         _ex_over_part_other, ("b",)),
    Rule("mean-over-part-other", t.mean_over(t.part(E, d, b), a), t.part(t.mean_over(E, a), d, b),
         (("ne_axis", a, b),), _ex_over_part_other, ("b",)),
    Rule("sum-over-add", t.sum_over(t.binary("add", A, B), a), t.binary("add", t.sum_over(A, a), t.sum_over(B, a)),
         (), _ex_over_add),
    Rule("sum-over-matmul-left", t.sum_over(t.matmul(A, B, n), a), t.matmul(t.sum_over(A, a), B, n),
         (("indep", B, a),),
         _ex_over_linear("left")),
    Rule("sum-over-matmul-right", t.sum_over(t.matmul(A, B, n), a), t.matmul(A, t.sum_over(B, a), n),
         (("indep", A, a),),
         _ex_over_linear("right")),
    # a sum or mean of a product's columns (rows) is the product with the right operand's columns
    # (the left operand's rows) summed first: a matrix-vector product instead of the matmul
    *[Rule(f"{op}-of-matmul-cols", t.reduce(op, t.matmul(A, B, n), -1, m), t.matmul(A, t.reduce(op, B, -1, m), n),
           (), _ex_matmul_reduced(-1)) for op in ("sum", "mean")],
    *[Rule(f"{op}-of-matmul-rows", t.reduce(op, t.matmul(A, B, n), -2, m), t.matmul(t.reduce(op, A, -2, m), B, n),
           (), _ex_matmul_reduced(-2)) for op in ("sum", "mean")],
    Rule("sum-over-scale", t.sum_over(t.binary("mul", A, B), a), t.binary("mul", t.sum_over(A, a), B),
         (("indep", B, a),), _ex_over_linear("scale")),
    Rule("sum-over-divide", t.sum_over(t.binary("div", A, B), a), t.binary("div", t.sum_over(A, a), B),
         (("indep", B, a),), _ex_over_linear("divide")),
    Rule("mean-over-invariant", t.mean_over(E, a), E, (("indep", E, a),), _ex_indep),
    # a sum or mean over loop iterations commutes with a sum or mean over a dim, and a squeeze
    # (a one-block kernel walking X's rows sums each iteration's column sums: sum(sum(X)))
    *[Rule(f"{over}-{op}", getattr(t, over)(t.reduce(op, E, d, n), a), t.reduce(op, getattr(t, over)(E, a), d, n), (),
           _ex_over_dim(unit=False)) for over in ("sum_over", "mean_over") for op in ("sum", "mean")],
    *[Rule(f"{over}-squeeze", getattr(t, over)(t.squeeze(E, d), a), t.squeeze(getattr(t, over)(E, a), d), (),
           _ex_over_dim(unit=True)) for over in ("sum_over", "mean_over")],
    # -- signs move outward: a schedule may negate before or after a linear op ------------------
    Rule("neg-neg", t.unary("neg", t.unary("neg", A)), A, (), _ex_comm),
    Rule("matmul-neg-left", t.matmul(t.unary("neg", A), B, n), t.unary("neg", t.matmul(A, B, n)), (), _ex_row_scale),
    Rule("matmul-neg-right", t.matmul(A, t.unary("neg", B), n), t.unary("neg", t.matmul(A, B, n)), (),
         _ex_row_scale),
    *[Rule(f"{op}-neg-left", t.binary(op, t.unary("neg", A), B), t.unary("neg", t.binary(op, A, B)), (), _ex_comm)
      for op in ("mul", "div")],
    *[Rule(f"{op}-neg", t.reduce(op, t.unary("neg", E), d, n), t.unary("neg", t.reduce(op, E, d, n)), (),
           _ex_over_reduce)
      for op in ("sum", "mean")],
    Rule("sub-swap", t.binary("sub", A, B), t.unary("neg", t.binary("sub", B, A)), (), _ex_comm),
    Rule("sum-over-neg", t.sum_over(t.unary("neg", A), a), t.unary("neg", t.sum_over(A, a)), (), _ex_over_add),
    Rule("mean-over-neg", t.mean_over(t.unary("neg", A), a), t.unary("neg", t.mean_over(A, a)), (), _ex_over_add),
    # -- algebra ------------------------------------------------------------------------------
    # sums and means over dims are linear: they commute (a kernel may reduce the columns first)
    # and distribute over + and - (sum(X + Y) as sum(X) + sum(Y)); exp(A + B) is exp(A) exp(B).
    # The oracle admits all of these, so the search builds such schedules.
    *[Rule(f"{inner}-{outer}-commute", t.reduce(outer, t.reduce(inner, E, d, n), d2, m),
           t.reduce(inner, t.reduce(outer, E, d2, m), d, n), (("ne_dim", d, d2),), _ex_two_dims)
      for inner in ("sum", "mean") for outer in ("sum", "mean")],
    *[Rule(f"{op}-of-{bop}", t.reduce(op, t.binary(bop, A, B), d, n),
           t.binary(bop, t.reduce(op, A, d, n), t.reduce(op, B, d, n)), (), _ex_same_shape)
      for op in ("sum", "mean") for bop in ("add", "sub")],
    # a term constant along the reduced dim (a constant, a broadcast) is its own mean, whatever
    # the extent (its sum would be it times the extent: no schedule needs that rule yet)
    Rule("mean-of-const", t.reduce("mean", t.const(c), d, n), t.const(c), (), _ex_constant_along),
    Rule("mean-of-bcast", t.reduce("mean", t.bcast(S, d), d, n), S, (), _ex_constant_along),
    # a scale broadcast along the reduced dim comes out of the reduction (the sum of a normalized
    # row is the row's sum over its norm)
    *[Rule(f"{op}-of-{bop}-by-bcast", t.reduce(op, t.binary(bop, A, t.bcast(S, d)), d, n),
           t.binary(bop, t.reduce(op, A, d, n), S), (), _ex_reduced_scale)
      for op in ("sum", "mean") for bop in ("mul", "div")],
    Rule("exp-of-add", t.unary("exp", t.binary("add", A, B)), t.binary("mul", t.unary("exp", A), t.unary("exp", B)),
         (), _ex_same_shape),
    Rule("exp-of-sub", t.unary("exp", t.binary("sub", A, B)), t.binary("div", t.unary("exp", A), t.unary("exp", B)),
         (), _ex_same_shape),
    # a quotient of two quotients by one exponential (never 0) is the quotient: a softmax whose
    # row maximum is subtracted from the exponent, and one where it is not
    Rule("div-cancel-exp",
         t.binary("div", t.binary("div", A, t.unary("exp", S)), t.binary("div", B, t.unary("exp", S))),
         t.binary("div", A, B), (), _ex_field),
    Rule("sub-as-add-neg", t.binary("sub", A, B), t.binary("add", A, t.unary("neg", B)), (), _ex_comm),
    Rule("mul-one", t.binary("mul", A, t.const(1.0)), A, (), _ex_comm),
    # a sum or mean of a term scaled by a constant is the scaled sum or mean
    *[Rule(f"{op}-of-{bop}-const", t.reduce(op, t.binary(bop, A, t.const(c)), d, n),
           t.binary(bop, t.reduce(op, A, d, n), t.const(c)), (), _ex_scaled_reduction)
      for op in ("sum", "mean") for bop in ("mul",)],
    # a broadcast of an op is the op of broadcasts (1 / S broadcast along the columns is 1 over the
    # broadcast S: an rsqrt written as a quotient meets the norm it scales)
    *[Rule(f"bcast-{op}", t.bcast(t.binary(op, A, B), d), t.binary(op, t.bcast(A, d), t.bcast(B, d)), (),
           _ex_unit_pair) for op in ("add", "mul", "div")],
    *[Rule(f"bcast-{op}-const-left", t.bcast(t.binary(op, t.const(c), A), d), t.binary(op, t.const(c), t.bcast(A, d)),
           (), _ex_unit_pair) for op in ("add", "mul", "div")],
    *[Rule(f"bcast-{op}-const-right", t.bcast(t.binary(op, A, t.const(c)), d), t.binary(op, t.bcast(A, d), t.const(c)),
           (), _ex_unit_pair) for op in ("add", "mul")],
    *[Rule(f"bcast-{op}", t.bcast(t.unary(op, A), d), t.unary(op, t.bcast(A, d)), (), _ex_unit_pair)
      for op in ("neg", "exp", "sqrt")],
    *[Rule(f"{op}-of-bcast", t.unary(op, t.bcast(A, d)), t.bcast(t.unary(op, A), d), (), _ex_unit_pair)
      for op in ("neg", "exp", "sqrt")],
    Rule("add-comm", t.binary("add", A, B), t.binary("add", B, A), (), _ex_comm),
    Rule("mul-comm", t.binary("mul", A, B), t.binary("mul", B, A), (), _ex_comm),
    Rule("mul-assoc", t.binary("mul", t.binary("mul", A, B), S), t.binary("mul", A, t.binary("mul", B, S)), (),
         _ex_field),
    # sums regroup too: (X + 2) - X is (X - X) + 2 (the oracle admits every grouping)
    Rule("add-assoc", t.binary("add", t.binary("add", A, B), S), t.binary("add", A, t.binary("add", B, S)), (),
         _ex_field),
    Rule("sub-of-add", t.binary("sub", t.binary("add", A, B), S), t.binary("add", t.binary("sub", A, S), B), (),
         _ex_field),
    Rule("div-times", t.binary("mul", t.binary("div", A, B), S), t.binary("div", t.binary("mul", A, S), B), (),
         _ex_field),
    Rule("div-div", t.binary("div", t.binary("div", A, B), S), t.binary("div", A, t.binary("mul", B, S)), (),
         _ex_field),
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
        out += [Rule(f"transpose-{op}[{perm}]{dim}", t.reduce(op, t.transpose(A, perm), dim, n),
                     t.transpose(t.reduce(op, A, from_dim, n), perm), (), _ex_permuted(order, None, reduced=src))
                for op in t.REDUCTIONS]
        out.append(Rule(f"transpose-bcast[{perm}]{dim}", t.bcast(t.transpose(A, perm), dim),
                        t.transpose(t.bcast(A, from_dim), perm), (), _ex_permuted(order, src)))
    out.append(Rule(f"transpose-inverse[{perm}]", t.transpose(t.transpose(A, inverse), perm), A, (),
                    _ex_permuted(order, None)))
    if rank >= 2 and order == [*range(rank - 2), rank - 1, rank - 2]:  # the last two dims swapped
        out.append(Rule(f"transpose-matmul[{perm}]", t.matmul(t.transpose(B, perm), t.transpose(A, perm), n),
                        t.transpose(t.matmul(A, B, n), perm), (), _ex_matmul_transposed(rank)))
    for op in t.ELEMENTWISE_BINARY:
        out.append(Rule(f"transpose-{op}-into-right[{perm}]",
                        t.transpose(t.binary(op, A, t.transpose(B, inverse)), perm),
                        t.binary(op, t.transpose(A, perm), B), (), _ex_permuted(order, None, b="permuted")))
        out.append(Rule(f"transpose-{op}-into-left[{perm}]",
                        t.transpose(t.binary(op, t.transpose(A, inverse), B), perm),
                        t.binary(op, A, t.transpose(B, perm)), (), _ex_permuted(order, None, a="permuted")))
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
