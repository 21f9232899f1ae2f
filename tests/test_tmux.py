"""TmuxServer against a real tmux, each test on its own private socket (killed when it ends)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

import pytest
from waiting import wait_for

from pi_tmux_matrix.dispatch.tmux import Pane, TmuxServer
from pi_tmux_matrix.errors import ContractError, TmuxUnavailable

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (these tests drive a real tmux)"
)

T = TypeVar("T")

HOSTILE = [
    "; rm -rf ~",
    "$(id)",
    "`id`",
    "a'b\"c",
    "line1\nline2",
    "ends;",
    "ends\\;",
    ";",
    "#{pane_id}",
    "-x",
    "",
]


def read_when_written(path: Path, what: str = "the pane's record") -> str:
    def probe() -> str | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return text if text.endswith("\n") else None

    return wait_for(what, probe)


def recorder(out: Path, *, then: str = "time.sleep(60)") -> list[str]:
    """A pane command recording its argv, cwd and a few env vars as one JSON line, then idling."""
    code = (
        "import json, os, sys, time; "
        "data = {'argv': sys.argv[2:], 'cwd': os.getcwd(), "
        "'env': {k: v for k, v in os.environ.items() if k.startswith('PM_TEST_')}}; "
        "open(sys.argv[1] + '.tmp', 'w').write(json.dumps(data) + '\\n'); "
        f"os.rename(sys.argv[1] + '.tmp', sys.argv[1]); {then}"
    )
    return [sys.executable, "-c", code, str(out)]


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def launch(server: TmuxServer, argv: list[str], tmp_path: Path, **changes: object) -> Pane:
    fields: dict[str, object] = {
        "session": "pm",
        "window_name": "agent",
        "cwd": str(tmp_path),
        "env": {},
        "tags": {},
    }
    fields.update(changes)
    return server.launch(argv, **fields)  # type: ignore[arg-type]


def test_launch_runs_argv_verbatim_in_cwd(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    cwd = tmp_path / "dir with space #{x} ;"
    cwd.mkdir()
    out = tmp_path / "record.json"
    pane = launch(server, [*recorder(out), *HOSTILE], tmp_path, cwd=str(cwd), window_name="w #{pane_id};")
    record = json.loads(read_when_written(out))
    assert record["argv"] == HOSTILE
    assert record["cwd"] == str(cwd)
    assert pane.pane_id.startswith("%")
    assert pane.window_id.startswith("@")
    assert pane.session == "pm"
    assert pane.window_name == "w #{pane_id};"
    assert not pane.dead
    assert pane.target == f"pm:w #{{pane_id}}; ({pane.pane_id})"
    # The pane's process is argv itself: no shell in between.
    assert Path(f"/proc/{pane.pane_pid}/exe").resolve() == Path(sys.executable).resolve()


def test_env_items_reach_the_pane_process(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    env = {
        "PM_TEST_A": "v; $(id) 'q' \"d\"",
        "PM_TEST_B": "",
        "PM_TEST_C": "ends;",
        "PM_TEST_D": "#{pane_id}",
    }
    out = tmp_path / "record.json"
    pane = launch(server, recorder(out), tmp_path, env=env)
    read_when_written(out)
    seen = environ_of(pane.pane_pid)
    assert {k: seen.get(k) for k in env} == env


def test_scrubbed_names_never_reach_a_pane_of_a_server_it_starts(
    tmux_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PM_TEST_SECRET", "leak")
    monkeypatch.setenv("PM_TEST_OWN", "leak")
    monkeypatch.setenv("PM_TEST_KEPT", "kept")
    server = TmuxServer(tmux_socket, scrub_env=["PM_TEST_SECRET", "PM_TEST_OWN"])
    out = tmp_path / "record.json"
    pane = launch(server, recorder(out), tmp_path, env={"PM_TEST_OWN": "mine"})
    record = json.loads(read_when_written(out))
    assert record["env"] == {"PM_TEST_OWN": "mine", "PM_TEST_KEPT": "kept"}
    assert "PM_TEST_SECRET" not in environ_of(pane.pane_pid)
    shown = subprocess.run(
        ["tmux", "-L", tmux_socket, "show-environment", "-g"], capture_output=True, text=True, check=True
    )
    assert "PM_TEST_SECRET" not in shown.stdout


def test_scrubbed_names_are_removed_from_a_server_someone_else_started(
    tmux_socket: str, tmp_path: Path
) -> None:
    # A server (and session) started by a client whose environment carries the variables.
    dirty = {**os.environ, "PM_TEST_SECRET": "leak", "PM_TEST_KEPT": "kept"}
    subprocess.run(
        ["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "pm", "--", "sleep", "60"],
        env=dirty,
        check=True,
        timeout=10,
    )
    subprocess.run(
        ["tmux", "-L", tmux_socket, "set-environment", "-t", "=pm", "PM_TEST_SECRET", "session-leak"],
        check=True,
        timeout=10,
    )
    server = TmuxServer(tmux_socket, scrub_env=["PM_TEST_SECRET"])
    out = tmp_path / "record.json"
    launch(server, recorder(out), tmp_path)
    record = json.loads(read_when_written(out))
    assert record["env"] == {"PM_TEST_KEPT": "kept"}  # only the named variables are removed


def test_tags_round_trip_through_panes(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    tags = {"@pi_matrix_key": "worker-abc", "pi_matrix_job": "j-1 #{pane_id} 'x' ;"}
    pane = launch(server, ["sleep", "60"], tmp_path, tags=tags)
    expected = (("@pi_matrix_job", "j-1 #{pane_id} 'x' ;"), ("@pi_matrix_key", "worker-abc"))
    assert pane.tags == expected
    listed = server.panes()
    assert [p.pane_id for p in listed] == [pane.pane_id]
    assert listed[0] == pane
    assert listed[0].tag("pi_matrix_key") == "worker-abc"
    assert listed[0].tag("@pi_matrix_job") == "j-1 #{pane_id} 'x' ;"
    assert listed[0].tag("@pi_matrix_nope") is None
    untagged = launch(server, ["sleep", "60"], tmp_path, window_name="plain")
    assert server.pane(untagged.pane_id) == untagged
    assert untagged.tags == ()


@pytest.mark.parametrize("name", ["key", "@other_key", "@pi_matrix_", "@pi_matrix_a b", "@pi_matrix_tags"])
def test_bad_tag_names_are_refused_before_anything_runs(tmux_socket: str, tmp_path: Path, name: str) -> None:
    server = TmuxServer(tmux_socket)
    with pytest.raises(ContractError, match="tag"):
        launch(server, ["sleep", "60"], tmp_path, tags={name: "v"})
    assert not server.reachable()


def test_second_launch_is_a_new_window_in_the_same_session(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    first = launch(server, ["sleep", "60"], tmp_path, window_name="one")
    second = launch(server, ["sleep", "60"], tmp_path, window_name="two")
    assert first.session == second.session == "pm"
    assert first.window_id != second.window_id
    assert first.pane_id != second.pane_id
    assert {p.pane_id for p in server.panes()} == {first.pane_id, second.pane_id}
    assert server.has_session("pm")
    assert not server.has_session("p")  # exact names: no prefix match
    sessions = subprocess.run(
        ["tmux", "-L", tmux_socket, "list-sessions", "-F", "#{session_name}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sessions.stdout.split() == ["pm"]


def test_kill_pane_then_pane_is_none(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    keep = launch(server, ["sleep", "60"], tmp_path, window_name="keep")
    gone = launch(server, ["sleep", "60"], tmp_path, window_name="gone")
    assert server.kill_pane(gone.pane_id) is True
    assert server.pane(gone.pane_id) is None
    assert server.kill_pane(gone.pane_id) is False
    assert server.pane(keep.pane_id) == keep


def test_no_server_is_unreachable_not_empty(tmux_socket: str) -> None:
    server = TmuxServer(tmux_socket)
    assert server.reachable() is False
    with pytest.raises(TmuxUnavailable) as caught:
        server.panes()
    assert caught.value.socket == tmux_socket
    with pytest.raises(TmuxUnavailable):
        server.pane("%0")
    with pytest.raises(TmuxUnavailable):
        server.has_session("pm")
    with pytest.raises(TmuxUnavailable):
        server.kill_pane("%0")
    with pytest.raises(TmuxUnavailable):
        server.capture("%0")
    server.kill_server()  # nothing to kill: no error


def test_a_server_answering_with_no_pane_gives_empty_not_unavailable(tmux_socket: str) -> None:
    subprocess.run(
        ["tmux", "-L", tmux_socket, "start-server", ";", "set-option", "-s", "exit-empty", "off"],
        check=True,
        timeout=10,
    )
    server = TmuxServer(tmux_socket)
    assert server.reachable() is True
    assert server.panes() == []
    assert server.pane("%0") is None
    assert server.has_session("pm") is False
    assert server.kill_pane("%0") is False
    server.kill_server()
    assert server.reachable() is False


def test_pipe_pane_sends_output_to_the_command(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    go = tmp_path / "go"
    # The pane prints only once the pipe is attached, so nothing races the test.
    speak = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
        "print('MARK-' + 'piped', flush=True); time.sleep(60)"
    )
    speaker = [sys.executable, "-c", speak, str(go)]
    pane = launch(server, speaker, tmp_path)
    out = tmp_path / "out #{pane_id} 'q' $(x) ;.bin"
    copy = (
        "import sys\n"
        "with open(sys.argv[1], 'ab', buffering=0) as f:\n"
        "    for chunk in iter(lambda: sys.stdin.buffer.read1(4096), b''): f.write(chunk)"
    )
    sink = [sys.executable, "-c", copy, str(out)]
    server.pipe_pane(pane.pane_id, sink)
    go.touch()
    wait_for("piped output", lambda: out.exists() and b"MARK-piped" in out.read_bytes())


def test_capture_returns_the_pane_text(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    pane = launch(
        server, [sys.executable, "-c", "import time; print('hello-' + 'capture'); time.sleep(60)"], tmp_path
    )
    wait_for("captured text", lambda: "hello-capture" in server.capture(pane.pane_id))
    assert "hello-capture" in server.capture(pane.pane_id, history=False)


def test_remain_on_exit_from_a_config_is_turned_off(tmux_socket: str, tmp_path: Path) -> None:
    subprocess.run(
        ["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "keep", "--", "sleep", "60"],
        check=True,
        timeout=10,
    )
    subprocess.run(
        ["tmux", "-L", tmux_socket, "set-option", "-g", "remain-on-exit", "on"], check=True, timeout=10
    )
    server = TmuxServer(tmux_socket)
    go = tmp_path / "go"
    waiter = [
        sys.executable,
        "-c",
        "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)",
        str(go),
    ]
    pane = launch(server, waiter, tmp_path)
    go.touch()
    wait_for("the finished pane to close", lambda: server.pane(pane.pane_id) is None)


def test_an_argv_that_finishes_at_once_still_launches(tmux_socket: str, tmp_path: Path) -> None:
    server = TmuxServer(tmux_socket)
    pane = launch(server, [sys.executable, "-c", "pass"], tmp_path, tags={"pi_matrix_key": "k"})
    assert pane.pane_id.startswith("%")
    wait_for("the server to exit with its only pane", lambda: not server.reachable())


@pytest.mark.parametrize("argv", [["sleep"], "sleep 60", [], ["sleep", "6\x000"]])
def test_launch_needs_an_argv_of_two_words(tmux_socket: str, tmp_path: Path, argv: list[str]) -> None:
    server = TmuxServer(tmux_socket)
    with pytest.raises(ValueError, match="argv"):
        launch(server, argv, tmp_path)
    assert not server.reachable()


def test_launch_refuses_a_missing_cwd(tmux_socket: str, tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="cwd"):
        launch(TmuxServer(tmux_socket), ["sleep", "60"], tmp_path, cwd=str(tmp_path / "nope"))


def test_missing_tmux_is_unavailable(
    tmux_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    server = TmuxServer(tmux_socket)
    assert server.reachable() is False
    with pytest.raises(TmuxUnavailable, match="not installed"):
        launch(server, ["sleep", "60"], tmp_path)
    with pytest.raises(TmuxUnavailable):
        server.panes()
    server.kill_server()


def fake_tmux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A ``tmux`` first on PATH that appends its argv and env to a log, then runs ``body``."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    log = tmp_path / "fake-tmux.log"
    script = bin_dir / "tmux"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n" + body
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_launch_passes_a_list_argv_after_double_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_tmux(
        tmp_path,
        monkeypatch,
        "if 'new-window' in sys.argv:\n    print('%7\\t4242\\t@3\\t0\\tpm\\t\\tagent')\n",
    )
    monkeypatch.setenv("PM_TEST_SECRET", "leak")
    server = TmuxServer("pm-test-fake", scrub_env=["PM_TEST_SECRET"])
    argv = ["agent-cli", "--flag", "ends;", "; rm -rf ~"]
    pane = launch(server, argv, tmp_path, env={"PM_TEST_K": "v"}, tags={"pi_matrix_key": "k"})
    assert pane == Pane(
        pane_id="%7", pane_pid=4242, window_id="@3", session="pm", window_name="agent", dead=False,
        tags=(("@pi_matrix_key", "k"),),
    )  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert all("PM_TEST_SECRET" not in call["env"] for call in calls)
    [call] = [call["argv"] for call in calls if "new-window" in call["argv"]]
    assert call[:2] == ["-L", "pm-test-fake"]
    # One call launches: the scrub, the new window, its options and tags, ';'-separated (a ';'
    # that is a word of argv arrives escaped, so the plain ';' words are the separators).
    start = call.index("new-window")
    end = call.index(";", start)
    assert call[start - 1] == ";" and call[end + 1] == "set-option"
    new_window = call[start:end]
    dash = new_window.index("--")
    # Words after "--" are argv, each one word; a final ';' is escaped for tmux's own parser.
    assert new_window[dash + 1 :] == ["agent-cli", "--flag", "ends\\;", "; rm -rf ~"]
    assert len(new_window[dash + 1 :]) >= 2
    head = new_window[:dash]
    assert "-d" in head
    assert head[head.index("-t") + 1] == "=pm:"
    assert head[head.index("-e") + 1] == "PM_TEST_K=v"
    assert "send-keys" not in json.dumps(calls)


def test_a_hung_tmux_is_unavailable_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tmux(tmp_path, monkeypatch, "time.sleep(30)\n")
    server = TmuxServer("pm-test-hung", timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TmuxUnavailable, match="did not answer"):
        server.panes()
    assert time.monotonic() - started < 10
    assert server.reachable() is False
