"""Handoffs in a shell master (issue 31.8): a master running in a tmux pane shows a worker's
handoff on the status line of that pane's clients, never printed into the middle of what a person
types there; with no client to show it, it is printed as before (nothing is swallowed).

A real ``pi-matrix master`` in a pane of a private tmux server (a plain program as its agent), a
stand-in worker in print mode that finishes, a real terminal (pty) as the tmux client."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading

import pytest
from labs import STANDIN_PRINT, Lab
from waiting import wait_for

from pi_tmux_matrix import procs

PI_MATRIX = [sys.executable, "-m", "pi_tmux_matrix"]


@pytest.fixture
def slab(lab: Lab) -> Lab:
    """The Lab with the stand-in as a print-mode pi worker."""
    lab.profile("standin-print", STANDIN_PRINT)
    return lab


def _tmux(socket: str, *args: str) -> str:
    argv = ["tmux", "-L", socket, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout


def _master_in_a_pane(lab: Lab) -> str:
    """The master in a pane of the lab's server (session ``boss``); its pane id."""
    master = [*PI_MATRIX, "--state-dir", str(lab.state), "master", "--session-id", "boss", "--task-ref",
              "goal-1", "--headless", "--", sys.executable, "-c", "import time; time.sleep(600)"]  # fmt: skip
    _tmux(
        lab.socket,
        "new-session",
        "-d",
        "-s",
        "boss",
        "-x",
        "200",
        "-y",
        "50",
        "-c",
        str(lab.work),
        shlex.join(master),
    )
    lab.master = wait_for(
        "the master", lambda: e if (e := lab.store.find("master-boss")) and e.child_pid else None
    )
    lab.started += [i for i in (lab.master.process, lab.master.child_process) if i is not None]
    wait_for(
        "its activation",
        lambda: "master-boss active" in _tmux(lab.socket, "capture-pane", "-p", "-t", "boss"),
    )
    return _tmux(lab.socket, "display-message", "-p", "-t", "boss", "#{pane_id}").strip()


def _client(lab: Lab) -> list[bytes]:
    """A person's terminal attached to session ``boss``; what it was sent (the screen's bytes)."""
    leader, follower = os.openpty()
    env = {k: v for k, v in lab.env.items() if k != "TMUX"}
    proc = subprocess.Popen(
        ["tmux", "-L", lab.socket, "attach", "-t", "boss"], stdin=follower, stdout=follower, stderr=follower,
        env=dict(env, TERM="xterm"), start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    identity = procs.identify(proc.pid)
    assert identity is not None
    lab.started.append(identity)
    seen: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                return
            if not data:
                return
            seen.append(data)

    threading.Thread(target=drain, daemon=True).start()
    wait_for("the client", lambda: _tmux(lab.socket, "list-clients").strip())
    return seen


def test_a_handoff_goes_to_the_status_line_not_into_the_typed_line(slab: Lab) -> None:
    lab = slab
    _master_in_a_pane(lab)
    screen = _client(lab)
    (agent,) = lab.fire("Say hello.", profile="standin-print").job.agents
    wait_for(
        f"{agent.key}'s handoff delivered",
        lambda: any(h.delivered_at for h in lab.store.get(agent.key).handoffs),
        timeout=60,
    )
    wait_for("the status line's notice", lambda: f"handoff {agent.key}".encode() in b"".join(screen))
    assert f"handoff {agent.key}" not in _tmux(lab.socket, "capture-pane", "-p", "-t", "boss")


def test_with_no_client_the_handoff_is_printed_in_the_pane(slab: Lab) -> None:
    lab = slab
    _master_in_a_pane(lab)
    (agent,) = lab.fire("Say hello.", profile="standin-print").job.agents
    wait_for(
        "the handoff printed in the master's pane",
        lambda: f"handoff {agent.key}" in _tmux(lab.socket, "capture-pane", "-p", "-J", "-t", "boss"),
        timeout=60,
    )
