"""What the guardrails read, shared by the pack's rules and each cloud's own rules.

A :class:`Resource` is one declared resource as plain data (type token, logical name,
inputs in the engine's camelCase), the same whether the engine handed it over
(``policy/pack.py``) or Pulumi's mocks recorded it (``policy/offline.py``). This module
knows no cloud: policy/rules.py and every infra/clouds/<name>/rules.py import it, and
it imports neither, so the cloud folders can hold their policy facts without a circle.

During a preview some inputs are not known yet (an id the cloud assigns, a JSON document
built from one). They arrive as :data:`UNKNOWN`; a rule never reports a value it cannot
see, because the engine runs the policies again with the real values before it creates
anything (resource policies) and after the update (stack policies).

Resources refer to one another (a bucket policy names its bucket). :func:`refers_to`
answers "does this input point at that resource?" from the engine's property
dependencies when there are any, else from the identifiers the target is known by (id,
ARN, name).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class _Unknown:
    """A value the engine does not know yet (preview); compares unequal to everything."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown during preview>"


UNKNOWN: Any = _Unknown()


def known(value: Any) -> bool:
    return value is not UNKNOWN


@dataclass(frozen=True)
class Resource:
    """One declared resource, as the engine sends it to a policy pack."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    urn: str = ""
    # What other resources may use to point at this one: id, ARN, physical name.
    ids: frozenset[str] = frozenset()
    # Input key -> keys (see `key`) of the resources that input was computed from.
    deps: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.urn or f"{self.type}::{self.name}"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.type})"

    def get(self, *path: str | int) -> Any:
        """Nested input lookup: None when absent, UNKNOWN when not known yet."""
        value: Any = self.inputs
        for step in path:
            if value is UNKNOWN:
                return UNKNOWN
            if isinstance(step, int):
                if not isinstance(value, list | tuple) or step >= len(value):
                    return None
                value = value[step]
            else:
                if not isinstance(value, Mapping):
                    return None
                value = value.get(step)
        return value

    @property
    def tags(self) -> Mapping[str, Any]:
        tags = self.inputs.get("tags")
        return tags if isinstance(tags, Mapping) else {}


# A stack rule's finding: the offending resource (None: the stack as a whole), the message.
StackFinding = tuple[Resource | None, str]


def refers_to(source: Resource, prop: str, target: Resource) -> bool:
    """Whether `source.inputs[prop]` points at `target`."""
    if target.key in source.deps.get(prop, frozenset()):
        return True
    value = source.inputs.get(prop)
    return isinstance(value, str) and value in target.ids


def attached(
    resources: Sequence[Resource], types: Iterable[str], bucket: Resource
) -> list[Resource]:
    """The resources of ``types`` whose ``bucket`` input points at ``bucket``."""
    types = tuple(types)
    return [r for r in resources if r.type in types and refers_to(r, "bucket", bucket)]


def as_list(value: Any) -> list[Any]:
    if value is None or value is UNKNOWN:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def is_true(value: Any) -> bool:
    """True for a boolean true, and for "true": some SDK fields are typed as strings."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def unencrypted(value: Any) -> bool:
    """A known encryption flag that is not on (a flag not known yet is not reported)."""
    return known(value) and not is_true(value)


def positive(value: Any) -> float | None:
    """``value`` as a finite number above zero (a price cap, a ceiling), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class Bill:
    """How one instance is paid for, read from its inputs."""

    provider: str
    instance_type: str
    billing: str  # on-demand | spot | subscription
    spot_max_price: float | None = None
    months: int = 1
