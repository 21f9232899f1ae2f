"""Under faults and hostile input (issue 17): nothing launched twice, no traceback, no silent loss.

One test per numbered case of the issue, each seen to fail on the code before its fix.
"""

from __future__ import annotations

from test_dispatch import Lab, sublab, wait_for  # noqa: F401 - sublab is a fixture

from pi_tmux_matrix import procs


def test_8_a_task_starting_with_a_dash_reaches_every_team_member(sublab: Lab) -> None:  # noqa: F811
    """The task summary goes to each host as ``--task-summary=VALUE``: a task that starts with
    ``-`` is never read as a flag (each host used to die on ``--task-summary -x``)."""
    sublab.start_master()
    fired = sublab.fire("-x", profile=None, team="stand-in-pair", backend="subprocess")
    assert len(fired.job.agents) == 2
    for agent in fired.job.agents:
        assert agent.host is not None
        sublab.started.append(agent.host)
        entry = sublab.worker(agent.key)
        assert entry.task_summary == "-x"
        assert procs.is_alive(entry.process)
