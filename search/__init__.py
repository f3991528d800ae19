"""Symbolic search: enumerate sGraphs, prune by abstract expressions, verify, instantiate.

    from superopt.search import run_search
    outcome = run_search(program, target, config, budget_s=60)   # an Outcome: the proved sGraphs, ranked
    best = outcome.best                                          # Verified: sGraph, verdict, instantiations

- `run_search` searches in this process, `run_distributed` on Ray workers (same Outcome);
  `CONTENDERS` is how many of the best the search proves when a GPU re-times them.
- `space_of(program)` is the space searched (`UnsupportedProgram` when a program has none),
  `ProgramViews` the program with its views folded out, `rank` an sGraph's best instantiations.
- `SGraphStore` keeps verified sGraphs for a search of the same program at other shapes.

Names load on first use, so that importing the package costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from superopt.search.distributed import run_distributed
    from superopt.search.driver import CONTENDERS, Outcome, Verified, run_search
    from superopt.search.instantiation import Ranked, rank
    from superopt.search.reuse import SGraphStore
    from superopt.search.space import UnsupportedProgram, space_of
    from superopt.search.views import ProgramViews

# Each name by the module that defines it, imported when first asked for; tests/test_layering.py
# keeps this, `__all__` and the typed imports above the same.
_SURFACE = {
    "superopt.search.distributed": ("run_distributed",),
    "superopt.search.driver": ("CONTENDERS", "Outcome", "Verified", "run_search"),
    "superopt.search.instantiation": ("Ranked", "rank"),
    "superopt.search.reuse": ("SGraphStore",),
    "superopt.search.space": ("UnsupportedProgram", "space_of"),
    "superopt.search.views": ("ProgramViews",),
}
__all__ = ["CONTENDERS", "Outcome", "ProgramViews", "Ranked", "SGraphStore", "UnsupportedProgram", "Verified",
           "rank", "run_distributed", "run_search", "space_of"]


def __getattr__(name: str) -> Any:
    home = next((module for module, names in _SURFACE.items() if name in names), None)
    if home is not None:
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
