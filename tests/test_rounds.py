"""Issue 19: a round's outcome travels at once. An interactive worker's DONE/BLOCKED marker hands
off when it is printed (not when the agent is stopped later), a later stop is no second,
contradicting handoff; ``send`` refuses an agent nobody would take the message for; a non-pi
master prints each handoff once, on a line of its own. Real hosts, real tmux on private sockets,
the stand-in agent; stored entries of an older pi-matrix still load."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from labs import Lab
from model_script import last_conversation
from pilabs import MLab, idle_pi_master, notices_posted
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import AgentIdentityContract, Mode, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.codec import decode_entry, encode_entry, unstructure_entry
from pi_tmux_matrix.matrix.mailbox import round_message
from pi_tmux_matrix.matrix.model import Entry, ExitKind, ExitRecord, Outcome, Status
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.supervise.bridge_reports import BridgeReports
from pi_tmux_matrix.supervise.record import OwnRecord
from pi_tmux_matrix.supervise.rounds import ARTIFACT_WAIT_S, Rounds
from pi_tmux_matrix.testing.fake_model import MARKER_CODE, Reply

CUSTOM_STANDIN = (
    '[profile]\nname = "standin-custom"\nprovider = "custom"\n'
    'command = ["{python}", "-m", "pi_tmux_matrix.testing.standin", "{task}"]\nmode = "interactive"\n'
    "deadline = 120\n"
)
CUSTOM_PRINT = (
    '[profile]\nname = "standin-custom-print"\nprovider = "custom"\n'
    'command = ["{python}", "-m", "pi_tmux_matrix.testing.standin", "-p", "{task}"]\nmode = "interactive"\n'
    "deadline = 120\n"
)


@pytest.fixture
def rlab(lab: Lab) -> Lab:
    """The Lab with the stand-in as a custom-provider worker (interactive and print)."""
    folder = lab.agent_dir / "launch_profiles"
    folder.mkdir(exist_ok=True)
    (folder / "standin-custom.toml").write_text(CUSTOM_STANDIN)
    (folder / "standin-custom-print.toml").write_text(CUSTOM_PRINT)
    return lab


def cli(lab: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pi_tmux_matrix", *words]
    return subprocess.run(argv, env=lab.env, capture_output=True, text=True, timeout=60, check=False)


def events(lab: Lab, key: str) -> list[dict[str, Any]]:
    path = lab.state / "events" / f"{key}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the stored outcome ------------------------------------------------------------------------------
def _worker_entry() -> Entry:
    me = procs.current()
    identity = AgentIdentityContract(
        agent_id="a1", session_id="s1", cwd="/tmp", provider="pi", mode=Mode.INTERACTIVE
    )
    entry = lifecycle.new_entry(
        role=Role.WORKER, identity=identity, process=me, now=1, parent_pid=me.pid, parent_session_id="boss",
    )  # fmt: skip
    return entry


def test_outcomes_of_an_agents_end_and_an_old_crashed_handoff_still_loads_as_failed() -> None:
    assert Outcome.of_exit(ExitRecord(kind=ExitKind.EXITED, at=1, code=0)) is Outcome.EXITED
    assert Outcome.of_exit(ExitRecord(kind=ExitKind.EXITED, at=1, code=3)) is Outcome.FAILED
    assert Outcome.of_exit(ExitRecord(kind=ExitKind.CRASHED, at=1, signal=9)) is Outcome.FAILED
    assert Outcome.of_exit(ExitRecord(kind=ExitKind.KILLED, at=1, code=0)) is Outcome.KILLED
    assert Outcome.of_exit(ExitRecord(kind=ExitKind.TIMED_OUT, at=1)) is Outcome.TIMED_OUT
    ended = lifecycle.record_terminal(_worker_entry(), ExitRecord(kind=ExitKind.CRASHED, at=2, signal=9), 2)
    raw = unstructure_entry(ended)
    assert raw["handoffs"][0]["outcome"] == "failed"
    raw["handoffs"][0]["outcome"] = "crashed"  # as an older pi-matrix wrote it
    loaded, _ = decode_entry(json.dumps(raw).encode(), ended.key)
    assert loaded.handoffs[0].outcome is Outcome.FAILED and loaded.handoffs[0].signal == 9
    raw["handoffs"][0]["outcome"] = "vanished"
    with pytest.raises(ValueError, match="expected one of"):
        decode_entry(json.dumps(raw).encode(), ended.key)


def test_a_round_hands_off_while_running_and_the_later_end_records_no_second_handoff() -> None:
    entry = _worker_entry()
    rounded = lifecycle.record_round(entry, Outcome.DONE, 5, summary="the answer", result_pointer="/x")
    assert rounded is not None and rounded.status is Status.RUNNING
    (handoff,) = rounded.undelivered
    assert (handoff.outcome, handoff.summary, handoff.result_pointer) == (Outcome.DONE, "the answer", "/x")
    stop = ExitRecord(kind=ExitKind.KILLED, at=6, code=0)
    # Undelivered yet: the end waits as terminal with the round's handoff, and only that one.
    waiting = lifecycle.record_terminal(rounded, stop, 6, handoff=False)
    assert waiting.status is Status.TERMINAL and waiting.handoffs == rounded.handoffs
    assert waiting.exit == stop and waiting.reason == "killed"
    # Delivered first: the end closes the record.
    delivered = lifecycle.mark_delivered(rounded, handoff.id, 7)
    closed = lifecycle.record_terminal(delivered, stop, 8, handoff=False)
    assert closed.status is Status.CLOSED and len(closed.handoffs) == 1 and closed.exit == stop
    assert decode_entry(encode_entry(closed), closed.key)[0] == closed


def test_many_rounds_never_push_out_a_handoff_the_owner_has_not_had() -> None:
    entry = _worker_entry()
    first = lifecycle.record_round(entry, Outcome.BLOCKED, 1, summary="first")
    assert first is not None
    current = first
    for n in range(40):
        delivered = lifecycle.mark_delivered(current, current.handoffs[-1].id, n) if n else current
        nxt = lifecycle.record_round(delivered if n else current, Outcome.DONE, n + 2, summary=f"r{n}")
        assert nxt is not None
        current = nxt
    assert current.handoffs[0].summary == "first" and current.handoffs[0].delivered_at is None


# --- a marker ends the round --------------------------------------------------------------------------
@pytest.mark.parametrize("word", ["done", "blocked"])
def test_an_interactive_workers_marker_hands_off_at_once_and_a_later_stop_is_no_second_handoff(
    rlab: Lab, word: str
) -> None:
    lab = rlab
    lab.start_master()
    task = "Say hello." if word == "done" else "Say hello, BLOCKED by a question."
    fired = lab.fire(task, profile="standin-custom")
    (agent,) = fired.job.agents
    worker = lab.worker(agent.key)
    result = wait_for("the marker's result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    assert result.kind.value == word
    # The handoff comes with the marker, while the agent lives on (idle, waiting for more).
    entry = wait_for(
        "the round's handoff", lambda: (e := lab.store.get(agent.key)).handoffs and e, timeout=5,
        detail=lambda: json.dumps(events(lab, agent.key)[-8:]),
    )  # fmt: skip
    assert procs.is_alive(worker.child_process) and entry.exit is None
    (handoff,) = entry.handoffs
    assert handoff.outcome.value == word
    # Not a pi: the excerpt is what the round printed before its marker, without the marker.
    assert "stand-in: working on: Say hello" in handoff.summary and "stand-in: step 3/3" in handoff.summary
    assert f"DONE:{agent.nonce}" not in handoff.summary and f"BLOCKED:{agent.nonce}" not in handoff.summary
    if word == "blocked":
        assert "blocked: the task says BLOCKED" in handoff.summary
    assert handoff.result_pointer and Path(handoff.result_pointer).exists()
    wait_for("the master took it", lambda: lab.store.get(agent.key).handoffs[0].delivered_at, timeout=10)

    stopped = cli(lab, "stop", agent.key, "--confirm", "yes-tmux-stop")
    assert stopped.returncode == 0, stopped.stderr
    assert procs.wait_for_exit(worker.process, 20)
    final = lab.store.get(agent.key)
    assert final.exit is not None and final.exit.kind is ExitKind.KILLED  # the stop is recorded
    assert final.status is Status.CLOSED and final.reason == "killed"
    assert [h.outcome.value for h in final.handoffs] == [word], "no second, contradicting handoff"


def test_a_followup_opens_a_new_round_that_hands_off_again(rlab: Lab) -> None:
    lab = rlab
    lab.start_master()
    fired = lab.fire("Say hello.", profile="stand-in")
    (agent,) = fired.job.agents
    lab.worker(agent.key)
    wait_for("round 1's handoff", lambda: lab.store.get(agent.key).handoffs, timeout=60)
    lab.dispatcher().followup(fired.job.id, "Say it again.")
    wait_for("round 2's result", lambda: lab.result(fired.job.id, agent.agent_id, 2), timeout=60)
    entry = wait_for("round 2's handoff", lambda: len((e := lab.store.get(agent.key)).handoffs) == 2 and e)
    assert [h.outcome for h in entry.handoffs] == [Outcome.DONE, Outcome.DONE]
    second = entry.handoffs[1].summary
    assert "working on: Say it again." in second and "Say hello." not in second, second


# --- send refuses what nobody would take ----------------------------------------------------------------
def test_send_to_a_pi_whose_bridge_is_silent_exits_1_and_sends_nothing(rlab: Lab) -> None:
    lab = rlab
    lab.env["STANDIN_SILENT_BRIDGE"] = "1"
    lab.start_master()
    (agent,) = lab.fire("Say hello.", profile="stand-in").job.agents
    lab.worker(agent.key)
    wait_for(
        "the host to call the bridge silent",
        lambda: any(e.get("event") == "bridge_silent" for e in events(lab, agent.key)),
        timeout=40,
        detail=lambda: json.dumps([e.get("event") for e in events(lab, agent.key)]),
    )
    sent = cli(lab, "send", agent.key, "--prompt", "more work")
    assert sent.returncode == 1, sent.stdout
    assert "sent" not in sent.stdout and "bridge is silent" in sent.stderr
    assert "nothing was sent" in sent.stderr
    assert not list((lab.state / "mailbox" / agent.key).glob("*.json")), "nothing was queued"


def test_send_to_an_agent_whose_host_is_gone_exits_1(rlab: Lab) -> None:
    lab = rlab
    lab.start_master()
    (agent,) = lab.fire("Say hello.", profile="stand-in").job.agents
    worker = lab.worker(agent.key)
    assert worker.process is not None
    procs.send_signal(worker.process, signal.SIGKILL)
    assert procs.wait_for_exit(worker.process, 10)
    sent = cli(lab, "send", agent.key, "--prompt", "more work")
    assert sent.returncode == 1 and "sent" not in sent.stdout
    assert "not alive" in sent.stderr and "nothing" in sent.stderr


def test_send_to_an_agent_that_is_gone_while_its_host_lives_exits_1(tmp_path: Path) -> None:
    """The host is alive (waiting out its grace, say) and the agent process is gone: nobody
    would take the message, so ``send`` says the agent is not running, exit 1, queues nothing."""
    from helpers import dead_identity, make_entry, make_identity, spawn_sleeper

    store = MatrixStore(tmp_path / "state")
    host = spawn_sleeper()
    try:
        host_id, agent = procs.identify(host.pid), dead_identity()
        entry = make_entry(
            "g19", identity=make_identity("g19", mode=Mode.INTERACTIVE, provider="pi"), process=host_id,
            child_pid=agent.pid, child_proc_start=agent.start_ticks,
        )  # fmt: skip
        store.register(entry)
        for how in ("--prompt", "--steer"):
            sent = subprocess.run(
                [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "send", entry.key,
                 how, "more work"], capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert sent.returncode == 1, (how, sent.stdout, sent.stderr)
            assert "sent" not in sent.stdout and "Traceback" not in sent.stderr
            assert f"its agent (pid {agent.pid}) is not running; nothing was sent" in sent.stderr, sent.stderr
        mailbox = store.root / "mailbox" / entry.key
        assert not mailbox.exists() or not list(mailbox.glob("*.json")), "nothing was queued"
    finally:
        host.kill()
        host.wait()


# --- a bash master ---------------------------------------------------------------------------------------
def _pane(lab: Lab) -> str:
    done = subprocess.run(
        ["tmux", "-L", lab.socket, "capture-pane", "-p", "-J", "-S", "-200", "-t", "=bash:"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout


def test_a_bash_master_prints_each_handoff_once_on_a_line_of_its_own(rlab: Lab) -> None:
    lab = rlab
    argv = [
        sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--task-ref", "goal-1",
        "--", "bash", "--norc", "--noprofile",
    ]  # fmt: skip
    names = ("PATH", "HOME", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR", "PYTHONPATH", "VIRTUAL_ENV")
    env = [w for name in names if name in lab.env for w in ("-e", f"{name}={lab.env[name]}")]
    tmux = ["tmux", "-L", lab.socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "bash", "-x", "200", *env, "-e", "PS1=$ ",
         "-c", str(lab.work), "--", *argv], env=lab.env, check=True,
    )  # fmt: skip
    master = wait_for("the bash master", lambda: lab.store.find("master-boss"), timeout=30)
    lab.master = master
    lab.started.append(master.process)  # type: ignore[arg-type]
    wait_for("bash's prompt", lambda: "$" in _pane(lab), timeout=20)
    keys = []
    for task in ("Say hello.", "Say bye."):
        (agent,) = lab.fire(task, profile="standin-custom-print").job.agents
        keys.append(agent.key)
    for key in keys:
        wait_for(
            f"{key} handed off",
            lambda k=key: any(h.delivered_at for h in lab.store.get(k).handoffs),
            timeout=60,
        )
    time.sleep(2.5)  # two more master ticks: nothing printed again
    screen = _pane(lab)
    for key in keys:
        lines = [line for line in screen.splitlines() if f"handoff {key}" in line]
        assert len(lines) == 1, screen
        (line,) = lines
        assert line.startswith(f"handoff {key}: "), screen  # its own line, not the prompt's
        assert line.count(" code 0") <= 1 and ", agent " in line, line  # each thing said once


# --- real pi ----------------------------------------------------------------------------------------------
@pytest.mark.real_pi
@pytest.mark.any_pi
def test_a_pi_workers_done_reaches_its_pi_master_at_once_as_done_with_its_answer_and_a_stop_adds_nothing(
    mlab: MLab,
) -> None:
    lab, llm, _script = mlab

    def responder(request: dict[str, Any]) -> Reply:
        said = json.dumps(request.get("messages"))
        found = MARKER_CODE.search(said) if "Work out the answer" in said else None
        return Reply(text=f"The answer is 42.\nDONE:{found.group(1)}") if found else Reply(text="ok")

    llm.responder = responder
    idle_pi_master(lab, llm)
    fired = lab.fire("Work out the answer.", profile="pi-worker")
    (agent,) = fired.job.agents
    worker = lab.worker(agent.key)
    result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    assert result.kind.value == "done"
    entry = wait_for(
        "the round's handoff", lambda: (e := lab.store.get(agent.key)).handoffs and e, timeout=10
    )
    assert entry.exit is None and procs.is_alive(worker.child_process), "handed off while pi lives on"
    (handoff,) = entry.handoffs
    assert handoff.outcome is Outcome.DONE
    assert handoff.summary == "The answer is 42."  # from the bridge's artifact, the marker line dropped
    artifact = json.loads(Path(str(handoff.result_pointer)).read_text())
    assert "The answer is 42." in artifact["text"]

    def seen() -> str | None:
        said = "\n".join(last_conversation(llm))
        return said if agent.key in said else None

    said = wait_for("the handoff in the master's conversation", seen, timeout=30)
    assert "outcome: done" in said and "| The answer is 42." in said
    wait_for("marked delivered", lambda: lab.store.get(agent.key).handoffs[0].delivered_at, timeout=30)

    stopped = cli(lab, "stop", agent.key, "--confirm", "yes-tmux-stop")
    assert stopped.returncode == 0, stopped.stderr
    assert procs.wait_for_exit(worker.process, 30)
    final = lab.store.get(agent.key)
    assert final.exit is not None and final.exit.kind is ExitKind.KILLED
    assert [h.outcome for h in final.handoffs] == [Outcome.DONE] and final.status is Status.CLOSED
    time.sleep(3)  # three master ticks: nothing more is posted for that worker
    posted = [n for n in notices_posted(lab, "master-boss", "handoff") if agent.key in n["message"]]
    assert len(posted) == 1
    assert "outcome: killed" not in "\n".join(last_conversation(llm))


def test_a_prompt_while_a_rounds_answer_is_awaited_opens_the_next_round(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    record = OwnRecord(store, _worker_entry().key)
    record.register(_worker_entry())
    reports = BridgeReports(seen=True)  # a bridged pi: the round waits for its artifact
    rounds = Rounds(record, reports, record.events)
    message = round_message(
        job="job-1", round_=1, outcome="done", marker="DONE:abc123", reason="", text="pane text", path="/r"
    )
    rounds.ended(message, 100.0)
    assert rounds.pending is not None and store.get(record.key).handoffs == ()  # awaiting the artifact
    rounds.asked()  # a follow-up lands meanwhile
    rounds.ended(message, 101.0)  # the same round reported twice: nothing more
    rounds.settle(100.0 + ARTIFACT_WAIT_S)
    (handoff,) = store.get(record.key).handoffs
    assert (handoff.outcome, handoff.summary, handoff.result_pointer) == (Outcome.DONE, "pane text", "/r")
    assert not rounds.handed_off, "the follow-up's round is open: its end is a result"
    rounds.ended(message.replace('"round": 1', '"round": 2'), 200.0)
    rounds.settle(200.0, final=True)
    assert rounds.handed_off and len(store.get(record.key).handoffs) == 2
