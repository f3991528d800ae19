"""Views at a program's edges (transposes and reshapes of its inputs and of its outputs), left
out of the program the search sees.

Both ops are views: a transpose is read in place with permuted strides (`SGraph.views`), a reshape
of a stored tensor is the same memory. So `Q @ transpose(K)` costs what `Q @ Kt` costs with `Kt`
given transposed, and the search should find the same kernels for both, as shallow (and a
reshaped input's dims should be the program's dims, which the search's dim classes cannot follow
through a reshape); likewise an output returned transposed costs what the value itself costs. The
search runs on the program with each view of an input in its place as an input, and each output
that is a view of a computed value replaced by that value (`ProgramViews.program`); every
candidate gets the views back (`ProgramViews.unfold`) before it is ranked and verified against
the program itself. A view kernel launches nothing, so leaving it out costs the search no schedule
worth having, and its kernel count (and launch bounds) no level. (A reshape of a transposed view
is a copy: a reshape returned of a transpose stays in the searched program, and one returned of
a value the schedule leaves transposed is charged when the candidate is ranked.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from superopt.program import Node, Program
from superopt.sgraph import LibraryKernel, SGraph, TensorDecl, renamed

VIEWS = ("transpose", "reshape")  # ops whose result, over a stored tensor, is a view of it


@dataclass(frozen=True)
class ProgramViews:
    original: Program
    program: Program = field(init=False)  # what is searched: the folded views left out
    inputs: tuple[Node, ...] = field(init=False)  # views of inputs, which the searched program takes as inputs
    outputs: tuple[tuple[int, Node], ...] = field(init=False)  # (output position, view of a computed value)

    def __post_init__(self) -> None:
        p = self.original
        names = {n.id for n in p.inputs}
        read = {i for n in p.topological() for i in n.inputs}
        inputs = tuple(n for n in p.topological() if n.op in VIEWS and n.inputs[0] in names and n.id not in p.outputs)
        stored = names | {n.id for n in inputs} | {n.id for n in p.topological() if n.op == "const"}
        transposed = {n.id for n in p.topological() if n.op == "transpose"}  # a reshape of one is a copy
        outputs = tuple((i, n) for i, o in enumerate(p.outputs) if (n := p.nodes[o]).op in VIEWS and o not in read
                        and n.inputs[0] not in stored | set(p.outputs)
                        and not (n.op == "reshape" and n.inputs[0] in transposed))
        if len({n.inputs[0] for _, n in outputs}) < len(outputs):
            outputs = ()  # two views of one value returned: the searched program would return it twice
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "outputs", outputs)
        object.__setattr__(self, "program", _fold(p, inputs, outputs) if inputs or outputs else p)

    def unfold(self, sg: SGraph) -> SGraph:
        """A schedule of the searched program as one of the original: views of inputs first, views
        of outputs last, as library kernels, over the original inputs. A tensor of the schedule
        named like an input the searched program does not take (one read only through views) is
        renamed."""
        if not (self.inputs or self.outputs):
            return sg
        originals = {n.id for n in self.original.inputs}
        defined = originals | {n.id for n in self.inputs} | {o for k in sg.kernels for o in k.outputs}
        clashes: dict[str, str] = {}
        for o in (o for k in sg.kernels for o in k.outputs if o in originals):
            clashes[o] = _fresh(o, defined)
            defined.add(clashes[o])
        sg = renamed(sg, clashes) if clashes else sg
        _, first = self.input_kernels({n.id for n in self.inputs})
        outputs = list(sg.outputs)
        last = []
        for i, n in self.outputs:
            name = n.id if n.id not in defined else _fresh(n.id, defined)
            defined.add(name)
            last.append(LibraryKernel(f"view_out{i}", n.op, (outputs[i],), dict(n.attrs), name))
            outputs[i] = name
        decls = [TensorDecl(n.id, n.shape, n.dtype or "f32") for n in self.original.inputs]
        return SGraph(tuple(decls), (*first, *sg.kernels, *last), tuple(outputs), sg.name)

    def input_kernels(self, read: set[str]) -> tuple[list[TensorDecl], list[LibraryKernel]]:
        """The views of inputs among `read` (tensors of the searched program) as library kernels,
        and the original inputs they read: what a part of a searched schedule reads, in the
        layout it is stored in (the search estimates its kernels on that)."""
        views = [(i, n) for i, n in enumerate(self.inputs) if n.id in read]
        stored = {v.inputs[0] for _, v in views}
        decls = [TensorDecl(n.id, n.shape, n.dtype or "f32") for n in self.original.inputs if n.id in stored]
        return decls, [LibraryKernel(f"view{i}", n.op, n.inputs, dict(n.attrs), n.id) for i, n in views]


def _fresh(name: str, taken: set[str]) -> str:
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def _fold(p: Program, inputs: tuple[Node, ...], outputs: tuple[tuple[int, Node], ...]) -> Program:
    gone = {n.id for n in inputs} | {n.id for _, n in outputs}
    returned = list(p.outputs)
    for i, n in outputs:
        returned[i] = n.inputs[0]
    read = {i for n in p.topological() if n.id not in gone for i in n.inputs} | set(returned)
    q = Program(p.name)
    for n in p.inputs:
        if n.id in read:
            q.input(n.id, n.shape, n.dtype or "f32")
    for n in inputs:
        q.input(n.id, n.shape, p.nodes[n.inputs[0]].dtype or "f32")
    for n in p.topological():
        if n.op != "input" and n.id not in gone:
            q.nodes[n.id] = n
    q.outputs = returned
    return q.validate()
