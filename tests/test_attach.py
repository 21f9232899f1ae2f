"""``pi-matrix attach KEY`` (issue 31.1): into the agent's pane on the right tmux server, from a
terminal outside tmux (it becomes the client), from inside the same server (the client switches),
and from inside another server (a new window there attaches); and every place a fire prints is a
command a person can paste (``tmux -L S pi-matrix:w`` was "unknown command").

A real headless master, a stand-in worker fired into a private tmux server, real terminals (ptys)
as tmux clients; each test kills the servers it started by their sockets."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from labs import Lab
from tmux_support import kill_tmux_server
from waiting import wait_for

from pi_tmux_matrix import procs

PYTHON_PI_MATRIX = [sys.executable, "-m", "pi_tmux_matrix"]


def _tmux(socket: str, *args: str) -> str:
    argv = ["tmux", "-L", socket, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    return done.stdout.strip()


def _terminal(lab: Lab, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``argv`` on a terminal of its own (a pty), as a person's shell would run it."""
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=dict(env, TERM="xterm"),
        cwd=lab.work, start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    lab.popens.append(proc)
    identity = procs.identify(proc.pid)
    assert identity is not None
    lab.started.append(identity)

    def drain() -> None:  # a client that cannot write its screen stalls
        while True:
            try:
                if not os.read(leader, 65536):
                    break
            except OSError:
                break

    threading.Thread(target=drain, daemon=True).start()
    return proc


def _worker(lab: Lab) -> tuple[str, str, str]:
    """A worker up: its key, its pane id and the command its fire printed."""
    lab.start_master()
    fired = subprocess.run(
        [*PYTHON_PI_MATRIX, "fire", "--profile", "stand-in", "--socket", lab.socket, "--parent-pid",
         str(lab.master.pid if lab.master else 0), "--parent-session", "boss", "--path", str(lab.work),
         "--", "HANG wait here"],
        cwd=lab.work, env=lab.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert fired.returncode == 0, fired.stderr
    (line,) = [row for row in fired.stdout.splitlines()[1:] if row.strip()]
    key = line.split()[1]
    entry = lab.worker(key)
    lab.started += [i for i in (entry.process, entry.child_process) if i is not None]
    pane = _tmux(lab.socket, "list-panes", "-a", "-F", "#{pane_id} #{pane_pid}")
    pane_id = next(p.split()[0] for p in pane.splitlines() if p.split()[1] == str(entry.pid))
    printed = line[line.index("tmux -L ") :]
    return key, pane_id, printed


def _client_panes(socket: str) -> list[str]:
    """The pane each client of the server shows."""
    clients = _tmux(socket, "list-clients", "-F", "#{client_name}").splitlines()
    return [_tmux(socket, "display-message", "-p", "-c", name, "#{pane_id}") for name in clients]


def test_the_printed_place_attaches_and_attach_from_a_terminal_becomes_the_client(lab: Lab) -> None:
    key, pane_id, printed = _worker(lab)
    assert printed.startswith(f"tmux -L {lab.socket} attach -t pi-matrix:"), printed
    said = subprocess.run(
        [*PYTHON_PI_MATRIX, "attach", key[:14], "--print"], cwd=lab.work, env=lab.env,
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    assert shlex.split(said.stdout) == ["tmux", "-L", lab.socket, "attach-session", "-t", pane_id]
    # The printed command, pasted into a terminal, shows the agent.
    outside = {k: v for k, v in lab.env.items() if k != "TMUX"}
    _terminal(lab, shlex.split(printed), outside)
    wait_for("a client on the agent's pane", lambda: _client_panes(lab.socket) == [pane_id])
    _tmux(lab.socket, "detach-client", "-a")
    _tmux(lab.socket, "detach-client")
    wait_for("no client", lambda: _client_panes(lab.socket) == [])
    # attach itself, from a terminal outside tmux, becomes that client.
    terminal = _terminal(lab, [*PYTHON_PI_MATRIX, "attach", key], outside)
    wait_for("attach's client on the agent's pane", lambda: _client_panes(lab.socket) == [pane_id])
    assert "tmux" in Path(f"/proc/{terminal.pid}/comm").read_text()  # it became tmux itself


def test_attach_inside_the_same_server_switches_the_client(lab: Lab) -> None:
    key, pane_id, _printed = _worker(lab)
    state = str(lab.state)
    inner = shlex.join([*PYTHON_PI_MATRIX, "--state-dir", state, "attach", key])
    _tmux(lab.socket, "new-session", "-d", "-s", "me", "-c", str(lab.work), f"sleep 1; {inner}; sleep 60")
    outside = {k: v for k, v in lab.env.items() if k != "TMUX"}
    _terminal(lab, ["tmux", "-L", lab.socket, "attach", "-t", "me"], outside)
    switched = lambda: _client_panes(lab.socket) == [pane_id]  # noqa: E731
    wait_for("the client switched to the agent's pane", switched, timeout=30)


def test_attach_inside_another_server_opens_a_window_there(lab: Lab, tmux_socket: str) -> None:
    key, pane_id, _printed = _worker(lab)
    mine = f"{lab.socket}-mine"
    try:
        inner = shlex.join([*PYTHON_PI_MATRIX, "--state-dir", str(lab.state), "attach", key])
        _tmux(mine, "new-session", "-d", "-s", "me", "-c", str(lab.work), f"sleep 1; {inner}; sleep 60")
        outside = {k: v for k, v in lab.env.items() if k != "TMUX"}
        _terminal(lab, ["tmux", "-L", mine, "attach", "-t", "me"], outside)
        wait_for(
            "a window of the person's server attached to the agent's pane",
            lambda: _client_panes(lab.socket) == [pane_id], timeout=30,
        )  # fmt: skip
        windows = _tmux(mine, "list-windows", "-t", "me", "-F", "#{window_name}").splitlines()
        assert key[:32] in windows, windows
    finally:
        time.sleep(0.1)
        kill_tmux_server(mine)


def test_top_t_takes_the_client_to_the_selected_agents_pane(lab: Lab) -> None:
    """top's ``t`` (issue 31.1's key in top): inside tmux the client goes to the agent's pane."""
    key, pane_id, _printed = _worker(lab)
    top = shlex.join([*PYTHON_PI_MATRIX, "--state-dir", str(lab.state), "top"])
    _tmux(lab.socket, "new-session", "-d", "-s", "watch", "-c", str(lab.work), top)
    outside = {k: v for k, v in lab.env.items() if k != "TMUX"}
    _terminal(lab, ["tmux", "-L", lab.socket, "attach", "-t", "watch"], outside)
    wait_for("top's table", lambda: key[:12] in _tmux(lab.socket, "capture-pane", "-p", "-t", "watch"))
    _tmux(lab.socket, "send-keys", "-t", "watch", "j")  # the master's row is first: its worker below
    _tmux(lab.socket, "send-keys", "-t", "watch", "t")
    there = lambda: _client_panes(lab.socket) == [pane_id]  # noqa: E731
    wait_for("the client on the agent's pane", there, timeout=15)
