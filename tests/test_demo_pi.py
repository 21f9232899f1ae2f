"""Issue 20 item 12 (the demo part): ``demo --agent pi`` takes the user's model provider into its
scratch agent dir, or says what is missing before it starts anything."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pi_tmux_matrix.cli.app import Io
from pi_tmux_matrix.cli.demo import Demo

STANDIN = [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]


def test_without_a_provider_the_demo_says_so_before_it_starts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PI_MATRIX_PI_COMMAND"] = json.dumps(STANDIN)  # a pi that is found: only the provider lacks
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "demo", "--agent", "pi"],
        capture_output=True, text=True, timeout=120, check=False, env=env, stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no model provider for pi" in done.stderr and "docs/real-provider.md" in done.stderr
    assert done.stdout == "" and time.monotonic() - began < 20


def test_the_users_provider_goes_into_the_demos_agent_dir(tmp_path: Path) -> None:
    user = Path(os.environ["PI_CODING_AGENT_DIR"])
    user.mkdir(parents=True)
    (user / "models.json").write_text('{"providers": {"p": {"baseUrl": "http://127.0.0.1:9/v1"}}}')
    (user / "auth.json").write_text('{"p": {"type": "api_key", "key": "sk-x"}}')
    mine = {
        "defaultProvider": "p",
        "defaultModel": "m",
        "processMatrix": {"enabled": True, "heartbeatMs": 99999},
    }
    (user / "settings.json").write_text(json.dumps(mine))
    root = tmp_path / "demo"
    root.mkdir()
    demo = Demo(Io(io.StringIO(), io.StringIO()), root, "pi")
    demo.setup()
    scratch = root / "agent"
    assert (scratch / "models.json").read_text() == (user / "models.json").read_text()
    assert (scratch / "auth.json").read_text() == (user / "auth.json").read_text()
    assert (scratch / "auth.json").stat().st_mode & 0o777 == 0o600
    settings = json.loads((scratch / "settings.json").read_text())
    assert (settings["defaultProvider"], settings["defaultModel"]) == ("p", "m")
    assert settings["processMatrix"]["heartbeatMs"] == 1000  # the demo's own, not the user's
