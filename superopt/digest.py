"""Stable digests of JSON data: the keys of caches that outlive a process.

A key must come out the same in every process and on every machine, so it is never Python's
`hash`: it is sha256 of one canonical JSON text (keys sorted, no spaces), written here once so
that two keys of the same data cannot differ by how each site happened to call `json.dumps`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(data: Any) -> str:
    """`data` as JSON text that depends on its content only: keys sorted, no whitespace."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def stable_digest(data: Any) -> str:
    """The sha256 hex digest of `data`'s canonical JSON text."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()
