"""The exact-session resume launcher: the matrix plugin's ``relaunch`` hook and ``pi-matrix resume``.

From a resumable payload it builds direct argv ``pi-matrix host … -- pi --session <exact
sessionFile> … "<wake prompt>"`` (never an id lookup), with ``PI_ORCHESTRATION_AGENT_ID``,
``PI_TASK_REF`` and the resuming master's ``PI_PARENT_*``, and cwd/worktree/profile/resource
pointers from the payload. It refuses when the session file or the cwd in its header is gone
(pi would create a fresh session, or block on a prompt). The new host's pid is published
(``launching``, fenced by the generation the launcher observed) before the host registers; the
resumed host then overwrites the same entry under a new generation.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

import attrs

from . import pisession, procs
from .contract import DEFAULT_SOCKET, NEVER_INHERITED
from .errors import Conflict, PiMatrixError, ProfileNotFound, ResumeRefused, TmuxUnavailable
from .identity import Mode, ProcessIdentity
from .matrix import lifecycle
from .matrix.model import Entry
from .matrix.store import MatrixStore
from .programs import spawn_detached
from .settings import MatrixSettings, load_settings
from .strictjson import JSONObject
from .supervise.relaunch import check_resumable, wake_prompt

if TYPE_CHECKING:
    from .dispatch.model import Relaunch
    from .dispatch.tmux import TmuxServer
    from .dispatch.tmux_model import Pane

__all__ = ["ResumePlan", "plan_resume", "relaunch", "session_header_cwd"]

log = logging.getLogger(__name__)


@attrs.frozen
class ResumePlan:
    key: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    window: str
    ticket: str | None = None  # the launch's ticket (matrix.tickets), when its host takes one
    session_file: str | None = None  # the pi session file it runs in (made by relaunch if missing)

    def to_json(self) -> JSONObject:
        return {"key": self.key, "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd}


# The one home of pi session files is pisession; the name stays for callers of 0.1.
session_header_cwd = pisession.header_cwd


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
    from .dispatch.manager import Dispatcher
    from .dispatch.model import AgentLaunch
    from .dispatch.profile import resolve_write_paths

    payload = check_resumable(entry)
    identity = payload.identity
    assert identity.cwd is not None
    session_file = identity.session_file
    if session_file is not None and os.path.lexists(session_file):
        header_cwd = session_header_cwd(session_file)
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
    else:
        # Never written (the agent died before its first turn) or gone: the same logical agent
        # goes into a fresh file under its own session id, made by the launcher (relaunch).
        session_file = session_file or pisession.new_session_file(identity.cwd, identity.session_id, env)
    dispatcher = Dispatcher(store, settings or load_settings(identity.cwd), env=env)
    if identity.profile is None:
        # Launched without a profile (a host started by hand): plain pi, as it ran before.
        from .dispatch.profile import WorkerLaunchProfile

        profile = WorkerLaunchProfile(
            name="pi", provider="pi", command=("pi",), mode=identity.mode or Mode.PRINT
        )
    else:
        try:
            profile = dispatcher.profiles.profile(identity.profile)
        except ProfileNotFound:
            # Never a silent substitute: another profile could carry other authority.
            raise ResumeRefused(
                f"{entry.key}: its launch profile {identity.profile!r} is not found; restore "
                f"launch_profiles/{identity.profile}.toml (pi-matrix profiles lists them) to resume it"
            ) from None
    if mode is not None:
        profile = attrs.evolve(profile, mode=mode)
    if profile.provider != "pi":
        raise ResumeRefused(
            f"{entry.key}: profile {profile.name} is not a pi profile; only pi sessions resume exactly"
        )
    wake = wake_prompt(payload)
    lane = identity.lane
    launch = AgentLaunch(
        job_id="resume", agent_id=identity.agent_id, session_id=identity.session_id, key=entry.key,
        profile=profile, task=wake, cwd=identity.cwd, parent=parent, parent_session=parent_session,
        allowed_paths=tuple(resolve_write_paths(profile, cwd=identity.cwd, worktree=identity.worktree)),
        deadline_s=profile.deadline_s, nonce="resume", worktree=identity.worktree, lane=lane,
        task_ref=payload.task_ref, session_file=session_file,
        resource_pointers=identity.resource_pointers,
        watched=False,  # a resumed session answers its wake prompt: no job's marker, no rounds
    )  # fmt: skip
    # The same door as every fire: the bridge (launch_argv) and the envelope (launch_env) come
    # from the recorded profile and the plugins, never rebuilt by hand here.
    argv, launch_env = dispatcher.compose(launch, task_summary=payload.task_summary)
    ticket = launch.ticket if dispatcher.settings.enabled else None
    return ResumePlan(
        entry.key, tuple(argv), launch_env, identity.cwd, identity.agent_id[:40], ticket, session_file
    )


def relaunch(
    request: Relaunch,
    *,
    settings: MatrixSettings | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Launch the plan (tmux on ``request.socket`` when tmux answers, else a detached host) and
    publish the new pid as ``launching``; returns the new host pid."""
    from .dispatch.backends import TMUX_SESSION
    from .dispatch.model import TMUX

    store = MatrixStore(request.state_dir)
    entry: Entry = request.entry
    plan = plan_resume(store, entry, request.parent, request.parent_session, settings=settings, env=env)
    if plan.session_file is not None and plan.session_file != entry.identity.session_file:
        # A fresh file for an agent whose transcript was never written: every plan of this
        # relaunch (the headless fallback too) names the same one.
        entry = lifecycle.with_identity(entry, session_file=plan.session_file)
    if procs.is_alive(entry.child_process):
        raise ResumeRefused(
            f"{entry.key}: its agent process (pid {entry.child_pid}) outlived its host and still runs; "
            "a second one would write the same session file; stop it first"
        )
    # Claim the relaunch before starting anything: of two masters (or a master and
    # `pi-matrix resume`) racing for one worker, only the one whose claim lands launches.
    try:
        fresh = plan.session_file if plan.session_file != request.entry.identity.session_file else None

        def claim(current: Entry) -> Entry:
            # A fresh session file is named in the claim itself: a relaunch that fails after making
            # it leaves the next one that same file, never a second file with the same header id.
            named = lifecycle.with_identity(current, session_file=fresh) if fresh else current
            return lifecycle.claim_launch(named)

        claimed = store.update(entry.key, claim, expected=entry.generation)
    except Conflict:
        raise ResumeRefused(
            f"{entry.key}: changed since it was read; another launcher won ("
            f"{lifecycle.claimed_by(store.find(entry.key))}); nothing was started here"
        ) from None
    where: tuple[str | None, str | None, str | None] = (None, None, None)  # socket, pane, target
    known: ProcessIdentity | None = None  # the host, when a ticket named it exactly
    try:
        pid: int | None = None
        if plan.session_file is not None and not os.path.lexists(plan.session_file):
            identity = entry.identity
            pisession.write_header(plan.session_file, identity.session_id, identity.cwd or plan.cwd)
        if request.backend == TMUX:
            from .dispatch.tmux import TmuxServer

            server = TmuxServer(request.socket or DEFAULT_SOCKET, scrub_env=sorted(NEVER_INHERITED))
            tags = {"@pi_matrix_key": entry.key, "@pi_matrix_job": "resume"}
            try:
                pane = server.launch(
                    plan.argv, session=TMUX_SESSION, window_name=plan.window, cwd=plan.cwd, env=plan.env,
                    tags=tags,
                )  # fmt: skip
                pid = pane.pane_pid
                where = (server.socket, pane.pane_id, f"{pane.session}:{pane.window_name}")
            except TmuxUnavailable as exc:
                # No tmux here, or one that did not answer in time: close this launch (a pane a
                # stalled server makes later starts nothing) unless its host already took it.
                late = _late_host(store, plan, exc, server, tags)
                if late is not None:
                    known, found = late
                    pid = known.pid
                    if found is not None:
                        where = (server.socket, found.pane_id, f"{found.session}:{found.window_name}")
        if pid is None:
            # Without a terminal an interactive agent cannot run: the detached host runs it in print
            # mode (one turn on the wake prompt, into the same session file).
            headless = plan_resume(
                store,
                entry,
                request.parent,
                request.parent_session,
                settings=settings,
                env=env,
                mode=Mode.PRINT,
            )
            pid = _spawn_detached(store, headless, env)
    except BaseException:
        # Nothing was started: give the worker back its resumable record (the claim is undone).
        with contextlib.suppress(PiMatrixError):
            store.update(entry.key, lifecycle.release_launch, expected=claimed.generation)
        raise
    launched = known or procs.identify(pid)
    if launched is not None:
        try:
            store.update(entry.key, lambda e: lifecycle.launched(e, launched), expected=claimed.generation)
        except Conflict:
            pass  # the new host registered first: its registration wins, as it should
        except PiMatrixError as exc:
            log.warning("%s: relaunched (host pid %d) but its pid was not published: %s", entry.key, pid, exc)
        follow_job(store, entry.key, launched, socket=where[0], pane_id=where[1], target=where[2])
    return pid


def follow_job(
    store: MatrixStore,
    key: str,
    host: ProcessIdentity,
    *,
    socket: str | None = None,
    pane_id: str | None = None,
    target: str | None = None,
    log_file: str | None = None,
) -> None:
    """The agent ``key`` runs under a new host now: the jobs holding it follow it (its host, and
    its pane or log), so ``jobs``, ``followup`` and ``stop JOB`` reach it as before the crash."""
    from .dispatch.jobs import JobStore
    from .dispatch.model import SUBPROCESS, TMUX, JobAgent

    def move(agent: JobAgent) -> JobAgent:
        return attrs.evolve(
            agent, host_pid=host.pid, host_start=host.start_ticks, boot_id=host.boot_id,
            pane_id=pane_id, socket=socket if pane_id else agent.socket, target=target or f"pid {host.pid}",
            log=None if pane_id else (log_file or str(store.root / "logs" / f"{key}.log")),
            backend=TMUX if pane_id else SUBPROCESS,
        )  # fmt: skip

    try:
        JobStore(store).follow(key, move)
    except PiMatrixError as exc:
        log.warning("%s: relaunched, but its job record could not follow it: %s", key, exc)


def _late_host(
    store: MatrixStore, plan: ResumePlan, exc: Exception, server: TmuxServer, tags: dict[str, str]
) -> tuple[ProcessIdentity, Pane | None] | None:
    """The host of a tmux launch that failed yet started (it took the ticket first) and its pane,
    tagged, when it can be found; None when the launch is closed (the detached host runs instead)."""
    if plan.ticket is None:
        return None
    from .matrix.tickets import LaunchTickets, Taken

    taken = LaunchTickets(store).take(plan.ticket, Taken(None, f"resume fell back to a detached host: {exc}"))
    if taken is None or taken.host is None:
        return None
    pane = None
    with contextlib.suppress(PiMatrixError):
        pane = server.adopt(taken.host.pid, tags=tags)
    return taken.host, pane


def _spawn_detached(store: MatrixStore, plan: ResumePlan, base_env: dict[str, str] | None = None) -> int:
    source = os.environ if base_env is None else base_env
    env = {k: v for k, v in source.items() if k not in NEVER_INHERITED}
    env.update(plan.env)
    child = spawn_detached(plan.argv, store.side_dir("logs") / f"{plan.key}.log", cwd=plan.cwd, env=env)
    return child.pid
