"""CompileClaims: one compile of each cached kernel at a time across processes sharing a cache.

Numba compiles a kernel that its on-disk cache lacks without asking whether another process
is compiling the same entry right now: two processes starting on a new machine (a server and a
chat, the first step and its compile helper, compile_ahead.py) each spent the whole compile.
Here a cache miss first takes a claim on the entry: an flock on a file named by the entry's
index key (function, signature, CPU, source) in the function's cache folder.

- Claim taken: this process compiles the entry; the claim is dropped once the entry is saved,
  or at once if the compile fails (and by the OS if the process dies).
- Claim held elsewhere: by default wait until it is dropped, then load the other process's
  entry (and compile only if none came, the other having failed or died); with
  `skip_claimed(True)` (the compile helper) raise ClaimedElsewhere instead, so the helper moves
  on to work nobody has started.

Index writes take a lock too: Numba updates a function's index by read-modify-write, so two
processes saving different signatures at once could lose one of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no claims, each process compiles what it misses
    fcntl = None  # type: ignore[assignment]

WAIT_S = 300.0  # for another process's compile of one entry (a big kernel: ~10 s here)
POLL_S = 0.02


class ClaimedElsewhere(Exception):
    """Another process is compiling this cache entry (raised only under skip_claimed)."""


_held: dict[tuple[int, str], int] = {}  # (id(cache), key) -> fd of the claim file
_skip = False
_installed = False
# called with the cache of each entry this process is about to compile (compile_ahead.py
# starts its helper on the first one)
on_compile: Callable[[Any], None] | None = None


def skip_claimed(on: bool) -> None:
    global _skip
    _skip = on


def _claim_path(cache: Any, sig: Any, codegen: Any) -> tuple[str, str]:
    py_func = cache._py_func
    key = repr((py_func.__module__, py_func.__qualname__,
                cache._index_key(sig, codegen)))
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return digest, os.path.join(cache._cache_path, f"{py_func.__name__}-{digest}.claim")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def after_miss(cache: Any, sig: Any, target_context: Any) -> Any:
    """Called when cache has no entry for sig: the entry another process compiled meanwhile,
    or None when this process is to compile it (holding the claim)."""
    if fcntl is None or not getattr(cache, "_enabled", False):
        return None
    try:
        digest, path = _claim_path(cache, sig, target_context.codegen())
        cache._impl.locator.ensure_cache_path()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except (OSError, AttributeError):  # a read-only cache or other internals: no claims
        return None
    if not _try_lock(fd):
        if _skip:
            os.close(fd)
            raise ClaimedElsewhere(path)
        deadline = time.monotonic() + WAIT_S
        while not _try_lock(fd):
            if time.monotonic() > deadline:  # compile it too rather than wait forever
                os.close(fd)
                return None
            time.sleep(POLL_S)
        loaded = cache._load_overload(sig, target_context)
        if loaded is not None:
            os.close(fd)  # drops the lock
            return loaded
    _held[(id(cache), digest)] = fd
    if on_compile is not None:
        on_compile(cache)
    return None


def release(cache: Any, sig: Any = None, codegen: Any = None) -> None:
    """Drop this process's claim on cache's entry for sig (every claim on cache if None)."""
    if sig is None:
        keys = [k for k in _held if k[0] == id(cache)]
    else:
        try:
            digest, _ = _claim_path(cache, sig, codegen)
        except AttributeError:
            return
        keys = [(id(cache), digest)]
    for k in keys:
        fd = _held.pop(k, None)
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def _index_lock(cache: Any) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(cache._cache_file._index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (OSError, AttributeError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install() -> bool:
    """Hook Numba's cache saves and failed compiles (the misses come through cache_load.py);
    True once in place."""
    global _installed
    if _installed:
        return True
    from numba.core import caching, event

    cache_cls = caching.Cache
    if not hasattr(cache_cls, "_save_overload"):
        return False

    def save_overload(self: Any, sig: Any, data: Any) -> None:
        try:
            with self._guard_against_spurious_io_errors(), _index_lock(self):
                self._save_overload(sig, data)
        finally:
            release(self, sig, data.codegen)

    class _FailedCompiles(event.Listener):
        def on_start(self, ev: Any) -> None:
            pass

        def on_end(self, ev: Any) -> None:
            # Event.is_failed is inverted in Numba 0.68 (True when no exception came)
            if _held and getattr(ev, "_exc_details", None) is not None:
                cache = getattr(ev.data.get("dispatcher"), "_cache", None)
                if cache is not None:
                    release(cache)

    save_overload.__doc__ = cache_cls.save_overload.__doc__
    cache_cls.save_overload = save_overload
    event.register("numba:compile", _FailedCompiles())
    _installed = True
    return True
