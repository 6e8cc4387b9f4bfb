"""What Pulumi's mocks answer for AWS (infra.offline): resource outputs and invokes.

Zone offerings come from the DescribeInstanceTypeOfferings data that moto ships (a copy of
the real API's answers) when moto is installed; otherwise a clearly synthetic list.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.offline import Engine

PACKAGE = "aws"  # the Pulumi package whose type tokens ("aws:...") these answer
ACCOUNT_ID = "123456789012"
# Types whose `name` the engine generates when the program does not set one.
NAMED_BY_ENGINE = (
    "aws:ec2/placementGroup:PlacementGroup",
    "aws:iam/policy:Policy",
    "aws:iam/role:Role",
    "aws:iam/instanceProfile:InstanceProfile",
    "aws:cloudwatch/eventRule:EventRule",
    "aws:lambda/function:Function",
)

# The ARNs AWS gives these types (the Service Authorization Reference's formats, which
# tests/infra/test_aws_iam.py matches policy resources against); others keep a placeholder.
AWS_ARNS = {
    "aws:ec2/instance:Instance": "arn:aws:ec2:{region}:{account}:instance/{id}",
    "aws:cloudwatch/logGroup:LogGroup": "arn:aws:logs:{region}:{account}:log-group:{name}",
    "aws:iam/policy:Policy": "arn:aws:iam::{account}:policy/{name}",
    "aws:iam/role:Role": "arn:aws:iam::{account}:role/{name}",
    "aws:lambda/function:Function": "arn:aws:lambda:{region}:{account}:function:{name}",
    "aws:cloudwatch/eventRule:EventRule": "arn:aws:events:{region}:{account}:rule/{name}",
}


def _zone_offerings(region: str, instance_type: str) -> list[str] | None:
    """Real per-AZ offerings for a region, from moto's copy of the EC2 API data.

    Only moto's data files are read: the package is found, not imported (importing moto
    pulls in boto3, botocore and werkzeug: about 0.4 s of CPU on top of pulumi)."""
    spec = importlib.util.find_spec("moto")
    if spec is None or not spec.submodule_search_locations:
        return None
    home = Path(next(iter(spec.submodule_search_locations)))
    root = home / "ec2" / "resources" / "instance_type_offerings"
    path = root / "availability-zone" / f"{region}.json.gz"
    if not path.exists():
        return []
    with gzip.open(path) as fh:
        rows = json.load(fh)
    return sorted({r["Location"] for r in rows if r["InstanceType"] == instance_type})


def _launch_interfaces(inputs: dict[str, Any], engine: Engine) -> int:
    """How many network interfaces an EC2 instance launches with: its launch template's, or
    the one default interface."""
    template = (inputs.get("launchTemplate") or {}).get("id")
    for r in engine.recorded("aws:ec2/launchTemplate:LaunchTemplate"):
        if r.id == template:
            return len(r.inputs.get("networkInterfaces") or []) or 1
    return 1


def resource(
    typ: str, name: str, inputs: dict[str, Any], out: dict[str, Any], rid: str, engine: Engine
) -> str:
    """Fill ``out`` with what AWS answers for a new resource; its id (``rid`` by default)."""
    digest = engine.digest
    service = typ.split(":")[1].split("/")[0]
    out.setdefault("arn", f"arn:aws:{service}:{engine.region}:{ACCOUNT_ID}:{name}")
    if typ == "aws:ec2/instance:Instance":
        rid = "i-" + digest(typ, name, n=17)
        public, private = engine.ips_for(name)
        if _launch_interfaces(inputs, engine) > 1:
            public = ""  # EC2 gives none (infra.nodes.public_ipv4_at_launch)
        out.update(
            publicIp=public,
            privateIp=private,
            primaryNetworkInterfaceId="eni-" + digest("eni", name, n=17),
        )
    elif typ == "aws:ec2/eip:Eip":
        out["publicIp"], _ = engine.ips_for(name)
    elif typ == "aws:s3/bucket:Bucket":
        out["bucket"] = inputs.get("bucketPrefix", "bucket-") + digest(name, n=12)
        out["arn"] = f"arn:aws:s3:::{out['bucket']}"
        rid = out["bucket"]
    elif typ == "aws:ec2/keyPair:KeyPair":
        out["keyName"] = inputs.get("keyNamePrefix", "") + digest(name)
    elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
        rid = "lt-" + digest(name, n=17)
        out["latestVersion"] = 1
    elif typ in NAMED_BY_ENGINE:
        out.setdefault("name", name)
    if typ in AWS_ARNS:
        out["arn"] = AWS_ARNS[typ].format(
            region=engine.region, account=ACCOUNT_ID, id=rid, name=out.get("name", name)
        )
    return rid


def invoke(token: str, inputs: dict[str, Any], engine: Engine) -> dict[str, Any] | None:
    """AWS's answer to an invoke, or None for a token it does not know."""
    region = engine.region
    if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
        itype = inputs["filters"][0]["values"][0]
        zones = _zone_offerings(region, itype)
        if zones is None:  # moto absent: synthetic, and named so nobody mistakes it
            zones = [f"{region}a"]
        return {
            "id": region,
            "locations": zones,
            "locationTypes": ["availability-zone"] * len(zones),
            "instanceTypes": [itype] * len(zones),
        }
    if token == "aws:ssm/getParameter:getParameter":
        name = inputs["name"]
        return {
            "id": name,
            "name": name,
            "type": "String",
            "value": "ami-" + engine.digest(name, n=17),
            "version": 1,
            "arn": f"arn:aws:ssm:{region}::parameter{name}",
        }
    return None
