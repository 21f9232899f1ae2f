"""The names of the launch contract and of the product's environment, in one home
(docs/decisions.md#one-contract-between-launcher-and-agent): every ``PI_*`` variable a launcher
sets, a host tells its agent or a program reads, and the dispatcher's default tmux socket. Every
other module imports the constant (tests/test_names_home.py).

Names only, so that whatever reads them starts light (a stand-in agent, a bridge's call of the
CLI); the contract's parsing and rendering is :mod:`.launch_contract`.
"""

from __future__ import annotations

from typing import Final

from .paths import ENV_AGENT_DIR, ENV_STATE_DIR

__all__ = [
    "CONTRACT_ENV",
    "DEFAULT_SOCKET",
    "ENV_AGENT_DIR",
    "ENV_AGENT_ID",
    "ENV_ALLOWED_PATHS",
    "ENV_BLOCKED_MARKER",
    "ENV_BRIDGE_DEBUG",
    "ENV_CLI",
    "ENV_DONE_MARKER",
    "ENV_FORK",
    "ENV_FORK_RESULT_PATH",
    "ENV_FORK_RUN_ID",
    "ENV_FORK_TASK",
    "ENV_HOST_PID",
    "ENV_KEY",
    "ENV_MAILBOX",
    "ENV_OFFLINE",
    "ENV_PARENT_PID",
    "ENV_PARENT_SESSION",
    "ENV_PARENT_START",
    "ENV_PI_COMMAND",
    "ENV_PROFILE",
    "ENV_PROJECT_TRUST",
    "ENV_STATE_DIR",
    "ENV_TASK_REF",
    "ENV_TMUX",
    "ENV_TMUX_PANE",
    "ENV_TMUX_SOCKET",
    "ENV_USAGE_FILE",
    "ENV_WORKTREE_LANE",
    "FORK_FORCED_ENV",
    "FORK_NOT_INHERITED",
    "FORK_RUN_ENV",
    "NEVER_INHERITED",
    "PASS_ENV",
    "RESERVED_ENV_PREFIX",
]

ENV_PARENT_PID: Final = "PI_PARENT_PID"
ENV_PARENT_SESSION: Final = "PI_PARENT_SESSION"
ENV_AGENT_ID: Final = "PI_ORCHESTRATION_AGENT_ID"
ENV_TASK_REF: Final = "PI_TASK_REF"
ENV_ALLOWED_PATHS: Final = "PI_WORKER_ALLOWED_PATHS"
ENV_WORKTREE_LANE: Final = "PI_WORKTREE_LANE"
# The parent's kernel start time (clock ticks) beside its pid: a pid alone may name whoever got it
# next, so a host whose parent pid is now held by another process knows its parent is gone.
ENV_PARENT_START: Final = "PI_PARENT_START"
# The contract: authority the launcher grants per launch, never taken from a profile
# (docs/decisions.md#one-contract-between-launcher-and-agent).
CONTRACT_ENV: Final = frozenset(
    {
        ENV_PARENT_PID,
        ENV_PARENT_START,
        ENV_PARENT_SESSION,
        ENV_AGENT_ID,
        ENV_TASK_REF,
        ENV_ALLOWED_PATHS,
        ENV_WORKTREE_LANE,
    }
)

# What a host tells its own agent (the bridge and the stand-in read them).
ENV_KEY: Final = "PI_MATRIX_KEY"
ENV_MAILBOX: Final = "PI_MATRIX_MAILBOX"
ENV_HOST_PID: Final = "PI_MATRIX_HOST_PID"
ENV_CLI: Final = "PI_MATRIX_CLI"
ENV_DONE_MARKER: Final = "PI_MATRIX_DONE_MARKER"
ENV_BLOCKED_MARKER: Final = "PI_MATRIX_BLOCKED_MARKER"
ENV_PROFILE: Final = "PI_MATRIX_PROFILE"
# Where a job's worker may claim its first round's usage (later rounds: the follow-up names it).
ENV_USAGE_FILE: Final = "PI_MATRIX_USAGE_FILE"
# Where the product's own programs are found and run (the state dir's and pi's agent dir's names,
# ENV_STATE_DIR and ENV_AGENT_DIR, are paths.py's: a listing reads them without this module).
ENV_PI_COMMAND: Final = "PI_MATRIX_PI_COMMAND"
# A file the pi bridge appends its debug lines to (what it caught and went on without); unset: none.
ENV_BRIDGE_DEBUG: Final = "PI_MATRIX_BRIDGE_DEBUG"
# How the bridge answers pi's project_trust event (pi >= 0.79): "yes", "no", or unset (pi decides).
ENV_PROJECT_TRUST: Final = "PI_MATRIX_PROJECT_TRUST"
ENV_TMUX_SOCKET: Final = "PI_MATRIX_TMUX_SOCKET"
# pi's own switch: no network at start (update checks, model catalogs); a fork and the offline
# fake model (docs/offline.md) set it.
ENV_OFFLINE: Final = "PI_OFFLINE"
DEFAULT_SOCKET: Final = "pi-matrix"  # the dispatcher's own tmux server (tmux -L) without the above
ENV_TMUX: Final = "TMUX"  # set by tmux in every pane: "<socket path>,<server pid>,<session>"
ENV_TMUX_PANE: Final = "TMUX_PANE"  # set by tmux in every pane: its id, e.g. %3
# Every PI_MATRIX_* name is the product's: a profile may not set one (it would forge a marker,
# a mailbox or a host).
RESERVED_ENV_PREFIX: Final = "PI_MATRIX_"

# A fork run's own names, and what a fork child is always given
# (docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority).
ENV_FORK: Final = "PI_FORK"
ENV_FORK_RESULT_PATH: Final = "PI_FORK_RESULT_PATH"
ENV_FORK_RUN_ID: Final = "PI_FORK_RUN_ID"
ENV_FORK_TASK: Final = "PI_FORK_TASK"
FORK_RUN_ENV: Final = frozenset({ENV_FORK_RESULT_PATH, ENV_FORK_RUN_ID, ENV_FORK_TASK})
FORK_FORCED_ENV: Final = {
    ENV_FORK: "1",
    ENV_OFFLINE: "1",
    "PI_SUBAGENT_DISABLE_SCHEDULER": "1",
    "PI_OBSERVATIONAL_MEMORY_PASSIVE": "1",
}

# Never inherited by a launched agent from whoever launched it (the dispatcher, a tmux server
# started long ago, a fork's parent): each launch sets its own, or the child would speak for its
# parent (its host, its contract, its markers).
NEVER_INHERITED: Final = CONTRACT_ENV | frozenset(
    {ENV_KEY, ENV_MAILBOX, ENV_HOST_PID, ENV_DONE_MARKER, ENV_BLOCKED_MARKER, ENV_PROFILE, ENV_USAGE_FILE}
)
# A fork child is also not the caller's pane, nor an earlier fork run.
FORK_NOT_INHERITED: Final = NEVER_INHERITED | FORK_RUN_ENV | frozenset({ENV_TMUX, ENV_TMUX_PANE})
# Passed explicitly on every tmux launch: a long-lived tmux server keeps the env of its first client.
# (No test double's knob: the stand-in's reach a pane through the tmux server its test started.)
PASS_ENV: Final = (
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    ENV_AGENT_DIR,
    ENV_OFFLINE,
    "NO_PROXY",
    "no_proxy",
    ENV_PI_COMMAND,
    ENV_BRIDGE_DEBUG,
)
