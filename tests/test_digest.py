"""Stable digests: one canonical JSON text per value, so keys agree across sites and processes."""

from __future__ import annotations

import hashlib

from superopt import workloads
from superopt.digest import canonical_json, stable_digest


def test_the_digest_depends_on_content_not_on_key_order():
    a = {"b": [1, 2.5, None], "a": {"y": "z", "x": True}}
    b = {"a": {"x": True, "y": "z"}, "b": [1, 2.5, None]}
    assert canonical_json(a) == canonical_json(b) == '{"a":{"x":true,"y":"z"},"b":[1,2.5,null]}'
    assert stable_digest(a) == stable_digest(b) == hashlib.sha256(canonical_json(a).encode()).hexdigest()
    assert stable_digest({**a, "b": [1, 2.5]}) != stable_digest(a)


def test_the_canonical_program_hash_keeps_its_value():
    """Stored winners are keyed by it: a digest written once must give what each site gave."""
    assert workloads.resolve("gqa").canonical_hash() == "02bc782bf5885433b00515b44f59c1971ddbef2dde747ce746d3bdf540a4f969"
