"""The version of superopt: cache keys and stored winners carry it, so the library reads it
here without importing the package face (`superopt.__version__` is this value)."""

__version__ = "0.2.1"
