"""Verification of sGraphs against programs: e-graph proofs, finite fields, float checks."""
