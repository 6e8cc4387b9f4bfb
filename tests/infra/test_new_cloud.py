"""A cloud is a folder: a throwaway fifth cloud (tests/infra/examplecloud/, as its author
writes it) copied into a temporary folder that is put on the clouds'
paths, with no file of the repository changed. It declares a node, a bucket and a guard
(scripts/plan.py's offline plan, its own resource types under Pulumi's mocks, the policy
pack judging them by its rules.py), is priced from its catalog (cost, size, gpus), reaps
(its function zip, built with its entry.py on top, run by a clean interpreter stops its idle
node) and ships a node module (its node.py, found by the node package's cloud lookup and
shipped with the watchdog). The last test counts the files outside a cloud's folder that
name a cloud: each is one a fifth cloud would have to edit, and there must be none."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import infra.catalog as catalog
from bootstrap.fleet import node_package
from infra import clouds, reaper_deploy
from infra.catalog import load_catalog, provider_names
from infra.clouds.base import get_provider
from infra.pricing import price_sheet
from infra.reaper import handler
from policy.resources import Resource
from tests.infra.test_provider_knowledge import ROOT, SCANNED, home_of, node_provider_names

NAME = "examplecloud"
SOURCE = Path(__file__).resolve().parent / NAME  # the new cloud's folder, as written


def _clear() -> None:
    for cached in (catalog._cloud_files, catalog.load_catalog, price_sheet._load_default):
        cached.cache_clear()
    reaper_deploy.function_zip.cache_clear()


def _forget() -> None:
    """Nothing of the throwaway cloud stays imported or registered after its test."""
    import gpufleet_node.clouds as node_clouds
    from gpufleet_node.clouds import base

    for module in [m for m in sys.modules if m.startswith(f"infra.clouds.{NAME}")]:
        del sys.modules[module]
    sys.modules.pop(f"{node_clouds.__name__}.{NAME}", None)
    base._REGISTERED.pop(NAME, None)
    node_clouds.CLOUDS.pop(NAME, None)


@pytest.fixture
def new_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tmp/examplecloud/: the new cloud's folder, on infra.clouds' path (the program, the
    catalog, the reaper, the mocks, the policy pack) and on the node package's (its node
    module). The function zips it builds are cached in a folder of the test's own."""
    import gpufleet_node.clouds as node_clouds

    folder = tmp_path / "clouds" / NAME
    shutil.copytree(SOURCE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(clouds, "__path__", [*clouds.__path__, str(folder.parent)])
    monkeypatch.setattr(node_clouds, "HOMES", [*node_clouds.HOMES, folder.parent])
    monkeypatch.setattr(reaper_deploy, "ZIP_CACHE", tmp_path / "zip-cache")
    _clear()
    yield folder
    _clear()
    _forget()


def test_the_catalog_knows_the_new_cloud_its_tier_offer_and_its_bill(new_cloud: Path) -> None:
    assert NAME in provider_names()
    assert load_catalog().resolve("t4x1", NAME).name == "ex.t4"
    assert price_sheet.load_pricing().providers[NAME].block["ssd"].amount == 0.1


def test_cost_compares_the_new_cloud_and_asks_its_own_live_prices(new_cloud: Path) -> None:
    from scripts import cost

    out, err = io.StringIO(), io.StringIO()
    assert cost.run(["--compare", "t4x1", "--json"], out, err) == 0, err.getvalue()
    assert NAME in {offer["provider"] for offer in json.loads(out.getvalue())["offers"]}
    assert cost.live_prices(NAME).__name__ == f"infra.clouds.{NAME}.prices"


def test_gpus_and_size_offer_the_new_clouds_instance(new_cloud: Path) -> None:
    from scripts import gpus, size

    out = io.StringIO()
    assert gpus.main(["--provider", NAME, "--json"], out, io.StringIO()) == 0
    assert "ex.t4" in out.getvalue()
    out = io.StringIO()
    assert size.main(["--model", "gpt2", "--tokens", "1e8", "--json"], out, io.StringIO()) == 0
    assert NAME in out.getvalue()


def test_the_program_and_the_reaper_find_the_new_cloud_by_its_folder(
    new_cloud: Path, tmp_path: Path
) -> None:
    assert get_provider(NAME).name == NAME
    assert NAME in handler.CLOUDS
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"instances": []}))
    env = {"GPUFLEET_REGION": "r1", "EXAMPLECLOUD_FLEET": str(fleet)}
    client = handler.make_cloud(NAME, env)
    assert (type(client).__module__, client.region) == (f"infra.clouds.{NAME}.reaper", "r1")


STACK = """
config:
  gpufleet:provider: examplecloud
  gpufleet:tier: t4x1
  gpufleet:region: ex-west-1
  gpufleet:sshCidrs:
    - 203.0.113.0/24
"""


def test_the_plan_declares_its_firewall_bucket_key_node_and_scheduled_reaper(
    new_cloud: Path, tmp_path: Path
) -> None:
    """scripts/plan.py's offline plan of a stack on the new cloud: the real program and
    components, the cloud's own resource types, its mocks, its bill and its policy facts."""
    from scripts import plan

    stack = tmp_path / "Pulumi.ex-t4x1.yaml"
    stack.write_text(STACK)
    doc, _notes = plan.plan(stack)
    types = sorted(r["type"] for r in doc["resources"] if r["type"].startswith(f"{NAME}:"))
    assert types == [
        "examplecloud:access:Key",
        "examplecloud:compute:Function",
        "examplecloud:compute:Instance",
        "examplecloud:network:Firewall",
        "examplecloud:storage:Bucket",
    ]
    (node,) = [r for r in doc["resources"] if r["type"] == "examplecloud:compute:Instance"]
    assert node["inputs"]["size"] == "ex.t4"
    assert node["inputs"]["tags"]["gpufleet:stack"] == "ex-t4x1"
    (fn,) = [r for r in doc["resources"] if r["type"] == "examplecloud:compute:Function"]
    assert fn["inputs"]["handler"] == "handler.example_handler"
    assert fn["inputs"]["env"]["GPUFLEET_PROVIDER"] == NAME
    zipped = reaper_deploy.function_zip(NAME)
    assert fn["inputs"]["codeSha256"] == hashlib.sha256(zipped).hexdigest()
    out = doc["outputs"]
    assert out["provider"] == NAME and out["bucket"] == "gpufleet-ex-t4x1"
    assert out["guard"] == {"function": "gpufleet-ex-t4x1-reaper", "schedule": "every 5 minutes"}
    assert out["nodes"][0]["public_ip"].startswith("198.51.100.")
    assert out["zone"] == "ex-west-1-a"
    assert (doc["cost"]["amount"], doc["cost"]["currency"]) == (0.5, "USD")
    assert doc["policies"]["passed"], doc["policies"]


def _fleet(path: Path) -> Path:
    tags = {
        "managed-by": "gpufleet",
        "gpufleet:stack": "ex",
        "gpufleet:tier": "t4x1",
        "gpufleet:role": "head",
        "gpufleet:idle-minutes": "30",
    }
    instances = [
        {"id": "busy", "beat_minutes_ago": 1, "util": 97.0},
        {"id": "idle", "beat_minutes_ago": 45, "util": 0.0},
    ]
    rows = [
        {"state": "running", "type": "ex.t4", "up_hours": 3, "tags": tags, **i} for i in instances
    ]
    path.write_text(json.dumps({"instances": rows}))
    return path


def test_its_function_zip_reaps_its_idle_node_run_by_a_clean_interpreter(
    new_cloud: Path, tmp_path: Path
) -> None:
    """The zip the plan would upload, unzipped and run as its platform would: its entry.py
    on top as handler.py, the reaper package and its reaper module beside it, nothing of the
    repository importable."""
    from infra.reaper import tags as T

    assert {T.MANAGED_BY, T.STACK, T.ROLE, T.IDLE_MINUTES} <= set(
        json.loads(_fleet(tmp_path / "probe.json").read_text())["instances"][0]["tags"]
    )
    folder = tmp_path / "function"
    zipfile.ZipFile(io.BytesIO(reaper_deploy.function_zip(NAME))).extractall(folder)
    assert (folder / "gpufleet_reaper" / f"{NAME}.py").is_file()
    fleet = _fleet(tmp_path / "fleet.json")
    code = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import handler\n"
        "assert 'infra' not in sys.modules\n"
        "print('RESULT ' + json.dumps(handler.example_handler({}, None)))\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "GPUFLEET_STACK": "ex",
        "GPUFLEET_APPLY": "true",
        "EXAMPLECLOUD_REGION": "r1",  # the platform's own variable (entry.py REGION_ENV)
        "EXAMPLECLOUD_FLEET": str(fleet),
    }
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-I", "-c", code, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [s["instance_id"] for s in result["stops"]] == ["idle"]
    states = {i["id"]: i["state"] for i in json.loads(fleet.read_text())["instances"]}
    assert states == {"busy": "running", "idle": "stopped"}


def test_its_node_module_is_found_by_name_and_shipped_with_the_watchdog(
    new_cloud: Path, tmp_path: Path
) -> None:
    from gpufleet_node import clouds as node_clouds

    node = node_clouds.node_cloud(NAME, "r1")
    assert (node.name, type(node).__module__) == (NAME, f"gpufleet_node.clouds.{NAME}")
    assert node.bucket_endpoint() == "https://storage.r1.example.invalid"
    shipped = f"gpufleet_node/clouds/{NAME}.py"
    assert shipped in node_package.closure("watchdog")
    assert node_package.source(shipped) == new_cloud / "node.py"
    # the shipped watchdog files alone: the node finds the new cloud among what was shipped
    for name in node_package.closure("watchdog"):
        (tmp_path / "opt" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(node_package.source(name), tmp_path / "opt" / name)
    code = (
        "from gpufleet_node import clouds\n"
        "print(sorted(clouds.CLOUDS), clouds.node_cloud('examplecloud', 'r1').name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code],
        cwd=tmp_path / "opt",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == NAME
    assert f"'{NAME}'" in done.stdout


def test_the_offline_plan_answers_with_the_new_clouds_own_mocks(new_cloud: Path) -> None:
    import pulumi

    from infra import offline

    engine = offline.Mocks("dev", "r1")
    node = pulumi.runtime.MockResourceArgs("examplecloud:index/node:Node", "n1", {})
    rid, out = engine.new_resource(node)
    assert rid.startswith("ex-") and out["address"].startswith("198.51.100.")
    call = pulumi.runtime.MockCallArgs("examplecloud:index/getRegion:getRegion", {}, "")
    assert engine.call(call) == ({"region": "r1"}, [])


def _node(**tags: str) -> Resource:
    return Resource("examplecloud:compute:Instance", "gpu-0", {"size": "ex.t4", "tags": tags})


def test_the_policy_pack_judges_the_new_clouds_resources_by_its_rules(new_cloud: Path) -> None:
    from policy import rules

    firewall = Resource("examplecloud:network:Firewall", "fw", {"sshFrom": ["0.0.0.0/0"]})
    found = rules.evaluate([_node(), firewall], stack_config={"maxHourlyCost": 0.1})
    by_policy = {v.policy: v.message for v in found}
    assert set(by_policy) == {
        "ssh-not-open-to-world",
        "gpu-instances-tagged",
        "gpu-instances-idle-guarded",
        "cost-ceiling",
    }
    assert by_policy["ssh-not-open-to-world"].startswith("fw (examplecloud:network:Firewall)")
    assert (
        "gpu-0 (examplecloud:compute:Instance) (ex.t4) lacks" in by_policy["gpu-instances-tagged"]
    )
    assert by_policy["gpu-instances-idle-guarded"].endswith(
        "; declare an examplecloud Function with a schedule"
    )
    # priced from the new cloud's own catalog: 0.5 USD/h for one ex.t4
    assert "about 0.5 USD/h (1x ex.t4 on-demand" in by_policy["cost-ceiling"]


def test_the_new_clouds_scheduled_reaper_guards_its_gpu_node(new_cloud: Path) -> None:
    from infra.reaper import tags as T
    from policy import rules

    tags = {
        T.MANAGED_BY: T.MANAGED_BY_VALUE,
        T.STACK: "ex",
        T.TIER: "t4x2",  # not a dev tier: nothing advises spot
        T.ROLE: "head",
        T.IDLE_MINUTES: "30",
        T.TTL_HOURS: "off",
        T.WATCHDOG: "on",
    }
    env = {"GPUFLEET_STACK": "ex", "GPUFLEET_APPLY": "true"}
    reaper = Resource("examplecloud:compute:Function", "reaper", {"env": env, "schedule": "5m"})
    assert rules.evaluate([_node(**tags), reaper]) == []
    unscheduled = Resource("examplecloud:compute:Function", "reaper", {"env": env})
    (found,) = rules.evaluate([_node(**tags), unscheduled])
    assert "reaper (examplecloud:compute:Function) has no enabled schedule" in found.message


# Files outside the clouds' folders (and their stacks, tests and docs) that may name a
# cloud, and why that is no edit a new cloud must make: the Python packages its SDK comes in
# are installed, not code (a cloud with an SDK adds its pin; this one has none). Shrink it.
NAMING_ALLOWED = {
    "requirements.txt": "the provider SDKs' pins (and the reaper SDKs' the tests run)",
    "pyproject.toml": "the provider SDKs' dependency ranges and mypy's per-SDK overrides",
    "infra/catalog/sources.toml": "citations: the titles and addresses of the sources the "
    "shared tables (GPU specs) cite; a new cloud's sources go in its own catalog.toml",
}
NAMED = ("aws", "azure", "alicloud", "tencent")  # before any catalog lookup: the four clouds


def _outside_a_clouds_folder(rel: str) -> bool:
    return home_of(rel) is None and not rel.startswith(("tests/", "docs/", "stacks/"))


def sdk_names() -> frozenset[str]:
    """What the clouds' folders declare of their SDKs: the Pulumi provider package
    (catalog.toml [sdk] package) and the distributions the reaper function imports (its
    reaper.py SDKS). Code outside the folders that names one knows that cloud as surely as
    code naming the cloud (compile_venv.py's SDK lists did, unseen by a name-only scan)."""
    found = {catalog.cloud_file(n).get("sdk", {}).get("package") for n in provider_names()}
    found |= {sdk for entry in handler.CLOUDS.values() for sdk in entry.sdks}
    return frozenset(n for n in found if n)


def files_naming_a_cloud() -> dict[str, list[int]]:
    """Each tracked file outside a cloud's folder whose code names a cloud or one of its
    SDKs: in Python, a string that is exactly a cloud's or an SDK's name (docstrings aside);
    elsewhere, a line (comments aside) holding one as a word."""
    import re

    names = frozenset(provider_names()) | sdk_names()
    alternatives = "|".join(re.escape(n) for n in sorted(names))
    word = re.compile(r"(?<![\w])(" + alternatives + r")(?![\w])", re.IGNORECASE)
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found: dict[str, list[int]] = {}
    for rel in listed:
        path = ROOT / rel
        if not _outside_a_clouds_folder(rel) or not path.is_file() or rel.endswith(".md"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if rel.endswith(".py"):
            hits = node_provider_names(text, names - {home_of(rel)})
        else:
            hits = [
                n
                for n, line in enumerate(text.splitlines(), 1)
                if word.search(line.split("#", 1)[0])
            ]
        if hits:
            found[rel] = hits
    return found


def test_the_scan_sees_a_cloud_named_outside_its_folder() -> None:
    assert node_provider_names('x = {"aws": 1}', frozenset(NAMED)) == [1]
    # an SDK list, as scripts/compile_venv.py held before the folders declared them
    sdks = sdk_names()
    assert {"pulumi_aws", "tencentcloud_iac_pulumi", "alibabacloud-ecs20140526"} <= sdks
    assert node_provider_names('MYPY_SDKS = ("pulumi_aws",)', sdks) == [1]
    assert _outside_a_clouds_folder("infra/config.py")
    assert not _outside_a_clouds_folder("infra/clouds/aws/entry.py")
    assert set(NAMED) <= set(provider_names())
    assert {p.split("/")[0] for p in SCANNED} <= {
        "infra",
        "bootstrap",
        "scripts",
        "policy",
        "gpufleet_node",
    }


def test_no_file_outside_a_clouds_folder_must_change_for_a_new_cloud(new_cloud: Path) -> None:
    """Every file that names one of the four clouds outside its folder is one a fifth cloud
    would have to edit too (a table, a default, a branch, a build step): there is none but
    the SDK pins. The throwaway cloud above needed none of them (it lives in a temporary
    folder; no file for it appears in the scanned folders). Before issue 40's move: the node
    modules (gpufleet_node/clouds/), infra/reaper/handler.py's entries and region variables,
    reaper_deploy.py's schedules, handler names and CloudWatch dashboard."""
    found = files_naming_a_cloud()
    assert set(found) == set(NAMING_ALLOWED), {
        p: lines for p, lines in found.items() if p not in NAMING_ALLOWED
    }
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", *SCANNED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert NAME not in changed
