"""Every exception class pi_tmux_matrix defines survives pickling (multiprocessing, executors).

The classes are found by walking the package, not listed by hand: a new error class whose
constructor takes fields pickle cannot replay fails here the day it is added.
"""

from __future__ import annotations

import copy
import errno
import importlib
import inspect
import itertools
import pickle
import pkgutil
from typing import Any

import pytest

import pi_tmux_matrix
from pi_tmux_matrix import errors


def _walk_modules() -> list[str]:
    names = [pi_tmux_matrix.__name__]
    prefix = pi_tmux_matrix.__name__ + "."
    names += [info.name for info in pkgutil.walk_packages(pi_tmux_matrix.__path__, prefix)]
    return sorted(names)


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _walk_modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            # Only classes defined in this module (not re-exports, not the builtins).
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[key] for key in sorted(found)]


CLASSES = _exception_classes()
_numbers = itertools.count(11)


def _value_for(cls: type[BaseException], param: inspect.Parameter) -> Any:
    """A distinct, recognisable value per parameter (a swapped field cannot compare equal)."""
    annotation = str(param.annotation)
    if "bool" in annotation:
        return True
    if "int" in annotation:
        return next(_numbers)
    if "list" in annotation:
        return [f"{param.name}-a", f"{param.name}-b"]
    if "str" in annotation or param.annotation is inspect.Parameter.empty:
        return f"<{param.name}>"
    raise AssertionError(
        f"{cls.__qualname__}({param.name}: {annotation}): teach _value_for a value for this type"
    )


def _instance(cls: type[BaseException]) -> BaseException:
    if issubclass(cls, OSError):
        # OSError's own (errno, strerror, filename) signature is not introspectable.
        return cls(errno.EDEADLK, "already held", "/state/entries/worker-s1.lock")
    try:
        signature = inspect.signature(cls)
    except ValueError:  # a builtin __init__: the plain (*args) message constructor
        return cls(f"{cls.__qualname__} happened; do the thing")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            args.append(f"{cls.__qualname__} happened; do the thing")
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        elif param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[param.name] = _value_for(cls, param)
        else:
            args.append(_value_for(cls, param))
    return cls(*args, **kwargs)


def _fields(err: BaseException) -> dict[str, Any]:
    fields = dict(vars(err))
    if isinstance(err, OSError):  # kept in C slots, not in __dict__
        fields.update(errno=err.errno, strerror=err.strerror, filename=err.filename)
    return fields


def test_the_walk_finds_the_whole_hierarchy_and_the_errors_elsewhere() -> None:
    names = {cls.__name__ for cls in CLASSES}
    in_errors = {name for name in errors.__all__ if isinstance(getattr(errors, name), type)}
    assert in_errors <= names
    assert {"ResumeRefused", "LockError", "LockTimeout", "DecodeError", "StrictJSONError"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_exception_round_trips_through_pickle(cls: type[BaseException]) -> None:
    err = _instance(cls)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(back) is cls
        assert str(back) == str(err)
        assert back.args == err.args
        assert _fields(back) == _fields(err)
    clone = copy.deepcopy(err)
    assert (type(clone), str(clone), _fields(clone)) == (cls, str(err), _fields(err))


def test_a_round_tripped_error_keeps_its_fields_exit_code_and_notes() -> None:
    err = errors.ProfileError("team.toml", "members[0].profile", "unknown profile", "pick a known one")
    err.__notes__ = ["while firing job j-1"]  # add_note() is 3.11+; the package supports 3.10
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, errors.ContractError)
    assert isinstance(back, ValueError)
    assert (back.source, back.field, back.problem, back.fix) == (
        "team.toml",
        "team.toml: members[0].profile",
        "unknown profile",
        "pick a known one",
    )
    assert back.exit_code == errors.EXIT_USAGE
    assert back.__notes__ == ["while firing job j-1"]
    exists = pickle.loads(pickle.dumps(errors.EntryExists("worker-s1", "g2")))
    assert str(exists) == "worker-s1: an entry with this key already exists (generation g2)"
    assert (exists.key, exists.expected, exists.found) == ("worker-s1", None, "g2")
