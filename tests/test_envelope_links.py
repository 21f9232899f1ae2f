"""Hard links and the envelope (issue 28 case 9), on real pi scripted by the fake model.

The envelope judges paths, not inodes: a hard link already present in an allowed path is the
same file as its other names, wherever they are. pi's write and edit truncate the path in place
(``fs.writeFile``), so a write through such a link would change the file outside; the envelope
refuses a write or edit of a regular file with more than one link. A read through one still
reaches its content (the documented limit), and no tool a worker has makes a link: what write
makes is a new file with one link of its own.
"""

from __future__ import annotations

import os

import pytest
from helpers import read_events
from model_script import tool_results
from pilabs import PiPair, run_worker, scoped_profile
from waiting import wait_for

from pi_tmux_matrix.testing.fake_model import Reply

pytestmark = pytest.mark.real_pi  # any_pi below: test_envelope.py runs its pi part on the oldest pi


@pytest.mark.any_pi  # a refused write: test_envelope
def test_a_write_through_a_hard_link_is_refused_and_a_worker_makes_none(pilab: PiPair) -> None:
    lab, llm = pilab
    outside = lab.tmp / "outside" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("outside-original\n")
    linked = lab.work / "linked.txt"
    os.link(outside, linked)  # present before the worker starts (the user's, or an old checkout's)
    scoped_profile(lab, "pi-links", tools=["read", "write", "edit"], write_paths=["{worktree}"])

    agent = run_worker(
        lab, llm, "pi-links",
        Reply(tool="read", arguments={"path": "linked.txt"}),
        Reply(tool="write", arguments={"path": "linked.txt", "content": "overwritten\n"}),
        Reply(tool="edit", arguments={"path": "linked.txt", "edits": [
            {"oldText": "outside-original", "newText": "edited"}]}),
        Reply(tool="write", arguments={"path": "fresh.txt", "content": "fresh\n"}),
    )  # fmt: skip

    assert outside.read_text() == "outside-original\n", "a write reached the file outside"
    assert os.stat(outside).st_ino == os.stat(linked).st_ino  # still one file, unchanged
    read, write, edit, fresh = tool_results(llm)
    assert "outside-original" in read  # the limit: a read through a link reaches its target
    for result, tool in ((write, "write"), (edit, "edit")):
        assert f"pi-matrix envelope: {tool} of" in result and "has 2 hard links" in result, result
    assert "Successfully wrote" in fresh
    made = os.stat(lab.work / "fresh.txt")
    assert made.st_nlink == 1 and made.st_ino != os.stat(outside).st_ino  # a new file, not a link
    wait_for("2 tool_blocked events", lambda: len(read_events(lab.state, agent.key, "tool_blocked")) == 2)
    blocked = read_events(lab.state, agent.key, "tool_blocked")
    assert [b["tool"] for b in blocked] == ["write", "edit"]
    assert all("hard links" in b["reason"] for b in blocked)
