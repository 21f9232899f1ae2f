"""The one door to git: every git command pi-matrix runs goes through :func:`run`
(docs/decisions.md#git-is-never-trusted-in-a-lane).

A repository's config is code: ``core.fsmonitor``, hooks, ``core.sshCommand``, filter drivers and
more are commands git runs with the user's rights. pi-matrix runs git in folders a confined worker
writes (its lane's worktree), so each call is hardened against repository-controlled execution:

- ``-c`` overrides, which beat every config file (system, global, the repository's, an included
  one): no fsmonitor, no hooks (``core.hooksPath=/dev/null``: neither ``.git/hooks`` nor a
  ``core.hooksPath`` pointing into the worktree, as husky's does), no ssh or askpass program, no
  credential helper, no commit signing program, no bare repository found by discovery
  (``safe.bareRepository=explicit``: a folder shaped like a git dir inside a worktree is never
  taken for a repository).
- ``GIT_NO_LAZY_FETCH=1`` (git 2.39.4 and later): a partial clone's missing object is never
  fetched from its promisor remote; and ``GIT_ALLOW_PROTOCOL`` empty: no transport at all (it
  overrides every ``protocol.<name>.allow`` a repository sets, which ``protocol.allow=never`` does
  not), so an ``ext::`` remote's shell command never runs.
- ``--no-pager`` and ``--no-optional-locks`` (a read such as ``status`` writes nothing).
- Only the subcommands in :data:`SUBCOMMANDS`, none of which diffs (``diff.external``,
  textconv), fetches, pushes, packs for a client (``uploadpack.packObjectsHook``,
  ``core.alternateRefsCommand``) or opens an editor.
- The variables that would aim git at another repository are dropped (a caller's ``GIT_DIR``).

Filter drivers (``filter.<name>.clean``/``smudge``/``process``) have arbitrary names, so no
override can list them; they come from config only, and the product only lets git read the
config of the repository it was pointed at: :func:`check_linked_worktree` refuses a lane whose
``.git`` file points anywhere but that repository's own worktree record, and the bridge's envelope
never lets a worker write a ``.git`` entry (docs/bridge.md). The same bound holds hooks defined
in config (``hook.<name>.command``, git 2.54 and later), which ``core.hooksPath`` does not reach,
and a submodule's own ``.git`` file, which is why lanes.py's ``status`` stays out of submodules.
"""

from __future__ import annotations

import os
import stat
import subprocess
from typing import Final

from .errors import LaneError

__all__ = ["HARDENING", "QUERY_TIMEOUT_S", "SUBCOMMANDS", "check_linked_worktree", "run"]

QUERY_TIMEOUT_S: Final = 30.0

# Every one overrides whatever a config file says (the command line is read last).
HARDENING: Final = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",  # a file, so no hook is ever found below it
    "core.sshCommand=false",
    "core.askPass=false",
    "credential.helper=",  # an empty value empties the list of helpers
    "commit.gpgSign=false",
    "protocol.allow=never",
    "safe.bareRepository=explicit",
)

# What the product runs. Each was checked for what it may execute beyond the overrides above:
# none diffs, talks to a remote or starts an editor.
SUBCOMMANDS: Final = frozenset(
    {"branch", "check-ref-format", "commit", "init", "merge-base", "rev-parse", "status", "worktree"}
)

# Repository-selecting variables: inherited from a hook or a wrapper they would silently aim every
# call at some other repository or index.
_GIT_LOCATION_ENV: Final = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)
_MAX_GITFILE = 4096  # a gitdir pointer is one line; anything longer is not one git wrote


def run(
    cwd: str, *args: str, config: tuple[str, ...] = (), timeout: float = QUERY_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """``git -C cwd [-c config...] <hardening> args``, text out, never a prompt. ``config`` adds
    the caller's own settings (an identity, say); it cannot undo the hardening, which comes last.
    Raises :class:`LaneError` when git is missing or too slow (lanes are what pi-matrix uses git
    for); a failing command is returned, not raised."""
    if not args or args[0] not in SUBCOMMANDS:
        raise ValueError(
            f"git {args[0] if args else '(nothing)'!r}: not a subcommand pi-matrix runs; check what it may "
            "execute (diff drivers, remotes, editors) before adding it to gitcmd.SUBCOMMANDS"
        )
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_ENV}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_ALLOW_PROTOCOL="", GIT_NO_LAZY_FETCH="1")
    argv = ["git", "--no-pager", "--no-optional-locks", "-C", cwd]
    for setting in (*config, *HARDENING):
        argv += ["-c", setting]
    try:
        return subprocess.run(
            [*argv, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=env,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise LaneError("git is not installed (not on PATH); install git to use lanes") from None
    except subprocess.TimeoutExpired:
        raise LaneError(f"{cwd}: git {args[0]} did not finish within {timeout:g}s; retry") from None


def _pointer(path: str, prefix: str, base: str) -> str:
    """The real path a one-line pointer file names (``gitdir: <path>`` or a bare path), relative
    ones taken from ``base``; raises ValueError saying what is wrong with it."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a symlink"
            if stat.S_ISLNK(info.st_mode)
            else "a folder"
            if stat.S_ISDIR(info.st_mode)
            else "not a file"
        )
        raise ValueError(f"{path} is {kind}, not the one-line file git writes")
    # Non-blocking: a FIFO swapped in after the lstat answers at once instead of hanging the caller.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        raw = os.read(fd, _MAX_GITFILE + 1)
    finally:
        os.close(fd)
    text = raw.decode("utf-8", errors="replace").rstrip("\n")
    if len(raw) > _MAX_GITFILE or "\n" in text or not text.startswith(prefix) or text == prefix:
        raise ValueError(f"{path} is not a {prefix or 'path'} line")
    return os.path.realpath(os.path.join(base, text[len(prefix) :]))


def check_linked_worktree(worktree: str, common_dir: str) -> None:
    """Refuse (:class:`LaneError`) to let git into ``worktree`` unless its ``.git`` is a regular
    file pointing to ``<common_dir>/worktrees/<id>`` whose ``gitdir`` points back to it: exactly
    the record ``git worktree add`` made. Anything else (a folder, a symlink, a pointer to a git dir
    of the worktree's own) would make git read config and hooks the worktree's writer chose."""
    dotgit = os.path.join(worktree, ".git")
    records = os.path.realpath(os.path.join(common_dir, "worktrees"))
    try:
        target = _pointer(dotgit, "gitdir: ", worktree)
        if os.path.dirname(target) != records:
            raise ValueError(f"{dotgit} points to {target}, not into {records}")
        back = _pointer(os.path.join(target, "gitdir"), "", target)
        if back != os.path.realpath(dotgit):
            raise ValueError(f"the record {target} belongs to {back}, not to {dotgit}")
    except ValueError as exc:
        repo = os.path.dirname(os.path.realpath(common_dir))
        raise LaneError(
            f"{worktree}: its .git is not the worktree pointer git made ({exc}); git would take its "
            "config and hooks from there, so pi-matrix runs no git in it. Check what changed it, then "
            f"restore it with 'git -C {repo} worktree repair {worktree}'"
        ) from None
