"""Recovery starts through the backend the job names (issue 32.1): a backend listed in
``backends()`` (the documented way, docs/architecture.md) is the one a resume of its job starts
the new host through, never a start of recovery's own. Seen to fail before the change: the
resume started a detached host itself and the backend recorded nothing."""

from __future__ import annotations

import signal
from collections.abc import Mapping

import attrs
import pytest
from labs import Lab, lose_worker
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch import manager
from pi_tmux_matrix.dispatch.backends import Backend, Started, SubprocessBackend, backends
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.model import JobAgent, PlannedAgent, Relaunch
from pi_tmux_matrix.dispatch.plugins import plugin_manager
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.store import MatrixStore

RECORDER = "recorder"


@attrs.frozen
class Recorder:
    """A test-only backend: detached hosts (through the subprocess backend), each start recorded."""

    inner: SubprocessBackend
    starts: list[tuple[str, str, int]]  # (job id, entry key, host pid)
    name: str = RECORDER

    def socket(self, requested: str) -> str | None:
        return None

    def start(self, job_id: str, agent: JobAgent, planned: PlannedAgent) -> Started:
        started = self.inner.start(job_id, agent, planned)
        self.starts.append((job_id, agent.key, started.host_pid))
        return started

    def adopt(self, job_id: str, agent: JobAgent, host: ProcessIdentity) -> Started | None:
        return None


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    """The recorder listed in ``backends()`` beside the built-in ones, for every dispatcher."""
    recorded: list[tuple[str, str, int]] = []

    def listed(store: MatrixStore, env: Mapping[str, str]) -> dict[str, Backend]:
        return {**backends(store, env), RECORDER: Recorder(SubprocessBackend(store, env), recorded)}

    monkeypatch.setattr(manager, "backends", listed)
    return recorded


def test_a_resume_of_a_job_fired_through_a_listed_backend_starts_through_that_backend(
    sublab: Lab,
    starts: list[tuple[str, str, int]],
) -> None:
    master = sublab.start_master()
    fired = sublab.fire("HANG resumable", backend=RECORDER)
    (agent,) = fired.job.agents
    assert agent.backend == RECORDER and [s[:2] for s in starts] == [(fired.job.id, agent.key)]
    sublab.worker(agent.key)
    lose_worker(sublab, master, agent.key)
    new_master = sublab.start_master(session="boss2")
    assert new_master.process is not None
    # No backend asked for: the one its job names (the `resume` verb's and top's default).
    request = Relaunch(
        entry=sublab.store.get(agent.key), parent=new_master.process, parent_session="boss2",
        state_dir=str(sublab.state), socket="pm-test-unused", backend=None,
    )  # fmt: skip
    pid = plugin_manager().hook.relaunch(request=request)
    assert isinstance(pid, int)
    if (ident := procs.identify(pid)) is not None:
        sublab.started.append(ident)
    assert starts[1:] == [("resume", agent.key, pid)], starts
    back = wait_for(
        "the resumed host", lambda: e if (e := sublab.store.find(agent.key)) and e.pid == pid else None
    )
    assert back.identity.agent_id == agent.agent_id
    (job,) = JobStore(sublab.store).list_jobs()[0]
    assert job.agents[0].backend == RECORDER and job.agents[0].host_pid == pid


def test_a_rehost_starts_its_new_host_through_the_subprocess_backend(
    sublab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rehost's host starts through the backend listed as ``subprocess`` (before: a spawn of
    supervise/rehost.py's own), its log still ``logs/<key>.rehost.log``."""
    from pi_tmux_matrix.rehost import rehost

    recorded: list[tuple[str, str, int]] = []

    def listed(store: MatrixStore, env: Mapping[str, str]) -> dict[str, Backend]:
        found = backends(store, env)
        return {**found, "subprocess": Recorder(SubprocessBackend(store, env), recorded, "subprocess")}

    monkeypatch.setattr(manager, "backends", listed)
    master = sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess", goal_id="goal-1")
    (agent,) = fired.job.agents
    entry = sublab.worker(agent.key)
    assert entry.child_process is not None
    sublab.started.append(entry.child_process)
    running = sublab.store.get(master.key)
    for ident in (master.process, running.child_process, entry.process):
        procs.send_signal(ident, signal.SIGKILL)  # type: ignore[arg-type]
        procs.wait_for_exit(ident, 5)  # type: ignore[arg-type]
    me = procs.current()
    pid = rehost(sublab.store, sublab.store.get(agent.key), me, "boss")
    if (ident := procs.identify(pid)) is not None:
        sublab.started.append(ident)
    assert recorded[1:] == [("rehost", agent.key, pid)], recorded
    back = wait_for(
        "the new host",
        lambda: e if (e := sublab.store.find(agent.key)) and e.pid == pid else None,
        timeout=20,
    )
    assert back.child_process == entry.child_process
    assert (sublab.state / "logs" / f"{agent.key}.rehost.log").exists()
