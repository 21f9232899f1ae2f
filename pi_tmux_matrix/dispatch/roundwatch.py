"""A job agent's marker rounds, watched from inside its own host
(docs/decisions.md#the-agents-host-watches-its-own-rounds).

One process per agent: the completion watcher used to be a second interpreter per agent (a
``pi-matrix watch`` started by ``pipe-pane`` or detached, ~26 MiB each, one more inotify
instance, one more start per fire). Now the host runs the rounds in a thread of its own
(wired by ``cli/host_rounds.py``):

* tmux backend: after the host registered and before its agent starts, the host makes a FIFO
  (``pipes/<job>.<agent>.<host pid>.fifo``) and pipes its own pane's output into it (``pipe-pane``
  running a ``sh`` and a ``cat``, no interpreter), so nothing the agent prints is missed; subprocess
  backend: the host's log is followed;
* each round is a :class:`~.watch.Watcher` (marker, deadline, end), the round the job record
  names; a follow-up re-arms the job, posts its prompt to the host, and the host's look at its
  mail wakes the thread, which takes the new round (and, as a safety net, the thread looks at
  the job every :data:`IDLE_LOOK_S` while no round is open);
* the deadline: the thread writes the ``timeout`` result and asks the host (``on_deadline``),
  whose own loop stops the agent; no disk and no mailbox on the way;
* the host's agent ended and its exit is recorded: the host says so through a pipe, the open
  round (if any) writes how the agent ended, and the thread ends.

A failure in the thread is logged and written to the agent's events, and the thread starts
over after a pause: a round is never left without a watcher while the host lives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from .. import procs
from ..errors import JobNotFound, PiMatrixError, TmuxUnavailable
from ..matrix.fsio import open_fifo, opened_dir, remove_regular
from ..matrix.layout import PIPES, pipe_name, pipe_prefix
from ..matrix.mailbox import EventLog
from ..matrix.store import MatrixStore
from .jobs import JobStore
from .model import TMUX
from .watch import InHost, Watcher, drain_pipe

if TYPE_CHECKING:
    import pluggy

__all__ = ["FINISH_WAIT_S", "HOSTED_LOOK_S", "IDLE_LOOK_S", "RoundWatch"]

log = logging.getLogger(__name__)
# How long the host waits for its round thread at the end: the open round's claim wait (5 s)
# and the last drain of the pane, with margin.
FINISH_WAIT_S: Final = 10.0
# With no round open, or an open round quiet, the job is looked at this often even unwoken: the
# net under the wakes. Beside no host (the matrix off) nothing wakes the thread, so this is how
# soon it sees a follow-up.
IDLE_LOOK_S: Final = 30.0
# In a host, which wakes the thread whenever it takes mail (a follow-up's prompt, a stop; by
# inotify, or by its own polls when inotify is refused), the net only has to catch what came
# without mail: a long one keeps an idle fleet quiet (docs/decisions.md#an-idle-fleet-is-quiet).
HOSTED_LOOK_S: Final = 120.0
RETRY_S: Final = (1.0, 5.0, 30.0)  # pauses before the thread starts over after a failure


@attrs.define
class RoundWatch:
    """The round thread of one job agent's host."""

    store: MatrixStore
    job_id: str
    agent_id: str
    pane: str | None = None  # the agent's pane (tmux backend), whose output is piped in
    socket: str | None = None
    follow: str | None = None  # the host's log (subprocess backend)
    skip_through: int = 0  # rounds up to this one are not this host's (a resumed session's)
    own_pane: bool = False  # the pane is the host's own, piped before its agent starts
    # Set by the program: the host's stop for the deadline, and the key it holds now (a session
    # switch changes it; None: nothing registered, the matrix is off).
    on_deadline: Callable[[], None] | None = None
    host_key: Callable[[], str] | None = None
    look_s: float = IDLE_LOOK_S  # the net: HOSTED_LOOK_S once a host pokes the thread on mail
    _fifo: tuple[int, int] | None = None
    _fifo_path: Path | None = None
    _piped: bool = False
    _exit_code: int | None = None
    _done: tuple[int, int] = attrs.field(factory=os.pipe)
    _wake: tuple[int, int] = attrs.field(factory=os.pipe)
    _thread: threading.Thread | None = None

    def __attrs_post_init__(self) -> None:
        for fd in (*self._done, *self._wake):
            os.set_blocking(fd, False)

    @classmethod
    def of_job(
        cls, store: MatrixStore, job_id: str, agent_id: str, *, pane: str | None, skip_through: int = 0
    ) -> RoundWatch | None:
        """The round thread for a job agent, or None (no such agent, or its job unreadable:
        nothing to watch). JobNotFound when the job has no record even after
        :data:`~.jobs.JOB_WAIT_S`:
        the host then starts nothing."""
        try:
            agent = JobStore(store).get_when_written(job_id).agent(agent_id)
        except JobNotFound:
            raise
        except PiMatrixError as exc:
            log.warning("job %s: its rounds are not watched: %s", job_id, exc)
            return None
        if agent is None:
            log.warning("job %s has no agent %s: its rounds are not watched", job_id, agent_id)
            return None
        if agent.backend == TMUX:
            return cls(
                store,
                job_id,
                agent_id,
                pane=pane or agent.pane_id,
                socket=agent.socket,
                skip_through=skip_through,
                own_pane=pane is not None,
            )
        # The fire records the log once the host runs; its name is the backend's (backends.py).
        log_file = agent.log or str(store.root / "logs" / f"{job_id}.{agent_id}.log")
        return cls(store, job_id, agent_id, follow=log_file, skip_through=skip_through)

    def open(self) -> None:
        """Before the agent starts: the pane's output into our FIFO (nothing printed is missed).
        Without a pipe the rounds still end by the agent's end and the deadline."""
        if self.pane is None or self.socket is None:
            return
        from .tmux import TmuxServer

        path = self.store.side_dir(PIPES) / pipe_name(self.job_id, self.agent_id, os.getpid())
        self._drop_dead_hosts_pipes()
        try:
            self._fifo = open_fifo(path)
            self._fifo_path = path
            # A ``sh`` and a ``cat`` per pane (~0.23 MiB together): no interpreter
            # (docs/decisions.md#the-agents-host-watches-its-own-rounds).
            TmuxServer(self.socket).pipe_pane(self.pane, ["sh", "-c", 'exec cat >"$1"', "sh", str(path)])
            self._piped = True
        except (OSError, TmuxUnavailable, PiMatrixError) as exc:
            log.warning(
                "job %s: no pipe on pane %s (%s); rounds end by exit or deadline", self.job_id, self.pane, exc
            )
            self._close_fifo()

    def _drop_dead_hosts_pipes(self) -> None:
        """The FIFOs earlier hosts of this job agent left (killed before they removed theirs) go
        as this one makes its own, each writer blocked in opening one let go (fsio). Only those
        whose host pid runs no process: a live one (the archived job's host after ``fire
        --force``) keeps its own, and a pid taken since keeps one until the sweep."""
        prefix = pipe_prefix(self.job_id, self.agent_id)
        try:
            with opened_dir(self.store.side_dir(PIPES), create=False) as fd:
                if fd is None:
                    return
                for name in os.listdir(fd):
                    pid = name.removeprefix(prefix).removesuffix(".fifo")
                    if name.startswith(prefix) and pid.isdigit() and procs.identify(int(pid)) is None:
                        remove_regular(fd, name, fifo=True)
        except (OSError, PiMatrixError) as exc:  # the sweep removes them later
            log.warning("job %s: earlier hosts' pane pipes are left for the sweep: %s", self.job_id, exc)

    def start(self) -> None:
        """Run the rounds beside the host's loop."""
        self._thread = threading.Thread(target=self._run, name="pi-matrix-rounds", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """The host took mail: a follow-up may have re-armed the round."""
        with contextlib.suppress(BlockingIOError):  # one wake byte already waits
            os.write(self._wake[1], b"w")

    def finish(self, timeout: float = FINISH_WAIT_S, *, exit_code: int | None = None) -> None:
        """The agent ended and its exit is recorded (``exit_code``: with nothing registered, how
        it ended): the open round says how, the thread ends, the pane's pipe is closed."""
        self._exit_code = exit_code
        with contextlib.suppress(BlockingIOError):
            os.write(self._done[1], b"d")
        if self._thread is not None:
            self._thread.join(timeout)
        elif exit_code is not None:  # never started (the agent could not be): still a result
            self._run()
        self._unpipe()
        self._close_fifo()

    # -- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        for pause in (*RETRY_S, None):
            try:
                self._rounds()
                return
            except Exception as exc:  # never the host's end: its agent is still supervised
                log.exception("job %s: the round thread failed", self.job_id)
                key = self._key()
                if key is not None:
                    EventLog(self.store, key).write("rounds_failed", error=str(exc)[:300], retry=pause)
            if pause is None or self._wait_done(pause):
                return

    def _rounds(self) -> None:
        jobs, watched = JobStore(self.store), self.skip_through
        in_host = InHost(
            os.getpid(),
            self._done[0],
            self._wake[0],
            self._deadline_stop,
            key=self.host_key,
            exit_code=lambda: self._exit_code,
            look_s=self.look_s,
        )
        loaded: list[pluggy.PluginManager] = []

        def plugins(cwd: str) -> Callable[[], pluggy.PluginManager]:
            # Loaded at the first result, once: loading reads every installed package's metadata
            # (~1 MiB of each host: docs/decisions.md#a-host-loads-only-what-it-uses), and an idle
            # agent's host never needs them.
            def load() -> pluggy.PluginManager:
                if not loaded:
                    loaded.append(_plugins(cwd))
                return loaded[0]

            return load

        while True:  # at least one look: an agent that never started still ends its round
            job = jobs.get(self.job_id)
            agent = job.agent(self.agent_id)
            if agent is None:
                return
            if agent.round > watched and jobs.result(job.id, agent.agent_id, agent.round) is None:
                # A fresh host's first round: its pipe was on before the agent started.
                first = self.own_pane and self._piped and watched == 0
                Watcher(
                    self.store,
                    job,
                    agent,
                    agent.round,
                    follow=self.follow,
                    socket=self.socket,
                    pane=self.pane,
                    plugins_of=plugins(agent.cwd),
                    pipe_fd=self._read_fd(),
                    in_host=in_host,
                    scan_history=not first,
                ).run()
                watched = agent.round
            elif not self._ended():
                watched = max(watched, agent.round)
                self._idle()
            if self._ended():
                return

    def _idle(self) -> None:
        """No round open: wait for a re-arm or the end, keeping the pane's pipe drained."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._done[0], selectors.EVENT_READ)
            selector.register(self._wake[0], selectors.EVENT_READ)
            fifo = self._read_fd()
            if fifo is not None:
                selector.register(fifo, selectors.EVENT_READ)
            until = time.monotonic() + self.look_s
            while time.monotonic() < until:
                ready = {key.fd for key, _ in selector.select(max(0.0, until - time.monotonic()))}
                if self._done[0] in ready:
                    return
                if self._wake[0] in ready:
                    # Before the pipe: what came with the wake may be the new round's output.
                    drain_pipe(self._wake[0])
                    return
                if fifo is not None and fifo in ready:
                    drain_pipe(fifo)  # between rounds the output is no round's
        finally:
            selector.close()

    def _deadline_stop(self) -> None:
        if self.on_deadline is not None:
            self.on_deadline()

    def _ended(self) -> bool:
        return self._wait_done(0)

    def _wait_done(self, seconds: float) -> bool:
        ready = selectors.DefaultSelector()
        try:
            ready.register(self._done[0], selectors.EVENT_READ)
            return bool(ready.select(seconds))
        finally:
            ready.close()

    def _read_fd(self) -> int | None:
        return self._fifo[0] if self._fifo is not None else None

    def _key(self) -> str | None:
        if self.host_key is not None:
            return self.host_key()
        try:
            agent = JobStore(self.store).get(self.job_id).agent(self.agent_id)
        except PiMatrixError:
            return None
        return agent.key if agent is not None else None

    def _unpipe(self) -> None:
        """Close the pane's pipe before its FIFO goes: a ``cat`` never waits on a FIFO nobody
        will open again (and the pane is left as it was, when it outlives the host)."""
        if not self._piped or self.pane is None or self.socket is None:
            return
        from .tmux import TmuxServer

        with contextlib.suppress(OSError, TmuxUnavailable, PiMatrixError):
            TmuxServer(self.socket).pipe_pane(self.pane, None)
        self._piped = False

    def _close_fifo(self) -> None:
        # The name goes while our ends are still open: a pipe helper that opens it later makes a
        # file and ends at the closed pipe, one that opens it before finds a reader. Closed first,
        # the FIFO would keep a helper arriving between the two waiting for a reader for good.
        if self._fifo_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._fifo_path)
            self._fifo_path = None
        if self._fifo is not None:
            for fd in self._fifo:
                os.close(fd)
            self._fifo = None


def _plugins(cwd: str) -> pluggy.PluginManager:
    from ..settings import load_settings
    from .plugins import plugin_manager

    return plugin_manager(matrix=load_settings(cwd).enabled)
