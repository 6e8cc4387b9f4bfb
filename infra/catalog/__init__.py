"""The catalog: GPU models, instance types, tiers and prices as dated, sourced data.

The data lives in the TOML files beside this module; this module only reads and checks it.
No network, no provider SDK, nothing computed at import: ``load_catalog()`` parses once per
process (cached) and returns frozen objects, so cost, plan, bootstrap and the reaper can all
read it cheaply.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from infra import clouds

DATA_DIR = Path(__file__).resolve().parent
# One file per cloud, in its own folder (infra/clouds/<name>/catalog.toml): [provider] facts,
# [sources] of its own, [instances], [tiers] offers and [pricing]. Adding a cloud adds its
# folder; no list elsewhere names it.
CLOUD_FILE = "catalog.toml"
# Where the cloud folders are: None, the infra.clouds package's path (tests set a folder).
CLOUDS_DIR: Path | None = None
PROFILES = ("general", "compute", "memory")


class CatalogError(ValueError):
    """The catalog data itself is inconsistent (a bug in the TOML files, not in user input)."""


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    url: str
    retrieved: dt.date
    note: str = ""


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    arch: str
    memory_gb: float
    bandwidth_gbs: float
    fp16_tflops: float
    bf16_tflops: float
    fp32_tflops: float
    bf16: bool
    form: str
    interconnect_gbs: float
    nvml_names: tuple[str, ...]
    source: str
    thresholds: Mapping[str, float]
    # datasheet fields no source confirms (e.g. the A10G's peaks): shown as unverified
    unverified: tuple[str, ...] = ()

    @property
    def training_dtype(self) -> str:
        """The mixed-precision dtype a training step should use on this GPU."""
        return "bfloat16" if self.bf16 else "float16"

    @property
    def peak_tflops(self) -> float:
        """Dense tensor-core peak in the training dtype."""
        return self.bf16_tflops if self.bf16 else self.fp16_tflops

    @property
    def expected_gemm_tflops(self) -> float:
        """What a healthy card of this model measures on a large GEMM."""
        return self.peak_tflops * self.thresholds["expected_gemm_fraction"]


@dataclass(frozen=True)
class Price:
    """Hourly price of one instance in the provider's currency, with where and when it was seen."""

    on_demand: float
    currency: str
    region: str
    date: dt.date
    source: str
    spot: tuple[float, float] | None = None
    spot_date: dt.date | None = None
    spot_source: str | None = None
    # no source quoted it (e.g. a price only a signed API could confirm): cost.py says so
    estimate: bool = False

    @property
    def spot_observation(self) -> str | None:
        """'one observation, 2024-06-01, SCAZ' when the spot "range" is one price seen once
        (low == high): said instead of a range of zero width such as '1,481-1,481'."""
        if not self.spot or self.spot[0] != self.spot[1]:
            return None
        when = (self.spot_date or self.date).isoformat()
        return f"one observation, {when}, {self.spot_source or self.source}"


@dataclass(frozen=True)
class InstanceType:
    provider: str
    name: str
    gpu: str
    gpus: int
    vcpus: int
    memory_gib: float
    network_gbps: float
    network_up_to: bool = False
    efa: bool = False
    efa_interfaces: int = 0
    efa_rdma: bool = False  # GPUDirect RDMA over EFA (fab train sets FI_EFA_USE_DEVICE_RDMA=1)
    infiniband: bool = False  # InfiniBand HCAs between nodes (Azure ND sizes), GPUDirect RDMA
    infiniband_gbps: int = 0
    # What the size's node image needs NCCL told (InfiniBand types): the topology file the
    # image ships and the interface for NCCL's bootstrap sockets; ``fabric_source`` names the
    # sources these come from (bootstrap/fleet/interconnect.py turns them into the environment).
    nccl_topo_file: str = ""
    nccl_socket_ifname: str = ""
    fabric_source: str = ""
    nvme_count: int = 0
    nvme_gb: int = 0
    nvlink: bool = False
    nvswitch: bool = False
    bare_metal: bool = False
    spec_source: str = ""
    note: str = ""
    price: Price | None = None

    @property
    def local_nvme_gb(self) -> int:
        return self.nvme_count * self.nvme_gb


@dataclass(frozen=True)
class Tier:
    key: str
    description: str
    gpus_allowed: tuple[str, ...]
    gpus: int
    idle_minutes: int
    ttl_hours: int
    nvlink: bool
    # provider -> profile -> instance type name
    offers: Mapping[str, Mapping[str, str]]

    @property
    def gpu(self) -> str:
        return self.gpus_allowed[0]


class Feature(enum.Enum):
    """What a cloud may lack. Each provider's catalog file lists the ones it cannot do, with
    the reason (``[provider.unsupported]``, keyed by the member's lower-case name); callers
    ask ``ProviderInfo.supports`` instead of comparing the provider's name."""

    PLACEMENT_GROUP = "cluster placement group"
    EFA = "EFA / RDMA networking"
    SUBSCRIPTION = "subscription (monthly/yearly) billing"
    LOCAL_NVME = "instance-local NVMe scratch"
    STOP_CHARGING = "no compute charge while stopped"
    CONSOLE_HOST_KEYS = "SSH host keys read from the console output before the first connection"
    INFINIBAND = "InfiniBand RDMA between nodes"
    SPOT_INFINIBAND_GROUP = "spot nodes joined into one InfiniBand group"
    CAPACITY_RESERVATION = "launching into an existing capacity reservation"
    CAPACITY_BLOCK = "a Capacity Block for ML (reserved GPU capacity for fixed dates)"


@dataclass(frozen=True)
class ScratchClass:
    """A data-disk class scratch may be provisioned on, with the sizes the cloud allows and
    the performance gpufleet buys with it (None: the class's own default)."""

    name: str
    min_gb: int = 0  # 0: none beyond the config's own minimum
    max_gb: int | None = None
    iops: int | None = None
    iops_per_gb: int | None = None
    max_iops: int | None = None
    throughput_mbs: int | None = None

    def provisioned_iops(self, size_gb: int) -> int | None:
        if self.iops is not None:
            return self.iops
        if self.iops_per_gb is not None:
            per_size = size_gb * self.iops_per_gb
            return per_size if self.max_iops is None else min(self.max_iops, per_size)
        return None


@dataclass(frozen=True)
class MonitoringAgent:
    """A cloud's monitoring agent on the node, as the cloud documents installing it."""

    name: str  # how messages name it
    processes: tuple[str, ...]  # each runs once the agent works
    installer: str  # the documented installer's URL, run as root when a process is missing
    source: str  # a key of [sources]


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    currency: str
    price_region: str
    default_region: str
    ssh_user: str
    billing: tuple[str, ...]
    title: str = ""  # how messages name the cloud
    max_root_disk_gb: int = 16384
    scratch_disk: str = "disk"
    # in the order they are offered; the default is one of them
    scratch_classes: Mapping[str, ScratchClass] = field(default_factory=dict)
    default_scratch_class: str = ""
    refused_tag_value_prefixes: tuple[str, ...] = ()
    # the characters an instance tag key may hold on this cloud (a regex character class's
    # body; "" when any is fine), and the keys it refuses whole
    tag_key_chars: str = ""
    refused_tag_keys: tuple[str, ...] = ()
    unsupported: Mapping[Feature, str] = field(default_factory=dict)
    # the regions a stack may name (empty: any name that looks like one), and the zone names
    # when a cloud's zones are not "<region><suffix>" (Azure numbers them 1-3)
    regions: tuple[str, ...] = ()
    zone_names: tuple[str, ...] = ()
    zone_suffix: str = "a"  # what follows the region's name in a zone's, e.g. "a" or "-b"
    # what a capacity reservation's id looks like there (a regex; "" when not documented)
    # and an example for the error that refuses one
    reservation_id: str = ""
    reservation_example: str = ""

    def zone_problem(self, zone: str, region: str) -> str | None:
        """Why ``zone`` cannot be a zone of ``region`` on this cloud, or None."""
        if self.zone_names:
            if zone not in self.zone_names:
                return f"{self.title} has no zone {zone!r}: use one of {', '.join(self.zone_names)}"
            return None
        suffix = zone[len(region) :] if zone.startswith(region) else ""
        if not re.fullmatch(r"-?[a-z0-9]{1,3}", suffix):
            return (
                f"{zone!r} is not a zone of region {region!r}: {self.title} zones are the "
                f"region's name and a suffix, e.g. {region}{self.zone_suffix}"
            )
        return None

    # the stop API's mode that keeps compute off the bill while stopped ("" = no such mode)
    stopped_mode: str = ""
    # what a person must know before `pulumi up` with one billing mode (a plan note), e.g.
    # an account kind it needs; keys are billing modes of ``billing``
    billing_notes: Mapping[str, str] = field(default_factory=dict)
    # the cloud's own monitoring agent, where the reaper reads its metrics (`fab setup`
    # verifies it, and installs it when missing); None: the reaper needs none
    monitoring_agent: MonitoringAgent | None = None

    def supports(self, feature: Feature) -> bool:
        return feature not in self.unsupported

    def check_supported(self, *features: Feature) -> None:
        """Raise UnsupportedError naming each feature this cloud lacks, with the reason."""
        missing = [f for f in features if f in self.unsupported]
        if missing:
            raise UnsupportedError(self.name, {f: self.unsupported[f] for f in missing})


class UnsupportedError(LookupError):
    def __init__(self, provider: str, missing: Mapping[Feature, str]):
        self.provider, self.missing = provider, dict(missing)
        why = "; ".join(f"{f.value} ({reason})" for f, reason in missing.items())
        super().__init__(f"{provider} does not support {why}")


@dataclass(frozen=True)
class Alternative:
    """A nearby offer suggested when a tier/provider/profile combination does not exist."""

    provider: str
    instance_type: str
    gpus: int
    gpu: str
    tier: str | None
    why: str

    def __str__(self) -> str:
        where = f"tier {self.tier} on {self.provider}" if self.tier else self.provider
        return f"{self.instance_type} ({self.gpus}x {self.gpu}, {where}: {self.why})"


@dataclass(frozen=True)
class Catalog:
    sources: Mapping[str, Source]
    gpus: Mapping[str, Gpu]
    instances: Mapping[tuple[str, str], InstanceType]
    tiers: Mapping[str, Tier]
    providers: Mapping[str, ProviderInfo] = field(default_factory=dict)
    # gpus.toml [defaults.thresholds]: what verify-gpu judges by when no GPU model is known
    default_thresholds: Mapping[str, float] = field(default_factory=dict)

    def instance(self, provider: str, name: str) -> InstanceType:
        try:
            return self.instances[(provider, name)]
        except KeyError:
            raise KeyError(f"{provider} instance type {name!r} is not in the catalog") from None

    def gpu_for(self, itype: InstanceType) -> Gpu:
        return self.gpus[itype.gpu]

    def resolve(self, tier: str, provider: str, profile: str = "general") -> InstanceType:
        """The instance type for a tier on a provider, or an UnavailableError with alternatives."""
        t = self.tiers[tier]
        offers = t.offers.get(provider, {})
        if profile in offers:
            return self.instance(provider, offers[profile])
        raise UnavailableError(tier, provider, profile, self.alternatives(tier, provider, profile))

    def alternatives(self, tier: str, provider: str, profile: str = "general") -> list[Alternative]:
        """Nearest offers to a missing combination: other profiles, the same GPU on this
        provider with the nearest GPU count, then the same tier on other providers."""
        t = self.tiers[tier]
        found: list[Alternative] = []
        offers = t.offers.get(provider, {})
        for prof, name in offers.items():
            if prof != profile:
                it = self.instance(provider, name)
                found.append(Alternative(provider, name, it.gpus, it.gpu, tier, f"profile {prof}"))
        if not offers:
            same_gpu = [
                it
                for (prov, _), it in self.instances.items()
                if prov == provider and it.gpu in t.gpus_allowed
            ]
            same_gpu.sort(key=lambda it: (abs(it.gpus - t.gpus), it.gpus < t.gpus, it.name))
            for it in same_gpu[:2]:
                found.append(
                    Alternative(
                        provider,
                        it.name,
                        it.gpus,
                        it.gpu,
                        self.tier_of(provider, it.name),
                        f"same GPU, {it.gpus} instead of {t.gpus}",
                    )
                )
        for other in self.providers:
            if other != provider and "general" in t.offers.get(other, {}):
                name = t.offers[other]["general"]
                it = self.instance(other, name)
                found.append(Alternative(other, name, it.gpus, it.gpu, tier, "same tier"))
        return found

    def tier_of(self, provider: str, instance_type: str) -> str | None:
        for key, t in self.tiers.items():
            if instance_type in t.offers.get(provider, {}).values():
                return key
        return None


class UnavailableError(LookupError):
    def __init__(self, tier: str, provider: str, profile: str, alternatives: list[Alternative]):
        self.tier, self.provider, self.profile = tier, provider, profile
        self.alternatives = alternatives
        what = f"tier {tier!r}" + (f" with profile {profile!r}" if profile != "general" else "")
        alts = "; ".join(str(a) for a in alternatives) or "none in the catalog"
        super().__init__(f"{provider} does not offer {what}. Nearest alternatives: {alts}")


def _date(value: Any, where: str) -> dt.date:
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError:
        raise CatalogError(f"{where}: {value!r} is not an ISO date") from None


def _read(name: str, folder: Path | None = None) -> dict[str, Any]:
    with ((folder or DATA_DIR) / name).open("rb") as fh:
        return tomllib.load(fh)


@functools.lru_cache(maxsize=1)
def _cloud_files() -> Mapping[str, dict[str, Any]]:
    """Each cloud's parsed file, in the order its ``[provider] order`` gives (then by name)."""
    homes = None if CLOUDS_DIR is None else [CLOUDS_DIR]
    found = clouds.folders(CLOUD_FILE, homes)
    files = {name: _read(CLOUD_FILE, folder) for name, folder in found.items()}
    for name, data in files.items():
        if not isinstance(data.get("provider"), dict):
            raise CatalogError(f"{cloud_path(name)}: a [provider] table is required")
    ranked = sorted(files, key=lambda n: (int(files[n]["provider"].get("order", 1000)), n))
    return MappingProxyType({n: files[n] for n in ranked})


def cloud_file_path(name: str) -> Path:
    """The file itself (``CLOUDS_DIR``'s when a test sets one), for the one writer of it:
    scripts/refresh_prices.py. LookupError when no cloud of that name has one."""
    homes = None if CLOUDS_DIR is None else [CLOUDS_DIR]
    found = clouds.folders(CLOUD_FILE, homes)
    if name not in found:
        raise LookupError(f"no cloud {name!r} with a {CLOUD_FILE}")
    return found[name] / CLOUD_FILE


def cloud_path(name: str) -> str:
    """Where a cloud's catalog file is, as error messages name it."""
    return f"clouds/{name}/{CLOUD_FILE}"


def provider_names() -> tuple[str, ...]:
    """The clouds the catalog knows, one per cloud folder with a catalog file (in their
    declared order)."""
    return tuple(_cloud_files())


def cloud_file(name: str) -> Mapping[str, Any]:
    """One cloud's parsed catalog file (read-only use: pricing reads its [pricing] table)."""
    return _cloud_files()[name]


@dataclass(frozen=True)
class Deadline:
    """A dated fact with an end (a plan retiring, a runtime's support ending): one
    ``[[deadlines]]`` entry of a cloud file."""

    what: str
    date: dt.date
    source: str
    warn_days: int

    def days_left(self, today: dt.date) -> int:
        return (self.date - today).days

    def note(self, title: str, today: dt.date) -> str | None:
        """A line for people once ``today`` is within ``warn_days`` of the date."""
        left = self.days_left(today)
        if left > self.warn_days:
            return None
        when = f"{-left} days ago" if left < 0 else f"in {left} days"
        return f"{title}: {self.what} on {self.date.isoformat()} ({when}; {self.source})"


def deadlines(provider: str) -> list[Deadline]:
    """The cloud file's ``[[deadlines]]``, each source a known one (CatalogError if not)."""
    known = load_catalog().sources
    out = []
    for i, row in enumerate(cloud_file(provider).get("deadlines", [])):
        where = f"{cloud_path(provider)} deadlines[{i}]"
        if row.get("source") not in known:
            raise CatalogError(f"{where}: unknown source {row.get('source')!r}")
        out.append(
            Deadline(
                str(row["what"]),
                _date(row["date"], where),
                str(row["source"]),
                int(row["warn_days"]),
            )
        )
    return out


def plan_notes(provider: str, stack: str, today: dt.date) -> list[str]:
    """What a plan of ``stack`` tells people about its cloud: the cloud file's
    ``[plan] notes`` and every deadline within its warning window."""
    title = load_catalog().providers[provider].title
    written = cloud_file(provider).get("plan", {}).get("notes", [])
    notes = [str(n).format(stack=stack) for n in written]
    notes += [n for d in deadlines(provider) if (n := d.note(title, today)) is not None]
    return notes


_GPU_FIGURES = ("memory_gb", "bandwidth_gbs", "fp16_tflops", "bf16_tflops", "fp32_tflops")


def _default_thresholds(data: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.get("defaults", {}).get("thresholds", {}).items()}


def _gpus(data: dict[str, Any]) -> dict[str, Gpu]:
    defaults = _default_thresholds(data)
    out = {}
    for key, g in data["gpus"].items():
        thresholds = {**defaults, **g.get("thresholds", {})}
        if "expected_gemm_fraction" not in thresholds:
            raise CatalogError(f"gpus.{key}: thresholds.expected_gemm_fraction is required")
        out[key] = Gpu(
            key=key,
            name=g["name"],
            arch=g["arch"],
            memory_gb=float(g["memory_gb"]),
            bandwidth_gbs=float(g["bandwidth_gbs"]),
            fp16_tflops=float(g["fp16_tflops"]),
            bf16_tflops=float(g["bf16_tflops"]),
            fp32_tflops=float(g["fp32_tflops"]),
            bf16=bool(g["bf16"]),
            form=g["form"],
            interconnect_gbs=float(g["interconnect_gbs"]),
            nvml_names=tuple(g["nvml_names"]),
            source=g["source"],
            thresholds=MappingProxyType({k: float(v) for k, v in thresholds.items()}),
            unverified=tuple(g.get("unverified", ())),
        )
        for name in out[key].unverified:
            if name not in _GPU_FIGURES:
                raise CatalogError(f"gpus.{key}.unverified: {name!r} is not a datasheet figure")
    return out


_PROVIDER_KEYS = frozenset(
    {"name", "order", "title", "currency", "price_region", "default_region", "ssh_user"}
    | {"billing"}
    | {"max_root_disk_gb", "scratch_disk", "default_scratch_class"}
    | {"refused_tag_value_prefixes", "unsupported", "scratch_classes", "stopped_mode"}
    | {"tag_key_chars", "refused_tag_keys"}
    | {"billing_notes"}
    | {"regions", "regions_source", "zone_names", "zone_suffix", "monitoring_agent"}
    | {"reservation_id", "reservation_example"}
)
_AGENT_KEYS = frozenset({"name", "processes", "installer", "source"})
_SCRATCH_KEYS = frozenset({"min_gb", "max_gb", "iops", "iops_per_gb", "max_iops", "throughput_mbs"})


def _provider(p: dict[str, Any], file: str) -> ProviderInfo:
    where = f"{cloud_path(file)} [provider]"
    if p.get("name") != file:
        raise CatalogError(f"{where}: name must be {file!r}, got {p.get('name')!r}")
    extra = set(p) - _PROVIDER_KEYS
    if extra:
        raise CatalogError(f"{where}: unknown keys {sorted(extra)}")
    features = {f.name.lower(): f for f in Feature}
    unsupported = {}
    for key, reason in p.get("unsupported", {}).items():
        if key not in features:
            raise CatalogError(f"{where}.unsupported: {key!r} is not one of {sorted(features)}")
        unsupported[features[key]] = str(reason)
    classes = {}
    for cls, raw in p.get("scratch_classes", {}).items():
        extra = set(raw) - _SCRATCH_KEYS
        if extra:
            raise CatalogError(f"{where}.scratch_classes.{cls}: unknown keys {sorted(extra)}")
        classes[cls] = ScratchClass(name=cls, **{k: int(v) for k, v in raw.items()})
    # The one list of modes and its words live with the billing rule (infra.pricing.billing_modes,
    # which reads this catalog): imported here, when a file is read, not when this loads.
    from infra.pricing.billing_modes import BILLING_MODES, billing_problem

    for mode in p["billing"]:
        if mode not in BILLING_MODES:
            raise CatalogError(f"{where}.billing: {billing_problem(str(mode))}")
    if (Feature.SUBSCRIPTION in unsupported) == ("subscription" in p["billing"]):
        raise CatalogError(f"{where}: billing and unsupported disagree about subscription")
    regions = p.get("regions", ())
    if regions and not {p["default_region"], p["price_region"]} <= set(regions):
        raise CatalogError(f"{where}: default_region and price_region must be in regions")
    if regions and not p.get("regions_source"):
        raise CatalogError(f"{where}: regions needs a regions_source (keys of [sources])")
    notes = {str(k): str(v) for k, v in p.get("billing_notes", {}).items()}
    if set(notes) - set(p["billing"]):
        raise CatalogError(
            f"{where}.billing_notes: {sorted(set(notes) - set(p['billing']))} "
            f"are not billing modes of this cloud ({p['billing']})"
        )
    default_class = p.get("default_scratch_class", "")
    if classes and default_class not in classes:
        raise CatalogError(f"{where}: default_scratch_class {default_class!r} is not listed")
    agent = None
    if "monitoring_agent" in p:
        raw_agent = p["monitoring_agent"]
        if set(raw_agent) != _AGENT_KEYS:
            raise CatalogError(f"{where}.monitoring_agent: keys must be {sorted(_AGENT_KEYS)}")
        agent = MonitoringAgent(
            name=str(raw_agent["name"]),
            processes=tuple(str(x) for x in raw_agent["processes"]),
            installer=str(raw_agent["installer"]),
            source=str(raw_agent["source"]),
        )
    return ProviderInfo(
        name=p["name"],
        currency=p["currency"],
        price_region=p["price_region"],
        default_region=p["default_region"],
        ssh_user=p["ssh_user"],
        billing=tuple(p["billing"]),
        title=p.get("title", p["name"]),
        max_root_disk_gb=int(p.get("max_root_disk_gb", 16384)),
        scratch_disk=p.get("scratch_disk", "disk"),
        scratch_classes=MappingProxyType(classes),
        default_scratch_class=default_class,
        refused_tag_value_prefixes=tuple(p.get("refused_tag_value_prefixes", ())),
        tag_key_chars=str(p.get("tag_key_chars", "")),
        refused_tag_keys=tuple(str(k) for k in p.get("refused_tag_keys", ())),
        unsupported=MappingProxyType(unsupported),
        regions=tuple(p.get("regions", ())),
        zone_names=tuple(str(z) for z in p.get("zone_names", ())),
        zone_suffix=str(p.get("zone_suffix", "a")),
        reservation_id=str(p.get("reservation_id", "")),
        reservation_example=str(p.get("reservation_example", "")),
        stopped_mode=str(p.get("stopped_mode", "")),
        billing_notes=MappingProxyType(notes),
        monitoring_agent=agent,
    )


def _instances(
    data: dict[str, Any], provider: ProviderInfo, gpus: Mapping[str, Gpu], sources: Mapping
) -> dict[tuple[str, str], InstanceType]:
    out = {}
    for name, raw in data["instances"].items():
        where = f"{provider.name}.instances.{name}"
        row = dict(raw)
        if row["gpu"] not in gpus:
            raise CatalogError(f"{where}: unknown gpu {row['gpu']!r}")
        price = None
        if "price" in row:
            p = row.pop("price")
            for key in ("source", "spot_source"):
                for tag in str(p.get(key, "")).replace(",", " ").split():
                    if p.get(key) and tag not in sources:
                        raise CatalogError(f"{where}: price {key} {tag!r} is not in sources.toml")
            spot = p.get("spot")
            if spot is not None and not (len(spot) == 2 and 0 < spot[0] <= spot[1]):
                raise CatalogError(f"{where}: spot must be [low, high], got {spot!r}")
            price = Price(
                on_demand=float(p["on_demand"]),
                currency=provider.currency,
                region=provider.price_region,
                date=_date(p["date"], where),
                source=p["source"],
                spot=(float(spot[0]), float(spot[1])) if spot else None,
                spot_date=_date(p["spot_date"], where) if "spot_date" in p else None,
                spot_source=p.get("spot_source"),
                estimate=bool(p.get("estimate", False)),
            )
        fabric_tags = str(row.get("fabric_source", "")).replace(",", " ").split()
        for tag in fabric_tags:
            if tag not in sources:
                raise CatalogError(f"{where}: fabric_source {tag!r} is not in sources.toml")
        if (row.get("nccl_topo_file") or row.get("nccl_socket_ifname")) and not fabric_tags:
            raise CatalogError(f"{where}: nccl_* settings need a fabric_source")
        out[(provider.name, name)] = InstanceType(
            provider=provider.name, name=name, price=price, **row
        )
    return out


def _tiers(
    data: dict[str, Any],
    cloud_offers: Mapping[str, Mapping[str, Mapping[str, str]]],
    instances: Mapping[tuple[str, str], InstanceType],
) -> dict:
    """Tiers from tiers.toml, with each cloud's offers from its own file's [tiers] table."""
    for provider, by_tier in cloud_offers.items():
        unknown = sorted(set(by_tier) - set(data["tiers"]))
        if unknown:
            raise CatalogError(f"{cloud_path(provider)} [tiers]: unknown tiers {unknown}")
    out = {}
    for key, t in data["tiers"].items():
        stray = sorted(set(t) - _TIER_KEYS)
        if stray:
            raise CatalogError(
                f"tiers.{key}: unknown keys {stray} (offers go in clouds/<cloud>/{CLOUD_FILE})"
            )
        allowed = (t["gpu"],) if isinstance(t["gpu"], str) else tuple(t["gpu"])
        offers: dict[str, Mapping[str, str]] = {}
        for provider, by_tier in cloud_offers.items():
            prof = by_tier.get(key, {})
            for profile, name in prof.items():
                if profile not in PROFILES:
                    raise CatalogError(f"tiers.{key}.{provider}: unknown profile {profile!r}")
                it = instances.get((provider, name))
                if it is None:
                    raise CatalogError(f"tiers.{key}.{provider}.{profile}: unknown type {name!r}")
                if it.gpu not in allowed or it.gpus != t["gpus"]:
                    raise CatalogError(
                        f"tiers.{key}.{provider}.{profile}: {name} has {it.gpus}x {it.gpu}, "
                        f"tier wants {t['gpus']}x {'/'.join(allowed)}"
                    )
            if prof:
                if "general" not in prof:
                    raise CatalogError(f"tiers.{key}.{provider}: a 'general' profile is required")
                offers[provider] = MappingProxyType(dict(prof))
        out[key] = Tier(
            key=key,
            description=t["description"],
            gpus_allowed=allowed,
            gpus=int(t["gpus"]),
            idle_minutes=int(t["idle_minutes"]),
            ttl_hours=int(t["ttl_hours"]),
            nvlink=bool(t.get("nvlink", False)),
            offers=MappingProxyType(offers),
        )
    return out


_TIER_KEYS = frozenset({"description", "gpu", "gpus", "idle_minutes", "ttl_hours", "nvlink"})


@functools.lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """Parse and cross-check the catalog files. Raises CatalogError on inconsistent data."""
    raw_sources = dict(_read("sources.toml")["sources"])
    clouds = _cloud_files()
    for name, data in clouds.items():
        for key, value in data.get("sources", {}).items():
            if key in raw_sources:
                raise CatalogError(f"{cloud_path(name)}: source {key!r} is already defined")
            raw_sources[key] = value
    sources = {
        k: Source(k, v["title"], v["url"], _date(v["retrieved"], f"sources.{k}"), v.get("note", ""))
        for k, v in raw_sources.items()
    }
    gpu_data = _read("gpus.toml")
    gpus = _gpus(gpu_data)
    instances: dict[tuple[str, str], InstanceType] = {}
    providers = {}
    for name, data in clouds.items():
        info = _provider(data["provider"], name)
        providers[name] = info
        instances.update(_instances(data, info, gpus, sources))
    offers = {name: data.get("tiers", {}) for name, data in clouds.items()}
    tiers = _tiers(_read("tiers.toml"), offers, instances)
    return Catalog(
        sources=MappingProxyType(sources),
        gpus=MappingProxyType(gpus),
        instances=MappingProxyType(instances),
        tiers=MappingProxyType(tiers),
        providers=MappingProxyType(providers),
        default_thresholds=MappingProxyType(_default_thresholds(gpu_data)),
    )


def gpu_by_nvml_name(catalog: Catalog, nvml_name: str) -> Gpu | None:
    """Map what nvidia-smi prints (e.g. 'NVIDIA A100-SXM4-40GB') to a catalog GPU."""
    wanted = nvml_name.strip().lower()
    for gpu in catalog.gpus.values():
        if any(n.lower() == wanted for n in gpu.nvml_names):
            return gpu
    return None
