"""``pi-matrix top`` in a real pseudo-terminal (issue 6 acceptance)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_entry, make_identity, spawn_registered_parent, spawn_sleeper

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity, Role
from pi_tmux_matrix.matrix.model import DirectiveKind, Status
from pi_tmux_matrix.matrix.store import MatrixStore


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def _read_until(fd: int, needle: str, timeout: float = 15.0) -> str:
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            seen += chunk
            if needle.encode() in seen:
                return seen.decode(errors="replace")
    raise AssertionError(f"{needle!r} never appeared; got: {seen.decode(errors='replace')[-1500:]}")


def test_top_draws_the_tree_and_the_adopt_key_asks_then_writes_the_grant(
    store: MatrixStore, sleepers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    dead_master = ProcessIdentity(pid=999_999, start_ticks=1, boot_id=procs.boot_id())
    store.create(make_entry("m-old", role=Role.MASTER, process=dead_master))
    orphans = []
    for name, lane in (("w1", "lane-a"), ("w2", "lane-b")):
        host = spawn_sleeper()
        sleepers.append(host)
        ident = procs.identify(host.pid)
        assert ident is not None
        entry = make_entry(
            name, identity=make_identity(name, lane=lane), process=ident, status=Status.RESUMABLE,
            parent_pid=dead_master.pid, parent_session_id="m-old", parent_proc_start=1,
        )  # fmt: skip
        orphans.append(store.create(entry))
    new_master = spawn_registered_parent(store.root, "m-new")  # a running master: top acts for it
    sleepers.append(new_master)

    pid, fd = pty.fork()
    if pid == 0:  # the child: pi-matrix top on the pty
        os.environ["COLUMNS"], os.environ["LINES"] = "80", "24"
        os.execv(sys.executable, [
            sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "top",
            "--parent-pid", str(new_master.pid), "--parent-session", "m-new",
        ])  # fmt: skip
    try:
        screen = _read_until(fd, "worker-w2")
        assert "master-m-old" in screen and "worker-w1" in screen
        assert "lane-a" in screen and "resumable" in screen
        assert "master-m-new" in screen  # the adopting master's own row comes first
        for _ in range(2):  # past both master rows to the first orphan
            os.write(fd, b"j")
            time.sleep(0.3)
        os.write(fd, b"a")
        _read_until(fd, "adopt worker agent-w1 (lane lane-a)? [y/N]")
        assert store.get("worker-w1").directive is None  # nothing before the answer
        os.write(fd, b"y\n")
        deadline = time.monotonic() + 10
        while store.get("worker-w1").status is not Status.ADOPTED and time.monotonic() < deadline:
            time.sleep(0.05)
        granted = store.get("worker-w1")
        assert granted.status is Status.ADOPTED
        assert granted.directive is not None and granted.directive.kind is DirectiveKind.ADOPT
        assert (granted.directive.parent_pid, granted.directive.parent_session_id) == (
            new_master.pid,
            "m-new",
        )
        assert store.get("worker-w2").directive is None  # only the selected row
        os.write(fd, b"q")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_top_without_a_terminal_prints_one_plain_snapshot(store: MatrixStore) -> None:
    store.create(make_entry("m1", role=Role.MASTER))
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "top"],
        capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "master-m1" in done.stdout and "\x1b[" not in done.stdout
