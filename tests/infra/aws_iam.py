"""AWS IAM as AWS documents it, for the tests that judge the AWS stacks' policies.

Two parts:

- a checker of policy documents against the Service Authorization Reference (every
  action, its resource types' ARN formats and its condition keys), as parliament
  packages it (``iam_definition.json``; read from the installed distribution without
  importing parliament, whose ``__init__`` needs setuptools' removed pkg_resources),
  plus tests/data/clouds/aws_iam.toml: IAM's condition operators, set operators, global
  and cross-service keys (IAM User Guide);
- a small evaluator of IAM's documented semantics for one account's identity policies
  (no SCPs, boundaries or session policies; the stacks use none). It follows the IAM
  User Guide pages (read 2026-12-01; awsdocs/iam-user-guide at e2b8637):
  "Policy evaluation logic" (deny by default, an explicit Deny wins over any Allow),
  "IAM JSON policy elements: Condition operators" (a key absent from the request
  matches no operator but the negated ones, which hold; IfExists holds on an absent
  key; Null tests presence; ArnLike compares the six colon-separated parts apart),
  "Creating a condition with multiple keys or values" (AND across operators and keys,
  OR across a key's values, AND for a negated operator's values; ForAllValues holds when
  every request value matches, and on no value at all; ForAnyValue needs one match) and
  "IAM policy elements: Variables and tags" (``${key}`` in Resource and in string/ARN
  condition values; an unresolved variable matches nothing, which the negated operators
  then hold on; ``${key, 'default'}``; ``${*}``, ``${?}``, ``${$}``).

tests/infra/test_aws_iam_eval.py holds the guide's own examples as this evaluator's tests.
"""

from __future__ import annotations

import base64
import fnmatch
import importlib.util
import ipaddress
import json
import operator as op
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "clouds" / "aws_iam.toml"
_VARIABLE = re.compile(r"\$\{([^}]*)\}")  # a policy variable, ${key} or ${key, 'default'}
# The reference's condition types and the operator families that take them.
TYPE_FAMILIES = {
    "string": ("string",),
    "arn": ("arn", "string"),
    "bool": ("boolean",),
    "boolean": ("boolean",),
    "numeric": ("numeric",),
    "long": ("numeric",),
    "integer": ("numeric",),
    "date": ("date",),
    "ipaddress": ("ip",),
    "binary": ("binary",),
}


@cache
def snapshot() -> dict[str, Any]:
    return tomllib.loads(SNAPSHOT.read_text())


@cache
def reference() -> dict[str, dict[str, Any]]:
    """The Service Authorization Reference by service prefix (parliament's copy)."""
    spec = importlib.util.find_spec("parliament")
    assert spec is not None and spec.origin, "parliament (requirements-dev.txt) is missing"
    path = Path(spec.origin).parent / "iam_definition.json"
    return {s["prefix"]: s for s in json.loads(path.read_text())}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---------------------------------------------------------------- the checker


def operator_parts(operator: str) -> tuple[str, str, bool]:
    """(set qualifier or "", base operator, IfExists) of a condition operator; raises
    ValueError for one IAM does not document."""
    ops = snapshot()["operators"]
    qualifier, _, base = operator.rpartition(":")
    if qualifier and qualifier not in snapshot()["set_operators"]["qualifiers"]:
        raise ValueError(f"{qualifier!r} is not a set operator IAM documents")
    suffix = ops["if_exists_suffix"]
    if_exists = base.endswith(suffix) and base != suffix
    if if_exists:
        base = base[: -len(suffix)]
    if operator_family(base) is None or (if_exists and base in ops["null"]):
        raise ValueError(f"{operator!r} is not a condition operator IAM documents")
    return qualifier, base, if_exists


def operator_family(base: str) -> str | None:
    for family, names in snapshot()["operators"].items():
        if isinstance(names, list) and base in names:
            return str(family)
    return None


def _key_matches(documented: str, key: str) -> bool:
    """The reference writes tag-keyed names as ``aws:ResourceTag/${TagKey}``."""
    documented, key = documented.lower(), key.lower()
    if "${" in documented or "<" in documented:
        stem = re.split(r"\$\{|<", documented)[0]
        return key.startswith(stem) and len(key) > len(stem)
    return documented == key


def key_info(action: str, key: str) -> tuple[tuple[str, ...], bool] | None:
    """(operator families, multivalued) of condition key ``key`` in a request for
    ``action`` (one concrete ``service:Name``), or None when IAM has no such key there."""
    for table in ("global", "cross_service"):
        for name, value in snapshot()["keys"][table].items():
            if name == "source":
                continue
            hit = (
                key.lower().startswith(name.lower())
                if name.endswith("/")
                else (key.lower() == name.lower())
            )
            if hit and (not name.endswith("/") or len(key) > len(name)):
                families, valued = value
                return tuple(families), valued == "multi"
    prefix, _, name = action.partition(":")
    service = reference()[prefix]
    privilege = next(p for p in service["privileges"] if p["privilege"] == name)
    listed = {k for rt in privilege["resource_types"] for k in rt["condition_keys"]}
    resources = {r["resource"]: r for r in service["resources"]}
    for rt in privilege["resource_types"]:
        listed |= set(resources.get(rt["resource_type"].rstrip("*"), {}).get("condition_keys", []))
    if not any(_key_matches(k, key) for k in listed):
        return None
    types = {c["condition"]: c["type"] for c in service["conditions"]}
    for documented, kind in types.items():
        if _key_matches(documented, key):
            multi = kind.lower().startswith("arrayof")
            base = kind.lower().removeprefix("arrayof")
            return TYPE_FAMILIES.get(base, ("string",)), multi
    # aws: tag keys listed per action take the global page's types.
    return ("string",), key.lower() == "aws:tagkeys"


def actions_named(pattern: str) -> list[str]:
    """The concrete ``service:Name`` actions ``pattern`` (wildcards allowed) names."""
    prefix, _, name = pattern.partition(":")
    service = reference().get(prefix.lower())
    if service is None:
        return []
    names = [p["privilege"] for p in service["privileges"]]
    return [
        f"{service['prefix']}:{n}" for n in names if fnmatch.fnmatchcase(n.lower(), name.lower())
    ]


def _glob_overlap(a: str, b: str) -> bool:
    """Whether two patterns with ``*`` wildcards can match one same string."""
    seen: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        if (i, j) in seen:
            return seen[(i, j)]
        if i == len(a) and j == len(b):
            out = True
        elif i < len(a) and a[i] == "*":
            out = go(i + 1, j) or (j < len(b) and go(i, j + 1))
        elif j < len(b) and b[j] == "*":
            out = go(i, j + 1) or (i < len(a) and go(i + 1, j))
        else:
            out = i < len(a) and j < len(b) and a[i] == b[j] and go(i + 1, j + 1)
        seen[(i, j)] = out
        return out

    return go(0, 0)


def arn_fits(resource: str, arn_format: str) -> bool:
    """Whether policy resource ``resource`` can name an ARN of the reference's format
    (``arn:${Partition}:ec2:${Region}:${Account}:instance/${InstanceId}``): part by part
    up to the account, then the resource part."""
    if resource == "*":
        return True
    theirs = re.sub(r"\$\{[^}]+\}", "*", arn_format).split(":", 5)
    ours = re.sub(r"\$\{[^}]+\}", "*", resource).split(":", 5)
    if len(ours) != 6 or len(theirs) != 6:
        return False
    return all(_glob_overlap(o, t) for o, t in zip(ours, theirs, strict=True))


def statement_problems(st: Mapping[str, Any]) -> list[str]:
    """What in one statement IAM's definitions do not support (empty: nothing)."""
    problems: list[str] = []
    if st.get("Effect") not in ("Allow", "Deny"):
        problems.append(f"Effect {st.get('Effect')!r} is not Allow or Deny")
    named: dict[str, list[str]] = {}
    for pattern in _listed(st.get("Action", st.get("NotAction", []))):
        named[pattern] = actions_named(pattern)
        if not named[pattern]:
            problems.append(f"action {pattern!r} is not in the Service Authorization Reference")
    actions = [a for found in named.values() for a in found]
    if "Resource" in st or "Principal" not in st:  # a trust policy names no resource
        resources = [str(r) for r in _listed(st.get("Resource", []))]
        problems += _resource_problems(named, resources)
        problems += [p for r in resources for p in _variable_problems(r)]
    for operator, clauses in st.get("Condition", {}).items():
        try:
            qualifier, base, _ = operator_parts(operator)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        family = operator_family(base)
        for key, values in clauses.items():
            if family not in ("string", "arn") and any(
                _VARIABLE.search(str(v)) for v in _listed(values)
            ):
                # "You can't use a policy variable with other operators" (Variables and tags)
                problems.append(f"{operator} cannot take a policy variable ({key})")
            for action in actions:
                info = key_info(action, key)
                if info is None:
                    problems.append(f"condition key {key!r} is not one {action} has")
                    continue
                families, multi = info
                if family != "null" and family not in families:
                    problems.append(f"{operator} does not take {key!r} (it works with {families})")
                if family != "null" and bool(qualifier) != multi:
                    want = "needs" if multi else "must not have"
                    problems.append(f"{key!r} {want} ForAllValues/ForAnyValue ({operator})")
    return problems


def _variable_problems(resource: str) -> list[str]:
    """Variables in a Resource: "only in the resource portion of the ARN" (after the fifth
    colon; Variables and tags), and never ``${ec2:SourceInstanceARN}`` (EC2 user guide,
    iam-policy-structure: it "cannot be used as a variable to populate the ARN for the
    Resource element")."""
    problems = []
    head = _VARIABLE.sub("\0", resource).split(":", 5)[:5]  # a variable's own colons aside
    if any("\0" in part for part in head):
        problems.append(f"{resource!r}: a variable before the ARN's resource part")
    if "${ec2:sourceinstancearn" in resource.lower():
        problems.append(f"{resource!r}: ec2:SourceInstanceARN cannot populate a Resource")
    return problems


def _fitting(action: str, resources: list[str]) -> list[str]:
    """The resources of ``resources`` that ``action`` can act on (the reference's
    resource types; an action with none takes "*" only)."""
    prefix, _, name = action.partition(":")
    service = reference()[prefix]
    privilege = next(p for p in service["privileges"] if p["privilege"] == name)
    formats = {r["resource"]: r["arn"] for r in service["resources"]}
    types = [rt["resource_type"].rstrip("*") for rt in privilege["resource_types"]]
    arns = [formats[t] for t in types if t]
    if not arns:
        return [r for r in resources if r == "*"]
    return [r for r in resources if any(arn_fits(r, f) for f in arns)]


def _resource_problems(named: Mapping[str, list[str]], resources: list[str]) -> list[str]:
    """Each action pattern must act on one of the resources, and each resource must be
    one that some named action acts on."""
    problems = []
    fitting: set[str] = set()
    for pattern, actions in named.items():
        ok = {r for a in actions for r in _fitting(a, resources)}
        if actions and not ok:
            problems.append(f"no resource of {resources} is one {pattern} acts on")
        fitting |= ok
    problems += [
        f"resource {r!r} fits none of {list(named)}" for r in resources if r not in fitting
    ]
    return problems


def document_problems(doc: Mapping[str, Any]) -> list[str]:
    problems = []
    if doc.get("Version") != "2012-10-17":
        problems.append(f"Version {doc.get('Version')!r}: policy variables need 2012-10-17")
    for st in _listed(doc.get("Statement", [])):
        problems += [f"{st.get('Sid', '?')}: {p}" for p in statement_problems(st)]
    return problems


# ---------------------------------------------------------------- the evaluator


@dataclass(frozen=True)
class Request:
    """One API call as IAM authorizes it: the action, the resource's ARN and the
    request context (key -> value or list of values; absent keys are absent)."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)


_SPECIAL = {"*": "*", "?": "?", "$": "$"}


class Unresolved(Exception):
    """A policy variable with no value in the request."""


def substitute(text: str, context: Mapping[str, Any], *, literal: bool) -> str:
    """``text`` with its policy variables replaced from ``context``. With ``literal``
    (a Like pattern), ``${*}`` and ``${?}`` stand for the characters themselves."""

    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if body in _SPECIAL:
            return "[*]" if literal and body == "*" else "[?]" if literal and body == "?" else body
        name, _, default = body.partition(",")
        value = _lookup(context, name.strip())
        if value is None:
            default = default.strip()
            if default.startswith("'") and default.endswith("'") and len(default) >= 2:
                return default[1:-1]
            raise Unresolved(name)
        return str(value).replace("*", "[*]").replace("?", "[?]") if literal else str(value)

    return _VARIABLE.sub(one, text)


def _lookup(context: Mapping[str, Any], key: str) -> Any:
    folded = {k.lower(): v for k, v in context.items()}  # key names are case-insensitive
    value = folded.get(key.lower())
    if isinstance(value, list):
        return None  # a multivalued key is no variable
    return value


def _like(value: str, pattern: str) -> bool:
    """Glob with ``*`` and ``?``; ``[*]``/``[?]`` (from substitute) are literal."""
    tokens = re.findall(r"\[\*\]|\[\?\]|\*|\?|[^*?\[]+|\[", pattern)
    regex = "".join(
        re.escape(t[1])
        if t in ("[*]", "[?]")
        else ".*"
        if t == "*"
        else "."
        if t == "?"
        else re.escape(t)
        for t in tokens
    )
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def _date(value: Any) -> datetime:
    text = str(value)
    if re.fullmatch(r"\d+", text):
        return datetime.fromtimestamp(int(text), UTC)
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# Numeric and date comparisons by the operator's name after its family (the negated one
# compares as its positive form; condition_holds negates).
ORDER = {
    "Equals": op.eq,
    "NotEquals": op.eq,
    "LessThan": op.lt,
    "LessThanEquals": op.le,
    "GreaterThan": op.gt,
    "GreaterThanEquals": op.ge,
}


def _matches(base: str, actual: Any, expected: str) -> bool:
    """One request value against one policy value, for the positive form of ``base``."""
    family = operator_family(base)
    a = str(actual)
    if family == "string":
        if "IgnoreCase" in base:
            return a.lower() == expected.lower()
        if base in ("StringLike", "StringNotLike"):
            return _like(a, expected)
        return a == expected
    if family == "arn":
        ours, theirs = a.split(":", 5), expected.split(":", 5)
        return len(ours) == len(theirs) == 6 and all(
            _like(o, t) for o, t in zip(ours, theirs, strict=True)
        )
    if family == "numeric":
        return ORDER[base.removeprefix("Numeric")](float(a), float(expected))
    if family == "date":
        return ORDER[base.removeprefix("Date")](_date(a), _date(expected))
    if family == "boolean":
        return a.lower() == expected.lower()
    if family == "binary":
        return base64.b64decode(a) == base64.b64decode(expected)
    if family == "ip":
        return ipaddress.ip_address(a) in ipaddress.ip_network(expected, strict=False)
    raise AssertionError(f"{base}: no comparison for family {family}")


def _negated(base: str) -> bool:
    return "Not" in base


def condition_holds(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, Any]) -> bool:
    folded = {k.lower(): v for k, v in context.items()}
    for operator, clauses in condition.items():
        qualifier, base, if_exists = operator_parts(operator)
        family = operator_family(base)
        for key, expected in clauses.items():
            present = folded.get(key.lower())
            values = [v for v in _listed(present) if v not in (None, "")] if present else []
            if family == "null":
                if (str(expected).lower() == "true") != (not values):
                    return False
                continue
            patterns: list[str | None] = []
            for e in _listed(expected):
                try:
                    # Variables only in string and ARN comparisons (Variables and tags).
                    literal = base in ("StringLike", "StringNotLike") or family == "arn"
                    if family in ("string", "arn"):
                        patterns.append(substitute(str(e), context, literal=literal))
                    else:
                        patterns.append(str(e))
                except Unresolved:
                    patterns.append(None)  # matches nothing
            if not values:
                if if_exists or qualifier == "ForAllValues":
                    continue
                if qualifier == "ForAnyValue" or not _negated(base):
                    return False
                continue  # a negated operator holds on an absent key
            if qualifier == "ForAllValues":
                ok = all(_value_holds(base, v, patterns) for v in values)
            elif qualifier == "ForAnyValue":
                ok = any(_value_holds(base, v, patterns) for v in values)
            else:
                ok = _value_holds(base, values[0], patterns)
            if not ok:
                return False
    return True


def _value_holds(base: str, value: Any, patterns: list[str | None]) -> bool:
    """One request value against a key's policy values: any matches (OR), or for a
    negated operator none does (AND); an unresolved pattern (None) matches nothing."""
    positive = base.replace("Not", "", 1) if _negated(base) else base
    hit = any(p is not None and _matches(positive, value, p) for p in patterns)
    return not hit if _negated(base) else hit


def _names(patterns: Any, value: str, context: Mapping[str, Any], *, fold: bool) -> bool:
    for p in _listed(patterns):
        try:
            pattern = substitute(str(p), context, literal=True)
        except Unresolved:
            continue  # "will not match any resource"
        if fold:
            pattern, value = pattern.lower(), value.lower()
        if _like(value, pattern):
            return True
    return False


def statement_applies(st: Mapping[str, Any], request: Request) -> bool:
    ctx = request.context
    if "NotAction" in st:
        if _names(st["NotAction"], request.action, ctx, fold=True):
            return False
    elif not _names(st.get("Action", []), request.action, ctx, fold=True):
        return False
    if "NotResource" in st:
        if _names(st["NotResource"], request.resource, ctx, fold=False):
            return False
    elif not _names(st.get("Resource", "*"), request.resource, ctx, fold=False):
        return False
    return condition_holds(st.get("Condition", {}), ctx)


def decide(documents: list[Mapping[str, Any]], request: Request) -> str:
    """ "Deny" (an explicit Deny applies), "Allow", or "ImplicitDeny" (none allows)."""
    verdict = "ImplicitDeny"
    for doc in documents:
        for st in _listed(doc["Statement"]):
            if statement_applies(st, request):
                if st["Effect"] == "Deny":
                    return "Deny"
                verdict = "Allow"
    return verdict


def allowed(documents: list[Mapping[str, Any]], request: Request) -> bool:
    return decide(documents, request) == "Allow"


# ---------------------------------------------------------------- a planned stack's documents

POLICY_FIELDS = {
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/policy:Policy": "policy",
    "aws:iam/role:Role": "assumeRolePolicy",
    "aws:s3/bucketPolicy:BucketPolicy": "policy",
}


def documents_of(result: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every IAM policy document a planned AWS stack declares."""
    for resource in result.resources:
        name = POLICY_FIELDS.get(resource.type)
        if name and isinstance(resource.inputs.get(name), str):
            yield f"{resource.name} ({name})", json.loads(resource.inputs[name])


def role_documents(result: Any, role_name: str) -> list[dict[str, Any]]:
    """The identity policies a role holds: inline RolePolicies and attached Policies."""
    roles = [r for r in result.of_type("aws:iam/role:Role") if r.outputs["name"] == role_name]
    refs = {role_name} | {r.id for r in roles}
    docs = [
        json.loads(p.inputs["policy"])
        for p in result.of_type("aws:iam/rolePolicy:RolePolicy")
        if p.inputs["role"] in refs
    ]
    arns = {
        a.inputs["policyArn"]
        for a in result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.inputs["role"] in refs
    }
    docs += [
        json.loads(p.inputs["policy"])
        for p in result.of_type("aws:iam/policy:Policy")
        if p.outputs["arn"] in arns
    ]
    return docs


def instance_role_documents(result: Any, instance: Any) -> list[dict[str, Any]]:
    """What an instance's role may do: its instance profile's role's policies."""
    (profile,) = [
        p
        for p in result.of_type("aws:iam/instanceProfile:InstanceProfile")
        if p.outputs["name"] == instance.inputs["iamInstanceProfile"]
    ]
    return role_documents(result, profile.inputs["role"])
