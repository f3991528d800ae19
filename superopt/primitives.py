"""The one definition of every operation in terms of primitive operations of an `Algebra`.

Every layer that gives tensors a meaning implements `Algebra` over its own values: float numpy
arrays (reference evaluator, sGraph interpreter), finite-field fingerprints, e-graph terms
(prover) and abstract expressions (search pruning). Composite operations (square, rsqrt, sigmoid,
silu, gelu, softmax, rms_norm, and mean by default) are defined here once, so all layers agree on
what they mean.

gelu is the tanh approximation, written with the identity 0.5 * (1 + tanh(z)) = sigmoid(2 z), so it
stays inside {+, -, *, /, exp}.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from superopt.ops import Op

V = TypeVar("V")

GELU_K = 2.0 * math.sqrt(2.0 / math.pi)  # 2 * sqrt(2/pi): tanh(z) -> sigmoid(2 z)
GELU_C = 0.044715


class Algebra(ABC, Generic[V]):
    """Primitive operations over some kind of tensor value V. Broadcasting follows numpy."""

    @abstractmethod
    def const(self, value: float) -> V: ...

    @abstractmethod
    def add(self, a: V, b: V) -> V: ...

    @abstractmethod
    def sub(self, a: V, b: V) -> V: ...

    @abstractmethod
    def mul(self, a: V, b: V) -> V: ...

    @abstractmethod
    def div(self, a: V, b: V) -> V: ...

    @abstractmethod
    def neg(self, a: V) -> V: ...

    @abstractmethod
    def exp(self, a: V) -> V: ...

    @abstractmethod
    def sqrt(self, a: V) -> V: ...

    @abstractmethod
    def relu(self, a: V) -> V: ...

    @abstractmethod
    def sum(self, a: V, dim: int, keepdim: bool) -> V: ...

    @abstractmethod
    def max(self, a: V, dim: int, keepdim: bool) -> V: ...

    @abstractmethod
    def matmul(self, a: V, b: V) -> V: ...

    @abstractmethod
    def transpose(self, a: V, perm: Sequence[int]) -> V: ...

    @abstractmethod
    def reshape(self, a: V, shape: Sequence[int]) -> V: ...

    def mean(self, a: V, dim: int, keepdim: bool, n: Any) -> V:
        """Mean over `dim` of extent n. Algebras that reason without sizes override this."""
        return self.div(self.sum(a, dim, keepdim), self.const(float(n)))


def apply(alg: Algebra[V], op: str, args: Sequence[V], attrs: Mapping[str, Any], shapes: Sequence[Any]) -> V:
    """Apply `op` to `args` in `alg`. `shapes` are the operands' shapes (only mean's default
    definition needs them, for the extent it divides by)."""
    define = DEFINITIONS.get(op)
    if define is None:
        raise ValueError(f"no definition for op {op!r}")
    if not args and op != Op.CONST:
        raise ValueError(f"op {op!r} needs an operand")
    return define(alg, args, attrs, shapes)


def _gelu(alg: Algebra[V], x: V) -> V:
    inner = alg.add(x, alg.mul(alg.const(GELU_C), alg.mul(x, square(alg, x))))
    return alg.mul(x, sigmoid(alg, alg.mul(alg.const(GELU_K), inner)))


def _rms_norm(alg: Algebra[V], x: V, attrs: Mapping[str, Any], shapes: Sequence[Any]) -> V:
    d = attrs["dim"]
    ms = alg.mean(square(alg, x), d, True, _extent(shapes, d))
    return alg.div(x, alg.sqrt(alg.add(ms, alg.const(attrs["eps"]))))


def _softmax(alg: Algebra[V], x: V, d: int) -> V:
    e = alg.exp(alg.sub(x, alg.max(x, d, True)))
    return alg.div(e, alg.sum(e, d, True))


# Every op in terms of the algebra's primitives: (alg, args, attrs, shapes) -> value. Keyed by Op.
DEFINITIONS: dict[str, Callable[[Algebra[Any], Sequence[Any], Mapping[str, Any], Sequence[Any]], Any]] = {
    Op.CONST: lambda alg, a, at, sh: alg.const(at["value"]),
    Op.ADD: lambda alg, a, at, sh: alg.add(a[0], a[1]),
    Op.SUB: lambda alg, a, at, sh: alg.sub(a[0], a[1]),
    Op.MUL: lambda alg, a, at, sh: alg.mul(a[0], a[1]),
    Op.DIV: lambda alg, a, at, sh: alg.div(a[0], a[1]),
    Op.NEG: lambda alg, a, at, sh: alg.neg(a[0]),
    Op.EXP: lambda alg, a, at, sh: alg.exp(a[0]),
    Op.SQRT: lambda alg, a, at, sh: alg.sqrt(a[0]),
    Op.RELU: lambda alg, a, at, sh: alg.relu(a[0]),
    Op.SQUARE: lambda alg, a, at, sh: square(alg, a[0]),
    Op.RSQRT: lambda alg, a, at, sh: alg.div(alg.const(1.0), alg.sqrt(a[0])),
    Op.SIGMOID: lambda alg, a, at, sh: sigmoid(alg, a[0]),
    Op.SILU: lambda alg, a, at, sh: alg.mul(a[0], sigmoid(alg, a[0])),
    Op.GELU: lambda alg, a, at, sh: _gelu(alg, a[0]),
    Op.SUM: lambda alg, a, at, sh: alg.sum(a[0], at["dim"], at["keepdim"]),
    Op.MAX: lambda alg, a, at, sh: alg.max(a[0], at["dim"], at["keepdim"]),
    Op.MEAN: lambda alg, a, at, sh: alg.mean(a[0], at["dim"], at["keepdim"], _extent(sh, at["dim"])),
    Op.RMS_NORM: lambda alg, a, at, sh: _rms_norm(alg, a[0], at, sh),
    Op.SOFTMAX: lambda alg, a, at, sh: _softmax(alg, a[0], at["dim"]),
    Op.MATMUL: lambda alg, a, at, sh: alg.matmul(a[0], a[1]),
    Op.TRANSPOSE: lambda alg, a, at, sh: alg.transpose(a[0], at["perm"]),
    Op.RESHAPE: lambda alg, a, at, sh: alg.reshape(a[0], at["shape"]),
}
assert set(DEFINITIONS) == set(Op), "every Op has a definition"


def _extent(shapes: Sequence[Any], dim: int) -> Any:
    """The size of the reduced dim, for algebras that need it (None where shapes are not given)."""
    return shapes[0][dim] if shapes and shapes[0] is not None else None


def square(alg: Algebra[V], x: V) -> V:
    return alg.mul(x, x)


def sigmoid(alg: Algebra[V], x: V) -> V:
    return alg.div(alg.const(1.0), alg.add(alg.const(1.0), alg.exp(alg.neg(x))))


class ArrayAlgebra(Algebra[V]):
    """An algebra over arrays that can be sliced and assembled: what the sGraph interpreter needs."""

    @abstractmethod
    def take(self, a: V, index: tuple[slice, ...]) -> V: ...

    @abstractmethod
    def poison(self, shape: Sequence[int]) -> V:
        """A buffer whose unwritten elements can never pass a comparison (NaN, or a marker)."""

    @abstractmethod
    def put(self, buf: V, index: tuple[slice, ...], value: V) -> None: ...

    @abstractmethod
    def concat(self, parts: Sequence[V], dim: int) -> V: ...

    @abstractmethod
    def broadcast_to(self, a: V, shape: Sequence[int]) -> V:
        """`a` repeated along its unit dims (numpy's rules): a tile every block of an axis writes."""

    @abstractmethod
    def round(self, a: V, storage: Any) -> V:
        """Round a value to the storage dtype it is written in (identity for exact algebras)."""
