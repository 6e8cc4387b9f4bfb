"""The adapter between Pulumi's policy SDK and the pure rules in policy/rules.py.

`pulumi preview --policy-pack policy/` runs policy/__main__.py, which builds a PolicyPack from
`build_policies()`. Each policy here only converts what the engine hands over (a
ResourceValidationArgs or the StackValidationArgs' PolicyResource list) into resources.Resource,
asks the rule, and reports each finding with the offending resource's URN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Secret,
    StackValidationArgs,
    StackValidationPolicy,
)

# The SDK's own proxy classes and sentinel test (private names, pinned version 1.21.0): the
# unwrapping must match exactly what the analyzer hands to a policy.
from pulumi_policy.proxy import _DictProxy, _is_unknown, _ListProxy

from policy import rules as R
from policy.resources import UNKNOWN, Resource

# Inputs/outputs that identify a resource (what other resources use to point at it). A
# type's own name key (`bucket`, `functionName`: rules.own_name_key, from its cloud's
# rules.py) identifies only that type: elsewhere the same key is a reference.
ID_KEYS = ("id", "arn", "name")
STACK_CONFIG_KEYS = ("maxHourlyCost",)


def plain(value: Any) -> Any:
    """The SDK's unknown-checking proxies -> plain dicts/lists, unknowns -> resources.UNKNOWN.

    Rules must be able to look at a resource during preview without tripping over a value the
    engine does not know yet (the proxy would raise and skip the whole policy).
    """
    if isinstance(value, _DictProxy):
        value = value["__target"]
    if isinstance(value, _ListProxy):
        value = value["__target"]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Secret):
        return plain(value.value)
    if _is_unknown(value):
        return UNKNOWN
    return value


def identifiers(type_: str, props: Mapping[str, Any]) -> frozenset[str]:
    own = R.own_name_key(type_)
    keys = (*ID_KEYS, own) if own else ID_KEYS
    return frozenset(v for k in keys if isinstance(v := props.get(k), str) and v)


def from_args(args: ResourceValidationArgs) -> Resource:
    inputs = plain(args.props)
    return Resource(
        args.resource_type, args.name, inputs, args.urn, identifiers(args.resource_type, inputs)
    )


def from_policy_resource(resource: PolicyResource) -> Resource:
    props = plain(resource.props)
    deps = {
        key: frozenset(d.urn for d in targets)
        for key, targets in (resource.property_dependencies or {}).items()
    }
    return Resource(
        resource.resource_type,
        resource.name,
        props,
        resource.urn,
        identifiers(resource.resource_type, props),
        deps,
    )


def stack_config() -> dict[str, Any]:
    """The stack's `gpufleet:*` values the pack falls back on; the CLI hands the stack's config
    to policy packs and pulumi_policy loads it into Pulumi's runtime config."""
    from pulumi.runtime.config import get_config

    found: dict[str, Any] = {}
    for key in STACK_CONFIG_KEYS:
        try:
            value = get_config(f"gpufleet:{key}")
        except Exception:  # no runtime config at all (outside the engine): nothing to fall back on
            value = None
        if value not in (None, ""):
            found[key] = value
    return found


def _level(level: str) -> EnforcementLevel:
    return EnforcementLevel.MANDATORY if level == R.MANDATORY else EnforcementLevel.ADVISORY


def _config(rule: R.Rule, args: ResourceValidationArgs | StackValidationArgs) -> dict[str, Any]:
    return {**R.fallback_config(rule.name, stack_config()), **dict(args.get_config() or {})}


def resource_policy(rule: R.Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in rule.check(from_args(args), _config(rule, args)):
            report_violation(message, None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=_level(rule.level),
        config_schema=PolicyConfigSchema(dict(rule.config_schema)) if rule.config_schema else None,
    )


def stack_policy(rule: R.Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [from_policy_resource(r) for r in args.resources]
        for target, message in rule.check(resources, _config(rule, args)):
            report_violation(message, target.urn if target is not None and target.urn else None)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=_level(rule.level),
        config_schema=PolicyConfigSchema(dict(rule.config_schema)) if rule.config_schema else None,
    )


def build_policies(rules: Sequence[R.Rule] = R.RULES) -> list[Policy]:
    return [resource_policy(r) if r.scope == "resource" else stack_policy(r) for r in rules]
