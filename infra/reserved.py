"""Reserved capacity for a tier, dates and a duration: each cloud's offerings, priced.

The third way to get GPUs (after on-demand/spot in a zone that has them, and failover across
zones): capacity bought for fixed dates. A cloud folder with a ``reserved.py`` answers
``offerings(instance_type, count, start, end, hours, region)`` from its own API, and
``request_problem(days, count)`` with its own limits; the others say what they sell instead
and how it is billed (docs/placement.md). Nothing here names a cloud.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra import clouds

MODULE = "reserved.py"


class NoOffering(Exception):
    """The cloud's API could not be asked (no credentials, unreachable): one line."""


@dataclass(frozen=True)
class Offering:
    """One offering: so many instances of a type in a zone for fixed dates, one fee."""

    provider: str
    offering_id: str
    instance_type: str
    zone: str
    count: int
    start: dt.datetime
    end: dt.datetime
    hours: int
    upfront_fee: float
    currency: str

    def per_instance_hour(self) -> float:
        return self.upfront_fee / (self.count * self.hours)

    def to_json(self, gpus: int) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "offering_id": self.offering_id,
            "instance_type": self.instance_type,
            "zone": self.zone,
            "count": self.count,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "hours": self.hours,
            "upfront_fee": self.upfront_fee,
            "currency": self.currency,
            "per_instance_hour": round(self.per_instance_hour(), 4),
            "per_gpu_hour": round(self.per_instance_hour() / gpus, 4) if gpus else None,
        }


def request_problem(provider: str, days: int, count: int) -> str | None:
    """Why the cloud sells no block of ``days`` days and ``count`` instances, or None."""
    problem: str | None = clouds.module(provider, "reserved").request_problem(days, count)
    return problem


def sellers() -> list[str]:
    """The clouds whose folder answers offerings (the rest sell reservations otherwise)."""
    return sorted(clouds.names(MODULE))


def offerings(
    provider: str,
    instance_type: str,
    count: int,
    start: dt.datetime,
    end: dt.datetime,
    hours: int,
    region: str,
) -> Sequence[Offering]:
    module = clouds.module(provider, "reserved")
    return list(module.offerings(instance_type, count, start, end, hours, region))
