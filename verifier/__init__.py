"""Verification of sGraphs against programs: e-graph proofs, finite fields, float checks.

    from superopt.verifier import verify_at
    from superopt.verifier.verify import verify

    verdict = verify(program, sgraph, target=target)          # a Verdict: `proved` when every layer passed
    verdict = verify_at(program, sgraph, params, verdict)    # and at the real shapes with these parameters

- `verify` runs every layer; it lives in the module `superopt.verifier.verify`, whose name it
  shares, so the package does not hand it out (that name is the module).
- `verify_at` adds the checks at the real shapes to a verdict; `FLOAT_SEED` seeds the float
  checks' inputs (a front end refuses a program not finite there before searching).
- `Oracle`, `AbstractAlgebra`, `abstract_program`, `abstract_sgraph`, `AE`, `AV`: the abstract
  expressions the search prunes by, and the oracle that says whether one is a subexpression of
  an equivalent form of the target.
- `prove(pairs, axes, limits)` is the e-graph proof alone (`Limits`, `ProofResult`).

Names load on first use, so that importing the package costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from superopt.verifier.egraph import Limits, ProofResult, prove
    from superopt.verifier.oracle import AE, AV, AbstractAlgebra, Oracle, abstract_program, abstract_sgraph
    from superopt.verifier.verify import FLOAT_SEED, verify_at

# Each name by the module that defines it, imported when first asked for; tests/test_layering.py
# keeps this, `__all__` and the typed imports above the same.
_SURFACE = {
    "superopt.verifier.egraph": ("Limits", "ProofResult", "prove"),
    "superopt.verifier.oracle": ("AE", "AV", "AbstractAlgebra", "Oracle", "abstract_program", "abstract_sgraph"),
    "superopt.verifier.verify": ("FLOAT_SEED", "verify_at"),
}
__all__ = ["AE", "AV", "FLOAT_SEED", "AbstractAlgebra", "Limits", "Oracle", "ProofResult", "abstract_program",
           "abstract_sgraph", "prove", "verify_at"]


def __getattr__(name: str) -> Any:
    home = next((module for module, names in _SURFACE.items() if name in names), None)
    if home is not None:
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
