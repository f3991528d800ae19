"""`from_torch`: a PyTorch module (or function) and example inputs in, a superopt program out.

The module is captured with `torch.export` (ATen ops, no Python left), its parameters, buffers and
tensor constants become program inputs named after their module paths (`mlp.up.weight`), the
example inputs give the shapes and dtypes, and each ATen op is lowered by `aten.AtenTranslator`.
`import_module` also returns how to feed the program from a call of the module (which argument or
parameter each input is, and where each output goes), which is what `superopt.compile` needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._pytree import TreeSpec

from superopt.frontends.aten import DTYPES, AtenTranslator
from superopt.frontends.builder import ModelBuilder
from superopt.ops import Op
from superopt.program import Program, ProgramError, Tensor

Model = torch.nn.Module | Callable[..., Any]


@dataclass(frozen=True)
class Source:
    """Where a program input's tensor comes from at a call: the `index`-th argument, or the
    module's parameter, buffer or constant at `path`."""

    kind: str  # "argument" | "parameter" | "buffer" | "constant"
    index: int = -1
    path: str = ""


@dataclass(frozen=True)
class ImportedModel:
    program: Program
    sources: dict[str, Source]  # program input id -> its source
    outputs: list[int]  # each model output (flattened) -> its index among the program's outputs
    out_spec: TreeSpec  # how the flat outputs nest (a tensor, a tuple, ...)
    exported: torch.export.ExportedProgram


class _Function(torch.nn.Module):
    """A plain function as a module, for `torch.export`: the function is the module's forward,
    so its arguments keep their names (they name the program's inputs)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.forward = fn
        # torch.export keeps the stack frames of `forward` methods only, unless a function is
        # registered as an anchor (recent torch): then an error can name the function's line.
        anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
        if anchor is not None:
            anchor(fn)


def from_torch(model: Model, example_inputs: torch.Tensor | Sequence[torch.Tensor]) -> Program:
    """The program of `model` at the shapes and dtypes of `example_inputs` (f16, bf16 or f32).
    Raises `UnsupportedOp` (a ProgramError) naming the first op superopt cannot say, and the
    user's source line that wrote it."""
    return import_model(model, example_inputs).program


def example_tuple(example_inputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The example inputs as a tuple of tensors of superopt's dtypes (else a ProgramError)."""
    examples = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    for i, x in enumerate(examples):
        if not isinstance(x, torch.Tensor):
            raise ProgramError(f"example input {i}: expected a tensor, got {type(x).__name__}")
        if x.dtype not in DTYPES:
            raise ProgramError(f"example input {i}: dtype {x.dtype}; superopt programs compute "
                               f"{', '.join(DTYPES.values())}")
    return examples


def _unaliased(examples: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The examples, each that shares memory with an earlier one copied: torch.export gives one
    placeholder to aliased inputs, so forward(x, residual) traced with (x, x) would become a
    program of one input, wrong for any call with two different tensors."""
    seen: set[int] = set()
    out = []
    for x in examples:
        storage = x.untyped_storage().data_ptr()
        out.append(x.clone() if storage in seen else x)
        seen.add(storage)
    return tuple(out)


def import_model(model: Model, example_inputs: torch.Tensor | Sequence[torch.Tensor]) -> ImportedModel:
    examples = _unaliased(example_tuple(example_inputs))
    module = model if isinstance(model, torch.nn.Module) else _Function(model)
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "function")
    try:
        # run_decompositions({}) only functionalizes: `h += x` on a value becomes an add, a write
        # to an input or buffer an output spec (refused below), and no op is decomposed.
        exported = torch.export.export(module, examples, strict=False).run_decompositions({})
    except Exception as e:  # whatever the model's Python raised while traced
        first = (str(e).strip().splitlines() or [""])[0]
        raise ProgramError(f"{name}: torch.export cannot capture it ({type(e).__name__}: {first}); superopt "
                           "imports what torch.export captures (no Python control flow on tensor values)") from e
    sig = exported.graph_signature
    changed = [s for s in sig.output_specs if s.kind != OutputKind.USER_OUTPUT]
    if changed:
        what = changed[0].target or changed[0].arg
        raise ProgramError(f"{name}: it writes {what} in place ({changed[0].kind.name}); superopt programs are pure "
                           "functions of their inputs")
    names: dict[str, str] = {}
    scalars: dict[str, float] = {}
    sources: dict[str, Source] = {}
    argument = 0
    for spec in sig.input_specs:
        placeholder = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            sources[placeholder] = Source("argument", index=argument)
            argument += 1
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and spec.target:
            kind = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer"}.get(spec.kind, "constant")
            value = exported.constants.get(spec.target) if kind == "constant" else None
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                scalars[placeholder] = float(value.item())
                continue
            names[placeholder] = spec.target
            sources[placeholder] = Source(kind, path=spec.target)
        else:
            raise ProgramError(f"{name}: input {placeholder} ({spec.kind.name}) is not a tensor superopt can read")
    builder = ModelBuilder(name)
    translator = AtenTranslator(builder, names, scalars)
    values = translator.graph(exported.graph_module.graph)
    tensors: list[Tensor] = []
    for i, v in enumerate(values):
        if not isinstance(v, Tensor) or v.id in translator.inputs.values() or v.node.op in ("input", Op.CONST):
            raise ProgramError(f"{name}: output {i} is not computed by the model (an input or a constant returned "
                               "as it is); superopt programs compute their outputs")
        tensors.append(v)
    program = builder.finish(tensors)
    outputs = [program.outputs.index(v.id) for v in tensors]
    by_input = {pid: sources[ph] for ph, pid in translator.inputs.items() if pid in program.nodes}
    return ImportedModel(program, by_input, outputs, exported.call_spec.out_spec, exported)
