"""The kernels every execution check runs (CPU emulation here, the GPU in test_runtime_gpu):
each workload's reference sGraph at its :ci shape under a few parameter choices, plus shapes and
dtypes that take the tensor-core and bf16/f32 paths."""

from __future__ import annotations

import math
from collections.abc import Callable

from superopt import workloads
from superopt.assignments import enumerate_assignments
from superopt.build import SGraphBuilder
from superopt.codegen import CudaProgram, generate
from superopt.costmodel import best_params
from superopt.instantiate import instantiate
from superopt.program import Program
from superopt.sgraph import SGraph
from superopt.targets import TARGETS
from superopt.workloads import llm

H100 = TARGETS["h100"]
NAMES = list(workloads.WORKLOADS)


def program_zoo() -> Program:
    """Ops no workload uses: softmax, max without keepdim, gelu/relu/sigmoid/rsqrt/neg/sub."""
    p = Program("zoo")
    x = p.input("X", (8, 32), "f16")
    p.output(p.op("softmax", x, dim=1, name="S"))
    p.output(p.op("max", p.op("sub", p.op("gelu", x), p.op("relu", x)), dim=1, keepdim=False, name="M"))
    p.output(p.op("mul", p.op("rsqrt", p.op("add", p.op("sigmoid", x), 1.0)), p.op("neg", x), name="R"))
    return p


def reference_zoo(p: Program) -> SGraph:
    """One kernel, rows split over the grid, no loop: every output from the same input tile."""
    b = SGraphBuilder.for_program(p, "zoo.fused")
    k = b.graph(grid=[("x", "gx")], loop=("f", 1))
    xt = k.input("X", [0], None)
    k.output(k.acc(k.op("softmax", xt, dim=1)), "S", [0])
    diff = k.op("sub", k.op("gelu", xt), k.op("relu", xt))
    k.output(k.acc(k.op("max", diff, dim=1, keepdim=False)), "M", [0])
    one = k.op("const", value=1.0)
    r = k.op("mul", k.op("rsqrt", k.op("add", k.op("sigmoid", xt), one)), k.op("neg", xt))
    k.output(k.acc(r), "R", [0])
    return b.build(["S", "M", "R"])


def program_concat() -> Program:
    p = Program("silu_rows")
    p.output(p.op("silu", p.input("X", (4, 64), "f16"), name="O"))
    return p


def reference_concat(p: Program) -> SGraph:
    """The loop walks columns and a concat accumulator puts the tiles side by side."""
    b = SGraphBuilder.for_program(p, "silu_rows.concat")
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("silu", k.input("X", [0], 1)), "concat", dim=1), "O", [0])
    return b.build(["O"])


VARIANTS: dict[str, tuple[Callable[[], Program], Callable[[Program], SGraph]]] = {
    "op-zoo": (program_zoo, reference_zoo),
    "concat-accumulator": (program_concat, reference_concat),
    "gqa-wmma-batched": (lambda: llm.program_gqa(2, 16, 64, 16), llm.reference_gqa),
    "qknorm_gqa-wmma": (lambda: llm.program_gqa(2, 16, 64, 16, qk_norm=True),
                        lambda p: llm.reference_gqa(p, qk_norm=True)),
    "lora-wmma": (lambda: llm.program_lora(16, 32, 32, 16), llm.reference_lora),
    "gated_mlp-wmma-bf16": (lambda: llm.program_gated_mlp(16, 32, 32, "bf16"), llm.reference_gated_mlp),
    "rmsnorm_mlp-f32": (lambda: llm.program_rmsnorm_mlp(4, 64, 48, "f32"), llm.reference_rmsnorm_mlp),
    "ntrans-bf16": (lambda: llm.program_ntrans(6, 64, "bf16"), llm.reference_ntrans),
}

Case = tuple[Program, dict[str, int], CudaProgram]


SCANNED_ASSIGNMENTS = 20_000  # a winner of several graph kernels has billions of valid assignments


def param_choices(sg: SGraph) -> list[dict[str, int]]:
    """The cost model's choice, the first valid assignment, and the one that splits the most among
    the first `SCANNED_ASSIGNMENTS` (listing them all took 12 GB for a decoder layer's winner of
    five graph kernels)."""
    valid = list(enumerate_assignments(sg, H100, limit=SCANNED_ASSIGNMENTS))
    most_split = max(valid, key=lambda v: (sum(x > 1 for x in v.values()), math.prod(v.values())))
    picks: list[dict[str, int]] = []
    for v in (best_params(sg, H100), valid[0], most_split):
        if v not in picks:
            picks.append(v)
    return picks


def ci_cases(name: str) -> list[Case]:
    program, sg = workloads.reference_for(f"{name}:ci")
    return [(program, v, generate(instantiate(sg, v, H100))) for v in param_choices(sg)]


def variant(name: str) -> tuple[Program, SGraph]:
    make, ref = VARIANTS[name]
    program = make()
    return program, ref(program)


def variant_cases(name: str) -> list[Case]:
    program, sg = variant(name)
    valid = list(enumerate_assignments(sg, H100))
    return [(program, v, generate(instantiate(sg, v, H100))) for v in (valid[0], valid[-1])]
