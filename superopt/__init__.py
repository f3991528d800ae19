"""superopt: a symbolic superoptimizer for tensor programs.

Give it a small tensor program; get back the fastest fused GPU kernel within the search bounds,
proved equivalent to the program, with its CUDA source, launch parameters and time.
"""

from __future__ import annotations

from typing import Any

from superopt.program import Program, ProgramError, Tensor

__version__ = "0.1.0"

__all__ = ["Program", "ProgramError", "Tensor", "__version__", "optimize"]


def optimize(program: Program, **options: Any) -> Any:
    """Find, prove and time the fastest schedule of `program`: see superopt.api.optimize."""
    from superopt.api import optimize as run

    return run(program, **options)
