"""The throwaway cloud's policy facts: an instance sized by its `size` input, a reaper
function scheduled by its own `schedule` input, and a firewall's SSH sources."""

from __future__ import annotations

from typing import Any

from policy.resources import SSH_FIX, Bill, CloudFacts, Resource, as_list, world

NAME = "examplecloud"
INSTANCE = "examplecloud:compute:Instance"
FUNCTION = "examplecloud:compute:Function"
FIREWALL = "examplecloud:network:Firewall"


def bill(r: Resource, itype: str) -> Bill:
    return Bill(NAME, itype, "on-demand")


def guard_env(fn: Resource) -> dict[str, Any]:
    env = fn.get("env")
    return env if isinstance(env, dict) else {}


def guard_scheduled(resources: list[Resource], fn: Resource) -> bool:
    return bool(fn.get("schedule"))


def ssh(r: Resource) -> list[str]:
    if r.type != FIREWALL:
        return []
    cidrs = [c for c in as_list(r.get("sshFrom")) if world(c)]
    return [f"{r.label} lets {c} reach SSH (port 22): {SSH_FIX}" for c in cidrs]


FACTS = CloudFacts(
    name=NAME,
    package=NAME,
    instances={INSTANCE: ("size",)},
    bill=bill,
    guard_fix="declare an examplecloud Function with a schedule",
    guard_functions=(FUNCTION,),
    guard_env=guard_env,
    guard_scheduled=guard_scheduled,
    ssh=ssh,
)
