"""The kernels the search actually returns, not only the hand-written references: each winner at its
:ci shape runs in the CPU harness against the float64 reference (under the cost model's parameters
and others), and the same sGraph rebound to the published shape compiles with nvcc for sm_90."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cuda_harness import runner
from cuda_harness.cases import H100, param_choices
from kernel_shapes import (
    attention_block,
    candidate,
    grouped_projections,
    llama_mlp,
    norm_projections,
    norm_then_softmax,
    projections,
    softmax_of_transposed,
    total,
)

from superopt import Program, workloads
from superopt.codegen import generate
from superopt.codegen.nvcc import compile_report, nvcc_path
from superopt.config import SearchConfig
from superopt.costmodel import best_params
from superopt.dtypes import dtype
from superopt.instantiate import instantiate
from superopt.loading import load_program
from superopt.reference import evaluate, max_rel_err, random_inputs
from superopt.search.driver import run_search
from superopt.search.instantiation import rank
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel, check_matches, input_decls, rebind
from superopt.verifier.oracle import Oracle

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = list(workloads.WORKLOADS)  # each searched once at :ci per session (the `searched` fixture)


def winner(searched, name: str):
    program, outcome = searched(f"{name}:ci")
    assert outcome.best.verdict.proved
    return program, outcome.best.sgraph


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
@pytest.mark.parametrize("name", SEARCHES)
def test_search_winner_runs_correctly_in_the_cpu_harness(searched, name):
    program, sg = winner(searched, name)
    assert any(isinstance(k, GraphKernel) for k in sg.kernels), "the winner should contain a fused kernel"
    progs = [(params, generate(instantiate(sg, params, H100))) for params in param_choices(sg)]
    runner.compile_all([prog for _, prog in progs])
    for seed, (params, prog) in enumerate(progs, start=11):
        inputs = random_inputs(program, seed)
        outs = runner.run(prog, inputs)
        for got, want in zip(outs, evaluate(program, inputs), strict=True):
            err = max_rel_err(got, want)
            assert err <= dtype(program.dtype).tolerance, (name, params, err)


def _residual_rmsnorm() -> Program:
    """A residual sum returned with its rms_norm."""
    p = Program("add_rmsnorm")
    h = p.op("add", p.input("X", (4, 64), "f16"), p.input("R", (4, 64), "f16"))
    p.output(h, p.rms_norm(h, -1))
    return p


def _exp_sum_scaled() -> Program:
    """Three values of exp(X): itself, its row sums and its product with X."""
    p = Program("exp_sum_scaled")
    x = p.input("X", (8, 32), "f16")
    e = p.exp(x)
    p.output(e, p.sum(e, 1, keepdim=True), e * x)
    return p


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
@pytest.mark.parametrize("make", [_residual_rmsnorm, _exp_sum_scaled, projections, grouped_projections,
                                  norm_then_softmax, total])
def test_a_kernel_writing_every_value_the_program_returns_runs_correctly(h100, make):
    """One searched kernel writes every output, values the body also reads from included (the
    residual sum is an accumulator its rms_norm reads), outputs split side by side by one grid
    axis, or by none (one block); all come out right in the CPU harness."""
    p = make()
    sg = run_search(p, h100, SearchConfig()).best.sgraph
    assert len(sg.kernels) == 1 and len(sg.kernels[0].outputs) == len(p.outputs)
    progs = [(params, generate(instantiate(sg, params, H100))) for params in param_choices(sg)]
    runner.compile_all([prog for _, prog in progs])
    for seed, (params, prog) in enumerate(progs, start=11):
        inputs = random_inputs(p, seed)
        outs = runner.run(prog, inputs)
        assert len(outs) == len(p.outputs)
        for got, want in zip(outs, evaluate(p, inputs), strict=True):
            assert max_rel_err(got, want) <= dtype("f16").tolerance, params


@pytest.mark.skipif(runner.gxx() is None or nvcc_path() is None, reason="needs g++ (the CPU harness) and nvcc")
def test_a_split_attention_block_runs_correctly_in_the_cpu_harness(h100):
    """The program split's schedule of a multi-head attention block: one kernel writes the Q, K
    and V projections side by side (three outputs, more than the search grows), views split the
    heads, one kernel attends, and the output projection reads the heads merged in place (a
    reshape of a transposed view: no copy launched). Compiled for sm_90 without spills."""
    p = attention_block(16, 64, 2)
    best = run_search(p, h100, SearchConfig(), max_states=600).best
    assert max(len(k.outputs) for k in best.sgraph.kernels if isinstance(k, GraphKernel)) == 3
    merged = best.sgraph.kernels[-1]
    assert isinstance(merged, GraphKernel) and set(merged.tensor_inputs) & set(best.sgraph.reshaped_views)
    assert best.best.estimate.launches == 3
    prog = generate(instantiate(best.sgraph, best.best.params, H100))
    assert sorted((r.name, r.spills) for r in compile_report(prog.source)) == sorted(
        (ln.name, False) for ln in prog.launches)
    for seed in (11, 12):
        inputs = random_inputs(p, seed)
        [got] = runner.run(prog, inputs)
        assert max_rel_err(got, evaluate(p, inputs)[0]) <= dtype("f16").tolerance, seed


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
def test_a_split_decoder_layer_runs_correctly_in_the_cpu_harness(h100):
    """A decoder layer's split schedule (`scripts/programs/decoder_layer.json`: five graph kernels
    between library ones, thirteen symbols) at the cost model's sizes, the first valid ones and the
    most split: right against float64. (Listing every valid assignment to pick those took 12 GB.)"""
    p = load_program(str(ROOT / "scripts" / "programs" / "decoder_layer.json"))
    best = run_search(p, h100, SearchConfig(), max_states=2_000).best
    assert best.verdict.proved and len(best.sgraph.graph_kernels) == 5
    for seed, params in enumerate(param_choices(best.sgraph), start=11):
        inputs = random_inputs(p, seed)
        [got] = runner.run(generate(instantiate(best.sgraph, params, H100)), inputs)
        assert max_rel_err(got, evaluate(p, inputs)[0]) <= dtype("f16").tolerance, params


@pytest.mark.skipif(runner.gxx() is None or nvcc_path() is None, reason="needs g++ (the CPU harness) and nvcc")
@pytest.mark.parametrize("real,small", [
    (lambda: llama_mlp(16, 4096, 11008), lambda: llama_mlp(4, 64, 128)),
    (lambda: norm_projections(16, 4096, 4096), lambda: norm_projections(4, 64, 32))], ids=["llama_mlp", "norm_qkv"])
def test_a_split_kernel_with_a_post_loop_phase_runs_correctly(h100, real, small):
    """Split schedules at real widths whose graph kernel loops over X's columns and finishes after
    the loop: the llama MLP block's gated kernel (the norm, silu and the product), and the Q, K
    and V projections of a normalized X (the norm over four accumulators). Compiled for sm_90 at
    that width without spills; rebound to a small width, right in the CPU harness at three
    tilings."""
    p = real()
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    best = min(ks.program_split(whole=True), key=lambda sg: rank(sg, h100)[0].estimate.time_s)
    assert [o.op for o in best.graph_kernels[0].block.post]
    cuda = generate(instantiate(best, rank(best, h100)[0].params, H100))
    assert [(r.name, r.spills) for r in compile_report(cuda.source)] == [(ln.name, False) for ln in cuda.launches]
    little = small()
    sg = rebind(best, input_decls(little))
    for seed, params in enumerate(param_choices(sg), start=11):
        inputs = random_inputs(little, seed)
        got = runner.run(generate(instantiate(sg, params, H100)), inputs)
        for out, want in zip(got, evaluate(little, inputs), strict=True):
            assert max_rel_err(out, want) <= dtype("f16").tolerance, params


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH: cannot compile for sm_90")
def test_search_winners_compile_for_sm90_at_published_shapes(searched):
    """Shape reuse in practice: the :ci winner rebound to the published shape, parameters from the
    cost model, compiled by nvcc. Every kernel of the generated source must come out of ptxas,
    without register spills."""
    rows = []
    for name in SEARCHES:
        _, sg = winner(searched, name)
        program = workloads.resolve(name)
        big = rebind(sg, input_decls(program))
        check_matches(big, program)
        params = best_params(big, H100)
        cuda = generate(instantiate(big, params, H100))
        resources = compile_report(cuda.source)
        assert sorted(r.name for r in resources) == sorted(ln.name for ln in cuda.launches), name
        for r in resources:
            assert r.registers <= 255 and not r.spills, (name, r)
            rows.append(f"{name:<15} {r.name:<35} {r.registers:>4} regs  spills {r.spill_store_bytes}/"
                        f"{r.spill_load_bytes}  params {params}")
    print("\n" + "\n".join(rows))


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
def test_a_kernel_reading_a_transposed_view_runs_correctly(searched_attention):
    """Attention over K stored (batch, length, head dim): the winner's fused kernel reads K^T as
    a view of K's memory (`SGraph.views`). Right in the CPU harness at every parameter choice;
    wrong when the kernel reads the view as if it were stored transposed (a mutant)."""
    program, outcome = searched_attention(False)
    sg = outcome.best.sgraph
    assert sg.views and any(set(sg.views) & set(k.tensor_inputs) for k in sg.kernels if isinstance(k, GraphKernel))
    progs = [generate(instantiate(sg, params, H100)) for params in param_choices(sg)]
    unaware = []
    for params in param_choices(sg):
        inst = instantiate(sg, params, H100)
        inst.sgraph.__dict__["views"] = {}  # code generated as if K^T were a tensor of its own
        unaware.append(replace(progs[len(unaware)], source=generate(inst).source))
        del inst.sgraph.__dict__["views"]
    runner.compile_all(progs + unaware)
    for seed, (prog, broken) in enumerate(zip(progs, unaware, strict=True), start=11):
        inputs = random_inputs(program, seed)
        want = evaluate(program, inputs)[0]
        assert max_rel_err(runner.run(prog, inputs)[0], want) <= dtype(program.dtype).tolerance
        assert max_rel_err(runner.run(broken, inputs)[0], want) > 0.05


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
def test_a_softmax_over_a_transposed_products_columns_runs_correctly():
    """softmax(transpose(X @ W)) as a kernel computing the softmax over the columns of X @ W, then
    a free view: right in the CPU harness at every parameter choice."""
    p = softmax_of_transposed()
    sg = candidate(p, ["graph", "library"])
    assert sg.kernels[1].op == "transpose" and sg.views
    progs = [generate(instantiate(sg, params, H100)) for params in param_choices(sg)]
    runner.compile_all(progs)
    for seed, prog in enumerate(progs, start=11):
        inputs = random_inputs(p, seed)
        assert max_rel_err(runner.run(prog, inputs)[0], evaluate(p, inputs)[0]) <= dtype("f32").tolerance


def _grouped_query_heads() -> Program:
    """Grouped-query attention as `torch.export` gives it (4 query heads share 2 KV heads): the
    scores of a KV head's 2 query heads reshaped to rank 5 for their softmax."""
    p = Program("gqa_heads")
    x = p.input("X", (16, 64), "f16")

    def heads(w: str, cols: int, n: int):  # (1, n, 16, 16): the projection's heads
        proj = p.op("matmul", x, p.input(w, (64, cols), "f16"))
        return p.op("transpose", p.op("reshape", proj, shape=[1, 16, n, 16]), perm=[0, 2, 1, 3])

    q, k, v = heads("Wq", 64, 4), heads("Wk", 32, 2), heads("Wv", 32, 2)
    kt = p.op("transpose", p.op("reshape", k, shape=[1, 2, 1, 16, 16]), perm=[0, 1, 2, 4, 3])
    scores = p.op("matmul", p.op("reshape", q, shape=[1, 2, 32, 16]), p.op("reshape", kt, shape=[1, 2, 16, 16]))
    probs = p.op("softmax", p.op("mul", p.op("reshape", scores, shape=[1, 2, 2, 16, 16]), 0.25), dim=-1)
    out = p.op("matmul", p.op("reshape", probs, shape=[1, 2, 32, 16]), v)
    p.output(p.op("reshape", out, shape=[1, 4, 16, 16], name="O"))
    return p


@pytest.mark.skipif(runner.gxx() is None, reason="g++ is not on PATH: the CPU harness needs it")
def test_a_winner_with_tiles_of_rank_5_generates_and_runs_correctly(h100):
    """Grouped-query attention from PyTorch: its fused winner (1.6x) has rank-5 tiles, which code
    generation refused (at most 4), so `export --cuda` failed and a GPU search crashed on a proved
    winner. Tiles of any program rank are generated; the kernel runs right in the CPU harness."""
    p = _grouped_query_heads()
    best = run_search(p, h100, SearchConfig(), budget_s=120).best
    assert best.verdict.proved and not best.sgraph.name.endswith(".unfused")
    inst = instantiate(best.sgraph, best.best.params, H100)
    assert max(len(inst.tile(k.id, t)) for k in best.sgraph.kernels if isinstance(k, GraphKernel)
               for t in best.sgraph.info.blocks[k.id].shapes) == 5
    prog = generate(inst)
    for seed in (11, 12):
        inputs = random_inputs(p, seed)
        [got] = runner.run(prog, inputs)
        assert max_rel_err(got, evaluate(p, inputs)[0]) <= dtype("f16").tolerance, seed
    if nvcc_path() is not None:
        assert all(not r.spills for r in compile_report(prog.source))
