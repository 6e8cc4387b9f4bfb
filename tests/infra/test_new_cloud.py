"""A cloud is a folder: a throwaway one, written into a temporary tree that is put on
infra.clouds' package path, is picked up by the catalog (cost, size, gpus), the program's
lookup, live prices, the offline plan's mocks, the policy pack and the reaper with no edit
anywhere else; and the files outside its folder that a new cloud must still touch are
counted (none now)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import infra.catalog as catalog
from infra import clouds
from infra.catalog import load_catalog, provider_names
from infra.clouds.base import get_provider
from infra.pricing import price_sheet
from infra.reaper import handler
from policy.resources import Resource
from tests.infra.test_catalog_clouds import NEW_CLOUD

NAME = "examplecloud"

# The throwaway cloud's own files: only what each part asks of a cloud.
PROGRAM = '''"""The throwaway cloud's program: a CloudProvider that declares nothing."""

NAME = "examplecloud"


class ExampleProvider:
    name = NAME


PROVIDER = ExampleProvider()
'''
REAPER = '''"""The throwaway cloud's reaper: from_env hands back what it was given."""

VENDOR_SDK = False
SDKS: tuple[str, ...] = ()
WHEELS = False


def from_env(region, env, given):
    return ("examplecloud client", region, given.endpoint)
'''
PRICES = '''"""The throwaway cloud's live prices: it has no price API, and says so."""

from infra.clouds.live import LivePriceError


def live_price(instance_type, region):
    raise LivePriceError("examplecloud has no price API")


def live_reservations(instance_type, region):
    raise LivePriceError("examplecloud sells no reservations")
'''

MOCKS = '''"""The throwaway cloud's answers under Pulumi's mocks (infra.offline)."""

PACKAGE = "examplecloud"


def resource(typ, name, inputs, out, rid, engine):
    out["address"], _ = engine.ips_for(name)
    return "ex-" + engine.digest(typ, name)


def invoke(token, inputs, engine):
    if token == "examplecloud:index/getRegion:getRegion":
        return {"region": engine.region}
    return None
'''

RULES = '''"""The throwaway cloud's policy facts: an instance sized by its `size` input, a
reaper function scheduled by its own `schedule` input, and a firewall's SSH sources."""

from policy.resources import SSH_FIX, Bill, CloudFacts, as_list, world

NAME = "examplecloud"
INSTANCE = "examplecloud:compute:Instance"
FUNCTION = "examplecloud:compute:Function"
FIREWALL = "examplecloud:network:Firewall"


def bill(r, itype):
    return Bill(NAME, itype, "on-demand")


def guard_env(fn):
    env = fn.get("env")
    return env if isinstance(env, dict) else {}


def guard_scheduled(resources, fn):
    return bool(fn.get("schedule"))


def ssh(r):
    if r.type != FIREWALL:
        return []
    cidrs = [c for c in as_list(r.get("sshFrom")) if world(c)]
    return [f"{r.label} lets {c} reach SSH (port 22): {SSH_FIX}" for c in cidrs]


FACTS = CloudFacts(
    name=NAME,
    package=NAME,
    instances={INSTANCE: ("size",)},
    bill=bill,
    guard_fix="declare an examplecloud Function with a schedule",
    guard_functions=(FUNCTION,),
    guard_env=guard_env,
    guard_scheduled=guard_scheduled,
    ssh=ssh,
)
'''


def _clear() -> None:
    for cached in (catalog._cloud_files, catalog.load_catalog, price_sheet._load_default):
        cached.cache_clear()


@pytest.fixture
def new_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The folder tmp/examplecloud/ on infra.clouds' path, as a new cloud's author writes it."""
    folder = tmp_path / NAME
    folder.mkdir()
    for name, text in {
        "__init__.py": '"""A throwaway cloud."""\n',
        "catalog.toml": NEW_CLOUD,
        "program.py": PROGRAM,
        "reaper.py": REAPER,
        "prices.py": PRICES,
        "mocks.py": MOCKS,
        "rules.py": RULES,
    }.items():
        (folder / name).write_text(text)
    monkeypatch.setattr(clouds, "__path__", [*clouds.__path__, str(tmp_path)])
    _clear()
    yield folder
    _clear()
    import sys

    for module in [m for m in sys.modules if m.startswith(f"infra.clouds.{NAME}")]:
        del sys.modules[module]


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


def test_the_program_and_the_reaper_find_the_new_cloud_by_its_folder(new_cloud: Path) -> None:
    assert get_provider(NAME).name == NAME
    assert NAME in handler.CLOUDS
    client = handler.make_cloud(NAME, {"GPUFLEET_REGION": "r1"}, endpoint="http://127.0.0.1:1")
    assert client == ("examplecloud client", "r1", "http://127.0.0.1:1")  # type: ignore[comparison-overlap]


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


def test_the_files_outside_its_folder_a_new_cloud_must_still_touch(new_cloud: Path) -> None:
    # Each registry still keyed by a cloud's name is a file a new cloud must edit. The
    # policy pack's facts now live in each cloud's rules.py; the node side
    # (gpufleet_node/) is its own folder of modules. The set was {"policy/rules.py"}.
    from policy import rules

    still = set()
    if NAME not in {facts.name for facts in rules.cloud_facts().values()}:
        still.add("policy/rules.py")
    assert still == set()
