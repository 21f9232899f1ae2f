"""Lanes on real git repositories in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repos import git, lanes_cli, make_repo

from pi_tmux_matrix.dispatch.lanes import Lane, ensure_lane, lane_path, list_lanes
from pi_tmux_matrix.errors import LaneError

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
    pytest.mark.usefixtures("git_env"),  # conftest.py: a committer, no system config, no repo above
]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo #1 'q'")


def exclude_lines(repo: Path) -> list[str]:
    return (repo / ".git" / "info" / "exclude").read_text().splitlines()


def test_create_makes_a_worktree_on_the_lane_branch_from_head(repo: Path) -> None:
    lane = ensure_lane(repo, "lane-1")
    assert lane == Lane(
        name="lane-1",
        repo=str(repo),
        worktree=str(repo / ".worktrees" / "lane-1"),
        branch="pi-matrix/lane-1",
        created=True,
    )
    assert (Path(lane.worktree) / "src" / "a.py").read_text() == "x = 1\n"
    assert git(lane.worktree, "rev-parse", "--abbrev-ref", "HEAD") == "pi-matrix/lane-1"
    assert git(lane.worktree, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"  # the main tree is untouched
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_reuse_returns_the_same_lane_not_created(repo: Path) -> None:
    first = ensure_lane(repo, "lane-1")
    (Path(first.worktree) / "work.txt").write_text("in progress\n")
    again = ensure_lane(repo, "lane-1")
    assert again == Lane(
        name=first.name, repo=first.repo, worktree=first.worktree, branch=first.branch, created=False
    )
    assert (Path(again.worktree) / "work.txt").read_text() == "in progress\n"


def test_exclude_entry_is_added_once(repo: Path) -> None:
    exclude = repo / ".git" / "info" / "exclude"
    exclude.write_text("*.log")  # no final newline: ours must still land on its own line
    ensure_lane(repo, "a")
    ensure_lane(repo, "b")
    ensure_lane(repo, "a")
    assert exclude_lines(repo) == ["*.log", ".worktrees/"]
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_exclude_is_created_when_missing(repo: Path) -> None:
    shutil.rmtree(repo / ".git" / "info")
    ensure_lane(repo, "a")
    assert exclude_lines(repo) == [".worktrees/"]


def test_from_inside_a_worktree_or_subdir_uses_the_main_repo(repo: Path) -> None:
    first = ensure_lane(repo / "src", "lane-1")
    assert first.repo == str(repo)
    nested = ensure_lane(Path(first.worktree) / "src", "lane-2")
    assert nested.repo == str(repo)
    assert nested.worktree == str(repo / ".worktrees" / "lane-2")
    assert ensure_lane(first.worktree, "lane-1").created is False
    assert [lane.name for lane in list_lanes(nested.worktree)] == ["lane-1", "lane-2"]


def test_a_symlinked_path_resolves_to_the_real_repo(repo: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(repo)
    lane = ensure_lane(link, "lane-1")
    assert lane.repo == str(repo)
    assert ensure_lane(repo, "lane-1").created is False


def test_existing_branch_without_worktree_is_checked_out_as_is(repo: Path) -> None:
    git(repo, "switch", "-q", "-c", "pi-matrix/lane-3")
    (repo / "more.txt").write_text("more\n")
    git(repo, "add", "more.txt")
    git(repo, "commit", "-q", "-m", "lane work")
    tip = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-q", "main")
    lane = ensure_lane(repo, "lane-3")
    assert lane.created is True
    assert git(lane.worktree, "rev-parse", "HEAD") == tip


def test_a_registered_worktree_whose_dir_vanished_is_recreated(repo: Path) -> None:
    first = ensure_lane(repo, "lane-1")
    shutil.rmtree(first.worktree)
    again = ensure_lane(repo, "lane-1")
    assert again.created is True
    assert Path(again.worktree, "README").is_file()


def test_not_a_repo_is_a_lane_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(LaneError, match="not inside a git repository") as caught:
        ensure_lane(plain, "lane-1")
    assert str(plain) in str(caught.value)
    with pytest.raises(LaneError, match="not a directory"):
        ensure_lane(tmp_path / "missing", "lane-1")
    with pytest.raises(LaneError):
        list_lanes(plain)
    with pytest.raises(LaneError):
        lane_path(plain, "lane-1")


def test_repo_without_a_commit_is_a_lane_error(tmp_path: Path) -> None:
    empty = make_repo(tmp_path / "empty", commit=False)
    with pytest.raises(LaneError, match="no commit yet") as caught:
        ensure_lane(empty, "lane-1")
    assert "first commit" in str(caught.value)
    assert not (empty / ".worktrees" / "lane-1").exists()


def test_a_directory_that_is_not_the_lane_worktree_is_refused(repo: Path) -> None:
    squatter = repo / ".worktrees" / "lane-1"
    squatter.mkdir(parents=True)
    (squatter / "mine.txt").write_text("keep me\n")
    with pytest.raises(LaneError, match="exists but is not a worktree") as caught:
        ensure_lane(repo, "lane-1")
    assert "lane-1" in str(caught.value)
    assert (squatter / "mine.txt").read_text() == "keep me\n"


def test_a_lane_worktree_on_another_branch_is_refused(repo: Path) -> None:
    lane = ensure_lane(repo, "lane-1")
    git(lane.worktree, "switch", "-q", "-c", "elsewhere")
    with pytest.raises(LaneError, match="elsewhere"):
        ensure_lane(repo, "lane-1")


def test_a_symlinked_lanes_dir_is_refused(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / ".worktrees").symlink_to(outside)
    with pytest.raises(LaneError, match="not a plain directory"):
        ensure_lane(repo, "lane-1")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    "name",
    [
        "",
        "../x",
        "a/b",
        ".hidden",
        "-rf",
        "a b",
        "$(id)",
        "a;b",
        "x" * 200,
        "a..b",
        "x.lock",
        "ends.",
        "a\nb",
    ],
)
def test_hostile_lane_names_are_refused(repo: Path, name: str) -> None:
    before = sorted(p.name for p in repo.parent.iterdir())
    with pytest.raises(LaneError):
        ensure_lane(repo, name)
    with pytest.raises(LaneError):
        lane_path(repo, name)
    assert sorted(p.name for p in repo.parent.iterdir()) == before
    assert not (repo / ".worktrees").exists() or list((repo / ".worktrees").iterdir()) == []
    assert "pi-matrix/" not in git(repo, "branch", "--list")


def test_lane_path_creates_nothing(repo: Path) -> None:
    assert lane_path(repo / "src", "lane-9") == str(repo / ".worktrees" / "lane-9")
    assert not (repo / ".worktrees").exists()


def test_list_lanes_only_lists_worktrees_under_the_lanes_dir(repo: Path, tmp_path: Path) -> None:
    assert list_lanes(repo) == []
    ensure_lane(repo, "b")
    ensure_lane(repo, "a")
    git(repo, "worktree", "add", "-q", str(tmp_path / "elsewhere"), "-b", "other")
    lanes = list_lanes(repo)
    assert [(lane.name, lane.branch, lane.created) for lane in lanes] == [
        ("a", "pi-matrix/a", False),
        ("b", "pi-matrix/b", False),
    ]
    assert all(lane.repo == str(repo) for lane in lanes)


def test_git_location_variables_of_the_caller_are_ignored(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make_repo(tmp_path / "other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    lane = ensure_lane(repo, "lane-1")
    assert lane.repo == str(repo)
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    assert git(other, "worktree", "list", "--porcelain").count("worktree ") == 1


RACER = """
import json, os, sys, time
from pi_tmux_matrix.dispatch.lanes import ensure_lane
from pi_tmux_matrix.errors import LaneError
repo, name, go = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.001)
try:
    lane = ensure_lane(repo, name)
    print(json.dumps({"created": lane.created, "worktree": lane.worktree}))
except LaneError as exc:
    print(json.dumps({"error": str(exc)}))
"""


@pytest.mark.parametrize("round_", range(3))
def test_two_processes_racing_for_a_new_lane_end_with_one_worktree(
    repo: Path, tmp_path: Path, round_: int
) -> None:
    go = tmp_path / "go"
    name = f"race-{round_}"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(repo), name, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        time.sleep(0.3)  # both are importing, then spinning on the go file
        go.touch()
        outputs = [racer.communicate(timeout=120) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait(timeout=10)
    results = []
    for (stdout, stderr), racer in zip(outputs, racers, strict=True):
        assert racer.returncode == 0, stderr
        results.append(json.loads(stdout))
    worktree = str(repo / ".worktrees" / name)
    outcomes = sorted(str(result.get("created", "error")) for result in results)
    # The lane lock makes the loser wait and reuse (without it, git refuses it the branch).
    assert outcomes == ["False", "True"], results
    assert [result["worktree"] for result in results] == [worktree, worktree]
    listed = [lane for lane in list_lanes(repo) if lane.name == name]
    assert [lane.worktree for lane in listed] == [worktree]
    assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD") == f"pi-matrix/{name}"
    assert git(worktree, "status", "--porcelain") == ""
    assert os.path.isfile(os.path.join(worktree, "README"))


# === pi-matrix lanes / lanes prune (issue 20) =====================================================
def test_lanes_lists_each_lane_with_its_user_and_prune_removes_only_what_no_work_needs(
    repo: Path, tmp_path: Path
) -> None:
    from pi_tmux_matrix import procs
    from pi_tmux_matrix.identity import AgentIdentityContract, Role
    from pi_tmux_matrix.matrix import lifecycle
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

    merged, idle, dirty, busy = (ensure_lane(repo, n) for n in ("merged", "idle", "dirty", "busy"))
    (Path(idle.worktree) / "work.py").write_text("y = 2\n")
    git(idle.worktree, "add", ".")
    git(idle.worktree, "commit", "-q", "-m", "work in the lane")
    (Path(dirty.worktree) / "scratch.txt").write_text("not committed\n")
    state = tmp_path / "state"
    where = busy.worktree
    identity = AgentIdentityContract(agent_id="w", session_id="busy1", cwd=where, worktree=where)
    MatrixStore(state).register(
        lifecycle.new_entry(role=Role.WORKER, identity=identity, process=procs.current(), now=now_ms())
    )

    listed = lanes_cli(state, "--path", str(repo), "--json")
    assert listed.returncode == 0, listed.stderr
    by_name = {lane["name"]: lane for lane in json.loads(listed.stdout)}
    assert {n: lane["state"] for n, lane in by_name.items()} == {
        "busy": "in use", "dirty": "dirty", "idle": "idle", "merged": "merged",
    }  # fmt: skip
    assert by_name["busy"]["usedBy"] == ["worker-busy1"]
    plain = lanes_cli(state, "--path", str(repo)).stdout
    assert "busy  in use by worker-busy1  pi-matrix/busy" in plain

    preview = lanes_cli(state, "prune", "--path", str(repo))
    assert preview.returncode == 2 and "would prune merged (merged)" in preview.stdout
    assert "--confirm yes-prune" in preview.stdout and os.path.isdir(merged.worktree)
    wrong = lanes_cli(state, "prune", "--path", str(repo), "--confirm", "yes")
    assert wrong.returncode == 2 and os.path.isdir(merged.worktree)

    done = lanes_cli(state, "prune", "--path", str(repo), "--confirm", "yes-prune")
    assert done.returncode == 0, done.stderr
    assert "pruned merged: worktree removed; branch pi-matrix/merged deleted (merged)" in done.stdout
    assert not os.path.exists(merged.worktree)
    assert git(repo, "branch", "--list", "pi-matrix/merged") == ""
    for lane in (idle, dirty, busy):
        assert os.path.isdir(lane.worktree), lane.name

    abandoned = lanes_cli(state, "prune", "--abandoned", "--path", str(repo), "--confirm", "yes-prune")
    assert abandoned.returncode == 0, abandoned.stderr
    assert "pruned idle: worktree removed; branch pi-matrix/idle kept (not merged)" in abandoned.stdout
    assert not os.path.exists(idle.worktree)
    assert git(repo, "log", "-1", "--format=%s", "pi-matrix/idle") == "work in the lane"  # no commit lost
    assert os.path.isdir(dirty.worktree) and os.path.isdir(busy.worktree)
    assert (Path(dirty.worktree) / "scratch.txt").read_text() == "not committed\n"
