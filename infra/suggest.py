"""The one "did you mean" of the project: config keys, tiers, currencies, stacks, GPUs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the closest option, or "" when none is close enough."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""
