"""Shared fixtures. Random inputs always come from fixed seeds so failures replay."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from db_fixtures import BACKENDS, database_url

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.db.engine import Database, open_database
from superopt.search.driver import Outcome, run_search
from superopt.targets import TARGETS, Target

# Variables that change where superopt keeps files, which database it opens, what the service asks
# of clients or how large a program may be: the caller's values must not leak into a test.
CLEARED_ENV = (
    "SUPEROPT_CACHE_DIR", "SUPEROPT_DB_URL", "SUPEROPT_TOKEN", "SUPEROPT_SECRET", "SUPEROPT_ALLOWED_HOSTS",
    "SUPEROPT_MAX_TENSOR_ELEMENTS", "SUPEROPT_MAX_PROGRAM_BYTES",
)


@pytest.fixture(scope="session")
def isolated_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache home per session (per xdist worker): tests that share the default cache (as runs
    of one user would) still share it, but never the caller's ~/.cache or $XDG_CACHE_HOME."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, isolated_cache_home: Path) -> None:
    """Make every test independent of the environment it is run from (`make test` with
    SUPEROPT_CACHE_DIR or SUPEROPT_DB_URL set): clear superopt's variables and point the cache
    home at a temporary folder. A test that needs one sets it itself, after this runs."""
    for var in CLEARED_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated_cache_home))


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache directory of the test's own (kept sGraphs, SQLite kernel cache); the search tests
    take it with `pytestmark = pytest.mark.usefixtures("private_cache")`."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database: a SQLite file, or a schema of its own on the PostgreSQL server."""
    with database_url(request.param, tmp_path) as u:
        yield u


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    """The database at `url`, open for the test and closed after it."""
    database = open_database(url)
    yield database
    database.close()


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


def attention(k_stored_transposed: bool) -> Program:
    """Attention over K stored (batch, length, head dim), as frameworks keep it (`Q @ K^T`), or
    given already transposed (batch, head dim, length)."""
    p = Program("attention")
    q = p.input("Q", (2, 16, 32), "f16")
    k = p.input("K", (2, 32, 64) if k_stored_transposed else (2, 64, 32), "f16")
    v = p.input("V", (2, 64, 32), "f16")
    e = p.exp(q @ (k if k_stored_transposed else p.transpose(k, (0, 2, 1))))
    p.output(p.matmul(e / p.sum(e, -1, keepdim=True), v))
    return p


@pytest.fixture(scope="session")
def searched_attention(h100: Target) -> Callable[[bool], tuple[Program, Outcome]]:
    """`attention` and its search, once per session for each layout of K."""

    @functools.cache
    def run(k_stored_transposed: bool) -> tuple[Program, Outcome]:
        program = attention(k_stored_transposed)
        return program, run_search(program, h100, SearchConfig())

    return run
