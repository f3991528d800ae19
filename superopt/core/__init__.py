"""The types the library fills and the front ends show, importing no front end.

search/, verifier/ and db/ produce and store these; the Python API, the command line, the
service and the worker present them. Each lives in a small module, imported from there:

- `superopt.core.result`: Verdict, Candidate, SearchStats, Result (with their JSON forms)
- `superopt.core.progress`: Progress, the callback a search reports through
- `superopt.core.errors`: ClusterUnreachable
- `superopt.core.version`: `__version__`, part of every cache key
"""
