"""A job agent's marker rounds, watched from inside its own host (issue 30.1).

One process per agent: the completion watcher used to be a second interpreter per agent (a
``pi-matrix watch`` started by ``pipe-pane`` or detached, ~26 MiB each, one more inotify
instance, one more start per fire). Now the host runs the rounds in a thread of its own:

* tmux backend: before the agent starts, the host makes a FIFO (``pipes/<job>.<agent>.fifo``)
  and pipes its own pane's output into it (``pipe-pane`` running one ``cat``, no interpreter),
  so nothing the agent prints is missed; subprocess backend: the host's log is followed;
* each round is a :class:`~.watch.Watcher` (marker, deadline, end), the round the job record
  names; a follow-up re-arms the job, posts its prompt to the host, and the host's look at its
  mail wakes the thread, which takes the new round;
* the host's agent ended and its exit is recorded: the host says so through a pipe, the open
  round (if any) writes how the agent ended, and the thread ends.

What the thread writes goes through the same doors as before: the job's results (``JobStore``),
the host's inbox (a ``round`` message the host's loop takes), the host's stop for the deadline.
A failure in the thread is logged and written to the agent's events; it never ends the host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from ..errors import PiMatrixError, TmuxUnavailable
from ..matrix.fsio import open_fifo
from ..matrix.mailbox import EventLog, Inbox, addressee
from ..matrix.store import MatrixStore
from .jobs import JobStore
from .model import TMUX
from .watch import InHost, Watcher, drain_pipe

if TYPE_CHECKING:
    import pluggy

__all__ = ["FINISH_WAIT_S", "RoundWatch"]

log = logging.getLogger(__name__)
# How long the host waits for its round thread at the end: the open round's claim wait (5 s)
# and the last drain of the pane, with margin.
FINISH_WAIT_S: Final = 10.0


@attrs.define
class RoundWatch:
    """The round thread of one job agent's host."""

    store: MatrixStore
    job_id: str
    agent_id: str
    pane: str | None = None  # the host's own pane (tmux backend), whose output is piped in
    socket: str | None = None
    follow: str | None = None  # the host's log (subprocess backend)
    _fifo: tuple[int, int] | None = None
    _fifo_path: Path | None = None
    _done: tuple[int, int] = attrs.field(factory=os.pipe)
    _wake: tuple[int, int] = attrs.field(factory=os.pipe)
    _thread: threading.Thread | None = None
    # The deadline's stop when no registered host reads its mail (the matrix off): the caller's.
    stop: Callable[[], object] | None = None

    def __attrs_post_init__(self) -> None:
        for fd in (*self._done, *self._wake):
            os.set_blocking(fd, False)

    @classmethod
    def of_job(cls, store: MatrixStore, job_id: str, agent_id: str, *, pane: str | None) -> RoundWatch | None:
        """The round thread for a job agent, or None (no such job or agent: nothing to watch)."""
        try:
            agent = JobStore(store).get(job_id).agent(agent_id)
        except PiMatrixError as exc:
            log.warning("job %s: its rounds are not watched: %s", job_id, exc)
            return None
        if agent is None:
            log.warning("job %s has no agent %s: its rounds are not watched", job_id, agent_id)
            return None
        if agent.backend == TMUX:
            return cls(store, job_id, agent_id, pane=pane or agent.pane_id, socket=agent.socket)
        # The fire records the log once the host runs; its name is the backend's (backends.py).
        log_file = agent.log or str(store.root / "logs" / f"{job_id}.{agent_id}.log")
        return cls(store, job_id, agent_id, follow=log_file)

    def open(self) -> None:
        """Before the agent starts: the pane's output into our FIFO (nothing printed is missed).
        Without a pipe the rounds still end by the agent's end and the deadline."""
        if self.pane is None or self.socket is None:
            return
        from .tmux import TmuxServer

        path = self.store.side_dir("pipes") / f"{self.job_id}.{self.agent_id}.fifo"
        try:
            self._fifo = open_fifo(path)
            self._fifo_path = path
            # One ``cat`` per pane (each sh execs the next): no interpreter, as issue 30.1 asks.
            TmuxServer(self.socket).pipe_pane(self.pane, ["sh", "-c", 'exec cat >"$1"', "sh", str(path)])
        except (OSError, TmuxUnavailable, PiMatrixError) as exc:
            log.warning(
                "job %s: no pipe on pane %s (%s); rounds end by exit or deadline", self.job_id, self.pane, exc
            )
            self._close_fifo()

    def start(self) -> None:
        """Run the rounds beside the host's loop."""
        self._thread = threading.Thread(target=self._run, name="pi-matrix-rounds", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """The host took mail: a follow-up may have re-armed the round."""
        with contextlib.suppress(BlockingIOError):  # one wake byte already waits
            os.write(self._wake[1], b"w")

    def finish(self, timeout: float = FINISH_WAIT_S) -> None:
        """The agent ended and its exit is recorded: the open round says how, the thread ends."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._done[1], b"d")
        if self._thread is not None:
            self._thread.join(timeout)
        self._close_fifo()

    # -- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._rounds()
        except Exception as exc:  # never the host's end: its agent is still supervised
            log.exception("job %s: the round thread failed", self.job_id)
            key = self._key()
            if key is not None:
                EventLog(self.store, key).write("rounds_failed", error=str(exc)[:300])

    def _rounds(self) -> None:
        jobs, watched = JobStore(self.store), 0
        in_host = InHost(os.getpid(), self._done[0], self._wake[0], self._deadline_stop)
        loaded: list[pluggy.PluginManager] = []

        def plugins(cwd: str) -> Callable[[], pluggy.PluginManager]:
            # Loaded at the first result, once: loading reads every installed package's metadata
            # (~1 MiB of each host, issue 30.10), and an idle agent's host never needs them.
            def load() -> pluggy.PluginManager:
                if not loaded:
                    loaded.append(_plugins(cwd))
                return loaded[0]

            return load

        while not self._ended():
            job = jobs.get(self.job_id)
            agent = job.agent(self.agent_id)
            if agent is None:
                return
            if agent.round > watched and jobs.result(job.id, agent.agent_id, agent.round) is None:
                Watcher(
                    self.store, job, agent, agent.round, follow=self.follow, socket=self.socket,
                    pane=self.pane, plugins_of=plugins(agent.cwd), pipe_fd=self._read_fd(),
                    in_host=in_host,
                ).run()  # fmt: skip
                watched = agent.round
                continue
            watched = max(watched, agent.round)
            self._idle()

    def _idle(self) -> None:
        """No round open: wait for a re-arm or the end, keeping the pane's pipe drained."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._done[0], selectors.EVENT_READ)
            selector.register(self._wake[0], selectors.EVENT_READ)
            fifo = self._read_fd()
            if fifo is not None:
                selector.register(fifo, selectors.EVENT_READ)
            while True:
                ready = {key.fd for key, _ in selector.select()}
                if fifo is not None and fifo in ready:
                    drain_pipe(fifo)  # between rounds the output is no round's
                if self._done[0] in ready:
                    return
                if self._wake[0] in ready:
                    drain_pipe(self._wake[0])
                    return
        finally:
            selector.close()

    def _deadline_stop(self) -> None:
        """The deadline passed: the host's own stop, asked as any owner asks (its loop, not this
        thread, runs the stop sequence: request -> SIGTERM -> SIGKILL, recorded timed out)."""
        if self.stop is not None:
            self.stop()
            return
        key = self._key()
        if key is None:
            return
        to = addressee(self.store, key, os.getpid())
        Inbox(self.store, key).post("stop", "deadline", sender="pi-matrix deadline", to=to)

    def _ended(self) -> bool:
        ready = selectors.DefaultSelector()
        try:
            ready.register(self._done[0], selectors.EVENT_READ)
            return bool(ready.select(0))
        finally:
            ready.close()

    def _read_fd(self) -> int | None:
        return self._fifo[0] if self._fifo is not None else None

    def _key(self) -> str | None:
        try:
            agent = JobStore(self.store).get(self.job_id).agent(self.agent_id)
        except PiMatrixError:
            return None
        return agent.key if agent is not None else None

    def _close_fifo(self) -> None:
        if self._fifo is not None:
            for fd in self._fifo:
                os.close(fd)
            self._fifo = None
        if self._fifo_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._fifo_path)
            self._fifo_path = None


def _plugins(cwd: str) -> pluggy.PluginManager:
    from ..settings import load_settings
    from .plugins import plugin_manager

    return plugin_manager(matrix=load_settings(cwd).enabled)
