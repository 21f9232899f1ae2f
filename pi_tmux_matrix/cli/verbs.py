"""The verbs as a person meets them: each one's one-line summary, in groups (everyday, recovery,
teams and tmux, setup), and the product's own verbs kept out of sight. The one source of a verb's
summary: its parser takes it from here (:func:`.base.add_verb`), and ``pi-matrix --help`` prints
these groups without loading any verb's module (docs/decisions.md#a-verb-loads-only-what-it-uses).
"""

from __future__ import annotations

import shutil
import textwrap
from typing import Final

__all__ = ["GROUPS", "HIDDEN", "SUMMARY", "top_help"]

GC_WORD: Final = "yes-gc"  # gc's confirmation word (cli/gc.py spells it from here)

SUMMARY: Final[dict[str, str]] = {
    "demo": "the main job end to end on its own tmux socket (a master, 3 agents, a crash, a recovery)",
    "fire": "launch agents from a launch profile or team into tmux panes (fire_task)",
    "jobs": "dispatcher jobs, reconciled with tmux and process identity",
    "job": "one job: its agents, their results, hosts and panes",
    "followup": "more work for a job's live agents (a fresh marker round)",
    "dismiss": "done with a finished job: stop its idle agents, hide it",
    "top": "the live view: masters and workers, CPU and memory, with keys to adopt, clean up, resume, stop",
    "tree": "masters with their workers: status, age, lane, task",
    "ls": "list every entry; 'alive' is judged by process identity",
    "show": "one entry: status, identity, directive, payload, handoffs, blocked tool calls",
    "send": "a message to the agent through its host's mailbox",
    "attach": "into the agent's tmux pane, on its server (inside tmux: switch or a new window)",
    "logs": "the agent's recent output (its pane, its log or its conversation); -f to follow",
    "stop": "stop an agent (KEY) or a whole job (ID); needs --confirm yes-tmux-stop",
    "master": "master activation: register, reconcile, scan for orphans, recover or ask, heartbeat",
    "resume": "relaunch a resumable worker into its exact session file",
    "adopt": "owner-approved adoption grant for a worker",
    "cleanup": "owner-approved cooperative wind-down request",
    "scan": "orphan report (workers whose parent is dead); writes nothing",
    "reconcile": "the reconciliation plan, applied under CAS unless --dry-run",
    "repair": "move corrupt or foreign files to quarantine/ and remove dead writers' temp files",
    "gc": (
        "remove history past the retention window and what removed entries left "
        f"(a preview without --confirm {GC_WORD})"
    ),
    "workspace": (
        "a team template's agents, interactive, as the tiled panes of a fresh tmux session "
        "(launch_workspace; no watcher, no deadline)"
    ),
    "templates": "team templates: list them, or show one with its members' instructions",
    "var": "a job's variables: list, read or set one (its workers read them when told to)",
    "stop-session": "stop every job with agents in tmux session NAME (a preview without the word)",
    "notify": "show a one-line message to the clients of a tmux session (tmux display-message)",
    "set-status": "set (or with no VALUE clear) a tmux session's @pi_KEY option for its status line",
    "lanes": "the lanes (git worktrees) of a repository and who uses them; prune idle ones",
    "fork": "run a task in a fork of a pi session (a child pi beside you in tmux)",
    "runs": "fork runs with their status and a cost/usage total",
    "doctor": "check tmux, pidfd, the state dir, node, pi and its fd and rg, and show the settings in force",
    "status": "tmux here (binary, version, the dispatcher's server, your session) and the matrix summary",
    "setup-help": "how to use the tmux route, or how to get tmux when it is missing",
    "guard": "is the tmux route open? (exit 0 yes, 1 no; diagnostic only, blocks nothing)",
    "profiles": "the launch profiles and teams in force, and their files",
    "completion": "print a shell completion script (bash, zsh or fish)",
    "fake-model": "real pi offline: serve the bundled fake model on 127.0.0.1 and point a pi agent dir at it",
}
# The groups of ``--help``, each in the order a person reaches for them.
_EVERYDAY: Final = ("demo", "fire", "jobs", "job", "followup", "dismiss", "top", "tree", "ls", "show")
_EVERYDAY_TOO: Final = ("attach", "logs", "send", "stop", "master")
GROUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("everyday", _EVERYDAY + _EVERYDAY_TOO),
    ("recovery", ("resume", "adopt", "cleanup", "scan", "reconcile", "repair", "gc")),
    (
        "teams and tmux",
        ("workspace", "templates", "var", "stop-session", "notify", "set-status", "lanes", "fork", "runs"),
    ),
    ("setup", ("doctor", "status", "setup-help", "guard", "profiles", "completion", "fake-model")),
)
# What the product runs for itself: a fire's agent host, the completion scripts' name lookup.
HIDDEN: Final = frozenset({"host", "complete-names"})

_USAGE: Final = "usage: pi-matrix [-h] [--version] [--state-dir DIR] COMMAND ..."
_OPTIONS: Final = (
    ("-h, --help", "show this help message and exit (COMMAND --help: that command's)"),
    ("--version", "show program's version number and exit"),
    ("--state-dir DIR", "the matrix state dir (default: see below)"),
)


def top_help(epilog: str, description: str, width: int | None = None) -> str:
    """``pi-matrix --help``: the verbs by group, then the options and ``epilog``."""
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 100)
    left = 2 + max(len(name) for name in [*SUMMARY, *(o for o, _ in _OPTIONS)]) + 2
    lines = [_USAGE, "", description, ""]

    def item(name: str, text: str) -> None:
        wrapped = textwrap.wrap(text, max(width - left, 30)) or [""]
        lines.append(f"  {name}".ljust(left) + wrapped[0])
        lines.extend(" " * left + more for more in wrapped[1:])

    for title, verbs in GROUPS:
        lines.append(f"{title}:")
        for name in verbs:
            item(name, SUMMARY[name])
        lines.append("")
    lines.append("options:")
    for name, text in _OPTIONS:
        item(name, text)
    return "\n".join(lines) + "\n\n" + epilog.rstrip("\n") + "\n"
