"""What Pulumi's mocks answer for Alibaba Cloud (infra.offline): resource outputs and invokes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.offline import Engine

PACKAGE = "alicloud"  # the Pulumi package whose type tokens ("alicloud:...") these answer
ACCOUNT_ID = "123456789012"  # a placeholder account, never a real one


def resource(
    typ: str, name: str, inputs: dict[str, Any], out: dict[str, Any], rid: str, engine: Engine
) -> str:
    """Fill ``out`` with what Alibaba Cloud answers for a new resource; its id."""
    if typ == "alicloud:ecs/instance:Instance":
        rid = "i-" + engine.digest(typ, name, n=20)
        public, private = engine.ips_for(name)
        out.update(publicIp=public, primaryIpAddress=private)
    elif typ == "alicloud:ram/role:Role":
        out["arn"] = f"acs:ram::{ACCOUNT_ID}:role/{inputs.get('roleName', name)}"
    return rid


def invoke(token: str, inputs: dict[str, Any], engine: Engine) -> dict[str, Any] | None:
    """Alibaba Cloud's answer to an invoke, or None for a token it does not know."""
    region = engine.region
    if token == "alicloud:index/getZones:getZones":
        zones = [f"{region}-{c}" for c in ("b", "g", "l")]
        return {"id": region, "ids": zones, "zones": [{"id": z} for z in zones]}
    if token == "alicloud:ecs/getImages:getImages":
        image = "ubuntu_22_04_x64_20G_alibase_20260901.vhd"
        return {"id": "images", "ids": [image], "images": [{"id": image, "name": image}]}
    if token == "alicloud:index/getCallerIdentity:getCallerIdentity":
        return {"id": ACCOUNT_ID, "accountId": ACCOUNT_ID, "arn": "", "identityType": "Account"}
    return None
