"""Finite-field fingerprints: evaluate program and instantiated sGraph exactly in Z_p.

Every value carries its residue mod p and, while it can still reach an exponent, a shadow mod q
(none when the program has no exp) with q | p - 1: `exp(x)` is g^(x mod q) in Z_p with g of order
q, so exp(a + b) = exp(a) exp(b) holds exactly (Mirage's construction; p = 2q + 1 ≈ 2^31 here
instead of 16-bit fields). Arithmetic is exact, so there is no tolerance: a mismatch proves the two
computations differ (for the modelled ops). Ops outside {+, -, *, /, exp, max} (sqrt, relu, and
exp of a value that already went through exp) are uninterpreted: random low-degree polynomials
drawn per trial, the same on both sides, so any computation that applies them to equal arguments
agrees.

A residue cannot be ordered, so `max` selects (`MAX_MODEL`): when the program or the sGraph
takes a maximum, every value also carries `order`, the same computation in float64 on random
real inputs (the uninterpreted ops as strictly increasing stand-ins), and a maximum is the
residue of the element its order puts first. Maxima then combine as maxima do: a max of per-tile
maxima is the row's, a sum of them is not. (As a symmetric function of the elements summed, max
passed a sum of per-tile maxima for the row's at every shape.) Rounding could order two elements
within about 1e-15 of each other differently on the two sides; random real inputs make that
unlikely. `error_bound` counts the residues only: a schedule right for some orders of the
elements (the row's first element for its maximum) passes a trial whose random orders are such.

Equal fingerprints are a probabilistic statement: a nonzero difference of total degree D vanishes
at a random point with probability ≤ D/p (Schwartz–Zippel), and exponents collide with probability
about D_exp/q (times 1 + 1e-7: residues are drawn from 31 random bits, `_most_likely`); k
independent trials multiply. `error_bound` reports that figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from superopt.instantiate import Instance
from superopt.interpreter import run as run_sgraph
from superopt.ops import Op
from superopt.primitives import Algebra, ArrayAlgebra, V, apply
from superopt.program import Program
from superopt.sgraph import LibraryKernel, SGraph

P = 2147483783  # prime, P = 2 Q + 1
Q = 1073741891  # prime
G = 9  # 3^2 has order Q in Z_P^* (P - 1 = 2 Q)
EXACT_BITS = 53  # float64 holds every integer below 2^53
RESIDUE_BITS = 32  # residues mod P and Q are below 2^32
DRAW_BITS = 31  # random bits per drawn residue: times a residue below 2^32, below 2^63
POISON = -1  # never a residue: an unwritten output element fails every comparison
UF_DEGREE = 3
MAX_MODEL = ("finite fields: max selects the element that a float64 shadow of the same computation puts "
             "first, so maxima combine as maxima, never as sums; the e-graph and the float layer check max too")
MAX_OPS = (Op.MAX, Op.SOFTMAX)  # the ops whose meaning takes a maximum (softmax subtracts the row's)


class FF:
    """A tensor over Z_P with an optional exponent shadow over Z_Q. An input's residues are held as
    float64 only (`pf`, `qf`: exact below 2^53), kept through slices and views of it: a matmul
    reads a weight as float64 (`_matmul_mod`), and the int64 residues (`p`, `q`) are made only
    where an op needs them, so at real shapes a weight is held once, not as both (a decoder
    layer's field check at X (16, 4096): 4.9 -> 2.8 GB)."""

    __slots__ = ("_p", "_q", "order", "pf", "qf")

    def __init__(self, p: np.ndarray | None, q: np.ndarray | None,
                 pf: np.ndarray | None = None, qf: np.ndarray | None = None, order: np.ndarray | None = None) -> None:
        self._p, self._q, self.pf, self.qf, self.order = p, q, pf, qf, order

    @property
    def p(self) -> np.ndarray:
        if self._p is None:
            assert self.pf is not None
            self._p = self.pf.astype(np.int64)
        return self._p

    @property
    def q(self) -> np.ndarray | None:
        if self._q is None and self.qf is not None:
            self._q = self.qf.astype(np.int64)
        return self._q

    @q.setter
    def q(self, value: np.ndarray | None) -> None:
        self._q, self.qf = value, None

    @property
    def shadowed(self) -> bool:
        return self._q is not None or self.qf is not None


def _mulmod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    return (a * b) % m  # both < 2^31: the product fits in int64


def _powmod(base: np.ndarray, exp: int, m: int) -> np.ndarray:
    result = np.ones_like(base)
    b = base % m
    while exp:
        if exp & 1:
            result = _mulmod(result, b, m)
        b = _mulmod(b, b, m)
        exp >>= 1
    return result


def _inv(a: np.ndarray, m: int) -> np.ndarray:
    return _powmod(a, m - 2, m)  # Fermat; 0 maps to 0


# g^(j * 16^i) for every 4-bit digit j of an exponent and digit position i.
_G_TABLE = np.array([[pow(G, j << (4 * i), P) for j in range(16)] for i in range(8)], dtype=np.int64)


def _exp_g(e: np.ndarray) -> np.ndarray:
    """g^e mod P for an array of exponents in [0, Q), one table lookup per 4-bit digit."""
    out = _G_TABLE[0][e & 15]
    for i in range(1, 8):
        out = _mulmod(out, _G_TABLE[i][(e >> (4 * i)) & 15], P)
    return out


def _matmul_mod(
    a: np.ndarray | None, b: np.ndarray | None, m: int, af: np.ndarray | None = None, bf: np.ndarray | None = None,
) -> np.ndarray:
    """Exact (a @ b) mod m in float64 BLAS: the operand with fewer elements is cut into limbs of
    `width` bits, the other taken whole (residues below 2^32), so every sum of K products stays
    below 2^53, where float64 is exact. The limbs are stacked along the cut operand's free dim,
    so one product reads the large operand (a weight) once, as float64 (`af`, `bf`: the
    operands as float64 where known; then `a`, `b` may be None): reading it, not the products, is
    what a limb costs."""
    a_shape, b_shape = _shape(a, af), _shape(b, bf)
    k = a_shape[-1]
    if k > 1 << 16:  # keep the limbs wide: contract the halves apart
        lo, hi = (_matmul_mod(_part(a, h, False), _part(b, h, True), m, _part(af, h, False), _part(bf, h, True))
                  for h in (slice(None, k // 2), slice(k // 2, None)))
        return (lo + hi) % m
    width = EXACT_BITS - RESIDUE_BITS - max(k - 1, 1).bit_length()  # K 2^width 2^32 <= 2^53
    cut_a = math.prod(a_shape) <= math.prod(b_shape)
    small, whole, free = (_ints(a, af), _floats(b, bf), -2) if cut_a else (_ints(b, bf), _floats(a, af), -1)
    shifts = range(0, RESIDUE_BITS, width)
    limbs = np.concatenate([(small >> s) & ((1 << width) - 1) for s in shifts], axis=free).astype(np.float64)
    product = (np.matmul(limbs, whole) if cut_a else np.matmul(whole, limbs)).astype(np.int64) % m
    out = np.zeros((), dtype=np.int64)
    for s, part in zip(shifts, np.split(product, len(shifts), axis=free), strict=True):
        out = (out + part * pow(2, s, m)) % m
    return out


def _part(x: np.ndarray | None, half: slice, rows: bool) -> np.ndarray | None:
    """A half of an operand's contraction dim (its rows for the right operand, else its columns)."""
    if x is None:
        return None
    return x[..., half, :] if rows else x[..., half]


def _floats(x: np.ndarray | None, known: np.ndarray | None) -> np.ndarray:
    if known is not None:
        return known
    assert x is not None
    return x.astype(np.float64)


def _ints(x: np.ndarray | None, floats: np.ndarray | None) -> np.ndarray:
    if x is not None:
        return x
    assert floats is not None
    return floats.astype(np.int64)


def _shape(x: np.ndarray | None, floats: np.ndarray | None) -> tuple[int, ...]:
    held = x if x is not None else floats
    assert held is not None
    return held.shape


def _const_mod(value: float, m: int) -> int:
    f = Fraction(value)
    return f.numerator % m * pow(f.denominator % m, m - 2, m) % m


# Strictly increasing real stand-ins for the uninterpreted ops, in the order shadow: equal
# arguments give equal orders, different ones different orders (relu's zeros would tie).
_ORDER_STANDINS: dict[Op, Callable[[np.ndarray], np.ndarray]] = {
    Op.SQRT: lambda x: np.sign(x) * np.sqrt(np.abs(x)),
    Op.RELU: lambda x: np.where(x > 0, x, x / 8),
    Op.EXP: np.exp,
}


def _real(fn: Callable[..., np.ndarray], *xs: FF) -> np.ndarray | None:
    """`fn` of the operands' order shadows, when all carry one (overflow to inf is an order too)."""
    if any(x.order is None for x in xs):
        return None
    with np.errstate(all="ignore"):
        return fn(*(x.order for x in xs))


class FieldAlgebra(ArrayAlgebra[FF]):
    """Exact Z_P arithmetic with a Z_Q exponent shadow; uninterpreted ops drawn from `rng`."""

    def __init__(self, rng: np.random.Generator) -> None:
        draw = lambda m: [int(x) for x in rng.integers(1, m, UF_DEGREE + 1)]
        self.uf = {name: (draw(P), draw(Q)) for name in (Op.SQRT, Op.RELU, Op.EXP)}

    def _uf(self, name: Op, x: FF) -> FF:
        cp, cq = self.uf[name]
        return FF(_poly(cp, x.p, P), None if x.q is None else _poly(cq, x.q, Q), order=_real(_ORDER_STANDINS[name], x))

    def _lift(self, fn: Any, real: Callable[..., np.ndarray], *xs: FF) -> FF:
        p = fn(*(x.p for x in xs), P)
        q = fn(*(x.q for x in xs), Q) if all(x.shadowed for x in xs) else None
        return FF(p, q, order=_real(real, *xs))

    @staticmethod
    def _view(fn: Callable[[np.ndarray], np.ndarray], a: FF) -> FF:
        """The same layout change of the residues, the shadow, their float64 copies and the order
        (those held: an input's int64 residues are not made for a view of it)."""
        return FF(*(None if x is None else fn(x) for x in (a._p, a._q, a.pf, a.qf, a.order)))

    def const(self, value: float) -> FF:
        return FF(np.array(_const_mod(value, P), dtype=np.int64), np.array(_const_mod(value, Q), dtype=np.int64),
                  order=np.array(value, dtype=np.float64))

    def add(self, a: FF, b: FF) -> FF:
        return self._lift(lambda x, y, m: (x + y) % m, np.add, a, b)

    def sub(self, a: FF, b: FF) -> FF:
        return self._lift(lambda x, y, m: (x - y) % m, np.subtract, a, b)

    def mul(self, a: FF, b: FF) -> FF:
        return self._lift(_mulmod, np.multiply, a, b)

    def div(self, a: FF, b: FF) -> FF:
        return self._lift(lambda x, y, m: _mulmod(x, _inv(y, m), m), np.divide, a, b)

    def neg(self, a: FF) -> FF:
        return self._lift(lambda x, m: (-x) % m, np.negative, a)

    def exp(self, a: FF) -> FF:
        if a.q is None:  # exp of an exp: outside the exact fragment
            return self._uf(Op.EXP, a)
        return FF(_exp_g(a.q), None, order=_real(np.exp, a))

    def sqrt(self, a: FF) -> FF:
        return self._uf(Op.SQRT, a)

    def relu(self, a: FF) -> FF:
        return self._uf(Op.RELU, a)

    def sum(self, a: FF, dim: int, keepdim: bool) -> FF:
        total = lambda x: np.sum(x, axis=dim, keepdims=keepdim)
        return self._lift(lambda x, m: total(x) % m, total, a)

    def max(self, a: FF, dim: int, keepdim: bool) -> FF:
        """The element the order shadow puts first (an unwritten one, NaN, first of all)."""
        order = a.order
        if order is None:
            raise ValueError("max needs the order shadow: the inputs were drawn without it")
        first = np.expand_dims(np.argmax(order, axis=dim), dim)

        def pick(x: np.ndarray) -> np.ndarray:
            picked = np.take_along_axis(np.broadcast_to(x, order.shape), first, axis=dim)
            return picked if keepdim else np.squeeze(picked, axis=dim)

        return FF(pick(a.p), None if a.q is None else pick(a.q), order=pick(order))

    def mean(self, a: FF, dim: int, keepdim: bool, n: Any) -> FF:
        return self.div(self.sum(a, dim, keepdim), self.const(float(n)))

    def matmul(self, a: FF, b: FF) -> FF:
        q = _matmul_mod(a._q, b._q, Q, a.qf, b.qf) if a.shadowed and b.shadowed else None
        return FF(_matmul_mod(a._p, b._p, P, a.pf, b.pf), q, order=_real(np.matmul, a, b))

    def transpose(self, a: FF, perm: Sequence[int]) -> FF:
        return self._view(lambda x: np.transpose(x, perm), a)

    def reshape(self, a: FF, shape: Sequence[int]) -> FF:
        return self._view(lambda x: np.reshape(x, tuple(shape)), a)

    def take(self, a: FF, index: tuple[slice, ...]) -> FF:
        return self._view(lambda x: x[index], a)

    def poison(self, shape: Sequence[int]) -> FF:
        return FF(np.full(tuple(shape), POISON, dtype=np.int64), np.full(tuple(shape), POISON, dtype=np.int64))

    def put(self, buf: FF, index: tuple[slice, ...], value: FF) -> None:
        buf.p[index] = value.p
        if value.order is not None:
            if buf.order is None:
                buf.order = np.full(buf.p.shape, np.nan)  # unwritten: what a max picks first
            buf.order[index] = value.order
        if buf.q is not None:
            if value.q is None:
                buf.q = None
            else:
                buf.q[index] = value.q

    def concat(self, parts: Sequence[FF], dim: int) -> FF:
        p = np.concatenate([x.p for x in parts], axis=dim)
        qs = [x.q for x in parts]
        return FF(p, None if any(q is None for q in qs) else np.concatenate(qs, axis=dim),  # type: ignore[arg-type]
                  order=_real(lambda *xs: np.concatenate(xs, axis=dim), *parts))

    def broadcast_to(self, a: FF, shape: Sequence[int]) -> FF:
        return self._view(lambda x: np.broadcast_to(x, tuple(shape)), a)

    def round(self, a: FF, storage: Any) -> FF:
        return a


def _poly(coeffs: list[int], x: np.ndarray, m: int) -> np.ndarray:
    out = np.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        out = (_mulmod(out, x, m) + c) % m
    return out


def random_field_inputs(
    program: Program, rng: np.random.Generator, shadow: Collection[str] | None = None, ordered: bool = False,
) -> dict[str, FF]:
    """Random residues, with float64 copies for matmuls (`FF.pf`); the exponent shadow of the
    inputs in `shadow` (default: all), the others' never being read (`exponent_inputs`: at real
    shapes a shadow doubles an input's work); with `ordered`, random reals in [-1, 1) that order
    the values for max (drawn last: the residues are those drawn without)."""
    inputs = {}
    for n in program.inputs:
        pf = _residues(rng, P, n.shape).astype(np.float64)
        qf = _residues(rng, Q, n.shape).astype(np.float64) if shadow is None or n.id in shadow else None
        inputs[n.id] = FF(None, None, pf, qf)
    for n in program.inputs if ordered else ():
        inputs[n.id].order = rng.uniform(-1.0, 1.0, n.shape)
    return inputs


def _residues(rng: np.random.Generator, m: int, shape: tuple[int, ...]) -> np.ndarray:
    """Residues mod m (< 2^32), each from 31 random bits scaled to [0, m): none has more than
    ceil(2^31 / m) of the 2^31 draws (`_most_likely`), the figure Schwartz-Zippel's bound takes;
    a third of `rng.integers`' time, which is most of a check's at real shapes."""
    bits = rng.bit_generator.random_raw(shape)
    bits >>= np.uint64(64 - DRAW_BITS)
    drawn = bits.view(np.int64)  # below 2^31: the same values; in place, as allocations are most of the time
    drawn *= m
    drawn >>= DRAW_BITS
    return drawn


def _most_likely(m: int) -> float:
    """The largest probability of one residue mod m drawn by `_residues`."""
    return -(-(1 << DRAW_BITS) // m) / (1 << DRAW_BITS)


def evaluate_program(program: Program, inputs: Mapping[str, V], alg: Algebra[V]) -> list[V]:
    values: dict[str, V] = dict(inputs)
    for n in program.topological():
        if n.op != "input":
            args = [values[i] for i in n.inputs]
            values[n.id] = apply(alg, n.op, args, n.attrs, [program.nodes[i].shape for i in n.inputs])
    return [values[o] for o in program.outputs]


@dataclass
class FieldCheck:
    passed: bool
    trials: int
    error_bound: float  # probability that a wrong sGraph passes every trial
    mismatch: str = ""
    max_model: str = ""  # how max was evaluated (`MAX_MODEL`), when the program or the sGraph takes one


def check(program: Program, inst: Instance, trials: int = 2, seed: int = 0) -> FieldCheck:
    """Compare fingerprints of `program` and the instantiated sGraph over `trials` random points."""
    deg, deg_exp = degree_bounds(program)
    per_trial = min(1.0, deg * _most_likely(P) + deg_exp * _most_likely(Q))
    shadowed = exponent_inputs(program)
    ordered = takes_max(program, inst.sgraph)
    model = MAX_MODEL if ordered else ""
    for trial in range(trials):
        if mismatch := _trial(program, inst, np.random.default_rng([seed, trial]), shadowed, ordered):
            return FieldCheck(False, trial + 1, per_trial ** (trial + 1), f"trial {trial}: {mismatch}", model)
    return FieldCheck(True, trials, per_trial**trials, max_model=model)


def takes_max(program: Program, sgraph: SGraph) -> bool:
    """Whether the program or the sGraph takes a maximum: only then do values need their order."""
    ops: list[str] = [n.op for n in program.topological()]
    for k in sgraph.kernels:
        ops += [k.op] if isinstance(k, LibraryKernel) else [op.op for op in k.block.ops()]
    return any(op in MAX_OPS for op in ops)


def _trial(program: Program, inst: Instance, rng: np.random.Generator, shadowed: frozenset[str], ordered: bool) -> str:
    """One random point: which output differs, or "". Its own frame, so that a trial's arrays
    are freed before the next one draws (at real shapes, held across the draws they tripled
    the next trial's time)."""
    alg = FieldAlgebra(rng)
    inputs = random_field_inputs(program, rng, shadow=shadowed, ordered=ordered)
    want = evaluate_program(program, inputs, alg)
    got = run_sgraph(inst, inputs, alg)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.p.shape != g.p.shape:
            return f"output {i}: shape differs"
        if not np.array_equal(w.p, g.p):
            return f"output {i}: {int(np.sum(w.p != g.p))} of {w.p.size} elements differ"
    return ""


class _Degree(Algebra[tuple[int, int]]):
    """(polynomial degree, exponent degree) bounds, treating a/b as a polynomial of deg a + deg b."""

    def const(self, value: float) -> tuple[int, int]:
        return 0, 0

    def add(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return max(a[0], b[0]), max(a[1], b[1])

    sub = add

    def mul(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return a[0] + b[0], max(a[1], b[1])

    div = mul
    matmul = mul

    def neg(self, a: tuple[int, int]) -> tuple[int, int]:
        return a

    def exp(self, a: tuple[int, int]) -> tuple[int, int]:
        return 1, max(a[1], a[0])

    def sqrt(self, a: tuple[int, int]) -> tuple[int, int]:
        return UF_DEGREE * a[0], a[1]

    relu = sqrt

    def sum(self, a: tuple[int, int], dim: int, keepdim: bool) -> tuple[int, int]:
        return a

    def max(self, a: tuple[int, int], dim: int, keepdim: bool) -> tuple[int, int]:
        return a  # one of the elements

    def mean(self, a: tuple[int, int], dim: int, keepdim: bool, n: Any) -> tuple[int, int]:
        return a

    def transpose(self, a: tuple[int, int], perm: Sequence[int]) -> tuple[int, int]:
        return a

    def reshape(self, a: tuple[int, int], shape: Sequence[int]) -> tuple[int, int]:
        return a


def degree_bounds(program: Program) -> tuple[int, int]:
    outputs = evaluate_program(program, {n.id: (1, 0) for n in program.inputs}, _Degree())
    # The difference of two rational functions of degree D compares by cross-multiplication: 2D.
    return max(2 * d for d, _ in outputs), max(2 * e for _, e in outputs)


class _Inputs(Algebra[frozenset[str]]):
    """The program inputs each value depends on; `under_exp` gathers those of exp's arguments."""

    def __init__(self) -> None:
        self.under_exp: set[str] = set()

    def const(self, value: float) -> frozenset[str]:
        return frozenset()

    def add(self, a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
        return a | b

    sub = mul = div = matmul = add

    def neg(self, a: frozenset[str]) -> frozenset[str]:
        return a

    sqrt = relu = neg

    def exp(self, a: frozenset[str]) -> frozenset[str]:
        self.under_exp |= a
        return a

    def sum(self, a: frozenset[str], dim: int, keepdim: bool) -> frozenset[str]:
        return a

    max = sum

    def transpose(self, a: frozenset[str], perm: Sequence[int]) -> frozenset[str]:
        return a

    def reshape(self, a: frozenset[str], shape: Sequence[int]) -> frozenset[str]:
        return a


def exponent_inputs(program: Program) -> frozenset[str]:
    """The program inputs an exp's argument depends on: only theirs need the exponent shadow (a
    value's shadow is read by exp alone; an equivalent sGraph's exps take what the program's do).
    gated_mlp: X and the gate's weight, not the up projection's."""
    alg = _Inputs()
    evaluate_program(program, {n.id: frozenset({n.id}) for n in program.inputs}, alg)
    return frozenset(alg.under_exp)
