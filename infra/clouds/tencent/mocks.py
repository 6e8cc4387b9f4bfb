"""What Pulumi's mocks answer for Tencent Cloud (infra.offline): resource outputs and invokes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.offline import Engine

PACKAGE = "tencentcloud"  # the Pulumi package whose type tokens ("tencentcloud:...") these answer
# Tencent's account numbers as the plan shows them: clearly not a real account.
TENCENT_UIN = "100000000001"
TENCENT_APPID = "1250000000"


def resource(
    typ: str, name: str, inputs: dict[str, Any], out: dict[str, Any], rid: str, engine: Engine
) -> str:
    """Fill ``out`` with what Tencent Cloud answers for a new resource; its id."""
    if typ == "tencentcloud:Instance/instance:Instance":
        rid = "ins-" + engine.digest(typ, name, n=8)
        out["publicIp"], out["privateIp"] = engine.ips_for(name)
    elif typ == "tencentcloud:Key/pair:Pair":
        rid = "skey-" + engine.digest(typ, name, n=8)
    elif typ == "tencentcloud:Cam/role:Role":
        out["roleArn"] = f"qcs::cam::uin/{TENCENT_UIN}:roleName/{inputs.get('name')}"
    return rid


def invoke(token: str, inputs: dict[str, Any], engine: Engine) -> dict[str, Any] | None:
    """Tencent Cloud's answer to an invoke, or None for a token it does not know."""
    if token == "tencentcloud:User/getInfo:getInfo":
        return {
            "id": TENCENT_UIN,
            "appId": TENCENT_APPID,
            "uin": TENCENT_UIN,
            "ownerUin": TENCENT_UIN,
            "name": "gpufleet-plan",
        }
    if token == "tencentcloud:Instance/getTypes:getTypes":
        return _instance_types(inputs["filters"][0]["values"][0], engine.region)
    if token == "tencentcloud:Images/getInstance:getInstance":
        image = "img-" + engine.digest(token, str(inputs.get("instanceType")), n=8)
        return {
            "id": "images",
            "imageId": image,
            "images": [{"imageId": image, "imageName": "Ubuntu Server 22.04 LTS 64bit"}],
        }
    return None


def _instance_types(family: str, region: str) -> dict[str, Any]:
    """Tencent type names are <FAMILY>.<size>: the family's catalog types, every zone."""
    from infra.catalog import load_catalog

    names = sorted(n for (_, n) in load_catalog().instances if n.split(".")[0] == family)
    zones = [f"{region}-{n}" for n in (3, 4, 6)]
    rows = [
        {
            "availabilityZone": z,
            "instanceType": n,
            "family": family,
            "cpuCoreCount": 0,
            "gpuCoreCount": 0,
            "memorySize": 0,
            "instanceChargeType": "POSTPAID_BY_HOUR",
            "status": "SELL",
            "cbsConfigs": [],
        }
        for n in names
        for z in zones
    ]
    return {"id": family, "instanceTypes": rows}
