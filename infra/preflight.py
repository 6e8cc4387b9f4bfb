"""Preflight: what the user's own account says about a stack before anything is created.

Read only. For one stack, each cloud's preflight.py (in its folder) asks that cloud's own
APIs, with the user's credentials: who the caller is, the GPU quota the stack needs against
the account's (on-demand and spot apart), the permissions ``pulumi up`` needs where the
cloud can prove them without creating anything (dry runs, policy simulation), the node
image, the bucket name. Two checks are the same on every cloud and asked here: the type
offered in the zone now (the cloud's availability.py, as ``where.py --live``) and the price
now against the catalog's (its prices.py, as ``cost.py --live``).

A cloud's preflight.py has one function, ``checks(need, calls)``, returning
:class:`Check` rows in the order people read them and counting each API call in
``calls``. No check raises: a missing credential, an unreachable endpoint or an answer the
code does not know becomes one line that says so. Nothing here names a cloud.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra import clouds
from infra.catalog import load_catalog

OK = "ok"  # the account answers yes
FAIL = "FAIL"  # the account answers no: `pulumi up` would fail here; the fix says what to do
NOT_CHECKED = "not checked"  # the cloud offers no way to prove it without creating things
UNKNOWN = "unknown"  # it could not be asked (no credentials, no network, an API error)
INFO = "info"  # an answer the stack does not depend on (the other billing mode's quota)
STATES = (OK, FAIL, NOT_CHECKED, UNKNOWN, INFO)


@dataclass(frozen=True)
class QuotaAsk:
    """A short quota as the cloud would take a request to raise it (``--request-quota``).

    ``what`` names it for a person ("vCPUs of Running On-Demand G and VT instances"),
    ``value`` is the new limit to ask for, ``where`` the region (or zone) it counts in, and
    ``key`` the cloud's own identifiers for its request call (a quota code and service).
    ``step`` is the documented step where the cloud has no request API gpufleet can call.
    """

    what: str
    value: int
    where: str
    key: tuple[tuple[str, str], ...] = ()
    step: str = ""

    def get(self, name: str) -> str:
        return dict(self.key).get(name, "")


@dataclass(frozen=True)
class Check:
    name: str  # short: identity, region, quota on-demand, permissions, image, ...
    state: str  # one of STATES
    detail: str  # what the cloud said, in one sentence
    fix: str = ""  # what to do (a command where there is one), "" when nothing is to do
    ask: QuotaAsk | None = None  # a short quota that --request-quota can file

    def to_json(self) -> dict[str, str]:
        return {"check": self.name, "state": self.state, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class Filed:
    """What a cloud answered to a quota request: its id and status, as it said them."""

    request_id: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Need:
    """What the stack asks of the account: read from its validated config."""

    stack: str
    provider: str
    region: str
    zone: str | None  # None: the program picks the first zone offering the type
    instance_type: str
    nodes: int
    vcpus: int  # per node
    gpus: int  # per node
    billing: str  # on-demand | spot | subscription

    @property
    def total_vcpus(self) -> int:
        return self.vcpus * self.nodes

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes


@dataclass
class Calls:
    """API calls made, counted by each cloud's module (``calls.add("sts:GetCallerIdentity")``)."""

    made: list[str] = field(default_factory=list)

    def add(self, name: str) -> None:
        self.made.append(name)


@dataclass(frozen=True)
class Report:
    need: Need
    checks: tuple[Check, ...]
    calls: tuple[str, ...]
    seconds: float

    @property
    def status(self) -> int:
        """docs/exit-status.md: 0 every check answered yes (or cannot be proven on that cloud
        without creating things: not checked); 1 one answered no or could not be asked."""
        return 1 if any(c.state in (FAIL, UNKNOWN) for c in self.checks) else 0

    def to_json(self) -> dict[str, Any]:
        n = self.need
        return {
            "stack": n.stack,
            "provider": n.provider,
            "region": n.region,
            "zone": n.zone,
            "instance_type": n.instance_type,
            "nodes": n.nodes,
            "billing": n.billing,
            "checks": [c.to_json() for c in self.checks],
            "calls": list(self.calls),
            "seconds": round(self.seconds, 3),
            "ok": self.status == 0,
        }


def need_of(cfg: Any) -> Need:
    """The Need of a validated StackConfig (infra.config)."""
    zone = None if cfg.zone in (None, "auto") else cfg.zone
    if cfg.placement is not None:  # zone: auto: the place `make up` tries first
        zone = cfg.placement.choice.zone
    return _need(cfg, cfg.provider, cfg.region, zone, cfg.instance_type)


def need_at(cfg: Any, candidate: Any) -> Need:
    """The stack's Need placed at one `zone: auto` candidate (infra.placement.Candidate)."""
    c = candidate
    return _need(cfg, c.provider, c.region, c.zone, c.instance_type)


def _need(cfg: Any, provider: str, region: str, zone: str | None, instance_type: str) -> Need:
    """The stack's Need of ``instance_type`` at that place (its vCPUs and GPUs: the catalog's)."""
    it = load_catalog().instance(provider, instance_type)
    return Need(
        stack=cfg.stack,
        provider=provider,
        region=region,
        zone=zone,
        instance_type=instance_type,
        nodes=cfg.nodes,
        vcpus=it.vcpus,
        gpus=it.gpus,
        billing=cfg.billing,
    )


def quota_asker(cfg: Any) -> Callable[[Any], Sequence[Check]]:
    """candidate -> the quota checks of its cloud's preflight.py (``quota(need, calls)``)
    for the stack placed there, asked once per place the cloud counts quota in (its
    ``QUOTA_SCOPE``: "region", or "zone"); a cloud without one answers one NOT_CHECKED."""
    seen: dict[tuple[str, ...], Sequence[Check]] = {}

    def ask(candidate: Any) -> Sequence[Check]:
        try:
            module = clouds.module(candidate.provider, "preflight")
        except LookupError:
            module = None
        quota = getattr(module, "quota", None)
        if quota is None:
            return [Check("quota", NOT_CHECKED, f"no quota check for {candidate.provider}")]
        scope = getattr(module, "QUOTA_SCOPE", "region")
        where = candidate.zone if scope == "zone" else ""
        key = (candidate.provider, candidate.region, where or "", candidate.instance_type)
        if key not in seen:
            try:
                seen[key] = list(quota(need_at(cfg, candidate), Calls()))
            except Exception as exc:  # a module's bug is one line, never a traceback
                first = (str(exc).splitlines() or [""])[0]
                seen[key] = [Check("quota", UNKNOWN, f"{type(exc).__name__}: {first}")]
        return seen[key]

    return ask


def offered_check(need: Need, calls: Calls) -> Check:
    """The type offered in the zone now: the cloud's own availability signal (where --live)."""
    from infra.clouds.availability import AVAILABLE, OFFERED, NoSignal

    try:
        signal = clouds.module(need.provider, "availability")
    except LookupError:
        return Check("offered", NOT_CHECKED, "this cloud has no live availability signal")
    try:
        zones = signal.live_zones(need.instance_type, [need.region])
    except NoSignal as exc:
        return Check("offered", UNKNOWN, f"{need.instance_type}: {exc}")
    calls.add(f"availability: {signal.SIGNAL}")
    where = f"{need.region} {need.zone}" if need.zone else need.region
    usable = [z for z in zones if z.state in (AVAILABLE, OFFERED)]
    here = [z for z in usable if need.zone in (None, z.zone) or z.zone == ""]
    if here:
        names = ", ".join(z.zone or z.region for z in here)
        return Check("offered", OK, f"{need.instance_type} in {where} now ({names})")
    said = "; ".join(f"{z.zone or z.region}: {z.state} ({z.detail})" for z in zones if z.zone)
    elsewhere = ", ".join(z.zone for z in usable if z.zone)
    fix = (
        f"set gpufleet:zone to one of {elsewhere}, or zone: auto"
        if elsewhere
        else f"`make where WHERE_ARGS={need.instance_type}` for other regions"
    )
    said = f"{need.instance_type} not offered in {where} now" + (f": {said}" if said else "")
    return Check("offered", FAIL, said, fix)


def price_check(need: Need, calls: Calls) -> Check:
    """The price now against the catalog's (the cloud's prices.py, as cost --live)."""
    from infra.clouds.live import LivePriceError

    it = load_catalog().instance(need.provider, need.instance_type)
    try:
        prices = clouds.module(need.provider, "prices")
    except LookupError:
        return Check("price", NOT_CHECKED, "this cloud has no live price source")
    try:
        live, currency = prices.live_price(need.instance_type, need.region)
    except LivePriceError as exc:  # the plan's cost then rests on the catalog: not a blocker
        return Check("price", INFO, f"not compared: {exc}")
    calls.add("prices: live_price")
    if it.price is None:
        return Check("price", INFO, f"{live:g} {currency}/h now; the catalog has no price")
    shipped = it.price.on_demand
    drift = (live - shipped) / shipped if shipped else 0.0
    said = (
        f"{live:g} {currency}/h on-demand now, catalog {shipped:g} "
        f"({it.price.date.isoformat()}, {drift:+.0%})"
    )
    if abs(drift) > 0.05:
        return Check("price", INFO, said, "the plan's cost uses the catalog's price")
    return Check("price", OK, said)


def run(
    need: Need,
    cloud_checks: Callable[[Need, Calls], Sequence[Check]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Report:
    """Every check for one stack, the cloud's own first; a check module that raises is one
    UNKNOWN line naming what it raised, never a traceback."""
    calls = Calls()
    start = clock()
    if cloud_checks is None:
        try:
            cloud_checks = clouds.module(need.provider, "preflight").checks
        except LookupError:
            cloud_checks = None
    found: list[Check] = []
    if cloud_checks is None:
        found.append(Check("account", NOT_CHECKED, f"no preflight for {need.provider} yet"))
    else:
        try:
            found.extend(cloud_checks(need, calls))
        except Exception as exc:  # a check module's bug must not hide the other lines
            first = (str(exc).splitlines() or [""])[0]
            found.append(Check("account", UNKNOWN, f"stopped: {type(exc).__name__}: {first}"))
    for extra in (offered_check, price_check):
        try:
            found.append(extra(need, calls))
        except Exception as exc:
            first = (str(exc).splitlines() or [""])[0]
            found.append(Check(extra.__name__[:-6], UNKNOWN, f"{type(exc).__name__}: {first}"))
    return Report(need, tuple(found), tuple(calls.made), clock() - start)


def render(report: Report, width: int = 80) -> list[str]:
    """One line per check (a long one continues indented), its fix beneath after '->'."""
    from infra.render import wrap_prose

    n = report.need
    where = f"{n.region}/{n.zone}" if n.zone else n.region
    head = f"preflight {n.stack}: {n.nodes} x {n.instance_type} ({n.provider} {where}, {n.billing})"
    lines = wrap_prose(head, width, "", "  ")
    for c in report.checks:
        lines += wrap_prose(f"[{c.state}] {c.name}: {c.detail}", width, "", "    ")
        if c.fix:
            lines += wrap_prose(f"fix: {c.fix}", width, "  ", "    ")
    failed = sum(c.state == FAIL for c in report.checks)
    unknown = sum(c.state == UNKNOWN for c in report.checks)
    verdict = (
        "nothing stands in the way of `pulumi up`"
        if report.status == 0
        else f"{failed} failed, {unknown} not answered: fix them before `pulumi up`"
    )
    lines += wrap_prose(
        f"{verdict} ({len(report.calls)} calls, {report.seconds:.2f} s)", width, "", "  "
    )
    return lines


def file_requests(
    report: Report, confirm: Callable[[str], bool], say: Callable[[str], None]
) -> int:
    """``--request-quota``: for each short quota of the stack (a FAIL check carrying a
    :class:`QuotaAsk`), ask the person, then file it through the cloud's
    ``request_quota(ask, calls)`` where its preflight.py has one; where the cloud takes
    such requests only by hand (or gpufleet cannot call its API), print the documented
    step instead. Nothing is filed without ``confirm`` answering True. 0 when every
    request asked for was filed (or none was needed), 1 when one failed."""
    n = report.need
    asks = [(c, c.ask) for c in report.checks if c.state == FAIL and c.ask is not None]
    if not asks:
        say("--request-quota: no short quota to request")
        return 0
    try:
        filer = getattr(clouds.module(n.provider, "preflight"), "request_quota", None)
    except LookupError:
        filer = None
    status = 0
    for check, ask in asks:
        assert ask is not None
        if ask.step or filer is None:
            say(f"{check.name}: {n.provider} takes this request by hand: {ask.step or check.fix}")
            continue
        if not confirm(f"file a request for {ask.value} {ask.what} in {ask.where}? [y/N] "):
            say(f"{check.name}: not filed")
            continue
        calls = Calls()
        try:
            filed = filer(ask, calls)
        except Exception as exc:  # the cloud refused or could not be reached: one line
            first = (str(exc).splitlines() or [""])[0]
            say(f"{check.name}: not filed: {first}")
            status = 1
            continue
        more = f", {filed.detail}" if filed.detail else ""
        say(f"{check.name}: filed: request {filed.request_id}, status {filed.status}{more}")
    return status
