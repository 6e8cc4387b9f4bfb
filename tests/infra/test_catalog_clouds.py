"""The catalog's clouds are its cloud folders: adding one is a new clouds/<name>/catalog.toml."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import infra.catalog as catalog
from infra import clouds
from infra.catalog import CatalogError, load_catalog, provider_names
from infra.pricing import price_sheet

NEW_CLOUD = """
[provider]
name = "examplecloud"
order = 99
currency = "USD"
price_region = "r1"
default_region = "r1"
ssh_user = "ubuntu"
billing = ["on-demand"]

[provider.unsupported]
subscription = "not sold"

[sources.EXC]
title = "Example cloud's own price page"
url = "https://example.invalid/prices"
retrieved = "2026-11-30"

[instances."ex.t4"]
gpu = "T4"
gpus = 1
vcpus = 4
memory_gib = 16
network_gbps = 10
spec_source = "EXC"
price = { on_demand = 0.5, date = "2026-11-30", source = "EXC" }

[tiers]
t4x1 = { general = "ex.t4" }

[pricing]
currency = "USD"
region = "r1"
root_disk_class = "ssd"
bucket_class = "hot"
spot_caveat = "none sold"
spot_caveat_source = "EXC"
block.ssd = { per_gb_month = 0.1, date = "2026-11-30", source = "EXC" }
bucket.hot = { per_gb_month = 0.02, date = "2026-11-30", source = "EXC" }
egress = { per_gb = 0.09, free_gb = 100, date = "2026-11-30", source = "EXC" }
snapshot = { per_gb_month = 0.05, date = "2026-11-30", source = "EXC" }
"""


def add_cloud(homes: Path, name: str, text: str) -> Path:
    """A cloud folder (a package) holding ``text`` as its catalog file."""
    (homes / name).mkdir(parents=True, exist_ok=True)
    (homes / name / "__init__.py").write_text("")
    (homes / name / catalog.CLOUD_FILE).write_text(text)
    return homes / name


@pytest.fixture
def catalog_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private copy of the shipped catalog that the loaders read instead of the real one."""
    data = tmp_path / "catalog"
    shutil.copytree(catalog.DATA_DIR, data, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    homes = data / "clouds"  # each cloud's folder with only its catalog file
    for name in clouds.names(catalog.CLOUD_FILE):
        add_cloud(homes, name, (clouds.HOME / name / catalog.CLOUD_FILE).read_text())
    monkeypatch.setattr(catalog, "DATA_DIR", data)
    monkeypatch.setattr(catalog, "CLOUDS_DIR", homes)
    monkeypatch.setattr(price_sheet, "PRICING_FILE", data / "pricing.toml")
    for cached in (catalog._cloud_files, catalog.load_catalog, price_sheet._load_default):
        cached.cache_clear()
    yield data
    for cached in (catalog._cloud_files, catalog.load_catalog, price_sheet._load_default):
        cached.cache_clear()


def test_the_shipped_clouds_are_the_files_in_the_clouds_folder_in_their_declared_order():
    files = {p.parent.name for p in clouds.HOME.glob(f"*/{catalog.CLOUD_FILE}")}
    assert set(provider_names()) == files == set(load_catalog().providers)
    orders = [catalog.cloud_file(n)["provider"]["order"] for n in provider_names()]
    assert orders == sorted(orders)


def test_a_new_cloud_file_adds_the_cloud_its_types_its_tier_offer_and_its_bill(catalog_copy):
    add_cloud(catalog_copy / "clouds", "examplecloud", NEW_CLOUD)
    assert provider_names()[-1] == "examplecloud"
    cat = load_catalog()
    assert cat.resolve("t4x1", "examplecloud").name == "ex.t4"
    assert cat.sources["EXC"].title.startswith("Example cloud")
    assert price_sheet.load_pricing().providers["examplecloud"].block["ssd"].amount == 0.1
    # and the other clouds' offers of the same tier now name it as an alternative
    assert "examplecloud" in {a.provider for a in cat.alternatives("t4x1", "aws", "memory")}


def test_a_tier_offer_for_a_tier_that_does_not_exist_is_a_catalog_error(catalog_copy):
    text = NEW_CLOUD.replace("t4x1 = {", "t4x9 = {")
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    with pytest.raises(
        CatalogError, match=r"examplecloud/catalog.toml \[tiers\]: unknown tiers \['t4x9'\]"
    ):
        load_catalog()


def test_an_offer_left_in_tiers_toml_is_refused_with_where_it_belongs(catalog_copy):
    tiers = catalog_copy / "tiers.toml"
    tiers.write_text(
        tiers.read_text() + '\n[tiers.t4x2]\ndescription = "x"\ngpu = "T4"\n'
        'gpus = 2\nidle_minutes = 30\nttl_hours = 24\naws = { general = "g4dn.xlarge" }\n'
    )
    with pytest.raises(CatalogError, match=r"tiers.t4x2: unknown keys \['aws'\].*clouds/"):
        load_catalog()


def test_a_source_defined_twice_is_a_catalog_error(catalog_copy):
    text = NEW_CLOUD.replace("[sources.EXC]", "[sources.AD]")
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    with pytest.raises(CatalogError, match="source 'AD' is already defined"):
        load_catalog()


def test_a_cloud_file_without_its_pricing_table_is_named_in_the_error(catalog_copy):
    text = NEW_CLOUD[: NEW_CLOUD.index("[pricing]")]
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    with pytest.raises(
        CatalogError, match=r"no \[pricing\] table in clouds/examplecloud/catalog.toml"
    ):
        price_sheet.load_pricing()


def test_a_file_in_clouds_without_a_provider_table_is_a_catalog_error(catalog_copy):
    add_cloud(catalog_copy / "clouds", "notes", 'title = "scratch notes"\n')
    with pytest.raises(
        CatalogError, match=r"clouds/notes/catalog.toml: a \[provider\] table is required"
    ):
        provider_names()


IB_TYPE = """
[instances."ex.ib8"]
gpu = "H100-80GB"
gpus = 8
vcpus = 96
memory_gib = 1900
network_gbps = 80
infiniband = true
infiniband_gbps = 3200
nccl_socket_ifname = "ens5"
nccl_topo_file = "/opt/example/topo.xml"
fabric_source = "EXC"
spec_source = "EXC"
"""


def test_a_new_clouds_infiniband_type_gets_its_own_nccl_settings_from_its_file(catalog_copy):
    from bootstrap.fleet.interconnect import INFINIBAND, fabric_env

    text = NEW_CLOUD.replace("[tiers]", IB_TYPE + "\n[tiers]")
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    got = fabric_env({"instance_type": "ex.ib8"}, "examplecloud", load_catalog())
    assert got.fabric == INFINIBAND and got.source == "EXC"
    assert got.env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert got.env["NCCL_TOPO_FILE"] == "/opt/example/topo.xml"


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (('fabric_source = "EXC"\n', ""), "nccl_\\* settings need a fabric_source"),
        (('fabric_source = "EXC"', 'fabric_source = "EXC, NOPE"'), "fabric_source 'NOPE'"),
    ],
)
def test_nccl_settings_without_a_known_source_are_a_catalog_error(catalog_copy, edit, says):
    text = NEW_CLOUD.replace("[tiers]", IB_TYPE.replace(*edit) + "\n[tiers]")
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    with pytest.raises(CatalogError, match=says):
        load_catalog()


def test_a_billing_note_is_read_for_a_mode_the_cloud_sells(catalog_copy):
    note = '\n[provider.billing_notes]\non-demand = "needs an account of kind X"\n'
    text = NEW_CLOUD.replace("\n[provider.unsupported]", note + "\n[provider.unsupported]")
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    info = load_catalog().providers["examplecloud"]
    assert info.billing_notes == {"on-demand": "needs an account of kind X"}


def test_a_billing_note_for_a_mode_the_cloud_does_not_sell_is_a_catalog_error(catalog_copy):
    note = '\n[provider.billing_notes]\nspot = "needs X"\n'
    text = NEW_CLOUD.replace("\n[provider.unsupported]", note + "\n[provider.unsupported]")
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    with pytest.raises(CatalogError, match=r"billing_notes: \['spot'\] are not billing modes"):
        load_catalog()


def test_a_billing_mode_the_tool_does_not_know_is_a_catalog_error(catalog_copy):
    text = NEW_CLOUD.replace('billing = ["on-demand"]', 'billing = ["on-demand", "spt"]')
    add_cloud(catalog_copy / "clouds", "examplecloud", text)
    with pytest.raises(CatalogError) as info:
        load_catalog()
    assert str(info.value).endswith(
        "examplecloud/catalog.toml [provider].billing: 'spt' is not a billing mode: "
        "use one of on-demand, spot, subscription (did you mean 'spot'?)"
    )
