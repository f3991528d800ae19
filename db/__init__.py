"""The kernel cache and the job queue: SQLAlchemy models, migrations, queries.

    from superopt.db.engine import open_database
    from superopt.db.cache import KernelCache
    from superopt.db.jobs import JobQueue

    db = open_database()         # --db URL, else $SUPEROPT_DB_URL, else ~/.cache/superopt/superopt.db
    cache = KernelCache(db)
    result = cache.lookup(program, target_fingerprint, config)   # a Result with cache_hit=True, or None
    cache.store(result, config)                                   # its candidates, and the winner when proved
    job = JobQueue(db).submit(program, target="h100")             # a worker (superopt.worker) runs it

- `open_database` (`Database`; `Retry`, `unavailable`, `reason` and `DatabaseUnavailable` for a
  database that goes away and comes back) is where every caller starts.
- `KernelCache` answers and stores searches (`CacheEntry`, one listed winner; `CacheKey`, what
  a winner is filed under; `check_hash_prefix`, a program hash as a user types it).
- `JobQueue` submits, claims and finishes jobs (`JobView`, `Claim`; `resolve_fingerprint`, the
  cache identity of a job's target on this host).
- `Audit` and `BadRow`: what `superopt.db.audit.audit(db)` finds (the function shares its
  module's name, so the package does not hand it out).
- `StoreError`, `NotFound`, `Conflict`, `RequestError`, `CacheIntegrityWarning`: what the front
  ends report. The tables themselves are `superopt.db.models`.

Names load on first use: importing this package loads nothing else, so that the command line
starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from superopt.db.audit import Audit, BadRow
    from superopt.db.cache import CacheEntry, KernelCache
    from superopt.db.engine import Database, DatabaseUnavailable, Retry, open_database, reason, unavailable
    from superopt.db.errors import CacheIntegrityWarning, Conflict, NotFound, RequestError, StoreError
    from superopt.db.jobs import Claim, JobQueue, JobView, resolve_fingerprint
    from superopt.db.keys import CacheKey, check_hash_prefix

# Each name by the module that defines it, imported when first asked for; tests/test_layering.py
# keeps this, `__all__` and the typed imports above the same.
_SURFACE = {
    "superopt.db.audit": ("Audit", "BadRow"),
    "superopt.db.cache": ("CacheEntry", "KernelCache"),
    "superopt.db.engine": ("Database", "DatabaseUnavailable", "Retry", "open_database", "reason", "unavailable"),
    "superopt.db.errors": ("CacheIntegrityWarning", "Conflict", "NotFound", "RequestError", "StoreError"),
    "superopt.db.jobs": ("Claim", "JobQueue", "JobView", "resolve_fingerprint"),
    "superopt.db.keys": ("CacheKey", "check_hash_prefix"),
}
__all__ = ["Audit", "BadRow", "CacheEntry", "CacheIntegrityWarning", "CacheKey", "Claim",
           "Conflict", "Database", "DatabaseUnavailable", "JobQueue", "JobView", "KernelCache", "NotFound",
           "RequestError", "Retry", "StoreError", "check_hash_prefix", "open_database", "reason",
           "resolve_fingerprint", "unavailable"]


def __getattr__(name: str) -> Any:
    home = next((module for module, names in _SURFACE.items() if name in names), None)
    if home is not None:
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
