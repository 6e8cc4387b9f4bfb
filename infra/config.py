"""StackConfig: the `gpufleet:*` stack configuration, read once, typed, frozen and validated.

Every problem is collected and reported together, each with its key and, for names, a
did-you-mean, before any resource is declared. The parser takes a plain mapping, so the same
code serves `pulumi up` (the engine's config bag), `scripts/plan.py` (a stack YAML file),
cost.py and the tests. No provider SDK and no Pulumi import here.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from infra import limits
from infra.catalog import (
    PROFILES,
    Catalog,
    Feature,
    ProviderInfo,
    UnavailableError,
    load_catalog,
    provider_names,
)
from infra.pricing.billing_modes import BILLING_MODES, SUBSCRIPTION_MONTHS, billing_problem
from infra.reaper import tags as T
from infra.suggest import did_you_mean

if TYPE_CHECKING:
    from infra.placement import Placement

NAMESPACE = "gpufleet"
MIN_ROOT_DISK_GB = 100  # driver + CUDA + PyTorch + pip/HF caches outgrow anything smaller
MAX_NODES = 64
WORLD = ("0.0.0.0/0", "::/0")
# Upper bounds: a value past these is a typo or a unit mix-up (minutes for hours), and some
# would break later (a tag of 1e12 minutes, a disk the cloud refuses); docs/configuration.md
# mirrors them. The per-cloud ones (root disk, scratch classes and their sizes) are each
# provider's catalog facts ([provider] in infra/clouds/<cloud>/catalog.toml).
MAX_IDLE_MINUTES = 1440  # a day: longer is no idle guard (use a lease: fab keep-alive)
# 14 days, what the guards read (gpufleet_node/idle_rules.py MAX_TTL_HOURS): a longer tag is
# unreadable to them; 0 turns the TTL off explicitly
MAX_TTL_HOURS = 336
MAX_ARCHIVE_DAYS = 3650
MAX_PRICE = 100_000.0  # per node-hour or per stack-hour, in the provider's currency
# SSH sources: no single network broader than these prefixes, and all of them together at
# most 1/64 of the address family (four IPv4 /8s): wider is "the internet" in pieces.
SSH_MIN_PREFIX = {4: 8, 6: 32}
SSH_MAX_SHARE_BITS = 6
# Where scratch may be mounted: a fresh directory under one of these (or one of them).
SCRATCH_ROOTS = ("/scratch", "/mnt", "/data", "/nvme", "/local", "/workspace")
# Tag keys gpufleet keeps for itself (compared in lower case), refused in a stack's tags.
# Each cloud's own refused key prefixes and its longest tag value are its limits.toml facts
# ([tags]); a stack's tags are judged against all clouds' (refused_tag_prefixes,
# max_tag_value), so they stay valid on any of them. Value prefixes a cloud refuses are its
# catalog fact (refused_tag_value_prefixes), judged for its own stacks only.
OWN_TAG_PREFIXES = ("gpufleet:",)

# Every key a stack may set, with a one-line meaning (docs/configuration.md mirrors it).
KEYS: Mapping[str, str] = MappingProxyType(
    {
        "provider": "a cloud of the catalog: infra/clouds/<provider>/catalog.toml",
        "tier": "t4x1, a10x1, a100x4, ... (see the catalog)",
        "profile": "general (default) | compute | memory, where the provider has the variant",
        "nodes": "number of GPU nodes (default 1); > 1 makes a cluster",
        "billing": "on-demand (default) | spot | subscription",
        "spotMaxPrice": "spot only: the most to pay per node-hour, in the provider's currency",
        "subscriptionMonths": "subscription only: 1-9, 12, 24 or 36 (where the cloud sells it)",
        "region": "cloud region (default: the provider's price region in the catalog)",
        "zone": "availability zone, or auto (default: the first zone offering the type)",
        "allowedClouds": "zone auto: the clouds to try, in order (default: provider)",
        "allowedRegions": "zone auto: the regions to try, in order (default: region)",
        "allowedTypes": "zone auto: the tier's types to try, in order (default: all)",
        "placement": "zone auto: where `make up` landed (provider/region/zone/type)",
        "sshCidrs": "list of CIDRs allowed to reach SSH (required)",
        "allowWorldSsh": "true to accept 0.0.0.0/0 in sshCidrs (default false)",
        "sshPublicKey": "OpenSSH public key installed for the SSH user (required for up)",
        "rootDiskGb": f"root disk size, >= {MIN_ROOT_DISK_GB} (default 200)",
        "scratchGb": "scratch data disk size where the type has no local NVMe (default 500)",
        "scratchClass": "one of the cloud's scratch_classes in its catalog file (aws: gp3 | io2)",
        "scratchPath": "mount point of the scratch disk(s) on the node (default /scratch)",
        "bucketArchiveDays": "days before bucket objects move to an archive class (default 30)",
        "idleMinutes": "stop after this many idle minutes (default: the tier's, 15 or 30)",
        "ttlHours": "hard limit per run even while busy; 0 turns it off (default 24, 12 for x8)",
        "destroyData": "true lets `pulumi destroy` delete the bucket and its objects",
        "restartReclaimed": "spot: false leaves a reclaimed node stopped (default true)",
        "maxHourlyCost": "refuse plans above this hourly cost for the whole stack",
        "capacityReservation": "launch into this existing capacity reservation (its id)",
        "capacityBlock": "true: capacityReservation is an AWS Capacity Block for ML",
        "tags": "extra tags (a map) on every taggable resource",
    }
)


class ConfigError(ValueError):
    """One or more problems in a stack's configuration; `.problems` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class StackConfig:
    stack: str
    provider: str
    tier: str
    profile: str
    instance_type: str
    nodes: int
    billing: str
    spot_max_price: float | None
    subscription_months: int | None
    region: str
    zone: str | None
    ssh_cidrs: tuple[str, ...]
    ssh_public_key: str | None
    root_disk_gb: int
    scratch_gb: int
    scratch_class: str
    scratch_path: str
    bucket_archive_days: int
    idle_minutes: int
    ttl_hours: int
    destroy_data: bool
    max_hourly_cost: float | None
    tags: Mapping[str, str] = field(default_factory=dict)
    # zone: auto: the candidates and the chosen one (infra/placement.py); None when pinned
    placement: Placement | None = None
    # an existing capacity reservation (block, group, private pool) the nodes launch into
    capacity_reservation: str | None = None
    capacity_block: bool = False
    # spot: the reaper's function starts a reclaimed node again (infra/reaper/recovery.py)
    restart_reclaimed: bool = True

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def _shown(number: float) -> str:
    """A number as the user would write it: whole numbers in full unless astronomically long."""
    if isinstance(number, int) and abs(number) < 10**15:
        return str(number)
    return f"{number:g}"


class _Reader:
    """Pulls typed values out of the raw mapping, recording problems instead of raising."""

    def __init__(self, raw: Mapping[str, Any]):
        self.raw = raw
        self.problems: list[str] = []

    def problem(self, key: str, message: str) -> None:
        # One line per problem (plan.py prints them so): a key from YAML may hold a newline.
        key = str(key)
        shown = key if key.isprintable() else repr(key)[1:-1]
        self.problems.append(f"{NAMESPACE}:{shown}: {message}")

    def has(self, key: str) -> bool:
        return self.raw.get(key) not in (None, "")

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.raw.get(key)
        if value is None or value == "":
            return default
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            self.problem(key, f"expected a string, got {type(value).__name__}")
            return default
        return str(value).strip()

    def choice(self, key: str, options: Iterable[str], default: str | None = None) -> str | None:
        options = list(options)
        value = self.text(key, default)
        if value is None:
            return None
        if value not in options:
            # names are case-blind (`A100x8` is a100x8): take the one option it spells
            folded = [o for o in options if o.casefold() == value.casefold()]
            if len(folded) == 1:
                return folded[0]
            self.problem(
                key,
                f"{value!r} is not one of {', '.join(options)}{did_you_mean(value, options)}",
            )
            return None
        return value

    def number(
        self,
        key: str,
        kind: Callable[[Any], Any],
        default: Any = None,
        minimum: float | None = None,
        maximum: float | None = None,
        why: str = "",
    ) -> Any:
        value = self.raw.get(key)
        if value is None or value == "":
            return default
        word = "a whole number" if kind is int else "a number"
        try:
            if isinstance(value, bool):
                raise ValueError
            if kind is int:
                # "1.5", 1.5, "inf" and 1e400 are not whole numbers (and int(inf) would raise).
                as_float = float(value)
                if not as_float.is_integer():
                    raise ValueError
                parsed = int(as_float)
            else:
                parsed = kind(value)
        except (TypeError, ValueError, OverflowError):
            self.problem(key, f"{value!r} is not {word}")
            return default
        if parsed != parsed or parsed in (float("inf"), float("-inf")):
            self.problem(key, f"{value!r} is not {word}")
            return default
        if minimum is not None and parsed < minimum:
            self.problem(key, f"must be >= {minimum:g}, got {_shown(parsed)}")
            return default
        if maximum is not None and parsed > maximum:
            self.problem(key, f"must be <= {maximum:g}{why}, got {_shown(parsed)}")
            return default
        return parsed

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.raw.get(key)
        if value is None or value == "":
            return default
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "1"):
            return True
        if str(value).lower() in ("false", "no", "0"):
            return False
        self.problem(key, f"{value!r} is not true or false")
        return default

    def structured(self, key: str, kind: type) -> Any:
        """Lists and maps come as YAML values from a stack file, or as JSON text from the engine."""
        value = self.raw.get(key)
        if value is None or value == "":
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                if kind is list:  # a single CIDR given as a plain string
                    return [value]
                self.problem(key, f"expected a {kind.__name__}, got text {value!r}")
                return None
        if not isinstance(value, kind):
            self.problem(key, f"expected a {kind.__name__}, got {type(value).__name__}")
            return None
        return value


_TAG_KEY = re.compile(r"^[\w.:/=+@ -]{1,127}$")
# The stack name becomes host names (<stack>-<i>), bucket and role names: Pulumi allows more
# (upper case, _ and .), which would only fail later, deep inside the program.
_STACK_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,59}")
# OpenSSH public key types (PROTOCOL / RFC 4253 6.6, RFC 5656, RFC 8709, PROTOCOL.u2f) and the
# one thing their blob must say: its own type name first, as an SSH string.
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


AnyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def ssh_exposure_problems(nets: list[AnyNetwork]) -> list[tuple[int | None, str]]:
    """Why these SSH sources amount to "the internet": (index or None for the set, message).

    Refused: a network broader than /8 (IPv6 /32), and a set whose union covers more than
    1/64 of its address family, the whole space split into pieces (0.0.0.0/1 + 128.0.0.0/1)
    included."""
    fix = (
        "list only your own networks (e.g. 203.0.113.7/32); gpufleet:allowWorldSsh true lets "
        "the config through, but the mandatory policy ssh-not-open-to-world still refuses the "
        "plan (exit 3) unless --policy-config disables it"
    )
    found: list[tuple[int | None, str]] = []
    for i, net in enumerate(nets):
        if net.prefixlen == 0:
            found.append((i, f"{net} opens SSH to the whole internet; {fix}"))
        elif net.prefixlen < SSH_MIN_PREFIX[net.version]:
            found.append(
                (
                    i,
                    f"{net} is broader than /{SSH_MIN_PREFIX[net.version]} "
                    f"({net.num_addresses:.3g} addresses): {fix}",
                )
            )
    if found:
        return found
    for version, bits in ((4, 32), (6, 128)):
        family = [n for n in nets if n.version == version]
        union = list(ipaddress.collapse_addresses(family))  # type: ignore[type-var]
        covered = sum(n.num_addresses for n in union)
        if covered >= 2**bits:
            found.append(
                (None, f"the listed IPv{version} networks together cover the whole internet; {fix}")
            )
        elif covered > 2 ** (bits - SSH_MAX_SHARE_BITS):
            found.append(
                (
                    None,
                    f"the listed IPv{version} networks together cover "
                    f"1/{2**bits // covered} of all addresses (at most "
                    f"1/{2**SSH_MAX_SHARE_BITS}): {fix}",
                )
            )
    return found


_PATH_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def scratch_path_problem(path: str) -> str | None:
    """Why `path` may not be the scratch mount point, or None. It must already be in normal
    form (no //, ., .. or trailing /) and lie under one of SCRATCH_ROOTS: mounting over /etc or
    /usr would hide the system, and `/scratch/../etc` is /etc."""
    roots = ", ".join(SCRATCH_ROOTS)
    if not isinstance(path, str) or not path.startswith("/"):
        return f"{path!r} is not an absolute path: use e.g. /scratch (allowed under {roots})"
    parts = path.split("/")[1:]
    normal = "/" + "/".join(p for p in parts if p not in ("", "."))
    if any(p == ".." for p in parts) or normal != path:
        return (
            f"{path!r} is not a plain path (no //, ., .. or trailing /): "
            f"use e.g. /scratch (allowed under {roots})"
        )
    if len(parts) > 4 or not all(_PATH_PART.fullmatch(p) for p in parts):
        return (
            f"{path!r}: at most 4 parts of letters, digits, '.', '_' and '-': "
            f"use e.g. /scratch (allowed under {roots})"
        )
    if not any(path == root or path.startswith(root + "/") for root in SCRATCH_ROOTS):
        return f"{path!r} is not under {roots}: mount scratch there, e.g. /scratch"
    return None


def refused_tag_prefixes() -> tuple[str, ...]:
    """The tag key prefixes no stack may use: gpufleet's, then each cloud's (in the catalog's
    order), each once, in lower case."""
    return tuple(
        dict.fromkeys(OWN_TAG_PREFIXES + limits.refused_tag_key_prefixes(provider_names()))
    )


def max_tag_value() -> int | None:
    """The longest tag value every cloud takes (None: no cloud declares a limit)."""
    return limits.tag_value_max(provider_names())


def tag_text(value: Any) -> str:
    """A tag value as the clouds store it: booleans in lower case, numbers as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def tag_problem(
    key: Any, value: Any, provider: str | None, catalog: Catalog | None = None
) -> str | None:
    """Why `key: value` may not be an extra tag, or None."""
    text_key = str(key)
    lowered = text_key.strip().lower()
    refused_keys = refused_tag_prefixes()
    if lowered.startswith(refused_keys) or lowered == T.MANAGED_BY:
        return (
            f"the key {text_key!r} is reserved (prefixes {', '.join(refused_keys)} in "
            "any letter case, and managed-by, are set by gpufleet or the cloud): rename it"
        )
    if not isinstance(key, str) or not _TAG_KEY.fullmatch(text_key):
        return (
            f"invalid tag key: 1-127 letters, digits, spaces and . : / = + @ _ - (got {text_key!r})"
        )
    info = (catalog or load_catalog()).providers.get(provider or "")
    if info and info.tag_key_chars and not re.fullmatch(f"[{info.tag_key_chars}]+", text_key):
        return (
            f"{info.title} refuses instance tag key {text_key!r}: only letters, digits and "
            f"{info.tag_key_chars.replace('A-Za-z0-9', '').replace(chr(92), '')} (no spaces "
            "or /): rename it"
        )
    if info and text_key in info.refused_tag_keys:
        return f"{info.title} refuses the instance tag key {text_key!r}: rename it"
    if value is None:
        return 'the value is null: give it a text value ("" for an empty tag)'
    if isinstance(value, Mapping | list | tuple | set):
        return f"the value must be text, got a {type(value).__name__}: tags are flat key: value"
    if isinstance(value, float) and not math.isfinite(value):
        return f"the value {value!r} is not a usable number: quote it as text"
    if not isinstance(value, str | int | float):
        return f"the value must be text, got {type(value).__name__}"
    text = tag_text(value)
    longest = max_tag_value()
    if longest is not None and len(text) > longest:
        return f"the value is {len(text)} characters long; at most {longest}"
    if not text.isprintable():
        return "the value holds a newline or control character: one printable line only"
    refused = info.refused_tag_value_prefixes if info else ()
    if refused and text.strip().lower().startswith(refused):
        return (
            f"{info.title if info else provider} refuses tag values starting with "
            f"{', '.join(refused)}: change the value"
        )
    return None


@dataclass(frozen=True)
class _Choice:
    """What the stack rents: cloud, tier, variant and count (the other steps judge against it)."""

    provider: str | None
    tier: str | None
    profile: str
    instance_type: str
    info: ProviderInfo | None
    nodes: int


def _check_names(r: _Reader, raw: Mapping[str, Any], stack: str) -> None:
    """The stack's own name (it becomes host, bucket and role names) and every key's."""
    if not _STACK_NAME.fullmatch(stack):
        suggestion = re.sub(r"[^a-z0-9-]+", "-", stack.lower()).strip("-")[:60] or "my-stack"
        r.problem(
            "stack",
            f"stack name {stack!r} must be 1-60 lower-case letters, digits and hyphens (it "
            f"becomes hostnames, bucket and role names): rename the stack, e.g. {suggestion!r}",
        )
    for key in raw:
        if key not in KEYS:
            valid = "valid keys: see docs/configuration.md"
            r.problem(key, f"unknown key{did_you_mean(key, KEYS)}; {valid}")


def _read_choice(r: _Reader, cat: Catalog) -> _Choice:
    """provider, tier, profile and nodes, and the instance type they resolve to."""
    if not r.has("provider"):
        r.problem("provider", f"required: one of {', '.join(provider_names())}")
    provider = r.choice("provider", provider_names())
    if not r.has("tier"):
        r.problem("tier", f"required: one of {', '.join(cat.tiers)}")
    tier = r.choice("tier", cat.tiers)
    profile = r.choice("profile", PROFILES, "general") or "general"
    instance_type = ""
    if provider and tier:
        try:
            instance_type = cat.resolve(tier, provider, profile).name
        except UnavailableError as exc:
            r.problem("tier", str(exc))
    info = cat.providers[provider] if provider else None
    nodes = r.number("nodes", int, 1, minimum=1, maximum=MAX_NODES, why=" per stack")
    return _Choice(provider, tier, profile, instance_type, info, nodes)


def _read_billing_mode(r: _Reader, cat: Catalog, provider: str | None) -> str:
    """billing, case-blind like every name here, judged by the one billing rule that the
    cost model and the sizing filters also use; on-demand where it is wrong or unset."""
    given = r.text("billing", "on-demand") or "on-demand"
    billing = next((m for m in BILLING_MODES if m.casefold() == given.casefold()), given)
    problem = billing_problem(billing, provider, cat)
    if problem:
        r.problem("billing", problem)
    return billing if billing in BILLING_MODES else "on-demand"


def _read_billing(
    r: _Reader, cat: Catalog, chosen: _Choice
) -> tuple[str, float | None, int | None]:
    """billing, spotMaxPrice and subscriptionMonths: each valid alone, together and on the cloud."""
    info, provider, instance_type = chosen.info, chosen.provider, chosen.instance_type
    billing = _read_billing_mode(r, cat, provider)
    spot_max = r.number("spotMaxPrice", float, None, minimum=0, maximum=MAX_PRICE)
    if spot_max == 0:
        r.problem("spotMaxPrice", "must be above 0; leave it unset to pay up to on-demand")
    months = r.number("subscriptionMonths", int, None, minimum=1)
    if months is not None and months not in SUBSCRIPTION_MONTHS:
        r.problem("subscriptionMonths", f"{months} is not one of {SUBSCRIPTION_MONTHS}")
    if spot_max is not None and billing != "spot":
        r.problem("spotMaxPrice", f"only applies with billing: spot (billing is {billing})")
    if months is not None and billing != "subscription":
        if billing == "spot":
            r.problem("billing", "spot and subscription exclude each other: choose one")
        else:
            r.problem("subscriptionMonths", f"only applies with billing: subscription ({billing})")
    if billing == "subscription" and months is None:
        months = 1
    if billing == "spot" and info and chosen.nodes > 1 and instance_type and provider:
        itype = cat.instance(provider, instance_type)
        if itype.infiniband and not info.supports(Feature.SPOT_INFINIBAND_GROUP):
            r.problem(
                "billing",
                f"spot cannot link {chosen.nodes} {instance_type} nodes over InfiniBand on "
                f"{provider} ({info.unsupported[Feature.SPOT_INFINIBAND_GROUP]}): use "
                "billing: on-demand, or nodes: 1 for spot",
            )
    if billing == "spot" and spot_max is not None and instance_type and provider:
        price = cat.instance(provider, instance_type).price
        if price and spot_max > price.on_demand:
            r.problem(
                "spotMaxPrice",
                f"{spot_max:g} is above the on-demand price {price.on_demand:g} {price.currency}/h "
                f"of {instance_type}: use on-demand billing instead",
            )
    return billing, spot_max, months


def _read_location(r: _Reader, info: ProviderInfo | None) -> tuple[str, str | None]:
    """region (a listed one, or one shaped like a region name) and a zone inside it."""
    region = r.text("region", info.default_region if info else None) or ""
    if region and info and info.regions and region not in info.regions:
        r.problem(
            "region",
            f"{info.title} has no region {region!r}{did_you_mean(region, info.regions)}; "
            f"its regions are {', '.join(info.regions)}",
        )
        region = ""  # a zone cannot be judged against a region that does not exist
    elif (
        region
        and not (info and info.regions)
        and not re.fullmatch(r"[a-z]{2}(-[a-z0-9]+)+", region)
    ):
        # the shape rule is for clouds that list no regions (Azure's names have no hyphen)
        r.problem("region", f"{region!r} does not look like a region name (e.g. us-east-1)")
    zone = r.text("zone")
    if zone and zone.lower() == "auto":
        return region, "auto"  # resolved once the rest is valid (infra/placement.py)
    if zone and region and info:
        why = info.zone_problem(zone, region) or _snapshot_zone_problem(info, zone, region)
        if why:
            r.problem("zone", why)
    return region, zone


def _snapshot_zone_problem(info: ProviderInfo, zone: str, region: str) -> str | None:
    """Why ``zone`` is not one of ``region``'s zones in the cloud's shipped zones.toml, or
    None (also where the snapshot does not list the region: nothing to judge by)."""
    from infra.zones import region_zones  # local: only a stack that pins a zone reads it

    known = region_zones(info.name, region)
    if known is None or zone in known[0]:
        return None
    zones, source = known
    if not zones:
        return f"{region} has no availability zones ({source}): leave gpufleet:zone out"
    return (
        f"{zone!r} is not a zone of {region} in the shipped snapshot ({source}); "
        f"its zones: {', '.join(zones)}"
    )


def _read_reservation(
    r: _Reader, info: ProviderInfo | None, billing: str, zone: str | None
) -> tuple[str | None, bool]:
    """capacityReservation and capacityBlock: an id the cloud's nodes can launch into."""
    reservation = r.text("capacityReservation")
    block = r.boolean("capacityBlock", False)
    if block and not reservation:
        r.problem("capacityBlock", "needs capacityReservation: the block's reservation id")
    if not info:
        return reservation, block
    for wanted, feature, key in (
        (reservation, Feature.CAPACITY_RESERVATION, "capacityReservation"),
        (block, Feature.CAPACITY_BLOCK, "capacityBlock"),
    ):
        if wanted and not info.supports(feature):
            r.problem(key, f"{info.title}: {info.unsupported[feature]}")
            return None, False
    if not reservation:
        return None, False
    if info.reservation_id and not re.fullmatch(info.reservation_id, reservation):
        r.problem(
            "capacityReservation",
            f"{reservation[:80]!r} is not a {info.title} capacity reservation id "
            f"(e.g. {info.reservation_example})",
        )
    if billing == "spot":
        r.problem("capacityReservation", "a reservation is used by on-demand nodes, not spot")
    if zone == "auto":
        r.problem(
            "capacityReservation",
            "holds capacity in one zone: pin gpufleet:zone to it (zone: auto moves)",
        )
    return reservation, block


def _read_ssh(r: _Reader) -> tuple[tuple[str, ...], str | None]:
    """sshCidrs (required, and not the internet unless allowWorldSsh) and sshPublicKey."""
    allow_world = r.boolean("allowWorldSsh", False)
    cidrs_raw = r.structured("sshCidrs", list)
    cidrs: list[str] = []
    nets: list[tuple[int, AnyNetwork]] = []
    if not cidrs_raw:
        r.problem(
            "sshCidrs",
            'required: the networks allowed to SSH in, e.g. ["203.0.113.7/32"] '
            "(your address: curl -s https://checkip.amazonaws.com)",
        )
    for i, c in enumerate(cidrs_raw or []):
        if not isinstance(c, str) or isinstance(c, bool):
            r.problem(f"sshCidrs[{i}]", f"expected a CIDR like 203.0.113.7/32, got {c!r}")
            continue
        try:
            net = ipaddress.ip_network(c.strip(), strict=True)
        except ValueError as exc:
            r.problem(f"sshCidrs[{i}]", f"{c!r} is not a valid CIDR ({exc})")
            continue
        if str(net) in cidrs:
            # AWS refuses the second rule (InvalidPermission.Duplicate) and pulumi up stops
            first = nets[cidrs.index(str(net))][0]
            r.problem(f"sshCidrs[{i}]", f"repeats sshCidrs[{first}] ({net}): remove one")
            continue
        nets.append((i, net))
        cidrs.append(str(net))
    if not allow_world:
        for where, message in ssh_exposure_problems([n for _, n in nets]):
            key = "sshCidrs" if where is None else f"sshCidrs[{nets[where][0]}]"
            r.problem(key, message)

    ssh_key = r.text("sshPublicKey")
    problem = ssh_key_problem(ssh_key) if ssh_key else None
    if problem:
        r.problem("sshPublicKey", problem)
    return tuple(cidrs), ssh_key


def ssh_key_problem(key: str) -> str | None:
    """Why `key` is not one OpenSSH public key line ("type base64 [comment]"), or None.

    The line goes into authorized_keys as it is, so anything past one line would be a second
    entry there; the base64 must decode, and the blob must start with the key's own type
    (RFC 4253 section 6.6), which catches a key pasted with the wrong prefix or cut short."""
    if any(c in key for c in "\r\n\x00"):
        return "must be one line: the key holds a line break (paste the .pub file's one line)"
    fields = key.split(None, 2)
    if fields[0] not in SSH_KEY_TYPES:
        return (
            f"{fields[0][:40]!r} is not an OpenSSH public key type (expected one of "
            f"{', '.join(SSH_KEY_TYPES[:2])}, ...: paste the .pub file, e.g. ~/.ssh/id_ed25519.pub)"
        )
    if len(fields) < 2:
        return "the key's base64 part is missing (expected 'ssh-ed25519 AAAA... comment')"
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (binascii.Error, ValueError):
        return "the key's second field is not base64: paste the whole .pub line"
    size = int.from_bytes(blob[:4], "big")
    if len(blob) < 4 + size or blob[4 : 4 + size] != fields[0].encode():
        return f"the key's data does not say {fields[0]}: it is cut short or of another type"
    if fields[0] == "ssh-ed25519" and len(blob) != 4 + size + 4 + 32:
        return "an ssh-ed25519 key is 32 bytes: this one is cut short or has extra data"
    return None


def _read_disks(r: _Reader, info: ProviderInfo | None) -> tuple[int, int, str, str]:
    """rootDiskGb, and the scratch disk's size, class and mount point, within the cloud's limits."""
    root = r.number(
        "rootDiskGb", int, 200, maximum=info.max_root_disk_gb if info else 16384, why=" GB"
    )
    if root is not None and root < MIN_ROOT_DISK_GB:
        r.problem(
            "rootDiskGb",
            f"{root} GB is too small: driver, CUDA and PyTorch need >= {MIN_ROOT_DISK_GB} GB",
        )
    scratch_gb = r.number("scratchGb", int, 500, minimum=1)
    scratch_class = (
        r.choice("scratchClass", tuple(info.scratch_classes), info.default_scratch_class)
        if info
        else None
    ) or ""
    disk = info.scratch_classes.get(scratch_class) if info else None
    if scratch_gb is not None and disk is not None and scratch_gb < disk.min_gb:
        r.problem(
            "scratchGb",
            f"{info.scratch_disk if info else ''} {scratch_class} starts at {disk.min_gb} GiB, "
            f"got {scratch_gb}",
        )
    scratch_max = disk.max_gb if disk else None
    if scratch_gb is not None and scratch_max is not None and scratch_gb > scratch_max:
        r.problem(
            "scratchGb",
            f"must be <= {scratch_max} GiB for a {scratch_class} disk, got {scratch_gb}",
        )
    scratch_path = r.text("scratchPath", "/scratch") or "/scratch"
    path_problem = scratch_path_problem(scratch_path)
    if path_problem:
        r.problem("scratchPath", path_problem)
    return root, scratch_gb, scratch_class, scratch_path


def _read_limits(
    r: _Reader, cat: Catalog, tier: str | None
) -> tuple[int, int, int, bool, float | None]:
    """How long things live and what they may cost: bucketArchiveDays, idleMinutes, ttlHours,
    destroyData and maxHourlyCost (the idle and TTL defaults are the tier's)."""
    tier_obj = cat.tiers[tier] if tier else None
    archive_days = r.number(
        "bucketArchiveDays", int, 30, minimum=1, maximum=MAX_ARCHIVE_DAYS, why=" (ten years)"
    )
    idle = r.number(
        "idleMinutes",
        int,
        tier_obj.idle_minutes if tier_obj else 30,
        minimum=5,
        maximum=MAX_IDLE_MINUTES,
        why=" (a day; keep a node longer with `fab keep-alive --hours N`)",
    )
    ttl = r.number(
        "ttlHours",
        int,
        tier_obj.ttl_hours if tier_obj else 24,
        minimum=0,
        maximum=MAX_TTL_HOURS,
        why=" (14 days, what the guards read; 0 turns the TTL off)",
    )
    destroy = r.boolean("destroyData", False)
    max_cost = r.number("maxHourlyCost", float, None, minimum=0, maximum=MAX_PRICE)
    return archive_days, idle, ttl, destroy, max_cost


def _read_tags(r: _Reader, provider: str | None, cat: Catalog) -> dict[str, str]:
    """The extra tags, each key and value one the clouds accept and gpufleet does not reserve."""
    tags: dict[str, str] = {}
    for k, v in (r.structured("tags", dict) or {}).items():
        problem = tag_problem(k, v, provider, cat)
        if problem:
            r.problem(f"tags.{k}", problem)
        else:
            tags[str(k)] = tag_text(v)
    return tags


def parse_config(raw: Mapping[str, Any], stack: str, catalog: Catalog | None = None) -> StackConfig:
    """Validate the raw `gpufleet:*` values (namespace already stripped) into a StackConfig.

    Each step reads its keys and adds what is wrong to the one problem list, so every bad
    value is reported together. Raises ConfigError listing every problem found.
    """
    cat = catalog or load_catalog()
    r = _Reader(raw)
    _check_names(r, raw, stack)
    chosen = _read_choice(r, cat)
    billing, spot_max, months = _read_billing(r, cat, chosen)
    region, zone = _read_location(r, chosen.info)
    reservation, block = _read_reservation(r, chosen.info, billing, zone)
    cidrs, ssh_key = _read_ssh(r)
    root, scratch_gb, scratch_class, scratch_path = _read_disks(r, chosen.info)
    archive_days, idle, ttl, destroy, max_cost = _read_limits(r, cat, chosen.tier)
    tags = _read_tags(r, chosen.provider, cat)
    restart_reclaimed = r.boolean("restartReclaimed", True)
    # what the cloud would refuse at `pulumi up`: names, rules per group, tags per resource
    # (not for a key already refused: fixing that one changes what would be counted)
    for key, message in limits.problems(chosen.provider, stack, chosen.nodes, cidrs, tags):
        if not any(p.startswith(f"{NAMESPACE}:{key}") for p in r.problems):
            r.problem(key, message)
    from infra import placement  # local: placement parses each candidate with this module

    for key, message in placement.problems(raw, cat, chosen.provider, chosen.tier):
        r.problem(key, message)

    if r.problems:
        raise ConfigError(r.problems)
    assert chosen.provider and chosen.tier  # both required above
    cfg = StackConfig(
        stack=stack,
        provider=chosen.provider,
        tier=chosen.tier,
        profile=chosen.profile,
        instance_type=chosen.instance_type,
        nodes=chosen.nodes,
        billing=billing,
        spot_max_price=spot_max,
        subscription_months=months,
        region=region,
        zone=zone,
        ssh_cidrs=cidrs,
        ssh_public_key=ssh_key,
        root_disk_gb=root,
        scratch_gb=scratch_gb,
        scratch_class=scratch_class,
        scratch_path=scratch_path,
        bucket_archive_days=archive_days,
        idle_minutes=idle,
        ttl_hours=ttl,
        destroy_data=destroy,
        max_hourly_cost=max_cost,
        tags=MappingProxyType(tags),
        capacity_reservation=reservation,
        capacity_block=block,
        restart_reclaimed=restart_reclaimed,
    )
    return placement.resolve(raw, cfg, cat) if zone == "auto" else cfg


def strip_namespace(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`gpufleet:tier` -> `tier`; other namespaces (aws:region, ...) are dropped."""
    prefix = NAMESPACE + ":"
    return {
        k[len(prefix) :]: v for k, v in raw.items() if isinstance(k, str) and k.startswith(prefix)
    }


def stack_name_from_file(path: Path) -> str:
    name = path.name
    if not (name.startswith("Pulumi.") and name.endswith((".yaml", ".yml"))):
        raise ConfigError([f"{path}: stack files are named Pulumi.<stack>.yaml"])
    return name[len("Pulumi.") :].rsplit(".", 1)[0]


def read_stack_file(path: Path) -> dict[str, Any]:
    """The raw `config:` mapping of a Pulumi stack file."""
    import yaml  # local: only the file-based entry points need PyYAML

    from infra import stack_yaml

    text = read_text_file(path, "stack file", ConfigError)
    try:
        doc = stack_yaml.load(text) or {}
    except stack_yaml.StackYamlError as exc:
        raise ConfigError([f"{path}: {exc}"]) from None
    except (yaml.YAMLError, RecursionError) as exc:
        # PyYAML's messages span lines (mark, snippet, caret): one line, as everywhere here
        raise ConfigError([f"{path}: not valid YAML ({_one_line(exc)})"]) from None
    config = doc.get("config", {}) if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigError([f"{path}: 'config:' must be a mapping of key: value"])
    secrets = [k for k, v in config.items() if isinstance(v, dict) and set(v) == {"secure"}]
    if secrets:
        # a `pulumi config set --secret` value is ciphertext only the Pulumi CLI can open
        raise ConfigError(
            [
                f"{path}: {key} is a Pulumi secret (secure:), which the offline tools cannot "
                f"decrypt; no gpufleet setting is secret: `pulumi config set {key} VALUE`"
                for key in secrets
            ]
        )
    return config


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def read_text_file(path: Path, what: str, error: Callable[[list[str]], Exception]) -> str:
    """A small UTF-8 text file, or `error([one line])` saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problem = f"{path}: no such {what}"
    except IsADirectoryError:
        problem = f"{path}: is a directory, not a {what}"
    except PermissionError:
        problem = f"{path}: permission denied reading the {what}"
    except UnicodeDecodeError as exc:
        problem = f"{path}: the {what} is not UTF-8 text (byte {exc.start}: {exc.reason})"
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        problem = f"{path!s:.80}: cannot read the {what} ({exc})"
    raise error([problem])


def load_stack_file(path: Path | str, overrides: Mapping[str, Any] | None = None) -> StackConfig:
    """Read and validate stacks/Pulumi.<stack>.yaml (the offline entry points' way in)."""
    path = Path(path)
    file_raw = read_stack_file(path)
    # a key with no namespace is silently ignored by Pulumi: say so, with the key to write
    hints = [
        f"{key}: config keys need the {NAMESPACE}: prefix: write {NAMESPACE}:{key}"
        + ("" if key in KEYS else f"{did_you_mean(key, KEYS)}")
        for key in file_raw
        if isinstance(key, str) and ":" not in key
    ]
    raw = strip_namespace(file_raw)
    raw.update(overrides or {})
    try:
        cfg = parse_config(raw, stack_name_from_file(path))
    except ConfigError as exc:
        raise ConfigError([*hints, *exc.problems]) from None
    if hints:
        raise ConfigError(hints)
    return cfg
