"""Shrinking programs for the numeric checks: reshapes keep their products, and a check at the
small shapes refutes exactly what a check at the real shapes refutes."""

from __future__ import annotations

from kernel_shapes import attention_block

from superopt import Program
from superopt.assignments import pick_for_checks
from superopt.config import SearchConfig
from superopt.instantiate import instantiate
from superopt.mutations import mutants
from superopt.search.driver import Searcher
from superopt.shrink import shrink, shrink_sgraph
from superopt.targets import TARGETS
from superopt.verifier import finite_field
from superopt.verifier.verify import verify

H100 = TARGETS["h100"]


def _shapes(p: Program, ops: tuple[str, ...] = ("input", "reshape")) -> dict[str, tuple[int, ...]]:
    return {n.id: n.shape for n in p.topological() if n.op in ops}


def test_heads_split_by_reshapes_shrink_to_few_small_heads():
    """The heads and head dim shrink on their own and the projection width is their product: 16
    heads of 128 over (512, 2048) become 8 heads of 16 over (64, 32), every class at a size of its
    own (16 heads of 16 over (32, 32) checked heads as wide as the head count and rows as wide as X)."""
    small = shrink(attention_block(512, 2048, 16))
    assert _shapes(small) == {
        "X": (64, 32), "Wq": (32, 128), "Wk": (32, 128), "Wv": (32, 128), "Wo": (128, 32),
        "reshape_2": (64, 8, 16), "reshape_7": (64, 8, 16), "reshape_10": (64, 8, 16), "reshape_18": (64, 128),
    }
    assert small.validate() is small


def test_reshapes_that_regroup_or_disagree_leave_the_program_as_it_is():
    regroup = Program("regroup")
    regroup.output(regroup.exp(regroup.reshape(regroup.input("X", (6, 4)), (4, 6))))
    assert shrink(regroup) is regroup
    # 256 as 16 x 16 and as 2 x 128, parts of different sizes kept apart: 8 x 8 = 64 and 2 x 16 = 32
    # (16 x 16 and 2 x 8 in ascending order): no one small size for X's dim
    twice = Program("twice")
    x = twice.input("X", (64, 256))
    twice.output(twice.reshape(x, (64, 16, 16)), twice.reshape(x, (64, 2, 128)))
    assert shrink(twice) is twice
    # made the same way twice, they agree: X shrinks
    same = Program("same")
    x = same.input("X", (64, 64))
    same.output(same.reshape(x, (64, 8, 8)), same.exp(same.reshape(x, (64, 8, 8))))
    assert _shapes(shrink(same)) == {"X": (32, 64), "reshape_1": (32, 8, 8), "reshape_2": (32, 8, 8)}


def _split_schedule(p: Program):
    searcher = Searcher(p, H100, SearchConfig())
    return searcher.views.unfold(searcher.search.program_split()[0])


def test_an_attention_block_is_verified_at_small_shapes():
    """Its split schedule (library reshapes and transposes between graph kernels) is checked at
    the shrunk shapes, reshapes resized, not at the real ones (a weight of 1024 x 1024 is over
    what `verify` checks at real shapes)."""
    p = attention_block(256, 1024, 8)
    v = verify(p, _split_schedule(p), target=H100)
    assert v.proved, v.egraph_reason
    checked = [layer["detail"]["shapes"] for layer in v.layers if layer["layer"] in ("finite_field", "float")]
    assert checked and all(s["X"] == [64, 32] and s["Wq"] == [32, 128] for s in checked)
    assert v.shapes_checked == [checked[0]]


def test_small_shape_checks_refute_the_mutants_the_real_shapes_refute():
    """Every mutant of a split attention block: finite fields at the shrunk shapes (heads of 16)
    pass exactly when they pass at the real shapes (heads of 32)."""
    p = attention_block(32, 64, 2)
    small = shrink(p)
    assert _shapes(small)["reshape_2"] == (16, 2, 16)
    compared = refuted = 0
    for what, mut in mutants(_split_schedule(p), p):
        small_mut = shrink_sgraph(mut, p, small)  # None: a reshape of a tensor the mutant sizes wrongly
        at_small = [] if small_mut is None else pick_for_checks(small_mut, H100, 1, pool=50)
        at_real = pick_for_checks(mut, H100, 1, pool=50)
        if small_mut is None or not at_small or not at_real:
            continue
        small_ok = finite_field.check(small, instantiate(small_mut, at_small[0], H100)).passed
        real_ok = finite_field.check(p, instantiate(mut, at_real[0], H100)).passed
        assert small_ok == real_ok, what
        compared, refuted = compared + 1, refuted + (not real_ok)
    assert compared >= 20 and refuted >= 10, (compared, refuted)
