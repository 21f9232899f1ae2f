"""Issue 20 items 11, 13, 14: ``$PI_MATRIX_PI_COMMAND`` is honoured wherever pi starts (a master's or
a host's ``-- pi`` as well as a profile's), a bad value is one clean line everywhere (``doctor``
too), ``doctor`` finds the pinned install of ``scripts/install-pi`` and prints settings as
settings.json spells them, and the README's test command installs that pi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDIN = [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]
PINNED = ROOT / ".pi-cli" / "bin" / "pi"  # scripts/install-pi's wrapper (pi on the node it needs)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No ``pi`` on PATH: only this Python's folder and the system's (node lives there too)."""
    env = {k: v for k, v in os.environ.items() if k != "PI_MATRIX_PI_COMMAND"}
    env.update(
        PATH=os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]), STANDIN_STEP_S="0.01"
    )
    env.update(extra)
    return env


def run(tmp_path: Path, *words: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), *words],
        capture_output=True, text=True, timeout=60, check=False, env=_env(tmp_path, **env),
        stdin=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize(
    "words",
    [
        ["master", "--headless", "--mode", "print", "--", "pi", "-p", "say hi"],
        ["host", "--mode", "print", "--", "pi", "-p", "say hi"],
    ],
    ids=["master", "host"],
)
def test_a_plain_pi_runs_the_command_the_variable_names(tmp_path: Path, words: list[str]) -> None:
    done = run(tmp_path, *words, PI_MATRIX_PI_COMMAND=json.dumps(STANDIN))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stand-in: working on: say hi" in done.stdout and "DONE" in done.stdout
    assert "cannot start" not in done.stderr


def test_with_the_matrix_off_the_plain_pi_is_still_the_variables(tmp_path: Path, isolated_env: Path) -> None:
    agent_dir = Path(os.environ["PI_CODING_AGENT_DIR"])
    agent_dir.mkdir(parents=True)
    (agent_dir / "settings.json").write_text('{"processMatrix": {"enabled": false}}')
    done = run(
        tmp_path, "host", "--mode", "print", "--", "pi", "-p", "x", PI_MATRIX_PI_COMMAND=json.dumps(STANDIN)
    )
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr


@pytest.mark.parametrize(
    "words", [["doctor"], ["doctor", "--json"], ["master", "--", "pi"], ["host", "--", "pi"]]
)
def test_a_bad_value_is_one_clean_line(tmp_path: Path, words: list[str]) -> None:
    done = run(tmp_path, *words, PI_MATRIX_PI_COMMAND="pi")
    assert "Traceback" not in done.stderr and "JSONDecodeError" not in done.stderr
    said = done.stdout + done.stderr
    assert "PI_MATRIX_PI_COMMAND" in said and "not a JSON array of strings" in said, said
    if words[0] == "doctor":
        assert done.returncode == 0  # pi is not a required check
    else:
        assert done.returncode == 2 and not (tmp_path / "state").exists()


def test_doctor_finds_the_pinned_install_and_never_suggests_an_unpinned_one(tmp_path: Path) -> None:
    if not PINNED.exists():
        pytest.skip("no .pi-cli/ (run scripts/install-pi)")
    done = run(tmp_path, "doctor")
    line = next(line for line in done.stdout.splitlines() if line.split()[1:2] == ["pi"])
    assert str(PINNED) in line and "not found;" in line, done.stdout
    assert f"PI_MATRIX_PI_COMMAND='{json.dumps([str(PINNED)])}'" in done.stdout
    assert "npm install -g" not in done.stdout
    ok = run(tmp_path, "doctor", "--json", PI_MATRIX_PI_COMMAND=json.dumps([str(PINNED)]))
    checks = {c["check"]: c for c in json.loads(ok.stdout)["checks"]}
    # Issue 29.4: the version against the supported range, and pi's node against its engines.node.
    assert checks["pi"]["ok"] and "1.6.0 (supported: 0.73.1 … 1.6.x)" in checks["pi"]["detail"], checks
    node = checks["pi's node"]
    assert node["ok"] and "pi 1.6.0 needs node >=22.19.0" in node["detail"], node


def test_doctor_prints_settings_as_settings_json_spells_them(tmp_path: Path) -> None:
    done = run(tmp_path, "doctor")
    settings = done.stdout.split("settings (agent dir", 1)[1]
    assert "enabled              true " in settings and "forkEnvironment      {}" in settings
    assert "True" not in settings and "None" not in settings


def test_the_readme_test_command_installs_the_pinned_pi() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run the tests", 1)[1].split("\n## ", 1)[0]
    command = "bash scripts/install-pi && bash scripts/install-ts && python -m pytest -n 4"
    assert command in section
    assert ".pi-cli/" in section and "skipped" in section
    # CI runs the same command, step by step (the README's test command is the one CI runs); a
    # step may have its output sent aside or its status kept (``>log &``, ``|| main=$?``).
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for step in command.split(" && "):
        assert any(line == step or line.startswith((f"{step} >", f"{step} ||")) for line in ci), step


def test_the_command_is_applied_once_even_when_it_starts_with_pi() -> None:
    """A profile's ``pi`` is resolved as the launch is built, and the host resolves its argv again
    as it starts it: a command that itself starts with ``pi`` must not be prefixed twice."""
    from pi_tmux_matrix.programs import agent_argv

    env = {"PI_MATRIX_PI_COMMAND": json.dumps(["pi", "--offline"])}
    once = agent_argv(["pi", "-p", "x"], env)
    assert once == ["pi", "--offline", "-p", "x"] and agent_argv(once, env) == once
    env = {"PI_MATRIX_PI_COMMAND": json.dumps(["/opt/pi/bin/pi"])}
    assert agent_argv(["pi", "-p", "x"], env) == ["/opt/pi/bin/pi", "-p", "x"]
    assert agent_argv(["claude", "-p", "x"], env) == ["claude", "-p", "x"]
    assert agent_argv(["pi"], {}) == ["pi"]
