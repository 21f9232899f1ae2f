"""The worker envelope holds on every launch path (issue 16.1), with real pi and the fake LLM.

A confined worker (its profile: read and write, allowed paths = its worktree) is started by each
path in turn: ``fire``, a ``followup`` round, ``resume``, and a new master's exact-session relaunch,
detached (the default) and in tmux. Each time its model asks to read a file outside its allowed
paths and to write into pi's agent dir; both are blocked by the bridge, and ``show KEY --json``
lists them (``toolBlocks``). Before the launch door, a relaunched or resumed worker ran without
the bridge and read the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import read_events
from pilabs import PiLab, PiPair
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too

SECRET = "the-outside-secret"
Scoped = tuple[PiLab, FakeModel, Path]  # the ``scoped`` fixture


@pytest.fixture
def scoped(pilab: PiPair, tmp_path: Path) -> Scoped:
    """``pilab`` (real pi on the fake LLM) with a confined profile and a file outside."""
    lab, llm = pilab
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    lab.profile(
        "pi-scoped",
        '[profile]\nname = "pi-scoped"\nprovider = "pi"\ncommand = ["pi"]\nmode = "interactive"\n'
        'deadline = 300\ntools = ["read", "write"]\nwrite_paths = ["{worktree}"]\n',
    )
    return lab, llm, secret


def escapes(lab: PiLab, secret: Path) -> tuple[Reply, Reply]:
    return (
        Reply(tool="read", arguments={"path": str(secret)}),
        Reply(tool="write", arguments={"path": str(lab.agent_dir / "extensions" / "x.ts"), "content": "0"}),
    )


def blocked(lab: PiLab, key: str, count: int) -> list[dict[str, Any]]:
    """Wait for ``count`` blocks in the worker's events; check ``show --json`` lists them."""
    records = wait_for(
        f"{count} tool_blocked events",
        lambda: r if len(r := read_events(lab.state, key, "tool_blocked")) >= count else None,
        timeout=60,
    )
    show = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "show", key, "--json"],
        capture_output=True, text=True, env=lab.env, timeout=30, check=True,
    )  # fmt: skip
    shown = [(b["tool"], b["path"]) for b in json.loads(show.stdout)["toolBlocks"]]
    assert [(r["tool"], r["path"]) for r in records][-len(shown) :] == shown
    return records


def assert_envelope_held(lab: PiLab, llm: FakeModel, secret: Path, records: list[dict[str, Any]]) -> None:
    assert [r["tool"] for r in records[-2:]] == ["read", "write"]
    assert "outside this worker's allowed paths" in records[-2]["reason"]
    assert "agent dir" in records[-1]["reason"]
    assert not (lab.agent_dir / "extensions" / "x.ts").exists()
    every_request = json.dumps(llm.requests)
    assert SECRET not in every_request, "the model was shown the file outside its allowed paths"


def fire_scoped(lab: PiLab, llm: FakeModel, secret: Path) -> tuple[Entry, Any]:
    llm.script(*escapes(lab, secret))
    lab.start_master()
    fired = lab.fire("Do the chores.", profile="pi-scoped")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    return entry, fired


def orphan(lab: PiLab, entry: Entry) -> Entry:
    """Kill the master and the worker: the worker's entry is left resumable."""
    assert lab.master is not None
    master = lab.store.find(lab.master.key)
    if master is not None and master.child_process is not None:
        lab.started.append(master.child_process)
    procs.send_signal(lab.master.process, 9)  # type: ignore[arg-type]
    lost = wait_for(
        "resumable",
        lambda: e if (e := lab.store.find(entry.key)) and e.status is Status.RESUMABLE else None,
        timeout=20,
    )
    for ident in (lost.process, lost.child_process):
        if ident is not None:
            procs.send_signal(ident, 9)
            procs.wait_for_exit(ident, 5)
    return lost


def test_fire_and_followup_keep_the_envelope(scoped: Scoped) -> None:
    lab, llm, secret = scoped
    entry, fired = fire_scoped(lab, llm, secret)
    assert_envelope_held(lab, llm, secret, blocked(lab, entry.key, 2))

    llm.script(*escapes(lab, secret))
    follow = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "followup", fired.job.id,
         "--", "One more chore."],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert follow.returncode == 0, follow.stderr
    assert_envelope_held(lab, llm, secret, blocked(lab, entry.key, 4))


@pytest.mark.any_pi
def test_resume_keeps_the_envelope(scoped: Scoped) -> None:
    lab, llm, secret = scoped
    entry, _fired = fire_scoped(lab, llm, secret)
    blocked(lab, entry.key, 2)
    orphan(lab, entry)
    new_master = lab.start_master(session="boss2")
    llm.script(*escapes(lab, secret))
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", entry.key, "--json", "--parent-pid",
         str(new_master.pid), "--parent-session", "boss2", "--socket", lab.socket],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    host = procs.identify(json.loads(done.stdout)["hostPid"])
    if host is not None:
        lab.started.append(host)
    assert_envelope_held(lab, llm, secret, blocked(lab, entry.key, 4))


@pytest.mark.parametrize("relaunch", ["detached", "tmux"])
@pytest.mark.any_pi
def test_a_new_masters_relaunch_keeps_the_envelope(scoped: Scoped, relaunch: str) -> None:
    lab, llm, secret = scoped
    entry, _fired = fire_scoped(lab, llm, secret)
    blocked(lab, entry.key, 2)
    lost = orphan(lab, entry)
    llm.script(*escapes(lab, secret))
    second = lab.start_master("boss", "goal-1", "--relaunch", relaunch, "--socket", lab.socket)
    back = wait_for(
        "the relaunched worker",
        lambda: e if (e := lab.store.find(entry.key)) and e.pid != lost.pid and e.child_pid else None,
        timeout=30,
    )
    if back.process is not None:
        lab.started.append(back.process)
    assert back.parent_pid == second.pid
    assert_envelope_held(lab, llm, secret, blocked(lab, entry.key, 4))
