"""The tests' one Lab: a state dir, fast settings, a work dir, a private tmux socket, a headless
master and the dispatcher, and every process a test starts, stopped by identity at the end.

A lab that really adds something subclasses it: :class:`masterlab.MasterLab` (worker hosts and
dead records of the owner verbs, no tmux), :class:`pilabs.PiLab` (real pi against a fake model),
:class:`forklab.Caller` (a tmux pane that plays a fork's caller). The fixtures (``lab``,
``sublab`` and the others) are in conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from helpers import kill_now, read_events, stop_outside_its_lock
from tmux_support import kill_tmux_server
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.model import JobAgent
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.errors import PiMatrixError
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.fsio import drop_fifos
from pi_tmux_matrix.matrix.layout import PIPES
from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.pytest_plugin import FAST, MatrixSettingsFile
from pi_tmux_matrix.settings import load_settings
from pi_tmux_matrix.testing.knobs import plugins_with_knobs

# The bundled stand-in agent (no LLM): the argv prefix the shipped plugin's ``stand_in_agent`` gives.
STANDIN = [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]
# The stand-in as a print-mode pi worker (``lab.profile("standin-print", STANDIN_PRINT)``).
STANDIN_PRINT = (
    '[profile]\nname = "standin-print"\nprovider = "pi"\n'
    'command = ["{python}", "-m", "pi_tmux_matrix.testing.standin"]\nmode = "print"\ndeadline = 120\n'
)


class Lab:
    """A state dir, fast settings, a live master, a private tmux socket; all cleaned up.

    ``settings`` is the agent dir's ``processMatrix`` (the shipped plugin's settings file, at its
    fastest legal timings; ``lab.settings.set(adoptionGraceMs=…)`` changes one). What the test
    starts is tracked: ``started`` (identities), ``popens`` (children), ``ptys`` (terminals) and
    ``stopped`` (SIGSTOPped); :meth:`cleanup` stops all of it by identity, with every process the
    state dir records, and kills the lab's tmux server (``socket``; None: the lab has none)."""

    # The stand-in's pace in the lab's environment (its own default is 0.2 s a step).
    knobs: ClassVar[dict[str, str]] = {"STANDIN_STEP_S": "0.05"}
    # How cleanup stops what is left, round by round: a chance to end cleanly, then for good.
    stop_signals: ClassVar[tuple[signal.Signals, ...]] = (signal.SIGTERM, signal.SIGKILL)

    def __init__(self, tmp: Path, socket: str | None, *, state: Path | None = None) -> None:
        self.tmp = tmp
        self.socket = socket
        self.state = state or tmp / "state"
        self.store = MatrixStore(self.state)
        self.agent_dir = Path(os.environ["PI_CODING_AGENT_DIR"])
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        self.settings = MatrixSettingsFile(self.agent_dir / "settings.json").set(**FAST)
        self.work = tmp / "work"
        self.work.mkdir()
        self.env = dict(os.environ, PI_MATRIX_STATE_DIR=str(self.state), **self.knobs)
        self.master: Entry | None = None
        self.started: list[ProcessIdentity] = []
        self.popens: list[subprocess.Popen[Any]] = []
        self.ptys: list[Pty] = []
        self.stopped: list[ProcessIdentity] = []

    # -- commands ---------------------------------------------------------------------------------
    def argv(self, *words: str) -> list[str]:
        """``pi-matrix --state-dir STATE WORDS`` (this interpreter, the package under test)."""
        return [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(self.state), *words]

    def cli(
        self, *words: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """A one-shot ``pi-matrix`` on the lab's state dir with no TTY at all (stdin /dev/null,
        output captured), in the work dir (or ``cwd``) and the lab's environment (or ``env``)."""
        return subprocess.run(
            self.argv(*words), capture_output=True, text=True, timeout=timeout, env=env or self.env,
            cwd=cwd or self.work, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip

    def popen(self, argv: list[str], out: Path | None = None) -> subprocess.Popen[Any]:
        """``argv`` as a child of the test (its output appended to ``out``), killed at cleanup."""
        sink: Any = subprocess.DEVNULL
        if out is not None:
            sink = open(out, "ab")  # noqa: SIM115 - closed right after the child has it
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=self.env, cwd=self.work
            )
        finally:
            if out is not None:
                sink.close()
        self.popens.append(proc)
        return proc

    def pty(self, *words: str) -> Pty:
        """``pi-matrix WORDS`` on a real terminal (:class:`Pty`), closed at cleanup."""
        return self.terminal(self.argv(*words))

    def terminal(self, argv: list[str]) -> Pty:
        """``argv`` on a real terminal in the lab's environment and work dir, closed at cleanup."""
        term = Pty(argv, self.env, self.work)
        self.ptys.append(term)
        return term

    def profile(self, name: str, text: str) -> None:
        """A launch profile ``name`` (its TOML ``text``) in the lab's agent dir."""
        folder = self.agent_dir / "launch_profiles"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.toml").write_text(text)

    # -- the dispatcher ---------------------------------------------------------------------------
    def start_master(self, session: str = "boss", task_ref: str = "goal-1", *extra: str) -> Entry:
        """A headless print-mode ``pi-matrix master`` over the stand-in (its task never ends);
        returns its entry once it registered and its activation is done."""
        argv = [
            sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", session, "--task-ref", task_ref,
            "--headless", "--mode", "print", *extra, "--", *STANDIN, "-p", "HANG orchestrating",
        ]  # fmt: skip
        said = self.tmp / f"master-{session}.{len(self.started)}.out"
        with said.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL,
                cwd=self.work, env=self.env, start_new_session=True,
            )  # fmt: skip
        ident = procs.identify(proc.pid)
        assert ident is not None
        self.started.append(ident)
        self.master = wait_for(
            "the master to register",
            lambda: e if (e := self.store.find(f"master-{session}")) and e.pid == proc.pid else None,
        )
        # Registered is not activated: the activation's reconcile (it removes a dead worker's
        # record) would otherwise race what the test does next. Its report's first line is last.
        active = f"master-{session} active"
        wait_for("the master's activation", lambda: active in said.read_text(errors="replace"))
        return self.master

    def dispatcher(self, **env: str) -> Dispatcher:
        # The stand-in's knobs (STANDIN_STEP_S above) reach its panes through a test-only plugin:
        # the panes' tmux server started from this process's environment, not from self.env.
        merged, settings = dict(self.env, **env), load_settings(self.work, self.env)
        plugins = plugins_with_knobs(merged, matrix=settings.enabled)
        return Dispatcher(self.store, settings, env=merged, plugins=plugins)

    def fire(self, task: str, *, env: dict[str, str] | None = None, **fields: Any) -> Any:
        """Fire ``task`` as the lab's master (profile ``stand-in`` unless given) through a
        dispatcher with ``env`` added to the lab's; its hosts are stopped at cleanup."""
        assert self.master is not None and self.socket is not None
        fields.setdefault("profile", "stand-in")
        request = FireRequest(
            task=task, path=str(self.work), socket=self.socket, parent_pid=self.master.pid,
            parent_session=self.master.identity.session_id, **fields,
        )  # fmt: skip
        result = self.dispatcher(**(env or {})).fire(request)
        self.started += [agent.host for agent in result.job.agents if agent.host is not None]
        return result

    def worker(self, key: str) -> Entry:
        return wait_for(
            f"{key} to register and start its agent",
            lambda: e if (e := self.store.find(key)) and e.status is Status.RUNNING and e.child_pid else None,
        )

    def result(self, job_id: str, agent_id: str, round_: int = 1) -> Any:
        return JobStore(self.store).result(job_id, agent_id, round_)

    # -- the record -------------------------------------------------------------------------------
    def entry(self, key: str) -> Entry:
        return self.store.get(key)

    def raw(self, key: str) -> bytes:
        return (self.state / f"{key}.json").read_bytes()

    def events(self, key: str, name: str | None = None) -> list[dict[str, Any]]:
        return read_events(self.state, key, name)

    # -- processes --------------------------------------------------------------------------------
    def kill(self, proc: subprocess.Popen[Any]) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()

    def pause(self, identity: ProcessIdentity) -> None:
        """SIGSTOP: the process stays alive (an orphan a master must see) but writes nothing;
        stopped outside its entry's lock (``helpers.stop_outside_its_lock``)."""
        self.stopped.append(identity)
        stop_outside_its_lock(self.store, identity)

    def _recorded(self) -> list[ProcessIdentity]:
        """Every process the state dir names (hosts and their agents; relaunched hosts are
        detached, not our children), never this test's own process."""
        found: list[ProcessIdentity] = []
        with contextlib.suppress(Exception):  # a test may have left its record unreadable
            for entry in self.store.list().entries:
                found += [i for i in (entry.process, entry.child_process) if i is not None]
        return [i for i in found if i.pid != os.getpid()]

    def cleanup(self) -> None:
        for term in self.ptys:
            term.close()
        for identity in self.stopped:
            procs.send_signal(identity, signal.SIGCONT)
        for proc in self.popens:
            self.kill(proc)
        targets: list[ProcessIdentity] = []
        for sig in self.stop_signals:
            targets += [i for i in (*self.started, *self._recorded()) if i not in targets]
            for identity in targets:
                procs.send_signal(identity, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(procs.is_alive(t) for t in targets):
                time.sleep(0.05)
        if self.socket is not None:
            kill_tmux_server(self.socket)
        # A pane pipe whose host was killed before its writer opened the FIFO blocks in that
        # open for good: the FIFOs go as the demo's do, each writer let go first.
        with contextlib.suppress(OSError, PiMatrixError):
            drop_fifos(self.state / PIPES)


def lose_worker(lab: Lab, master: Entry, key: str) -> Entry:
    """Kill the master (the worker winds down to resumable), then the worker's host and agent:
    the resumable record, nothing of it alive."""
    procs.send_signal(master.process, signal.SIGKILL)  # type: ignore[arg-type]
    resumable = wait_for(
        "resumable", lambda: e if (e := lab.store.find(key)) and e.status is Status.RESUMABLE else None
    )
    for ident in (resumable.process, resumable.child_process):
        procs.send_signal(ident, signal.SIGKILL)  # type: ignore[arg-type]
        procs.wait_for_exit(ident, 5)  # type: ignore[arg-type]
    return resumable


def lose_and_plan_resume(
    lab: Lab, master: Entry, key: str
) -> tuple[Entry, Entry, subprocess.CompletedProcess[str]]:
    """Kill the master (the worker winds down to resumable), then the worker; start a new master
    (session boss2) and ask ``resume KEY --dry-run --json`` for it: (resumable, master, the run)."""
    assert lab.socket is not None
    resumable = lose_worker(lab, master, key)
    new_master = lab.start_master(session="boss2")
    dry = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", key, "--dry-run", "--json",
         "--parent-pid", str(new_master.pid), "--parent-session", "boss2", "--socket", lab.socket],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    return resumable, new_master, dry


def hostless_agent(lab: Lab, **fields: Any) -> tuple[Any, JobAgent, Entry]:
    """A detached stand-in fired and registered, then its host killed -9 while its agent runs
    on: (the fire's result, its agent, its entry as registered)."""
    fired = lab.fire("HANG long work", backend="subprocess", **fields)
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    assert entry.child_process is not None
    lab.started.append(entry.child_process)
    kill_now(entry.process)
    return fired, agent, entry


def rehosted(lab: Lab, entry: Entry, master: Entry) -> Entry:
    """``entry``'s agent running again under a new host whose parent is ``master``."""
    return wait_for(
        "the agent under a new host",
        lambda: (
            e
            if (e := lab.store.find(entry.key))
            and e.pid != entry.pid
            and e.status is Status.RUNNING
            and e.parent_pid == master.pid
            else None
        ),
        timeout=20,
    )


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
