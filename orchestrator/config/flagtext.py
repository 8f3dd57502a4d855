"""How a flag is written on a command line: its option word and value words, and the
canonical form of a value a cache key holds. Shared by the frozen launch
(`config.experiment`) and its roles (`config.deployment`)."""

from __future__ import annotations

from typing import Any, Union

from orchestrator.config.jsonvalue import canonical

#: A flag's value: True = bare switch; a scalar = `--flag VALUE`; a tuple = `--flag V1 V2`.
FlagValue = Union[bool, int, float, str, tuple[Union[int, float, str], ...]]  # noqa: UP007


def option_word(name: str) -> str:
    """The argv word of a flag named `name`: `--tp-size`, or `-tp` for a short option
    (a key written with one dash)."""
    return name if name.startswith("-") else f"--{name}"


def render_value(value: FlagValue) -> list[str]:
    """The argv words of a flag's value (nothing for a bare switch)."""
    if value is True:
        return []
    if isinstance(value, tuple):
        return [_scalar_text(v) for v in value]
    return [_scalar_text(value)]


def _scalar_text(v: bool | int | float | str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _jsonable(v: FlagValue) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _keyed(v: FlagValue) -> Any:
    c = canonical(v)
    return _jsonable(v) if c is None else c
