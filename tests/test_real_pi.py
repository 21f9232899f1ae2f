"""The dispatcher with the real pi CLI (pinned, from npm) against a fake LLM on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_events
from pilabs import PiPair
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.matrix.model import Status

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too


def test_a_fired_pi_worker_answers_through_the_fake_llm_and_its_job_completes_once(
    pilab: PiPair,
) -> None:
    lab, llm = pilab
    lab.start_master()
    started = time.monotonic()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    assert entry.identity.provider == "pi" and entry.identity.session_file == agent.session_file

    result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    assert result.kind is ResultKind.DONE
    assert any("Say hello." in text for text in llm.user_texts())
    session_file = Path(agent.session_file or "")
    wait_for("pi's session file", session_file.exists)
    header = json.loads(session_file.read_text().splitlines()[0])
    assert header["type"] == "session"
    assert procs.is_alive(entry.process)  # interactive pi waits for more work
    assert lab.store.get(agent.key).status is Status.RUNNING
    time.sleep(1.0)
    results = sorted(p.name for p in (lab.state / "results").iterdir() if not p.name.startswith("."))
    # One result, and beside it the round's usage claim the bridge wrote (issue 22).
    name = f"{fired.job.id}.{agent.agent_id}.1"
    assert results == [f"{name}.json", f"{name}.usage.json"]
    print(f"real pi worker: DONE after {time.monotonic() - started:.1f}s")


def test_the_bridge_reports_pi_identity_writes_the_result_artifact_and_delivers_the_parent_lost_notice(
    pilab: PiPair,
) -> None:
    lab, llm = pilab
    master = lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)

    ready = wait_for(
        "the bridge's identity report", lambda: read_events(lab.state, agent.key, "bridge_ready"), timeout=30
    )
    assert ready[0]["session_id"] == agent.session_id  # pi's own id is the matrix's
    assert ready[0]["session_file"] == agent.session_file
    header = json.loads(Path(agent.session_file or "").read_text().splitlines()[0])
    assert header["id"] == agent.session_id

    wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    results = wait_for(
        "the result artifact", lambda: read_events(lab.state, agent.key, "agent_result"), timeout=30
    )
    artifact = json.loads(Path(str(results[0]["path"])).read_text())
    assert "DONE:" in artifact["text"] and artifact["stopReason"] == "stop"
    assert artifact["usage"] is not None

    # The master dies: the worker goes resumable and pi gets the notice as a message of its session.
    procs.send_signal(master.process, 9)  # type: ignore[arg-type]
    wait_for(
        "resumable",
        lambda: e if (e := lab.store.find(agent.key)) and e.status is Status.RESUMABLE else None,
        timeout=15,
    )
    wait_for(
        "the parent-lost notice in pi's next request",
        lambda: any("parent session" in text and "is gone" in text for text in llm.user_texts()),
        timeout=30,
    )
    assert procs.is_alive(entry.process)


def test_a_cleanup_directive_shuts_pi_down_gracefully_and_closes_the_entry(
    pilab: PiPair,
) -> None:
    lab, _llm = pilab
    master = lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the bridge", lambda: read_events(lab.state, agent.key, "bridge_ready"), timeout=30)
    procs.send_signal(master.process, 9)  # type: ignore[arg-type]
    wait_for(
        "resumable",
        lambda: e if (e := lab.store.find(agent.key)) and e.status is Status.RESUMABLE else None,
        timeout=15,
    )
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "cleanup", agent.key],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_for("the host to end", lambda: not procs.is_alive(entry.process), timeout=20)
    final = lab.store.get(agent.key)
    assert (final.status, final.reason) == (Status.CLOSED, "cleanup")
    hooks = [e["what"] for e in read_events(lab.state, agent.key, "bridge")]
    assert "session_shutdown" in hooks, "pi's session_shutdown hook ran (the bridge reports it)"
    exited = read_events(lab.state, agent.key, "child_exited")
    assert exited and exited[-1]["code"] == 0  # a clean exit, not a signal


def test_print_mode_one_shot_job_exits_zero_with_the_reply_in_its_result(pilab: PiPair) -> None:
    lab, _llm = pilab
    profile_dir = lab.agent_dir / "launch_profiles"
    profile_dir.mkdir()
    (profile_dir / "pi-print.toml").write_text(
        '[profile]\nname = "pi-print"\nprovider = "pi"\ncommand = ["pi"]\nmode = "print"\ndeadline = 120\n'
    )
    lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-print")
    (agent,) = fired.job.agents
    result = wait_for("the result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    assert result.kind in (ResultKind.DONE, ResultKind.EXITED)
    wait_for("the entry to end", lambda: lab.store.get(agent.key).exit is not None, timeout=30)
    final = lab.store.get(agent.key)
    assert final.exit is not None and final.exit.kind.value == "exited" and final.exit.code == 0
    artifacts = read_events(lab.state, agent.key, "agent_result")
    assert artifacts
    assert "DONE:" in json.loads(Path(str(artifacts[0]["path"])).read_text())["text"]
    (handoff,) = final.handoffs
    assert handoff.result_pointer == artifacts[0]["path"]


def test_a_new_master_of_the_same_session_and_task_relaunches_dead_pi_into_the_same_file(
    pilab: PiPair,
) -> None:
    lab, llm = pilab
    master = lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    lab.worker(agent.key)
    wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    session_file = Path(agent.session_file or "")
    before = session_file.read_text().splitlines()
    header = json.loads(before[0])

    # The master's own agent is hung up when its host dies; tracked for the cleanup all the same.
    running = wait_for(
        "the master's agent", lambda: e if (e := lab.store.find(master.key)) and e.child_process else None
    )
    assert running.child_process is not None
    lab.started.append(running.child_process)
    procs.send_signal(master.process, 9)  # type: ignore[arg-type]
    lost = wait_for(
        "resumable",
        lambda: e if (e := lab.store.find(agent.key)) and e.status is Status.RESUMABLE else None,
        timeout=15,
    )
    for ident in (lost.process, lost.child_process):
        procs.send_signal(ident, 9)  # type: ignore[arg-type]
        procs.wait_for_exit(ident, 5)  # type: ignore[arg-type]
    asked = len(llm.requests)

    second = lab.start_master("boss", "goal-1", "--relaunch", "tmux", "--socket", lab.socket)
    back = wait_for(
        "the relaunched pi under the new master",
        lambda: (
            e
            if (e := lab.store.find(agent.key))
            and e.pid != lost.pid
            and e.status is Status.RUNNING
            and e.parent_pid == second.pid
            and e.child_pid
            else None
        ),
        timeout=30,
    )
    if back.process is not None:
        lab.started.append(back.process)
    wait_for("the wake turn at the fake LLM", lambda: len(llm.requests) > asked, timeout=30)
    assert any("resumed in your own session" in text for text in llm.user_texts())
    wait_for(
        "the session file to grow",
        lambda: len(session_file.read_text().splitlines()) > len(before),
        timeout=30,
    )
    assert json.loads(session_file.read_text().splitlines()[0])["id"] == header["id"]
    assert back.identity.session_file == str(session_file) and back.key == agent.key


def test_an_rpc_worker_takes_prompt_steer_and_abort_through_its_host(pilab: PiPair) -> None:
    from pi_tmux_matrix.testing.fake_model import Reply

    lab, llm = pilab
    lab.start_master()
    llm.script(Reply(text=" ".join(["working"] * 30), chunk_delay_s=0.1))  # a slow first answer
    fired = lab.fire("Do the long thing.", profile="pi-rpc-worker")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the first request", lambda: len(llm.requests) >= 1, timeout=30)

    def send(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "send", agent.key, *args],
            capture_output=True, text=True, env=lab.env, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    send("--steer", "Also mention the steering word PELICAN.")
    wait_for("the steer at the fake LLM", lambda: any("PELICAN" in t for t in llm.user_texts()), timeout=30)

    def rpc_types() -> list[str]:
        return [
            str(e["data"].get("type"))
            for e in read_events(lab.state, agent.key, "rpc")
            if isinstance(e.get("data"), dict)
        ]

    wait_for("agent_start ... agent_end in the events file", lambda: "agent_end" in rpc_types(), timeout=30)
    types = rpc_types()
    assert types.index("agent_start") < types.index("agent_end")

    llm.script(Reply(text=" ".join(["slowly"] * 200), chunk_delay_s=0.1))
    ends = types.count("agent_end")
    send("--prompt", "Another long thing.")
    wait_for("the second run to start", lambda: rpc_types().count("agent_start") > ends, timeout=30)
    send("--abort")
    wait_for("the aborted run to end", lambda: rpc_types().count("agent_end") > ends, timeout=30)
    assert procs.is_alive(entry.process) and procs.is_alive(entry.child_process)  # stdin stayed open


def test_a_terminal_handoff_is_delivered_once_and_replayed_after_a_session_switch(
    pilab: PiPair,
) -> None:
    from pi_tmux_matrix.matrix.mailbox import Inbox

    lab, _llm = pilab
    profile_dir = lab.agent_dir / "launch_profiles"
    profile_dir.mkdir()
    (profile_dir / "pi-print.toml").write_text(
        '[profile]\nname = "pi-print"\nprovider = "pi"\ncommand = ["pi"]\nmode = "print"\ndeadline = 120\n'
    )
    first_out = lab.tmp / "master-1.out"

    def master(session: str, out: Path) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", session, "--task-ref", "goal-1",
            "--headless", "--mode", "print",
            "--", sys.executable, "-m", "pi_tmux_matrix.testing.standin", "-p", "HANG m",
        ]  # fmt: skip
        with out.open("wb") as sink:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                    env=lab.env, cwd=lab.work, start_new_session=True)  # fmt: skip
        ident = procs.identify(proc.pid)
        assert ident is not None
        lab.started.append(ident)
        return proc

    one = master("boss", first_out)
    m1 = wait_for(
        "master 1", lambda: e if (e := lab.store.find("master-boss")) and e.pid == one.pid else None
    )
    lab.master = m1

    # Delivered once: the worker ends, the master prints its handoff, the record closes.
    fired = lab.fire("Say hello.", profile="pi-print")
    (agent,) = fired.job.agents
    wait_for("the handoff delivered", lambda: lab.store.get(agent.key).status is Status.CLOSED, timeout=60)
    time.sleep(2.5)  # a few heartbeats: nothing is delivered twice
    assert first_out.read_text().count(f"handoff {agent.key}:") == 1

    # The owner switches sessions before the next worker ends: the handoff waits for its session.
    fired2 = lab.fire("Say hello again.", profile="pi-print")
    (agent2,) = fired2.job.agents
    Inbox(lab.store, "master-boss").post("switch", json.dumps({"sessionId": "boss-next"}), sender="test")
    wait_for("the switch", lambda: lab.store.find("master-boss-next") is not None, timeout=15)
    wait_for("the second worker's terminal record", lambda: lab.store.get(agent2.key).undelivered, timeout=60)
    time.sleep(2.5)
    assert lab.store.get(agent2.key).status is Status.TERMINAL  # not injected into the wrong session
    assert f"handoff {agent2.key}:" not in first_out.read_text()

    # A master of the original session activates: the handoff is replayed there, once.
    second_out = lab.tmp / "master-2.out"
    master("boss", second_out)
    wait_for("the replayed handoff", lambda: lab.store.get(agent2.key).status is Status.CLOSED, timeout=30)
    time.sleep(2.5)
    assert second_out.read_text().count(f"handoff {agent2.key}:") == 1
    assert f"handoff {agent2.key}:" not in first_out.read_text()
