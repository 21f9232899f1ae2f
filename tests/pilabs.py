"""The Lab with the real pi CLI (pinned, from npm) against the fake model on 127.0.0.1, and what
its tests do with it: a pi master typed into a tmux window or run in print mode, the notices its
host posts, a worker fired with a scripted model. The fixtures (``pilab``, ``mlab``) are in
conftest.py; the model is the shipped ``pi_tmux_matrix.testing.fake_model``, scripting and reading
its side is in model_script.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from labs import Lab
from model_script import Scripted
from pi_support import pi_bin, pi_temp
from waiting import wait_for

from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply, default_reply, write_pi_agent_dir


class PiLab(Lab):
    """:class:`labs.Lab` whose pi profiles run the real pi (``pi``) against ``llm``; ``env``
    adds to the lab's environment."""

    def __init__(self, tmp: Path, socket: str, llm: FakeModel, pi: str, **env: str) -> None:
        super().__init__(tmp, socket)
        self.llm = llm
        self.pi = pi
        on_the_fake_model(self, llm, pi, **env)


def on_the_fake_model(lab: Lab, llm: FakeModel, pi: str, **env: str) -> None:
    """Point ``lab``'s agent dir and environment at ``llm`` and the pi binary ``pi`` (offline,
    a temp dir of its own, no proxy for 127.0.0.1); ``env`` adds to its environment."""
    write_pi_agent_dir(lab.agent_dir, llm.base_url)
    lab.env.update(
        PI_MATRIX_PI_COMMAND=json.dumps([pi]), PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost",
        TMPDIR=pi_temp(lab.tmp / "tmp"), **env,
    )  # fmt: skip


PiPair = tuple[PiLab, FakeModel]  # the ``pilab`` fixture
MLab = tuple[PiLab, FakeModel, Scripted]  # the ``mlab`` fixture


@contextmanager
def pi_lab(
    tmp_path: Path, tmux_socket: str, responder: Callable[[dict[str, Any]], Reply] = default_reply, **env: str
) -> Iterator[PiLab]:
    """A :class:`PiLab` on a fake model started here (answering with ``responder``), everything
    cleaned up after."""
    binary = pi_bin()
    with FakeModel(responder=responder) as llm:
        lab = PiLab(tmp_path, tmux_socket, llm, binary, **env)
        try:
            yield lab
        finally:
            lab.cleanup()


def job_of(text: str) -> str:
    found = re.search(r"job-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}", text)
    assert found, f"no job id in {text!r}"
    return found.group(0)


# === a pi master ==================================================================================
def run_print_master(lab: PiLab, prompt: str) -> subprocess.CompletedProcess[str]:
    """``pi-matrix master --session-id boss --headless --mode print -- pi -p PROMPT`` to its end."""
    argv = [
        sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--task-ref", "goal-1",
        "--headless", "--mode", "print", "--", lab.pi, "-p", prompt,
    ]  # fmt: skip
    return subprocess.run(
        argv, env=lab.env, cwd=lab.work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def master_window(lab: PiLab, *pi_args: str) -> None:
    """``pi-matrix master --session-id boss -- pi …`` (interactive) in a window of the lab's tmux."""
    assert lab.socket is not None
    argv = [
        sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--task-ref", "goal-1",
        "--", lab.pi, *pi_args,
    ]  # fmt: skip
    tmux = ["tmux", "-L", lab.socket]
    # The lab's server may already run (the dispatcher's): pass what pi and the host need.
    names = ("PATH", "HOME", "TMPDIR", "PI_OFFLINE", "NO_PROXY", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR",
             "PI_MATRIX_PI_COMMAND", "PI_MATRIX_TMUX_SOCKET", "PYTHONPATH", "VIRTUAL_ENV")  # fmt: skip
    env = [w for name in names if name in lab.env for w in ("-e", f"{name}={lab.env[name]}")]
    # A killed master's window may be closing its session "m" (or the server with it) just now:
    # has-session and the call after it can disagree, so the choice is made again on a failure.
    for attempt in range(5):
        has = subprocess.run([*tmux, "has-session", "-t", "=m"], capture_output=True, check=False)
        new = ["new-session", "-d", "-s", "m", "-x", "160"]
        where = ["new-window", "-t", "=m:"] if has.returncode == 0 else new
        command = [*tmux, *where, *env, "-c", str(lab.work), "--", *argv]
        made = subprocess.run(command, env=lab.env, capture_output=True, check=False)
        if made.returncode == 0:
            return
        time.sleep(0.2 * (attempt + 1))
    raise AssertionError(f"tmux could not open the master's window: {made.stderr!r}")


def capture(lab: Lab) -> str:
    """What the master's window (session ``m``) shows."""
    assert lab.socket is not None
    done = subprocess.run(
        ["tmux", "-L", lab.socket, "capture-pane", "-p", "-J", "-t", "=m:"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout


def idle_pi_master(lab: PiLab, llm: FakeModel) -> Entry:
    """An interactive pi master in tmux that has answered its first prompt and waits."""
    master_window(lab, "Begin.")
    entry = wait_for(
        "the master's pi", lambda: (e := lab.store.find("master-boss")) and e.child_pid and e, timeout=30
    )
    wait_for("its first turn", lambda: len(llm.requests) >= 1, timeout=60)
    lab.master = entry
    lab.started.extend(i for i in (entry.process, entry.child_process) if i is not None)
    return entry


def notices_posted(lab: Lab, key: str, kind: str) -> list[dict[str, Any]]:
    """The notices of ``kind`` the host posted to ``key``'s agent (its mailbox), in order."""
    path = lab.state / "mailbox" / f"{key}.agent.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [n for n in lines if n.get("type") == kind]


def delivered(lab: Lab, key: str) -> bool:
    """Marked delivered: its record closed (and, once closed, a reconcile may remove it)."""
    entry = lab.store.find(key)
    return entry is None or entry.status is Status.CLOSED


# === a pi worker ==================================================================================
def scoped_profile(lab: PiLab, name: str, *, tools: list[str], write_paths: list[str]) -> None:
    """A print-mode pi worker profile ``name`` with ``tools`` and ``write_paths``."""
    lab.profile(
        name,
        "[profile]\n"
        f'name = "{name}"\nprovider = "pi"\ncommand = ["pi"]\nmode = "print"\ndeadline = 120\n'
        f"tools = {json.dumps(tools)}\nwrite_paths = {json.dumps(write_paths)}\n",
    )


def run_worker(lab: PiLab, llm: FakeModel, profile: str, *calls: Reply, lane: str | None = None) -> Any:
    """Fire one print-mode pi worker (in ``lane``'s worktree if given) whose model makes ``calls``
    in order, then finishes; wait until its host has recorded the end."""
    llm.script(*calls)
    lab.start_master()
    fired = lab.fire("Do the file chores.", profile=profile, lane=lane)
    (agent,) = fired.job.agents
    wait_for("the result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    wait_for("the host to record the end", lambda: lab.store.get(agent.key).exit is not None, timeout=30)
    assert len(llm.requests) == len(calls) + 1, "each call's result went back to the model"
    return agent
