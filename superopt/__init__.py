"""superopt: a symbolic superoptimizer for tensor programs.

Give it a small tensor program; get back the fastest fused GPU kernel within the search bounds,
proved equivalent to the program, with its CUDA source, launch parameters and time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from superopt.core.version import __version__
from superopt.program import Program, ProgramError, Tensor

if TYPE_CHECKING:
    from superopt.frontends.compiled import compile
    from superopt.frontends.onnx_import import import_onnx
    from superopt.frontends.torch_import import from_torch

__all__ = ["Program", "ProgramError", "Tensor", "__version__", "compile", "from_torch", "import_onnx", "optimize"]

# Front ends that import a framework (torch, onnx) are loaded on first use: `import superopt`
# stays free of both.
_FRONTENDS = {"compile": "superopt.frontends.compiled", "from_torch": "superopt.frontends.torch_import",
              "import_onnx": "superopt.frontends.onnx_import"}


def __getattr__(name: str) -> Any:
    if name in _FRONTENDS:
        return getattr(importlib.import_module(_FRONTENDS[name]), name)
    raise AttributeError(f"module 'superopt' has no attribute {name!r}")


def optimize(program: Program, **options: Any) -> Any:
    """Find, prove and time the fastest schedule of `program`: see superopt.api.optimize."""
    from superopt.api import optimize as run

    return run(program, **options)
