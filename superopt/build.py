"""Builders for sGraphs: hand-written reference schedules, the unfused baseline, search results.

    b = SGraphBuilder.for_program(program)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", imap=[None], fmap=1)
    ...
    k.output(o, "O", omap=[1])
    sg = b.build(["O"])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from superopt.program import Program
from superopt.sgraph import (
    AccKind,
    Accumulator,
    Axis,
    BlockGraph,
    BlockInput,
    BlockOp,
    BlockOutput,
    GraphKernel,
    Kernel,
    LibraryKernel,
    SGraph,
    TensorDecl,
    input_decls,
)
from superopt.sizes import Size

SizeLike = Size | int | str


class BlockBuilder:
    def __init__(self, kid: str, grid: Sequence[tuple[str, SizeLike]], loop: tuple[str, SizeLike]) -> None:
        self.kid = kid
        self.grid = tuple(Axis(n, Size.of(s)) for n, s in grid)
        self.loop = Axis(loop[0], Size.of(loop[1]))
        self.inputs: list[BlockInput] = []
        self.body: list[BlockOp] = []
        self.accs: list[Accumulator] = []
        self.post: list[BlockOp] = []
        self.outputs: list[BlockOutput] = []
        self._n = 0

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def input(self, tensor: str, imap: Sequence[int | None], fmap: int | None, name: str | None = None) -> str:
        bid = name or f"{tensor}_t"
        self.inputs.append(BlockInput(bid, tensor, tuple(imap), fmap))
        return bid

    def op(self, op: str, *args: str, name: str | None = None, **attrs: Any) -> str:
        """A loop-body op."""
        bid = name or self._id("b")
        self.body.append(BlockOp(bid, op, tuple(args), attrs))
        return bid

    def acc(self, source: str, kind: str = AccKind.SUM, dim: int | None = None, name: str | None = None) -> str:
        bid = name or self._id("acc")
        self.accs.append(Accumulator(bid, source, kind, dim))
        return bid

    def after(self, op: str, *args: str, name: str | None = None, **attrs: Any) -> str:
        """A post-loop op."""
        bid = name or self._id("p")
        self.post.append(BlockOp(bid, op, tuple(args), attrs))
        return bid

    def output(self, source: str, tensor: str, omap: Sequence[int]) -> str:
        self.outputs.append(BlockOutput(source, tensor, tuple(omap)))
        return tensor

    def kernel(self) -> GraphKernel:
        block = BlockGraph(
            self.grid, self.loop, tuple(self.inputs), tuple(self.body), tuple(self.accs), tuple(self.post),
            tuple(self.outputs),
        )
        return GraphKernel(self.kid, block)


class SGraphBuilder:
    def __init__(self, inputs: Sequence[TensorDecl], name: str) -> None:
        self.inputs = tuple(inputs)
        self.name = name
        self.kernels: list[Kernel | BlockBuilder] = []
        self._n = 0

    @staticmethod
    def for_program(program: Program, name: str | None = None) -> SGraphBuilder:
        return SGraphBuilder(input_decls(program), name or program.name)

    def _kid(self) -> str:
        self._n += 1
        return f"k{self._n - 1}"

    def library(self, op: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        kid = self._kid()
        tensor = out or f"t{kid[1:]}"
        self.kernels.append(LibraryKernel(kid, op, tuple(inputs), attrs, tensor))
        return tensor

    def graph(self, grid: Sequence[tuple[str, SizeLike]], loop: tuple[str, SizeLike] = ("f", 1)) -> BlockBuilder:
        bb = BlockBuilder(self._kid(), grid, loop)
        self.kernels.append(bb)
        return bb

    def build(self, outputs: Sequence[str]) -> SGraph:
        kernels = tuple(k.kernel() if isinstance(k, BlockBuilder) else k for k in self.kernels)
        sg = SGraph(self.inputs, kernels, tuple(outputs), self.name)
        sg.info  # noqa: B018 - validate now, so a bad builder call fails where it was made
        return sg


def unfused_baseline(program: Program) -> SGraph:
    """Every program op as its own library kernel: the schedule a framework runs, always a candidate."""
    b = SGraphBuilder.for_program(program, f"{program.name}.unfused")
    names: dict[str, str] = {}
    for n in program.topological():
        if n.op == "input":
            names[n.id] = n.id
            continue
        names[n.id] = b.library(n.op, *(names[i] for i in n.inputs), out=n.id, **dict(n.attrs))
    return b.build([names[o] for o in program.outputs])
