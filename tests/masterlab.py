"""The Lab of the owner verbs (issue 3's master acceptance): no tmux, no dispatcher. Workers are
real ``pi-matrix host`` processes running the bundled stand-in under a real headless ``pi-matrix
master`` (the ``master_lab`` fixture makes the stand-in the default pi); dead workers are entries
written with the store (``resumable`` with a complete pi context)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any, ClassVar

from helpers import dead_identity, make_entry, make_identity
from labs import STANDIN, Lab
from waiting import wait_for

from pi_tmux_matrix.matrix.model import Entry, ResumablePayload, Status
from pi_tmux_matrix.matrix.store import now_ms


class MasterLab(Lab):
    """:class:`labs.Lab` without tmux, its processes started straight as the test's children,
    the stand-in at its own pace and everything left killed outright at the end."""

    knobs: ClassVar[dict[str, str]] = {}
    # Twice: a host relaunched while the first round ran is recorded by the second.
    stop_signals: ClassVar[tuple[signal.Signals, ...]] = (signal.SIGKILL, signal.SIGKILL)

    def __init__(self, tmp: Path, state: Path) -> None:
        super().__init__(tmp, None, state=state)

    def headless_master(
        self, session: str, task_ref: str | None = None
    ) -> tuple[subprocess.Popen[Any], Path]:
        """A long-running headless ``pi-matrix master`` of the default pi; returns once its
        activation printed: the process and the file its output goes to."""
        out = self.work / f"master-{session}-{len(self.popens)}.out"
        args = ["master", "--session-id", session, "--headless"]
        if task_ref:
            args += ["--task-ref", task_ref]
        proc = self.popen(self.argv(*args), out)
        wait_for(
            f"master {session} to activate",
            lambda: f"master master-{session} active" in out.read_text() or proc.poll() is not None,
            30,
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
        session_file = self.work / "sessions" / f"{session}.jsonl"
        args = [
            "host", "--parent-pid", str(parent), "--parent-session", parent_session,
            "--session-id", session, "--agent-id", f"agent-{session}", "--session-file",
            str(session_file), "--provider", "pi", "--cwd", str(self.work), "--mode", mode,
        ]  # fmt: skip
        if task_ref:
            args += ["--task-ref", task_ref]
        if lane:
            args += ["--lane", lane]
        child = [*STANDIN, "--session", str(session_file)]
        if mode == "print":
            child.append("-p")
        proc = self.popen([*self.argv(*args), "--", *child, task], self.work / f"worker-{session}.out")
        key = f"worker-{session}"
        wait_for(
            f"{key} to start its child",
            lambda: (
                ((e := self.store.find(key)) is not None and e.child_pid is not None)
                or proc.poll() is not None
            ),
            30,
        )
        assert proc.poll() is None, (self.work / f"worker-{session}.out").read_text()
        return proc, session_file

    def dead_resumable(
        self, session: str, parent_session: str, task_ref: str | None, *, lane: str | None = None
    ) -> Entry:
        """A worker whose process is dead, left ``resumable`` with a complete pi context."""
        session_file = self.work / "sessions" / f"{session}.jsonl"
        session_file.parent.mkdir(parents=True, exist_ok=True)
        header = {"type": "session", "version": 3, "id": session, "cwd": str(self.work)}
        first = {"type": "message", "role": "user", "content": "summarise the logs"}
        session_file.write_text(json.dumps(header) + "\n" + json.dumps(first) + "\n")
        identity = make_identity(
            session, session_file=str(session_file), cwd=str(self.work), provider="pi", lane=lane
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


def orphaned_worker(
    lab: MasterLab, session: str, master_session: str, task_ref: str | None, *, lane: str | None = None
) -> tuple[subprocess.Popen[Any], Entry]:
    """A live worker host whose master was SIGKILLed; returns once it is ``resumable``."""
    master, _ = lab.headless_master(master_session, task_ref)
    worker, _ = lab.start_worker(session, master.pid, master_session, task_ref, lane=lane)
    lab.kill(master)
    key = f"worker-{session}"
    entry = wait_for(
        f"{key} to become resumable", lambda: (e := lab.entry(key)).status is Status.RESUMABLE and e, 10
    )
    return worker, entry


def several_orphans(
    lab: MasterLab, master_session: str, task_ref: str | None, sessions: list[tuple[str, str | None]]
) -> dict[str, tuple[subprocess.Popen[Any], Entry]]:
    """Several live workers of one master, all orphaned by one SIGKILL."""
    master, _ = lab.headless_master(master_session, task_ref)
    workers = {
        session: lab.start_worker(session, master.pid, master_session, task_ref, lane=lane)[0]
        for session, lane in sessions
    }
    lab.kill(master)
    out: dict[str, tuple[subprocess.Popen[Any], Entry]] = {}
    for session, proc in workers.items():
        key = f"worker-{session}"
        entry = wait_for(
            f"{key} resumable", lambda k=key: (e := lab.entry(k)).status is Status.RESUMABLE and e, 10
        )
        out[session] = (proc, entry)
    return out


def adopted_by(lab: Lab, key: str, parent_pid: int) -> bool:
    """Whether the worker's host logged that it re-parented to ``parent_pid``."""
    return any(e["event"] == "adopted" and e["parent_pid"] == parent_pid for e in lab.events(key))
