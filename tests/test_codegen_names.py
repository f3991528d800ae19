"""Kernel parameters are named after their tensors, within safety: only letters, digits and `_` of a
name reach the code, behind a prefix no keyword, built-in or generator-made identifier has, and two
names that reduce alike stay apart. Checked by nvcc (sm_90) and by the CPU harness."""

from __future__ import annotations

import re

import numpy as np
import pytest
from cuda_harness import runner
from hypothesis import given
from hypothesis import strategies as st

from superopt import workloads
from superopt.build import SGraphBuilder
from superopt.codegen import generate
from superopt.codegen.names import param_names
from superopt.codegen.nvcc import compile_report, nvcc_path
from superopt.costmodel import best_params
from superopt.instantiate import instantiate
from superopt.sgraph import SGraph, TensorDecl
from superopt.targets import TARGETS

# Tensor names the grammar accepts, each a trap for a naive mapping: keywords, CUDA built-ins,
# reserved spellings (`__x`, `_X`) and names that reduce to one identifier (`a:b`, `a-b`, `a_b`).
INPUTS = ("x", "W.q", "a:b", "a-b", "a_b", "int", "threadIdx", "__x", "_X", "blockIdx", "warpSize", "tid")
OUTPUTS = ("out.y", "out:y")
EXPECTED = {
    "x": "p_x", "W.q": "p_W_q", "a:b": "p_a_b", "a-b": "p_a_b_1", "a_b": "p_a_b_2", "int": "p_int",
    "threadIdx": "p_threadIdx", "__x": "p_x_1", "_X": "p_X", "blockIdx": "p_blockIdx", "warpSize": "p_warpSize",
    "tid": "p_tid", "out.y": "o_out_y", "out:y": "o_out_y_1",
}
IDENTIFIER = re.compile(r"[po]_[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*")  # no `__` anywhere: C++ reserves it


def named_sgraph() -> SGraph:
    """One graph kernel adding all of INPUTS (8 x 64, f16, two rows per block) into both OUTPUTS."""
    b = SGraphBuilder([TensorDecl(t, (8, 64), "f16") for t in INPUTS], "names")
    k = b.graph(grid=[("x", 4)])
    tiles = [k.input(t, [0], None, name=f"in{i}") for i, t in enumerate(INPUTS)]
    total = tiles[0]
    for t in tiles[1:]:
        total = k.op("add", total, t)
    k.output(k.acc(total), OUTPUTS[0], [0])
    k.output(k.acc(k.op("exp", total)), OUTPUTS[1], [0])
    return b.build(list(OUTPUTS))


@pytest.fixture(scope="module")
def program():
    return generate(instantiate(named_sgraph(), {}, TARGETS["h100"]))


def test_parameters_carry_the_sanitized_names_in_launch_order(program):
    (launch,) = program.launches
    assert launch.args == (*INPUTS, *OUTPUTS) and launch.outputs == OUTPUTS
    head = program.source.split(f"{launch.name}(", 1)[1].split(") {", 1)[0]
    declared = re.findall(r"__restrict__ (\w+)", head)
    assert declared == [EXPECTED[t] for t in launch.args]
    for t in launch.args:  # each parameter's comment names its tensor in full
        assert re.search(rf"__restrict__ {EXPECTED[t]}\W.*// {re.escape(t)}$", program.source, re.M)
    launcher = program.source.split(f"launch_{launch.name}(", 1)[1].split(")", 1)[0]
    assert re.findall(r"\* (\w+)", launcher) == declared  # the host launcher passes the same names


def test_the_sanitized_names_compile_for_sm90(program):
    if nvcc_path() is None:
        pytest.skip("nvcc is not on PATH: cannot compile for sm_90")
    assert [r.name for r in compile_report(program.source)] == [program.launches[0].name]


def test_the_sanitized_names_run_right_on_the_cpu_harness(program):
    if runner.gxx() is None:
        pytest.skip("g++ is not on PATH: the CPU harness needs it")
    rng = np.random.default_rng(3)
    inputs = {t: rng.uniform(-0.1, 0.1, (8, 64)) for t in INPUTS}
    total = sum(np.asarray(inputs[t], np.float16).astype(np.float64) for t in INPUTS)
    summed, exped = runner.run(program, inputs)
    np.testing.assert_allclose(summed, total, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(exped, np.exp(total), rtol=1e-2)


def test_names_reduce_to_letters_digits_and_single_underscores():
    long = "a" * 63 + "." + "b" * 200  # sGraph ids follow no grammar: cut to the name limit
    names = param_names(["x\n#include <x>", "", "_", "a_", "a", "é", long, "*/"], {"*/"})
    assert names == {"x\n#include <x>": "p_x_include_x", "": "p_t", "_": "p_t_1", "a_": "p_a", "a": "p_a_1",
                     "é": "p_t_2", long: "p_" + "a" * 63, "*/": "o_t"}


@given(st.lists(st.text(max_size=80), max_size=12), st.data())
def test_parameter_names_are_distinct_identifiers(tensors, data):
    outputs = set(data.draw(st.lists(st.sampled_from(tensors))) if tensors else [])
    names = param_names(tensors, outputs)
    assert set(names) == set(tensors) and len(set(names.values())) == len(names)
    assert all(IDENTIFIER.fullmatch(n) and n.startswith("o_" if t in outputs else "p_") for t, n in names.items())
    assert param_names(tensors, outputs) == names  # deterministic


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_only_parameters_take_the_parameter_prefixes(name):
    """The generator's own identifiers never start `p_` or `o_`, so no tensor name can shadow one."""
    _, sg = workloads.reference_for(f"{name}:ci")
    prog = generate(instantiate(sg, best_params(sg, TARGETS["h100"]), TARGETS["h100"]))
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", prog.source, flags=re.S)
    params = {n for ln in prog.launches for n in param_names(ln.args, ln.outputs).values()}
    assert set(re.findall(r"\b[po]_\w+", code)) == params
