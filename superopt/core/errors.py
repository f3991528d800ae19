"""Errors the library raises for the front ends to report (each front end maps them to its exit
code or HTTP status)."""


class ClusterUnreachable(ConnectionError):
    """No Ray cluster answers at the address a search was given."""
