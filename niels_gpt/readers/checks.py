"""The sizes a reader is asked for (batch size B, window length T), checked before anything is read."""

from __future__ import annotations

import numbers

from niels_gpt.errors import ConfigError


def count(where: str, name: str, value, *, what: str) -> int:
    """`value` as an int >= 1, else ConfigError: `<where>: <name>=<value> (<type>) is not ...; pass ...`."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value >= 1:
            return int(value)
        raise ConfigError(f"{where}: {name}={value} is not {what}: it must be at least 1")
    kind = type(value).__name__
    raise ConfigError(f"{where}: {name}={value!r} ({kind}) is not {what}: pass a positive int, e.g. {name}=8")
