"""The `torch.compile` backend "superopt": `torch.compile(model, backend="superopt")`.

Dynamo captures the model, AOTAutograd lowers it to ATen, and the ATen graph is cut into maximal
regions of ops superopt can import (convex, so no region waits on an op outside it that waits on
it). Each region becomes one program that runs through the same path as `superopt.compile`: its
proved kernels (from the kernel cache, or a search with `options={"search": True}`) on the GPU,
else the region's own ATen ops, eagerly. Everything else stays PyTorch's. What was replaced is
logged (logger "superopt.torch") and kept in the backend's `regions`.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from superopt.api import NoCandidate
from superopt.frontends.aten import BROADCASTING, AtenTranslator, op_name
from superopt.frontends.builder import ModelBuilder, Unexpressible, UnsupportedOp
from superopt.frontends.kernels import KernelPath, SearchOptions
from superopt.ops import LAYOUT
from superopt.program import ProgramError

log = logging.getLogger("superopt.torch")

LAYOUT_OPS = ("input", *LAYOUT)  # a region of these only is not worth a launch


def unsupported(node: fx.Node) -> str | None:
    """Why `node` cannot be part of a region (None: it can), found by importing it alone, its
    operands as inputs: a tuple-valued op counts only where each output its users read is one
    superopt computes (layer_norm's normalized values, not its saved mean)."""
    if node.target is operator.getitem:
        producer = node.args[0]
        return unsupported(producer) if isinstance(producer, fx.Node) else "getitem of a non-node"
    translator = AtenTranslator(ModelBuilder("probe"), operands_as_inputs=True)
    try:
        translator.node(node)
    except (UnsupportedOp, Unexpressible, ProgramError) as e:
        return str(e)
    if node.name in translator.broadcast:  # an expand: fine where every user broadcasts as numpy does
        needs = next((u for u in node.users if op_name(u) not in BROADCASTING), None)
        if needs is not None:
            return f"{op_name(node)}: its broadcast reaches {op_name(needs)}, which needs it materialized"
    value = translator.values[node.name]
    if isinstance(value, tuple):
        for user in node.users:
            if user.target is not operator.getitem or value[user.args[1]] is None:  # type: ignore[index]
                return f"{op_name(node)}: output {user} is one superopt does not compute"
    return None


class _Importable(OperatorSupportBase):
    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        return node.op == "call_function" and unsupported(node) is None


@dataclass
class Region:
    """One region of a compiled graph: its ops, its program, and how it runs."""

    name: str
    ops: list[str]
    program: str  # name and canonical hash
    replaced: bool  # runs as a superopt program (its kernels, or eager where they cannot run)
    runs: str  # "kernels" | "eager"
    kernels: int | None  # kernels of the proved winner (None: no winner)
    speedup: float | None  # the winner's over the unfused baseline
    time_source: str | None  # "measured" | "estimated"
    reason: str  # why it runs eager ("" when it runs its kernels)


class RegionKernel(torch.nn.Module):
    """A region as a module: its program's kernels when they can run, else its ATen ops."""

    def __init__(self, eager: fx.GraphModule, path: KernelPath, inputs: list[str | None]) -> None:
        super().__init__()
        self.eager = eager
        self.path = path
        self.inputs = inputs  # per positional argument: its program input id (None: not read)

    def forward(self, *args: torch.Tensor) -> Any:
        if self.path.kernels is not None:
            outs = self.path.run({pid: a for pid, a in zip(self.inputs, args, strict=True) if pid is not None})
            if outs is not None:
                return tuple(outs)
        return self.eager(*args)


class SuperoptBackend:
    """A torch.compile backend; `regions` lists what each compilation replaced."""

    def __init__(self, options: SearchOptions | None = None) -> None:
        self.options = options or SearchOptions()
        self.regions: list[Region] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list[torch.Tensor],
                 options: Mapping[str, Any] | None = None, mode: str | None = None) -> Any:
        """torch.compile's `options` are `SearchOptions` fields (`{"search": True, "budget_s": 30}`)."""
        from torch._dynamo.backends.common import aot_autograd

        if mode is not None:
            raise ValueError(f"the superopt backend has no modes (got mode={mode!r}); its options are "
                             f"{', '.join(f.name for f in fields(SearchOptions))}")
        chosen = replace(self.options, **dict(options or {}))
        return aot_autograd(fw_compiler=lambda g, _: self.compile_graph(g, chosen))(gm, example_inputs)

    def compile_graph(self, gm: fx.GraphModule, options: SearchOptions) -> fx.GraphModule:
        """Replace each maximal importable region of an ATen graph by a `RegionKernel`."""
        partitioner = CapabilityBasedPartitioner(gm, _Importable(), allows_single_node_partition=True)
        partitions = partitioner.propose_partitions()
        fused = fuse_by_partitions(gm, [p.nodes for p in partitions], prefix="superopt_region_",
                                   always_return_tuple=True)
        for node in fused.graph.nodes:
            if node.op == "call_module" and str(node.target).startswith("superopt_region_"):
                sub = getattr(fused, str(node.target))
                kernel = self._region(str(node.target), sub, options)
                if kernel is not None:
                    setattr(fused, str(node.target), kernel)
        fused.recompile()
        return fused

    def _region(self, name: str, sub: fx.GraphModule, options: SearchOptions) -> RegionKernel | None:
        ops = [op_name(n) for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        builder = ModelBuilder(name)
        translator = AtenTranslator(builder)
        try:
            program = builder.finish([builder.tensor(v) for v in translator.graph(sub.graph)])
        except (UnsupportedOp, Unexpressible, ProgramError) as e:
            self._report(Region(name, ops, "", False, "eager", None, None, None, f"not imported: {e}"))
            return None
        label = f"{program.name} {program.canonical_hash()[:12]}"
        if all(n.op in LAYOUT_OPS for n in program.nodes.values()):
            self._report(Region(name, ops, label, False, "eager", None, None, None, "layout ops only"))
            return None
        try:
            path = KernelPath(program, options, f"{name} ({len(ops)} ops)")
        except NoCandidate as e:  # nothing proved: the region is PyTorch's
            self._report(Region(name, ops, label, False, "eager", None, None, None, str(e)))
            return None
        r = path.result
        self._report(Region(name, ops, label, True, "kernels" if path.kernels else "eager",
                            r.best.kernels if r else None, r.speedup if r else None,
                            r.best.time_source if r else None, path.reason))
        reads = {ph: pid for ph, pid in translator.inputs.items() if pid in program.nodes}
        return RegionKernel(sub, path, [reads.get(n.name) for n in sub.graph.nodes if n.op == "placeholder"])

    def _report(self, region: Region) -> None:
        self.regions.append(region)
        gain = f", {region.kernels} kernel(s), {region.speedup:.2f}x ({region.time_source})" if region.kernels else ""
        log.info("%s: %d ops (%s) -> %s%s%s", region.name, len(region.ops), ", ".join(region.ops),
                 region.runs if region.replaced else "left to PyTorch", gain,
                 f": {region.reason}" if region.reason else "")


BACKEND = SuperoptBackend()  # what backend="superopt" names (the entry point in pyproject.toml)
