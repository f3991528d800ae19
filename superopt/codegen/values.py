"""Thread-level fusion: the value of a block tensor at one element, as C statements and an expression.

A stage walks an iteration space (an element loop over a tile, or the rows and reduced dim of a
reduction). A tensor stored in shared memory is read at the element with numpy broadcasting (a
size-1 dim reads index 0); a tensor the storage plan keeps in registers (an elementwise chain,
or a constant) is recomputed here from its operands, one `const float` per op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from superopt.codegen.layout import strides
from superopt.codegen.prelude import float_literal, formula
from superopt.ops import Op


@dataclass(frozen=True)
class Coord:
    """Coordinate of one dim: `var / inner % extent` (extent None: no modulo needed)."""

    var: str
    inner: int = 1
    extent: int | None = None

    def expr(self) -> str:
        e = self.var if self.inner == 1 else f"{self.var} / {self.inner}"
        return e if self.extent is None else f"{e} % {self.extent}"


class Space:
    """An iteration space: the shape walked, how each dim's coordinate derives from loop variables,
    and (for element loops) the linear index that addresses a tensor of exactly this shape."""

    def __init__(self, shape: tuple[int, ...], coords: dict[int, Coord], linear: str | None = None) -> None:
        self.shape = shape
        self.coords = coords
        self.linear = linear
        self.decls: list[str] = []
        self._names: dict[int, str] = {}

    @staticmethod
    def elements(shape: tuple[int, ...], var: str = "i") -> Space:
        """Row-major walk of `shape` by the linear variable `var`."""
        st = strides(shape)
        coords = {d: Coord(var, st[d], None if d == 0 else n) for d, n in enumerate(shape)}
        return Space(shape, coords, var)

    @staticmethod
    def rows(shape: tuple[int, ...], dim: int, row: str = "row", k: str = "k") -> Space:
        """Rows of `shape` along `dim`: `row` enumerates the other dims row-major, `k` walks `dim`."""
        others = [d for d in range(len(shape)) if d != dim]
        coords = {dim: Coord(k)}
        for j, d in enumerate(others):
            inner = 1
            for e in others[j + 1 :]:
                inner *= shape[e]
            coords[d] = Coord(row, inner, None if j == 0 else shape[d])
        return Space(shape, coords)

    def coord(self, d: int) -> str:
        if self.shape[d] == 1:
            return "0"
        if d not in self._names:
            c = self.coords[d]
            if c.inner == 1 and c.extent is None:
                self._names[d] = c.var
            else:
                self._names[d] = f"c{d}"
                self.decls.append(f"const int c{d} = {c.expr()};")
        return self._names[d]

    def index(self, shape: tuple[int, ...]) -> str:
        """Linear index into a tensor of `shape` broadcast (right-aligned) over this space."""
        if shape == self.shape and self.linear is not None:
            return self.linear
        off = len(self.shape) - len(shape)
        st = strides(shape)
        terms = []
        for j, n in enumerate(shape):
            if n == 1:
                continue
            c = self.coord(j + off)
            terms.append(c if st[j] == 1 else f"{c} * {st[j]}")
        return " + ".join(terms) or "0"


@dataclass(frozen=True)
class TensorRef:
    """How a block tensor is read: from a shared-memory tile, as a constant, or recomputed."""

    name: str  # C name of the smem pointer (stored) or of the register value (fused)
    shape: tuple[int, ...]
    stored: bool
    op: str | None = None  # the op that computes it (fused tensors and constants)
    inputs: tuple[str, ...] = ()
    value: float | None = None  # constants


class Values:
    """Lowers reads of block tensors in one iteration space into `lets` plus an expression."""

    def __init__(self, space: Space, ref: Callable[[str], TensorRef]) -> None:
        self.space = space
        self.ref = ref
        self.lets: list[str] = []
        self._done: set[str] = set()
        self.leaves: set[str] = set()  # stored tensors read

    def of(self, tid: str) -> str:
        r = self.ref(tid)
        if r.op == Op.CONST:
            assert r.value is not None
            return float_literal(r.value)
        if r.stored:
            self.leaves.add(tid)
            return f"so_f({r.name}[{self.space.index(r.shape)}])"
        if tid not in self._done:
            args = [self.of(i) for i in r.inputs]
            assert r.op is not None
            self.lets.append(f"const float {r.name} = {formula(r.op, args)};")
            self._done.add(tid)
        return r.name

    def body(self, statements: list[str]) -> list[str]:
        """The loop body: coordinates, then fused values, then the statements using them."""
        return [*self.space.decls, *self.lets, *statements]
