"""A small evaluator of Azure RBAC's documented semantics, for tests.

From Microsoft's "Understand Azure role definitions" (role-definitions.md) and "Understand
scope for Azure RBAC" (scope-overview.md):

- A role's allowed management operations are its ``Actions`` minus its ``NotActions``;
  its allowed data operations are its ``DataActions`` minus its ``NotDataActions``. The two
  are separate: ``*`` in ``Actions`` grants no data operation.
- ``*`` is a wildcard inside an operation string (``Microsoft.Compute/*``,
  ``*/read``); operation strings compare case-insensitively.
- ``NotActions`` is not a deny: it only subtracts from the role it is in. A principal's
  access is the union over its role assignments, so another assignment may grant what one
  role's ``NotActions`` left out.
- An assignment applies at its scope and everything below it (management group,
  subscription, resource group, resource): a child inherits the parent's assignments.

Deny assignments, conditions (ABAC) and classic administrators are outside this model:
gpufleet declares none of them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "clouds" / "azure_rbac.toml"


def matches(pattern: str, operation: str) -> bool:
    """Whether an Actions entry covers an operation: ``*`` matches any run of characters,
    the comparison ignores case."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, operation, flags=re.IGNORECASE) is not None


@dataclass(frozen=True)
class Role:
    name: str
    actions: tuple[str, ...] = ()
    not_actions: tuple[str, ...] = ()
    data_actions: tuple[str, ...] = ()
    not_data_actions: tuple[str, ...] = ()

    def allows(self, operation: str, *, data: bool = False) -> bool:
        grant, take = (
            (self.data_actions, self.not_data_actions) if data else (self.actions, self.not_actions)
        )
        return any(matches(p, operation) for p in grant) and not any(
            matches(p, operation) for p in take
        )

    @classmethod
    def from_permissions(cls, name: str, permissions: Iterable[Mapping[str, Any]]) -> Role:
        """A role from ARM's ``permissions`` list (what a RoleDefinition's inputs hold). Several
        permission blocks are a union of their Actions and NotActions."""
        keys = ("actions", "notActions", "dataActions", "notDataActions")
        lists: dict[str, list[str]] = {k: [] for k in keys}
        for block in permissions:
            for key in keys:
                lists[key] += list(block.get(key) or [])
        return cls(
            name,
            tuple(lists["actions"]),
            tuple(lists["notActions"]),
            tuple(lists["dataActions"]),
            tuple(lists["notDataActions"]),
        )


def within(resource: str, scope: str) -> bool:
    """Whether ``resource`` is ``scope`` or below it (scope inheritance)."""
    r, s = resource.rstrip("/").lower(), scope.rstrip("/").lower()
    return r == s or r.startswith(s + "/")


@dataclass(frozen=True)
class Assignment:
    role: Role
    scope: str


def allowed(
    assignments: Iterable[Assignment], operation: str, resource: str, *, data: bool = False
) -> bool:
    """Whether a principal holding ``assignments`` may perform ``operation`` on
    ``resource``: any assignment at or above the resource whose role allows it."""
    return any(
        within(resource, a.scope) and a.role.allows(operation, data=data) for a in assignments
    )


@lru_cache(maxsize=1)
def snapshot() -> dict[str, Any]:
    with SNAPSHOT.open("rb") as fh:
        return tomllib.load(fh)


def published_operations() -> tuple[frozenset[str], frozenset[str]]:
    """(management operations, data operations) of the snapshot, lower-cased."""
    ops = snapshot()["operations"].values()
    actions = frozenset(a.lower() for o in ops for a in o["actions"])
    data = frozenset(a.lower() for o in ops for a in o["data_actions"])
    return actions, data


def built_in(role_id: str) -> Role:
    """A built-in role as the snapshot publishes it (KeyError for an unknown id)."""
    row = snapshot()["roles"][role_id]
    return Role(
        row["name"],
        tuple(row["actions"]),
        tuple(row["not_actions"]),
        tuple(row["data_actions"]),
        tuple(row["not_data_actions"]),
    )
