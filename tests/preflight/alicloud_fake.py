"""A local fake of the four Alibaba Cloud actions the preflight asks, plus ECS
DescribeAvailableResource for the shared offered check, on 127.0.0.1.

The wire format as the official SDK speaks it (reference/testing-notes.md): POST, the action
in ``x-acs-action``, the parameters in the query string, a JSON body; errors as
``{"Code", "Message", "RequestId"}`` with an HTTP error status. Every ECS request is
checked against the SDK's own request model (tests/support/alicloud_models.unknown_params):
a parameter the model does not define is refused, as the API refuses it.

Answers carry only fields of the SDK's response models (alibabacloud_ecs20140526 7.11.8,
checked by a test): DescribeAccountAttributesResponseBody (AccountAttributeItems.
AccountAttributeItem[].AttributeName, AttributeValues.ValueItem[].Value), DescribeImages
(Images.Image[].ImageId, ImageName, OSName, CreationTime), DescribeAvailableResource (as
tests/infra/where/test_live_alicloud.py builds it from Alibaba's sample). RunInstances with
DryRun answers the DryRunOperation error code (the SDK's RunInstancesRequest.DryRun); the
HTTP status of that answer is not documented there: 400 here, which the SDK raises like any
error. A denied action answers 403 Forbidden.RAM with the message of Alibaba's
announcement of the ECS authentication change (read 2026-12-05). STS GetCallerIdentity
answers the members of alibabacloud_sts20150401's GetCallerIdentityResponseBody
(aliyun/alibabacloud-python-sdk sts-20150401 at 1d271f4c, read 2026-12-05; that SDK is not
installed here, so STS_FIELDS below is copied from it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.infra.where.fakes import serving
from tests.support.alicloud_models import unknown_params

STS_FIELDS = ("AccountId", "Arn", "IdentityType", "PrincipalId", "RequestId", "RoleId", "UserId")
TYPE = "ecs.gn6i-c4g1.xlarge"
DENIED_MESSAGE = (
    "User not authorized to operate on the specified resource, or this API doesn't support RAM."
)


def item(name: str, value: str) -> dict[str, Any]:
    return {"AttributeName": name, "AttributeValues": {"ValueItem": [{"Value": value}]}}


def zone(zone_id: str, itype: str, status: str, category: str) -> dict[str, Any]:
    return {
        "Status": status,
        "RegionId": "cn-shanghai",
        "ZoneId": zone_id,
        "StatusCategory": category,
        "AvailableResources": {
            "AvailableResource": [
                {
                    "Type": "InstanceType",
                    "SupportedResources": {
                        "SupportedResource": [
                            {"Status": status, "Value": itype, "StatusCategory": category}
                        ]
                    },
                }
            ]
        },
    }


@dataclass
class AlicloudFake:
    attributes: dict[str, str] = field(
        default_factory=lambda: {
            "max-postpaid-instance-vcpu-count": "500",
            "used-postpaid-instance-vcpu-count": "0",
            "max-spot-instance-vcpu-count": "500",
            "used-spot-instance-vcpu-count": "0",
        }
    )
    images: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {
                "ImageId": "ubuntu_22_04_x64_20G_alibase_20241016.vhd",
                "ImageName": "ubuntu_22_04_x64_20G_alibase_20241016.vhd",
                "OSName": "Ubuntu  22.04 64位",
                "CreationTime": "2024-10-16T08:00:00Z",
            }
        ]
    )
    zones: list[dict[str, Any]] = field(
        default_factory=lambda: [zone("cn-shanghai-l", TYPE, "Available", "WithStock")]
    )
    denied: set[str] = field(default_factory=set)
    seen: list[dict[str, Any]] = field(default_factory=list)
    endpoint: str = ""

    def answer(
        self, method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        from alibabacloud_ecs20140526 import models

        if "authorization" not in headers:
            return 400, {"Code": "MissingAuthorization", "Message": "unsigned"}
        action = headers.get("x-acs-action", "")
        if action in self.denied:
            return 403, {"Code": "Forbidden.RAM", "Message": DENIED_MESSAGE, "RequestId": "f"}
        if action == "GetCallerIdentity":
            return 200, {
                "AccountId": "1234567890123456",
                "Arn": "acs:ram::1234567890123456:user/ada",
                "IdentityType": "RamUser",
                "PrincipalId": "200000000000000001",
                "RequestId": "fake",
                "UserId": "200000000000000001",
            }
        model = getattr(models, f"{action}Request", None)
        if model is None:
            return 400, {"Code": "InvalidAction.NotFound", "Message": action}
        wrong = unknown_params(model, q)
        if wrong:
            return 400, {"Code": "InvalidParameter", "Message": f"unknown {wrong}"}
        if action == "DescribeAccountAttributes":
            asked = [v for k, v in q.items() if k.startswith("AttributeName")]
            rows = [item(n, self.attributes[n]) for n in asked if n in self.attributes]
            return 200, {"AccountAttributeItems": {"AccountAttributeItem": rows}, "RequestId": "f"}
        if action == "DescribeImages":
            return 200, {
                "Images": {"Image": self.images},
                "TotalCount": len(self.images),
                "RequestId": "f",
            }
        if action == "DescribeAvailableResource":
            return 200, {"AvailableZones": {"AvailableZone": self.zones}, "RequestId": "f"}
        if action == "RunInstances" and q.get("DryRun", "").lower() == "true":  # SDK: True
            return 400, {
                "Code": "DryRunOperation",
                "Message": "Request validation has been passed with DryRun flag set.",
                "RequestId": "f",
            }
        return 400, {"Code": "UnsupportedOperation", "Message": action}

    @contextmanager
    def running(self) -> Iterator[AlicloudFake]:
        with serving(self.answer) as (endpoint, seen):
            self.endpoint, self.seen = endpoint, seen
            yield self
