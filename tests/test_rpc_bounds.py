"""Issue 28 cases 2 and 3: what an rpc child writes is hostile input, and the events file it feeds
is bounded.

2. A tool call nested 3,000 deep (pi echoes the model's arguments on its rpc stdout) killed the
   host with ``RecursionError``: now every line is parsed with bounds, a bad line is recorded raw
   and supervision goes on. An endless line without a newline is held to a cap, never whole.
3. Each streaming ``message_update`` carries the whole message so far, and every one was
   appended to ``events/<key>.jsonl``: the file grew with the square of the answer. Now updates
   are not recorded, what is recorded is bounded, the file rotates at ``eventsMaxBytes`` (one
   old generation kept) and is read back only as a bounded tail, never blocking on a FIFO.

The real-pi tests run ``pi-matrix host --mode rpc`` around the pinned pi against the fake model;
each was seen to fail on the code before the change.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Reaper, make_entry
from hosts import Host, pi_matrix
from pi_support import pi_bin, pi_temp
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.cli.top import detail_lines
from pi_tmux_matrix.matrix.mailbox import EVENT_LINE_BYTES, EVENTS_TAIL_BYTES, EventLog, Inbox
from pi_tmux_matrix.matrix.model import ExitKind, Status
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.settings import EVENTS_MAX_BYTES
from pi_tmux_matrix.supervise import rpc
from pi_tmux_matrix.supervise.rpc import LINE_MAX_BYTES, RECORD_BYTES, RpcPipe, loggable
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply, write_pi_agent_dir

TIMINGS = {"adoptionGraceMs": 5_000, "watcherPollMs": 1_000, "heartbeatMs": 1_000}
DEEP = 3_000  # the nesting of the tool call


# --- fixtures -----------------------------------------------------------------------------------
@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def llm(isolated_env: Path) -> Iterator[FakeModel]:
    """The fake model, with pi's agent dir pointed at it and the matrix's timings at their lower
    bounds (``settings`` adds to the same file)."""
    with FakeModel() as fake:
        agent_dir = Path(os.environ["PI_CODING_AGENT_DIR"])
        write_pi_agent_dir(agent_dir, fake.base_url)
        settings(processMatrix=TIMINGS)
        yield fake


def settings(**sections: Any) -> None:
    path = Path(os.environ["PI_CODING_AGENT_DIR"]) / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = json.loads(path.read_text()) if path.exists() else {}
    document.update(sections)
    path.write_text(json.dumps(document))


def pi_host(reaper: Reaper, store: MatrixStore, work: Path, session: str, prompt: str) -> Host:
    """``pi-matrix host --mode rpc`` around the real pi (no session file, no extensions)."""
    cmd = [
        sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "host",
        "--session-id", session, "--cwd", str(work), "--provider", "pi", "--mode", "rpc",
        "--rpc-prompt", prompt, "--", pi_bin(), "--mode", "rpc", "--no-session", "--no-extensions",
    ]  # fmt: skip
    log = work.parent / f"host-{session}.log"
    tmp = work.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost", TMPDIR=pi_temp(tmp))
    popen = reaper.logged(cmd, log, cwd=work, env=env)
    return Host(popen=popen, key=f"master-{session}", session_file=work / "none", store=store, log=log)


def rpc_events(host: Host) -> list[dict[str, Any]]:
    return [e["data"] for e in host.events("rpc") if isinstance(e.get("data"), dict)]


def answers(host: Host) -> list[str]:
    """The text of every assistant message_end the host recorded."""
    found = []
    for event in rpc_events(host):
        message = event.get("message")
        mine = isinstance(message, dict) and message.get("role") == "assistant"
        if event.get("type") == "message_end" and mine:
            assert isinstance(message, dict)
            content = message.get("content")
            if isinstance(content, list):  # pi's parts; the stand-in's is a string
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            found.append(str(content))
    return found


def stop(host: Host, store: MatrixStore, work: Path) -> None:
    """Stop the agent the owner's way and see its entry end normally (killed by its owner)."""
    done = pi_matrix(store, "stop", host.key, "--confirm", "yes-tmux-stop", cwd=work)
    assert done.returncode == 0, done.stderr
    host.wait_exit(30)
    entry = host.entry()
    assert entry is not None and entry.exit is not None, host.diagnose()
    assert entry.exit.kind is ExitKind.KILLED


# === case 2: one tool call kills an rpc host =====================================================
def runs_ended(host: Host) -> int:
    """pi's agent_end lines, taken or (carrying the deep call) recorded raw."""
    return sum(
        1 for e in rpc_events(host)
        if e.get("type") == "agent_end" or str(e.get("raw", "")).startswith('{"type":"agent_end"')
    )  # fmt: skip


@pytest.mark.real_pi
@pytest.mark.parametrize("depth", [pytest.param(2_000, marks=pytest.mark.any_pi), DEEP])
def test_a_tool_call_nested_thousands_deep_is_recorded_raw_and_the_rpc_host_goes_on(
    reaper: Reaper, store: MatrixStore, work: Path, llm: FakeModel, depth: int
) -> None:
    """Python's parser recursed once per level and gave up past ~1,000. pi 0.73.1 itself copes
    with 2,000 (the model answers after the call, and the next prompt too); at the issue's 3,000
    its own next request overflows its stack, so its runs end in its error, but they end, and
    the host records them and goes on."""
    deep = '{"path": "nowhere.txt", "extra": ' + "[" * depth + "]" * depth + "}"
    llm.script(Reply(tool="read", raw_arguments=deep), Reply(text="AFTER-DEEP"), Reply(text="SECOND-ANSWER"))
    host = pi_host(reaper, store, work, f"deep{depth}", "Call the tool.")
    child = host.wait_child(reaper)

    wait_for("the run to end", lambda: runs_ended(host) == 1, timeout=60, detail=host.diagnose)
    raw = [e for e in rpc_events(host) if "raw" in e]
    assert raw, host.diagnose()
    # pi's lines that carry the call (its end, its execution, the turn, the run) are each
    # recorded raw with the parser's reason, their head as it came.
    assert all(e["error"] == f"nested deeper than {rpc.MAX_DEPTH} levels" for e in raw), raw
    assert any(e["raw"].startswith('{"type":"tool_execution_start"') for e in raw)
    assert all(len(e["raw"]) <= rpc.RAW_LINE_CHARS for e in raw)
    assert host.popen.poll() is None and procs.is_alive(child), host.diagnose()
    entry = host.entry()
    assert entry is not None and entry.status is Status.RUNNING and entry.exit is None
    if depth < DEEP:
        assert answers(host)[-1] == "AFTER-DEEP"

    # The agent keeps going: the owner's next prompt is a run of its own through the same host.
    done = pi_matrix(store, "send", host.key, "--prompt", "And now?", cwd=work)
    assert done.returncode == 0, done.stderr
    wait_for("the next run to end", lambda: runs_ended(host) == 2, timeout=60, detail=host.diagnose)
    if depth < DEEP:
        assert answers(host)[-1] == "SECOND-ANSWER"
    assert host.popen.poll() is None and procs.is_alive(child), host.diagnose()
    stop(host, store, work)


@pytest.mark.real_pi
def test_a_lone_surrogate_in_a_tool_call_is_recorded_and_the_rpc_host_goes_on(
    reaper: Reaper, store: MatrixStore, work: Path, llm: FakeModel
) -> None:
    """JSON may escape a lone surrogate ("\\ud800"), and pi writes one back that way; it parses
    to a string UTF-8 cannot encode, which failed the events line and killed the host."""
    llm.script(Reply(tool="read", raw_arguments='{"path": "odd-\\ud800.txt"}'), Reply(text="AFTER-ODD"))
    host = pi_host(reaper, store, work, "odd1", "Call the tool.")
    child = host.wait_child(reaper)
    wait_for("the answer after the tool call", lambda: "AFTER-ODD" in answers(host), timeout=60,
             detail=host.diagnose)  # fmt: skip
    started = [e for e in rpc_events(host) if e.get("type") == "tool_execution_start"]
    assert started[0]["args"] == {"path": "odd-\ud800.txt"}  # recorded as the same JSON escape
    assert host.popen.poll() is None and procs.is_alive(child), host.diagnose()
    stop(host, store, work)


def test_an_rpc_line_with_no_newline_is_held_to_its_cap_recorded_raw_and_skipped() -> None:
    recorded: list[dict[str, Any]] = []
    pipe = RpcPipe(io.StringIO(), recorded.append)
    block = b"x" * rpc.READ_BYTES
    for _ in range(3 * LINE_MAX_BYTES // len(block)):  # three caps' worth, never a newline
        pipe._consume(block)
        assert len(pipe._line) <= LINE_MAX_BYTES  # never the whole line in memory
    assert recorded == [
        {"raw": "x" * rpc.RAW_LINE_CHARS, "error": f"a line over {LINE_MAX_BYTES} bytes, skipped to its end"}
    ]
    # The rest of that line is dropped up to its newline; the next line is an event again.
    pipe._consume(b"still the long line\n" + b'{"type":"agent_start"}\n')
    assert recorded[1:] == [{"type": "agent_start"}]
    assert len(pipe._line) == 0


def test_bad_lines_of_every_kind_are_recorded_raw_and_the_next_event_still_counts() -> None:
    recorded: list[dict[str, Any]] = []
    out = io.StringIO()
    pipe = RpcPipe(out, recorded.append)
    lines = [
        b"[" * 100_000 + b"]" * 100_000,  # deep, and not an object
        b'{"type":"x","n":' + b"9" * 5000 + b"}",  # an int Python refuses to convert
        b'{"type":"x","type":"y"}',  # pi never writes a duplicate key
        b"not json \xff at all",
        (
            b'{"type":"message_end","message":{"role":"assistant",'
            b'"content":[{"type":"text","text":"ok \\ud800"}]}}'
        ),  # a lone surrogate, as JSON escapes it
    ]
    pipe._consume(b"\n".join(lines) + b"\n")
    assert [sorted(e) for e in recorded[:4]] == [["error", "raw"]] * 4
    assert "nested deeper" in recorded[0]["error"] and "unacceptable number" in recorded[1]["error"]
    assert "duplicate key" in recorded[2]["error"] and "invalid JSON" in recorded[3]["error"]
    assert recorded[4]["type"] == "message_end" and pipe.last_message == "ok \ud800"


def standin_host(reaper: Reaper, store: MatrixStore, work: Path, session: str) -> Host:
    """``pi-matrix host --mode rpc`` around the bundled stand-in (it answers "done: <prompt>")."""
    cmd = [
        sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(store.root), "host",
        "--session-id", session, "--cwd", str(work), "--provider", "pi", "--mode", "rpc",
        "--", sys.executable, "-m", "pi_tmux_matrix.testing.standin", "--mode", "rpc", "--no-session",
    ]  # fmt: skip
    log = work.parent / f"host-{session}.log"
    with open(log, "wb") as output:
        popen = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, cwd=work,
            env=dict(os.environ, STANDIN_STEP_S="0.01"), start_new_session=True,
        )  # fmt: skip
    reaper.popen(popen)
    return Host(popen=popen, key=f"master-{session}", session_file=work / "none", store=store, log=log)


def test_mailbox_messages_nested_deep_are_refused_and_the_host_goes_on(
    reaper: Reaper, store: MatrixStore, work: Path, isolated_env: Path
) -> None:
    """The host's other JSON readers (a session switch, the bridge's reports, a round's end, a
    fork's result) take their text from the mailbox: bounded too, never a RecursionError."""
    settings(processMatrix=TIMINGS)
    host = standin_host(reaper, store, work, "mail1")
    host.wait_child(reaper)
    deep = "[" * 30_000 + "]" * 30_000
    inbox = Inbox(store, host.key)
    for kind in ("switch", "identity", "result", "bridge", "round", "fork_result"):
        inbox.post(kind, deep)
    wait_for("the switch refused", lambda: host.events("switch_refused"), timeout=15, detail=host.diagnose)
    wait_for("the reports garbled", lambda: len(host.events("bridge_garbled")) == 3, timeout=15,
             detail=host.diagnose)  # fmt: skip
    wait_for("the round refused", lambda: host.events("round_refused"), timeout=15, detail=host.diagnose)
    # The fork result's payload is not JSON it takes: it goes to the agent as the text it is.
    wait_for("the fork result answered", lambda: any(a.startswith("done: [[[") for a in answers(host)),
             timeout=15, detail=host.diagnose)  # fmt: skip
    assert host.popen.poll() is None, host.diagnose()
    stop(host, store, work)


def test_the_host_rotates_its_events_file_at_the_eventsMaxBytes_setting(
    reaper: Reaper, store: MatrixStore, work: Path, isolated_env: Path
) -> None:
    settings(processMatrix={**TIMINGS, "eventsMaxBytes": CAP})
    host = standin_host(reaper, store, work, "rot2")
    host.wait_child(reaper)
    inbox = Inbox(store, host.key)
    for n in range(12):  # each answer is recorded twice (its message_end, its agent_end), ~4 KB each
        inbox.post("prompt", f"prompt {n:02d} " + "w" * 5000)
    log = EventLog(store, host.key)

    def answered() -> list[str]:
        return [str(e["data"]["message"]["content"])[:16] for e in log.tail(200)
                if e.get("event") == "rpc" and e["data"].get("type") == "message_end"]  # fmt: skip

    wait_for("the last answer", lambda: "done: prompt 11 " in answered(), timeout=30, detail=host.diagnose)
    assert log.old_path.exists(), host.diagnose()
    assert log.path.stat().st_size <= CAP and log.old_path.stat().st_size <= CAP
    stop(host, store, work)


# === case 3: one long answer floods the disk =====================================================
ANSWER_CHARS = 100_000
CAP = 64 * 1024  # eventsMaxBytes' lower bound


@pytest.mark.real_pi
def test_a_long_streamed_answer_keeps_the_events_file_linear_and_under_its_cap(
    reaper: Reaper, store: MatrixStore, work: Path, llm: FakeModel
) -> None:
    answer = ("lorem ipsum " * ANSWER_CHARS)[: ANSWER_CHARS - 8] + " THE-END"
    llm.script(Reply(text=answer, chunk_chars=1000))  # 100 KB in 100 deltas: ~11 MB of updates
    host = pi_host(reaper, store, work, "long1", "Write a lot.")
    host.wait_child(reaper)

    current = store.root / "events" / f"{host.key}.jsonl"

    def run_ended() -> bool:
        return any(e.get("type") == "agent_end" for e in rpc_events(host))

    wait_for("the run to end", run_ended, timeout=90, detail=host.diagnose)
    # The final message, the turn and the run are recorded, each bounded; the hundred streaming
    # updates (the whole message so far, each time: ~11 MB) are not. Far under the default cap
    # and under the answer's own size: the file grows with what happened, not with its square.
    size = current.stat().st_size
    assert size <= ANSWER_CHARS // 2 and size <= EVENTS_MAX_BYTES, size
    assert [e for e in rpc_events(host) if e.get("type") == "message_update"] == []
    final = [
        e["message"] for e in rpc_events(host)
        if e.get("type") == "message_end" and e["message"].get("role") == "assistant"
    ]  # fmt: skip
    assert len(final) == 1
    text = final[0]["content"][0]["text"]
    cut = f"…[{ANSWER_CHARS - rpc.RECORD_CHARS} more chars]"
    assert text.startswith("lorem ipsum") and text.endswith(cut)
    # The pane still shows the whole answer, end included (the host's own output).
    wait_for("the answer's end in the pane", lambda: "THE-END" in host.log.read_text(), timeout=10)
    shown = pi_matrix(store, "show", host.key, cwd=work)
    assert shown.returncode == 0 and host.key in shown.stdout, shown.stdout + shown.stderr
    entry = host.entry()
    assert entry is not None
    detail = "\n".join(detail_lines(store, entry, None))  # top's pane: the last events, bounded
    assert "agent_end" in detail and "…[" in detail
    stop(host, store, work)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_only_the_final_message_is_recorded_and_every_record_is_bounded() -> None:
    big = "y" * 500_000
    partial = {"role": "assistant", "content": [{"type": "text", "text": big}]}
    update = {"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": "y",
              "partial": partial}, "message": partial}  # fmt: skip
    assert loggable(update) is None
    record = loggable({"type": "message_end", "message": partial})
    assert record is not None and len(json.dumps(record)) <= RECORD_BYTES
    cut = f"…[{500_000 - rpc.RECORD_CHARS} more chars]"
    assert record["message"]["content"][0]["text"] == "y" * rpc.RECORD_CHARS + cut
    run = {"type": "agent_end", "messages": [partial] * 200}
    record = loggable(run)
    assert record is not None and len(json.dumps(record)) <= RECORD_BYTES and record["type"] == "agent_end"
    nested: Any = "leaf"
    for _ in range(100):
        nested = {"a": nested}
    record = loggable({"type": "tool_execution_start", "args": nested})
    assert record is not None and "…[nested deeper]" in json.dumps(record, ensure_ascii=False)
    wide = loggable({"type": "x", "data": {str(n): "z" * 3000 for n in range(2000)}})
    assert wide is not None and len(json.dumps(wide)) <= RECORD_BYTES


def test_the_events_file_rotates_at_its_cap_keeping_one_old_generation(store: MatrixStore) -> None:
    log = EventLog(store, "worker-rot1", max_bytes=CAP)
    for n in range(600):
        log.write("note", n=n, pad="p" * 900)
        assert log.path.stat().st_size <= CAP
    assert log.old_path.stat().st_size <= CAP
    old = _lines(log.old_path)
    new = _lines(log.path)
    assert [e["n"] for e in old + new] == list(range(old[0]["n"], 600))  # contiguous, nothing lost
    assert len(old) + len(new) > CAP // 1000  # the old generation is kept whole
    # tail() reads across the two generations, newest last.
    assert [e["n"] for e in log.tail(len(new) + 5)] == [*range(600 - len(new) - 5, 600)]
    # A line over the line cap is replaced by a marker naming its size.
    log.write("huge", text="h" * (2 * EVENT_LINE_BYTES))
    last = log.tail(1)[0]
    assert last["event"] == "huge" and "over the 65536 byte line cap" in last["truncated"]
    # A writer that does not know the setting (a job's watcher) appends without rotating.
    before = log.old_path.stat().st_ino
    other = EventLog(store, "worker-rot1", max_bytes=None)
    for n in range(100):
        other.write("result", n=n, pad="p" * 900)
    assert log.old_path.stat().st_ino == before and log.path.stat().st_size > CAP


def _show_peak_bytes(store: MatrixStore, key: str, work: Path) -> tuple[int, str]:
    """Run ``pi-matrix show KEY`` in a fresh interpreter; its peak of Python allocations (bytes)
    while it ran, and its output."""
    program = (
        "import runpy, sys, tracemalloc\n"
        f"sys.argv = ['pi-matrix', '--state-dir', {str(store.root)!r}, 'show', {key!r}]\n"
        "tracemalloc.start()\n"
        "try:\n    runpy.run_module('pi_tmux_matrix', run_name='__main__')\n"
        "finally:\n    print('PEAK', tracemalloc.get_traced_memory()[1], file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=work, check=False
    )
    assert done.returncode == 0, done.stderr
    return int(done.stderr.rsplit("PEAK", 1)[1]), done.stdout


def test_show_reads_only_a_bounded_tail_of_a_huge_events_file(store: MatrixStore, work: Path) -> None:
    entry = store.create(make_entry("big1"))
    store.side_dir("events")
    EventLog(store, entry.key).write("registered")
    small, _ = _show_peak_bytes(store, entry.key, work)  # what show itself takes (imports and all)
    line = json.dumps({"event": "note", "at": 1, "pad": "q" * 1000}) + "\n"
    size = 32 * 1024 * 1024  # an old file, or one written by anything but the host
    with open(store.root / "events" / f"{entry.key}.jsonl", "a") as handle:
        handle.writelines(line * 1000 for _ in range(size // len(line) // 1000 + 1))
        newest = {"event": "tool_blocked", "at": 2, "tool": "bash", "path": "/the/newest", "reason": "r"}
        handle.write(json.dumps(newest) + "\n")
    peak, out = _show_peak_bytes(store, entry.key, work)
    assert "bash /the/newest" in out, out  # show's blocked calls come from the events' tail
    assert peak - small < 8 * EVENTS_TAIL_BYTES < size, (small, peak)  # the tail, parsed; never the file


def test_show_with_a_fifo_at_the_events_file_answers_promptly(store: MatrixStore, work: Path) -> None:
    entry = store.create(make_entry("fifo1"))
    store.side_dir("events")
    fifo = store.root / "events" / f"{entry.key}.jsonl"
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    done = pi_matrix(store, "show", entry.key, cwd=work)  # 60 s timeout: a hang fails the test
    assert done.returncode == 0, done.stderr
    assert "last events" in done.stdout or entry.key in done.stdout
    assert time.monotonic() - started < 20
    # The writer side never blocks on it either (a FIFO without a reader: refused at once).
    program = (
        "import sys\nfrom pi_tmux_matrix.matrix.mailbox import EventLog\n"
        "from pi_tmux_matrix.matrix.store import MatrixStore\n"
        f"EventLog(MatrixStore({str(store.root)!r}), {entry.key!r}).write('probe')\n"
    )
    wrote = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=20, check=False
    )
    assert wrote.returncode == 0 and "not recorded" in wrote.stderr, wrote.stderr
    assert fifo.exists() and not fifo.is_file()
