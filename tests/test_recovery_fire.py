"""``fire`` confirms the start (issue 18.6): the agent's program is found before a pane is made,
and, asked to (``--confirm-start``; since issue 30 point 4 a fire waits on no start by default,
see test_fire_unconfirmed.py), a host that cannot start its agent makes the fire fail with the
reason, which the job and ``show`` carry. Each test was seen to fail on the code before the change."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from labs import Lab

from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.model import ResultKind


def _profile(at: Lab, name: str, command: list[str]) -> None:
    folder = at.agent_dir / "launch_profiles"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(
        f'[profile]\nname = "{name}"\nprovider = "custom"\ncommand = {json.dumps(command)}\n'
        'mode = "interactive"\ndeadline = 60\n'
    )


def test_a_fire_whose_agent_program_is_missing_fails_before_any_pane_and_writes_no_job(lab: Lab) -> None:
    """No ``pi`` on PATH: it used to print ``launched 1 agent(s)``, exit 0, with the reason only in
    the events file."""
    master = lab.start_master()
    bare = tmp_bin(lab)
    env = dict(lab.env, PATH=str(bare))
    env.pop("PI_MATRIX_PI_COMMAND", None)
    parent = ("--parent-pid", str(master.pid), "--parent-session", "boss")
    fire = ("fire", "--profile", "pi-worker", "--socket", lab.socket, *parent)
    done = lab.cli(*fire, "--", "say hi", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cannot start 'pi'" in done.stderr and "is not on PATH" in done.stderr
    assert "PI_MATRIX_PI_COMMAND" in done.stderr and "Traceback" not in done.stderr
    assert JobStore(lab.store).list_jobs() == ([], [])
    assert not [e for e in lab.store.list().entries if e.key.startswith("worker-")]


def tmp_bin(at: Lab) -> Path:
    """A PATH folder with only what a host needs (tmux), no pi."""
    bare = at.tmp / "bare-bin"
    bare.mkdir(exist_ok=True)
    for tool in ("tmux", "sh"):
        found = subprocess.run(["which", tool], capture_output=True, text=True, check=False).stdout.strip()
        if found and not (bare / tool).exists():
            os.symlink(found, bare / tool)
    return bare


def test_an_agent_whose_start_fails_in_its_host_fails_the_fire_with_the_reason(sublab: Lab) -> None:
    """The program is there but cannot be executed (its interpreter is missing): the host's spawn
    fails; the fire that confirms the start exits 1 naming the reason, the job holds an
    ``exited`` result with it."""
    master = sublab.start_master()
    script = sublab.tmp / "agent.sh"
    script.write_text("#!/nonexistent/interpreter\necho hi\n")
    script.chmod(0o755)
    _profile(sublab, "broken", [str(script), "{task}"])
    parent = ("--parent-pid", str(master.pid), "--parent-session", "boss")
    fire = ("fire", "--profile", "broken", "--backend", "subprocess", "--confirm-start", *parent)
    done = sublab.cli(*fire, "--", "hi")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "could not start" in done.stderr and "No such file or directory" in done.stderr
    (job,), _problems = JobStore(sublab.store).list_jobs()
    (agent,) = job.agents
    result = JobStore(sublab.store).result(job.id, agent.agent_id, 1)
    assert result is not None and result.kind is ResultKind.EXITED and "could not start" in result.detail
    shown = sublab.cli("show", agent.key)
    assert "start        the agent could not start" in shown.stdout, shown.stdout
