"""Generated kernels on a real GPU through CuPy: correct against the float64 reference on fresh
inputs with poisoned outputs, then timed. Marked `gpu`; skipped, with the reason, where CuPy or
a device is missing (scripts/gpu_check.sh runs them)."""

from __future__ import annotations

import dataclasses

import pytest
from cuda_harness.cases import H100, NAMES, VARIANTS, ci_cases, variant, variant_cases
from kernel_shapes import (
    candidate,
    grouped_projections,
    merged_heads,
    norm_then_softmax,
    projections,
    reshaped_view_sgraph,
    softmax_of_transposed,
    total,
)

from superopt import workloads
from superopt.build import unfused_baseline
from superopt.codegen import CudaProgram, generate
from superopt.costmodel import best_params
from superopt.instantiate import instantiate
from superopt.runtime import device_fingerprint, gpu_available

_ok, _why = gpu_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ok, reason=f"no GPU: {_why}")]

N_REPEAT = 100


def _device_program(prog: CudaProgram):
    from superopt.runtime.executor import DeviceProgram

    return DeviceProgram(prog)


def test_device_fingerprint_identifies_the_gpu():
    fp = device_fingerprint()
    assert fp["device"] and fp["cupy"] and fp["cuda_runtime"] > 0
    major, minor = fp["compute_capability"].split(".")
    assert int(major) >= 7 and minor.isdigit()


@pytest.mark.parametrize("name", [*NAMES, *VARIANTS])
def test_generated_kernels_match_the_reference_on_gpu(name):
    from superopt.runtime.measure import check

    cases = ci_cases(name) if name in NAMES else variant_cases(name)
    for program, _, prog in cases:
        for seed in (1, 2):
            check(program, _device_program(prog), seed)  # raises IncorrectKernel with the error


@pytest.mark.parametrize("name", NAMES)
def test_published_shape_reference_checked_then_timed(name):
    from superopt.runtime.measure import measure, measure_baseline

    program, sg = workloads.reference_for(name)
    ours = measure(program, sg, best_params(sg, H100), H100, n_repeat=N_REPEAT)
    base = measure_baseline(program, H100, n_repeat=N_REPEAT)
    for m in (ours, base):
        assert m.max_rel_err <= m.tolerance and 0 < m.min_us <= m.median_us and m.runs == N_REPEAT
    assert base.launches == sum(1 for k in unfused_baseline(program).kernels if getattr(k, "op", "") != "const")


@pytest.mark.parametrize("name", [*NAMES, "op-zoo"])
def test_library_kernels_match_the_reference_on_gpu(name):
    """The unfused baseline: every op as a CuPy/cuBLAS library kernel."""
    from superopt.runtime.measure import check

    program = variant(name)[0] if name in VARIANTS else workloads.resolve(f"{name}:ci")
    check(program, _device_program(generate(instantiate(unfused_baseline(program), {}, H100))), seed=3)


def test_a_kernel_reading_a_transposed_view_matches_the_reference_on_gpu(searched_attention):
    """Attention over K as frameworks store it: the fused kernel reads K^T in place from K's
    memory (a view: no buffer of its own, no copy), as does the baseline's library matmul."""
    from superopt.runtime.measure import check

    program, outcome = searched_attention(False)
    sg = outcome.best.sgraph
    prog = generate(instantiate(sg, best_params(sg, H100), H100))
    assert prog.views
    for seed in (1, 2):
        check(program, _device_program(prog), seed)
    check(program, _device_program(generate(instantiate(unfused_baseline(program), {}, H100))), seed=3)


@pytest.mark.parametrize(("make", "kinds"), [(projections, ["graph"]), (grouped_projections, ["graph"]),
                                              (norm_then_softmax, ["graph"]),
                                              (total, ["graph"]), (softmax_of_transposed, ["graph", "library"])])
def test_kernels_of_the_less_common_shapes_match_the_reference_on_gpu(make, kinds):
    """Outputs split side by side by one grid axis, one block over a size-1 axis, a softmax over
    a transposed product's columns then a view: each searched kernel (the best one of its kind,
    unbounded where the cost model prefers library kernels at these shapes) on the device."""
    from superopt.runtime.measure import check

    p = make()
    sg = candidate(p, kinds)
    check(p, _device_program(generate(instantiate(sg, best_params(sg, H100), H100))), seed=1)


def test_reshapes_and_transposes_run_in_place_on_gpu(h100):
    """A reshape of a stored tensor and a transpose alias it (no buffer, no launch); a reshape of a
    transposed view is a copy. The unfused baseline and the searched winner of a program with all
    three match the reference, and the baseline launches only its exp, mul and copy."""
    from superopt.config import SearchConfig
    from superopt.program import Program
    from superopt.runtime.measure import check
    from superopt.search.driver import run_search

    p = Program("layouts")
    x, y = p.input("X", (8, 32), "f16"), p.input("Y", (16, 16), "f16")
    e = p.exp(p.reshape(x, (16, 16))) * y
    p.output(p.reshape(p.transpose(e, (1, 0)), (8, 32)), p.reshape(e, (256,)))
    baseline = _device_program(generate(instantiate(unfused_baseline(p), {}, H100)))
    assert baseline.launches == 3
    check(p, baseline, seed=1)
    sg = run_search(p, h100, SearchConfig()).best.sgraph
    check(p, _device_program(generate(instantiate(sg, best_params(sg, H100), H100))), seed=2)


def test_merged_heads_are_read_in_place_on_gpu():
    """A graph kernel reading a reshape of a transposed view (heads merged for a projection)
    gets the stored tensor's buffer and indexes it itself: no copy launched, right at a loop whose
    chunks lie within a head and at one whose chunks span both heads."""
    from superopt.runtime.measure import check

    p = merged_heads()
    sg = reshaped_view_sgraph(p)
    for seed, loop in enumerate((4, 1), start=1):
        dp = _device_program(generate(instantiate(sg, {"hx": 2, "rx": 2, "gx": 2, "gy": 1, "F": loop}, H100)))
        assert dp.launches == 2 and dp.buffers["R"] is dp.buffers["E"]
        check(p, dp, seed)


def test_unwritten_output_elements_fail_the_check():
    """A kernel that skips the last element of every block's output tile leaves poison (NaN)."""
    from superopt.runtime.measure import IncorrectKernel, check

    program, sg = workloads.reference_for("gated_mlp:ci")
    prog = generate(instantiate(sg, {"F": 2, "gx": 3}, H100))
    src = prog.source.replace("for (int i = tid; i < 64; i += 128) {\n      const int c0 = i / 16;",
                              "for (int i = tid; i < 63; i += 128) {\n      const int c0 = i / 16;")
    assert src != prog.source
    with pytest.raises(IncorrectKernel):
        check(program, _device_program(dataclasses.replace(prog, source=src)))


def test_more_than_48k_of_shared_memory_launches():
    from superopt.runtime.measure import check

    program, sg = workloads.reference_for("ntrans")
    prog = generate(instantiate(sg, {"gx": 8}, H100))
    assert prog.launches[0].smem_bytes > 48 * 1024
    check(program, _device_program(prog))


def test_calibration_measures_plausible_figures():
    from superopt.runtime.calibrate import calibrate

    t = calibrate(H100, copy_bytes=1 << 28, gemm=4096, n_repeat=5)
    assert 1e11 < t.dram_bytes_per_s < 2e13 and 1e12 < t.tensor_flops < 1e16 and 0 < t.launch_overhead_s < 1e-4
    assert t.name == "h100-calibrated"
