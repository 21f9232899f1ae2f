"""``pi-matrix top`` on a real terminal: a private tmux server runs it and ``capture-pane`` reads
the screen a person would see (issue 6 acceptance; issue 20 items 2-6)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from helpers import make_entry, make_identity, spawn_registered_parent, spawn_sleeper
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity, Role
from pi_tmux_matrix.matrix.mailbox import EventLog
from pi_tmux_matrix.matrix.model import DirectiveKind, Status
from pi_tmux_matrix.matrix.store import MatrixStore

ELLIPSIS = "…"
SGR = re.compile(r"\x1b\[([0-9;:]*)m")


class Top:
    """``pi-matrix top`` in a private tmux server of ``width`` x ``height``."""

    def __init__(
        self, socket: str, store: MatrixStore, width: int, height: int, *args: str, env: tuple[str, ...] = ()
    ) -> None:
        self.socket = socket
        argv = [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "top", *args]
        self.tmux(
            "new-session", "-d", "-x", str(width), "-y", str(height), "-s", "top",
            "-e", "TERM=xterm-256color", *(f"-e{e}" for e in env), " ".join(argv) + "; sleep 30",
        )  # fmt: skip

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True)
        return done.stdout

    def screen(self, escapes: bool = False) -> list[str]:
        text = self.tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "top")
        return text.split("\n")

    def keys(self, text: str) -> None:
        """``text`` written to the terminal in one go, as a fast typist or a held key sends it."""
        self.tmux("send-keys", "-t", "top", "-l", text)

    def special(self, name: str) -> None:
        self.tmux("send-keys", "-t", "top", name)

    def wait(self, what: str, probe: Callable[[list[str]], bool], timeout: float = 15.0) -> list[str]:
        """The screen once ``probe`` says yes of it."""
        return wait_for(
            what,
            lambda: lines if probe(lines := self.screen()) else None,
            timeout,
            detail=lambda: "the screen:\n" + "\n".join(self.screen()),
            step=0.1,
        )

    def text(self, needle: str, timeout: float = 15.0) -> list[str]:
        return self.wait(repr(needle), lambda lines: any(needle in line for line in lines), timeout)

    def selected(self) -> str:
        """The plain text of the highlighted (reverse video) row below the table's header."""
        raw, plain = self.screen(escapes=True), self.screen()
        marked = [i for i, line in enumerate(raw) if any("7" in m.split(";") for m in SGR.findall(line))]
        header = next(i for i, line in enumerate(plain) if line.startswith("KEY"))
        rows = [i for i in marked if i > header]
        assert len(rows) == 1, "\n".join(raw)
        return plain[rows[0]]


@pytest.fixture
def top(tmux_socket: str, store: MatrixStore) -> Callable[..., Top]:
    def start(width: int = 80, height: int = 24, *args: str, env: tuple[str, ...] = ()) -> Top:
        return Top(tmux_socket, store, width, height, *args, env=env)

    return start


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def _uuid_matrix(store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]) -> list[str]:
    """A master with three workers and an orphan, all with 43-character keys, two sharing their
    first 9 id characters, the first worker's host alive; the keys in table order."""
    master = str(uuid.uuid4())
    store.create(make_entry(master, role=Role.MASTER))
    host = spawn_sleeper()
    sleepers.append(host)
    ident = procs.identify(host.pid)
    sessions = [
        "7b31747a4" + str(uuid.uuid4())[9:],
        "7b31747a5" + str(uuid.uuid4())[9:],
        "c" + str(uuid.uuid4())[1:],
    ]
    for i, session in enumerate(sessions):
        entry = make_entry(
            session, identity=make_identity(session, lane=f"lane-{i}"), status=Status.RESUMABLE,
            task_ref=f"TASK-{i}", parent_session_id=master, process=ident if i == 0 else None,
        )  # fmt: skip
        store.create(entry)
    orphan = str(uuid.uuid4())
    store.create(make_entry(orphan, identity=make_identity(orphan), parent_session_id="gone"))
    return [f"master-{master}", *(f"worker-{s}" for s in sessions), f"worker-{orphan}"]


def _shown_keys(lines: list[str]) -> list[str]:
    return [m.group(0) for line in lines if (m := re.search(r"(master|worker)-[0-9a-f-]+…?", line))]


def test_at_80x24_the_table_shows_more_than_key_status_alive_with_unique_prefix_keys(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    keys = _uuid_matrix(store, sleepers)
    view = top(80, 24)
    lines = view.text("KEY")
    shown = _shown_keys(lines)
    assert len(shown) == len(keys), lines
    for token in shown:  # item 2: never cut mid-key without an ellipsis; each prefix names one key
        assert token.endswith(ELLIPSIS), lines
        assert len([k for k in keys if k.startswith(token[:-1])]) == 1, (token, lines)
    header = next(line for line in lines if line.startswith("KEY"))
    for column in ("STATUS", "ALIVE", "CPU%", "RSS", "AGE", "LANE"):  # item 6
        assert column in header, lines
    assert any("5 agents: 1 master, 4 workers" in line and "resumable 3" in line for line in lines), lines
    assert view.tmux("display-message", "-p", "-t", "top", "#{alternate_on}").strip() == "1"
    alive_row = next(line for line in lines if keys[1][:15] in line)
    assert re.search(r"\byes\s+\d+\.\d\s+\d+(\.\d)?[KMG]\b", alive_row), alive_row  # CPU % and RSS


def test_colours_on_a_terminal_and_none_with_no_color(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    _uuid_matrix(store, sleepers)
    colour = re.compile(r"^(3[0-7]|38|9[0-7])$")
    painted = top(80, 24)
    painted.text("KEY")
    raw = "\n".join(painted.screen(escapes=True))
    assert any(colour.match(p) for m in SGR.findall(raw) for p in m.split(";")), raw
    painted.tmux("kill-server")
    # The server leaves asynchronously: a client that reaches it meanwhile fails.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = subprocess.run(["tmux", "-L", painted.socket, "ls"], capture_output=True, check=False)
        if probe.returncode != 0:
            break
        time.sleep(0.05)
    plain = top(80, 24, env=("NO_COLOR=1",))
    plain.text("KEY")
    raw = "\n".join(plain.screen(escapes=True))
    assert not any(colour.match(p) for m in SGR.findall(raw) for p in m.split(";")), raw
    assert any("7" in m.split(";") for m in SGR.findall(raw))  # the selection still shows


def test_at_160x40_keys_are_whole(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    keys = _uuid_matrix(store, sleepers)
    lines = top(160, 40).text("TMUX")
    for key in keys:
        assert any(key in line for line in lines), (key, lines)


def test_top_once_on_a_pipe_keeps_every_key_whole_at_any_width(
    store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    keys = _uuid_matrix(store, sleepers)
    for columns in ("80", "200"):
        piped = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "top", "--once"],
            capture_output=True, text=True, timeout=30, check=True, stdin=subprocess.DEVNULL,
            env={"COLUMNS": columns, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert ELLIPSIS not in piped.stdout and "\x1b[" not in piped.stdout
        for key in keys:
            assert re.search(rf"(^|\s){re.escape(key)}\s", piped.stdout, re.MULTILINE), piped.stdout


def test_a_burst_of_keys_moves_one_row_per_key(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    keys = _uuid_matrix(store, sleepers)
    view = top(80, 24)
    view.text("KEY")
    assert keys[0][:15] in view.selected()
    view.keys("jjj")  # item 3: three keys in one read are three moves
    view.wait("the third worker selected", lambda _: keys[3][:15] in view.selected())
    view.keys("kk")
    view.wait("the first worker selected", lambda _: keys[1][:15] in view.selected())
    for _ in range(4):  # a held key: repeats as fast as tmux forwards them
        view.special("j")
    view.wait("the orphan selected", lambda _: keys[4][:15] in view.selected())
    view.tmux("send-keys", "-t", "top", "Up", "Up", "Up", "Down")  # escape sequences back to back
    view.wait("the second worker selected", lambda _: keys[2][:15] in view.selected())


def test_column_widths_hold_between_redraws_while_the_rows_change(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    keys = _uuid_matrix(store, sleepers)
    long = store.update(keys[3], lambda e: attrs.evolve(e, status=Status.WINDING_DOWN, task_ref="TASK-22"))
    view = top(80, 24)
    lines = view.text("winding_down")
    header = next(line for line in lines if line.startswith("KEY"))
    store.update(long.key, lambda e: attrs.evolve(e, status=Status.RUNNING, task_ref="T2"))
    lines = view.wait("the change drawn", lambda ls: not any("winding_down" in line for line in ls))
    assert next(line for line in lines if line.startswith("KEY")) == header  # item 6: no jumping


def test_enter_opens_the_detail_pane_and_slash_filters(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    keys = _uuid_matrix(store, sleepers)
    log = EventLog(store, keys[2])
    log.write("registered", pid=123)
    log.write("tool_blocked", tool="write", path="/etc/passwd", reason="outside the lane")
    view = top(80, 24)
    view.text("KEY")
    view.keys("jj")
    view.special("Enter")
    lines = view.text(f"detail: {keys[2]}")
    for needle in ("session file", "tmux target", "last events", "registered", "tool_blocked", "blocked "):
        assert any(needle in line for line in lines), (needle, lines)
    view.special("Escape")
    view.text("KEY")
    view.keys("/lane-2")
    view.special("Enter")
    # The filter applies while it is typed: the one-row table can be drawn before Enter
    # is, so wait for the closed filter's status line too.
    lines = view.wait(
        "the filtered table",
        lambda ls: len(_shown_keys(ls)) == 1 and any("filter /lane-2" in line for line in ls),
    )
    assert _shown_keys(lines)[0].startswith(keys[3][:15]), lines


def test_adopt_asks_inline_without_enter_while_the_view_keeps_redrawing(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    dead_master = ProcessIdentity(pid=999_999, start_ticks=1, boot_id=procs.boot_id())
    store.create(make_entry("m-old", role=Role.MASTER, process=dead_master))
    for name, lane in (("w1", "lane-a"), ("w2", "lane-b")):
        host = spawn_sleeper()
        sleepers.append(host)
        entry = make_entry(
            name, identity=make_identity(name, lane=lane), process=procs.identify(host.pid),
            status=Status.RESUMABLE, parent_pid=dead_master.pid, parent_session_id="m-old",
            parent_proc_start=1,
        )  # fmt: skip
        store.create(entry)
    new_master = spawn_registered_parent(store.root, "m-new")
    sleepers.append(new_master)
    view = top(80, 24, "--parent-pid", str(new_master.pid), "--parent-session", "m-new")
    view.text("worker-w2")
    view.keys("j")
    view.keys("a")  # on the master row: nothing to adopt
    view.text("select a worker first")
    view.keys("j")  # to master-m-old's first worker; any key clears the last message
    view.wait("the message cleared", lambda ls: not any("select a worker" in line for line in ls))
    view.keys("a")
    question = "adopt worker-w1 (lane lane-a) into master-m-new (pid"
    view.text(question)
    store.create(make_entry("w3", identity=make_identity("w3")))
    view.text("worker-w3", timeout=5)  # the view redraws while the question waits
    assert any(question in line for line in view.screen())
    assert store.get("worker-w1").directive is None
    view.keys("y")  # one key, no Enter
    view.text("adoption granted: worker-w1")
    granted = store.get("worker-w1")
    assert granted.status is Status.ADOPTED
    assert granted.directive is not None and granted.directive.kind is DirectiveKind.ADOPT
    assert (granted.directive.parent_pid, granted.directive.parent_session_id) == (new_master.pid, "m-new")
    assert store.get("worker-w2").directive is None
    view.keys("j")
    view.keys("a")
    view.text("adopt worker-w2")
    view.keys("n")
    lines = view.text("cancelled")
    assert not any("error" in line for line in lines)
    assert store.get("worker-w2").directive is None
    view.keys("q")
    view.wait("top to exit", lambda ls: not any("KEY" in line for line in ls))
    assert view.tmux("display-message", "-p", "-t", "top", "#{alternate_on}").strip() == "0"


def test_outside_a_master_adopt_says_what_it_needs_then_offers_the_running_master(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    store.create(
        make_entry("w1", identity=make_identity("w1"), status=Status.RESUMABLE, parent_session_id="gone")
    )
    view = top(80, 24)
    view.text("worker-w1")
    view.keys("ja")
    lines = view.text("needs a running master")
    said = " ".join(lines)
    assert "pi-matrix master" in said and "--parent-pid" in said and "no calling master" not in said
    view.keys("r")
    view.text("resume needs a running master")
    master = spawn_registered_parent(store.root, "m-new")
    sleepers.append(master)
    view.text("master-m-new")
    view.keys("j")  # the master row is first now; back to the worker
    view.keys("a")
    view.text(f"adopt worker-w1 (lane -) into master-m-new (pid {master.pid})? y/N")
    view.keys("y")
    view.text("adoption granted: worker-w1")
    granted = store.get("worker-w1")
    assert granted.directive is not None and granted.directive.parent_session_id == "m-new"


def test_top_without_a_terminal_prints_one_plain_snapshot(store: MatrixStore, tmp_path: Path) -> None:
    store.create(make_entry("m1", role=Role.MASTER))
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "top"],
        capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "master-m1" in done.stdout and "\x1b[" not in done.stdout
    assert "1 agent: 1 master, 0 workers" in done.stdout


def test_usage_is_instant_and_of_exactly_that_process(sleepers: list[subprocess.Popen[bytes]]) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 30: pass"],
        stdin=subprocess.DEVNULL,
    )
    sleepers.append(busy)
    ident = procs.identify(busy.pid)
    assert ident is not None
    time.sleep(0.5)
    started = time.monotonic()
    got = procs.usage(ident)
    # No sampling interval (a redraw never waits for one): generous, so a loaded machine passes.
    assert time.monotonic() - started < 1.0
    assert got is not None
    # The busy loop's CPU time grows as it is scheduled: on a loaded machine, slower.
    deadline = time.monotonic() + 20
    while got is not None and got[0] <= 0.1 and time.monotonic() < deadline:
        time.sleep(0.1)
        got = procs.usage(ident)
    assert got is not None
    seconds, rss, lived = got
    assert seconds > 0.1 and rss > 1 << 20 and lived >= 0.4
    reused = ProcessIdentity(pid=busy.pid, start_ticks=ident.start_ticks + 1, boot_id=ident.boot_id)
    assert procs.usage(reused) is None  # a pid that now names another process counts nothing


def _real_worker(store: MatrixStore, parent: subprocess.Popen[bytes], name: str) -> subprocess.Popen[bytes]:
    """A real ``pi-matrix host`` of worker session ``name`` under ``parent`` (a registered master),
    its agent a ``sleep``: it reads its mailbox and its entry's directives as any worker does."""
    parent_id = procs.identify(parent.pid)
    assert parent_id is not None
    env = {
        **os.environ, "PI_MATRIX_STATE_DIR": str(store.root), "PI_PARENT_PID": str(parent.pid),
        "PI_PARENT_START": str(parent_id.start_ticks), "PI_PARENT_SESSION": "boss",
    }  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "pi_tmux_matrix", "host", "--session-id", name, "--mode", "print",
         "--", "sleep", "60"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def test_stop_and_cleanup_ask_inline_and_do_nothing_on_n_and_end_the_worker_on_y(
    top: Callable[..., Top], store: MatrixStore, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    parent = spawn_registered_parent(store.root, "boss")
    sleepers.append(parent)
    hosts = {name: _real_worker(store, parent, name) for name in ("w1", "w2")}
    sleepers.extend(hosts.values())
    agents = {}
    for name in hosts:
        key = f"worker-{name}"
        entry = wait_for(f"{key}'s agent", lambda k=key: (e := store.find(k)) and e.child_pid and e)
        agents[name] = entry.child_process
    try:
        view = top(80, 24)
        view.text("worker-w2")
        stop_question = "stop worker-w1 (lane -) (request, then SIGTERM, then SIGKILL)? y/N"
        for key, name, question, done in (
            ("s", "w1", stop_question, "stop requested"),
            ("c", "w2", "clean up worker-w2 (lane -) gracefully? y/N", "cleanup requested"),
        ):
            view.keys("j")
            view.wait(f"worker-{name} selected", lambda _, n=name: f"worker-{n}" in view.selected())
            view.keys(key)
            view.text(question)
            view.keys("n")  # one key, no Enter
            view.text("cancelled")
            store.create(make_entry(f"x-{key}", identity=make_identity(f"x-{key}")))
            view.text(f"worker-x-{key}", timeout=5)  # the redraw goes on
            assert hosts[name].poll() is None and store.get(f"worker-{name}").directive is None
            assert not list((store.root / "mailbox" / f"worker-{name}").glob("*.json"))
            view.keys(key)
            view.text(question)
            view.keys("y")
            view.text(f"{done}: worker-{name}")
            assert hosts[name].wait(timeout=20) is not None  # the host stopped its agent and ended
            ended = store.get(f"worker-{name}")
            assert ended.exit is not None and ended.exit.kind.value == "killed", ended
            assert not procs.is_alive(agents[name])
        assert "error" not in " ".join(view.screen())
    finally:
        for agent in agents.values():
            if agent is not None:
                procs.send_signal(agent, 9)
