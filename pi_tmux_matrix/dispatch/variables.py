"""Job variables (the origin's ``set_variable`` / ``list_variables``): a small per-job file of named
values a master sets while its workers run, ``<state dir>/variables/<job>.json``.

Written through the records store (durable, atomic, 0600, under the job's record lock), so a
worker that reads it at its decision point sees a whole old or a whole new version. Each
worker's prompt names the file and says to read it only at the decision point its task names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from ..errors import ContractError
from ..matrix.records import Records
from ..matrix.store import MatrixStore, now_ms

__all__ = ["MAX_VALUE_BYTES", "JobVariables", "Variables", "check_name", "variables_instruction"]

NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,80}")
MAX_VALUE_BYTES: Final = 16 * 1024
MAX_VARIABLES: Final = 200


@attrs.frozen
class JobVariables:
    job_id: str
    values: Mapping[str, str] = attrs.field(factory=dict)
    updated_at: int = 0


def check_name(name: str, field: str = "NAME") -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ContractError(
            field, f"{str(name)[:90]!r} is not a variable name", "use 1-80 letters, digits, '_', '.' or '-'"
        )
    return name


def _check_value(value: str, field: str) -> str:
    if "\x00" in value or len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
        raise ContractError(field, "over 16 KiB or holds a NUL byte", "keep a value short; point to a file")
    return value


class Variables:
    """The variables of every job in one state dir."""

    def __init__(self, store: MatrixStore) -> None:
        self.records = Records(store, "variables", JobVariables, own_name=lambda v: v.job_id)

    def path(self, job_id: str) -> Path:
        return Path(self.records.path(job_id))

    def of(self, job_id: str) -> dict[str, str]:
        found = self.records.find(job_id)
        return dict(found.values) if found is not None else {}

    def set(
        self, job_id: str, name: str, value: str, *, name_field: str = "NAME", value_field: str = "VALUE"
    ) -> dict[str, str]:
        """Set one variable (under the job's variables lock); the job's variables after it."""
        check_name(name, name_field)
        _check_value(value, value_field)
        if self.records.find(job_id) is None:
            self.records.put(job_id, JobVariables(job_id), exclusive=True)

        def change(current: JobVariables) -> JobVariables:
            values = {**current.values, name: value}
            if len(values) > MAX_VARIABLES:
                raise ContractError(name_field, f"job {job_id} has {MAX_VARIABLES} variables", "reuse a name")
            return attrs.evolve(current, values=values, updated_at=now_ms())

        return dict(self.records.update(job_id, change).values)


def variables_instruction(path: Path) -> str:
    """What each worker is told of its job's variables."""
    return (
        f'Job variables (set by your master while you work) are in {path} (JSON, under "values"). '
        "Read that file only at a decision point your task names; do not poll it."
    )
