"""``pi-matrix ls / show / repair`` as a user runs them: a real subprocess, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import dir_digest, make_entry, plant_hostile_files, run_main, spawn_sleeper

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.store import MatrixStore


def pi_matrix(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_ls_json_on_a_new_state_dir_prints_empty_array(tmp_path: Path) -> None:
    state = tmp_path / "never-made"
    done = pi_matrix("--state-dir", str(state), "ls", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert done.stderr == ""
    assert not state.exists()


def test_ls_lists_valid_entries_reports_the_rest_and_changes_nothing(
    store: MatrixStore, tmp_path: Path
) -> None:
    store.create(make_entry("good1", process=procs.current()))
    store.create(make_entry("good2"))
    outside = tmp_path / "outside"
    outside.mkdir()
    plant_hostile_files(store.root, outside)
    before = dir_digest(str(store.root))

    started = time.monotonic()
    done = pi_matrix("--state-dir", str(store.root), "ls", "--json")
    elapsed = time.monotonic() - started

    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["key"] for r in rows] == ["worker-good1", "worker-good2"]
    assert [r["alive"] for r in rows] == [True, False]  # good1 is this very test process
    assert rows[0]["schemaVersion"] == 1 and "identity" in rows[0]
    *lines, hint = done.stderr.strip().splitlines()
    assert len(lines) == 9 and all(line.startswith("pi-matrix: warning: ") for line in lines)
    assert hint.startswith("pi-matrix: hint: run 'pi-matrix repair'")  # one hint after the warnings
    for name in (
        "worker-trunc",
        "worker-junk",
        "worker-fifo",
        "worker-dir",
        "worker-link",
        "worker-other",
        "worker-big",
        "notes.txt",
        "bad name",
    ):
        assert sum(name in line for line in lines) == 1, name
    assert elapsed < 2.0 + 1.5  # the 2 s budget plus interpreter start-up on a loaded CI core
    assert dir_digest(str(store.root)) == before
    # The human table works on the same directory too.
    table = pi_matrix("--state-dir", str(store.root), "ls")
    assert table.returncode == 0
    assert "worker-good1" in table.stdout and "worker-good2" in table.stdout


def test_alive_follows_the_real_process(store: MatrixStore) -> None:
    sleeper = spawn_sleeper()
    try:
        identity = procs.identify(sleeper.pid)
        assert identity is not None
        store.create(make_entry("w1", process=identity))
        code, out, _ = run_main("--state-dir", str(store.root), "ls", "--json")
        assert code == 0 and json.loads(out)[0]["alive"] is True
    finally:
        sleeper.kill()
        sleeper.wait()
    code, out, _ = run_main("--state-dir", str(store.root), "ls", "--json")
    assert json.loads(out)[0]["alive"] is False


def test_show(store: MatrixStore) -> None:
    store.create(make_entry("w1", parent_pid=99, parent_session_id="m1", task_ref="goal:7"))
    code, out, _ = run_main("--state-dir", str(store.root), "show", "worker-w1", "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["key"] == "worker-w1" and shown["taskRef"] == "goal:7" and shown["alive"] is False
    code, out, _ = run_main("--state-dir", str(store.root), "show", "worker-w1")
    assert code == 0 and "goal:7" in out and "parent" in out


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("show", "worker-nope"), 3, "no such entry"),
        (("show", "../../etc/passwd"), 2, "not an entry key"),
        (("show",), 2, "required"),
        (("frobnicate",), 2, "invalid choice"),
    ],
)
def test_errors_are_one_line_with_an_exit_code(
    store: MatrixStore, args: tuple[str, ...], code: int, needle: str
) -> None:
    store.create(make_entry("w1"))
    done = pi_matrix("--state-dir", str(store.root), *args)
    assert done.returncode == code
    assert needle in done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr


def test_corrupt_entry_show_names_the_file_and_the_fix(store: MatrixStore) -> None:
    store.create(make_entry("w1"))
    (store.root / "worker-w1.json").write_text('{"schemaVersion": 1, "key": "worker-w1", "pid": "x"')
    done = pi_matrix("--state-dir", str(store.root), "show", "worker-w1")
    assert done.returncode == 1
    assert "worker-w1.json" in done.stderr and "pi-matrix repair" in done.stderr


def test_repair_dry_run_then_real(store: MatrixStore, tmp_path: Path) -> None:
    store.create(make_entry("good1"))
    (store.root / "worker-junk.json").write_bytes(b"\x00\xff garbage")
    before = dir_digest(str(store.root))
    code, out, _ = run_main("--state-dir", str(store.root), "repair", "--dry-run")
    assert code == 0 and "would quarantine" in out and "worker-junk.json" in out
    assert dir_digest(str(store.root)) == before
    code, out, _ = run_main("--state-dir", str(store.root), "repair", "--json")
    assert code == 0
    (action,) = json.loads(out)
    assert action["action"] == "quarantine" and Path(action["target"]).exists()
    assert Path(action["target"]).read_bytes() == b"\x00\xff garbage"  # moved, never deleted
    code, out, err = run_main("--state-dir", str(store.root), "ls", "--json")
    assert [r["key"] for r in json.loads(out)] == ["worker-good1"] and err == ""


def test_disabled_matrix_writes_nothing(tmp_path: Path, isolated_env: Path) -> None:
    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    agent.mkdir(parents=True)
    (agent / "settings.json").write_text('{"processMatrix": {"enabled": false}}')
    state = tmp_path / "state"
    before = dir_digest(str(tmp_path))
    done = pi_matrix("--state-dir", str(state), "repair")
    assert done.returncode == 2 and "enabled: is false" in done.stderr
    assert pi_matrix("--state-dir", str(state), "ls", "--json").stdout.strip() == "[]"
    assert dir_digest(str(tmp_path)) == before


def test_help_documents_exit_codes_and_version() -> None:
    done = pi_matrix("--help")
    assert done.returncode == 0
    for line in ("0  success", "2  bad input", "3  the thing named does not exist"):
        assert line in done.stdout
    assert pi_matrix("--version").stdout.startswith("pi-matrix ")


def test_state_dir_from_env(store: MatrixStore) -> None:
    store.create(make_entry("w1"))
    env = {**os.environ, "PI_MATRIX_STATE_DIR": str(store.root)}
    done = pi_matrix("ls", "--json", env=env)
    assert [r["key"] for r in json.loads(done.stdout)] == ["worker-w1"]
    # <agent dir>/state/process-matrix is the default under PI_CODING_AGENT_DIR.
    env = {**os.environ, "PI_CODING_AGENT_DIR": str(store.root.parent.parent)}
    done = pi_matrix("ls", "--json", env=env)
    assert [r["key"] for r in json.loads(done.stdout)] == ["worker-w1"]


def test_doctor_reports_checks_and_where_each_setting_comes_from(tmp_path: Path) -> None:
    import json as _json
    import os as _os
    import subprocess as _subprocess
    import sys as _sys

    agent = Path(_os.environ["PI_CODING_AGENT_DIR"])
    agent.mkdir(parents=True, exist_ok=True)
    (agent / "settings.json").write_text(_json.dumps({"processMatrix": {"heartbeatMs": 2000}}))
    done = _subprocess.run(
        [_sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), "doctor", "--json"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    report = _json.loads(done.stdout)
    names = [c["check"] for c in report["checks"]]
    assert names == ["tmux", "pidfd", "state dir", "node", "pi", "pi's fd", "pi's rg"]
    assert report["settings"]["heartbeatMs"] == {"value": 2000, "from": str(agent / "settings.json")}
    assert report["settings"]["watcherPollMs"]["from"] == "default"
    assert done.returncode == (1 if any(c["required"] and not c["ok"] for c in report["checks"]) else 0)


def test_ndjson_listings_and_shell_completion_from_the_parser(tmp_path: Path) -> None:
    import json as _json
    import subprocess as _subprocess
    import sys as _sys

    def run(*args: str) -> _subprocess.CompletedProcess[str]:
        return _subprocess.run(
            [_sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    for verb in (["ls", "--ndjson"], ["tree", "--ndjson"], ["jobs", "--ndjson"]):
        done = run(*verb)
        assert done.returncode == 0, done.stderr
        assert all(_json.loads(line) for line in done.stdout.splitlines())
    bash = run("completion", "bash")
    assert bash.returncode == 0 and "complete -o default -F _pi_matrix pi-matrix" in bash.stdout
    for verb in ("fire", "resume", "doctor", "completion"):
        assert verb in bash.stdout
    assert "--confirm" in bash.stdout and "--ndjson" in bash.stdout
    fish = run("completion", "fish")
    assert "__fish_seen_subcommand_from fire' -l profile" in fish.stdout
    checked = _subprocess.run(["bash", "-n"], input=bash.stdout, text=True, capture_output=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_the_cli_reference_in_docs_is_the_parsers_own_help() -> None:
    import subprocess as _subprocess
    import sys as _sys

    if _sys.version_info[:2] != (3, 11):
        pytest.skip("argparse's help layout differs between Python versions; the file is made on 3.11")

    root = Path(__file__).resolve().parent.parent
    done = _subprocess.run(
        [_sys.executable, "-m", "pi_tmux_matrix.cli.reference"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == (root / "docs" / "cli-reference.md").read_text(), (
        "docs/cli-reference.md is stale: python -m pi_tmux_matrix.cli.reference > docs/cli-reference.md"
    )


def test_doctor_without_tmux_says_so_and_exits_non_zero_with_the_fix(tmp_path: Path) -> None:
    import os as _os
    import subprocess as _subprocess
    import sys as _sys

    # A PATH with python but without tmux.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(_sys.executable)
    env = dict(_os.environ, PATH=str(bin_dir))
    done = _subprocess.run(
        [_sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), "doctor"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "FAIL  tmux       not found" in done.stdout
    assert "fix: install tmux" in done.stdout
