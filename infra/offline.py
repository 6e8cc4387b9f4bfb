"""Evaluate the real program offline, under Pulumi's own mocks: no CLI, no account, no network.

The mocks record every resource exactly as the engine would receive it (type, name, inputs in
the engine's camelCase) and answer the few invokes the program makes with realistic data:
AWS zone offerings come from the DescribeInstanceTypeOfferings data that moto ships (a copy of
the real API's answers) when moto is installed; otherwise a clearly synthetic list.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor

from infra.config import StackConfig

PLACEHOLDER_SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPLANONLYPLACEHOLDERKEYxxxxxxxxxxxxxxxxxxxxx "
    "gpufleet-plan-placeholder"
)
ACCOUNT_ID = "123456789012"
# Tencent's account numbers as the plan shows them: clearly not a real account.
TENCENT_UIN = "100000000001"
TENCENT_APPID = "1250000000"
AZURE_SUBSCRIPTION = "00000000-0000-4000-8000-000000000000"  # a placeholder, never a real one
# Azure resources: the input that names each type (the rest take the Pulumi name), and the
# ARM provider segment of its id.
AZURE_NAMED_BY = {
    "azure-native:resources:ResourceGroup": "resourceGroupName",
    "azure-native:compute:VirtualMachine": "vmName",
    "azure-native:storage:StorageAccount": "accountName",
    "azure-native:storage:BlobContainer": "containerName",
    "azure-native:storage:Blob": "blobName",
    "azure-native:managedidentity:UserAssignedIdentity": "resourceName",
    "azure-native:applicationinsights:Workbook": "resourceName",
    "azure-native:web:WebApp": "name",
    "azure-native:web:AppServicePlan": "name",
}
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


@dataclass
class RecordedResource:
    type: str
    name: str
    inputs: dict[str, Any]
    id: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)
    urn: str = ""
    parent: str = ""  # the parent's URN: the stack's for top-level resources
    dependencies: tuple[str, ...] = ()  # URNs this resource's inputs or dependsOn refer to
    retain_on_delete: bool = False  # the resource option: a destroy leaves it in the cloud

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "urn": self.urn,
            "parent": self.parent,
            "dependencies": list(self.dependencies),
            "inputs": self.inputs,
        }


@dataclass
class PlanResult:
    resources: list[RecordedResource]
    outputs: dict[str, Any]
    invokes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stack_urn: str = ""

    def of_type(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_]


def _zone_offerings(region: str, instance_type: str) -> list[str] | None:
    """Real per-AZ offerings for a region, from moto's copy of the EC2 API data."""
    try:
        import moto
    except ImportError:
        return None
    root = Path(moto.__file__).parent / "ec2" / "resources" / "instance_type_offerings"
    path = root / "availability-zone" / f"{region}.json.gz"
    if not path.exists():
        return []
    with gzip.open(path) as fh:
        rows = json.load(fh)
    return sorted({r["Location"] for r in rows if r["InstanceType"] == instance_type})


def keep_number_kinds(value: Any) -> Any:
    """Whole floats back to ints, everywhere in `value`.

    Inputs reach the mocks through protobuf's Struct, which has only doubles: `fromPort=22`
    arrives as 22.0. The engine's own display (and the provider) read them as JSON numbers, so
    a whole number is shown as one."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: keep_number_kinds(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keep_number_kinds(v) for v in value]
    return value


def _digest(*parts: str, n: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:n]


class Mocks(pulumi.runtime.Mocks):
    """Deterministic fake engine: same program, same answers, every run."""

    def __init__(self, stack: str, region: str):
        self.stack, self.region = stack, region
        self.resources: list[RecordedResource] = []
        self.invokes: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _ips_for(name: str) -> tuple[str, str]:
        """Stable per name (resources register concurrently, so no counters)."""
        n = int(_digest("ip", name), 16)
        # 198.51.100.0/24 is a documentation range: never a real host.
        return f"198.51.100.{10 + n % 240}", f"10.42.{n // 240 % 15}.{10 + n % 240}"

    def _launch_interfaces(self, inputs: dict[str, Any]) -> int:
        """How many network interfaces an EC2 instance launches with: its launch
        template's, or the one default interface."""
        template = (inputs.get("launchTemplate") or {}).get("id")
        with self._lock:
            for r in self.resources:
                if r.type == "aws:ec2/launchTemplate:LaunchTemplate" and r.id == template:
                    return len(r.inputs.get("networkInterfaces") or []) or 1
        return 1

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = keep_number_kinds(dict(args.inputs))
        record = RecordedResource(args.typ, args.name, inputs, **_registering.__dict__)
        with self._lock:
            self.resources.append(record)
        rid = f"{args.name}-{_digest(args.typ, args.name)}"
        out = dict(inputs)
        typ = args.typ
        if typ.startswith("aws:"):
            service = typ.split(":")[1].split("/")[0]
            out.setdefault("arn", f"arn:aws:{service}:{self.region}:{ACCOUNT_ID}:{args.name}")
        if typ == "aws:ec2/instance:Instance":
            rid = "i-" + _digest(typ, args.name, n=17)
            public, private = self._ips_for(args.name)
            if self._launch_interfaces(inputs) > 1:
                public = ""  # EC2 gives none (infra.nodes.public_ipv4_at_launch)
            out.update(
                publicIp=public,
                privateIp=private,
                primaryNetworkInterfaceId="eni-" + _digest("eni", args.name, n=17),
            )
        elif typ == "alicloud:ecs/instance:Instance":
            rid = "i-" + _digest(typ, args.name, n=20)
            public, private = self._ips_for(args.name)
            out.update(publicIp=public, primaryIpAddress=private)
        elif typ == "aws:ec2/eip:Eip":
            out["publicIp"], _ = self._ips_for(args.name)
        elif typ == "aws:s3/bucket:Bucket":
            out["bucket"] = inputs.get("bucketPrefix", "bucket-") + _digest(args.name, n=12)
            out["arn"] = f"arn:aws:s3:::{out['bucket']}"
            rid = out["bucket"]
        elif typ == "aws:ec2/keyPair:KeyPair":
            out["keyName"] = inputs.get("keyNamePrefix", "") + _digest(args.name)
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            rid = "lt-" + _digest(args.name, n=17)
            out["latestVersion"] = 1
        elif typ in NAMED_BY_ENGINE:
            out.setdefault("name", args.name)
        elif typ == "random:index/randomId:RandomId":
            raw = bytes.fromhex(_digest("random", args.name, n=2 * int(inputs["byteLength"])))
            out.update(hex=raw.hex(), dec=str(int.from_bytes(raw, "big")))
        elif typ == "tencentcloud:Instance/instance:Instance":
            rid = "ins-" + _digest(typ, args.name, n=8)
            out["publicIp"], out["privateIp"] = self._ips_for(args.name)
        elif typ == "tencentcloud:Key/pair:Pair":
            rid = "skey-" + _digest(typ, args.name, n=8)
        elif typ == "tencentcloud:Cam/role:Role":
            out["roleArn"] = f"qcs::cam::uin/{TENCENT_UIN}:roleName/{inputs.get('name')}"
        elif typ == "alicloud:ram/role:Role":
            out["arn"] = f"acs:ram::{ACCOUNT_ID}:role/{inputs.get('roleName', args.name)}"
        elif typ.startswith("azure-native:"):
            rid = self._azure(typ, args.name, inputs, out)
        if typ in AWS_ARNS:
            out["arn"] = AWS_ARNS[typ].format(
                region=self.region, account=ACCOUNT_ID, id=rid, name=out.get("name", args.name)
            )
        out.setdefault("id", rid)
        record.id, record.outputs = rid, out
        return rid, out

    def _azure(self, typ: str, name: str, inputs: dict[str, Any], out: dict[str, Any]) -> str:
        """Azure outputs the program reads: names, ARM ids, addresses, identities, URLs."""
        own = str(inputs.get(AZURE_NAMED_BY.get(typ, ""), "") or name)
        out.setdefault("name", own)
        _, namespace, kind = typ.split(":")
        group = inputs.get("resourceGroupName", own)
        rid = f"/subscriptions/{AZURE_SUBSCRIPTION}/resourceGroups/{group}"
        if kind != "ResourceGroup":
            rid += f"/providers/Microsoft.{namespace}/{kind[0].lower() + kind[1:]}s/{own}"
        identity = inputs.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # an input list of identity ids comes back from ARM as a map keyed by id
            ids = identity["userAssignedIdentities"]
            out["identity"] = {**identity, "userAssignedIdentities": {i: {} for i in ids}}
        if kind == "PublicIPAddress":
            out["ipAddress"], _ = self._ips_for(name)
        elif kind == "NetworkInterface":
            _, private = self._ips_for(name)
            configs = [dict(c) for c in inputs.get("ipConfigurations", [])]
            if configs:
                configs[0]["privateIPAddress"] = private
            out["ipConfigurations"] = configs
        elif kind == "UserAssignedIdentity":
            out["principalId"] = "p-" + _digest("principal", name, n=12)
            out["clientId"] = "c-" + _digest("client", name, n=12)
        elif kind == "Blob":
            out["url"] = f"https://{inputs.get('accountName')}.blob.core.windows.net/" + (
                f"{inputs.get('containerName')}/{own}"
            )
        return rid

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return self._answer(args), []

    def _answer(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        inputs = dict(args.args)
        with self._lock:
            self.invokes.append((args.token, inputs))
        token = args.token
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            itype = inputs["filters"][0]["values"][0]
            zones = _zone_offerings(self.region, itype)
            if zones is None:  # moto absent: synthetic, and named so nobody mistakes it
                zones = [f"{self.region}a"]
            return {
                "id": self.region,
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
                "value": "ami-" + _digest(name, n=17),
                "version": 1,
                "arn": f"arn:aws:ssm:{self.region}::parameter{name}",
            }
        if token == "alicloud:index/getZones:getZones":
            zones = [f"{self.region}-{c}" for c in ("b", "g", "l")]
            return {"id": self.region, "ids": zones, "zones": [{"id": z} for z in zones]}
        if token == "alicloud:ecs/getImages:getImages":
            image = "ubuntu_22_04_x64_20G_alibase_20260901.vhd"
            return {"id": "images", "ids": [image], "images": [{"id": image, "name": image}]}
        if token == "alicloud:index/getCallerIdentity:getCallerIdentity":
            return {"id": ACCOUNT_ID, "accountId": ACCOUNT_ID, "arn": "", "identityType": "Account"}
        if token == "tencentcloud:User/getInfo:getInfo":
            return {
                "id": TENCENT_UIN,
                "appId": TENCENT_APPID,
                "uin": TENCENT_UIN,
                "ownerUin": TENCENT_UIN,
                "name": "gpufleet-plan",
            }
        if token == "tencentcloud:Instance/getTypes:getTypes":
            family = inputs["filters"][0]["values"][0]
            from infra.catalog import load_catalog

            # Tencent type names are <FAMILY>.<size>: the family's catalog types, every zone.
            names = sorted(n for (_, n) in load_catalog().instances if n.split(".")[0] == family)
            zones = [f"{self.region}-{n}" for n in (3, 4, 6)]
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
        if token == "tencentcloud:Images/getInstance:getInstance":
            image = "img-" + _digest(token, str(inputs.get("instanceType")), n=8)
            return {
                "id": "images",
                "imageId": image,
                "images": [{"imageId": image, "imageName": "Ubuntu Server 22.04 LTS 64bit"}],
            }
        if token == "azure-native:authorization:getClientConfig":
            return {
                "clientId": "c-plan",
                "objectId": "o-plan",
                "subscriptionId": AZURE_SUBSCRIPTION,
                "tenantId": AZURE_SUBSCRIPTION,
            }
        raise NotImplementedError(f"no offline answer for invoke {token}: add one in offline.py")


# What RecordingMonitor knows of the registration in progress on this thread (urn, parent,
# dependencies), for Mocks.new_resource, which the SDK calls without them.
_registering = threading.local()


def _in_own_event_loop(call: Callable[[Any], Any], request: Any) -> Any:
    """Run one monitor call on a worker thread in an event loop that is closed afterwards.

    The SDK runs monitor calls on its executor's threads, and each call there creates an event
    loop for the thread (`_ensure_event_loop`) that nobody closes. At interpreter exit those
    loops were collected after their self-pipe sockets, and `BaseEventLoop.__del__` printed
    "Exception ignored ... Invalid file descriptor: -1" now and then."""
    if threading.current_thread() is threading.main_thread():
        return call(request)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return call(request)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


class RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, plus where each resource sits in the tree and what it needs."""

    def __init__(self, mocks: Mocks):
        super().__init__(mocks)
        self.stack_urn = ""

    def RegisterResource(self, request: Any) -> Any:  # the gRPC method's name
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            self.stack_urn = urn
        deps = {*request.dependencies}
        for prop in request.propertyDependencies.values():
            deps.update(prop.urns)
        _registering.__dict__.update(
            urn=urn,
            parent=request.parent,
            dependencies=tuple(sorted(deps)),
            retain_on_delete=bool(request.retainOnDelete),
        )
        try:
            return _in_own_event_loop(super().RegisterResource, request)
        finally:
            _registering.__dict__.clear()

    def Invoke(self, request: Any) -> Any:
        return _in_own_event_loop(super().Invoke, request)

    def ReadResource(self, request: Any) -> Any:
        return _in_own_event_loop(super().ReadResource, request)


_RUN_LOCK = threading.Lock()  # Pulumi's runtime settings are process-global


def evaluate(cfg: StackConfig, project: str = "gpufleet") -> PlanResult:
    """Run the real program for `cfg` under mocks and return what it declared.

    It runs in an event loop of its own, whose executor threads and loop are shut and closed
    before it returns: nothing of the run is left for the interpreter to collect at exit."""
    from infra.program import build

    with _RUN_LOCK:
        mocks = Mocks(cfg.stack, cfg.region)
        monitor = RecordingMonitor(mocks)
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            pulumi.runtime.set_mocks(
                mocks, project=project, stack=cfg.stack, preview=False, monitor=monitor
            )
            captured: dict[str, Any] = {}

            @pulumi.runtime.test
            def _run() -> pulumi.Output[Any]:
                outputs = build(cfg)
                return pulumi.Output.from_input(outputs).apply(captured.update)

            _run()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()
        # Resources and invokes register from concurrent threads, so their arrival order
        # changes run to run: the plan is handed out in URN (and token) order instead, so
        # `plan.py --json` is byte-identical for an unchanged stack.
        resources = sorted(mocks.resources, key=lambda r: r.urn)
        invokes = sorted(mocks.invokes, key=lambda i: (i[0], repr(sorted(i[1].items()))))
        return PlanResult(resources, captured, invokes, monitor.stack_urn)
