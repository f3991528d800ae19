"""CUDA C++ code generation for instantiated graph-defined kernels."""
