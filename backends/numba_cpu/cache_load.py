"""Loading cached kernels without Numba's full context refresh: a third of a warm start.

Before Numba loads a function from its on-disk cache it calls `refresh()` on the target
context: that initializes the runtime (NRT) and then imports and installs every typing and
lowering registry Numba has (linalg, random, typed containers, datetime, ...), 0.3-0.6 s on a
2-core machine, for code that is already machine code and needs none of them.  Numba does the
same refresh again before any compile (`compile_extra`), so deferring it loses nothing there.

lazy_refresh() replaces `Cache.load_overload` with one that initializes only the runtime
(compiled kernels allocate through it; without it they crash), loads, and falls back to the
full refresh when the cache has no entry, i.e. exactly Numba's behaviour whenever a compile
follows.  A miss first asks compile_claims.py whether another process is compiling that
entry.  It checks that the Numba internals it relies on exist and otherwise leaves Numba as
it is (a slower start, never a wrong one).
"""

from __future__ import annotations

from typing import Any

_installed = False


def lazy_refresh() -> bool:
    """Install the deferred refresh once; True when it is in place."""
    global _installed
    if _installed:
        return True
    from numba.core import caching
    from numba.core.runtime import rtsys

    from . import compile_claims

    cache = caching.Cache
    if not all(hasattr(cache, name) for name in ("load_overload", "_load_overload",
                                                   "_guard_against_spurious_io_errors")):
        return False

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        rtsys.initialize(target_context)  # cheap after the first call
        loaded = None
        with self._guard_against_spurious_io_errors():
            loaded = self._load_overload(sig, target_context)
            if loaded is None:  # another process may be compiling it (compile_claims.py)
                loaded = compile_claims.after_miss(self, sig, target_context)
        if loaded is None:  # a compile follows: give it Numba's fully refreshed context
            target_context.refresh()
        return loaded

    load_overload.__doc__ = cache.load_overload.__doc__
    cache.load_overload = load_overload
    compile_claims.install()
    _installed = True
    return True
