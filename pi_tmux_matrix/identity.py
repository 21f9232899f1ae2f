"""The single source of an agent's identity, and the id rules every boundary enforces.

``AgentIdentityContract`` is the one place an agent's logical identity lives. Matrix entries and
resumable payloads embed it whole; nothing keeps a parallel copy of its fields, so a resume can
never relaunch with a lane from one record and a session file from another.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, Final

import attrs

from .errors import InvalidId

__all__ = [
    "ID_MAX",
    "ID_PATTERN",
    "KEY_PATTERN",
    "AgentIdentityContract",
    "Mode",
    "ProcessIdentity",
    "Role",
    "entry_key",
    "parse_key",
    "validate_id",
    "validate_task_ref",
]

# Ids end up in file names: this allowlist means an accepted id can only ever name a file
# directly inside the state dir (no separators, no leading dot, no "..", bounded length).
ID_MAX: Final = 128  # characters of an id: every file name the matrix derives from ids stays valid
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A task ref never names a file, and goal ids in the wild carry ':' '#' '@' '+' '/'.
TASK_REF_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:#@+/-]{0,255}")
KEY_PATTERN: Final = re.compile(r"(master|worker)-([A-Za-z0-9][A-Za-z0-9._-]{0,127})")

MAX_PATH_CHARS: Final = 4096
MAX_RESOURCE_POINTERS: Final = 64


@attrs.frozen
class ProcessIdentity:
    """A process that cannot be confused with a later one that reuses its pid.

    ``start_ticks`` is the kernel start time in clock ticks since boot (``/proc/<pid>/stat``
    field 22); ``boot_id`` is ``/proc/sys/kernel/random/boot_id``. Liveness lives in ``procs``.
    """

    pid: int
    start_ticks: int
    boot_id: str


class Role(str, Enum):
    """A registered process is a master (no declared parent) or a worker (declared parent)."""

    MASTER = "master"
    WORKER = "worker"


class Mode(str, Enum):
    """How the agent CLI runs: with a TTY, one-shot print, or a JSON-lines rpc pipe."""

    INTERACTIVE = "interactive"
    PRINT = "print"
    RPC = "rpc"


def validate_id(value: object, field: str) -> str:
    """Return ``value`` if it is an acceptable id, else raise :class:`InvalidId` naming ``field``.

    >>> validate_id("orch-lane-1.worker", "agentId")
    'orch-lane-1.worker'
    >>> validate_id("../etc", "sessionId")
    Traceback (most recent call last):
    ...
    pi_tmux_matrix.errors.InvalidId: sessionId: '../etc' is not a valid id; ...
    """
    if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
        raise InvalidId(
            field,
            f"{_shown(value)} is not a valid id",
            "use 1-128 characters from A-Z a-z 0-9 . _ - starting with a letter or digit",
        )
    return value


def validate_task_ref(value: object, field: str = "taskRef") -> str:
    """Like :func:`validate_id` but also allows ``: # @ + /`` (task refs never name files)."""
    if not isinstance(value, str) or TASK_REF_PATTERN.fullmatch(value) is None:
        raise InvalidId(
            field,
            f"{_shown(value)} is not a valid task ref",
            "use 1-256 characters from A-Z a-z 0-9 . _ - : # @ + / starting with a letter or digit",
        )
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def entry_key(role: Role, session_id: str) -> str:
    """The matrix key ``<role>-<sessionId>``.

    >>> entry_key(Role.WORKER, "abc123")
    'worker-abc123'
    """
    # Role(role) only for a plain string: the Enum call costs more than the rest of the key.
    value = role.value if type(role) is Role else Role(role).value
    return f"{value}-{validate_id(session_id, 'sessionId')}"


def parse_key(key: object) -> tuple[Role, str]:
    """Split and validate an entry key; raises :class:`InvalidId` for anything else."""
    match = KEY_PATTERN.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise InvalidId(
            "key",
            f"{_shown(key)} is not an entry key",
            "keys look like master-<sessionId> or worker-<sessionId>; see 'pi-matrix ls'",
        )
    return Role(match.group(1)), match.group(2)


_Validator = Callable[[Any, Any, Any], None]


def _optional_id(field: str) -> _Validator:
    def check(_inst: object, _attr: attrs.Attribute[str | None], value: str | None) -> None:
        if value is not None:
            validate_id(value, field)

    return check


def _optional_path(field: str) -> _Validator:
    def check(_inst: object, _attr: attrs.Attribute[str | None], value: str | None) -> None:
        if value is None:
            return
        _check_path(value, field)

    return check


def _check_path(value: object, field: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidId(field, f"{_shown(value)} is not a path", "give an absolute path")
    if "\0" in value or len(value) > MAX_PATH_CHARS:
        raise InvalidId(
            field, "contains NUL or is too long", f"give an absolute path under {MAX_PATH_CHARS} chars"
        )
    if not value.startswith("/"):  # os.path.isabs on POSIX, without its three calls per path
        raise InvalidId(field, f"{_shown(value)} is relative", "give an absolute path")


def _to_paths(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _check_pointers(_inst: object, _attr: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    if len(value) > MAX_RESOURCE_POINTERS:
        raise InvalidId(
            "resourcePointers",
            f"{len(value)} pointers",
            f"keep at most {MAX_RESOURCE_POINTERS}",
        )
    for item in value:
        _check_path(item, "resourcePointers")


@attrs.frozen(kw_only=True)
class AgentIdentityContract:
    """Who an agent is, independent of which process currently runs it.

    ``session_id`` is what the entry key is derived from; ``agent_id`` is the stable logical-agent
    id carried across exact-session resumes (``PI_ORCHESTRATION_AGENT_ID``).
    """

    agent_id: str = attrs.field(validator=lambda _i, _a, v: validate_id(v, "agentId"))
    session_id: str = attrs.field(validator=lambda _i, _a, v: validate_id(v, "sessionId"))
    session_file: str | None = attrs.field(default=None, validator=_optional_path("sessionFile"))
    cwd: str | None = attrs.field(default=None, validator=_optional_path("cwd"))
    worktree: str | None = attrs.field(default=None, validator=_optional_path("worktree"))
    lane: str | None = attrs.field(default=None, validator=_optional_id("lane"))
    profile: str | None = attrs.field(default=None, validator=_optional_id("profile"))
    provider: str | None = attrs.field(default=None, validator=_optional_id("provider"))
    mode: Mode | None = None
    resource_pointers: tuple[str, ...] = attrs.field(
        default=(), converter=_to_paths, validator=_check_pointers
    )

    def key(self, role: Role) -> str:
        """The matrix key of the entry this identity registers as ``role``."""
        return entry_key(role, self.session_id)

    @property
    def is_pi(self) -> bool:
        """A pi agent (or one whose provider was never recorded, which pi itself writes)."""
        return self.provider in (None, "pi")

    @property
    def relaunchable(self) -> bool:
        """A pi agent with its working directory: it can be relaunched as the same logical agent
        (same agent id, same session id), into its session file when it has one, else into a
        fresh one whose wake prompt says the transcript was lost."""
        return self.is_pi and self.cwd is not None

    @property
    def resume_complete(self) -> bool:
        """Enough durable context to relaunch this exact session: 'complete'
        (docs/decisions.md#exact-orphans-are-recovered-without-asking)."""
        return self.is_pi and self.session_file is not None and self.cwd is not None
