"""Shape reuse: the verified symbolic sGraphs of a search, kept for the same program at other shapes.

A verified sGraph holds for every size that meets its constraints, so optimizing the same program
at another shape only re-instantiates it (Prism's shape-generic checkpoints). Programs are keyed by
their structure: the canonical form with every dim replaced by whether it is 1 (broadcasting
depends on that), plus the search configuration with its space version (`SearchConfig.to_json`):
what a smaller space stored is a miss for a larger one. Files live under the cache directory; a stored
sGraph that no longer fits (a corrupt file, a changed IR) is skipped, never trusted: the caller
re-verifies every reused sGraph at the new shape before using it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from superopt.canonical import canonical_form
from superopt.config import SearchConfig
from superopt.digest import stable_digest
from superopt.paths import cache_dir, write_atomically
from superopt.program import Program
from superopt.sgraph import SGraph, SGraphError, check_matches, input_decls, named_for, rebind


def structure_key(program: Program, config: SearchConfig) -> str:
    form = canonical_form(program)
    for node in form["nodes"]:
        shape_at = 1 if node[0] == "input" else 3
        node[shape_at] = [1 if d == 1 else "n" for d in node[shape_at]]
    return stable_digest({"program": form, "config": config.to_json()})


class SGraphStore:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or cache_dir() / "sgraphs"

    def _path(self, program: Program, config: SearchConfig) -> Path:
        return self.directory / f"{structure_key(program, config)}.json"

    def save(self, program: Program, config: SearchConfig, sgraphs: list[SGraph], stats: dict[str, Any]) -> None:
        path = self._path(program, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"program": program.name, "search": stats, "sgraphs": [sg.to_json() for sg in sgraphs]}
        write_atomically(path, json.dumps(data))

    def load(self, program: Program, config: SearchConfig) -> tuple[list[SGraph], dict[str, Any]] | None:
        """The stored sGraphs rebound to this program's shapes (those that fit), or None."""
        path = self._path(program, config)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        decls = input_decls(program)
        out = []
        for raw in data.get("sgraphs", []):
            try:
                stored = SGraph.from_json(raw)
                sg = rebind(stored, decls, named_for(program.name, stored.name))
                check_matches(sg, program)
            except (SGraphError, ValueError, KeyError, TypeError):
                continue
            out.append(sg)
        return out, dict(data.get("search", {}))

