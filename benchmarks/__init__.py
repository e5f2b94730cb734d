"""Benchmarks: each a module run from the checkout's root, `python -m benchmarks.NAME` (method in its docstring,
figures in docs/benchmarks.md)."""
