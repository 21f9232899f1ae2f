"""The fork cap under a race: forks started at the same moment are counted under one lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from forklab import Caller


def test_forks_started_at_once_never_exceed_the_cap(caller: Caller) -> None:
    agent_dir = Path(caller.env["PI_CODING_AGENT_DIR"])
    agent_dir.mkdir(parents=True, exist_ok=True)
    (agent_dir / "settings.json").write_text(json.dumps({"processMatrix": {"maxConcurrentForks": 1}}))
    slow = dict(caller.env, STANDIN_STEPS="2000")
    argv = [sys.executable, "-m", "pi_tmux_matrix", "fork", "--session", str(caller.session), "--background"]
    racers = [
        subprocess.Popen(
            [*argv, "--", f"racer {n}"],
            env=slow,
            cwd=caller.work,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(5)
    ]
    outcomes = [(racer.wait(timeout=90), racer.stderr.read() if racer.stderr else "") for racer in racers]
    for racer in racers:
        for stream in (racer.stdout, racer.stderr):
            if stream is not None:
                stream.close()
    accepted = [code for code, _err in outcomes if code == 0]
    refused = [err for code, err in outcomes if code == 1]
    assert len(accepted) == 1, outcomes
    assert len(refused) == 4 and all("maxConcurrentForks=1" in err for err in refused), outcomes
    assert len(caller.runs()) == 1  # nothing recorded for a refused fork
