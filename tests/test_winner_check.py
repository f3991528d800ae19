"""The generated-program scripts' independent check (scripts/winner_check.py): its numpy
evaluation agrees with the reference evaluator on every op, a searched winner of a program written
here passes it at small and real shapes, and wrong schedules (mutants of that winner) fail it."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_harness import runner
from scripts_loader import load_script

from superopt import Program
from superopt.config import SearchConfig
from superopt.mutations import mutants
from superopt.reference import evaluate, random_inputs
from superopt.search.driver import run_search

check = load_script("winner_check")


def _every_op() -> Program:
    """Every op the numpy evaluation defines, on small random shapes."""
    p = Program("every_op")
    x, w = p.input("X", (2, 6, 8), "f32"), p.input("W", (2, 8, 4), "f32")
    t = x
    for op in ("neg", "exp", "square", "relu", "sigmoid", "silu", "gelu"):
        t = p.op(op, t)
    t = p.op("rsqrt", p.op("add", p.op("sqrt", p.op("exp", t)), 1.0))
    t = p.softmax(p.rms_norm(t, -1, 1e-5), 1)
    y = p.op("matmul", p.op("sub", t, p.op("mean", x, dim=-1, keepdim=True)), w)
    y = p.op("div", y, p.op("max", p.op("exp", y), dim=1, keepdim=True))
    z = p.reshape(p.transpose(y, (0, 2, 1)), (2, 24))
    p.output(z, p.op("mul", p.op("sum", y, dim=-1), 0.5))
    return p


def test_the_numpy_evaluation_agrees_with_the_reference_evaluator_on_every_op():
    p = _every_op()
    inputs = random_inputs(p, 5)
    for got, want in zip(check.numpy_outputs(p, inputs), evaluate(p, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def _gated_projection() -> Program:
    """A user's block: rms_norm, a product, a bias, gelu, gated by the sigmoid of a second product."""
    p = Program("gated_projection")
    x = p.rms_norm(p.input("X", (64, 128), "f16"), -1, 1e-6)
    up = p.op("gelu", p.op("add", p.op("matmul", x, p.input("W", (128, 96), "f16")), p.input("B", (1, 96), "f16")))
    p.output(p.op("mul", up, p.op("sigmoid", p.op("matmul", x, p.input("G", (128, 96), "f16")))))
    return p


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
def test_a_winner_passes_and_its_mutants_fail(h100):
    program = _gated_projection()
    sg = run_search(program, h100, SearchConfig(), max_states=2_000).best.sgraph
    assert len(sg.kernels) < 4, "the search should fuse some of the six ops"
    passed = check.check_winner(program, sg, seed=3)
    assert not isinstance(passed, str) and passed.shapes == "small" and passed.ok, passed
    # Ops changed, inserted or dropped change the values at every size; a changed map or
    # accumulator may not at the sizes checked (a loop of one iteration), so those are left out.
    changed = [(what, m) for what, m in mutants(sg, program)
               if not any(word in what for word in ("imap", "fmap", "omap", "accumulator"))]
    assert len(changed) >= 10
    for what, mutant in changed[::3]:
        outcome = check.check_winner(program, mutant, seed=3)
        assert not isinstance(outcome, str) and not outcome.ok, (what, outcome)


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
def test_a_program_that_cannot_shrink_is_checked_at_its_real_shapes(h100):
    p = Program("tiny")
    p.output(p.op("silu", p.op("matmul", p.input("X", (4, 8), "f32"), p.input("W", (8, 4), "f32"))))
    outcome = check.check_winner(p, run_search(p, h100, SearchConfig()).best.sgraph, seed=1)
    assert not isinstance(outcome, str) and outcome.ok, outcome
