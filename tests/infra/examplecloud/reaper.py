"""The throwaway cloud's reaper client: its "API" is a JSON file (EXAMPLECLOUD_FLEET) that
lists the instances with their tags and metrics; a stop marks them stopped in that file."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from infra.reaper.core import UTC, ConfigError, Instance, Invocation, Metrics, StopResult

VENDOR_SDK = False
SDKS: tuple[str, ...] = ()
WHEELS = False
FLEET_ENV = "EXAMPLECLOUD_FLEET"


class ExampleCloud:
    provider = "examplecloud"

    def __init__(self, region: str, fleet: Path) -> None:
        self.region, self.fleet = region, fleet

    def _read(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.fleet.read_text())
        return doc

    def scan(self, stack: str | None) -> list[Instance]:
        now = datetime.now(UTC)
        return [
            Instance(
                i["id"],
                i["state"],
                i["type"],
                now - timedelta(hours=i["up_hours"]),
                i["tags"],
            )
            for i in self._read()["instances"]
        ]

    def metrics(
        self, instance_ids: Sequence[str], *, start: datetime, end: datetime
    ) -> dict[str, Metrics]:
        found = {}
        for i in self._read()["instances"]:
            if i["id"] in instance_ids:
                beat = i.get("beat_minutes_ago")
                found[i["id"]] = Metrics(
                    None if beat is None else end - timedelta(minutes=beat), i.get("util")
                )
        return found

    def stop(self, instance_ids: Sequence[str]) -> StopResult:
        doc = self._read()
        for i in doc["instances"]:
            if i["id"] in instance_ids:
                i["state"] = "stopped"
        self.fleet.write_text(json.dumps(doc))
        return StopResult(stopped=list(instance_ids))


def from_env(region: str, env: Mapping[str, str], given: Invocation) -> ExampleCloud:
    if not env.get(FLEET_ENV):
        raise ConfigError(f"{FLEET_ENV} is not set")
    return ExampleCloud(region, Path(env[FLEET_ENV]))
