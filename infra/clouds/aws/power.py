"""EC2 start and stop for ``fab start`` / ``fab stop`` (the contract: infra/clouds/power.py).

The reaper's client (its bounded retries, boto3's own credential chain): DescribeInstances
filtered by ``instance-id`` (an unknown id is left out, not an error for the whole call),
StartInstances, and the reaper's StopInstances. A stop releases EC2's public IPv4 unless
it is an Elastic IP, so describe reports the address the node has now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.clouds.aws.reaper import AwsCloud, _error_text, parse_instance
from infra.clouds.power import NodePower

MAX_PAGES = 20  # the stack's nodes fit one page; more is a paging loop
# What the laptop's credentials need for fab start / fab stop (SECURITY.md section 2).
LAPTOP_ACTIONS = ("ec2:DescribeInstances", "ec2:StartInstances", "ec2:StopInstances")


def connect(region: str, stack: str, env: Mapping[str, str], endpoint: str | None) -> AwsPower:
    del stack, env  # boto3 reads its own credentials; the ids come from the stack
    return AwsPower(AwsCloud(region, endpoint_url=endpoint, max_attempts=4))


class AwsPower:
    def __init__(self, cloud: AwsCloud) -> None:
        self.cloud = cloud

    def describe(self, ids: Sequence[str]) -> dict[str, NodePower]:
        pages = (
            self.cloud.client("ec2")
            .get_paginator("describe_instances")
            .paginate(
                Filters=[{"Name": "instance-id", "Values": list(ids)}],
                PaginationConfig={"MaxItems": 1000, "PageSize": 1000},
            )
        )
        found: dict[str, NodePower] = {}
        for n, page in enumerate(pages):
            if n >= MAX_PAGES:
                raise RuntimeError(f"DescribeInstances paged past {MAX_PAGES} pages")
            for reservation in page.get("Reservations") or []:
                for raw in reservation.get("Instances") or []:
                    found[str(raw.get("InstanceId"))] = _node(raw)
        return found

    def start(self, ids: Sequence[str]) -> dict[str, str]:
        try:
            answer = self.cloud.client("ec2").start_instances(InstanceIds=list(ids))
        except Exception as exc:  # the call as a whole was refused: every id with it
            return {iid: _error_text(exc) for iid in ids}
        started = {s.get("InstanceId") for s in answer.get("StartingInstances") or []}
        return {i: "not in the StartInstances answer" for i in ids if i not in started}

    def stop(self, ids: Sequence[str]) -> dict[str, str]:
        return dict(self.cloud.stop(ids).failed)


def _node(raw: dict[str, Any]) -> NodePower:
    return NodePower(
        parse_instance(raw),
        public_ip=raw.get("PublicIpAddress") or None,
        private_ip=raw.get("PrivateIpAddress") or None,
    )
