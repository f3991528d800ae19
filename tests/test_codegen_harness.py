"""Generated CUDA executed on the CPU: the same source, compiled by g++ against the emulation
headers in tests/cuda_harness, compared with the float64 reference on fresh random inputs with
poisoned outputs. Deliberately broken kernels must be caught."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from cuda_harness import runner
from cuda_harness.cases import H100, NAMES, VARIANTS, Case, ci_cases, variant, variant_cases
from kernel_shapes import reshaped_view, reshaped_view_sgraph

from superopt import workloads
from superopt.assignments import enumerate_assignments
from superopt.codegen import CudaProgram, KernelLaunch, generate
from superopt.dtypes import dtype
from superopt.instantiate import instantiate
from superopt.program import Program
from superopt.reference import evaluate, max_rel_err, random_inputs

pytestmark = pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")


@pytest.fixture(scope="module")
def cases() -> dict[str, list[Case]]:
    built = {name: ci_cases(name) for name in NAMES} | {name: variant_cases(name) for name in VARIANTS}
    runner.compile_all([prog for progs in built.values() for _, _, prog in progs])
    return built


def run_error(program: Program, prog: CudaProgram, seed: int = 7) -> float:
    inputs = random_inputs(program, seed)
    outs = runner.run(prog, inputs)
    return max(max_rel_err(o, r) for o, r in zip(outs, evaluate(program, inputs), strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_reference_kernels_match_float64_reference(cases, name):
    for program, params, prog in cases[name]:
        err = run_error(program, prog)
        assert err <= dtype(program.dtype).tolerance, (name, params, err)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_tensor_core_and_dtype_variants(cases, name):
    used_wmma = False
    for program, params, prog in cases[name]:
        used_wmma |= any(ln.wmma for ln in prog.launches)
        err = run_error(program, prog)
        assert err <= dtype(program.dtype).tolerance, (name, params, err)
    assert used_wmma == ("wmma" in name)


def test_every_element_written_and_inputs_fresh(cases):
    """Two seeds give different outputs (no stale state), and no NaN survives (every output
    element was written over the poison)."""
    program, _, prog = cases["gqa"][0]
    a = runner.run(prog, random_inputs(program, 1))[0]
    b = runner.run(prog, random_inputs(program, 2))[0]
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and not np.allclose(a, b)


# -- deliberately broken kernels --------------------------------------------------------------


def _sub(pattern: str, repl: str, count: int = 1) -> Callable[[str], str]:
    def mutate(source: str) -> str:
        new, n = re.subn(pattern, repl, source, count=count)
        assert n == count, f"mutation pattern {pattern!r} not found"
        return new

    return mutate


def _sub_tiles(pattern: str, repl: str) -> Callable[[str], str]:
    """`_sub` with `{tile}` in both strings standing for that tile's C name (the generator names
    tiles by position; the comment on each shared-memory declaration says which tile it holds)."""
    def mutate(source: str) -> str:
        declared = r"(t_\d+) = reinterpret_cast<\w+\*>\(so_smem \+ \d+\);  // (\S+): "
        names = {m.group(2): m.group(1) for m in re.finditer(declared, source)}
        return _sub(pattern.format(**names), repl.format(**names))(source)

    return mutate


def _drop_first_barrier_in_loop(source: str) -> str:
    head, sep, loop = source.partition("for (int it = 0;")
    assert sep
    return head + sep + loop.replace("    __syncthreads();\n", "", 1)


# (case, params, mutation, what it breaks)
BROKEN = {
    "missing barrier after the tile loads": ("gated_mlp", {"F": 2, "gx": 3}, _drop_first_barrier_in_loop),
    "input tile off by one block": (
        "rmsnorm_matmul", {"F": 2, "gx": 2}, _sub(r"const int base = blk_x \* 24 \+ it \* 1536;",
                                                  "const int base = (blk_x + 1) * 24 + it * 1536;")),
    "loop walks the wrong tile": (
        "rmsnorm_mlp", {"F": 4, "gx": 3}, _sub(r"const int base = it \* 16;", "const int base = (it ^ 1) * 16;")),
    "wrong output map": (
        "gqa", {"F": 1, "gx": 2, "gy": 2, "gz": 2, "hx": 1, "hy": 1},
        _sub(r"const int base = blk_x \* 256 \+ blk_y \* 128 \+ blk_z \* 16;",
             "const int base = blk_x * 256 + blk_z * 128 + blk_y * 16;")),
    "accumulator never zeroed": ("lora", {"F": 2, "gx": 2}, _sub_tiles(r"{acc4}\[i\] = 0\.0f;", ";")),
    "reduction over half the lanes": (
        "ntrans", {"gx": 1}, _sub(r"so_group_sum<(\d+)>\(ss\)", r"so_group_sum<\1 / 2>(ss)", count=2)),
    "missing barrier before a tensor-core matmul": ("gqa-wmma-batched", None, _drop_first_barrier_in_loop),
    "last output element of every tile never written": (
        "gated_mlp", {"F": 2, "gx": 3}, _sub(r"i < 64; i \+= 128\) \{\n      const int c0 = i / 16;",
                                              "i < 63; i += 128) {\n      const int c0 = i / 16;")),
    "concat puts the loop's tiles in mirrored slots": (
        "concat-accumulator", {"gx": 2, "F": 4}, _sub(r"\+ it \* 16\] = ", "+ (3 - it) * 16] = ")),
    "store converts the wrong accumulator": (
        "gated_mlp", {"F": 1, "gx": 1}, _sub_tiles(r"so_silu\(so_f\({acc2}\[i\]\)\)", "so_silu(so_f({acc4}[i]))")),
}


def _broken_program(case: str, params: dict[str, int] | None) -> tuple[Program, CudaProgram]:
    if case in VARIANTS:
        program, sg = variant(case)
        params = params or next(enumerate_assignments(sg, H100))
    else:
        program, sg = workloads.reference_for(f"{case}:ci")
    assert params is not None
    return program, generate(instantiate(sg, params, H100))


@pytest.mark.parametrize("what", list(BROKEN))
def test_broken_kernels_are_caught(what):
    case, params, mutate = BROKEN[what]
    program, prog = _broken_program(case, params)
    assert run_error(program, prog) <= dtype(program.dtype).tolerance  # intact, it passes
    broken = CudaProgram(mutate(prog.source), prog.steps, prog.tensors, prog.inputs, prog.outputs, prog.params)
    try:
        err = run_error(program, broken)
    except runner.HarnessError:
        return  # crashed, deadlocked or wrote out of bounds: caught
    assert not err <= dtype(program.dtype).tolerance, f"{what}: error {err} passed"


def test_divergent_barrier_is_a_deadlock():
    program, prog = _broken_program("ntrans", {"gx": 1})
    src = prog.source.replace("    __syncthreads();\n", "    if (tid < 64) __syncthreads();\n", 1)
    with pytest.raises(runner.HarnessError, match="deadlock"):
        runner.run(CudaProgram(src, prog.steps, prog.tensors, prog.inputs, prog.outputs), random_inputs(program, 0))


def test_misaligned_vector_copy_is_reported():
    program, prog = _broken_program("gated_mlp", {"F": 1, "gx": 1})
    assert "const __half* __restrict__ p_X,  // X" in prog.source
    src = prog.source.replace("reinterpret_cast<const uint4*>(p_X + base + v * 8)",
                              "reinterpret_cast<const uint4*>(p_X + base + v * 8 + 1)", 1)
    assert src != prog.source
    with pytest.raises(runner.HarnessError, match="misaligned"):
        runner.run(CudaProgram(src, prog.steps, prog.tensors, prog.inputs, prog.outputs), random_inputs(program, 0))


@pytest.mark.parametrize(("shape", "perm", "reshaped"), [
    ((2, 16, 32), (1, 0, 2), (16, 64)), ((8, 16, 8), (1, 0, 2), (16, 64)),  # heads merged
    ((6, 8, 4), (2, 0, 1), (24, 8)), ((4, 6, 8), (1, 2, 0), (12, 16)), ((8, 12), (1, 0), (6, 16))])
def test_a_kernel_reads_a_reshaped_view_in_place(shape, perm, reshaped):
    """A graph kernel reading a reshape of a transposed view (`SGraph.reshaped_views`: heads
    merged for the output projection, or dims split and merged across a transpose) indexes the
    stored tensor itself, no copy launched: right at every loop size and row split, its chunks of
    the reshaped dims within a dim of the view and across them."""
    program = reshaped_view(shape, perm, reshaped, 8)
    sg = reshaped_view_sgraph(program)
    tilings: dict[tuple[int, int], dict[str, int]] = {}
    for params in enumerate_assignments(sg, H100):
        tilings.setdefault((params["F"], params["gx"]), params)
    assert {f for f, _ in tilings} >= {1, 2, reshaped[1]} and len({g for _, g in tilings}) >= 3
    progs = [generate(instantiate(sg, params, H100)) for params in tilings.values()]
    runner.compile_all(progs)
    for seed, (params, prog) in enumerate(zip(tilings.values(), progs, strict=True)):
        assert [s.op for s in prog.steps if not isinstance(s, KernelLaunch)] == ["transpose", "reshape"]
        assert prog.reshaped_views == {"R": "E"} and "a reshape of T" in prog.source
        assert run_error(program, prog, seed=seed) <= dtype("f16").tolerance, params
