"""The built-in workloads: LLM blocks measured by Mirage and Prism, with reference sGraphs.

A workload is named `NAME` (its default published shape), `NAME:LABEL` (another published shape)
or `NAME:ci` (a small shape that runs in seconds on a CPU). `resolve("gqa:ci")` gives the program;
`get("gqa").reference(program)` the hand-written fused sGraph for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from superopt.program import Program
from superopt.sgraph import SGraph
from superopt.workloads import llm

PRISM_ND = [(8, 1024), (8, 2048), (8, 4096), (16, 1024), (16, 4096)]
PRISM_ATTN = [(2, 8, 1, 1024, 128), (2, 8, 128, 1024, 128), (2, 32, 1, 1024, 128), (4, 8, 1, 1024, 128)]


@dataclass(frozen=True)
class Workload:
    name: str
    computation: str
    build: Callable[..., Program]
    reference: Callable[[Program], SGraph]
    shapes: Mapping[str, Mapping[str, Any]]  # label -> keyword sizes for `build`
    default: str
    source: str

    def program(self, label: str | None = None) -> Program:
        label = label or self.default
        if label not in self.shapes:
            raise KeyError(
                f"workload {self.name!r} has no shape {label!r}; known: {', '.join(self.shapes)}"
            )
        p = self.build(**self.shapes[label])
        p.name = self.name if label == self.default else f"{self.name}:{label}"
        return p


def _nd_shapes(extra: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    shapes = {k: dict(v) for k, v in extra.items()}
    for n, d in PRISM_ND:
        shapes[f"prism-{n}x{d}"] = {"n": n, "d": d, "e": d}
    return shapes


def _attn_shapes(qk_norm: bool) -> dict[str, dict[str, Any]]:
    shapes: dict[str, dict[str, Any]] = {
        "mirage-bs1": {"b": 2, "m": 256, "n": 4096, "dh": 64},
        "mirage-bs8": {"b": 16, "m": 256, "n": 4096, "dh": 64},
    }
    for b, h, q, kv, dh in PRISM_ATTN:
        shapes[f"prism-{b}x{h}x{q}x{kv}x{dh}"] = {"b": b, "m": h * q, "n": h * kv, "dh": dh}
    shapes["ci"] = {"b": 2, "m": 8, "n": 64, "dh": 16}
    return {k: {**v, "qk_norm": qk_norm} for k, v in shapes.items()}


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "rmsnorm_matmul", "O = rms_norm(X) @ W", llm.program_rmsnorm_matmul, llm.reference_rmsnorm_matmul,
            _nd_shapes({
                "mirage-bs1": {"n": 2, "d": 4096, "e": 6144},
                "mirage-bs8": {"n": 16, "d": 4096, "e": 6144},
                "ci": {"n": 4, "d": 64, "e": 48},
            }),
            "mirage-bs1", "Mirage RMSNorm (LLaMA-2-7B); Prism rms_norm",
        ),
        Workload(
            "gated_mlp", "O = silu(X @ W1) * (X @ W2)", llm.program_gated_mlp, llm.reference_gated_mlp,
            _nd_shapes({"mirage": {"n": 8, "d": 4096, "e": 4096}, "ci": {"n": 4, "d": 64, "e": 48}}),
            "mirage", "Mirage GatedMLP (Falcon-7B); Prism swiglu",
        ),
        Workload(
            "rmsnorm_mlp", "O = (rms_norm(X) @ Wu) * (rms_norm(X) @ Wg)", llm.program_rmsnorm_mlp,
            llm.reference_rmsnorm_mlp, _nd_shapes({"ci": {"n": 4, "d": 64, "e": 48}}),
            "prism-8x4096", "Prism rmsnorm_mlp",
        ),
        Workload(
            "lora", "O = X @ W + (X @ A) @ B", llm.program_lora, llm.reference_lora,
            {"mirage": {"n": 16, "d": 256, "e": 4096, "r": 16}, "ci": {"n": 4, "d": 32, "e": 48, "r": 8}},
            "mirage", "Mirage LoRA (GPT-3-7B-LoRA)",
        ),
        Workload(
            "gqa", "O = (exp(Q @ K) / sum(exp(Q @ K))) @ V", llm.program_gqa, llm.reference_gqa,
            _attn_shapes(False), "mirage-bs1", "Mirage GQA (LLaMA-3-70B, 4-GPU TP); Prism attention",
        ),
        Workload(
            "qknorm_gqa", "gqa after rms_norm of Q and K", llm.program_gqa,
            partial(llm.reference_gqa, qk_norm=True), _attn_shapes(True), "mirage-bs1",
            "Mirage QKNorm (Chameleon-7B); Prism qk_norm_attention",
        ),
        Workload(
            "ntrans", "O = rms_norm(X + alpha * (rms_norm(H) + X))", llm.program_ntrans, llm.reference_ntrans,
            {"mirage-bs1": {"n": 8, "d": 4096}, "mirage-bs8": {"n": 64, "d": 4096}, "ci": {"n": 6, "d": 64}},
            "mirage-bs1", "Mirage nTrans (nGPT-1B)",
        ),
    ]
}


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; built-in: {', '.join(WORKLOADS)}") from None


def split_name(spec: str) -> tuple[Workload, str]:
    """'gqa:ci' -> (gqa workload, 'ci'); 'gqa' -> (gqa, its default label)."""
    name, colon, label = spec.partition(":")
    w = get(name)
    label = label if colon else w.default
    if label not in w.shapes:
        raise KeyError(f"workload {name!r} has no shape {label!r}; known: {', '.join(w.shapes)}")
    return w, label


def resolve(spec: str) -> Program:
    w, label = split_name(spec)
    return w.program(label)


def reference_for(spec: str) -> tuple[Program, SGraph]:
    w, label = split_name(spec)
    p = w.program(label)
    return p, w.reference(p)


def is_builtin(spec: str) -> bool:
    return spec.partition(":")[0] in WORKLOADS
