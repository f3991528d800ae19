"""superopt: a symbolic superoptimizer for tensor programs.

Give it a small tensor program; get back the fastest fused GPU kernel within the search bounds,
proved equivalent to the program, with its CUDA source, launch parameters and time.
"""

from __future__ import annotations

from superopt.program import Program, ProgramError, Tensor

__version__ = "0.1.0"

__all__ = ["Program", "ProgramError", "Tensor", "__version__"]
