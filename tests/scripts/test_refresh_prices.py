"""`scripts/refresh_prices.py` (make refresh-prices) against local fakes of the price APIs on
127.0.0.1, rewriting a private copy of the catalog (never the shipped files).

The fakes are the ones `cost.py --live` is tested with: AWS Price List GetProducts and
Alibaba Cloud DescribePrice (tests/scripts/test_cost_cli_live.py, GetProducts in botocore's
JSON 1.1 shape, DescribePrice answered to the official ECS SDK) and Azure's Retail Prices
pages (tests/infra/test_azure_prices.py, the documented Items / NextPageLink JSON), here
answering per size. Every price is FAKE.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import catalog, clouds
from infra.pricing import price_sheet
from scripts import refresh_prices
from tests.infra.test_azure_prices import FakeRetailPrices, _row, _serve
from tests.scripts.refresh_fakes import AliPrices
from tests.scripts.test_cost_cli_live import FakeApis
from tests.support.moto_server import moto_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLOSED = "http://127.0.0.1:9"  # nothing listens: a refused connection, never the internet
TODAY = dt.date.today().isoformat()


@pytest.fixture(autouse=True)
def no_real_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client points at a closed port on loopback unless a test gives it a fake."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", CLOSED)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", CLOSED)  # the spot price history
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", f"{CLOSED}/api/retail/prices")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", "127.0.0.1:9")
    monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", "127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # a refused port is not retried for seconds


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each cloud's folder with a copy of its catalog file, read (and written) instead."""
    home = tmp_path / "clouds"
    for name in clouds.names(catalog.CLOUD_FILE):
        (home / name).mkdir(parents=True)
        (home / name / "__init__.py").write_text("")
        (home / name / catalog.CLOUD_FILE).write_bytes(
            (clouds.HOME / name / catalog.CLOUD_FILE).read_bytes()
        )
    monkeypatch.setattr(catalog, "CLOUDS_DIR", home)
    caches = (catalog._cloud_files, catalog.load_catalog, price_sheet._load_default)
    for cached in caches:
        cached.cache_clear()
    yield home
    for cached in caches:
        cached.cache_clear()


def shipped(cloud: str) -> dict[str, Any]:
    with (clouds.HOME / cloud / catalog.CLOUD_FILE).open("rb") as f:
        return tomllib.load(f)


def priced(cloud: str) -> dict[str, float]:
    return {
        name: row["price"]["on_demand"]
        for name, row in shipped(cloud)["instances"].items()
        if "price" in row
    }


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = refresh_prices.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def changed_lines(before: bytes, after: bytes) -> dict[int, tuple[str, str]]:
    old, new = before.decode().splitlines(True), after.decode().splitlines(True)
    assert len(old) == len(new)
    return {i: (a, b) for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b}


def fits(text: str) -> bool:
    """80 columns, but for a path wider than a line, kept whole on its own (infra.usage.fit)."""
    return all(len(ln) <= 80 or " " not in ln.strip() for ln in text.splitlines())


def said(err: str) -> list[str]:
    """stderr's problems, each one whole (a line of two spaces continues the one before)."""
    problems: list[str] = []
    for line in err.splitlines():
        if line.startswith("  ") and problems:
            problems[-1] += " " + line.strip()
        else:
            problems.append(line)
    return problems


class PerSizeRetailPrices(FakeRetailPrices):
    """The Retail Prices fake, answering each armSkuName of the $filter with its own rows:
    a Spot and a Windows row first (the client must skip them), then the Linux one."""

    def __init__(self, prices: dict[str, float]):
        super().__init__([])
        self.prices = prices

    def pages_for(self, query: dict[str, Any]) -> list[list[dict[str, Any]]]:
        m = re.search(r"armSkuName eq '([^']+)'", query.get("$filter", [""])[0])
        size = m[1] if m else ""
        if size not in self.prices:
            return [[]]
        sku = size.removeprefix("Standard_").replace("_", " ")
        rows = [
            _row(f"{sku} Spot", "Virtual Machines Series", 0.01),
            _row(sku, "Virtual Machines Series Windows", 99.0),
            _row(sku, "Virtual Machines Series", self.prices[size]),
        ]
        return [[{**r, "armSkuName": size} for r in rows[:2]], [{**rows[2], "armSkuName": size}]]


@pytest.fixture
def azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[PerSizeRetailPrices]:
    old = priced("azure")
    # every size 10 % cheaper but the first, which is unchanged
    new = {name: round(v * 0.9, 4) for name, v in old.items()}
    first = next(iter(old))
    new[first] = old[first]
    server = PerSizeRetailPrices(new)
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", server.url)
    yield from _serve(server)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto 5.2.5 on 127.0.0.1 (tests/support/moto_server.py): its DescribeSpotPriceHistory
    answers SpotPrice "0.00001" for each Availability Zone its offerings list a type in
    (moto/ec2/responses/spot_instances.py), and nothing for a type it does not offer there."""
    with moto_server(warm=("ec2",)) as url:
        yield url


@pytest.fixture
def fake() -> Iterator[FakeApis]:
    server = FakeApis()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_azure_refresh_rewrites_only_each_price_its_date_and_source(
    homes: Path, azure: PerSizeRetailPrices
):
    path = homes / "azure" / catalog.CLOUD_FILE
    before = path.read_bytes()
    others = {n: (homes / n / catalog.CLOUD_FILE).read_bytes() for n in ("aws", "alicloud")}
    code, out, err = run("--cloud", "azure")
    assert code == 0, err
    after = path.read_bytes()
    diff = changed_lines(before, after)
    old = shipped("azure")["instances"]
    new = tomllib.loads(after.decode())["instances"]
    assert len(diff) == len(old) == len([n for n in old if "price" in old[n]])
    for name, row in new.items():
        price, was = row["price"], old[name]["price"]
        assert price["on_demand"] == azure.prices[name]
        assert (price["date"], price["source"]) == (TODAY, "AZ-RETAIL")
        # a spot range is the Spot meter's now, with its own date and source
        if "spot" in was:
            assert price["spot"] == [0.01, 0.01]
            assert (price["spot_date"], price["spot_source"]) == (TODAY, "AZ-RETAIL")
        else:
            assert not {k for k in price if k.startswith("spot")}
        assert {k: v for k, v in row.items() if k != "price"} == {
            k: v for k, v in old[name].items() if k != "price"
        }
    for i, (a, b) in diff.items():
        assert a.startswith("price = {") and b.startswith("price = {"), i
    assert all((homes / n / catalog.CLOUD_FILE).read_bytes() == b for n, b in others.items())
    # the table: each changed size once, with its old and new price and -10 %
    moved = [n for n in old if azure.prices[n] != old[n]["price"]["on_demand"]]
    assert f"azure: {len(old)} prices from AZ-RETAIL (USD/h), {len(moved)} changed, 1 the" in out
    for name in moved:
        line = next(
            ln for ln in out.splitlines() if ln.split()[:3] == [name, "eastus", "on-demand"]
        )
        assert "eastus" in line and "on-demand" in line and "->" in line
        assert line.rstrip().endswith(("-10.0%", "-9.9%", "-10.1%")), line
    assert f"catalog.toml: its prices are now dated {TODAY}, source AZ-RETAIL" in out.replace(
        "\n  ", " "
    )
    ranged = [n for n in old if "spot" in old[n]["price"]]
    assert f"azure: {len(ranged)} spot ranges from AZ-RETAIL, {len(ranged)} changed" in out
    spot_rows = [ln for ln in out.splitlines() if " spot " in ln and "->" in ln]
    assert len(spot_rows) == len(ranged) and all(ln.rstrip().endswith("%") for ln in spot_rows)
    assert fits(out) and fits(err)
    # a second refresh (a new process: the catalog read again) finds nothing to change
    catalog._cloud_files.cache_clear()
    catalog.load_catalog.cache_clear()
    code, out, _ = run("--cloud", "azure")
    assert code == 0 and "0 changed" in out and path.read_bytes() == after


def test_dry_run_shows_the_table_and_writes_nothing(homes: Path, azure: PerSizeRetailPrices):
    files = {p: p.read_bytes() for p in homes.glob(f"*/{catalog.CLOUD_FILE}")}
    code, out, err = run("--cloud", "azure", "--dry-run")
    assert code == 0, err
    assert "would change" in out and "--dry-run: nothing written" in out
    assert " -> " in out and "-10.0%" in out
    assert all(p.read_bytes() == b for p, b in files.items())
    assert not list(homes.glob("*/.*.refresh"))


def test_aws_refresh_through_get_products_keeps_a_type_the_answer_lacks(
    homes: Path, fake: FakeApis, moto_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", fake.url)
    old = priced("aws")
    names = list(old)
    lacking = names[-1]
    for name in names[:-1]:
        fake.aws_prices[(name, "US East (N. Virginia)")] = f"{old[name] * 1.05:.10f}"
    path = homes / "aws" / catalog.CLOUD_FILE
    before = path.read_bytes()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)  # moto's spot history
    code, out, err = run("--cloud", "aws")
    assert code == 1  # one price could not be had (docs/exit-status.md)
    kept = [
        p
        for p in said(err)
        if not p.endswith(("spot range: EC2 DescribeSpotPriceHistory: no Linux spot price",))
    ]
    assert [p for p in said(err) if "spot range" not in p] == [
        p for p in said(err) if p.startswith(f"aws: kept {lacking}: AWS Price List API")
    ], kept
    new = tomllib.loads(path.read_text())["instances"]
    for name in names[:-1]:
        assert new[name]["price"]["on_demand"] == pytest.approx(old[name] * 1.05)
        assert new[name]["price"]["source"] == "AWS-PRICELIST"
    kept = shipped("aws")["instances"][lacking]["price"]
    assert {k: v for k, v in new[lacking]["price"].items() if not k.startswith("spot")} == {
        k: v for k, v in kept.items() if not k.startswith("spot")
    }
    assert len(changed_lines(before, path.read_bytes())) >= len(names) - 1
    assert "+5.0%" in out and fits(out) and fits(err)
    sent = [r for r in fake.requests if r["api"] == "aws"]
    assert all(r["target"] == "AWSPriceListService.GetProducts" for r in sent)


def test_without_network_each_cloud_says_so_in_one_line_and_nothing_is_written(
    homes: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "fake-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "fake-id")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-secret")
    files = {p: p.read_bytes() for p in homes.glob(f"*/{catalog.CLOUD_FILE}")}
    code, out, err = run()
    assert code == 1
    problems = said(err)
    assert [p.split(":")[0] for p in problems] == list(catalog.provider_names())
    assert all(p.endswith("nothing rewritten") for p in problems), err
    assert all("connect" in p.lower() or "refused" in p for p in problems), err
    assert "Traceback" not in err and out == "" and fits(err)
    assert all(p.read_bytes() == b for p, b in files.items())


def test_a_cloud_without_credentials_is_skipped_in_one_line(
    homes: Path, azure: PerSizeRetailPrices
):
    code, out, err = run("--cloud", "alicloud", "--cloud", "azure")
    assert code == 0, err  # what could be asked was refreshed
    assert err.splitlines()[0].startswith("alicloud: skipped: no Alibaba Cloud credentials")
    assert "azure: " in out
    code, out, err = run("--cloud", "alicloud")
    assert code == 1 and out == ""
    assert "alicloud: skipped" in err and "no cloud could be asked" in err


def test_a_cloud_with_no_price_api_is_skipped(homes: Path, monkeypatch: pytest.MonkeyPatch):
    def no_module(name: str, part: str) -> Any:
        raise LookupError(f"no cloud {name!r} with a {part}.py")

    monkeypatch.setattr(clouds, "module", no_module)
    code, out, err = run("--cloud", "tencent")
    assert code == 1 and out == ""
    assert err.splitlines()[0] == "tencent: skipped: no price API in its folder (no prices.py)"


def test_an_unknown_cloud_is_refused_in_one_line(homes: Path):
    code, out, err = run("--cloud", "azur")
    assert code == 2 and out == ""
    assert "did you mean 'azure'?" in err and "Traceback" not in err


def _plan(homes: Path, stack: Path) -> subprocess.CompletedProcess[str]:
    """scripts/plan.py --json reading the catalog copy (CLOUDS_DIR set before anything)."""
    code = (
        "import runpy, sys; from pathlib import Path; import infra.catalog as c; "
        f"c.CLOUDS_DIR = Path({str(homes)!r}); "
        f"sys.argv = ['plan.py', '--stack-file', {str(stack)!r}, '--json']; "
        "runpy.run_path('scripts/plan.py', run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env
    )


def test_the_plan_of_an_alibaba_stack_reads_the_refreshed_price_and_its_date(
    homes: Path, fake: FakeApis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import json

    stack = tmp_path / "Pulumi.ali.yaml"
    stack.write_text(
        "config:\n  gpufleet:provider: alicloud\n  gpufleet:tier: a100x4\n"
        '  gpufleet:sshCidrs: ["203.0.113.7/32"]\n'
    )
    proc = _plan(homes, stack)
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)["outputs"]["hourly_cost"]
    kind = cost["instance_type"]
    # before: the shipped price, its old date, and the note naming the command
    assert cost["price_date"] == "2023-06-01"
    assert any("make refresh-prices CLOUD=alicloud" in w for w in cost["warnings"])

    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "fake-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    # DescribePrice by the hour and the month and DescribeSpotPriceHistory: refresh_fakes.py
    ali = AliPrices()
    for name in priced("alicloud"):
        ali.hour[name] = 100.25
        ali.spot[name] = [("cn-shanghai-l", "2026-12-05T07:00:00Z", 20.5)]
    quotes = shipped("alicloud")["pricing"]["subscription"]["monthly"]
    ali.month.update({name: q["price"] for name, q in quotes.items()})
    with ali.running():
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", ali.endpoint)
        code, out, err = run("--cloud", "alicloud")
    assert code == 0, err
    assert "ALI-DESCRIBEPRICE" in out and "CNY/h" in out

    proc = _plan(homes, stack)
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)["outputs"]["hourly_cost"]
    assert cost["instance_type"] == kind
    assert cost["amount"] == pytest.approx(100.25 * cost["nodes"])
    assert (cost["price_date"], cost["source"]) == (TODAY, "ALI-DESCRIBEPRICE")
    assert not any("days old" in w for w in cost["warnings"])


# -- spot ranges: AWS DescribeSpotPriceHistory (moto), Azure's Spot meters, the rewrite


def test_aws_spot_ranges_come_from_the_spot_price_history_with_their_date_and_source(
    homes: Path, fake: FakeApis, moto_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", fake.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    old = shipped("aws")["instances"]
    for name, row in old.items():
        if "price" in row:
            fake.aws_prices[(name, "US East (N. Virginia)")] = str(row["price"]["on_demand"])
    path = homes / "aws" / catalog.CLOUD_FILE
    before = path.read_bytes()
    code, out, err = run("--cloud", "aws")
    new = tomllib.loads(path.read_text())["instances"]
    ranged = [n for n, r in old.items() if "spot" in r.get("price", {})]
    refreshed = [n for n in ranged if new[n]["price"]["spot_source"] == "AWS-SPOTHISTORY"]
    assert refreshed, out + err  # moto offers some of the catalog's types in us-east-1
    for name in refreshed:
        price = new[name]["price"]
        assert price["spot"] == [0.00001, 0.00001] and price["spot_date"] == TODAY
        assert price["on_demand"] == old[name]["price"]["on_demand"]
        row = next(ln for ln in out.splitlines() if ln.split()[:3] == [name, "us-east-1", "spot"])
        assert "->" in row and row.rstrip().endswith("%")
    for name in set(ranged) - set(refreshed):  # moto has no offering: kept, said, exit 1
        spot = {k: v for k, v in new[name]["price"].items() if k.startswith("spot")}
        assert spot == {k: v for k, v in old[name]["price"].items() if k.startswith("spot")}
        assert any(p.startswith(f"aws: kept {name}'s spot range: EC2") for p in said(err))
    assert code == (1 if set(ranged) - set(refreshed) else 0)
    assert f"aws: {len(refreshed)} spot ranges from AWS-SPOTHISTORY" in out
    assert all(
        a.startswith("price = {") for a, _ in changed_lines(before, path.read_bytes()).values()
    )
    assert fits(out) and fits(err)


def test_a_spot_range_without_its_own_date_gets_one_and_the_rest_stays():
    text = (
        '[instances.a]\nprice = { on_demand = 1.0, date = "2024-01-01", source = "X", '
        "spot = [0.3, 0.4] }\n# kept\n[instances.b]\nprice = { on_demand = 2.0, date = "
        '"2024-01-01", source = "X", spot = [0.5, 0.6], spot_date = "2024-01-01", '
        'spot_source = "Y" }\n'
    )
    day = dt.date(2026, 12, 5)
    out = refresh_prices.rewrite(text, {}, day, "X", {"a": (0.25, 0.35), "b": (0.5, 0.7)}, "Z")
    doc = tomllib.loads(out)["instances"]
    assert doc["a"]["price"] == {
        "on_demand": 1.0,
        "date": "2024-01-01",
        "source": "X",
        "spot": [0.25, 0.35],
        "spot_date": "2026-12-05",
        "spot_source": "Z",
    }
    assert doc["b"]["price"]["spot"] == [0.5, 0.7] and doc["b"]["price"]["spot_source"] == "Z"
    assert "# kept" in out


def test_a_dry_run_shows_the_spot_rows_too(homes: Path, azure: PerSizeRetailPrices):
    code, out, err = run("--cloud", "azure", "--dry-run")
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if " spot " in ln and " -> " in ln]
    assert rows and all(re.search(r"-> +0\.01 ", ln) for ln in rows), out
    assert "spot ranges from AZ-RETAIL" in out and "would change" in out
