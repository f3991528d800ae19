"""`superopt.compile`: a PyTorch module in, a callable with the module's signature out.

The module is imported as one program (`from_torch`), its proved kernels are found (the kernel
cache, or a search when asked for), and each call runs them on the caller's tensors, or runs the
module itself where they cannot run (no GPU, no kernel): the answer is the module's either way.
The program is static: every call must bring the example inputs' shapes and dtypes.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

from superopt.config import DEFAULT_BUDGET_S, DEFAULT_TARGET, SearchConfig
from superopt.frontends.kernels import KernelPath, SearchOptions
from superopt.frontends.torch_import import ImportedModel, Model, example_tuple, import_model


class CompiledModel:
    """The model, running superopt's proved kernels where it can. `program`, `result` (the
    proved winner, or None) and `reason` (why it runs eager; empty when it runs kernels) say
    what it does."""

    def __init__(self, model: Model, examples: tuple[torch.Tensor, ...], imported: ImportedModel,
                 path: KernelPath) -> None:
        self.model = model
        self.examples = examples
        self.imported = imported
        self.path = path
        self.program = imported.program
        self.result = path.result
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        self.__signature__ = inspect.signature(forward)
        self.__doc__ = forward.__doc__

    @property
    def reason(self) -> str:
        return self.path.reason

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given = _positional(self.__signature__.bind(*args, **kwargs))
        # An argument set to its default (attention_mask=None, as Hugging Face passes it) is
        # what the trace saw: no other call.
        given = given[:len(self.examples)] + [(n, v) for n, v in given[len(self.examples):]
                                              if not _is_default(self.__signature__, n, v)]
        if len(given) != len(self.examples):
            # An argument the examples did not give (a scale, a flag, an optional tensor) was traced
            # at its default: the program computes that, so a call that sets it cannot run it.
            extra = f" ({', '.join(repr(n) for n, _ in given[len(self.examples):])} too: the program was traced " \
                "with their defaults; compile with them among the example inputs)" if len(given) > len(self.examples) \
                else ""
            raise TypeError(f"{self.program.name} was compiled for {len(self.examples)} tensor arguments, "
                            f"got {len(given)}{extra}")
        tensors = [got for _, got in given[: len(self.examples)]]
        for (name, got), want in zip(given, self.examples, strict=False):
            if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
                what = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
                raise ValueError(f"argument {name!r}: {what}; {self.program.name} was compiled for "
                                 f"{tuple(want.shape)} {want.dtype} (compile again for other shapes)")
        outs = self.path.run(self._inputs(tensors)) if self.path.kernels is not None else None
        if outs is None:
            return self.model(*args, **kwargs)
        return tree_unflatten([outs[i] for i in self.imported.outputs], self.imported.out_spec)

    def _inputs(self, args: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each program input's tensor for this call, read from the live module (so that
        `model.cuda()` or a weight update after compiling is seen)."""
        module = self.model if isinstance(self.model, torch.nn.Module) else None
        out: dict[str, torch.Tensor] = {}
        for pid, src in self.imported.sources.items():
            if src.kind == "argument":
                out[pid] = args[src.index]
            elif src.kind == "constant" or module is None:
                out[pid] = self.imported.exported.constants[src.path]  # type: ignore[assignment]
            else:
                out[pid] = module.get_parameter(src.path) if src.kind == "parameter" else module.get_buffer(src.path)
        return out


def _is_default(signature: inspect.Signature, name: str, value: Any) -> bool:
    """Is `value` the default of parameter `name`: that object, or an equal constant of its type?"""
    param = signature.parameters.get(name)
    if param is None or param.default is inspect.Parameter.empty:
        return False
    default = param.default
    return value is default or (type(value) is type(default) and isinstance(value, (bool, int, float, str))
                                and value == default)


def _positional(bound: inspect.BoundArguments) -> list[tuple[str, Any]]:
    """The call's arguments in the order `torch.export` saw the example inputs, by name."""
    out: list[tuple[str, Any]] = []
    for name, value in bound.arguments.items():
        if bound.signature.parameters[name].kind == inspect.Parameter.VAR_POSITIONAL:
            out.extend((f"{name}[{i}]", v) for i, v in enumerate(value))
        else:
            out.append((name, value))
    return out


def compile(
    model: Model,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    search: bool = False,
    target: str = DEFAULT_TARGET,
    budget_s: float | None = DEFAULT_BUDGET_S,
    max_states: int | None = None,
    config: SearchConfig | None = None,
    force: bool = False,
    cache: bool = True,
    db: str | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> CompiledModel:
    """`model` as a callable running superopt's proved kernels: looked up in the kernel cache,
    or searched for with `search=True` (then the options are `superopt.optimize`'s). Raises
    `UnsupportedOp` for an op superopt cannot import, naming it and its source line."""
    examples = example_tuple(example_inputs)
    imported = import_model(model, examples)
    options = SearchOptions(search=search, target=target, budget_s=budget_s, max_states=max_states, config=config,
                            force=force, cache=cache, db=db, workers=workers, ray_address=ray_address)
    return CompiledModel(model, examples, imported, KernelPath(imported.program, options, imported.program.name))
