"""The guardrails as pure functions over the resources a stack declares.

Every rule reads plain data: a list of :class:`policy.resources.Resource` (type token,
logical name, inputs in the engine's camelCase). The same functions run in two places:

* inside ``pulumi preview/up --policy-pack policy/`` (``policy/pack.py`` turns the engine's
  ``PolicyResource`` objects into resources), and
* offline, in ``scripts/plan.py``, on the resources Pulumi's mocks recorded
  (``policy/plan_check.py``).

What a rule needs to know about one cloud's resource types (its type tokens, where an
instance keeps its size, how it is billed, how its reaper is scheduled, its own SSH,
disk and bucket checks) lives in that cloud's folder, infra/clouds/<name>/rules.py,
found by listing the folders: the rules here only ask the resource's own cloud. Inputs
not known yet during a preview, and how one resource refers to another, are
policy/resources.py's business.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from infra import clouds
from infra.reaper import tags as T
from policy.resources import (
    Bill,
    BucketKind,
    Check,
    CloudFacts,
    Resource,
    StackCheck,
    StackFinding,
    as_list,
    attached,
    is_true,
    known,
    positive,
)

PACK_NAME = "gpufleet-guardrails"
PACK_VERSION = "0.1.0"
MANDATORY = "mandatory"
ADVISORY = "advisory"
DISABLED = "disabled"
LEVELS = (MANDATORY, ADVISORY, DISABLED)

# ------------------------------------------------------------------------------ the clouds

PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
DEV_TIERS = ("t4x1",)  # "the cheap dev box"; any stack tagged purpose=dev counts too

# What the reaper reads from its environment (infra/reaper/handler.py).
ENV_STACK = "GPUFLEET_STACK"
ENV_APPLY = "GPUFLEET_APPLY"


@functools.cache
def _facts(path: tuple[str, ...]) -> Mapping[str, CloudFacts]:
    found: dict[str, CloudFacts] = {}
    for name in clouds.names("rules.py"):
        facts = getattr(clouds.module(name, "rules"), "FACTS", None)
        if not isinstance(facts, CloudFacts) or facts.name != name:
            raise TypeError(
                f"infra/clouds/{name}/rules.py must declare FACTS = CloudFacts(name={name!r}, "
                "...) (policy.resources.CloudFacts)"
            )
        found[facts.package] = facts
    return MappingProxyType(found)


def cloud_facts() -> Mapping[str, CloudFacts]:
    """Each cloud's policy facts by the package of its type tokens, from the rules.py in
    the cloud's folder (infra.clouds lists the folders: no table of clouds here)."""
    return _facts(tuple(clouds.__path__))


def cloud_of(type_: str) -> CloudFacts | None:
    """The cloud whose type tokens ``type_`` belongs to; None for a package no cloud
    folder declares (not any cloud's business: no rule judges it)."""
    return cloud_facts().get(type_.split(":", 1)[0])


def bucket_kind(type_: str) -> BucketKind | None:
    facts = cloud_of(type_)
    return facts.bucket_kinds.get(type_) if facts else None


def own_name_key(type_: str) -> str | None:
    """The input, besides id/ARN/name, that other resources name this type by (a bucket's
    ``bucket``), or None."""
    facts = cloud_of(type_)
    return facts.own_names.get(type_) if facts else None


def _instance_cloud(resource: Resource) -> CloudFacts | None:
    facts = cloud_of(resource.type)
    return facts if facts is not None and resource.type in facts.instances else None


def instance_size(resource: Resource) -> Any:
    """The instance's type/size input (None when the resource is no instance)."""
    facts = _instance_cloud(resource)
    return resource.get(*facts.instances[resource.type]) if facts else None


def is_gpu_instance(resource: Resource, gpu_types: Callable[[str, str], bool]) -> bool:
    facts = _instance_cloud(resource)
    itype = instance_size(resource)
    return facts is not None and isinstance(itype, str) and gpu_types(facts.name, itype)


def catalog_gpu_types(provider: str, instance_type: str) -> bool:
    """GPU instance types: the catalog's, plus any type of a GPU family the reaper knows."""
    from infra.catalog import load_catalog
    from infra.reaper.catalog_data import load_table

    if (provider, instance_type) in load_catalog().instances:
        return True
    return load_table().gpu_family_known(instance_type)


def _ask(r: Resource, check: Callable[[CloudFacts], Check]) -> list[str]:
    """What the resource's own cloud finds (nothing for a type no cloud declares)."""
    facts = cloud_of(r.type)
    return check(facts)(r) if facts else []


def _ask_each(
    resources: Sequence[Resource], check: Callable[[CloudFacts], StackCheck]
) -> list[StackFinding]:
    """What each resource's own cloud finds about it, in the resources' order."""
    found: list[StackFinding] = []
    for r in resources:
        facts = cloud_of(r.type)
        if facts is not None:
            found += check(facts)(resources, r)
    return found


# ------------------------------------------------------------------- per-cloud checks


def check_ssh_not_world(r: Resource) -> list[str]:
    return _ask(r, lambda c: c.ssh)


def check_imdsv2(r: Resource) -> list[str]:
    return _ask(r, lambda c: c.imdsv2)


def check_disks_encrypted(r: Resource) -> list[str]:
    return _ask(r, lambda c: c.disks)


def check_no_blind_stop_alarms(r: Resource) -> list[str]:
    return _ask(r, lambda c: c.stop_alarms)


def check_buckets_encrypted(resources: Sequence[Resource]) -> list[StackFinding]:
    return _ask_each(resources, lambda c: c.bucket_encryption)


# ------------------------------------------------------------------------------- buckets


def _statements(document: Any) -> list[Mapping[str, Any]] | None:
    """A policy document's statements; None when the document is not known yet."""
    if not known(document):
        return None
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return []
    if not isinstance(document, Mapping):
        return []
    return [s for s in as_list(_element(document, "Statement")) if isinstance(s, Mapping)]


def _element(node: Mapping[str, Any], name: str) -> Any:
    """A policy element by its name in any letter case: IAM and RAM write ``Statement``,
    Tencent CAM and COS ``statement`` (their element names are lowercase only)."""
    return next((v for k, v in node.items() if str(k).lower() == name.lower()), None)


def _denies_insecure_transport(statements: list[Mapping[str, Any]], kind: BucketKind) -> bool:
    key, service, operator = kind.tls_key.lower(), kind.service, kind.tls_operator.lower()
    for s in statements:
        if str(_element(s, "Effect")).lower() != "deny":
            continue
        principal = _element(s, "Principal")
        if isinstance(principal, Mapping):
            principal = principal.get(kind.principal_key)
        if not set(kind.anyone) & {str(x) for x in as_list(principal)}:
            continue
        actions = as_list(_element(s, "Action"))
        if f"{service}:*" not in actions and "*" not in actions:
            continue
        conditions = _element(s, "Condition")
        bool_block = (
            next((v for k, v in conditions.items() if str(k).lower() == operator), None)
            if isinstance(conditions, Mapping)
            else None
        )
        if not isinstance(bool_block, Mapping):
            continue
        for k, v in bool_block.items():
            if str(k).lower() == key and "false" in [str(x).lower() for x in as_list(v)]:
                return True
    return False


def _public_access_problem(
    resources: Sequence[Resource], b: Resource, kind: BucketKind
) -> StackFinding | None:
    """Public access blocked: some block attached to the bucket with every flag on (a flag
    not known yet during preview is given the benefit of the doubt), or, on a cloud with
    no such block, the bucket's own ACL."""
    if kind.required_acl is not None:
        acl = b.get("acl")
        if known(acl) and acl != kind.required_acl:
            return (b, f"{b.label} may become public: its ACL is {acl!r}; set acl='private'")
        return None
    blocks = attached(resources, (kind.block_type,), b)
    if any(
        all(is_true(blk.get(f)) or not known(blk.get(f)) for f in kind.block_flags)
        for blk in blocks
    ):
        return None
    if blocks:
        off = [f for f in kind.block_flags if not is_true(blocks[0].get(f))]
        why = f"its public access block leaves {', '.join(off)} off"
    else:
        why = "it has no public access block"
    return (b, f"{b.label} may become public: {why}; {kind.block_fix}")


def check_buckets_private_tls(resources: Sequence[Resource]) -> list[StackFinding]:
    found: list[StackFinding] = _ask_each(resources, lambda c: c.storage)
    for b in resources:
        kind = bucket_kind(b.type)
        if kind is None:
            continue
        public = _public_access_problem(resources, b, kind)
        if public is not None:
            found.append(public)
        # No public canned ACL, neither on the bucket nor as a separate ACL resource.
        for holder in [b, *attached(resources, kind.acl_types, b)]:
            acl = holder.get("acl")
            if isinstance(acl, str) and acl in PUBLIC_ACLS:
                found.append(
                    (
                        holder,
                        f"{holder.label} sets the canned ACL {acl!r} on {b.name}: use 'private'",
                    )
                )
        # TLS only: some attached policy denies everything when the request is plain HTTP.
        documents = [
            _statements(p.get("policy")) for p in attached(resources, (kind.policy_type,), b)
        ]
        if not any(d is None or _denies_insecure_transport(d, kind) for d in documents):
            found.append(
                (
                    b,
                    f"{b.label} accepts plain HTTP: declare a {kind.policy_fix} for it with a "
                    f"statement that denies {kind.service}:* to every principal when "
                    f"{kind.tls_key} is false ({kind.tls_operator})",
                )
            )
    return found


# ------------------------------------------------------------------------- GPU instance tags

# What the watchdog and the reaper read (infra/reaper/tags.py; docs/stacks.md, "Contract: tags").
_TTL_OPT_OUT = ("0", "off", "none", "never", "false", "no")


def _positive_number(text: Any) -> bool:
    try:
        value = float(str(text))
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


def tag_problems(tags: Mapping[str, Any]) -> list[str]:
    problems = []
    if tags.get(T.MANAGED_BY) != T.MANAGED_BY_VALUE:
        problems.append(f"{T.MANAGED_BY}={T.MANAGED_BY_VALUE}")
    for key in (T.STACK, T.TIER):
        if not isinstance(tags.get(key), str) or not tags[key].strip():
            problems.append(f"{key} (the stack/tier name)")
    if tags.get(T.ROLE) not in ("head", "worker"):
        problems.append(f"{T.ROLE}=head|worker")
    if not _positive_number(tags.get(T.IDLE_MINUTES)):
        problems.append(f"{T.IDLE_MINUTES} (minutes > 0)")
    ttl = tags.get(T.TTL_HOURS)
    if not (
        isinstance(ttl, str) and (ttl.strip().lower() in _TTL_OPT_OUT or _positive_number(ttl))
    ):
        problems.append(f"{T.TTL_HOURS} (hours, or 'off')")
    if tags.get(T.WATCHDOG) != "on":
        problems.append(f"{T.WATCHDOG}=on")
    return problems


def check_gpu_tags(r: Resource, gpu_types: Callable[[str, str], bool]) -> list[str]:
    if not is_gpu_instance(r, gpu_types) or not known(r.inputs.get("tags")):
        return []
    problems = tag_problems(r.tags)
    if not problems:
        return []
    return [
        f"{r.label} ({instance_size(r)}) lacks the gpufleet tags the watchdog and "
        f"the reaper read: {', '.join(problems)}; declare it with infra.nodes.node_tags(...) "
        "as its tags"
    ]


# ------------------------------------------------------------------------------ idle guard


def _function_problem(env: Mapping[str, Any] | None, fn: Resource, stack: str) -> str | None:
    """Why this function (whose environment is ``env``, None when not known yet) does not
    guard `stack`, or None when it does (or cannot tell yet)."""
    if env is None:
        return None
    if known(env.get(ENV_STACK)) and env.get(ENV_STACK) != stack:
        return f"{fn.label} reaps stack {env.get(ENV_STACK)!r}, not {stack!r} ({ENV_STACK})"
    if known(env.get(ENV_APPLY)) and str(env.get(ENV_APPLY)).lower() != "true":
        return f"{fn.label} only logs ({ENV_APPLY} is not 'true'): a dry run stops nothing"
    return None


def _unguarded(
    resources: Sequence[Resource], inst: Resource, cloud: CloudFacts, tags: Mapping[str, Any]
) -> list[str]:
    """Why the GPU instance is not covered by an idle guard (empty when it is)."""
    stack = tags.get(T.STACK)
    why: list[str] = []
    if tags.get(T.WATCHDOG) != "on":
        why.append(f"its {T.WATCHDOG} tag is not 'on', so nothing expects a node watchdog")
    functions = [r for r in resources if r.type in cloud.guard_functions]
    guarding = []
    for fn in functions:
        problem = _function_problem(cloud.guard_env(fn), fn, str(stack))
        if problem:
            why.append(problem)
        elif cloud.guard_scheduled(resources, fn):
            guarding.append(fn)
        else:
            why.append(f"{fn.label} has no enabled schedule that can invoke it")
    if not functions:
        why.append("the stack declares no scheduled reaper function")
    if not isinstance(stack, str) or not stack:
        why.append(f"it has no {T.STACK} tag, so no reaper would find it")
    covered = tags.get(T.WATCHDOG) == "on" and isinstance(stack, str) and stack and guarding
    return [] if covered else why


def check_idle_guard(
    resources: Sequence[Resource], gpu_types: Callable[[str, str], bool]
) -> list[StackFinding]:
    found: list[StackFinding] = []
    for inst in resources:
        cloud = _instance_cloud(inst)
        tags = inst.inputs.get("tags")
        if cloud is None or not is_gpu_instance(inst, gpu_types) or not known(tags):
            continue
        why = _unguarded(resources, inst, cloud, tags if isinstance(tags, Mapping) else {})
        if why:
            found.append(
                (
                    inst,
                    f"{inst.label} is not covered by an idle guard: {'; '.join(why)}; "
                    f"{cloud.guard_fix}",
                )
            )
    return found


# ------------------------------------------------------------------------------------ cost


def instance_bill(r: Resource) -> Bill | None:
    """How the instance is paid for, as its own cloud reads it; None for no instance."""
    cloud = _instance_cloud(r)
    itype = instance_size(r)
    if cloud is None or not isinstance(itype, str):
        return None
    return cloud.bill(r, itype)


def is_spot(r: Resource) -> bool:
    bill = instance_bill(r)
    return bill is not None and bill.billing == "spot"


# (bill, count) -> (amount per hour for `count` such instances, currency)
Pricer = Callable[[Bill, int], tuple[float, str]]


def catalog_pricer(bill: Bill, count: int) -> tuple[float, str]:
    """The catalog's price, the same figure `make plan` and `make cost` print."""
    from infra.pricing.cost import hourly_estimate

    est = hourly_estimate(
        bill.provider,
        bill.instance_type,
        count,
        bill.billing,
        spot_max_price=bill.spot_max_price,
        subscription_months=bill.months,
    )
    return float(est["amount"]), str(est["currency"])


def stack_cost(
    resources: Sequence[Resource], pricer: Pricer
) -> tuple[dict[str, float], list[str], list[str]]:
    """({currency: amount per hour}, what was priced, what could not be priced and why)."""
    groups: dict[Bill, int] = {}
    for r in resources:
        bill = instance_bill(r)
        if bill is not None:
            groups[bill] = groups.get(bill, 0) + 1
    totals: dict[str, float] = {}
    priced: list[str] = []
    unpriced: list[str] = []
    for bill, count in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        try:
            amount, currency = pricer(bill, count)
        except (KeyError, ValueError) as exc:
            unpriced.append(f"{count}x {bill.instance_type} ({exc})")
            continue
        totals[currency] = round(totals.get(currency, 0.0) + amount, 4)
        priced.append(f"{count}x {bill.instance_type} {bill.billing}")
    return totals, priced, unpriced


def check_cost_ceiling(
    resources: Sequence[Resource], config: Mapping[str, Any], pricer: Pricer
) -> list[StackFinding]:
    ceiling = positive(config.get("maxHourlyCost"))
    if ceiling is None:
        if is_true(config.get("requireCeiling")) and any(instance_bill(r) for r in resources):
            return [
                (
                    None,
                    "the stack sets no hourly cost ceiling: set gpufleet:maxHourlyCost in the "
                    "stack file (or maxHourlyCost in this policy's pack config)",
                )
            ]
        return []
    totals, priced, unpriced = stack_cost(resources, pricer)
    found: list[StackFinding] = []
    if unpriced:
        found.append(
            (
                None,
                f"cannot check the cost ceiling {ceiling:g}/h: no catalog price for "
                f"{'; '.join(unpriced)}; add the type to infra/catalog or remove the ceiling",
            )
        )
    if len(totals) > 1:
        found.append(
            (
                None,
                f"instances are priced in several currencies ({', '.join(sorted(totals))}): "
                "one ceiling cannot cover them; split the stack per provider",
            )
        )
    for currency, amount in totals.items():
        if amount > ceiling:
            found.append(
                (
                    None,
                    f"the stack costs about {amount:g} {currency}/h ({', '.join(priced)}, catalog "
                    f"price), above the ceiling maxHourlyCost={ceiling:g}: use fewer or smaller "
                    "nodes, spot billing, or raise gpufleet:maxHourlyCost deliberately",
                )
            )
    return found


# ------------------------------------------------------------------------------- dev spot


def check_dev_spot(
    r: Resource, config: Mapping[str, Any], gpu_types: Callable[[str, str], bool]
) -> list[str]:
    if not is_gpu_instance(r, gpu_types) or not known(r.inputs.get("tags")):
        return []
    dev_tiers = [str(t) for t in as_list(config.get("devTiers"))] or list(DEV_TIERS)
    tier = r.tags.get(T.TIER)
    purpose = str(r.tags.get("purpose", "")).strip().lower()
    if tier not in dev_tiers and purpose != "dev":
        return []
    bill = instance_bill(r)
    if bill is None or bill.billing == "spot":
        return []
    why = f"tier {tier}" if tier in dev_tiers else "tag purpose=dev"
    return [
        f"{r.label} is a dev box ({why}) billed {bill.billing}: set gpufleet:billing: spot in "
        "its stack file (typically 30-70 % cheaper; gpufleet's spot nodes stop, not terminate, "
        "on interruption)"
    ]


# ---------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    level: str
    scope: str  # "resource" | "stack"
    # resource rules: (resource, config) -> messages; stack rules: (resources, config) -> findings
    check: Callable[..., Any]
    config_schema: Mapping[str, Any] = field(default_factory=dict)


# The pack settings (JSON schema) of the two rules that take any.
COST_CEILING_SETTINGS: Mapping[str, Any] = {
    "maxHourlyCost": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "ceiling in the provider's currency per hour; overrides "
        "the stack's gpufleet:maxHourlyCost",
    },
    "requireCeiling": {
        "type": "boolean",
        "description": "report stacks with GPU instances that set no ceiling",
    },
}
DEV_SPOT_SETTINGS: Mapping[str, Any] = {
    "devTiers": {
        "type": "array",
        "items": {"type": "string"},
        "description": "tiers that count as dev boxes (default t4x1, a10x1)",
    }
}


def _rules(
    gpu_types: Callable[[str, str], bool] = catalog_gpu_types, pricer: Pricer = catalog_pricer
) -> tuple[Rule, ...]:
    return (
        Rule(
            "ssh-not-open-to-world",
            "SSH (port 22) must never be reachable from 0.0.0.0/0 or ::/0.",
            MANDATORY,
            "resource",
            lambda r, c: check_ssh_not_world(r),
        ),
        Rule(
            "imdsv2-required",
            "Instances and launch templates must require IMDSv2 session tokens.",
            MANDATORY,
            "resource",
            lambda r, c: check_imdsv2(r),
        ),
        Rule(
            "disks-encrypted",
            "Every root, data and scratch disk must be encrypted.",
            MANDATORY,
            "resource",
            lambda r, c: check_disks_encrypted(r),
        ),
        Rule(
            "buckets-encrypted",
            "Every bucket must have default server-side encryption.",
            MANDATORY,
            "stack",
            lambda rs, c: check_buckets_encrypted(rs),
        ),
        Rule(
            "buckets-private-tls-only",
            "Buckets must block public access and deny requests without TLS.",
            MANDATORY,
            "stack",
            lambda rs, c: check_buckets_private_tls(rs),
        ),
        Rule(
            "gpu-instances-tagged",
            "GPU instances must carry the gpufleet tags the watchdog and the reaper read.",
            MANDATORY,
            "resource",
            lambda r, c: check_gpu_tags(r, gpu_types),
        ),
        Rule(
            "gpu-instances-idle-guarded",
            "Every GPU instance must be covered by the node watchdog and a scheduled reaper.",
            MANDATORY,
            "stack",
            lambda rs, c: check_idle_guard(rs, gpu_types),
        ),
        Rule(
            "no-blind-stop-alarms",
            "No CloudWatch alarm may stop, terminate or reboot an instance: only the guards "
            "that honour protected, leases and GPU use stop nodes.",
            MANDATORY,
            "resource",
            lambda r, c: check_no_blind_stop_alarms(r),
        ),
        Rule(
            "cost-ceiling",
            "The stack's GPU instances must cost no more per hour than gpufleet:maxHourlyCost.",
            MANDATORY,
            "stack",
            lambda rs, c: check_cost_ceiling(rs, c, pricer),
            COST_CEILING_SETTINGS,
        ),
        Rule(
            "dev-stacks-use-spot",
            "Dev boxes (tiers t4x1/a10x1, or tagged purpose=dev) should use spot billing.",
            ADVISORY,
            "resource",
            lambda r, c: check_dev_spot(r, c, gpu_types),
            DEV_SPOT_SETTINGS,
        ),
    )


RULES: tuple[Rule, ...] = _rules()


def build_rules(
    gpu_types: Callable[[str, str], bool] = catalog_gpu_types, pricer: Pricer = catalog_pricer
) -> tuple[Rule, ...]:
    """The rules with other lookups plugged in (tests price without the catalog)."""
    return _rules(gpu_types, pricer)


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Violation:
    policy: str
    level: str
    description: str
    message: str
    resource_type: str | None = None  # None: the stack as a whole
    resource_name: str | None = None
    urn: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "level": self.level,
            "description": self.description,
            "resource_type": self.resource_type,
            "resource_name": self.resource_name,
            "urn": self.urn,
            "message": self.message,
        }


class PolicyConfigError(ValueError):
    """The pack configuration (Pulumi's policy config format) names or sets something wrong."""


def normalise_config(
    raw: Mapping[str, Any], rules: Sequence[Rule] = RULES
) -> dict[str, tuple[str | None, dict[str, Any]]]:
    """Pulumi's pack config ({policy: level | {"enforcementLevel": level, prop: value}}) ->
    {policy: (level or None, properties)}; unknown policies or levels are errors."""
    names = {r.name for r in rules}
    out: dict[str, tuple[str | None, dict[str, Any]]] = {}
    for name, value in raw.items():
        if name == "all":
            if not isinstance(value, str) or value not in LEVELS:
                raise PolicyConfigError(f"all: expected one of {', '.join(LEVELS)}")
            for n in names:
                out.setdefault(n, (value, {}))
            continue
        if name not in names:
            raise PolicyConfigError(
                f"{name}: no such policy (policies: {', '.join(sorted(names))})"
            )
        level: Any
        if isinstance(value, str):
            level, props = value, {}
        elif isinstance(value, Mapping):
            props = {k: v for k, v in value.items() if k != "enforcementLevel"}
            level = value.get("enforcementLevel")
        else:
            raise PolicyConfigError(f"{name}: expected a level or an object, got {value!r}")
        if level is not None and level not in LEVELS:
            raise PolicyConfigError(f"{name}: enforcementLevel {level!r} is not one of {LEVELS}")
        schema = next(r.config_schema for r in rules if r.name == name)
        for prop, prop_value in props.items():
            problem = _schema_problem(prop_value, schema.get(prop))
            if prop not in schema:
                known_props = ", ".join(sorted(schema)) or "none"
                problem = f"no such setting (settings of {name}: {known_props})"
            if problem:
                raise PolicyConfigError(f"{name}.{prop}: {problem}")
        out[name] = (level, props)
    return out


def _schema_problem(value: Any, schema: Mapping[str, Any] | None) -> str | None:
    """What is wrong with a pack setting, for the few JSON-schema forms the rules declare (the
    CLI checks the same schema before it runs a pack)."""
    if schema is None:
        return None
    kind = schema.get("type")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {value!r}"
        if not math.isfinite(value):
            return f"expected a finite number, got {value!r}"
        low = schema.get("exclusiveMinimum")
        if low is not None and not value > low:
            return f"must be above {low}, got {value!r}"
    elif kind == "boolean" and not isinstance(value, bool):
        return f"expected true or false, got {value!r}"
    elif kind == "array":
        if not isinstance(value, list):
            return f"expected a list, got {value!r}"
        if schema.get("items", {}).get("type") == "string" and not all(
            isinstance(v, str) for v in value
        ):
            return f"expected a list of strings, got {value!r}"
    return None


def evaluate(
    resources: Sequence[Resource],
    config: Mapping[str, Any] | None = None,
    *,
    stack_config: Mapping[str, Any] | None = None,
    rules: Sequence[Rule] = RULES,
) -> list[Violation]:
    """Run every rule over the stack's resources, as `pulumi preview --policy-pack` would.

    `config` is the pack config in Pulumi's format; `stack_config` holds the stack's own
    `gpufleet:*` values (namespace stripped) that policies fall back on (maxHourlyCost).
    """
    settings = normalise_config(config or {}, rules)
    stack_config = stack_config or {}
    violations: list[Violation] = []
    for rule in rules:
        level_override, props = settings.get(rule.name, (None, {}))
        level = level_override or rule.level
        if level == DISABLED:
            continue
        merged = {**fallback_config(rule.name, stack_config), **props}
        if rule.scope == "resource":
            for r in resources:
                for message in rule.check(r, merged):
                    violations.append(
                        Violation(
                            rule.name,
                            level,
                            rule.description,
                            message,
                            r.type,
                            r.name,
                            r.urn or None,
                        )
                    )
        else:
            for target, message in rule.check(resources, merged):
                violations.append(
                    Violation(
                        rule.name,
                        level,
                        rule.description,
                        message,
                        target.type if target else None,
                        target.name if target else None,
                        (target.urn or None) if target else None,
                    )
                )
    return violations


def fallback_config(policy: str, stack_config: Mapping[str, Any]) -> dict[str, Any]:
    """Policy settings that come from the stack's own config when the pack sets none."""
    if policy == "cost-ceiling" and stack_config.get("maxHourlyCost") not in (None, ""):
        return {"maxHourlyCost": stack_config["maxHourlyCost"]}
    return {}
