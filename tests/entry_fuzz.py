"""Entries and JSON for the strict loader's fuzzing (test_loader_fuzz.py) and the fast path's
differential tests (test_plaincodec.py): hypothesis strategies of valid entries, a pool of valid
entries with random parts, raw-text rendering (for what ``json.dumps`` cannot produce) and the
positions in a document."""

from __future__ import annotations

import json
import operator
import random
import string
from collections.abc import Iterator
from typing import Any

from helpers import make_entry
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pi_tmux_matrix.identity import AgentIdentityContract, Mode, Role
from pi_tmux_matrix.matrix.codec import unstructure_entry
from pi_tmux_matrix.matrix.model import (
    Directive,
    DirectiveKind,
    Entry,
    ExitKind,
    ExitRecord,
    Handoff,
    Outcome,
    ResumablePayload,
    Status,
)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# --- strategies -------------------------------------------------------------------------------

ALNUM = string.ascii_letters + string.digits
# Cheaper than st.from_regex, which dominated generation time.
ids = st.builds(operator.add, st.sampled_from(ALNUM), st.text(ALNUM + "._-", max_size=12))
task_refs = st.builds(operator.add, st.sampled_from(ALNUM), st.text(ALNUM + "._:#@+/-", max_size=16))
# st.characters() includes lone surrogates (st.text()'s default alphabet does not).
texts = st.text(st.characters(), max_size=20)
paths = st.text(st.characters(exclude_characters="\0"), max_size=20).map(lambda s: "/" + s)
big_ints = st.integers(min_value=-(10**40), max_value=10**40) | st.integers(-(2**63), 2**63)
ms = st.integers(min_value=0, max_value=2**53)


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


identities = st.builds(
    AgentIdentityContract,
    agent_id=ids,
    session_id=ids,
    session_file=opt(paths),
    cwd=opt(paths),
    worktree=opt(paths),
    lane=opt(ids),
    profile=opt(ids),
    provider=opt(st.sampled_from(["pi", "claude"]) | ids),
    mode=opt(st.sampled_from(list(Mode))),
    resource_pointers=st.lists(paths, max_size=3).map(tuple),
)
directives = st.builds(
    Directive,
    kind=st.sampled_from(list(DirectiveKind)),
    at=ms,
    parent_pid=opt(big_ints),
    parent_session_id=opt(texts),
    parent_proc_start=opt(big_ints),
)


def payloads(identity: AgentIdentityContract) -> st.SearchStrategy[ResumablePayload]:
    """Payloads of the entry whose identity is ``identity`` (a payload describes its entry)."""
    return st.builds(
        ResumablePayload,
        identity=st.just(identity),
        reason=st.text(max_size=200),
        at=ms,
        task_ref=opt(task_refs),
        task_summary=texts,
        checkpoint=opt(texts),
    )


handoffs = st.builds(
    Handoff,
    id=texts,
    generation=texts,
    parent_session_id=opt(texts),
    outcome=st.sampled_from(list(Outcome)),
    created_at=ms,
    code=opt(big_ints),
    signal=opt(big_ints),
    summary=texts,
    result_pointer=opt(texts),
    delivered_at=opt(ms),
)
exits = st.builds(
    ExitRecord, kind=st.sampled_from(list(ExitKind)), at=ms, code=opt(big_ints), signal=opt(big_ints)
)


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    identity = draw(identities)
    role = draw(st.sampled_from(list(Role)))
    return Entry(
        key=identity.key(role),
        role=role,
        status=draw(st.sampled_from(list(Status))),
        identity=identity,
        created_at=draw(ms),
        updated_at=draw(ms),
        reason=draw(opt(st.text(max_size=200))),
        generation=draw(texts),
        registration=draw(texts),
        pid=draw(opt(big_ints)),
        proc_start=draw(opt(big_ints)),
        boot_id=draw(opt(texts)),
        parent_pid=draw(opt(big_ints)),
        parent_session_id=draw(opt(texts)),
        parent_proc_start=draw(opt(big_ints)),
        task_ref=draw(opt(task_refs)),
        child_pid=draw(opt(big_ints)),
        child_proc_start=draw(opt(big_ints)),
        heartbeat_at=draw(opt(ms)),
        ready_at=draw(opt(ms)),
        directive=draw(opt(directives)),
        resumable=draw(opt(payloads(identity))),
        handoffs=tuple(draw(st.lists(handoffs, max_size=3))),
        exit=draw(opt(exits)),
    )


json_scalars = (
    st.none()
    | st.booleans()
    | big_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
small_values = (
    json_scalars
    | st.lists(json_scalars, max_size=2)
    | st.dictionaries(st.text(max_size=4), json_scalars, max_size=2)
)


def pool_entry(rng: random.Random) -> Entry:
    """A valid entry with a random selection of optional parts (for the mutation pool)."""

    def maybe(value: Any) -> Any:
        return value if rng.random() < 0.6 else None

    def text(limit: int = 12) -> str:
        alphabet = ALNUM + ' ._-/:"\\\n\t\u00e9\u4e2d\U0001f600\ud800\udfff[]{}'
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, limit)))

    def ident(prefix: str) -> str:
        return prefix + "".join(rng.choice(ALNUM + "._-") for _ in range(rng.randint(0, 8)))

    def number() -> int:
        return rng.choice([0, 1, -1, rng.randint(1, 2**22), rng.randint(-(2**63), 2**63), 10**30])

    def identity(session: str) -> AgentIdentityContract:
        return AgentIdentityContract(
            agent_id=ident("a"),
            session_id=session,
            session_file=maybe("/" + text()),
            cwd=maybe("/" + text()),
            worktree=maybe("/" + text()),
            lane=maybe(ident("l")),
            profile=maybe(ident("p")),
            provider=maybe(rng.choice(["pi", "claude", ident("x")])),
            mode=maybe(rng.choice(list(Mode))),
            resource_pointers=["/" + text() for _ in range(rng.randint(0, 3))],
        )

    def handoff() -> Handoff:
        return Handoff(
            id=text(),
            generation=text(),
            parent_session_id=maybe(ident("ps")),
            outcome=rng.choice(list(Outcome)),
            created_at=number(),
            code=maybe(number()),
            signal=maybe(number()),
            summary=text(40),
            result_pointer=maybe("/" + text()),
            delivered_at=maybe(number()),
        )

    session = ident("s")
    role = rng.choice(list(Role))
    ident_ = identity(session)
    return Entry(
        key=ident_.key(role),
        role=role,
        status=rng.choice(list(Status)),
        identity=ident_,
        created_at=number(),
        updated_at=number(),
        reason=maybe(text()),
        generation=text(),
        registration=text(),
        pid=maybe(number()),
        proc_start=maybe(number()),
        boot_id=maybe(text()),
        parent_pid=maybe(number()),
        parent_session_id=maybe(ident("ps")),
        parent_proc_start=maybe(number()),
        task_ref=maybe(ident("goal:") + "#1"),
        child_pid=maybe(number()),
        child_proc_start=maybe(number()),
        heartbeat_at=maybe(number()),
        ready_at=maybe(number()),
        directive=maybe(
            Directive(
                kind=rng.choice(list(DirectiveKind)),
                at=number(),
                parent_pid=maybe(number()),
                parent_session_id=maybe(ident("ps")),
                parent_proc_start=maybe(number()),
            )
        ),
        resumable=maybe(
            ResumablePayload(
                identity=ident_,
                reason=text(),
                at=number(),
                task_ref=maybe(ident("t")),
                task_summary=text(40),
                checkpoint=maybe(text()),
            )
        ),
        handoffs=[handoff() for _ in range(rng.randint(0, 3))],
        exit=maybe(ExitRecord(kind=rng.choice(list(ExitKind)), at=number(), code=maybe(number()))),
    )


_rng = random.Random(20_260_000)
POOL = [pool_entry(_rng) for _ in range(64)]


# --- raw-text rendering (for what json.dumps cannot produce) --------------------------------

Path_ = tuple[Any, ...]


def render(
    doc: Any,
    *,
    raw_values: dict[Path_, str] | None = None,
    extra_pairs: dict[Path_, list[str]] | None = None,
) -> bytes:
    """JSON text of ``doc`` with some values replaced by raw text and extra ``"k": v`` pairs."""
    raw_values = raw_values or {}
    extra_pairs = extra_pairs or {}

    def enc(value: Any, here: Path_) -> str:
        if here in raw_values:
            return raw_values[here]
        if isinstance(value, dict):
            parts = [f"{json.dumps(k)}: {enc(v, (*here, k))}" for k, v in value.items()]
            parts.extend(extra_pairs.get(here, []))
            return "{" + ", ".join(parts) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(enc(v, (*here, i)) for i, v in enumerate(value)) + "]"
        return json.dumps(value, ensure_ascii=False)

    # Raw UTF-8 for everything except lone surrogates, which only JSON escapes can carry
    # (backslashreplace spells U+D800 as the JSON escape \ud800; it can only occur in strings).
    return enc(doc, ()).encode("utf-8", "backslashreplace")


def locations(doc: Any, here: Path_ = ()) -> Iterator[Path_]:
    """Every value position below the root."""
    items: Any = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*here, key)
        yield from locations(value, (*here, key))


def dict_locations(doc: Any) -> list[Path_]:
    return [()] + [p for p in locations(doc) if isinstance(get(doc, p), dict)]


def get(doc: Any, path: Path_) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def put(doc: Any, path: Path_, value: Any) -> None:
    get(doc, path[:-1])[path[-1]] = value


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


# --- hand-picked: lax primitives cattrs would coerce, and the keys of a document ---------------
LAX_PRIMITIVES = [
    (("createdAt",), "12"),
    (("createdAt",), 12.5),
    (("createdAt",), 12.0),
    (("createdAt",), True),
    (("pid",), "12"),
    (("pid",), True),
    (("pid",), 12.5),
    (("heartbeatAt",), 1.0),
    (("directive",), {"kind": "adopt", "at": "1"}),
    (("exit",), {"kind": "exited", "at": 1, "code": False}),
    (("bootId",), 5),
    (("bootId",), []),
    (("generation",), None),
    (("generation",), {}),
    (("taskSummary",), 1.5),
    (("identity", "agentId"), None),
    (("identity", "agentId"), 5),
    (("identity", "lane"), True),
]

TOP_KEYS = list(unstructure_entry(make_entry()))
IDENTITY_KEYS = list(unstructure_entry(make_entry())["identity"])
