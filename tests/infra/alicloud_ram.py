"""Alibaba Cloud RAM as Alibaba documents it: the snapshot of what a policy may
name (tests/data/clouds/alicloud_ram.toml) and a small evaluator of RAM's
documented semantics, for the tests that judge the Alicloud stacks' policies.

The evaluator follows these pages (read 2026-12-01):

- "How RAM evaluates policies" (help/en/ram/policy-evaluation-process):
  deny by default; an explicit Deny overrides any Allow.
- "Policy elements" (help/en/ram/policy-elements): Effect Allow | Deny;
  Action or NotAction as ``<ram-code>:<action-name>``, "in most cases not
  case-sensitive", ``*`` wildcards (``ecs:Describe*``); Resource as an ARN
  ``acs:<service>:<region>:<account>:<relative-id>`` with ``*`` wildcards; a
  condition block holds several conditions, all of which must hold (AND), and
  a key with several values holds when any value matches (OR).
- "Conditional operators" (help/en/ram/conditional-operator): the five
  families (string, number, date and time, Boolean, IP address); StringLike's
  ``*`` matches any run of characters, the empty one included, and ``?`` one.

What the pages do not say is what a condition on a key the request lacks
(``acs:RequestTag/k`` in a request without tag ``k``) evaluates to. The
evaluator takes the only reading under which "the policy is enforced when a
request meets this condition" makes sense for the matching operators: an
absent value meets no StringEquals, StringLike, Numeric*, Date*, Bool or
IpAddress test, so such a condition does not hold. For the negated operators
(StringNotEquals, StringNotLike, NotIpAddress, *NotEquals) either reading is
defensible, so the evaluator refuses to judge them on an absent key
(:class:`Undocumented`): no guard of ours may rest on them.

Run ``python -m tests.infra.alicloud_ram ecs`` (or ``cms``) to print the
installed SDK's operation names in the snapshot's TOML form.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import re
import sys
import textwrap
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "clouds" / "alicloud_ram.toml"
SDK_PACKAGES = {"ecs": "alibabacloud_ecs20140526", "cms": "alibabacloud_cms20190101"}
NEGATED = {
    "StringNotEquals",
    "StringNotEqualsIgnoreCase",
    "StringNotLike",
    "NumericNotEquals",
    "DateNotEquals",
    "NotIpAddress",
}


class Undocumented(AssertionError):
    """The documentation does not say how RAM decides this case."""


@cache
def snapshot() -> dict[str, Any]:
    return tomllib.loads(SNAPSHOT.read_text())


def operator_family(operator: str) -> str | None:
    for family, names in snapshot()["operators"].items():
        if family != "source" and operator in names:
            return str(family)
    return None


def key_family(key: str) -> str | None:
    """The operator family a documented condition key takes, or None."""
    keys = {k: v for k, v in snapshot()["keys"]["global"].items() if k != "source"}
    if key in keys:
        return str(keys[key])
    for prefix, family in keys.items():
        if prefix.endswith("/") and key.startswith(prefix) and len(key) > len(prefix):
            return str(family)
    return None


def action_known(action: str) -> bool:
    """``ram-code:Name`` names an action of the snapshot; ``*`` wildcards must
    match at least one (RAM compares action names case-insensitively)."""
    code, _, name = action.partition(":")
    listed = snapshot()["actions"].get(code.lower(), {}).get("actions", [])
    return any(fnmatch.fnmatchcase(a.lower(), name.lower()) for a in listed)


def sdk_operations(code: str) -> list[str]:
    """The operation names the installed SDK's client calls (``Params(action=...)``)."""
    import importlib.util

    spec = importlib.util.find_spec(SDK_PACKAGES[code])
    assert spec is not None and spec.submodule_search_locations
    client = Path(next(iter(spec.submodule_search_locations))) / "client.py"
    return sorted(set(re.findall(r"action = '([A-Za-z0-9]+)'", client.read_text())))


# ---------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Request:
    """One API call as RAM sees it: the action, the resource's ARN and the
    request context (condition key -> value; absent keys are absent)."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _compare(operator: str, actual: Any, expected: Any) -> bool:
    family = operator_family(operator)
    if family == "string":
        a, e = str(actual), str(expected)
        if "IgnoreCase" in operator:
            a, e = a.lower(), e.lower()
        if operator in ("StringLike", "StringNotLike"):
            return fnmatch.fnmatchcase(a, e.replace("[", "[[]"))
        return a == e
    if family == "numeric":
        a_n, e_n = float(actual), float(expected)
        return {
            "NumericEquals": a_n == e_n,
            "NumericNotEquals": a_n == e_n,
            "NumericLessThan": a_n < e_n,
            "NumericLessThanEquals": a_n <= e_n,
            "NumericGreaterThan": a_n > e_n,
            "NumericGreaterThanEquals": a_n >= e_n,
        }[operator]
    if family == "date":
        a_d = datetime.fromisoformat(str(actual).replace("Z", "+00:00"))
        e_d = datetime.fromisoformat(str(expected).replace("Z", "+00:00"))
        return {
            "DateEquals": a_d == e_d,
            "DateNotEquals": a_d == e_d,
            "DateLessThan": a_d < e_d,
            "DateLessThanEquals": a_d <= e_d,
            "DateGreaterThan": a_d > e_d,
            "DateGreaterThanEquals": a_d >= e_d,
        }[operator]
    if family == "boolean":
        return str(actual).lower() == str(expected).lower()
    if family == "ip":
        network = ipaddress.ip_network(str(expected), strict=False)
        return ipaddress.ip_address(str(actual)) in network
    raise AssertionError(f"{operator} is not an operator RAM documents")


def condition_holds(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, Any]) -> bool:
    """AND across operators and keys, OR across one key's values; a negated
    operator holds when no value matches."""
    for operator, clauses in condition.items():
        if operator_family(operator) is None:
            raise AssertionError(f"{operator} is not an operator RAM documents")
        for key, expected in clauses.items():
            if key not in context:
                if operator in NEGATED:
                    raise Undocumented(f"{operator} on {key}, absent from the request")
                return False
            hit = any(
                _compare(operator, actual, e)
                for actual in _listed(context[key])
                for e in _listed(expected)
            )
            if hit == (operator in NEGATED):
                return False
    return True


def _matches(patterns: Any, value: str, *, fold: bool) -> bool:
    def norm(s: str) -> str:
        return s.lower() if fold else s

    return any(fnmatch.fnmatchcase(norm(value), norm(str(p))) for p in _listed(patterns))


def statement_applies(st: Mapping[str, Any], request: Request) -> bool:
    if "NotAction" in st:
        if _matches(st["NotAction"], request.action, fold=True):
            return False
    elif not _matches(st["Action"], request.action, fold=True):
        return False
    if not _matches(st.get("Resource", "*"), request.resource, fold=False):
        return False
    return condition_holds(st.get("Condition", {}), request.context)


def decide(documents: list[Mapping[str, Any]], request: Request) -> str:
    """ "Deny" (explicit), "Allow", or "ImplicitDeny" (no statement allows)."""
    verdict = "ImplicitDeny"
    for doc in documents:
        for st in _listed(doc["Statement"]):
            if not statement_applies(st, request):
                continue
            if st["Effect"] == "Deny":
                return "Deny"
            if st["Effect"] == "Allow":
                verdict = "Allow"
    return verdict


def allowed(documents: list[Mapping[str, Any]], request: Request) -> bool:
    return decide(documents, request) == "Allow"


# ---------------------------------------------------------------- documents


def documents_of(result: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every RAM/OSS policy document a planned Alicloud stack declares:
    custom policies, roles' trust policies and bucket policies."""
    fields = {
        "alicloud:ram/policy:Policy": "policyDocument",
        "alicloud:ram/role:Role": "assumeRolePolicyDocument",
        "alicloud:oss/bucketPolicy:BucketPolicy": "policy",
    }
    for resource in result.resources:
        name = fields.get(resource.type)
        if name and isinstance(resource.inputs.get(name), str):
            yield f"{resource.name} ({name})", json.loads(resource.inputs[name])


def _toml_list(items: list[str]) -> str:
    body = ", ".join(f'"{i}"' for i in items)
    lines = textwrap.wrap(body, 74, break_on_hyphens=False)
    return "actions = [\n" + "".join(f"    {line}\n" for line in lines) + "]"


if __name__ == "__main__":
    print(_toml_list(sdk_operations(sys.argv[1])))
