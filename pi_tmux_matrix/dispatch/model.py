"""The dispatcher's records: jobs, their agents, results, and what a launch looks like to plugins.

Pure data (frozen attrs), stored through the one converter in camelCase like the entries. A job
is written before any of its agents starts, and each agent's result exactly once per marker
round (an exclusive create), so a crashed dispatcher or a racing watcher never duplicates or
loses a completion.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import attrs

from ..identity import AgentIdentityContract, ProcessIdentity
from ..matrix.codec import register_enum
from ..matrix.model import Entry
from ..matrix.tickets import new_ticket
from . import SUBPROCESS, TMUX
from .usage import ClaimedUsage

if TYPE_CHECKING:
    # Only for the annotation: at run time the hook specs (which import this module) stay
    # importable without the profile loader (tomllib, importlib.resources).
    from .profile import WorkerLaunchProfile

__all__ = [
    "JOB_SCHEMA_VERSION",
    "OPEN",
    "SPLIT",
    "SUBPROCESS",
    "TMUX",
    "AgentLaunch",
    "AgentResult",
    "Job",
    "JobAgent",
    "PlannedAgent",
    "Relaunch",
    "ResultKind",
]

JOB_SCHEMA_VERSION: Final = 1
# The backends' names as records keep them (JobAgent.backend); dispatch/backends.py runs them.
# Marker rounds per agent: a job record is read round by round, so the number is bounded (a record
# claiming 10^9 rounds is corrupt, never a hang), and result names stay valid ids.
MAX_ROUND: Final = 9999


class ResultKind(enum.Enum):
    DONE = "done"  # the agent printed its DONE marker
    BLOCKED = "blocked"  # the agent printed its BLOCKED marker
    EXITED = "exited"  # the host ended without a marker (code recorded)
    TIMEOUT = "timeout"  # the deadline passed first; the agent was then stopped
    STOPPED = "stopped"  # the owner stopped it (stop --confirm yes-tmux-stop)


register_enum(ResultKind)


@attrs.frozen
class JobAgent:
    """One agent of a job: who it is, where it runs, and the marker round being watched."""

    agent_id: str
    key: str  # the matrix entry key, worker-<sessionId>
    session_id: str
    profile: str
    provider: str
    mode: str
    cwd: str
    backend: str  # TMUX | SUBPROCESS: the backend that started its host
    nonce: str  # the current round's marker nonce: DONE:<nonce> / BLOCKED:<nonce>
    round: int = attrs.field(validator=[attrs.validators.ge(1), attrs.validators.le(MAX_ROUND)])
    deadline_at: int  # Unix ms of the current round's deadline
    deadline_s: float
    worktree: str | None = None
    lane: str | None = None
    session_file: str | None = None
    socket: str | None = None  # tmux -L name
    pane_id: str | None = None
    target: str | None = None  # human tmux target, session:window
    host_pid: int | None = None  # the pane's process: the agent host
    host_start: int | None = None  # its kernel start ticks (identity, not just a pid)
    boot_id: str | None = None  # its host's boot: set when planned (before the host is known)
    log: str | None = None  # subprocess backend: the host's output file

    @property
    def host(self) -> ProcessIdentity | None:
        if self.host_pid is None or self.host_start is None or self.boot_id is None:
            return None
        return ProcessIdentity(self.host_pid, self.host_start, self.boot_id)

    @property
    def in_tmux(self) -> bool:
        """Launched into a tmux pane (recorded or not yet)."""
        return self.backend == TMUX

    @property
    def tmux_socket(self) -> str | None:
        """The tmux server its pane is on; None when it was not launched into tmux."""
        return self.socket if self.in_tmux else None

    @property
    def where(self) -> str:
        """Where a person finds it, as a command they can paste (``tmux -L SOCKET attach -t
        SESSION:WINDOW``: the session alone could be on any server, and the default one is not
        it; ``pi-matrix attach KEY`` does the same from inside tmux too), ``pid N`` when detached,
        ``-`` before it started."""
        if self.target is None:
            return "-"
        if self.tmux_socket is None:
            return self.target
        return f"tmux -L {self.tmux_socket} attach -t {self.target}"

    @property
    def pane_ref(self) -> tuple[str, str] | None:
        """``(socket, pane id)`` of its recorded tmux pane, if it has one."""
        if self.tmux_socket is None or self.pane_id is None:
            return None
        return self.tmux_socket, self.pane_id

    def result_name(self, job_id: str, round_: int | None = None) -> str:
        return f"{job_id}.{self.agent_id}.{round_ or self.round}"


@attrs.frozen
class Job:
    id: str
    created_at: int
    parent_pid: int
    parent_session_id: str
    task: str  # bounded
    profile: str | None
    team: str | None
    agents: tuple[JobAgent, ...]
    task_ref: str | None = None
    lane: str | None = None
    backend: str = TMUX
    dismissed_at: int | None = None
    stopped_at: int | None = None
    orphaned_at: int | None = None  # every pane vanished while the job was unfinished
    schema_version: int = JOB_SCHEMA_VERSION
    # False: a workspace (launch_workspace): its agents run interactively with no watcher, no
    # deadline and no marker rounds; it ends when its owner stops it.
    watched: bool = True

    def agent(self, agent_id: str) -> JobAgent | None:
        return next((a for a in self.agents if a.agent_id == agent_id), None)


@attrs.frozen
class AgentResult:
    """Written once per agent and marker round by whoever sees the end first."""

    job_id: str
    agent_id: str
    key: str
    round: int
    kind: ResultKind
    at: int
    detail: str = ""
    exit_code: int | None = None
    exit_kind: str | None = None
    # The worker's usage claim for the round, read when this result was written (advisory);
    # None: it claimed nothing (never zeros made up for it).
    usage: ClaimedUsage | None = None


@attrs.frozen
class AgentLaunch:
    """One agent about to be launched, as plugins see it (frozen: contribute, never mutate)."""

    job_id: str
    agent_id: str
    session_id: str
    key: str
    profile: WorkerLaunchProfile
    task: str
    cwd: str
    parent: ProcessIdentity
    parent_session: str
    allowed_paths: tuple[str, ...]
    deadline_s: float
    nonce: str
    worktree: str | None = None
    lane: str | None = None
    task_ref: str | None = None
    session_file: str | None = None
    # Context pointers recorded with the agent's identity (a resumed agent keeps its own).
    resource_pointers: tuple[str, ...] = ()
    # Taken by the host before it starts anything, or by the launcher when the start failed: a
    # pane a stalled tmux makes after the launcher gave up starts nothing (matrix.tickets).
    ticket: str = attrs.field(factory=new_ticket)
    # False: a workspace agent (no watcher): neither its prompt nor its env asks for a marker.
    watched: bool = True

    def identity(self) -> AgentIdentityContract:
        """The identity this launch's agent has: the one its host is told to register (the host
        argv) and the one the launcher's ``launching`` entry names before that. Built here only,
        so the entry a reader sees while the agent starts names what the registration replacing
        it will (the same resource pointers too), whichever field a launch gains later."""
        return AgentIdentityContract(
            agent_id=self.agent_id,
            session_id=self.session_id,
            session_file=self.session_file,
            cwd=self.cwd,
            worktree=self.worktree,
            lane=self.lane,
            profile=self.profile.name,
            provider=self.profile.provider,
            mode=self.profile.mode,
            resource_pointers=self.resource_pointers,
        )


@attrs.frozen
class PlannedAgent:
    """One agent's launch, compiled: what its backend starts, with which env, where."""

    launch: AgentLaunch
    argv: tuple[str, ...]  # the pane command: the host, then the agent CLI
    env: Mapping[str, str]  # what goes in with -e
    cwd: str
    window: str
    session: str | None = None  # the tmux session its window goes in (None: the shared one)
    # A workspace's pane: OPEN makes the fresh session ``session`` (refused if it exists), SPLIT
    # adds a pane to its window, tiled; None: a window of its own.
    layout: str | None = None
    # Its output file under logs/ when no pane shows it (None: <job>.<agent>.log). A relaunch
    # keeps <key>.log and a rehost <key>.rehost.log, the names the state dir's sweep knows.
    log_name: str | None = None

    def job_agent(
        self, backend: str, socket: str | None, *, deadline_at: int = 0, boot_id: str | None = None
    ) -> JobAgent:
        """This agent as its job records it at its first round, before its host is known: the
        one place a fire, a relaunch and a rehost make it from their plan."""
        launch = self.launch
        return JobAgent(
            agent_id=launch.agent_id,
            key=launch.key,
            session_id=launch.session_id,
            profile=launch.profile.name,
            provider=launch.profile.provider,
            mode=launch.profile.mode.value,
            cwd=self.cwd,
            backend=backend,
            nonce=launch.nonce,
            round=1,
            deadline_s=launch.deadline_s,
            deadline_at=deadline_at,
            worktree=launch.worktree,
            lane=launch.lane,
            session_file=launch.session_file,
            socket=socket,
            boot_id=boot_id,
        )


OPEN: Final = "open"
SPLIT: Final = "split"


@attrs.frozen
class Relaunch:
    """A dead worker to relaunch into its exact session under ``parent`` (the ``relaunch``
    hook's request; the matrix's implementation is ``recovery.relaunch``)."""

    entry: Entry
    parent: ProcessIdentity
    parent_session: str
    state_dir: str
    socket: str | None = None
    # The backend to start its host through; None: the one its job names (tmux for a worker of
    # no job), as the job's fire did.
    backend: str | None = None
