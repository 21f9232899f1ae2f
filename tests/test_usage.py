"""Issue 22 (usage): a worker's optional, cooperative usage claim (``<result>.usage.json``, pi's
usage record shape) is read when its round's result is written and shown, advisory, in ``job``,
``jobs --json``, the round's handoff and ``jobs --usage``; nothing is made up when there is no
claim; an invalid claim is reported as one and never shown as numbers; the pi bridge claims
pi's own usage. Real hosts, real tmux on private sockets, the stand-in (opt-in ``STANDIN_USAGE``)
and the real pi against the fake LLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pilabs import MLab, PiPair, job_of, run_print_master
from waiting import wait_for

from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.usage import ClaimedUsage, UsageTotal, parse_claim, read_claim
from pi_tmux_matrix.supervise.handoff_text import handoff_line, handoff_message
from pi_tmux_matrix.testing.fake_model import Reply

CLAIM = '{"input": 1000, "output": 234, "totalTokens": 1234, "cost": {"total": 0.05}, "model": "m-1"}'
LINE = "usage (advisory, claimed by the worker): 1234 tokens, $0.0500, model m-1"


def _profile(name: str, usage: str | None) -> str:
    """The stand-in under pi's argv builder (it takes follow-ups as pi does), claiming ``usage``."""
    env = "" if usage is None else f"env = {{ STANDIN_USAGE = '{usage}' }}\n"
    return (
        f'[profile]\nname = "{name}"\nprovider = "pi"\n'
        'command = ["{python}", "-m", "pi_tmux_matrix.testing.standin"]\nmode = "interactive"\n'
        f"deadline = 120\n{env}"
    )


@pytest.fixture
def ulab(lab: Lab) -> Lab:
    """The Lab with the stand-in under pi's argv builder, claiming usage or not."""
    folder = lab.agent_dir / "launch_profiles"
    folder.mkdir(exist_ok=True)
    (folder / "claims.toml").write_text(_profile("claims", CLAIM))
    (folder / "silent.toml").write_text(_profile("silent", None))
    (folder / "bad-claim.toml").write_text(_profile("bad-claim", '{"input": -5, "totalTokens": 7}'))
    return lab


def cli(lab: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pi_tmux_matrix", *words]
    done = subprocess.run(argv, env=lab.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done


def _round(lab: Lab, profile: str) -> tuple[Any, Any]:
    """Fire one agent of ``profile`` and wait for its first round's result and handoff."""
    lab.start_master()
    fired = lab.fire("Say hello.", profile=profile)
    (agent,) = fired.job.agents
    lab.worker(agent.key)
    wait_for("the round's result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    wait_for("the round's handoff", lambda: lab.store.get(agent.key).handoffs, timeout=20)
    return fired.job, agent


def _agent_json(lab: Lab, job_id: str) -> dict[str, Any]:
    (listed,) = [j for j in json.loads(cli(lab, "jobs", "--json").stdout) if j["jobId"] == job_id]
    shown = json.loads(cli(lab, "job", job_id, "--json").stdout)
    assert shown["agents"] == listed["agents"]
    agent: dict[str, Any] = listed["agents"][0]
    return agent


# --- a claim, shown everywhere, advisory -----------------------------------------------------------
def test_a_workers_claim_shows_advisory_in_job_jobs_json_the_handoff_and_the_usage_totals(ulab: Lab) -> None:
    lab = ulab
    job, agent = _round(lab, "claims")
    claim_file = Path(JobStore(lab.store).claim_path(agent.result_name(job.id, 1)))
    assert claim_file.name == f"{job.id}.{agent.agent_id}.1.usage.json" and claim_file.exists()
    result = lab.result(job.id, agent.agent_id)
    assert result.usage is not None and result.usage.advisory and result.usage.claimed.total_tokens == 1234

    text = cli(lab, "job", job.id).stdout
    assert f"usage of {agent.agent_id} round 1: {LINE}" in text, text
    shown = _agent_json(lab, job.id)["results"][0]["usage"]
    assert shown == {
        "advisory": True,
        "claimed": {
            "input": 1000,
            "output": 234,
            "totalTokens": 1234,
            "cost": {"total": 0.05},
            "model": "m-1",
        },
    }
    entry = lab.store.get(agent.key)
    (handoff,) = entry.handoffs
    assert handoff.usage == LINE
    assert LINE in handoff_message(entry, handoff).splitlines()
    assert handoff_line(entry, handoff).endswith(f"; {LINE}")

    # A follow-up's round is claimed in its own file, named in the follow-up's prompt.
    lab.dispatcher().followup(job.id, "Say it again.")
    wait_for("round 2's result", lambda: lab.result(job.id, agent.agent_id, 2), timeout=60)
    assert lab.result(job.id, agent.agent_id, 2).usage.claimed.total_tokens == 1234
    assert Path(JobStore(lab.store).claim_path(agent.result_name(job.id, 2))).exists()

    totals = cli(lab, "jobs", "--usage").stdout
    assert f"job {job.id}: 2468 tokens, $0.1000 claimed by 1 of 1 agent(s) (advisory)" in totals, totals
    assert "master boss (1 job(s)): 2468 tokens, $0.1000 claimed by 1 of 1 agent(s) (advisory)" in totals
    report = json.loads(cli(lab, "jobs", "--usage", "--json").stdout)
    assert report["advisory"] is True
    (per_job,) = report["jobs"]
    assert per_job["jobId"] == job.id and per_job["totalTokens"] == 2468 and per_job["cost"] == 0.1
    assert per_job["unclaimed"] == 0 and report["masters"][0]["parentSession"] == "boss"


def test_no_claim_means_no_usage_anywhere_and_the_totals_say_the_agent_claimed_nothing(ulab: Lab) -> None:
    lab = ulab
    job, agent = _round(lab, "silent")
    assert lab.result(job.id, agent.agent_id).usage is None
    shown = cli(lab, "job", job.id).stdout
    assert "usage of" not in shown and "advisory" not in shown and "claim" not in shown
    assert _agent_json(lab, job.id)["results"][0]["usage"] is None  # null, never made-up zeros
    (handoff,) = lab.store.get(agent.key).handoffs
    said = handoff_message(lab.store.get(agent.key), handoff)
    assert handoff.usage is None and "advisory" not in said and "usage:" not in said
    totals = cli(lab, "jobs", "--usage").stdout
    assert f"job {job.id}: 0 tokens claimed by 0 of 1 agent(s); 1 claimed nothing (advisory)" in totals
    (per_job,) = json.loads(cli(lab, "jobs", "--usage", "--json").stdout)["jobs"]
    assert per_job["cost"] is None and per_job["unclaimed"] == 1 and per_job["claimedBy"] == 0


def test_an_invalid_claim_is_reported_as_one_and_never_shown_as_numbers(ulab: Lab) -> None:
    lab = ulab
    job, agent = _round(lab, "bad-claim")
    usage = lab.result(job.id, agent.agent_id).usage
    assert usage is not None and usage.claimed is None and "negative" in (usage.invalid or "")
    done = cli(lab, "job", job.id)
    assert "usage: invalid claim (input is negative or not finite)" in done.stdout
    assert "warning" in done.stderr and "invalid claim" in done.stderr
    assert _agent_json(lab, job.id)["results"][0]["usage"] == {
        "advisory": True, "invalid": "input is negative or not finite",
    }  # fmt: skip
    (handoff,) = lab.store.get(agent.key).handoffs
    assert handoff.usage == "usage: invalid claim (input is negative or not finite)"
    totals = cli(lab, "jobs", "--usage").stdout
    assert "0 tokens claimed by 0 of 1 agent(s); 1 claimed nothing; 1 invalid claim(s) not counted" in totals
    assert "7" not in totals.split(job.id, 1)[1].split("\n", 1)[0]


# --- the claim's format, strictly ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("claim", "why"),
    [
        (b'{"input": -1}', "negative"),
        (b'{"input": 1.5}', "whole number"),
        (b'{"input": true}', "not a number"),
        (b'{"input": NaN}', "strict JSON"),
        (b'{"input": 1e999}', "whole number"),
        (b'{"tokens": 5}', "unknown field 'tokens'"),
        (b'{"cost": {"total": "0.1"}}', "cost.total is not a number"),
        (b'{"cost": {"euros": 1}}', "unknown field 'euros'"),
        (b'{"input": 1, "input": 2}', "duplicate key"),
        (b"[1, 2]", "not a JSON object"),
        (b"{}", "no token count and no cost"),
        (b'{"totalTokens": 5, "model": "x\\u001b[2J"}', "printable"),
        (b'{"totalTokens": 5, "pad": "' + b"x" * 5000 + b'"}', "over 4096 bytes"),
    ],
)
def test_a_claim_that_is_not_one_says_why(claim: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_claim(claim)


def test_pis_usage_record_is_a_claim_and_a_missing_or_odd_file_never_breaks_a_reader(tmp_path: Path) -> None:
    pi_record = {
        "input": 10, "output": 5, "cacheRead": 2, "cacheWrite": 1, "totalTokens": 18,
        "cost": {"input": 0.1, "output": 0.2, "cacheRead": 0.0, "cacheWrite": 0.0, "total": 0.3},
        "model": "gpt-x", "provider": "openai",
    }  # fmt: skip
    usage = parse_claim(json.dumps(pi_record).encode())
    assert usage.tokens == 18 and usage.dollars == 0.3 and usage.provider == "openai"
    assert parse_claim(b'{"input": 3, "output": 4}').tokens == 7  # no totalTokens: the claimed parts
    assert read_claim(str(tmp_path / "absent.usage.json")) is None
    os.symlink("/etc/passwd", tmp_path / "link.usage.json")
    linked = read_claim(str(tmp_path / "link.usage.json"))
    assert linked is not None and linked.claimed is None and linked.invalid
    os.mkdir(tmp_path / "dir.usage.json")
    odd = read_claim(str(tmp_path / "dir.usage.json"))
    assert odd is not None and odd.claimed is None
    total = UsageTotal.of([[ClaimedUsage(claimed=usage), None], [None], [ClaimedUsage(invalid="bad")]])
    assert (total.agents, total.claimed_by, total.unclaimed, total.invalid, total.tokens) == (3, 1, 2, 1, 18)


# --- the pi bridge claims pi's own usage ------------------------------------------------------------
@pytest.mark.real_pi
def test_a_pi_workers_bridge_claims_pis_own_usage_for_the_round(
    pilab: PiPair,
) -> None:
    lab, _llm = pilab
    profile_dir = lab.agent_dir / "launch_profiles"
    profile_dir.mkdir(exist_ok=True)
    (profile_dir / "pi-print.toml").write_text(
        '[profile]\nname = "pi-print"\nprovider = "pi"\ncommand = ["pi"]\nmode = "print"\ndeadline = 120\n'
    )
    lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-print")
    (agent,) = fired.job.agents
    result = wait_for("the round's result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=90)
    wait_for("the handoff", lambda: lab.store.get(agent.key).handoffs, timeout=30)
    (handoff,) = lab.store.get(agent.key).handoffs
    artifact = json.loads(Path(str(handoff.result_pointer)).read_text())
    pis = artifact["usage"]  # pi's own record of the run's (one) assistant message
    assert pis and pis["totalTokens"] > 0, artifact
    assert result.usage is not None and result.usage.claimed is not None, result
    claimed = result.usage.claimed
    assert (claimed.input, claimed.output, claimed.total_tokens) == (
        pis["input"],
        pis["output"],
        pis["totalTokens"],
    )
    assert claimed.cost is not None and claimed.cost.total == pis["cost"]["total"]
    assert claimed.model == artifact.get("model", claimed.model) and claimed.provider
    assert handoff.usage is not None and f"{pis['totalTokens']} tokens" in handoff.usage


# --- the master's tool ------------------------------------------------------------------------------
@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_master_tools_list_jobs_with_usage_gives_the_claimed_totals(
    mlab: MLab,
) -> None:
    lab, llm, script = mlab
    (lab.agent_dir / "launch_profiles" / "claims.toml").write_text(_profile("claims", CLAIM))

    def when_done(previous: str) -> Reply:
        job_id = job_of(previous)
        store = JobStore(lab.store)
        wait_for("the worker's result", lambda: store.results_of(store.get(job_id)).get(next(
            a.agent_id for a in store.get(job_id).agents), []), timeout=60)  # fmt: skip
        return Reply(tool="tmux_agent_manager", arguments={"action": "list_jobs", "usage": True})

    script.steps = [tool(action="fire_task", profile="claims", task="Say hello."), when_done]
    done = run_print_master(lab, "Launch one worker, then tell me what it used.")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(last_tool_result(llm.requests[2]))
    assert report["advisory"] is True
    (per_job,) = report["jobs"]
    assert per_job["totalTokens"] == 1234 and per_job["cost"] == 0.05 and per_job["claimedBy"] == 1
    assert report["masters"] == [{"parentSession": "boss", "jobs": 1, **{k: per_job[k] for k in per_job
                                  if k not in ("jobId", "parentSession")}}]  # fmt: skip


def test_a_forced_relaunch_of_a_launch_key_never_shows_the_old_jobs_claim(tmp_path: Path) -> None:
    """``fire --launch-key K --force`` archives the old job; the new one has the same result
    names, so the old claims go with the archive (each archived result keeps its own usage)."""
    from helpers import plant_job

    from pi_tmux_matrix.dispatch.jobs import result_now
    from pi_tmux_matrix.dispatch.model import ResultKind
    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    jobs = JobStore(store)
    job = plant_job(store, "my-launch-key", tmp_path)
    (agent,) = job.agents
    claim = Path(jobs.claim_path(agent.result_name(job.id, 1)))
    claim.write_text(CLAIM)
    written = jobs.put_result(result_now(job, agent.agent_id, agent.key, 1, ResultKind.DONE))
    assert written is not None and written.usage is not None and written.usage.claimed is not None
    jobs.archive(job)
    assert not claim.exists()
    again = plant_job(store, "my-launch-key", tmp_path)
    fresh = jobs.put_result(result_now(again, agent.agent_id, agent.key, 1, ResultKind.DONE))
    assert fresh is not None and fresh.usage is None


def test_a_pi_rounds_result_waits_for_the_claim_of_the_run_that_printed_the_marker(tmp_path: Path) -> None:
    """A round of two pi runs: the first run's claim is already there when the marker shows; the
    result waits for the bridge's claim of the marker's run (written just before its artifact)."""
    import threading
    import time

    from helpers import in_host, plant_job

    from pi_tmux_matrix.dispatch.model import ResultKind
    from pi_tmux_matrix.dispatch.watch import Watcher
    from pi_tmux_matrix.matrix.store import MatrixStore

    store = MatrixStore(tmp_path / "state")
    job = plant_job(store, "job-20261205-080000-abcdef", tmp_path)
    (agent,) = job.agents
    claim = Path(JobStore(store).claim_path(agent.result_name(job.id, 1)))
    artifacts = store.root / "artifacts" / agent.key
    artifacts.mkdir(parents=True)
    claim.write_text('{"totalTokens": 10}')  # the round's first run (a steer while pi was idle)
    (artifacts / "run-0001.json").write_text(json.dumps({"text": "looking"}))

    def marker_run_ends() -> None:
        time.sleep(0.5)
        claim.write_text('{"totalTokens": 25}')
        (artifacts / "run-0002.json").write_text(json.dumps({"text": f"done\nDONE:{agent.nonce}"}))

    ending = threading.Thread(target=marker_run_ends)
    with in_host() as host:
        watcher = Watcher(store, job, agent, 1, host)
        watcher.scanner.feed(f"done\nDONE:{agent.nonce}\n".encode())
        watcher._found = (ResultKind.DONE, "")
        ending.start()
        try:
            assert watcher._marker_found()
        finally:
            ending.join()
    result = JobStore(store).result(job.id, agent.agent_id, 1)
    assert result is not None and result.usage is not None and result.usage.claimed is not None
    assert result.usage.claimed.total_tokens == 25


# --- spend in view (issue 31.10) ------------------------------------------------------------------
def test_top_and_jobs_show_each_agents_claimed_spend_and_the_masters_total(ulab: Lab) -> None:
    lab = ulab
    job, agent = _round(lab, "claims")
    silent = lab.fire("Say hello.", profile="silent").job
    (quiet,) = silent.agents
    wait_for("the silent round's result", lambda: lab.result(silent.id, quiet.agent_id), timeout=60)
    env = dict(lab.env, COLUMNS="250")
    argv = [sys.executable, "-m", "pi_tmux_matrix"]
    jobs = subprocess.run(
        [*argv, "jobs"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "SPEND" in jobs.splitlines()[0], jobs
    (job_row,) = [line for line in jobs.splitlines() if line.startswith(job.id)]
    (agent_row,) = [line for line in jobs.splitlines() if agent.key in line]
    assert "$0.05" in job_row and "$0.05" in agent_row, jobs
    (silent_row,) = [line for line in jobs.splitlines() if quiet.key in line]
    assert "$" not in silent_row, jobs  # it claimed nothing: nothing is made up
    top = subprocess.run(
        [*argv, "top", "--once"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    (master_row,) = [line for line in top.splitlines() if line.startswith("master-boss")]
    (worker_row,) = [line for line in top.splitlines() if agent.key in line]
    assert "$0.05" in master_row and "$0.05" in worker_row, top
