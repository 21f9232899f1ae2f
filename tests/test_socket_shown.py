"""Issue 20 item 10: an agent's tmux target names its server. On ``--socket nc-main`` a fire, ``jobs``
and ``job`` say ``tmux -L <socket> <session>:<window>`` (a bare ``pi-matrix:w`` read as the
default socket), and ``fire --json`` / ``job --json`` carry each agent's ``socket``."""

from __future__ import annotations

import json
import subprocess
import sys

from labs import Lab

from pi_tmux_matrix import procs


def cli(lab: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", *words],
        capture_output=True, text=True, env=lab.env, timeout=60, check=False, cwd=lab.work,
    )  # fmt: skip


def test_targets_name_the_socket_in_text_and_json(lab: Lab) -> None:
    master = lab.start_master()
    fire = ["fire", "--profile", "stand-in", "--socket", lab.socket, "--parent-pid", str(master.pid),
            "--parent-session", "boss", "--path", str(lab.work)]  # fmt: skip
    fired = cli(lab, *fire, "--json", "--", "HANG json")
    assert fired.returncode == 0, fired.stderr
    agent = json.loads(fired.stdout)["agents"][0]
    ident = procs.identify(agent["panePid"])
    assert ident is not None
    lab.started.append(ident)
    assert agent["socket"] == lab.socket and agent["target"].startswith("pi-matrix:")
    job_id = json.loads(fired.stdout)["jobId"]

    shown = json.loads(cli(lab, "job", job_id, "--json").stdout)
    assert shown["agents"][0]["socket"] == lab.socket
    where = f"tmux -L {lab.socket} attach -t {agent['target']}"  # a command a person can paste
    done = cli(lab, "job", job_id)
    assert done.returncode == 0 and where in done.stdout, done.stdout + done.stderr
    listed = cli(lab, "jobs")  # the table: the target, its server beside it
    assert f"({lab.socket})" in listed.stdout and agent["target"] in listed.stdout, listed.stdout

    text = cli(lab, *fire, "--", "HANG text")
    assert text.returncode == 0, text.stderr
    assert f"tmux -L {lab.socket} attach -t pi-matrix:" in text.stdout, text.stdout
    for line in text.stdout.splitlines()[1:]:
        key = line.split()[1]
        lab.worker(key)
