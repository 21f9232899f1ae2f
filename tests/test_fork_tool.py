"""The `fork` tool inside pi (seed 003, issue 23): registered by the bridge in a master's pi (not
in a fork child), waited and background forks, the cap, the parent's shutdown, the cost footer.
Real pi on both sides, against the fake LLM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pilabs import MLab, PiLab, PiPair, capture, master_window, run_print_master
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.fork import INTERRUPTED, PARENT_ABORTED, RunStatus, RunStore, mark_delivered
from pi_tmux_matrix.matrix.mailbox import EventLog
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.supervise.rpc import command_for
from pi_tmux_matrix.testing.fake_model import Reply

FORK_RESULT_TYPE = "pi-matrix-fork-result"
BACKGROUND_ANSWER = "Background answer." + " More." * 500  # past a run record's 2,000-char summary


@pytest.fixture
def flab(mlab: MLab) -> PiPair:
    lab, llm, _script = mlab
    return lab, llm


def system_prompt(request: dict[str, Any]) -> str:
    messages = request.get("messages") or []
    return str(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""


def is_fork(request: dict[str, Any]) -> bool:
    return "You are a fork" in system_prompt(request)


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t.get("function", {}).get("name") for t in request.get("tools") or [] if isinstance(t, dict)}


def tool_results(request: dict[str, Any]) -> list[str]:
    found = []
    for message in request.get("messages") or []:
        if message.get("role") == "tool":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            found.append(str(content))
    return found


def last_user_text(request: dict[str, Any]) -> str:
    users = [m for m in request.get("messages") or [] if m.get("role") == "user"]
    return json.dumps(users[-1].get("content")) if users else ""


def priced(lab: PiLab) -> None:
    """The fake model with a price: 10 input + 5 output tokens a request cost $0.01 + $0.01."""
    path = lab.agent_dir / "models.json"
    models = json.loads(path.read_text())
    model = models["providers"]["fake"]["models"][0]
    model["cost"] = {"input": 1000, "output": 2000, "cacheRead": 0, "cacheWrite": 0}
    path.write_text(json.dumps(models))


def runs_of(lab: PiLab) -> list[Any]:
    return RunStore(lab.store).list()[0]


def custom_messages(session_file: Path, custom_type: str) -> list[dict[str, Any]]:
    found = []
    for line in session_file.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "custom_message" and record.get("customType") == custom_type:
            found.append(record)
    return found


@pytest.mark.real_pi
def test_the_model_forks_and_waits_the_answer_is_the_tool_result_and_the_child_has_no_fork_tool(
    flab: PiPair,
) -> None:
    lab, llm = flab

    long_answer = "The fork found 42. " + "Details. " * 1000  # longer than a run record's excerpt

    def respond(request: dict[str, Any]) -> Reply:
        if is_fork(request):
            return Reply(text=long_answer)
        if tool_results(request):
            return Reply(text="The fork said 42.")
        return Reply(tool="fork", arguments={"task": "Find the answer."})

    llm.responder = respond
    done = run_print_master(lab, "Fork one to find the answer.")
    assert done.returncode == 0, done.stdout + done.stderr
    masters = [r for r in llm.requests if not is_fork(r)]
    forks = [r for r in llm.requests if is_fork(r)]
    assert len(forks) == 1 and len(masters) == 2
    assert "fork" in tool_names(masters[0])  # the master's pi has the tool
    assert "fork" not in tool_names(forks[0])  # a fork child (PI_FORK=1) does not
    assert tool_results(masters[1]) == [long_answer]  # the whole answer is the tool result
    (run,) = RunStore(lab.store).list()[0]
    assert run.status is RunStatus.COMPLETED and run.parent_key == "master-boss"
    assert run.text is not None and run.text.startswith("The fork found 42.") and run.mode.value == "wait"
    assert len(run.text) < len(long_answer)  # the record keeps an excerpt


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_cap_refuses_a_fourth_fork_and_the_masters_end_fails_the_running_ones(
    flab: PiPair,
) -> None:
    lab, llm = flab

    def respond(request: dict[str, Any]) -> Reply:
        if is_fork(request):
            return Reply(text="too late", delay_s=120)  # still working when the master ends
        results = tool_results(request)
        if len(results) < 4:
            return Reply(
                tool="fork", arguments={"task": f"Look around, part {len(results) + 1}.", "background": True}
            )
        return Reply(text="Enough forks.")

    llm.responder = respond
    done = run_print_master(lab, "Fork four helpers.")
    assert done.returncode == 0, done.stdout + done.stderr
    final = [r for r in llm.requests if not is_fork(r)][-1]
    results = tool_results(final)
    assert all("started in the background" in r for r in results[:3]), results
    assert "3 fork(s) already running" in results[3] and "maxConcurrentForks=3" in results[3]
    runs = RunStore(lab.store).list()[0]
    assert len(runs) == 3  # the fourth was never recorded
    assert all(r.status is RunStatus.FAILED and r.error == PARENT_ABORTED for r in runs), runs


def _master_session(lab: PiLab) -> Path:
    entry = wait_for(
        "the master's pi",
        lambda: (e := lab.store.find("master-boss")) and e.child_pid and e.identity.session_file and e,
        timeout=30,
    )
    return Path(entry.identity.session_file)


@pytest.mark.real_pi
@pytest.mark.any_pi  # a message into the master: test_handoffs; the footer: test_fork_footer
def test_a_background_forks_result_arrives_once_and_the_footer_sums_the_forks_cost(
    flab: PiPair,
) -> None:
    lab, llm = flab
    priced(lab)

    def respond(request: dict[str, Any]) -> Reply:
        if is_fork(request):
            task = last_user_text(request)
            return Reply(text=BACKGROUND_ANSWER if "part 2" in task else "Waited answer.")
        results = tool_results(request)
        texts = json.dumps(request.get("messages"))
        if "Background answer." in texts:
            return Reply(text="Got the background answer.")
        if len(results) == 0:
            return Reply(tool="fork", arguments={"task": "Look, part 1."})
        if len(results) == 1:
            return Reply(tool="fork", arguments={"task": "Look, part 2.", "background": True})
        return Reply(text="Waiting for the background fork.")

    llm.responder = respond
    master_window(lab, "Fork twice.")
    session = _master_session(lab)
    wait_for(
        "the background result in the master's session",
        lambda: custom_messages(session, FORK_RESULT_TYPE),
        timeout=120,
        detail=lambda: capture(lab),
    )
    wait_for(
        "the master's answer to it",
        lambda: any(
            "Background answer." in json.dumps(r.get("messages")) for r in llm.requests if not is_fork(r)
        ),
        timeout=60,
    )
    # Two forks of one request each: $0.02 apiece.
    wait_for("the footer", lambda: "forks +$0.04" in capture(lab), timeout=30, detail=lambda: capture(lab))
    events = EventLog(lab.store, "master-boss")
    wait_for(
        "the result acknowledged",
        lambda: [
            e for e in events.tail(200) if e.get("event") == "notice_taken" and e.get("kind") == "fork_result"
        ],
        timeout=30,
    )
    time.sleep(4)  # longer than the bridge's resend delay: a second copy would be there by now
    (delivered,) = custom_messages(session, FORK_RESULT_TYPE)
    assert delivered["content"] == f"[pi-matrix fork {runs_of(lab)[1].id}] completed\n{BACKGROUND_ANSWER}"
    assert delivered["details"]["usage"]["cost"] == 0.02
    runs = RunStore(lab.store).list()[0]
    assert [r.status for r in runs] == [RunStatus.COMPLETED, RunStatus.COMPLETED]


@pytest.mark.real_pi
@pytest.mark.any_pi  # a setting of ours, read by pi-matrix
def test_cost_footer_false_shows_no_footer(flab: PiPair) -> None:
    lab, llm = flab
    priced(lab)
    (lab.work / ".pi").mkdir()
    (lab.work / ".pi" / "settings.json").write_text(json.dumps({"pi-fork": {"costFooter": False}}))
    # A project setting: pi 0.79+ asks whether to trust the folder; the master trusts it ahead.
    settings = json.loads((lab.agent_dir / "settings.json").read_text())
    settings.setdefault("processMatrix", {})["masterProjectTrust"] = "trust"
    (lab.agent_dir / "settings.json").write_text(json.dumps(settings))

    def respond(request: dict[str, Any]) -> Reply:
        if is_fork(request):
            if request["messages"][-1].get("role") == "tool":  # its bash call came back
                return Reply(text="Waited answer.")
            return Reply(tool="bash", arguments={"command": "echo looked"})
        if tool_results(request):
            return Reply(text="All done here.")
        return Reply(tool="fork", arguments={"task": "Look."})

    llm.responder = respond
    master_window(lab, "Fork once.")
    wait_for(
        "the master's last answer",
        lambda: "All done here." in capture(lab),
        timeout=120,
        detail=lambda: capture(lab),
    )
    time.sleep(1)  # the footer would be drawn by now (turn_end)
    shown = capture(lab)
    assert "forks +$" not in shown
    # The tool's own rows (renderCall, renderResult collapsed): the task, then one line of result.
    assert "fork Look." in shown
    assert re.search(r"✓ run-[0-9-]+-[0-9a-f]{6} completed · 30 tok · \$0\.0400 · fake-model", shown), shown
    assert "→ bash" not in shown  # collapsed: one line
    # Expanded (Ctrl-O): the fork's activity, then its answer.
    subprocess.run(["tmux", "-L", lab.socket, "send-keys", "-t", "=m:", "C-o"], check=True)
    expanded = wait_for(
        "the expanded row", lambda: "→ bash: echo looked" in (t := capture(lab)) and t, timeout=10
    )
    assert expanded.index("→ bash: echo looked") < expanded.index("Waited answer.")


@pytest.mark.real_pi
def test_a_worker_never_has_the_fork_tool_even_without_a_tool_list(flab: PiPair) -> None:
    """Agent-launching tools are never a worker's (the envelope's ceiling): a full-scope worker
    whose profile sets no --tools gets the bridge's fork tool registered but never active, and a
    call of it anyway is blocked; nothing is forked."""
    lab, llm = flab
    folder = lab.agent_dir / "launch_profiles"
    folder.mkdir(exist_ok=True)
    (folder / "pi-open.toml").write_text(
        '[profile]\nname = "pi-open"\nprovider = "pi"\ncommand = ["pi"]\nmode = "print"\ndeadline = 120\n'
        "write_paths = []\n"
    )
    llm.script(Reply(tool="fork", arguments={"task": "Fork anyway."}), Reply(text="I could not fork."))
    lab.start_master()
    fired = lab.fire("Try to fork.", profile="pi-open")
    (agent,) = fired.job.agents
    wait_for("the result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    first, second = llm.requests
    assert "fork" not in tool_names(first) and "read" in tool_names(first)
    (blocked,) = tool_results(second)
    assert blocked == "Tool fork not found"  # not active in a worker: pi has no such tool there
    assert not (lab.state / "runs").exists() or not list((lab.state / "runs").glob("*.json"))


@pytest.mark.real_pi
def test_escape_during_a_waited_fork_stops_it(flab: PiPair) -> None:
    """The tool call aborted (Escape in pi) stops the waited fork: the CLI it runs gets SIGINT."""
    lab, llm = flab

    def respond(request: dict[str, Any]) -> Reply:
        if is_fork(request):
            return Reply(text="too late", delay_s=60)
        return Reply(tool="fork", arguments={"task": "Take your time."})

    llm.responder = respond
    master_window(lab, "Fork a slow one.")
    wait_for("the fork's request", lambda: any(is_fork(r) for r in list(llm.requests)), timeout=60)
    (run,) = RunStore(lab.store).list()[0]
    assert run.status is RunStatus.RUNNING
    subprocess.run(["tmux", "-L", lab.socket, "send-keys", "-t", "=m:", "Escape"], check=True)
    ended = wait_for(
        "the fork stopped",
        lambda: (r := RunStore(lab.store).get(run.id)).status is not RunStatus.RUNNING and r,
        timeout=30,
    )
    assert ended.status is RunStatus.FAILED and ended.error == INTERRUPTED
    assert ended.process is not None and procs.wait_for_exit(ended.process, 10)


def test_an_rpc_agent_gets_a_background_result_as_a_follow_up_prompt() -> None:
    text = "[pi-matrix fork run-1] completed\nok"
    payload = json.dumps({"runId": "run-1", "status": "completed", "text": text})
    assert command_for("fork_result", payload) == {
        "type": "prompt",
        "message": text,
        "streamingBehavior": "followUp",
    }


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_a_background_result_that_ends_while_its_master_is_gone_arrives_once_in_the_next_one(
    flab: PiPair,
) -> None:
    """The acknowledged delivery survives a restart, as a handoff's does: the master dies while its
    background fork works; the fork ends (nobody to tell); the next master of the same session is
    told by its host until its bridge acknowledges, and the run is marked delivered."""
    lab, llm = flab

    def respond(request: dict[str, Any]) -> Reply:
        if is_fork(request):
            return Reply(text="Late background answer.", delay_s=3)
        if "Late background answer." in json.dumps(request["messages"]):
            return Reply(text="Got the late answer.")
        if tool_results(request):
            return Reply(text="Started it.")
        return Reply(tool="fork", arguments={"task": "Look slowly.", "background": True})

    llm.responder = respond
    master_window(lab, "Fork one in the background.")
    session = _master_session(lab)
    wait_for("the fork's request", lambda: any(is_fork(r) for r in list(llm.requests)), timeout=60)
    master = lab.store.get("master-boss")
    assert master.process is not None and master.child_process is not None
    # The whole master dies at once (a crash), the fork still working: one SIGKILL to the host's
    # process group, which its interactive pi shares. Killed one after the other, a host that
    # outlived its pi ended that session's forks between the two kills, as it should
    # (docs/decisions.md#a-fork-stops-with-its-parent-session); tmux continues a stopped pane
    # process, so the host cannot be held with SIGSTOP meanwhile.
    assert procs.send_signal(master.process, signal.SIGKILL, group=True)
    for identity in (master.child_process, master.process):
        assert procs.wait_for_exit(identity, 10)
    (run,) = runs_of(lab)
    ended = wait_for(
        "the fork to end", lambda: (r := RunStore(lab.store).get(run.id)).ended_at_ms and r, timeout=60
    )
    assert ended.status is RunStatus.COMPLETED and ended.delivered_at_ms is None
    assert custom_messages(session, FORK_RESULT_TYPE) == []

    master_window(lab, "--session", str(session))
    back = wait_for(
        "the new master",
        lambda: (e := lab.store.find("master-boss")) and e.pid != master.pid and e,
        timeout=30,
    )
    lab.started.extend(i for i in (back.process, back.child_process) if i is not None)
    wait_for(
        "the run marked delivered",
        lambda: RunStore(lab.store).get(run.id).delivered_at_ms is not None,
        timeout=60,
        detail=lambda: capture(lab),
    )
    time.sleep(4)  # more beats of the host: it tells no more, and the bridge would not inject twice
    (delivered,) = custom_messages(session, FORK_RESULT_TYPE)
    assert "Late background answer." in delivered["content"]
    assert delivered["details"]["runId"] == run.id


def test_marking_delivered_takes_only_real_run_ids(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    mark_delivered(store, ["../../etc/passwd", "run-nope", ""])  # what a bridge may say: nothing happens
    assert not (tmp_path / "state" / "runs").exists() or not list((tmp_path / "state" / "runs").iterdir())
