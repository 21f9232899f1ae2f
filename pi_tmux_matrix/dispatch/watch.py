"""One agent's completion watcher: event-driven, one per agent and marker round.

Run as the hidden verb ``pi-matrix --state-dir D watch --job J --agent A --round N
(--socket S --pane P | --follow LOG)`` (:func:`pi_tmux_matrix.programs.watch_argv`).

tmux backend: tmux ``pipe-pane`` feeds the pane's output to this process's stdin (no
capture-pane polling; one capture of the history at start catches what the agent printed
before the pipe was attached). Subprocess backend: the host's log file is read every
:data:`FOLLOW_POLL_S` (no inotify: the kernel's 128 instances per user are the hosts', one per
agent, issue 30). Either way the watcher also holds a pidfd on the host and a timer for the
deadline, and writes exactly one result for its round, for whichever comes first:

* the agent's ``DONE:<nonce>`` / ``BLOCKED:<nonce> reason`` marker on a line of its own;
* the host's exit (its entry says how the agent ended);
* the deadline: the ``timeout`` result is written first, then the host is asked to stop its
  agent (request -> SIGTERM -> SIGKILL, recorded ``timed_out``), then the owned pane closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs
import pluggy

from .. import procs
from ..errors import CorruptEntry, PiMatrixError, TmuxUnavailable
from ..matrix.artifacts import marked_answer
from ..matrix.fsio import open_state_file
from ..matrix.mailbox import EventLog, Inbox, addressee, round_message
from ..matrix.store import MatrixStore, now_ms
from ..matrix.strays import stop_stray, stray_agent
from .confirm import spawn_failure
from .jobs import JobStore, result_now
from .markers import MarkerScanner
from .model import AgentResult, Job, JobAgent, ResultKind

__all__ = ["MarkerScanner", "Watcher", "stop_agents"]

log = logging.getLogger(__name__)

STOP_WAIT_S: Final = 15.0  # host stop sequence: request + grace + SIGTERM + SIGKILL, with margin
STRAY_GRACE_S: Final = 5.0  # an agent without its host: SIGTERM, this long, then SIGKILL
# How long a marker's result waits for the pi bridge's usage claim (written at pi's agent_end,
# a moment after the marker showed in the pane); as long as a handoff waits for its artifact.
CLAIM_WAIT_S: Final = 5.0
# A followed log is read this often: a read at its end costs next to nothing, and a marker waits
# at most this long (the pi bridge's own safety-net poll is as long).
FOLLOW_POLL_S: Final = 0.25
# Whether a follow-up re-armed the agent (a file read and parsed): looked at this often when
# polling, not at every poll.
SUPERSEDED_EVERY_S: Final = 1.0


@attrs.define
class Watcher:
    store: MatrixStore
    job: Job
    agent: JobAgent
    round: int
    follow: str | None = None
    socket: str | None = None
    pane: str | None = None
    # Both come from where the program starts (the hidden ``pi-matrix watch`` verb): the plugin
    # manager, and the fd tmux's ``pipe-pane`` writes the pane's output to (its stdin).
    plugins: pluggy.PluginManager | None = None
    pipe_fd: int | None = None
    jobs: JobStore = attrs.field(init=False)
    scanner: MarkerScanner = attrs.field(init=False)
    events: EventLog = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.jobs = JobStore(self.store)
        self.scanner = MarkerScanner(self.agent.nonce)
        # Its line per round never rotates the file: the agent's host does, at its eventsMaxBytes.
        self.events = EventLog(self.store, self.agent.key, max_bytes=None)

    # -- the result ---------------------------------------------------------------------------------
    def write(
        self,
        kind: ResultKind,
        detail: str = "",
        *,
        exit_code: int | None = None,
        exit_kind: str | None = None,
    ) -> AgentResult | None:
        result = result_now(
            self.job, self.agent.agent_id, self.agent.key, self.round, kind, detail=detail,
            exit_code=exit_code, exit_kind=exit_kind,
        )  # fmt: skip
        written = self.jobs.put_result(result)
        if written is None:
            return None  # someone saw the end first (a stop, another watcher): theirs stands
        result = written
        self.events.write("result", job=self.job.id, round=self.round, kind=kind.value, detail=detail[:200])
        if kind in (ResultKind.DONE, ResultKind.BLOCKED):
            self._tell_host(kind, detail, "" if result.usage is None else result.usage.line())
        if self.plugins is not None:
            with contextlib.suppress(Exception):  # a plugin's failure never loses a written result
                self.plugins.hook.on_terminal(job=self.job, result=result)
        return result

    def _tell_host(self, kind: ResultKind, detail: str, usage: str) -> None:
        """The marker ended the round: its host hands off now (it owns writes to its entry), not
        when its agent later ends. Addressed to the host this round runs under: a host gone
        since takes nothing, and its end hands off as before."""
        name = self.agent.result_name(self.job.id, self.round)
        text = round_message(
            job=self.job.id, round_=self.round, outcome=kind.value, marker=self.scanner.marker,
            reason=detail, text=self.scanner.round_text, path=self.jobs.results.path(name), usage=usage,
        )  # fmt: skip
        to = addressee(self.store, self.agent.key, self.agent.host_pid)
        try:
            Inbox(self.store, self.agent.key).post("round", text, sender="pi-matrix watch", to=to)
        except PiMatrixError as exc:
            log.warning("%s: the round's end was not told to its host: %s", self.agent.key, exc)

    def superseded(self) -> bool:
        """A follow-up re-armed the agent with a newer round, or this round already has a result."""
        try:
            job = self.jobs.get(self.job.id)
            current = job.agent(self.agent.agent_id)
            if current is None or current.round != self.round:
                return True
            return self.jobs.result(self.job.id, self.agent.agent_id, self.round) is not None
        except PiMatrixError:
            return False

    def host_ended(self) -> AgentResult | None:
        entry = self.store.find(self.agent.key)
        exit_record = entry.exit if entry is not None and entry.pid == self.agent.host_pid else None
        if exit_record is None:
            return self.write(ResultKind.EXITED, "the host ended without recording an exit")
        # A program that could not be started: the same words as the fire's (the fire may come
        # second on a loaded machine, and this result is the one the job keeps).
        failed = spawn_failure(self.store, self.agent.key) if exit_record.code == 127 else None
        if failed is not None:
            return self.write(ResultKind.EXITED, failed, exit_code=127, exit_kind=exit_record.kind.value)
        detail = f"agent {exit_record.kind.value}"
        if exit_record.code is not None:
            detail += f" with code {exit_record.code}"
        if exit_record.signal is not None:
            detail += f" by signal {exit_record.signal}"
        return self.write(
            ResultKind.EXITED, detail, exit_code=exit_record.code, exit_kind=exit_record.kind.value
        )

    def on_deadline(self) -> None:
        if self.superseded():
            return  # a follow-up re-armed the agent: this round's deadline no longer applies
        try:
            written = self.write(ResultKind.TIMEOUT, f"deadline of {self.agent.deadline_s:.0f}s passed")
        except (PiMatrixError, OSError):
            # The result is lost (a full disk), the owner's limit is not: stop, then report.
            stop_agent(self.store, self.agent, reason="deadline")
            raise
        if written is None:
            return
        stop_agent(self.store, self.agent, reason="deadline")

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        except Exception as exc:
            # Never silent: the job would go on saying "running" while nobody watches the round.
            error = f"{type(exc).__name__}: {exc}"[:300]
            self.events.write("watcher_failed", job=self.job.id, round=self.round, error=error)
            raise

    def _run(self) -> int:
        if self.superseded():
            return 0
        host = self.agent.host
        pidfd = procs.open_pidfd(host) if host is not None else None
        if pidfd is None:
            self._scan_history()
            if not self._marker_found():
                self.host_ended()
            return 0
        selector = selectors.DefaultSelector()
        selector.register(pidfd, selectors.EVENT_READ, "host")
        follow_fd = self._open_sources(selector)
        try:
            self._scan_history()
            if self._marker_found() or (follow_fd is not None and self._read_follow(follow_fd)):
                return 0
            while not self._step(selector, follow_fd):
                pass
            return 0
        finally:
            selector.close()
            os.close(pidfd)
            if follow_fd is not None:
                os.close(follow_fd)

    def _open_sources(self, selector: selectors.BaseSelector) -> int | None:
        """The agent's output: the host's log (read every :data:`FOLLOW_POLL_S`) or the pane's
        pipe (``pipe_fd``, tmux ``pipe-pane`` writing to the watcher's stdin)."""
        if self.follow is not None:
            try:
                follow_fd = open_state_file(self.follow)
            except CorruptEntry as exc:
                # A FIFO or a symlink where the host's log should be: never read. The round still
                # ends, by the host's exit or the deadline, without the marker.
                log.warning("%s: the log is not followed: %s", self.agent.key, exc)
                return None
            return follow_fd
        if self.pipe_fd is not None:
            os.set_blocking(self.pipe_fd, False)
            selector.register(self.pipe_fd, selectors.EVENT_READ, "pipe")
        return None

    def _step(self, selector: selectors.BaseSelector, follow_fd: int | None) -> bool:
        """One wait of the loop; True when this round's result is written (or someone else's is)."""
        remaining = (self.agent.deadline_at - now_ms()) / 1000
        if remaining <= 0:
            self.on_deadline()
            return True
        ready = selector.select(timeout=min(remaining, FOLLOW_POLL_S if follow_fd is not None else 30.0))
        for key, _ in ready:
            if key.data == "host":
                self._drain(self.pipe_fd if self.follow is None else None, follow_fd)
                if not self._marker_found():
                    self.host_ended()
                return True
            if key.data == "pipe":
                assert self.pipe_fd is not None
                if self._read_pipe(self.pipe_fd):
                    return True
                if self._pipe_closed:
                    selector.unregister(self.pipe_fd)
                    if self.superseded():
                        return True
        if follow_fd is None:
            return self.superseded()
        if self._read_follow(follow_fd):
            return True
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + SUPERSEDED_EVERY_S
        return self.superseded()

    _found: tuple[ResultKind, str] | None = None
    _pipe_closed: bool = False
    _next_look: float = 0.0  # following a log: when superseded() is looked at next

    def _marker_found(self) -> bool:
        if self._found is None:
            return False
        kind, detail = self._found
        self._await_claim()
        self.write(kind, detail)
        return True

    def _await_claim(self) -> None:
        """A pi worker's bridge claims the round's usage at pi's ``agent_end``, which comes just
        after the marker showed: its result (which reads the claim) waits for it, bounded. Only
        where the bridge runs (it makes ``artifacts/<key>/`` when its session starts): another
        agent's claim is written before its marker, or never. The claim is complete once the
        run that printed the marker ended: the bridge writes it just before that run's artifact,
        so the wait is for an artifact holding the marker (a claim of an earlier run of the same
        round is not the round's)."""
        folder = self.store.root / "artifacts" / self.agent.key
        if not folder.is_dir():
            return
        claim = self.jobs.claim_path(self.agent.result_name(self.job.id, self.round))
        until = time.monotonic() + CLAIM_WAIT_S
        while time.monotonic() < until and not self.superseded():
            if os.path.lexists(claim) and self._marker_run_ended(folder):
                return
            time.sleep(0.05)

    def _marker_run_ended(self, folder: Path) -> bool:
        """One of the bridge's newest run artifacts holds this round's marker (in any of the run's
        answers: notices taken as steers after it are answered in the same run)."""
        return marked_answer(folder, self.scanner.marker) is not None

    def _feed(self, data: bytes) -> bool:
        if self._found is None:
            self._found = self.scanner.feed(data)
        return self._marker_found()

    def _read_pipe(self, fd: int) -> bool:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            self._pipe_closed = True
            if self._found is None:
                self._found = self.scanner.finish()
            return self._marker_found()
        return self._feed(data)

    def _read_follow(self, fd: int) -> bool:
        while True:
            data = os.read(fd, 65536)
            if not data:
                return False
            if self._feed(data):
                return True

    def _drain(self, source_fd: int | None, follow_fd: int | None) -> None:
        """The host is gone: read what it printed last before judging how it ended."""
        if follow_fd is not None:
            self._read_follow(follow_fd)
            return
        if source_fd is None or self._pipe_closed:
            return
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not self._pipe_closed and self._found is None:
            try:
                data = os.read(source_fd, 65536)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if not data:
                self._pipe_closed = True
                self._found = self._found or self.scanner.finish()
                break
            self._found = self._found or self.scanner.feed(data)

    def _scan_history(self) -> None:
        """Once, at start: what the pane showed before the pipe was attached."""
        if self.socket is None or self.pane is None or self._found is not None:
            return
        from .tmux import TmuxServer

        try:
            text = TmuxServer(self.socket).capture(self.pane, history=True)
        except (TmuxUnavailable, PiMatrixError, OSError):
            return
        self._found = self.scanner.feed(text.encode() + b"\n")


def stop_agent(store: MatrixStore, agent: JobAgent, *, reason: str, wait_s: float = STOP_WAIT_S) -> bool:
    """The owner-side stop of one agent (see :func:`stop_agents`); True when its host is gone."""
    return not stop_agents(store, [agent], reason=reason, wait_s=wait_s)


def stop_agents(
    store: MatrixStore, agents: Sequence[JobAgent], *, reason: str, wait_s: float = STOP_WAIT_S
) -> list[JobAgent]:
    """Stop agents through their hosts, all at once, and return the ones whose host survived.

    Each host runs its own stop sequence (request -> SIGTERM -> SIGKILL of its agent); a host that
    has not finished within ``wait_s`` gets SIGTERM (it forwards it), then SIGKILL. Only hosts this
    dispatcher launched are signalled, checked by identity; only their own panes are closed. A
    request the disk refuses (full) is skipped: signals need no disk, and nobody waits for it.
    """
    hosts = [(agent, _host_of(store, agent)) for agent in agents]
    asked = 0
    for agent, host in hosts:
        if host is not None and procs.is_alive(host):
            to = addressee(store, agent.key, host.pid)
            try:
                Inbox(store, agent.key).post("stop", reason, sender=f"pi-matrix {reason}", to=to)
                asked += 1
            except PiMatrixError as exc:
                log.warning("%s; its host gets SIGTERM instead", exc)
    for sig, grace in ((None, wait_s if asked else 0.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        alive = [(a, h) for a, h in hosts if h is not None and procs.is_alive(h)]
        if not alive:
            break
        if sig is not None:
            for _, host in alive:
                procs.send_signal(host, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(procs.is_alive(h) for _, h in alive):
            time.sleep(0.05)
    survivors = [a for a, h in hosts if h is not None and procs.is_alive(h)]
    survivors += [a for a in _stop_unsupervised(store, [a for a, h in hosts if not procs.is_alive(h)])]
    for agent, host in hosts:
        if agent not in survivors:
            _close_pane(agent, host)
    return survivors


def _stop_unsupervised(store: MatrixStore, agents: Sequence[JobAgent]) -> list[JobAgent]:
    """Agents whose host is dead while the agent itself runs on (no host forwards a stop): each is
    stopped by its recorded identity and its end recorded (:func:`~..matrix.strays.stop_stray`,
    the same as ``stop KEY``); the ones that survive are returned."""
    left: list[JobAgent] = []
    for agent in agents:
        try:
            entry = store.find(agent.key)
        except PiMatrixError:
            continue
        if entry is None or stray_agent(entry) is None:
            continue
        try:
            stop_stray(store, entry, grace_s=STRAY_GRACE_S)
        except PiMatrixError as exc:
            log.warning("%s: %s", agent.key, exc)
            left.append(agent)
    return left


def _host_of(store: MatrixStore, agent: JobAgent) -> procs.ProcessIdentity | None:
    """The host to stop for ``agent``: the one the job recorded while it lives, else the live host
    the matrix has registered for its key (a host the job never learnt of: a launch that timed
    out yet started, or one resumed after a crash). A stop never reports a live agent stopped."""
    if procs.is_alive(agent.host):
        return agent.host
    try:
        entry = store.find(agent.key)
    except PiMatrixError:
        return agent.host
    if entry is not None and procs.is_alive(entry.process):
        return entry.process
    return agent.host


def _close_pane(agent: JobAgent, host: procs.ProcessIdentity | None) -> None:
    """Close the agent's pane only if it still is that agent's: pane ids restart at %0 with a new
    tmux server, so the id alone could name another job's pane. Its tags must name this agent and,
    while the host lives, its process must be the host."""
    if agent.pane_ref is None:
        return
    socket, pane_id = agent.pane_ref
    from .tmux import TmuxServer
    from .tmux_model import KEY_TAG

    with contextlib.suppress(TmuxUnavailable, PiMatrixError, OSError):
        server = TmuxServer(socket)
        pane = server.pane(pane_id)
        if pane is None or pane.tag(KEY_TAG) != agent.key:
            return
        running = procs.identify(pane.pane_pid)
        if running is not None and host is not None and running != host:
            return
        server.kill_pane(pane_id)
