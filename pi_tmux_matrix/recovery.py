"""Recovery: a dead worker relaunched into its exact session, and a live agent whose host died
given a new host. The matrix plugin's ``relaunch`` hook, ``pi-matrix resume``, a master's
recovery and ``top``'s resume key all come here; it reads top-down.

:func:`relaunch` checks the entry (:func:`check_resumable`), claims it by CAS (``launching``)
before it starts anything, plans the start (:func:`plan_resume`: a ``PlannedAgent`` composed by
``Planner.compose``, the same door as every fire: direct argv ``pi-matrix host … -- pi --session
<exact sessionFile> … "<wake prompt>"``, never an id lookup, with the contract's env and the
resuming master's ``PI_PARENT_*``), and starts it through the Backend its job names
(``dispatch/backends.py``: ``start_fenced``, as a fire does). Without tmux it falls back to a
detached host in print mode. The new host's pid is published (``launching``, fenced by the claim)
before the host registers; the resumed host then overwrites the same entry under a new
generation, and the job holding the agent follows it (:func:`follow_job`).

:func:`rehost` claims the entry of a live agent whose host died and starts ``pi-matrix host
--rehost KEY --rehost-claim GEN`` through the subprocess backend (the agent keeps running where it
is; the new host only watches it, so it needs no terminal).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Final

import attrs

from . import pisession, procs
from .contract import DEFAULT_SOCKET
from .dispatch import SUBPROCESS, TMUX
from .dispatch.backends import Backend, LaunchClosed, Started, backend_named, start_fenced
from .dispatch.manager import Dispatcher
from .dispatch.model import AgentLaunch, JobAgent, PlannedAgent, Relaunch
from .dispatch.profile import WorkerLaunchProfile, resolve_write_paths
from .errors import Conflict, PiMatrixError, ProfileNotFound, ResumeRefused, TmuxUnavailable
from .identity import Mode, ProcessIdentity
from .matrix import lifecycle
from .matrix.model import Entry, ResumablePayload, Status, bounded
from .matrix.store import MatrixStore
from .settings import MatrixSettings, load_settings
from .strictjson import JSONObject
from .supervise.master import settle_dead

__all__ = [
    "RESUME",
    "ResumePlan",
    "check_resumable",
    "follow_job",
    "job_agent",
    "plan_resume",
    "recorded_profile",
    "relaunch",
    "transcript_lost",
    "wake_prompt",
]

log = logging.getLogger(__name__)

RESUME: Final = "resume"  # the job id a relaunch starts under (its pane's job tag, its nonce)
MAX_WAKE: Final = 2000


@attrs.frozen
class ResumePlan:
    """Everything about a relaunch, nothing started: the agent's planned start (what its backend
    starts) and the session file it runs in (made by :func:`relaunch` if missing)."""

    key: str
    planned: PlannedAgent
    ticket: str | None = None  # the launch's ticket (matrix.tickets), when its host takes one
    session_file: str | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        return self.planned.argv

    @property
    def env(self) -> dict[str, str]:
        return dict(self.planned.env)

    @property
    def cwd(self) -> str:
        return self.planned.cwd

    def to_json(self) -> JSONObject:
        return {"key": self.key, "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd}


# -- relaunch ----------------------------------------------------------------------------------------
def relaunch(
    request: Relaunch, *, settings: MatrixSettings | None = None, env: dict[str, str] | None = None
) -> int:
    """Relaunch ``request.entry`` through the backend asked for (None: its job's) and publish the
    new host's pid as ``launching``; returns it. :class:`ResumeRefused` says why not."""
    store = MatrixStore(request.state_dir)
    # A worker whose host and agent were both killed still says it runs until a reconcile: the
    # same one-entry pass here, so resume works at once.
    observed = entry = settle_dead(store, request.entry)
    payload = check_resumable(entry)
    dispatcher = Dispatcher(store, settings or load_settings(payload.identity.cwd), env=env)
    backend = backend_named(dispatcher.backends, request.backend or _job_backend(store, entry.key) or TMUX)
    plan = _plan(dispatcher, entry, payload, request, mode=_mode_of(backend, request))
    if plan.session_file is not None and plan.session_file != entry.identity.session_file:
        # A fresh file for an agent whose transcript was never written: every plan of this
        # relaunch (the headless fallback too) names the same one.
        entry = lifecycle.with_identity(entry, session_file=plan.session_file)
    if procs.is_alive(entry.child_process):
        raise ResumeRefused(
            f"{entry.key}: its agent process (pid {entry.child_pid}) outlived its host and still runs; "
            "a second one would write the same session file; stop it first"
        )
    claimed = _claim(store, observed, plan)
    try:
        if plan.session_file is not None and not os.path.lexists(plan.session_file):
            identity = entry.identity
            pisession.write_header(plan.session_file, identity.session_id, identity.cwd or plan.cwd)
        backend, started = _start(dispatcher, backend, entry, plan, request)
    except BaseException:
        # Nothing was started: give the worker back its resumable record (the claim is undone).
        with contextlib.suppress(PiMatrixError):
            store.update(entry.key, lifecycle.release_launch, expected=claimed.generation)
        raise
    if started.host is not None:
        launched = started.host
        try:
            store.update(entry.key, lambda e: lifecycle.launched(e, launched), expected=claimed.generation)
        except Conflict:
            pass  # the new host registered first: its registration wins, as it should
        except PiMatrixError as exc:
            log.warning(
                "%s: relaunched (host pid %d), its pid not published: %s", entry.key, launched.pid, exc
            )
        socket = backend.socket(request.socket or DEFAULT_SOCKET)
        follow_job(store, entry.key, launched, started=started, socket=socket, backend=backend.name)
    return started.host_pid


def _claim(store: MatrixStore, entry: Entry, plan: ResumePlan) -> Entry:
    """Claim the relaunch before starting anything: of two masters (or a master and
    ``pi-matrix resume``) racing for one worker, only the one whose claim lands launches."""
    fresh = plan.session_file if plan.session_file != entry.identity.session_file else None

    def claim(current: Entry) -> Entry:
        # A fresh session file is named in the claim itself: a relaunch that fails after making
        # it leaves the next one that same file, never a second file with the same header id.
        named = lifecycle.with_identity(current, session_file=fresh) if fresh else current
        return lifecycle.claim_launch(named)

    try:
        return store.update(entry.key, claim, expected=entry.generation)
    except Conflict:
        raise ResumeRefused(
            f"{entry.key}: changed since it was read; another launcher won ("
            f"{lifecycle.claimed_by(store.find(entry.key))}); nothing was started here"
        ) from None


def _start(
    dispatcher: Dispatcher, backend: Backend, entry: Entry, plan: ResumePlan, request: Relaunch
) -> tuple[Backend, Started]:
    """Start the plan through ``backend``, fenced by its ticket as a fire is; when tmux does not
    answer and nothing runs for it, through a detached host in print mode instead."""
    store = dispatcher.store
    agent = job_agent(backend, plan.planned, request.socket)
    try:
        return backend, start_fenced(backend, _fence(store, plan), RESUME, agent, plan.planned)
    except (TmuxUnavailable, LaunchClosed) as exc:
        if backend.name == SUBPROCESS or not isinstance(exc.__cause__ or exc, TmuxUnavailable):
            raise
    # Without a terminal an interactive agent cannot run: the detached host runs it in print
    # mode (one turn on the wake prompt, into the same session file).
    detached = dispatcher.backends[SUBPROCESS]
    headless = _plan(dispatcher, entry, check_resumable(entry), request, mode=Mode.PRINT)
    agent = job_agent(detached, headless.planned, request.socket)
    return detached, start_fenced(detached, _fence(store, headless), RESUME, agent, headless.planned)


def _fence(store: MatrixStore, plan: ResumePlan) -> MatrixStore | None:
    """The store whose ticket closes a failed start (None: its host takes no ticket)."""
    return store if plan.ticket is not None else None


def _mode_of(backend: Backend, request: Relaunch) -> Mode | None:
    """Print mode where no terminal runs the agent (a backend with no tmux socket): an
    interactive agent cannot run without one. None: as its profile says."""
    return Mode.PRINT if backend.socket(request.socket or DEFAULT_SOCKET) is None else None


def job_agent(backend: Backend, planned: PlannedAgent, socket: str | None) -> JobAgent:
    """The agent as its backend starts it: which backend, which tmux socket, this boot."""
    return planned.job_agent(backend.name, backend.socket(socket or DEFAULT_SOCKET), boot_id=procs.boot_id())


def _job_backend(store: MatrixStore, key: str) -> str | None:
    """The backend of the newest live job holding ``key`` (None: no job holds it)."""
    from .dispatch.jobs import JobStore

    try:
        jobs, _problems = JobStore(store).list_jobs()
    except PiMatrixError:
        return None
    live = [j for j in jobs if j.dismissed_at is None and j.stopped_at is None]
    for job in sorted(live, key=lambda j: j.created_at, reverse=True):
        for agent in job.agents:
            if agent.key == key:
                return agent.backend
    return None


def follow_job(
    store: MatrixStore,
    key: str,
    host: ProcessIdentity,
    *,
    started: Started | None = None,
    socket: str | None = None,
    backend: str = SUBPROCESS,
    log_file: str | None = None,
) -> None:
    """The agent ``key`` runs under a new host now: the jobs holding it follow it (its host and
    backend, its pane on ``socket`` or its log), so ``jobs``, ``followup`` and ``stop JOB`` reach
    it as before the crash. ``started``: where its backend started it (None: a detached host
    logging to ``log_file``: a rehost's own host)."""
    from .dispatch.jobs import JobStore

    pane_id = started.pane_id if started else None
    target = started.target if started else f"pid {host.pid}"
    output = (started.log if started else None) or log_file or str(store.root / "logs" / f"{key}.log")

    def move(agent: JobAgent) -> JobAgent:
        return attrs.evolve(
            agent,
            host_pid=host.pid,
            host_start=host.start_ticks,
            boot_id=host.boot_id,
            pane_id=pane_id,
            socket=socket if pane_id else agent.socket,
            target=target,
            log=None if pane_id else output,
            backend=backend,
        )

    try:
        JobStore(store).follow(key, move)
    except PiMatrixError as exc:
        log.warning("%s: relaunched, but its job record could not follow it: %s", key, exc)


# -- plan --------------------------------------------------------------------------------------------
def plan_resume(
    store: MatrixStore,
    entry: Entry,
    parent: ProcessIdentity,
    parent_session: str,
    *,
    settings: MatrixSettings | None = None,
    env: dict[str, str] | None = None,
    mode: Mode | None = None,
) -> ResumePlan:
    """Everything about the relaunch of ``entry``, nothing started (what ``--dry-run`` prints)."""
    entry = settle_dead(store, entry, write=False)
    payload = check_resumable(entry)
    dispatcher = Dispatcher(store, settings or load_settings(payload.identity.cwd), env=env)
    request = Relaunch(entry=entry, parent=parent, parent_session=parent_session, state_dir=str(store.root))
    return _plan(dispatcher, entry, payload, request, mode=mode)


def _plan(
    dispatcher: Dispatcher, entry: Entry, payload: ResumablePayload, request: Relaunch, *, mode: Mode | None
) -> ResumePlan:
    identity = payload.identity
    assert identity.cwd is not None
    session_file = _session_file(entry, payload, dispatcher.env)
    profile = recorded_profile(dispatcher, entry)
    if mode is not None:
        profile = attrs.evolve(profile, mode=mode)
    if profile.provider != "pi":
        raise ResumeRefused(
            f"{entry.key}: profile {profile.name} is not a pi profile; only pi sessions resume exactly"
        )
    launch = AgentLaunch(
        job_id=RESUME,
        agent_id=identity.agent_id,
        session_id=identity.session_id,
        key=entry.key,
        profile=profile,
        task=wake_prompt(payload),
        cwd=identity.cwd,
        parent=request.parent,
        parent_session=request.parent_session,
        allowed_paths=tuple(resolve_write_paths(profile, cwd=identity.cwd, worktree=identity.worktree)),
        deadline_s=profile.deadline_s,
        nonce=RESUME,
        worktree=identity.worktree,
        lane=identity.lane,
        task_ref=payload.task_ref,
        session_file=session_file,
        resource_pointers=identity.resource_pointers,
        watched=False,  # a resumed session answers its wake prompt: no job's marker, no rounds
    )
    # The same door as every fire: the bridge (launch_argv) and the envelope (launch_env) come
    # from the recorded profile and the plugins, never rebuilt by hand here.
    argv, launch_env = dispatcher.compose(launch, task_summary=payload.task_summary)
    planned = PlannedAgent(
        launch, argv, launch_env, identity.cwd, identity.agent_id[:40], log_name=f"{entry.key}.log"
    )
    ticket = launch.ticket if dispatcher.settings.enabled else None
    return ResumePlan(entry.key, planned, ticket, session_file)


def _session_file(entry: Entry, payload: ResumablePayload, env: dict[str, str]) -> str:
    """The exact session file to resume, checked (its header readable, its cwd there); or, when
    it was never written or is gone, a fresh file under the agent's own session id."""
    identity = payload.identity
    assert identity.cwd is not None
    session_file = identity.session_file
    if session_file is None or not os.path.lexists(session_file):
        # Never written (the agent died before its first turn) or gone: the same logical agent
        # goes into a fresh file under its own session id, made by the launcher (relaunch).
        return session_file or pisession.new_session_file(identity.cwd, identity.session_id, env)
    header_cwd = pisession.header_cwd(session_file)
    if header_cwd is None:
        raise ResumeRefused(
            f"{entry.key}: the session file {session_file} has no readable header (a pi session "
            "starts with a line holding its id and cwd); it cannot be resumed exactly"
        )
    if not os.path.isdir(header_cwd):
        raise ResumeRefused(
            f"{entry.key}: the session's own cwd {header_cwd} (its header) is gone; pi would stop at a "
            "prompt; restore the folder or clean the entry up"
        )
    return session_file


def recorded_profile(dispatcher: Dispatcher, entry: Entry) -> WorkerLaunchProfile:
    """The launch profile it was fired with; plain pi for a host started by hand (no profile)."""
    identity = entry.identity
    if identity.profile is None:
        return WorkerLaunchProfile(
            name="pi", provider="pi", command=("pi",), mode=identity.mode or Mode.PRINT
        )
    try:
        return dispatcher.profiles.profile(identity.profile)
    except ProfileNotFound:
        # Never a silent substitute: another profile could carry other authority.
        raise ResumeRefused(
            f"{entry.key}: its launch profile {identity.profile!r} is not found; restore "
            f"launch_profiles/{identity.profile}.toml (pi-matrix profiles lists them) to resume it"
        ) from None


# -- checks and the wake prompt ----------------------------------------------------------------------
def check_resumable(entry: Entry) -> ResumablePayload:
    """The payload to resume from, or :class:`ResumeRefused` saying what is missing."""
    payload = entry.resumable
    if entry.status is not Status.RESUMABLE or payload is None:
        raise ResumeRefused(f"{entry.key}: status {entry.status.value} is not resumable")
    identity = payload.identity
    if not identity.relaunchable:
        what = "not a pi agent" if not identity.is_pi else "no working directory recorded"
        raise ResumeRefused(f"{entry.key}: {what}; only a pi agent with its cwd can be relaunched")
    assert identity.cwd is not None
    if not os.path.isdir(identity.cwd):
        raise ResumeRefused(
            f"{entry.key}: working directory {identity.cwd} is gone (pi would stop at a prompt); "
            "restore it or clean the entry up"
        )
    return payload


def transcript_lost(payload: ResumablePayload) -> bool:
    """The worker's session holds no transcript: no file was written, it is gone, or it holds only
    its header (the agent died before its first turn). It is relaunched as the same agent, told
    to start the task again from its summary."""
    return not pisession.has_transcript(payload.identity.session_file)


def wake_prompt(payload: ResumablePayload) -> str:
    """The first prompt of a resumed session: pointers, never a second transcript."""
    identity = payload.identity
    if transcript_lost(payload):
        first = (
            f"[pi-matrix] You are agent {identity.agent_id}, relaunched after your process was lost "
            f"({payload.reason}). Your session holds no transcript (it ended before one was written), "
            "so start the task again from its summary."
        )
    else:
        first = (
            f"[pi-matrix] You are agent {identity.agent_id}, resumed in your own session after "
            f"your process was lost ({payload.reason})."
        )
    parts = [first]
    if payload.task_ref:
        parts.append(f"Task: {payload.task_ref}.")
    if payload.task_summary:
        parts.append(f"Task summary: {bounded(payload.task_summary, 600)}")
    parts.append(f"Latest checkpoint: {payload.checkpoint or 'the last message of this session'}.")
    if identity.resource_pointers:
        parts.append("Context: " + ", ".join(identity.resource_pointers[:8]) + ".")
    parts.append("Re-read what you need, then continue the task from where you stopped.")
    return bounded(" ".join(parts), MAX_WAKE)
