"""The callback a search reports its progress through: the Python API, the command line's bar
and the worker's job row all receive the same events."""

from collections.abc import Callable
from typing import Any

Progress = Callable[[dict[str, Any]], None]
