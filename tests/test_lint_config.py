"""pyproject.toml's mypy overrides: every provider SDK service the code uses is type-checked.

mypy skips the provider SDKs' services that nothing here uses (a cold run analysed all of
them: 471 CPU s and 6.9 GB); a service a program starts to use must be added to the
followed list, or calls into it would silently go unchecked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SDKS = {"aws": "pulumi_aws", "az": "pulumi_azure_native", "ali": "pulumi_alicloud"}
USE = re.compile(r"\b(aws|az|ali)\.([a-z_][a-z0-9_]*)\b")


def overrides() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["mypy"]["overrides"])


def modules(override: dict[str, object]) -> list[str]:
    names = override["module"]
    assert isinstance(names, list)
    return [str(name) for name in names]


def followed() -> set[str]:
    return {
        module for o in overrides() if o.get("follow_imports") == "normal" for module in modules(o)
    }


def used_services() -> set[str]:
    used = set()
    for folder in ("infra", "policy", "scripts", "bootstrap"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for alias, name in USE.findall(text):
                if f"import {SDKS[alias]} as {alias}" in text:
                    used.add(f"{SDKS[alias]}.{name}")
    return used


def test_the_sdks_are_skipped_but_for_what_is_listed() -> None:
    skipped = {m for o in overrides() if o.get("follow_imports") == "skip" for m in modules(o)}
    assert {f"{sdk}.*" for sdk in SDKS.values()} <= skipped
    assert set(SDKS.values()) <= followed()  # the top modules, or `aws` itself reads as Any


def test_every_sdk_service_the_code_uses_is_type_checked() -> None:
    used = used_services()
    assert {"pulumi_aws.ec2", "pulumi_azure_native.compute", "pulumi_alicloud.ecs"} <= used
    names = followed()
    for module in sorted(used):
        is_function = module.rsplit(".", 1)[1].startswith("get_")  # ali.get_zones_output
        wanted = module.removesuffix("_output") if is_function else module
        assert wanted in names, f"{wanted}: add it (and {wanted}.*) to pyproject's followed list"
        if not is_function:
            assert f"{wanted}.*" in names, f"{wanted}.*: add it to pyproject's followed list"
