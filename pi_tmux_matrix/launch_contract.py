"""The env + CLI flag contract between a launcher and its agent, parsed and rendered
(docs/decisions.md#one-contract-between-launcher-and-agent).

A launcher (``fire_task``, the resume launcher) renders a :class:`LaunchContract` into env vars;
the agent host parses it back from env and flags (flags win). The rules at this boundary:

* ``PI_PARENT_PID`` malformed, non-positive or out of range: ignored with one warning, and the
  process acts as a master. Bad env never crashes an agent.
* ``PI_PARENT_SESSION``, ``PI_ORCHESTRATION_AGENT_ID`` and ``PI_TASK_REF`` (and their flags) are
  trimmed; one that is only whitespace is absent.
* ``PI_WORKER_ALLOWED_PATHS`` malformed: startup fails naming the variable. It is a security
  envelope, so it is taken whole or not at all; ``[]`` means full-machine scope.
* Ids are validated before anything touches the filesystem.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from . import strictjson
from .contract import (
    ENV_AGENT_ID,
    ENV_ALLOWED_PATHS,
    ENV_PARENT_PID,
    ENV_PARENT_SESSION,
    ENV_PARENT_START,
    ENV_TASK_REF,
    ENV_WORKTREE_LANE,
)
from .errors import ContractError
from .identity import Role, validate_id, validate_task_ref

__all__ = [
    "ALLOWED_PATHS_MAX_BYTES",
    "ALLOWED_PATHS_MAX_ITEMS",
    "PID_LIMIT",
    "LaunchContract",
    "add_contract_arguments",
    "contract_from_args",
    "parse_allowed_paths",
    "parse_env",
    "parse_parent_pid",
    "parse_parent_start",
    "path_allowed",
]

log = logging.getLogger(__name__)

# Linux caps pid_max at 2^22; anything above cannot be a pid on any Linux machine.
PID_LIMIT: Final = 1 << 22
ALLOWED_PATHS_MAX_BYTES: Final = 64 * 1024
ALLOWED_PATHS_MAX_ITEMS: Final = 256


@attrs.frozen(kw_only=True)
class LaunchContract:
    """What a launch says about the process's place in the matrix."""

    parent_pid: int | None = None
    parent_session: str | None = None
    parent_start: int | None = None  # the parent's start ticks, when the launcher knows them
    agent_id: str | None = None
    task_ref: str | None = None
    allowed_paths: tuple[str, ...] = ()
    worktree_lane: str | None = None

    @property
    def role(self) -> Role:
        """A valid declared parent makes a worker; anything else is a master."""
        return Role.WORKER if self.parent_pid is not None else Role.MASTER

    def to_env(self) -> dict[str, str]:
        """Render the env a launcher passes to its child (only the set values, plus paths).

        The allowed-paths channel is always set, so a child never inherits a stale envelope
        from its launcher's own environment.
        """
        env: dict[str, str] = {ENV_ALLOWED_PATHS: json.dumps(list(self.allowed_paths))}
        if self.parent_pid is not None:
            env[ENV_PARENT_PID] = str(self.parent_pid)
        if self.parent_pid is not None and self.parent_start is not None:
            env[ENV_PARENT_START] = str(self.parent_start)
        if self.parent_session is not None:
            env[ENV_PARENT_SESSION] = self.parent_session
        if self.agent_id is not None:
            env[ENV_AGENT_ID] = self.agent_id
        if self.task_ref is not None:
            env[ENV_TASK_REF] = self.task_ref
        if self.worktree_lane is not None:
            env[ENV_WORKTREE_LANE] = self.worktree_lane
        return env

    def to_args(self) -> list[str]:
        """Render the CLI sugar (launch-only values have no flag and stay in env)."""
        args: list[str] = []
        if self.parent_pid is not None:
            args += ["--parent-pid", str(self.parent_pid)]
        if self.parent_pid is not None and self.parent_start is not None:
            args += ["--parent-start", str(self.parent_start)]
        if self.parent_session is not None:
            args += ["--parent-session", self.parent_session]
        if self.task_ref is not None:
            args += ["--task-ref", self.task_ref]
        if self.worktree_lane is not None:
            args += ["--worktree-lane", self.worktree_lane]
        return args


def parse_parent_pid(raw: str | None, source: str = ENV_PARENT_PID) -> int | None:
    """A usable parent pid, or ``None`` (with one warning) for anything malformed."""
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if text.isascii() and text.isdigit() and len(text) <= 10:
        value = int(text)
        if 0 < value < PID_LIMIT:
            return value
    log.warning(
        "%s=%r is not a usable pid (need an integer 1..%d); ignoring it, this process acts as a master",
        source,
        raw[:40],
        PID_LIMIT - 1,
    )
    return None


def parse_parent_start(raw: str | None, source: str = ENV_PARENT_START) -> int | None:
    """The parent's start ticks, or ``None`` (with one warning) for anything malformed: then the
    host reads them itself, as before the contract carried them."""
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if text.isascii() and text.isdigit() and len(text) <= 20:
        return int(text)
    log.warning("%s=%r is not a start time in clock ticks; ignoring it", source, raw[:40])
    return None


def parse_allowed_paths(raw: str | None) -> tuple[str, ...]:
    """Parse ``PI_WORKER_ALLOWED_PATHS``: a JSON array of absolute paths, whole or not at all."""
    if raw is None or raw == "":
        return ()

    def fail(problem: str) -> ContractError:
        return ContractError(
            ENV_ALLOWED_PATHS,
            problem,
            'set it to a JSON array of absolute paths, e.g. ["/work/repo"], or [] for full scope',
        )

    if "\0" in raw:
        raise fail("contains a NUL character")
    try:
        value = strictjson.loads(raw, max_bytes=ALLOWED_PATHS_MAX_BYTES, max_depth=2)
    except strictjson.StrictJSONError as exc:
        raise fail(f"not strict JSON ({exc})") from None
    if not isinstance(value, list):
        raise fail(f"is a JSON {type(value).__name__}, not an array")
    if len(value) > ALLOWED_PATHS_MAX_ITEMS:
        raise fail(f"has {len(value)} paths (limit {ALLOWED_PATHS_MAX_ITEMS})")
    paths: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise fail(f"item {index} is not a non-empty string")
        if "\0" in item:
            raise fail(f"item {index} contains a NUL character")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise fail(f"item {index} is not valid UTF-8 (a lone surrogate): no file has that name") from None
        if not item.startswith("/"):
            raise fail(f"item {index} ({item[:60]!r}) is relative")
        parts = item.rstrip("/").split("/")[1:]
        if any(part in ("", ".", "..") for part in parts):
            raise fail(f"item {index} ({item[:60]!r}) is not normalised (empty, '.' or '..' part)")
        paths.append(os.path.normpath(item))
    return tuple(paths)


def path_allowed(path: str, allowed: Iterable[str]) -> bool:
    """Whether ``path`` lies inside the envelope. ``()`` is full scope.

    Compared on real paths with ``commonpath``, so ``/p-evil`` is not inside ``/p`` and a
    symlink cannot smuggle a path out.
    """
    roots = tuple(allowed)
    if not roots:
        return True
    try:
        real = os.path.realpath(path)
    except (UnicodeEncodeError, ValueError):
        return False  # a name no file can have (a lone surrogate, a NUL) is never inside
    for root in roots:
        real_root = os.path.realpath(root)
        if os.path.commonpath([real, real_root]) == real_root:
            return True
    return False


def _optional(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def _trimmed(value: str | None) -> str | None:
    """An id-like contract value with the whitespace around it dropped; only whitespace is none.

    Launchers and shells pad values (``PI_TASK_REF="goal-1 "``, a line read with its newline):
    as in the origin, the padding is not part of the id, so it neither stops the agent nor loses
    the parent session that makes it recoverable."""
    if value is None:
        return None
    return value.strip() or None


def parse_env(env: Mapping[str, str] | None = None) -> LaunchContract:
    """Read the contract from an environment (``os.environ`` by default)."""
    source = os.environ if env is None else env
    return _build(
        parent_pid_raw=source.get(ENV_PARENT_PID),
        parent_pid_source=ENV_PARENT_PID,
        parent_start=parse_parent_start(source.get(ENV_PARENT_START)),
        parent_session=_optional(source, ENV_PARENT_SESSION),
        parent_session_source=ENV_PARENT_SESSION,
        agent_id=_optional(source, ENV_AGENT_ID),
        task_ref=_optional(source, ENV_TASK_REF),
        task_ref_source=ENV_TASK_REF,
        lane=_optional(source, ENV_WORKTREE_LANE),
        lane_source=ENV_WORKTREE_LANE,
        allowed_raw=source.get(ENV_ALLOWED_PATHS),
    )


def _build(
    *,
    parent_pid_raw: str | None,
    parent_pid_source: str,
    parent_start: int | None = None,
    parent_session: str | None,
    parent_session_source: str,
    agent_id: str | None,
    task_ref: str | None,
    task_ref_source: str,
    lane: str | None,
    lane_source: str,
    allowed_raw: str | None,
) -> LaunchContract:
    parent_pid = parse_parent_pid(parent_pid_raw, parent_pid_source)
    parent_session, agent_id, task_ref = _trimmed(parent_session), _trimmed(agent_id), _trimmed(task_ref)
    if parent_session is not None:
        try:
            validate_id(parent_session, parent_session_source)
        except ContractError as exc:
            # The parent session is diagnostic and fences adoption; a bad one must not turn a
            # worker into a crash, but it must not be recorded either.
            log.warning("%s; ignoring it", exc)
            parent_session = None
    if agent_id is not None:
        validate_id(agent_id, ENV_AGENT_ID)
    if task_ref is not None:
        validate_task_ref(task_ref, task_ref_source)
    if lane is not None:
        validate_id(lane, lane_source)
    return LaunchContract(
        parent_pid=parent_pid,
        parent_session=parent_session if parent_pid is not None else None,
        parent_start=parent_start if parent_pid is not None else None,
        agent_id=agent_id,
        task_ref=task_ref,
        allowed_paths=parse_allowed_paths(allowed_raw),
        worktree_lane=lane,
    )


def add_contract_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the CLI sugar of the contract; every flag falls back to its env variable."""
    group = parser.add_argument_group("matrix contract (each flag falls back to its env variable)")
    group.add_argument("--parent-pid", metavar="PID", help=f"declares a worker of PID ({ENV_PARENT_PID})")
    group.add_argument(
        "--parent-start", metavar="TICKS", help=f"the parent's kernel start ticks ({ENV_PARENT_START})"
    )
    group.add_argument(
        "--parent-session", metavar="ID", help=f"the parent's session id ({ENV_PARENT_SESSION})"
    )
    group.add_argument("--agent-id", metavar="ID", help=f"the stable logical agent id ({ENV_AGENT_ID})")
    group.add_argument("--task-ref", metavar="REF", help=f"the goal/task identity ({ENV_TASK_REF})")
    group.add_argument(
        "--worktree-lane",
        "--lane",
        dest="worktree_lane",
        metavar="LANE",
        help=f"the worktree lane ({ENV_WORKTREE_LANE})",
    )


def contract_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> LaunchContract:
    """Flags win over env; allowed paths come from env only (launch-only channel)."""
    source = os.environ if env is None else env

    def pick(flag_value: str | None, name: str, flag: str) -> tuple[str | None, str]:
        if flag_value is not None:
            return (flag_value or None), flag
        return _optional(source, name), name

    pid_raw, pid_src = pick(getattr(args, "parent_pid", None), ENV_PARENT_PID, "--parent-pid")
    start_raw, start_src = pick(getattr(args, "parent_start", None), ENV_PARENT_START, "--parent-start")
    session, session_src = pick(getattr(args, "parent_session", None), ENV_PARENT_SESSION, "--parent-session")
    agent, _ = pick(getattr(args, "agent_id", None), ENV_AGENT_ID, "--agent-id")
    task, task_src = pick(getattr(args, "task_ref", None), ENV_TASK_REF, "--task-ref")
    lane, lane_src = pick(getattr(args, "worktree_lane", None), ENV_WORKTREE_LANE, "--worktree-lane")
    return _build(
        parent_pid_raw=pid_raw,
        parent_pid_source=pid_src,
        parent_start=parse_parent_start(start_raw, start_src),
        parent_session=session,
        parent_session_source=session_src,
        agent_id=agent,
        task_ref=task,
        task_ref_source=task_src,
        lane=lane,
        lane_source=lane_src,
        allowed_raw=source.get(ENV_ALLOWED_PATHS),
    )
