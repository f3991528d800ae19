"""Shared fixtures. Random inputs always come from fixed seeds so failures replay."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search.driver import Outcome, run_search
from superopt.targets import TARGETS, Target


@pytest.fixture(scope="session")
def h100() -> Target:
    return TARGETS["h100"]


@pytest.fixture(scope="session")
def searched(h100: Target) -> Callable[..., tuple[Program, Outcome]]:
    """In-process searches shared by the whole session (search tests, code generation of the
    winners): one run per workload spec and configuration, on the h100 cost model."""

    @functools.cache
    def run(spec: str, **config: int) -> tuple[Program, Outcome]:
        program = workloads.resolve(spec)
        return program, run_search(program, h100, SearchConfig(**config), budget_s=120)

    return run
