"""The space version: derived from the constants that bound the search space, so that a winner
found in one space is not the answer in another (a miss, not an error)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from db_fixtures import standin_result

from superopt import config, workloads
from superopt.config import SearchConfig, space_constants, space_version
from superopt.db.cache import KernelCache
from superopt.db.engine import open_database
from superopt.digest import stable_digest
from superopt.targets import TARGETS, fingerprint

REPO = Path(__file__).resolve().parent.parent

# The module constants of the search (numbers and collections) that do not bound its space, and
# why. A new one in search/ or superopt/config.py fails the first test until it goes into
# `space_constants` (it changes what a configuration covers) or here (it does not).
NOT_SPACE = {
    "_SURFACE": "the names the package hands out (search/__init__.py), by module",
    "DEFAULT_BUDGET_S": "a budget: how long to look",
    "MAX_VALUES": "where a bound applies (the value paths), not what it admits: the same candidates",
    "COMMUTATIVE": "a symmetry: the other operand order computes the same value",
    "UNIT": "the class number of a size-1 dim",
    "SPLIT_WIDTH": "how a walk is dealt out to parts: all parts together walk it whole",
    "POST_ENTRIES": "a memo size", "BODY_CACHE_ENTRIES": "a memo size", "FLOOR_ENTRIES": "a memo size",
    "BLOCK_CACHE_ENTRIES": "a memo size", "BLOCK_CACHE_STATES": "a memo size", "PLAN_ENTRIES": "a memo size",
    "SMALL_JOB": "where it runs", "PARTS_PER_WORKER": "where it runs", "IN_FLIGHT_PER_WORKER": "where it runs",
    "CONNECT_TIMEOUT_S": "where it runs",
    "CONTENDERS": "how many of the best a GPU re-times, like a budget",
    "PROBE_BLOCK_OPS": "the probe finds a bound early", "PROBE_STATES": "the probe finds a bound early",
    "PROBE_AFTER_STATES": "the probe finds a bound early", "PROBE_ROOM": "the probe finds a bound early",
    "HOLD_STATES": "the order candidates are proved in", "FULL_COLLECTION_AFTER": "garbage collection",
    "SIZES": "the fingerprint's sizes, to tell values apart", "SEED": "the fingerprint's random values",
    "RTOL": "how near two values computed in float64 must be to be one (`StoredValues`), to tell them apart",
    "SHRINK_CAP": "the small sizes `StoredValues` checks a program with a reshape at, to tell values apart",
    "MAX_ELEMENTS": "how large a program `StoredValues` checks its candidates against, a cost",
    "TIE": "estimates that equal within rounding",
    "_ORDER": "the canonical order of ops: the same ops in another order",
    "VIEWS": "a fact of the ops (their results are views of what they read), not a bound",
    "_SEARCHERS": "a worker process's state",
    "MAX_BODY_BYTES": "the service's request limits", "BODY_TIMEOUT_S": "the service's request limits",
    "LEASE_S": "how a worker holds a job", "POLL_S": "how a worker holds a job",
    "MAX_LEASE_S": "how a worker holds a job", "MAX_ROWS": "how much of the cache a listing shows",
    "DB_RETRY_S": "how long a worker waits for its database",
}


def _constants() -> dict[str, str]:
    """Numbers and collections named in capitals at the top level of search/*.py and
    superopt/config.py, by name: the module that assigns them."""
    found: dict[str, str] = {}
    for path in [*sorted((REPO / "search").glob("*.py")), REPO / "superopt" / "config.py"]:
        module = importlib.import_module("superopt.config" if path.parent.name == "superopt"
                                         else f"superopt.search.{path.stem}")
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.lstrip("_").isupper():
                    value = getattr(module, t.id)
                    if isinstance(value, int | float | tuple | dict | frozenset) and not isinstance(value, bool):
                        found[t.id] = module.__name__
    return found


def test_every_search_constant_is_in_the_space_or_said_not_to_be():
    found = _constants()
    assert sorted(set(found) - set(space_constants()) - set(NOT_SPACE)) == []
    assert sorted(set(NOT_SPACE) - set(found)) == []  # none listed that is gone
    assert {found[name] for name in space_constants()} == {"superopt.config"}  # defined beside the version


def test_the_space_constants_are_these():
    """Written out, so that a change to the list is a change to this test too."""
    assert sorted(space_constants()) == [
        "GRID_TILES", "LOOP_RANGES", "MAX_ACCUMULATORS", "MAX_OUTPUTS", "MIDDLES", "PART_ACCUMULATORS",
        "SPACE_RULES", "SPLITTABLE", "SPLIT_ENDS", "SPLIT_KEEP", "UNSUPPORTED",
    ]


def _changed(value: object) -> object:
    if isinstance(value, int):
        return value + 1
    if isinstance(value, tuple):
        return (*value, value[-1])
    assert isinstance(value, dict)
    return {**value, "gelu": ("tanh",)}


@pytest.mark.parametrize("name", sorted(space_constants()))
def test_the_space_version_moves_with_each_space_constant(monkeypatch, name):
    version, key = space_version(), SearchConfig().hash()
    monkeypatch.setattr(config, name, _changed(getattr(config, name)))
    assert space_version() != version and SearchConfig().hash() != key
    assert SearchConfig().to_json()["space_version"] == space_version()


def test_the_space_version_is_the_same_in_every_process_and_configuration():
    """Part of keys that outlive a process: a digest of the constants alone, never `hash`."""
    fresh = subprocess.run([sys.executable, "-c", "from superopt.config import space_version; print(space_version())"],
                           capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "1"})
    assert fresh.stdout.strip() == space_version() == stable_digest(space_constants())[:16]
    assert SearchConfig(max_kernel_ops=2).to_json()["space_version"] == space_version()


def test_a_winner_of_another_space_is_a_cache_miss(tmp_path, monkeypatch):
    """Stored under the old space's configuration hash: looked up from a larger space, it is not
    found (no integrity warning, no error), and the larger space's own search is stored beside it."""
    db = open_database(f"sqlite:///{tmp_path / 'superopt.db'}")
    cache = KernelCache(db)
    program, h100 = workloads.resolve("gqa:ci"), fingerprint(TARGETS["h100"])
    assert cache.store(standin_result(program))["cached"]
    assert cache.lookup(program, h100) is not None
    monkeypatch.setattr(config, "PART_ACCUMULATORS", config.PART_ACCUMULATORS + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.lookup(program, h100) is None
    assert cache.store(standin_result(program))["cached"]
    assert cache.lookup(program, h100) is not None
    monkeypatch.undo()
    assert cache.lookup(program, h100) is not None
    db.close()
