"""What the policy pack knows about Azure's resource types: SSH in network security
groups, encryption at host, storage accounts and containers that stay private and
TLS-only, the Functions app that runs the reaper on its timer, and how a VM is billed.
policy/rules.py finds this module by its folder and asks it about the resources whose
type token starts with ``azure-native:``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policy.resources import (
    SSH_FIX,
    Bill,
    CloudFacts,
    Resource,
    StackFinding,
    as_list,
    known,
    positive,
    world,
)

NAME = "azure"

VM = "azure-native:compute:VirtualMachine"
FUNCTION_APP = "azure-native:web:WebApp"
NSG = "azure-native:network:NetworkSecurityGroup"
NSG_RULE = "azure-native:network:SecurityRule"
STORAGE_ACCOUNT = "azure-native:storage:StorageAccount"
CONTAINER = "azure-native:storage:BlobContainer"


def _rule_opens_ssh(rule: Mapping[str, Any]) -> bool:
    """An inbound Allow rule whose destination ports include 22 (a range, a list or '*')."""
    if str(rule.get("direction")) != "Inbound" or str(rule.get("access")) != "Allow":
        return False
    if str(rule.get("protocol") or "*").lower() not in ("tcp", "*"):
        return False
    for ports in [rule.get("destinationPortRange"), *as_list(rule.get("destinationPortRanges"))]:
        text = str(ports or "")
        if text == "*":
            return True
        low, _, high = text.partition("-")
        if low.isdigit() and int(low) <= 22 <= int(high or low):
            return True
    return False


def ssh_findings(r: Resource) -> list[str]:
    if r.type not in (NSG, NSG_RULE):
        return []
    found: list[str] = []
    rules = as_list(r.get("securityRules")) if r.type == NSG else [r.inputs]
    for rule in rules:
        if not isinstance(rule, Mapping) or not _rule_opens_ssh(rule):
            continue
        sources = [rule.get("sourceAddressPrefix"), *as_list(rule.get("sourceAddressPrefixes"))]
        for cidr in sources:
            if world(cidr) or str(cidr).lower() in ("*", "internet", "any"):
                found.append(
                    f"{r.label}: rule {rule.get('name')} lets {cidr} reach SSH (port 22): {SSH_FIX}"
                )
    return found


def disk_findings(r: Resource) -> list[str]:
    if r.type != VM:
        return []
    # managed disks are always encrypted at rest with platform keys; encryption at host
    # adds the temp disk, the disk caches and local NVMe, which hold scratch
    at_host = r.get("securityProfile", "encryptionAtHost")
    if not known(at_host) or at_host is True:
        return []
    return [
        f"{r.label}: encryption at host is off, so the temp disk, caches and local NVMe "
        "are not encrypted; set security_profile=SecurityProfileArgs("
        "encryption_at_host=True)"
    ]


def _account_problems(a: Resource) -> list[StackFinding]:
    found: list[StackFinding] = []
    public = a.get("allowBlobPublicAccess")
    if known(public) and public is not False:
        found.append(
            (a, f"{a.label} may serve blobs anonymously: set allow_blob_public_access=False")
        )
    https = a.get("enableHttpsTrafficOnly")
    if known(https) and https is False:
        found.append((a, f"{a.label} accepts plain HTTP: set enable_https_traffic_only=True"))
    tls = a.get("minimumTlsVersion")
    if known(tls) and tls not in ("TLS1_2", "TLS1_3"):
        found.append(
            (a, f"{a.label} accepts TLS below 1.2 ({tls}): set minimum_tls_version='TLS1_2'")
        )
    return found


def storage_findings(resources: Sequence[Resource], a: Resource) -> list[StackFinding]:
    """A storage account is private and TLS-only by its own properties; a container must
    not allow anonymous reads."""
    if a.type == STORAGE_ACCOUNT:
        return _account_problems(a)
    if a.type == CONTAINER:
        access = a.get("publicAccess")
        if known(access) and access not in (None, "None"):
            return [(a, f"{a.label} allows anonymous {access} reads: set public_access='None'")]
    return []


GUARD_FIX = (
    "declare the reaper (an azure-native web.WebApp of kind functionapp,linux with "
    "GPUFLEET_STACK=<stack>, GPUFLEET_APPLY=true, GPUFLEET_SCHEDULE and "
    "WEBSITE_RUN_FROM_PACKAGE in its app settings): the IdleGuard component does all of this"
)


def guard_env(fn: Resource) -> Mapping[str, Any] | None:
    """The Functions app's settings by name; None when not known yet."""
    settings = fn.get("siteConfig", "appSettings")
    if not known(settings):
        return None
    return {str(s.get("name")): s.get("value") for s in as_list(settings) if isinstance(s, Mapping)}


def guard_scheduled(resources: Sequence[Resource], fn: Resource) -> bool:
    """An Azure Functions app runs the reaper on its package's timer trigger, which reads
    its NCRONTAB from the GPUFLEET_SCHEDULE setting: a Linux function app with a package and
    a schedule set is scheduled (the trigger itself lives in the package, not the program)."""
    kind = fn.get("kind")
    if known(kind) and "functionapp" not in str(kind):
        return False
    if fn.get("enabled") is False:
        return False
    env = guard_env(fn)
    if env is None:
        return True
    return bool(env.get("GPUFLEET_SCHEDULE")) and bool(env.get("WEBSITE_RUN_FROM_PACKAGE"))


def bill(r: Resource, itype: str) -> Bill:
    if r.get("priority") == "Spot":
        cap = positive(r.get("billingProfile", "maxPrice"))  # -1: up to on-demand
        return Bill(NAME, itype, "spot", cap)
    return Bill(NAME, itype, "on-demand")


FACTS = CloudFacts(
    name=NAME,
    package="azure-native",
    # Azure nests the VM's size in its hardware profile
    instances={VM: ("hardwareProfile", "vmSize")},
    bill=bill,
    guard_fix=GUARD_FIX,
    guard_functions=(FUNCTION_APP,),
    guard_env=guard_env,
    guard_scheduled=guard_scheduled,
    ssh=ssh_findings,
    disks=disk_findings,
    storage=storage_findings,
)
