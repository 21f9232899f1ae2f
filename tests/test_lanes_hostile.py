"""Issue 28: git metadata planted where a worker writes runs nothing through pi-matrix.

The metadata is planted straight on disk, as a worker's ``bash`` could (bash is outside the
envelope by design; tests/test_envelope.py shows write and edit cannot). Every command it names
touches a canary file; after every product git call (``pi-matrix lanes``, ``prune``, a lane made,
reused and removed) no canary may exist, and each refusal names the path and the fix. Real git,
real repositories in tmp_path.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from repos import git, lanes_cli, make_repo

from pi_tmux_matrix.dispatch.lanes import LaneState, ensure_lane, list_lanes, remove_lane
from pi_tmux_matrix.errors import LaneError

pytestmark = pytest.mark.usefixtures("git_env")  # conftest.py: a committer, no system config, no repo above


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


HOOKS = ("post-checkout", "reference-transaction", "pre-commit", "post-commit", "post-index-change")


def canary_script(tmp_path: Path) -> Path:
    """``<script> NAME`` touches ``canary-NAME`` in tmp_path, then passes its input through (a
    filter, pager or hook that succeeds changes nothing else: the run goes on to show them all)."""
    script = tmp_path / "evil" / "run"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\ntouch "{tmp_path}/canary-$1"\nexec cat\n')
    script.chmod(0o755)
    return script


def canaries(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("canary-*"))


def hostile_config(script: Path, hooks: Path) -> str:
    """Every repository-config key that makes git run a command, each aimed at the canary."""
    return (
        "[core]\n"
        f'\tfsmonitor = "{script} fsmonitor"\n'
        f"\thooksPath = {hooks}\n"
        f'\tsshCommand = "{script} ssh"\n'
        f'\taskPass = "{script} askpass"\n'
        f'\tpager = "{script} pager"\n'
        f'\teditor = "{script} editor"\n'
        "[credential]\n"
        f'\thelper = "!{script} credential"\n'
        "[diff]\n"
        f'\texternal = "{script} diff"\n'
        '[filter "evil"]\n'
        f'\tclean = "{script} clean"\n'
        f'\tsmudge = "{script} smudge"\n'
        "[commit]\n\tgpgSign = true\n"
        "[gpg]\n"
        f'\tprogram = "{script} gpg"\n'
    )


def hook_dir(folder: Path, script: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in HOOKS:
        hook = folder / name
        hook.write_text(f'#!/bin/sh\nexec "{script}" hook-{name}\n')
        hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    return folder


def plant_gitdir(lane: Path, script: Path) -> None:
    """The issue's attack: a git dir of the lane's own under another name, with a config and hooks
    that run the canary, and the lane's ``.git`` file aimed at it. Its index is the lane's real one
    and README is touched, so ``git status`` there would hash README through the planted clean
    filter (a filter driver has an arbitrary name: no ``-c`` can switch it off)."""
    evil = lane / ".evilgit"
    (evil / "objects").mkdir(parents=True)
    (evil / "refs" / "heads").mkdir(parents=True)
    (evil / "HEAD").write_text("ref: refs/heads/main\n")
    (evil / "config").write_text(hostile_config(script, hook_dir(evil / "hooks", script)))
    record = lane / (lane / ".git").read_text().removeprefix("gitdir: ").strip()  # absolute or relative
    (evil / "index").write_bytes((record / "index").read_bytes())
    (lane / ".gitattributes").write_text("* filter=evil diff=evil\n")
    os.utime(lane / "README", (1, 1))
    (lane / ".git").write_text("gitdir: .evilgit\n")


def test_a_lane_whose_git_file_was_aimed_at_a_planted_git_dir_is_refused_and_runs_nothing(
    repo: Path, tmp_path: Path
) -> None:
    script = canary_script(tmp_path)
    hijacked = ensure_lane(repo, "hijacked")
    ensure_lane(repo, "clean")
    lane = Path(hijacked.worktree)
    pointer = (lane / ".git").read_text()
    plant_gitdir(lane, script)
    state = tmp_path / "state"

    listed = lanes_cli(state, "--path", str(repo))
    assert canaries(tmp_path) == [], "a planted command ran"
    assert listed.returncode == 2, listed.stdout + listed.stderr
    assert f"{lane}: its .git is not the worktree pointer git made" in listed.stderr
    assert f"'git -C {repo} worktree repair {lane}'" in listed.stderr and "Traceback" not in listed.stderr
    prune = lanes_cli(state, "prune", "--abandoned", "--path", str(repo), "--confirm", "yes-prune")
    assert prune.returncode == 2 and f"{lane}: its .git" in prune.stderr
    inside = lanes_cli(state, "--path", str(lane / "src"))
    assert inside.returncode == 2 and "points to a git dir inside its own working tree" in inside.stderr
    with pytest.raises(LaneError, match=r"its \.git is not the worktree pointer") as reused:
        ensure_lane(repo, "hijacked")
    assert str(lane) in str(reused.value)
    with pytest.raises(LaneError, match="inside its own working tree"):
        ensure_lane(lane, "another")
    assert ensure_lane(repo, "fresh").created  # the repository itself stays usable
    with pytest.raises(LaneError, match=r"its \.git is not the worktree pointer"):
        remove_lane(LaneState(hijacked, merged=True, dirty=False, missing=False))
    assert lane.is_dir() and (lane / ".evilgit" / "config").is_file()
    assert canaries(tmp_path) == [], "a planted command ran"

    # The fix the error names puts the pointer back; then the lane is listed again (dirty: the
    # planted files are untracked work), and still nothing runs.
    git(repo, "worktree", "repair", str(lane))
    assert (lane / ".git").read_text() == pointer
    again = lanes_cli(state, "--path", str(repo), "--json")
    assert again.returncode == 0, again.stderr
    assert {lane["name"]: lane["state"] for lane in json.loads(again.stdout)} == {
        "clean": "merged", "fresh": "merged", "hijacked": "dirty",
    }  # fmt: skip
    assert canaries(tmp_path) == [], "a planted command ran"


def test_a_submodule_git_file_aimed_at_a_planted_git_dir_runs_nothing(repo: Path, tmp_path: Path) -> None:
    """One level down: a lane's checked-out submodule has a ``.git`` file of its own, and ``git
    status`` would run a status inside it, through that file, with the planted clean filter."""
    script = canary_script(tmp_path)
    upstream = make_repo(tmp_path / "upstream")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(upstream), "sub")
    git(repo, "commit", "-q", "-m", "a submodule")
    lane = Path(ensure_lane(repo, "lane-1").worktree)
    git(lane, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init")
    plant_gitdir(lane / "sub", script)
    done = lanes_cli(tmp_path / "state", "--path", str(repo), "--json")
    assert canaries(tmp_path) == [], "a planted command ran"
    assert done.returncode == 0, done.stderr
    assert [(lane["name"], lane["state"]) for lane in json.loads(done.stdout)] == [("lane-1", "merged")]


@pytest.mark.parametrize("shape", ["folder", "symlink", "other-record"])
def test_a_lane_git_entry_that_is_not_the_pointer_git_wrote_is_refused(
    repo: Path, tmp_path: Path, shape: str
) -> None:
    script = canary_script(tmp_path)
    lane = Path(ensure_lane(repo, "lane-1").worktree)
    other = Path(ensure_lane(repo, "lane-2").worktree)
    dotgit = lane / ".git"
    dotgit.unlink()
    if shape == "folder":  # a repository of the lane's own, right at its root
        make_repo(dotgit.parent / "inner")
        (dotgit.parent / "inner" / ".git").rename(dotgit)
        (dotgit / "config").write_text(hostile_config(script, hook_dir(dotgit / "hooks", script)))
        want = "is a folder, not the one-line file git writes"
    elif shape == "symlink":
        dotgit.symlink_to(other / ".git")
        want = "is a symlink"
    else:  # another lane's record: consistent, but not this worktree's
        dotgit.write_text((other / ".git").read_text())
        want = f"belongs to {other}/.git"
    done = lanes_cli(tmp_path / "state", "--path", str(repo))
    assert canaries(tmp_path) == [], "a planted command ran"
    assert done.returncode == 2 and want in done.stderr, done.stderr


def test_the_repository_config_of_the_user_runs_no_command_through_pi_matrix(
    repo: Path, tmp_path: Path
) -> None:
    """The -c hardening itself: a config git does read (the repository's own, as if ``bash`` had
    written it) names a command for fsmonitor, hooks (a hooks path and ``.git/hooks``), ssh,
    askpass, credentials, signing; making, listing and pruning lanes runs none of them."""
    script = canary_script(tmp_path)
    merged = ensure_lane(repo, "merged")  # at HEAD: merged, so prune removes it and its branch
    ensure_lane(repo, "kept")
    with (repo / ".git" / "config").open("a") as config:
        config.write(hostile_config(script, hook_dir(tmp_path / "hooks-elsewhere", script)))
    hook_dir(repo / ".git" / "hooks", script)

    made = ensure_lane(repo, "made")
    assert made.created and (Path(made.worktree) / "README").is_file()
    state = tmp_path / "state"
    listed = lanes_cli(state, "--path", str(repo), "--json")
    assert listed.returncode == 0, listed.stderr
    assert {lane["name"] for lane in json.loads(listed.stdout)} == {"kept", "made", "merged"}
    pruned = lanes_cli(state, "prune", "--path", str(repo), "--confirm", "yes-prune")
    assert pruned.returncode == 0, pruned.stderr
    assert not os.path.exists(merged.worktree)
    assert [lane.name for lane in list_lanes(repo)] == []  # every lane merged: all pruned
    assert canaries(tmp_path) == [], f"a command from the repository's config ran: {canaries(tmp_path)}"


def test_a_partial_clone_fetches_nothing_over_a_transport_its_config_allows(
    repo: Path, tmp_path: Path
) -> None:
    """A missing object in a partial clone makes git fetch it from the promisor remote; an
    ``ext::`` remote is a shell command, and the repository may allow it (``protocol.ext.allow``
    beats a ``-c protocol.allow=never``). Two layers hold it, and the test fails only when both
    are gone: GIT_NO_LAZY_FETCH=1 (no lazy fetch) and GIT_ALLOW_PROTOCOL empty (no transport)."""
    canary = tmp_path / "canary-ext"
    blob = git(repo, "rev-parse", "HEAD:README")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    for key, value in (
        ("extensions.partialClone", "origin"),
        ("remote.origin.url", f"ext::sh -c touch% {canary}"),
        ("remote.origin.promisor", "true"),
        ("protocol.ext.allow", "always"),
    ):
        git(repo, "config", key, value)
    with pytest.raises(LaneError, match=r"git worktree add .* failed"):
        ensure_lane(repo, "lane-1")
    assert not canary.exists(), "the ext:: remote's command ran"


def test_a_bare_shaped_folder_in_a_lane_is_not_taken_for_a_repository(repo: Path, tmp_path: Path) -> None:
    """``safe.bareRepository=explicit``: discovery from a folder shaped like a git dir (HEAD,
    objects/, refs/, a config: files write may make) does not take it for a repository."""
    script = canary_script(tmp_path)
    lane = Path(ensure_lane(repo, "lane-1").worktree)
    bare = lane / "vendor"
    (bare / "objects").mkdir(parents=True)
    (bare / "refs").mkdir()
    (bare / "HEAD").write_text("ref: refs/heads/main\n")
    (bare / "config").write_text("[core]\n\tbare = true\n" + hostile_config(script, bare / "hooks"))
    done = lanes_cli(tmp_path / "state", "--path", str(bare))
    assert done.returncode == 2 and "a bare repository (or a git dir)" in done.stderr, done.stderr
    assert canaries(tmp_path) == []
    # The repository's own git dir is not a planted one: from inside it, its working tree is used.
    inside = lanes_cli(tmp_path / "state", "--path", str(repo / ".git" / "refs"))
    assert inside.returncode == 0 and "lane-1  " in inside.stdout, inside.stderr


def test_the_git_door_runs_only_the_subcommands_it_knows() -> None:
    from pi_tmux_matrix import gitcmd

    with pytest.raises(ValueError, match="'fetch': not a subcommand pi-matrix runs"):
        gitcmd.run(os.getcwd(), "fetch")
