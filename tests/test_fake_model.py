"""Issue 31.11: real pi without a model key. ``pi-matrix fake-model`` serves the bundled fake model
on 127.0.0.1 and points a pi agent dir at it; the real pi gets its answers (``ok``, or a
dispatcher task's marker); bad input is refused naming the field and the fix; and
``demo --agent pi --fake-model`` runs the main job with real pi, offline, end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Reaper
from pi_support import pi_bin, pi_temp
from tmux_support import require_tmux

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.request import marker_instruction
from pi_tmux_matrix.testing.fake_model import MARKER_CODE, FakeModel, default_reply, is_ours

SERVING = re.compile(r"fake model serving at (http://127\.0\.0\.1:(\d+)/v1)")
FOREIGN_MODELS = '{"providers": {"mine": {"baseUrl": "https://llm.example.com/v1", "apiKey": "$K"}}}'


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(TMPDIR=pi_temp(tmp), **extra)
    return env


def _run(*words: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A fake-model command that is refused: it must end at once."""
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "fake-model", *words],
        capture_output=True, text=True, timeout=30, check=False, env=_env(tmp_path), cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


class Served:
    """A running ``pi-matrix fake-model``: its URL and port once it says it serves."""

    def __init__(self, reaper: Reaper, tmp_path: Path, *words: str) -> None:
        self.log = tmp_path / f"fake-model-{time.monotonic_ns()}.log"
        self.popen = reaper.logged(
            [sys.executable, "-m", "pi_tmux_matrix", "fake-model", *words],
            self.log, cwd=tmp_path, env=_env(tmp_path),
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while (found := SERVING.search(self.output())) is None or "Ctrl-C" not in self.output():
            assert self.popen.poll() is None, self.output()
            assert time.monotonic() < deadline, f"it never said it serves:\n{self.output()}"
            time.sleep(0.05)
        self.url, self.port = found.group(1), int(found.group(2))

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit code."""
        identity = procs.identify(self.popen.pid)
        assert identity is not None
        procs.send_signal(identity, signal.SIGTERM)
        return self.popen.wait(timeout=15)


def _pi(tmp_path: Path, agent_dir: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    """The real pi, one prompt in print mode, as a person would run it after the printed exports."""
    env = _env(tmp_path, PI_CODING_AGENT_DIR=str(agent_dir), PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost")
    return subprocess.run(
        [pi_bin(), "-p", prompt], capture_output=True, text=True, timeout=120, check=False, env=env,
        cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.real_pi
def test_the_verb_serves_and_real_pi_gets_ok_then_its_marker(tmp_path: Path, reaper: Reaper) -> None:
    agent_dir = tmp_path / "fake-agent"
    served = Served(reaper, tmp_path, "--agent-dir", str(agent_dir))
    out = served.output()
    assert f"export PI_CODING_AGENT_DIR={agent_dir}\n" in out and "export PI_OFFLINE=1\n" in out
    models = json.loads((agent_dir / "models.json").read_text())
    assert is_ours(models) and models["providers"]["fake"]["baseUrl"] == served.url
    settings = json.loads((agent_dir / "settings.json").read_text())
    assert (settings["defaultProvider"], settings["defaultModel"]) == ("fake", "fake-model")

    said = _pi(tmp_path, agent_dir, "hi")
    assert said.returncode == 0, said.stdout + said.stderr
    assert said.stdout.strip() == "ok"

    # The dispatcher's own instruction (never the marker itself) is answered with its marker.
    task = f"Fix the flaky test.\n\n{marker_instruction('3f1c9a0b')}"
    said = _pi(tmp_path, agent_dir, task)
    assert said.returncode == 0, said.stdout + said.stderr
    assert said.stdout.strip().splitlines()[-1] == "DONE:3f1c9a0b"

    assert served.stop() == 0
    out = served.output()
    assert "answer 1: 'ok'" in out and "answer 2: 'Done with the task. DONE:3f1c9a0b'" in out
    assert out.rstrip().endswith("fake model stopped after 2 answer(s)")


def test_its_default_agent_dir_is_its_own_never_pis(tmp_path: Path, reaper: Reaper) -> None:
    home = Path(os.environ["HOME"])
    served = Served(reaper, tmp_path)
    assert f"export PI_CODING_AGENT_DIR={home / '.pi' / 'fake-model-agent'}\n" in served.output()
    assert is_ours(json.loads((home / ".pi" / "fake-model-agent" / "models.json").read_text()))
    assert not Path(os.environ["PI_CODING_AGENT_DIR"]).exists()  # ~/.pi/agent: untouched
    assert served.stop() == 0
    # Its own files are rewritten at the next start (the port may change): no --force needed.
    again = Served(reaper, tmp_path)
    assert again.stop() == 0


def test_a_foreign_provider_is_refused_unless_forced(tmp_path: Path, reaper: Reaper) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "models.json").write_text(FOREIGN_MODELS)
    (agent_dir / "settings.json").write_text('{"defaultProvider": "mine", "theme": "dark"}')
    done = _run("--agent-dir", str(agent_dir), tmp_path=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("pi-matrix: error: --agent-dir: ")
    assert "models.json (another provider's)" in done.stderr
    assert "settings.json (defaultProvider 'mine')" in done.stderr and "--force" in done.stderr
    assert "serving" not in done.stdout
    assert (agent_dir / "models.json").read_text() == FOREIGN_MODELS  # nothing written
    assert sorted(p.name for p in agent_dir.iterdir()) == ["models.json", "settings.json"]

    # A default provider alone (pi's own, with a key in auth.json) is refused too.
    (agent_dir / "models.json").unlink()
    done = _run("--agent-dir", str(agent_dir), tmp_path=tmp_path)
    assert done.returncode == 2 and "defaultProvider 'mine'" in done.stderr, done.stderr
    (agent_dir / "models.json").write_text(FOREIGN_MODELS)

    served = Served(reaper, tmp_path, "--agent-dir", str(agent_dir), "--force")
    assert f"kept the replaced models.json as {agent_dir}/models.json.before-fake-model" in served.output()
    assert (agent_dir / "models.json.before-fake-model").read_text() == FOREIGN_MODELS
    kept = json.loads((agent_dir / "settings.json.before-fake-model").read_text())
    assert kept["defaultProvider"] == "mine"
    assert is_ours(json.loads((agent_dir / "models.json").read_text()))
    settings = json.loads((agent_dir / "settings.json").read_text())
    assert settings["defaultProvider"] == "fake" and settings["theme"] == "dark"  # its other keys kept
    assert served.stop() == 0


@pytest.mark.parametrize("port", ["nope", "70000", "-1", "8080x", ""])
def test_a_bad_port_is_refused_naming_the_field_and_the_fix(tmp_path: Path, port: str) -> None:
    agent_dir = tmp_path / "agent"
    done = _run("--port", port, "--agent-dir", str(agent_dir), tmp_path=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"pi-matrix: error: --port: {port!r} is not a port number; give 1-65535, or 0 for any free one\n"
    )
    assert not agent_dir.exists()


def test_a_port_in_use_and_a_file_for_a_folder_are_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent_dir = tmp_path / "agent"
        done = _run("--port", str(port), "--agent-dir", str(agent_dir), tmp_path=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--port: cannot listen on 127.0.0.1:{port} (" in done.stderr
    assert "pick another port, or 0 for any free one" in done.stderr
    assert not agent_dir.exists()

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    done = _run("--agent-dir", str(a_file), tmp_path=tmp_path)
    assert done.returncode == 2
    assert f"--agent-dir: {a_file} is a file, not a folder; name a folder" in done.stderr


def test_the_shipped_server_reads_the_dispatchers_own_instruction() -> None:
    """The fake's marker pattern follows the dispatcher's words, with and without a usage file."""
    for instruction in (marker_instruction("abcdef12"), marker_instruction("abcdef12", "/u.json")):
        found = MARKER_CODE.search(instruction)
        assert found is not None and found.group(1) == "abcdef12"
        request = {"messages": [{"role": "user", "content": [{"type": "text", "text": instruction}]}]}
        assert default_reply(request).text.endswith("\nDONE:abcdef12")
    assert default_reply({"messages": [{"role": "user", "content": "hi"}]}).text == "ok"
    with FakeModel() as model:
        assert model.base_url.startswith("http://127.0.0.1:")


def test_the_demo_without_a_provider_names_the_fake_model(tmp_path: Path) -> None:
    standin = [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]  # a pi that is found
    env = _env(tmp_path, PI_MATRIX_PI_COMMAND=json.dumps(standin))
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "demo", "--agent", "pi"],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2 and "add --fake-model" in done.stderr, done.stderr
    assert done.stdout == ""


@pytest.mark.real_pi
@pytest.mark.any_pi  # a fired pi and its relaunch: test_real_pi
def test_the_demo_runs_real_pi_offline_against_the_fake_model(tmp_path: Path) -> None:
    require_tmux()
    env = _env(tmp_path, PI_MATRIX_PI_COMMAND=json.dumps([pi_bin()]))
    env.pop("NO_PROXY", None)
    env.pop("PI_OFFLINE", None)  # the demo sets both itself
    user_agent_dir = Path(env["PI_CODING_AGENT_DIR"])  # no provider at all there
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "demo", "--agent", "pi", "--fake-model"],
        capture_output=True, text=True, timeout=240, check=False, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "real pi answered by the bundled fake model at http://127.0.0.1:" in out
    steps = [
        "fire three pi agents on two lanes",
        "each pi asks the fake model and ends its round",
        "kill -9 the master",
        "a worker is lost too",
        "recovers its exact orphans",
    ]
    positions = [out.index(step) for step in steps]
    assert positions == sorted(positions)
    assert len(re.findall(r": round 1 done\n", out)) == 3, out
    assert out.count("resumable (parent_lost)") >= 3
    assert re.search(r"same key, same session file .+\.jsonl, new host pid \d+ \(was \d+\)", out)
    answered = re.search(r"the fake model answered (\d+) request\(s\)", out)
    assert answered is not None and int(answered.group(1)) >= 3
    assert not user_agent_dir.exists()  # the user's agent dir: neither read into nor written

    # Nothing left: its tmux server, its processes and its scratch folder are gone.
    socket_name = re.search(r"tmux -L (pi-matrix-demo-\d+)", out)
    assert socket_name is not None
    probe = subprocess.run(["tmux", "-L", socket_name.group(1), "ls"], capture_output=True, check=False)
    assert probe.returncode != 0
    tmp = tmp_path / "tmp"
    assert [p.name for p in tmp.iterdir() if p.name.startswith("pi-matrix-demo-")] == []
    assert _processes_mentioning(str(tmp)) == []


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or text in environ:
            found.append(int(entry.name))
    return found
