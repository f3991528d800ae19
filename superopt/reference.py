"""The numpy reference: evaluate programs on float arrays, in float64 or in their declared dtype.

In the declared dtype every op computes in float32 and its output is rounded to the dtype (what
a framework running the program op by op stores); in float64 nothing is rounded. The same
`FloatAlgebra` runs the tiles of the sGraph interpreter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice, product

import numpy as np

from superopt.dtypes import DType, dtype
from superopt.ops import Op
from superopt.primitives import ArrayAlgebra, apply
from superopt.program import Node, Program

SIGN_PATTERNS = 16  # sign patterns of the inputs tried where signed ones leave a program undefined: all of four inputs
OFFSETS = (0.0, 1.0, 8.0)  # added to the inputs' magnitudes, in turn, where no sign pattern defines the program


class FloatAlgebra(ArrayAlgebra[np.ndarray]):
    """Float arrays. `precision` None means exact float64; otherwise compute in float32."""

    def __init__(self, precision: DType | None = None) -> None:
        self.precision = precision
        self.ftype = np.float64 if precision is None else np.float32

    def round(self, x: np.ndarray, storage: DType | None) -> np.ndarray:
        """Round a stored value to `storage` (no-op in float64 mode or for fp32 storage)."""
        if self.precision is None or storage is None:
            return x
        return storage.round(x)

    def take(self, a: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
        return a[index]

    def poison(self, shape: Sequence[int]) -> np.ndarray:
        return np.full(tuple(shape), np.nan, dtype=self.ftype)

    def put(self, buf: np.ndarray, index: tuple[slice, ...], value: np.ndarray) -> None:
        buf[index] = value

    def concat(self, parts: Sequence[np.ndarray], dim: int) -> np.ndarray:
        return np.concatenate(parts, axis=dim)

    def broadcast_to(self, a: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return np.broadcast_to(a, tuple(shape))

    def cast(self, x: np.ndarray) -> np.ndarray:
        """`x` in the compute type; in float64 mode a float32 array is kept as it is (no copy of
        a weight at real shapes): it holds its values exactly, and every op computes in float64."""
        x = np.asarray(x)
        return x if self.precision is None and x.dtype == np.float32 else x.astype(self.ftype, copy=False)

    def const(self, value: float) -> np.ndarray:
        return np.asarray(value, dtype=self.ftype)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.add(a, b, dtype=self.ftype)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.subtract(a, b, dtype=self.ftype)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.multiply(a, b, dtype=self.ftype)

    def div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(a, b, dtype=self.ftype)

    def neg(self, a: np.ndarray) -> np.ndarray:
        return np.negative(a, dtype=self.ftype)

    def exp(self, a: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.exp(a, dtype=self.ftype)

    def sqrt(self, a: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.sqrt(a, dtype=self.ftype)

    def relu(self, a: np.ndarray) -> np.ndarray:
        return np.maximum(a, 0).astype(self.ftype)

    def sum(self, a: np.ndarray, dim: int, keepdim: bool) -> np.ndarray:
        return np.asarray(np.sum(a, axis=dim, keepdims=keepdim, dtype=self.ftype))

    def max(self, a: np.ndarray, dim: int, keepdim: bool) -> np.ndarray:
        return np.max(a, axis=dim, keepdims=keepdim).astype(self.ftype)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # inf/NaN operands propagate; callers compare results
            return np.matmul(a.astype(self.ftype, copy=False), b.astype(self.ftype, copy=False))

    def transpose(self, a: np.ndarray, perm: Sequence[int]) -> np.ndarray:
        return np.transpose(a, perm)

    def reshape(self, a: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return np.reshape(a, tuple(shape))


def evaluate(program: Program, inputs: Mapping[str, np.ndarray], exact: bool = True) -> list[np.ndarray]:
    """Run `program`. exact=True: float64 throughout; False: the program's dtype, op by op."""
    values = _node_values(program, inputs, exact)
    return [values[o] for o in program.outputs]


def _node_values(program: Program, inputs: Mapping[str, np.ndarray], exact: bool = True) -> dict[str, np.ndarray]:
    for n in program.inputs:
        if np.shape(inputs[n.id]) != n.shape:
            raise ValueError(f"input {n.id!r} has shape {np.shape(inputs[n.id])}, the program declares {n.shape}")
    return node_values(program, inputs, FloatAlgebra(None if exact else dtype(program.dtype)))


def node_values(program: Program, inputs: Mapping[str, np.ndarray], alg: FloatAlgebra) -> dict[str, np.ndarray]:
    """Every node's value on `inputs` in `alg`'s arithmetic. The inputs may have other sizes than
    the program declares, where its ops allow (no reshape): the search's checks at small sizes."""
    values: dict[str, np.ndarray] = {}
    for n in program.topological():
        if n.op == "input":
            values[n.id] = alg.round(alg.cast(np.asarray(inputs[n.id])), dtype(n.dtype or "f32"))
            continue
        args = [values[i] for i in n.inputs]
        out = apply(alg, n.op, args, n.attrs, [np.shape(a) for a in args])
        values[n.id] = alg.round(out, dtype(n.dtype) if n.dtype else None)
    return values


def random_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    """Fresh random inputs (never zeros), scaled so that matmul outputs stay of order one.

    Each input gets its own scale in [0.5, 1] and a small offset, so that normalizations and
    means are not accidentally near identities; an input used as the right operand of a matmul
    (itself, or transposed, reshaped or multiplied into it) is further scaled by 1/sqrt(contraction length),
    which keeps attention logits of order one (exp without a max subtraction stays inside f16
    even summed over thousands of keys). Values are rounded to the input's dtype so every layer
    sees exactly representable numbers, and held as float32, which represents them all (half the
    memory of float64 at real shapes).
    """
    rng = np.random.default_rng(seed)
    scale = {n.id: 1.0 for n in program.inputs}
    for n in program.nodes.values():
        if n.op != Op.MATMUL:
            continue
        right = program.nodes[n.inputs[1]]
        leaf = right
        # A layout of an input scales that input; a product, its left operand (its right one is
        # scaled for its own contraction): K = X @ Wk read as transpose(K) scales X.
        while leaf.op in (Op.TRANSPOSE, Op.RESHAPE, Op.MATMUL):
            leaf = program.nodes[leaf.inputs[0]]
        if leaf.op == "input":
            scale[leaf.id] = min(scale[leaf.id], 1.0 / np.sqrt(right.shape[-2]))
    out: dict[str, np.ndarray] = {}
    for n in program.inputs:
        s = scale[n.id] * rng.uniform(0.5, 1.0)
        x = rng.standard_normal(n.shape)
        x += 0.1  # in place: at real shapes each new array was a fresh page-faulted allocation
        x *= s
        x[x == 0] = s
        out[n.id] = dtype(n.dtype or "f32").round(x)  # float32: exact for every dtype's values
    return out


def inputs_and_reference(program: Program, seed: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """`random_inputs` and the program's float64 outputs on them. Where the program is undefined
    at signed inputs (a square root of an input) or overflows its dtype there (a division by a
    row sum of signed values near zero, then exp), each input is given one sign (its magnitudes
    still random, never zero): all positive first, then the other patterns, up to
    `SIGN_PATTERNS`, until one defines the program (the square root of -X @ W wants X negative);
    then the same with each magnitude raised by an offset (`OFFSETS`: sqrt(X - 1) wants X > 1).
    No comparison with a NaN reference means anything, and no computation in the dtype can
    match values it cannot hold, the unfused program's included."""
    inputs, values = _defined_inputs(program, seed)
    return inputs, [values[o] for o in program.outputs]


def undefined_node(program: Program, seed: int = 0) -> Node | None:
    """The first node whose value is not finite in its dtype at every input sign pattern and
    offset that `inputs_and_reference` tries (None: the program is defined there). No float
    check of any schedule can pass against such a program."""
    return _unfit(program, _defined_inputs(program, seed)[1])


def _defined_inputs(program: Program, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`inputs_and_reference`'s inputs, with every node's float64 value at them."""
    signed = random_inputs(program, seed)
    values = _node_values(program, signed)
    if _unfit(program, values) is None:
        return signed, values
    first: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None
    for offset in OFFSETS:
        for signs in islice(product((1.0, -1.0), repeat=len(signed)), SIGN_PATTERNS):
            inputs = {name: dtype(program.nodes[name].dtype or "f32").round(sign * (np.abs(x) + offset))
                      for (name, x), sign in zip(signed.items(), signs, strict=True)}
            values = _node_values(program, inputs)
            if _unfit(program, values) is None:
                return inputs, values
            first = first or (inputs, values)
    assert first is not None
    return first  # all positive: the float layer will say why


def _unfit(program: Program, values: Mapping[str, np.ndarray]) -> Node | None:
    """The first computed node whose value is not finite within its dtype (inputs are, by construction)."""
    return next((n for n in program.topological()
                 if n.op != "input" and not np.all(np.abs(values[n.id]) <= dtype(n.dtype or "f32").largest)), None)


def max_rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """Normwise relative error max|out - ref| / max|ref|; inf when out has NaN/inf or a wrong shape."""
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return float("inf")
    denom = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(out - ref)) / denom)
