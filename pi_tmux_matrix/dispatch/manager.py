"""``tmux_agent_manager``: fire_task, jobs, follow-ups, dismiss, confirmed stop, reconcile with tmux.

A launch is compiled whole before anything is reserved or started (profiles, team, parent,
lane, cap, env, argv), the job is written before its first agent starts, and each agent's pane
command *is* its host: ``pi-matrix host … -- <agent argv>`` started by ``tmux new-window … -e K=V
-- argv`` (never typed into a shell). Liveness is judged by process identity, never by tmux:
an unreachable tmux server is reported as such and proves nothing about the agents.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import pluggy

from .. import pisession, procs
from ..contract import (
    ENV_BLOCKED_MARKER,
    ENV_DONE_MARKER,
    ENV_PI_COMMAND,
    ENV_PROFILE,
    ENV_STATE_DIR,
    NEVER_INHERITED,
    PASS_ENV,
)
from ..errors import (
    ContractError,
    DispatchError,
    EntryExists,
    LaneError,
    PiMatrixError,
    TmuxUnavailable,
)
from ..identity import AgentIdentityContract, ProcessIdentity, Role, validate_id, validate_task_ref
from ..matrix import lifecycle
from ..matrix.mailbox import Inbox
from ..matrix.model import Entry, Status, bounded
from ..matrix.owners import owning_master
from ..matrix.store import MatrixStore, RecordStore, now_ms
from ..programs import host_argv, pi_command, spawn_detached, watch_argv
from ..settings import MatrixSettings, agent_dir
from .jobs import JobStore, new_job_id, new_nonce, result_now
from .model import AgentLaunch, AgentResult, Job, JobAgent, ResultKind
from .plugins import plugin_manager
from .watch import stop_agents

__all__ = [
    "DEFAULT_SOCKET",
    "Dispatcher",
    "FireRequest",
    "FireResult",
    "PlannedAgent",
    "session_file_for",
]

log = logging.getLogger(__name__)

DEFAULT_SOCKET: Final = "pi-matrix"
TMUX_SESSION: Final = "pi-matrix"
MAX_TASK_BYTES: Final = 32 * 1024
MAX_DEADLINE_S: Final = 24 * 3600.0
LIVE: Final = frozenset(
    {Status.LAUNCHING, Status.RUNNING, Status.WINDING_DOWN, Status.ADOPTED, Status.RESUMABLE}
)

# Deprecated name: contract.NEVER_INHERITED is the one home of this list.
SCRUB_ENV: Final = tuple(sorted(NEVER_INHERITED))


@attrs.frozen
class FireRequest:
    task: str
    profile: str | None = None
    team: str | None = None
    lane: str | None = None
    goal_id: str | None = None
    path: str | None = None
    socket: str = DEFAULT_SOCKET
    deadline_s: float | None = None
    backend: str = "tmux"
    dry_run: bool = False
    parent_pid: int | None = None
    parent_session: str | None = None
    agent_id: str | None = None


@attrs.frozen
class PlannedAgent:
    launch: AgentLaunch
    argv: tuple[str, ...]  # the pane command: the host, then the agent CLI
    env: Mapping[str, str]  # what goes in with -e
    cwd: str
    window: str


@attrs.frozen
class FireResult:
    job: Job
    planned: tuple[PlannedAgent, ...]
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        agents = []
        for planned, agent in zip(self.planned, self.job.agents, strict=True):
            item: dict[str, Any] = {
                "agentId": agent.agent_id,
                "key": agent.key,
                "profile": agent.profile,
                "lane": agent.lane,
                "cwd": agent.cwd,
                "target": agent.target,
                "paneId": agent.pane_id,
                "panePid": agent.host_pid,
                "sessionFile": agent.session_file,
            }
            if self.dry_run:
                item["argv"] = list(planned.argv)
                item["env"] = dict(planned.env)
            agents.append(item)
        return {"jobId": self.job.id, "dryRun": self.dry_run, "taskRef": self.job.task_ref, "agents": agents}


# The one home of pi session files is pisession; these names stay for callers of 0.1.
session_file_for = pisession.new_session_file
write_session_header = pisession.write_header


def marker_instruction(nonce: str) -> str:
    """How an agent is told to end: the marker itself never appears in the text, so an echo of
    the instruction cannot be taken for the agent's answer."""
    return (
        f"When you are finished, print a line holding only DONE, a colon and the code {nonce} "
        f"(no spaces). If you cannot go on, print BLOCKED, a colon and {nonce}, then a space and "
        "the reason, on a line of its own."
    )


def _window_name(agent_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", agent_id)[:40]


class Dispatcher:
    """The dispatcher over one state dir."""

    def __init__(
        self,
        store: MatrixStore,
        settings: MatrixSettings,
        *,
        env: Mapping[str, str] | None = None,
        plugins: pluggy.PluginManager | None = None,
        profiles: Any = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.plugins = plugins if plugins is not None else plugin_manager(matrix=settings.enabled)
        self._profiles = profiles
        self.jobs = JobStore(store)

    # -- compile -------------------------------------------------------------------------------------
    @property
    def profiles(self) -> Any:
        if self._profiles is None:
            from .profile import load_profiles

            self._profiles = load_profiles(agent_dir(self.env))
        return self._profiles

    def _parent(self, request: FireRequest) -> tuple[ProcessIdentity, str]:
        explicit = request.parent_pid is not None or request.parent_session is not None
        found = (
            owning_master(self.store, request.parent_pid, request.parent_session)
            if explicit or self.settings.enabled
            else None
        )
        if found is None:
            if not self.settings.enabled:
                me = procs.current()
                return me, f"dispatcher-{me.pid}"
            raise DispatchError(
                "fire: no calling master (no ancestor process is a registered master); run it under "
                "'pi-matrix master -- <your shell or agent>', or pass --parent-pid and --parent-session"
            )
        return found

    def _members(self, request: FireRequest) -> tuple[str, list[tuple[Any, str | None, str]]]:
        """(label, [(profile, suffix, instructions)]) — a team or one profile."""
        if request.team is not None and request.profile is not None:
            raise ContractError("--team/--profile", "both given", "give one: a team names its own profiles")
        if request.team is not None:
            team = self.profiles.team(request.team)
            return team.name, [
                (self.profiles.profile(m.profile), m.suffix, m.instructions) for m in team.members
            ]
        if request.profile is None:
            raise ContractError(
                "--profile", "missing", "name a launch profile (pi-matrix profiles lists them)"
            )
        return request.profile, [(self.profiles.profile(request.profile), None, "")]

    def _cwd(self, request: FireRequest) -> str:
        path = request.path or os.getcwd()
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            raise ContractError(
                "--path", f"{path} is not a directory", "give an existing folder for the agents"
            )
        return real

    def _check_task(self, request: FireRequest) -> str:
        task = request.task
        if not task.strip():
            raise ContractError("TASK", "empty", "give the task after --")
        if len(task.encode("utf-8", "surrogatepass")) > MAX_TASK_BYTES:
            raise ContractError(
                "TASK", f"over {MAX_TASK_BYTES} bytes", "put long context in a file and point to it"
            )
        if "\x00" in task:
            raise ContractError("TASK", "contains a NUL byte", "remove it (argv cannot carry NUL)")
        return task

    def _deadline(self, request: FireRequest, profile_deadline: float) -> float:
        deadline = request.deadline_s if request.deadline_s is not None else profile_deadline
        if not (1 <= deadline <= MAX_DEADLINE_S):
            raise ContractError(
                "--deadline",
                f"{deadline:g}s is outside 1..{MAX_DEADLINE_S:.0f}",
                "give seconds, at most 24 h",
            )
        return float(deadline)

    def live_entries(self) -> list[Entry]:
        return [e for e in self.store.list().entries if e.status in LIVE and procs.is_alive(e.process)]

    def _check_cap(self, cwd: str, adding: int) -> None:
        cap = self.settings.max_concurrent_agents
        live = [e for e in self.live_entries() if e.role is Role.WORKER and e.identity.cwd == cwd]
        if len(live) + adding > cap:
            raise DispatchError(
                f"fire: {len(live)} live agent(s) already run in {cwd} and this launch adds {adding}, over "
                f"processMatrix.maxConcurrentAgents={cap}; wait for one to finish ('pi-matrix jobs'), stop "
                "one, or raise the setting"
            )

    def _check_lane_free(self, lane: str, worktree: str) -> None:
        for entry in self.live_entries():
            if entry.identity.lane == lane and entry.identity.worktree == worktree:
                raise LaneError(
                    f"lane {lane!r} ({worktree}) is bound to live agent {entry.identity.agent_id} "
                    f"({entry.key}); wait for it, stop it, or pick another lane"
                )

    def plan(self, request: FireRequest) -> tuple[Job, list[PlannedAgent]]:
        """Compile everything about a launch; creates nothing except (not dry) the lane worktree."""
        task = self._check_task(request)
        if request.backend not in ("tmux", "subprocess"):
            raise ContractError("--backend", f"{request.backend!r} is unknown", "use tmux or subprocess")
        validate_id(request.socket, "--socket")
        label, members = self._members(request)
        parent, parent_session = self._parent(request)
        cwd = self._cwd(request)
        worktree: str | None = None
        lane = validate_id(request.lane, "--lane") if request.lane is not None else None
        if lane is not None:
            from .lanes import ensure_lane, lane_path

            worktree = lane_path(cwd, lane) if request.dry_run else ensure_lane(cwd, lane).worktree
            if request.dry_run:
                self._check_lane_free(lane, worktree)
        work_cwd = worktree or cwd
        job_id = new_job_id()
        task_ref = validate_task_ref(request.goal_id, "--goal-id") if request.goal_id is not None else None
        if task_ref is None and self.settings.enabled:
            master = next(
                (
                    e
                    for e in self.store.list().entries
                    if e.pid == parent.pid and e.proc_start == parent.start_ticks
                ),
                None,
            )
            task_ref = master.task_ref if master is not None else None
        task_ref = task_ref or f"job:{job_id}"
        if request.agent_id is not None:
            base = validate_id(request.agent_id, "--agent-id")
        else:
            base = f"{label}-{job_id[-6:]}"
        planned: list[PlannedAgent] = []
        agents: list[JobAgent] = []
        from .profile import resolve_write_paths
        from .providers import agent_command

        for profile, suffix, instructions in members:
            agent_id = validate_id(f"{base}-{suffix}" if suffix else base, "agent id")
            # pi keeps the id in a session file's header: a pi agent's file is created with ours,
            # so pi's own session id and the matrix key agree from the first turn.
            session_id = str(uuid.uuid4()) if profile.provider == "pi" else secrets.token_hex(8)
            nonce = new_nonce()
            deadline_s = self._deadline(request, profile.deadline_s)
            is_pi = profile.provider == "pi"
            session_file = session_file_for(work_cwd, session_id, self.env) if is_pi else None
            text = "\n\n".join(p for p in (instructions.strip(), task, marker_instruction(nonce)) if p)
            allowed = resolve_write_paths(profile, cwd=work_cwd, worktree=worktree)
            launch = AgentLaunch(
                job_id=job_id, agent_id=agent_id, session_id=session_id, key=f"worker-{session_id}",
                profile=profile, task=text, cwd=work_cwd, parent=parent, parent_session=parent_session,
                allowed_paths=tuple(allowed), deadline_s=deadline_s, nonce=nonce, worktree=worktree,
                lane=lane, task_ref=task_ref, session_file=session_file,
            )  # fmt: skip
            command = agent_command(self.pi_located(profile), task=text, session_file=session_file, lane=lane)
            agent_argv = list(command.argv)
            extra = [a for part in self.plugins.hook.launch_argv(launch=launch) if part for a in part]
            if extra:
                at = len(agent_argv) - 1 if agent_argv and agent_argv[-1] == text else len(agent_argv)
                agent_argv[at:at] = extra
            identity = AgentIdentityContract(
                agent_id=agent_id, session_id=session_id, session_file=session_file, cwd=work_cwd,
                worktree=worktree, lane=lane, profile=profile.name, provider=profile.provider,
                mode=profile.mode,
            )  # fmt: skip
            argv = host_argv(
                self.store.root, identity=identity, task_summary=task, task_ref=task_ref, lane=lane,
                rpc_prompt=command.rpc_prompt, agent_argv=agent_argv,
            )  # fmt: skip
            env = self._launch_env(launch, profile)
            planned.append(PlannedAgent(launch, tuple(argv), env, work_cwd, _window_name(agent_id)))
            agents.append(
                JobAgent(
                    agent_id=agent_id,
                    key=launch.key,
                    session_id=session_id,
                    profile=profile.name,
                    provider=profile.provider,
                    mode=profile.mode.value,
                    cwd=work_cwd,
                    backend=request.backend,
                    nonce=nonce,
                    round=1,
                    deadline_at=now_ms() + int(deadline_s * 1000),
                    deadline_s=deadline_s,
                    worktree=worktree,
                    lane=lane,
                    session_file=session_file,
                    socket=request.socket if request.backend == "tmux" else None,
                )
            )
        job = Job(
            id=job_id, created_at=now_ms(), parent_pid=parent.pid, parent_session_id=parent_session,
            task=bounded(task, 2000), profile=request.profile, team=request.team, agents=tuple(agents),
            task_ref=task_ref, lane=lane, backend=request.backend,
        )  # fmt: skip
        return job, planned

    def pi_located(self, profile: Any) -> Any:
        """A pi profile whose command is plain ``pi`` runs ``$PI_MATRIX_PI_COMMAND`` when set (pi
        installed off PATH, e.g. the project's pinned ``.pi-cli/``); every other profile as written."""
        if profile.provider != "pi" or tuple(profile.command) != ("pi",) or not self.env.get(ENV_PI_COMMAND):
            return profile
        try:
            command = pi_command(self.env)
        except PiMatrixError as exc:
            raise ContractError(
                ENV_PI_COMMAND, "not a JSON array of strings", 'set it like ["/usr/bin/pi"], or unset it'
            ) from exc
        return attrs.evolve(profile, command=tuple(command))

    def _launch_env(self, launch: AgentLaunch, profile: Any) -> dict[str, str]:
        env: dict[str, str] = {k: self.env[k] for k in PASS_ENV if self.env.get(k)}
        env[ENV_STATE_DIR] = str(self.store.root)
        env.update(dict(profile.env))
        env[ENV_DONE_MARKER] = f"DONE:{launch.nonce}"
        env[ENV_BLOCKED_MARKER] = f"BLOCKED:{launch.nonce}"
        # The bridge names the worker's profile in its appended system prompt (its identity).
        env[ENV_PROFILE] = profile.name
        env.update(self._plugin_env(launch))
        return env

    def _plugin_env(self, launch: AgentLaunch) -> dict[str, str]:
        """Every plugin's ``launch_env``, called once through pluggy (so hook wrappers wrap it). No
        plugin may override another's variable: a disagreement fails the launch naming both."""
        try:
            contributions = self.plugins.hook.launch_env(launch=launch)
        except Exception as exc:  # a plugin's bug must name the plugin
            culprit = _culprit(self.plugins, "launch_env", exc)
            raise DispatchError(
                f"fire: plugin {culprit!r} failed in launch_env ({exc}); fix or uninstall it"
            ) from exc
        merged: dict[str, str] = {}
        for contributed in contributions:
            for key, value in (contributed or {}).items():
                if key in merged and merged[key] != str(value):
                    first, second = self._env_owners(launch, key)
                    raise DispatchError(
                        f"fire: plugins {first!r} and {second!r} both set {key} to different values; "
                        "uninstall or fix one of them"
                    )
                merged[key] = str(value)
        return merged

    def _env_owners(self, launch: AgentLaunch, key: str) -> tuple[str, str]:
        """The two plugins that set ``key`` (only on a conflict): each plugin's hook asked alone,
        still through pluggy, in registration order."""
        impls = [i for i in self.plugins.hook.launch_env.get_hookimpls() if not (i.hookwrapper or i.wrapper)]
        setters: list[str] = []
        for impl in impls:
            others = [i.plugin for i in impls if i is not impl]
            alone = self.plugins.subset_hook_caller("launch_env", remove_plugins=others)
            if any(key in (part or {}) for part in alone(launch=launch)):
                setters.append(impl.plugin_name)
        setters += ["unknown", "unknown"]
        return setters[0], setters[1]

    # -- fire ----------------------------------------------------------------------------------------
    def fire(self, request: FireRequest) -> FireResult:
        job, planned = self.plan(request)
        if request.dry_run:
            return FireResult(job, tuple(planned), True)
        # Checks and launches under one lock, so two fires cannot both take the last slot or lane.
        with self._cap_lock():
            if self.settings.enabled:
                if job.lane is not None and job.agents[0].worktree is not None:
                    self._check_lane_free(job.lane, job.agents[0].worktree)
                cwds: dict[str, int] = {}
                for p in planned:
                    cwds[p.cwd] = cwds.get(p.cwd, 0) + 1
                for cwd, count in cwds.items():
                    self._check_cap(cwd, count)
            self.jobs.create(job)
            launched: list[JobAgent] = []
            try:
                for agent, plan in zip(job.agents, planned, strict=True):
                    launched.append(self._launch_one(job, agent, plan))
            except PiMatrixError as exc:
                done = ", ".join(a.agent_id for a in launched) or "none"
                raise DispatchError(
                    f"fire: job {job.id}: launch failed ({exc}); already running: {done}"
                ) from exc
            finally:
                by_id = {a.agent_id: a for a in launched}
                job = self.jobs.update(
                    job.id,
                    lambda j: attrs.evolve(j, agents=tuple(by_id.get(a.agent_id, a) for a in j.agents)),
                )
                # Every agent that started is watched, even when a later one failed to start.
                for agent in job.agents:
                    if agent.agent_id in by_id:
                        self._start_watcher(job, agent)
        for agent, plan in zip(job.agents, planned, strict=True):
            self._notify("on_launched", job=job, launch=plan.launch, pane=_pane_info(agent))
        return FireResult(job, tuple(planned), False)

    def _notify(self, hook: str, **kwargs: Any) -> None:
        """Call a notification hook through pluggy, one plugin at a time (each call wrapped by every
        wrapper plugin): a failing plugin is reported by name, never allowed to undo a launch or a
        result, nor to keep the plugins after it from hearing of it."""
        caller = getattr(self.plugins.hook, hook)
        plain = [i for i in caller.get_hookimpls() if not (i.hookwrapper or i.wrapper)]
        for impl in reversed(plain):  # pluggy's own order: the last registered first
            others = [i.plugin for i in plain if i is not impl]
            try:
                self.plugins.subset_hook_caller(hook, remove_plugins=others)(**kwargs)
            except Exception as exc:  # noqa: BLE001 - a plugin's bug is reported, not propagated
                log.warning("plugin %r failed in %s: %s", impl.plugin_name, hook, exc)

    def _cap_lock(self) -> Any:
        if not self.settings.enabled:
            return contextlib.nullcontext()
        return RecordStore(self.store, "jobs").locked("fire-cap")

    def _launch_one(self, job: Job, agent: JobAgent, plan: PlannedAgent) -> JobAgent:
        if agent.provider == "pi" and agent.session_file is not None:
            write_session_header(agent.session_file, agent.session_id, plan.cwd)
        if agent.backend == "tmux":
            from .tmux import TmuxServer

            server = TmuxServer(agent.socket or DEFAULT_SOCKET, scrub_env=SCRUB_ENV)
            pane = server.launch(
                plan.argv, session=TMUX_SESSION, window_name=plan.window, cwd=plan.cwd, env=plan.env,
                tags={"@pi_matrix_key": agent.key, "@pi_matrix_job": job.id},
            )  # fmt: skip
            host = procs.identify(pane.pane_pid)
            launched = attrs.evolve(
                agent, pane_id=pane.pane_id, target=f"{pane.session}:{pane.window_name}",
                host_pid=pane.pane_pid,
                host_start=host.start_ticks if host else None, boot_id=host.boot_id if host else None,
            )  # fmt: skip
        else:
            log_path = self.store.side_dir("logs") / f"{job.id}.{agent.agent_id}.log"
            env = {k: v for k, v in self.env.items() if k not in SCRUB_ENV}
            env.update(plan.env)
            try:
                child = spawn_detached(plan.argv, log_path, cwd=plan.cwd, env=env)
            except OSError as exc:
                raise DispatchError(f"fire: cannot start {plan.argv[0]}: {exc.strerror}") from None
            host = procs.identify(child.pid)
            launched = attrs.evolve(
                agent, host_pid=child.pid, host_start=host.start_ticks if host else None,
                boot_id=host.boot_id if host else None, log=str(log_path), target=f"pid {child.pid}",
            )  # fmt: skip
        if self.settings.enabled and launched.host is not None:
            self._publish_launching(plan.launch, launched.host)
        return launched

    def _publish_launching(self, launch: AgentLaunch, host: ProcessIdentity) -> None:
        """The launcher publishes the host's pid before the host registers (seed 000)."""
        identity = AgentIdentityContract(
            agent_id=launch.agent_id, session_id=launch.session_id, session_file=launch.session_file,
            cwd=launch.cwd, worktree=launch.worktree, lane=launch.lane, profile=launch.profile.name,
            provider=launch.profile.provider, mode=launch.profile.mode,
        )  # fmt: skip
        entry = lifecycle.new_entry(
            role=Role.WORKER, identity=identity, process=host, now=now_ms(), parent=launch.parent,
            parent_session_id=launch.parent_session, task_ref=launch.task_ref, task_summary=launch.task,
            status=Status.LAUNCHING,
        )  # fmt: skip
        with contextlib.suppress(EntryExists):  # the host registered first: its registration is the record
            self.store.create(entry)

    def _start_watcher(self, job: Job, agent: JobAgent) -> None:
        tmux = agent.backend == "tmux" and agent.socket is not None and agent.pane_id is not None
        pane = (agent.socket or DEFAULT_SOCKET, agent.pane_id or "") if tmux else None
        argv = watch_argv(self.store.root, job.id, agent.agent_id, agent.round, pane=pane, follow=agent.log)
        if agent.backend == "tmux" and agent.pane_id is not None:
            from .tmux import TmuxServer

            try:
                TmuxServer(agent.socket or DEFAULT_SOCKET).pipe_pane(agent.pane_id, argv)
                return
            except (TmuxUnavailable, PiMatrixError) as exc:
                # The pane is already gone (a quick agent) or tmux is unreachable: a detached
                # watcher without the pane's output still writes the host's exit or the deadline.
                log.warning(
                    "%s: no pipe on pane %s (%s); watching its host only", agent.key, agent.pane_id, exc
                )
        spawn_detached(argv, self.store.side_dir("logs") / f"{job.id}.{agent.agent_id}.watch.log")

    # -- jobs ----------------------------------------------------------------------------------------
    def view(self, job: Job, *, tmux_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A job as ``jobs``/``job`` show it: each agent's result, host liveness and tmux state."""
        results = self.jobs.results_of(job)
        agents = []
        finished = 0
        for agent in job.agents:
            rounds = results.get(agent.agent_id, [])
            current = next((r for r in rounds if r.round == agent.round), None)
            if current is not None:
                finished += 1
            host_alive = procs.is_alive(agent.host)
            entry = self.store.find(agent.key) if self.settings.enabled else None
            agents.append(
                {
                    "agentId": agent.agent_id,
                    "key": agent.key,
                    "profile": agent.profile,
                    "lane": agent.lane,
                    "round": agent.round,
                    "target": agent.target,
                    "paneId": agent.pane_id,
                    "hostPid": agent.host_pid,
                    "hostAlive": host_alive,
                    "status": entry.status.value if entry is not None else None,
                    "tmux": (tmux_state or {}).get(
                        agent.agent_id, "n/a" if agent.backend != "tmux" else "unknown"
                    ),
                    "result": None if current is None else _result_json(current),
                    "results": [_result_json(r) for r in rounds],
                    "deadlineAt": agent.deadline_at,
                }
            )
        if job.dismissed_at is not None:
            state = "dismissed"
        elif job.stopped_at is not None:
            state = "stopped"
        elif finished == len(job.agents):
            state = "finished"
        elif job.orphaned_at is not None:
            state = "orphaned"
        else:
            state = "running"
        return {
            "jobId": job.id,
            "state": state,
            "createdAt": job.created_at,
            "profile": job.profile,
            "team": job.team,
            "lane": job.lane,
            "taskRef": job.task_ref,
            "task": bounded(job.task, 200),
            "parentPid": job.parent_pid,
            "parentSession": job.parent_session_id,
            "backend": job.backend,
            "agents": agents,
        }

    def _panes(self, socket: str, cache: dict[str, list[Any] | None]) -> list[Any] | None:
        """The panes on ``socket`` (None: the server does not answer), asked once per command."""
        if socket not in cache:
            from .tmux import TmuxServer

            try:
                cache[socket] = TmuxServer(socket).panes()
            except TmuxUnavailable:
                cache[socket] = None
        return cache[socket]

    def tmux_states(self, job: Job, cache: dict[str, list[Any] | None] | None = None) -> dict[str, str]:
        """Tri-state per agent: ``unreachable`` (no tmux answer: proves nothing), ``gone`` (the
        server answers, the pane is not there), ``ours`` (the pane's process is the job's host),
        ``foreign`` (a pane with that id runs something else)."""
        cache = {} if cache is None else cache
        states: dict[str, str] = {}
        for agent in job.agents:
            if agent.backend != "tmux" or agent.socket is None:
                states[agent.agent_id] = "n/a"
                continue
            panes = self._panes(agent.socket, cache)
            if panes is None:
                states[agent.agent_id] = "unreachable"
                continue
            pane = next((p for p in panes if p.pane_id == agent.pane_id), None)
            if pane is None:
                states[agent.agent_id] = "gone"
            else:
                states[agent.agent_id] = "ours" if pane.pane_pid == agent.host_pid else "foreign"
        return states

    def _rebuild_from_tags(self, job: Job, cache: dict[str, list[Any] | None]) -> Job:
        """A dispatcher that died between starting a pane and recording it: the pane's tags
        (``@pi_matrix_job``/``@pi_matrix_key``) say which agent it is, so the record is completed."""
        missing = [a for a in job.agents if a.backend == "tmux" and a.pane_id is None and a.socket]
        if not missing:
            return job
        found: dict[str, JobAgent] = {}
        for agent in missing:
            assert agent.socket is not None
            for pane in self._panes(agent.socket, cache) or []:
                if pane.tag("@pi_matrix_job") == job.id and pane.tag("@pi_matrix_key") == agent.key:
                    host = procs.identify(pane.pane_pid)
                    found[agent.agent_id] = attrs.evolve(
                        agent, pane_id=pane.pane_id, target=f"{pane.session}:{pane.window_name}",
                        host_pid=pane.pane_pid, host_start=host.start_ticks if host else None,
                        boot_id=host.boot_id if host else None,
                    )  # fmt: skip
        if not found:
            return job
        return self.jobs.update(
            job.id,
            lambda j: attrs.evolve(
                j, agents=tuple(found.get(a.agent_id, a) if a.pane_id is None else a for a in j.agents)
            ),
        )

    def untracked(
        self, sockets: set[str], known: set[str], cache: dict[str, list[Any] | None]
    ) -> list[dict[str, Any]]:
        """Panes tagged by a dispatcher whose job record is gone (a wiped or other state dir)."""
        rows: list[dict[str, Any]] = []
        for socket in sorted(sockets):
            for pane in self._panes(socket, cache) or []:
                job_id = pane.tag("@pi_matrix_job")
                if job_id and job_id not in known:
                    host = procs.identify(pane.pane_pid)
                    rows.append(
                        {
                            "jobId": job_id, "key": pane.tag("@pi_matrix_key"), "socket": socket,
                            "paneId": pane.pane_id, "target": pane.target, "hostPid": pane.pane_pid,
                            "hostAlive": host is not None,
                        }
                    )  # fmt: skip
        return rows

    def reconcile(self, *, sockets: set[str] | None = None) -> list[dict[str, Any]]:
        """On dispatcher start (``jobs``): complete records from pane tags, mark unfinished jobs
        whose panes all vanished as orphaned (never killing anything), report every job's
        tri-state; panes tagged with an unknown job are listed as ``untracked``."""
        jobs, problems = self.jobs.list_jobs()
        cache: dict[str, list[Any] | None] = {}
        views: list[dict[str, Any]] = [
            {"jobId": Path(bad.path).stem, "state": "corrupt", "problem": bad.reason, "path": bad.path}
            for bad in problems
        ]
        for job in jobs:
            current = self._rebuild_from_tags(job, cache)
            states = self.tmux_states(current, cache)
            view = self.view(current, tmux_state=states)
            unfinished = [a for a in view["agents"] if a["result"] is None]
            recorded = all(a.pane_id is not None for a in current.agents if a.backend == "tmux")
            if (
                view["state"] == "running"
                and unfinished
                and recorded  # a fire still launching has no panes yet: not orphaned
                and all(states.get(a["agentId"]) == "gone" and not a["hostAlive"] for a in unfinished)
            ):
                current = self.jobs.update(
                    job.id, lambda j: attrs.evolve(j, orphaned_at=now_ms()) if j.orphaned_at is None else None
                )
                view = self.view(current, tmux_state=states)
            views.append(view)
        if sockets:
            known = {job.id for job in jobs} | {"resume"}
            for row in self.untracked(sockets, known, cache):
                views.append({"jobId": row["jobId"], "state": "untracked", "agents": [row]})
        return views

    def followup(self, job_id: str, text: str, agent_id: str | None = None) -> Job:
        """Send more work to a job's live agents: a fresh marker round, the same profile and
        authority (only the instructions change), delivered through each host's mailbox."""
        if not text.strip():
            raise ContractError("TEXT", "empty", "give the follow-up after --")
        job = self.jobs.get(job_id)
        targets = [a for a in job.agents if agent_id is None or a.agent_id == agent_id]
        if not targets:
            raise ContractError(
                "--agent", f"job {job_id} has no agent {agent_id!r}", "pick one from 'pi-matrix job ID'"
            )
        live = [a for a in targets if procs.is_alive(a.host)]
        if not live:
            raise DispatchError(f"followup: no agent of {job_id} is alive to take it; fire a new job")
        live_ids = {a.agent_id for a in live}
        rearmed: dict[str, JobAgent] = {}

        def rearm(current: Job) -> Job:
            # Computed under the job's lock from the record as it stands: two follow-ups at once
            # take rounds n+1 and n+2, never the same round with two nonces.
            agents = []
            for agent in current.agents:
                if agent.agent_id in live_ids:
                    next_round = attrs.evolve(
                        agent, nonce=new_nonce(), round=agent.round + 1,
                        deadline_at=now_ms() + int(agent.deadline_s * 1000),
                    )  # fmt: skip
                    rearmed[agent.agent_id] = next_round
                    agents.append(next_round)
                else:
                    agents.append(agent)
            return attrs.evolve(current, agents=tuple(agents))

        job = self.jobs.update(job_id, rearm)
        for agent in job.agents:
            if agent.agent_id not in rearmed:
                continue
            self._start_watcher(job, agent)
            marker = f"[pi-matrix] marker code {agent.nonce}"
            message = f"{text.strip()}\n\n{marker_instruction(agent.nonce)}\n{marker}"
            Inbox(self.store, agent.key).post("prompt", message, sender="pi-matrix followup")
        return job

    def dismiss(self, job_id: str) -> Job:
        """Done with a finished job: its idle agents are stopped cooperatively and the job is hidden."""
        job = self.jobs.get(job_id)
        view = self.view(job)
        working = [a["agentId"] for a in view["agents"] if a["result"] is None and a["hostAlive"]]
        if working:
            raise DispatchError(
                f"dismiss: {job_id} still has working agents ({', '.join(working)}); wait for them, or "
                f"'pi-matrix stop {job_id} --confirm yes-tmux-stop'"
            )
        survivors = stop_agents(self.store, job.agents, reason="dismiss")
        job = self.jobs.update(job_id, lambda j: attrs.evolve(j, dismissed_at=now_ms()))
        if survivors:
            raise DispatchError(_survived("dismiss", job_id, survivors))
        return job

    def stop(self, job_id: str) -> tuple[Job, list[AgentResult]]:
        """The confirmed stop: a ``stopped`` result first (where none exists), then each host's stop
        sequence, then its own pane."""
        job = self.jobs.get(job_id)
        written: list[AgentResult] = []
        for agent in job.agents:
            result = result_now(
                job, agent.agent_id, agent.key, agent.round, ResultKind.STOPPED, detail="stopped by its owner"
            )
            if self.jobs.put_result(result):
                written.append(result)
        survivors = stop_agents(self.store, job.agents, reason="stop")
        job = self.jobs.update(job_id, lambda j: attrs.evolve(j, stopped_at=now_ms()))
        for result in written:
            self._notify("on_terminal", job=job, result=result)
        if survivors:
            raise DispatchError(_survived("stop", job_id, survivors))
        return job, written


def _culprit(plugins: pluggy.PluginManager, hook: str, exc: BaseException) -> str:
    """The plugin whose hook implementation raised ``exc``: the innermost traceback frame that runs
    one of the hook's implementations (pluggy keeps them on the traceback)."""
    codes = {
        getattr(impl.function, "__code__", None): impl.plugin_name
        for impl in getattr(plugins.hook, hook).get_hookimpls()
    }
    name = "unknown"
    tb = exc.__traceback__
    while tb is not None:
        name = codes.get(tb.tb_frame.f_code, name)
        tb = tb.tb_next
    return name


def _survived(verb: str, job_id: str, survivors: Sequence[JobAgent]) -> str:
    hosts = ", ".join(f"{a.agent_id} (host pid {a.host_pid})" for a in survivors)
    return f"{verb}: {job_id}: still running after SIGKILL: {hosts}; check them with 'pi-matrix job {job_id}'"


def _result_json(result: AgentResult) -> dict[str, Any]:
    return {
        "round": result.round,
        "kind": result.kind.value,
        "at": result.at,
        "detail": result.detail,
        "exitCode": result.exit_code,
        "exitKind": result.exit_kind,
    }


def _pane_info(agent: JobAgent) -> dict[str, Any]:
    return {"paneId": agent.pane_id, "panePid": agent.host_pid, "target": agent.target, "pid": agent.host_pid}
