"""Every CAM and COS policy document the shipped Tencent stacks declare, checked against
Tencent's published names (tests/data/clouds/tencent_cam.toml, dated and cited): each
action exists, each condition operator and key is documented and fits the other, and each
element is spelled as CAM reads it. The snapshot's cvm and monitor lists are checked
against the installed SDK's own API lists, so a stale snapshot fails too."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
from tests.infra.conftest import STACK_FILES, stack_id
from tests.support import tencent_cam as cam

SNAPSHOT_FILE = Path(__file__).resolve().parents[1] / "data" / "clouds" / "tencent_cam.toml"
# the resource inputs that hold a CAM or COS policy document
DOCUMENT_INPUTS = {
    "tencentcloud:Cam/policy:Policy": "document",
    "tencentcloud:Cam/role:Role": "document",
    "tencentcloud:Cos/bucketPolicy:BucketPolicy": "policy",
}


@functools.cache
def snapshot() -> dict[str, Any]:
    return tomllib.loads(SNAPSHOT_FILE.read_text())


def tencent_stacks() -> list[Path]:
    return [p for p in STACK_FILES if load_stack_file(p).provider == "tencent"]


@functools.cache
def documents(path: Path, nodes: int) -> tuple[tuple[str, str], ...]:
    """(resource name, document) for every policy document the stack declares."""
    overrides: dict[str, Any] = {"sshPublicKey": PLACEHOLDER_SSH_KEY, "nodes": nodes}
    result = evaluate(load_stack_file(path, overrides))
    return tuple(
        (r.name, r.inputs[field])
        for type_, field in DOCUMENT_INPUTS.items()
        for r in result.of_type(type_)
    )


VARIANTS = [
    pytest.param(path, nodes, id=f"{stack_id(path)}-{nodes}node")
    for path in tencent_stacks()
    for nodes in (1, 2)
]


def operator_families(section: dict[str, Any]) -> dict[str, list[str]]:
    """family -> operators ([operators] minus its qualifiers, suffix and sources)."""
    meta = {"sources", "qualifiers", "if_exist_suffix"}
    return {k: v for k, v in section.items() if k not in meta}


def statements(document: str) -> Iterator[dict[str, Any]]:
    yield from cam.load(document)["statement"]


def test_the_shipped_tencent_stacks_are_checked_at_all() -> None:
    """Three stacks: on-demand, spot and monthly, each alone and as a two-node cluster."""
    assert len(VARIANTS) == 6
    kinds = {load_stack_file(p).billing for p in tencent_stacks()}
    assert kinds == {"on-demand", "spot", "subscription"}


@pytest.mark.parametrize(("path", "nodes"), VARIANTS)
def test_every_action_is_one_tencent_publishes(path: Path, nodes: int) -> None:
    services = snapshot()["services"]
    unknown = []
    for name, doc in documents(path, nodes):
        for st in statements(doc):
            for action in cam._listed(st["action"]):
                service, _, api = action.removeprefix("name/").partition(":")
                known = services.get(service, {}).get("actions", [])
                if not any(cam.action_matches(f"{service}:{api}", f"{service}:{a}") for a in known):
                    unknown.append(f"{name}: {action}")
    assert unknown == []


@pytest.mark.parametrize(("path", "nodes"), VARIANTS)
def test_every_condition_operator_and_key_is_documented_and_they_fit(
    path: Path, nodes: int
) -> None:
    snap = snapshot()
    ops, keys = snap["operators"], snap["keys"]
    family_of = {op: fam for fam, names in operator_families(ops).items() for op in names}
    multi = set(snap["multi_valued_keys"]["keys"])
    problems = []
    for name, doc in documents(path, nodes):
        for st in statements(doc):
            for text, clauses in (st.get("condition") or {}).items():
                op = cam.Operator.parse(text)
                if op.qualifier and op.qualifier not in ops["qualifiers"]:
                    problems.append(f"{name}: qualifier {op.qualifier}")
                for key in clauses:
                    if key not in keys:
                        problems.append(f"{name}: condition key {key!r} is not documented")
                    elif family_of.get(op.base) != keys[key]:
                        problems.append(f"{name}: {op.base} does not compare a {keys[key]} key")
                    if key in multi and not op.qualifier:
                        problems.append(f"{name}: {key} has several values: use for_any_value")
    assert problems == []


@pytest.mark.parametrize(("path", "nodes"), VARIANTS)
def test_every_document_is_spelled_as_cam_reads_it(path: Path, nodes: int) -> None:
    policy = snapshot()["policy"]
    for name, doc in documents(path, nodes):
        parsed = cam.load(doc)  # lowercase elements, known operators, effect, version
        assert parsed["version"] == policy["version"], name
        assert set(parsed) <= set(policy["top_elements"]), name
        for st in parsed["statement"]:
            assert set(st) <= set(policy["statement_elements"]), name
            assert st["effect"] in policy["effects"], name


@pytest.mark.parametrize("service", ["cvm", "monitor"])
def test_the_snapshot_agrees_with_the_installed_sdks_api_list(service: str) -> None:
    """The SDK's client has one method per API, named like it (the cross-check)."""
    entry = snapshot()["services"][service]
    module_name, _, class_name = entry["sdk"].rpartition(".")
    client = getattr(importlib.import_module(module_name), class_name)
    apis = {n for n, _ in inspect.getmembers(client, inspect.isfunction) if n[:1].isupper()}
    assert set(entry["actions"]) <= apis
    assert apis - set(entry["actions"]) == set()


def test_every_snapshot_entry_names_its_sources() -> None:
    snap = snapshot()
    sources = snap["sources"]
    for src in sources.values():
        assert src["url"].startswith("https://") and src["read"]
    sections = [snap["policy"], snap["operators"], snap["keys"], snap["multi_valued_keys"]]
    for section in [*sections, *snap["services"].values()]:
        assert section["sources"] and set(section["sources"]) <= set(sources)


def test_a_misspelt_action_or_operator_would_be_caught() -> None:
    """The checks above can fail: the names the stacks once used are not in the snapshot."""
    snap = snapshot()
    assert "ListMultipart" not in snap["services"]["cos"]["actions"]
    family_of = {
        op for names in snap["operators"].values() if isinstance(names, list) for op in names
    }
    assert "bool" not in family_of and "bool_equal" in family_of
    assert "cos:secure_transport" not in snap["keys"]
    with pytest.raises(cam.PolicyError):
        cam.load(json.dumps({"version": "2.0", "Statement": []}))
