"""tmux for the tests: required (a loud skip locally, a failure under CI), and a private server
killed by its socket (one this test run started; never anyone else's)."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tmux() -> None:
    """Skip locally, fail under CI: the dispatcher's tests need a real tmux."""
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed; CI must have tmux for the dispatcher tests")
        pytest.skip("tmux is not installed (the dispatcher tests need a real tmux)")


def kill_tmux_server(socket: str) -> None:
    """Kill the tmux server on ``socket`` (one this test run started; never anyone else's)."""
    if shutil.which("tmux") is None:
        return
    from pi_tmux_matrix.dispatch.tmux import TmuxServer

    TmuxServer(socket).kill_server()  # also removes the socket file tmux leaves behind
