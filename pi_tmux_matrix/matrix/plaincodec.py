"""Records to and from their camelCase mappings without cattrs: the one fast path
(docs/decisions.md#one-fast-decoder).

Two readers need it. A listing (``ls``, ``tree``, ``top``, a fire's cap check, a host's parent
poll) reads every entry, and the converter's per-field hooks cost more than parsing the JSON does
(docs/decisions.md#a-verb-loads-only-what-it-uses); a host (one per agent) reads its job record
and writes its entry, results and events all its life, and building the converter for that would
load cattrs with ``typing_extensions``, ``dataclasses``, ``datetime``, ``base64`` and ``socket``:
~1.5 MiB of every host's ~20 (docs/decisions.md#a-host-loads-only-what-it-uses). This module does
both directions by walking the attrs fields itself:

* :func:`unstructure` gives what the converter's unstructure gives (each attrs field under its
  camelCase name, an enum as its value, a tuple or a list as a list, a dict item by item); a
  value of any other kind is left to the converter.
* :func:`structure` is a strict pass: a JSON type must be exactly the field's (``true`` is not 1,
  ``"12"`` not 12), an enum is one of its values or an old spelling of ``model.ENUM_ALIASES`` (the
  converter's aliases too), each value is built by its class's own ``__init__`` (every validator
  runs), and whatever it is not sure of (an unknown or missing field, a type, an enum value, a
  union, a value a validator refuses) it does not word: it raises :class:`Unsure`, and
  :func:`.codec.structure` hands the document to the converter, which refuses with its explained
  message (or accepts, were this pass stricter than it needs to be). So every refusal is the
  converter's, word for word, and the only way to be wrong would be to accept what the converter
  refuses or to build another value: tests/test_plaincodec.py holds it to neither, for every
  record, and for entries differentially on valid and hostile files (fuzzed).

The walk is planned once per class (each field's camelCase key, ``__init__`` argument, the JSON
types taken as they are, the builder of anything else), so an entry costs about what the
hand-written entry decoder it replaced did (``fastcodec``, ~13 us per entry on top of
the ~8 us JSON parse; ``benchmarks/bench_store.py``'s ``ls --json`` within noise of it), and a
field added to the model is read here with no change.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from enum import Enum
from typing import Any, Final, TypeVar, Union, cast, get_args, get_origin

import attrs

from .model import ENUM_ALIASES, to_camel

__all__ = ["Unsure", "structure", "unstructure"]

T = TypeVar("T")
_PLAIN: Final = (str, int, float, bool, type(None))
_UNIONS: Final = (Union, types.UnionType)  # Optional[X] and X | None alike, as the converter


class Unsure(Exception):
    """This pass will not decide: the converter does (and words a refusal)."""


def unstructure(value: object) -> object:
    """``value`` as the converter unstructures it; :class:`Unsure` for a kind it leaves alone."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, Enum):
        return value.value
    # Exactly these classes (a subclass is the converter's to judge), narrowed for the checker.
    if kind is list or kind is tuple:
        items = cast("list[object] | tuple[object, ...]", value)
        return [unstructure(item) for item in items]  # a tuple too, as the converter (JSON's array)
    if kind is dict:
        return {unstructure(k): unstructure(v) for k, v in cast("dict[object, object]", value).items()}
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


def structure(raw: object, cls: type[T]) -> T:
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


def _or_unsure(kind: Any) -> Build:
    """``kind``'s builder, or one that is always unsure: a record with a field of a kind this pass
    does not know is still read here when that field is absent."""
    try:
        return _builder(kind)
    except Unsure as exc:
        reason = str(exc)

        def unsure(_value: Any) -> Any:
            raise Unsure(reason)

        return unsure


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
        return _array(args[0], tuple)
    if origin is list and len(args) == 1:
        return _array(args[0], list)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _mapping(_builder(args[1]))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return _enum(kind)
    if isinstance(kind, type) and attrs.has(kind):
        return _record(kind)
    raise Unsure(f"no plain path for {kind!r}")


_TAKEN: Final = (str, int, bool)  # the JSON types taken as they are, exactly (bool is no int)
_NONE: Final[frozenset[type]] = frozenset({type(None)})


def _as_is(kind: Any) -> frozenset[type]:
    """The types a value of ``kind`` is taken as it is, with no builder called: a str, an int or a
    bool, and null for an optional field. Most of a record's fields are such, so the walk checks
    ``type(value)`` in a set for them (a third of the walk's cost over a listing)."""
    if kind in _TAKEN:
        return frozenset({kind})
    args = get_args(kind)
    if get_origin(kind) in _UNIONS and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        return frozenset({inner, type(None)}) if inner in _TAKEN else _NONE
    return frozenset()


def _array(kind: Any, made: type[Any]) -> Build:
    taken, item = _as_is(kind), _builder(kind)

    def build(value: Any) -> Any:
        if type(value) is not list:
            raise Unsure("array")
        if taken and set(map(type, value)) <= taken:  # a whole array of strings checked in C
            return made(value)
        return made([item(v) for v in value])

    return build


def _mapping(item: Build) -> Build:
    def build(value: Any) -> Any:
        if type(value) is not dict:
            raise Unsure("object")
        return {k: item(v) for k, v in value.items()}

    return build


def _enum(kind: type[Enum]) -> Build:
    # Members by their string values, and the old spellings still read (model.ENUM_ALIASES, the
    # converter's too). The bound lookup is C: any other value (another string, a number, an
    # array) raises, and :func:`structure` makes that Unsure for the converter to word.
    members: dict[Any, Enum] = {m.value: m for m in kind if type(m.value) is str}
    members.update(ENUM_ALIASES.get(kind, {}))
    return members.__getitem__


def _record(cls: type[Any]) -> Build:
    attrs.resolve_types(cls)  # the annotations are strings (from __future__ import annotations)
    fields = [f for f in attrs.fields(cls) if f.init]
    names = frozenset(to_camel(f.name) for f in fields)
    required = frozenset(to_camel(f.name) for f in fields if f.default is attrs.NOTHING)
    # camelCase key -> (the __init__ argument, the types taken as they are, the builder of any
    # other value). Filled on the first value, not here: a record naming its own class recurses.
    plan: dict[str, tuple[str, frozenset[type], Build]] = {}

    def fill() -> None:
        made = {}
        for f in fields:
            as_is = _as_is(f.type)
            # Optional[X]: null is taken as it is, so the builder is X's (one call fewer).
            kind = next(a for a in get_args(f.type) if a is not type(None)) if type(None) in as_is else f.type
            made[to_camel(f.name)] = (f.alias, as_is, _or_unsure(kind))
        plan.update(made)  # whole or not at all: another thread never sees half a plan

    def build(value: Any) -> Any:
        if type(value) is not dict or not value.keys() <= names or not required <= value.keys():
            raise Unsure(cls.__name__)  # not an object, an unknown field or a missing one
        if not plan:
            fill()
        kwargs = {}
        for key, item in value.items():
            alias, as_is, make = plan[key]
            kwargs[alias] = item if type(item) in as_is else make(item)
        return cls(**kwargs)

    return build
