"""The throwaway cloud's live prices: it has no price API, and says so."""

from __future__ import annotations

from infra.clouds.live import LivePriceError


def live_price(instance_type: str, region: str) -> float:
    raise LivePriceError("examplecloud has no price API")


def live_reservations(instance_type: str, region: str) -> list[object]:
    raise LivePriceError("examplecloud sells no reservations")
