"""The suite does not depend on the environment it is run from (conftest's `isolated_env`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ODD = {"SUPEROPT_CACHE_DIR": "/nonexistent/superopt-cache", "XDG_CACHE_HOME": "/nonexistent/xdg",
       "SUPEROPT_DB_URL": "sqlite:////nonexistent/odd.db", "SUPEROPT_TOKEN": "odd",
       "SUPEROPT_MAX_TENSOR_ELEMENTS": "abc"}


def test_tests_pass_with_odd_superopt_variables_set(tmp_path: Path) -> None:
    """`make test` run by a user whose shell sets superopt's variables (a cache folder of their
    own, a server's database URL) passed only when they were unset: tests read them."""
    tests = ["tests/test_db_cache.py::test_database_urls", "tests/test_cli.py::test_show_program_and_reference_sgraph",
             "tests/test_jobs_cli.py::test_one_hash_prefix_rule_in_every_cache_command"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests],
        cwd=ROOT, env={**os.environ, **ODD}, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
