"""Whether a value holds a NaN or an infinity: JSON has neither, and orjson writes each as
`null`, so a value holding one would be stored changed without a word."""

from __future__ import annotations

import math


def has_non_finite(value: object) -> bool:
    """Whether a NaN or an infinity is in `value`, its dicts, lists and tuples (a loop: the
    value was encoded, so it is nested at most orjson's 255 deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list | tuple):
            stack += item
    return False
