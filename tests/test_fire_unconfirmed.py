"""A fire waits on no host's start (issue 30 point 4), and a failed start still reaches the job and
``show``: twenty single fires one after another used to wait twenty host start-ups.

The hosts are held back (or killed before they register) by a ``sitecustomize`` on the
PYTHONPATH of the fires' panes only: a seam outside the code under test, so each fire is seen
to return while its host has not registered. Real tmux on a private socket throughout.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from pathlib import Path

import attrs
import pytest
from helpers import job_on_host
from labs import Lab
from seams import HOLD, HOLD_THEN_DIE, gated_pythonpath
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch import plan
from pi_tmux_matrix.dispatch.confirm import CONFIRM_S, confirm_starts, record_failures
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.model import AgentLaunch, ResultKind
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore


def test_a_series_of_fires_returns_while_no_host_has_started(lab: Lab) -> None:
    """Three fires in a row, every host held before it registers: each fire returned with its
    window made and its ``launching`` entry published, no host registered yet; once let go, all
    start. Before, each fire waited for its host up to ``CONFIRM_S`` (15 s for three here)."""
    lab.start_master()
    pythonpath = gated_pythonpath(lab.tmp, HOLD)
    began = time.monotonic()
    fired = [lab.fire(f"HANG series {i}", env={"PYTHONPATH": pythonpath}) for i in range(3)]
    took = time.monotonic() - began
    agents = [r.job.agents[0] for r in fired]
    for agent in agents:
        entry = lab.store.find(agent.key)
        assert entry is not None and entry.status is Status.LAUNCHING, entry  # published, not registered
        assert entry.pid == agent.host_pid and entry.child_pid is None
        assert agent.pane_id is not None and procs.is_alive(agent.host)
    # Generous: three waits would take 3 x CONFIRM_S; three launches take well under one.
    assert took < CONFIRM_S, took
    (lab.tmp / "gate").unlink()
    for agent in agents:
        lab.worker(agent.key)
    assert all(lab.result(r.job.id, r.job.agents[0].agent_id) is None for r in fired)


def test_a_launching_entry_names_the_identity_its_host_then_registers(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher's ``launching`` entry and the host's registration that replaces it name one
    identity, resource pointers included (the launching entry used to leave them out, so it named
    fewer resources than the agent had). A fire's launches carry none of their own (a resume's
    carry the recorded ones), so this fire's planner is given two; its host is held until the
    ``launching`` entry has been read."""
    lab.start_master()
    pointers = (str(lab.work / "notes.md"), str(lab.work / "design"))
    monkeypatch.setattr(plan, "AgentLaunch", functools.partial(AgentLaunch, resource_pointers=pointers))
    pythonpath = gated_pythonpath(lab.tmp, HOLD)
    fired = lab.fire("HANG pointed", env={"PYTHONPATH": pythonpath})
    monkeypatch.undo()
    (agent,) = fired.job.agents
    launching = lab.store.find(agent.key)
    assert launching is not None and launching.status is Status.LAUNCHING, launching
    assert launching.identity.resource_pointers == pointers, launching.identity
    (lab.tmp / "gate").unlink()
    registered = lab.worker(agent.key)
    assert registered.identity == launching.identity


def test_a_fire_that_asks_to_confirm_still_waits_and_names_the_failure(lab: Lab) -> None:
    """``confirm_s`` (the CLI's ``--confirm-start``) keeps the old contract for a caller that
    wants it: the fire fails with the reason, the job holds it, the entry is closed."""
    lab.start_master()
    # Held until the fire has identified it (it is seen held): a host dying at once may end before
    # its start time is read, a start the next test covers.
    pythonpath = gated_pythonpath(lab.tmp, HOLD_THEN_DIE)
    held = lab.tmp / "gate.held"
    letgo = threading.Thread(
        target=lambda: wait_for("the host held", held.exists, timeout=60) and (lab.tmp / "gate").unlink()
    )
    letgo.start()
    try:
        # Generous: the wait ends when the host is seen dead; only a loaded machine needs it all.
        lab.fire("HANG doomed", env={"PYTHONPATH": pythonpath}, confirm_s=6 * CONFIRM_S)
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        said = str(exc)
    else:
        raise AssertionError("the fire did not fail")
    finally:
        letgo.join()
    assert "could not start" in said and "its host ended before it started the agent" in said
    (job,), _ = JobStore(lab.store).list_jobs()
    (agent,) = job.agents
    result = lab.result(job.id, agent.agent_id)
    assert result is not None and result.kind is ResultKind.EXITED
    entry = lab.store.find(agent.key)
    assert entry is not None and entry.status is Status.CLOSED and entry.reason == "start_failed"


def test_a_confirmed_start_whose_host_ended_before_it_was_identified_fails(tmp_path: Path) -> None:
    """A pane's host that ended before the fire read its start time (on a loaded machine a host
    dying at once does) is recorded by pid alone: ``confirm_s`` reports it as a failed start, the
    job gets the reason, and no ``show`` is pointed to (no ``launching`` entry was published). It
    used to be skipped, and the fire asked to confirm the start returned as if it had started."""
    store = MatrixStore(tmp_path / "state")
    gone = subprocess.Popen(["true"])
    gone.wait()
    job = job_on_host(store, tmp_path, procs.ProcessIdentity(gone.pid, 1, procs.boot_id()), "s9")
    (agent,) = job.agents
    unidentified = attrs.evolve(agent, host_start=None)
    assert unidentified.host is None and unidentified.host_pid == gone.pid
    (failed,) = confirm_starts(store, [unidentified], timeout=10)
    assert failed.reason == "its host ended before it started the agent", failed
    record_failures(store, JobStore(store), job, [failed])
    result = JobStore(store).result(job.id, agent.agent_id, agent.round)
    assert result is not None and result.kind is ResultKind.EXITED and result.detail == failed.reason


def test_a_host_that_dies_before_registering_reaches_the_job_and_show_through_jobs(lab: Lab) -> None:
    """The pane's host ends at once, before it registers: the fire has already returned (it
    waits on no start); ``jobs`` finds the host dead with its agent never started, writes the
    job's ``exited`` result with the reason and closes the launcher's ``launching`` record,
    whose ``show`` says how it ended."""
    lab.start_master()
    pythonpath = gated_pythonpath(lab.tmp, HOLD_THEN_DIE)
    fired = lab.fire("HANG doomed", env={"PYTHONPATH": pythonpath})
    (agent,) = fired.job.agents
    assert agent.host is not None
    wait_for("the host held at the gate", lambda: (lab.tmp / "gate.held").exists() or None)
    (lab.tmp / "gate").unlink()  # the fire has returned: now its host ends
    wait_for("the host to end", lambda: not procs.is_alive(agent.host) or None)
    entry = lab.store.find(agent.key)
    assert entry is not None and entry.status is Status.LAUNCHING  # nobody has looked yet
    listed = lab.cli("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    result = lab.result(fired.job.id, agent.agent_id)
    assert result is not None and result.kind is ResultKind.EXITED, result
    assert "its host ended before it started the agent" in result.detail
    entry = lab.store.find(agent.key)
    assert entry is not None and entry.status is Status.CLOSED and entry.reason == "start_failed"
    shown = lab.cli("show", agent.key)
    assert "start        the agent could not start: its host ended before it started" in shown.stdout, (
        shown.stdout
    )
    one = lab.cli("job", fired.job.id)
    assert "exited" in one.stdout, one.stdout
    # Settled once: a second look writes nothing new and says the same.
    again = lab.cli("jobs", "--json")
    assert again.returncode == 0 and lab.result(fired.job.id, agent.agent_id) == result


def _broken_profile(at: Lab) -> None:
    """A launch profile ``broken`` whose program is there but cannot be executed (a script with a
    missing interpreter): its host cannot start it."""
    script = at.tmp / "agent.sh"
    script.write_text("#!/nonexistent/interpreter\necho hi\n")
    script.chmod(0o755)
    folder = at.agent_dir / "launch_profiles"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "broken.toml").write_text(
        f'[profile]\nname = "broken"\nprovider = "custom"\ncommand = ["{script}", "{{task}}"]\n'
        'mode = "interactive"\ndeadline = 60\n'
    )


def test_an_agent_its_host_cannot_start_reaches_the_job_from_the_host_itself(lab: Lab) -> None:
    """The program is there but cannot be executed (a missing interpreter): the fire returns at
    once; the host records ``spawn_failed`` and exit 127, and its round thread writes the job's
    ``exited`` result with the reason, with nobody running ``jobs``."""
    lab.start_master()
    _broken_profile(lab)
    fired = lab.fire("hi", env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, profile="broken")
    (agent,) = fired.job.agents
    result = wait_for("the host's own result", lambda: lab.result(fired.job.id, agent.agent_id))
    assert result.kind is ResultKind.EXITED and result.exit_code == 127, result
    assert "could not start" in result.detail and "No such file or directory" in result.detail
    shown = lab.cli("show", agent.key)
    assert "start        the agent could not start" in shown.stdout, shown.stdout
    assert "exit         " in shown.stdout and "code 127" in shown.stdout, shown.stdout


def test_the_cli_fire_waits_on_no_start_unless_asked(lab: Lab) -> None:
    """``pi-matrix fire`` (the master tool's fire_task runs it) returns once launched;
    ``--confirm-start`` waits and exits 1 naming an agent that could not start."""
    master = lab.start_master()
    _broken_profile(lab)
    base = ("fire", "--profile", "broken", "--socket", lab.socket, "--parent-pid", str(master.pid),
            "--parent-session", "boss")  # fmt: skip
    quick = lab.cli(*base, "--", "hi")
    assert quick.returncode == 0 and "launched 1 agent(s)" in quick.stdout, quick.stdout + quick.stderr
    waited = lab.cli(*base, "--confirm-start", "--", "hi")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "could not start" in waited.stderr and "No such file or directory" in waited.stderr
    refused = lab.cli(*base, "--confirm-start", "0", "--", "hi")
    assert refused.returncode == 2 and "--confirm-start" in refused.stderr, refused.stderr
    for job in JobStore(lab.store).list_jobs()[0]:
        lab.started += [a.host for a in job.agents if a.host is not None]
