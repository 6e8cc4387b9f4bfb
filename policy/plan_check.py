"""Run the guardrails on an offline plan: the resources Pulumi's mocks recorded.

The mocks record each resource's inputs exactly as the engine would receive them, but not the
engine's property dependencies, so references (a bucket policy's `bucket`) are resolved by
value: each recorded resource keeps the id and outputs the mocks answered with, which are the
very id/ARN/name that the referring resources were given during the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.config import StackConfig, read_text_file
from infra.offline import PlanResult
from policy import rules as R
from policy.pack import identifiers
from policy.resources import Resource

# `scripts/plan.py` exits with this when a mandatory policy fails (2 is invalid config).
EXIT_MANDATORY = 3


def resources_from_plan(result: PlanResult, cfg: StackConfig) -> list[Resource]:
    return [
        Resource(rec.type, rec.name, rec.inputs, ids=identifiers(rec.type, rec.outputs) | {rec.id})
        for rec in result.resources
    ]


def stack_settings(cfg: StackConfig) -> dict[str, Any]:
    return {"maxHourlyCost": cfg.max_hourly_cost} if cfg.max_hourly_cost is not None else {}


def check_plan(
    cfg: StackConfig, result: PlanResult, pack_config: Mapping[str, Any] | None = None
) -> list[R.Violation]:
    return R.evaluate(
        resources_from_plan(result, cfg), pack_config, stack_config=stack_settings(cfg)
    )


def load_pack_config(path: Path | str) -> dict[str, Any]:
    """A policy config file in `pulumi preview --policy-pack-config` format (JSON)."""
    path = Path(path)
    text = read_text_file(path, "policy config file", lambda lines: R.PolicyConfigError(lines[0]))
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise R.PolicyConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise R.PolicyConfigError(f"{path}: expected a JSON object {{policy: level or settings}}")
    R.normalise_config(doc)  # unknown policy names and levels fail here, before the plan runs
    return doc


def summary(violations: Sequence[R.Violation]) -> dict[str, Any]:
    """The `policies` section of `plan.py --json`."""
    mandatory = sum(1 for v in violations if v.level == R.MANDATORY)
    return {
        "pack": R.PACK_NAME,
        "version": R.PACK_VERSION,
        "policies": [r.name for r in R.RULES],
        "mandatory": mandatory,
        "advisory": sum(1 for v in violations if v.level == R.ADVISORY),
        "passed": mandatory == 0,
        "violations": [v.to_json() for v in violations],
    }


def format_preview(violations: Sequence[R.Violation], source: str = "policy") -> str:
    """The policy section the way `pulumi preview --policy-pack policy/` lays it out."""
    failed = any(v.level == R.MANDATORY for v in violations)
    mark = "❌" if failed else ("⚠️" if violations else "✅")
    lines = ["Policies:", f"    {mark} {R.PACK_NAME}@v{R.PACK_VERSION} (local: {source})"]
    for v in violations:
        where = f"  ({v.resource_type}: {v.resource_name})" if v.resource_type else ""
        lines.append(f"        - [{v.level}]  {v.policy}{where}")
        lines.append(f"          {v.description}")
        lines.append(f"          {v.message}")
    return "\n".join(lines)
