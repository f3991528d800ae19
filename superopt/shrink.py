"""Shrink a program to small shapes with the same structure, so numeric checks stay cheap.

The symbolic proof covers every size; the finite-field and float layers run the interpreter,
whose cost grows with the shapes. Each dim class (superopt.dimclasses: dims equal by
construction) of size n becomes a divisor of n, so every split of the small size is one of n:
the largest that is at most `cap` where the classes stay apart. Two classes of different sizes
never shrink to one size (X (4, 64) and Y (4, 32) both at width 32 would check exactly the case
where a schedule that takes one width for the other is right), and classes of one size get
different sizes where their divisors allow (`_assign`). A prime n keeps its size. A dim that
a concrete schedule splits by constant sizes stays their multiple (`constant_splits`).
A reshape that splits a dim into several (heads out of a projection's columns) or merges several
into one (heads merged back) ties the one dim's size to the product of the others: those others
shrink (to at most `PART_CAP` each) and the one is their product, so an attention block over
(512, 2048) in 16 heads of 128 is checked at (64, 32) in 8 heads of 16. A program whose reshapes
regroup dims otherwise ((6, 4) into (4, 6)) or tie one dim to two different products is not
shrunk, nor is its sGraph; neither is an sGraph whose reshapes the program's do not tell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from superopt.assignments import divisors
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.ops import Op
from superopt.program import Program, ProgramError, Tensor
from superopt.sgraph import LibraryKernel, SGraph, SGraphError, input_decls, rebind

MAX_CHECKED_ELEMENTS = 2**26  # per tensor of a program evaluated by a check (float64: 512 MiB)
PART_CAP = 16  # a dim that a reshape multiplies with others shrinks to at most this


def shrink(program: Program, cap: int = 32, multiples: Mapping[tuple[str, int], int] | None = None) -> Program:
    """The same program over small shapes (or the program itself when nothing can shrink).
    `multiples`: (input, dim) -> what its small size must be a multiple of (`constant_splits`)."""
    dims = _small_dims(program, cap, multiples or {})
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
            attrs = {**n.attrs, "shape": list(shapes[n.id])} if n.op == Op.RESHAPE else dict(n.attrs)
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
        if n.op == Op.RESHAPE:
            before = (program.nodes[n.inputs[0]].shape, n.shape)
            resized.setdefault(before, set()).add(small.nodes[n.id].shape)
    kernels = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel) and k.op == Op.RESHAPE:
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


def constant_splits(sg: SGraph) -> dict[tuple[str, int], int]:
    """(input, dim) -> the constant grid sizes and loop range a kernel splits that dim of one of
    the sGraph's inputs by (a concrete schedule's): its small size must stay their multiple."""
    inputs = {t.id for t in sg.inputs}
    out: dict[tuple[str, int], int] = {}
    for k in sg.graph_kernels:
        b = k.block
        for i in (i for i in b.inputs if i.tensor in inputs):
            factors = [(a.size, m) for a, m in zip(b.grid, i.imap, strict=True)] + [(b.loop.size, i.fmap)]
            for size, d in factors:
                if d is not None and size.is_const():
                    key = (i.tensor, d)
                    out[key] = math.lcm(out.get(key, 1), size.int_value())
    return out


def _small_dims(program: Program, cap: int, multiples: Mapping[tuple[str, int], int],
                ) -> dict[tuple[str, int], int] | None:
    """(node id, dim) -> its small size; None when the program's reshapes tie sizes in a way this
    cannot keep (`_reshape_ties`, or one dim made two ways that shrink to different products, or
    classes of different sizes that no choice here keeps apart)."""
    classes = dim_classes(program)
    ties = _reshape_ties(program, classes)
    if ties is None:
        return None
    same, products = ties
    full = {_root(same, c): program.nodes[nid].shape[d] for (nid, d), c in classes.items() if c != NO_CLASS}
    made: dict[int, set[tuple[int, ...]]] = {}
    for whole, parts in products:
        made.setdefault(_root(same, whole), set()).add(tuple(sorted(_root(same, p) for p in parts)))
    in_parts = {p for ways in made.values() for way in ways for p in way} - made.keys()
    limits = {r: PART_CAP if r in in_parts else cap for r in full.keys() - made.keys()}
    need = _needs(multiples, {key: _root(same, c) for key, c in classes.items() if c != NO_CLASS}, full)
    for strict, ascending in _PASSES:
        sizes = _assign(_Classes(full, made, limits, in_parts, need), strict, ascending)
        if sizes is not None:
            return {key: 1 if c == NO_CLASS else sizes[_root(same, c)] for key, c in classes.items()}
    return None


def _needs(multiples: Mapping[tuple[str, int], int], roots: dict[tuple[str, int], int],
           full: dict[int, int]) -> dict[int, int]:
    """Per class, what its small size must be a multiple of: the lcm of its dims' `multiples`,
    where that divides the real size (a split that does not is the sGraph's error, found later)."""
    need: dict[int, int] = {}
    for key, m in multiples.items():
        if key in roots:
            need[roots[key]] = math.lcm(need.get(roots[key], 1), m)
    return {r: m for r, m in need.items() if full[r] % m == 0}


# (every class distinct, classes in ascending order of size): the first pass that finds sizes wins;
# the last always does when no reshape makes a class of others.
_PASSES = ((True, False), (False, False), (False, True))


@dataclass(frozen=True)
class _Classes:
    """The classes to size (by their union-find roots): real sizes, the ways reshapes make some of
    them of others (parts), the cap of each other one, which of those are reshape parts, and
    what some must be a multiple of (the constant splits of a concrete schedule)."""

    full: dict[int, int]
    made: dict[int, set[tuple[int, ...]]]
    limits: dict[int, int]
    parts: set[int]
    need: dict[int, int]


def _assign(c: _Classes, strict: bool, ascending: bool) -> dict[int, int] | None:
    """Per class, a small size that divides its real one, apart from every other class's (`strict`)
    or from those of a different real size: a size-dependent error (a sum of a constant over one
    dim taken for another's) vanishes where two sizes are equal. Reshape parts first, so the
    classes they make are known before the others choose; larger classes choose first, unless
    `ascending`. None when some class finds no size."""
    sizes: dict[int, int] = {}

    def place(roots: set[int]) -> bool:
        for r in sorted(roots, key=lambda r: (c.full[r], r), reverse=not ascending):
            fits = (s for s in _candidates(c.full[r], c.limits[r], strict)
                    if s % c.need.get(r, 1) == 0 and not _clashes(r, s, sizes, c.full, strict))
            s = next(fits, None)
            if s is None:
                return False
            sizes[r] = s
        return True

    if not place(c.parts):
        return None
    wholes = _products(c.made, sizes)
    if wholes is None or any(_clashes(r, s, sizes, c.full, strict) for r, s in wholes.items()):
        return None
    sizes.update(wholes)
    return sizes if place(c.limits.keys() - sizes.keys()) else None


def _clashes(r: int, s: int, sizes: dict[int, int], full: dict[int, int], strict: bool) -> bool:
    return any(t == s and q != r and (strict or full[q] != full[r]) for q, t in sizes.items())


def _candidates(n: int, limit: int, strict: bool) -> list[int]:
    """Small sizes for a class of real size n, most preferred first: divisors of n (every split
    of the small size is one of n), the largest up to `limit` and the ones down to half of it
    (never below 8 when it is larger: splits by 4 of both a grid axis and the loop stay
    possible); then, unless `strict`, larger divisors, then smaller ones."""
    divs = [d for d in divisors(n) if d > 1]
    best = max((d for d in divs if d <= limit), default=n)
    floor = max(best // 2, min(best, 8))
    near = [d for d in reversed(divs) if floor <= d <= best]
    if strict:
        return near
    return near + [d for d in divs if d > best] + [d for d in reversed(divs) if d < floor]


def _products(made: dict[int, set[tuple[int, ...]]], sizes: dict[int, int]) -> dict[int, int] | None:
    """The size of each class a reshape makes of others: the product of its parts' sizes, the same
    every way it is made; None for a class made of itself or made two ways that disagree."""
    known: dict[int, int | None] = dict(sizes)

    def size(r: int, seen: frozenset[int]) -> int | None:
        if r not in known:
            if r in seen:
                return None
            ways: set[int | None] = set()
            for parts in made[r]:
                each = [s for p in parts if (s := size(p, seen | {r})) is not None]
                ways.add(math.prod(each) if len(each) == len(parts) else None)
            known[r] = ways.pop() if len(ways) == 1 else None
        return known[r]

    out = {r: size(r, frozenset()) for r in made}
    return None if None in out.values() else {r: s for r, s in out.items() if s is not None}


def _reshape_ties(program: Program, classes: dict[tuple[str, int], int],
                  ) -> tuple[dict[int, int], list[tuple[int, tuple[int, ...]]]] | None:
    """The sizes a program's reshapes tie together: classes of equal size (a union-find parent
    map) and (whole, parts) products; None for a reshape that regroups several dims into
    several."""
    same: dict[int, int] = {}
    products: list[tuple[int, tuple[int, ...]]] = []
    for n in program.topological():
        if n.op != Op.RESHAPE:
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
