"""Issue 20 item 9: every human table (ls, tree, jobs) goes through one renderer: it fits the
terminal, keys shrink to a unique prefix with an ellipsis (whole on a pipe), one age format,
``├─``/``└─`` drawn right, colour only on a terminal and never with ``NO_COLOR``."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import uuid

import pytest
from helpers import make_entry, make_identity
from labs import Lab

from pi_tmux_matrix.cli.app import main
from pi_tmux_matrix.cli.base import Io
from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

ELLIPSIS = "…"
KEY_CELL = re.compile(r"((?:master|worker)-[0-9a-f-]+)(…?)")


def _render(store: MatrixStore, *argv: str, width: int | None) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert main(["--state-dir", str(store.root), *argv], io=Io(out, err, width=width)) == 0, err.getvalue()
    return out.getvalue()


def _matrix(store: MatrixStore) -> list[str]:
    """A master with three workers of 43-character keys, two of them sharing 9 id characters,
    an orphan, all 150 s old."""
    born = now_ms() - 150_000
    master = str(uuid.uuid4())
    store.create(make_entry(master, role=Role.MASTER, created_at=born))
    sessions = ["7b31747a4" + str(uuid.uuid4())[9:], "7b31747a5" + str(uuid.uuid4())[9:], str(uuid.uuid4())]
    for i, session in enumerate(sessions):
        entry = make_entry(
            session, identity=make_identity(session, lane=f"lane-{i}"), status=Status.RESUMABLE,
            task_ref=f"TASK-{i}-a-rather-long-task-reference", parent_session_id=master, created_at=born,
        )  # fmt: skip
        store.create(entry)
    orphan = str(uuid.uuid4())
    lone = make_entry(orphan, identity=make_identity(orphan), parent_session_id="gone", created_at=born)
    store.create(lone)
    return [f"master-{master}", *(f"worker-{s}" for s in [*sessions, orphan])]


@pytest.mark.parametrize("verb", ["ls", "tree"])
def test_at_80_columns_every_line_fits_and_keys_are_unique_prefixes_with_an_ellipsis(
    store: MatrixStore, verb: str
) -> None:
    keys = _matrix(store)
    text = _render(store, verb, width=80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    shown = [m for line in lines if (m := KEY_CELL.search(line))]
    assert len(shown) == len(keys), text
    for match in shown:
        prefix, ellipsis = match.groups()
        assert ellipsis == ELLIPSIS, text  # never cut without one
        named = [k for k in keys if k.startswith(prefix)]
        assert len(named) == 1, (prefix, text)  # a prefix that names exactly one entry
    # The two keys sharing 9 id characters are told apart, so every key keeps at least 10.
    assert len(shown[0].group(1)) >= len("worker-7b31747a4")
    assert "STATUS" in lines[0] and "ALIVE" in lines[0] and "AGE" in lines[0]


@pytest.mark.parametrize("verb", ["ls", "tree"])
def test_on_a_pipe_keys_stay_whole_and_nothing_is_cut(store: MatrixStore, verb: str) -> None:
    keys = _matrix(store)
    text = _render(store, verb, width=None)
    assert ELLIPSIS not in text
    for key in keys:
        assert key in text
    assert "TASK-0-a-rather-long-task-reference" in text


def test_one_age_format_in_ls_and_tree(store: MatrixStore) -> None:
    _matrix(store)
    for verb in ("ls", "tree"):
        text = _render(store, verb, width=None)
        assert re.search(r"\b2m\b", text), (verb, text)
        assert "150s" not in text and "age " not in text, (verb, text)


def test_tree_draws_a_tee_for_every_child_but_the_last(store: MatrixStore) -> None:
    keys = _matrix(store)
    lines = _render(store, "tree", width=None).splitlines()
    branches = [line[:3] for line in lines if line.startswith(("├─", "└─"))]
    assert branches == ["├─ ", "├─ ", "└─ ", "└─ "], lines  # three children, then the lone orphan
    assert lines[1].startswith(keys[0])
    assert any(line.startswith("(no master)") for line in lines)


def _on_a_pty(argv: list[str], env: dict[str, str]) -> str:
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "pi_tmux_matrix", *argv], env)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("verb", ["ls", "tree"])
def test_colour_only_on_a_terminal_and_never_with_no_color(store: MatrixStore, verb: str) -> None:
    _matrix(store)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="200", LINES="40")
    coloured = _on_a_pty(["--state-dir", str(store.root), verb], env)
    assert "\x1b[33m" in coloured or "\x1b[33;" in coloured, coloured  # resumable in yellow
    plain = _on_a_pty(["--state-dir", str(store.root), verb], {**env, "NO_COLOR": "1"})
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", plain), plain
    piped = _render(store, verb, width=None)
    assert "\x1b[" not in piped


def test_unique_prefix_length_is_the_shortest_that_tells_every_key_apart() -> None:
    from pi_tmux_matrix.cli.render import unique_prefix_length

    assert unique_prefix_length(["worker-abc1", "worker-abd2", "master-abc"]) == len("worker-abc")
    assert unique_prefix_length(["worker-ab", "worker-abc"]) == len("worker-ab") + 1
    assert unique_prefix_length(["worker-a"], minimum=15) == 15


def test_jobs_fits_80_columns_with_its_agents_drawn_under_it(lab: Lab) -> None:
    lab.start_master()
    fired = lab.fire("HANG a while")
    (agent,) = fired.job.agents
    args = ["jobs", "--socket", lab.socket]
    narrow = _render(lab.store, *args, width=80)
    lines = narrow.splitlines()
    assert all(len(line) <= 80 for line in lines), narrow
    assert lines[1].startswith(fired.job.id)
    assert lines[2].startswith(f"└─ {agent.agent_id}")
    # Issue 31.4: at 80 the job, its state, the agent's name and its tmux target stay whole.
    assert "TARGET" in lines[0] and agent.target is not None, narrow
    assert lines[2].rstrip().endswith(agent.target), narrow
    assert agent.key in _render(lab.store, *args, width=None)


def test_rich_is_imported_only_by_a_verb_that_prints_a_table() -> None:
    probe = "import sys, pi_tmux_matrix.cli.app; print('rich' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30
    )
    assert done.stdout.strip() == "False"  # every start of pi-matrix would pay its import
