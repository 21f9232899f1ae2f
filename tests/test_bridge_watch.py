"""Issue 19, event-driven delivery on pi's side: the bridge follows its notices file by inotify
(``fs.watch``); its 250 ms poll is only the safety net. bridge.ts runs in node through pi's own
loader against a stand-in for pi's extension API (our seam) whose ``setInterval`` does nothing:
with no poll at all, a notice appended to the file still reaches ``sendUserMessage``, and
with the watch gone too it would never arrive."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from pi_support import bridge_harness, pi_jiti, pi_temp, read_line

from pi_tmux_matrix.bridge import bridge_path

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too


def test_a_notice_reaches_pi_as_it_is_appended_with_no_poll_at_all(tmp_path: Path) -> None:
    jiti = pi_jiti()
    state = tmp_path / "state"
    (state / "mailbox").mkdir(parents=True)
    notices = state / "mailbox" / "worker-t1.agent.jsonl"  # not there yet: the folder is watched
    script = tmp_path / "harness.mjs"
    script.write_text(bridge_harness(bridge_path(), poll=False))
    modules = jiti.parent.parent.parent  # .pi-cli/node_modules: what pi's loader resolves from
    env = dict(
        os.environ, NODE_PATH=str(modules), TMPDIR=pi_temp(tmp_path), PI_MATRIX_KEY="worker-t1",
        PI_MATRIX_STATE_DIR=str(state), PI_MATRIX_MAILBOX=str(notices),
    )  # fmt: skip
    proc = subprocess.Popen(
        ["node", str(script)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert read_line(proc, 60) == {"ready": True}
        line = {"type": "prompt", "message": "hello", "at": int(time.time() * 1000), "id": "n1"}
        with notices.open("a") as handle:  # the file is created by this first append
            handle.write(json.dumps(line) + "\n")
        assert read_line(proc, 10) == {"sent": "[pi-matrix prompt] hello"}, "the notice never reached pi"
    finally:
        proc.kill()
        proc.wait(10)
