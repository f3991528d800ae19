"""Shrink a program to small shapes with the same structure, so numeric checks stay cheap.

The symbolic proof covers every size; the finite-field and float layers run the interpreter,
whose cost grows with the shapes. Each dim class (superopt.dimclasses: dims equal by
construction) of size n becomes the largest divisor of n that is at most `cap`, so every split of
n that fits in the small size stays possible; it keeps n when that divisor is 1 (a prime n).
A reshape that splits a dim into several (heads out of a projection's columns) or merges several
into one (heads merged back) ties the one dim's size to the product of the others: those others
shrink (to at most `PART_CAP` each) and the one is their product, so an attention block over
(512, 2048) in 16 heads is checked at (32, 256) in 16 heads of 16. A program whose reshapes
regroup dims otherwise ((6, 4) into (4, 6)) or tie one dim to two different products is not
shrunk, nor is its sGraph; neither is an sGraph whose reshapes the program's do not tell.
"""

from __future__ import annotations

import math

from superopt.assignments import divisors
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.program import Program, ProgramError, Tensor
from superopt.sgraph import LibraryKernel, SGraph, SGraphError, input_decls, rebind

MAX_CHECKED_ELEMENTS = 2**26  # per tensor of a program evaluated by a check (float64: 512 MiB)
PART_CAP = 16  # a dim that a reshape multiplies with others shrinks to at most this


def shrink(program: Program, cap: int = 32) -> Program:
    """The same program over small shapes (or the program itself when nothing can shrink)."""
    dims = _small_dims(program, cap)
    if dims is None:
        return _checkable(program)
    shapes = {n.id: tuple(dims[(n.id, d)] for d in range(len(n.shape))) for n in program.topological()}
    if all(shapes[n.id] == n.shape for n in program.inputs):
        return _checkable(program)
    out = Program(program.name)
    for n in program.topological():
        if n.op == "input":
            out.input(n.id, shapes[n.id], n.dtype or "f32")
        else:
            attrs = {**n.attrs, "shape": list(shapes[n.id])} if n.op == "reshape" else dict(n.attrs)
            out.op(n.op, *(Tensor(out, i) for i in n.inputs), name=n.id, **attrs)
    out.outputs = list(program.outputs)
    return _checkable(out.validate())


def shrink_sgraph(sg: SGraph, program: Program, small: Program) -> SGraph | None:
    """The sGraph's structure over the shrunk program's inputs, its reshapes resized as the
    program's are (a reshape is matched by its sizes: None when two of the program's reshapes
    with those sizes shrink differently, or none has them, or the sizes of what it reshapes are
    not constant: a wrong map; or when the sGraph needs two dims of different classes equal, as
    they are only at the real shapes)."""
    resized: dict[tuple[tuple[int, ...], tuple[int, ...]], set[tuple[int, ...]]] = {}
    for n in program.topological():
        if n.op == "reshape":
            before = (program.nodes[n.inputs[0]].shape, n.shape)
            resized.setdefault(before, set()).add(small.nodes[n.id].shape)
    kernels = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel) and k.op == "reshape":
            shape = sg.info.shapes[k.inputs[0]]
            new = resized.get((tuple(d.int_value() for d in shape), tuple(k.attrs["shape"])), set()) \
                if all(d.is_const() for d in shape) else set()
            if len(new) != 1:
                return None
            k = LibraryKernel(k.id, k.op, k.inputs, {**k.attrs, "shape": list(next(iter(new)))}, k.output)
        kernels.append(k)
    shrunk = rebind(SGraph(sg.inputs, tuple(kernels), sg.outputs, sg.name), input_decls(small))
    try:
        shrunk.info  # noqa: B018 (analysis: sizes that only agree at the real shapes fail here)
    except SGraphError:
        return None
    return shrunk


def _small_dims(program: Program, cap: int) -> dict[tuple[str, int], int] | None:
    """(node id, dim) -> its small size; None when the program's reshapes tie sizes in a way this
    cannot keep (`_reshape_ties`, or one dim made two ways that shrink to different products)."""
    classes = dim_classes(program)
    ties = _reshape_ties(program, classes)
    if ties is None:
        return None
    same, products = ties
    full = {_root(same, c): program.nodes[nid].shape[d] for (nid, d), c in classes.items() if c != NO_CLASS}
    made: dict[int, set[tuple[int, ...]]] = {}
    for whole, parts in products:
        made.setdefault(_root(same, whole), set()).add(tuple(sorted(_root(same, p) for p in parts)))
    in_parts = {p for ways in made.values() for parts in ways for p in parts}
    sizes: dict[int, int | None] = {}

    def size(r: int, seen: frozenset[int]) -> int | None:
        if r not in sizes:
            if r in seen:
                return None  # a dim made of itself
            if r in made:
                products: set[int | None] = set()
                for parts in made[r]:
                    known = [s for p in parts if (s := size(p, seen | {r})) is not None]
                    products.add(math.prod(known) if len(known) == len(parts) else None)
                sizes[r] = products.pop() if len(products) == 1 else None
            else:
                small = max(x for x in divisors(full[r]) if x <= (PART_CAP if r in in_parts else cap))
                sizes[r] = small if small > 1 else full[r]
        return sizes[r]

    out: dict[tuple[str, int], int] = {}
    for key, c in classes.items():
        s = 1 if c == NO_CLASS else size(_root(same, c), frozenset())
        if s is None:
            return None
        out[key] = s
    return out


def _reshape_ties(program: Program, classes: dict[tuple[str, int], int],
                  ) -> tuple[dict[int, int], list[tuple[int, tuple[int, ...]]]] | None:
    """The sizes a program's reshapes tie together: classes of equal size (a union-find parent
    map) and (whole, parts) products; None for a reshape that regroups several dims into
    several."""
    same: dict[int, int] = {}
    products: list[tuple[int, tuple[int, ...]]] = []
    for n in program.topological():
        if n.op != "reshape":
            continue
        src = program.nodes[n.inputs[0]]
        for before, after in _groups(src.shape, n.shape):
            a = [classes[(src.id, d)] for d in before if src.shape[d] != 1]
            b = [classes[(n.id, d)] for d in after if n.shape[d] != 1]
            if len(a) > 1 and len(b) > 1:
                return None
            if len(a) == 1 and len(b) == 1:
                same[_root(same, a[0])] = _root(same, b[0])
            elif a and b:
                whole, parts = (a[0], b) if len(a) == 1 else (b[0], a)
                products.append((whole, tuple(parts)))
    return same, products


def _groups(before: tuple[int, ...], after: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """The dims of a reshape's input and output in runs of equal element counts."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(before) and j < len(after):
        a, b, pa, pb = [i], [j], before[i], after[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                a.append(i)
                pa *= before[i]
                i += 1
            else:
                b.append(j)
                pb *= after[j]
                j += 1
        groups.append((a, b))
    return groups


def _root(parent: dict[int, int], c: int) -> int:
    while parent.get(c, c) != c:
        c = parent[c]
    return c


def _checkable(small: Program) -> Program:
    """`small`, unless evaluating it (in float64, as the checks do) would take too much memory: a
    dim with no divisor up to the cap (a large prime) keeps its full size."""
    big = max(small.nodes.values(), key=lambda n: math.prod(n.shape))
    if math.prod(big.shape) > MAX_CHECKED_ELEMENTS:
        raise ProgramError(f"node {big.id!r} ({big.op}): checking the program needs it at shape {list(big.shape)} "
                           f"(a dim with no small divisor, or a reshape, keeps its size), over the "
                           f"{MAX_CHECKED_ELEMENTS:,} elements a check evaluates")
    return small
