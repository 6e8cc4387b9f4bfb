"""What the guardrails read, shared by the pack's rules and each cloud's own rules.

A :class:`Resource` is one declared resource as plain data (type token, logical name,
inputs in the engine's camelCase), the same whether the engine handed it over
(``policy/pack.py``) or Pulumi's mocks recorded it (``policy/plan_check.py``). This module
knows no cloud: policy/rules.py and every infra/clouds/<name>/rules.py import it, and
it imports neither, so the cloud folders can hold their policy facts without a circle.
:class:`CloudFacts` is what such a rules.py declares.

During a preview some inputs are not known yet (an id the cloud assigns, a JSON document
built from one). They arrive as :data:`UNKNOWN`; a rule never reports a value it cannot
see, because the engine runs the policies again with the real values before it creates
anything (resource policies) and after the update (stack policies).

Resources refer to one another (a bucket policy names its bucket). :func:`refers_to`
answers "does this input point at that resource?" from the engine's property
dependencies when there are any, else from the identifiers the target is known by (id,
ARN, name).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config import SSH_MIN_PREFIX


class _Unknown:
    """A value the engine does not know yet (preview); compares unequal to everything."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown during preview>"


UNKNOWN: Any = _Unknown()


def known(value: Any) -> bool:
    return value is not UNKNOWN


@dataclass(frozen=True)
class Resource:
    """One declared resource, as the engine sends it to a policy pack."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    urn: str = ""
    # What other resources may use to point at this one: id, ARN, physical name.
    ids: frozenset[str] = frozenset()
    # Input key -> keys (see `key`) of the resources that input was computed from.
    deps: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.urn or f"{self.type}::{self.name}"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.type})"

    def get(self, *path: str | int) -> Any:
        """Nested input lookup: None when absent, UNKNOWN when not known yet."""
        value: Any = self.inputs
        for step in path:
            if value is UNKNOWN:
                return UNKNOWN
            if isinstance(step, int):
                if not isinstance(value, list | tuple) or step >= len(value):
                    return None
                value = value[step]
            else:
                if not isinstance(value, Mapping):
                    return None
                value = value.get(step)
        return value

    @property
    def tags(self) -> Mapping[str, Any]:
        tags = self.inputs.get("tags")
        return tags if isinstance(tags, Mapping) else {}


# A stack rule's finding: the offending resource (None: the stack as a whole), the message.
StackFinding = tuple[Resource | None, str]


def refers_to(source: Resource, prop: str, target: Resource) -> bool:
    """Whether `source.inputs[prop]` points at `target`."""
    if target.key in source.deps.get(prop, frozenset()):
        return True
    value = source.inputs.get(prop)
    return isinstance(value, str) and value in target.ids


def attached(
    resources: Sequence[Resource], types: Iterable[str], bucket: Resource
) -> list[Resource]:
    """The resources of ``types`` whose ``bucket`` input points at ``bucket``."""
    types = tuple(types)
    return [r for r in resources if r.type in types and refers_to(r, "bucket", bucket)]


def mapping_at(r: Resource, *path: str) -> Mapping[str, Any] | None:
    """The input at ``path`` as a mapping ({} when absent or not one); None when it is not
    known yet (a function's environment during a preview)."""
    value = r.get(*path)
    if not known(value):
        return None
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    if value is None or value is UNKNOWN:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def is_true(value: Any) -> bool:
    """True for a boolean true, and for "true": some SDK fields are typed as strings."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def unencrypted(value: Any) -> bool:
    """A known encryption flag that is not on (a flag not known yet is not reported)."""
    return known(value) and not is_true(value)


def positive(value: Any) -> float | None:
    """``value`` as a finite number above zero (a price cap, a ceiling), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def prepaid_months(period: Any) -> int:
    """A subscription's prepaid period: a known count above zero, else 1 (a period not
    known yet, or none, bills as the shortest one)."""
    return int(period) if isinstance(period, int | float) and period > 0 else 1


@dataclass(frozen=True)
class Bill:
    """How one instance is paid for, read from its inputs."""

    provider: str
    instance_type: str
    billing: str  # on-demand | spot | subscription
    spot_max_price: float | None = None
    months: int = 1


# ---------------------------------------------------------------------------- SSH to world

SSH_PORT = 22
SSH_FIX = (
    "list only your own networks (gpufleet:sshCidrs, e.g. 203.0.113.7/32) or reach the node "
    "through a bastion/VPN"
)


def world(cidr: Any) -> bool:
    """0.0.0.0/0, ::/0, and anything as absurdly broad (0.0.0.0/1 is half the internet): the
    same per-network bound the config parser applies (infra.config.SSH_MIN_PREFIX)."""
    if not isinstance(cidr, str):
        return False
    try:
        net = ipaddress.ip_network(cidr.strip(), strict=False)
    except ValueError:
        return False
    return net.prefixlen < SSH_MIN_PREFIX[net.version]


def _protocol(value: Any) -> str:
    text = str(value).strip().lower() if value is not None else ""
    return {"6": "tcp", "-1": "all", "all": "all"}.get(text, text)


def covers_ssh(protocol: Any, from_port: Any, to_port: Any) -> bool:
    """Whether a rule for ``protocol`` (a name, an IANA number, -1 or all) from
    ``from_port`` to ``to_port`` (-1 to -1: every port) lets SSH through."""
    proto = _protocol(protocol)
    if proto == "all":
        return True  # every protocol means every port
    if proto != "tcp":
        return False
    try:
        low, high = int(from_port), int(to_port)
    except (TypeError, ValueError):
        return False
    return (low == -1 and high == -1) or low <= SSH_PORT <= high


# ---------------------------------------------------------------------------------- IMDSv2


def imds_tokens_problem(r: Resource, endpoint: Any, tokens: Any, fix: str) -> list[str]:
    """The finding for an instance whose metadata service still answers without a
    session token (IMDSv1); none while either setting is unknown."""
    if not known(endpoint) or not known(tokens) or endpoint == "disabled":
        return []  # a disabled metadata service has no IMDSv1 either
    if tokens != "required":
        shown = "not set (IMDSv1 allowed)" if tokens is None else repr(tokens)
        return [f"{r.label}: metadata httpTokens is {shown}; {fix}"]
    return []


# ------------------------------------------------------------------------------- buckets


@dataclass(frozen=True)
class BucketKind:
    """How one cloud spells "private and TLS-only" for its buckets."""

    service: str  # action prefix in bucket policies
    block_type: str
    block_flags: tuple[str, ...]  # every one must be true
    block_fix: str
    policy_type: str
    policy_fix: str
    tls_key: str  # the condition key that is false on plain HTTP
    acl_types: tuple[str, ...]
    # A cloud with no public-access-block resource (COS): the bucket's own ACL must be this.
    required_acl: str | None = None
    # the Boolean operator: IAM and RAM "Bool", CAM "bool_equal" (598/58420)
    tls_operator: str = "Bool"
    # A statement's Principal as a map: the key that names accounts (IAM "AWS", RAM "RAM",
    # CAM "qcs"); and the principals that mean everyone.
    principal_key: str = ""
    anyone: tuple[str, ...] = ("*",)


# ---------------------------------------------------------------------- one cloud's facts

Check = Callable[[Resource], list[str]]
StackCheck = Callable[[Sequence[Resource], Resource], list[StackFinding]]


def no_findings(r: Resource) -> list[str]:
    return []


def no_stack_findings(resources: Sequence[Resource], r: Resource) -> list[StackFinding]:
    return []


def no_env(fn: Resource) -> Mapping[str, Any] | None:
    return {}


def never_scheduled(resources: Sequence[Resource], fn: Resource) -> bool:
    return False


@dataclass(frozen=True)
class CloudFacts:
    """What the policy pack needs to know about one cloud's resource types: each cloud's
    infra/clouds/<name>/rules.py declares one as ``FACTS``, and the rules ask the cloud
    whose ``package`` begins a resource's type token. Every check is handed resources of
    any of the cloud's types and answers for the ones it knows; a cloud leaves out what it
    has no resource for."""

    name: str  # the catalog's name for the cloud
    package: str  # the type tokens' package: "aws" in aws:ec2/instance:Instance
    # instance type token -> the path of the input that holds its size
    instances: Mapping[str, tuple[str, ...]]
    bill: Callable[[Resource, str], Bill]  # (an instance, its size) -> how it is paid
    guard_fix: str  # how to declare the scheduled reaper this cloud's GPU nodes need
    guard_functions: tuple[str, ...] = ()  # the reaper's function types
    guard_env: Callable[[Resource], Mapping[str, Any] | None] = no_env  # None: unknown yet
    guard_scheduled: Callable[[Sequence[Resource], Resource], bool] = never_scheduled
    ssh: Check = no_findings  # SSH open to the world
    imdsv2: Check = no_findings  # a metadata service that answers without a token
    disks: Check = no_findings  # unencrypted disks
    stop_alarms: Check = no_findings  # alarms that stop instances blindly
    bucket_encryption: StackCheck = no_stack_findings  # a bucket without default encryption
    storage: StackCheck = no_stack_findings  # storage that is private by its own properties
    bucket_kinds: Mapping[str, BucketKind] = field(default_factory=dict)
    # types that other resources name by one of their own inputs, besides id/ARN/name
    own_names: Mapping[str, str] = field(default_factory=dict)
