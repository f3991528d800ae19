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
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

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
    if op == "const":
        return alg.const(attrs["value"])
    if op in _PRIMITIVE_BINARY:
        return getattr(alg, op)(args[0], args[1])
    if not args:
        raise ValueError(f"op {op!r} needs an operand")
    x = args[0]
    if op in ("neg", "exp", "sqrt", "relu"):
        return getattr(alg, op)(x)
    if op == "square":
        return square(alg, x)
    if op == "rsqrt":
        return alg.div(alg.const(1.0), alg.sqrt(x))
    if op == "sigmoid":
        return sigmoid(alg, x)
    if op == "silu":
        return alg.mul(x, sigmoid(alg, x))
    if op == "gelu":
        inner = alg.add(x, alg.mul(alg.const(GELU_C), alg.mul(x, square(alg, x))))
        return alg.mul(x, sigmoid(alg, alg.mul(alg.const(GELU_K), inner)))
    if op == "sum" or op == "max":
        return getattr(alg, op)(x, attrs["dim"], attrs["keepdim"])
    if op == "mean":
        return alg.mean(x, attrs["dim"], attrs["keepdim"], _extent(shapes, attrs["dim"]))
    if op == "rms_norm":
        d = attrs["dim"]
        ms = alg.mean(square(alg, x), d, True, _extent(shapes, d))
        return alg.div(x, alg.sqrt(alg.add(ms, alg.const(attrs["eps"]))))
    if op == "softmax":
        d = attrs["dim"]
        e = alg.exp(alg.sub(x, alg.max(x, d, True)))
        return alg.div(e, alg.sum(e, d, True))
    if op == "matmul":
        return alg.matmul(args[0], args[1])
    if op == "transpose":
        return alg.transpose(x, attrs["perm"])
    if op == "reshape":
        return alg.reshape(x, attrs["shape"])
    raise ValueError(f"no definition for op {op!r}")


_PRIMITIVE_BINARY = ("add", "sub", "mul", "div")


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
