"""The kernel cache and the job queue: SQLAlchemy models, migrations, queries."""
