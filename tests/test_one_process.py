"""Issue 30.1: one process per agent. The completion watcher's work (markers, deadlines, rounds,
the agent's end) runs inside the agent's own host, for tmux and detached agents alike: a fired
agent adds one interpreter (its host), where it used to add two (host + ``pi-matrix watch``).

Real hosts, the bundled stand-in agent, a private tmux server per test (``Lab``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labs import STANDIN_PRINT, Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.matrix.layout import pipe_prefix
from pi_tmux_matrix.matrix.model import ExitKind


def our_interpreters(state: Path) -> list[int]:
    """Every process running pi-matrix's code with this state dir on its command line (hosts,
    watchers, masters), by /proc: what one agent costs in interpreters."""
    found = []
    marker = str(state).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in words and any(w.endswith(b"python") or b"python3" in w for w in words[:1]):
            found.append(int(cmdline.parent.name))
    return sorted(found)


@pytest.mark.parametrize("backend", ["tmux", "subprocess"])
def test_a_fired_agent_adds_one_interpreter_its_host(lab: Lab, backend: str) -> None:
    lab.start_master()
    before = set(our_interpreters(lab.state))
    fired = lab.fire("HANG until stopped", backend=backend)
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    time.sleep(1.0)  # a watcher process would be up by now (the fire started it right after)
    added = set(our_interpreters(lab.state)) - before
    assert added == {entry.pid}, f"interpreters added by one fire: {sorted(added)} (host {entry.pid})"


@pytest.mark.parametrize("backend", ["tmux", "subprocess"])
def test_the_hosts_own_round_thread_ends_each_round_by_its_marker(lab: Lab, backend: str) -> None:
    lab.start_master()
    fired = lab.fire("Say hello.", backend=backend)
    (agent,) = fired.job.agents
    first = wait_for("round 1's result", lambda: lab.result(fired.job.id, agent.agent_id, 1), timeout=30)
    assert first.kind is ResultKind.DONE
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "followup", fired.job.id, "--", "Say more."],
        env=lab.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    second = wait_for("round 2's result", lambda: lab.result(fired.job.id, agent.agent_id, 2), timeout=30)
    assert second.kind is ResultKind.DONE
    handoffs = wait_for("two handoffs", lambda: len(h := lab.store.get(agent.key).handoffs) == 2 and h)
    assert [h.outcome.value for h in handoffs] == ["done", "done"]


def test_the_deadline_is_kept_by_the_host_itself_timeout_first_then_the_agent_stopped(
    sublab: Lab,
) -> None:
    sublab.start_master()
    fired = sublab.fire("HANG forever", backend="subprocess", deadline_s=2)
    (agent,) = fired.job.agents
    entry = sublab.worker(agent.key)
    result = wait_for("the timeout", lambda: sublab.result(fired.job.id, agent.agent_id), timeout=30)
    assert result.kind is ResultKind.TIMEOUT
    assert entry.process is not None and procs.wait_for_exit(entry.process, 20)
    ended = sublab.store.get(agent.key)
    assert ended.exit is not None and ended.exit.kind is ExitKind.TIMED_OUT


def test_an_agent_that_ends_without_its_marker_gets_its_exit_as_the_rounds_result(lab: Lab) -> None:
    lab.profile("standin-print", STANDIN_PRINT)
    lab.start_master()
    fired = lab.fire("FAIL on purpose", profile="standin-print")
    (agent,) = fired.job.agents
    result = wait_for("the exit's result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=30)
    assert result.kind is ResultKind.EXITED and result.exit_code == 3, result
    mine = pipe_prefix(fired.job.id, agent.agent_id)  # the host's pid follows
    pipes = lab.state / "pipes"
    wait_for("its FIFO removed", lambda: not [n for n in os.listdir(pipes) if n.startswith(mine)], timeout=10)


def test_the_deadline_stops_the_agent_with_the_mailbox_disk_full(sublab: Lab) -> None:
    """The round thread asks its host for the deadline's stop in-process (a flag and a signal),
    never through the mailbox: with every mailbox write refused (ENOSPC, in the host's process
    only) the agent is still stopped and recorded timed out (review finding on 30.1)."""
    from seams import full_disk

    from pi_tmux_matrix.dispatch.request import FireRequest

    sublab.start_master()
    assert sublab.master is not None
    full = full_disk(sublab.tmp, "mailbox")
    request = FireRequest(
        task="HANG forever", path=str(sublab.work), backend="subprocess", deadline_s=2, profile="stand-in",
        parent_pid=sublab.master.pid, parent_session=sublab.master.identity.session_id,
    )  # fmt: skip
    fired = sublab.dispatcher(PYTHONPATH=full["PYTHONPATH"]).fire(request)
    (agent,) = fired.job.agents
    assert agent.host is not None
    sublab.started.append(agent.host)
    result = wait_for("the timeout", lambda: sublab.result(fired.job.id, agent.agent_id), timeout=30)
    assert result.kind is ResultKind.TIMEOUT
    assert procs.wait_for_exit(agent.host, 20), "the agent outlived its deadline"
    ended = sublab.store.get(agent.key)
    assert ended.exit is not None and ended.exit.kind is ExitKind.TIMED_OUT


def test_with_the_matrix_off_a_program_that_cannot_start_still_ends_its_round(sublab: Lab) -> None:
    """Matrix off: the host registers nothing and runs the agent as its child beside the round
    thread; a program that cannot start gives the round its result (exit 127) all the same."""
    import json

    (sublab.agent_dir / "settings.json").write_text(json.dumps({"processMatrix": {"enabled": False}}))
    folder = sublab.agent_dir / "launch_profiles"
    folder.mkdir(exist_ok=True)
    broken = sublab.tmp / "broken-cli"  # executable, but its interpreter is not there: exec fails
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    (folder / "missing.toml").write_text(
        f'[profile]\nname = "missing"\nprovider = "custom"\ncommand = ["{broken}"]\n'
        'mode = "interactive"\ndeadline = 60\n'
    )
    from pi_tmux_matrix.dispatch.request import FireRequest

    fired = sublab.dispatcher().fire(
        FireRequest(task="say hi", profile="missing", path=str(sublab.work), backend="subprocess")
    )
    (agent,) = fired.job.agents
    if agent.host is not None:
        sublab.started.append(agent.host)
    result = wait_for("the round's result", lambda: sublab.result(fired.job.id, agent.agent_id), timeout=30)
    assert result.kind is ResultKind.EXITED and result.exit_code == 127, result
    assert sublab.store.list().entries == ()


# A seam of this test's own: a sitecustomize that writes the interpreter's sys.modules to a file
# on SIGUSR1 (which pi-matrix never uses), put on the host's PYTHONPATH by the fire.
_DUMP_MODULES = """\
import os, signal, sys

def _dump(_signum, _frame):
    with open(os.path.join({folder!r}, "modules-%d" % os.getpid()), "w") as out:
        out.write("\\n".join(sorted(sys.modules)))

signal.signal(signal.SIGUSR1, _dump)
"""
# What a host must not load on its way to idling with a job agent (issue 30.3): the converter
# (cattrs, ~1.5 MiB with typing_extensions, dataclasses, datetime, base64, socket), psutil, and
# what only other verbs use.
NOT_IN_A_HOST = (
    "cattrs", "typing_extensions", "dataclasses", "datetime", "base64", "socket", "psutil", "pluggy",
    "rich", "tomllib", "uuid", "secrets", "pi_tmux_matrix.dispatch.manager", "pi_tmux_matrix.fork.launch",
)  # fmt: skip


def test_an_idle_job_host_loads_no_converter_no_psutil_no_socket(lab: Lab) -> None:
    seam = lab.tmp / "seam"
    seam.mkdir()
    (seam / "sitecustomize.py").write_text(_DUMP_MODULES.format(folder=str(seam)))
    lab.start_master()
    assert lab.master is not None
    from pi_tmux_matrix.dispatch.request import FireRequest

    request = FireRequest(
        task="HANG until stopped", path=str(lab.work), socket=lab.socket, profile="stand-in",
        parent_pid=lab.master.pid, parent_session=lab.master.identity.session_id,
    )  # fmt: skip
    path = os.pathsep.join(p for p in (str(seam), os.environ.get("PYTHONPATH", "")) if p)
    fired = lab.dispatcher(PYTHONPATH=path).fire(request)
    (agent,) = fired.job.agents
    if agent.host is not None:
        lab.started.append(agent.host)
    entry = lab.worker(agent.key)
    # Past its first heartbeats and parent polls (1 s each in the lab): what it loads on first use.
    wait_for("two heartbeats", lambda: (e := lab.store.get(agent.key)).heartbeat_at and e, timeout=10)
    time.sleep(2.5)
    dump = seam / f"modules-{entry.pid}"
    os.kill(entry.pid, signal.SIGUSR1)
    modules = set(wait_for("the host's modules", lambda: dump.exists() and dump.read_text()).split())
    assert "pi_tmux_matrix.supervise.host" in modules  # the dump is the host's
    loaded = sorted(m for m in modules if m.split(".")[0] in NOT_IN_A_HOST or m in NOT_IN_A_HOST)
    assert loaded == [], loaded
