"""Symbolic search: enumerate sGraphs, prune by abstract expressions, verify, instantiate."""
