"""Every policy document the Alicloud stacks declare names only what RAM
documents: actions of the snapshot (tests/data/clouds/alicloud_ram.toml),
RAM's condition operators, and condition keys RAM or the service defines,
each with an operator of the key's family. The stacks are evaluated under
Pulumi's mocks as shipped, and as spot and two-node variants."""

from __future__ import annotations

import functools
import inspect
import re
from pathlib import Path
from typing import Any

import pulumi_alicloud as ali
import pytest

from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from tests.infra.alicloud_ram import (
    action_known,
    documents_of,
    key_family,
    operator_family,
    sdk_operations,
    snapshot,
)
from tests.infra.conftest import STACK_FILES, stack_id

ALICLOUD_FILES = [p for p in STACK_FILES if "provider: alicloud" in p.read_text()]
VARIANTS = {"as shipped": {}, "spot": {"billing": "spot"}, "two nodes": {"nodes": 2}}
# Service condition keys the policies may use, with where each is defined.
SERVICE_KEYS: dict[str, str] = {}


@functools.cache
def _planned(path: Path, variant: str) -> PlanResult:
    overrides: dict[str, Any] = {"sshPublicKey": PLACEHOLDER_SSH_KEY, **VARIANTS[variant]}
    return evaluate(load_stack_file(path, overrides))


CASES = [
    pytest.param(path, variant, id=f"{stack_id(path)}-{variant.replace(' ', '-')}")
    for path in ALICLOUD_FILES
    for variant in VARIANTS
]


def _statements(result: PlanResult) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for where, doc in documents_of(result):
        statements = doc["Statement"]
        for st in statements if isinstance(statements, list) else [statements]:
            found.append((where, st))
    return found


def test_the_shipped_stacks_include_alicloud_ones() -> None:
    assert len(ALICLOUD_FILES) >= 3


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_every_action_is_one_ram_documents(path: Path, variant: str) -> None:
    statements = _statements(_planned(path, variant))
    assert statements
    for where, st in statements:
        for key in ("Action", "NotAction"):
            for action in st.get(key, []) if isinstance(st.get(key), list) else [st.get(key)]:
                if action is not None:
                    assert action_known(action), f"{where}: {action} is not in the snapshot"


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_every_condition_uses_a_documented_operator_and_key_of_its_family(
    path: Path, variant: str
) -> None:
    for where, st in _statements(_planned(path, variant)):
        for operator, clauses in st.get("Condition", {}).items():
            family = operator_family(operator)
            assert family, f"{where}: {operator} is not a RAM condition operator"
            for key in clauses:
                wanted = key_family(key) or SERVICE_KEYS.get(key)
                assert wanted, f"{where}: {key} is not a documented condition key"
                assert wanted == family, f"{where}: {key} takes {wanted}, not {operator}"


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_no_guard_rests_on_a_negated_operator(path: Path, variant: str) -> None:
    """RAM does not say how a negated operator treats a key the request lacks
    (tests/infra/alicloud_ram.py), so none of our documents uses one."""
    for where, st in _statements(_planned(path, variant)):
        for operator in st.get("Condition", {}):
            assert "Not" not in operator, f"{where}: {operator}"


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_every_trusted_service_is_one_alibaba_documents_as_a_role_principal(
    path: Path, variant: str
) -> None:
    principals = snapshot()["principals"]
    trusted = [
        (where, service)
        for where, st in _statements(_planned(path, variant))
        if isinstance(st.get("Principal"), dict)  # a bucket policy's is ["*"]
        for service in st["Principal"].get("Service", [])
    ]
    assert trusted
    for where, service in trusted:
        assert service in principals, f"{where}: {service} is not a documented principal"


@pytest.mark.parametrize("code", ["ecs", "cms"])
def test_the_snapshots_action_list_is_the_installed_sdks_operation_list(code: str) -> None:
    ours = snapshot()["actions"][code]["actions"]
    theirs = sdk_operations(code)
    assert ours == theirs, (
        f"{code}: the SDK has {sorted(set(theirs) - set(ours))[:10]} more and "
        f"{sorted(set(ours) - set(theirs))[:10]} fewer: refresh the snapshot "
        f"(python -m tests.infra.alicloud_ram {code})"
    )


def test_every_snapshot_source_is_cited_with_a_url_and_a_read_date() -> None:
    data = snapshot()
    sources = data["sources"]
    for name, source in sources.items():
        assert source["url"].startswith("https://") and source["read"], name
    cited = [data["operators"]["source"], data["keys"]["global"]["source"]]
    cited += list(data["principals"].values())
    cited += [table["source"] for table in data["actions"].values()]
    assert set(cited) <= set(sources)


def _documented_limit(model: type, arg: str, pattern: str) -> int:
    doc = inspect.getdoc(model.__init__) or ""
    part = doc.split(f":param pulumi.Input[_builtins.str] {arg}:", 1)[1].split(":param", 1)[0]
    found = re.search(pattern, part)
    assert found, f"{model.__name__}.{arg}: the SDK no longer states its limit"
    return int(found.group(1))


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_every_custom_policy_fits_the_length_and_name_rules_the_sdk_states(
    path: Path, variant: str
) -> None:
    most = _documented_limit(ali.ram.PolicyArgs, "policy_document", r"maximum length is (\d+)")
    longest_name = _documented_limit(ali.ram.PolicyArgs, "policy_name", r"1 to (\d+) char")
    policies = _planned(path, variant).of_type("alicloud:ram/policy:Policy")
    assert policies
    for p in policies:
        assert len(p.inputs["policyDocument"].encode()) <= most, p.name
        name = p.inputs["policyName"]
        assert re.fullmatch(rf"[A-Za-z0-9-]{{1,{longest_name}}}", name), name
