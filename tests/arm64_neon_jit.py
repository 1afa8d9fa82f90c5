"""Jitted callers of the dispatch overloads for tests/arm64_neon_checks.py, at module level so
the numba cache keeps them (compiling them under emulation takes a minute)."""

from __future__ import annotations

from localinfer.backends.numba_cpu.dispatch import embed, project
from localinfer.backends.numba_cpu.project_q8k import project_q8k
from numba import njit


@njit(cache=True)
def run(isa, ws, x, qbuf, out):
    project(isa, ws, 0, x, qbuf, out)


@njit(cache=True)
def run_q8k(isa, ws, x, qbuf, out):
    project_q8k(isa, ws, 0, x, qbuf, out)


@njit(cache=True)
def lookup(isa, ws, tokens, out):
    embed(isa, ws, tokens, out)
