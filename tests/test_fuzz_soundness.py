"""The soundness fuzzer (scripts/fuzz_soundness.py): its judge catches a prover that proves a
schedule right only at some sizes, its mutations make such schedules, and a seeded slice of its
random pairs finds no wrong proof."""

from __future__ import annotations

from scripts_loader import load_script

from superopt import Program
from superopt.build import SGraphBuilder
from superopt.dimclasses import dim_classes
from superopt.sgraph import input_decls, rebind

fuzz = load_script("fuzz_soundness")
SLICE_PAIRS = 600  # about a minute on one core


def _never(program, sgraph) -> bool:
    return False


def test_a_prover_that_proves_the_known_bad_pair_is_reported_wrong():
    """sum(X) + sum(Y + (1 + 1)) for sum(X + 1) + sum(Y + 1), X and Y of different widths: a
    prover that proves it (as the stub proving everything does) is caught by the numbers."""
    j = fuzz.judge(fuzz.known_bad_case(), lambda program, sgraph: True)
    assert j.proved and j.wrong_proved
    assert j.mismatch.sizing == 0 and "differ" in j.mismatch.detail


def test_the_known_bad_pair_is_judged_wrong_by_numbers_at_every_sizing():
    """With the real prover (whatever it says), exact numbers refute the pair at each sizing
    alone; the pair is wrong-proved exactly when the prover proves it."""
    case = fuzz.known_bad_case()
    j = fuzz.judge(case, fuzz.EgraphProver())
    assert j.mismatch is not None and j.wrong_proved == j.proved
    for i, program in enumerate(case.programs):
        sg = rebind(case.sgraph, input_decls(program))
        assert fuzz.judge(fuzz.Case((program,), sg, case.origin), _never).mismatch is not None, i


def test_the_right_schedule_of_the_known_program_agrees_at_every_sizing():
    """The numbers raise no false alarm: the schedule that adds each 1 in its own row sum agrees
    at all three sizings (and is proved)."""
    programs = fuzz.known_bad_case().programs
    right = fuzz.fused(programs[0], dim_classes(programs[0])[("X", 0)], None)
    j = fuzz.judge(fuzz.Case(programs, right, "right"), fuzz.EgraphProver())
    assert j.mismatch is None and j.checked == len(programs) and j.proved


def test_hops_make_schedules_that_are_right_only_where_the_widths_agree():
    """The fuzzer's own mutations reach the known bad pair's class: moving an operand between the
    row sums of the right schedule gives a schedule that exact numbers refute when X and Y differ
    in width and accept when they are equally wide."""
    programs = fuzz.known_bad_case().programs
    right = fuzz.fused(programs[0], dim_classes(programs[0])[("X", 0)], None)
    equal = fuzz.known_program(4, 8, 8)
    hops = [m for what, m in fuzz.size_mutants(right, programs[0]) if "moved into" in what]
    size_only = [m for m in hops
                 if fuzz.judge(fuzz.Case(programs, m, ""), _never).mismatch is not None
                 and fuzz.judge(fuzz.Case((equal,), rebind(m, input_decls(equal)), ""), _never).mismatch is None]
    assert size_only, [m.dumps() for m in hops]


def _softmax_shifted_by_exp_of_max() -> tuple[Program, object]:
    """softmax(X) @ W, and a kernel subtracting exp(max(X)) instead of max(X) before the exp:
    the same values (a softmax is unchanged by any shift constant along its row), but an exp of
    a value that went through exp is outside the finite field's exact fragment."""
    p = Program("shifted_softmax")
    p.output(p.op("matmul", p.softmax(p.input("X", (3, 6), "f16"), -1), p.input("W", (6, 9), "f16")))
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx"), ("y", "gy")])
    x = k.input("X", [0, None], None)
    e = k.op("exp", k.op("sub", x, k.op("exp", k.op("max", x, dim=1, keepdim=True))))
    out = k.op("div", k.op("matmul", e, k.input("W", [None, 1], None)), k.op("sum", e, dim=1, keepdim=True))
    k.output(k.acc(out), "O", [0, 1])
    return p, b.build(["O"])


def test_a_field_only_difference_is_no_wrong_proof():
    """Where finite fields differ but float64 agrees (their model of exp of exp is not exp), the
    pair is counted apart, not as wrong-proved; the e-graph proves it (exp(x - c) = exp(x) / exp(c),
    cancelled in the quotient)."""
    program, sg = _softmax_shifted_by_exp_of_max()
    j = fuzz.judge(fuzz.Case((program,), sg, "shifted"), fuzz.EgraphProver())
    assert j.proved and j.field_only and j.mismatch is None and not j.wrong_proved


def test_a_recorded_wrong_proof_is_judged_again_by_replay(tmp_path):
    """`--replay` reads what `--json` wrote: the known bad pair, recorded as wrong-proved under
    the stub, is wrong-proved again under it and refuted by numbers under any prover."""
    case = fuzz.known_bad_case()
    s = fuzz.Summary()
    s.add(fuzz.PairResult(True, True, 1, reproduction=fuzz.reproduction(case, fuzz.judge(case, lambda p, sg: True))))
    fuzz.write_json(tmp_path / "run.json", 0, s)
    [(origin, j)] = fuzz.replay(tmp_path / "run.json", lambda p, sg: True)
    assert origin == case.origin and j.wrong_proved
    [(_, j)] = fuzz.replay(tmp_path / "run.json", _never)
    assert j.mismatch is not None and not j.wrong_proved


def test_a_seeded_slice_finds_no_wrong_proof():
    """A slice of the fuzzer's random pairs: none is proved by the e-graph while exact numbers
    differ, and the slice exercises both sides (proofs made, wrong schedules refused)."""
    s = fuzz.run(seed=0, pairs=SLICE_PAIRS)
    assert s.pairs == SLICE_PAIRS and s.errors == 0, s.error_messages
    assert s.proved >= 30 and s.numeric_differ >= 30 and s.unchecked < s.pairs // 10, s.counts()
    wrong = [f"{c['program']['name']}: {c['origin']}: {c['finite_field']}" for c in s.cases]
    assert not wrong, "\n".join(wrong)
