"""The throwaway cloud's answers under Pulumi's mocks (infra.offline)."""

from __future__ import annotations

from typing import Any

PACKAGE = "examplecloud"


def resource(
    typ: str, name: str, inputs: dict[str, Any], out: dict[str, Any], rid: str, engine: Any
) -> str:
    if typ in ("examplecloud:compute:Instance", "examplecloud:index/node:Node"):
        out["address"], out["privateAddress"] = engine.ips_for(name)
    if typ == "examplecloud:network:Firewall":
        out["zone"] = f"{engine.region}-a"
    return "ex-" + engine.digest(typ, name)


def invoke(token: str, inputs: dict[str, Any], engine: Any) -> dict[str, Any] | None:
    if token == "examplecloud:index/getRegion:getRegion":
        return {"region": engine.region}
    return None
