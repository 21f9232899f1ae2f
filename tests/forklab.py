"""The world of a fork run's tests (seed 003): a private tmux server whose pane plays the caller."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from labs import STANDIN, Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.fork import ForkRun, RunStore


class Caller(Lab):
    """A scratch world: :class:`labs.Lab` with a parent session file, and a tmux pane on the lab's
    server that plays the caller (its ``TMUX`` and ``TMUX_PANE`` in the environment)."""

    # A fork's processes are killed outright (a finisher must not start on the way out).
    stop_signals: ClassVar[tuple[signal.Signals, ...]] = (signal.SIGKILL, signal.SIGKILL)

    def __init__(self, tmp: Path, socket: str) -> None:
        super().__init__(tmp, socket)
        self.session = self.work / "parent.jsonl"
        header = {"type": "session", "version": 3, "id": "parent-1", "timestamp": "2026-12-03T00:00:00.000Z"}
        self.session.write_text(json.dumps({**header, "cwd": str(self.work)}) + "\n")
        subprocess.run(
            ["tmux", "-L", socket, "new-session", "-d", "-s", "caller", "-x", "200", "-y", "50", "sleep 600"],
            check=True,
        )
        shown = subprocess.run(
            ["tmux", "-L", socket, "display-message", "-p", "-t", "caller",
             "#{socket_path}\t#{pane_id}\t#{window_id}"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        self.socket_path, self.pane, self.window = shown.split("\t")
        self.env.update(
            PI_MATRIX_PI_COMMAND=json.dumps(STANDIN), TMUX=f"{self.socket_path},1,0", TMUX_PANE=self.pane
        )

    def fork(self, *words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pi_tmux_matrix", "fork", "--session", str(self.session), *words]
        return subprocess.run(
            argv, env=env or self.env, cwd=self.work, capture_output=True, text=True, timeout=90, check=False
        )

    def master_that_forks(self, task: str, *agent_flags: str) -> subprocess.Popen[bytes]:
        """A headless master whose agent (a script, given ``agent_flags`` like pi's) runs
        ``pi-matrix fork --background … -- task``, keeps its output, and waits for :meth:`go`."""
        code = (
            "import subprocess, sys, pathlib, time\n"
            f"argv = [sys.executable, '-m', 'pi_tmux_matrix', 'fork', '--background', '--json', "
            f"'--session', {str(self.session)!r}, '--', {task!r}]\n"
            "out = subprocess.run(argv, capture_output=True, text=True)\n"
            f"pathlib.Path({str(self.work / 'fork.out')!r}).write_text(out.stdout + out.stderr)\n"
            f"while not pathlib.Path({str(self.work / 'go')!r}).exists(): time.sleep(0.05)\n"
        )
        argv = [
            sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--headless", "--mode",
            "print", "--", sys.executable, "-c", code, *agent_flags,
        ]  # fmt: skip
        return self.spawn(argv)

    def spawn(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        """``argv`` started in the caller's env and cwd, silent, in a session of its own (as pi's
        bash tool starts commands); ``options`` override those for :class:`subprocess.Popen`."""
        defaults: dict[str, Any] = {
            "stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
            "start_new_session": True,
        }  # fmt: skip
        return subprocess.Popen(argv, env=self.env, cwd=self.work, **{**defaults, **options})

    @contextmanager
    def process(self, argv: list[str], **options: Any) -> Iterator[subprocess.Popen[bytes]]:
        """:meth:`spawn`, killed on the way out if it is still running."""
        proc = self.spawn(argv, **options)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def forked_run_id(self) -> str:
        out = self.work / "fork.out"
        shown = wait_for("the master's agent to fork", lambda: out.exists() and out.read_text())
        return str(json.loads(shown)["id"])

    def go(self) -> None:
        (self.work / "go").write_text("")

    def runs_cli(self, *words: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pi_tmux_matrix", "runs", *words]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)

    def runs(self) -> list[ForkRun]:
        return RunStore(self.store).list()[0]

    def panes(self) -> dict[str, tuple[str, str]]:
        """pane id -> (window id, fork run tag) on the caller's server."""
        shown = subprocess.run(
            ["tmux", "-L", self.socket, "list-panes", "-a", "-F",
             "#{pane_id}\t#{window_id}\t#{@pi_matrix_fork_run}"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        rows = [line.split("\t") for line in shown.splitlines() if line]
        return {row[0]: (row[1], row[2]) for row in rows}

    def cleanup(self) -> None:
        for run in self.runs():
            if run.process is not None:
                procs.signal_group(run.process, signal.SIGKILL)
        for identity in procs.with_argument(str(self.state)):
            procs.send_signal(identity, signal.SIGKILL)  # background finishers
        # Hosts and their agents (a print-mode agent has its own session: it outlives a killed
        # host), and the tmux server.
        super().cleanup()
