"""CVM start and stop for ``fab start`` / ``fab stop`` (the contract: infra/clouds/power.py).

The reaper's client and its StopInstances (StoppedMode=STOP_CHARGING, StopType=SOFT_FIRST),
plus DescribeInstances by ``InstanceIds`` and StartInstances (tencentcloud-sdk-python-cvm
3.1.178, tencentcloud/cvm/v20170312/models.py: StartInstancesRequest.InstanceIds,
Instance.PublicIpAddresses / PrivateIpAddresses / StopChargingMode).

STOP_CHARGING "只针对部分按量计费实例生效" (only some pay-as-you-go instances, the same
models.py, StopInstancesRequest.StoppedMode, citing https://cloud.tencent.com/document/
product/213/19918); an instance that cannot is refused with
``UnsupportedOperation.StoppedModeStopCharging`` (tencentcloud/cvm/v20170312/errorcodes.py,
"不支持关机不收费特性"), and :data:`NO_STOP_CHARGING` says so in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.power import NodePower
from infra.clouds.tencent.reaper import TencentCloud, _text, credentials_from, parse_instance

NO_STOP_CHARGING_CODE = "UnsupportedOperation.StoppedModeStopCharging"
# What the laptop's credentials need for fab start / fab stop (SECURITY.md section 2).
LAPTOP_ACTIONS = ("cvm:DescribeInstances", "cvm:StartInstances", "cvm:StopInstances")
NO_STOP_CHARGING = (
    "this instance cannot stop without charging (UnsupportedOperation.StoppedModeStopCharging:"
    " local disks or a type without STOP_CHARGING): not stopped; stop it from the console if"
    " it may keep billing while stopped"
)


def connect(region: str, stack: str, env: Mapping[str, str], endpoint: str | None) -> TencentPower:
    del stack
    secret_id, secret_key, token = credentials_from(env)
    cloud = TencentCloud(
        region,
        endpoint=endpoint,
        secret_id=secret_id or None,
        secret_key=secret_key or None,
        token=token or None,
        max_attempts=4,
    )
    return TencentPower(cloud)


class TencentPower:
    def __init__(self, cloud: TencentCloud) -> None:
        self.cloud = cloud

    def describe(self, ids: Sequence[str]) -> dict[str, NodePower]:
        answer = self.cloud._call("cvm", "DescribeInstances", {"InstanceIds": list(ids)})
        listed = _raw(answer).get("InstanceSet")
        if not isinstance(listed, list):
            raise ValueError("DescribeInstances answered without InstanceSet")
        return {str(raw.get("InstanceId")): _node(raw) for raw in listed}

    def start(self, ids: Sequence[str]) -> dict[str, str]:
        try:
            self.cloud._call("cvm", "StartInstances", {"InstanceIds": list(ids)})
        except Exception as exc:  # all or nothing, as the API answers
            return {iid: _text(exc) for iid in ids}
        return {}

    def stop(self, ids: Sequence[str]) -> dict[str, str]:
        failed = dict(self.cloud.stop(ids).failed)
        return {i: NO_STOP_CHARGING if NO_STOP_CHARGING_CODE in w else w for i, w in failed.items()}


def _raw(answer: Any) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads(answer.to_json_string())
    return data


def _first(value: Any) -> str | None:
    return str(value[0]) if isinstance(value, list) and value else None


def _node(raw: dict[str, Any]) -> NodePower:
    return NodePower(
        parse_instance(raw),
        public_ip=_first(raw.get("PublicIpAddresses")),
        private_ip=_first(raw.get("PrivateIpAddresses")),
    )
