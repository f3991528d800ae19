"""Stored kernels name their tensors canonically, and are renamed for whoever asks.

A cache key is the canonical program (superopt.canonical): node names are not part of it, so one
entry answers every program of that computation, whatever its names. A kernel stored with the
names of the program that happened to be searched would then fit no other: a forced search of the
same program under other input names would replace the winner with one whose names no longer
match the stored program, and every later lookup would miss. So a kernel is stored with each tensor that is
a program node named by that node's place in the canonical order (`$0`, `$1`, ...: never a node
name, whose grammar has no `$`), and renamed on the way out to the asking program's node at the
same place. Tensors the search named itself (`k0_out0`) keep their names, unless the asking
program uses one: that tensor is then given a fresh name, so no two tensors ever merge.
"""

from __future__ import annotations

from collections.abc import Mapping

from superopt.canonical import canonical_order
from superopt.program import Program
from superopt.sgraph import SGraph, named_for, renamed

Order = tuple[str, ...]  # a program's node ids in canonical order: all a renaming depends on


def order_of(program: Program) -> Order:
    return tuple(canonical_order(program))


def to_canonical(sg: SGraph, order: Order) -> SGraph:
    """`sg`, written for the program of `order`, with that program's node names made canonical."""
    return _rename(sg, {nid: f"${i}" for i, nid in enumerate(order)})


def from_canonical(sg: SGraph, order: Order, program_name: str | None = None) -> SGraph:
    """A stored `sg` with its canonical names made those of the program of `order`, and its own
    name that program's (`program_name`) with the stored name's suffix (`.searched`, `.unfused`):
    a hit for `mm_bias_gelu` was called after `t0`, the program first searched."""
    return _rename(sg, {f"${i}": nid for i, nid in enumerate(order)}, named_for(program_name, sg.name))


def _rename(sg: SGraph, names: Mapping[str, str], name: str | None = None) -> SGraph:
    tensors = {d.id for d in sg.inputs} | {t for k in sg.kernels for t in k.outputs}
    targets = set(names.values())
    taken = tensors | targets
    clashes: dict[str, str] = {}
    for t in sorted(t for t in tensors if t not in names and t in targets):
        n = 1
        while f"{t}_{n}" in taken:
            n += 1
        clashes[t] = f"{t}_{n}"
        taken.add(clashes[t])
    return renamed(sg, {**names, **clashes}, name)
