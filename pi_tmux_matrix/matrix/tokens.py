"""The generation tokens every write of the state dir carries, and its wall-clock stamps.

A token fences a compare-and-swap: a writer names the generation it read, and a write that
finds another generation on disk loses. Tokens are never minted twice, by any process (a random
incarnation per process, renewed in a forked child, and a counter)."""

from __future__ import annotations

import itertools
import os
import time

__all__ = ["new_token", "now_ms"]

# os.urandom, as secrets.token_hex does, without importing secrets (hmac, hashlib: ~5 ms of
# every command's start-up).
_incarnation = os.urandom(8).hex()
_counter = itertools.count(1)


def _reset_tokens_after_fork() -> None:
    # A forked child must never mint a token its parent also mints.
    global _incarnation, _counter  # noqa: PLW0603
    _incarnation = os.urandom(8).hex()
    _counter = itertools.count(1)


os.register_at_fork(after_in_child=_reset_tokens_after_fork)


def new_token() -> str:
    """A token never minted before by any process: random incarnation + a counter."""
    return f"{_incarnation}-{next(_counter)}"


def now_ms() -> int:
    """Wall-clock milliseconds; records are for humans and expiry, never for liveness."""
    return time.time_ns() // 1_000_000
