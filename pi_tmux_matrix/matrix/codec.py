"""The one cattrs converter, and strict bounded decoding of entry files.

On disk everything is camelCase (pi's convention) with a ``schemaVersion``; in Python it is
snake_case. Primitives are structured strictly: ``"12"`` is not a pid and ``true`` is not 1.

The converter is built on first use (:func:`conv`), and cattrs imported with it. :func:`structure`
and :func:`unstructure` go through :mod:`.plaincodec` first (the one fast path:
docs/decisions.md#one-fast-decoder): so ``ls``/``tree``/``show``, which read every entry, need no
cattrs at all (~10 ms of every such command's start-up), and a host, which reads its job and
writes its entry and results all its life, never builds it either (~1.5 MiB of each host:
docs/decisions.md#a-host-loads-only-what-it-uses). The converter reads what the plain pass is
unsure of, and words every refusal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Optional, TypeVar, get_args, get_origin

import attrs

from .. import strictjson
from ..identity import Mode, Role
from ..strictjson import JSONObject
from . import plaincodec
from .model import ENUM_ALIASES, SCHEMA_VERSION, DirectiveKind, Entry, ExitKind, Outcome, Status, to_camel

if TYPE_CHECKING:
    import cattrs
    from attrs import AttrsInstance

__all__ = [
    "MAX_ENTRY_BYTES",
    "DecodeError",
    "conv",
    "decode_entry",
    "encode_entry",
    "entry_document",
    "register_enum",
    "structure",
    "structure_strictly",
    "to_camel",
    "unstructure",
    "unstructure_entry",
]

MAX_ENTRY_BYTES: Final = 1024 * 1024
T = TypeVar("T")


class DecodeError(ValueError):
    """Why some bytes are not a valid entry (becomes a CorruptEntry with the path)."""

    def __init__(self, reason: str, *, newer: bool = False) -> None:
        self.reason = reason
        self.newer = newer  # written by a newer pi-matrix: report, never quarantine
        super().__init__(reason)


def _strict(kind: type[Any], label: str) -> Any:
    def structure(value: Any, _type: Any) -> Any:
        # bool is an int subclass, so `true` must be refused explicitly for ints.
        if type(value) is not kind:
            raise TypeError(f"expected {label}, got {type(value).__name__}")
        return value

    return structure


def _strict_optional(kind: type[Any], label: str) -> Any:
    def structure(value: Any, _type: Any) -> Any:
        if value is not None and type(value) is not kind:
            raise TypeError(f"expected {label} or null, got {type(value).__name__}")
        return value

    return structure


def _enum_hook(cls: type[Enum], aliases: dict[str, Any] | None = None) -> Any:
    names = list(cls._value2member_map_)
    members = {**cls._value2member_map_, **(aliases or {})}  # old spellings read, never written

    def structure_enum(value: Any, _type: Any) -> Any:
        # The value map, not cls(value): Enum.__call__ is several times slower.
        member = members.get(value) if type(value) is str else None
        if member is None:
            raise ValueError(f"expected one of {names}, got {value!r}"[:200])
        return member

    return structure_enum


def _exactly(kind: Any) -> Callable[[Any], bool]:
    def match(cls: Any) -> bool:
        return bool(cls == kind)  # ==: `int | None` and `Optional[int]` are equal, not identical

    return match


def _make_converter(*, detailed: bool) -> cattrs.Converter:
    from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
    from cattrs.preconf.json import make_converter

    conv = make_converter(
        forbid_extra_keys=True, prefer_attrib_converters=False, detailed_validation=detailed
    )
    # cattrs dispatches classes through singledispatch before any predicate hook, and its
    # defaults coerce (int("12"), str(5)). So the strict primitives are class hooks, and every
    # str-valued Enum gets its own class hook too: singledispatch picks the most specific
    # class, so Status is never taken for a plain str.
    for kind, label in ((int, "an integer"), (str, "a string"), (bool, "true or false")):
        conv.register_structure_hook(kind, _strict(kind, label))
        # Optional primitives in one call instead of cattrs' generic optional -> inner hop:
        # an entry has ~20 of them (the converter reads what the plain pass is unsure of).
        conv.register_structure_hook_func(_exactly(Optional[kind]), _strict_optional(kind, label))  # noqa: UP045
    for enum in (Role, Mode, Status, DirectiveKind, ExitKind, Outcome):
        conv.register_structure_hook(enum, _enum_hook(enum, ENUM_ALIASES.get(enum)))

    # Homogeneous tuples come from JSON arrays only: cattrs would happily iterate a string
    # into characters or a mapping into its keys.
    def is_array(cls: Any) -> bool:
        args = get_args(cls)
        return get_origin(cls) is tuple and len(args) == 2 and args[1] is Ellipsis

    def array_factory(cls: Any) -> Any:
        item_type = get_args(cls)[0]
        item = conv.get_structure_hook(item_type)

        def structure_array(value: Any, _type: Any) -> tuple[Any, ...]:
            if type(value) is not list:
                raise TypeError(f"expected an array, got {type(value).__name__}")
            return tuple([item(v, item_type) for v in value])

        return structure_array

    conv.register_structure_hook_factory(is_array, array_factory)

    def is_attrs(cls: Any) -> bool:
        return attrs.has(cls)

    def structure_factory(cls: Any) -> Any:
        renames: dict[str, Any] = {f.name: override(rename=to_camel(f.name)) for f in attrs.fields(cls)}
        return make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True, **renames)

    def unstructure_factory(cls: Any) -> Any:
        renames: dict[str, Any] = {f.name: override(rename=to_camel(f.name)) for f in attrs.fields(cls)}
        return make_dict_unstructure_fn(cls, conv, **renames)

    conv.register_structure_hook_factory(is_attrs, structure_factory)
    conv.register_unstructure_hook_factory(is_attrs, unstructure_factory)
    return conv


_built: list[cattrs.Converter] = []  # [the converter, the explainer], once built
_enums: list[type[Enum]] = []  # enums of higher layers, registered before or after the build


def _converters() -> list[cattrs.Converter]:
    if not _built:
        # The same converter twice: the second with per-field error paths. Building those paths
        # costs about a third of the decode time of every entry, so the fast one runs first and
        # the explainer only explains a failure.
        made = [_make_converter(detailed=False), _make_converter(detailed=True)]
        for made_one in made:
            for enum in _enums:
                made_one.register_structure_hook(enum, _enum_hook(enum, ENUM_ALIASES.get(enum)))
        _built.extend(made)
    return _built


def conv() -> cattrs.Converter:
    """The one converter (built on first use)."""
    return _converters()[0]


def __getattr__(name: str) -> Any:
    # ``converter`` as a name, for those who import it: built when first asked for.
    if name == "converter":
        return conv()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_enum(enum: type[Enum]) -> None:
    """Structure a str-valued Enum of a higher layer strictly (its value, never coerced)."""
    _enums.append(enum)
    for made in _built:
        made.register_structure_hook(enum, _enum_hook(enum, ENUM_ALIASES.get(enum)))


def _describe(exc: BaseException, _type: Any = None) -> str:
    if isinstance(exc, KeyError):
        return f"required field {exc.args[0] if exc.args else ''} missing"
    import cattrs

    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    return str(exc) or type(exc).__name__


def _camel_path(message: str) -> str:
    # cattrs names attributes; the file (and the person reading it) uses camelCase keys.
    text, sep, path = message.rpartition(" @ ")
    return f"{text}{sep}{to_camel(path)}" if sep else message


def _explain(data: Any, cls: type[Any], fallback: BaseException) -> str:
    import cattrs

    try:
        _converters()[1].structure(data, cls)
    except cattrs.BaseValidationError as exc:
        messages = [_camel_path(m) for m in cattrs.transform_error(exc, path="$", format_exception=_describe)]
        shown = "; ".join(messages[:3])
        return shown + (f" (+{len(messages) - 3} more)" if len(messages) > 3 else "")
    except Exception as exc:  # noqa: BLE001 - any failure is the explanation we want
        return _describe(exc)
    return _describe(fallback)


def structure(data: object, cls: type[T]) -> T:
    """Structure ``data`` as ``cls`` or raise :class:`DecodeError` with one readable line."""
    try:
        return plaincodec.structure(data, cls)  # no cattrs for a valid record (a host's reads)
    except plaincodec.Unsure:
        return structure_strictly(data, cls)


def structure_strictly(data: object, cls: type[T]) -> T:
    """:func:`structure` by the converter alone: the reference the plain pass is held to (its
    refusals are the words users read; tests/test_plaincodec.py compares the two)."""
    try:
        return conv().structure(data, cls)
    except Exception as exc:  # noqa: BLE001 - hostile input can fail in any structuring step
        raise DecodeError(_explain(data, cls, exc)) from None


def unstructure_entry(entry: Entry) -> JSONObject:
    """The on-disk (camelCase) form of ``entry``."""
    return unstructure(entry)


def unstructure(record: AttrsInstance) -> JSONObject:
    """The on-disk (camelCase) form of an attrs record: the converter's, without building it
    (a host writes its entry and results all its life, and needs no cattrs for that)."""
    try:
        document = plaincodec.unstructure(record)
    except plaincodec.Unsure:
        document = conv().unstructure(record)
    if not isinstance(document, dict):  # an attrs record is a JSON object: said to the type checker
        raise TypeError(f"{type(record).__name__} did not unstructure to an object")
    return document


def encode_entry(entry: Entry) -> bytes:
    """The exact bytes written to ``<key>.json``."""
    # One line: json.dumps with indent falls back to the pure-Python encoder (5x slower).
    # ensure_ascii: a lone surrogate (legal in JSON text, not in UTF-8) is written as an escape
    # instead of making the entry unwritable.
    return (json.dumps(unstructure_entry(entry)) + "\n").encode()


def entry_document(data: bytes, expected_key: str) -> JSONObject:
    """The parsed camelCase mapping of an entry file whose envelope is right (strict JSON, an
    object, this ``schemaVersion``, the inner key that names the file); its fields unchecked."""
    try:
        raw = strictjson.loads(data, max_bytes=MAX_ENTRY_BYTES)
    except strictjson.StrictJSONError as exc:
        raise DecodeError(str(exc)) from None
    if not isinstance(raw, dict):
        raise DecodeError(f"top level is a JSON {type(raw).__name__}, not an object")
    version = raw.get("schemaVersion")
    if type(version) is not int:
        raise DecodeError("missing or non-integer schemaVersion")
    if version > SCHEMA_VERSION:
        raise DecodeError(
            f"schemaVersion {version} is newer than this pi-matrix understands ({SCHEMA_VERSION}); "
            "upgrade pi-matrix",
            newer=True,
        )
    if version != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schemaVersion {version}")
    if raw.get("key") != expected_key:
        raise DecodeError(f"inner key {str(raw.get('key'))[:80]!r} differs from the file name")
    return raw


def decode_entry(data: bytes, expected_key: str) -> tuple[Entry, JSONObject]:
    """Parse strictly and check the key; returns the entry and its raw camelCase mapping.

    Every reader's path (the store's listings and gets): the fields go through the plain pass
    (:mod:`.plaincodec`), and only what it is unsure of through the converter, whose refusal is
    the :class:`DecodeError`. ``entry_document`` + :func:`structure_strictly` is the reference.
    """
    raw = entry_document(data, expected_key)
    return structure(raw, Entry), raw
