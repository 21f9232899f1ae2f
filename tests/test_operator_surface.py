"""Issue 20 item 17 (parts): ``master --once`` leaves no ``running`` record under a dead pid; the
orphan question says which dead master the worker came from; docs/cli.md lists every verb
(``fork`` and ``runs`` were missing) and docs/settings.md every setting."""

from __future__ import annotations

import json
import re
from pathlib import Path

from masterlab import MasterLab, several_orphans

from pi_tmux_matrix import procs
from pi_tmux_matrix.cli.app import build_parser
from pi_tmux_matrix.cli.base import public_verbs
from pi_tmux_matrix.settings import FIELDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_master_once_closes_its_own_record(master_lab: MasterLab) -> None:
    done = master_lab.cli("master", "--session-id", "boss", "--task-ref", "goal-1", "--once")
    assert done.returncode == 0, done.stderr
    entry = master_lab.entry("master-boss")
    assert not procs.is_alive(entry.process)
    assert (entry.status.value, entry.reason) == ("closed", "once")
    listed = json.loads(master_lab.cli("ls", "--json").stdout)
    assert [(r["key"], r["status"], r["alive"]) for r in listed] == [("master-boss", "closed", False)]
    again = master_lab.cli("master", "--session-id", "boss", "--once", "--json")  # the session is free again
    assert again.returncode == 0, again.stderr


def test_the_orphan_question_names_the_dead_master(master_lab: MasterLab) -> None:
    orphans = several_orphans(master_lab, "home", "goal-1", [("a", "lane-a")])
    old = orphans["a"][1]
    term = master_lab.pty("master", "--interactive", "--session-id", "other", "--task-ref", "goal-1")
    said = term.expect(r"worker-a: its master \(pid (\d+), session home, task goal-1\) is gone\r?\n")
    assert int(said.group(1)) == old.parent_pid
    term.expect(r"adopt worker agent-a \(lane lane-a\)\? \[y/N\] ")
    term.answer("n")
    term.expect(r"clean up worker agent-a \(lane lane-a\) gracefully\? \[y/N\] ")  # said once per worker
    term.answer("n")
    term.expect(r"orphan worker-a \(foreign, alive, agent agent-a, lane lane-a\): left")


def test_docs_cli_lists_every_verb_and_settings_every_setting() -> None:
    cli = (DOCS / "cli.md").read_text()
    rows = set(re.findall(r"^\| `([a-z-]+)[ `]", cli, re.MULTILINE))
    verbs = {name for name, _ in public_verbs(build_parser())}
    assert {"fork", "runs"} <= rows
    assert verbs <= rows, sorted(verbs - rows)
    settings = (DOCS / "settings.md").read_text()
    assert all(f"| `{key}` |" in settings for key in dict(FIELDS)), [
        key for key in dict(FIELDS) if f"| `{key}` |" not in settings
    ]
