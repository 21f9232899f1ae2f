"""The one cattrs converter, and strict bounded decoding of entry files.

On disk everything is camelCase (pi's convention) with a ``schemaVersion``; in Python it is
snake_case. Primitives are structured strictly: ``"12"`` is not a pid and ``true`` is not 1.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any, Final, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter

from .. import strictjson
from .model import SCHEMA_VERSION, Entry

__all__ = [
    "MAX_ENTRY_BYTES",
    "DecodeError",
    "converter",
    "decode_entry",
    "encode_entry",
    "to_camel",
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


_CAMEL = re.compile(r"_([a-z0-9])")


def to_camel(name: str) -> str:
    """``parent_session_id`` -> ``parentSessionId``."""
    return _CAMEL.sub(lambda m: m.group(1).upper(), name)


def _strict(kind: type[Any], label: str) -> Any:
    def structure(value: Any, _type: Any) -> Any:
        # bool is an int subclass, so `true` must be refused explicitly for ints.
        if type(value) is not kind:
            raise TypeError(f"expected {label}, got {type(value).__name__}")
        return value

    return structure


def _make_converter(*, detailed: bool) -> cattrs.Converter:
    conv = make_converter(
        forbid_extra_keys=True, prefer_attrib_converters=False, detailed_validation=detailed
    )
    # Exact-type predicates, not singledispatch: a class hook for str would also catch every
    # str-valued Enum (singledispatch matches subclasses) and hand back a bare string.
    for kind, label in ((int, "an integer"), (str, "a string"), (bool, "true or false")):
        conv.register_structure_hook_func(lambda t, k=kind: t is k, _strict(kind, label))

    # Registered after the str hook so that str-valued enums are not taken for plain strings.
    def is_enum(cls: Any) -> bool:
        return isinstance(cls, type) and issubclass(cls, Enum)

    def enum_factory(cls: Any) -> Any:
        def structure_enum(value: Any, _type: Any) -> Any:
            if type(value) is not str:
                raise TypeError(f"expected one of {[m.value for m in cls]}, got {type(value).__name__}")
            return cls(value)

        return structure_enum

    conv.register_structure_hook_factory(is_enum, enum_factory)

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


converter: Final = _make_converter(detailed=False)
# The same converter with per-field error paths. Building those paths costs about a third of
# the decode time of every entry, so the fast one runs first and this one only explains a failure.
_explainer: Final = _make_converter(detailed=True)


def _describe(exc: BaseException, _type: Any = None) -> str:
    if isinstance(exc, KeyError):
        return f"required field {exc.args[0] if exc.args else ''} missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    return str(exc) or type(exc).__name__


def _explain(data: Any, cls: type[Any], fallback: BaseException) -> str:
    try:
        _explainer.structure(data, cls)
    except cattrs.BaseValidationError as exc:
        messages = cattrs.transform_error(exc, path="$", format_exception=_describe)
        shown = "; ".join(messages[:3])
        return shown + (f" (+{len(messages) - 3} more)" if len(messages) > 3 else "")
    except Exception as exc:  # noqa: BLE001 - any failure is the explanation we want
        return _describe(exc)
    return _describe(fallback)


def structure(data: Any, cls: type[T]) -> T:
    """Structure ``data`` as ``cls`` or raise :class:`DecodeError` with one readable line."""
    try:
        return converter.structure(data, cls)
    except Exception as exc:  # noqa: BLE001 - hostile input can fail in any structuring step
        raise DecodeError(_explain(data, cls, exc)) from None


def unstructure_entry(entry: Entry) -> dict[str, Any]:
    """The on-disk (camelCase) form of ``entry``."""
    result: dict[str, Any] = converter.unstructure(entry)
    return result


def encode_entry(entry: Entry) -> bytes:
    """The exact bytes written to ``<key>.json``."""
    return (json.dumps(unstructure_entry(entry), indent=2, ensure_ascii=False) + "\n").encode()


def decode_entry(data: bytes, expected_key: str) -> tuple[Entry, dict[str, Any]]:
    """Parse strictly and check the key; returns the entry and its raw camelCase mapping."""
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
    entry = structure(raw, Entry)
    return entry, raw
