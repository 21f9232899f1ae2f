"""One rooted exception hierarchy.

Library code raises these; only the CLI turns them into a line on stderr and an exit code.
Every error carries the field (or path) it is about and says how to fix it, because the
person reading it is usually in the middle of an incident.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "AdoptionRefused",
    "AgentNotFound",
    "Ambiguous",
    "Conflict",
    "ContractError",
    "CorruptEntry",
    "DispatchError",
    "EntryExists",
    "IllegalTransition",
    "InvalidId",
    "JobNotFound",
    "LaneError",
    "LockUnavailable",
    "NoMaster",
    "NoSuch",
    "NotConfirmed",
    "NotFound",
    "PiMatrixError",
    "ProfileError",
    "ProfileNotFound",
    "ResumeRefused",
    "RunNotFound",
    "StateDirError",
    "StoreError",
    "TmuxUnavailable",
    "UsageError",
    "exit_code_for",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3


def exit_code_for(error: BaseException) -> int:
    """The one exit-code rule (docs/cli.md): bad input or usage 2, the thing named does not exist
    3, every other failure 1. Each error class says which it is; anything else failed (1)."""
    if isinstance(error, PiMatrixError):
        return error.exit_code
    if isinstance(error, SystemExit):  # argparse's own usage errors
        return error.code if isinstance(error.code, int) else EXIT_USAGE
    return EXIT_FAILED


class PiMatrixError(Exception):
    """Root of every error pi_tmux_matrix raises on purpose."""

    exit_code: int = EXIT_FAILED

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduce replays ``cls(*self.args)``, but ``args`` holds the formatted
        # message while most subclasses' __init__ takes the fields, so unpickling raised
        # TypeError (and a multiprocessing pool could not hand the error back). Rebuild with
        # __new__ and restore args and __dict__ as they were instead: every subclass, present or
        # future, round-trips with its message and fields, whatever its constructor takes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[PiMatrixError], args: tuple[Any, ...], state: dict[str, Any]) -> PiMatrixError:
    """Unpickle ``cls`` as it was pickled, without running its __init__ again."""
    err = cls.__new__(cls, *args)  # BaseException.__new__ sets .args (the message)
    err.__dict__.update(state)  # the fields, plus __notes__ if any were added
    return err


class ContractError(PiMatrixError, ValueError):
    """Bad input at a boundary: an env variable, a flag, an id, a settings value."""

    exit_code = EXIT_USAGE

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")


class UsageError(PiMatrixError):
    """A command line argparse refuses (an unknown flag, a bad choice, flags that exclude each
    other): exit 2, written where every other error goes."""

    exit_code = EXIT_USAGE


class InvalidId(ContractError):
    """An id (session, agent, lane, task ref, entry key) that failed the allowlist."""


class Ambiguous(ContractError):
    """A prefix or agent id a person typed that names more than one thing: the candidates are
    listed, nothing is guessed (as git and docker refuse an ambiguous short id)."""

    def __init__(self, field: str, word: str, candidates: list[str]) -> None:
        self.word = word
        self.candidates = candidates
        shown = ", ".join(candidates[:10]) + (
            f" (and {len(candidates) - 10} more)" if len(candidates) > 10 else ""
        )
        super().__init__(field, f"{word!r} is ambiguous: it names {shown}", "type more of the one you mean")


class IllegalTransition(PiMatrixError):
    """A status change the lifecycle model does not allow."""

    def __init__(self, key: str, current: str, target: str) -> None:
        self.key = key
        self.current = current
        self.target = target
        super().__init__(
            f"{key}: status {current} cannot move to {target}; "
            "re-read the entry and act on its current status"
        )


class AdoptionRefused(PiMatrixError):
    """An adoption grant that lost: another master's grant for the same worker won (one grant
    wins), so nothing was written. Not a :class:`Conflict`: re-reading and retrying cannot win
    it, the worker is the winner's now.

    ``how``: ``granted`` (the winner's grant stands, its host has not yet accepted it) or
    ``adopted`` (the worker re-parented to the winner since the grant was decided)."""

    def __init__(self, key: str, how: str, winner_pid: int | None, winner_session: str | None) -> None:
        self.key = key
        self.how = how
        self.winner_pid = winner_pid
        self.winner_session = winner_session
        self.winner = f"master pid {winner_pid} session {winner_session or '-'}"
        said = "already granted to" if how == "granted" else "already adopted by"
        super().__init__(
            f"{key}: adoption refused: {said} {self.winner}; it is that master's worker now "
            "('pi-matrix show' names its parent)"
        )


class StoreError(PiMatrixError):
    """The entry store could not complete an operation; nothing was committed."""

    def __init__(
        self, message: str, *, path: str | None = None, errno: int | None = None, committed: bool = False
    ) -> None:
        self.path = path
        self.errno = errno
        # The new version was in place when the write failed (only its folder's fsync did).
        self.committed = committed
        super().__init__(message)


class StateDirError(StoreError):
    """The state dir is unsafe or unusable (symlink, wrong owner, wrong mode, not a dir)."""

    exit_code = EXIT_USAGE


class LockUnavailable(StoreError):
    """The per-entry lock could not be taken (timeout, or no real flock on this filesystem)."""


class Conflict(StoreError):
    """The generation token observed is no longer the one on disk; the write was refused."""

    def __init__(self, key: str, expected: str | None, found: str | None) -> None:
        self.key = key
        self.expected = expected
        self.found = found
        super().__init__(
            f"{key}: generation {expected or '<none>'} is no longer current "
            f"(on disk: {found or '<no entry>'}); re-read the entry and retry"
        )


class EntryExists(Conflict):
    """An exclusive create found the key already present."""

    def __init__(self, key: str, found: str | None) -> None:
        super().__init__(key, None, found)
        self.args = (f"{key}: an entry with this key already exists (generation {found})",)


class NotFound(StoreError):
    """No entry with this key."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"{key}: no such entry; run 'pi-matrix ls' to see the keys")


class CorruptEntry(StoreError):
    """A file named like an entry that is not a valid entry. Never deleted implicitly.

    ``newer``: written by a newer pi-matrix. ``repair`` leaves such a file alone, so the fix said
    is to upgrade, never to run repair. ``fix``: the fix for a file outside repair's reach."""

    def __init__(self, path: str, reason: str, *, newer: bool = False, fix: str | None = None) -> None:
        self.reason = reason
        self.newer = newer
        # ``fix``: a file ``repair`` does not handle (a mailbox message, a claim, a log) says its own.
        if fix is None:
            fix = (
                "upgrade pi-matrix to read it ('pi-matrix repair' leaves it alone)"
                if newer
                else "run 'pi-matrix repair' to move it to quarantine/"
            )
        super().__init__(f"{path}: {reason}; {fix}", path=path)


# --- the dispatcher -------------------------------------------------------------------------------
class ProfileError(ContractError):
    """A launch profile or team template that cannot be used as written (names file and field)."""

    def __init__(self, source: str, field: str, problem: str, fix: str) -> None:
        self.source = source
        super().__init__(f"{source}: {field}" if source else field, problem, fix)


class ProfileNotFound(PiMatrixError):
    """No launch profile or team of that name."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        choices = ", ".join(known) if known else "none"
        super().__init__(f"no {kind} named {name!r}; known: {choices}")


class LaneError(PiMatrixError):
    """A lane (git worktree) that cannot be created, reused or bound."""

    exit_code = EXIT_USAGE


class TmuxUnavailable(PiMatrixError):
    """The tmux server cannot be reached (not installed, not running, socket refused).

    Never evidence that an agent is dead: the matrix judges that by process identity."""

    def __init__(self, socket: str, reason: str) -> None:
        self.socket = socket
        self.reason = reason
        super().__init__(f"tmux server on socket {socket!r} unreachable: {reason}")


class DispatchError(PiMatrixError):
    """A launch or job operation that failed (nothing half-launched is left unrecorded)."""


class JobNotFound(PiMatrixError):
    """No dispatcher job with that id."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job {job_id!r}; 'pi-matrix jobs' lists them")


class RunNotFound(PiMatrixError):
    """No fork run with that id."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no fork run {run_id!r}; 'pi-matrix runs' lists them")


class NoMaster(PiMatrixError):
    """A verb that acts for a master was run under none: the operation is refused (exit 1), the
    input itself was fine."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        super().__init__(
            f"{verb}: no calling master (no ancestor process is a registered master); run it under "
            "'pi-matrix master -- <your shell or agent>', or pass --parent-pid and --parent-session"
        )


class NotConfirmed(PiMatrixError):
    """A stop asked without the confirming word: a preview was printed and nothing was stopped."""

    exit_code = EXIT_USAGE

    def __init__(self, word: str) -> None:
        super().__init__(f"nothing was stopped; add --confirm {word} to stop it")


class NoSuch(PiMatrixError):
    """The thing named does not exist (a job's variable, a tmux session with no job): exit 3."""

    exit_code = EXIT_NOT_FOUND


class AgentNotFound(NoSuch):
    """A job has no agent of that id."""

    def __init__(self, job_id: str, agent_id: str) -> None:
        self.job_id = job_id
        self.agent_id = agent_id
        super().__init__(f"job {job_id} has no agent {agent_id!r}; 'pi-matrix job {job_id}' lists them")


class ResumeRefused(PiMatrixError):
    """The entry cannot be resumed as it stands; the message says why and what to do."""
