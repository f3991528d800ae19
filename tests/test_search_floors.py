"""Bounds and floors: each is below the cost model's estimate of what it cuts, and binds."""

from __future__ import annotations

import itertools

import pytest
from search_helpers import f32_workload, in_f32, sample_first_kernels, with_floors

from superopt import workloads
from superopt.config import SearchConfig
from superopt.loading import load_program
from superopt.search import kernel as kernel_module
from superopt.search.instantiation import rank
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("spec", ["gqa", "rmsnorm_mlp"])
def test_time_bound_never_exceeds_the_cost_models_estimate(h100, spec):
    """The kernel-level bound (the cost model's least time for the kernels chosen so far, alone;
    launches plus every tensor a kernel reads and writes at full DRAM bandwidth) is below the
    cost model's estimate of every candidate containing them, so cutting graphs whose bound
    exceeds the best proved time never cuts a graph that could win. First kernels that fit no
    instantiation (their bound is infinite) are in no instantiable candidate."""
    ks = with_floors(spec, h100)
    checked, infinite = 0, 0
    for choice in ks.first_choices(2)[:3]:
        firsts = ks._library_moves(ks.initial(), False) if choice[0] == "library" else \
            ks._graph_moves(ks.initial(), False, only=choice[1])
        for first in firsts:
            spent_first = ks.floors.spent(first)
            assert spent_first > ks.floors.launch_s
            infinite += spent_first == float("inf")
            for last in itertools.islice(ks.moves(first, final=True), 20):
                cand = ks._candidate(last)
                if cand is None or not (ranked := rank(cand, h100)):
                    continue
                assert max(spent_first, ks.floors.spent(last)) <= ranked[0].estimate.time_s, cand.dumps()
                checked += 1
            if checked > 40 and (spec == "gqa" or infinite):
                break
    assert checked > 10 and (spec == "gqa" or infinite)


@pytest.mark.parametrize("spec", ["gqa:ci", "lora:ci", "rmsnorm_mlp:ci", "gqa"])
def test_last_kernel_floor_is_below_every_last_kernel_over_its_inputs(h100, spec):
    """The floor of a last graph kernel, known from the tensors it reads and the outputs it must
    write before any of its block graphs is generated (`_whole_floor`), is at most the cost
    model's least time of every last kernel the search builds over those tensors, so cutting by
    it never cuts a graph that could win; and at the published shape it is no empty bound: it
    comes within 2x of some of them (attention's last kernels must read all of K and V in
    every block, whatever their block graph)."""
    ks = with_floors(spec, h100)
    ratios = []
    for first in sample_first_kernels(ks, depth=2, choices=4, each=4):
        missing = ks.floors.missing(first)
        index = {t.id: n for n, t in enumerate(first.tensors)}
        for last in itertools.islice(ks._graph_moves(first, True), 25):
            kernel = last.kernels[-1]
            floor = ks.floors._whole_floor(first, tuple(sorted(index[t] for t in kernel.tensor_inputs)), missing)
            prefix = ks.floors._prefix(last)
            assert prefix is not None
            least = min(ks.floors._floors(last, *prefix, kernel).values(), default=float("inf"))
            assert floor <= least * (1 + 1e-9), kernel
            ratios.append(least / floor)
    assert len(ratios) >= 15
    assert spec != "gqa" or min(ratios) < 2.0, min(ratios)


@pytest.mark.parametrize("spec", ["gqa:ci", "gqa"])
def test_middle_kernel_floor_is_below_every_candidate_through_it(h100, spec):
    """The floor of a graph kernel that is not the last (`Floors.middle_floor`: the kernels before it,
    its inputs, the launches after it and what the later kernels must read and write, known
    before its block graphs are generated) is at most the cost model's best time of every
    candidate grown through such a kernel, so cutting by it never cuts a graph that could win;
    and at the published shape it binds: within 2x of some of them. So is the bound of each
    state on the way (its kernels, the launches to come and the bytes they owe, `Floors.owed`)."""
    ks = with_floors(spec, h100)
    ratios = []
    for first in sample_first_kernels(ks, depth=3, choices=3, each=3):
        floor = ks.floors.middle_floor(first, 1)
        index = {t.id: n for n, t in enumerate(first.tensors)}
        for middle in itertools.islice(ks._graph_moves(first, False), 30):
            subset = tuple(sorted(index[t] for t in middle.kernels[-1].tensor_inputs))
            for last in itertools.islice(ks.moves(middle, final=True), 5):
                cand = ks._candidate(last)
                if cand is None or not (ranked := rank(cand, h100)):
                    continue
                best = ranked[0].estimate.time_s * (1 + 1e-9)
                assert floor(subset) <= best, cand.dumps()
                for state, left in ((first, 2), (middle, 1)):
                    assert left * ks.floors.launch_s + ks.floors.spent(state) + ks.floors.owed(state)(()) / ks.floors.bandwidth <= best
                ratios.append(best / floor(subset))
    assert len(ratios) >= 10
    assert spec != "gqa" or min(ratios) < 2.0, min(ratios)


def test_a_first_kernel_that_cannot_beat_the_bound_is_cut_before_its_block_graphs(h100, monkeypatch):
    """rmsnorm_mlp at its published shape: a graph of two kernels whose first reads X and one
    weight reads the other weight in its second and launches twice, so the floor of its first
    kernel (`Floors.middle_floor`, known from what it reads) is above the winner's time. Such a choice
    is cut before its first kernels are generated and ranked (a second each, for nothing), and
    the floor is below every candidate grown through such first kernels."""
    ks = with_floors("rmsnorm_mlp", h100)
    floor = ks.floors.middle_floor(ks.initial(), 1)((0, 1))
    times = []
    for first in itertools.islice(ks._graph_moves(ks.initial(), False, only=(0, 1)), 12):
        for last in itertools.islice(ks.moves(first, final=True), 3):
            if (cand := ks._candidate(last)) is not None and (ranked := rank(cand, h100)):
                times.append(ranked[0].estimate.time_s * (1 + 1e-9))
    assert len(times) >= 5 and floor <= min(times), (floor, min(times))

    def generated(*args):
        raise AssertionError("the first kernels of a choice cut by the bound were generated")

    ks.floors.bound_s = 24.56e-6  # just above the winner's estimate
    assert floor > ks.floors.bound_s
    monkeypatch.setattr(ks, "first_kernels", generated)
    bounded = ks.floors.bounded
    assert list(ks.candidates_in(2, ("graph", (0, 1)))) == []
    assert ks.floors.bounded == bounded + 1
    # Reading X, Wu and Wg, the first kernel may do all the work, and its own floor is no cut; but
    # what it writes must be a program value (f16), and whatever it writes, its 64 MiB of weights and
    # a second launch exceed the bound (`ValuePaths.after`): the first kernel alone is the winner.
    list(ks.candidates_in(2, ("graph", (0, 1, 2)), firsts=[]))
    assert ks.floors.bounded == bounded + 2
    assert ks.floors.cuts["first kernel's inputs"] >= 2


def test_kernels_cut_by_what_is_known_are_cut_without_being_analyzed(h100, monkeypatch):
    """Before a state's kernels are analyzed for their least times (`Floors.spent`), the bound asks
    what is known without that (`Floors.known_spent`: kept least times, else launch and bytes), which is
    never above it: the same graphs are cut and the same candidates come, with fewer analyses
    (attention at its published shape with the winner's time as the bound: a middle kernel
    writing a tensor the last kernel must read again is cut by its bytes alone)."""

    def search(known: bool) -> tuple[list[str], int, int]:
        program = workloads.resolve("gqa")
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3), target=h100)
        ks.floors.bound_s = 12.3e-6  # just above the winner's estimate (12.23 us)
        ks.floors.paths = None  # (the value paths cut these middle kernels before any is built)
        analyzed = []
        prefix, spent = ks.floors._prefix, ks.floors.spent

        def counted(s):
            analyzed.append(s)
            return prefix(s)

        def checked(s):
            least = spent(s)
            assert ks.floors.known_spent(s) <= least * (1 + 1e-12)
            return least

        monkeypatch.setattr(ks.floors, "_prefix", counted)
        monkeypatch.setattr(ks.floors, "spent", checked)
        if not known:
            monkeypatch.setattr(ks.floors, "known_spent", lambda s: 0.0)
        found = [sg.dumps() for sg in ks.candidates()]
        return found, ks.floors.bounded, len(analyzed)

    found, bounded, analyses = search(known=True)
    found_before, bounded_before, analyses_before = search(known=False)
    assert found and found == found_before and bounded == bounded_before
    assert analyses < analyses_before, (analyses, analyses_before)


def test_middle_kernels_over_program_inputs_are_bounded_by_their_least_time_once_known(h100, monkeypatch):
    """A middle kernel reading program inputs only is the same after every first kernel: once its
    moves were generated twice, the least time of all of them is kept (`Floors.middle_least`), and it
    bounds that subset before its block graphs are generated again. Attention at its published
    shape, the winner's time as the bound: the same candidates under the bound come, from fewer
    states; the kept least time binds above `middle_own`, and every candidate grown through such
    a middle kernel takes at least the middle floor."""

    def search(kept: bool) -> tuple[KernelSearch, set[str]]:
        program = f32_workload("gqa")  # f32: where a middle kernel may hand on partial sums
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3), target=h100)
        ks.floors.bound_s = 17.6e-6  # just above the winner's estimate (17.597 us)
        if not kept:
            monkeypatch.setattr(ks.floors, "middle_key", lambda s, subset, part: None)
        under = {sg.dumps() for sg in ks.candidates()
                 if (ranked := rank(sg, h100)) and ranked[0].estimate.time_s <= ks.floors.bound_s}
        return ks, under

    ks, found = search(kept=True)
    before, found_before = search(kept=False)
    assert found and found == found_before
    assert ks.total_states < before.total_states and not before.floors.middle_least
    start = ks.initial()
    first = next(f for f in ks._graph_moves(start, False, only=(0, 1)) if len(f.tensors) == 4)
    binding = [(subset, least) for (subset, level, _, part), least in ks.floors.middle_least.items()
               if level == 1 and part == (1, 0) and least > ks.floors.middle_own(first, subset) * 1.01]
    assert binding, ks.floors.middle_least
    floor = ks.floors.middle_floor(first, 1)
    ks.floors.bound_s = float("inf")  # every middle and last kernel, to check the floor against
    checked = 0
    for subset, least in binding:
        for middle in itertools.islice(ks._graph_moves(first, False, only=subset), 20):
            own = ks.floors.least_alone(first, middle.kernels[-1], middle.tensors[len(first.tensors):])
            assert least <= own, middle.kernels[-1]
            for last in itertools.islice(ks.moves(middle, final=True), 3):
                cand = ks._candidate(last)
                if cand is not None and (ranked := rank(cand, h100)):
                    assert floor(subset) <= ranked[0].estimate.time_s * (1 + 1e-9), cand.dumps()
                    checked += 1
    assert checked >= 3


@pytest.mark.parametrize("spec", ["gqa:ci", "gqa"])
def test_a_middle_kernel_leaving_the_last_more_to_read_than_a_library_op_takes_is_bounded_by_its_graph(
        h100, spec):
    """After a first kernel over Q and K writing exp(Q K), a middle kernel that reads neither it
    nor V leaves the last kernel three tensors to read (those two and the middle's output, or
    the middle would not contribute): no library op takes three, so the last is a graph kernel
    writing O, whose grid splits only O's classes and reads exp(Q K) or V again per block along
    the others (`_last_after`, `_whole_floor`). That floor binds well above what the tensors'
    bytes alone give, and every candidate grown through such a middle kernel takes at least
    as long."""
    ks = with_floors(spec, h100, "f32")
    start = ks.initial()
    q, k, v = range(3)
    exp_qk = next(f for f in ks._graph_moves(start, False, only=(q, k))
                  if len(f.tensors) == 4 and f.tensors[3].ae[0] == "exp" and f.tensors[3].chunk is None)
    floor, last = ks.floors.middle_floor(exp_qk, 1), ks.floors._last_after(exp_qk)
    assert last is not None
    moved = ks.floors.owed(exp_qk)((q, k)) / ks.floors.bandwidth  # what the kernels after it must move, at full bandwidth
    assert last((q, k)) - ks.floors.launch_s > 1.5 * moved, (last((q, k)), moved)
    # The last kernel may be a library op here (a matmul of a middle output and V, or of the
    # middle's output and exp(Q K)): then it is bounded by its launch and what it must move.
    assert ks.floors.launch_s < last((q, k, v)) < last((q, k)) and ks.floors.launch_s < last((k, 3)) < last((q, k))
    checked = 0
    for middle in ks._graph_moves(exp_qk, False, only=(q, k)):
        for end in itertools.islice(ks.moves(middle, final=True), 3):
            cand = ks._candidate(end)
            if cand is None or not (ranked := rank(cand, h100)):
                continue
            assert isinstance(end.kernels[-1], GraphKernel)
            assert floor((q, k)) <= ranked[0].estimate.time_s * (1 + 1e-9), cand.dumps()
            checked += 1
        if checked >= 5:
            break
    assert checked >= 5


@pytest.mark.parametrize("spec", ["gqa", "lora", "rmsnorm_mlp:ci"])
def test_middle_kernel_own_floor_is_below_every_middle_kernel_over_its_inputs(h100, spec):
    """A kernel that is not the last may write partial results, so its grid may split any class
    of what it reads (`middle_own`: `whole_reduction_floor` over every class): its floor is at
    most the cost model's least time of every middle kernel the search builds over those tensors,
    and it binds beyond the inputs' bytes at full bandwidth: splitting the grid enough to keep
    the DRAM pipe full re-reads the inputs that lack a split class."""
    ks = with_floors(spec, h100, "f32")
    checked, tighter = 0, 0
    for first in sample_first_kernels(ks, depth=3, choices=3, each=3):
        index = {t.id: n for n, t in enumerate(first.tensors)}
        for middle in itertools.islice(ks._graph_moves(first, False), 60):
            subset = tuple(sorted(index[t] for t in middle.kernels[-1].tensor_inputs))
            own = ks.floors.middle_own(first, subset)
            assert ks.floors.spent(first) + own <= ks.floors.spent(middle) * (1 + 1e-9), middle.kernels[-1]
            read = sum(ks.floors._bytes(first.tensors[i]) for i in subset) / ks.floors.bandwidth
            tighter += own > ks.floors.launch_s + max(read, ks.floors.iteration_s) * 1.01
            checked += 1
    assert checked >= 60 and tighter >= 10, (checked, tighter)


@pytest.mark.parametrize("spec", ["rmsnorm_mlp:ci", "gqa:ci", "gqa", "lora:ci", "scripts/programs/attention_projections.json"])
def test_a_kernels_grid_floor_is_below_its_least_estimate(h100, spec):
    """A kernel is cut by the floor of its own grid (`_grid_floor`: the bytes its axes make its
    blocks read), before its prefix is analyzed, when that floor and what must follow exceed the
    bound: a first kernel (`Floors.ranked_first`), a later one (`Floors.known_spent`). The floor is at most
    the cost model's least estimate of the kernel at any sizes (`_floors`), partials, transposed
    reads and side-by-side axes (the Q, K and V projections of one X) included; and it binds:
    for some kernels it is above the bytes they move at full bandwidth."""
    program = load_program(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ks.floors.bound_s = 1.0
    checked = tighter = later = 0

    def check(state) -> None:
        nonlocal checked, tighter
        kernel = state.kernels[-1]
        grid = ks.floors._grid_floor(state, kernel)
        if (prefix := ks.floors._prefix(state)) is None or not (least := ks.floors._floors(state, *prefix, kernel)):
            return
        assert grid <= min(least.values()) * (1 + 1e-9), (grid, least, prefix[0].dumps())
        size = {t.id: ks.floors._bytes(t) for t in state.tensors}
        tighter += grid > ks.floors._moving_s(kernel, size) * 1.01
        checked += 1

    for choice in [c for c in ks.first_choices(2) if c[0] == "graph"]:
        for n, first in enumerate(itertools.islice(ks._graph_moves(ks.initial(), False, only=choice[1]), 60)):
            check(first)
            for second in itertools.islice(ks._graph_moves(first, False), 10 if n % 10 == 0 else 0):
                later += 1
                check(second)
    assert checked >= 10 and tighter >= 5 and later >= 10, (checked, tighter, later)


@pytest.mark.parametrize("spec", ["rmsnorm_mlp:ci", "gqa:ci", "gqa", "lora:ci"])
def test_a_block_graphs_tiled_floor_is_below_the_grid_floor_of_every_kernel_it_tiles_into(h100, spec, monkeypatch):
    """A first or middle kernel's block graph is cut before its tilings are searched when the
    floor of them all (`Floors.tiled_floor`: `_grid_floor` over every axis they may take, partial-result
    axes included) and what must follow exceed the bound. That floor is at most the grid floor of
    each kernel the block graph tiles into, and the second value it returns is what the kernel
    writes; it binds: for most kernels it is the grid floor (within 0.1%)."""
    program = in_f32(load_program(spec))
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ks.floors.bound_s = 1.0  # finite, so the floors are computed, and large, so nothing is cut
    tiled_from = []  # the block graph of each kernel `resolve` makes, in order
    resolve = kernel_module.resolve

    def recording(block, *args, **kwargs):
        for res in resolve(block, *args, **kwargs):
            tiled_from.append(block)
            yield res

    monkeypatch.setattr(kernel_module, "resolve", recording)
    checked, tight, partials = [0, 0], [0, 0], 0

    def check(before, after, place: int) -> None:
        nonlocal partials
        if (tiled := ks.floors.tiled_floor(before, after.last_key[1], tiled_from[-1])) is None:
            return
        grid = ks.floors._grid_floor(after, after.kernels[-1])
        new = after.tensors[len(before.tensors):]
        assert tiled[0] <= grid * (1 + 1e-9), (tiled, grid, after.kernels[-1])
        assert tiled[1] == pytest.approx(sum(map(ks.floors._bytes, new)))
        checked[place] += 1
        tight[place] += tiled[0] >= grid * 0.999
        partials += any(t.chunk is not None for t in new)

    for choice in [c for c in ks.first_choices(2) if c[0] == "graph"][:3]:
        for first in itertools.islice(ks._graph_moves(ks.initial(), False, only=choice[1], first=True), 60):
            check(ks.initial(), first, 0)
    for first in itertools.islice(sample_first_kernels(ks, 3, choices=3, each=30), 0, None, 3):
        for second in itertools.islice(ks._graph_moves(first, False, later=1), 100):
            check(first, second, 1)
    assert min(checked) >= 10 and all(n >= c // 2 for n, c in zip(tight, checked, strict=True)), (checked, tight)
    if spec.startswith("gqa"):
        assert partials >= 5, partials  # flash-decoding partials: the tilings' partial axes are floored too


@pytest.mark.parametrize("spec", ["gqa", "gqa:ci"])
def test_chunk_merge_floors_are_below_every_candidate_that_merges_later(h100, spec):
    """A first kernel writing per-chunk partials is bounded together with the kernel that will
    merge them, at the chunk count they share (the merge's loop walks the chunks). Those bounds,
    the one checked before growing a state (`Floors.merged_later` plus the launches to come) and the
    one checked before a last kernel's block graphs (`Floors.last_graph_floor`), are at most the cost
    model's best time of every candidate grown from the state, at two and three kernels; and at
    the published shape they bind: some candidate is within 2x of them."""
    ks = with_floors(spec, h100, "f32")
    start = ks.initial()
    inputs = tuple(range(len(start.tensors)))
    chunked = [f for f in ks._graph_moves(start, False, only=inputs) if any(t.chunk for t in f.tensors)]
    ratios = []

    def check(before: list, last) -> None:
        cand = ks._candidate(last)
        if cand is None or not (ranked := rank(cand, h100)):
            return
        best = ranked[0].estimate.time_s
        first = before[0]
        left = len(last.kernels) - 1
        bound = left * ks.floors.launch_s + ks.floors.merged_later(first, lambda c: c * ks.floors.iteration_s)
        prev = before[-1]
        index = {t.id: n for n, t in enumerate(prev.tensors)}
        subset = tuple(sorted(index[t] for t in last.kernels[-1].tensor_inputs))
        floor = ks.floors.last_graph_floor(prev, ks.floors.spent(prev), subset, ks.floors.missing(prev))
        assert max(bound, floor) <= best * (1 + 1e-9), cand.dumps()
        ratios.append(best / max(bound, floor))

    for first in chunked[:12]:
        for last in itertools.islice(ks._graph_moves(first, True), 30):
            check([first], last)
        for mid in itertools.islice(ks.moves(first), 6):
            for last in itertools.islice(ks._graph_moves(mid, True), 3):
                check([first, mid], last)
    assert len(ratios) >= 15
    assert spec != "gqa" or min(ratios) < 2.0, min(ratios)
