"""Bring a model: PyTorch modules and ONNX files imported as superopt programs, and compiled back
into callables that run the proved kernels (`superopt.compile`, the `torch.compile` backend).

Importing this package imports neither torch nor onnx; each importer imports its framework."""
