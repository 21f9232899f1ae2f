"""Issue 20 item 8: one exit-code rule. Every verb's refusals, as docs/cli.md's table lists them,
exit with the code the table gives (usage 2, not found 3, any other refusal 1), and the table
covers every verb a person types."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import make_entry, plant_job, run_main

from pi_tmux_matrix.cli.app import build_parser
from pi_tmux_matrix.cli.base import public_verbs
from pi_tmux_matrix.errors import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    Ambiguous,
    NoMaster,
    NotFound,
    exit_code_for,
)
from pi_tmux_matrix.matrix.store import MatrixStore

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
JOB = "job-20261205-071800-a1b2c3"
ROW = re.compile(r"^\| ([a-z-]+) \| `(.+)` \| (\d) \|$")


def documented() -> list[tuple[str, str, int]]:
    section = DOC.read_text().split("### Refusals, verb by verb", 1)[1]
    rows = [ROW.match(line) for line in section.splitlines()]
    return [(m[1], m[2], int(m[3])) for m in rows if m]


def test_the_table_covers_every_verb() -> None:
    verbs = {name for name, _ in public_verbs(build_parser())}
    listed = {verb for verb, _, _ in documented()}
    assert verbs <= listed, f"verbs without a documented refusal: {sorted(verbs - listed)}"
    for verb, command, _ in documented():
        assert command.split()[0] == verb, command


@pytest.mark.parametrize("row", documented(), ids=lambda row: row[1])
def test_every_documented_refusal_exits_as_the_table_says(
    store: MatrixStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: tuple[str, str, int]
) -> None:
    _verb, command, code = row
    monkeypatch.setenv("PI_MATRIX_TMUX_SOCKET", f"no-server-{tmp_path.name}")
    store.create(make_entry("ab1"))
    store.create(make_entry("ab2"))
    plant_job(store, JOB, tmp_path)
    plant_job(store, "job-20261205-071900-d4e5f6", tmp_path)
    words = shlex.split(command.replace("<dead>", "worker-ab1").replace("<job>", JOB))
    got, _out, err = run_main("--state-dir", str(store.root), *words)
    assert got == code, f"{command}: exit {got}, the table says {code}\n{err}"
    assert err.startswith("pi-matrix: error: "), err


def test_one_function_gives_the_code_of_every_error() -> None:
    assert exit_code_for(NoMaster("fire")) == EXIT_FAILED
    assert exit_code_for(NotFound("worker-x")) == EXIT_NOT_FOUND
    assert exit_code_for(Ambiguous("KEY", "w", ["a", "b"])) == EXIT_USAGE
    assert exit_code_for(SystemExit(2)) == EXIT_USAGE
    assert exit_code_for(OSError("disk full")) == EXIT_FAILED
