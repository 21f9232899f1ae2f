"""Records to and from their camelCase mappings without cattrs, for what a host reads and writes.

A host (one per agent) reads its job record and writes its entry, results and events all its
life; building the cattrs converter for that would load cattrs with ``typing_extensions``,
``dataclasses``, ``datetime``, ``base64`` and ``socket``: ~1.5 MiB of every host's ~20 (issue 30.3).
This module does both directions by walking the attrs fields itself:

* :func:`unstructure` gives what the converter's unstructure gives (each attrs field under its
  camelCase name, an enum as its value, a tuple or a list as a list, a dict item by item); a
  value of any other kind is left to the converter.
* :func:`structure` is a strict pass in the manner of :mod:`.fastcodec`: a JSON type must be
  exactly the field's (``true`` is not 1, ``"12"`` not 12), each value is built by its class's own
  ``__init__`` (every validator runs), and whatever it is not sure of (an unknown or missing field,
  an enum value, a union, a value a validator refuses) it does not word: it raises
  :class:`Unsure`, and :func:`.codec.structure` hands the document to the converter, which
  refuses with its explained message. tests/test_plaincodec.py holds both to the converter's.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from enum import Enum
from typing import Any, Final, TypeVar, Union, get_args, get_origin

import attrs

from .model import to_camel

__all__ = ["Unsure", "structure", "unstructure"]

T = TypeVar("T")
_PLAIN: Final = (str, int, float, bool, type(None))
_UNIONS: Final = (Union, types.UnionType)  # Optional[X] and X | None alike, as the converter


class Unsure(Exception):
    """This pass will not decide: the converter does (and words a refusal)."""


def unstructure(value: Any) -> Any:
    """``value`` as the converter unstructures it; :class:`Unsure` for a kind it leaves alone."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, Enum):
        return value.value
    if kind is list or kind is tuple:
        return [unstructure(item) for item in value]  # a tuple too, as the converter (JSON's array)
    if kind is dict:
        return {unstructure(k): unstructure(v) for k, v in value.items()}
    fields = _names(kind)
    if fields is None:
        raise Unsure(kind.__name__)
    return {camel: unstructure(getattr(value, name)) for name, camel in fields}


_NAMES: dict[type[Any], tuple[tuple[str, str], ...] | None] = {}


def _names(cls: type[Any]) -> tuple[tuple[str, str], ...] | None:
    """(attribute, camelCase key) of each field of an attrs class; None for any other class."""
    if cls not in _NAMES:
        _NAMES[cls] = tuple((f.name, to_camel(f.name)) for f in attrs.fields(cls)) if attrs.has(cls) else None
    return _NAMES[cls]


def structure(raw: Any, cls: type[T]) -> T:
    """``raw`` as ``cls`` when it certainly is one; :class:`Unsure` when the converter must decide."""
    try:
        result: T = _builder(cls)(raw)
    except Unsure:
        raise
    except Exception as exc:  # noqa: BLE001 - a validator's refusal, hostile input: the converter words it
        raise Unsure(str(exc)) from None
    return result


Build = Callable[[Any], Any]
_BUILDERS: dict[Any, Build] = {}


def _builder(kind: Any) -> Build:
    found = _BUILDERS.get(kind)
    if found is None:
        found = _BUILDERS[kind] = _make(kind)
    return found


def _exact(kind: type[Any]) -> Build:
    def build(value: Any) -> Any:
        if type(value) is not kind:  # exactly: bool is an int subclass
            raise Unsure(kind.__name__)
        return value

    return build


def _float(value: Any) -> float:
    # The converter's float: a JSON number, an integer read as its float.
    if type(value) is not float and type(value) is not int:
        raise Unsure("float")
    return float(value)


def _make(kind: Any) -> Build:
    if kind in (str, int, bool):
        return _exact(kind)
    if kind is float:
        return _float
    if kind is Any:
        return lambda value: value
    origin, args = get_origin(kind), get_args(kind)
    if origin in _UNIONS and len(args) == 2 and type(None) in args:
        inner = _builder(args[0] if args[1] is type(None) else args[1])
        return lambda value: None if value is None else inner(value)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _array(_builder(args[0]), tuple)
    if origin is list and len(args) == 1:
        return _array(_builder(args[0]), list)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _mapping(_builder(args[1]))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return _enum(kind)
    if isinstance(kind, type) and attrs.has(kind):
        return _record(kind)
    raise Unsure(f"no plain path for {kind!r}")


def _array(item: Build, made: type[Any]) -> Build:
    def build(value: Any) -> Any:
        if type(value) is not list:
            raise Unsure("array")
        return made([item(v) for v in value])

    return build


def _mapping(item: Build) -> Build:
    def build(value: Any) -> Any:
        if type(value) is not dict:
            raise Unsure("object")
        return {k: item(v) for k, v in value.items()}

    return build


def _enum(kind: type[Enum]) -> Build:
    # Members by their string values only; another spelling (an alias) is the converter's.
    members = {m.value: m for m in kind if type(m.value) is str}

    def build(value: Any) -> Any:
        member = members.get(value) if type(value) is str else None
        if member is None:
            raise Unsure(kind.__name__)
        return member

    return build


def _record(cls: type[Any]) -> Build:
    attrs.resolve_types(cls)  # the annotations are strings (from __future__ import annotations)
    fields = [f for f in attrs.fields(cls) if f.init]
    plan = {to_camel(f.name): (f.alias, f.type) for f in fields}
    required = frozenset(to_camel(f.name) for f in fields if f.default is attrs.NOTHING)
    builders: dict[str, Build] = {}

    def build(value: Any) -> Any:
        if type(value) is not dict or not value.keys() <= plan.keys() or not required <= value.keys():
            raise Unsure(cls.__name__)  # not an object, an unknown field or a missing one
        kwargs = {}
        for key, item in value.items():
            alias, kind = plan[key]
            make = builders.get(key)
            if make is None:
                make = builders[key] = _builder(kind)
            kwargs[alias] = make(item)
        return cls(**kwargs)

    return build

