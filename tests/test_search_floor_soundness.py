"""The floors never exceed the cost model's estimate of a kernel they stand for: checked on every
graph kernel of every candidate some small searches complete, and shown to catch a floor that
over-cuts (a mutant DRAM latency floor)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from superopt import costmodel, workloads
from superopt.assignments import candidates as divisor_candidates
from superopt.config import SearchConfig
from superopt.search.floors import Floors
from superopt.search.kernel import BudgetExhausted, KernelSearch
from superopt.search.space import space_of
from superopt.search.states import KState, KTensor
from superopt.search.tiling import output_shape, resolve
from superopt.sgraph import GraphKernel, SGraph
from superopt.targets import Target
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")

SPECS = ["rmsnorm_matmul:ci", "gated_mlp:ci", "gqa:ci", "gqa", "lora:ci", "ntrans:ci"]


def _completed(spec: str, target: Target, states: int) -> Iterator[tuple[KState, SGraph]]:
    """The candidates of graphs of up to 3 kernels of at most 5 block ops over `spec`, with their
    kernel-level states: at most `states` states of each depth's first choices."""
    program = workloads.resolve(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3, max_block_ops=5),
                      target=target)
    seen: list[tuple[KState, SGraph]] = []
    candidate = ks._candidate

    def recording(s: KState) -> SGraph | None:
        sg = candidate(s)
        if sg is not None:
            seen.append((s, sg))
        return sg

    ks._candidate = recording  # type: ignore[method-assign]
    for depth in range(1, 4):
        for choice in ks.first_choices(depth):
            ks.max_states = ks.total_states + states
            try:
                for _ in ks.candidates_in(depth, choice):
                    yield from seen
                    seen.clear()
            except BudgetExhausted:  # the next choice
                pass
            yield from seen
            seen.clear()


def _violations(spec: str, target: Target, states: int = 200) -> list[str]:
    """Each graph kernel of a candidate whose least estimate (over every assignment of its
    symbols) is below a floor of it: the DRAM latency floor, `Floors._grid_floor` (its own grid)
    and `Floors.middle_own` (its inputs)."""
    program = workloads.resolve(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=target)
    wrong: list[str] = []
    checked = 0
    for s, sg in _completed(spec, target, states):
        values = divisor_candidates(sg)
        for n, k in enumerate(s.kernels):
            if not isinstance(k, GraphKernel):
                continue
            least = min(costmodel.kernel_floors(sg, target, k, values).values(), default=float("inf"))
            if least == float("inf"):
                continue
            checked += 1
            before = KState(s.tensors, s.kernels[:n], ())
            subset = tuple(i for i, t in enumerate(s.tensors) if t.id in k.tensor_inputs)
            floors = {"dram latency": target.launch_overhead_s + costmodel._dram_latency_floor(1),
                      "grid": ks.floors._grid_floor(s, k), "middle own": ks.floors.middle_own(before, subset)}
            wrong += [f"{spec} {k.id} {name} {floor * 1e6:.3f} us > {least * 1e6:.3f} us"
                      for name, floor in floors.items() if floor > least * (1 + 1e-9)]
    assert checked, f"{spec}: no graph kernel checked"
    return wrong


@pytest.mark.parametrize("spec", SPECS)
def test_floors_never_exceed_the_estimate_of_a_completed_kernel(h100, spec):
    assert _violations(spec, h100) == []


def test_an_over_cutting_floor_is_caught(h100, monkeypatch):
    """A DRAM latency floor twice the cost model's (it would cut kernels that win) is reported."""
    monkeypatch.setattr(costmodel, "_dram_latency_floor", lambda loop: 2 * loop * costmodel.DRAM_LATENCY_S)
    assert _violations("rmsnorm_matmul:ci", h100, states=300)


def test_every_graph_kernel_pays_a_dram_latency_per_loop_iteration(h100):
    """`_graph` at any sizes: a kernel whose loop walks an input takes at least loop x
    `DRAM_LATENCY_S` beyond its launch (`costmodel._dram_latency_floor`)."""
    _, reference = workloads.reference_for("gqa")
    values = divisor_candidates(reference)
    for k in reference.kernels:
        if isinstance(k, GraphKernel) and k.block.loop.size.is_const():
            loop = k.block.loop.size.int_value()
            least = min(costmodel.kernel_floors(reference, h100, k, values).values())
            assert least >= h100.launch_overhead_s + costmodel._dram_latency_floor(loop)


def _body_violations(spec: str, target: Target) -> tuple[int, int]:
    """How many kernels (tilings of block graphs completing a loop body: first kernels over each
    pair of program inputs, a hundred bodies each) estimate below their body's `Floors.body_floor`,
    and how many were checked."""
    program = workloads.resolve(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_block_ops=5), target=target)
    root = ks.initial()
    ids = [t.id for t in root.tensors]
    wrong = checked = 0
    for subset in itertools.combinations(range(len(root.tensors)), 2):
        specs = [ks._spec(root.tensors[i], i, False) for i in subset]
        for body in itertools.islice(ks._gen.bodies(ks._gen.start(specs)), 100):
            floor = ks.floors.body_floor(root, subset, body)
            for block in ks._gen.posts(body):
                for res in resolve(block, specs, ids, "k0", 0, None, ks._plans, ks.config.max_grid_axes):
                    outputs = [KTensor(tid, output_shape(block, tile, chunk), block.tiles[tile].ae,
                                       block.tiles[tile].pdims, chunk) for tid, tile, chunk in res.outputs]
                    least = ks.floors.least_alone(root, res.kernel, outputs)
                    if least:  # 0: not known (no prefix sGraph)
                        checked += 1
                        wrong += floor > least * (1 + 1e-9)
    return wrong, checked


@pytest.mark.parametrize("spec", ["rmsnorm_matmul:ci", "gqa:ci", "qknorm_gqa:ci", "gqa", "rmsnorm_matmul"])
def test_a_loop_body_floor_never_exceeds_the_estimate_of_a_kernel_completing_it(h100, spec):
    """`Floors.body_floor` (what cuts a loop body before its post-loop graphs are generated) is
    below the least estimate of every kernel completing the body."""
    wrong, checked = _body_violations(spec, h100)
    assert checked and not wrong


def test_a_body_floor_that_over_cuts_is_caught(h100, monkeypatch):
    """A body floor half again as high (it would cut bodies whose kernels win) is caught."""
    body_floor = Floors.body_floor
    monkeypatch.setattr(Floors, "body_floor", lambda f, s, subset, body: 1.5 * body_floor(f, s, subset, body))
    assert _body_violations("gqa:ci", h100)[0]
