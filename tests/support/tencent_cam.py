"""A small evaluator of Tencent Cloud CAM's documented policy semantics (tests only).

It decides one request against policy documents the way Tencent's pages describe, and
refuses what they do not describe rather than guess. Its own tests are the examples on
those pages (tests/infra/test_tencent_cam_semantics.py); the guards' tests ask it whether
our node and reaper policies allow what the watchdog and the reaper do.

What it follows (read 2026-12-01; the URLs are in tests/data/clouds/tencent_cam.toml):
- Evaluation (598/10605): deny by default; a matching deny wins; else a matching allow.
- Elements (598/10603): version "2.0", a statement list; element names lowercase only
  (COS bucket policies too, 436/46205 of 2025-07-14).
- Actions: ``service:Api`` with an optional ``name/`` prefix; ``*`` wildcards; the API
  part is case-sensitive (COS 436/31923: "区分英文大小写").
- Resources (598/10606): ``*``, or six segments ``qcs:project:service:region:account:res``
  where an empty service or region means all of them and ``*`` is a wildcard; an empty
  account means the policy owner's account (this evaluator checks one account at a time,
  so it matches any).
- Conditions (598/10608, 598/58420): every operator of a block and every key of an
  operator must hold; a key holds when its request value matches any listed value;
  ``_if_exist`` holds when the request lacks the key; ``for_all_value:`` holds when every
  request value matches (the request's set is a subset of the policy's), ``for_any_value:``
  when one does (the sets intersect), COS 436/46206's table for qcs:request_tag.

Undocumented cases raise :class:`Undocumented` instead of answering: an operator without
a qualifier on a key the request gives several values for, and a qualifier on a key the
request lacks.
"""

from __future__ import annotations

import base64
import fnmatch
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ALLOW, DENY, IMPLICIT_DENY = "allow", "deny", "implicit deny"

QUALIFIERS = ("for_all_value", "for_any_value")
IF_EXIST = "_if_exist"
# 598/58420 (cloud.tencent.com/document/product/598/10608): seven families.
# string_like / string_not_like: in the same page's key-to-operator mapping for the tag keys
STRING_OPS = (
    "string_equal",
    "string_not_equal",
    "string_equal_ignore_case",
    "string_not_equal_ignore_case",
    "string_like",
    "string_not_like",
)
RELATIONS = ("equal", "not_equal", "less_than", "less_than_equal", "greater_than")
RELATIONS += ("greater_than_equal",)
NUMERIC_OPS = tuple(f"numeric_{r}" for r in RELATIONS)
DATE_OPS = tuple(f"date_{r}" for r in RELATIONS)
OPERATORS = (
    *STRING_OPS,
    *NUMERIC_OPS,
    *DATE_OPS,
    "bool_equal",
    "binary_equal",
    "ip_equal",
    "ip_not_equal",
    "null_equal",
)
TOP_ELEMENTS = frozenset({"version", "statement", "principal"})
STATEMENT_ELEMENTS = frozenset({"effect", "action", "resource", "condition", "principal"})


class PolicyError(ValueError):
    """A document CAM documents no meaning for (CreatePolicy would refuse it)."""


class Undocumented(LookupError):
    """The documents do not say how CAM decides this case."""


@dataclass(frozen=True)
class Request:
    action: str  # "cvm:StopInstances" (a "name/" prefix is ignored)
    resource: str  # six segments, e.g. qcs::cvm:ap-guangzhou:uin/1:instance/ins-1
    # condition keys and the request's values; multi-valued keys (qcs:resource_tag) hold
    # one "key&value" string per tag
    context: Mapping[str, Sequence[str]] = field(default_factory=dict)
    principal: str = ""  # for bucket and trust policies: qcs::cam::uin/1:uin/2


@dataclass(frozen=True)
class Operator:
    qualifier: str  # "" or one of QUALIFIERS
    base: str
    if_exist: bool

    @classmethod
    def parse(cls, text: str) -> Operator:
        qualifier, _, rest = text.rpartition(":")
        if qualifier and qualifier not in QUALIFIERS:
            raise PolicyError(f"condition operator {text!r}: unknown qualifier {qualifier!r}")
        if_exist = rest.endswith(IF_EXIST) and rest != "null_equal"
        base = rest.removesuffix(IF_EXIST) if if_exist else rest
        if base not in OPERATORS:
            raise PolicyError(f"condition operator {text!r}: {base!r} is not a CAM operator")
        if if_exist and base == "null_equal":
            raise PolicyError("null_equal takes no _if_exist (598/10608)")
        return cls(qualifier, base, if_exist)


def load(document: str | Mapping[str, Any]) -> dict[str, Any]:
    """The document as CAM reads it, or PolicyError saying what CAM would refuse."""
    doc = json.loads(document) if isinstance(document, str) else dict(document)
    _lowercase_elements(doc, TOP_ELEMENTS, "policy")
    if doc.get("version") != "2.0":
        raise PolicyError(f'version must be "2.0", got {doc.get("version")!r}')
    statements = doc.get("statement")
    if not isinstance(statements, list) or not statements:
        raise PolicyError("statement must be a non-empty list")
    for i, st in enumerate(statements):
        where = f"statement[{i}]"
        _lowercase_elements(st, STATEMENT_ELEMENTS, where)
        if st.get("effect") not in (ALLOW, DENY):
            raise PolicyError(f"{where}.effect must be allow or deny, got {st.get('effect')!r}")
        if "action" not in st:
            raise PolicyError(f"{where}: action is required")
        if "resource" not in st and "principal" not in st and "principal" not in doc:
            raise PolicyError(f"{where}: resource is required")
        for text in st.get("condition", {}) or {}:
            Operator.parse(text)
    return doc


def _lowercase_elements(node: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    for key in node:
        if key not in known:
            hint = " (element names are lowercase)" if key.lower() in known else ""
            raise PolicyError(f"{where}: unknown element {key!r}{hint}")


def decide(documents: Iterable[str | Mapping[str, Any]], request: Request) -> str:
    """allow, deny (a matching deny statement) or implicit deny (no allow matched)."""
    allowed = False
    for document in documents:
        doc = load(document)
        for st in doc["statement"]:
            principal = st.get("principal", doc.get("principal"))
            if not _statement_matches(st, principal, request):
                continue
            if st["effect"] == DENY:
                return DENY
            allowed = True
    return ALLOW if allowed else IMPLICIT_DENY


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _statement_matches(st: Mapping[str, Any], principal: Any, request: Request) -> bool:
    if not any(action_matches(a, request.action) for a in _listed(st["action"])):
        return False
    if "resource" in st and not any(
        resource_matches(r, request.resource) for r in _listed(st["resource"])
    ):
        return False
    if principal is not None and not _principal_matches(principal, request.principal):
        return False
    return conditions_hold(st.get("condition") or {}, request.context)


def action_matches(pattern: str, action: str) -> bool:
    return fnmatch.fnmatchcase(action.removeprefix("name/"), pattern.removeprefix("name/"))


def resource_matches(pattern: str, resource: str) -> bool:
    if pattern == "*":
        return True
    want, got = pattern.split(":", 5), resource.split(":", 5)
    if len(want) != 6 or len(got) != 6:
        raise PolicyError(f"resource {pattern!r}: not the six-segment form (598/10606)")
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        # service (2), region (3) and account (4) may be left empty: all of them
        if w == "" and i in (2, 3, 4):
            continue
        if not fnmatch.fnmatchcase(g, w):
            return False
    return True


def _principal_matches(principal: Any, who: str) -> bool:
    if isinstance(principal, Mapping):
        listed = [p for values in principal.values() for p in _listed(values)]
    else:
        listed = _listed(principal)
    return any(p in ("*", "qcs::cam::anyone:anyone", who) for p in listed)


def conditions_hold(block: Mapping[str, Any], context: Mapping[str, Sequence[str]]) -> bool:
    for text, keys in block.items():
        op = Operator.parse(text)
        for key, values in keys.items():
            if not _clause_holds(op, key, _listed_values(values), context):
                return False
    return True


def _listed_values(values: Any) -> list[str]:
    if isinstance(values, (str, int, float, bool)):
        values = [values]
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in values]


def _clause_holds(
    op: Operator, key: str, wanted: list[str], context: Mapping[str, Sequence[str]]
) -> bool:
    if op.base == "null_equal":
        absent = key not in context or not context[key]
        return absent == (wanted[0].lower() == "true")
    got = list(context.get(key, ()))
    if not got:
        if op.if_exist:
            return True
        if op.qualifier:
            raise Undocumented(f"{op.qualifier} on {key!r}, which the request lacks")
        return False
    if not op.qualifier:
        if len(got) > 1:
            raise Undocumented(f"{op.base} without a qualifier on multi-valued {key!r}")
        return _value_matches(op.base, got[0], wanted)
    matches = [_value_matches(op.base, value, wanted) for value in got]
    return all(matches) if op.qualifier == "for_all_value" else any(matches)


def _value_matches(base: str, value: str, wanted: list[str]) -> bool:
    """Whether one request value satisfies the operator against the listed values: a
    positive operator holds when any listed value matches, a negated one when none does."""
    negated = "_not_" in base
    positive = base.replace("_not_", "_")
    hit = any(_compare(positive, value, w) for w in wanted)
    return not hit if negated else hit


def _compare(base: str, value: str, wanted: str) -> bool:
    if base == "string_equal":
        return value == wanted
    if base == "string_equal_ignore_case":
        return value.lower() == wanted.lower()
    if base == "string_like":
        return fnmatch.fnmatchcase(value, wanted)
    if base == "bool_equal":
        return value.lower() == wanted.lower()
    if base == "binary_equal":
        return base64.b64decode(value) == base64.b64decode(wanted)
    if base == "ip_equal":
        return ipaddress.ip_address(value) in ipaddress.ip_network(wanted, strict=False)
    family, _, relation = base.partition("_")
    if family == "numeric":
        a: Any = float(value)
        b: Any = float(wanted)
    elif family == "date":
        a, b = _when(value), _when(wanted)
    else:
        raise PolicyError(f"no comparison for {base!r}")
    return {
        "equal": a == b,
        "less_than": a < b,
        "less_than_equal": a <= b,
        "greater_than": a > b,
        "greater_than_equal": a >= b,
    }[relation]


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
