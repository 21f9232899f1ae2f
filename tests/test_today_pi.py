"""Issue 29: today's pi. The supported range and a pi's node need (piversion.py), project trust
(pi >= 0.79's "Trust project folder?": workers never trust, a master decides visibly), a pi
under any name (a wrapper, ``node …/cli.js``: the bridge, or a refusal saying ``--provider
pi``), and the version an entry records. The real-pi tests run whatever pi PI_MATRIX_PI_BIN
names; those about trust need one with the dialog (>= 0.79) and skip on an older one."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pilabs import PiLab, pi_lab
from tmux_support import require_tmux
from waiting import wait_for

from pi_tmux_matrix.cli.host import provider_of
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.dispatch.profile import WorkerLaunchProfile, parse_profile
from pi_tmux_matrix.dispatch.providers import agent_command
from pi_tmux_matrix.errors import ContractError, ProfileError
from pi_tmux_matrix.identity import Mode
from pi_tmux_matrix.piversion import (
    TRUST_FLAGS_SINCE,
    PiInfo,
    is_pi_program,
    pi_info,
    program_length,
    supported,
    warn_unsupported,
)
from pi_tmux_matrix.projecttrust import decide_master_trust, trust_requiring_resource
from pi_tmux_matrix.settings import load_settings
from pi_tmux_matrix.testing.fake_model import FakeModel


# -- a pi package as npm lays it out, without pi ------------------------------------------------
def fake_pi(root: Path, version: str, scope: str = "@earendil-works", node: str = ">=22.19.0") -> Path:
    """``node_modules/<scope>/pi-coding-agent`` with its package.json and dist/cli.js, the
    ``.bin/pi`` link npm makes, and install-pi's wrapper ``bin/pi``; returns the wrapper."""
    package = root / "node_modules" / scope / "pi-coding-agent"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text(
        json.dumps({"name": f"{scope}/pi-coding-agent", "version": version, "engines": {"node": node}})
    )
    (package / "dist" / "cli.js").write_text("#!/usr/bin/env node\n")
    (package / "dist" / "cli.js").chmod(0o755)
    (root / "node_modules" / ".bin").mkdir()
    (root / "node_modules" / ".bin" / "pi").symlink_to(package / "dist" / "cli.js")
    (root / "bin").mkdir()
    wrapper = root / "bin" / "pi"
    wrapper.write_text(f'#!/bin/sh\nexec "/usr/bin/node" "{package}/dist/cli.js" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_the_version_and_node_need_come_from_package_json_however_pi_is_started(tmp_path: Path) -> None:
    wrapper = fake_pi(tmp_path, "1.6.0")
    link = tmp_path / "node_modules" / ".bin" / "pi"
    cli = str(tmp_path / "node_modules" / "@earendil-works" / "pi-coding-agent" / "dist" / "cli.js")
    for command in ([str(wrapper)], [str(link)], ["node", cli]):
        info = pi_info(command, ask=False)
        found = (info.version, info.node_need, info.source)
        assert found == ((1, 6, 0), (22, 19, 0), "package.json"), command
        assert info.knows(TRUST_FLAGS_SINCE) and is_pi_program(command)
    assert program_length(["node", cli, "-p", "x"]) == 2 and program_length([str(wrapper), "-p"]) == 1
    assert pi_info([str(tmp_path / "nothing-here")], ask=False) == PiInfo(None)
    fifo = tmp_path / "pi-fifo"  # an argv[0] that would block a plain open(): never read
    os.mkfifo(fifo)
    fifo.chmod(0o755)
    assert pi_info([str(fifo)], ask=False) == PiInfo(None) and not is_pi_program([str(fifo)])


def test_doctor_reports_a_pi_outside_the_range_and_a_node_older_than_it_needs(tmp_path: Path) -> None:
    wrapper = fake_pi(tmp_path, "1.9.0", node=">=99.0.0")
    cli = tmp_path / "node_modules" / "@earendil-works" / "pi-coding-agent" / "dist" / "cli.js"
    cli.write_text("#!/usr/bin/env node\nconsole.log('1.9.0');\n")
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(tmp_path / "state"), "doctor", "--json"],
        env={**os.environ, "PI_MATRIX_PI_COMMAND": json.dumps([str(wrapper)])},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    checks = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    pi, node = checks["pi"], checks["pi's node"]
    assert not pi["ok"] and "1.9.0, outside the supported range 0.73.1 … 1.6.x" in pi["detail"], pi
    assert "bash scripts/install-pi" in pi["fix"]
    assert not node["ok"] and "pi 1.9.0 needs node >=99.0.0" in node["detail"], node
    assert done.returncode == 0  # advisory checks: doctor fails only on what it requires


@pytest.mark.parametrize(
    ("version", "ok"),
    [((0, 73, 1), True), ((0, 73, 0), False), ((0, 87, 1), True), ((1, 6, 9), True), ((1, 7, 0), False)],
)
def test_the_supported_range_is_0_73_1_to_1_6_x(version: tuple[int, int, int], ok: bool) -> None:
    assert supported(version) is ok


def pi_profile(command: str) -> WorkerLaunchProfile:
    return WorkerLaunchProfile(name="w", provider="pi", command=(command,), mode=Mode.INTERACTIVE)


def test_a_worker_never_trusts_the_project_and_the_flag_goes_only_to_a_pi_that_knows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    today = fake_pi(tmp_path / "today", "1.6.0")
    oldest = fake_pi(tmp_path / "oldest", "0.73.1", scope="@mariozechner", node=">=20.6.0")
    newer = fake_pi(tmp_path / "newer", "1.9.0")
    argv = agent_command(pi_profile(str(today)), task="Do it.", session_file=None).argv
    assert "--no-approve" in argv and "--approve" not in argv and argv[-1] == "Do it."
    assert "--no-approve" not in agent_command(pi_profile(str(oldest)), task="x", session_file=None).argv
    with caplog.at_level(logging.WARNING, logger="pi_tmux_matrix"):
        for _ in range(2):
            agent_command(pi_profile(str(newer)), task="x", session_file=None)
    warned = [r.getMessage() for r in caplog.records if "outside the supported range" in r.getMessage()]
    assert len(warned) == 1 and "pi 1.9.0" in warned[0], warned  # once per process
    assert warn_unsupported(PiInfo(None))  # a version it cannot read is not warned about


@pytest.mark.parametrize("flag", ["--approve", "-a"])
def test_a_profile_cannot_make_its_workers_trust_the_project(flag: str) -> None:
    toml = f'[profile]\nname = "p"\nprovider = "pi"\ncommand = ["pi", "{flag}"]\n'
    with pytest.raises(ProfileError, match=r"command\[1\]: .* sets pi's tools, extensions or project trust"):
        parse_profile(toml, "f.toml")
    env = toml.replace(f', "{flag}"', "") + '[profile.env]\nPI_MATRIX_PROJECT_TRUST = "yes"\n'
    with pytest.raises(ProfileError, match=r"PI_MATRIX_PROJECT_TRUST"):
        parse_profile(env, "f.toml")


def test_a_pi_under_another_name_is_pi_or_refused_with_the_flag_that_says_so(tmp_path: Path) -> None:
    fake_pi(tmp_path, "1.6.0")
    cli = str(tmp_path / "node_modules" / "@earendil-works" / "pi-coding-agent" / "dist" / "cli.js")
    assert provider_of(["node", cli, "-p", "x"]) == "pi"
    assert provider_of([str(tmp_path / "node_modules" / ".bin" / "pi")]) == "pi"
    other = tmp_path / "pi-1.6.0"  # a pi-like name whose program cannot be seen from its words
    other.write_text("#!/bin/sh\nexec \"$PI_BIN\" \"$@\"\n")
    with pytest.raises(ContractError) as refused:
        provider_of([str(other)])
    assert refused.value.field == "--provider" and "--provider pi" in refused.value.fix
    assert provider_of([str(other)], "pi") == "pi" and provider_of(["claude"]) == "claude"


def test_a_wrapper_under_any_name_that_runs_pi_is_pi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper = fake_pi(tmp_path, "1.6.0")  # install-pi's wrapper: names pi's cli.js
    by_path = tmp_path / "mypi"
    by_path.write_text(f'#!/bin/sh\nexec "{wrapper}" "$@"\n')
    by_name = tmp_path / "agent"
    by_name.write_text('#!/bin/bash\nset -e\nexport PI_X=1\nexec pi --model x "$@"\n')
    looping = tmp_path / "looping"
    looping.mkdir()
    (looping / "pi").write_text('#!/bin/sh\nexec pi "$@"\n')  # runs "itself" on its own PATH
    for script in (by_path, by_name, looping / "pi"):
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    assert provider_of([str(by_path), "-p", "x"]) == "pi"
    assert provider_of([str(by_name)]) == "pi"  # its bare ``pi``, looked up on PATH
    assert pi_info([str(by_name)]).version == (1, 6, 0)
    monkeypatch.setenv("PATH", f"{looping}:/usr/bin:/bin")
    assert not is_pi_program([str(looping / "pi")])  # followed once, never in a loop
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert provider_of([str(by_name)]) == "agent"  # no pi where the launch looks: another CLI


def test_master_project_trust_is_read_from_the_agent_dir_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"
    (agent).mkdir()
    (project / ".pi").mkdir(parents=True)
    env = {"PI_CODING_AGENT_DIR": str(agent), "HOME": str(tmp_path)}
    (project / ".pi" / "settings.json").write_text('{"processMatrix": {"masterProjectTrust": "trust"}}')
    with caplog.at_level(logging.WARNING, logger="pi_tmux_matrix"):
        assert load_settings(project, env).master_project_trust == "pi"
    assert any("a project cannot grant itself trust" in r.getMessage() for r in caplog.records)
    (agent / "settings.json").write_text('{"processMatrix": {"masterProjectTrust": "never"}}')
    assert load_settings(project, env).master_project_trust == "never"
    (agent / "settings.json").write_text('{"processMatrix": {"masterProjectTrust": "yes"}}')
    assert load_settings(project, env).master_project_trust == "pi"


def test_the_master_says_who_decides_trust_before_pi_starts(tmp_path: Path) -> None:
    agent, work = tmp_path / "agent", tmp_path / "work"
    agent.mkdir()
    (work / ".pi").mkdir(parents=True)
    today, oldest = PiInfo((1, 6, 0)), PiInfo((0, 73, 1))
    assert trust_requiring_resource(str(work)) is None
    assert decide_master_trust(["pi"], today, "pi", str(work), agent).message is None  # nothing to trust
    (work / ".pi" / "settings.json").write_text("{}")
    headless = decide_master_trust(["pi"], today, "pi", str(work), agent, interactive=False)
    assert "no window to ask in" in (headless.message or "")
    asks = decide_master_trust(["pi"], today, "pi", str(work), agent)
    assert asks.flags == () and asks.answer is None
    assert asks.message is not None and "asks 'Trust project folder?'" in asks.message
    (agent / "settings.json").write_text('{"defaultProjectTrust": "always"}')
    assert "pi trusts it (your defaultProjectTrust: always)" in (
        decide_master_trust(["pi"], today, "pi", str(work), agent).message or ""
    )
    never = decide_master_trust(["pi"], today, "never", str(work), agent)
    assert never.flags == ("--no-approve",) and never.answer == "no"
    assert "not trusted" in (never.message or "")
    trust = decide_master_trust(["pi"], PiInfo(None), "trust", str(work), agent)
    assert trust.flags == () and trust.answer == "yes"  # a wrapper's unknown pi: the bridge answers
    assert decide_master_trust(["pi"], oldest, "never", str(work), agent).flags == ()  # no dialog there
    assert decide_master_trust(["pi", "--approve"], today, "never", str(work), agent).flags == ()


# -- real pi ------------------------------------------------------------------------------------
def tool_names(request: dict[str, Any]) -> set[str]:
    return {
        str((t.get("function") or {}).get("name") or t.get("name"))
        for t in request.get("tools") or []
        if isinstance(t, dict)
    }


@pytest.fixture
def plab(tmp_path: Path, tmux_socket: str) -> Iterator[tuple[PiLab, FakeModel, str]]:
    with pi_lab(tmp_path, tmux_socket, PI_MATRIX_TMUX_SOCKET=tmux_socket) as the_lab:
        yield the_lab, the_lab.llm, the_lab.pi


def needs_trust_dialog(binary: str) -> None:
    if not pi_info([binary]).knows(TRUST_FLAGS_SINCE):
        pytest.skip(f"pi {pi_info([binary]).text} has no project-trust dialog (since 0.79)")


def untrusted_project(lab: PiLab) -> None:
    """A project whose own pi settings, were they loaded, would send pi to another model (one the
    agent dir's models.json has too, so pi would use it)."""
    models_path = lab.agent_dir / "models.json"
    models = json.loads(models_path.read_text())
    models["providers"]["fake"]["models"].append(
        {"id": "project-model", "contextWindow": 128000, "maxTokens": 4096}
    )
    models_path.write_text(json.dumps(models))
    (lab.work / ".pi").mkdir()
    (lab.work / ".pi" / "settings.json").write_text(json.dumps({"defaultModel": "project-model"}))


@pytest.mark.real_pi
def test_a_fired_interactive_pi_worker_in_a_project_with_pi_settings_starts_untrusted(
    plab: tuple[PiLab, FakeModel, str],
) -> None:
    require_tmux()
    lab, llm, binary = plab
    needs_trust_dialog(binary)
    untrusted_project(lab)
    lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=90)
    assert result.kind is ResultKind.DONE
    assert {r["model"] for r in llm.requests} == {"fake-model"}  # the project's settings were not loaded
    entry = lab.store.get(agent.key)
    assert entry.agent_version == pi_info([binary]).text  # point 4: the entry records the version


@pytest.mark.real_pi
def test_a_worker_whose_pi_version_cannot_be_seen_is_answered_no_by_its_bridge(
    plab: tuple[PiLab, FakeModel, str], tmp_path: Path
) -> None:
    """A wrapper pi-matrix cannot see into gets no --no-approve: the bridge answers pi's
    project_trust event "no" (PI_MATRIX_PROJECT_TRUST), so the worker neither waits nor trusts."""
    require_tmux()
    lab, llm, binary = plab
    needs_trust_dialog(binary)
    untrusted_project(lab)
    # Its pi is named in another file: nothing in the wrapper's own words says which program runs.
    (tmp_path / "which-pi").write_text(binary)
    wrapper = tmp_path / "my-agent"
    wrapper.write_text(f'#!/bin/sh\nexec "$(cat {tmp_path}/which-pi)" "$@"\n')
    wrapper.chmod(0o755)
    folder = lab.agent_dir / "launch_profiles"
    folder.mkdir()
    (folder / "wrapped.toml").write_text(
        f'[profile]\nname = "wrapped"\nprovider = "pi"\ncommand = ["{wrapper}"]\nmode = "interactive"\n'
        'tools = ["read"]\ndeadline = 120\n'
    )
    lab.start_master()
    fired = lab.fire("Say hello.", profile="wrapped")
    (agent,) = fired.job.agents
    result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=90)
    assert result.kind is ResultKind.DONE
    assert {r["model"] for r in llm.requests} == {"fake-model"}
    events = (lab.state / "events" / f"{agent.key}.jsonl").read_text()
    assert '"child_started"' in events and "--no-approve" not in events


def master_window(lab: PiLab, binary: str, *pi_args: str, provider: tuple[str, ...] = ()) -> None:
    """``pi-matrix master --session-id boss [--provider P] -- <pi> …`` interactive, in tmux."""
    argv = [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", *provider,
            "--", binary, *pi_args]  # fmt: skip
    names = ("PATH", "HOME", "TMPDIR", "PI_OFFLINE", "NO_PROXY", "PI_CODING_AGENT_DIR", "PI_MATRIX_STATE_DIR",
             "PI_MATRIX_PI_COMMAND", "PI_MATRIX_TMUX_SOCKET", "PYTHONPATH", "VIRTUAL_ENV")  # fmt: skip
    env = [w for name in names if name in lab.env for w in ("-e", f"{name}={lab.env[name]}")]
    subprocess.run(
        ["tmux", "-L", lab.socket, "new-session", "-d", "-s", "m", "-x", "160", *env, "-c", str(lab.work),
         "--", *argv],
        env=lab.env, check=True,
    )  # fmt: skip


def capture(lab: PiLab) -> str:
    done = subprocess.run(
        ["tmux", "-L", lab.socket, "capture-pane", "-p", "-J", "-t", "=m:"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout


def bridged_request(lab: PiLab, llm: FakeModel) -> dict[str, Any]:
    """The master pi's first request, once it came: the bridge's tool is in it."""
    request = wait_for("the master pi's first request", lambda: llm.requests[:1], timeout=60,
                       detail=lambda: capture(lab))[0]  # fmt: skip
    assert "tmux_agent_manager" in tool_names(request), tool_names(request)
    return request


@pytest.mark.real_pi
def test_a_master_in_a_project_follows_pis_own_dialog_and_gets_its_bridge_once_answered(
    plab: tuple[PiLab, FakeModel, str],
) -> None:
    require_tmux()
    lab, llm, binary = plab
    needs_trust_dialog(binary)
    untrusted_project(lab)
    master_window(lab, binary, "Begin.")
    wait_for("pi's trust dialog", lambda: "Trust project folder?" in capture(lab), timeout=60,
             detail=lambda: capture(lab))  # fmt: skip
    assert not llm.requests  # nothing runs until it is answered
    subprocess.run(["tmux", "-L", lab.socket, "send-keys", "-t", "=m:", "Enter"], check=True)  # "Trust"
    request = bridged_request(lab, llm)
    assert request["model"] == "project-model"  # trusted: the project's settings apply
    assert lab.store.get("master-boss").agent_version == pi_info([binary]).text


@pytest.mark.real_pi
def test_a_master_decided_ahead_never_shows_the_dialog(plab: tuple[PiLab, FakeModel, str]) -> None:
    require_tmux()
    lab, llm, binary = plab
    needs_trust_dialog(binary)
    untrusted_project(lab)
    settings = json.loads((lab.agent_dir / "settings.json").read_text())
    settings["processMatrix"]["masterProjectTrust"] = "never"
    (lab.agent_dir / "settings.json").write_text(json.dumps(settings))
    master_window(lab, binary, "Begin.")
    request = bridged_request(lab, llm)
    assert request["model"] == "fake-model"  # not trusted: the project's settings are not loaded
    assert "Trust project folder?" not in capture(lab)
    shown = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "show", "master-boss"],
        env=lab.env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert f"version      pi {pi_info([binary]).text}" in shown, shown


@pytest.mark.real_pi
def test_a_pi_wrapper_under_another_name_gets_the_bridge_with_provider_pi_or_is_refused(
    plab: tuple[PiLab, FakeModel, str], tmp_path: Path
) -> None:
    lab, llm, binary = plab
    # Its program is in a variable: nothing in its words says it is pi, its name says it may be.
    wrapper = tmp_path / "pi-today"
    wrapper.write_text('#!/bin/sh\nexec "$PI_TODAY" "$@"\n')
    wrapper.chmod(0o755)
    lab.env["PI_TODAY"] = binary
    base = [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--headless",
            "--mode", "print"]  # fmt: skip
    run: dict[str, Any] = {"env": lab.env, "cwd": lab.work, "stdin": subprocess.DEVNULL,
                           "capture_output": True, "text": True, "timeout": 120}  # fmt: skip
    refused = subprocess.run([*base, "--", str(wrapper), "-p", "Begin."], check=False, **run)
    assert refused.returncode != 0 and "--provider pi" in refused.stderr, refused.stderr
    assert not llm.requests and lab.store.find("master-boss") is None  # refused before anything
    untrusted_project(lab)
    done = subprocess.run([*base, "--provider", "pi", "--", str(wrapper), "-p", "Begin."], check=False, **run)
    assert done.returncode == 0, done.stdout + done.stderr
    model = bridged_request(lab, llm)["model"]
    if pi_info([binary]).knows(TRUST_FLAGS_SINCE):  # said before pi starts, whoever decides
        assert model == "fake-model"  # a headless pi trusts no project (0.73 had no such thing)
        assert "pi-matrix: project trust:" in done.stderr and "no window to ask in" in done.stderr
