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

A transpose of a computed value is first moved to the program's edges (`_pushed`): sunk to the
outputs where every value computed from it allows (elementwise ops, normalizations, reductions
that keep their dim, the dim renumbered; a second transpose composes with it, and where the two
cancel nothing is left), so the schedule computes in the stored layout and returns views; else
pushed up to views of inputs, through matmuls too ((A B)^T = B^T A^T) but only across values
nothing else reads (both would be computed); a value that is only returned besides is returned
as a view of what the transpose became (a projected K written to a KV cache and read transposed
by attention). `exp(Q @ transpose(X @ W))` is searched as
`exp(Q @ (W^T @ X^T))` over views of X and W. The searched program then has no free kernel
inside a schedule, which would cost a level of depth and turn off the launch bounds
(`Space.launches`), so that attention over a projected K would search many times the states for
the same winner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from superopt import ops
from superopt.ops import Op
from superopt.program import Node, Program, ProgramError, Tensor
from superopt.sgraph import LibraryKernel, SGraph, TensorDecl, input_decls, renamed

VIEWS = ops.LAYOUT  # ops whose result, over a stored tensor, is a view of it


@dataclass(frozen=True)
class ProgramViews:
    original: Program
    program: Program = field(init=False)  # what is searched: the folded views left out
    inputs: tuple[Node, ...] = field(init=False)  # views of inputs, which the searched program takes as inputs
    outputs: tuple[tuple[int, Node], ...] = field(init=False)  # (output position, view of a computed value)

    def __post_init__(self) -> None:
        p = _pushed(self.original)
        names = {n.id for n in p.inputs}
        read = {i for n in p.topological() for i in n.inputs}
        # (a 0-d view stays: no program input has rank 0, a 0-d parameter imported from PyTorch)
        inputs = tuple(n for n in p.topological() if n.op in VIEWS and n.inputs[0] in names and n.id not in p.outputs
                       and n.shape)
        stored = names | {n.id for n in inputs} | {n.id for n in p.topological() if n.op == Op.CONST}
        transposed = {n.id for n in p.topological() if n.op == Op.TRANSPOSE}  # a reshape of one is a copy
        outputs = tuple((i, n) for i, o in enumerate(p.outputs) if (n := p.nodes[o]).op in VIEWS and o not in read
                        and n.inputs[0] not in stored | set(p.outputs)
                        and not (n.op == Op.RESHAPE and n.inputs[0] in transposed))
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
        return SGraph(input_decls(self.original), (*first, *sg.kernels, *last), tuple(outputs), sg.name)

    def input_kernels(self, read: set[str]) -> tuple[list[TensorDecl], list[LibraryKernel]]:
        """The views of inputs among `read` (tensors of the searched program) as library kernels,
        and the original inputs they read: what a part of a searched schedule reads, in the
        layout it is stored in (the search estimates its kernels on that)."""
        views = [(i, n) for i, n in enumerate(self.inputs) if n.id in read]
        stored = {v.inputs[0] for _, v in views}
        decls = [d for d in input_decls(self.original) if d.id in stored]
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


def _pushed(p: Program) -> Program:
    """`p` with each transpose of a computed value moved to the program's edges where it can be
    (`_moved`). A value returned and read only by a transpose (a projected K, written to a KV cache
    and read transposed by attention) is first written as the transpose of that transpose
    (`_returned_through`): the transpose can then move up to views of the inputs, and the value is
    returned as a view of what it became; taken when that leaves fewer transposes inside."""
    moved = _moved(p)
    turned = _returned_through(p)
    if turned is not p and _inner_transposes(alt := _moved(turned)) < _inner_transposes(moved):
        return alt
    return moved


def _returned_through(p: Program) -> Program:
    """`p` with each computed value V that is returned and read only by one transpose T returned
    as `transpose(T)` by the inverse permutation (V itself renamed), or `p` when there is none."""
    readers = Counter(i for n in p.topological() for i in n.inputs) + Counter(p.outputs)
    turn = {n.id: n.inputs[0] for n in p.topological() if n.op == Op.TRANSPOSE and n.inputs[0] in p.outputs
            and readers[n.inputs[0]] == 2 and p.nodes[n.inputs[0]].op not in ("input", Op.CONST)}
    if not turn:
        return p
    taken = set(p.nodes)
    renamed: dict[str, str] = {}
    for v in turn.values():
        renamed[v] = _fresh(v, taken)
        taken.add(renamed[v])
    q = Program(p.name)
    try:
        for n in p.topological():
            nid = renamed.get(n.id, n.id)
            q.nodes[nid] = Node(nid, n.op, tuple(renamed.get(i, i) for i in n.inputs), n.attrs, n.shape, n.dtype)
            if n.id in turn:
                perm = list(n.attrs["perm"])
                q.op(Op.TRANSPOSE, Tensor(q, nid), perm=[perm.index(d) for d in range(len(perm))], name=turn[n.id])
        q.outputs = list(p.outputs)
        return q.validate()
    except ProgramError:  # more nodes than a program may have
        return p


def _inner_transposes(p: Program) -> int:
    """Transposes of computed values that some node reads: free kernels inside every schedule."""
    read = {i for n in p.topological() for i in n.inputs}
    return sum(n.op == Op.TRANSPOSE and n.id in read and p.nodes[n.inputs[0]].op not in ("input", Op.CONST)
               for n in p.topological())


def _moved(p: Program) -> Program:
    """`p` with each transpose of a computed value moved to the program's edges where it can be
    (`_Pusher`), or `p` itself when none can: sunk to the outputs its values lead to (the
    schedule computes in the stored layout and returns views), else pushed up to the inputs."""
    q = Program(p.name)
    pusher = _Pusher(p, q)
    ids: dict[str, str] = {}  # node of p -> the node of q that stands for it
    sunk: dict[str, tuple[int, ...]] = {}  # node of p -> perm: it is the transpose of `ids[node]` by perm
    for n in p.topological():
        pending = [sunk[i] for i in n.inputs if i in sunk]
        computed = n.op == Op.TRANSPOSE and p.nodes[n.inputs[0]].op not in ("input", Op.CONST)
        perm = tuple(n.attrs["perm"]) if n.op == Op.TRANSPOSE else ()
        if pending or (computed and pusher.sinks(n.id)):
            if n.op == Op.TRANSPOSE:  # of a sunk value: the two compose (and may cancel)
                ids[n.id], perm = ids[n.inputs[0]], tuple(pending[0][d] for d in perm) if pending else perm
            else:
                ids[n.id], perm = pusher.untransposed(ids, sunk, n, pending[0]), pending[0]
            if perm != tuple(range(len(perm))):
                sunk[n.id] = perm
                if n.id in p.outputs:  # returned as a view, named as the program names it
                    q.op(Op.TRANSPOSE, Tensor(q, ids[n.id]), perm=perm, name=n.id)
            continue
        pushed = pusher.transposed(ids, n.inputs[0], perm) if computed else None
        if pushed is None:
            q.nodes[n.id] = Node(n.id, n.op, tuple(ids[i] for i in n.inputs), n.attrs, n.shape, n.dtype)
        ids[n.id] = pushed or n.id
    q.outputs = [o if o in sunk else ids[o] for o in p.outputs]
    if len(set(q.outputs)) < len(q.outputs):
        return p  # transposes that cancel return a value returned already: a program returns it once
    live = q._live()
    q.nodes = {k: n for k, n in q.nodes.items() if k in live}  # what the moved transposes left unread
    if list(q.nodes.values()) == list(p.nodes.values()) and q.outputs == p.outputs:
        return p
    try:
        return q.validate()
    except ProgramError:  # more nodes than a program may have (views of inputs, of outputs added)
        return p


@dataclass
class _Pusher:
    """Moves transposes of values of `p` to the edges of `q`: `transposed` pushes one up to views
    of inputs, `sinks` and `untransposed` sink one to an output. Neither where a value on the way
    is read by anything else (both it and its transpose would be computed) or its op does not
    commute with the transpose (a reshape, a reduction that drops its dim, a matmul whose
    transpose moves a batch dim into its last two, operands of another rank)."""

    p: Program
    q: Program
    readers: Counter[str] = field(init=False)
    views: dict[tuple[str, tuple[int, ...]], str] = field(default_factory=dict)  # (input, perm) -> its view

    def __post_init__(self) -> None:
        self.readers = Counter(i for n in self.p.topological() for i in n.inputs) + Counter(self.p.outputs)

    def sinks(self, nid: str) -> bool:
        """May transpose `nid` sink to the outputs? Every value computed from it stands
        transposed by one permutation (a transpose on the way composes with it; where they cancel,
        what follows is computed as it is) and is computed by elementwise ops, normalizations or
        reductions that keep their dim, no reshape or matmul. An elementwise op's other operands
        must be scalars, or inputs where the op makes an output nothing else reads: the prover
        moves a transpose across an op with an operand it does not transpose only right under
        the transpose (the output's view), as `transpose(A * Y^T) = transpose(A) * Y`."""
        perms = {nid: tuple(self.p.nodes[nid].attrs["perm"])}
        for n in self.p.topological():
            mine = {perms[i] for i in n.inputs if i in perms}
            if n.id == nid or not mine:
                continue
            if len(mine) > 1:
                return False
            (perm,) = mine
            if n.op == Op.TRANSPOSE:
                if (composed := tuple(perm[d] for d in n.attrs["perm"])) != tuple(range(len(perm))):
                    perms[n.id] = composed
                continue
            if not self._sinks_through(n, [self.p.nodes[i] for i in n.inputs if i not in perms]):
                return False
            perms[n.id] = perm
        return True

    def _sinks_through(self, n: Node, others: list[Node]) -> bool:
        if "dim" in n.attrs:  # a normalization, or a reduction that keeps its dim
            return bool(n.attrs.get("keepdim", True))
        last = n.id in self.p.outputs and self.readers[n.id] == 1
        return n.op in ops.ELEMENTWISE and all(
            not o.shape or (last and o.op == "input" and len(o.shape) == len(n.shape)) for o in others)

    def untransposed(self, ids: dict[str, str], sunk: dict[str, tuple[int, ...]], n: Node,
                     perm: tuple[int, ...]) -> str:
        """Node `n` of a sunk transpose's way (`sinks`) computed in the layout before the transpose:
        its other operands viewed by the inverse permutation, its dim the one it was before."""
        inverse = tuple(perm.index(d) for d in range(len(perm)))
        operands = [ids[i] if i in sunk or not self.p.nodes[i].shape else self._view(ids, i, inverse)
                    for i in n.inputs]
        attrs = dict(n.attrs)
        if "dim" in attrs:
            attrs["dim"] = perm[ops.normalize_dim(attrs["dim"], len(perm))]
        return self._add(n.op, operands, attrs, n.id)

    def transposed(self, ids: dict[str, str], nid: str, perm: tuple[int, ...]) -> str | None:
        n = self.p.nodes[nid]
        if perm == tuple(range(len(perm))):
            return ids[nid]
        if n.op == "input":
            return self._view(ids, nid, perm)
        if n.op == Op.CONST or self.readers[nid] != 1:
            return None
        if n.op == Op.TRANSPOSE:
            return self.transposed(ids, n.inputs[0], tuple(n.attrs["perm"][d] for d in perm))
        rank, attrs = len(n.shape), dict(n.attrs)
        operands: Sequence[str | None]
        if n.op in ops.ELEMENTWISE:  # a scalar operand stays, one of another rank would not line up
            operands = [ids[i] if not self.p.nodes[i].shape else
                        self.transposed(ids, i, perm) if len(self.p.nodes[i].shape) == rank else None
                        for i in n.inputs]
        elif n.op == Op.MATMUL:
            a, b = n.inputs
            if {perm[-2], perm[-1]} != {rank - 2, rank - 1} or \
                    any(len(self.p.nodes[i].shape) != rank for i in n.inputs):
                return None
            swapped = perm[-1] != rank - 1  # (A B)^T = B^T A^T
            operands = [self.transposed(ids, i, perm) for i in ((b, a) if swapped else (a, b))]
        elif "dim" in attrs and attrs.get("keepdim", True):  # a reduction or a normalization
            attrs["dim"] = perm.index(ops.normalize_dim(attrs["dim"], rank))
            operands = [self.transposed(ids, n.inputs[0], perm)]
        else:
            return None
        if any(o is None for o in operands):
            return None
        return self._add(n.op, [o for o in operands if o is not None], attrs, nid)

    def _view(self, ids: dict[str, str], nid: str, perm: tuple[int, ...]) -> str:
        """Input `nid` transposed by `perm`: one view per input and permutation."""
        if (nid, perm) not in self.views:
            self.views[nid, perm] = self._add(Op.TRANSPOSE, [ids[nid]], {"perm": perm}, nid)
        return self.views[nid, perm]

    def _add(self, op: str, operands: list[str], attrs: dict[str, object], of: str) -> str:
        """A node of `q` standing for the transpose of node `of` of `p`, named after it."""
        taken = set(self.p.nodes) | set(self.q.nodes)
        name = f"{of}_t" if f"{of}_t" not in taken else _fresh(f"{of}_t", taken)
        return self.q.op(op, *(Tensor(self.q, o) for o in operands), **attrs, name=name).id
