"""Compiling a launch: a :class:`FireRequest` in, the job and each agent's :class:`PlannedAgent` out.

Everything about a launch is decided here before anything is reserved or started: the task and
deadline checks, the profiles of a team or one profile, the calling master, the cwd and lane, the
task ref, each agent's ids, marker nonce, argv (the host, then the agent CLI) and env (the
profile's, then every plugin's ``launch_env``). The only thing it creates is a lane's worktree
(not on a dry run). The room checks (concurrency cap, lane bound to a live agent) are here too;
the dispatcher runs them again under its fire lock.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs
import pluggy

from .. import pisession, procs
from ..contract import (
    ENV_BLOCKED_MARKER,
    ENV_DONE_MARKER,
    ENV_PI_COMMAND,
    ENV_PROFILE,
    ENV_STATE_DIR,
    ENV_USAGE_FILE,
    PASS_ENV,
)
from ..errors import ContractError, DispatchError, LaneError
from ..identity import Mode, ProcessIdentity, Role, validate_id, validate_task_ref
from ..matrix.model import Entry, Status, bounded
from ..matrix.owners import master_entry, owning_master, require_master
from ..matrix.store import MatrixStore, now_ms
from ..programs import host_argv, pi_command
from ..settings import MatrixSettings, agent_dir
from .backends import Backend, backend_named
from .jobs import JobStore, new_job_id, new_nonce
from .model import OPEN, SPLIT, AgentLaunch, Job, JobAgent, PlannedAgent
from .request import (
    FireRequest,
    agent_id_of,
    check_task,
    check_workspace,
    cwd_of,
    deadline_of,
    job_id_of,
    marker_instruction,
    window_name,
    workspace_field,
)
from .tmux_model import check_session
from .variables import Variables, variables_instruction

if TYPE_CHECKING:
    from .profile import ProfileSet, WorkerLaunchProfile

__all__ = ["LIVE", "Planner"]

LIVE: Final = frozenset(
    {Status.LAUNCHING, Status.RUNNING, Status.WINDING_DOWN, Status.ADOPTED, Status.RESUMABLE}
)
_WORKER_KEY: Final = f"{Role.WORKER.value}-"  # a worker entry's key: worker-<sessionId>


@attrs.frozen
class _JobPlace:
    """What every agent of one launch shares."""

    job_id: str
    task: str
    # Only from a goal: none is recorded as none, never minted
    # (docs/decisions.md#a-task-ref-comes-only-from-a-goal).
    task_ref: str | None
    cwd: str  # the agents' cwd: the lane's worktree, else the request's folder
    folder: str  # the request's folder (where an ad-hoc agent's own lane is made)
    worktree: str | None
    lane: str | None
    parent: ProcessIdentity
    parent_session: str
    backend: str
    socket: str | None


@attrs.frozen
class _Member:
    """One agent of a launch: its profile, agent-id suffix, first instructions, and (an ad-hoc
    agent's) own folder and lane."""

    profile: WorkerLaunchProfile
    suffix: str | None
    instructions: str
    path: str | None = None
    lane: str | None = None
    field: str = "--profile"


def _folder(path: str, field: str) -> str:
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise ContractError(field, f"{path} is not a directory", "give an existing folder for the agent")
    return real


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


@attrs.define
class Planner:
    """Compiles launches for one dispatcher (its store, settings, env, plugins and backends)."""

    store: MatrixStore
    settings: MatrixSettings
    env: Mapping[str, str] = attrs.field(kw_only=True)
    plugins: pluggy.PluginManager = attrs.field(kw_only=True)
    backends: Mapping[str, Backend] = attrs.field(kw_only=True)
    _profiles: ProfileSet | None = attrs.field(default=None, kw_only=True)  # read on first use

    @property
    def profiles(self) -> ProfileSet:
        """The launch profiles and teams in force, read on first use."""
        if self._profiles is None:
            from .profile import load_profiles

            self._profiles = load_profiles(agent_dir(self.env))
        return self._profiles

    # -- who, where ----------------------------------------------------------------------------------
    def _parent(self, request: FireRequest) -> tuple[ProcessIdentity, str]:
        explicit = request.parent_pid is not None or request.parent_session is not None
        # Nothing starts under the parent on a dry run, nor as a worker with the matrix off.
        registered = self.settings.enabled and not request.dry_run
        found = (
            owning_master(self.store, request.parent_pid, request.parent_session, registered=registered)
            if explicit or self.settings.enabled
            else None
        )
        if found is None and not self.settings.enabled:
            me = procs.current()
            return me, f"dispatcher-{me.pid}"
        return require_master(found, "fire")

    def _members(self, request: FireRequest) -> tuple[str, list[_Member]]:
        """(label, members) — a team, one profile, or the request's ad-hoc agents."""
        named = (("--team", request.team), ("--profile", request.profile), ("--agent", request.agents))
        given = [flag for flag, value in named if value]
        if len(given) > 1:
            raise ContractError(
                "/".join(given), "given together", "give one: a team or ad-hoc agents name their own profiles"
            )
        if request.agents:
            # Every entry's profile and folder are checked before any lane is made.
            return "agents", [
                _Member(
                    a.profile(),
                    a.name,
                    "",
                    a.folder and _folder(*a.folder),
                    a.worktree_lane and validate_id(a.worktree_lane, f"{a.field}.worktreeLane"),
                    a.field,
                )
                for a in request.agents
            ]
        if request.team is not None:
            team = self.profiles.team(request.team)
            return team.name, [
                _Member(self.profiles.profile(m.profile), m.suffix, m.instructions) for m in team.members
            ]
        if request.profile is None:
            raise ContractError(
                "--profile", "missing", "name a launch profile (pi-matrix profiles lists them)"
            )
        return request.profile, [_Member(self.profiles.profile(request.profile), None, "")]

    def _worktree(self, cwd: str, lane: str | None, *, dry_run: bool) -> str | None:
        """The lane's worktree (made unless dry; a dry run checks the lane is free instead)."""
        if lane is None:
            return None
        from .lanes import ensure_lane, lane_path

        worktree = lane_path(cwd, lane) if dry_run else ensure_lane(cwd, lane).worktree
        if dry_run:
            self.check_lane_free(lane, worktree)
        return worktree

    def _place_of(self, place: _JobPlace, member: _Member, *, dry_run: bool) -> _JobPlace:
        """An ad-hoc agent's own folder and lane (made unless dry), else the job's place."""
        if member.path is None and member.lane is None:
            return place
        folder = member.path or place.folder
        lane = member.lane if member.lane is not None else place.lane
        worktree = self._worktree(folder, lane, dry_run=dry_run)
        return attrs.evolve(place, cwd=worktree or folder, worktree=worktree, lane=lane)

    def _task_ref(self, request: FireRequest, parent: ProcessIdentity, session: str) -> str | None:
        """The goal id given, else (matrix on) the calling master's own task ref, else none.

        Never made up: exact recovery compares task refs, so a ref the master never had (the
        job's id, say) would make its own goal-less workers foreign after a restart."""
        if request.goal_id is not None:
            return validate_task_ref(request.goal_id, "--goal-id")
        if not self.settings.enabled:
            return None
        # The parent's entry by its key (one file); a listing only when that is not it.
        master = master_entry(self.store, parent, session)
        if master is None:
            same = (parent.pid, parent.start_ticks)
            master = next((e for e in self.store.list().entries if (e.pid, e.proc_start) == same), None)
        return master.task_ref if master is not None else None

    # -- room ----------------------------------------------------------------------------------------
    def live_entries(self) -> list[Entry]:
        return [e for e in self.store.list().entries if e.status in LIVE and procs.is_alive(e.process)]

    def check_cap(self, cwd: str, adding: int) -> None:
        """The cap counts live agent processes, a finished interactive worker idling in its pane
        too (it holds its memory and its pane): the refusal names those, and how to free them
        (docs/decisions.md#the-cap-counts-live-agents-and-names-the-finished-ones)."""
        cap = self.settings.max_concurrent_agents
        # Names first: the workers' entry files, live or not, of any cwd, bound the live ones of
        # this cwd. Under the cap by that bound, no entry is read: a fleet's fire read every file
        # of the state dir (~0.1 ms each) on its path, under the fire lock.
        names = self.store.keys()
        workers = sum(1 for key in names if key.startswith(_WORKER_KEY))
        if workers + adding <= cap:
            return
        live = [e for e in self.live_entries() if e.role is Role.WORKER and e.identity.cwd == cwd]
        if len(live) + adding > cap:
            idle = self._finished({e.key for e in live})
            dismiss = ", ".join(f"'pi-matrix dismiss {job}' ({', '.join(ids)})" for job, ids in idle.items())
            count = sum(len(ids) for ids in idle.values())
            free = (
                f"{count} of them finished their round and idle: {dismiss} frees them; or "
                if idle
                else "wait for one to finish ('pi-matrix jobs'), "
            )
            raise DispatchError(
                f"fire: {len(live)} live agent(s) already run in {cwd} and this launch adds {adding}, over "
                f"processMatrix.maxConcurrentAgents={cap}; {free}stop one, or raise the setting"
            )

    def _finished(self, keys: set[str]) -> dict[str, list[str]]:
        """Of the agents ``keys``, those whose job's current round has its result: job id -> agent
        ids (jobs not dismissed or stopped)."""
        jobs = JobStore(self.store)
        found: dict[str, list[str]] = {}
        for job in jobs.list_jobs()[0]:
            if job.dismissed_at is not None or job.stopped_at is not None:
                continue
            for agent in job.agents:
                if agent.key in keys and jobs.result(job.id, agent.agent_id, agent.round) is not None:
                    found.setdefault(job.id, []).append(agent.agent_id)
        return found

    def check_lane_free(self, lane: str, worktree: str) -> None:
        for entry in self.live_entries():
            if entry.identity.lane == lane and entry.identity.worktree == worktree:
                raise LaneError(
                    f"lane {lane!r} ({worktree}) is bound to live agent {entry.identity.agent_id} "
                    f"({entry.key}); wait for it, stop it, or pick another lane"
                )

    def check_room(self, job: Job, planned: Sequence[PlannedAgent]) -> None:
        """The lane is free and every cwd stays within the cap (matrix on; under the fire lock)."""
        if not self.settings.enabled:
            return
        # Each lane once: a team shares the job's lane; ad-hoc agents may each have their own.
        for lane, worktree in sorted({(a.lane, a.worktree) for a in job.agents if a.lane and a.worktree}):
            self.check_lane_free(lane, worktree)
        cwds: dict[str, int] = {}
        for p in planned:
            cwds[p.cwd] = cwds.get(p.cwd, 0) + 1
        for cwd, count in cwds.items():
            self.check_cap(cwd, count)

    # -- compile -------------------------------------------------------------------------------------
    def plan(self, request: FireRequest) -> tuple[Job, list[PlannedAgent]]:
        """Compile everything about a launch; creates nothing except (not dry) the lane worktree."""
        # A workspace's task is optional: without one its agents start idle.
        task = check_task(request.task) if request.watched or request.task.strip() else ""
        backend = backend_named(self.backends, request.backend)
        validate_id(request.socket, "--socket")
        if not request.watched:
            check_workspace(request)
        if request.workspace is not None:
            check_session(request.workspace, workspace_field(request))
        label, members = self._members(request)
        parent, parent_session = self._parent(request)
        cwd = cwd_of(request)
        lane = validate_id(request.lane, "--lane") if request.lane is not None else None
        worktree = self._worktree(cwd, lane, dry_run=request.dry_run)
        job_id = job_id_of(request) or new_job_id()
        place = _JobPlace(
            job_id=job_id,
            task=task,
            task_ref=self._task_ref(request, parent, parent_session),
            cwd=worktree or cwd,
            folder=cwd,
            worktree=worktree,
            lane=lane,
            parent=parent,
            parent_session=parent_session,
            backend=backend.name,
            socket=backend.socket(request.socket),
        )
        if request.agent_id is not None:
            base = validate_id(request.agent_id, "--agent-id")
        else:
            base = f"{label}-{window_name(job_id[-6:])}"
        compiled = [
            self._plan_agent(
                request,
                self._place_of(place, m, dry_run=request.dry_run),
                m.profile,
                agent_id_of(job_id, f"{base}-{m.suffix}" if m.suffix else base),
                m.instructions,
            )
            for m in members
        ]
        if not request.watched:
            # One window of tiled panes: the first makes the fresh session, the others split it.
            compiled = [
                (attrs.evolve(planned, layout=SPLIT if n else OPEN), agent)
                for n, (planned, agent) in enumerate(compiled)
            ]
        job = Job(
            id=job_id,
            created_at=now_ms(),
            parent_pid=parent.pid,
            parent_session_id=parent_session,
            task=bounded(task, 2000),
            profile=request.profile,
            team=request.team,
            agents=tuple(agent for _, agent in compiled),
            task_ref=place.task_ref,
            lane=lane,
            backend=request.backend,
            watched=request.watched,
        )
        return job, [planned for planned, _ in compiled]

    def _plan_agent(
        self,
        request: FireRequest,
        place: _JobPlace,
        profile: WorkerLaunchProfile,
        agent_id: str,
        instructions: str,
    ) -> tuple[PlannedAgent, JobAgent]:
        from .profile import resolve_write_paths

        # pi keeps the id in a session file's header: a pi agent's file is created with ours,
        # so pi's own session id and the matrix key agree from the first turn.
        is_pi = profile.provider == "pi"
        session_id = str(uuid.uuid4()) if is_pi else secrets.token_hex(8)
        nonce = new_nonce()
        session_file = pisession.new_session_file(place.cwd, session_id, self.env) if is_pi else None
        told = variables_instruction(Variables(self.store).path(place.job_id))
        parts: tuple[str, ...]
        if request.watched:
            deadline_s = deadline_of(request, profile.deadline_s)
            claim = JobStore(self.store).claim_path(f"{place.job_id}.{agent_id}.1")
            parts = (instructions.strip(), place.task, told, marker_instruction(nonce, claim))
        else:
            # A workspace agent is a person's: interactive, no deadline, never asked for a marker,
            # and with no task no first prompt at all (its instructions wait for one).
            profile = attrs.evolve(profile, mode=Mode.INTERACTIVE)
            deadline_s = 0.0
            parts = (instructions.strip(), place.task, told) if place.task else ()
        text = "\n\n".join(p for p in parts if p)
        allowed = resolve_write_paths(profile, cwd=place.cwd, worktree=place.worktree)
        launch = AgentLaunch(
            job_id=place.job_id,
            agent_id=agent_id,
            session_id=session_id,
            key=f"worker-{session_id}",
            profile=profile,
            task=text,
            cwd=place.cwd,
            parent=place.parent,
            parent_session=place.parent_session,
            allowed_paths=tuple(allowed),
            deadline_s=deadline_s,
            nonce=nonce,
            worktree=place.worktree,
            lane=place.lane,
            task_ref=place.task_ref,
            session_file=session_file,
            watched=request.watched,
        )
        argv, env = self.compose(launch, task_summary=place.task or "(no task: waiting for you)")
        planned = PlannedAgent(launch, argv, env, place.cwd, window_name(agent_id), request.workspace)
        agent = planned.job_agent(
            place.backend,
            place.socket,
            deadline_at=now_ms() + int(deadline_s * 1000) if request.watched else 0,
            boot_id=procs.boot_id(),  # its host runs in this boot: a crash that ends it ends the host
        )
        return planned, agent

    def compose(self, launch: AgentLaunch, *, task_summary: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """The one door through which every agent start is built (fire, follow-up rounds reuse the
        host, ``resume`` and every relaunch): the host argv, then the agent CLI from the launch's
        profile with every plugin's ``launch_argv`` (the bridge) before the task, and the env with
        every plugin's ``launch_env`` (the contract, the envelope)."""
        return self._host_argv(launch, task_summary), self.launch_env(launch, launch.profile)

    def _host_argv(self, launch: AgentLaunch, task_summary: str) -> tuple[str, ...]:
        """The pane command: the host, then the agent CLI with every plugin's ``launch_argv``
        before the task (when the task is its last word)."""
        from .providers import agent_command

        profile = launch.profile
        command = agent_command(
            self.pi_located(profile),
            task=launch.task or None,
            session_file=launch.session_file,
            lane=launch.lane,
        )
        agent_argv = list(command.argv)
        extra = [a for part in self.plugins.hook.launch_argv(launch=launch) if part for a in part]
        if extra:
            at = len(agent_argv) - 1 if agent_argv and agent_argv[-1] == launch.task else len(agent_argv)
            agent_argv[at:at] = extra
        return tuple(
            host_argv(
                self.store.root,
                identity=launch.identity(),
                task_summary=task_summary,
                task_ref=launch.task_ref,
                lane=launch.lane,
                rpc_prompt=command.rpc_prompt,
                agent_argv=agent_argv,
                ticket=launch.ticket if self.settings.enabled else None,
                # A job's marker rounds are watched by the agent's own host
                # (docs/decisions.md#the-agents-host-watches-its-own-rounds).
                job=(launch.job_id, launch.agent_id) if launch.watched else None,
            )
        )

    def pi_located(self, profile: WorkerLaunchProfile) -> WorkerLaunchProfile:
        """A pi profile whose command is plain ``pi`` runs ``$PI_MATRIX_PI_COMMAND`` when set (pi
        installed off PATH, e.g. the project's pinned ``.pi-cli/``); every other profile as written."""
        if profile.provider != "pi" or tuple(profile.command) != ("pi",) or not self.env.get(ENV_PI_COMMAND):
            return profile
        return attrs.evolve(profile, command=tuple(pi_command(self.env)))

    # -- env -----------------------------------------------------------------------------------------
    def launch_env(self, launch: AgentLaunch, profile: WorkerLaunchProfile) -> dict[str, str]:
        env: dict[str, str] = {k: self.env[k] for k in PASS_ENV if self.env.get(k)}
        env[ENV_STATE_DIR] = str(self.store.root)
        env.update(dict(profile.env))
        if launch.watched:  # a workspace agent is never asked for a marker
            env[ENV_DONE_MARKER] = f"DONE:{launch.nonce}"
            env[ENV_BLOCKED_MARKER] = f"BLOCKED:{launch.nonce}"
        # The bridge names the worker's profile in its appended system prompt (its identity).
        env[ENV_PROFILE] = profile.name
        if launch.watched:  # a workspace agent has no rounds, so no claim of one
            env[ENV_USAGE_FILE] = JobStore(self.store).claim_path(f"{launch.job_id}.{launch.agent_id}.1")
        env.update(self._plugin_env(launch))
        return env

    def _plugin_env(self, launch: AgentLaunch) -> dict[str, str]:
        """Every plugin's ``launch_env``, called once through pluggy (so hook wrappers wrap it). No
        plugin may override another's variable: a disagreement fails the launch naming both."""
        try:
            contributions = self.plugins.hook.launch_env(launch=launch)
        except Exception as exc:  # a plugin's bug must name the plugin
            name = _culprit(self.plugins, "launch_env", exc)
            raise DispatchError(
                f"fire: plugin {name!r} failed in launch_env ({exc}); fix or uninstall it"
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
