"""Transposed and reshaped program inputs, searched as inputs of their own.

Both are views: a transpose is read in place with permuted strides (`SGraph.views`), a reshape of
a stored tensor is the same memory. So `Q @ transpose(K)` costs what `Q @ Kt` costs with `Kt`
given transposed, and the search should find the same kernels for both, as shallow (and a
reshaped input's dims should be the program's dims, which the search's dim classes cannot follow
through a reshape). It runs on the program with each such view of an input in its place as an
input (`InputViews.program`), and every candidate gets the views back (`InputViews.unfold`)
before it is ranked and verified against the program itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from superopt.program import Node, Program
from superopt.sgraph import LibraryKernel, SGraph, TensorDecl

VIEWS = ("transpose", "reshape")  # ops whose result, over a program input, is a view of it


@dataclass(frozen=True)
class InputViews:
    original: Program
    program: Program = field(init=False)  # what is searched: the folded views are inputs
    folded: tuple[Node, ...] = field(init=False)  # the views of inputs, in program order

    def __post_init__(self) -> None:
        p = self.original
        names = {n.id for n in p.inputs}
        folded = tuple(n for n in p.topological()
                       if n.op in VIEWS and n.inputs[0] in names and n.id not in p.outputs)
        object.__setattr__(self, "folded", folded)
        object.__setattr__(self, "program", _fold(p, folded) if folded else p)

    def unfold(self, sg: SGraph) -> SGraph:
        """A schedule of the searched program as one of the original: the folded views first, as
        library kernels (free), over the original inputs."""
        if not self.folded:
            return sg
        views = tuple(LibraryKernel(f"view{i}", n.op, n.inputs, dict(n.attrs), n.id)
                      for i, n in enumerate(self.folded))
        decls = tuple(TensorDecl(n.id, n.shape, n.dtype or "f32") for n in self.original.inputs)
        return SGraph(decls, (*views, *sg.kernels), sg.outputs, sg.name)


def _fold(p: Program, folded: tuple[Node, ...]) -> Program:
    gone = {n.id for n in folded}
    read = {i for n in p.topological() if n.id not in gone for i in n.inputs} | set(p.outputs)
    q = Program(p.name)
    for n in p.inputs:
        if n.id in read:
            q.input(n.id, n.shape, n.dtype or "f32")
    for n in folded:
        q.input(n.id, n.shape, p.nodes[n.inputs[0]].dtype or "f32")
    for n in p.topological():
        if n.op != "input" and n.id not in gone:
            q.nodes[n.id] = n
    q.outputs = list(p.outputs)
    return q.validate()
