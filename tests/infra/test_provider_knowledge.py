"""Provider knowledge lives in the cloud's own folder: outside infra/clouds/<name>/ no code
compares that cloud's name to a literal (a cloud's folder names no other cloud); callers
read the cloud's catalog facts instead. On the node (gpufleet_node/, files that must run
alone) a cloud's knowledge lives in its own module, written in its folder as
infra/clouds/<name>/node.py and shipped as gpufleet_node/clouds/<name>.py, which registers
its class: outside that module no node file names that cloud at all. And every
registry knows every cloud the catalog knows, so adding a cloud is
new modules, classes and catalog files."""

from __future__ import annotations

import ast
import importlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from infra import clouds
from infra.catalog import (
    CatalogError,
    Feature,
    _provider,
    load_catalog,
    provider_names,
)
from infra.clouds import base
from infra.reaper import handler
from policy import rules

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("infra", "bootstrap", "scripts", "policy", "gpufleet_node")
# Where provider differences are meant to live: infra/clouds/<name>/ may name <name> only.
CLOUD_HOMES = "infra/clouds/"
# The node package, run alone on the node: its per-cloud code is one module per cloud, in
# the cloud's folder (infra/clouds/<name>/node.py, shipped as gpufleet_node/clouds/<name>.py)
# and scanned as a node file: it may name <name> only.
NODE_DIR = "gpufleet_node/"
NODE_FILE = "node.py"

# What could not be moved yet: path -> (how many comparisons, why). Shrink it; never grow it
# without a reason a reviewer accepts.
ALLOWED: dict[str, tuple[int, str]] = {}
# The same for the node files outside the node modules (a provider's name anywhere in code).
NODE_ALLOWED: dict[str, tuple[int, str]] = {}


def _names_a_provider(node: ast.AST | None, names: frozenset[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_provider(e, names) for e in node.elts)
    return False


def provider_name_branches(source: str, names: frozenset[str]) -> list[int]:
    """Line numbers where code compares something to a provider's name written as a literal
    (==, !=, in, not in, a match case): the branches that belong behind the provider."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            if any(_names_a_provider(x, names) for x in (node.left, *node.comparators)):
                found.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _names_a_provider(node.value, names):
            found.append(node.lineno)
    return sorted(found)


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (prose, not code)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def node_provider_names(source: str, names: frozenset[str]) -> list[int]:
    """Line numbers where code names a provider: a string literal that is exactly a
    provider's name (a branch, a default, a key), docstrings left aside."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in prose
    )


def home_of(rel: str) -> str | None:
    """The cloud whose folder holds ``rel`` (infra/clouds/<name>/..., its node module
    included), else None."""
    inside = rel.removeprefix(CLOUD_HOMES)
    return inside.split("/")[0] if inside != rel and "/" in inside else None


def _scan() -> Counter[str]:
    names = frozenset(provider_names())
    counts: Counter[str] = Counter()
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            others = names - {home_of(rel)}
            on_node = rel.startswith(NODE_DIR) or bool(home_of(rel) and path.name == NODE_FILE)
            scan = node_provider_names if on_node else None
            source = path.read_text(encoding="utf-8")
            hits = scan(source, others) if scan else provider_name_branches(source, others)
            if hits:
                counts[rel] = len(hits)
    return counts


def default_clouds(source: str, names: frozenset[str]) -> list[int]:
    """Line numbers where code falls back to a cloud (issue 23: no default cloud): a
    parameter's default, ``x or "<cloud>"``, ``default="<cloud>"``, ``.get(k, "<cloud>")``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        found: list[Any] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found = [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found = node.values[1:]
        elif isinstance(node, ast.keyword) and node.arg == "default":
            found = [node.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            found = node.args[1:2] if node.func.attr == "get" else []
        lines += [n.lineno for n in found if isinstance(n, ast.Constant) and n.value in names]
    return sorted(lines)


# Fallbacks to a cloud not moved yet: path -> (how many, why). Shrink it, never grow it.
# Before each cloud's entry point moved to its folder (infra/clouds/<name>/entry.py):
# infra/reaper/handler.py, 5 (each entry's own cloud when GPUFLEET_PROVIDER is unset, and
# build_function_zip's provider defaulting to alicloud).
DEFAULT_ALLOWED: dict[str, tuple[int, str]] = {}


def test_the_fallback_scanner_finds_each_way_of_defaulting_to_a_cloud() -> None:
    source = "\n".join(
        [
            'def f(provider="aws"): pass',  # 1
            'p = provider or "aws"',  # 2
            'parser.add_argument("--provider", default="aws")',  # 3
            'p = env.get("GPUFLEET_PROVIDER", "aws")',  # 4
            'p = provider or "gcp"',  # not a cloud here
        ]
    )
    assert default_clouds(source, frozenset({"aws"})) == [1, 2, 3, 4]


def test_outside_a_clouds_folder_nothing_falls_back_to_a_default_cloud() -> None:
    names = frozenset(provider_names())
    found = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            hits = default_clouds(path.read_text(encoding="utf-8"), names - {home_of(rel)})
            if hits:
                found[rel] = len(hits)
    assert found == {p: n for p, (n, _why) in DEFAULT_ALLOWED.items()}, found


def _node_clouds() -> Any:
    return importlib.import_module("gpufleet_node.clouds")


def test_the_scanner_finds_each_way_of_branching_on_a_provider_name() -> None:
    names = frozenset({"aws", "alicloud"})
    source = "\n".join(
        [
            'if cfg.provider == "aws": pass',  # 1
            'if "alicloud" != p: pass',  # 2
            'ok = provider in ("aws", "gcp")',  # 3
            'ok = provider not in ["alicloud"]',  # 4
            "match p:",  # 5
            '    case "aws": pass',  # 6
            'REGISTRY = {"aws": 1, "alicloud": 2}',  # 7: a registry, not a branch
            'x = REGISTRY["aws"]',  # 8: a lookup, not a branch
            'if prefix == "aws:": pass',  # 9: a tag prefix, not a name
        ]
    )
    assert provider_name_branches(source, names) == [1, 2, 3, 4, 6]


def test_on_the_node_any_provider_name_in_code_counts_but_prose_does_not() -> None:
    names = frozenset({"aws", "alicloud"})
    source = "\n".join(
        [
            '"""aws"""',  # 1: the module's docstring
            "def f(p):",  # 2
            '    """alicloud"""',  # 3: a docstring
            '    return p or "aws"',  # 4: a default cloud
            "CLOUDS = {'alicloud': 1}",  # 5: a table by name
            'x = "aws:"',  # 6: a prefix, not a name
        ]
    )
    assert node_provider_names(source, names) == [4, 5]


def test_outside_their_clouds_folder_the_node_files_name_no_provider() -> None:
    # Before the node's clouds became classes: 10 branches in watchdog.py, 1 in
    # watchdog_sync.py (now bucket.py) and 1 in job_sync.py; before clouds/: the CLOUDS table.
    found = {p: n for p, n in _scan().items() if p.startswith(NODE_DIR)}
    assert found == {p: n for p, (n, _why) in NODE_ALLOWED.items()}, (
        "a provider's name in a node file outside a cloud's node module: put it in "
        f"infra/clouds/<name>/node.py instead (or shrink NODE_ALLOWED): {found}"
    )


def test_every_node_cloud_is_its_own_module_registered_under_its_own_name() -> None:
    clouds = _node_clouds().CLOUDS
    modules = {p.parent.name for p in (ROOT / CLOUD_HOMES).glob(f"*/{NODE_FILE}")}
    assert set(clouds) == modules
    assert not set(_node_clouds().HERE.glob("*.py")) - {
        _node_clouds().HERE / "__init__.py",
        _node_clouds().HERE / "base.py",
    }, "a cloud's node module in gpufleet_node/clouds/: it belongs in its cloud's folder"
    assert {name: cls.name for name, cls in clouds.items()} == {n: n for n in clouds}
    assert {name: cls.__module__ for name, cls in clouds.items()} == {
        n: f"gpufleet_node.clouds.{n}" for n in clouds
    }


def test_no_module_outside_the_providers_branches_on_a_provider_name() -> None:
    found = _scan()
    allowed = {**ALLOWED, **NODE_ALLOWED}
    unexpected = {path: n for path, n in found.items() if path not in allowed}
    assert unexpected == {}, (
        "compare to a provider's name outside infra/clouds/<name>/: read the cloud's catalog "
        f"facts (infra.catalog ProviderInfo) or add a registry entry instead: {unexpected}"
    )
    grown = {p: n for p, n in found.items() if p in allowed and n > allowed[p][0]}
    assert grown == {}, f"more provider-name branches than the allow-list says: {grown}"


def test_the_allow_list_holds_only_what_is_still_there() -> None:
    found = _scan()
    stale = {p: (found.get(p, 0), n) for p, (n, _) in ALLOWED.items() if found.get(p, 0) < n}
    assert stale == {}, f"shrink ALLOWED (found, allowed): {stale}"


def test_the_policy_pack_names_no_cloud_it_asks_each_clouds_rules() -> None:
    # Before each cloud's rules.py: PACKAGE_PROVIDERS, GUARD_FIX (with its 'aws' default),
    # GUARD_FUNCTIONS and instance_bill's Bill("aws", ...) ... Bill("alicloud", ...).
    names = frozenset(provider_names())
    found = {
        path.relative_to(ROOT).as_posix(): hits
        for path in sorted((ROOT / "policy").rglob("*.py"))
        if (hits := node_provider_names(path.read_text(encoding="utf-8"), names))
    }
    assert found == {}, "a cloud's name in policy/: move it to infra/clouds/<name>/rules.py"


def test_every_registry_covers_every_provider_the_catalog_knows() -> None:
    # A cloud exists once its catalog file does; every layer must then know it. A registry may
    # know a cloud before its catalog file lands (the reaper half of a new cloud comes first).
    known = set(load_catalog().providers)
    assert known == set(provider_names())
    assert known <= set(clouds.names("program.py"))
    assert known <= set(clouds.names("prices.py"))
    assert known <= set(clouds.names("rules.py"))
    assert known <= {facts.name for facts in rules.cloud_facts().values()}
    assert known <= set(handler.CLOUDS)
    assert known <= set(_node_clouds().CLOUDS)


def test_every_node_cloud_reaches_its_bucket_with_the_one_bucket_client() -> None:
    # The watchdog, job sync, verify's probe and the verify report upload all go through
    # the node cloud's bucket_store (bucket.py); there is no second table of uploaders.
    node_clouds = _node_clouds().CLOUDS
    bucket = importlib.import_module("gpufleet_node.bucket")
    stores = {name: cls.bucket_store for name, cls in node_clouds.items()}
    assert stores and all(issubclass(s, bucket.BucketStore) for s in stores.values()), stores


def test_console_host_keys_are_read_exactly_where_the_catalog_says_the_cloud_can() -> None:
    able = {
        name
        for name, info in load_catalog().providers.items()
        if info.supports(Feature.CONSOLE_HOST_KEYS)
    }
    assert set(clouds.names("console.py")) == able
    for name in able:
        assert callable(clouds.module(name, "console").fetcher)


@pytest.mark.parametrize("name", provider_names())
def test_what_a_cloud_cannot_do_lives_in_its_catalog_file_alone(name: str) -> None:
    """Every caller reads [provider.unsupported] through infra.catalog; the program keeps
    no copy that could drift from it (nothing read the old UNSUPPORTED mirror)."""
    provider = base.get_provider(name)
    assert provider.name == name
    assert not hasattr(provider, "UNSUPPORTED")
    assert "UNSUPPORTED" not in base.CloudProvider.__annotations__


def test_each_cloud_offers_its_default_scratch_class() -> None:
    for info in load_catalog().providers.values():
        assert info.default_scratch_class in info.scratch_classes


def test_a_feature_the_catalog_does_not_know_is_refused() -> None:
    raw = {
        "name": "aws",
        "currency": "USD",
        "price_region": "us-east-1",
        "default_region": "us-east-1",
        "ssh_user": "ubuntu",
        "billing": ["on-demand"],
        "unsupported": {"teleport": "no", "subscription": "no"},
    }
    with pytest.raises(CatalogError, match="'teleport' is not one of"):
        _provider(raw, "aws")


def test_billing_and_the_subscription_feature_must_agree() -> None:
    raw = {
        "name": "aws",
        "currency": "USD",
        "price_region": "us-east-1",
        "default_region": "us-east-1",
        "ssh_user": "ubuntu",
        "billing": ["on-demand", "subscription"],
        "unsupported": {"subscription": "no"},
    }
    with pytest.raises(CatalogError, match="disagree about subscription"):
        _provider(raw, "aws")


def test_check_supported_names_each_missing_feature_with_its_reason() -> None:
    ali = load_catalog().providers["alicloud"]
    with pytest.raises(LookupError) as exc:
        ali.check_supported(Feature.EFA, Feature.PLACEMENT_GROUP, Feature.SUBSCRIPTION)
    text = str(exc.value)
    assert "EFA / RDMA networking (eRDMA only from generation 8" in text
    assert "cluster placement group" in text and "subscription" not in text
    load_catalog().providers["aws"].check_supported(Feature.EFA, Feature.PLACEMENT_GROUP)


def test_an_io2_scratch_disk_buys_500_iops_per_gib_up_to_its_ceiling() -> None:
    io2 = load_catalog().providers["aws"].scratch_classes["io2"]
    assert io2.provisioned_iops(100) == 50_000
    assert io2.provisioned_iops(1000) == 64_000
    assert load_catalog().providers["alicloud"].scratch_classes["PL1"].provisioned_iops(100) is None
