"""The dispatcher with the real pi CLI (pinned, from npm) against a fake LLM on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_llm import FakeLLM, write_pi_agent_dir
from pi_support import pi_bin
from test_dispatch import Lab, wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.matrix.model import Status


@pytest.fixture
def pilab(tmp_path: Path, tmux_socket: str) -> Iterator[tuple[Lab, FakeLLM]]:
    binary = pi_bin()
    with FakeLLM() as llm:
        lab = Lab(tmp_path, tmux_socket)
        write_pi_agent_dir(lab.agent_dir, llm.base_url)
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        lab.env.update(
            PI_MATRIX_PI_COMMAND=json.dumps([binary]),
            PI_OFFLINE="1",
            NO_PROXY="127.0.0.1,localhost",
            TMPDIR=str(tmp),
        )
        try:
            yield lab, llm
        finally:
            lab.cleanup()


def test_a_fired_pi_worker_answers_through_the_fake_llm_and_its_job_completes_once(
    pilab: tuple[Lab, FakeLLM],
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
    results = [p.name for p in (lab.state / "results").iterdir() if not p.name.startswith(".")]
    assert results == [f"{fired.job.id}.{agent.agent_id}.1.json"]
    print(f"real pi worker: DONE after {time.monotonic() - started:.1f}s")


def _events(lab: Lab, key: str, name: str) -> list[dict[str, object]]:
    path = lab.state / "events" / f"{key}.jsonl"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [r for r in (json.loads(line) for line in lines) if r.get("event") == name]


def test_the_bridge_reports_pi_identity_writes_the_result_artifact_and_delivers_the_parent_lost_notice(
    pilab: tuple[Lab, FakeLLM],
) -> None:
    lab, llm = pilab
    master = lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)

    ready = wait_for(
        "the bridge's identity report", lambda: _events(lab, agent.key, "bridge_ready"), timeout=30
    )
    assert ready[0]["session_id"] == agent.session_id  # pi's own id is the matrix's
    assert ready[0]["session_file"] == agent.session_file
    header = json.loads(Path(agent.session_file or "").read_text().splitlines()[0])
    assert header["id"] == agent.session_id

    wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    results = wait_for("the result artifact", lambda: _events(lab, agent.key, "agent_result"), timeout=30)
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
