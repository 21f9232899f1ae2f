"""The agent host: the registered process that owns exactly one agent child.

Real ``pi`` cannot be changed, so the host carries the seed's pi-side behaviour for it (and a
foreign CLI gets the same supervision): it registers the entry, runs ARGV without a shell,
watches the declared parent's identity with a pidfd (death is seen at once; ``watcherPollMs``
polling is the safety net), winds down to ``resumable`` when the parent is gone, waits the
grace window for an adoption grant or a cleanup request, and records how the child ended.

It never kills anything but its own child, and only when its owner asked (``stop``), its
deadline passed, a cleanup was requested, or the grace window expired.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from typing import IO, Any, Final

import attrs

from .. import procs
from ..contract import LaunchContract
from ..errors import Conflict, PiMatrixError
from ..identity import AgentIdentityContract, Mode, ProcessIdentity, Role, validate_id, validate_task_ref
from ..inotify import DirWatch
from ..inotify import available as inotify_available
from ..matrix.model import DirectiveKind, Entry, ExitKind, ExitRecord, Status
from ..matrix.store import MatrixStore, now_ms
from ..settings import MatrixSettings
from . import lifecycle
from .mailbox import AgentNotices, EventLog, Inbox, Message

__all__ = ["AgentHost", "HostHooks", "HostSpec", "exit_code_of"]

log = logging.getLogger(__name__)
BRIDGE_REPORT_S: Final = 20  # how long a pi child with the bridge gets to report in

ENV_KEY: Final = "PI_MATRIX_KEY"
ENV_STATE_DIR: Final = "PI_MATRIX_STATE_DIR"
ENV_MAILBOX: Final = "PI_MATRIX_MAILBOX"
ENV_HOST_PID: Final = "PI_MATRIX_HOST_PID"
ENV_CLI: Final = "PI_MATRIX_CLI"
# With inotify the inbox wakes the host at once; without it, this is how often it looks.
INBOX_POLL_S: Final = 1.0
ENVELOPE_TEXT_CHARS: Final = 1000  # of a tool_blocked report's tool, path or reason
# What the pi bridge reports from inside the session (never an owner's command).
BRIDGE_KINDS: Final = ("identity", "result", "bridge")


@attrs.frozen(kw_only=True)
class HostSpec:
    """Everything the host needs to know before it starts."""

    argv: tuple[str, ...]
    identity: AgentIdentityContract
    contract: LaunchContract
    mode: Mode = Mode.INTERACTIVE
    task_summary: str = ""
    deadline_s: float | None = None
    stop_grace_s: float = 3.0
    rpc_prompt: str | None = None
    role: Role | None = None  # None: worker iff the contract declares a valid parent


@attrs.define
class HostHooks:
    """Extension points the master uses (activation, delivery on every tick)."""

    on_registered: Callable[[AgentHost], None] | None = None
    on_tick: Callable[[AgentHost], None] | None = None
    on_switch: Callable[[AgentHost, str], None] | None = None


def exit_code_of(returncode: int) -> int:
    """A child's return code as a process exit status (signals as 128+n, like a shell)."""
    return returncode if returncode >= 0 else 128 - returncode


class AgentHost:
    """Register, run the child, supervise, record the end. One instance per process."""

    def __init__(
        self,
        spec: HostSpec,
        store: MatrixStore,
        settings: MatrixSettings,
        *,
        hooks: HostHooks | None = None,
        out: IO[str] | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.settings = settings
        self.hooks = hooks or HostHooks()
        self.out = out or sys.stdout
        self.role = spec.role or spec.contract.role
        self.me = procs.current()
        self.key = spec.identity.key(self.role)
        self.registration = ""
        self.entry: Entry | None = None
        self.superseded = False
        self.parent: ProcessIdentity | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.child_identity: ProcessIdentity | None = None
        self.events = EventLog(store, self.key)
        self.inbox = Inbox(store, self.key)
        self.notices = AgentNotices(store, self.key)
        # supervision state
        self.phase = "running"  # running | grace | stopping
        self.grace_deadline: float | None = None
        self.stop_outcome: ExitKind | None = None
        self.stop_reason: str | None = None
        self.stop_steps: list[tuple[float, int]] = []
        self.forwarded: int | None = None
        self.last_message = ""
        self.result_pointer: str | None = None  # the bridge's latest result artifact
        self.bridge_expected_by: float | None = None
        self.bridge_seen = False
        self.handoffs_accepted: set[str] = set()  # handoff ids the bridge injected into the session
        self._parent_fd: int | None = None
        self._inbox_watch: DirWatch | None = None
        self._selector: selectors.BaseSelector | None = None
        self._rpc_buffer = b""

    # -- writes to our own entry (fenced by our process generation) --------------------------
    def write(self, change: Callable[[Entry], Entry | None]) -> Entry | None:
        """Apply ``change`` to our entry; None (and no more writes) once a newer process owns it."""
        if self.superseded:
            return None
        before = self.entry.status if self.entry is not None else None
        try:
            entry = self.store.update(self.key, change, registration=self.registration)
        except Conflict as exc:
            self.superseded = True
            log.warning(
                "%s: a newer process generation owns this entry now (%s); this host will not write it again",
                self.key,
                exc.found,
            )
            self.events.write("superseded", found=exc.found)
            return None
        except PiMatrixError as exc:
            log.warning("%s: could not update the entry: %s", self.key, exc)
            return None
        self.entry = entry
        if entry.status is not before:
            self.events.write("status", status=entry.status.value, reason=entry.reason)
        return entry

    # -- registration -----------------------------------------------------------------------------
    def register(self) -> Entry:
        """Write our entry as a new process generation (an older same-session host loses it)."""
        contract = self.spec.contract
        if self.role is Role.WORKER and contract.parent_pid is not None:
            self.parent = procs.identify(contract.parent_pid)
        entry = lifecycle.new_entry(
            role=self.role,
            identity=self.spec.identity,
            process=self.me,
            now=now_ms(),
            parent=self.parent,
            parent_pid=contract.parent_pid,
            parent_session_id=contract.parent_session,
            task_ref=contract.task_ref,
            task_summary=self.spec.task_summary,
        )
        self.entry = self.store.register(entry)
        self.registration = self.entry.registration
        self.superseded = False
        self.events.write("registered", role=self.role.value, generation=self.registration)
        return self.entry

    # -- the child --------------------------------------------------------------------------------
    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                ENV_KEY: self.key,
                ENV_STATE_DIR: str(self.store.root),
                ENV_MAILBOX: str(self.notices.ensure()),
                ENV_HOST_PID: str(self.me.pid),
                # How the bridge runs this same pi-matrix (a master's tmux_agent_manager tool).
                ENV_CLI: json.dumps([sys.executable, "-m", "pi_tmux_matrix"]),
            }
        )
        return env

    def _spawn(self) -> None:
        mode = self.spec.mode
        kwargs: dict[str, Any] = {
            "env": self._child_env(),
            "cwd": self.spec.identity.cwd,
            "close_fds": True,
        }
        if mode is Mode.PRINT:
            kwargs.update(stdin=subprocess.DEVNULL, start_new_session=True)
        elif mode is Mode.RPC:
            kwargs.update(stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self.child = subprocess.Popen(list(self.spec.argv), **kwargs)  # argv list, never a shell
        self.child_identity = procs.identify(self.child.pid)
        if self.child_identity is not None:
            identity = self.child_identity
            self.write(lambda e: lifecycle.with_child(e, identity))
        self.events.write("child_started", pid=self.child.pid, argv=list(self.spec.argv)[:20])
        # A pi child loaded with the bridge reports in within seconds; one that does not is still
        # supervised here (parent watch, stop, exit), only without pi's own identity and notices.
        self.bridge_expected_by = time.monotonic() + BRIDGE_REPORT_S if "-e" in self.spec.argv else None
        if mode is Mode.RPC and self.spec.rpc_prompt:
            self._rpc_send({"type": "prompt", "message": self.spec.rpc_prompt})

    def _rpc_send(self, command: dict[str, Any]) -> bool:
        child = self.child
        if child is None or child.stdin is None or child.stdin.closed:
            return False
        try:
            child.stdin.write((json.dumps(command) + "\n").encode())
            child.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def _signal_child(self, sig: int) -> None:
        identity = self.child_identity
        if identity is None:
            return
        if self.spec.mode is Mode.INTERACTIVE:
            procs.send_signal(identity, sig)
        else:
            procs.signal_group(identity, sig)

    # -- stopping our own child -------------------------------------------------------------------
    def request_stop(self, outcome: ExitKind, reason: str) -> None:
        """The one stop path: request -> grace -> SIGTERM -> grace -> SIGKILL."""
        if self.stop_outcome is not None:
            return
        self.stop_outcome = outcome
        self.stop_reason = reason
        self.events.write("stop_requested", outcome=outcome.value, reason=reason)
        now = time.monotonic()
        grace = self.spec.stop_grace_s
        requested = False
        if self.spec.mode is Mode.RPC:
            requested = self._rpc_send({"type": "abort"})
            child = self.child
            if child is not None and child.stdin is not None:
                # pi --mode rpc exits at once on stdin EOF: the cleanest stop it offers.
                with suppress(OSError):
                    child.stdin.close()
                requested = True
        elif self.spec.mode is Mode.INTERACTIVE and self.spec.identity.is_pi:
            self.notices.notify("shutdown", f"stop requested: {reason}")
            requested = True
        first = now + grace if requested else now
        self.stop_steps = [(first, signal.SIGTERM), (first + grace, signal.SIGKILL)]

    def _run_stop_steps(self) -> None:
        now = time.monotonic()
        while self.stop_steps and self.stop_steps[0][0] <= now:
            _, sig = self.stop_steps.pop(0)
            self.events.write("stop_signal", signal=int(sig))
            self._signal_child(sig)

    # -- parent death and the grace window ------------------------------------------------------
    def _watch_parent(self) -> None:
        self._unwatch_parent()
        if self.parent is None or self._selector is None:
            return
        fd = procs.open_pidfd(self.parent)
        if fd is None:
            return
        self._parent_fd = fd
        self._selector.register(fd, selectors.EVENT_READ, "parent")

    def _watch_inbox(self) -> None:
        """Wake on new mail in our inbox (inotify); without inotify the loop polls it."""
        self._unwatch_inbox()
        if self._selector is None or not inotify_available():
            return
        try:
            watch = DirWatch(self.store.side_dir("mailbox", self.key))
        except OSError:
            return
        self._inbox_watch = watch
        self._selector.register(watch.fd, selectors.EVENT_READ, "inbox")

    def _unwatch_inbox(self) -> None:
        if self._inbox_watch is not None:
            if self._selector is not None:
                self._selector.unregister(self._inbox_watch.fd)
            self._inbox_watch.close()
            self._inbox_watch = None

    def _unwatch_parent(self) -> None:
        if self._parent_fd is not None:
            if self._selector is not None:
                self._selector.unregister(self._parent_fd)
            os.close(self._parent_fd)
            self._parent_fd = None

    def parent_alive(self) -> bool:
        return self.parent is not None and procs.is_alive(self.parent)

    def on_parent_lost(self) -> None:
        """Seed 000 steps 1-3: winding_down -> resumable -> one steer notice -> grace window."""
        if self.role is not Role.WORKER or self.phase != "running":
            return
        self._unwatch_parent()
        self.phase = "grace"
        now = now_ms()
        self.events.write("parent_lost", parent_pid=self.parent.pid if self.parent else None)

        # A master may have granted adoption before this host saw its parent die (a grant can land
        # on a running entry). Winding down over a live grant would void an approved adoption, so
        # the grant wins; a grant to a master that is itself gone is dropped with the wind-down.
        def grant_pending(e: Entry) -> bool:
            d = e.directive
            if e.status is not Status.ADOPTED or d is None or d.kind is not DirectiveKind.ADOPT:
                return False
            if d.parent_pid is None or d.parent_proc_start is None:
                return False
            return procs.is_alive(
                ProcessIdentity(d.parent_pid, d.parent_proc_start, e.boot_id or self.me.boot_id)
            )

        def down(e: Entry) -> Entry | None:
            if grant_pending(e) or not e.can_move_to(Status.WINDING_DOWN):
                return None
            if e.status is Status.ADOPTED:
                e = attrs.evolve(e, directive=None)
            return lifecycle.wind_down(e, now)

        self.write(down)
        self.write(
            lambda e: (
                lifecycle.make_resumable(e, now_ms())
                if not grant_pending(e) and e.can_move_to(Status.RESUMABLE)
                else None
            )
        )
        self.check_entry()  # a grant or a cleanup request that landed first is honoured now
        if self.phase != "grace":
            return
        grace_s = self.settings.adoption_grace_ms / 1000
        entry = self.entry
        text = (
            f"[pi-matrix] Your parent session ({entry.parent_session_id if entry else '?'}, "
            f"pid {entry.parent_pid if entry else '?'}) is gone. Finish or checkpoint the current "
            f"step and start no new work. A new master may adopt you within {grace_s:.0f}s; "
            "otherwise this agent will be stopped and left resumable."
        )
        self.steer(text, notice=True)
        self.grace_deadline = time.monotonic() + grace_s

    def steer(self, text: str, *, notice: bool = False) -> None:
        """Deliver a steering message to the child the way its mode allows."""
        if self.spec.mode is Mode.RPC:
            delivered = self._rpc_send({"type": "steer", "message": text})
            channel = "rpc" if delivered else "lost"
        elif self.spec.mode is Mode.INTERACTIVE and self.spec.identity.is_pi:
            self.notices.notify("steer", text)
            channel = "mailbox"
        else:
            channel = "recorded"
        self.events.write("steer_notice" if notice else "steer", channel=channel, message=text)

    def check_entry(self) -> None:
        """Read our entry (lock-free) and act on a master's directive."""
        if self.superseded:
            return
        try:
            current = self.store.get(self.key)
        except PiMatrixError as exc:
            log.warning("%s: cannot read own entry: %s", self.key, exc)
            return
        if current.registration != self.registration:
            self.superseded = True
            self.events.write("superseded", found=current.registration)
            return
        directive = current.directive
        if directive is None:
            return
        if directive.kind is DirectiveKind.CLEANUP and self.stop_outcome is None:
            self.events.write("cleanup_requested", by=directive.parent_session_id)
            self.phase = "stopping"
            self.request_stop(ExitKind.KILLED, "cleanup")
        elif directive.kind is DirectiveKind.ADOPT and current.status is Status.ADOPTED:
            self._accept_adoption(current)

    def _accept_adoption(self, current: Entry) -> None:
        directive = current.directive
        assert directive is not None
        boot = current.boot_id or self.me.boot_id
        if directive.parent_pid is None or directive.parent_proc_start is None:
            return
        new_parent = ProcessIdentity(directive.parent_pid, directive.parent_proc_start, boot)
        if not procs.is_alive(new_parent):
            self.events.write("adoption_ignored", reason="new parent not alive", pid=new_parent.pid)
            return

        def accept(entry: Entry) -> Entry | None:
            d = entry.directive
            if d is None or d.kind is not DirectiveKind.ADOPT or entry.status is not Status.ADOPTED:
                return None
            return lifecycle.accept_adoption(entry, now_ms())

        if self.write(accept) is None:
            return
        self.parent = new_parent
        self.phase = "running"
        self.grace_deadline = None
        self.events.write("adopted", parent_pid=new_parent.pid, parent_session=directive.parent_session_id)
        self._watch_parent()
        if not procs.is_alive(new_parent):
            self.on_parent_lost()

    def _grace_expired(self) -> None:
        self.grace_deadline = None
        self.events.write("grace_expired")
        self.phase = "stopping"
        self.request_stop(ExitKind.KILLED, "grace_expired")

    # -- session switch (/new, /resume, /fork) -----------------------------------------------------
    def switch_session(
        self, session_id: str, *, session_file: str | None = None, task_ref: str | None = None
    ) -> None:
        """Follow the agent into another session: new key, new registration, old record closed.

        The old record is closed first under our own registration, so no timer of the old
        session can write it again; its handoffs stay where they are and replay when a master
        of that session activates.
        """
        validate_id(session_id, "sessionId")
        if task_ref is not None:
            validate_task_ref(task_ref)
        old_key = self.key
        if session_id == self.spec.identity.session_id:
            return
        now = now_ms()
        self.write(
            lambda e: lifecycle.close(e, "session_switched", now) if e.can_move_to(Status.CLOSED) else None
        )
        self.events.write("session_switched", to=session_id)
        identity = attrs.evolve(self.spec.identity, session_id=session_id, session_file=session_file)
        contract = attrs.evolve(self.spec.contract, task_ref=task_ref)
        self.spec = attrs.evolve(self.spec, identity=identity, contract=contract)
        self.key = identity.key(self.role)
        self.events = EventLog(self.store, self.key)
        self.inbox = Inbox(self.store, self.key)
        self.notices = AgentNotices(self.store, self.key)
        self.register()
        if self.child_identity is not None:
            child = self.child_identity
            self.write(lambda e: lifecycle.with_child(e, child))
        self.events.write("session_switched", previous=old_key)
        self._watch_inbox()
        if self.hooks.on_switch is not None:
            self.hooks.on_switch(self, old_key)

    # -- owner commands -----------------------------------------------------------------------------
    def handle_messages(self, messages: list[Message]) -> None:
        for message in messages:
            self.events.write("message", kind=message.kind, sender=message.sender)
            if message.kind == "stop":
                # The dispatcher's watcher asks with "deadline": its owner's time limit, not a kill.
                if message.text == "deadline":
                    self.request_stop(ExitKind.TIMED_OUT, "deadline")
                else:
                    self.request_stop(ExitKind.KILLED, "stop")
            elif message.kind == "steer":
                self.steer(message.text)
            elif message.kind == "prompt":
                if self.spec.mode is Mode.RPC:
                    self._rpc_send(
                        {"type": "prompt", "message": message.text, "streamingBehavior": "followUp"}
                    )
                elif self.spec.mode is Mode.INTERACTIVE and self.spec.identity.is_pi:
                    self.notices.notify("prompt", message.text)
            elif message.kind == "switch":
                self._switch_from_message(message.text)
            elif message.kind in BRIDGE_KINDS:
                self._from_bridge(message.kind, message.text)
            elif message.kind == "abort":
                if self.spec.mode is Mode.RPC:
                    self._rpc_send({"type": "abort"})
                elif self.spec.mode is Mode.INTERACTIVE and self.spec.identity.is_pi:
                    self.notices.notify("abort", message.text)

    def _from_bridge(self, kind: str, text: str) -> None:
        """What the pi bridge reports from inside the session (never an owner's command)."""
        try:
            report = json.loads(text)
            if not isinstance(report, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError) as exc:
            self.events.write("bridge_garbled", kind=kind, error=str(exc)[:200])
            return
        self.bridge_seen = True
        if kind == "identity":
            self._bridge_identity(report)
        elif kind == "result":
            pointer = report.get("path")
            if isinstance(pointer, str) and os.path.isabs(pointer):
                self.result_pointer = pointer
            self.events.write(
                "agent_result", path=pointer, run=report.get("run"), stop_reason=report.get("stopReason")
            )
        elif report.get("event") == "handoff_accepted" and isinstance(report.get("id"), str):
            # pi took the message: only now may the master mark the handoff delivered.
            self.handoffs_accepted.add(report["id"])
            self.events.write("handoff_accepted", id=report["id"][:200])
        elif report.get("event") in ("tool_blocked", "envelope_refused"):
            self._envelope_report(report)
        else:
            what = report.get("event")
            self.events.write("bridge", what=what if isinstance(what, str) else None)

    def _envelope_report(self, report: dict[str, Any]) -> None:
        """The worker's envelope refused a tool call (or the whole session): recorded in its own
        events, bounded, for ``pi-matrix show`` to list."""

        def text(name: str) -> str | None:
            value = report.get(name)
            return value[:ENVELOPE_TEXT_CHARS] if isinstance(value, str) else None

        if report.get("event") == "envelope_refused":
            self.events.write("envelope_refused", reason=text("reason"))
            return
        self.events.write("tool_blocked", tool=text("tool"), path=text("path"), reason=text("reason"))

    def _bridge_identity(self, report: dict[str, Any]) -> None:
        """pi's real session id and file: the entry's identity is completed with them, and a
        different id (pi chose its own, /new, /resume, /fork) is a session switch."""
        session_id, session_file = report.get("sessionId"), report.get("sessionFile")
        self.events.write("bridge_ready", session_id=session_id, session_file=session_file)
        if not isinstance(session_id, str):
            return
        if session_file is not None and not isinstance(session_file, str):
            return
        try:
            validate_id(session_id, "pi session id")
        except PiMatrixError as exc:
            self.events.write("bridge_identity_refused", error=str(exc)[:200])
            return
        known = {self.spec.identity.session_id, self.entry.identity.session_id if self.entry else None}
        if session_id not in known:
            self.switch_session(session_id, session_file=session_file)
            return
        current = self.entry.identity.session_file if self.entry else None
        if session_file and session_file != current:
            self.write(lambda e: lifecycle.with_identity(e, session_file=session_file))

    def _switch_from_message(self, text: str) -> None:
        try:
            request = json.loads(text)
            self.switch_session(
                str(request["sessionId"]),
                session_file=request.get("sessionFile"),
                task_ref=request.get("taskRef"),
            )
        except (ValueError, KeyError, TypeError, PiMatrixError) as exc:
            self.events.write("switch_refused", error=str(exc)[:300])

    def wake(self) -> None:
        """New mail, or a directive announced: look now rather than at the next tick."""
        self.handle_messages(self.inbox.take())
        self.check_entry()

    # -- rpc output -----------------------------------------------------------------------------------
    def _read_rpc(self, fd: int) -> bool:
        """Consume what the rpc child wrote; False at EOF."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self._consume_rpc(chunk)
        return True

    def _consume_rpc(self, chunk: bytes) -> None:
        self._rpc_buffer += chunk
        *lines, self._rpc_buffer = self._rpc_buffer.split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").strip()
            if not text:
                continue
            try:
                event = json.loads(text)
            except ValueError:
                event = {"raw": text[:2000]}
            if isinstance(event, dict):
                self.events.write("rpc", data=event)
                self._show_rpc(event)

    def _show_rpc(self, event: dict[str, Any]) -> None:
        """What a person (and the dispatcher's watcher) reads in the pane: the assistant's text as
        lines of its own, and one line per run boundary, instead of the raw JSON stream."""
        kind = event.get("type")
        shown: str | None = None
        message = event.get("message")
        if kind == "message_end" and isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
                )
            if isinstance(content, str) and content:
                self.last_message = content[-2000:]
                shown = content
        elif kind in ("agent_start", "agent_end"):
            shown = f"[pi-matrix rpc] {kind}"
        elif kind == "response" and event.get("success") is False:
            shown = f"[pi-matrix rpc] {event.get('command')} failed: {str(event.get('error'))[:200]}"
        if shown is None:
            return
        with suppress(OSError, ValueError):
            self.out.write(shown + "\n")
            self.out.flush()

    def _drain_rpc(self) -> None:
        stdout = self.child.stdout if self.child is not None else None
        if stdout is None or stdout.closed:
            return
        while True:
            try:
                chunk = os.read(stdout.fileno(), 65536)
            except (BlockingIOError, OSError, ValueError):
                return
            if not chunk:
                return
            self._consume_rpc(chunk)

    # -- the end --------------------------------------------------------------------------------------
    def _classify(self, returncode: int) -> ExitRecord:
        now = now_ms()
        code = returncode if returncode >= 0 else None
        sig = -returncode if returncode < 0 else None
        if self.stop_outcome is not None:
            return ExitRecord(kind=self.stop_outcome, at=now, code=code, signal=sig)
        if self.forwarded is not None:
            return ExitRecord(kind=ExitKind.KILLED, at=now, code=code, signal=sig)
        if sig is not None:
            return ExitRecord(kind=ExitKind.CRASHED, at=now, code=None, signal=sig)
        return ExitRecord(kind=ExitKind.EXITED, at=now, code=code)

    def _record_end(self, returncode: int) -> None:
        record = self._classify(returncode)
        self.events.write("child_exited", kind=record.kind.value, code=record.code, signal=record.signal)
        self._abort_forks()
        now = now_ms()
        if self.stop_reason == "grace_expired":
            # Expiry leaves the entry resumable for a future session; only the exit is noted.
            self.write(lambda e: attrs.evolve(e, exit=record) if e.status is Status.RESUMABLE else None)
            return
        if self.stop_reason == "cleanup":
            self.write(lambda e: lifecycle.close(attrs.evolve(e, exit=record), "cleanup", now))
            return
        summary = self.last_message or (
            f"{record.kind.value}"
            + (f" code {record.code}" if record.code is not None else "")
            + (f" signal {record.signal}" if record.signal is not None else "")
        )

        def finish(entry: Entry) -> Entry | None:
            if not entry.can_move_to(Status.TERMINAL):
                return None
            pointer = self.result_pointer or str(self.events.path)
            return lifecycle.record_terminal(entry, record, now, summary=summary, result_pointer=pointer)

        self.write(finish)

    def _abort_forks(self) -> None:
        """The agent's session shut down: its running fork runs are stopped and failed (seed 003)."""
        from ..fork import abort_runs

        session_file = self.entry.identity.session_file if self.entry is not None else None
        try:
            stopped = abort_runs(self.store, parent_session_file=session_file, parent_key=self.key)
        except PiMatrixError as exc:
            self.events.write("fork_abort_failed", error=str(exc))
            return
        for run in stopped:
            self.events.write("fork_aborted", run=run.id, status=run.status.value)

    # -- the loop -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Register, run the child (if any), supervise until it ends; returns its exit code."""
        self.register()
        if self.hooks.on_registered is not None:
            self.hooks.on_registered(self)
        if self.role is Role.WORKER and not self.parent_alive():
            self.on_parent_lost()
        # Handlers, not SIG_IGN: an ignored disposition would be inherited by the child across
        # exec and make Ctrl-C dead in an interactive agent. _on_signals decides what each means.
        watched = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR2)
        with procs.SignalWakeup(watched) as wakeup:
            if self.spec.argv:
                try:
                    self._spawn()
                except OSError as exc:
                    print(
                        f"pi-matrix host: cannot start {self.spec.argv[0]!r}: {exc.strerror}", file=sys.stderr
                    )
                    self.events.write("spawn_failed", error=str(exc))
                    self._record_end(127)
                    return 127
            return self._loop(wakeup)

    def _loop(self, wakeup: procs.SignalWakeup) -> int:
        selector = selectors.DefaultSelector()
        self._selector = selector
        selector.register(wakeup.read_fd, selectors.EVENT_READ, "signal")
        child_fd = None
        if self.child is not None:
            child_fd = os.pidfd_open(self.child.pid)
            selector.register(child_fd, selectors.EVENT_READ, "child")
            if self.child.stdout is not None:
                os.set_blocking(self.child.stdout.fileno(), False)
                selector.register(self.child.stdout.fileno(), selectors.EVENT_READ, "rpc")
        self._watch_inbox()
        if self.phase == "running":
            self._watch_parent()
        poll_s = self.settings.watcher_poll_ms / 1000
        beat_s = self.settings.heartbeat_ms / 1000
        started = time.monotonic()
        next_poll = started + poll_s
        next_beat = started + beat_s
        next_inbox = started + INBOX_POLL_S
        deadline = started + self.spec.deadline_s if self.spec.deadline_s else None
        self.wake()  # mail sent before we were watching
        try:
            while True:
                now = time.monotonic()
                timers = [next_poll, next_beat]
                if self._inbox_watch is None:
                    timers.append(next_inbox)
                if self.grace_deadline is not None:
                    timers.append(self.grace_deadline)
                if deadline is not None and self.stop_outcome is None:
                    timers.append(deadline)
                if self.stop_steps:
                    timers.append(self.stop_steps[0][0])
                timeout = max(0.0, min(timers) - now)
                for key, _ in selector.select(timeout):
                    tag = key.data
                    if tag == "child":
                        assert self.child is not None
                        returncode = self.child.wait()
                        self._unwatch_parent()
                        self._drain_rpc()
                        # The bridge's last reports (its final result, a tool block) may land
                        # just before pi exits: read them before the end is recorded.
                        self.handle_messages([m for m in self.inbox.take() if m.kind in BRIDGE_KINDS])
                        self._record_end(returncode)
                        return exit_code_of(returncode)
                    if tag == "parent":
                        if not self.parent_alive():
                            self.on_parent_lost()
                    elif tag == "signal":
                        self._on_signals(wakeup.drain())
                    elif tag == "inbox" and self._inbox_watch is not None:
                        self._inbox_watch.drain()
                        self.wake()
                    elif tag == "rpc" and not self._read_rpc(key.fd):
                        selector.unregister(key.fd)
                if self.child is None and self.stop_outcome is not None:
                    self._record_end(0)
                    return 0
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + poll_s
                    if self.phase == "running" and self.role is Role.WORKER and not self.parent_alive():
                        self.on_parent_lost()
                    self.wake()
                if self._inbox_watch is None and now >= next_inbox:
                    next_inbox = now + INBOX_POLL_S
                    self.handle_messages(self.inbox.take())
                if now >= next_beat:
                    next_beat = now + beat_s
                    self._heartbeat()
                    if self.hooks.on_tick is not None:
                        self.hooks.on_tick(self)
                if self.grace_deadline is not None and now >= self.grace_deadline:
                    self._grace_expired()
                if deadline is not None and now >= deadline and self.stop_outcome is None:
                    self.request_stop(ExitKind.TIMED_OUT, "deadline")
                self._run_stop_steps()
        finally:
            self._unwatch_parent()
            if child_fd is not None:
                os.close(child_fd)
            self._unwatch_inbox()
            selector.close()
            self._selector = None

    def _heartbeat(self) -> None:
        beat = now_ms()
        self.write(lambda e: lifecycle.heartbeat(e, beat))
        expected = self.bridge_expected_by
        if expected is not None and not self.bridge_seen and time.monotonic() > expected:
            self.bridge_expected_by = None
            self.events.write("bridge_silent", after_s=BRIDGE_REPORT_S)
            log.warning(
                "%s: the pi bridge has not reported in %ds; the agent is supervised without pi's session "
                "identity, mailbox notices or result artifacts (check the -e path and pi's output)",
                self.key,
                BRIDGE_REPORT_S,
            )

    def _on_signals(self, received: list[int]) -> None:
        for sig in received:
            if sig == signal.SIGUSR2:
                self.wake()
            elif sig == signal.SIGINT and self.spec.mode is Mode.INTERACTIVE and self.child is not None:
                continue  # the terminal already sent it to the child's process group
            elif sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                if self.child is None:
                    # A master with no child: being asked to stop is the end of the line.
                    self.request_stop(ExitKind.KILLED, "signal")
                    continue
                self.forwarded = sig
                self.events.write("signal_forwarded", signal=sig)
                self._signal_child(sig)
