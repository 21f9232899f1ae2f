"""One agent per session file (issue 18, cases 3, 4 and 7): a session has one master, a master's
agent never outlives its host unseen, and a restarted master continues its session's one file.

Real processes throughout: real ``pi-matrix master`` hosts, the stand-in and small Python agents,
real pi (pinned, from npm) against the fake LLM on 127.0.0.1 in a private tmux server. Every
process a test starts is stopped by its identity at the end (the lab's cleanup).
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_llm import FakeLLM, write_pi_agent_dir
from helpers import read_events
from pi_support import pi_bin
from test_dispatch import Lab, wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.model import Entry

STOP = "pi-matrix stop master-{session} --confirm yes-tmux-stop"
# An agent that ignores a hangup on purpose (as under nohup), so it outlives its host's SIGKILL;
# it says when its SIGHUP disposition is set.
STUBBORN = (
    "import pathlib, signal, sys, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    "pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(300)"
)


def kill9(identity: ProcessIdentity | None) -> None:
    assert identity is not None
    procs.send_signal(identity, signal.SIGKILL)
    assert procs.wait_for_exit(identity, 10)


# === cases 3 and 7 with real pi ===================================================================
@pytest.fixture
def pilab(tmp_path: Path, tmux_socket: str) -> Iterator[tuple[Lab, FakeLLM]]:
    binary = pi_bin()
    with FakeLLM() as llm:
        lab = Lab(tmp_path, tmux_socket)
        write_pi_agent_dir(lab.agent_dir, llm.base_url)
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        lab.env.update(
            PI_MATRIX_PI_COMMAND=json.dumps([binary]), PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost",
            TMPDIR=str(tmp),
        )  # fmt: skip
        lab.pi = binary  # type: ignore[attr-defined]
        try:
            yield lab, llm
        finally:
            lab.cleanup()


def pi_master_window(lab: Lab, session: str, *pi_args: str) -> Entry:
    """``pi-matrix master --session-id SESSION -- pi …`` (interactive) typed at a shell in a new
    window of the lab's private tmux server (the shell leads the terminal's session, as a user's
    does: the host's end alone hangs nothing up); its entry once pi runs under it."""
    before = lab.store.find(f"master-{session}")
    argv = [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", session, "--",
            lab.pi, *pi_args]  # type: ignore[attr-defined]  # fmt: skip
    tmux = ["tmux", "-L", lab.socket]
    has = subprocess.run([*tmux, "has-session", "-t", "=m"], capture_output=True, check=False)
    fresh = ["new-session", "-d", "-s", "m", "-x", "160"]
    where = ["new-window", "-t", "=m:"] if has.returncode == 0 else fresh
    names = ("PATH", "HOME", "TMPDIR", "PI_OFFLINE", "NO_PROXY", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR",
             "PI_MATRIX_PI_COMMAND", "PYTHONPATH", "VIRTUAL_ENV")  # fmt: skip
    env = [w for name in names if name in lab.env for w in ("-e", f"{name}={lab.env[name]}")]
    shell = ["sh", "-c", f"{shlex.join(argv)}; exec sleep 600"]
    subprocess.run([*tmux, *where, *env, "-c", str(lab.work), "--", *shell], env=lab.env, check=True)
    entry = wait_for(
        f"a new master-{session} running pi",
        lambda: (
            e
            if (e := lab.store.find(f"master-{session}"))
            and (before is None or e.registration != before.registration)
            and e.child_pid
            else None
        ),
        timeout=30,
    )
    lab.started += [i for i in (entry.process, entry.child_process) if i is not None]
    return entry


def test_a_killed_hosts_pi_ends_with_it(pilab: tuple[Lab, FakeLLM]) -> None:
    lab, _llm = pilab
    entry = pi_master_window(lab, "lead")
    wait_for("the bridge", lambda: read_events(lab.state, entry.key, "bridge_ready"), timeout=30)
    pi = entry.child_process
    assert pi is not None

    kill9(entry.process)

    assert procs.wait_for_exit(pi, 10), "pi ran on after its host was killed"

