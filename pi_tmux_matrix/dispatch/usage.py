"""A worker's usage claim: optional, cooperative, advisory.

A worker may write ``results/<job>.<agent>.<round>.usage.json`` (its round's result name plus
``.usage.json``) before it prints its marker: pi's own per-message usage record shape (what pi
0.73.1 keeps in an assistant message's ``usage``) plus an optional ``model`` and ``provider``::

    {"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
     "cost": {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0, "total": 0.0},
     "model": "gpt-x", "provider": "openai"}

Every field is optional, but at least one number must be there. The pi bridge writes it for pi
workers from pi's usage records (the sum of the round's assistant messages); any other agent is
told the path in its marker instruction (and ``$PI_MATRIX_USAGE_FILE`` for the first round).

It is read once, when the round's result is written (:meth:`~.jobs.JobStore.put_result`), and
kept in the result: never checked against anything, so always shown as *claimed* and advisory.
A claim that is not one (too big, not JSON, an unknown field, a negative or non-finite number)
is kept as ``invalid`` with the reason and never shown as numbers; no claim is no ``usage``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

import attrs

from .. import strictjson
from ..errors import CorruptEntry
from ..matrix.codec import unstructure
from ..matrix.fsio import read_state_file

__all__ = [
    "CLAIM_SUFFIX",
    "MAX_CLAIM_BYTES",
    "ClaimedUsage",
    "Cost",
    "Usage",
    "UsageTotal",
    "parse_claim",
    "read_claim",
]

CLAIM_SUFFIX: Final = ".usage.json"
MAX_CLAIM_BYTES: Final = 4096
MAX_TOKENS: Final = 10**15  # far above any real run: a bigger count is a broken claim
MAX_COST: Final = 10.0**9
MAX_LABEL: Final = 200  # characters of model / provider
_TOKENS: Final = {
    "input": "input",
    "output": "output",
    "cacheRead": "cache_read",
    "cacheWrite": "cache_write",
    "totalTokens": "total_tokens",
}
_COSTS: Final = {
    "input": "input",
    "output": "output",
    "cacheRead": "cache_read",
    "cacheWrite": "cache_write",
    "total": "total",
}
_LABELS: Final = ("model", "provider")


@attrs.frozen
class Cost:
    """pi's ``usage.cost``: dollars, as the worker's provider priced them."""

    input: float | None = None
    output: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None
    total: float | None = None


@attrs.frozen
class Usage:
    """pi's usage record (``input``, ``output``, ``cacheRead``, ``cacheWrite``, ``totalTokens``,
    ``cost``), every field optional, plus the model and provider that ran."""

    input: int | None = None
    output: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    total_tokens: int | None = None
    cost: Cost | None = None
    model: str | None = None
    provider: str | None = None

    @property
    def tokens(self) -> int | None:
        """``totalTokens`` as claimed; without it the sum of the counts that were claimed."""
        if self.total_tokens is not None:
            return self.total_tokens
        parts = [p for p in (self.input, self.output, self.cache_read, self.cache_write) if p is not None]
        return sum(parts) if parts else None

    @property
    def dollars(self) -> float | None:
        return None if self.cost is None else self.cost.total


@attrs.frozen
class ClaimedUsage:
    """What a result keeps of its round's claim: the numbers, or why the claim was refused."""

    claimed: Usage | None = None
    invalid: str | None = None  # the claim was there but is not one: never shown as numbers
    advisory: bool = True  # claimed by the worker, checked against nothing

    def line(self) -> str:
        """One line for people: ``usage (advisory, claimed by the worker): N tokens, $X``."""
        if self.claimed is None:
            return f"usage: invalid claim ({self.invalid or 'unreadable'})"
        return f"usage (advisory, claimed by the worker): {describe(self.claimed)}"

    def to_json(self) -> dict[str, object]:
        """``{"advisory": true, "claimed": {...}}`` with only the claimed fields, or
        ``{"advisory": true, "invalid": "why"}``."""
        if self.claimed is None:
            return {"advisory": True, "invalid": self.invalid or "unreadable"}
        return {"advisory": True, "claimed": _present(unstructure(self.claimed))}


def _present(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {k: _present(v) for k, v in raw.items() if v is not None}
    return raw


def describe(usage: Usage) -> str:
    """``N tokens, $X`` (and the model), saying only what was claimed."""
    said = []
    if usage.tokens is not None:
        said.append(f"{usage.tokens} tokens")
    if usage.dollars is not None:
        said.append(f"${usage.dollars:.4f}")
    if usage.model is not None:
        said.append(f"model {usage.model}")
    return ", ".join(said) or "nothing measurable"


def _number(value: Any, field: str, *, whole: bool) -> int | float:
    # bool is an int in Python and NaN/Infinity never get here (strictjson refuses them).
    if type(value) not in (int, float):
        raise ValueError(f"{field} is not a number")
    if whole and (type(value) is float and not value.is_integer()):
        raise ValueError(f"{field} is not a whole number of tokens")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} is negative or not finite")
    if value > (MAX_TOKENS if whole else MAX_COST):
        raise ValueError(f"{field} is implausibly large")
    return int(value) if whole else float(value)


def _fields(raw: Any, known: dict[str, str], where: str, *, whole: bool) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not a JSON object")  # noqa: TRY004 (one error kind: a bad claim)
    unknown = sorted(set(raw) - set(known) - ({"cost", *_LABELS} if where == "the claim" else set()))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} in {where}"[:200])
    return {
        known[k]: _number(v, k if where == "the claim" else f"cost.{k}", whole=whole)
        for k, v in raw.items()
        if k in known
    }


def _label(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if type(value) is not str or len(value) > MAX_LABEL or not value.isprintable():
        raise ValueError(f"{name} is not a printable string of at most {MAX_LABEL} characters")
    return value


def parse_claim(data: bytes) -> Usage:
    """A claim's bytes as a :class:`Usage`; ValueError saying why it is not a valid claim."""
    if len(data) > MAX_CLAIM_BYTES:
        raise ValueError(f"over {MAX_CLAIM_BYTES} bytes")
    try:
        raw = strictjson.loads(data, max_bytes=MAX_CLAIM_BYTES, max_depth=4)
    except (strictjson.StrictJSONError, ValueError) as exc:
        raise ValueError(f"not strict JSON ({exc})"[:200]) from None
    counts = _fields(raw, _TOKENS, "the claim", whole=True)
    cost = None
    if raw.get("cost") is not None:
        cost = Cost(**_fields(raw["cost"], _COSTS, "cost", whole=False))
    model, provider = (_label(raw.get(name), name) for name in _LABELS)
    usage = Usage(**counts, cost=cost, model=model, provider=provider)
    if usage.tokens is None and usage.dollars is None:
        raise ValueError("claims no token count and no cost")
    return usage


def read_claim(path: str) -> ClaimedUsage | None:
    """The claim at ``path`` as a result keeps it; None when there is none. Never raises: a
    claim that cannot be read is kept as invalid (a worker's file must not break a reader)."""
    try:
        data = read_state_file(path, max_bytes=MAX_CLAIM_BYTES)
    except FileNotFoundError:
        return None
    except CorruptEntry as exc:
        return ClaimedUsage(invalid=exc.reason)
    except OSError as exc:
        return ClaimedUsage(invalid=f"unreadable ({exc.strerror or exc})")
    try:
        return ClaimedUsage(claimed=parse_claim(data))
    except ValueError as exc:
        return ClaimedUsage(invalid=str(exc))


@attrs.frozen
class UsageTotal:
    """Claimed usage summed over some agents' rounds (a job's, a master's): only what was claimed,
    with how many agents claimed nothing and how many claims were invalid."""

    agents: int = 0
    claimed_by: int = 0  # agents with at least one valid claim
    invalid: int = 0  # invalid claims (rounds), never summed
    tokens: int = 0
    dollars: float = 0.0
    priced: int = 0  # valid claims that gave a cost

    @property
    def unclaimed(self) -> int:
        return self.agents - self.claimed_by

    @classmethod
    def of(cls, agents: Iterable[Iterable[ClaimedUsage | None]]) -> UsageTotal:
        """The total over agents, each given as its rounds' usage (None: no claim)."""
        total = cls()
        for given in agents:
            rounds = list(given)
            valid = [u.claimed for u in rounds if u is not None and u.claimed is not None]
            invalid = sum(1 for u in rounds if u is not None and u.claimed is None)
            total = total + cls(
                agents=1,
                claimed_by=1 if valid else 0,
                invalid=invalid,
                tokens=sum(u.tokens or 0 for u in valid),
                dollars=sum(u.dollars or 0.0 for u in valid),
                priced=sum(1 for u in valid if u.dollars is not None),
            )
        return total

    def __add__(self, other: UsageTotal) -> UsageTotal:
        return UsageTotal(*(a + b for a, b in zip(attrs.astuple(self), attrs.astuple(other), strict=True)))

    def line(self) -> str:
        cost = f", ${self.dollars:.4f}" if self.priced else ""
        said = f"{self.tokens} tokens{cost} claimed by {self.claimed_by} of {self.agents} agent(s)"
        if self.unclaimed:
            said += f"; {self.unclaimed} claimed nothing"
        if self.invalid:
            said += f"; {self.invalid} invalid claim(s) not counted"
        return said + " (advisory)"

    def to_json(self) -> dict[str, object]:
        return {
            "advisory": True,
            "agents": self.agents,
            "claimedBy": self.claimed_by,
            "unclaimed": self.unclaimed,
            "invalidClaims": self.invalid,
            "totalTokens": self.tokens,
            "cost": round(self.dollars, 6) if self.priced else None,
        }
