"""The published workloads: the search finds, proves and repeats their fused schedules."""

from __future__ import annotations

import pytest
from search_helpers import graph_kernels, ops_of

from superopt import workloads
from superopt.config import SearchConfig
from superopt.search.driver import run_search
from superopt.search.instantiation import rank

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_search_finds_a_schedule_as_good_as_the_reference(name, h100, searched):
    program, outcome = searched(f"{name}:ci")
    ref = workloads.get(name).reference(program)
    ref_us = rank(ref, h100)[0].estimate.time_us
    best = outcome.best
    assert best.verdict.proved and best.verdict.egraph == "proved"
    assert best.best.estimate.time_us <= ref_us + 1e-9, (best.best.estimate.time_us, ref_us)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert best.best.estimate.time_us < baseline.best.estimate.time_us
    assert not outcome.stats.budget_exhausted


def test_rmsnorm_matmul_rediscovers_the_fused_family(searched):
    """One graph-defined kernel whose loop walks the hidden dim: both matmul operands walked, the
    product and the mean of squares accumulated, the division after the loop."""
    _, outcome = searched("rmsnorm_matmul:ci")
    fused = [v.sgraph for v in outcome.verified if len(v.sgraph.kernels) == 1 and graph_kernels(v.sgraph)]
    assert fused
    families = []
    for sg in fused:
        (k,) = graph_kernels(sg)
        fmap = {i.tensor: i.fmap for i in k.block.inputs}
        accs = sorted(a.kind for a in k.block.accumulators)
        families.append((fmap.get("X"), fmap.get("W"), accs, "matmul" in ops_of(k, "body"), ops_of(k, "post")))
    assert (1, 0, ["mean", "sum"], True, ["add", "const", "div", "sqrt"]) in families


def test_gated_mlp_rediscovers_the_fused_family(searched):
    _, outcome = searched("gated_mlp:ci")
    best = outcome.best.sgraph
    (k,) = graph_kernels(best)
    assert len(best.kernels) == 1
    assert ops_of(k, "body") == ["matmul", "matmul"]
    assert ops_of(k, "post") == ["mul", "silu"]
    assert {a.kind for a in k.block.accumulators} == {"sum"}
    assert {i.tensor: i.fmap for i in k.block.inputs} == {"X": 1, "W1": 0, "W2": 0}


def test_attention_finds_a_fused_schedule_better_than_unfused(searched):
    _, outcome = searched("gqa:ci")
    best = outcome.best
    assert graph_kernels(best.sgraph)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert best.best.estimate.time_us < baseline.best.estimate.time_us


def test_lora_fuses_into_one_proved_kernel(searched):
    """Neither Mirage nor Prism finds a kernel for LoRA; the whole block fits one launch here."""
    _, outcome = searched("lora:ci")
    best = outcome.best.sgraph
    assert len(best.kernels) == 1 and graph_kernels(best)
    assert outcome.best.verdict.proved


def test_same_input_gives_the_same_winner(h100, searched):
    program, first = searched("gqa:ci")
    second = run_search(program, h100, SearchConfig(), budget_s=120)
    assert first.best.sgraph.dumps() == second.best.sgraph.dumps()
    assert first.best.best.params == second.best.best.params
    assert first.stats.states == second.stats.states
