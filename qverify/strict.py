"""The one strict pydantic base: every file qverify reads (qverify.toml, recipes, profiles, build.json, run
manifests) and every record it writes is a `Strict` model, with one rule for unknown keys, non-finite numbers
and booleans where a number belongs (README, "Exit codes": such input is exit 4).

- unknown keys are errors that name the key (extra="forbid");
- nan and inf are refused anywhere, nested free-form mappings included (a recipe's llm-compressor arguments):
  nan passes every range check (all comparisons are False) and inf is no count, size or time;
- a boolean is not a number: `replicates = true` would otherwise be taken as 1.

`Record` is for what qverify measures itself (results, gate reports): a mean over no items is nan and a bound
from one replicate is inf, and these are results, not input.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def non_finite_at(value: Any, where: str = "") -> str | None:
    """The dotted path of the first nan or inf in `value` (nested dicts and lists), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "value"
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        if (found := non_finite_at(v, f"{where}.{k}" if where else str(k))) is not None:
            return found
    return None


def _holds_models(annotation: Any) -> bool:
    """Whether a field's type has a pydantic model in it: those check their own fields (with the full key path)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_models(a) for a in typing.get_args(annotation))


def _takes_int_not_bool(annotation: Any) -> bool:
    if annotation is int:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        return int in members and bool not in members
    return False


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    finite: ClassVar[bool] = True  # False in Record

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        annotation = field.annotation if field is not None else Any
        if isinstance(value, bool):
            if _takes_int_not_bool(annotation):
                raise ValueError("a whole number is needed, not a boolean")
        elif cls.finite and not _holds_models(annotation) and (where := non_finite_at(value)) is not None:
            inner = "" if where == "value" else f" (at {where})"
            raise ValueError(f"nan and inf are not allowed{inner}")
        return value


class Record(Strict):
    """What qverify computes and writes itself; nan and inf may be measurements here."""

    model_config = ConfigDict(allow_inf_nan=True)
    finite: ClassVar[bool] = False
