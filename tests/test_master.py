"""``pi-matrix master`` and the owner verbs with real processes (issue 3's master acceptance).

Workers are real ``pi-matrix host`` processes running the bundled stand-in, whose parent is a
real ``pi-matrix master`` the test SIGKILLs; dead workers are entries written with the store
(status ``resumable`` with a complete pi context). Settings sit at their lower bounds. Every
process a test starts is tracked and, at the end, stopped by its identity (never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import dir_digest, make_entry, make_identity, read_events, spawn_sleeper

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import (
    Entry,
    ExitKind,
    ExitRecord,
    Outcome,
    ResumablePayload,
    Status,
)
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

SETTINGS = {"processMatrix": {"adoptionGraceMs": 5000, "watcherPollMs": 1000, "heartbeatMs": 1000}}
STANDIN = [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]
T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, step: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def dead_identity() -> ProcessIdentity:
    """The identity of a real process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"], stdin=subprocess.DEVNULL)
    identity = procs.identify(child.pid)
    child.wait()
    assert identity is not None
    assert not procs.is_alive(identity)
    return identity


def stable_digest(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """dir_digest with directory sizes dropped (a directory's size is the filesystem's business)."""
    return {
        name: (kind, mode, 0 if stat.S_ISDIR(kind) else size, digest)
        for name, (kind, mode, size, digest) in dir_digest(str(root)).items()
    }


def handoff_lines(text: str, key: str) -> list[str]:
    return [line for line in text.replace("\r", "").splitlines() if line.startswith(f"handoff {key}:")]


class Pty:
    """A child process whose stdin, stdout and stderr are a real pseudo-terminal."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.fd, slave = pty.openpty()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True
            )
        finally:
            os.close(slave)
        self.seen = ""  # everything read, \r dropped
        self._pos = 0  # how far expect() has consumed

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not data:
            return False
        self.seen += data.decode("utf-8", "replace").replace("\r", "")
        return True

    def expect(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.seen, self._pos)
            if match:
                self._pos = match.end()
                return match
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} on the terminal; it showed:\n{self.seen}")
            if not self._read(min(left, 0.2)):
                if self.proc.poll() is not None:
                    raise AssertionError(f"exited before {pattern!r}; the terminal showed:\n{self.seen}")
                time.sleep(0.05)

    def answer(self, text: str) -> None:
        os.write(self.fd, (text + "\n").encode())

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Read the terminal until the child has exited and closed it; its exit code."""
        deadline = time.monotonic() + timeout
        while self._read(0.1) or self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout}s; the terminal showed:\n{self.seen}")
            if self.proc.poll() is not None and not self._read(0.05):
                break
        return self.proc.wait()

    def drain(self, seconds: float = 0.3) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self._read(0.05):
            pass
        return self.seen

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Lab:
    """One test's state dir, environment, and every process it starts."""

    def __init__(self, root: Path, state: Path) -> None:
        self.root = root
        self.state = state
        self.store = MatrixStore(state)
        self.env = dict(os.environ)
        self.popens: list[subprocess.Popen[Any]] = []
        self.identities: list[ProcessIdentity] = []
        self.ptys: list[Pty] = []
        self.stopped: list[ProcessIdentity] = []

    # -- commands -----------------------------------------------------------------------------
    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(self.state), *args]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A one-shot ``pi-matrix`` with no TTY at all (stdin /dev/null, stdout a pipe)."""
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def popen(self, argv: list[str], out: Path | None = None) -> subprocess.Popen[Any]:
        sink: Any = subprocess.DEVNULL
        if out is not None:
            sink = open(out, "ab")  # noqa: SIM115 - closed right after the child has it
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=self.env, cwd=self.root
            )
        finally:
            if out is not None:
                sink.close()
        self.popens.append(proc)
        return proc

    def pty(self, *args: str) -> Pty:
        term = Pty(self.argv(*args), self.env, self.root)
        self.ptys.append(term)
        return term

    # -- processes ----------------------------------------------------------------------------
    def start_master(self, session: str, task_ref: str | None = None) -> tuple[subprocess.Popen[Any], Path]:
        """A long-running headless ``pi-matrix master``; returns once its activation printed."""
        out = self.root / f"master-{session}-{len(self.popens)}.out"
        args = ["master", "--session-id", session, "--headless"]
        if task_ref:
            args += ["--task-ref", task_ref]
        proc = self.popen(self.argv(*args), out)
        wait_for(
            lambda: f"master master-{session} active" in out.read_text() or proc.poll() is not None,
            30,
            f"master {session} to activate",
        )
        assert proc.poll() is None, out.read_text()
        return proc, out

    def start_worker(
        self,
        session: str,
        parent: int,
        parent_session: str,
        task_ref: str | None = None,
        *,
        lane: str | None = None,
        task: str = "HANG work",
        mode: str = "interactive",
    ) -> tuple[subprocess.Popen[Any], Path]:
        """A real ``pi-matrix host`` running the stand-in; returns once the child is recorded."""
        session_file = self.root / "sessions" / f"{session}.jsonl"
        args = [
            "host", "--parent-pid", str(parent), "--parent-session", parent_session,
            "--session-id", session, "--agent-id", f"agent-{session}", "--session-file",
            str(session_file), "--provider", "pi", "--cwd", str(self.root), "--mode", mode,
        ]  # fmt: skip
        if task_ref:
            args += ["--task-ref", task_ref]
        if lane:
            args += ["--lane", lane]
        child = [*STANDIN, "--session", str(session_file)]
        if mode == "print":
            child.append("-p")
        proc = self.popen([*self.argv(*args), "--", *child, task], self.root / f"worker-{session}.out")
        key = f"worker-{session}"
        wait_for(
            lambda: (
                ((e := self.store.find(key)) is not None and e.child_pid is not None)
                or proc.poll() is not None
            ),
            30,
            f"{key} to start its child",
        )
        assert proc.poll() is None, (self.root / f"worker-{session}.out").read_text()
        return proc, session_file

    def kill(self, proc: subprocess.Popen[Any]) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()

    def pause(self, identity: ProcessIdentity) -> None:
        """SIGSTOP: the process stays alive (an orphan a master must see) but writes nothing."""
        assert procs.send_signal(identity, signal.SIGSTOP)
        self.stopped.append(identity)
        wait_for(lambda: procs.process_state(identity.pid) == "T", 10, f"pid {identity.pid} to stop")

    def entry(self, key: str) -> Entry:
        return self.store.get(key)

    def raw(self, key: str) -> bytes:
        return (self.state / f"{key}.json").read_bytes()

    def events(self, key: str) -> list[dict[str, Any]]:
        return read_events(self.state, key)

    # -- dead workers written with the store --------------------------------------------------
    def dead_resumable(
        self, session: str, parent_session: str, task_ref: str | None, *, lane: str | None = None
    ) -> Entry:
        """A worker whose process is dead, left ``resumable`` with a complete pi context."""
        session_file = self.root / "sessions" / f"{session}.jsonl"
        session_file.parent.mkdir(parents=True, exist_ok=True)
        header = {"type": "session", "version": 3, "id": session, "cwd": str(self.root)}
        first = {"type": "message", "role": "user", "content": "summarise the logs"}
        session_file.write_text(json.dumps(header) + "\n" + json.dumps(first) + "\n")
        identity = make_identity(
            session, session_file=str(session_file), cwd=str(self.root), provider="pi", lane=lane
        )
        payload = ResumablePayload(
            identity=identity,
            reason="parent_lost",
            at=now_ms(),
            task_ref=task_ref,
            task_summary="summarise the logs",
        )
        parent = dead_identity()
        entry = make_entry(
            session,
            status=Status.RESUMABLE,
            identity=identity,
            process=dead_identity(),
            reason="parent_lost",
            parent_pid=parent.pid,
            parent_proc_start=parent.start_ticks,
            parent_session_id=parent_session,
            task_ref=task_ref,
            task_summary="summarise the logs",
            resumable=payload,
        )
        return self.store.register(entry)

    # -- the end ------------------------------------------------------------------------------
    def _live_recorded(self) -> list[ProcessIdentity]:
        found: list[ProcessIdentity] = []
        with contextlib.suppress(Exception):
            for entry in self.store.list().entries:
                for identity in (entry.process, entry.child_process):
                    if identity is not None and identity.pid != os.getpid() and procs.is_alive(identity):
                        found.append(identity)
        return found

    def cleanup(self) -> None:
        for term in self.ptys:
            term.close()
        for identity in self.stopped:
            procs.send_signal(identity, signal.SIGCONT)
        for proc in self.popens:
            self.kill(proc)
        # Relaunched hosts are detached (not our children) and hosts' agents are theirs: they
        # are all named, with start times, in this test's own state dir.
        for _ in range(3):
            live = [i for i in (*self.identities, *self._live_recorded()) if procs.is_alive(i)]
            if not live:
                break
            for identity in live:
                procs.send_signal(identity, signal.SIGKILL)
            time.sleep(0.2)


@pytest.fixture
def lab(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    agent_dir = Path(os.environ["PI_CODING_AGENT_DIR"])
    agent_dir.mkdir(parents=True)
    (agent_dir / "settings.json").write_text(json.dumps(SETTINGS))
    monkeypatch.setenv("PI_MATRIX_STATE_DIR", str(state_dir))
    monkeypatch.setenv("PI_MATRIX_PI_COMMAND", json.dumps(STANDIN))
    work = tmp_path / "work"
    work.mkdir()
    the_lab = Lab(work, state_dir)
    try:
        yield the_lab
    finally:
        the_lab.cleanup()


def orphaned_worker(
    lab: Lab, session: str, master_session: str, task_ref: str | None, *, lane: str | None = None
) -> tuple[subprocess.Popen[Any], Entry]:
    """A live worker host whose master was SIGKILLed; returns once it is ``resumable``."""
    master, _ = lab.start_master(master_session, task_ref)
    worker, _ = lab.start_worker(session, master.pid, master_session, task_ref, lane=lane)
    lab.kill(master)
    key = f"worker-{session}"
    entry = wait_for(
        lambda: (e := lab.entry(key)).status is Status.RESUMABLE and e,
        10,
        f"{key} to become resumable",
    )
    return worker, entry


def several_orphans(
    lab: Lab, master_session: str, task_ref: str | None, sessions: list[tuple[str, str | None]]
) -> dict[str, tuple[subprocess.Popen[Any], Entry]]:
    """Several live workers of one master, all orphaned by one SIGKILL."""
    master, _ = lab.start_master(master_session, task_ref)
    workers = {
        session: lab.start_worker(session, master.pid, master_session, task_ref, lane=lane)[0]
        for session, lane in sessions
    }
    lab.kill(master)
    out: dict[str, tuple[subprocess.Popen[Any], Entry]] = {}
    for session, proc in workers.items():
        key = f"worker-{session}"
        entry = wait_for(
            lambda k=key: (e := lab.entry(k)).status is Status.RESUMABLE and e, 10, f"{key} resumable"
        )
        out[session] = (proc, entry)
    return out


def adopted_by(lab: Lab, key: str, parent_pid: int) -> bool:
    """Whether the worker's host logged that it re-parented to ``parent_pid``."""
    return any(e["event"] == "adopted" and e["parent_pid"] == parent_pid for e in lab.events(key))


# --- exact orphans: recovered without a prompt ------------------------------------------------------
def test_exact_live_orphan_is_readopted_without_a_prompt(lab: Lab) -> None:
    worker, before = orphaned_worker(lab, "w1", "boss", "goal-1")
    assert before.reason == "parent_lost"
    assert before.resumable is not None and before.resumable.task_ref == "goal-1"

    master, out = lab.start_master("boss", "goal-1")

    adopted = wait_for(
        lambda: (e := lab.entry("worker-w1")).status is Status.RUNNING and e.parent_pid == master.pid and e,
        10,
        "re-adoption by the new master",
    )
    assert adopted.parent_session_id == "boss"
    assert adopted.registration == before.registration  # the same host, re-parented
    assert adopted.directive is None and adopted.resumable is None
    assert "orphan worker-w1 (exact, alive, agent agent-w1, lane -): re-adopted" in out.read_text()
    assert worker.poll() is None
    assert procs.is_alive(adopted.child_process)
    # The host logs "adopted" just after its CAS lands, so the entry can be seen first: wait for it.
    wait_for(lambda: adopted_by(lab, "worker-w1", master.pid), 10, "the host's adopted event")


def test_exact_dead_orphan_is_relaunched_into_the_same_session_and_key(lab: Lab) -> None:
    before = lab.dead_resumable("w2", "boss", "goal-1")
    session_file = Path(before.identity.session_file or "")
    transcript = session_file.read_bytes()

    done = lab.run("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")

    assert done.returncode == 0, done.stderr
    match = re.search(
        r"orphan worker-w2 \(exact, dead, agent agent-w2, lane -\): relaunched: new host pid (\d+)",
        done.stdout,
    )
    assert match, done.stdout
    assert "[y/N]" not in done.stdout + done.stderr
    host_pid = int(match.group(1))
    host = procs.identify(host_pid)
    if host is not None:
        lab.identities.append(host)

    # The new host registered the same key (a new process generation) ...
    entry = wait_for(
        lambda: (
            (e := lab.entry("worker-w2")).registration != before.registration
            and e.status is not Status.LAUNCHING
            and e
        ),
        20,
        "the relaunched host to register",
    )
    assert entry.pid == host_pid
    assert entry.key == before.key
    assert entry.identity.session_file == str(session_file)
    assert entry.identity.agent_id == "agent-w2"
    assert entry.task_ref == "goal-1"
    assert entry.parent_session_id == "boss"
    # ... and the stand-in appended to that very session file: the wake prompt, then its turn.
    finished = wait_for(
        lambda: (e := lab.entry("worker-w2")).status is Status.TERMINAL and e, 20, "the resumed turn to end"
    )
    text = session_file.read_bytes()
    assert text.startswith(transcript)
    added = [json.loads(line) for line in text[len(transcript) :].splitlines()]
    assert added[0]["role"] == "user"
    assert added[0]["content"].startswith("[pi-matrix] You are agent agent-w2, resumed in your own session")
    assert "Task: goal-1." in added[0]["content"]
    assert added[1]["role"] == "assistant"
    assert added[1]["content"].startswith("done: ")
    (handoff,) = finished.undelivered
    assert handoff.parent_session_id == "boss"
    assert handoff.outcome is Outcome.EXITED and handoff.code == 0
    assert handoff.generation == entry.registration
    assert (lab.state / "logs" / "worker-w2.log").exists()


def test_a_relaunched_worker_keeps_its_pi_identity(lab: Lab) -> None:
    before = lab.dead_resumable("w3", "boss", "goal-1")
    done = lab.run("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")
    assert "relaunched" in done.stdout, done.stdout + done.stderr
    entry = wait_for(
        lambda: (
            (e := lab.entry("worker-w3")).registration != before.registration
            and e.status is not Status.LAUNCHING
            and e
        ),
        20,
        "the relaunched host to register",
    )
    assert entry.identity.provider == before.identity.provider == "pi"
    assert entry.identity.resume_complete


@pytest.mark.parametrize("task_state", ["blocked", "terminal"])
def test_a_blocked_or_terminal_task_disables_exact_recovery(lab: Lab, task_state: str) -> None:
    worker, live = orphaned_worker(lab, "w4", "boss", "goal-1")
    lab.dead_resumable("w5", "boss", "goal-1")
    dead_bytes = lab.raw("worker-w5")

    done = lab.run(
        "master", "--session-id", "boss", "--task-ref", "goal-1", "--task-state", task_state, "--once"
    )

    assert done.returncode == 0, done.stderr
    why = f"task is {task_state}: automatic recovery disabled"
    assert f"orphan worker-w4 (exact, alive, agent agent-w4, lane -): reported: {why}" in done.stdout
    assert f"orphan worker-w5 (exact, dead, agent agent-w5, lane -): reported: {why}" in done.stdout
    assert lab.raw("worker-w5") == dead_bytes  # not relaunched, not touched
    assert not (lab.state / "logs").exists()
    now = lab.entry("worker-w4")
    assert now.status is Status.RESUMABLE
    assert now.directive is None
    assert now.parent_pid == live.parent_pid
    assert not (lab.state / "mailbox" / "worker-w4").exists() or not any(
        (lab.state / "mailbox" / "worker-w4").iterdir()
    )
    assert worker.poll() is None


# --- foreign orphans: owner-gated in a terminal ------------------------------------------------------
def test_foreign_live_orphans_are_adopted_cleaned_up_or_left_as_the_owner_answers(lab: Lab) -> None:
    orphans = several_orphans(lab, "home", "goal-1", [("a", "lane-a"), ("b", "lane-b"), ("c", None)])
    leave_host = orphans["c"][1].process
    assert leave_host is not None
    lab.pause(leave_host)  # alive, but it cannot write: any byte change would be the master's
    leave_before = {k: v for k, v in stable_digest(lab.state).items() if "worker-c" in k}
    assert "worker-c.json" in leave_before

    term = lab.pty("master", "--interactive", "--session-id", "other", "--task-ref", "goal-1")

    term.expect(r"adopt worker agent-a \(lane lane-a\)\? \[y/N\] ")
    term.answer("y")
    term.expect(r"adopt worker agent-b \(lane lane-b\)\? \[y/N\] ")
    term.answer("n")
    term.expect(r"clean up worker agent-b \(lane lane-b\) gracefully\? \[y/N\] ")
    term.answer("y")
    term.expect(r"adopt worker agent-c \(lane -\)\? \[y/N\] ")
    term.answer("n")
    term.expect(r"clean up worker agent-c \(lane -\) gracefully\? \[y/N\] ")
    term.answer("n")
    term.expect(r"master master-other active")
    term.expect(r"orphan worker-a \(foreign, alive, agent agent-a, lane lane-a\): adopted")
    term.expect(r"orphan worker-b \(foreign, alive, agent agent-b, lane lane-b\): cleanup_requested")
    term.expect(r"orphan worker-c \(foreign, alive, agent agent-c, lane -\): left")

    # adopt: the grant is written and the worker re-parents to this master.
    adopted = wait_for(
        lambda: (e := lab.entry("worker-a")).status is Status.RUNNING and e.parent_pid == term.proc.pid and e,
        10,
        "worker-a to re-parent",
    )
    assert adopted.parent_session_id == "other"
    wait_for(lambda: adopted_by(lab, "worker-a", term.proc.pid), 10, "worker-a's adopted event")
    assert orphans["a"][0].poll() is None

    # cleanup: the worker stops its own agent and exits; its record is closed.
    worker_b, entry_b = orphans["b"]
    worker_b.wait(timeout=10)
    closed = lab.entry("worker-b")
    assert closed.status is Status.CLOSED and closed.reason == "cleanup"
    assert closed.exit is not None and closed.exit.kind is ExitKind.KILLED
    assert not procs.is_alive(entry_b.child_process)

    # leave: not a byte of that worker's entry, lock, mailbox or events changed.
    after = {k: v for k, v in stable_digest(lab.state).items() if "worker-c" in k}
    assert after == leave_before
    assert term.proc.poll() is None


def test_a_dead_foreign_worker_is_offered_resume_first(lab: Lab) -> None:
    resumed = lab.dead_resumable("d", "home", "goal-1", lane="lane-d")
    declined = lab.dead_resumable("e", "home", "goal-1")
    declined_bytes = lab.raw("worker-e")
    session_file = Path(resumed.identity.session_file or "")
    transcript = session_file.read_bytes()

    term = lab.pty("master", "--interactive", "--session-id", "other", "--task-ref", "goal-1")

    first = term.expect(r"(\w[^\n]*) worker agent-d \(lane lane-d\)[^\n]*\? \[y/N\] ")
    assert first.group(0).startswith("resume worker agent-d (lane lane-d) in its own session?")
    term.answer("y")
    first = term.expect(r"(\w[^\n]*) worker agent-e \(lane -\)[^\n]*\? \[y/N\] ")
    assert first.group(0).startswith("resume worker agent-e (lane -) in its own session?")
    term.answer("n")
    match = term.expect(
        r"orphan worker-d \(foreign, dead, agent agent-d, lane lane-d\): resumed: new host pid (\d+)"
    )
    host = procs.identify(int(match.group(1)))
    if host is not None:
        lab.identities.append(host)
    term.expect(r"orphan worker-e \(foreign, dead, agent agent-e, lane -\): left")
    # A dead worker is never offered adopt or cleanup: there is no process to re-parent.
    assert "adopt worker agent-e" not in term.drain()
    assert "clean up worker agent-e" not in term.seen

    relaunched = wait_for(
        lambda: (
            (e := lab.entry("worker-d")).registration != resumed.registration
            and e.status is not Status.LAUNCHING
            and e
        ),
        20,
        "worker-d to be relaunched",
    )
    assert relaunched.parent_pid == term.proc.pid
    assert relaunched.parent_session_id == "other"
    assert relaunched.identity.lane == "lane-d"
    wait_for(lambda: len(session_file.read_bytes()) > len(transcript) + 1, 20, "the resumed turn")
    assert session_file.read_bytes().startswith(transcript)
    assert lab.raw("worker-e") == declined_bytes
    assert lab.entry("worker-e") == declined


# --- headless: report only, write nothing -------------------------------------------------------------
@pytest.mark.parametrize("how", ["headless-flag-in-a-tty", "no-tty"])
def test_headless_reports_foreign_orphans_and_writes_nothing(lab: Lab, how: str) -> None:
    _, live = orphaned_worker(lab, "f1", "home", "goal-1", lane="lane-1")
    lab.dead_resumable("f2", "home", "goal-1")
    # The dead master's own record is the reconciliation pass's business, not the scan's: clear
    # it first so the only thing left for this activation to touch is the foreign orphans.
    assert lab.run("reconcile").returncode == 0
    assert live.process is not None
    lab.pause(live.process)
    before = stable_digest(lab.state)

    args = ["master", "--session-id", "other", "--task-ref", "goal-1", "--once"]
    if how == "no-tty":
        done = lab.run(*args)
        assert done.returncode == 0, done.stderr
        output = done.stdout + done.stderr
    else:
        term = lab.pty(*args, "--headless")
        code = term.wait_exit()
        output = term.seen
        assert code == 0, output

    assert "[y/N]" not in output
    assert "orphan worker-f1 (foreign, alive, agent agent-f1, lane lane-1): reported" in output
    assert "orphan worker-f2 (foreign, dead, agent agent-f2, lane -): reported" in output
    after = stable_digest(lab.state)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed, "the master registers its own entry"
    assert all("master-other" in name for name in changed), changed


# --- terminal handoffs ----------------------------------------------------------------------------------
def test_a_running_master_delivers_a_handoff_once_and_the_record_closes(lab: Lab) -> None:
    master, out = lab.start_master("lead")
    worker, _ = lab.start_worker("h1", master.pid, "lead", task="write the report", mode="print")
    assert worker.wait(timeout=20) == 0

    closed = wait_for(
        lambda: (e := lab.entry("worker-h1")).status is Status.CLOSED and e, 15, "delivery and close"
    )
    (handoff,) = closed.handoffs
    assert handoff.delivered_at is not None
    time.sleep(2.5)  # two more heartbeat ticks: nothing is delivered twice
    master.send_signal(signal.SIGTERM)
    master.wait(timeout=15)
    (line,) = handoff_lines(out.read_text(), "worker-h1")
    assert line.startswith("handoff worker-h1: exited code 0")


def test_a_handoff_waits_for_its_session_and_replays_once(lab: Lab) -> None:
    parent = spawn_sleeper()
    lab.popens.append(parent)
    _other, other_out = lab.start_master("elsewhere")
    worker, _ = lab.start_worker("h2", parent.pid, "away", task="tidy up", mode="print")
    assert worker.wait(timeout=20) == 0

    waiting = lab.entry("worker-h2")
    assert waiting.status is Status.TERMINAL
    (handoff,) = waiting.undelivered
    assert handoff.parent_session_id == "away"
    time.sleep(2.5)  # a master of another session ticks twice: never its handoff
    assert lab.entry("worker-h2") == waiting
    assert handoff_lines(other_out.read_text(), "worker-h2") == []

    first = lab.run("master", "--session-id", "away", "--once")
    assert first.returncode == 0, first.stderr
    assert handoff_lines(first.stdout, "worker-h2"), first.stdout
    assert all(
        line.startswith("handoff worker-h2: exited code 0")
        for line in handoff_lines(first.stdout, "worker-h2")
    )
    assert lab.entry("worker-h2").status is Status.CLOSED

    second = lab.run("master", "--session-id", "away", "--once")
    assert second.returncode == 0, second.stderr
    assert handoff_lines(second.stdout, "worker-h2") == []


def _terminal_worker(lab: Lab, session: str, owner: str) -> Entry:
    dead = dead_identity()
    entry = lab.store.register(
        make_entry(session, process=dead, parent_pid=dead.pid, parent_session_id=owner)
    )
    record = ExitRecord(kind=ExitKind.EXITED, at=now_ms(), code=0)
    return lab.store.update(
        entry.key,
        lambda e: lifecycle.record_terminal(e, record, now_ms(), summary="finished"),
        registration=entry.registration,
    )


def test_a_handoff_replayed_on_activation_is_printed_exactly_once(lab: Lab) -> None:
    _terminal_worker(lab, "h3", "away")
    done = lab.run("master", "--session-id", "away", "--once")
    expected = "handoff worker-h3: exited code 0, agent agent-h3: finished"
    assert handoff_lines(done.stdout, "worker-h3") == [expected]


def test_an_undelivered_handoff_survives_a_closed_record(lab: Lab) -> None:
    first = _terminal_worker(lab, "h4", "away")
    (handoff,) = first.undelivered
    # A relaunch registers a newer generation (the handoff is carried over), which is then
    # cleaned up by its owner: the record closes with the handoff still undelivered.
    newer = lab.store.register(make_entry("h4", parent_session_id="away"))
    assert [h.id for h in newer.undelivered] == [handoff.id]
    lab.store.update(
        newer.key, lambda e: lifecycle.close(e, "cleanup", now_ms()), registration=newer.registration
    )

    done = lab.run("master", "--session-id", "away", "--once")
    assert done.returncode == 0, done.stderr
    assert handoff_lines(done.stdout, "worker-h4"), done.stdout


# --- scan, reconcile, tree --------------------------------------------------------------------------------
def _matrix_for_owner_verbs(lab: Lab) -> dict[str, Entry]:
    sleeper = spawn_sleeper()
    lab.popens.append(sleeper)
    alive = procs.identify(sleeper.pid)
    assert alive is not None
    me = procs.current()
    dead = dead_identity()
    complete = {"session_file": str(lab.root / "s.jsonl"), "cwd": str(lab.root), "provider": "pi"}
    entries = [
        make_entry("lead", role=Role.MASTER, process=me),
        make_entry(
            "kid1", process=alive, parent_pid=me.pid, parent_proc_start=me.start_ticks,
            parent_session_id="lead", task_ref="goal-1",
        ),
        make_entry(
            "kid2", status=Status.RESUMABLE, process=dead, parent_pid=me.pid,
            parent_proc_start=me.start_ticks, parent_session_id="lead",
        ),
        make_entry(
            "orphan", process=alive, parent_pid=dead.pid, parent_proc_start=dead.start_ticks,
            parent_session_id="gone", identity=make_identity("orphan", lane="lane-o"),
        ),
        make_entry(
            "crashed", process=dead, parent_pid=me.pid, parent_proc_start=me.start_ticks,
            parent_session_id="lead", identity=make_identity("crashed", **complete), task_ref="goal-2",
        ),
        make_entry("vanished", process=dead, parent_pid=me.pid, parent_proc_start=me.start_ticks,
                   parent_session_id="lead", identity=make_identity("vanished", provider="other")),
        make_entry("done", status=Status.CLOSED, process=dead),
    ]  # fmt: skip
    return {e.key: lab.store.register(e) for e in entries}


def test_scan_json_reports_orphans_and_writes_nothing(lab: Lab) -> None:
    _matrix_for_owner_verbs(lab)
    before = dir_digest(str(lab.state))

    done = lab.run("scan", "--json")

    assert done.returncode == 0, done.stderr
    rows = {row["key"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"worker-orphan"}
    assert rows["worker-orphan"]["alive"] is True
    assert rows["worker-orphan"]["lane"] == "lane-o"
    assert rows["worker-orphan"]["parentSessionId"] == "gone"
    assert dir_digest(str(lab.state)) == before


def test_reconcile_dry_run_plans_and_writes_nothing(lab: Lab) -> None:
    _matrix_for_owner_verbs(lab)
    before = dir_digest(str(lab.state))

    done = lab.run("reconcile", "--dry-run", "--json")

    assert done.returncode == 0, done.stderr
    plan = {row["key"]: row["action"] for row in json.loads(done.stdout)}
    assert plan == {
        "master-lead": "keep",
        "worker-kid1": "keep",
        "worker-kid2": "keep",
        "worker-orphan": "keep",
        "worker-crashed": "mark_resumable",
        "worker-vanished": "remove",
        "worker-done": "remove",
    }
    assert dir_digest(str(lab.state)) == before


def test_reconcile_removes_closed_records_and_repairs_a_dead_running_worker(lab: Lab) -> None:
    planted = _matrix_for_owner_verbs(lab)
    kept = {key: lab.raw(key) for key in ("master-lead", "worker-kid1", "worker-kid2", "worker-orphan")}

    done = lab.run("reconcile", "--json")

    assert done.returncode == 0, done.stderr
    applied = {row["key"]: row["action"] for row in json.loads(done.stdout)}
    assert applied == {
        "worker-crashed": "mark_resumable",
        "worker-vanished": "remove",
        "worker-done": "remove",
    }
    assert not (lab.state / "worker-done.json").exists()
    assert not (lab.state / "worker-vanished.json").exists()
    repaired = lab.entry("worker-crashed")
    assert repaired.status is Status.RESUMABLE and repaired.reason == "interrupted"
    assert repaired.registration == planted["worker-crashed"].registration
    assert repaired.resumable is not None
    assert repaired.resumable.identity == planted["worker-crashed"].identity
    assert repaired.resumable.task_ref == "goal-2"
    assert {key: lab.raw(key) for key in kept} == kept

    again = lab.run("reconcile", "--json")
    assert json.loads(again.stdout) == []


def test_tree_json_groups_workers_under_their_master(lab: Lab) -> None:
    _matrix_for_owner_verbs(lab)
    before = dir_digest(str(lab.state))

    done = lab.run("tree", "--json")

    assert done.returncode == 0, done.stderr
    tree = json.loads(done.stdout)
    (master,) = tree["masters"]
    assert master["key"] == "master-lead" and master["alive"] is True
    assert {w["key"] for w in master["workers"]} == {
        "worker-kid1", "worker-kid2", "worker-crashed", "worker-vanished",
    }  # fmt: skip
    kid1 = next(w for w in master["workers"] if w["key"] == "worker-kid1")
    assert kid1["alive"] is True and kid1["taskRef"] == "goal-1" and kid1["status"] == "running"
    assert {w["key"] for w in tree["unparented"]} == {"worker-orphan", "worker-done"}
    assert dir_digest(str(lab.state)) == before


def test_a_real_master_and_its_worker_show_up_in_the_tree(lab: Lab) -> None:
    master, _ = lab.start_master("live")
    lab.start_worker("t1", master.pid, "live", "goal-9", lane="lane-t")
    done = lab.run("tree", "--json")
    tree = json.loads(done.stdout)
    (node,) = tree["masters"]
    assert node["key"] == "master-live" and node["alive"] is True
    (worker,) = node["workers"]
    assert worker["key"] == "worker-t1"
    assert worker["alive"] and worker["childAlive"]
    assert worker["lane"] == "lane-t" and worker["taskRef"] == "goal-9"
    assert tree["unparented"] == []
