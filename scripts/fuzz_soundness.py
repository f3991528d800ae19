"""Differential soundness fuzzer of the e-graph prover: does it ever prove a wrong schedule?

Random small programs (reductions sum / mean / max over rows of different widths, sums of
broadcasts and constants, matmul chains, rms_norm, softmax, transposes, an occasional reshape),
each drawn once with symbolic widths and built at three sizings in which every dim has an extent
of its own, are paired with many sGraphs: the search's own candidates (`run_search`: verified and
dominated), one-kernel schedules made from the program (every choice of the dim the grid splits
and the dim the loop walks), and mutations of those, above all ones that are wrong only at some
sizes: an operand (a constant, a broadcast row, a term) moved between reductions of different
widths, a post-loop op done per loop tile, loops of constant size; plus a sample of the generic
`superopt.mutations`.

Each pair is judged twice: by the e-graph alone (both sides lowered, `prove`), and by exact
finite-field evaluation at one instantiation under each sizing. A rule that holds only when two
dims are equally wide is refuted by numbers there, never at shapes that make them equal. Finite
fields are exact only for their fragment (an exp of a value that went through exp, a sqrt, a
relu are uninterpreted there, so an identity about them can look false): where they differ, the
pair is evaluated again in float64 without storage rounding, and only a difference there too
(beyond `FLOAT64_AGREE`) counts; the others are counted apart (`field_only`). A pair
the e-graph proves while the numbers differ is *wrong-proved*: it is printed with a reproduction
(program and sGraph JSON at the sizing where they differ, the parameters, the float check's
error as a second opinion), and the run exits 1. `--replay` judges a run's wrong proofs again
(after a fix to the prover, say).

    .venv/bin/python scripts/fuzz_soundness.py [--seed 0] [--pairs 10000] [--jobs 2] [--json out/fuzz.json]
    .venv/bin/python scripts/fuzz_soundness.py --replay out/fuzz.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from itertools import count
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from superopt import Program, ops
from superopt.assignments import pick_for_checks
from superopt.build import SGraphBuilder
from superopt.config import SearchConfig
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.instantiate import Instance, instantiate
from superopt.interpreter import run_float
from superopt.mutations import mutants, rename_readers, with_ops
from superopt.ops import Op
from superopt.program import Tensor
from superopt.reference import inputs_and_reference, max_rel_err
from superopt.search.driver import run_search
from superopt.sgraph import (
    AccKind,
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphKernel,
    Kernel,
    SGraph,
    SGraphError,
    check_matches,
)
from superopt.shrink import shrink_sgraph
from superopt.sizes import Size
from superopt.targets import TARGETS
from superopt.verifier import finite_field, float_check
from superopt.verifier.egraph import Limits, prove
from superopt.verifier.lowering import lower_program, lower_sgraph

TARGET = TARGETS["h100"]
WIDTHS = ("a", "b", "c")  # the dims a program's rows may have; "r" is the rows
EXTENTS = range(2, 13)  # every dim's extent, all distinct within a sizing
SIZINGS = 3  # sizings of each program: one instantiation is checked under each
PAIRS_PER_PROGRAM = 60  # so that 10,000 pairs cover some 170 programs
FUSED_BASES = 4  # one-kernel schedules made per program
GENERIC_BASES = 2  # base schedules given generic mutants (`superopt.mutations`: slow to make)
GENERIC_PER_BASE = 8  # of their generic mutants, judged
SEARCH = SearchConfig(max_kernel_ops=2, max_block_ops=6)
SEARCH_STATES = 300  # the search's budget, in states: the same candidates on every machine
SEARCH_SECONDS = 30.0  # and a bound in time, should a state be slow
LIMITS = Limits(seconds=3.0)  # a proof that needs longer counts as refused

Prover = Callable[[Program, SGraph], bool]


# -- random programs -------------------------------------------------------------------------------


@dataclass
class _Draw:
    """What one program's generator draws from: its random choices and its dims' extents."""

    p: Program
    rng: random.Random
    n: Mapping[str, int]
    vectors: dict[tuple[int, ...], Tensor] = field(default_factory=dict)

    def input(self, *dims: str | int) -> Tensor:
        """A new input over these dims (names, or literal extents such as a reshape's product)."""
        shape = tuple(self.n[d] if isinstance(d, str) else d for d in dims)
        return self.p.input(f"X{len(self.p.inputs)}", shape, "f16")

    def vector(self, shape: tuple[int, ...]) -> Tensor:
        """One input of this shape (a row or column vector) shared by every term that draws it:
        what rules move between terms."""
        if shape not in self.vectors:
            self.vectors[shape] = self.p.input(f"R{len(self.vectors)}", shape, "f16")
        return self.vectors[shape]

    def shifted(self, x: Tensor, dim: int = -1) -> Tensor:
        """x, or x with a constant or a vector broadcast along `dim` added, subtracted or multiplied
        in, or an elementwise op applied: the operands a reduction over `dim` pulls out of it."""
        kind = self.rng.choice(("none", "const", "const", "const", "const", "vector", "vector", "vector", Op.EXP,
                                Op.SQUARE))
        op = self.rng.choice((Op.ADD, Op.ADD, Op.ADD, Op.SUB, Op.MUL))
        if kind == "const":
            c = self.rng.choice((1.0, 2.0, 0.5, 3.0))
            return self.p.op(op, x, c) if self.rng.random() < 0.7 else self.p.op(op, c, x)
        if kind == "vector":
            return self.p.op(op, x, self.vector(tuple(1 if i == dim % len(x.shape) else e
                                                      for i, e in enumerate(x.shape))))
        return x if kind == "none" else self.p.op(kind, x)

    def reduce(self, x: Tensor, dim: int, keepdim: bool) -> Tensor:
        op = self.rng.choice((Op.SUM, Op.SUM, Op.SUM, Op.SUM, Op.MEAN, Op.MAX))
        return self.p.op(op, x, dim=dim, keepdim=keepdim)

    def combined(self, terms: Sequence[Tensor]) -> Tensor:
        """The terms added or subtracted in turn, sometimes scaled."""
        out = terms[0]
        for t in terms[1:]:
            out = self.p.op(self.rng.choice((Op.ADD, Op.ADD, Op.SUB)), out, t)
        return self.p.mul(out, 0.5) if self.rng.random() < 0.2 else out


def _reductions(d: _Draw) -> list[Tensor]:
    """Reductions of rows (or columns) of different widths, each shifted, then summed: the shape
    of the first unsound proof, sum(X + 1) + sum(Y + 1) as sum(X) + sum(Y + 2)."""
    widths = d.rng.sample(WIDTHS, d.rng.choice((2, 2, 3)))
    keep = d.rng.random() < 0.75
    same = d.rng.choice((Op.SUM, Op.SUM, Op.MEAN, Op.MAX)) if d.rng.random() < 0.5 else None  # one for all terms

    def reduce(x: Tensor, dim: int) -> Tensor:
        return d.reduce(x, dim, keep) if same is None else d.p.op(same, x, dim=dim, keepdim=keep)

    if d.rng.random() < 0.25:  # columns: X (w, r) reduced over dim 0
        return [d.combined([reduce(d.shifted(d.input(w, "r"), 0), 0) for w in widths])]
    return [d.combined([reduce(d.shifted(d.input("r", w)), -1) for w in widths])]


def _broadcasts(d: _Draw) -> list[Tensor]:
    """A full tensor combined with a row reduction of another width (a broadcast along the
    width), sometimes reduced again and summed with a third width's reduction."""
    s = d.reduce(d.shifted(d.input("r", "b")), -1, True)
    out = d.p.op(d.rng.choice((Op.ADD, Op.SUB, Op.MUL, Op.DIV)), d.shifted(d.input("r", "a")), s)
    if d.rng.random() < 0.5:
        out = d.combined([d.reduce(out, -1, True), d.reduce(d.shifted(d.input("r", "c")), -1, True)])
    return [out]


def _products(d: _Draw) -> list[Tensor]:
    """X @ W over three widths: X normalized, shifted or transposed first (or reshaped from three
    dims), then a second product, a product of its own or a broadcast row reduction, sometimes
    transposed at the end."""
    r = d.rng.random()
    if r < 0.15:
        inner: tuple[str | int, ...] = (d.n["a"] * d.n["b"], "c")
        x = d.p.reshape(d.input("r", "a", "b"), (d.n["r"], d.n["a"] * d.n["b"]))
    elif r < 0.3:
        inner, x = ("a", "b"), d.p.transpose(d.input("a", "r"), (1, 0))
    else:
        inner, x = ("a", "b"), d.input("r", "a")
    pre = d.rng.choice(("none", Op.RMS_NORM, Op.SOFTMAX, "shift"))
    xp = d.shifted(x) if pre == "shift" else x if pre == "none" else d.p.op(pre, x, dim=-1)
    out = xp @ d.input(*inner)
    r = d.rng.random()
    if r < 0.3:
        out = out @ d.input(inner[1], "r")
    elif r < 0.5:
        out = out + d.shifted(x) @ d.input(*inner)
    elif r < 0.7:
        out = d.p.op(d.rng.choice((Op.ADD, Op.MUL, Op.DIV)), out, d.reduce(d.shifted(x), -1, True))
    return [d.p.transpose(out, (1, 0)) if d.rng.random() < 0.2 else out]


def _norms(d: _Draw) -> list[Tensor]:
    """rms_norm or softmax of shifted rows; with two widths, their row reductions summed."""
    outs = []
    for w in d.rng.sample(WIDTHS, d.rng.choice((1, 2))):
        x = d.shifted(d.input("r", w))
        outs.append(d.p.rms_norm(x, -1) if d.rng.random() < 0.5 else d.p.softmax(x, -1))
    return outs if len(outs) == 1 else [d.combined([d.reduce(o, -1, True) for o in outs])]


KINDS: tuple[Callable[[_Draw], list[Tensor]], ...] = (
    _reductions, _reductions, _reductions, _broadcasts, _products, _products, _norms)


@dataclass(frozen=True)
class Structure:
    """A random program with symbolic widths: `build` draws the same choices at every sizing."""

    seed: str

    def build(self, sizes: Mapping[str, int]) -> Program:
        rng = random.Random(self.seed)
        d = _Draw(Program(f"fuzz_{self.seed.replace('/', '_')}"), rng, sizes)
        outputs = rng.choice(KINDS)(d)
        if rng.random() < 0.2:  # a second output, of another kind
            outputs += rng.choice(KINDS)(d)
        d.p.output(*outputs)
        return d.p.validate()

    def sizings(self) -> list[dict[str, int]]:
        """Sizings in which all dims differ (rows and widths): a rule true only for equal
        extents is refuted at each of them."""
        rng = random.Random(f"{self.seed}/sizes")
        out: list[dict[str, int]] = []
        while len(out) < SIZINGS:
            sizes = dict(zip(("r", *WIDTHS), rng.sample(EXTENTS, 1 + len(WIDTHS)), strict=True))
            if sizes not in out:
                out.append(sizes)
        return out


# -- sGraphs for a program ---------------------------------------------------------------------------


def searched(program: Program) -> list[SGraph]:
    """The search's candidates for the program: those it verified, and those it ranked behind them."""
    outcome = run_search(program, TARGET, SEARCH, budget_s=SEARCH_SECONDS, max_states=SEARCH_STATES)
    return [v.sgraph for v in outcome.verified] + list(outcome.dominated)


def fused(program: Program, grid: int | None, loop: int | None) -> SGraph | None:
    """The program as one graph kernel whose grid splits dim class `grid` (None: one block) and
    whose loop walks class `loop` (None: one iteration) in every tensor that has it; transposes
    and reshapes of inputs stay library kernels before it. A loop over a class an output keeps is
    a concat accumulator, else a sum (a mean for a mean). Right or wrong by construction (a loop
    over a normalized dim normalizes each tile): numbers will tell. None when no such sGraph
    exists (a view of a computed value, a split class that an output lacks)."""
    classes = dim_classes(program)

    def dim(nid: str, c: int | None) -> int | None:
        return next((i for i in range(len(program.nodes[nid].shape)) if classes[(nid, i)] == c), None)

    b = SGraphBuilder.for_program(program, f"{program.name}.fused")
    tensors: dict[str, str] = {}  # program node -> kernel tensor: inputs, and library views of them
    for n in program.topological():
        if n.op == "input":
            tensors[n.id] = n.id
        elif n.op in ops.LAYOUT and n.inputs[0] in tensors:
            tensors[n.id] = b.library(n.op, tensors[n.inputs[0]], out=n.id, **dict(n.attrs))
    k = b.graph(grid=[("x", 1 if grid is None else "gx")], loop=("f", 1 if loop is None else "F"))
    body = [n for n in program.topological() if n.id not in tensors]
    read = {i for n in body for i in n.inputs if i in tensors}
    tiles = {t: k.input(t, [dim(t, grid)], dim(t, loop), name=f"{t}_t") for t in tensors if t in read}
    for n in body:
        if not ops.OPS[n.op].block_level:
            return None
        tiles[n.id] = k.op(n.op, *(tiles[i] for i in n.inputs), **dict(n.attrs))
    for o in program.outputs:
        walked = dim(o, loop)
        kind = AccKind.CONCAT if walked is not None else AccKind.MEAN if program.nodes[o].op == Op.MEAN else AccKind.SUM
        split = 0 if grid is None else dim(o, grid)
        if split is None:
            return None
        k.output(k.acc(tiles[o], kind, walked), f"{o}_out", [split])
    try:
        sg = b.build([f"{o}_out" for o in program.outputs])
    except SGraphError:
        return None
    return sg if _valid(sg, program) else None


def fused_bases(program: Program, rng: random.Random) -> list[tuple[str, SGraph]]:
    """Up to FUSED_BASES one-kernel schedules, drawn from every pair of a split class that every
    output has (or none) and a loop class (or none): those with a split and no loop first (the
    schedules the prover can prove, so their mutants test it most)."""
    classes = dim_classes(program)
    every = sorted({c for c in classes.values() if c != NO_CLASS})
    kept = [c for c in every if all(any(classes[(o, i)] == c for i in range(len(program.nodes[o].shape)))
                                    for o in program.outputs)]
    choices = [(g, f) for g in [None, *kept] for f in [None, *every] if f is None or f != g]
    rng.shuffle(choices)
    out = []
    for g, f in sorted(choices, key=lambda c: (c[0] is None, c[1] is not None)):
        sg = fused(program, g, f)
        if sg is not None:
            out.append((f"one kernel, grid on dim class {g}, loop on dim class {f}", sg))
        if len(out) == FUSED_BASES:
            break
    return out


def _valid(sg: SGraph, program: Program) -> bool:
    """Is `sg` well formed, with outputs of the program's shapes? (Mutations often make neither.)"""
    try:
        check_matches(sg, program)
    except (SGraphError, ValueError):
        return False
    return True


# -- mutations wrong only at some sizes --------------------------------------------------------------


def size_mutants(sg: SGraph, program: Program) -> list[tuple[str, SGraph]]:
    """Variants of `sg` that are often right at some sizes and wrong at others: operands moved
    between terms (between reductions over different widths), post-loop ops done per tile,
    loop sizes fixed to a constant."""
    out: list[tuple[str, SGraph]] = []
    for i, k in enumerate(sg.kernels):
        if not isinstance(k, GraphKernel):
            continue
        for what, block in [*_hops(k.block), *_hoists(k.block)]:
            kernels = (*sg.kernels[:i], GraphKernel(k.id, block), *sg.kernels[i + 1 :])
            out.append((f"kernel {k.id}: {what}", SGraph(sg.inputs, kernels, sg.outputs, sg.name)))
    out += _constant_axes(sg)
    return [(what, m) for what, m in out if _valid(m, program)]


def _hops(b: BlockGraph) -> Iterator[tuple[str, BlockGraph]]:
    """Op u = P ± Q loses Q, which a sum or mean v = red(T) takes on as red(T ± Q) (where v is not
    negated after, one of the signs keeps the total). Where u feeds a reduction over a dim of
    another extent, a constant or broadcast Q is summed a different number of times: right at
    some sizes only."""
    for phase, u, kept, q, j in _hop_sites(b):
        ops_: tuple[BlockOp, ...] = getattr(b, phase)
        v = ops_[j]
        for sign in (Op.ADD, Op.SUB):
            moved = BlockOp(f"{v.id}_h", sign, (v.inputs[0], q))
            taker = replace(v, inputs=(moved.id,))
            hopped = rename_readers(with_ops(b, phase, (*ops_[:j], moved, taker, *ops_[j + 1 :])), u.id, kept)
            rest = tuple(o for o in getattr(hopped, phase) if o.id != u.id)
            yield f"{phase} op {u.id}'s operand {q} moved into {v.id} ({sign})", with_ops(hopped, phase, rest)


def _hop_sites(b: BlockGraph) -> Iterator[tuple[str, BlockOp, str, str, int]]:
    """(phase, u, what u leaves behind, the operand that moves, the index of v in the phase)."""
    for phase in ("body", "post"):
        ops_: tuple[BlockOp, ...] = getattr(b, phase)
        for u in ops_:
            for kept, q in _movable(u):
                for j, v in enumerate(ops_):
                    if v.op in (Op.SUM, Op.MEAN) and _visible(b, phase, q, j):
                        yield phase, u, kept, q, j


def _movable(u: BlockOp) -> list[tuple[str, str]]:
    """(what u leaves behind, the operand that moves): either operand of a sum, the subtrahend."""
    if u.op == Op.ADD:
        return [(u.inputs[0], u.inputs[1]), (u.inputs[1], u.inputs[0])]
    return [(u.inputs[0], u.inputs[1])] if u.op == Op.SUB else []


def _hoists(b: BlockGraph) -> Iterator[tuple[str, BlockGraph]]:
    """A post-loop op of accumulators done in the loop body on each iteration's tiles instead,
    accumulated as its first operand was: per-tile normalization (a row divided by its tile's sum)."""
    accs = {a.id: a for a in b.accumulators}
    for op in b.post:
        if not op.inputs or any(i not in accs for i in op.inputs):
            continue
        first = accs[op.inputs[0]]
        tile = BlockOp(f"{op.id}_tile", op.op, tuple(accs[i].source for i in op.inputs), op.attrs)
        acc = Accumulator(f"{op.id}_acc", tile.id, first.kind, first.dim)
        moved = replace(b, body=(*b.body, tile), accumulators=(*b.accumulators, acc),
                        post=tuple(o for o in b.post if o is not op))
        yield f"post op {op.id} ({op.op}) done per loop tile", _pruned(rename_readers(moved, op.id, acc.id))


def _constant_axes(sg: SGraph) -> list[tuple[str, SGraph]]:
    """Every axis of a loop's symbolic size given a constant size instead (2 or 3, by the
    symbol's name): a loop of constant size fits some sizings only, and splits differently."""
    out = []
    for s in sorted({x for k in sg.graph_kernels for x in k.block.loop.size.symbols}):
        c = 2 + len(s) % 2
        kernels = tuple(_axis_resized(k, Size.of(s), Size.const(c)) for k in sg.kernels)
        out.append((f"axes of size {s} given size {c}", SGraph(sg.inputs, kernels, sg.outputs, sg.name)))
    return out


def _axis_resized(k: Kernel, old: Size, new: Size) -> Kernel:
    if not isinstance(k, GraphKernel):
        return k
    b = k.block
    grid = tuple(replace(a, size=new) if a.size == old else a for a in b.grid)
    loop = replace(b.loop, size=new) if b.loop.size == old else b.loop
    return GraphKernel(k.id, replace(b, grid=grid, loop=loop))


def _visible(b: BlockGraph, phase: str, tid: str, j: int) -> bool:
    """Can op j of `phase` read block tensor `tid`: an input or accumulator of its phase, or an
    op before it?"""
    first = [i.id for i in b.inputs] if phase == "body" else [a.id for a in b.accumulators]
    return tid in first or tid in {o.id for o in getattr(b, phase)[:j]}


def _pruned(b: BlockGraph) -> BlockGraph:
    """`b` without the inputs, ops and accumulators nothing reads any more."""
    while True:
        read = {i for o in (*b.body, *b.post) for i in o.inputs} | {a.source for a in b.accumulators} \
            | {o.source for o in b.outputs}
        kept = replace(b, inputs=tuple(i for i in b.inputs if i.id in read),
                       body=tuple(o for o in b.body if o.id in read),
                       accumulators=tuple(a for a in b.accumulators if a.id in read),
                       post=tuple(o for o in b.post if o.id in read))
        if kept == b:
            return b
        b = kept


# -- the pairs of one program --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A pair to judge: one program structure at several sizings (the first is the proof's, and
    the sGraph's) and an sGraph over its inputs."""

    programs: tuple[Program, ...]
    sgraph: SGraph
    origin: str  # how the sGraph was made


def cases(structure: Structure, prover: Prover) -> list[Case]:
    """Up to PAIRS_PER_PROGRAM distinct sGraphs for the structure: its base schedules (searched
    and one-kernel), then a shuffle of the size mutants and a sample of the generic mutants of
    those the prover proves (all, if it proves none): a mutant of a schedule it cannot prove is
    seldom proved, right or wrong, so it tests the prover's soundness little."""
    programs = tuple(structure.build(s) for s in structure.sizings())
    program = programs[0]
    rng = random.Random(f"{structure.seed}/cases")
    bases = [(f"searched {i}", sg) for i, sg in enumerate(searched(program))] + fused_bases(program, rng)
    mutated = [(name, sg) for name, sg in bases if prover(program, sg)] or bases
    variants = [(f"{name}; {what}", m) for name, base in mutated for what, m in size_mutants(base, program)]
    for name, base in rng.sample(mutated, min(GENERIC_BASES, len(mutated))):
        generic = mutants(base, program)
        variants += [(f"{name}; {what}", m) for what, m in rng.sample(generic, min(GENERIC_PER_BASE, len(generic)))]
    rng.shuffle(variants)
    seen: set[str] = set()
    out: list[Case] = []
    for origin, sg in [*bases, *variants]:
        text = json.dumps({**sg.to_json(), "name": ""}, sort_keys=True)
        if text not in seen:
            seen.add(text)
            out.append(Case(programs, sg, origin))
        if len(out) == PAIRS_PER_PROGRAM:
            break
    return out


# -- judging ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    sizing: int  # which of the case's programs
    params: dict[str, int]
    detail: str


@dataclass(frozen=True)
class Judgement:
    proved: bool  # by the e-graph
    mismatch: Mismatch | None  # where exact numbers differ first, if they do anywhere
    checked: int  # instantiations evaluated (one per sizing that has a valid one)
    field_only: bool = False  # Z_p differed somewhere, float64 did not (see `judge`)

    @property
    def wrong_proved(self) -> bool:
        return self.proved and self.mismatch is not None


class EgraphProver:
    """The e-graph alone, called as `verify` calls it, on the first sizing. Proofs are kept by
    their terms: mutants often lower alike."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self._programs: dict[int, tuple[Program, list[Any]]] = {}  # id -> (program, kept alive; its terms)
        self._proofs: dict[tuple[Any, ...], bool] = {}

    def __call__(self, program: Program, sg: SGraph) -> bool:
        if id(program) not in self._programs:
            self._programs[id(program)] = program, lower_program(program)
        lhs = self._programs[id(program)][1]
        rhs, axes = lower_sgraph(sg, program)
        key = (tuple(lhs), tuple(rhs), tuple(axes))
        if key not in self._proofs:
            self._proofs[key] = prove(list(zip(lhs, rhs, strict=True)), axes, self.limits).proved
        return self._proofs[key]


def judge(case: Case, prover: Prover) -> Judgement:
    """The prover's verdict on the pair, and where exact numbers differ: one instantiation under
    each sizing (the sGraph rebound to that sizing's program), checked in Z_p, and where Z_p
    differs, in float64 (`_float64_agrees`)."""
    proved = prover(case.programs[0], case.sgraph)
    checked = 0
    field_only = False
    for i, program in enumerate(case.programs):
        found = _instance(case, i)
        if found is None:
            continue
        sg, values = found
        checked += 1
        inst = instantiate(sg, values, TARGET)
        res = finite_field.check(program, inst, trials=1, seed=i)
        if not res.passed:
            if _float64_agrees(program, inst, seed=i):
                field_only = True  # outside the field's exact fragment: the numbers agree
                continue
            return Judgement(proved, Mismatch(i, values, res.mismatch), checked)
    return Judgement(proved, None, checked, field_only)


FLOAT64_AGREE = 1e-7  # relative: float64 rounding stays far below; a wrong schedule at random inputs far above


def _float64_agrees(program: Program, inst: Instance, seed: int) -> bool:
    """Do the program and the instantiated sGraph agree in float64 (no storage rounding) at
    fresh random inputs, where the program is defined?"""
    inputs, want = inputs_and_reference(program, seed)
    got = run_float(inst, inputs, exact=True)
    return all(max_rel_err(g, w) <= FLOAT64_AGREE for g, w in zip(got, want, strict=True))


def _instance(case: Case, i: int) -> tuple[SGraph, dict[str, int]] | None:
    """The sGraph over sizing i's program and parameters for it (each sizing its own choice
    among `pick_for_checks`' spread), or None where it has none (a constant loop that does not
    divide, dims that only matched at the first sizing)."""
    sg = case.sgraph if i == 0 else shrink_sgraph(case.sgraph, case.programs[0], case.programs[i])
    picks = [] if sg is None else pick_for_checks(sg, TARGET, i + 1)
    return None if sg is None or not picks else (sg, picks[-1])


def reproduction(case: Case, j: Judgement) -> dict[str, Any]:
    """What reproduces a wrong proof: the program and sGraph where the numbers differ (the proof
    needs no sizes: it holds, wrongly, there too), the parameters, and the float check there."""
    assert j.mismatch is not None
    m = j.mismatch
    found = _instance(case, m.sizing)
    assert found is not None
    sg, _ = found
    program = case.programs[m.sizing]
    fl = float_check.check(program, instantiate(sg, m.params, TARGET))
    return {"origin": case.origin, "params": m.params, "finite_field": m.detail,
            "float_max_rel_err": fl.max_rel_err, "float_tolerance": fl.tolerance,
            "program": program.to_json(), "sgraph": sg.to_json()}


# -- running ------------------------------------------------------------------------------------------------


@dataclass
class PairResult:
    """One judged pair, as a worker process sends it back (plain data: it pickles)."""

    proved: bool
    differs: bool
    checked: int
    error: str = ""  # the exception, when judging raised: the pair is counted as neither
    field_only: bool = False
    reproduction: dict[str, Any] | None = None  # for a wrong proof


def fuzz_structure(seed: str) -> list[PairResult]:
    """Judge every pair of one random program (in a worker process: all it returns pickles)."""
    structure = Structure(seed)
    prover = EgraphProver()
    try:
        pairs = cases(structure, prover)
    except Exception as e:  # a fuzzer reports and goes on: one bad program must not stop 10,000 pairs
        return [PairResult(False, False, 0, f"{seed}: making pairs: {_error(e)}")]
    out = []
    for case in pairs:
        try:
            j = judge(case, prover)
            out.append(PairResult(j.proved, j.mismatch is not None, j.checked, field_only=j.field_only,
                                  reproduction=reproduction(case, j) if j.wrong_proved else None))
        except Exception as e:
            out.append(PairResult(False, False, 0, f"{seed}: {case.origin}: {_error(e)}"))
    return out


def _error(e: Exception) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})"


def structures(seed: int, jobs: int) -> Generator[list[PairResult], None, None]:
    """Each random program's results, in order (so a seed always gives the same pairs), judged by
    `jobs` processes (a few programs ahead of the one awaited)."""
    seeds = (f"{seed}/{i}" for i in count())
    if jobs == 1:
        yield from map(fuzz_structure, seeds)
        return
    pool = ProcessPoolExecutor(jobs, mp_context=get_context("spawn"))
    try:
        ahead: deque[Future[list[PairResult]]] = deque(pool.submit(fuzz_structure, next(seeds))
                                                      for _ in range(2 * jobs))
        while True:
            done = ahead.popleft().result()
            ahead.append(pool.submit(fuzz_structure, next(seeds)))
            yield done
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class Summary:
    """A run's counts (the table and JSON it prints) and what it found."""

    pairs: int = 0
    proved: int = 0
    refused: int = 0
    wrong_proved: int = 0
    numeric_differ: int = 0
    unchecked: int = 0  # pairs with no valid instantiation at any sizing: judged by the prover only
    field_only: int = 0  # pairs whose finite-field values differ while float64 agrees (see `judge`)
    errors: int = 0
    programs: int = 0
    seconds: float = 0.0
    cases: list[dict[str, Any]] = field(default_factory=list)  # the wrong proofs' reproductions
    error_messages: list[str] = field(default_factory=list)

    def add(self, r: PairResult) -> None:
        self.pairs += 1
        if r.error:
            self.errors += 1
            self.error_messages.append(r.error)
            return
        self.proved += r.proved
        self.refused += not r.proved
        self.numeric_differ += r.differs
        self.unchecked += r.checked == 0
        self.field_only += r.field_only
        if r.reproduction is not None:
            self.wrong_proved += 1
            self.cases.append(r.reproduction)

    def counts(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("cases", "error_messages")}


def run(seed: int, pairs: int, jobs: int = 1, on_case: Callable[[dict[str, Any]], None] | None = None,
        on_program: Callable[[Summary], None] | None = None) -> Summary:
    """Judge `pairs` pairs drawn from `seed`; `on_case` sees each wrong proof as it is found."""
    t0 = time.monotonic()
    summary = Summary()
    programs = structures(seed, jobs)
    while summary.pairs < pairs:
        summary.programs += 1
        for r in next(programs)[: pairs - summary.pairs]:
            summary.add(r)
            if r.reproduction is not None and on_case is not None:
                on_case(r.reproduction)
        summary.seconds = round(time.monotonic() - t0, 1)
        if on_program is not None:
            on_program(summary)
    programs.close()  # stops the workers
    return summary


# -- the known bad pair ---------------------------------------------------------------------------------------


def known_bad_case() -> Case:
    """The pair that exposed the prover's size-blind rules: O = sum(X + 1) + sum(Y + 1) over rows
    of X (4, 64) and Y (4, 32), as sum(X) + sum(Y + (1 + 1)): equal only where X and Y are equally
    wide (sum(A + c) = sum(A) + sum(c), and sum(c) named no width)."""
    programs = tuple(known_program(r, a, b) for r, a, b in ((4, 64, 32), (3, 10, 6), (2, 9, 12)))
    b = SGraphBuilder.for_program(programs[0], "known_bad")
    k = b.graph(grid=[("x", "gx")])
    xt, yt = k.input("X", [0], None), k.input("Y", [0], None)
    one = k.op(Op.CONST, value=1.0)
    o = k.op(Op.ADD, k.op(Op.SUM, xt, dim=1, keepdim=True),
             k.op(Op.SUM, k.op(Op.ADD, yt, k.op(Op.ADD, one, one)), dim=1, keepdim=True))
    k.output(k.acc(o), "O", [0])
    return Case(programs, b.build(["O"]), "sum(X) + sum(Y + (1 + 1)) for sum(X + 1) + sum(Y + 1)")


def known_program(rows: int, x_width: int, y_width: int) -> Program:
    p = Program("known_bad")
    x, y = p.input("X", (rows, x_width), "f32"), p.input("Y", (rows, y_width), "f32")
    p.output(p.op(Op.ADD, p.sum(x + 1.0, -1, keepdim=True), p.sum(y + 1.0, -1, keepdim=True), name="O"))
    return p


# -- the command line ---------------------------------------------------------------------------------------------


def _print_case(n: int, case: dict[str, Any]) -> None:
    print(f"\nWRONG-PROVED #{n}: {case['program']['name']}: {case['origin']}")
    print(f"  proved by the e-graph; exact numbers differ at {_shapes(case['program'])} with {case['params']}: "
          f"{case['finite_field']} (float max rel err {case['float_max_rel_err']:.3g}, "
          f"tolerance {case['float_tolerance']:.3g})")
    print(f"  program: {json.dumps(case['program'], separators=(',', ':'))}")
    print(f"  sgraph:  {json.dumps(case['sgraph'], separators=(',', ':'))}", flush=True)


def _shapes(program_json: dict[str, Any]) -> str:
    return ", ".join(f"{n['id']}{tuple(n['shape'])}" for n in program_json["nodes"] if n["op"] == "input")


def _progress(s: Summary) -> None:
    print(f"[{s.seconds:7.1f} s] {s.programs} programs, {s.pairs} pairs: {s.proved} proved, "
          f"{s.wrong_proved} wrong-proved, {s.numeric_differ} differ, {s.errors} errors", file=sys.stderr, flush=True)


def replay(path: Path, prover: Prover) -> list[tuple[str, Judgement]]:
    """The wrong proofs a run wrote (`--json`), judged again, each at the sizing where it was
    refuted: is the prover still proving them (the check that a fix took)?"""
    recorded = json.loads(path.read_text())["wrong_proved_cases"]
    return [(c["origin"], judge(Case((Program.from_json(c["program"]),), SGraph.from_json(c["sgraph"]), c["origin"]),
                                prover)) for c in recorded]


def _replay(path: Path) -> int:
    judged = replay(path, EgraphProver())
    for n, (origin, j) in enumerate(judged, 1):
        verdict = "STILL WRONG-PROVED" if j.wrong_proved else "proved" if j.proved else "refused"
        print(f"#{n} {verdict}: {origin}")
    still = sum(j.wrong_proved for _, j in judged)
    print(json.dumps({"replayed": len(judged), "still_wrong_proved": still}))
    return 1 if still else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--json", type=Path, help="also write the counts and every wrong proof here")
    ap.add_argument("--replay", type=Path, help="judge again the wrong proofs a run wrote with --json, and stop")
    args = ap.parse_args(argv)
    if args.replay:
        return _replay(args.replay)
    found = count(1)
    s = run(args.seed, args.pairs, args.jobs, on_case=lambda c: _print_case(next(found), c), on_program=_progress)
    print()
    counts = s.counts()
    for key in ("pairs", "proved", "refused", "wrong_proved", "numeric_differ", "field_only", "unchecked", "errors",
                "programs", "seconds"):
        print(f"{key.replace('_', '-'):>15}  {counts[key]}")
    for message in s.error_messages[:10]:
        print(f"error: {message}")
    print(json.dumps(counts))
    if args.json:
        write_json(args.json, args.seed, s)
    return 1 if s.wrong_proved else 0


def write_json(path: Path, seed: int, s: Summary) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seed": seed, **s.counts(), "wrong_proved_cases": s.cases,
                                "error_messages": s.error_messages}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
