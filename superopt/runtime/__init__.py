"""GPU runtime: compile with CuPy, check against the reference, time with CUDA events."""
