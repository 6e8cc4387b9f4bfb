"""Cloud limits a stack would hit at `pulumi up`, checked when its config is parsed.

Each cloud folder's ``limits.toml`` holds that cloud's numbers, each with its source: how many
rules one security group takes and how many the cloud's program declares for a stack, how
many tags a resource takes (and how long a key or value may be), and the names the program
derives from the stack's name with each name's longest allowed length. :func:`problems` turns
them into one line per broken limit, which infra.config reports with every other problem
before anything is declared. A cloud without the file has no such checks. No SDK, no Pulumi.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import clouds
from infra.reaper import tags as T

FILE = "limits.toml"
# Every tag gpufleet puts on a node, its most-tagged resource: the watchdog's and reaper's
# contract (T.TAG_KEYS; keep-alive-until is written later, by the watchdog for `fab
# keep-alive`, and protected by a person) and the Name every node carries. User tags come on
# top, so a node at the limit would refuse the lease tag the day it is needed.
OWN_TAGS = frozenset({*T.TAG_KEYS, "Name"})


class LimitsError(ValueError):
    """A limits.toml that cannot be read as this module expects."""


@dataclass(frozen=True)
class Source:
    url: str
    says: str
    retrieved: str


@dataclass(frozen=True)
class RuleLimit:
    """One security group (NSG) per stack: its size limit and what the program puts in it.
    ``inbound``/``outbound``: rules besides one per SSH network, by family ("ipv4", "ipv6")
    where the cloud counts the families apart (``per_family``), else under "any"."""

    what: str
    quota: str
    source: str
    per_family: bool
    inbound: Mapping[str, int]
    outbound: Mapping[str, int]
    inbound_max: int | None = None
    outbound_max: int | None = None
    total_max: int | None = None
    ssh_max: int | None = None
    ssh_max_why: str = ""
    ssh_max_source: str = ""


@dataclass(frozen=True)
class TagLimit:
    """How many tags a resource takes and how long each may be; ``refused_key_prefixes``:
    the key prefixes the cloud keeps for itself (compared in lower case), which infra.config
    refuses on every cloud so a stack's tags stay valid wherever it moves."""

    source: str
    max: int
    key_max: int
    value_max: int
    value_min: int = 0
    refused_key_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NameLimit:
    """A name the program derives: ``template`` with {stack} (and {node}, the last node's
    index), plus ``random_suffix`` characters Pulumi adds, at most ``max`` long."""

    resource: str
    template: str
    max: int
    source: str
    random_suffix: int = 0
    # a regex the whole name must match where the cloud restricts more than the stack name
    # does (host names: no "--", no "-" at the end), and how a message says it
    pattern: str = ""
    pattern_says: str = ""

    def length(self, stack: str, nodes: int) -> int:
        return len(self.template.format(stack=stack, node=nodes - 1)) + self.random_suffix

    def longest_stack(self, nodes: int) -> int:
        return self.max - (self.length("", nodes))


@dataclass(frozen=True)
class CloudLimits:
    name: str
    title: str
    sources: Mapping[str, Source]
    rules: RuleLimit | None
    tags: TagLimit | None
    names: tuple[NameLimit, ...]

    def longest_stack_name(self, nodes: int = 1) -> int | None:
        """The longest stack name whose derived names all fit (None: no name limit)."""
        return min((n.longest_stack(nodes) for n in self.names), default=None)


def _take(raw: Mapping[str, Any], where: str, kind: type) -> Any:
    extra = set(raw) - {f.name for f in dataclasses.fields(kind)}
    if extra:
        raise LimitsError(f"{where}: unknown keys {sorted(extra)}")
    try:
        return kind(**raw)
    except TypeError as exc:
        raise LimitsError(f"{where}: {exc}") from None


def parse(name: str, data: Mapping[str, Any], where: str = FILE) -> CloudLimits:
    """One cloud's limits from its parsed TOML; LimitsError naming what is wrong."""
    sources = {
        k: _take(v, f"{where} [sources.{k}]", Source) for k, v in data.get("sources", {}).items()
    }
    rules = (
        _take(data["security_group"], f"{where} [security_group]", RuleLimit)
        if "security_group" in data
        else None
    )
    tags = _take(data["tags"], f"{where} [tags]", TagLimit) if "tags" in data else None
    if tags is not None:
        prefixes = tuple(str(p).lower() for p in tags.refused_key_prefixes)
        tags = dataclasses.replace(tags, refused_key_prefixes=prefixes)
    names = tuple(
        _take(n, f"{where} [[names]] {i}", NameLimit) for i, n in enumerate(data.get("names", ()))
    )
    cited = [x.source for x in (rules, tags, *names) if x is not None]
    if rules and rules.ssh_max_source:
        cited.append(rules.ssh_max_source)
    for key in cited:
        if key not in sources:
            raise LimitsError(f"{where}: source {key!r} is not one of [sources]")
    for n in names:
        if "{stack}" not in n.template:
            raise LimitsError(f"{where}: name template {n.template!r} has no {{stack}}")
        if bool(n.pattern) != bool(n.pattern_says):
            raise LimitsError(f"{where}: {n.template!r}: pattern and pattern_says go together")
        re.compile(n.pattern)
    extra = set(data) - {"title", "sources", "security_group", "tags", "names"}
    if extra:
        raise LimitsError(f"{where}: unknown keys {sorted(extra)}")
    return CloudLimits(name, str(data.get("title", name)), sources, rules, tags, names)


@functools.cache
def load(name: str) -> CloudLimits | None:
    """The cloud's limits (its folder's limits.toml), or None when it has none."""
    folder = clouds.folders(FILE).get(name)
    if folder is None:
        return None
    path: Path = folder / FILE
    with path.open("rb") as f:
        data = tomllib.load(f)
    return parse(name, data, f"infra/clouds/{name}/{FILE}")


def refused_tag_key_prefixes(names: Iterable[str]) -> tuple[str, ...]:
    """The tag key prefixes any of ``names`` keeps for itself ([tags] refused_key_prefixes), in the
    clouds' order, each once."""
    found: dict[str, None] = {}
    for name in names:
        cloud = load(name)
        if cloud and cloud.tags:
            found.update(dict.fromkeys(cloud.tags.refused_key_prefixes))
    return tuple(found)


def tag_value_max(names: Iterable[str]) -> int | None:
    """The longest tag value all of ``names`` take (the strictest [tags] value_max), or None
    when none of them declares one."""
    found = [c.tags.value_max for c in map(load, names) if c and c.tags]
    return min(found, default=None)


def longest_stack_name(provider: str, nodes: int = 1) -> int | None:
    """The longest stack name ``provider``'s derived names fit (None: no name limit there)."""
    cloud = load(provider)
    return cloud.longest_stack_name(nodes) if cloud else None


def rule_counts(limits: RuleLimit, ssh_cidrs: Iterable[str]) -> dict[tuple[str, str], int]:
    """How many rules the stack's group gets: {(direction, family): count}, the family being
    "ipv4"/"ipv6" where the cloud counts them apart, else "any"."""
    counts: dict[tuple[str, str], int] = {}
    for direction, fixed in (("inbound", limits.inbound), ("outbound", limits.outbound)):
        for family, n in fixed.items():
            counts[direction, family] = int(n)
    for cidr in ssh_cidrs:
        family = f"ipv{ipaddress.ip_network(cidr).version}" if limits.per_family else "any"
        counts["inbound", family] = counts.get(("inbound", family), 0) + 1
    return counts


def _rule_problems(cloud: CloudLimits, rules: RuleLimit, cidrs: tuple[str, ...]) -> list[str]:
    fix = "merge neighbouring networks into wider CIDRs"
    cap = f"{cloud.title} allows"
    if rules.ssh_max is not None and len(cidrs) > rules.ssh_max:
        return [
            f"{len(cidrs)} networks: {cap} at most {rules.ssh_max} SSH rules in the stack's "
            f"{rules.what} ({rules.ssh_max_why}): list at most {rules.ssh_max} ({fix})"
        ]
    counts = rule_counts(rules, cidrs)
    found = []
    if rules.total_max is not None:
        total = sum(counts.values())
        if total > rules.total_max:
            fixed = total - len(cidrs)
            found.append(
                f"{len(cidrs)} networks make {total} rules in the stack's {rules.what} "
                f"({fixed} of them gpufleet's own); {cap} {rules.total_max} ({rules.quota}): "
                f"list at most {rules.total_max - fixed} networks ({fix})"
            )
    for (direction, family), n in sorted(counts.items()):
        most = rules.inbound_max if direction == "inbound" else rules.outbound_max
        if most is not None and n > most:
            label = "" if family == "any" else f" {family.replace('ipv', 'IPv')}"
            fixed = n - sum(
                1
                for c in cidrs
                if direction == "inbound"
                and (family == "any" or f"ipv{ipaddress.ip_network(c).version}" == family)
            )
            found.append(
                f"{n - fixed}{label} networks make {n} {direction}{label} rules in the stack's "
                f"{rules.what}; {cap} {most} ({rules.quota}): list at most {most - fixed}"
                f"{label} networks ({fix})"
            )
    return found


def _tag_problems(
    cloud: CloudLimits, tags: TagLimit, user: Mapping[str, str]
) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for key, value in user.items():
        if len(key) > tags.key_max:
            found.append(
                (
                    f"tags.{key}",
                    f"the key is {len(key)} characters; {cloud.title} takes at most "
                    f"{tags.key_max}: shorten it",
                )
            )
        if len(value) > tags.value_max:
            found.append(
                (
                    f"tags.{key}",
                    f"the value is {len(value)} characters; {cloud.title} takes at most "
                    f"{tags.value_max}: shorten it",
                )
            )
        if len(value) < tags.value_min:
            found.append(
                (
                    f"tags.{key}",
                    f"{cloud.title} refuses an empty tag value: give it a value or drop the tag",
                )
            )
    total = len(OWN_TAGS | set(user))
    if total > tags.max:
        extra = total - len(OWN_TAGS)
        found.append(
            (
                "tags",
                f"{extra} tags plus gpufleet's own {len(OWN_TAGS)} make {total} on each node; "
                f"{cloud.title} allows {tags.max} per resource: drop {total - tags.max} "
                f"(at most {tags.max - len(OWN_TAGS)} of your own)",
            )
        )
    return found


def _name_problem(cloud: CloudLimits, stack: str, nodes: int) -> str | None:
    """The one name that breaks first, as one line (the tightest limit binds)."""
    broken = [n for n in cloud.names if n.length(stack, nodes) > n.max]
    if not broken:
        for n in cloud.names:
            name = n.template.format(stack=stack, node=0)
            if n.pattern and not re.fullmatch(n.pattern, name):
                fixed = re.sub("-+", "-", stack).strip("-") or "my-stack"
                return (
                    f"stack name {stack!r} gives the {cloud.title} {n.resource} {name!r}, "
                    f"which takes {n.pattern_says}: rename the stack, e.g. {fixed!r}"
                )
        return None
    worst = min(broken, key=lambda n: n.longest_stack(nodes))
    longest = cloud.longest_stack_name(nodes)
    shown = worst.template.format(stack="<stack>", node=nodes - 1)
    random = f" + {worst.random_suffix} random" if worst.random_suffix else ""
    return (
        f"stack name {stack!r} is {len(stack)} characters; {cloud.title} stacks take at most "
        f"{longest} ({worst.resource} {shown}{random} may be {worst.max} characters): rename "
        "the stack"
    )


def problems(
    provider: str | None,
    stack: str,
    nodes: int,
    ssh_cidrs: tuple[str, ...],
    tags: Mapping[str, str],
) -> list[tuple[str, str]]:
    """(key, one line) for each cloud limit the stack would break on ``provider``."""
    cloud = load(provider) if provider else None
    if cloud is None:
        return []
    found: list[tuple[str, str]] = []
    name = _name_problem(cloud, stack, nodes)
    if name:
        found.append(("stack", name))
    if cloud.rules:
        found += [("sshCidrs", m) for m in _rule_problems(cloud, cloud.rules, ssh_cidrs)]
    if cloud.tags:
        found += _tag_problems(cloud, cloud.tags, tags)
    return found
