"""Evaluate terms on float64 numpy arrays, with concrete axis sizes: the ground truth for rules.

Rules are checked, not trusted: each rewrite rule of the prover is evaluated on random concrete
instances (tensors of several sizes, axes of several sizes, tensors that depend on an axis where
the rule allows it) and both sides must agree. A tensor binding may be an array or a function of
the axis indices (a tile family).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from superopt.ops import Op
from superopt.primitives import apply
from superopt.reference import FloatAlgebra
from superopt.verifier.terms import (
    COMPOSITES,
    ELEMENTWISE_BINARY,
    ELEMENTWISE_UNARY,
    REDUCTIONS,
    AxisVar,
    ConstVar,
    DimVar,
    Ext,
    ExtVar,
    PermVar,
    Term,
    Var,
)

TensorValue = np.ndarray | Callable[[Mapping[str, int]], np.ndarray]
INEXACT = (Op.EXP, Op.SQRT, *COMPOSITES)  # no rational value


@dataclass
class Bindings:
    tensors: dict[str, TensorValue] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    axes: dict[str, str] = field(default_factory=dict)  # AxisVar name -> axis name
    consts: dict[str, float] = field(default_factory=dict)
    perms: dict[str, str] = field(default_factory=dict)  # PermVar name -> permutation text ("1,0")
    sizes: dict[str, int] = field(default_factory=dict)  # axis name -> size
    extents: dict[str, int] = field(default_factory=dict)  # ExtVar or extent symbol name -> value


class EvalError(ValueError):
    """A term that is ill-formed for the bound sizes (e.g. a split that does not divide)."""


def extent(n: object, b: Bindings) -> int:
    """The value of an extent under these bindings (a split must divide it)."""
    if isinstance(n, ExtVar):
        return b.extents[n.name]
    if not isinstance(n, Ext):
        raise EvalError(f"not an extent: {n!r}")
    if n.kind == "sym":
        return 1 if n.args[0] == "1" else b.extents[str(n.args[0])]
    inner, axis = extent(n.args[0], b), b.sizes[str(_param(n.args[1], b))]
    if n.kind == "times":
        return inner * axis
    if inner % axis:
        raise EvalError(f"extent {inner} split into {axis} tiles")
    return inner // axis


def _reduce(op: str, x: np.ndarray, d: int, n: int | None) -> np.ndarray:
    """A reduction over dim d of extent n: a value of size 1 there (a broadcast, a constant) is
    constant along d, so its sum is n times it and its mean is itself."""
    if n is None or (-d <= x.ndim and x.shape[d] == n):
        if -d > x.ndim:
            raise EvalError(f"{op} over dim {d} of shape {x.shape}")
        return getattr(np, op)(x, axis=d, keepdims=True)
    if -d <= x.ndim and x.shape[d] != 1:
        raise EvalError(f"{op} over dim {d} of shape {x.shape} with extent {n}")
    return x * n if op == Op.SUM else x


def _matmul(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """x @ y contracting an extent k: an operand of size 1 there is broadcast to k."""
    if x.shape[-1] == 1 and k != 1:
        x = np.broadcast_to(x, (*x.shape[:-1], k))
    if y.shape[-2] == 1 and k != 1:
        y = np.broadcast_to(y, (*y.shape[:-2], k, y.shape[-1]))
    if x.shape[-1] != k or y.shape[-2] != k:
        raise EvalError(f"matmul of {x.shape} and {y.shape} contracting {k}")
    return np.matmul(x, y)


def _param(p: object, b: Bindings) -> object:
    if isinstance(p, DimVar):
        return b.dims[p.name] + p.offset
    if isinstance(p, AxisVar):
        return b.axes[p.name]
    if isinstance(p, ConstVar):
        return b.consts[p.name]
    if isinstance(p, PermVar):
        return b.perms[p.name]
    return p


def evaluate(t: Term, b: Bindings, idx: Mapping[str, int] | None = None, exact: bool = False) -> np.ndarray:
    """The value of t; `exact`: in rational arithmetic (object arrays of Fractions: the floats
    bound, taken exactly), so no rounding can hide or fake a difference (no exp or sqrt)."""
    idx = dict(idx or {})
    if isinstance(t, Var):
        return _tensor(b.tensors[t.name], idx, exact)
    params = [_param(p, b) for p in t.params]
    op = t.op
    if op == "inp":
        return _tensor(b.tensors[str(params[0])], idx, exact)
    if op == Op.CONST:
        value = float(str(params[0]))
        return np.asarray(Fraction(value) if exact else value)
    kids = t.children
    if op in ("sum_over", "mean_over", "cat_over"):
        axis = str(params[-1])
        parts = [evaluate(kids[0], b, {**idx, axis: i}, exact) for i in range(b.sizes[axis])]
        if op == "cat_over":
            return np.concatenate(parts, axis=_int(params[0]))
        total = np.sum(parts, axis=0)
        return total / len(parts) if op == "mean_over" else total
    vals = [evaluate(c, b, idx, exact) for c in kids]
    if op in ELEMENTWISE_BINARY:
        fn = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}[op]
        return fn(vals[0], vals[1])
    if op in ELEMENTWISE_UNARY:
        if exact and op in INEXACT:
            raise EvalError(f"{op} has no exact evaluation")
        unary: dict[str, Callable[[np.ndarray], np.ndarray]] = {
            Op.NEG: np.negative, Op.EXP: np.exp, Op.SQRT: np.sqrt, Op.RELU: lambda x: np.maximum(x, 0.0),
        }
        fn1 = unary[op]
        return fn1(vals[0])
    if op in COMPOSITES:
        if exact:
            raise EvalError(f"{op} has no exact evaluation")
        return apply(FloatAlgebra(), op, vals, {}, [])
    x = vals[0]
    if op in REDUCTIONS:
        return _reduce(op, x, _int(params[0]), extent(t.params[1], b) if len(t.params) > 1 else None)
    if op in ("bcast", "squeeze"):
        d = _int(params[0])
        if -d <= x.ndim and x.shape[d] != 1:
            raise EvalError(f"{op} on dim {d} of shape {x.shape}, which is not 1")
        return np.squeeze(x, axis=d) if op == "squeeze" else x
    if op == Op.MATMUL:
        return _matmul(x, vals[1], extent(t.params[0], b))
    if op == Op.TRANSPOSE:
        return np.transpose(x, [int(v) for v in str(params[0]).split(",")])
    if op == Op.RESHAPE:
        return np.reshape(x, [int(v) for v in str(params[0]).split(",")])
    if op == "part":
        d, axis = _int(params[0]), str(params[1])
        n, k = x.shape[d], b.sizes[axis]
        if n % k:
            raise EvalError(f"part of dim {d} (size {n}) into {k} tiles")
        w = n // k
        sl = [slice(None)] * x.ndim
        sl[d] = slice(idx[axis] * w, (idx[axis] + 1) * w)
        return x[tuple(sl)]
    raise EvalError(f"no evaluation for op {op!r}")


def _tensor(v: TensorValue, idx: Mapping[str, int], exact: bool) -> np.ndarray:
    value = v(idx) if callable(v) else v
    return np.vectorize(Fraction, otypes=[object])(value) if exact else value


def agree(lhs: Term, rhs: Term, b: Bindings, free: list[str], rtol: float = 1e-9, exact: bool = False) -> bool:
    """Both sides have equal shapes and values for every index of the free axes (`exact`: equal
    rationals, see `evaluate`; else equal within rtol in float64)."""
    combos: list[dict[str, int]] = [{}]
    for axis in free:
        combos = [{**c, axis: i} for c in combos for i in range(b.sizes[axis])]
    for c in combos:
        x, y = evaluate(lhs, b, c, exact), evaluate(rhs, b, c, exact)
        if x.shape != y.shape:
            return False
        if not (np.array_equal(x, y) if exact else np.allclose(x, y, rtol=rtol, atol=1e-12)):
            return False
    return True


def exact_evaluable(t: Term) -> bool:
    """Whether t has an exact (rational) value: no exp or sqrt in it."""
    return isinstance(t, Var) or (t.op not in INEXACT and all(exact_evaluable(c) for c in t.children))


def _int(param: object) -> int:
    """An integer term parameter (dims are stored as ints, sometimes as their text)."""
    if not isinstance(param, int | str):
        raise EvalError(f"expected an integer parameter, got {param!r}")
    return int(param)
