"""The worker's envelope on real pi (issue 7): the bridge blocks structural tool calls outside the
allowed paths and inside the private roots, pi's --tools is the ceiling, and a malformed
PI_WORKER_ALLOWED_PATHS never runs a session. Real pi against the fake LLM, one pi per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import read_events
from model_script import tool_results
from pi_support import pi_bin, pi_jiti, pi_search_path, pi_temp
from pilabs import PiPair, run_worker, scoped_profile
from waiting import wait_for

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.contract import ENV_ALLOWED_PATHS
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply, write_pi_agent_dir


@pytest.mark.real_pi
def test_a_worker_scoped_to_its_worktree_writes_inside_and_every_escape_is_blocked(pilab: PiPair) -> None:
    lab, llm = pilab
    worktree = lab.work  # {worktree} without a lane is the launch's cwd
    outside = lab.tmp / "outside"
    outside.mkdir()
    (worktree / "escape").symlink_to(outside)
    sibling = lab.tmp / "sibling" / "a.txt"
    evil = Path(f"{worktree}-evil") / "b.txt"
    scoped_profile(lab, "pi-scoped", tools=["read", "write"], write_paths=["{worktree}"])

    agent = run_worker(
        lab, llm, "pi-scoped",
        Reply(tool="write", arguments={"path": "inside.txt", "content": "fine"}),
        Reply(tool="write", arguments={"path": str(sibling), "content": "no"}),
        Reply(tool="write", arguments={"path": str(evil), "content": "no"}),
        Reply(tool="write", arguments={"path": "escape/c.txt", "content": "no"}),
        Reply(tool="write", arguments={"path": "../x.txt", "content": "no"}),
    )  # fmt: skip

    assert (worktree / "inside.txt").read_text() == "fine"
    for escaped in (sibling, evil, outside / "c.txt", lab.tmp / "x.txt"):
        assert not escaped.exists(), f"{escaped} was written"
    assert not sibling.parent.exists() and not evil.parent.exists()  # not even the folder
    results = tool_results(llm)
    assert len(results) == 5
    assert "Successfully wrote" in results[0]
    for result, shown in zip(results[1:], (str(sibling), str(evil), "escape/c.txt", "../x.txt"), strict=True):
        assert "pi-matrix envelope: write of" in result and shown in result
        assert "outside this worker's allowed paths" in result and str(worktree) in result
    assert f"really {outside}/c.txt" in results[3]  # the symlink is followed, not trusted

    # The appended system prompt: identity, scope, bash boundary, lane, no spawning.
    system = next(m for m in llm.requests[0]["messages"] if m.get("role") == "system")
    prompt = system["content"] if isinstance(system["content"], str) else json.dumps(system["content"])
    assert f"pi-matrix worker {agent.agent_id} (launch profile pi-scoped" in prompt
    assert f"may only touch paths inside {worktree}" in prompt
    assert "not a sandbox" in prompt and "no worktree lane" in prompt
    assert "Do not start other agents" in prompt

    # Every block is in the worker's own events, and `pi-matrix show` lists them.
    wait_for("4 tool_blocked events", lambda: len(read_events(lab.state, agent.key, "tool_blocked")) == 4)
    records = read_events(lab.state, agent.key, "tool_blocked")
    assert [r["path"] for r in records] == [str(sibling), str(evil), "escape/c.txt", "../x.txt"]
    assert all(r["tool"] == "write" and "allowed paths" in r["reason"] for r in records)
    show = [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "show", agent.key]
    text = subprocess.run(show, capture_output=True, text=True, env=lab.env, timeout=30, check=True).stdout
    assert text.count("  blocked      ") == 4 and "write ../x.txt" in text
    as_json = subprocess.run(
        [*show, "--json"], capture_output=True, text=True, env=lab.env, timeout=30, check=True
    ).stdout
    shown = json.loads(as_json)
    assert [b["path"] for b in shown["toolBlocks"]] == [r["path"] for r in records]


@pytest.mark.real_pi
def test_a_full_scope_worker_still_cannot_touch_pi_secrets_the_state_dir_or_other_sessions(
    pilab: PiPair,
) -> None:
    lab, llm = pilab
    auth = lab.agent_dir / "auth.json"
    auth.write_text("{}")
    foreign = lab.agent_dir / "sessions" / "--elsewhere--" / "other.jsonl"
    foreign.parent.mkdir(parents=True)
    foreign.write_text('{"type":"session","id":"other"}\n')
    (lab.agent_dir / "notes.txt").write_text("apiKey rotation is due\n")  # public: the grep finds it
    scoped_profile(lab, "pi-full", tools=["read", "write", "grep"], write_paths=[])

    lab.start_master()
    llm.script(
        Reply(tool="write", arguments={"path": str(auth), "content": '{"stolen": 1}'}),
        Reply(tool="write", arguments={"path": str(lab.state / "jobs" / "forged.json"), "content": "{}"}),
        Reply(tool="read", arguments={"path": str(foreign)}),
        Reply(tool="grep", arguments={"pattern": "apiKey", "path": str(lab.agent_dir)}),
        Reply(tool="write", arguments={"path": str(lab.tmp / "anywhere.txt"), "content": "fine"}),
    )
    fired = lab.fire("Do the file chores.", profile="pi-full")
    (agent,) = fired.job.agents
    # The own session file stays readable: one more call, aimed at this agent's own transcript.
    llm.script(Reply(tool="read", arguments={"path": agent.session_file}))
    wait_for("the result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    wait_for("the host to record the end", lambda: lab.store.get(agent.key).exit is not None, timeout=30)

    assert json.loads(auth.read_text()) == {}
    assert not (lab.state / "jobs" / "forged.json").exists()
    assert (lab.tmp / "anywhere.txt").read_text() == "fine"  # [] is full scope
    results = tool_results(llm)
    assert len(results) == 6
    assert "pi's auth.json" in results[0] and "no worker may touch" in results[0]
    assert "pi-matrix state dir" in results[1]
    assert "session files" in results[2] and "other sessions" in results[2]
    # A search of a folder holding a private root runs (issue 16.4): what it finds inside the
    # private root is taken out of its result (tests/test_envelope.py::test_a_search_*).
    assert not results[3].startswith("pi-matrix envelope")
    assert "notes.txt:1: apiKey rotation is due" in results[3], results[3]  # the grep ran and found
    assert "fake-key" not in results[3] and "2 line(s) from private folders" in results[3], results[3]
    assert "Successfully wrote" in results[4]
    own = results[5]  # the transcript itself (which quotes the blocks above), not a block
    assert not own.startswith("pi-matrix envelope") and own.replace(" ", "").startswith('{"type":"session"')
    wait_for("3 tool_blocked events", lambda: len(read_events(lab.state, agent.key, "tool_blocked")) == 3)
    blocked = read_events(lab.state, agent.key, "tool_blocked")
    assert [r["tool"] for r in blocked] == ["write", "write", "read"]


@pytest.mark.real_pi
def test_the_host_refuses_a_malformed_allowed_paths_value_before_starting_pi(tmp_path: Path) -> None:
    binary = pi_bin()
    marker = tmp_path / "pi-ran"
    env = dict(os.environ, PI_MATRIX_STATE_DIR=str(tmp_path / "state"))
    for raw in ('["relative/path"]', "not json", '{"a": 1}', '["/ok", "/a/../b"]'):
        env[ENV_ALLOWED_PATHS] = raw
        done = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", "host", "--parent-pid", str(os.getpid()),
             "--mode", "print", "--", "sh", "-c", f"touch {marker}; exec {binary} --version"],
            capture_output=True, text=True, env=env, timeout=30, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 2, (raw, done.stderr)
        assert "PI_WORKER_ALLOWED_PATHS" in done.stderr and "Traceback" not in done.stderr
        assert not marker.exists(), f"the agent was started with {raw!r}"
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").glob("worker-*.json"))


@pytest.mark.real_pi
def test_the_bridge_alone_given_a_malformed_value_ends_the_session_before_any_tool_runs(
    tmp_path: Path,
) -> None:
    binary = pi_bin()
    work = tmp_path / "work"
    work.mkdir()
    state = tmp_path / "state"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    target = work / "written.txt"
    with FakeModel() as llm:
        write_pi_agent_dir(Path(os.environ["PI_CODING_AGENT_DIR"]), llm.base_url)
        llm.script(Reply(tool="write", arguments={"path": str(target), "content": "no"}))
        key = f"worker-{uuid.uuid4()}"
        env = dict(
            os.environ, PI_MATRIX_KEY=key, PI_MATRIX_STATE_DIR=str(state), PI_PARENT_PID=str(os.getpid()),
            PI_WORKER_ALLOWED_PATHS='["relative"]', PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost",
            TMPDIR=pi_temp(tmp),
        )  # fmt: skip
        done = subprocess.run(
            [binary, "-p", "--no-session", "-e", str(bridge_path()), "Write the file."],
            capture_output=True, text=True, env=env, cwd=work, timeout=60, check=False,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        asked = list(llm.requests)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "PI_WORKER_ALLOWED_PATHS item 0" in done.stderr and "is relative" in done.stderr
    assert asked == [], "the model was never asked, so no tool call could run"
    assert not target.exists()
    reports = [json.loads(p.read_text()) for p in sorted((state / "mailbox" / key).glob("*.json"))]
    refused = [json.loads(r["text"]) for r in reports if r["kind"] == "bridge"]
    assert any(r.get("event") == "envelope_refused" and "relative" in r["reason"] for r in refused)


@pytest.mark.real_pi
def test_the_profile_tool_ceiling_makes_pi_itself_refuse_bash(pilab: PiPair) -> None:
    lab, llm = pilab
    pwned = lab.work / "pwned"
    scoped_profile(lab, "pi-rw", tools=["read", "write"], write_paths=["{worktree}"])
    agent = run_worker(lab, llm, "pi-rw", Reply(tool="bash", arguments={"command": f"touch {pwned}"}))
    (result,) = tool_results(llm)
    assert "Tool bash not found" in result  # pi's own refusal: bash was never given to this worker
    assert not pwned.exists()
    started = read_events(lab.state, agent.key, "child_started")
    argv = started[0]["argv"]
    assert argv[argv.index("--tools") + 1] == "read,write"
    assert read_events(lab.state, agent.key, "tool_blocked") == []  # not the envelope: pi had no such tool


@pytest.mark.parametrize("tool", ["tmux_agent_manager", "fork", "subagent"])
def test_a_profile_may_not_grant_an_agent_launching_tool(tool: str) -> None:
    from pi_tmux_matrix.dispatch.profile import parse_profile
    from pi_tmux_matrix.errors import ProfileError

    text = f'[profile]\nname = "p"\nprovider = "pi"\ncommand = ["pi"]\ntools = ["read", "{tool}"]\n'
    with pytest.raises(ProfileError) as info:
        parse_profile(text, "p.toml")
    assert "profile.tools[1]" in str(info.value) and "launches agents" in str(info.value)


@pytest.mark.real_pi
def test_the_resolver_judges_paths_the_way_the_kernel_will_open_them(tmp_path: Path) -> None:
    """envelope.ts's judge() on its own (through pi's jiti, no LLM): `..` after a symlink is the
    target's parent, a dangling link is followed, pi's `@`/`~` forms are expanded first."""
    jiti = pi_jiti()
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "out").symlink_to("../outside")
    (root / "dangling").symlink_to(tmp_path / "nowhere" / "file")
    (root / "loop").symlink_to("loop")
    cases = {
        f"{root}/sub/../a": True,
        f"{root}/out/../root/x": True,  # physically tmp/root/x
        f"{root}/out/../escaped": False,  # lexically inside root, physically tmp/escaped
        f"{root}/out/x": False,
        "out/../x": True,  # relative: pi joins and normalises it first, as the kernel then sees
        "dangling": False,
        "loop/x": False,  # ELOOP: blocked, never trusted
        "@sub/x": True,
        "~/x": False,
        f"{root}-evil/x": False,
        str(root): True,
    }
    script = tmp_path / "judge.mjs"
    source, module = json.dumps(str(root)), json.dumps(str(bridge_path().parent / "envelope.ts"))
    script.write_text(
        f"import {{ createJiti }} from {json.dumps(str(jiti))};\n"
        f"const m = await createJiti(import.meta.url).import({module});\n"
        f"const e = {{ allowed: [m.physical({source})], privateRoots: [], sessionsDirs: [] }};\n"
        f"const paths = {json.dumps(list(cases))};\n"
        f"console.log(JSON.stringify(paths.map((p) => m.judge(e, 'write', p, {source}, null) ?? null)));\n"
    )
    done = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=60, check=False,
        env=dict(os.environ, TMPDIR=pi_temp(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    verdicts = dict(zip(cases, json.loads(done.stdout), strict=True))
    wrong = {p: v for p, v in verdicts.items() if (v is None) != cases[p]}
    assert not wrong, wrong
    assert "symbolic links" in str(verdicts["loop/x"])


def test_the_host_refuses_a_confined_pi_child_without_the_bridge(tmp_path: Path) -> None:
    """Fail closed (issue 16): allowed paths or a tool ceiling on a pi child whose argv lacks
    ``-e <bridge>`` stop the host before anything starts (exit 2, naming the missing bridge); with
    the bridge, or unconfined, it starts."""
    marker = tmp_path / "pi-ran"
    state = tmp_path / "state"
    fake_pi = tmp_path / "bin" / "pi"
    fake_pi.parent.mkdir()
    fake_pi.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake_pi.chmod(0o755)

    def host(allowed: str, *agent: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PI_MATRIX_STATE_DIR=str(state), **{ENV_ALLOWED_PATHS: allowed})
        return subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", "host", "--parent-pid", str(os.getpid()),
             "--mode", "print", "--", str(fake_pi), *agent],
            capture_output=True, text=True, env=env, timeout=30, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    for allowed, agent in (
        (json.dumps([str(tmp_path)]), ["-p", "hello"]),
        ("[]", ["--tools", "read", "-p", "hello"]),
        (json.dumps([str(tmp_path)]), ["-e", str(tmp_path / "other.ts"), "-p", "hello"]),
    ):
        done = host(allowed, *agent)
        assert done.returncode == 2, (allowed, agent, done.stderr)
        assert "-e <bridge>" in done.stderr and str(bridge_path()) in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not marker.exists(), f"pi was started confined without its bridge: {agent}"
    assert not state.exists() or not list(state.glob("worker-*.json")), "an entry was left behind"

    done = host(json.dumps([str(tmp_path)]), "-e", str(bridge_path()), "-p", "hello")
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    marker.unlink()
    assert host("[]", "-p", "hello").returncode == 0 and marker.exists()


@pytest.mark.real_pi
def test_planted_code_is_never_loaded_and_a_worker_cannot_plant_it(pilab: PiPair) -> None:
    """Issue 16.2 and 16.3 on real pi: a worker cannot write into a .pi folder, .git/hooks or the
    agent dir (whatever the path trick: a missing folder, then `..`, then a symlink), and an
    extension already planted in the project's .pi/extensions is not loaded by the next worker
    (workers start with --no-extensions; only the bridge and their profile's own come with -e)."""
    lab, llm = pilab
    worktree = lab.work
    marker = lab.tmp / "planted-extension-ran"
    planted = worktree / ".pi" / "extensions" / "helper.ts"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        'import * as fs from "node:fs";\n'
        f"export default function () {{ fs.writeFileSync({json.dumps(str(marker))}, 'loaded'); }}\n"
    )
    (worktree / ".git" / "hooks").mkdir(parents=True)
    (worktree / "cfg").symlink_to(lab.agent_dir)
    scoped_profile(lab, "pi-scoped", tools=["read", "write"], write_paths=["{worktree}"])

    agent = run_worker(
        lab, llm, "pi-scoped",
        Reply(tool="write", arguments={"path": ".pi/extensions/more.ts", "content": "export default 0;"}),
        Reply(tool="write", arguments={"path": ".git/hooks/post-checkout", "content": "#!/bin/sh\n"}),
        Reply(tool="write", arguments={"path": f"{worktree}/m-w/../cfg/auth.json", "content": "{}"}),
        Reply(tool="write", arguments={"path": "fine.txt", "content": "fine"}),
    )  # fmt: skip

    assert not marker.exists(), "the planted extension ran inside the worker"
    assert not (worktree / ".pi" / "extensions" / "more.ts").exists()
    assert not (worktree / ".git" / "hooks" / "post-checkout").exists()
    assert json.loads((lab.agent_dir / "auth.json").read_text() or "{}") is not None
    assert (worktree / "fine.txt").read_text() == "fine"
    results = tool_results(llm)
    assert "a .pi folder" in results[0] and "a repository's .git" in results[1]
    assert "pi's agent dir" in results[2] or "auth.json" in results[2]
    wait_for("3 tool_blocked events", lambda: len(read_events(lab.state, agent.key, "tool_blocked")) == 3)


@pytest.mark.real_pi
def test_a_search_runs_where_private_roots_are_absent_and_leaves_out_what_is_inside_them(
    tmp_path: Path,
) -> None:
    """Issue 16.4, envelope.ts on its own (through pi's jiti): grep/find of the worktree are not
    blocked by a private root that does not exist (the project's .pi/settings.json usually does
    not), nor by one that does; lines from inside an existing one are taken out of the result."""
    jiti = pi_jiti()
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "secrets").mkdir()
    (work / "secrets" / "key.txt").write_text("apiKey=1\n")
    (work / "src" / "a.ts").write_text("apiKey\n")  # every kept line names a file that exists (28.5)
    script = tmp_path / "search.mjs"
    module = json.dumps(str(bridge_path().parent / "envelope.ts"))
    w = json.dumps(str(work))
    script.write_text(
        f"import {{ createJiti }} from {json.dumps(str(jiti))};\n"
        f"const m = await createJiti(import.meta.url).import({module});\n"
        f"const e = {{ allowed: [m.physical({w})], sessionsDirs: [], privateRoots: [\n"
        f"  {{ real: m.physical({w} + '/.pi/settings.json'), what: 'settings' }},\n"
        f"  {{ real: m.physical({w} + '/secrets'), what: 'secrets' }}] }};\n"
        "const out = {\n"
        f"  grepCwd: m.judge(e, 'grep', '.', {w}, null) ?? null,\n"
        f"  findCwd: m.judge(e, 'find', '.', {w}, null) ?? null,\n"
        f"  grepInside: m.judge(e, 'grep', 'secrets', {w}, null) ?? null,\n"
        f"  hidden: m.hiddenFrom(e, m.physical({w})),\n"
        f"  grep: m.withoutHidden('grep', 'src/a.ts:1: apiKey\\nsecrets/key.txt:1: apiKey=1\\n"
        f"secrets/key.txt-2- x\\n\\n[50 matches limit reached]', m.physical({w}),\n"
        f"    m.hiddenFrom(e, m.physical({w}))),\n"
        f"  find: m.withoutHidden('find', 'src/a.ts\\nsecrets/\\nsecrets/key.txt', m.physical({w}),\n"
        f"    m.hiddenFrom(e, m.physical({w}))),\n"
        "};\n"
        "console.log(JSON.stringify(out));\n"
    )
    done = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=60, check=False,
        env=dict(os.environ, TMPDIR=pi_temp(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["grepCwd"] is None and out["findCwd"] is None  # the searches run
    assert "secrets" in str(out["grepInside"])  # a search inside a private root is still blocked
    assert out["hidden"] == [str((work / "secrets").resolve())]  # only the one that exists
    assert out["grep"]["text"] == "src/a.ts:1: apiKey\n\n[50 matches limit reached]"
    assert out["grep"]["removed"] == 2
    assert out["find"] == {"text": "src/a.ts", "removed": 2}


@pytest.mark.real_pi
def test_a_real_pi_search_of_the_worktree_runs_and_leaves_out_a_private_root(pilab: PiPair) -> None:
    """Issue 16.4 on real pi (ripgrep and fd from Debian's packages): grep and find of the worktree
    run and find what is there; the project's .pi/settings.json, a private root that exists
    inside it, is left out. The worktree is no git repository, so pi passes fd
    ``--no-require-git`` (pi 0.73.1 always does): Debian's fd 8.6 runs through install-pi's
    adapter, and what the worktree's .gitignore names stays out, as pi promises."""
    lab, llm = pilab
    pi_search_path(pi_bin(), lab.agent_dir)  # pi finds rg and an fd it can run (install-pi's wrapper)
    worktree = lab.work
    (worktree / "src").mkdir()
    (worktree / "src" / "a.txt").write_text("apiKey in the code\n")
    (worktree / "src" / "config.json").write_text("{}\n")
    (worktree / ".pi").mkdir()
    (worktree / ".pi" / "settings.json").write_text('{"apiKey": "secret-value"}\n')
    (worktree / ".gitignore").write_text("/build\n")
    (worktree / "build").mkdir()
    (worktree / "build" / "out.json").write_text("{}\n")
    scoped_profile(lab, "pi-search", tools=["read", "grep", "find"], write_paths=["{worktree}"])

    run_worker(
        lab, llm, "pi-search",
        Reply(tool="grep", arguments={"pattern": "apiKey", "hidden": True}),
        Reply(tool="find", arguments={"pattern": "*.json", "hidden": True}),
    )  # fmt: skip

    grep, find = tool_results(llm)
    assert "src/a.txt" in grep and "secret-value" not in grep, grep
    assert not grep.startswith("pi-matrix envelope")
    # find ran: the public file is found (a failed find names none), the gitignored one is not,
    # and the one private line is taken out, the note naming the private root, not what was in it.
    listed = find.split("[pi-matrix envelope:")[0]
    assert listed.split() == ["src/config.json"], find
    assert "settings.json" not in listed and "out.json" not in find, find
    assert "1 line(s) from private folders" in find, find


@pytest.mark.real_pi
def test_a_worker_cannot_aim_its_lanes_git_file_at_a_git_dir_it_wrote(pilab: PiPair) -> None:
    """Issue 28 case 1 on real pi: a worker with read, write and edit in its lane writes a git dir
    of its own under another name (HEAD, objects/, refs/heads/, a config whose core.fsmonitor is a
    command), then tries to aim the worktree's ``.git`` file at it (write, then edit). Both ``.git``
    writes are blocked and the pointer is unchanged; ``pi-matrix lanes`` afterwards runs git
    status in that worktree and the command never runs."""
    lab, llm = pilab
    repo = lab.work
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True, timeout=30, env=lab.env)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "init"], check=True, timeout=30, env=lab.env)
    canary = lab.tmp / "canary-fsmonitor"
    record = f"{os.path.realpath(repo)}/.git/worktrees/lane-1"
    scoped_profile(lab, "pi-lane", tools=["read", "write", "edit"], write_paths=["{worktree}"])

    agent = run_worker(
        lab, llm, "pi-lane",
        Reply(tool="write", arguments={"path": ".evilgit/HEAD", "content": "ref: refs/heads/main\n"}),
        Reply(tool="write", arguments={"path": ".evilgit/objects/info/keep", "content": ""}),
        Reply(tool="write", arguments={"path": ".evilgit/refs/heads/keep", "content": ""}),
        Reply(tool="write", arguments={
            "path": ".evilgit/config", "content": f'[core]\n\tfsmonitor = "touch {canary}"\n',
        }),
        Reply(tool="write", arguments={"path": ".git", "content": "gitdir: .evilgit\n"}),
        Reply(tool="edit", arguments={"path": ".git", "edits": [{"oldText": record, "newText": ".evilgit"}]}),
        Reply(tool="write", arguments={"path": "src/../.git", "content": "gitdir: .evilgit\n"}),
        lane="lane-1",
    )  # fmt: skip

    worktree = repo / ".worktrees" / "lane-1"
    lanes = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "lanes", "--path", str(repo),
         "--json"],
        capture_output=True, text=True, env=lab.env, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert not canary.exists(), "the planted core.fsmonitor ran when pi-matrix lanes ran git status"
    assert lanes.returncode == 0, lanes.stderr
    assert [(lane["name"], lane["state"]) for lane in json.loads(lanes.stdout)] == [("lane-1", "dirty")]
    assert (worktree / ".git").read_text() == f"gitdir: {record}\n"  # the pointer git wrote
    assert (worktree / ".evilgit" / "config").is_file()  # inert: nothing points at it
    results = tool_results(llm)
    assert len(results) == 7
    assert all("Successfully wrote" in result for result in results[:4]), results[:4]
    for result in results[4:]:
        assert "pi-matrix envelope:" in result and "a repository's .git" in result, result
    wait_for("3 tool_blocked events", lambda: len(read_events(lab.state, agent.key, "tool_blocked")) == 3)
    blocked = read_events(lab.state, agent.key, "tool_blocked")
    assert [(r["tool"], r["path"]) for r in blocked] == [
        ("write", ".git"),
        ("edit", ".git"),
        ("write", "src/../.git"),
    ]
    system = next(m for m in llm.requests[0]["messages"] if m.get("role") == "system")
    prompt = system["content"] if isinstance(system["content"], str) else json.dumps(system["content"])
    assert "any .git file or folder" in prompt
