"""The tests' one way to wait: poll a probe until it says yes, with a bound and a name.

Every wait in the tests goes through :func:`poll` (the one loop): :func:`wait_for` fails naming
what never came, :func:`holds` fails when something stops being true, :func:`settles` waits for
a value to come to equal another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
STEP_S = 0.05  # between two looks (a race test asks for less)


def poll(probe: Callable[[], T], timeout: float, *, step: float = STEP_S) -> T:
    """``probe()``'s first truthy value within ``timeout`` seconds, else its last (falsy) one."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 20.0,
    detail: Callable[[], object] | None = None,
    *,
    step: float = STEP_S,
) -> T:
    """Poll ``probe`` until it returns something truthy, and return that; fail naming ``what``
    (with the last value seen and ``detail()``, if given) after ``timeout`` seconds."""
    value = poll(probe, timeout, step=step)
    if value:
        return value
    extra = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what} (last: {value!r}){extra}")


def holds(what: str, probe: Callable[[], object], *, until: float, step: float = STEP_S) -> None:
    """``probe`` stays truthy on every look until the monotonic time ``until``."""
    while True:
        if not probe():
            raise AssertionError(f"stopped holding: {what}")
        if time.monotonic() >= until:
            return
        time.sleep(step)


def settles(what: str, probe: Callable[[], object], expected: object, *, timeout: float = 5.0) -> None:
    """``probe()`` comes to equal ``expected`` within ``timeout`` seconds."""
    wait_for(
        what,
        lambda: probe() == expected,
        timeout=timeout,
        detail=lambda: f"expected {expected!r}, got {probe()!r}",
    )
