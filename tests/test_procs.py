"""Process identity and liveness against real processes (no mocks of /proc).

Every process a test starts is registered with the ``owned`` fixture and killed by pid and
reaped in its teardown; a grandchild is killed only after its identity is re-checked.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import spawn_sleeper
from waiting import poll

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity

# Field 2 (comm) is greedy up to the last ')' so a name holding ') (' still parses.
_STAT = re.compile(rb"^(?P<pid>\d+) \((?P<comm>.*)\) (?P<rest>.*)$", re.DOTALL)
_WEIRD_NAME = "a) b (c"


def stat_fields(pid: int) -> tuple[str, str, int]:
    """(comm, state, starttime) parsed from ``/proc/<pid>/stat`` independently of procs."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    match = _STAT.match(data)
    assert match is not None, data
    assert int(match["pid"]) == pid
    rest = match["rest"].split()
    # rest[0] is field 3 (state), so field N is rest[N - 3].
    return match["comm"].decode(), rest[0].decode(), int(rest[22 - 3])


def proc_state(pid: int) -> str | None:
    try:
        return stat_fields(pid)[1]
    except FileNotFoundError:
        return None


@pytest.fixture
def owned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Children the test starts; each is killed by pid (if still running) and reaped."""
    children: list[subprocess.Popen[bytes]] = []
    yield children
    for child in children:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)


def sleeper(owned: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    child = spawn_sleeper(60)
    owned.append(child)
    identity = procs.identify(child.pid)
    assert identity is not None
    return child, identity


def dead_pid(owned: list[subprocess.Popen[bytes]]) -> int:
    """A pid that just exited and was reaped (pids are not reused this fast in practice)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    owned.append(child)
    child.wait(timeout=10)
    return child.pid


# --- identify / current ------------------------------------------------------------------------


def test_current_matches_proc_self() -> None:
    me = procs.current()
    _, state, ticks = stat_fields(os.getpid())
    assert me.pid == os.getpid()
    assert me.start_ticks == ticks
    assert state in {"R", "S"}
    assert me.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert procs.is_alive(me)


def test_identify_handles_a_command_name_with_spaces_and_parens(
    tmp_path: Path, owned: list[subprocess.Popen[bytes]]
) -> None:
    # comm is the basename of the executed file: copy the interpreter to a hostile name.
    exe = tmp_path / _WEIRD_NAME
    shutil.copy2(os.path.realpath(sys.executable), exe)
    child = subprocess.Popen(
        [str(exe), "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL
    )
    owned.append(child)
    comm, _, ticks = stat_fields(child.pid)
    assert comm == _WEIRD_NAME  # the name really holds ') (' so the parse is exercised
    identity = procs.identify(child.pid)
    assert identity == ProcessIdentity(child.pid, ticks, procs.boot_id())
    assert procs.is_alive(identity)
    assert procs.process_state(child.pid) in {"R", "S", "D"}


def test_identify_absent_or_invalid_pid(owned: list[subprocess.Popen[bytes]]) -> None:
    assert procs.identify(0) is None
    assert procs.identify(-1) is None
    assert procs.identify(dead_pid(owned)) is None
    assert procs.process_state(0) is None


def test_identify_is_independent_of_the_wall_clock(
    owned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, identity = sleeper(owned)
    me = procs.current()
    # A wall-clock jump of ten years either way changes nothing: start ticks count from boot.
    for jump in (10 * 365 * 86400.0, -10 * 365 * 86400.0):
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda real=real_time, j=jump: real() + j)
        monkeypatch.setattr(
            time, "time_ns", lambda real=real_time, j=jump: int((real() + j) * 1e9)
        )
        assert procs.identify(identity.pid) == identity
        assert procs.current() == me
        assert procs.is_alive(identity)
        monkeypatch.undo()


# --- is_alive ----------------------------------------------------------------------------------


def test_is_alive_for_a_live_child_then_not_after_exit(owned: list[subprocess.Popen[bytes]]) -> None:
    child, identity = sleeper(owned)
    assert procs.is_alive(identity)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert not procs.is_alive(identity)
    assert procs.identify(child.pid) is None


def test_is_alive_none_is_false() -> None:
    assert not procs.is_alive(None)


def test_pid_reuse_with_other_start_ticks_is_not_alive(owned: list[subprocess.Popen[bytes]]) -> None:
    _, identity = sleeper(owned)
    for ticks in (identity.start_ticks - 1, identity.start_ticks + 1, 0):
        assert not procs.is_alive(ProcessIdentity(identity.pid, ticks, identity.boot_id))
    assert procs.is_alive(identity)


def test_another_boot_is_not_alive(owned: list[subprocess.Popen[bytes]]) -> None:
    _, identity = sleeper(owned)
    other = ProcessIdentity(identity.pid, identity.start_ticks, "00000000-0000-0000-0000-000000000000")
    assert other.boot_id != procs.boot_id()
    assert not procs.is_alive(other)
    assert procs.is_alive(identity)


def test_zombie_is_not_alive_although_kill_0_succeeds(owned: list[subprocess.Popen[bytes]]) -> None:
    child, identity = sleeper(owned)
    os.kill(child.pid, signal.SIGKILL)
    # Not reaped: the child stays a zombie until wait().
    assert poll(lambda: proc_state(child.pid) == "Z", 10), proc_state(child.pid)
    os.kill(child.pid, 0)  # the point: a naive "pid exists" check says it is still there
    assert procs.process_state(child.pid) == "Z"
    assert procs.identify(child.pid) == identity  # same process, just dead
    assert not procs.is_alive(identity)
    assert procs.wait_for_exit(identity, timeout=0.1)
    assert not procs.send_signal(identity, signal.SIGTERM)
    child.wait(timeout=10)
    assert proc_state(child.pid) is None


# --- wait_for_exit -------------------------------------------------------------------------------

_GRANDPARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         stdin=subprocess.DEVNULL)
print(child.pid, flush=True)
child.wait()
sys.stdin.read()
"""


@pytest.fixture
def grandchild(owned: list[subprocess.Popen[bytes]]) -> Iterator[ProcessIdentity]:
    """A sleeper that is not our child: a helper we own starts it and reaps it."""
    helper = subprocess.Popen(
        [sys.executable, "-c", _GRANDPARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    owned.append(helper)
    assert helper.stdout is not None
    pid = int(helper.stdout.readline())
    identity = procs.identify(pid)
    assert identity is not None
    _, _, ticks = stat_fields(pid)
    assert identity.start_ticks == ticks
    try:
        yield identity
    finally:
        # Kill the grandchild by pid only while it is still the process we started.
        if procs.is_alive(identity):
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity.pid, signal.SIGKILL)
        assert helper.stdin is not None
        helper.stdin.close()
        helper.stdout.close()


def _kill_later(pid: int, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, os.kill, (pid, signal.SIGKILL))
    timer.start()
    return timer


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs os.pidfd_open")
def test_wait_for_exit_wakes_promptly_for_a_non_child(grandchild: ProcessIdentity) -> None:
    assert os.getppid() != grandchild.pid
    assert procs.is_alive(grandchild)
    timer = _kill_later(grandchild.pid, 0.3)
    try:
        started = time.monotonic()
        # A 30 s poll interval: only the pidfd can wake this within the bound below.
        ended = procs.wait_for_exit(grandchild, timeout=20, poll_interval=30)
        elapsed = time.monotonic() - started
    finally:
        timer.cancel()
        timer.join()
    assert ended
    assert elapsed < 5, elapsed
    assert not procs.is_alive(grandchild)


def test_wait_for_exit_times_out_for_a_live_process(grandchild: ProcessIdentity) -> None:
    started = time.monotonic()
    assert procs.wait_for_exit(grandchild, timeout=0.3, poll_interval=0.05) is False
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 5, elapsed
    assert procs.is_alive(grandchild)


def test_wait_for_exit_zero_timeout_for_a_live_process(grandchild: ProcessIdentity) -> None:
    assert procs.wait_for_exit(grandchild, timeout=0) is False


def test_wait_for_exit_is_immediate_for_a_dead_identity(owned: list[subprocess.Popen[bytes]]) -> None:
    child, identity = sleeper(owned)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    started = time.monotonic()
    assert procs.wait_for_exit(identity, timeout=30, poll_interval=30)
    assert procs.wait_for_exit(identity)  # no timeout at all: still returns at once
    stale = ProcessIdentity(os.getpid(), procs.current().start_ticks + 1, procs.boot_id())
    assert procs.wait_for_exit(stale, timeout=30, poll_interval=30)
    assert time.monotonic() - started < 1


def test_wait_for_exit_without_pidfds_falls_back_to_polling(
    grandchild: ProcessIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[ProcessIdentity] = []

    def no_pidfd(identity: ProcessIdentity) -> None:
        calls.append(identity)

    monkeypatch.setattr(procs, "_open_pidfd", no_pidfd)
    assert procs.wait_for_exit(grandchild, timeout=0.2, poll_interval=0.02) is False
    timer = _kill_later(grandchild.pid, 0.2)
    try:
        started = time.monotonic()
        assert procs.wait_for_exit(grandchild, timeout=20, poll_interval=0.02)
        elapsed = time.monotonic() - started
    finally:
        timer.cancel()
        timer.join()
    assert calls  # the seam was really used
    assert elapsed < 5, elapsed


# --- send_signal ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_send_signal_reaches_the_right_process(
    owned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    if not pidfd:
        monkeypatch.setattr(procs, "_open_pidfd", lambda _identity: None)
    child, identity = sleeper(owned)
    bystander, other = sleeper(owned)
    assert procs.send_signal(identity, signal.SIGTERM) is True
    assert child.wait(timeout=10) == -signal.SIGTERM
    assert bystander.poll() is None
    assert procs.is_alive(other)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_send_signal_refuses_a_stale_identity(
    owned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    if not pidfd:
        monkeypatch.setattr(procs, "_open_pidfd", lambda _identity: None)
    child, identity = sleeper(owned)
    # The recorded process is gone and its pid now runs something else (our sleeper).
    reused = ProcessIdentity(identity.pid, identity.start_ticks - 1, identity.boot_id)
    other_boot = ProcessIdentity(identity.pid, identity.start_ticks, "not-this-boot")
    assert procs.send_signal(reused, signal.SIGTERM) is False
    assert procs.send_signal(other_boot, signal.SIGKILL) is False
    time.sleep(0.1)
    assert child.poll() is None
    assert procs.is_alive(identity)
    assert proc_state(child.pid) in {"R", "S", "D"}

    gone = dead_pid(owned)
    ghost = ProcessIdentity(gone, identity.start_ticks, identity.boot_id)
    assert procs.send_signal(ghost, signal.SIGTERM) is False


# --- the one stop by identity ----------------------------------------------------------------------


def test_stop_terms_then_kills_what_stays_and_leaves_a_reused_pid_alone(
    owned: list[subprocess.Popen[bytes]],
) -> None:
    """SIGTERM to each, the grace, SIGKILL to whoever ignored it; an identity whose pid now names
    another process (other start ticks) is never signalled."""
    ignore_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", ignore_term], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    owned.append(stubborn)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    polite, polite_id = sleeper(owned)
    bystander, bystander_id = sleeper(owned)
    stubborn_id = procs.identify(stubborn.pid)
    assert stubborn_id is not None
    impostor = ProcessIdentity(bystander_id.pid, bystander_id.start_ticks + 1, bystander_id.boot_id)
    t0 = time.monotonic()
    assert procs.stop([stubborn_id, polite_id, impostor, None], 0.5) == []
    assert time.monotonic() - t0 < 30  # a generous bound: the grace, then SIGKILL
    assert stubborn.wait(10) == -signal.SIGKILL
    assert polite.wait(10) == -signal.SIGTERM
    assert procs.is_alive(bystander_id)  # not the impostor's to stop
    assert bystander.poll() is None


_HEAP_PROBE = """
from pi_tmux_matrix import procs

def anon_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))

# 40 MiB in 2 KiB blocks (the C allocator's heap, not mmap), every 20th kept: freed, the rest
# leaves holes the allocator keeps resident (only the heap's top is given back on its own).
blocks = [bytes(2048) for _ in range(20000)]
kept = blocks[::20]
del blocks
before = anon_kib()
procs.release_free_heap()
print(before, anon_kib())
"""


def test_release_free_heap_gives_back_the_holes_a_start_left() -> None:
    """A host calls it once its start is behind it (docs/decisions.md#a-hosts-memory-is-judged-
    by-its-pss): the pages the allocator holds free go back to the kernel."""
    if not hasattr(__import__("ctypes").CDLL(None), "malloc_trim"):
        pytest.skip("this libc has no malloc_trim (not glibc): release_free_heap does nothing")
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before - after > 20 * 1024, (before, after)  # of ~38 MiB freed in holes
