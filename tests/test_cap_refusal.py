"""The cap and finished workers (issue 31.5): two finished interactive workers idling after their
round hold the cap (it counts live agents), and the refusal names them with the way to free them,
`pi-matrix dismiss JOB` (on main it said "wait for one to finish", which never comes).

A real headless master and stand-in workers in a private tmux server."""

from __future__ import annotations

import pytest
from labs import Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.errors import DispatchError


@pytest.fixture
def caplab(lab: Lab) -> Lab:
    """The Lab with room for two agents."""
    lab.settings.set(maxConcurrentAgents=2)
    return lab


def test_the_refusal_names_the_finished_jobs_and_dismiss_frees_their_room(caplab: Lab) -> None:
    lab = caplab
    lab.start_master()
    finished = []
    for i in range(2):
        fired = lab.fire(f"quick one {i}")
        (agent,) = fired.job.agents
        entry = lab.worker(agent.key)
        wait_for(f"round 1 of {fired.job.id}", lambda f=fired, a=agent: lab.result(f.job.id, a.agent_id))
        assert procs.is_alive(entry.child_process)  # finished, and idling in its pane
        finished.append((fired.job.id, agent.agent_id))
    with pytest.raises(DispatchError) as refused:
        lab.fire("HANG one too many")
    said = str(refused.value)
    assert "2 of them finished their round and idle" in said, said
    for job_id, agent_id in finished:
        assert f"'pi-matrix dismiss {job_id}' ({agent_id})" in said, said
    assert "wait for one to finish" not in said
    lab.dispatcher().dismiss(finished[0][0])
    wait_for("room for one more", lambda: _fires(lab))


def test_a_cap_full_of_working_agents_still_says_wait(caplab: Lab) -> None:
    lab = caplab
    lab.start_master()
    for i in range(2):
        lab.fire(f"HANG busy {i}")
    with pytest.raises(DispatchError, match=r"wait for one to finish \('pi-matrix jobs'\)"):
        lab.fire("HANG one too many")


def _fires(lab: Lab) -> bool:
    try:
        lab.fire("HANG now there is room")
    except DispatchError:
        return False
    return True
