"""``pi-matrix top``: the live view of the matrix (masters → workers), with owner keys.

On a terminal it redraws whenever the state dir changes (inotify; a 1 s poll otherwise), reading
entries without taking any lock. Keys: ↑/↓ or k/j select, ``a`` adopt, ``c`` clean up, ``r``
resume, ``s`` stop, ``q`` quit; each action asks the same confirmation as its CLI verb and runs
the same code. Not on a terminal (or with ``--once``) it prints one plain snapshot.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import sys
import termios
import tty
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from .. import procs
from ..errors import EXIT_OK, EXIT_USAGE, PiMatrixError
from ..identity import ProcessIdentity, Role
from ..inotify import DirWatch
from ..inotify import available as inotify_available
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore, now_ms
from ..settings import resolve_state_dir
from ..supervise.claim import unsupervised
from .base import age

if TYPE_CHECKING:
    from .base import Io

__all__ = ["register", "rows"]

HEADER = ("KEY", "STATUS", "ALIVE", "LANE", "TASK", "AGE", "BEAT", "HANDOFFS", "TMUX")


def register(sub: Any, epilog: str) -> None:
    top = sub.add_parser(
        "top",
        help="the live view: masters and workers, with keys to adopt, clean up, resume, stop",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument(
        "--parent-pid", type=int, metavar="PID", help="the adopting master (default: the caller's)"
    )
    top.add_argument("--parent-session", metavar="ID", help="the adopting master's session id")
    top.set_defaults(handler=cmd_top)



def rows(store: MatrixStore) -> list[tuple[Entry | None, tuple[str, ...]]]:
    """The tree as table rows: each master, then its workers (indented), then unparented workers."""
    entries = store.list().entries
    now = now_ms()
    targets: dict[str, str] = {}
    with contextlib.suppress(PiMatrixError, OSError):
        from ..dispatch.jobs import JobStore

        for job in JobStore(store).list_jobs()[0]:
            for agent in job.agents:
                if agent.target and agent.pane_id:
                    targets[agent.key] = f"{agent.socket}:{agent.pane_id}"
    masters = [e for e in entries if e.role is Role.MASTER]
    sessions = {m.identity.session_id for m in masters}
    out: list[tuple[Entry | None, tuple[str, ...]]] = []

    def row(entry: Entry, indent: str) -> tuple[Entry | None, tuple[str, ...]]:
        alive = "yes" if procs.is_alive(entry.process) else (unsupervised(entry) or "no")
        status = entry.status.value + (f" ({entry.reason})" if entry.reason else "")
        return entry, (
            indent + entry.key, status, alive, entry.identity.lane or "-", entry.task_ref or "-",
            age(entry.created_at, now), age(entry.heartbeat_at, now), str(len(entry.undelivered)),
            targets.get(entry.key, "-"),
        )  # fmt: skip

    for master in masters:
        out.append(row(master, ""))
        for worker in entries:
            if worker.role is Role.WORKER and worker.parent_session_id == master.identity.session_id:
                out.append(row(worker, "└ "))
    orphans = [e for e in entries if e.role is Role.WORKER and e.parent_session_id not in sessions]
    if orphans:
        out.append((None, ("(no registered master)", "", "", "", "", "", "", "", "")))
        out.extend(row(worker, "└ ") for worker in orphans)
    return out


def _table(table: list[tuple[Entry | None, tuple[str, ...]]], width: int) -> list[str]:
    cells = [HEADER, *(r for _, r in table)]
    widths = [min(max(len(c[i]) for c in cells), 44) for i in range(len(HEADER))]
    lines = []
    for cell in cells:
        line = "  ".join(text[: widths[i]].ljust(widths[i]) for i, text in enumerate(cell)).rstrip()
        lines.append(line[:width])
    return lines


class _Terminal:
    """cbreak mode on the terminal for single keys; cooked mode back for a question."""

    def __init__(self, stdin: IO[str], stdout: IO[str]) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.fd = stdin.fileno()
        self.saved = termios.tcgetattr(self.fd)

    @contextlib.contextmanager
    def keys(self) -> Iterator[None]:
        tty.setcbreak(self.fd)
        self.stdout.write("\x1b[?25l")  # hide the cursor
        try:
            yield
        finally:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.stdout.write("\x1b[?25h\n")
            self.stdout.flush()

    def ask(self, question: str) -> bool:
        termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
        try:
            self.stdout.write(f"\x1b[?25h\n{question} [y/N] ")
            self.stdout.flush()
            answer = os.read(self.fd, 1024).decode(errors="replace")
        finally:
            tty.setcbreak(self.fd)
            self.stdout.write("\x1b[?25l")
        return answer.strip().lower() in ("y", "yes")


class Top:
    def __init__(self, store: MatrixStore, io: Io, owner: tuple[ProcessIdentity, str] | None) -> None:
        self.store = store
        self.io = io
        self.owner = owner
        self.selected = 0
        self.message = ""

    def draw(self, table: list[tuple[Entry | None, tuple[str, ...]]]) -> None:
        size = shutil.get_terminal_size((80, 24))
        lines = _table(table, size.columns)
        out = ["\x1b[H\x1b[2J", f"pi-matrix top — {self.store.root}"[: size.columns]]
        for i, line in enumerate(lines):
            marker = "\x1b[7m" if i == self.selected + 1 else ""
            out.append(f"{marker}{line}\x1b[0m" if marker else line)
        out = out[: size.lines - 2]
        out.append(self.message[: size.columns])
        out.append("↑/↓ select  a adopt  c clean up  r resume  s stop  q quit"[: size.columns])
        self.io.out.write("\r\n".join(out))
        self.io.out.flush()

    def act(self, key: str, entry: Entry | None, terminal: _Terminal) -> None:
        from ..matrix import lifecycle
        from ..matrix.mailbox import Inbox
        from ..supervise.master import handshake, require_master

        if entry is None or entry.role is not Role.WORKER:
            self.message = "select a worker first"
            return
        lane = entry.identity.lane or "-"
        who = f"worker {entry.identity.agent_id} (lane {lane})"
        try:
            if key == "a":
                master, session = require_master(self.owner)
                if terminal.ask(f"adopt {who}?"):
                    now = now_ms()
                    handshake(
                        self.store,
                        entry,
                        lambda e: lifecycle.grant_adoption(e, master, session, now),
                        "pi-matrix top",
                    )
                    self.message = f"adoption granted: {entry.key}"
            elif key == "c":
                if terminal.ask(f"clean up {who} gracefully?"):
                    owner_session = self.owner[1] if self.owner else None
                    handshake(
                        self.store,
                        entry,
                        lambda e: lifecycle.request_cleanup(e, owner_session, now_ms()),
                        "pi-matrix top",
                    )
                    self.message = f"cleanup requested: {entry.key}"
            elif key == "s":
                if not procs.is_alive(entry.process):
                    self.message = f"{entry.key}: its host is not running"
                elif terminal.ask(f"stop {who} (request -> SIGTERM -> SIGKILL)?"):
                    Inbox(self.store, entry.key).post("stop", sender="pi-matrix top", to=entry.registration)
                    self.message = f"stop requested: {entry.key}"
            elif key == "r":
                self.resume(entry, who, terminal)
        except PiMatrixError as exc:
            self.message = f"error: {exc}"

    def resume(self, entry: Entry, who: str, terminal: _Terminal) -> None:
        from ..dispatch.model import Relaunch
        from ..dispatch.plugins import plugin_manager
        from ..matrix.owners import require_master
        from .dispatch import default_socket

        master, session = require_master(self.owner)
        if procs.is_alive(entry.process) or entry.status is not Status.RESUMABLE:
            self.message = f"{entry.key}: only a dead resumable worker is resumed (adopt a live one)"
            return
        if terminal.ask(f"resume {who} in its own session?"):
            request = Relaunch(
                entry=entry, parent=master, parent_session=session, state_dir=str(self.store.root),
                socket=default_socket(),
            )  # fmt: skip
            pid = plugin_manager().hook.relaunch(request=request)
            self.message = f"resumed {entry.key}: host pid {pid}"

    def run(self, terminal: _Terminal) -> None:
        watch: DirWatch | None = None
        with contextlib.suppress(OSError):
            if inotify_available() and self.store.exists():
                watch = DirWatch(self.store.root)
        try:
            with terminal.keys():
                while True:
                    table = rows(self.store)
                    self.selected = max(0, min(self.selected, len(table) - 1))
                    self.draw(table)
                    fds = [terminal.fd] + ([watch.fd] if watch else [])
                    ready, _, _ = select.select(fds, [], [], 1.0)
                    if watch is not None and watch.fd in ready:
                        watch.drain()
                    if terminal.fd not in ready:
                        continue
                    key = os.read(terminal.fd, 8).decode(errors="replace")
                    if key in ("q", "\x03"):
                        return
                    if key in ("j", "\x1b[B"):
                        self.selected += 1
                    elif key in ("k", "\x1b[A"):
                        self.selected -= 1
                    elif key in ("a", "c", "r", "s") and table:
                        self.act(key, table[self.selected][0], terminal)
        finally:
            if watch is not None:
                watch.close()


def cmd_top(args: argparse.Namespace, io: Io) -> int:
    store = MatrixStore(resolve_state_dir(args.state_dir))
    from ..matrix.owners import owning_master

    owner = owning_master(store, args.parent_pid, args.parent_session)
    interactive = not args.once and sys.stdin.isatty() and sys.stdout.isatty() and io.out is sys.stdout
    if not interactive:
        width = shutil.get_terminal_size((120, 24)).columns
        table = rows(store)
        io.out.write("\n".join(_table(table, width)) + "\n")
        if not table:
            io.out.write("no entries\n")
        return EXIT_OK
    if not hasattr(termios, "tcgetattr"):
        io.err.write("pi-matrix: error: top needs a terminal; use --once\n")
        return EXIT_USAGE
    Top(store, io, owner).run(_Terminal(sys.stdin, sys.stdout))
    return EXIT_OK
