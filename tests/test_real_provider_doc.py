"""Issue 20 item 12: docs/real-provider.md takes pi from zero to a model provider. Its tested files
(``<!-- tested: NAME -->`` blocks), as written, with only the endpoint swapped for the fake
OpenAI-compatible server, make the pinned real pi answer: the key from an environment variable or
from ``auth.json``, under a host and as a fired worker in a tmux pane."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from labs import Lab
from pi_support import pi_bin, pi_temp
from tmux_support import require_tmux
from waiting import wait_for

from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.piversion import pi_info
from pi_tmux_matrix.testing.fake_model import FakeModel

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too

DOC = Path(__file__).resolve().parent.parent / "docs" / "real-provider.md"
EXAMPLE_URL = "https://llm.example.com/v1"


def documented_files() -> dict[str, dict[str, object]]:
    blocks = re.findall(r"<!-- tested: (\S+) -->\n```json\n(.*?)```", DOC.read_text(), re.DOTALL)
    return {name: json.loads(body) for name, body in blocks}


def write_agent_dir(agent_dir: Path, base_url: str, *, auth: bool) -> None:
    files = documented_files()
    if not dollar_syntax():
        # As the doc says for a pi before 0.77: the variable's bare name.
        provider = files["models.json"]["providers"]["my-provider"]  # type: ignore[index]
        provider["apiKey"] = provider["apiKey"].lstrip("$")
    assert set(files) == {"models.json", "auth.json", "settings.json"}
    agent_dir.mkdir(parents=True, exist_ok=True)
    models = json.dumps(files["models.json"]).replace(EXAMPLE_URL, base_url)
    assert base_url in models, "the doc's endpoint is not the example one any more"
    (agent_dir / "models.json").write_text(models)
    settings_path = agent_dir / "settings.json"
    settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    settings_path.write_text(json.dumps({**settings, **files["settings.json"]}))
    if auth:
        (agent_dir / "auth.json").write_text(json.dumps(files["auth.json"]))
        (agent_dir / "auth.json").chmod(0o600)


def dollar_syntax() -> bool:
    """Does this pi read ``$NAME`` in models.json as the variable (0.77+)? Before, a bare name."""
    return pi_info([pi_bin()]).knows((0, 77, 0))


@pytest.fixture
def llm() -> Iterator[FakeModel]:
    with FakeModel() as server:
        yield server


def _pi_env(tmp_path: Path, binary: str, **extra: str) -> dict[str, str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MY_PROVIDER_API_KEY"}
    env.update(
        PI_MATRIX_PI_COMMAND=json.dumps([binary]),
        PI_OFFLINE="1",
        NO_PROXY="127.0.0.1,localhost",
        TMPDIR=pi_temp(tmp),
    )
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("env", "Bearer sk-from-env"),
        ("auth.json", "Bearer sk-your-key"),
        ("unset", "Bearer MY_PROVIDER_API_KEY"),
    ],
)
def test_the_documented_files_reach_the_provider_under_a_host(
    tmp_path: Path, llm: FakeModel, how: str, expected: str
) -> None:
    binary = pi_bin()
    agent_dir = Path(os.environ["PI_CODING_AGENT_DIR"])
    write_agent_dir(agent_dir, llm.base_url, auth=how == "auth.json")
    extra = {"MY_PROVIDER_API_KEY": "sk-from-env"} if how == "env" else {}
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), "host",
         "--mode", "print", "--", "pi", "-p", "Say hello."],
        capture_output=True, text=True, timeout=120, check=False, env=_pi_env(tmp_path, binary, **extra),
        stdin=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    if how == "unset" and dollar_syntax():
        # The doc's warning, today's pi: it stops before asking the provider.
        assert done.returncode != 0 and "No API key found" in done.stdout + done.stderr
        assert llm.authorizations == []
        return
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"
    assert llm.authorizations == [expected]  # "unset", pi < 0.77: the variable's name as the key
    assert llm.requests[0]["model"] == "my-model"


@pytest.mark.any_pi
def test_a_fired_worker_in_tmux_reads_the_key_from_auth_json(
    tmp_path: Path, tmux_socket: str, llm: FakeModel
) -> None:
    require_tmux()
    binary = pi_bin()
    lab = Lab(tmp_path, tmux_socket)
    try:
        write_agent_dir(lab.agent_dir, llm.base_url, auth=True)
        lab.env = _pi_env(tmp_path, binary, PI_MATRIX_STATE_DIR=str(lab.state), STANDIN_STEP_S="0.05")
        lab.env.pop("MY_PROVIDER_API_KEY", None)
        lab.start_master()
        fired = lab.fire("Say hello.", profile="pi-worker")
        (agent,) = fired.job.agents
        result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=90)
        assert result.kind is ResultKind.DONE
        assert set(llm.authorizations) == {"Bearer sk-your-key"}
    finally:
        lab.cleanup()
