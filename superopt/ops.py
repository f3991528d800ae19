"""The operator table: arity, attributes and shape/dtype rules for every tensor operation.

One table serves the program IR, the pre-defined (library) kernels of sGraphs and the block-level
ops of graph-defined kernels, so a shape rule is written once. Shapes are tuples of `Size`
(concrete programs use constant sizes; block tiles use symbolic ones).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from superopt.sizes import Size, product

Shape = tuple[Size, ...]



class Op(StrEnum):
    """Every tensor operation's name. Members equal the strings programs spell in JSON, so a
    program, an sGraph or a database row reads and writes the same text; code compares against
    members so a misspelt op is an attribute error, not a silent mismatch."""

    # repr as the string too: messages, digests of reprs (search keys over kernels and terms) and
    # texts that held the plain name read the same with a member in its place.
    __repr__ = str.__repr__

    CONST = "const"
    MATMUL = "matmul"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    NEG = "neg"
    EXP = "exp"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SQUARE = "square"
    SILU = "silu"
    GELU = "gelu"
    RELU = "relu"
    SIGMOID = "sigmoid"
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    RMS_NORM = "rms_norm"
    SOFTMAX = "softmax"
    TRANSPOSE = "transpose"
    RESHAPE = "reshape"


UNARY = (Op.NEG, Op.EXP, Op.SQRT, Op.RSQRT, Op.SQUARE, Op.SILU, Op.GELU, Op.RELU, Op.SIGMOID)
BINARY = (Op.ADD, Op.SUB, Op.MUL, Op.DIV)
REDUCE = (Op.SUM, Op.MEAN, Op.MAX)
NORMALIZE = (Op.RMS_NORM, Op.SOFTMAX)  # a reduction and an elementwise map over one dim, fused
LAYOUT = (Op.TRANSPOSE, Op.RESHAPE)  # move elements, compute nothing
ELEMENTWISE = frozenset(UNARY + BINARY)
ONE = Size.const(1)


class OpError(ValueError):
    """An operation applied to operands or attributes it does not accept (message names why)."""


@dataclass(frozen=True)
class Attr:
    kind: str  # "int", "bool", "float", "perm", "shape"
    default: Any = None
    required: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: Op
    arity: int
    attrs: Mapping[str, Attr]
    infer: Callable[[Sequence[Shape], Mapping[str, Any]], Shape]
    block_level: bool  # may appear inside a block graph


def broadcast(a: Shape, b: Shape) -> Shape:
    """numpy broadcasting over symbolic sizes: right-aligned, equal or 1."""
    out: list[Size] = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else ONE
        db = b[-i] if i <= len(b) else ONE
        if da == db or db == ONE:
            out.append(da)
        elif da == ONE:
            out.append(db)
        else:
            raise OpError(f"shapes {fmt_shape(a)} and {fmt_shape(b)} do not broadcast (dim -{i}: {da} vs {db})")
    return tuple(reversed(out))


def normalize_dim(dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise OpError(f"dim {dim} is out of range for a rank-{rank} tensor")
    return dim % rank


def fmt_shape(shape: Sequence[Size | int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _same(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    return shapes[0]


def _binary(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    return broadcast(shapes[0], shapes[1])


def _reduce(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    x = shapes[0]
    if not x:
        raise OpError("cannot reduce a scalar")
    d = normalize_dim(attrs["dim"], len(x))
    if attrs["keepdim"]:
        return (*x[:d], ONE, *x[d + 1 :])
    return (*x[:d], *x[d + 1 :])


def _normalize_over_dim(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    normalize_dim(attrs["dim"], len(shapes[0]))
    return shapes[0]


NO_BROADCAST = "matmul does not broadcast: reshape a batch into rows to multiply it by one matrix"


def _matmul(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise OpError(f"matmul needs operands of rank >= 2, got {fmt_shape(a)} and {fmt_shape(b)}")
    if len(a) != len(b):
        raise OpError(f"matmul operands must have the same rank, got {fmt_shape(a)} and {fmt_shape(b)} "
                      f"({NO_BROADCAST})")
    if a[:-2] != b[:-2]:
        raise OpError(f"matmul batch dimensions differ: {fmt_shape(a)} @ {fmt_shape(b)} ({NO_BROADCAST})")
    if a[-1] != b[-2]:
        raise OpError(f"matmul inner dimensions differ: {fmt_shape(a)} @ {fmt_shape(b)} ({a[-1]} vs {b[-2]})")
    return (*a[:-1], b[-1])


def _transpose(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    x, perm = shapes[0], attrs["perm"]
    if sorted(perm) != list(range(len(x))):
        raise OpError(f"perm {list(perm)} is not a permutation of the {len(x)} dims")
    return tuple(x[p] for p in perm)


def _reshape(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    x, new = shapes[0], tuple(Size.of(s) for s in attrs["shape"])
    if product(x) != product(new):
        raise OpError(f"cannot reshape {fmt_shape(x)} into {fmt_shape(new)}: element counts differ")
    return new


def _const(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    return ()


_REDUCE_ATTRS = {"dim": Attr("int", required=True), "keepdim": Attr("bool", False)}

OPS: dict[str, OpSpec] = {
    Op.CONST: OpSpec(Op.CONST, 0, {"value": Attr("float", required=True)}, _const, True),
    Op.MATMUL: OpSpec(Op.MATMUL, 2, {}, _matmul, True),
    **{n: OpSpec(n, 2, {}, _binary, True) for n in BINARY},
    **{n: OpSpec(n, 1, {}, _same, True) for n in UNARY},
    **{n: OpSpec(n, 1, _REDUCE_ATTRS, _reduce, True) for n in REDUCE},
    Op.RMS_NORM: OpSpec(
        Op.RMS_NORM, 1, {"dim": Attr("int", -1), "eps": Attr("float", 1e-6)}, _normalize_over_dim, True
    ),
    Op.SOFTMAX: OpSpec(Op.SOFTMAX, 1, {"dim": Attr("int", -1)}, _normalize_over_dim, True),
    Op.TRANSPOSE: OpSpec(Op.TRANSPOSE, 1, {"perm": Attr("perm", required=True)}, _transpose, False),
    Op.RESHAPE: OpSpec(Op.RESHAPE, 1, {"shape": Attr("shape", required=True)}, _reshape, False),
}
assert set(OPS) == set(Op), "every Op has a spec"


def spec(op: str) -> OpSpec:
    try:
        return OPS[op]
    except KeyError:
        raise OpError(f"unknown op {op!r}") from None


def check_attrs(op: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Validate and complete an op's attributes; returns them with defaults filled in."""
    sp = spec(op)
    unknown = set(attrs) - set(sp.attrs)
    if unknown:
        raise OpError(f"unexpected attribute {sorted(unknown)[0]!r} for {op}")
    out: dict[str, Any] = {}
    for name, a in sp.attrs.items():
        if name not in attrs or attrs[name] is None:
            if a.required:
                raise OpError(f"missing attribute {name!r} for {op}")
            out[name] = a.default
            continue
        out[name] = _check_attr(op, name, a.kind, attrs[name])
    if op == Op.RMS_NORM and not out["eps"] > 0:
        raise OpError(f"attribute 'eps' of rms_norm must be > 0, got {out['eps']}")
    return out


def _check_attr(op: str, name: str, kind: str, v: Any) -> Any:
    if kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif kind == "bool":
        ok = isinstance(v, bool)
    elif kind == "float":
        real = isinstance(v, int | float) and not isinstance(v, bool)
        ok = real and abs(v) <= sys.float_info.max and math.isfinite(v)  # huge ints overflow float()
    elif kind in ("perm", "shape"):
        ok = isinstance(v, list | tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
    else:
        raise AssertionError(kind)
    if not ok:
        raise OpError(f"attribute {name!r} of {op} must be {_KIND_TEXT[kind]}, got {v!r}")
    if kind == "float":
        return float(v)
    if kind == "shape" and any(i <= 0 for i in v):
        raise OpError(f"attribute {name!r} of {op} has a non-positive dimension: {list(v)}")
    return tuple(v) if kind in ("perm", "shape") else v


_KIND_TEXT = {
    "int": "an integer",
    "bool": "true or false",
    "float": "a finite number",
    "perm": "a list of integers",
    "shape": "a list of positive integers",
}


def infer_shape(op: str, shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Shape:
    sp = spec(op)
    if len(shapes) != sp.arity:
        raise OpError(f"{op} takes {sp.arity} operand(s), got {len(shapes)}")
    return sp.infer(shapes, attrs)


def canonical_attrs(op: str, attrs: Mapping[str, Any], in_shapes: Sequence[Shape]) -> dict[str, Any]:
    """Attributes in a form independent of spelling: dims made non-negative, tuples as lists."""
    out = dict(attrs)
    if "dim" in out and in_shapes:
        out["dim"] = normalize_dim(out["dim"], len(in_shapes[0]))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(out.items())}
