"""A host's job rounds, wired at the program's edge (one process per agent:
docs/decisions.md#the-agents-host-watches-its-own-rounds).

The host (``supervise/``) knows nothing of jobs; the dispatcher's round thread
(:mod:`..dispatch.roundwatch`) knows nothing of the host's loop. Here the two meet, through the
host's hooks:

* after the host registered and before it starts its agent: the pane piped to the thread, the
  thread started (a host that loses its registration never touches the pane or the job);
* each look at the host's mail wakes the thread (a follow-up may have re-armed the round);
* the deadline: the thread asks, the host's own loop stops its agent (request -> SIGTERM ->
  SIGKILL, recorded timed out). Asked through a flag and a SIGUSR2 to itself, never through the
  disk or the mailbox, which a full disk or a session switch would lose;
* the agent's end, once recorded: the open round writes how it ended, the thread ends.

With the matrix off nothing is registered, but the job still gets its results: the program
runs the agent as its child beside the thread (:func:`run_unregistered`).
"""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import TYPE_CHECKING

import attrs

from .. import procs
from ..errors import PiMatrixError
from ..identity import Role
from ..matrix.model import ExitKind
from ..programs import agent_argv
from ..supervise.host import AgentHost, HostHooks

if TYPE_CHECKING:
    from ..dispatch.roundwatch import RoundWatch
    from ..matrix.store import MatrixStore
    from .base import Io

__all__ = ["job_agent_of", "rounds_for", "run_unregistered", "run_with_rounds"]

UNREGISTERED_STOP_GRACE_S = 5.0  # matrix off: the deadline's SIGTERM, then this long, then SIGKILL


def job_agent_of(store: MatrixStore, key: str) -> tuple[str, str, int] | None:
    """The live watched job (id, agent id, its current round) whose agent ``key`` is, if any."""
    from ..dispatch.jobs import JobStore

    try:
        jobs, _problems = JobStore(store).list_jobs()
    except PiMatrixError:
        return None
    for job in jobs:
        for agent in job.agents:
            if agent.key == key and job.watched and job.stopped_at is None and job.dismissed_at is None:
                return job.id, agent.agent_id, agent.round
    return None


def rounds_for(
    store: MatrixStore,
    job: str | None,
    agent_id: str | None,
    *,
    key: str | None,
    role: Role,
    pane: str | None,
) -> RoundWatch | None:
    """The host's round thread: for ``--job`` (a fire), else for the job the key's agent belongs
    to (a resumed or rehosted agent: rounds a follow-up opens from now on), else none."""
    from ..dispatch.roundwatch import RoundWatch

    if job is not None and agent_id is not None:
        return RoundWatch.of_job(store, job, agent_id, pane=pane)
    if key is None or role is not Role.WORKER:
        return None
    found = job_agent_of(store, key)
    if found is None:
        return None
    # A resumed session answers its wake prompt, not the open round's marker: only later rounds.
    return RoundWatch.of_job(
        store, found[0], found[1], pane=pane, skip_through=found[2] if job is None else 0
    )


class _Deadline:
    """The thread's deadline, turned into the host's own stop on its loop."""

    def __init__(self, host: AgentHost) -> None:
        self.host = host
        self.asked = threading.Event()
        self.looping = threading.Event()  # the host's signal handlers are in: SIGUSR2 wakes it

    def ask(self) -> None:  # the round thread
        self.asked.set()
        if self.looping.is_set():
            procs.send_signal(self.host.me, signal.SIGUSR2)  # its loop looks now (wake)

    def look(self) -> None:  # the host's loop, at each wake
        self.looping.set()
        stop = self.host.agent.stop
        if self.asked.is_set() and not stop.requested and self.host.agent.running:
            self.host.agent.request_stop(ExitKind.TIMED_OUT, "deadline")


def run_with_rounds(host: AgentHost, rounds: RoundWatch | None, hooks: HostHooks) -> int:
    """Run the host with ``hooks``, and its round thread beside it when it has one."""
    registered = hooks.on_registered
    if rounds is None:
        host.hooks = hooks
        return host.run()
    from ..dispatch.roundwatch import HOSTED_LOOK_S  # loaded already: ``rounds`` is one

    deadline = _Deadline(host)
    rounds.on_deadline = deadline.ask
    rounds.host_key = lambda: host.key
    rounds.look_s = HOSTED_LOOK_S  # the host pokes the thread whenever it takes mail

    def started(the_host: AgentHost) -> None:
        if registered is not None:
            registered(the_host)
        rounds.open()  # before the agent starts: nothing it prints is missed
        rounds.start()

    def woke(_host: AgentHost) -> None:
        deadline.look()
        rounds.poke()

    host.hooks = attrs.evolve(hooks, on_registered=started, on_wake=woke)
    try:
        return host.run()
    finally:
        rounds.finish()


def run_unregistered(argv: list[str], rounds: RoundWatch, io: Io) -> int:
    """Matrix off, a job's rounds watched: nothing is registered (the off switch), but the job
    still gets its results, so this process runs the agent as its child (the terminal passed
    through) beside the round thread, instead of becoming it."""
    try:
        child = subprocess.Popen(agent_argv(argv))
    except OSError as exc:
        io.err.write(f"pi-matrix: error: cannot start {argv[0]!r}: {exc.strerror}\n")
        rounds.finish(exit_code=127)  # the round still gets its result, as a shell says it
        return 127
    identity = procs.identify(child.pid)

    def stop() -> None:  # the round thread: SIGTERM, a grace, then SIGKILL, by identity
        procs.stop([identity], UNREGISTERED_STOP_GRACE_S)

    rounds.on_deadline = stop
    # As the agent would have: a stop or hang-up ends it; Ctrl-C already reached it from the tty.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda got, _frame: procs.send_signal(identity, got) if identity else None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rounds.open()
    rounds.start()
    code = 0
    try:
        code = child.wait()
    finally:
        rounds.finish(exit_code=code)
    return 128 - code if code < 0 else code
