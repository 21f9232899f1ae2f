"""Issue 21, start-up: a verb imports only what it needs. The budget is kept as the modules a
verb may not load (deterministic, unlike a time), plus one generous bound on the whole import time
that only catches a gross regression (``python -X importtime``)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import loaded

from pi_tmux_matrix.cli.app import MODULES, VERB_MODULES, build_parser, verb_of
from pi_tmux_matrix.cli.verbs import GROUPS, HIDDEN, SUMMARY

IMPORT_BUDGET_US = 1_500_000  # 1.5 s of imports: ten times today's, on the slowest machine


def test_the_verb_map_names_the_module_that_registers_each_verb() -> None:
    whole = build_parser()
    sub = next(a for a in whole._actions if isinstance(a, argparse._SubParsersAction))
    assert set(VERB_MODULES) | {"completion"} == set(sub.choices)
    for name in MODULES:
        parser = argparse.ArgumentParser()
        verbs = parser.add_subparsers()
        importlib.import_module(f"pi_tmux_matrix.cli.{name}").register(verbs, "")
        for verb in verbs.choices:
            assert VERB_MODULES.get(verb, "completion") == name, verb


@pytest.mark.parametrize(
    ("words", "verb"),
    [
        (["ls"], "ls"), (["--state-dir", "d", "show", "k"], "show"), (["--state-dir=d", "tree"], "tree"),
        (["--version"], None), (["--help"], None), ([], None), (["--state-dir"], None),
    ],
)  # fmt: skip
def test_the_verb_is_found_after_the_global_options(words: list[str], verb: str | None) -> None:
    assert verb_of(words) == verb


def test_version_and_ls_load_only_what_they_need(tmp_path: Path) -> None:
    state = tmp_path / "state"
    modules, done = loaded("--version", cwd=tmp_path)
    out = done.stdout
    assert out.startswith("pi-matrix ")
    assert not {"attrs", "cattrs", "pi_tmux_matrix.matrix.store", "rich"} & set(modules)
    modules, done = loaded("--state-dir", str(state), "ls", cwd=tmp_path)
    out = done.stdout
    assert out.startswith("no entries")
    heavy = {m for m in modules if m.startswith(("rich", "pluggy", "psutil", "tomllib", "tomli", "cattrs"))}
    heavy |= {m for m in modules if m.startswith(("pi_tmux_matrix.dispatch", "pi_tmux_matrix.supervise"))}
    heavy |= {m for m in modules if m.startswith("pi_tmux_matrix.cli.") and m.split(".")[-1] in MODULES}
    assert heavy <= {"pi_tmux_matrix.cli.entries"}, sorted(heavy)
    # An empty state dir is answered without the model, the store or attrs (about half of ls).
    assert not {"attrs", "pi_tmux_matrix.matrix.store", "pi_tmux_matrix.cli.listing"} & set(modules)
    assert sum(t for m, t in modules.items() if "." not in m) < IMPORT_BUDGET_US


def test_help_groups_every_verb_once_and_loads_no_verb_module(tmp_path: Path) -> None:
    """``pi-matrix --help`` for people: the verbs by group (everyday, recovery, teams and tmux,
    setup), each verb the parser has exactly once with the summary its own parser shows, the
    product's own verbs (host, complete-names) out of sight; and no verb's module loaded (it
    loaded all 15 on main: 281-443 ms)."""
    modules, done = loaded("--help", cwd=tmp_path)
    out = done.stdout
    verb_modules = {m for m in modules if m.startswith("pi_tmux_matrix.cli.") and m.split(".")[-1] in MODULES}
    assert verb_modules == set(), sorted(verb_modules)
    assert not {"attrs", "pi_tmux_matrix.matrix.store"} & set(modules)
    titles = [line for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles[:4] == ["everyday:", "recovery:", "teams and tmux:", "setup:"], titles
    whole = build_parser()
    sub = next(a for a in whole._actions if isinstance(a, argparse._SubParsersAction))
    shown = {action.dest: action.help for action in sub._choices_actions}
    assert set(shown) == set(sub.choices) - HIDDEN == set(SUMMARY)
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line[2] != " "]
    for verb, summary in shown.items():
        assert summary == SUMMARY[verb]
        assert listed.count(verb) == 1, verb
    assert not HIDDEN & set(listed)
    assert sorted(v for _title, verbs in GROUPS for v in verbs) == sorted(SUMMARY)


def test_listing_real_entries_needs_no_cattrs(tmp_path: Path) -> None:
    """Entries are read by the plain pass (plaincodec); the converter (and cattrs) is built on
    first use, which a listing of valid entries never makes."""
    from helpers import make_entry

    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    for name in ("s1", "s2"):
        store.create(make_entry(name))
    for verb in (["ls", "--json"], ["ls"], ["tree"]):
        modules, _out = loaded("--state-dir", str(store.root), *verb, cwd=tmp_path)
        assert not {m for m in modules if m.startswith("cattrs")}, verb


def test_the_fork_packages_lazy_names_are_its_rooms_own() -> None:
    from pi_tmux_matrix import fork

    for room, names in fork._ROOMS.items():
        module = importlib.import_module(f"pi_tmux_matrix.fork.{room}")
        assert tuple(module.__all__) == names, room
        for name in names:
            assert getattr(fork, name) is getattr(module, name)


def test_a_host_delivering_fork_results_loads_no_launcher() -> None:
    """What a host's beat imports for background fork results (``ForkResults``): the delivery
    room, not the launcher, the panes or the tmux dispatcher (~25 ms and ~2 MiB per host; only a
    session's shutdown, which stops its running forks, needs the panes)."""
    probe = (
        "import sys\n"
        "from pi_tmux_matrix.fork.deliver import due, mark_delivered, runs_stamp, undelivered\n"
        "print(sorted(m for m in sys.modules if m.startswith('pi_tmux_matrix')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    modules = set(eval(done.stdout))
    launcher = {"pi_tmux_matrix.fork.launch", "pi_tmux_matrix.fork.panes", "pi_tmux_matrix.dispatch.tmux"}
    assert not launcher & modules, sorted(launcher & modules)


def _both_listings(root: Path, shape: str) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """``ls`` through its empty-dir answer and through the full listing, each as (exit, out, err)."""
    import io as _io

    from pi_tmux_matrix.cli import entries, listing
    from pi_tmux_matrix.cli.base import Io
    from pi_tmux_matrix.errors import PiMatrixError, exit_code_for

    results = []
    for command in (entries.cmd_ls, listing.cmd_ls):
        out, err = _io.StringIO(), _io.StringIO()
        args = argparse.Namespace(state_dir=str(root), json=shape == "json", ndjson=shape == "ndjson")
        try:
            code = command(args, Io(out, err, 100))
        except PiMatrixError as exc:
            code, err = exit_code_for(exc), _io.StringIO(str(exc))
        results.append((code, out.getvalue(), err.getvalue()))
    return results[0], results[1]


def _tree(root: Path, case: str) -> None:
    import os

    if case == "absent":
        return
    root.mkdir(mode=0o700)
    if case == "reserved dirs and a write in flight":
        for name in ("locks", "events", "jobs", "quarantine"):
            (root / name).mkdir()
        (root / ".worker-a.json.tmp").write_text("{")
    elif case == "a foreign file":
        (root / "notes.txt").write_text("x")
    elif case == "a reserved name as a file":
        (root / "events").write_text("x")
    elif case == "a symlink named like a reserved dir":
        (root.parent / "elsewhere").mkdir()
        os.symlink(root.parent / "elsewhere", root / "runs")
    elif case == "a corrupt entry":
        (root / "worker-a.json").write_text("{")
    elif case == "a state dir others may enter":
        root.chmod(0o755)


@pytest.mark.parametrize("shape", ["text", "json", "ndjson"])
@pytest.mark.parametrize(
    "case",
    [
        "absent", "empty", "reserved dirs and a write in flight", "a foreign file",
        "a reserved name as a file", "a symlink named like a reserved dir", "a corrupt entry",
        "a state dir others may enter",
    ],
)  # fmt: skip
def test_the_empty_state_dir_answer_is_the_full_listings_word_for_word(
    tmp_path: Path, case: str, shape: str
) -> None:
    """``ls`` answers an empty state dir without loading the listing; anything the listing would
    show or report (or refuse) goes to the listing, so both say the same."""
    root = tmp_path / "state"
    _tree(root, case)
    quick, full = _both_listings(root, shape)
    assert quick == full
