"""pi's project trust (pi >= 0.79), as a master decides it.

pi started interactively in a folder with project-local pi resources (``.pi/settings.json``,
``mcp.json``, ``extensions``, ``skills``, ``prompts``, ``themes``, ``SYSTEM.md``,
``APPEND_SYSTEM.md``, or a ``.agents/skills`` in it or above it) asks "Trust project folder?" and
starts nothing until answered. Workers never trust (dispatch/providers.py). A master follows
``processMatrix.masterProjectTrust``: ``pi`` (default) leaves it to pi (its ``trust.json``, its
``defaultProjectTrust``, else the dialog) and says which of those will decide; ``trust`` and
``never`` decide ahead. Either way the decision is printed before pi starts, so a master never
waits silently, and the bridge loads once pi goes on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs

from . import strictjson
from .contract import ENV_PROJECT_TRUST
from .piversion import TRUST_FLAGS_SINCE, PiInfo, pi_info, program_length, small_text, warn_unsupported
from .programs import agent_argv
from .settings import agent_dir, load_settings

__all__ = ["TRUST_FLAGS", "TrustDecision", "decide_master_trust", "master_trust", "trust_requiring_resource"]

# pi's own list (core/trust-manager.js, 1.6): what under <cwd>/.pi makes pi ask.
_RESOURCES: Final = (
    "settings.json",
    "mcp.json",
    "extensions",
    "skills",
    "prompts",
    "themes",
    "SYSTEM.md",
    "APPEND_SYSTEM.md",
)
TRUST_FLAGS: Final = frozenset({"--approve", "-a", "--no-approve", "-na"})
_MAX_TRUST_FILE: Final = 1024 * 1024


def trust_requiring_resource(cwd: str, home: str | None = None) -> str | None:
    """The first project-local resource that makes pi ask about ``cwd``, or None."""
    here = Path(os.path.realpath(cwd))
    for name in _RESOURCES:
        if (here / ".pi" / name).exists():
            return str(here / ".pi" / name)
    user_skills = Path(os.path.realpath(home or os.path.expanduser("~"))) / ".agents" / "skills"
    for folder in (here, *here.parents):
        skills = folder / ".agents" / "skills"
        if skills != user_skills and skills.exists():
            return str(skills)
    return None


def _json_object(path: Path) -> dict[str, object]:
    """pi's ``trust.json`` as an object ({} when missing or unusable): bounded, never blocking,
    parsed strictly (a file nested thousands deep is unusable, never a RecursionError)."""
    text = small_text(str(path), _MAX_TRUST_FILE)
    if text is None:
        return {}
    try:
        value = strictjson.loads(text, max_bytes=_MAX_TRUST_FILE)
    except strictjson.StrictJSONError:
        return {}
    return value if isinstance(value, dict) else {}


def _stored(agent_dir: Path, cwd: str) -> bool | None:
    """pi's remembered answer for ``cwd`` or its nearest folder above (``trust.json``)."""
    data = _json_object(agent_dir / "trust.json")
    here = Path(os.path.realpath(cwd))
    for folder in (here, *here.parents):
        value = data.get(str(folder))
        if isinstance(value, bool):
            return value
    return None


@attrs.frozen
class TrustDecision:
    """What a master's pi is given: extra argv words, the bridge's answer (None: unset), and
    the line that says so (None: nothing to say, the folder needs no trust)."""

    flags: tuple[str, ...] = ()
    answer: str | None = None
    message: str | None = None


def decide_master_trust(  # noqa: PLR0917 (the facts it decides on, each its own)
    argv: Sequence[str], info: PiInfo, setting: str, cwd: str, agent_dir: Path, interactive: bool = True
) -> TrustDecision:
    """The master's trust decision for a pi started in ``cwd`` with ``argv`` (see the module)."""
    resource = trust_requiring_resource(cwd)
    if info.version is not None and not info.knows(TRUST_FLAGS_SINCE):
        return TrustDecision()  # this pi has no trust dialog: it loads project files as it always did
    if any(word in TRUST_FLAGS for word in argv[1:]):
        said = None if resource is None else f"{resource}: trust as the pi command line says"
        return TrustDecision(message=said)
    flag_ok = info.knows(TRUST_FLAGS_SINCE)
    if setting == "trust":
        flags = ("--approve",) if flag_ok else ()
        why = "trusted (processMatrix.masterProjectTrust: trust)"
        return TrustDecision(flags, "yes", None if resource is None else f"{resource}: project {why}")
    if setting == "never":
        flags = ("--no-approve",) if flag_ok else ()
        why = "not trusted: its .pi/ resources are not loaded (processMatrix.masterProjectTrust: never)"
        return TrustDecision(flags, "no", None if resource is None else f"{resource}: project {why}")
    if resource is None:
        return TrustDecision()
    stored = _stored(agent_dir, cwd)
    default = _json_object(agent_dir / "settings.json").get("defaultProjectTrust", "ask")
    if stored is not None:
        how = f"pi {'trusts' if stored else 'does not trust'} it (remembered in {agent_dir / 'trust.json'})"
    elif default in ("always", "never"):
        verb = "trusts" if default == "always" else "does not trust"
        how = f"pi {verb} it (your defaultProjectTrust: {default})"
    elif not interactive:
        how = "pi does not trust it: there is no window to ask in (print and rpc modes)"
    else:
        how = (
            "pi asks 'Trust project folder?' in its window before it starts (your defaultProjectTrust: "
            f"{default}); the bridge loads once you answer. To decide ahead, set pi's defaultProjectTrust "
            "or processMatrix.masterProjectTrust (trust or never) in the agent dir's settings.json"
        )
    return TrustDecision(message=f"{resource}: {how}")


def master_trust(argv: list[str], cwd: str, interactive: bool) -> tuple[list[str], str | None]:
    """A master's pi argv with its trust flag (when this pi knows the flags), the bridge's answer
    set in this process's env (which pi inherits; cleared when pi decides), and the line to say."""
    at = program_length(argv)
    info = pi_info(agent_argv(argv[:at]))
    warn_unsupported(info)
    setting = load_settings().master_project_trust
    decision = decide_master_trust(argv, info, setting, cwd, agent_dir(), interactive)
    if decision.answer is None:
        os.environ.pop(ENV_PROJECT_TRUST, None)
    else:
        os.environ[ENV_PROJECT_TRUST] = decision.answer
    return [*argv[:at], *decision.flags, *argv[at:]], decision.message
