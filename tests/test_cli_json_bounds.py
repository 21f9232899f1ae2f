"""Issue 28 case 6: every JSON the CLI reads from its user goes through the bounds entries are
read with (``strictjson.loads``: 1 MiB, nesting 32, no duplicate keys, no NaN). A value past them
is a usage error naming the argument: exit 2, one line, never a ``RecursionError`` traceback.

The inputs: ``fire --agent JSON`` (each), ``fire --agents-file FILE``, ``$PI_MATRIX_PI_COMMAND``
(every start of pi). ``settings.json`` and ``$PI_WORKER_ALLOWED_PATHS`` always went through
strictjson (a bad settings file is a warning and the defaults, by design: see test_settings.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEEP = "[" * 2000  # the issue's value: python3 -c 'print("["*2000)'


def pi_matrix(
    tmp_path: Path, *words: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), *words],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def one_usage_line(done: subprocess.CompletedProcess[str], names: str) -> str:
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"pi-matrix: error: {names}"), lines[0]
    return lines[0]


def test_the_issues_deep_agent_is_one_usage_line_naming_agent(tmp_path: Path) -> None:
    done = pi_matrix(tmp_path, "fire", "--agent", DEEP, "--", "t")
    said = one_usage_line(done, "--agent #1: ")
    assert "nested deeper than 32 levels" in said
    assert not (tmp_path / "state").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("words", "names", "why"),
    [
        (["--agent", '{"provider": "pi"}', "--agent", DEEP], "--agent #2: ", "nested deeper than 32 levels"),
        (["--agent", '{"provider": "pi", "provider": "claude"}'], "--agent #1: ", "duplicate key 'provider'"),
        (["--agent", '{"deadline": NaN}'], "--agent #1: ", "non-standard JSON constant NaN"),
        (["--agents-file", "{deep}"], "--agents-file: ", "nested deeper than 32 levels"),
        (["--agents-file", "{big}"], "--agents-file: ", "larger than 1048576 bytes"),
    ],
)
def test_every_fire_json_input_past_the_bounds_is_one_usage_line(
    tmp_path: Path, words: list[str], names: str, why: str
) -> None:
    deep, big = tmp_path / "deep.json", tmp_path / "big.json"
    deep.write_text(DEEP)
    big.write_text('[{"task": "' + "x" * (1024 * 1024) + '"}]')
    words = [{"{deep}": str(deep), "{big}": str(big)}.get(w, w) for w in words]
    done = pi_matrix(tmp_path, "fire", *words, "--", "t")
    assert why in one_usage_line(done, names)


@pytest.mark.parametrize("value", [DEEP, '["pi", ' * 40 + '"x"' + "]" * 40])
def test_a_deep_pi_command_is_one_usage_line_naming_the_variable(tmp_path: Path, value: str) -> None:
    done = pi_matrix(
        tmp_path, "fire", "--profile", "pi-worker", "--dry-run", "--parent-pid", "1", "--parent-session", "m",
        "--", "t", env={"PI_MATRIX_PI_COMMAND": value},
    )  # fmt: skip
    assert "not a JSON array of strings" in one_usage_line(done, "PI_MATRIX_PI_COMMAND: ")
