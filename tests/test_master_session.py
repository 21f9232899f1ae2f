"""One agent per session file (issue 18, cases 3, 4 and 7): a session has one master, a master's
agent never outlives its host unseen, and a restarted master continues its session's one file.

Real processes throughout: real ``pi-matrix master`` hosts, the stand-in and small Python agents,
real pi (pinned, from npm) against the fake LLM on 127.0.0.1 in a private tmux server. Every
process a test starts is stopped by its identity at the end (the lab's cleanup).
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_events, stop_outside_its_lock
from labs import STANDIN, Lab
from pilabs import PiLab, PiPair
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.model import Entry, ExitKind, Status

STOP = "pi-matrix stop master-{session} --confirm yes-tmux-stop"
# An agent that ignores a hangup on purpose (as under nohup), so it outlives its host's SIGKILL;
# it says when its SIGHUP disposition is set.
STUBBORN = (
    "import pathlib, signal, sys, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    "pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(300)"
)


def cli(lab: Lab, *words: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", *words], cwd=lab.work, env=lab.env, capture_output=True,
        text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def start_master(lab: Lab, session: str, *argv: str, extra: tuple[str, ...] = ()) -> tuple[Entry, Path]:
    """``pi-matrix master --session-id SESSION [EXTRA] -- ARGV`` in the background (interactive
    mode, no terminal); its stderr goes to a file. The registered entry, and that file."""
    err = lab.tmp / f"master-{session}-{len(lab.started)}.err"
    with err.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", session, "--headless",
             *extra, "--", *argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink, cwd=lab.work, env=lab.env,
            start_new_session=True,
        )  # fmt: skip
    ident = procs.identify(proc.pid)
    assert ident is not None
    lab.started.append(ident)
    key = f"master-{session}"
    entry = wait_for(
        f"{key} (pid {proc.pid}) and its agent",
        lambda: e if (e := lab.store.find(key)) and e.pid == proc.pid and e.child_pid else None,
    )
    assert entry.child_process is not None
    lab.started.append(entry.child_process)
    return entry, err


def kill9(identity: ProcessIdentity | None) -> None:
    assert identity is not None
    procs.send_signal(identity, signal.SIGKILL)
    assert procs.wait_for_exit(identity, 10)


# === case 4: a second master of a live session ====================================================
def test_a_second_master_of_a_live_session_is_refused_and_the_first_keeps_its_entry(lab: Lab) -> None:
    first, _err = start_master(lab, "m4", *STANDIN, "-p", "HANG orchestrating")

    done = cli(lab, "master", "--session-id", "m4", "--headless", "--", "sleep", "1")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "master master-m4 active" not in done.stdout
    assert f"host pid {first.pid}" in done.stderr and STOP.format(session="m4") in done.stderr
    assert "--takeover" in done.stderr
    time.sleep(2.5)  # the first master's heartbeats land: it still owns its entry
    now = lab.store.get("master-m4")
    assert (now.pid, now.registration, now.status) == (first.pid, first.registration, Status.RUNNING)
    assert procs.is_alive(first.process) and procs.is_alive(first.child_process)


def test_takeover_makes_the_new_master_the_only_writer_and_the_old_host_says_so_once(lab: Lab) -> None:
    first, first_err = start_master(lab, "m4", *STANDIN, "-p", "HANG orchestrating")

    second, _err = start_master(lab, "m4", *STANDIN, "-p", "HANG orchestrating", extra=("--takeover",))

    assert procs.wait_for_exit(first.child_process, 15), "the old master's agent was stopped"  # type: ignore[arg-type]
    assert procs.wait_for_exit(first.process, 15), "the old host ended with its agent"  # type: ignore[arg-type]
    lines = [line for line in first_err.read_text().splitlines() if "taken over" in line]
    said = f"pi-matrix: master-m4 was taken over by pid {second.pid}: this host writes nothing more"
    assert lines == [said + "; its agent is stopped"]
    time.sleep(2.5)  # heartbeats: only the new master writes the entry
    now = lab.store.get("master-m4")
    assert (now.pid, now.registration, now.status) == (second.pid, second.registration, Status.RUNNING)
    assert procs.is_alive(second.child_process)


def test_takeover_of_a_hung_master_stops_its_agent_by_identity_and_the_host_never_writes_again(
    lab: Lab,
) -> None:
    first, first_err = start_master(lab, "m4", *STANDIN, "-p", "HANG orchestrating")
    assert first.process is not None and first.child_process is not None
    stop_outside_its_lock(lab.store, first.process)
    try:
        second, _err = start_master(lab, "m4", *STANDIN, "-p", "HANG orchestrating", extra=("--takeover",))
        assert not procs.is_alive(first.child_process), "no second agent before the first is gone"
    finally:
        procs.send_signal(first.process, signal.SIGCONT)
    assert procs.wait_for_exit(first.process, 15)
    assert first_err.read_text().count("was taken over by") == 1
    time.sleep(2.5)
    now = lab.store.get("master-m4")
    assert (now.pid, now.registration, now.status) == (second.pid, second.registration, Status.RUNNING)


# === case 3: a master's agent that outlives its host ==============================================
def test_an_agent_running_on_without_its_host_is_seen_blocks_a_second_agent_and_stop_ends_it(
    lab: Lab,
) -> None:
    ready = lab.tmp / "ready"
    first, _err = start_master(lab, "lead", sys.executable, "-c", STUBBORN, str(ready))
    wait_for("the agent to ignore hangups", ready.exists)
    kill9(first.process)
    agent = first.child_process
    assert agent is not None
    time.sleep(0.5)
    assert procs.is_alive(agent)
    note = f"agent pid {agent.pid} unsupervised"

    for view in (("tree",), ("show", "master-lead"), ("ls",)):
        shown = cli(lab, *view)
        assert shown.returncode == 0 and note in shown.stdout, (view, shown.stdout)
    assert STOP.format(session="lead") in cli(lab, "show", "master-lead").stdout

    refused = cli(lab, "master", "--session-id", "lead", "--headless", "--", "sleep", "1")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"pid {agent.pid}" in refused.stderr and STOP.format(session="lead") in refused.stderr
    assert lab.store.get("master-lead").registration == first.registration  # nothing was written

    preview = cli(lab, "stop", "master-lead")
    assert preview.returncode == 2 and procs.is_alive(agent)
    stopped = cli(lab, "stop", "master-lead", "--confirm", "yes-tmux-stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not procs.is_alive(agent)
    final = lab.store.get("master-lead")
    assert final.status is Status.CLOSED and final.exit is not None and final.exit.kind is ExitKind.KILLED

    again = cli(lab, "master", "--session-id", "lead", "--headless", "--", "true")
    assert again.returncode == 0, again.stdout + again.stderr


def test_takeover_stops_an_agent_left_without_its_host_and_starts_the_new_one(lab: Lab) -> None:
    ready = lab.tmp / "ready"
    first, _err = start_master(lab, "lead", sys.executable, "-c", STUBBORN, str(ready))
    wait_for("the agent to ignore hangups", ready.exists)
    kill9(first.process)

    second, _err = start_master(lab, "lead", *STANDIN, "-p", "HANG orchestrating", extra=("--takeover",))

    assert not procs.is_alive(first.child_process)
    assert procs.is_alive(second.child_process)


# === cases 3 and 7 with real pi ===================================================================
def pi_master_window(lab: PiLab, session: str, *pi_args: str) -> Entry:
    """``pi-matrix master --session-id SESSION -- pi …`` (interactive) typed at a shell in a new
    window of the lab's private tmux server (the shell leads the terminal's session, as a user's
    does: the host's end alone hangs nothing up); its entry once pi runs under it."""
    before = lab.store.find(f"master-{session}")
    argv = [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", session, "--",
            lab.pi, *pi_args]  # fmt: skip
    tmux = ["tmux", "-L", lab.socket]
    has = subprocess.run([*tmux, "has-session", "-t", "=m"], capture_output=True, check=False)
    fresh = ["new-session", "-d", "-s", "m", "-x", "160"]
    where = ["new-window", "-t", "=m:"] if has.returncode == 0 else fresh
    names = ("PATH", "HOME", "TMPDIR", "PI_OFFLINE", "NO_PROXY", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR",
             "PI_MATRIX_PI_COMMAND", "PYTHONPATH", "VIRTUAL_ENV")  # fmt: skip
    env = [w for name in names if name in lab.env for w in ("-e", f"{name}={lab.env[name]}")]
    shell = ["sh", "-c", f"{shlex.join(argv)}; exec sleep 600"]
    subprocess.run([*tmux, *where, *env, "-c", str(lab.work), "--", *shell], env=lab.env, check=True)
    entry = wait_for(
        f"a new master-{session} running pi",
        lambda: (
            e
            if (e := lab.store.find(f"master-{session}"))
            and (before is None or e.registration != before.registration)
            and e.child_pid
            else None
        ),
        timeout=30,
    )
    lab.started += [i for i in (entry.process, entry.child_process) if i is not None]
    return entry


def session_files_with_id(lab: Lab, session: str) -> list[Path]:
    found = []
    for path in (lab.agent_dir / "sessions").rglob("*.jsonl"):
        first = path.read_text().splitlines()[:1]
        if first and json.loads(first[0]).get("id") == session:
            found.append(path)
    return found


def assistant_turns(path: Path) -> int:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(
        1 for r in lines if r.get("type") == "message" and (r.get("message") or {}).get("role") == "assistant"
    )


@pytest.mark.real_pi
def test_a_killed_hosts_pi_ends_with_it(pilab: PiPair) -> None:
    lab, _llm = pilab
    entry = pi_master_window(lab, "lead")
    wait_for("the bridge", lambda: read_events(lab.state, entry.key, "bridge_ready"), timeout=30)
    pi = entry.child_process
    assert pi is not None

    kill9(entry.process)

    assert procs.wait_for_exit(pi, 10), "pi ran on after its host was killed"


@pytest.mark.real_pi
@pytest.mark.any_pi  # pi again into its session file: test_real_pi, test_master_tool
def test_a_restarted_pi_master_continues_its_sessions_one_file(pilab: PiPair) -> None:
    lab, llm = pilab
    first = pi_master_window(lab, "lead", "Remember the word HERON.")
    session_file = Path(first.identity.session_file or "")
    wait_for("the first turn in the session file", lambda: assistant_turns(session_file) >= 1, timeout=60)
    header = session_file.read_text().splitlines()[0]

    def crash_and_restart(entry: Entry, prompt: str, turns: int) -> Entry:
        for ident in (entry.process, entry.child_process):  # the host crashes; pi with it, or killed
            procs.send_signal(ident, signal.SIGKILL)  # type: ignore[arg-type]
            assert procs.wait_for_exit(ident, 10)  # type: ignore[arg-type]
        asked = len(llm.requests)
        back = pi_master_window(lab, "lead", prompt)
        assert back.identity.session_file == str(session_file)
        wait_for("the next turn in the same file", lambda: assistant_turns(session_file) > turns, timeout=60)
        assert session_file.read_text().splitlines()[0] == header  # header id kept
        assert session_files_with_id(lab, "lead") == [session_file]  # never a second file
        seen = "\n".join(
            str(m.get("content")) for r in llm.requests[asked:] for m in r.get("messages", [])
        )
        assert "HERON" in seen and prompt in seen  # pi continued the conversation
        return back

    second = crash_and_restart(first, "Which word was it?", 1)
    # The dead master's record is gone (reconciled away): the session's file is found by its name.
    kill9(second.process)
    procs.send_signal(second.child_process, signal.SIGKILL)  # type: ignore[arg-type]
    assert procs.wait_for_exit(second.child_process, 10)  # type: ignore[arg-type]
    assert cli(lab, "reconcile").returncode == 0
    assert lab.store.find("master-lead") is None
    crash_and_restart(second, "And once more?", 2)


def test_the_session_file_of_an_id_is_the_one_whose_header_carries_it(tmp_path: Path) -> None:
    from pi_tmux_matrix.pisession import new_session_file, session_file_of, write_header

    cwd = str(tmp_path)
    assert session_file_of("lead") is None
    other = new_session_file(cwd, "other")
    write_header(other, "other", cwd)
    assert session_file_of("lead", [other]) is None  # a recorded file of another session is not it
    older = new_session_file("/somewhere/else", "lead")
    write_header(older, "lead", cwd)
    time.sleep(0.01)
    newer = new_session_file(cwd, "lead")
    write_header(newer, "lead", cwd)
    assert session_file_of("lead") == newer  # the newest of the files named for it
    assert session_file_of("lead", [None, other, older]) == older  # the recorded one first
    decoy = Path(new_session_file(cwd, "decoy")).with_name("9_lead.jsonl")
    decoy.write_text('{"type": "session", "id": "not-lead", "cwd": "/"}\n')
    assert session_file_of("lead") == newer
