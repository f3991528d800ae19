"""Helpers shared by the search tests (tests/test_search_*.py): kernels and ops of sGraphs and states."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel
from superopt.targets import Target
from superopt.verifier.oracle import Oracle


def graph_kernels(sg) -> list[GraphKernel]:
    return [k for k in sg.kernels if isinstance(k, GraphKernel)]


def ops_of(k: GraphKernel, phase: str) -> list[str]:
    return sorted(o.op for o in getattr(k.block, phase))


def tile_ops(tiles: Iterator, consts: bool = False) -> list[str]:
    """The block ops of these tiles, each chain's (`Chain`) one by one; `consts`: a "const" for
    each op with constant operands too, as an sGraph lists them."""
    out = []
    for t in tiles:
        steps = dict(t.attrs)["ops"] if t.op == "chain" else [(t.op, t.args, t.consts)]
        out += [op for op, _, c in steps] + ["const"] * sum(1 for _, _, c in steps if c and consts)
    return out


def program_ops(p: Program) -> list[str]:
    return sorted(n.op for n in p.topological() if n.op not in ("input", "const"))


def in_f32(program: Program) -> Program:
    """The program with f32 inputs: between kernels, an f16 tensor holds only the program's own
    values (`KernelSearch._overflows`), so tests of partial sums and other values a kernel may
    hand on take the f32 form of an f16 workload."""
    doc = json.loads(program.dumps())
    for node in doc["nodes"]:
        if "dtype" in node:
            node["dtype"] = "f32"
    return Program.loads(json.dumps(doc))


def f32_workload(spec: str) -> Program:
    return in_f32(workloads.resolve(spec))


def with_floors(spec: str, h100: Target, dtype: str | None = None) -> KernelSearch:
    """A kernel search of a workload (`dtype` "f32": its f32 form, `in_f32`) with a finite bound,
    so that its floors are computed."""
    program = workloads.resolve(spec)
    if dtype is not None:
        assert dtype == "f32"
        program = in_f32(program)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ks.floors.bound_s = 1.0
    return ks


def sample_first_kernels(ks: KernelSearch, depth: int, choices: int, each: int) -> Iterator:
    """The first few first kernels of the first few choices of graphs of `depth` kernels."""
    for choice in ks.first_choices(depth)[:choices]:
        firsts = ks._library_moves(ks.initial(), False) if choice[0] == "library" else \
            ks._graph_moves(ks.initial(), False, only=choice[1])
        yield from itertools.islice(firsts, each)
