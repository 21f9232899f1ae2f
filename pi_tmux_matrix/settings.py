"""``processMatrix`` and ``pi-fork`` settings, the agent dir and the state dir.

``pi-fork`` configures fork runs (docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority):
``extensions``, ``environment``, ``costFooter``, ``defaultModel`` and ``defaultThinking``, read from
the same two files; ``processMatrix.forkEnvironment`` is kept as an alias of ``pi-fork.environment``.

Settings never crash anything: an out-of-bounds number is clamped, a wrong type or an
unreadable file falls back to the default, and each of those says so once as a warning.
``enabled: false`` is the hard off switch: callers check it before creating anything.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from . import strictjson
from .paths import ENV_AGENT_DIR, ENV_STATE_DIR, agent_dir, resolve_state_dir

__all__ = [
    "BOUNDS",
    "DEFAULTS",
    "ENV_AGENT_DIR",
    "ENV_STATE_DIR",
    "EVENTS_MAX_BYTES",
    "FIELDS",
    "FORK_FIELDS",
    "PROJECT_TRUST_CHOICES",
    "ForkSettings",
    "MatrixSettings",
    "agent_dir",
    "load_settings",
    "resolve_state_dir",
]

log = logging.getLogger(__name__)

SETTINGS_MAX_BYTES: Final = 1024 * 1024
EVENTS_MAX_BYTES: Final = 4 * 1024 * 1024  # eventsMaxBytes' default

# camelCase key -> (default, low, high) (docs/decisions.md#settings-never-crash-anything).
BOUNDS: Final[dict[str, tuple[int, int, int]]] = {
    "heartbeatMs": (30_000, 1_000, 600_000),
    "adoptionGraceMs": (300_000, 5_000, 3_600_000),
    "watcherPollMs": (25_000, 1_000, 600_000),
    # The dispatcher's cap of live agents per working directory, not a time
    # (docs/decisions.md#the-caps-count-what-runs).
    "maxConcurrentAgents": (3, 1, 256),
    # Running fork runs per working directory (docs/decisions.md#the-caps-count-what-runs).
    "maxConcurrentForks": (3, 1, 64),
    # Each agent's events file: past this many bytes it is rotated to ``.jsonl.1`` (one old
    # generation kept, so an agent's events take at most twice this on disk;
    # docs/decisions.md#an-agents-events-file-is-bounded).
    "eventsMaxBytes": (EVENTS_MAX_BYTES, 64 * 1024, 1024 * 1024 * 1024),
    # How long history (jobs, results, logs, events, launches, fork runs) outlives what it is
    # about before a sweep removes it (the origin keeps closed records 30 days;
    # docs/decisions.md#the-state-dir-is-bounded).
    "historyRetentionDays": (30, 1, 3650),
}
# Not whole numbers: the on/off switch, and variables set in every fork child (pi-fork.environment;
# the forced PI_FORK/PI_OFFLINE/... win: docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority).
DEFAULTS: Final[dict[str, Any]] = {
    "enabled": True,
    "forkEnvironment": {},
    "masterProjectTrust": "pi",
    **{k: v[0] for k, v in BOUNDS.items()},
}
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
FORK_SECTION: Final = "pi-fork"
THINKING_LEVELS: Final = ("off", "minimal", "low", "medium", "high", "xhigh")  # pi's --thinking
# How a master's pi (>= 0.79) answers "Trust project folder?": as pi itself decides (its trust.json,
# its defaultProjectTrust, else its dialog), or decided ahead. Read from the agent dir's settings
# only: a project must not be able to grant itself trust.
PROJECT_TRUST_CHOICES: Final = ("pi", "trust", "never")


@attrs.frozen(kw_only=True)
class ForkSettings:
    """The ``pi-fork`` settings in force, and where each came from
    (docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority)."""

    extensions: tuple[str, ...] = ()  # loaded in every fork child, after the inherited ones
    environment: Mapping[str, str] = attrs.field(factory=dict)  # set in every fork child
    cost_footer: bool = True  # the parent's ``forks +$…`` footer
    default_model: str | None = None  # a fork's model unless the call names one
    default_thinking: str | None = None
    sources: Mapping[str, str] = attrs.field(factory=dict, eq=False)


# camelCase key of pi-fork -> ForkSettings field.
FORK_FIELDS: Final = {
    "extensions": "extensions",
    "environment": "environment",
    "costFooter": "cost_footer",
    "defaultModel": "default_model",
    "defaultThinking": "default_thinking",
}


@attrs.frozen(kw_only=True)
class MatrixSettings:
    """The settings in force, and where each value came from (``default`` or a file path)."""

    enabled: bool = True
    heartbeat_ms: int = 30_000
    adoption_grace_ms: int = 300_000
    watcher_poll_ms: int = 25_000
    max_concurrent_agents: int = 3
    max_concurrent_forks: int = 3
    events_max_bytes: int = EVENTS_MAX_BYTES
    history_retention_days: int = 30
    fork_environment: Mapping[str, str] = attrs.field(factory=dict)  # the alias's own value
    master_project_trust: str = "pi"  # one of PROJECT_TRUST_CHOICES
    fork: ForkSettings = attrs.field(factory=ForkSettings)
    sources: Mapping[str, str] = attrs.field(factory=dict, eq=False)


FIELDS = {
    "enabled": "enabled",
    "heartbeatMs": "heartbeat_ms",
    "adoptionGraceMs": "adoption_grace_ms",
    "watcherPollMs": "watcher_poll_ms",
    "maxConcurrentAgents": "max_concurrent_agents",
    "maxConcurrentForks": "max_concurrent_forks",
    "eventsMaxBytes": "events_max_bytes",
    "historyRetentionDays": "history_retention_days",
    "forkEnvironment": "fork_environment",
    "masterProjectTrust": "master_project_trust",
}


def _read_document(path: Path) -> dict[str, Any] | None:
    """One settings file's top-level object, or None (warned) if unusable."""
    try:
        # O_NONBLOCK + a regular-file check: a FIFO named settings.json must not hang startup.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: cannot read settings (%s); using defaults for its values", path, exc.strerror)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("%s: not a regular file; using defaults for its values", path)
            return None
        data = os.read(fd, SETTINGS_MAX_BYTES + 1)
    except OSError as exc:
        log.warning("%s: cannot read settings (%s); using defaults for its values", path, exc.strerror)
        return None
    finally:
        os.close(fd)
    try:
        document = strictjson.loads(data, max_bytes=SETTINGS_MAX_BYTES)
    except strictjson.StrictJSONError as exc:
        log.warning("%s: not valid settings JSON (%s); using defaults for its values", path, exc)
        return None
    if not isinstance(document, dict):
        log.warning("%s: settings must be a JSON object; using defaults for its values", path)
        return None
    return document


def _section(document: dict[str, Any] | None, name: str, path: Path) -> dict[str, Any] | None:
    """The ``name`` object of a settings document, or None (warned if it is not an object)."""
    section = None if document is None else document.get(name)
    if section is None:
        return None
    if not isinstance(section, dict):
        log.warning("%s: %s must be an object, not %s; using defaults", path, name, type(section).__name__)
        return None
    return section


def _environment(value: Any, path: Path, key: str) -> dict[str, str] | None:
    good = isinstance(value, dict) and all(
        isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v
        for k, v in value.items()
    )
    if good:
        return dict(value)
    log.warning('%s: %s must map variable names to strings, like {"MY_VAR": "1"}; using none', path, key)
    return None


def _fork_value(key: str, value: Any, path: Path) -> Any:
    """A valid value for ``pi-fork.<key>``, or None to keep what was there (warned)."""
    where = f"{FORK_SECTION}.{key}"
    if key == "environment":
        return _environment(value, path, where)
    if key == "costFooter":
        if isinstance(value, bool):
            return value
        log.warning("%s: %s must be true or false, not %r; using the default", path, where, value)
        return None
    if key == "extensions":
        if isinstance(value, list) and all(isinstance(v, str) and v.strip() and "\0" not in v for v in value):
            return tuple(os.path.expanduser(v) for v in value)
        log.warning('%s: %s must be a list of extension paths, like ["~/ext/x.ts"]; using none', path, where)
        return None
    if key == "defaultThinking":
        if value in THINKING_LEVELS:
            return value
        log.warning(
            "%s: %s must be one of %s, not %r; ignored", path, where, ", ".join(THINKING_LEVELS), value
        )
        return None
    # defaultModel: pi's --model value ("provider/model" or a pattern); never read as a flag.
    if isinstance(value, str) and value.strip() and not value.startswith("-") and "\0" not in value:
        return value
    log.warning('%s: %s must be a model name like "provider/model", not %r; ignored', path, where, value)
    return None


def _fork_section(
    document: dict[str, Any] | None, matrix: dict[str, Any] | None, path: Path
) -> dict[str, Any]:
    """The ``pi-fork`` values one file sets (camelCase keys), with the alias
    ``processMatrix.forkEnvironment`` merged under ``pi-fork.environment`` (which wins per name)."""
    found: dict[str, Any] = {}
    if matrix is not None and "forkEnvironment" in matrix:
        alias = _environment(matrix["forkEnvironment"], path, "processMatrix.forkEnvironment")
        if alias is not None:
            found["environment"] = alias
    for key, value in (_section(document, FORK_SECTION, path) or {}).items():
        if key not in FORK_FIELDS:
            log.warning("%s: unknown setting %s.%s ignored", path, FORK_SECTION, str(key)[:60])
            continue
        coerced = _fork_value(key, value, path)
        if coerced is None:
            continue
        found[key] = {**found.get(key, {}), **coerced} if key == "environment" else coerced
    return found


def _coerce(key: str, value: Any, path: Path) -> Any:
    """A valid value for ``key`` (clamped if needed), or the sentinel None to keep the default."""
    if key == "enabled":
        if isinstance(value, bool):
            return value
        log.warning("%s: processMatrix.enabled must be true or false, not %r; using default", path, value)
        return None
    if key == "forkEnvironment":
        return _environment(value, path, "processMatrix.forkEnvironment")
    if key == "masterProjectTrust":
        if value in PROJECT_TRUST_CHOICES:
            return value
        log.warning(
            '%s: processMatrix.masterProjectTrust must be one of "pi", "trust", "never", not %r; using "pi"',
            path,
            value,
        )
        return None
    default, low, high = BOUNDS[key]
    # bool is an int subclass: `true` is a type error, not 1 ms. A fractional (or infinite,
    # from 1e400) float is a type error too: milliseconds are whole numbers.
    fractional = isinstance(value, float) and not value.is_integer()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or fractional:
        units = {"Ms": " of milliseconds", "Bytes": " of bytes", "Days": " of days"}
        unit = next((text for end, text in units.items() if key.endswith(end)), "")
        log.warning(
            "%s: processMatrix.%s must be a whole number%s, not %r; using default %d",
            path,
            key,
            unit,
            value,
            default,
        )
        return None
    number = int(value)
    if number < low or number > high:
        clamped = min(max(number, low), high)
        log.warning(
            "%s: processMatrix.%s=%d is outside %d..%d; clamped to %d",
            path,
            key,
            number,
            low,
            high,
            clamped,
        )
        return clamped
    return number


def load_settings(
    cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> MatrixSettings:
    """Defaults, overridden by ``<agent dir>/settings.json``, overridden by ``<cwd>/.pi/settings.json``,
    key by key (``pi-fork`` too: a project's ``environment`` replaces the global one whole)."""
    source = os.environ if env is None else env
    values: dict[str, Any] = dict(DEFAULTS)
    sources: dict[str, str] = dict.fromkeys(DEFAULTS, "default")
    files = [agent_dir(source) / "settings.json"]
    project = Path(cwd if cwd is not None else os.getcwd()) / ".pi" / "settings.json"
    if project != files[0]:
        files.append(project)
    fork: dict[str, Any] = {}
    fork_sources: dict[str, str] = dict.fromkeys(FORK_FIELDS.values(), "default")
    for path in files:
        document = _read_document(path)
        section = _section(document, "processMatrix", path)
        for key, value in _fork_section(document, section, path).items():
            fork[key] = value
            fork_sources[FORK_FIELDS[key]] = str(path)
        if not section:
            continue
        for key, value in section.items():
            if key not in DEFAULTS:
                log.warning("%s: unknown setting processMatrix.%s ignored", path, str(key)[:60])
                continue
            if key == "masterProjectTrust" and path != files[0]:
                log.warning(
                    "%s: processMatrix.masterProjectTrust is read from %s only (a project cannot "
                    "grant itself trust); ignored here",
                    path,
                    files[0],
                )
                continue
            coerced = _coerce(key, value, path)
            if coerced is not None:
                values[key] = coerced
                sources[key] = str(path)
    return MatrixSettings(
        **{FIELDS[key]: value for key, value in values.items()},
        fork=ForkSettings(**{FORK_FIELDS[k]: v for k, v in fork.items()}, sources=fork_sources),
        sources={FIELDS[key]: src for key, src in sources.items()},
    )
