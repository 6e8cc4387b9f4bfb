"""ECS start and stop for ``fab start`` / ``fab stop`` (the contract: infra/clouds/power.py).

The reaper's client and its StopInstances (StoppedMode=StopCharging, SuccessFirst), plus
DescribeInstances by ``InstanceIds`` and StartInstances (field names from the SDK's models,
alibabacloud_ecs20140526 7.11.8: StartInstancesRequest instance_id / batch_optimization,
DescribeInstancesResponseBody ...PublicIpAddress.IpAddress, EipAddress.IpAddress,
VpcAttributes.PrivateIpAddress.IpAddress, StoppedMode).

StopCharging where the cloud allows it: "如实例自身不支持节省停机模式，API 侧不会进行报错拦截，
优先保证实例停机。不支持节省停机的实例类型：经典网络实例、本地盘实例、包年包月实例等" (StopInstance,
https://help.aliyun.com/document_detail/25501.html, read 2026-12-02): an instance that
cannot stop in economical mode (local disks, classic network, subscription) is stopped in
standard mode with no error, and keeps billing its compute. There is no error code to
catch: DescribeInstances' StoppedMode=KeepCharging after the stop says it, and ``fab stop``
prints that line. A stop in economical mode may also change the public IP (unless it is an
EIP), so describe reports the address the node has now.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.alicloud.reaper import PAGE, AlicloudCloud, _text, parse_instance
from infra.clouds.power import NodePower

# The reaper needs the account for its metrics namespace; starting and stopping read no
# metrics, so any value does when the environment gives none.
NO_ACCOUNT = "not-needed-to-start-or-stop"
# What the laptop's credentials need for fab start / fab stop (SECURITY.md section 2).
LAPTOP_ACTIONS = ("ecs:DescribeInstances", "ecs:StartInstances", "ecs:StopInstances")


def connect(region: str, stack: str, env: Mapping[str, str], endpoint: str | None) -> AlicloudPower:
    del stack
    cloud = AlicloudCloud(
        region,
        endpoint=endpoint,
        access_key_id=env.get("ALIBABA_CLOUD_ACCESS_KEY_ID"),
        access_key_secret=env.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET"),
        security_token=env.get("ALIBABA_CLOUD_SECURITY_TOKEN"),
        account_id=env.get("GPUFLEET_ALICLOUD_ACCOUNT_ID") or NO_ACCOUNT,
        max_attempts=4,
    )
    return AlicloudPower(cloud)


class AlicloudPower:
    def __init__(self, cloud: AlicloudCloud) -> None:
        self.cloud = cloud

    def describe(self, ids: Sequence[str]) -> dict[str, NodePower]:
        from alibabacloud_ecs20140526 import models as ecs_models

        request = ecs_models.DescribeInstancesRequest(
            region_id=self.cloud.region,
            instance_ids=json.dumps(list(ids)),
            max_results=PAGE,
        )
        body = self.cloud._call(self.cloud.ecs, "DescribeInstances", request).body.to_map()
        listed = (body.get("Instances") or {}).get("Instance")
        if not isinstance(listed, list):
            raise ValueError("DescribeInstances answered without Instances.Instance")
        return {str(raw.get("InstanceId")): _node(raw) for raw in listed}

    def start(self, ids: Sequence[str]) -> dict[str, str]:
        from alibabacloud_ecs20140526 import models as ecs_models

        request = ecs_models.StartInstancesRequest(
            region_id=self.cloud.region, instance_id=list(ids), batch_optimization="SuccessFirst"
        )
        try:
            response = self.cloud._call(self.cloud.ecs, "StartInstances", request)
        except Exception as exc:  # the call as a whole was refused: every id with it
            return {iid: _text(exc) for iid in ids}
        rows = (response.body.to_map().get("InstanceResponses") or {}).get("InstanceResponse")
        failed: dict[str, str] = {}
        seen = set()
        for row in rows or []:
            seen.add(row.get("InstanceId"))
            if str(row.get("Code", "200")) != "200":
                failed[str(row.get("InstanceId"))] = f"{row.get('Code')}: {row.get('Message', '')}"
        failed.update({i: "not in the StartInstances answer" for i in ids if i not in seen})
        return failed

    def stop(self, ids: Sequence[str]) -> dict[str, str]:
        return dict(self.cloud.stop(ids).failed)


def _first(value: Any) -> str | None:
    if isinstance(value, list):
        return str(value[0]) if value else None
    return str(value) if value else None


def _node(raw: dict[str, Any]) -> NodePower:
    eip = (raw.get("EipAddress") or {}).get("IpAddress")
    public = _first((raw.get("PublicIpAddress") or {}).get("IpAddress"))
    private = (raw.get("VpcAttributes") or {}).get("PrivateIpAddress") or {}
    return NodePower(
        parse_instance(raw),
        public_ip=_first(eip) or public,
        private_ip=_first(private.get("IpAddress")),
    )
