"""Shared fixtures. Random inputs always come from fixed seeds so failures replay."""

from __future__ import annotations

import pytest

from superopt.targets import TARGETS


@pytest.fixture(scope="session")
def h100():
    return TARGETS["h100"]
