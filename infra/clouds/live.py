"""Live prices: what each cloud's prices.py answers (``scripts/cost.py --live`` asks it).

A cloud with live prices has a prices.py in its folder with two functions, both
``(instance_type, region)``:

- ``live_price``: (price per hour, currency) for one pay-as-you-go instance;
- ``live_reservations``: ({term: (total for the term, currency)}, the source's name), or
  LivePriceError saying the cloud has no such source.

Each raises LivePriceError with a one-line reason when the price cannot be had (no
credentials, no network, no matching product): said, never fatal. NoCredentials (nothing
was asked) and PriceNotFound (asked, answered, no such price) say which, for
``scripts/refresh_prices.py``; each prices.py also names ``SOURCE``, the key of its
catalog's [sources] entry for the API, which a refreshed price carries. The SDKs are imported
inside the functions: nothing else needs them.
"""

from __future__ import annotations

from collections.abc import Mapping

Terms = Mapping[str, tuple[float, str]]  # term -> (total for the whole term, currency)


class LivePriceError(RuntimeError):
    """The live price could not be had; the message says why, in one line."""


class NoCredentials(LivePriceError):
    """The cloud answers prices only to an account and none is set: nothing was asked."""


class PriceNotFound(LivePriceError):
    """The cloud answered, but no price for that type in that region (not a transport error)."""
