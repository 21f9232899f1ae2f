"""Fork runs (seed 003) with the stand-in agent: a private tmux server plays the caller's tmux."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from forklab import Caller
from helpers import loaded
from labs import STANDIN
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.fork import (
    FORCED_ENV,
    INTERRUPTED,
    PARENT_ABORTED,
    ForkRun,
    RunMode,
    RunStatus,
    RunStore,
    child_env,
    child_flags,
    config_flags,
    find_exit_code,
    inherited_flags,
    launch_script,
    merge_flags,
    reap,
)
from pi_tmux_matrix.matrix.mailbox import EventLog
from pi_tmux_matrix.matrix.store import now_ms
from pi_tmux_matrix.settings import ForkSettings


# --- the pure parts --------------------------------------------------------------------------------
def test_inherited_flags_keep_only_the_seed_flags_in_order_canonically() -> None:
    argv = [
        "--model", "a/b", "--tools", "read", "-e", "/x.ts", "--thinking=high", "--skill", "s1",
        "--provider", "fake", "--session", "/s.jsonl", "--no-extensions", "task words",
    ]  # fmt: skip
    assert inherited_flags(argv) == [
        "--model", "a/b", "--extension", "/x.ts", "--thinking", "high", "--skill", "s1", "--provider", "fake",
        "--no-extensions",
    ]  # fmt: skip
    merged = merge_flags(
        inherited_flags(argv), ["--model", "c/d", "--extension", "/x.ts", "--extension", "/y.ts"]
    )
    assert merged == [
        "--extension", "/x.ts", "--thinking", "high", "--skill", "s1", "--provider", "fake",
        "--no-extensions", "--model", "c/d", "--extension", "/y.ts",
    ]  # fmt: skip


def test_the_inherited_flag_list_is_the_seeds() -> None:
    """Seed 003's runner-cli forwards "--extension, --skill, --model, --thinking, --provider, etc.":
    those five (with -e), and what else keeps the fork a copy of its parent's pi (its discovery
    switches, prompt templates, model cycle); never a secret, the tools, the session or the mode."""
    inherited = [
        "--extension", "/e1.ts", "-e", "/e2.ts", "--extension=/e3.ts", "--skill", "/s", "--skill=/s2",
        "--model", "p/m", "--thinking", "low", "--provider", "p", "--prompt-template", "/t",
        "--models", "p/*", "--no-extensions", "-ne", "--no-skills", "-ns", "--no-prompt-templates", "-np",
        "--no-context-files", "-nc",
    ]  # fmt: skip
    dropped = [
        "--api-key", "sk-secret", "--tools", "read", "-t", "bash", "--no-tools", "-nt", "--no-builtin-tools",
        "--session", "/s.jsonl", "--fork", "/f.jsonl", "--session-dir", "/d", "--continue", "-c", "--resume",
        "-r", "--no-session", "--system-prompt", "be", "--append-system-prompt", "more", "--mode", "rpc",
        "--print", "-p", "--theme", "/th", "--no-themes", "--verbose", "--offline", "@file.md", "a task",
    ]  # fmt: skip
    assert inherited_flags([*dropped, *inherited]) == [
        "--extension", "/e1.ts", "--extension", "/e2.ts", "--extension", "/e3.ts", "--skill", "/s",
        "--skill", "/s2", "--model", "p/m", "--thinking", "low", "--provider", "p", "--prompt-template", "/t",
        "--models", "p/*", "--no-extensions", "--no-extensions", "--no-skills", "--no-skills",
        "--no-prompt-templates", "--no-prompt-templates", "--no-context-files", "--no-context-files",
    ]  # fmt: skip
    assert "sk-secret" not in child_flags(["--api-key", "sk-secret"], [], None)
    # A switch is given once, whatever the parent repeated.
    assert child_flags(["-ne", "--no-extensions", "-e", "/a.ts"], [], "/bridge.ts") == [
        "--no-extensions", "--extension", "/a.ts", "--extension", "/bridge.ts",
    ]  # fmt: skip


def test_pi_fork_settings_sit_between_the_parents_flags_and_the_callers() -> None:
    parent = ["--model", "parent/m", "--thinking", "low", "-e", "/p.ts"]
    config = config_flags(
        ForkSettings(default_model="cfg/m", default_thinking="high", extensions=("/cfg.ts",))
    )
    assert config == ["--model", "cfg/m", "--thinking", "high", "--extension", "/cfg.ts"]
    # defaultModel and defaultThinking win over the parent's; the extensions are added.
    assert child_flags(parent, [], "/bridge.ts", config=config) == [
        "--extension", "/p.ts", "--model", "cfg/m", "--thinking", "high", "--extension", "/cfg.ts",
        "--extension", "/bridge.ts",
    ]  # fmt: skip
    # The call's own model and thinking win over both.
    flags = child_flags(parent, ["--model", "call/m", "--thinking", "off"], None, config=config)
    assert flags[flags.index("--model") + 1] == "call/m" and flags.count("--model") == 1
    assert flags[flags.index("--thinking") + 1] == "off" and flags.count("--thinking") == 1
    # No settings: the parent's stand.
    assert child_flags(parent, [], None, config=config_flags(ForkSettings())) == [
        "--model", "parent/m", "--thinking", "low", "--extension", "/p.ts",
    ]  # fmt: skip


def test_the_forced_variables_win_over_the_parent_and_the_settings() -> None:
    parent = {"PATH": "/bin", "PI_FORK": "0", "PI_OFFLINE": "0", "PI_MATRIX_KEY": "worker-x", "TMUX": "t"}
    overrides = {"PI_SUBAGENT_DISABLE_SCHEDULER": "0", "PI_OBSERVATIONAL_MEMORY_PASSIVE": "0", "MINE": "1"}
    env = child_env(parent, overrides, {"PI_FORK_RUN_ID": "run-1"})
    assert {k: env[k] for k in FORCED_ENV} == dict(FORCED_ENV)
    assert env["MINE"] == "1" and env["PATH"] == "/bin" and env["PI_FORK_RUN_ID"] == "run-1"
    assert "PI_MATRIX_KEY" not in env and "TMUX" not in env  # the child never speaks for its parent


def test_the_exit_marker_is_found_only_for_its_own_run_on_a_line_of_its_own() -> None:
    script = launch_script("run-1", ["pi", "--session", "/s", "it's a task; rm -rf /"])
    assert "'it'\"'\"'s a task; rm -rf /'" in script  # one quoted word, never shell syntax
    assert find_exit_code("x\n__PI_FORK_EXIT_run-1__:7\r\n", "run-1") == 7
    assert find_exit_code("say __PI_FORK_EXIT_run-1__:0 inline\n", "run-1") is None
    assert find_exit_code("__PI_FORK_EXIT_run-2__:0\n", "run-1") is None


# --- with tmux and the stand-in ------------------------------------------------------------------------
def test_fork_wait_runs_the_child_beside_the_caller_and_prints_its_result(caller: Caller) -> None:
    before = caller.session.read_bytes()
    done = caller.fork("--json", "--", "check", "the", "parser")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["status"] == "completed" and shown["text"] == "done: check the parser"
    assert shown["windowId"] == caller.window  # split off the caller's own window
    assert shown["usage"]["totalTokens"] == 15
    (run,) = caller.runs()
    folder = caller.state / "runs" / run.id
    assert caller.session.read_bytes() == before  # the parent's file is never touched
    snapshot = (folder / "session.jsonl").read_text()
    assert snapshot.startswith(before.decode()) and "check the parser" in snapshot  # the child wrote there
    assert find_exit_code((folder / "pane.log").read_text(), run.id) == 0
    assert run.argv[-1] == "check the parser" and "--extension" in run.argv
    wait_for("the fork pane to close", lambda: run.pane_id not in caller.panes())
    assert caller.pane in caller.panes()  # the caller's own pane is left alone


def test_background_forks_fill_a_2x2_grid_the_cap_refuses_a_fourth_and_reaping_frees_a_slot(
    caller: Caller,
) -> None:
    slow = dict(caller.env, STANDIN_STEPS="2000")
    ids = []
    for n in range(3):
        done = caller.fork("--background", "--json", "--", f"task {n}", env=slow)
        assert done.returncode == 0, done.stderr
        ids.append(json.loads(done.stdout)["id"])
    panes = caller.panes()
    mine = [p for p, (window, tag) in panes.items() if tag in ids]
    assert len(mine) == 3 and all(panes[p][0] == caller.window for p in mine)
    geometry = subprocess.run(
        ["tmux", "-L", caller.socket, "list-panes", "-t", caller.window, "-F", "#{pane_left},#{pane_top}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert len(set(geometry)) == 4 and len({g.split(",")[0] for g in geometry}) == 2  # 2 columns x 2 rows

    refused = caller.fork("--background", "--", "one too many", env=slow)
    assert refused.returncode == 1 and "maxConcurrentForks=3" in refused.stderr
    assert len(caller.runs()) == 3  # nothing was recorded for the refused fork

    victim = RunStore(caller.store).get(ids[0])
    assert victim.process is not None
    procs.signal_group(victim.process, signal.SIGKILL)  # the fork's process dies without a word
    assert procs.wait_for_exit(victim.process, 10)
    accepted = caller.fork("--background", "--json", "--", "now there is room", env=slow)
    assert accepted.returncode == 0, accepted.stderr
    reaped = RunStore(caller.store).get(ids[0])
    assert reaped.status is RunStatus.FAILED
    assert reaped.error == "fork process ended without a result artifact or exit marker"


def test_a_finished_background_fork_is_recorded_by_its_finisher_and_its_pane_stays(caller: Caller) -> None:
    done = caller.fork("--background", "--json", "--", "quick one")
    run_id = json.loads(done.stdout)["id"]
    store = RunStore(caller.store)
    run = wait_for("the finisher to record the end", lambda: (r := store.get(run_id)).ended_at_ms and r)
    assert run.status is RunStatus.COMPLETED and run.text == "done: quick one"
    assert run.pane_id in caller.panes()  # left for the user to read
    listed = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "runs", "--json"],
        env=caller.env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    body = json.loads(listed.stdout)
    assert [r["id"] for r in body["runs"]] == [run_id]
    assert body["total"] == {
        "runs": 1, "input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
        "cost": 0.001,
    }  # fmt: skip
    text = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "runs"],
        env=caller.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert run_id in text and "1 run(s); tokens 15" in text and "cost $0.0010" in text


def test_a_child_that_leaves_no_result_gets_a_synthetic_failure_with_its_exit_code(caller: Caller) -> None:
    env = dict(caller.env, PI_MATRIX_PI_COMMAND=json.dumps(["/bin/sh", "-c", "exit 7", "pi"]))
    done = caller.fork("--json", "--", "anything", env=env)
    assert done.returncode == 1
    shown = json.loads(done.stdout)
    assert shown["status"] == "failed" and shown["exitCode"] == 7
    assert shown["error"] == "fork exited with code 7 without a result artifact"


def test_the_child_gets_the_forced_env_over_the_settings_and_the_parents(caller: Caller) -> None:
    agent_dir = Path(caller.env["PI_CODING_AGENT_DIR"])
    agent_dir.mkdir(parents=True, exist_ok=True)
    settings = {
        "processMatrix": {"forkEnvironment": {"PI_OFFLINE": "0", "PI_FORK": "0", "FROM_SETTINGS": "yes"}}
    }
    (agent_dir / "settings.json").write_text(json.dumps(settings))
    dump = 'env > "$PI_FORK_RESULT_PATH.env"'
    env = dict(
        caller.env,
        PI_MATRIX_PI_COMMAND=json.dumps(["/bin/sh", "-c", dump, "pi"]),
        PI_OBSERVATIONAL_MEMORY_PASSIVE="0",
        PI_MATRIX_KEY="worker-somebody",
    )
    done = caller.fork("--json", "--", "show me", env=env)
    run_id = json.loads(done.stdout)["id"]
    seen = (caller.state / "runs" / run_id / "result.json.env").read_text().splitlines()
    got = dict(line.split("=", 1) for line in seen if "=" in line)
    assert {k: got.get(k) for k in FORCED_ENV} == dict(FORCED_ENV)
    assert got["FROM_SETTINGS"] == "yes" and got["PI_FORK_RUN_ID"] == run_id
    assert "PI_MATRIX_KEY" not in got


def test_pi_fork_settings_reach_the_child_and_its_command_line(caller: Caller) -> None:
    """``pi-fork`` from the project's .pi/settings.json: environment, defaultModel, defaultThinking,
    extensions (seed 003's config), applied by the one fork launcher the CLI and the tool share."""
    (caller.work / ".pi").mkdir()
    pi_fork = {
        "environment": {"FROM_PI_FORK": "yes", "PI_FORK": "0"},
        "defaultModel": "cfg/model",
        "defaultThinking": "high",
        "extensions": ["/cfg/ext.ts"],
    }
    (caller.work / ".pi" / "settings.json").write_text(json.dumps({"pi-fork": pi_fork}))
    dump = 'env > "$PI_FORK_RESULT_PATH.env"'
    env = dict(caller.env, PI_MATRIX_PI_COMMAND=json.dumps(["/bin/sh", "-c", dump, "pi"]))
    done = caller.fork("--json", "--thinking", "low", "--", "show me", env=env)
    run = json.loads(done.stdout)
    seen = (caller.state / "runs" / run["id"] / "result.json.env").read_text().splitlines()
    got = dict(line.split("=", 1) for line in seen if "=" in line)
    assert got["FROM_PI_FORK"] == "yes" and got["PI_FORK"] == "1"  # the forced ones still win
    argv = run["argv"]
    assert argv[argv.index("--model") + 1] == "cfg/model"
    assert argv[argv.index("--thinking") + 1] == "low"  # the caller's own choice wins
    assert argv[argv.index("/cfg/ext.ts") - 1] == "--extension"


def test_a_fork_child_cannot_fork_and_bad_input_writes_nothing(caller: Caller) -> None:
    nested = caller.fork("--", "again", env=dict(caller.env, PI_FORK="1"))
    assert nested.returncode == 2 and "PI_FORK" in nested.stderr
    caller.session.write_text("not json\n")
    bad = caller.fork("--", "task")
    assert bad.returncode == 2 and "--session" in bad.stderr and "session header" in bad.stderr
    dash = caller.fork("--session", str(caller.session), "--", "-rf")
    assert dash.returncode == 2
    assert caller.runs() == []


def test_a_masters_shutdown_stops_its_forks_and_fails_them_with_the_seed_message(caller: Caller) -> None:
    """The master's agent (a script) forks in the background with inherited flags, then exits:
    its host stops the fork and records why."""
    flags = ["--model", "fake/big", "--thinking", "high", "--tools", "read"]
    master = caller.master_that_forks("HANG forever", *flags)
    try:
        run = RunStore(caller.store).get(caller.forked_run_id())
        assert run.parent_key == "master-boss"
        assert run.argv[run.argv.index("--model") + 1] == "fake/big"  # inherited from the master's pi
        assert run.argv[run.argv.index("--thinking") + 1] == "high"
        assert "--tools" not in run.argv
        assert run.process is not None and procs.is_alive(run.process)
        caller.go()
        assert master.wait(timeout=30) == 0
        ended = RunStore(caller.store).get(run.id)
        assert ended.status is RunStatus.FAILED and ended.error == PARENT_ABORTED
        assert procs.wait_for_exit(run.process, 10)
        assert run.pane_id not in caller.panes()
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()


def test_a_background_forks_result_is_sent_to_its_parent_agent_through_its_host(caller: Caller) -> None:
    master = caller.master_that_forks("quick look")
    try:
        run_id = caller.forked_run_id()
        events = EventLog(caller.store, "master-boss")

        def delivered() -> dict[str, object] | None:
            found = [
                e for e in events.tail(50) if e.get("event") == "message" and e.get("kind") == "fork_result"
            ]
            return found[0] if found else None

        message = wait_for("the finisher's report to reach the master's host", delivered)
        assert message["sender"] == "pi-matrix fork"
        assert RunStore(caller.store).get(run_id).status is RunStatus.COMPLETED
        caller.go()
        assert master.wait(timeout=30) == 0
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()


def test_a_run_with_no_update_for_30_minutes_is_reaped_as_stale(caller: Caller) -> None:
    store = RunStore(caller.store)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # alive, but silent
    try:
        alive = procs.identify(sleeper.pid)
        old = now_ms() - 31 * 60 * 1000
        run = ForkRun(
            id="run-20260101-000000-abcdef", cwd=str(caller.work), task="t", mode=RunMode.BACKGROUND,
            created_at_ms=old, updated_at_ms=old, process=alive,
        )  # fmt: skip
        store.put(run, exclusive=True)
        (reaped,) = reap(store)
        assert reaped.status is RunStatus.FAILED and reaped.error is not None and "stale" in reaped.error
        assert store.get(run.id) == reaped  # recorded, not only reported
        assert alive is not None and procs.wait_for_exit(alive, 10)  # and stopped: it no longer counts
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_corrupt_run_record_is_reported_not_deleted(caller: Caller) -> None:
    folder = caller.state / "runs"
    folder.mkdir(parents=True)
    for made in (caller.state, folder):
        made.chmod(0o700)  # the store refuses a state dir others can enter
    bad = folder / "run-20260101-000000-000000.json"
    bad.write_text("{torn")
    listed = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "runs", "--json"],
        env=caller.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0 and json.loads(listed.stdout)["runs"] == []
    assert str(bad) in listed.stderr and "left in place" in listed.stderr
    assert bad.exists()


def test_a_waiter_told_to_stop_stops_its_fork_and_fails_it_with_the_seed_message(caller: Caller) -> None:
    argv = [sys.executable, "-m", "pi_tmux_matrix", "fork", "--session", str(caller.session), "--", "HANG on"]
    with caller.process(argv, start_new_session=False) as waiter:
        run = wait_for("the fork's pane", lambda: (runs := caller.runs()) and runs[0].process and runs[0])
        waiter.send_signal(signal.SIGTERM)  # what the parent session's shutdown sends its tool call
        assert waiter.wait(timeout=30) == 1
        ended = RunStore(caller.store).get(run.id)
        assert ended.status is RunStatus.FAILED and ended.error == PARENT_ABORTED
        assert run.process is not None and procs.wait_for_exit(run.process, 10)
        assert run.pane_id not in caller.panes()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=["hangup", "ctrl-c"])
def test_a_waiter_fails_its_fork_as_a_shutdown_on_a_hangup_and_as_an_interruption_on_ctrl_c(
    caller: Caller, sig: signal.Signals
) -> None:
    argv = [sys.executable, "-m", "pi_tmux_matrix", "fork", "--session", str(caller.session), "--", "HANG on"]
    with caller.process(argv, start_new_session=False) as waiter:
        run = wait_for("the fork's pane", lambda: (runs := caller.runs()) and runs[0].process and runs[0])
        waiter.send_signal(sig)
        assert waiter.wait(timeout=30) == 1
        ended = RunStore(caller.store).get(run.id)
        assert ended.status is RunStatus.FAILED
        assert ended.error == (INTERRUPTED if sig == signal.SIGINT else PARENT_ABORTED)
        assert run.process is not None and procs.wait_for_exit(run.process, 10)


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (sig - 1) & 1)


def test_a_runs_wait_told_to_stop_stops_the_fork_it_waits_for(caller: Caller) -> None:
    started = caller.fork("--background", "--json", "--", "HANG on")
    run_id = json.loads(started.stdout)["id"]
    argv = [sys.executable, "-m", "pi_tmux_matrix", "runs", run_id, "--wait"]
    with caller.process(argv, start_new_session=False) as waiter:
        run = wait_for("the fork to run", lambda: (runs := caller.runs()) and runs[0].process and runs[0])
        wait_for("the waiter's SIGTERM handler", lambda: _catches(waiter.pid, signal.SIGTERM))
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=30) == 1
        ended = RunStore(caller.store).get(run_id)
        assert ended.status is RunStatus.FAILED and ended.error == PARENT_ABORTED
        assert run.process is not None and procs.wait_for_exit(run.process, 10)


# --- stopping exactly the run's own processes and pane -------------------------------------------------
def _running(caller: Caller) -> ForkRun:
    return wait_for(
        "the fork to run", lambda: (runs := caller.runs()) and runs[0].process and runs[0], timeout=30
    )


def test_an_abort_never_closes_a_pane_that_is_not_the_runs(caller: Caller) -> None:
    """A record naming a pane id the run no longer owns (tmux restarted and reused the id):
    the pane is left alone."""
    now = now_ms()
    run = ForkRun(
        id="run-20260101-000000-abcdef", cwd=str(caller.work), task="t", mode=RunMode.BACKGROUND,
        created_at_ms=now, updated_at_ms=now, socket="client", socket_path=caller.socket_path,
        pane_id=caller.pane,  # the caller's own pane, which carries no fork tag
    )  # fmt: skip
    RunStore(caller.store).put(run, exclusive=True)
    aborted = caller.runs_cli(run.id, "--abort")
    assert aborted.returncode == 1 and "aborted by pi-matrix runs --abort" in aborted.stdout
    assert caller.pane in caller.panes()


def test_an_abort_stops_the_childs_own_children_even_those_that_ignore_hangups(caller: Caller) -> None:
    pidfile = caller.work / "grandchild.pid"
    stubborn = (
        f"setsid sh -c 'trap \"\" HUP TERM; echo $$ > {pidfile}; while :; do sleep 0.2; done' & "
        "while :; do sleep 0.2; done"
    )
    env = dict(caller.env, PI_MATRIX_PI_COMMAND=json.dumps(["/bin/sh", "-c", stubborn, "pi"]))
    done = caller.fork("--background", "--json", "--", "spawn one", env=env)
    assert done.returncode == 0, done.stderr
    run = _running(caller)
    pid = int(wait_for("the grandchild's pid", lambda: pidfile.exists() and pidfile.read_text().strip()))
    grandchild = procs.identify(pid)
    assert grandchild is not None
    try:
        aborted = caller.runs_cli(run.id, "--abort")
        assert aborted.returncode == 1
        assert procs.wait_for_exit(grandchild, 15), "the fork's grandchild outlived the abort"
    finally:
        procs.send_signal(grandchild, signal.SIGKILL)  # it left the pane's session: not the fixture's
    assert run.process is not None and not procs.is_alive(run.process)
    wait_for("the fork pane to close", lambda: run.pane_id not in caller.panes())


def test_a_waiter_killed_with_its_whole_group_still_gets_its_fork_stopped(caller: Caller) -> None:
    """pi's bash tool ends a tool call by SIGKILLing its process group: no handler runs. The
    run's finisher watches the waiter and stops the fork."""
    argv = [sys.executable, "-m", "pi_tmux_matrix", "fork", "--session", str(caller.session), "--", "HANG on"]
    with caller.process(argv) as waiter:
        run = _running(caller)
        # The run records its process before the waiter starts the finisher (fork/launch.py): a
        # waiter killed in between leaves no finisher (its parent session's end stops the fork).
        # Under load the kill landed there (seen in CI); this test is about the finisher.
        wait_for("the finisher to start", lambda: procs.with_argument(run.id))
        os.killpg(waiter.pid, signal.SIGKILL)
        waiter.wait(timeout=10)
        store = RunStore(caller.store)
        ended = wait_for("the finisher to stop the fork", lambda: (r := store.get(run.id)).ended_at_ms and r)
        assert ended.status is RunStatus.FAILED and ended.error == PARENT_ABORTED
        assert run.process is not None and procs.wait_for_exit(run.process, 10)
        wait_for("the fork pane to close", lambda: run.pane_id not in caller.panes())


# --- launches that go wrong half-way ---------------------------------------------------------------------
def _start(caller: Caller) -> ForkRun:
    """start_fork in this process (so a test can break one of its seams), beside the caller."""
    from pi_tmux_matrix.fork import ForkRequest, start_fork
    from pi_tmux_matrix.settings import load_settings

    request = ForkRequest(
        session_file=str(caller.session), task="HANG here", mode=RunMode.BACKGROUND,
        tmux_env=caller.env["TMUX"], tmux_pane=caller.pane,
    )  # fmt: skip
    env = dict(caller.env)
    return start_fork(caller.store, load_settings(env=env), request, env=env, pi_argv=STANDIN)


def test_a_launch_that_fails_after_making_the_pane_leaves_no_pane_and_starts_nothing(
    caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pi_tmux_matrix.dispatch.tmux import TmuxServer
    from pi_tmux_matrix.errors import DispatchError

    def broken(self: TmuxServer, pane_id: str, command: object) -> None:
        raise DispatchError("pipe-pane failed (forced)")

    monkeypatch.setattr(TmuxServer, "pipe_pane", broken)
    before = set(caller.panes())
    with pytest.raises(DispatchError):
        _start(caller)
    (run,) = caller.runs()
    assert run.status is RunStatus.FAILED and run.error is not None and "pipe-pane failed" in run.error
    wait_for("the half-made pane to go", lambda: set(caller.panes()) == before)
    folder = caller.state / "runs" / run.id
    assert not (folder / "go").exists()
    assert (folder / "session.jsonl").read_bytes() == caller.session.read_bytes()  # pi never ran


def test_an_abort_during_the_launch_wins_and_the_pane_is_not_attached(
    caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pi_tmux_matrix.dispatch.tmux import TmuxServer
    from pi_tmux_matrix.fork import abort_runs

    real = TmuxServer.pipe_pane

    def abort_first(self: TmuxServer, pane_id: str, command: list[str]) -> None:
        abort_runs(caller.store, parent_session_file=str(caller.session))  # the parent shuts down now
        real(self, pane_id, command)

    monkeypatch.setattr(TmuxServer, "pipe_pane", abort_first)
    before = set(caller.panes())
    run = _start(caller)
    assert run.status is RunStatus.FAILED and run.error == PARENT_ABORTED
    assert run.pane_id is None and RunStore(caller.store).get(run.id) == run
    wait_for("the pane to go", lambda: set(caller.panes()) == before)
    assert not (caller.state / "runs" / run.id / "go").exists()


# --- refusals that write nothing -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "env", "field"),
    [
        ((), {"PI_WORKER_ALLOWED_PATHS": "/somewhere"}, "PI_WORKER_ALLOWED_PATHS"),
        ((), {"TMUX_PANE": "%999"}, "TMUX_PANE"),
        (("--timeout", "nan"), {}, "--timeout"),
        (("--timeout", "-1"), {}, "--timeout"),
    ],
)
def test_forks_that_cannot_run_are_refused_before_anything_is_written(
    caller: Caller, extra: tuple[str, ...], env: dict[str, str], field: str
) -> None:
    refused = caller.fork(*extra, "--", "task", env=dict(caller.env, **env))
    assert refused.returncode == 2, refused.stderr
    assert field in refused.stderr
    assert caller.runs() == []
    assert [tag for _window, tag in caller.panes().values() if tag] == []


# --- what a listing and the files say -------------------------------------------------------------------
def test_a_listing_leaves_a_run_with_a_result_running_until_its_process_ends(caller: Caller) -> None:
    store = RunStore(caller.store)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        now = now_ms()
        run = ForkRun(
            id="run-20260101-000000-abcdef", cwd=str(caller.work), task="t", mode=RunMode.BACKGROUND,
            created_at_ms=now, updated_at_ms=now, process=procs.identify(sleeper.pid),
        )  # fmt: skip
        store.put(run, exclusive=True)
        store.write_file(run.id, "result.json", json.dumps({"text": "hi", "stopReason": "stop"}).encode())
        (listed,) = reap(store)
        assert listed.status is RunStatus.RUNNING  # pi is still leaving: its exit code comes next
        store.write_file(run.id, "exit.code", b"0\n")
        (listed,) = reap(store)
        assert listed.status is RunStatus.COMPLETED and listed.exit_code == 0 and listed.text == "hi"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_exit_code_is_found_at_the_end_of_a_long_pane_log(caller: Caller) -> None:
    store = RunStore(caller.store)
    now = now_ms()
    run = ForkRun(
        id="run-20260101-000000-abcdef", cwd=str(caller.work), task="t", mode=RunMode.BACKGROUND,
        created_at_ms=now, updated_at_ms=now,
    )  # fmt: skip
    store.put(run, exclusive=True)
    log = b"x" * (70 * 1024 * 1024) + f"\n__PI_FORK_EXIT_{run.id}__:4\n".encode()
    (store.folder(run.id) / "pane.log").write_bytes(log)
    assert store.exit_code(run.id) == 4
    store.write_file(run.id, "exit.code", b"5\n")
    assert store.exit_code(run.id) == 5  # the script's own file first


def test_a_result_without_an_answer_is_a_failure() -> None:
    from pi_tmux_matrix.fork import finished

    now = now_ms()
    run = ForkRun(id="run-1", cwd="/", task="t", mode=RunMode.WAIT, created_at_ms=now, updated_at_ms=now)
    ended = finished(run, {"text": "  ", "stopReason": "stop"}, 0, now)
    assert (
        ended.status is RunStatus.FAILED
        and ended.error is not None
        and "without a final answer" in ended.error
    )


def test_the_snapshot_stops_at_the_last_whole_line_and_secrets_stay_off_the_command_line(
    caller: Caller,
) -> None:
    with caller.session.open("a") as handle:
        handle.write('{"type":"message","half')  # the parent is writing a line right now
    subprocess.run(
        ["tmux", "-L", caller.socket, "set-environment", "-g", "PI_MATRIX_KEY", "worker-leaked"], check=True
    )
    dump = 'env > "$PI_FORK_RESULT_PATH.env"'
    env = dict(
        caller.env,
        PI_MATRIX_PI_COMMAND=json.dumps(["/bin/sh", "-c", dump, "pi"]),
        MY_API_TOKEN="sekret-123",
    )
    done = caller.fork("--json", "--", "show me", env=env)
    run_id = json.loads(done.stdout)["id"]
    folder = caller.state / "runs" / run_id
    assert (folder / "session.jsonl").read_text() == caller.session.read_text().rsplit("\n", 1)[0] + "\n"
    got = dict(
        line.split("=", 1) for line in (folder / "result.json.env").read_text().splitlines() if "=" in line
    )
    assert got["MY_API_TOKEN"] == "sekret-123"
    assert "PI_MATRIX_KEY" not in got  # not from the tmux server's global environment either
    assert "sekret-123" not in " ".join(RunStore(caller.store).get(run_id).argv)
    assert (folder / "fork.sh").stat().st_mode & 0o077 == 0


def test_the_first_stop_request_is_the_reason() -> None:
    from pi_tmux_matrix.fork import StopRequest

    stop = StopRequest()
    assert stop.reason() is None
    stop.parent_shutdown()
    stop.interrupt()
    assert stop.reason() == PARENT_ABORTED
    other = StopRequest()
    other.interrupt()
    assert other.reason() == INTERRUPTED


def test_a_waited_fork_shows_its_progress_on_a_terminal_and_nothing_on_a_pipe(caller: Caller) -> None:
    """Issue 20: ``fork --wait`` says it is still running (an elapsed line on a terminal, erased
    at the end); on a pipe its stderr stays clean."""
    import pty

    piped = caller.fork("--", "say hi")
    assert piped.returncode == 0, piped.stderr
    assert "running" not in piped.stderr and "\r" not in piped.stderr
    argv = [sys.executable, "-m", "pi_tmux_matrix", "fork", "--session", str(caller.session), "--", "HANG on"]
    leader, follower = pty.openpty()
    try:
        with caller.process(argv, stderr=follower, start_new_session=False) as waiter:
            seen = b""
            deadline = time.monotonic() + 30
            while b"s (Ctrl-C stops it)" not in seen or seen.count(b"\r\x1b[2K") < 2:
                assert time.monotonic() < deadline, seen
                ready, _, _ = select.select([leader], [], [], 0.5)
                if ready:
                    seen += os.read(leader, 4096)
            (run,) = [r for r in caller.runs() if r.status is RunStatus.RUNNING]
            assert f"fork {run.id} running in {run.pane_id}: ".encode() in seen
            waiter.send_signal(signal.SIGTERM)
            assert waiter.wait(timeout=30) == 1
    finally:
        os.close(leader)
        os.close(follower)


def test_the_fork_settings_answer_every_pi_start_asks_for_loads_no_store_or_fork_code() -> None:
    """The bridge asks ``runs --fork-settings`` once per pi start: it reads settings, nothing else."""
    modules, done = loaded("runs", "--fork-settings", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["costFooter"] is True
    heavy = ("pi_tmux_matrix.fork", "pi_tmux_matrix.matrix.store", "pi_tmux_matrix.dispatch")
    assert sorted(m for m in modules if m.startswith(heavy)) == []
