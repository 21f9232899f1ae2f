"""``tmux_agent_manager``: fire_task, jobs, follow-ups, dismiss, confirmed stop, reconcile with tmux.

The :class:`Dispatcher` is the facade over one state dir; the work is done by its rooms:
:mod:`~pi_tmux_matrix.dispatch.plan` compiles a launch whole before anything is reserved or started
(profiles, team, parent, lane, cap, env, argv), :mod:`~pi_tmux_matrix.dispatch.backends` starts each
host, :mod:`~pi_tmux_matrix.dispatch.views` shows jobs and :mod:`~pi_tmux_matrix.dispatch.reconcile_tmux`
holds them against tmux. The job is written before its first agent starts, and each agent's pane
command *is* its host: ``pi-matrix host … -- <agent argv>`` started by ``tmux new-window … -e K=V
-- argv`` (never typed into a shell). Liveness is judged by process identity, never by tmux:
an unreachable tmux server is reported as such and proves nothing about the agents.

Names that live in the rooms are imported from the rooms (``FireRequest`` from
:mod:`~pi_tmux_matrix.dispatch.request`, ``PlannedAgent`` from :mod:`~pi_tmux_matrix.dispatch.model`);
the package's face re-exports the public ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

import attrs
import pluggy

from .. import pisession, procs
from ..errors import (
    AgentNotFound,
    ContractError,
    DispatchError,
    JobNotFound,
    PiMatrixError,
    TmuxUnavailable,
)
from ..matrix.mailbox import Inbox, addressee, encode_message
from ..matrix.model import Entry
from ..matrix.store import MatrixStore, RecordStore, now_ms
from ..matrix.tickets import LaunchTickets
from ..settings import MatrixSettings
from .backends import Backend, backends
from .confirm import check_programs, confirm_starts, record_failures, settle_starts
from .hostless import settle
from .jobs import JOB_WAIT_S, JobStore, new_nonce, result_now
from .launching import Beside, launch_one
from .model import MAX_ROUND, TMUX, AgentLaunch, AgentResult, Job, JobAgent, PlannedAgent, ResultKind
from .plan import Planner
from .plugins import plugin_manager
from .reconcile_tmux import PaneCache, reconcile, tmux_states, untracked
from .request import FireRequest, marker_instruction, workspace_field
from .stops import stop_agents
from .tmux import TmuxServer
from .views import JobView, ListedJob, PaneInfo, TmuxState, UntrackedPane, job_view

if TYPE_CHECKING:
    from .profile import ProfileSet, WorkerLaunchProfile

__all__ = [
    "Dispatcher",
    "FireResult",
    "session_file_for",
    "write_session_header",
]

log = logging.getLogger(__name__)


@attrs.frozen
class FireResult:
    job: Job
    planned: tuple[PlannedAgent, ...]
    dry_run: bool

    def to_json(self) -> dict[str, object]:
        agents = []
        for planned, agent in zip(self.planned, self.job.agents, strict=True):
            item: dict[str, object] = {
                "agentId": agent.agent_id,
                "key": agent.key,
                "profile": agent.profile,
                "lane": agent.lane,
                "cwd": agent.cwd,
                "socket": agent.tmux_socket,
                "target": agent.target,
                "paneId": agent.pane_id,
                "panePid": agent.host_pid,
                "sessionFile": agent.session_file,
            }
            if self.dry_run:
                item["argv"] = list(planned.argv)
                item["env"] = dict(planned.env)
            if planned.layout is not None:
                item["pane"] = planned.layout  # open: makes the workspace; split: a pane beside
            agents.append(item)
        shown: dict[str, object] = {
            "jobId": self.job.id,
            "dryRun": self.dry_run,
            "taskRef": self.job.task_ref,
        }
        if not self.job.watched:
            shown.update(workspace=self.planned[0].session, watched=False)
        return {**shown, "agents": agents}


# The one home of pi session files is pisession; these names stay for callers of 0.1.
session_file_for = pisession.new_session_file
write_session_header = pisession.write_header


class Dispatcher:
    """The dispatcher over one state dir: fire, view, reconcile, follow up, dismiss, stop."""

    def __init__(
        self,
        store: MatrixStore,
        settings: MatrixSettings,
        *,
        env: Mapping[str, str] | None = None,
        plugins: pluggy.PluginManager | None = None,
        profiles: ProfileSet | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.plugins = plugins if plugins is not None else plugin_manager(matrix=settings.enabled)
        self.jobs = JobStore(store)
        self.backends: dict[str, Backend] = backends(store, self.env)
        self.planner = Planner(
            store, settings, env=self.env, plugins=self.plugins, backends=self.backends, profiles=profiles
        )

    # -- compile (dispatch/plan.py) ------------------------------------------------------------------
    @property
    def profiles(self) -> ProfileSet:
        return self.planner.profiles

    def plan(self, request: FireRequest) -> tuple[Job, list[PlannedAgent]]:
        """Compile everything about a launch; creates nothing except (not dry) the lane worktree."""
        return self.planner.plan(request)

    def pi_located(self, profile: WorkerLaunchProfile) -> WorkerLaunchProfile:
        return self.planner.pi_located(profile)

    def _launch_env(self, launch: AgentLaunch, profile: WorkerLaunchProfile) -> dict[str, str]:
        return self.planner.launch_env(launch, profile)

    def compose(self, launch: AgentLaunch, *, task_summary: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """The one door every agent start is built through (see :meth:`Planner.compose`)."""
        return self.planner.compose(launch, task_summary=task_summary)

    def live_entries(self) -> list[Entry]:
        return self.planner.live_entries()

    # -- fire ----------------------------------------------------------------------------------------
    def fire(self, request: FireRequest) -> FireResult:
        job, planned = self.plan(request)
        self._check_workspace(request)
        if request.dry_run:
            self._check_launch_key(request, job, archive=False)
            return FireResult(job, tuple(planned), True)
        check_programs(planned, self.env)
        # Checks and launches under one lock, so two fires cannot both take the last slot or lane.
        with self._cap_lock():
            self.planner.check_room(job, planned)
            self._check_launch_key(request, job, archive=True)
            # The job's first version is written beside the launches, not before them: its write
            # and its two fsyncs (each a journal commit a series of fires waits for in turn) run
            # while tmux makes the panes, and its hosts, which read it, wait for it
            # (dispatch/jobs.py: JOB_WAIT_S). It is durable before the update below, and so
            # before the fire returns. The update, which records the hosts and panes, leaves its
            # folder's fsync out: a crash that undoes it leaves the first version, whose agents
            # name the boot they were launched in, and readers settle them as ended with that
            # boot (docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs).
            beside = Beside()  # the writes run beside the launches (dispatch/launching.py)
            created = beside.run("the job record", self.jobs.create, job)
            launched: list[JobAgent] = []
            store = self.store if self.settings.enabled else None
            try:
                for agent, plan in zip(job.agents, planned, strict=True):
                    launched.append(launch_one(self.backends, store, job.id, agent, plan, beside=beside))
            except PiMatrixError as exc:
                failure = f"fire: job {job.id}: launch failed ({exc}); {_running(launched)}"
                raise DispatchError(failure) from exc
            finally:
                by_id = {a.agent_id: a for a in launched}
                try:
                    if created.exception() is None:  # else its hosts start nothing: joined below
                        job = self.jobs.update(
                            job.id,
                            lambda j: attrs.evolve(
                                j, agents=tuple(by_id.get(a.agent_id, a) for a in j.agents)
                            ),
                            sync_dir=False,
                        )
                finally:
                    unwritten = beside.join()
            error = created.exception()
            if error is not None:
                raise DispatchError(
                    f"fire: job {job.id}: its record could not be written ({error}): its hosts start no "
                    f"agent and end within {JOB_WAIT_S:.0f} s"
                ) from error
            if unwritten:
                what, error = unwritten[0]
                raise DispatchError(f"fire: job {job.id}: {what}: {error}; {_running(launched)}") from error
        # The start is not waited for unless asked (docs/decisions.md#fires-do-not-wait-for-starts):
        # a series of fires must not wait on each host's start in turn. A failed start still reaches
        # the job and the entry: the host records it (its round thread writes the result), or
        # ``jobs``/``job`` settles a host that never got that far (confirm.settle_starts).
        waited = self.settings.enabled and request.confirm_s > 0
        failed = confirm_starts(self.store, job.agents, request.confirm_s) if waited else []
        if self.settings.enabled:
            LaunchTickets(self.store).prune()  # a day's launches are kept (matrix.tickets)
        for agent, plan in zip(job.agents, planned, strict=True):
            self._notify("on_launched", job=job, launch=plan.launch, pane=PaneInfo.of(agent).to_json())
        if failed:
            record_failures(self.store, self.jobs, job, failed)
            reasons = "; ".join(f"{f.agent.agent_id}: {f.reason}" for f in failed)
            raise DispatchError(f"fire: job {job.id}: {len(failed)} agent(s) could not start: {reasons}")
        return FireResult(job, tuple(planned), False)

    def _check_launch_key(self, request: FireRequest, job: Job, *, archive: bool) -> None:
        """A launch key names one job: a second fire with it is refused, unless ``force`` moves the
        old record aside (its live agents and panes are never touched)."""
        if request.launch_key is None:
            return
        try:
            old = self.jobs.get(job.id)
        except JobNotFound:
            return
        if not request.force:
            fired = max(0, now_ms() - old.created_at) // 1000
            raise ContractError(
                "--launch-key",
                f"job {job.id} already exists (fired {fired}s ago)",
                "pick another key, or pass --force to archive the old job's record (its live panes are "
                "never touched)",
            )
        if archive:
            name = self.jobs.archive(old)
            log.warning("fire: job %s archived as %s (--force)", job.id, name)

    def _check_workspace(self, request: FireRequest) -> None:
        """A workspace is a fresh tmux session: one that is already there is refused, force or not."""
        if request.workspace is None or request.backend != TMUX:
            return
        server = TmuxServer(request.socket, timeout=5.0)
        try:
            there = server.has_session(request.workspace)
        except TmuxUnavailable:
            return  # no server yet: the launch starts one with this session
        if there:
            where = f"tmux session {request.workspace!r} already exists on socket {request.socket!r}"
            raise ContractError(
                workspace_field(request),
                where,
                f"pick another name, or stop it first ('pi-matrix stop-session {request.workspace} --socket "
                f"{request.socket} --confirm yes-tmux-stop' stops its jobs)",
            )

    def _notify(self, hook: str, **kwargs: object) -> None:
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

    def _cap_lock(self) -> contextlib.AbstractContextManager[object]:
        if not self.settings.enabled:
            return contextlib.nullcontext()
        return RecordStore(self.store, "jobs").locked("fire-cap")

    # -- jobs (dispatch/views.py, dispatch/reconcile_tmux.py) ----------------------------------------
    def view(self, job: Job, *, tmux_state: Mapping[str, TmuxState] | None = None) -> JobView:
        """A job as ``jobs``/``job`` show it: each agent's result, host liveness and tmux state."""
        if not self.settings.enabled:
            return job_view(job, self.jobs.results_of(job), entries=None, tmux_state=tmux_state)
        view = job_view(job, self.jobs.results_of(job), entries=self.store, tmux_state=tmux_state)
        if settle_starts(self.store, self.jobs, job, view.unsettled()):
            view = job_view(job, self.jobs.results_of(job), entries=self.store, tmux_state=tmux_state)
        return view

    def settled_view(self, job: Job, *, tmux_state: Mapping[str, TmuxState] | None = None) -> JobView:
        """:meth:`view` for a reader that may end rounds (``job ID``): after the starts that never
        happened, a round whose host and agent both ended unseen gets its result
        (docs/decisions.md#a-hostless-round-stays-open-until-its-agent-ends)."""
        view = self.view(job, tmux_state=tmux_state)
        if settle(self.jobs, self.store if self.settings.enabled else None, job):
            view = self.view(job, tmux_state=tmux_state)
        return view

    def tmux_states(self, job: Job, cache: PaneCache | None = None) -> dict[str, TmuxState]:
        return tmux_states(job, cache)

    def untracked(
        self, sockets: AbstractSet[str], known: AbstractSet[str], cache: PaneCache
    ) -> list[UntrackedPane]:
        return untracked(sockets, known, cache)

    def reconcile(self, *, sockets: AbstractSet[str] | None = None) -> list[ListedJob]:
        """Complete records from pane tags, mark orphaned jobs, list untracked panes on ``sockets``
        (see :func:`~pi_tmux_matrix.dispatch.reconcile_tmux.reconcile`)."""
        return reconcile(self.jobs, self.store if self.settings.enabled else None, sockets=sockets)

    def followup(self, job_id: str, text: str, agent_id: str | None = None) -> Job:
        """Send more work to a job's live agents: a fresh marker round, the same profile and
        authority (only the instructions change), delivered through each host's mailbox."""
        if not text.strip():
            raise ContractError("TEXT", "empty", "give the follow-up after --")
        job = self.jobs.get(job_id)
        targets = [a for a in job.agents if agent_id is None or a.agent_id == agent_id]
        if not targets:
            raise AgentNotFound(job_id, agent_id or "-")
        live = [a for a in targets if procs.is_alive(a.host)]
        if not job.watched and live:
            # A workspace's agents take the text as it is: no marker round, no watcher, no deadline.
            encode_message("prompt", text.strip(), "pi-matrix followup")
            for agent in live:
                to = addressee(self.store, agent.key, agent.host_pid)
                Inbox(self.store, agent.key).post("prompt", text.strip(), sender="pi-matrix followup", to=to)
            return job
        if any(a.round >= MAX_ROUND for a in live):
            raise DispatchError(f"followup: {job_id} has had {MAX_ROUND} rounds; fire a new job for more")
        if not live:
            raise DispatchError(f"followup: no agent of {job_id} is alive to take it; fire a new job")
        live_ids = {a.agent_id for a in live}
        rearmed: dict[str, JobAgent] = {}
        # The message as it will be posted (its nonce's length is fixed): checked before the round
        # moves on, so a refused follow-up changes nothing.
        longest = max((self.jobs.claim_path(a.result_name(job_id, a.round + 1)) for a in live), key=len)
        encode_message("prompt", _followup(text, new_nonce(), longest), "pi-matrix followup")

        def rearm(current: Job) -> Job:
            # Computed under the job's lock from the record as it stands: two follow-ups at once
            # take rounds n+1 and n+2, never the same round with two nonces.
            agents = []
            for agent in current.agents:
                if agent.agent_id in live_ids:
                    next_round = attrs.evolve(
                        agent,
                        nonce=new_nonce(),
                        round=agent.round + 1,
                        deadline_at=now_ms() + int(agent.deadline_s * 1000),
                    )
                    rearmed[agent.agent_id] = next_round
                    agents.append(next_round)
                else:
                    agents.append(agent)
            return attrs.evolve(current, agents=tuple(agents))

        job = self.jobs.update(job_id, rearm)
        for agent in job.agents:
            if agent.agent_id not in rearmed:
                continue
            # Its host watches the new round itself: taking this prompt wakes its round thread.
            message = _followup(text, agent.nonce, self.jobs.claim_path(agent.result_name(job.id)))
            to = addressee(self.store, agent.key, agent.host_pid)
            Inbox(self.store, agent.key).post("prompt", message, sender="pi-matrix followup", to=to)
        return job

    def dismiss(self, job_id: str) -> Job:
        """Done with a finished job: its idle agents are stopped cooperatively and the job is hidden."""
        job = self.jobs.get(job_id)
        working = [
            a.agent.agent_id
            for a in self.view(job).agents
            if a.result is None and (a.host_alive or a.unsupervised)
        ]
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
        sequence, then its own pane. A record the disk refuses stops no agent less: raised after."""
        job = self.jobs.get(job_id)
        written: list[AgentResult] = []
        unwritten: list[PiMatrixError] = []
        for agent in job.agents:
            result = result_now(
                job, agent.agent_id, agent.key, agent.round, ResultKind.STOPPED, detail="stopped by its owner"
            )
            try:
                if (stored := self.jobs.put_result(result)) is not None:
                    written.append(stored)
            except PiMatrixError as exc:
                unwritten.append(exc)
        survivors = stop_agents(self.store, job.agents, reason="stop")
        try:
            job = self.jobs.update(job_id, lambda j: attrs.evolve(j, stopped_at=now_ms()))
        except PiMatrixError as exc:
            unwritten.append(exc)
        for result in written:
            self._notify("on_terminal", job=job, result=result)
        if survivors:
            raise DispatchError(_survived("stop", job_id, survivors))
        if unwritten:
            raise DispatchError(f"stop: {job_id}: its agents were stopped, but not recorded: {unwritten[0]}")
        return job, written


def _running(launched: Sequence[JobAgent]) -> str:
    return "already running: " + (", ".join(a.agent_id for a in launched) or "none")


def _followup(text: str, nonce: str, usage_file: str) -> str:
    """A follow-up's prompt: the text, then how to end this round (its own marker nonce) and
    where it may claim the round's usage."""
    marker = f"[pi-matrix] marker code {nonce}"
    return f"{text.strip()}\n\n{marker_instruction(nonce, usage_file)}\n{marker}"


def _survived(verb: str, job_id: str, survivors: Sequence[JobAgent]) -> str:
    hosts = ", ".join(f"{a.agent_id} (host pid {a.host_pid})" for a in survivors)
    return f"{verb}: {job_id}: still running after SIGKILL: {hosts}; check them with 'pi-matrix job {job_id}'"
