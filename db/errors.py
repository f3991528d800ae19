"""Errors and warnings of the cache and the queue that a user can cause or should see."""

from __future__ import annotations


class StoreError(ValueError):
    """A database that cannot be used as named, or a job or kernel id that is not there.

    Front ends print it as one line (CLI exit 2, HTTP 4xx)."""


class NotFound(StoreError):
    """A job or kernel id with no row."""


class Conflict(StoreError):
    """An operation the row's state does not allow (cancelling a finished job)."""


class RequestError(ValueError):
    """A job request that cannot be run; `field` names where the problem is ("budget_s",
    "config.max_kernel_ops", "program", "line 3: target")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CacheIntegrityWarning(UserWarning):
    """A stored entry failed its check on load (program re-hash or row digest); it was treated as a miss."""


def stored_id(kind: str, value: int) -> int:
    """A row id as asked for, or NotFound when no row can have it (ids are positive 64-bit)."""
    if not 0 < value < 2**63:
        raise NotFound(f"no {kind} {value}")
    return value
