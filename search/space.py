"""The search space of one program: which ops and constants the generator may use.

The vocabulary comes from the program itself: its ops, and for composites that contain a
reduction (rms_norm, softmax, mean) the primitives of their definition too, because a fused kernel
splits such a reduction across loop iterations (an rms_norm becomes a mean of squares accumulated
over the loop, then a square root and a division after it). Elementwise composites (silu, gelu,
sigmoid, rsqrt, square) stay whole: they fuse as they are. Constants are the program's constants
and those of the composites' definitions (eps), so `x + eps` is one generator step.
"""

from __future__ import annotations

from dataclasses import dataclass

from superopt import ops
from superopt.config import SPLITTABLE, UNSUPPORTED
from superopt.program import Program


class UnsupportedProgram(ValueError):
    """A program the search cannot handle (message names the node and op)."""


@dataclass(frozen=True)
class Space:
    block_ops: tuple[str, ...]  # ops a block graph may contain (ordered: the canonical rank)
    library_ops: tuple[str, ...]  # ops a library kernel may run: the program's own ops
    constants: tuple[float, ...]
    keepdim_false: bool  # whether reductions that drop their dim appear in the program
    free_kernels: int | None  # kernels of a schedule that may be free views (None: any number)

    def rank(self, op: str) -> int:
        return self.block_ops.index(op) if op in self.block_ops else len(self.block_ops) + (op == "acc")

    def launches(self, kernels: int) -> int:
        """The fewest launches that many kernels pay: all but those that may be free views."""
        return 0 if self.free_kernels is None else max(0, kernels - self.free_kernels)


def space_of(program: Program) -> Space:
    seen: list[str] = []
    written: set[str] = set()
    consts: list[float] = []
    keepdim_false = False
    for n in program.topological():
        if n.op == "input":
            continue
        if n.op not in ops.OPS:
            raise UnsupportedProgram(f"node {n.id!r}: op {n.op!r} is not supported by the search")
        if n.op == "const":
            consts.append(float(n.attrs["value"]))
            continue
        written.add(n.op)
        if n.op in ops.REDUCE and not n.attrs["keepdim"]:
            keepdim_false = True
        for op in (n.op, *SPLITTABLE.get(n.op, ())):
            if op not in seen:
                seen.append(op)
        if n.op == "rms_norm":
            consts.append(float(n.attrs["eps"]))
    block = tuple(op for op in _ORDER if op in seen and op not in UNSUPPORTED)
    library = tuple(op for op in _ORDER if op in written)
    return Space(block, library, tuple(dict.fromkeys(consts)), keepdim_false, _free_kernels(program))


def _free_kernels(program: Program) -> int | None:
    """How many kernels of a schedule the prover can prove may be free views: one per reshape of
    the program (no prover rule moves a reshape, so such a schedule reshapes only the values the
    program reshapes, and it computes no value twice; the oracle's abstract values do not tell a
    reshape apart, so the search reshapes no other value: `KernelSearch._reshapes`), any
    number where the program transposes (the prover's transpose rules make transposed values of
    many others)."""
    written = [n.op for n in program.topological()]
    return None if "transpose" in written else sum(op == "reshape" for op in written)


# The canonical order of op types (the generator adds ops in increasing (operands, rank) order).
_ORDER = (
    "matmul", "mul", "div", "add", "sub", "neg", "exp", "sqrt", "rsqrt", "square", "silu", "gelu", "relu",
    "sigmoid", "sum", "mean", "max", "rms_norm", "softmax", "transpose", "reshape",
)
