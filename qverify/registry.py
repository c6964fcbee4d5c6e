"""A small typed registry per kind (suites, recipes, backends, gate metrics).

Modelled on lm-eval's Registry: rejects duplicate names and answers an unknown
name with "did you mean". Registration is explicit, by a decorator in the file
that implements the thing.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from qverify.errors import BadInput

T = TypeVar("T")


def unknown_message(kind: str, name: str, known: Iterable[str], lookup: str | None = None) -> str:
    """'unknown <kind> <name>; did you mean <closest>?': the one wording of an unknown name everywhere.

    `lookup` is the normalised form that was looked up, when it differs from what the user typed.
    """
    close = difflib.get_close_matches(name if lookup is None else lookup, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint}"


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"duplicate {self.kind} name {name!r}")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise BadInput(self.unknown_message(name), fix=f"use one of: {', '.join(self.names())}") from None

    def unknown_message(self, name: str) -> str:
        return unknown_message(self.kind, name, self.names())

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> list[tuple[str, T]]:
        return [(n, self._entries[n]) for n in self.names()]
