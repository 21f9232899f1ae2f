"""A ``pi-matrix host`` a test started itself (``python -m pi_tmux_matrix … host -- ARGV``, as a
user would), around the bundled stand-in, and what it wrote: its entry, events, session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import Reaper, read_events
from labs import STANDIN
from waiting import wait_for

from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.model import Entry
from pi_tmux_matrix.matrix.store import MatrixStore


def pi_matrix(store: MatrixStore, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``pi-matrix --state-dir <the store's root> ARGS`` in ``cwd``, to its end, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        check=False,
    )


@dataclass
class Host:
    """One running ``pi-matrix host`` and the files it is about."""

    popen: subprocess.Popen[bytes]
    key: str
    session_file: Path
    store: MatrixStore
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def entry(self) -> Entry | None:
        return self.store.find(self.key)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return read_events(self.store.root, self.key, name)

    def statuses(self) -> list[tuple[str, str | None]]:
        return [(e["status"], e.get("reason")) for e in self.events("status")]

    def session(self) -> list[dict[str, Any]]:
        try:
            lines = self.session_file.read_text().splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def steers(self) -> list[str]:
        return [
            str(r.get("content"))
            for r in self.session()
            if r.get("type") == "message" and r.get("role") == "user" and r.get("steer") is True
        ]

    def turn_started(self, task: str) -> bool:
        return any(
            r.get("type") == "message" and r.get("role") == "user" and r.get("content") == task
            for r in self.session()
        )

    def diagnose(self) -> str:
        entry = self.entry()
        status = None if entry is None else (entry.status.value, entry.reason, entry.pid, entry.exit)
        tail = [(e["event"], e.get("status") or e.get("kind") or e.get("channel")) for e in self.events()]
        try:
            output = self.log.read_text()[-2000:]
        except OSError:
            output = ""
        return f"entry: {status}\nevents: {tail}\nhost output:\n{output}"

    def wait_child(self, reaper: Reaper, *, timeout: float = 30.0) -> ProcessIdentity:
        """The agent process the host started (from the entry), tracked for cleanup."""

        def child() -> ProcessIdentity | None:
            entry = self.entry()
            if entry is None or entry.pid != self.pid:
                return None
            return entry.child_process

        return reaper.identity(
            wait_for("the host to record its child", child, timeout=timeout, detail=self.diagnose)
        )

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"host {self.pid} still running after {timeout}s\n{self.diagnose()}"
            ) from None


def start_host(
    reaper: Reaper,
    store: MatrixStore,
    work: Path,
    session: str,
    *,
    mode: str,
    agent: list[str],
    parent: int | None = None,
    parent_session: str | None = None,
    task_ref: str | None = None,
    task_summary: str | None = None,
    extra: tuple[str, ...] = (),
) -> Host:
    """Start ``pi-matrix host`` around ``agent`` (the stand-in's own arguments)."""
    session_file = work.parent / "sessions" / f"{session}.jsonl"
    cmd = [
        sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "host",
        "--session-id", session, "--session-file", str(session_file), "--cwd", str(work),
        "--provider", "pi", "--mode", mode,
    ]  # fmt: skip
    if parent is not None:
        cmd += ["--parent-pid", str(parent), "--parent-session", parent_session or "boss"]
    if task_ref is not None:
        cmd += ["--task-ref", task_ref]
    if task_summary is not None:
        cmd += ["--task-summary", task_summary]
    mode_flags = {"print": ["-p"], "rpc": ["--mode", "rpc"], "interactive": []}[mode]
    cmd += [*extra, "--", *STANDIN, *mode_flags, "--session", str(session_file), *agent]
    log = work.parent / "logs" / f"{session}-{len(reaper.popens)}.log"
    log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "STANDIN_STEP_S": "0.05"}
    popen = reaper.logged(cmd, log, cwd=work, env=env)
    key = f"{'worker' if parent is not None else 'master'}-{session}"
    return Host(popen=popen, key=key, session_file=session_file, store=store, log=log)
