"""A Python orchestrator on pi-matrix: be a master, fire a team, wait for results and handoffs.

    python examples/orchestrator.py

It registers itself as a master (so the workers' PI_PARENT_PID is this process and they wind
down if it dies), fires the ``stand-in-pair`` team on a private tmux socket, waits for both
agents' results, stops them, and prints the handoffs their hosts recorded. Everything lives in a
scratch folder and is cleaned up at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pi_tmux_matrix import (
    AgentIdentityContract,
    Dispatcher,
    FireRequest,
    MatrixStore,
    Role,
    TmuxServer,
    current_process,
    load_settings,
    new_entry,
    now_ms,
)


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="pi-matrix-example-"))
    socket = f"pi-matrix-example-{os.getpid()}"
    os.environ.update(PI_CODING_AGENT_DIR=str(root / "agent"), PI_MATRIX_STATE_DIR=str(root / "state"))
    (root / "agent").mkdir()
    store = MatrixStore(root / "state")
    me = current_process()
    session = "orchestrator-1"
    # 1. Register as a master: workers launched from here name this process as their parent.
    identity = AgentIdentityContract(agent_id="example-orchestrator", session_id=session, cwd=str(root))
    store.register(new_entry(role=Role.MASTER, identity=identity, process=me, now=now_ms(), task_ref="demo"))
    dispatcher = Dispatcher(store, load_settings(root))
    try:
        # 2. Fire a team: one job, one agent per member, each in its own tmux window.
        fired = dispatcher.fire(
            FireRequest(
                task="summarise the README",
                team="stand-in-pair",
                path=str(root),
                socket=socket,
                parent_pid=me.pid,
                parent_session=session,
            )
        )
        print(f"fired {fired.job.id}: {[a.agent_id for a in fired.job.agents]} (tmux -L {socket} attach)")
        # 3. Wait for every agent's result (written once per agent by its watcher).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            view = dispatcher.view(dispatcher.jobs.get(fired.job.id))
            if all(agent.result for agent in view.agents):
                break
            time.sleep(0.2)
        for agent in view.agents:
            # to_json() is what `pi-matrix job ID --json` prints for the agent.
            print(f"  {agent.agent.agent_id}: {json.dumps(agent.to_json()['result'])}")
        # 4. Done with the job: its idle agents stop; each host records a terminal handoff.
        dispatcher.dismiss(fired.job.id)
        for agent in fired.job.agents:
            entry = store.get(agent.key)
            for handoff in entry.handoffs:
                print(
                    f"  handoff {agent.key}: {handoff.outcome.value} -> session {handoff.parent_session_id}"
                )
    finally:
        TmuxServer(socket).kill_server()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
