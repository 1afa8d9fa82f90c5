"""Explicit SIMD building blocks (per instruction set) and the host-feature dispatch."""
