"""What the cloud modules share: how a child resource is declared, how a zone is chosen, how
an allowed network is split by family, the shape of an IAM-style policy document, the tag
pairs that scope a stop to the stack, and the bucket lifecycle's ages.

Only what is the same on every cloud that uses it lives here; each cloud's own spelling
(resource classes, policy syntax, names) stays in its module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pulumi

from infra.config import ConfigError
from infra.reaper import tags as T

# Objects move to the cheaper tier after gpufleet:bucketArchiveDays without a change, and to
# the archive tier this many days later (every cloud's lifecycle rule says the same).
ARCHIVE_AFTER_COOL_DAYS = 180
# Multipart uploads left unfinished this long are removed (their parts are billed).
ABORT_MULTIPART_DAYS = 7


def child_opts(parent: pulumi.Resource, **kw: object) -> pulumi.ResourceOptions:
    """Options of a resource declared inside a component: the component is its parent."""
    return pulumi.ResourceOptions(parent=parent, **kw)  # type: ignore[arg-type]


def pinned_or_first_zone(
    zone: str | None, offered: Callable[[], pulumi.Output[list[str]]], problem: str
) -> pulumi.Output[str]:
    """``zone`` when gpufleet:zone pins one; else the first by name of the zones
    ``offered`` lists (the cloud is asked only then). None offered is a ConfigError with
    ``problem`` as its line: a ValueError, so callers tell bad config from bugs through
    Pulumi's wrapping (`plan.py` exits 2 on it)."""
    if zone:
        return pulumi.Output.from_input(zone)

    def first(zones: list[str]) -> str:
        if not zones:
            raise ConfigError([problem])
        return sorted(zones)[0]

    return offered().apply(first)


def ipv4_or_ipv6(cidr: str) -> tuple[str | None, str | None]:
    """(IPv4 range, IPv6 range) for a security rule's source: one of them is ``cidr``."""
    return (None, cidr) if ":" in cidr else (cidr, None)


def policy_json(version: str, statements: list[dict[str, Any]]) -> str:
    """An IAM-style policy document (AWS IAM, Alibaba RAM): ``Version`` then ``Statement``."""
    return json.dumps({"Version": version, "Statement": statements})


def managed_stack_tags(stack: str) -> tuple[tuple[str, str], ...]:
    """The (tag, value) pairs that make an instance this stack's managed one: the only
    instances a reaper may stop (each cloud writes its own condition from them)."""
    return ((T.MANAGED_BY, T.MANAGED_BY_VALUE), (T.STACK, stack))
