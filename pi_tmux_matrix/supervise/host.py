"""The agent host: the registered process that owns exactly one agent child.

Real ``pi`` cannot be changed, so the host carries the pi-side behaviour for it, and a foreign CLI
gets the same (docs/decisions.md#the-host-carries-what-pi-cannot): it registers the entry, runs ARGV
without a shell, watches the declared parent's identity with a pidfd (death is seen at once;
``watcherPollMs`` polling is the safety net), winds down to ``resumable`` when the parent is gone,
waits the grace window for an adoption grant or a cleanup request, and records how the child ended.

It never kills anything but its own child, and only when its owner asked (``stop``), its
deadline passed, a cleanup was requested, or the grace window expired.

This module holds the host itself: registration, session switches, the owner's messages, and
the selector loop. The rooms it is built from: ``record`` (our entry, fenced writes, our events
and mail), ``child`` (spawn, telling the agent, the stop sequence, how the child ended), ``rpc``
(the rpc-mode pipe), ``bridge_reports`` (what the pi bridge reports), ``worker`` (the parent
watch, wind-down and grace window) and ``timers`` (the loop's clocks).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Final

import attrs

from .. import procs, strictjson
from ..errors import PiMatrixError
from ..identity import Mode, ProcessIdentity, Role, validate_id, validate_task_ref
from ..matrix import lifecycle
from ..matrix.mailbox import MAX_MESSAGE_BYTES, AgentNotices, EventLog, Message
from ..matrix.model import Entry, ExitKind, Status
from ..matrix.store import MatrixStore, now_ms
from ..piversion import agent_version
from ..settings import MatrixSettings
from .bridge_reports import BRIDGE_KINDS, BridgeReports, SessionReport
from .child import AgentChild, child_env, exit_code_of
from .claim import Yielding
from .hostspec import HostSpec
from .record import OwnRecord
from .rounds import Rounds
from .rpc import RPC_TAG
from .timers import Timers
from .worker import PARENT_TAG, Phase, WorkerSide

__all__ = ["AgentHost", "HostHooks", "Phase", "exit_code_of"]

log = logging.getLogger(__name__)
# The selector's tags for what the loop waits on (the parent's pidfd and rpc stdout are tagged
# by the rooms that register them).
CHILD_TAG: Final = "child"
SIGNAL_TAG: Final = "signal"
INOTIFY_TAG: Final = "inotify"  # the process's one inotify instance: our inbox, a master's state dir
ROUND_END_WAIT_S: Final = 1.5  # an agent that ended by itself: how long its round's marker may lag


@attrs.define
class HostHooks:
    """Extension points the master uses (activation, delivery on every tick)."""

    on_registered: Callable[[AgentHost], None] | None = None
    on_tick: Callable[[AgentHost], None] | None = None
    on_switch: Callable[[AgentHost, str], None] | None = None
    # The agent's session shut down (its child ended): what depends on it is ended too, e.g. its
    # running fork runs (docs/decisions.md#a-fork-stops-with-its-parent-session); fork/ sits
    # above supervise/, so the program wires it in.
    on_agent_end: Callable[[AgentHost], None] | None = None
    # Sees the record the first registration replaces, under its lock; raising refuses it.
    may_register: Callable[[Entry | None], None] | None = None
    # After each look at the inbox (new mail, at once with inotify): e.g. a handoff pi took.
    on_wake: Callable[[AgentHost], None] | None = None


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
        err: IO[str] | None = None,
    ) -> None:
        self.spec = spec
        self.store, self.settings = store, settings
        self.hooks = hooks or HostHooks()
        self.out = out or sys.stdout
        self.role = spec.role or spec.contract.role
        self.me = procs.current()
        self.record = OwnRecord(store, spec.identity.key(self.role), events_cap=settings.events_max_bytes)
        self.agent = AgentChild(
            self.record,
            mode=spec.mode,
            is_pi=spec.identity.is_pi,
            stop_grace_s=spec.stop_grace_s,
            out=self.out,
            die_with_host=self.role is Role.MASTER,
        )
        self.yielding = Yielding(self.record, self.agent, self.role, err or sys.stderr)
        self.record.on_superseded = self.yielding
        self.worker = WorkerSide(
            self.record,
            self.agent,
            self.role,
            self.me,
            settings.adoption_grace_ms / 1000,
            beat_window_s=(2 * settings.heartbeat_ms + settings.watcher_poll_ms) / 1000,
        )
        self.reports = BridgeReports(artifacts=str(store.root / "artifacts"))
        self.rounds = Rounds(self.record, self.reports, self.record.events)
        self.handoffs_told: set[str] = set()  # the workers whose word of a new handoff came
        self._selector: selectors.BaseSelector | None = None
        self._trimmed = False  # the free heap given back once, at the first heartbeat

    # What the program reads of its host (cli/master.py: its hooks, and ``reports`` for delivery).
    @property
    def key(self) -> str:
        return self.record.key

    @property
    def entry(self) -> Entry | None:
        return self.record.entry

    @property
    def events(self) -> EventLog:
        return self.record.events

    @property
    def notices(self) -> AgentNotices:
        return self.record.notices

    @property
    def child(self) -> subprocess.Popen[bytes] | None:
        return self.agent.popen

    def register(self, check: Callable[[Entry | None], None] | None = None) -> Entry:
        """Write our entry as a new process generation (an older same-session host loses it)."""
        contract = self.spec.contract
        if self.role is Role.WORKER and contract.parent_pid is not None:
            if contract.parent_start is not None:
                # The launcher's own record of its identity: whatever holds the pid now may be
                # someone else, and then the parent is already lost (seen right after registering).
                declared = ProcessIdentity(contract.parent_pid, contract.parent_start, self.me.boot_id)
                self.worker.parent = declared
            else:
                self.worker.parent = procs.identify(contract.parent_pid)
        entry = lifecycle.new_entry(
            role=self.role,
            identity=self.spec.identity,
            process=self.me,
            now=now_ms(),
            parent=self.worker.parent,
            parent_pid=contract.parent_pid,
            task_ref=contract.task_ref,
            parent_session_id=contract.parent_session,
            task_summary=self.spec.task_summary,
            agent_version=agent_version(self.spec.argv, self.spec.identity),
        )
        if self.spec.take_over is not None:
            entry = lifecycle.with_child(entry, self.spec.take_over)
        registered = self.record.register(entry, expected=self.spec.claim, check=check)
        self.spec = attrs.evolve(self.spec, claim=None)  # a claim fences the first registration only
        self.events.write("registered", role=self.role.value, generation=registered.registration)
        return registered

    # -- the child --------------------------------------------------------------------------------
    def _spawn(self) -> None:
        env = child_env(
            key=self.key,
            state_dir=str(self.store.root),
            mailbox=str(self.notices.ensure()),
            host_pid=self.me.pid,
        )
        child = self.agent.start(self.spec.argv, cwd=self.spec.identity.cwd, env=env)
        identity = self.agent.identity
        if identity is not None:
            self.record.write(lambda e: lifecycle.with_child(e, identity))
        self.events.write("child_started", pid=child.pid, argv=list(self.spec.argv)[:20])
        self.reports.expect(self.spec.argv, time.monotonic())
        if self.spec.mode is Mode.RPC and self.spec.rpc_prompt:
            self.agent.rpc.send({"type": "prompt", "message": self.spec.rpc_prompt})

    def _record_end(self, returncode: int | None) -> None:
        stop = self.agent.stop
        record = stop.classify(returncode, now_ms())
        self.events.write("child_exited", kind=record.kind.value, code=record.code, signal=record.signal)
        if self.hooks.on_agent_end is not None and not self.record.superseded:  # else not ours to end
            self.hooks.on_agent_end(self)
        # A worker whose pane or tmux server went away under it did not end its task: resumable.
        lost = self.role is Role.WORKER and self.agent.terminal_lost(returncode)
        self.rounds.settle(time.monotonic(), final=True)  # a round that ended first hands off first
        # The outcome already says how it ended: no text is an empty excerpt, not the outcome again.
        summary = self.agent.rpc.last_message or self.reports.last_text()
        pointer = self.reports.result_pointer or str(self.events.path)
        self.record.write(
            stop.end_step(
                record,
                now_ms(),
                summary=summary,
                result_pointer=pointer,
                lost=lost,
                handoff=not self.rounds.handed_off,
            )
        )

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
        now, ready_at = now_ms(), self.entry.ready_at if self.entry else None  # the same pi: still ready
        self.record.write(
            lambda e: lifecycle.close(e, "session_switched", now) if e.can_move_to(Status.CLOSED) else None
        )
        self.events.write("session_switched", to=session_id)
        identity = attrs.evolve(self.spec.identity, session_id=session_id, session_file=session_file)
        contract = attrs.evolve(self.spec.contract, task_ref=task_ref)
        self.spec = attrs.evolve(self.spec, identity=identity, contract=contract)
        self.record.rekey(identity.key(self.role))
        self.register()
        child = self.agent.identity
        if child is not None:
            self.record.write(lambda e: lifecycle.with_child(e, child, ready_at))
        self.events.write("session_switched", previous=old_key)
        self._watch_mail()
        if self.hooks.on_switch is not None:
            self.hooks.on_switch(self, old_key)

    def _switch_from_message(self, text: str) -> None:
        try:
            # Strict and bounded: a request nested 10,000 deep is refused, not a RecursionError.
            request = strictjson.loads(text, max_bytes=MAX_MESSAGE_BYTES)
            self.switch_session(
                str(request["sessionId"]),
                session_file=request.get("sessionFile"),
                task_ref=request.get("taskRef"),
            )
        except (ValueError, KeyError, TypeError, PiMatrixError) as exc:
            self.events.write("switch_refused", error=str(exc)[:300])

    def _follow_session(self, report: SessionReport) -> None:
        """pi's real session: a different id (pi chose its own, /new, /resume, /fork) is a session
        switch; the same one completes the entry's identity with pi's session file. Either way the
        agent is ready (``readyAt``; a switch's new entry from this report, as the same pi is up)."""
        entry = self.entry
        if report.session_id not in {
            self.spec.identity.session_id,
            entry.identity.session_id if entry else None,
        }:
            self.switch_session(report.session_id, session_file=report.session_file)
        # pi has loaded (the bridge reports at session_start): the entry says when, once.
        now, session_file = now_ms(), report.session_file
        self.record.write(lambda e: lifecycle.ready(e, now, session_file))

    # -- owner commands (and the bridge's reports, which share the inbox) ---------------------------
    def handle_messages(self, messages: list[Message]) -> None:
        for message in messages:
            self.events.write("message", kind=message.kind, sender=message.sender)
            if message.kind == "stop":
                # The dispatcher's watcher asks with "deadline": its owner's time limit, not a kill.
                if message.text == "deadline":
                    self.agent.request_stop(ExitKind.TIMED_OUT, "deadline")
                else:
                    self.agent.request_stop(ExitKind.KILLED, "stop")
            elif message.kind == "steer":
                self.rounds.asked()
                self.agent.steer(message.text)
            elif message.kind in ("prompt", "abort"):
                if message.kind == "prompt":
                    self.rounds.asked()
                self.agent.tell("prompt" if message.kind == "prompt" else "abort", message.text)
            elif message.kind == "round":
                self.rounds.ended(message.text, time.monotonic())
            elif message.kind == "fork_result":
                # A background fork's result (its finisher posts it): into the session once.
                self.agent.tell("fork_result", message.text)
            elif message.kind == "switch":
                self._switch_from_message(message.text)
            elif message.kind == "handoff":
                self.handoffs_told.add(message.text)  # a master's delivery takes them (on_wake)
            elif message.kind in BRIDGE_KINDS:
                report = self.reports.receive(message.kind, message.text, self.events)
                if report is not None:
                    self._follow_session(report)
                self.rounds.settle(time.monotonic())  # the artifact a round waits for may be in

    def wake(self, *, net: bool = False) -> None:
        """New mail, or a directive announced: look now rather than at the next tick. ``net``: the
        poll's look, the safety net under inotify; it tells ``on_wake`` only when it found mail,
        so an idle host's tick wakes nothing else (docs/decisions.md#an-idle-fleet-is-quiet)."""
        current, messages = self.record.look()
        self.handle_messages(messages)
        self.worker.check_entry(current)
        if self.hooks.on_wake is not None and not self.record.superseded and (messages or not net):
            self.hooks.on_wake(self)

    # -- the loop -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Register, run the child (if any), supervise until it ends; returns its exit code."""
        self.register(self.hooks.may_register)
        if self.hooks.on_registered is not None:
            self.hooks.on_registered(self)
        if self.role is Role.WORKER and not self.worker.alive():
            self.worker.parent_lost()
        # Handlers, not SIG_IGN: an ignored disposition would be inherited by the child across
        # exec and make Ctrl-C dead in an interactive agent. _on_signals decides what each means.
        watched = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR2)
        with procs.SignalWakeup(watched) as wakeup:
            if self.spec.take_over is not None:
                self.agent.take_over(self.spec.take_over)
            elif self.spec.argv:
                try:
                    self._spawn()
                except OSError as exc:
                    log.error("host: cannot start %r: %s", self.spec.argv[0], exc.strerror)
                    self.events.write("spawn_failed", error=str(exc))
                    self._record_end(127)
                    return 127
            return self._loop(wakeup)

    def _loop(self, wakeup: procs.SignalWakeup) -> int:
        """Wait on the fds and the timers until the child ends; each ready fd goes to the handler
        of its tag, then whatever timers are due run."""
        selector = selectors.DefaultSelector()
        self._selector = selector
        selector.register(wakeup.read_fd, selectors.EVENT_READ, SIGNAL_TAG)
        child_fd = None
        if self.agent.running:
            identity = self.agent.identity
            child_fd = procs.open_pidfd(identity) if identity is not None else None
            if child_fd is None:
                return self._on_child_exit()  # it ended before we could watch it
            selector.register(child_fd, selectors.EVENT_READ, CHILD_TAG)
            self.agent.rpc.watch(selector)
        self._watch_mail()
        self.worker.start_watching(selector)
        timers = Timers.start(self.settings, self.spec.deadline_s, time.monotonic())
        self.wake()  # mail sent before we were watching
        handlers: dict[str, Callable[[selectors.SelectorKey], int | None]] = {
            CHILD_TAG: lambda _key: self._on_child_exit(),
            PARENT_TAG: lambda _key: self.worker.check(),
            SIGNAL_TAG: lambda _key: self._on_signals(wakeup.drain()),
            INOTIFY_TAG: lambda _key: self.record.watches.dispatch(),
            RPC_TAG: self._on_rpc,
        }
        try:
            while True:
                for key, _ in selector.select(self._timeout(timers)):
                    code = key.data() if callable(key.data) else handlers[key.data](key)
                    if code is not None:
                        return code
                if not self.agent.running and self.agent.stop.requested:
                    self._record_end(0)
                    return 0
                self._on_timers(timers)
        finally:
            self.yielding.tell()  # a takeover's line, once the agent's screen is gone
            self.worker.stop_watching()
            if child_fd is not None:
                os.close(child_fd)
            self.record.unwatch_mail()
            selector.close()
            self.record.watches.close()
            self._selector = None

    def _timeout(self, timers: Timers) -> float:
        stop = self.agent.stop
        return timers.timeout(
            time.monotonic(),
            inbox=self.record.mail_watch is None,
            deadline=not stop.requested,
            others=(self.worker.grace_deadline, stop.next_at(), self.rounds.next_at()),
        )

    def _on_child_exit(self) -> int:
        returncode = self.agent.end_code()
        self.worker.unwatch()
        self.agent.rpc.drain()
        # The bridge's last reports (its final result, a tool block) and the watcher's word that
        # the round ended (a print agent exits right after its marker) go in before the end.
        until = time.monotonic() + (ROUND_END_WAIT_S if self.spec.rounds_watched else 0.0)
        while True:
            self.handle_messages([m for m in self.record.mail() if m.kind in (*BRIDGE_KINDS, "round")])
            if not self.rounds.awaited(self.agent.stop.requested) or time.monotonic() >= until:
                break
            time.sleep(0.05)
        self._record_end(returncode)
        return exit_code_of(returncode)

    def _watch_mail(self) -> None:
        """Wake on new mail (polled when inotify is refused); the instance's fd is waited on
        once, whichever watch made it (a master's state dir's, before the loop)."""
        self.record.watch_mail(self.wake)
        fd, selector = self.record.watches.fd, self._selector
        if selector is not None and fd is not None and fd not in selector.get_map():
            selector.register(fd, selectors.EVENT_READ, INOTIFY_TAG)

    def _on_rpc(self, key: selectors.SelectorKey) -> None:
        if not self.agent.rpc.read(key.fd) and self._selector is not None:
            self._selector.unregister(key.fd)

    def _on_timers(self, timers: Timers) -> None:
        now = time.monotonic()
        self.rounds.settle(now)
        polled = timers.poll.due(now)
        if polled:
            self.worker.poll()
            self.wake(net=True)
        if self.record.mail_watch is None and timers.inbox.due(now):
            self.wake(net=True)
        if timers.beat_due(now, polled=polled):
            beat = now_ms()
            # Whole, not durable: a crash that undoes a beat ended this host too
            # (docs/decisions.md#a-heartbeat-is-whole-but-not-made-durable).
            self.record.write(lambda e: lifecycle.heartbeat(e, beat), durable=False)
            if not self._trimmed:
                # Its start is behind it (imports, registration, the agent's spawn): what the
                # allocator still holds free goes back, ~1 MiB of every host
                # (docs/decisions.md#a-hosts-memory-is-judged-by-its-pss).
                self._trimmed = True
                procs.release_free_heap()
            self.reports.check_silent(time.monotonic(), self.events, self.key)
            if self.hooks.on_tick is not None and not self.record.superseded:
                self.hooks.on_tick(self)
        if self.worker.expired(now):
            self.worker.expire()
        if timers.deadline_passed(now) and not self.agent.stop.requested:
            self.agent.request_stop(ExitKind.TIMED_OUT, "deadline")
        self.agent.run_stop_steps()

    def _on_signals(self, received: list[int]) -> None:
        for sig in received:
            if sig == signal.SIGUSR2:
                self.wake()
            elif sig == signal.SIGINT and self.spec.mode is Mode.INTERACTIVE and self.child is not None:
                continue  # the terminal already sent it to the child's process group
            elif sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                if not self.agent.running:
                    # A master with no child: being asked to stop is the end of the line.
                    self.agent.request_stop(ExitKind.KILLED, "signal")
                    continue
                self.agent.forward(sig)
