"""``pi-matrix host`` started by hand writes its pi session file's header (issue 32.13), as a fire
does: ``--session-id S --session-file F`` with no F made F's header pi's own (a random id), and
pi's first identity report through the bridge then closed the host's entry ``worker-S`` as a
session switch. Real pi against the fake model, a real host process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pi_support import pi_bin

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.testing.fake_model import FakeModel, write_pi_agent_dir

pytestmark = pytest.mark.real_pi


def test_a_host_started_by_hand_writes_the_header_of_its_new_session_file(tmp_path: Path) -> None:
    binary = pi_bin()
    work = tmp_path / "work"
    work.mkdir()
    state = tmp_path / "state"
    session_id = str(uuid.uuid4())
    session_file = tmp_path / "sessions" / "mine.jsonl"
    with FakeModel() as llm:
        write_pi_agent_dir(Path(os.environ["PI_CODING_AGENT_DIR"]), llm.base_url)
        env = dict(os.environ, PI_MATRIX_STATE_DIR=str(state), PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost")
        host = [
            sys.executable, "-m", "pi_tmux_matrix", "host", "--session-id", session_id,
            "--session-file", str(session_file), "--parent-pid", str(os.getpid()), "--mode", "print",
        ]  # fmt: skip
        agent = [binary, "-p", "-e", str(bridge_path()), "--session", str(session_file), "Say hi."]
        done = subprocess.run(
            [*host, "--", *agent], capture_output=True, text=True, env=env, cwd=work, timeout=120,
            check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    header = json.loads(session_file.read_text().splitlines()[0])
    assert header["type"] == "session" and header["id"] == session_id, header
    entry = MatrixStore(state).find(f"worker-{session_id}")
    assert entry is not None, sorted(p.name for p in state.glob("*.json"))
    assert entry.reason != "session_switched", entry
    assert entry.exit is not None and entry.exit.code == 0, entry
