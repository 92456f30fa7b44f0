"""Timeouts as the host API takes them: an argument, else an environment variable, else a default."""

from __future__ import annotations

import math
import os

#: Longest wait a timeout may ask for (a week): waits always end, and the device counts nanoseconds in int64.
MAX_SECONDS = 7 * 24 * 3600.0


def _seconds(name: str, value, variable: str, default: float = 30.0) -> float:
    """A positive number of seconds: the argument, else the environment variable, else the default."""
    source = f"{name}={value!r}"
    if value is None:
        raw = os.environ.get(variable)
        if raw is None:
            return default
        source = f"{variable}={raw!r}"
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{source} is not a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{source} must be a positive number of seconds")
    if not math.isfinite(value) or value > MAX_SECONDS:
        raise ValueError(f"{source} is too large: a wait must end, with an error naming what it waited for; "
                         f"give at most {MAX_SECONDS:g} seconds")
    return float(value)
