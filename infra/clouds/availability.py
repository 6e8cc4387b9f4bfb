"""What a cloud's own availability signal says, zone by zone (``scripts/where.py --live``).

A cloud with a signal has an availability.py in its folder with one function:

- ``live_zones(instance_type, regions)``: the zones of ``regions`` the cloud's API reports
  for that type, each a :class:`ZoneSignal`; or NoSignal with a one-line reason (no
  credentials, the API refused, no such signal on this cloud).

``SIGNAL`` in that module names the API calls, so a reader knows what a state rests on. The
SDKs are imported inside the functions: this module and infra.where need none.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a zone's state may be, in every cloud's words mapped to these four.
AVAILABLE = "available"  # the API says the type can be had there now
SOLD_OUT = "sold out"  # offered there, no stock now (Alicloud WithoutStock, Tencent SOLD_OUT)
RESTRICTED = "restricted"  # this account/subscription may not use it there (Azure restrictions)
OFFERED = "offered"  # listed there, with no stock signal (EC2 offerings)
STATES = (AVAILABLE, OFFERED, SOLD_OUT, RESTRICTED)


@dataclass(frozen=True)
class ZoneSignal:
    region: str
    zone: str  # "" when the signal is for the whole region (an Azure region without zones)
    state: str  # one of STATES
    spot_price: float | None = None  # the latest spot price there, where the API gives one
    detail: str = ""  # the cloud's own words (status, reason code), for people


class NoSignal(RuntimeError):
    """The cloud's signal could not be had; the message says why, in one line."""
