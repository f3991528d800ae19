"""The block graph generator: its walk, its pruning and the values one block graph computes."""

from __future__ import annotations

import pytest
from search_helpers import graph_kernels, ops_of, tile_ops

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search.block import Generator, InputSpec
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def test_pruning_keeps_every_reference_block_graph(h100):
    """The generator, with the oracle pruning, produces the reference's block graph (up to naming)
    for every single-kernel reference: pruning never cuts its prefixes."""
    for name in ("rmsnorm_matmul", "gated_mlp", "rmsnorm_mlp", "ntrans"):
        program, ref = workloads.reference_for(f"{name}:ci")
        (k,) = graph_kernels(ref)
        want = (ops_of(k, "body"), sorted(a.kind for a in k.block.accumulators), ops_of(k, "post"))
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig())
        specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]
        gen = Generator(space_of(program), ks.oracle, len(k.block.body) + len(k.block.post))
        seen = set()
        for s in gen.complete_graphs(gen.start(specs)):
            body = sorted(tile_ops(t for t in s.tiles if t.phase == 0 and t.op != "input"))
            post = sorted(tile_ops((t for t in s.tiles if t.phase == 1 and t.op != "acc"), consts=True))
            seen.add((tuple(body), len([t for t in s.tiles if t.op == "acc"]), tuple(post)))
        assert (tuple(want[0]), len(want[1]), tuple(want[2])) in seen, name


def test_generator_respects_op_budget():
    program = workloads.resolve("rmsnorm_matmul:ci")
    gen = Generator(space_of(program), Oracle(program), 3)
    specs = [InputSpec(0, (4, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    for s in gen.complete_graphs(gen.start(specs)):
        assert s.nops <= 3


def _every_step(gen: Generator, s, phase: int):
    """Every one-operand op on every tile and every binary op on every ordered pair of the
    phase's tiles (add and mul with their older operand first), each with its place in the
    generation order (by first operand; its one-operand ops, then its pairs by second operand
    and op): what a walk that remembers nothing tries."""
    mine = [k for k, t in enumerate(s.tiles) if t.phase == phase]
    for i in mine:
        admitted, rejected = gen._single_ops(s.tiles[i])
        for n, (op, _, attrs, consts) in enumerate(admitted):
            yield (i, 0, n), (op, (i,), attrs, consts)
        for op, _, attrs, consts in rejected:
            yield (i, 0, len(admitted)), (op, (i,), attrs, consts)  # never a child
        for j in mine:
            for op in gen._binary_ops:
                if not (j < i and op in ("add", "mul")):
                    yield (i, 1, j, gen._rank[op]), (op, (i, j), (), ())


def _tiles(s) -> tuple:
    """A state's tiles without their interned ids (each generator numbers expressions as it meets them)."""
    return tuple(t._replace(aid=-1, vid=-1) for t in s.tiles)


def _naive_walk(gen: Generator, start, phase: int, budget: int) -> list:
    walked, frontier = [], [((), start)]
    while frontier:
        level = []
        for path, s in frontier:
            walked.append((path, s))
            if s.nops >= budget:
                continue  # every op would pass the budget: none is tried
            steps = [step for _, step in sorted(_every_step(gen, s, phase), key=lambda e: e[0])]
            children = [c for step in steps if (c := gen._try(s, *step)) is not None and c.nops <= budget]
            level += [((*path, n), c) for n, c in enumerate(children)]
        frontier = level
    return walked


def _walked(states: list) -> list:
    return [(path, _tiles(s)) for path, s in states]


@pytest.mark.parametrize(("spec", "budget"), [("rmsnorm_mlp:ci", 10), ("qknorm_gqa:ci", 8)])
def test_block_walk_equals_trying_every_op_on_every_state(spec, budget):
    """The walk skips the operand pairs whose ops the oracle rejects (memoized per operand
    values) and the ops the canonical order forbids, and counts what it skips as `_try` would:
    in the loop body and after the loop, it reaches exactly the states, in the same order, and
    counts exactly the pruned ops, of trying every op on every state with `_try`."""
    program = workloads.resolve(spec)
    oracle = Oracle(program)
    ks = KernelSearch(program, space_of(program), oracle, SearchConfig())
    specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]
    walk, naive = Generator(space_of(program), oracle, budget), Generator(space_of(program), oracle, budget)
    bodies = list(walk._phase(walk.start(specs), 0, budget))
    naive_bodies = _naive_walk(naive, naive.start(specs), 0, budget)
    assert _walked(bodies) == _walked(naive_bodies)
    assert walk.pruned == naive.pruned and len(bodies) > 1000
    accumulated = [pair for (_, body), (_, same) in zip(bodies[::50], naive_bodies[::50], strict=True)
                   for pair in zip(walk._with_accumulators(body), naive._with_accumulators(same), strict=True)]
    for accs, same in accumulated[:20]:
        assert _walked(walk._phase(accs._replace(nops=0), 1, 4)) == _walked(_naive_walk(naive, same._replace(nops=0), 1, 4))
    assert walk.pruned == naive.pruned and len(accumulated) >= 20


def test_a_block_graph_never_computes_one_value_twice():
    """(X·c)@W and X@(W·c) are one value under the target's axioms: each is generated, but no
    block graph computes both (same e-class, same dims, same phase)."""
    p = Program("scaled")
    x, w = p.input("X", (4, 64), "f32"), p.input("W", (64, 48), "f32")
    p.output(p.exp((x * 0.25) @ w))
    oracle = Oracle(p)
    gen = Generator(space_of(p), oracle, 5)
    specs = [InputSpec(0, (4, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    scaled = oracle.class_of(oracle.alg.matmul(oracle.alg.mul(oracle.alg.const(0.25), (("inp", "X"), (0, 1))),
                                               (("inp", "W"), (1, 2)))[0])
    forms = set()
    for s in gen.complete_graphs(gen.start(specs)):
        values = [(t.phase, oracle.class_of(t.ae), tuple(s.classes.find(d) for d in t.dims))
                  for t in s.tiles if t.op not in ("input", "acc")]
        assert len(values) == len(set(values)), [t.op for t in s.tiles]
        forms |= {t.ae for t in s.tiles if t.op not in ("input", "acc") and oracle.class_of(t.ae) == scaled}
    assert scaled is not None and len(forms) == 2


def test_an_empty_loop_body_is_accumulated_only_over_tied_inputs():
    """With untied inputs, an empty loop body only loads them and the post-loop graph does all the
    work: the same graph in the body with no loop (a tiling the symbolic search always has) covers
    it, so no block graph has an empty body.
    Over inputs tied to a chunk axis (merging partial results) the accumulators sum the chunks:
    such graphs are kept."""
    program = workloads.resolve("rmsnorm_matmul:ci")
    gen = Generator(space_of(program), Oracle(program), 4)
    untied = [InputSpec(0, (4, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    graphs = list(gen.complete_graphs(gen.start(untied)))
    assert graphs and all(any(t.phase == 0 and t.op != "input" for t in s.tiles) for s in graphs)
    tied = [InputSpec(0, (4, 8), ("inp", "X"), (0, 1), tied_dim=1)]
    assert any(s.nops == 0 for s in gen._with_accumulators(gen.start(tied)))
    # A concrete (Mirage-style) search fixes the loop before the graph: all its graphs stay.
    fixed_loop = Generator(space_of(program), Oracle(program), 4, no_loop_tilings=False)
    every = list(fixed_loop.complete_graphs(fixed_loop.start(untied)))
    assert any(all(t.phase == 1 or t.op == "input" for t in s.tiles) for s in every)
    assert len(every) > len(graphs)


def test_loop_bodies_walked_in_parts_rebuild_the_whole_walk():
    """Distributed search walks a block space's loop bodies in parts and hands them to every graph
    shard, which rebuilds those of its own part: it then completes exactly the block graphs, in
    the same order, that a generator walking every body itself completes for that part, though
    each walk part walked only its share."""
    program = workloads.resolve("rmsnorm_mlp:ci")
    oracle = Oracle(program)
    ks = KernelSearch(program, space_of(program), oracle, SearchConfig())
    specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]

    def graphs(gen: Generator, part: tuple[int, int]) -> list[list[tuple]]:
        return [[(t.op, t.args, t.attrs, t.consts, t.dims, t.ae) for t in s.tiles]
                for s in gen.complete_graphs(gen.start(specs), part)]

    walks = []
    for i in range(3):
        gen = Generator(space_of(program), oracle, 6)
        walks.append(gen.body_part(gen.start(specs), (3, i)))
    whole = Generator(space_of(program), oracle, 6)
    n_bodies = sum(1 for _ in whole._accumulated(whole.start(specs)))
    assert all(0 < len(w) < n_bodies for w in walks)
    for part in ((2, 0), (2, 1)):
        adopted = Generator(space_of(program), oracle, 6)
        adopted.adopt_bodies(adopted.start(specs), [b for w in reversed(walks) for b in w], part)
        assert graphs(adopted, part) == graphs(whole, part)
