"""A pi worker that died before its first turn (issue 18.11) is repaired to ``resumable`` and
relaunched as the same logical agent: same agent id and session id, a fresh session file, a wake
prompt that says the transcript was lost. Each test was seen to fail before the change."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from helpers import make_entry, make_identity
from labs import Lab
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.reconcile import ActionKind, Facts, reconcile
from pi_tmux_matrix.matrix.store import now_ms


def test_a_dead_pi_worker_without_a_session_file_is_repaired_to_resumable_not_deleted() -> None:
    entry = make_entry("a", identity=make_identity("a", cwd="/work"), generation="g-3", task_ref="goal:2")
    (action,) = reconcile([entry], Facts(now_ms=now_ms())).actions
    assert action.kind is ActionKind.MARK_RESUMABLE, action.reason
    assert action.entry.resumable is not None and action.entry.resumable.identity == entry.identity


def test_a_worker_whose_session_file_is_gone_is_relaunched_as_the_same_agent_into_a_fresh_file(
    lab: Lab,
) -> None:
    master = lab.start_master()
    fired = lab.fire("HANG work that never got a turn")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    session_file = Path(entry.identity.session_file or "")
    wait_for("the session file", session_file.exists)
    # The worker is lost (its master, then itself), and only then is its file gone: as when pi
    # never got to write its session (a live agent would write it again).
    procs.send_signal(master.process, signal.SIGKILL)  # type: ignore[arg-type]
    resumable = wait_for(
        "resumable", lambda: e if (e := lab.store.find(agent.key)) and e.status is Status.RESUMABLE else None
    )
    for ident in (resumable.process, resumable.child_process):
        procs.send_signal(ident, signal.SIGKILL)  # type: ignore[arg-type]
        procs.wait_for_exit(ident, 5)  # type: ignore[arg-type]
    session_file.unlink()
    new_master = lab.start_master(session="boss2")
    dry = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", agent.key, "--dry-run", "--json",
         "--parent-pid", str(new_master.pid), "--parent-session", "boss2", "--socket", lab.socket],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    agent_argv = plan["argv"][plan["argv"].index("--") + 1 :]
    assert agent_argv[agent_argv.index("--session") + 1] == str(session_file)
    assert any("holds no transcript" in word and "start the task again" in word for word in agent_argv)
    assert not session_file.exists()  # a dry run writes nothing

    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", agent.key, "--json",
         "--parent-pid", str(new_master.pid), "--parent-session", "boss2", "--socket", lab.socket],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid = json.loads(done.stdout)["hostPid"]
    back = wait_for(
        "the relaunched host",
        lambda: e if (e := lab.store.find(agent.key)) and e.pid == pid and e.child_pid else None,
    )
    if back.process is not None:
        lab.started.append(back.process)
    assert back.identity.agent_id == agent.agent_id and back.identity.session_file == str(session_file)
    header = json.loads(session_file.read_text().splitlines()[0])
    assert header["id"] == entry.identity.session_id
