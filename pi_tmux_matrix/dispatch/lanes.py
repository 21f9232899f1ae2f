"""Lanes: one git worktree per lane, ``<repo>/.worktrees/<name>`` on branch ``pi-matrix/<name>``.

The repo is always the *main* working tree of the repository that holds the given path (found from
``git rev-parse --git-common-dir`` and ``git worktree list``), so a lane asked for from inside
another lane lands beside it rather than nested in it. Creating and reusing a lane happens under an
exclusive ``flock`` on ``<git common dir>/pi-matrix-lanes.lock``: two dispatchers racing for the
same new lane end with one worktree, one of them ``created``, the other reusing it.

Every git call goes through :func:`pi_tmux_matrix.gitcmd.run`: an argv list, a timeout, no terminal
prompt, no ``GIT_DIR``-style variable of the caller, and hardened against repository-controlled
execution (no fsmonitor, hooks, transports...). A lane's worktree is written by a worker, so before
git runs in one its ``.git`` pointer is checked to lead back to the repository's own worktree record
(:func:`pi_tmux_matrix.gitcmd.check_linked_worktree`): git never reads config or hooks the worker
chose (docs/decisions.md#git-is-never-trusted-in-a-lane).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import attrs

from ..errors import InvalidId, LaneError
from ..gitcmd import QUERY_TIMEOUT_S, check_linked_worktree
from ..gitcmd import run as _run
from ..identity import ID_PATTERN, validate_id
from ..matrix.fsio import open_append

__all__ = [
    "BRANCH_PREFIX",
    "LANES_DIR",
    "Lane",
    "LaneState",
    "ensure_lane",
    "lane_path",
    "lane_states",
    "list_lanes",
    "remove_lane",
]

LANES_DIR: Final = ".worktrees"
BRANCH_PREFIX: Final = "pi-matrix/"
EXCLUDE_LINE: Final = ".worktrees/"
LOCK_NAME: Final = "pi-matrix-lanes.lock"
# A checkout of a large tree can take a while.
ADD_TIMEOUT_S: Final = 300.0
LOCK_TIMEOUT_S: Final = 330.0


@attrs.frozen
class Lane:
    """A lane's worktree. ``created`` is True only for the call that made the worktree."""

    name: str
    repo: str  # the main working tree (absolute, symlinks resolved)
    worktree: str  # <repo>/.worktrees/<name>
    branch: str  # pi-matrix/<name>; for list_lanes, whatever the worktree has checked out ("" if detached)
    created: bool


@attrs.frozen
class _Repo:
    toplevel: str
    common_dir: str


@attrs.frozen
class _Worktree:
    path: str
    branch: str | None  # refs/heads/... or None when detached
    prunable: bool
    bare: bool


def _git(cwd: str, *args: str, timeout: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return _run(cwd, *args, timeout=timeout)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    text = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
    return text if len(text) <= 500 else text[:497] + "..."


def _lane_name(name: object) -> str:
    try:
        return validate_id(name, "lane")
    except InvalidId as exc:
        raise LaneError(str(exc)) from None


def _repo(path: str | Path) -> _Repo:
    """The repository holding ``path``: its main working tree and its git common dir."""
    where = os.path.abspath(os.fspath(path))
    if not os.path.isdir(where):
        raise LaneError(f"{where}: not a directory; lanes are made from inside a git repository")
    parts = where.split(os.sep)
    if ".git" in parts:
        # Inside a git dir: discovery under safe.bareRepository=explicit refuses it on older git,
        # so start from the working tree that holds it, as git itself would use.
        where = os.sep.join(parts[: parts.index(".git")]) or os.sep
    done = _git(
        where, "rev-parse", "--path-format=absolute", "--git-common-dir", "--git-dir", "--show-toplevel"
    )
    if done.returncode != 0 and "safe.bareRepository" in done.stderr:
        raise LaneError(
            f"{where}: a bare repository (or a git dir) has no main working tree to put .worktrees/ in; "
            "use a lane from a folder of a non-bare clone's working tree"
        )
    if done.returncode != 0:
        raise LaneError(
            f"{where}: not inside a git repository ({_said(done)}); "
            "run from a repository, or 'git init' and commit there first, or launch without --lane"
        )
    common, gitdir, top = (os.path.realpath(line) for line in done.stdout.splitlines()[:3])
    _trusted_discovery(top, gitdir, common)
    main = _worktrees(where)[0]
    if main.bare:
        raise LaneError(
            f"{common}: a bare repository has no main working tree to put .worktrees/ in; "
            "use a lane from a non-bare clone"
        )
    return _Repo(os.path.realpath(main.path), common)


def _trusted_discovery(top: str, gitdir: str, common: str) -> None:
    """Refuse a repository git found through a pointer a worker could have planted
    (docs/decisions.md#git-is-never-trusted-in-a-lane): a linked worktree's ``.git`` must lead to
    the common dir's own record of it, a git dir must not lie inside the working tree it serves
    (other than as ``<top>/.git``), and a repository inside a lane's worktree is the lane's
    writer's, not the user's."""
    if gitdir != common:
        check_linked_worktree(top, common)
    if _inside(common, top) and common != os.path.join(top, ".git"):
        raise LaneError(
            f"{top}: its .git points to a git dir inside its own working tree ({common}), the shape a "
            "planted repository has; git would run its config. Check what changed it; lanes are "
            "made from the repository itself"
        )
    for folder in _ancestors(top):
        if os.path.basename(os.path.dirname(folder)) == LANES_DIR and os.path.isfile(
            os.path.join(folder, ".git")
        ):
            raise LaneError(
                f"{top}: this repository lies inside the lane worktree {folder}, where a worker "
                "writes; lanes are made from the main repository (pass its folder)"
            )


def _ancestors(path: str) -> list[str]:
    found: list[str] = []
    while (parent := os.path.dirname(path)) != path:
        found.append(parent)
        path = parent
    return found


def _inside(candidate: str, root: str) -> bool:
    return candidate == root or candidate.startswith(root.rstrip("/") + "/")


def _worktrees(cwd: str) -> list[_Worktree]:
    """``git worktree list`` (the main working tree first)."""
    done = _git(cwd, "worktree", "list", "--porcelain", "-z")
    if done.returncode != 0:
        raise LaneError(f"{cwd}: git worktree list failed ({_said(done)}); check the repository")
    found: list[_Worktree] = []
    fields: dict[str, str] = {}
    # Records are NUL-terminated attribute lines, with an empty line (a lone NUL) after each.
    for item in [*done.stdout.split("\0"), ""]:
        if item:
            key, _, value = item.partition(" ")
            fields[key] = value
            continue
        if "worktree" in fields:
            found.append(
                _Worktree(
                    path=fields["worktree"],
                    branch=fields.get("branch"),
                    prunable="prunable" in fields,
                    bare="bare" in fields,
                )
            )
        fields = {}
    if not found:
        raise LaneError(f"{cwd}: git worktree list named no working tree; check the repository")
    return found


def _lane_paths(repo: _Repo, name: str) -> tuple[str, str]:
    """The lane's worktree and branch; the id rules alone still let through names git refuses."""
    branch = f"{BRANCH_PREFIX}{name}"
    check = _git(repo.toplevel, "check-ref-format", "--branch", branch)
    if check.returncode != 0:
        raise LaneError(f"lane {name!r}: {branch!r} is not a valid git branch name; pick another lane name")
    return os.path.join(repo.toplevel, LANES_DIR, name), branch


def lane_path(path: str | Path, name: str) -> str:
    """Where lane ``name`` of the repository holding ``path`` lives (nothing is created)."""
    name = _lane_name(name)
    return _lane_paths(_repo(path), name)[0]


def ensure_lane(path: str | Path, name: str) -> Lane:
    """Create lane ``name`` from HEAD, or reuse it if its worktree is already on its branch.

    An existing branch ``pi-matrix/<name>`` without a worktree is checked out as is (its commits
    are kept). Raises :class:`LaneError` naming the lane and the fix for anything else.
    """
    name = _lane_name(name)
    repo = _repo(path)
    worktree, branch = _lane_paths(repo, name)
    with _locked(repo.common_dir):
        _exclude(repo.common_dir)
        reused = _existing(repo, name, worktree, branch)
        if reused is not None:
            return reused
        head = _git(repo.toplevel, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        if head.returncode != 0:
            raise LaneError(
                f"{repo.toplevel}: the repository has no commit yet, and lane {name!r} branches from "
                "HEAD; make a first commit"
            )
        lanes_dir = os.path.join(repo.toplevel, LANES_DIR)
        if os.path.lexists(lanes_dir) and (os.path.islink(lanes_dir) or not os.path.isdir(lanes_dir)):
            raise LaneError(
                f"{lanes_dir}: is not a plain directory (a symlink or a file); "
                f"move it away so lanes stay inside {repo.toplevel}"
            )
        has_branch = _git(repo.toplevel, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        if has_branch.returncode == 0:
            args = ["worktree", "add", worktree, branch]
        else:
            args = ["worktree", "add", "-b", branch, worktree, head.stdout.strip()]
        done = _git(repo.toplevel, *args, timeout=ADD_TIMEOUT_S)
        if done.returncode != 0:
            raise LaneError(
                f"lane {name!r}: git worktree add {worktree} failed ({_said(done)}); "
                f"fix the cause, then 'git worktree prune' in {repo.toplevel} and retry"
            )
        return Lane(name=name, repo=repo.toplevel, worktree=worktree, branch=branch, created=True)


def _existing(repo: _Repo, name: str, worktree: str, branch: str) -> Lane | None:
    """The lane if its worktree exists on its branch; None if there is none (stale entries pruned)."""
    target = os.path.realpath(worktree)
    for entry in _worktrees(repo.toplevel):
        if os.path.realpath(entry.path) != target:
            continue
        if entry.prunable or not os.path.isdir(worktree):
            # Registered, but its directory is gone: drop the record so it can be added again.
            _git(repo.toplevel, "worktree", "prune")
            break
        if entry.branch != f"refs/heads/{branch}":
            found = entry.branch.removeprefix("refs/heads/") if entry.branch else "a detached HEAD"
            raise LaneError(
                f"lane {name!r}: {worktree} is a worktree on {found}, not on {branch}; "
                f"switch it back ('git -C {worktree} switch {branch}') or pick another lane name"
            )
        check_linked_worktree(worktree, repo.common_dir)  # a worker's next git runs there too
        return Lane(name=name, repo=repo.toplevel, worktree=worktree, branch=branch, created=False)
    if os.path.lexists(worktree):
        raise LaneError(
            f"lane {name!r}: {worktree} exists but is not a worktree of {repo.toplevel}; "
            "move it away or pick another lane name"
        )
    return None


def list_lanes(path: str | Path) -> list[Lane]:
    """The lanes (worktrees directly under ``.worktrees/``) of the repository holding ``path``."""
    return _lanes(_repo(path))


def _lanes(repo: _Repo) -> list[Lane]:
    lanes_dir = os.path.join(repo.toplevel, LANES_DIR)
    lanes: list[Lane] = []
    for entry in _worktrees(repo.toplevel):
        where = os.path.realpath(entry.path)
        name = os.path.basename(where)
        if os.path.dirname(where) != lanes_dir or ID_PATTERN.fullmatch(name) is None:
            continue
        branch = entry.branch.removeprefix("refs/heads/") if entry.branch else ""
        lanes.append(Lane(name=name, repo=repo.toplevel, worktree=where, branch=branch, created=False))
    return sorted(lanes, key=lambda lane: lane.name)


@attrs.frozen
class LaneState:
    """What ``pi-matrix lanes`` says of a lane: whether its branch is merged into the main
    working tree's HEAD, whether its worktree holds uncommitted work, whether it is gone."""

    lane: Lane
    merged: bool
    dirty: bool
    missing: bool  # the worktree's folder is gone (git still lists it)


def lane_states(path: str | Path) -> list[LaneState]:
    """Every lane of the repository holding ``path``, with its state (read only)."""
    states: list[LaneState] = []
    repo = _repo(path)
    for lane in _lanes(repo):
        missing = not os.path.isdir(lane.worktree)
        dirty = False
        if not missing:
            check_linked_worktree(lane.worktree, repo.common_dir)  # its writer may have replaced .git
            # --ignore-submodules=dirty: git would otherwise run a status inside each submodule,
            # through the submodule's own .git file, which the lane's writer may have aimed at
            # config of its own (a filter driver runs there); a submodule's new commits still show.
            status = _git(
                lane.worktree,
                "status",
                "--porcelain",
                "--untracked-files=normal",
                "--ignore-submodules=dirty",
            )
            dirty = status.returncode != 0 or bool(status.stdout.strip())
        tip = f"refs/heads/{lane.branch}"
        ancestor = _git(lane.repo, "merge-base", "--is-ancestor", tip, "HEAD") if lane.branch else None
        merged = ancestor is not None and ancestor.returncode == 0
        states.append(LaneState(lane, merged=merged, dirty=dirty, missing=missing))
    return states


def remove_lane(state: LaneState) -> str:
    """Remove a lane's worktree, and its branch when merged (``git branch -d``: git itself
    refuses an unmerged one, so no commit is ever lost); what was done, in words. Refused for
    a worktree with uncommitted work. The caller has checked that no live agent uses it."""
    lane = state.lane
    if state.dirty:
        raise LaneError(
            f"lane {lane.name!r}: {lane.worktree} has uncommitted changes; commit or discard them first"
        )
    common = _repo(lane.repo).common_dir
    with _locked(common):
        if state.missing:
            _git(lane.repo, "worktree", "prune")
        else:
            # git worktree remove runs git status inside the worktree (through its .git): checked
            # again here, under the lock, right before.
            check_linked_worktree(lane.worktree, common)
            done = _git(lane.repo, "worktree", "remove", lane.worktree)
            if done.returncode != 0:
                raise LaneError(f"lane {lane.name!r}: git worktree remove failed ({_said(done)})")
        if not (state.merged and lane.branch.startswith(BRANCH_PREFIX)):
            return f"worktree removed; branch {lane.branch or '(detached)'} kept (not merged)"
        done = _git(lane.repo, "branch", "-d", lane.branch)
        if done.returncode != 0:
            return f"worktree removed; branch {lane.branch} kept ({_said(done)})"
        return f"worktree removed; branch {lane.branch} deleted (merged)"


_EXCLUDE_MAX_BYTES: Final = 1024 * 1024  # far above any real exclude file


def _exclude(common_dir: str) -> None:
    """Add ``.worktrees/`` to ``info/exclude`` once, so lanes never show in ``git status``. The
    file is the repository's: read and appended without following a symlink, without blocking on
    a FIFO, and only while it is a regular file of at most :data:`_EXCLUDE_MAX_BYTES`."""
    info = os.path.join(common_dir, "info")
    os.makedirs(info, exist_ok=True)
    path = os.path.join(info, "exclude")
    try:
        fd = open_append(path, mode=0o644, read=True)
    except OSError as exc:
        raise LaneError(f"{path}: cannot use it ({exc.strerror}); make it a regular file") from None
    try:
        if os.fstat(fd).st_size > _EXCLUDE_MAX_BYTES:
            raise LaneError(f"{path}: over {_EXCLUDE_MAX_BYTES} bytes; move it aside")
        text = os.pread(fd, _EXCLUDE_MAX_BYTES, 0).decode("utf-8", errors="replace")
        if any(line.strip() in (EXCLUDE_LINE, f"/{EXCLUDE_LINE}") for line in text.splitlines()):
            return
        os.write(fd, (("" if not text or text.endswith("\n") else "\n") + EXCLUDE_LINE + "\n").encode())
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(common_dir: str) -> Iterator[None]:
    """The repository's lane lock (``flock``; released by the kernel if the holder dies)."""
    path = os.path.join(common_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LaneError(
            f"{path}: cannot open the lane lock ({exc.strerror}); check its permissions"
        ) from None
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise LaneError(f"{path}: cannot lock ({exc.strerror}); use a local filesystem") from None
            if time.monotonic() >= deadline:
                raise LaneError(
                    f"{path}: another pi-matrix held the lane lock for {LOCK_TIMEOUT_S:g}s; "
                    "retry, or find the process holding it (fuser)"
                )
            time.sleep(0.05)
        yield
    finally:
        os.close(fd)
