"""Alembic migrations of the kernel cache schema (applied automatically on first use)."""
