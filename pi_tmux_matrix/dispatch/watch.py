"""One agent's completion watcher for one marker round: event-driven.

It runs inside the agent's own host (one process per agent:
docs/decisions.md#the-agents-host-watches-its-own-rounds), in the host's round thread
(:mod:`.roundwatch`), one :class:`Watcher` per round. tmux backend: tmux ``pipe-pane`` feeds the
pane's output into a FIFO the host reads (no capture-pane polling; one capture of the history at
each round's start catches what the agent printed before). Subprocess backend: the host's log
file is read every :data:`FOLLOW_POLL_S` (no inotify: the kernel's 128 instances per user are
the hosts', one per agent: docs/decisions.md#one-inotify-instance-per-host). The host tells the
round it ended (its agent ended and its exit is recorded) through a pipe, and the round keeps a
timer for the deadline; it writes exactly one result for its round, for whichever comes first:

* the agent's ``DONE:<nonce>`` / ``BLOCKED:<nonce> reason`` marker on a line of its own;
* the host's exit (its entry says how the agent ended);
* the deadline: the ``timeout`` result is written first, then the host stops its agent
  (request -> SIGTERM -> SIGKILL, recorded ``timed_out``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from ..errors import CorruptEntry, PiMatrixError, TmuxUnavailable
from ..matrix.artifacts import marked_answer
from ..matrix.fsio import open_state_file
from ..matrix.mailbox import EventLog, Inbox, addressee, round_message
from ..matrix.store import MatrixStore, now_ms
from .hostless import HOST_ENDED, exit_words
from .jobs import JobStore, result_now
from .markers import MarkerScanner
from .model import AgentResult, Job, JobAgent, ResultKind

if TYPE_CHECKING:
    import pluggy

__all__ = ["InHost", "MarkerScanner", "Watcher", "drain_pipe"]

log = logging.getLogger(__name__)

# How long a marker's result waits for the pi bridge's usage claim (written at pi's agent_end,
# a moment after the marker showed in the pane); as long as a handoff waits for its artifact.
CLAIM_WAIT_S: Final = 5.0
# A followed log is read this often: a read at its end costs next to nothing, and a marker waits
# at most this long (the pi bridge's own safety-net poll is as long).
FOLLOW_POLL_S: Final = 0.25
# Whether a follow-up re-armed the agent (a file read and parsed): looked at this often when
# polling, not at every poll.
SUPERSEDED_EVERY_S: Final = 1.0


@attrs.frozen
class InHost:
    """What a round watched from inside its agent's host needs of that host."""

    pid: int  # the host's own pid (the job record may not name it yet: the fire writes it after)
    done_fd: int  # readable once the host's agent ended and its exit is recorded
    wake_fd: int  # readable when the host took mail (a follow-up may have re-armed the round)
    stop: Callable[[], None]  # the deadline: the host stops its agent (recorded timed out)
    # The key the host holds now (a session switch changes it); None: nothing is registered (the
    # matrix is off), and ``exit_code`` says how the agent ended.
    key: Callable[[], str] | None = None
    exit_code: Callable[[], int | None] = lambda: None
    look_s: float = 30.0  # a quiet round's job is looked at this often unwoken (the thread's net)


@attrs.define
class Watcher:
    """One round of one agent, run by the round thread of that agent's host (:mod:`.roundwatch`)."""

    store: MatrixStore
    job: Job
    agent: JobAgent
    round: int
    in_host: InHost  # the host this round runs in: how its agent ended, its deadline stop, its wakes
    follow: str | None = None
    socket: str | None = None
    pane: str | None = None
    # Both come from the host's round thread: how to get the plugin manager when a result is
    # written (the thread loads it then, once), and the FIFO tmux's ``pipe-pane`` writes the
    # pane's output to.
    plugins_of: Callable[[], pluggy.PluginManager] | None = None
    pipe_fd: int | None = None
    # False: the pipe was on the pane before its agent started, so its history holds nothing the
    # pipe did not bring (a fresh host's first round): no capture-pane.
    scan_history: bool = True
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
            self.job,
            self.agent.agent_id,
            self.agent.key,
            self.round,
            kind,
            detail=detail,
            exit_code=exit_code,
            exit_kind=exit_kind,
        )
        written = self.jobs.put_result(result)
        if written is None:
            return None  # someone saw the end first (a stop, another watcher): theirs stands
        result = written
        self.events.write("result", job=self.job.id, round=self.round, kind=kind.value, detail=detail[:200])
        if kind in (ResultKind.DONE, ResultKind.BLOCKED):
            self._tell_host(kind, detail, "" if result.usage is None else result.usage.line())
        with contextlib.suppress(Exception):  # a plugin's failure never loses a written result
            if self.plugins_of is not None:
                self.plugins_of().hook.on_terminal(job=self.job, result=result)
        return result

    def _tell_host(self, kind: ResultKind, detail: str, usage: str) -> None:
        """The marker ended the round: its host hands off now (it owns writes to its entry), not
        when its agent later ends. Addressed to the host this round runs under: a host gone
        since takes nothing, and its end hands off as before."""
        name = self.agent.result_name(self.job.id, self.round)
        text = round_message(
            job=self.job.id,
            round_=self.round,
            outcome=kind.value,
            marker=self.scanner.marker,
            reason=detail,
            text=self.scanner.round_text,
            path=self.jobs.results.path(name),
            usage=usage,
        )
        key = self._host_key()
        to = addressee(self.store, key, self.in_host.pid)
        try:
            Inbox(self.store, key).post("round", text, sender="pi-matrix watch", to=to)
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

    def _host_key(self) -> str:
        return self.in_host.key() if self.in_host.key is not None else self.agent.key

    def host_ended(self) -> AgentResult | None:
        if self.in_host.key is None:
            code = self.in_host.exit_code()  # nothing registered: the host knows how it ended
            detail = "agent exited" + (f" with code {code}" if code is not None else "")
            return self.write(ResultKind.EXITED, detail, exit_code=code)
        entry = self.store.find(self._host_key())
        if entry is None or entry.pid != self.in_host.pid:
            return None  # the key is another host's now (a lost claim): its rounds are not ours
        exit_record = entry.exit
        if exit_record is None:
            return self.write(ResultKind.EXITED, HOST_ENDED)
        detail, code, kind = exit_words(self.store, self.agent.key, exit_record)
        return self.write(ResultKind.EXITED, detail, exit_code=code, exit_kind=kind)

    def on_deadline(self) -> None:
        if self.superseded():
            return  # a follow-up re-armed the agent: this round's deadline no longer applies
        try:
            written = self.write(ResultKind.TIMEOUT, f"deadline of {self.agent.deadline_s:.0f}s passed")
        except (PiMatrixError, OSError):
            # The result is lost (a full disk), the owner's limit is not: stop, then report.
            self.in_host.stop()
            raise
        if written is None:
            return
        self.in_host.stop()  # the host is this process: it stops its own agent

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
        selector = selectors.DefaultSelector()
        # The host is this process: it says when its agent ended, and when it took mail.
        selector.register(self.in_host.done_fd, selectors.EVENT_READ, "host")
        selector.register(self.in_host.wake_fd, selectors.EVENT_READ, "wake")
        follow_fd = self._open_sources(selector)
        try:
            self._scan_history()
            if self._marker_found() or (follow_fd is not None and self._read_follow(follow_fd)):
                return 0
            while not self._step(selector, follow_fd):
                pass
            return 0
        finally:
            selector.close()  # closes no fd: the host's FIFO and pipes outlive the round
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
        quiet = self.in_host.look_s
        ready = selector.select(timeout=min(remaining, FOLLOW_POLL_S if follow_fd is not None else quiet))
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
            if key.data == "wake":
                drain_pipe(key.fd)
                if self.superseded():
                    return True
                # Just looked: not again below (an idle fleet's every wake read the job twice).
                self._next_look = time.monotonic() + SUPERSEDED_EVERY_S
        if follow_fd is not None and self._read_follow(follow_fd):
            return True
        # Not at every chunk of a busy pane: a follow-up wakes a host's round at once anyway.
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
        # The FIFO of a host's own pane ends only after the host: what the agent printed last is
        # in already, or a moment away.
        deadline = time.monotonic() + 0.3
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
        if not self.scan_history or self.socket is None or self.pane is None or self._found is not None:
            return
        from .tmux import TmuxServer

        try:
            text = TmuxServer(self.socket).capture(self.pane, history=True)
        except (TmuxUnavailable, PiMatrixError, OSError):
            return
        self._found = self.scanner.feed(text.encode() + b"\n")


def drain_pipe(fd: int) -> None:
    """Empty a non-blocking wake pipe (its bytes only say "look again")."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while os.read(fd, 4096):
            pass
