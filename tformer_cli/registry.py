"""Registries: each seam (optimizers, schedules, poolings, data loaders) is a dict from a config name to a
function, so a new option is one decorated function plus one YAML, and an unknown name fails with the list."""
from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def registrar(table: dict[str, Callable]) -> Callable[[str], Callable[[F], F]]:
    """A decorator factory: `@register("name")` puts the decorated function into `table` under that name."""

    def register(name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            table[name] = fn
            return fn

        return add

    return register
