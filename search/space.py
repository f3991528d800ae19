"""The search space of one program: which ops and constants the generator may use.

The vocabulary comes from the program itself: its ops, and for composites that contain a
reduction (rms_norm, softmax, mean) the primitives of their definition too, because a fused kernel
splits such a reduction across loop iterations (an rms_norm becomes a mean of squares accumulated
over the loop, then a square root and a division after it). Elementwise composites (silu, gelu,
sigmoid, rsqrt, square) stay whole: they fuse as they are. Constants are the program's constants
and those of the composites' definitions (eps), so `x + eps` is one generator step. A run of
elementwise ops each read only by the next (`Chain`) is one step, taken whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from superopt import ops
from superopt.config import SPLITTABLE, UNSUPPORTED
from superopt.ops import Op
from superopt.program import Node, Program
from superopt.verifier.oracle import AE, AV, abstract_program

# One op of a chain: op, its operands (-1: the previous op's value; i >= 0: the chain's i-th
# operand), and its constant operands (position, value), as a block tile holds them.
ChainOp = tuple[str, tuple[int, ...], tuple[tuple[int, float], ...]]


class UnsupportedProgram(ValueError):
    """A program the search cannot handle (message names the node and op)."""


@dataclass(frozen=True)
class Chain:
    """A maximal run of the program's elementwise ops, each but the last read only by the next
    (bias adds, scales, activations, residual adds). A block graph computes it as one step (one
    block op of the bound): its inner values are never tiles, so no kernel or loop boundary cuts
    it and no block graph rearranges it. Cutting a chain only writes and reads a value in between;
    as its own steps, a chain of n ops made every block graph of each of its n cut points, and
    a search over a 16-op chain outlasted any budget."""

    ops: tuple[ChainOp, ...]
    operands: tuple[AV, ...]  # the abstract values it reads, in order of first use
    inner: tuple[AE, ...]  # the values of all its ops but the last


@dataclass(frozen=True)
class Space:
    block_ops: tuple[Op, ...]  # ops a block graph may contain (ordered: the canonical rank)
    library_ops: tuple[Op, ...]  # ops a library kernel may run: the program's own ops
    constants: tuple[float, ...]
    keepdim_false: bool  # whether reductions that drop their dim appear in the program
    free_kernels: int | None  # kernels of a schedule that may be free views (None: any number)
    chains: tuple[Chain, ...] = ()  # the program's elementwise chains of two ops or more
    # the values of the program's other ops: an inner value of a chain equal to one of them is a
    # value of its own (a block graph may compute it alone)
    outer: tuple[AE, ...] = ()

    def rank(self, op: str) -> int:
        return self.block_ops.index(op) if op in self.block_ops else len(self.block_ops) + (op == "acc")

    def launches(self, kernels: int) -> int:
        """The fewest launches that many kernels pay: all but those that may be free views."""
        return 0 if self.free_kernels is None else max(0, kernels - self.free_kernels)


def space_of(program: Program) -> Space:
    seen: list[Op] = []
    written: set[Op] = set()
    consts: list[float] = []
    keepdim_false = False
    for n in program.topological():
        if n.op == "input":
            continue
        if n.op not in ops.OPS:
            raise UnsupportedProgram(f"node {n.id!r}: op {n.op!r} is not supported by the search")
        if n.op == Op.CONST:
            consts.append(float(n.attrs["value"]))
            continue
        written.add(n.op)
        if n.op in ops.REDUCE and not n.attrs["keepdim"]:
            keepdim_false = True
        for op in (n.op, *SPLITTABLE.get(n.op, ())):
            if op not in seen:
                seen.append(op)
        if n.op == Op.RMS_NORM:
            consts.append(float(n.attrs["eps"]))
    block = tuple(op for op in _ORDER if op in seen and op not in UNSUPPORTED)
    library = tuple(op for op in _ORDER if op in written)
    values = abstract_program(program)
    runs = chain_runs(program)
    chains = tuple(Chain(steps, tuple(values[o] for o in operands), tuple(values[n.id][0] for n in run[:-1]))
                   for run in runs for steps, operands in [chain_steps(program, run)])
    inner = {n.id for run in runs for n in run[:-1]}
    outer = tuple(values[n.id][0] for n in program.topological() if n.op != Op.CONST and n.id not in inner)
    return Space(block, library, tuple(dict.fromkeys(consts)), keepdim_false, _free_kernels(program), chains, outer)


def chain_runs(program: Program) -> list[list[Node]]:
    """The program's elementwise chains of two ops or more (`Chain`), as runs of its nodes. A node
    continues the run of the first of its operands that is elementwise, no output, and read by
    it alone."""
    readers: dict[str, set[str]] = {}
    for n in program.topological():
        for i in n.inputs:
            readers.setdefault(i, set()).add(n.id)
    nxt: dict[str, Node] = {}
    for n in program.topological():
        if n.op not in ops.ELEMENTWISE:
            continue
        for i in n.inputs:
            prev = program.nodes[i]
            if prev.op in ops.ELEMENTWISE and readers[i] == {n.id} and i not in program.outputs:
                nxt[i] = n
                break
    continued = {n.id for n in nxt.values()}
    runs = []
    for n in program.topological():
        if n.id in nxt and n.id not in continued:
            run = [n]
            while run[-1].id in nxt:
                run.append(nxt[run[-1].id])
            runs.append(run)
    return runs


def chain_steps(program: Program, run: Sequence[Node]) -> tuple[tuple[ChainOp, ...], tuple[str, ...]]:
    """A run's ops (`ChainOp`) and the program nodes they read from outside it, in order of first
    use (the run's operands). Constants are the ops' own, as a block tile holds them."""
    operands: list[str] = []
    steps: list[ChainOp] = []
    for k, n in enumerate(run):
        refs: list[int] = []
        consts: list[tuple[int, float]] = []
        for pos, i in enumerate(n.inputs):
            if k and i == run[k - 1].id:
                refs.append(-1)
            elif program.nodes[i].op == Op.CONST:
                consts.append((pos, float(program.nodes[i].attrs["value"])))
            else:
                if i not in operands:
                    operands.append(i)
                refs.append(operands.index(i))
        steps.append((n.op, tuple(refs), tuple(consts)))
    return tuple(steps), tuple(operands)


def _free_kernels(program: Program) -> int | None:
    """How many kernels of a schedule the prover can prove may be free views: one per reshape of
    the program (no prover rule moves a reshape, so such a schedule reshapes only the values the
    program reshapes, and it computes no value twice; the oracle's abstract values do not tell a
    reshape apart, so the search reshapes no other value: `KernelSearch._reshapes`), any
    number where the program transposes (the prover's transpose rules make transposed values of
    many others)."""
    written = [n.op for n in program.topological()]
    return None if Op.TRANSPOSE in written else sum(op == Op.RESHAPE for op in written)


# The canonical order of op types (the generator adds ops in increasing (operands, rank) order).
_ORDER = (
    Op.MATMUL, Op.MUL, Op.DIV, Op.ADD, Op.SUB, Op.NEG, Op.EXP, Op.SQRT, Op.RSQRT, Op.SQUARE, Op.SILU, Op.GELU,
    Op.RELU, Op.SIGMOID, Op.SUM, Op.MEAN, Op.MAX, Op.RMS_NORM, Op.SOFTMAX, Op.TRANSPOSE, Op.RESHAPE,
)
