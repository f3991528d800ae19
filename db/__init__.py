"""The kernel cache and the job queue: SQLAlchemy models, migrations, queries.

    from superopt.db.engine import open_database
    from superopt.db.cache import KernelCache
    from superopt.db.jobs import JobQueue

    db = open_database()         # --db URL, else $SUPEROPT_DB_URL, else ~/.cache/superopt/superopt.db
    cache = KernelCache(db)
    result = cache.lookup(program, target_fingerprint, config)   # a Result with cache_hit=True, or None
    cache.store(result, config)                                   # its candidates, and the winner when proved
    job = JobQueue(db).submit(program, target="h100")             # a worker (superopt.worker) runs it

Importing this package loads nothing else, so that the command line starts fast.
"""
