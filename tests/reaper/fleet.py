"""A managed fleet on a moto server: every case the reaper must tell apart, >= 2,000 instances.

moto cannot launch an instance in the past, so the fleet ages its instances by writing
``launch_time`` in the in-process moto backend (the server runs in this process). Metrics
are put through the real CloudWatch API with timestamps relative to the same clock.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import boto3

from gpufleet_node.fleet_names import DIMENSION, METRIC_GPU_UTIL, METRIC_HEARTBEAT, NAMESPACE
from gpufleet_node.idle_rules import UTC, format_utc
from infra.reaper import tags as T

ACCOUNT = "123456789012"
REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's built-in AMIs


def client(service: str, url: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@dataclass(frozen=True)
class Case:
    """One kind of instance: how it looks and what the reaper must do with it."""

    name: str
    expect: str  # "stop" | "keep" | "absent" (never in the decisions)
    age_min: float = 180  # minutes since launch
    heartbeat_min: float | None = None  # minutes ago; None = no heartbeat datapoint
    util: float | None = None  # the GPU utilization datapoint (at the heartbeat time)
    tags: dict[str, str] = field(default_factory=dict)
    spot: bool = False
    stopped: bool = False
    disable_api_stop: bool = False
    managed: bool = True


def cases(now: datetime) -> list[Case]:
    lease = format_utc(now + timedelta(hours=2))
    return [
        Case("busy", "keep", heartbeat_min=1, util=93),
        Case("idle-watchdog-alive", "keep", heartbeat_min=2, util=0),
        Case("stale-heartbeat-idle", "stop", heartbeat_min=40, util=2),
        # Silent 17 min: under stale (10) + tolerated skew (15), so still alive.
        Case("recently-silent", "keep", heartbeat_min=17, util=2),
        # Never a heartbeat: no evidence either way, kept (unknown) until the TTL.
        Case("watchdog-gone-long-ago", "keep"),
        Case("stale-heartbeat-but-gpu-busy", "keep", heartbeat_min=30, util=95),
        Case("no-metrics-yet", "keep", age_min=10),
        Case("lease-in-the-future", "keep", tags={T.KEEP_ALIVE_UNTIL: lease}),
        Case("protected", "keep", tags={T.PROTECTED: "true"}),
        Case(
            "ttl-expired-while-busy",
            "stop",
            age_min=13 * 60,
            heartbeat_min=1,
            util=99,
            tags={T.TTL_HOURS: "12"},
        ),
        Case(
            "ttl-opted-out",
            "keep",
            age_min=30 * 60,
            heartbeat_min=1,
            util=99,
            tags={T.TTL_HOURS: "off"},
        ),
        Case("spot-idle", "stop", spot=True, heartbeat_min=40, util=0),
        Case("spot-busy", "keep", spot=True, heartbeat_min=1, util=70),
        Case("already-stopped", "keep", stopped=True),
        Case("untagged", "absent", managed=False),
        Case("watchdog-off", "keep", tags={T.WATCHDOG: "off"}),
    ]


# Per stack: (tier, ttl, how many of each case). x8 tier: 12 h TTL, 15 idle minutes.
STACKS = {"alpha": ("a100x8", "12", 80), "beta": ("t4x1", "24", 40), "gamma": ("h100x8", "12", 16)}
HEADS_PER_STACK = 2  # a head and a worker that are both idle: the worker must stop first
REFUSED = 3  # idle instances with DisableApiStop: AWS refuses to stop them


@dataclass
class Fleet:
    url: str
    now: datetime
    expected: dict[str, str]  # instance id -> stop | keep | absent (stack "alpha" view)
    stack_of: dict[str, str]
    case_of: dict[str, str]
    role_of: dict[str, str]
    refused: set[str]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expected_for(self, stack: str | None) -> dict[str, str]:
        """What the reaper must decide when scanning ``stack`` (None: every stack)."""
        out = {}
        for iid, want in self.expected.items():
            if want == "absent":
                continue
            if stack is not None and self.stack_of[iid] != stack:
                continue
            out[iid] = want
        return out

    def refused_in(self, stack: str) -> set[str]:
        return {i for i in self.refused if self.stack_of[i] == stack}

    def stop_ids(self, stack: str | None) -> set[str]:
        return {i for i, w in self.expected_for(stack).items() if w == "stop"}


def speed_up_moto_tags() -> Callable[[], None]:
    """Make moto's per-resource tag lookup O(1) instead of a scan of every tag in the region.

    moto answers ``get_tags`` for one instance by filtering all tags with regexes, which makes
    describing N instances O(N^2) (about 25 s for 2,000 here). The replacement returns the
    same records from the same store. Returns the undo.
    """
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    original = TaggedEC2Resource.get_tags

    def get_tags(self: Any) -> list[dict[str, str]]:
        if not self.id:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "")
        return [
            {"resource_id": self.id, "key": k, "value": v, "resource_type": kind}
            for k, v in self.ec2_backend.tags.get(self.id, {}).items()
        ]

    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]

    def undo() -> None:
        TaggedEC2Resource.get_tags = original  # type: ignore[method-assign]

    return undo


def moto_get_metric_data() -> Any:
    """moto's own GetMetricData, under any speed-up installed."""
    from moto.cloudwatch.models import CloudWatchBackend

    current = CloudWatchBackend.get_metric_data
    while hasattr(current, "__wrapped__"):
        current = current.__wrapped__
    return current


def speed_up_moto_metrics() -> Callable[[], None]:
    """Make moto's GetMetricData index the datapoints by metric instead of rescanning them.

    moto filters every datapoint of the region once per query and per period bucket, so 500
    per-minute queries over an hour against a 2,000-node fleet take minutes. The replacement
    gives the same answer (same buckets from StartTime, same statistics through moto's own
    Statistics class, same order) for MetricStat queries; anything else goes to moto's.
    Returns the undo.
    """
    from moto.cloudwatch.models import CloudWatchBackend, Statistics

    original = moto_get_metric_data()

    def get_metric_data(
        self: Any,
        queries: list[dict[str, Any]],
        start_time: datetime,
        end_time: datetime,
        scan_by: str = "TimestampAscending",
    ) -> list[dict[str, Any]]:
        if any("MetricStat" not in q for q in queries) or start_time >= end_time:
            return original(self, queries, start_time, end_time, scan_by)
        start = start_time.replace(microsecond=0)
        end = end_time.replace(microsecond=0)
        index: dict[tuple[Any, ...], list[Any]] = {}
        for md in self.get_all_metrics():
            if start <= md.timestamp < end:
                dims = tuple(sorted((d.name, d.value) for d in md.dimensions))
                index.setdefault((md.namespace, md.name, dims), []).append(md)
        out = []
        for query in queries:
            stat = query["MetricStat"]
            metric = stat["Metric"]
            dims = tuple(sorted((d["Name"], d["Value"]) for d in metric.get("Dimensions", [])))
            period = int(stat["Period"])
            unit = stat.get("Unit")
            buckets: dict[int, list[Any]] = {}
            for md in index.get((metric["Namespace"], metric["MetricName"], dims), []):
                if unit and md.unit != unit:
                    continue
                slot = int((md.timestamp - start).total_seconds()) // period
                if start + timedelta(seconds=slot * period) <= end:
                    buckets.setdefault(slot, []).append(md)
            stamps, values = [], []
            for slot in sorted(buckets):
                stats = Statistics([stat["Stat"]], start + timedelta(seconds=slot * period))
                stats.metric_data = buckets[slot]
                values.append(stats.get_statistics_for_type(stat["Stat"]))
                stamps.append(stats.timestamp)
            if scan_by == "TimestampDescending":
                stamps.reverse()
                values.reverse()
            if query.get("ReturnData", True):
                out.append(
                    {
                        "id": query["Id"],
                        "label": query.get("Label") or f"{metric['MetricName']} {stat['Stat']}",
                        "values": values,
                        "timestamps": stamps,
                        "status_code": "Complete",
                    }
                )
        return out

    get_metric_data.__wrapped__ = original  # type: ignore[attr-defined]
    CloudWatchBackend.get_metric_data = get_metric_data  # type: ignore[method-assign]

    def undo() -> None:
        CloudWatchBackend.get_metric_data = original  # type: ignore[method-assign]

    return undo


def moto_describe_images() -> Any:
    """moto's own DescribeImages, under any speed-up installed."""
    from moto.ec2.models.amis import AmiBackend

    current = AmiBackend.describe_images
    while hasattr(current, "__wrapped__"):
        current = current.__wrapped__
    return current


_WILDCARDS = frozenset("*?[")


def speed_up_moto_images() -> Callable[[], None]:
    """Make moto's lookup of one image by its id a dict read instead of a filter scan.

    Every instance moto launches looks its AMI up with ``describe_images(filters={"image-id":
    id})``, which fnmatches the id against each of moto's ~1,300 built-in images: 80% of
    moto's time launching 500 instances (7.8 of 9.7 s profiled here, 2026-12-02). Without
    wildcards that filter is an exact match on the key ``amis`` is stored under, so the
    replacement returns the same image (or none); every other call goes to moto's own.
    Returns the undo.
    """
    from moto.ec2.models.amis import AmiBackend

    original = moto_describe_images()

    def describe_images(
        self: Any,
        ami_ids: list[str] | None = None,
        filters: dict[str, Any] | None = None,
        exec_users: list[str] | None = None,
        owners: list[str] | None = None,
    ) -> list[Any]:
        wanted = (filters or {}).get("image-id")
        if (
            not ami_ids
            and not exec_users
            and not owners
            and filters is not None
            and len(filters) == 1
            and isinstance(wanted, str)
            and not _WILDCARDS & set(wanted)
        ):
            found = self.amis.get(wanted)
            return [found] if found is not None and found.id == wanted else []
        return original(self, ami_ids, filters, exec_users, owners)

    describe_images.__wrapped__ = original  # type: ignore[attr-defined]
    AmiBackend.describe_images = describe_images  # type: ignore[method-assign]

    def undo() -> None:
        AmiBackend.describe_images = original  # type: ignore[method-assign]

    return undo


def speed_up_moto_instances() -> Callable[[], None]:
    """Make moto's ``get_instance`` walk its reservations instead of copying them first.

    moto finds one instance by copying every reservation (``all_reservations``) and testing
    each instance against no filter; launching, stopping or starting N instances calls it N
    times. The replacement walks the same reservations in the same order and returns the
    same first instance with that id, or raises moto's own error. Returns the undo.
    """
    from moto.ec2.exceptions import InvalidInstanceIdError
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.get_instance

    def get_instance(self: Any, instance_id: str) -> Any:
        for reservation in list(self.reservations.values()):
            for instance in reservation.instances:
                if instance.id == instance_id:
                    return instance
        raise InvalidInstanceIdError(instance_id)

    InstanceBackend.get_instance = get_instance  # type: ignore[method-assign]

    def undo() -> None:
        InstanceBackend.get_instance = original  # type: ignore[method-assign]

    return undo


def speed_up_moto() -> Callable[[], None]:
    """The speed-ups above; returns one undo."""
    undos = [
        speed_up_moto_tags(),
        speed_up_moto_metrics(),
        speed_up_moto_images(),
        speed_up_moto_instances(),
    ]

    def undo() -> None:
        for one in reversed(undos):
            one()

    return undo


def states() -> dict[str, str]:
    """Every instance's state, read from the in-process backend (no API call to count)."""
    return {i.id: i.state for r in _ec2_backend().all_reservations() for i in r.instances}


def _ec2_backend(region: str = REGION) -> Any:
    from moto.backends import get_backend

    return get_backend("ec2")[ACCOUNT][region]


def age(instance_ids: list[str], minutes: float, now: datetime) -> None:
    backend = _ec2_backend()
    launched = (now - timedelta(minutes=minutes)).astimezone(UTC).replace(tzinfo=None)
    wanted = set(instance_ids)
    for reservation in backend.reservations.values():  # one pass, not one scan per id
        for instance in reservation.instances:
            if instance.id in wanted:
                instance.launch_time = launched


def launch_kwargs(case: Case, tags: dict[str, str], region: str = REGION) -> dict[str, Any]:
    """What moto's RunInstances handler passes its backend for the fleet's instances.

    Mirrors moto 5.2.5's ``InstanceResponse.run_instances`` (moto/ec2/responses/
    instances.py) for ImageId, InstanceType, MinCount = MaxCount, TagSpecifications,
    InstanceMarketOptions and DisableApiStop, every other parameter absent (and the
    ClientToken botocore makes up);
    tests/reaper/test_fleet_tools.py holds the two to the same DescribeInstances answer.
    """
    return {
        "instance_type": "p4d.24xlarge",
        "is_instance_type_default": False,
        "placement": None,
        "placement_hostid": None,
        "region_name": region,
        "subnet_id": None,
        "key_name": None,
        "security_group_ids": [],
        "nics": [],
        "private_ip": None,
        "associate_public_ip": None,
        "tags": {"instance": dict(tags)} if tags else {},
        "ebs_optimized": False,
        "disable_api_stop": case.disable_api_stop,
        "instance_market_options": "spot" if case.spot else {},
        "instance_initiated_shutdown_behavior": None,
        "launch_template": {},
        "hibernation_options": {},
        "iam_instance_profile_name": None,
        "iam_instance_profile_arn": None,
        "monitoring_state": "disabled",
        "ipv6_address_count": None,
        "metadata_options": {},
        "client_token": str(uuid.uuid4()),  # what botocore fills in when none is given
    }


def launch(count: int, tags: dict[str, str], case: Case, region: str = REGION) -> list[str]:
    """``count`` instances of ``case``, made by moto's own backend in this process.

    The RunInstances API would do the same through HTTP, but its answer (every instance,
    rendered as XML by moto, parsed by botocore) was most of the fleet's build time; the
    reaper under test still reads the fleet only through the API.
    """
    backend, ids = _ec2_backend(region), []
    for start in range(0, count, 500):  # RunInstances' batches: one reservation per 500
        n = min(count - start, 500)
        made = backend.run_instances(AMI, n, None, [], **launch_kwargs(case, tags, region))
        ids += [i.id for i in made.instances]
    return ids


def _metric_data(iid: str, case: Case, now: datetime) -> Iterator[dict[str, Any]]:
    if case.heartbeat_min is None:
        return
    at = now - timedelta(minutes=case.heartbeat_min)
    dims = [{"Name": DIMENSION, "Value": iid}]
    yield {
        "MetricName": METRIC_HEARTBEAT,
        "Dimensions": dims,
        "Timestamp": at,
        "Value": float(int(at.timestamp())),
    }
    if case.util is not None:
        yield {
            "MetricName": METRIC_GPU_UTIL,
            "Dimensions": dims,
            "Timestamp": at,
            "Value": case.util,
            "Unit": "Percent",
        }


def build_fleet(url: str, *, scale: int = 1) -> Fleet:
    """Launch the fleet on a fresh moto state; ``scale`` multiplies every case count."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST")).read()
    ec2 = client("ec2", url)
    cw = client("cloudwatch", url)
    now = datetime.now(UTC)
    expected: dict[str, str] = {}
    stack_of: dict[str, str] = {}
    case_of: dict[str, str] = {}
    role_of: dict[str, str] = {}
    refused: set[str] = set()
    data: list[dict[str, Any]] = []
    to_stop_now: list[str] = []
    for stack, (tier, ttl, per_case) in STACKS.items():
        base = {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: stack, T.TIER: tier, T.TTL_HOURS: ttl}
        base[T.ROLE] = "worker"
        specials = [
            Case("idle-head", "stop", heartbeat_min=40, util=0, tags={T.ROLE: "head"}),
            Case("idle-worker", "stop", heartbeat_min=40, util=0),
            Case("refuses-stop", "stop", heartbeat_min=40, util=0, disable_api_stop=True),
        ]
        counts = [(c, per_case * scale) for c in cases(now)]
        counts += [(specials[0], 1), (specials[1], 1), (specials[2], REFUSED)]
        for case, count in counts:
            tags = {**base, **case.tags} if case.managed else {"Name": f"{stack}-hand-made"}
            ids = launch(count, tags, case)
            age(ids, case.age_min, now)
            for iid in ids:
                expected[iid] = case.expect
                stack_of[iid] = stack if case.managed else ""
                case_of[iid] = case.name
                role_of[iid] = tags.get(T.ROLE, "")
                data.extend(_metric_data(iid, case, now))
                if case.disable_api_stop:
                    refused.add(iid)
            if case.stopped:
                to_stop_now += ids
    for start in range(0, len(to_stop_now), 500):
        ec2.stop_instances(InstanceIds=to_stop_now[start : start + 500])
    random.Random(7).shuffle(data)  # metrics arrive in no particular order
    for start in range(0, len(data), 1000):
        cw.put_metric_data(Namespace=NAMESPACE, MetricData=data[start : start + 1000])
    return Fleet(url, now, expected, stack_of, case_of, role_of, refused)


def restart(fleet: Fleet, instance_ids: list[str]) -> None:
    """Undo a test's stops: start them again, with their old launch times."""
    if not instance_ids:
        return
    ec2 = client("ec2", fleet.url)
    for start in range(0, len(instance_ids), 500):
        ec2.start_instances(InstanceIds=instance_ids[start : start + 500])
    by_case: dict[str, list[str]] = {}
    for iid in instance_ids:
        by_case.setdefault(fleet.case_of[iid], []).append(iid)
    ages = {c.name: c.age_min for c in cases(fleet.now)}
    ages.update({"idle-head": 180, "idle-worker": 180, "refuses-stop": 180})
    for name, ids in by_case.items():
        age(ids, ages[name], fleet.now)
