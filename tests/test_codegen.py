"""Code generation: structure of the generated source and of its launch plan (no compiler needed)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_shapes import merged_heads, reshaped_view_sgraph

from superopt import workloads
from superopt.assignments import enumerate_assignments
from superopt.build import SGraphBuilder
from superopt.codegen import CodegenError, KernelLaunch, LibraryCall, generate
from superopt.codegen.layout import alignment, smem_slots, tile_runs, vector_bytes
from superopt.codegen.names import c_names
from superopt.codegen.nvcc import parse_ptxas
from superopt.codegen.stages import lanes_for
from superopt.costmodel import best_params, estimate, is_free, kernel_floors
from superopt.instantiate import instantiate
from superopt.sgraph import LibraryKernel, SGraph, TensorDecl
from superopt.targets import TARGETS

H100 = TARGETS["h100"]
CI_PARAMS = {
    "rmsnorm_matmul": {"F": 2, "gx": 3},
    "gated_mlp": {"F": 4, "gx": 2},
    "rmsnorm_mlp": {"F": 2, "gx": 2},
    "lora": {"F": 2, "gx": 2},
    "gqa": {"F": 2, "gx": 2, "gy": 2, "gz": 2, "hx": 1, "hy": 2},
    "qknorm_gqa": {"F": 2, "gx": 2, "gy": 2, "gz": 2, "hx": 1, "hy": 2},
    "ntrans": {"gx": 3},
}


def ci_instance(name: str):
    _, sg = workloads.reference_for(f"{name}:ci")
    return instantiate(sg, CI_PARAMS[name], H100)


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_launch_plan_follows_the_instance(name):
    inst = ci_instance(name)
    prog = generate(inst)
    sg = inst.sgraph
    assert [s.kernel for s in prog.steps] == [k.id for k in sg.kernels]
    for k in sg.graph_kernels:
        (ln,) = [s for s in prog.launches if s.kernel == k.id]
        assert ln.grid == (*inst.grid(k), 1, 1, 1)[:3]
        assert ln.block == (128, 1, 1)
        assert ln.smem_bytes == inst.smem(k)  # exactly the storage plan the search checked
        assert ln.args == (*k.tensor_inputs, *k.outputs) and ln.outputs == k.outputs
        assert f'extern "C" __global__ void __launch_bounds__(128, 2) {ln.name}(' in prog.source
    assert set(prog.tensors) == set(sg.info.shapes)
    assert prog.outputs == sg.outputs and prog.inputs == tuple(t.id for t in sg.inputs)


def test_library_kernels_become_host_calls():
    prog = generate(ci_instance("lora"))
    call, launch = prog.steps
    assert isinstance(call, LibraryCall) and (call.op, call.inputs, call.output) == ("matmul", ("X", "A"), "D")
    assert isinstance(launch, KernelLaunch) and "D" in launch.args
    assert prog.launch_json()[0] == {"kernel": "k0", "kind": "library", "op": "matmul", "inputs": ["X", "A"],
                                     "attrs": {}, "output": "D"}


def test_source_is_deterministic_and_names_its_schedule():
    a, b = generate(ci_instance("gqa")), generate(ci_instance("gqa"))
    assert a.source == b.source and a.source_hash == b.source_hash
    header = a.source.split("*/")[0]
    assert "sGraph gqa.flashdecode" in header and "params: F=2,gx=2,gy=2,gz=2,hx=1,hy=2" in header
    assert "kernel k0  graph-defined  grid x=gx y=gy z=gz  loop f=F  -> NUM, DEN" in header
    assert re.fullmatch(r"so_[0-9a-f]{8}_k0", a.launches[0].name)  # made by the generator, not of user text
    assert f"{a.launches[0].name}<<<(2, 2, 2), 128, " in header
    other = instantiate(ci_instance("gqa").sgraph, {**CI_PARAMS["gqa"], "F": 4}, H100)
    assert generate(other).source != a.source


def test_storage_plan_decides_what_lives_in_shared_memory():
    inst = ci_instance("rmsnorm_matmul")
    src = generate(inst).source
    info = inst.sgraph.info.blocks["k0"]
    t, v = c_names(info.shapes, "t_"), c_names(info.shapes, "v_")  # tiles by position, never by id
    for tid, where in info.storage.items():
        declared = re.search(rf"\* const {t[tid]} = reinterpret_cast<\w+\*>\(so_smem \+ \d+\);  // {tid}: ", src)
        assert (declared is not None) == (where is not None), tid
    # b1 (matmul) adds straight into its accumulator; p7, p9 are fused into their consumers
    assert f"for (int r = 0; r < 4; ++r) {t['acc4']}[(mg * 4 + r) * 16 + ni] += dot[r];" in src
    assert f"const float {v['p7']} = (so_f({t['acc5']}[i]) + 1e-06f);" in src
    assert f"const float {v['p9']} = (so_f({t['acc4']}[i]) / so_f({t['p8']}[c0]));" in src  # the row RMS, broadcast


def test_tensor_cores_where_tile_dims_allow_and_cuda_cores_otherwise():
    _, sg = workloads.reference_for("gqa")
    prog = generate(instantiate(sg, {"gx": 2, "gy": 16, "gz": 16, "F": 2, "hx": 1, "hy": 256}, H100))
    assert [ln.wmma for ln in prog.launches] == [True, False]
    assert "nvcuda::wmma::mma_sync(fc, fa, fb, fc);" in prog.source and "#include <mma.h>" in prog.source
    assert "b3 = b2 @ V_t (added into acc4): 1 x (16 x 128) @ (128 x 64) on tensor cores" in prog.source
    _, sg = workloads.reference_for("rmsnorm_matmul")
    prog = generate(instantiate(sg, {"gx": 512, "F": 4}, H100))  # 2 rows: too few for a 16x16 fragment
    assert not prog.launches[0].wmma and "#include <mma.h>" not in prog.source
    assert "on CUDA cores, 2 rows x 1 column per thread, 8 lanes per column strip" in prog.source


def test_dynamic_shared_memory_above_48k_is_requested():
    _, sg = workloads.reference_for("ntrans")
    prog = generate(instantiate(sg, {"gx": 8}, H100))
    (ln,) = prog.launches
    assert ln.smem_bytes == 81922 and ln.needs_smem_opt_in
    assert f"cudaFuncSetAttribute({ln.name}, cudaFuncAttributeMaxDynamicSharedMemorySize, 81922)" in prog.source


def test_vector_loads_follow_alignment():
    _, sg = workloads.reference_for("rmsnorm_matmul")
    src = generate(instantiate(sg, {"gx": 512, "F": 4}, H100)).source
    assert "load W_t <- W (1024 run(s) of 12, 8-byte copies)" in src  # 24-byte rows: 8-byte vectors
    assert "load X_t <- X (2 run(s) of 1024, 16-byte copies)" in src
    assert "reinterpret_cast<uint2*>" in src and "reinterpret_cast<uint4*>" in src


@pytest.mark.parametrize("spec", ["gqa:ci", "lora:ci", "rmsnorm_mlp"])
def test_best_params_is_the_cost_model_minimum(spec):
    _, sg = workloads.reference_for(spec)
    valid = list(enumerate_assignments(sg, H100))
    # ties are broken by the sorted parameter values
    brute = min(valid, key=lambda v: (estimate(instantiate(sg, v, H100)).time_s, tuple(sorted(v.items()))))
    assert best_params(sg, H100) == brute


def test_other_thread_counts_are_refused():
    inst = ci_instance("ntrans")
    wide = instantiate(inst.sgraph, inst.values, dataclasses.replace(H100, threads_per_block=256))
    with pytest.raises(CodegenError, match="256 threads per block"):
        generate(wide)


@given(st.lists(st.tuples(st.sampled_from(["f16", "f32", "bf16"]),
                          st.lists(st.integers(1, 40), min_size=1, max_size=3)), min_size=1, max_size=8))
def test_shared_memory_slots_are_dense_and_aligned(tiles):
    stored = [(f"t{i}", dt, tuple(shape)) for i, (dt, shape) in enumerate(tiles)]
    slots = smem_slots(stored)
    assert sorted(s.tensor for s in slots) == sorted(t for t, _, _ in stored)
    offset = 0
    for s in slots:
        assert s.offset == offset and s.offset % alignment(s.nbytes) == 0
        offset += s.nbytes
    assert offset == sum(s.nbytes for s in slots)


def test_tile_runs_and_vector_widths():
    runs = tile_runs((2, 16, 64), (2, 256, 64))  # whole rows of a 3-D tensor: one run per batch
    assert (runs.split_dim, runs.run, runs.rows) == (1, 1024, 2)
    assert tile_runs((4, 64), (4, 64)).rows == 1
    assert vector_bytes(12, 2) == 8 and vector_bytes(8, 2) == 16 and vector_bytes(3, 2) == 2
    assert vector_bytes(2, 4) == 8 and vector_bytes(1, 4) == 4


def test_lane_groups_fill_the_block_within_a_warp():
    assert lanes_for(4, 1024) == 32 and lanes_for(24, 1024) == 4 and lanes_for(200, 1024) == 1
    assert lanes_for(1, 8) == 8  # never more lanes than elements in the row


def test_ptxas_report_parsing():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 8 bytes cumulative stack size, 16 bytes smem
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers
"""
    a, b = parse_ptxas(log)
    assert (a.name, a.registers, a.static_smem_bytes, a.spill_load_bytes, a.spills) == ("k_a", 128, 16, 12, True)
    assert (b.name, b.registers, b.spills) == ("k_b", 32, False)


def _exp_rows(tensor: str, shape: tuple[int, int], layout: list[tuple[str, str, list[int]]]) -> SGraph:
    """exp of `tensor` (made by `layout`: library ops from the input X of `shape`), one block per 2 rows."""
    b = SGraphBuilder([TensorDecl("X", shape, "f16")], "exp_rows")
    for op, out, perm in layout:
        b.library(op, "X", out=out, perm=perm)
    rows = shape[0] if not layout else shape[1]
    k = b.graph(grid=[("x", rows // 2)])
    k.output(k.acc(k.op("exp", k.input(tensor, [0], None))), "O", [0])
    return b.build(["O"])


def test_a_transpose_is_a_free_view_read_in_its_stored_layout():
    """A library transpose launches nothing and moves nothing (`SGraph.views`); a kernel reading
    the view pays for the runs of the stored tensor that its tiles touch: rows of 2 elements of
    X (4-byte runs of 32-byte sectors) take 8 times the DRAM time of 1024-element rows, so the
    kernel (which also writes its output, 16 MiB either way) takes (8 + 1) / (1 + 1) as long."""
    h100 = TARGETS["h100"]
    viewed = _exp_rows("XT", (1024, 8192), [("transpose", "XT", [1, 0])])
    stored = _exp_rows("X", (8192, 1024), [])
    assert viewed.views == {"XT": ("X", (1, 0))}
    v, s = estimate(instantiate(viewed, {}, h100)), estimate(instantiate(stored, {}, h100))
    assert (v.kernels[0].time_s, v.kernels[0].dram_bytes) == (0.0, 0)
    assert v.kernels[1].dram_bytes == s.kernels[0].dram_bytes
    body_v, body_s = (e.kernels[-1].time_s - h100.launch_overhead_s for e in (v, s))
    assert body_v == pytest.approx(4.5 * body_s, rel=0.05)


def test_a_reshape_of_a_transposed_view_returned_is_a_copy():
    b = SGraphBuilder([TensorDecl("X", (64, 32), "f16")], "reshaped")
    b.library("transpose", "X", out="XT", perm=[1, 0])
    b.library("reshape", "XT", out="R", shape=[2048])
    b.library("reshape", "X", out="S", shape=[2048])
    sg = b.build(["R", "S"])
    times = [k.time_s for k in estimate(instantiate(sg, {}, TARGETS["h100"])).kernels]
    assert times[0] == times[2] == 0.0 and times[1] > TARGETS["h100"].launch_overhead_s
    assert [is_free(sg, k) for k in sg.kernels] == [True, False, True] and sg.reshaped_views == {}


@pytest.mark.parametrize("head_dim", [32, 4])
def test_a_reshape_of_a_transposed_view_only_graph_kernels_read_is_free(head_dim):
    """Heads merged by a reshape of a transposed view, read only by a graph kernel: no copy (the
    kernel indexes the stored tensor), and the reader pays for the runs the view keeps in order,
    a head's row: 64 bytes fill whole 32-byte sectors (the same time as reading a copy), 8 bytes
    a quarter of one (4 times the DRAM bytes; with these few blocks the reads are bound by the
    sectors in flight, so they take longer, though less than 4 times). Returned too, the reshape is
    a copy, launched, and 0 is its floor only while no library kernel reads it."""
    p = merged_heads(32, 8192, head_dim, 64)
    free, returned = reshaped_view_sgraph(p), reshaped_view_sgraph(p, returned=True)
    assert free.reshaped_views == {"R": "T"} and returned.reshaped_views == {}
    params = {"hx": 32, "rx": 128, "gx": 128, "gy": 1, "F": 4}
    f_est, r_est = (estimate(instantiate(sg, params, H100)) for sg in (free, returned))
    assert f_est.kernels[2].time_s == 0.0 and f_est.launches == 2
    assert r_est.kernels[2].time_s > H100.launch_overhead_s and r_est.launches == 3
    extra = f_est.kernels[3].time_s - r_est.kernels[3].time_s
    assert extra == 0.0 if head_dim == 32 else extra > 0.0
    assert f_est.kernels[3].dram_bytes == r_est.kernels[3].dram_bytes  # the same useful bytes either way
    values = {s: [params[s]] for s in free.symbols}
    assert kernel_floors(free, H100, free.kernels[2], values) == {0: 0.0}
    copied = SGraph(free.inputs, (*free.kernels, LibraryKernel("k9", "exp", ("R",), {}, "Z")), ("O", "Z"))
    assert kernel_floors(copied, H100, copied.kernels[2], values)[0] > H100.launch_overhead_s
