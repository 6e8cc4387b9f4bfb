"""`make refresh-prices` on Alibaba Cloud and Tencent Cloud: on-demand, spot ranges (ECS
DescribeSpotPriceHistory; CVM InquiryPriceRunInstances SPOTPAID) and monthly quotes
(DescribePrice by the month; InquiryPriceRunInstances PREPAID), against the local fakes of
tests/scripts/refresh_fakes.py on 127.0.0.1, throttled and failed answers through the fault
proxy, and runs without credentials. A private copy of the catalog is rewritten (never the
shipped files). Every price is FAKE.
"""

# ruff: noqa: F811 (the fixtures `homes` and `no_real_api` come from test_refresh_prices)
from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import catalog
from tests.scripts.refresh_fakes import AliPrices, TencentPrices, cloud_fault_proxy, refusing
from tests.scripts.test_refresh_prices import (  # noqa: F401 (fixtures)
    TODAY,
    changed_lines,
    fits,
    homes,
    no_real_api,
    priced,
    run,
    said,
    shipped,
)
from tests.support.fault_proxy import Fault

pytestmark = pytest.mark.integration

ALI_REGION, TC_REGION = "cn-shanghai", "ap-guangzhou"


def monthly(cloud: str) -> dict[str, float]:
    quotes = shipped(cloud)["pricing"]["subscription"]["monthly"]
    return {name: q["price"] for name, q in quotes.items()}


@pytest.fixture
def ali(monkeypatch: pytest.MonkeyPatch) -> Iterator[AliPrices]:
    """Every priced type 5 % dearer by the hour, every quote 2 % cheaper by the month; spot
    in two zones (zone l's older row must lose to its newer one), the last type without."""
    fake = AliPrices()
    names = list(priced("alicloud"))
    for name, value in priced("alicloud").items():
        fake.hour[name] = round(value * 1.05, 4)
    for name, value in monthly("alicloud").items():
        fake.month[name] = round(value * 0.98, 2)
    for i, name in enumerate(names[:-1]):
        low = round(fake.hour[name] * 0.2 + i, 4)
        fake.spot[name] = [
            ("cn-shanghai-l", "2026-12-05T06:00:00Z", low * 3),
            ("cn-shanghai-l", "2026-12-05T07:00:00Z", low),
            ("cn-shanghai-m", "2026-12-05T07:00:00Z", round(low * 1.5, 4)),
        ]
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "fake-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "fake-secret")
    with fake.running():
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", fake.endpoint)
        yield fake


@pytest.fixture
def tc(monkeypatch: pytest.MonkeyPatch) -> Iterator[TencentPrices]:
    """Every type sold by the hour in zone 3, as spot in zones 3 and 6 (6 dearer), by the
    month in zone 4 for the quoted types; the last priced type sold as spot nowhere."""
    fake = TencentPrices()
    names = list(priced("tencent"))
    for name, value in priced("tencent").items():
        fake.hour[name] = round(value * 0.9, 4)
        fake.selling[(name, "POSTPAID_BY_HOUR")] = ["ap-guangzhou-3"]
    for name in names[:-1]:
        fake.selling[(name, "SPOTPAID")] = ["ap-guangzhou-6", "ap-guangzhou-3"]
        fake.spot[(name, "ap-guangzhou-3")] = round(fake.hour[name] * 0.2, 4)
        fake.spot[(name, "ap-guangzhou-6")] = round(fake.hour[name] * 0.3, 4)
    for name, value in monthly("tencent").items():
        fake.month[name] = round(value * 1.1, 2)
        fake.selling[(name, "PREPAID")] = ["ap-guangzhou-4"]
    monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "fake-id")
    monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-secret")
    with fake:
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", fake.endpoint)
        yield fake


def doc(homes: Path, cloud: str) -> dict[str, Any]:
    return tomllib.loads((homes / cloud / catalog.CLOUD_FILE).read_text())


def only_price_lines_changed(before: bytes, after: bytes) -> None:
    for a, b in changed_lines(before, after).values():
        assert a.startswith(("price = {", '"')) and b[:10] == a[:10], (a, b)


def test_alicloud_refresh_adds_spot_ranges_and_rewrites_monthly_quotes(
    homes: Path, ali: AliPrices
) -> None:
    path = homes / "alicloud" / catalog.CLOUD_FILE
    before = path.read_bytes()
    code, out, err = run("--cloud", "alicloud")
    names = list(priced("alicloud"))
    lacking = names[-1]
    assert code == 1, err  # one type had no spot price: kept, said (docs/exit-status.md)
    assert [p for p in said(err)] == [
        f"alicloud: kept {lacking}'s spot range: Alibaba Cloud DescribeSpotPriceHistory: no "
        f"Linux VPC spot price for {lacking} in {ALI_REGION}"
    ]
    new = doc(homes, "alicloud")
    for name in names:
        price = new["instances"][name]["price"]
        assert price["on_demand"] == ali.hour[name] and price["source"] == "ALI-DESCRIBEPRICE"
        if name == lacking:
            assert "spot" not in price
            continue
        rows = ali.spot[name]  # zone l's latest row (not its older, dearer one), and zone m
        assert price["spot"] == [rows[1][2], rows[2][2]]
        assert (price["spot_date"], price["spot_source"]) == (TODAY, "ALI-SPOTHISTORY")
    quotes = new["pricing"]["subscription"]["monthly"]
    for name, value in ali.month.items():
        assert quotes[name] == {"price": value, "date": TODAY, "source": "ALI-DESCRIBEPRICE-MONTH"}
    only_price_lines_changed(before, path.read_bytes())
    assert "# 1x A100 40GB" in path.read_text()  # a quote's comment stays
    # the SDK's own request: VPC, Linux, the region, no zone; three rows at two a page
    history = [
        r for r in ali.seen if r["headers"].get("x-acs-action") == "DescribeSpotPriceHistory"
    ]
    first = history[0]["query"]
    assert (first["NetworkType"], first["OSType"], first["RegionId"]) == (
        "vpc",
        "linux",
        ALI_REGION,
    )
    assert "ZoneId" not in first and any(r["query"].get("Offset") == "2" for r in history)
    months = [r for r in ali.seen if r["query"].get("PriceUnit") == "Month"]
    assert len(months) == len(ali.month) and all(r["query"]["Period"] == "1" for r in months)
    # the table: a new range said 'new', a monthly row with its change
    assert f"alicloud: {len(names) - 1} spot ranges from ALI-SPOTHISTORY" in out
    assert f"alicloud: {len(ali.month)} monthly prices from ALI-DESCRIBEPRICE-MONTH" in out
    spot_rows = [
        ln for ln in out.splitlines() if ln.startswith("  ") and ln.split()[2:3] == ["spot"]
    ]
    assert len(spot_rows) == len(names) - 1
    assert all(" - -> " in ln and ln.rstrip().endswith("new") for ln in spot_rows)
    month_rows = [
        ln for ln in out.splitlines() if ln.startswith("  ") and ln.split()[2:3] == ["monthly"]
    ]
    assert len(month_rows) == len(ali.month) and all("-2.0%" in ln for ln in month_rows)
    assert "monthly prices source ALI-DESCRIBEPRICE-MONTH" in out.replace("\n  ", " ")
    assert fits(out) and fits(err) and "Traceback" not in err
    # a second refresh: the ranges exist now and are refreshed in place, nothing changes
    catalog._cloud_files.cache_clear()
    catalog.load_catalog.cache_clear()
    after = path.read_bytes()
    code, out, _ = run("--cloud", "alicloud")
    assert code == 1 and path.read_bytes() == after
    assert f"{len(names) - 1} spot ranges from ALI-SPOTHISTORY, 0 changed" in out


def test_tencent_refresh_asks_spot_in_each_selling_zone_and_the_month_prepaid(
    homes: Path, tc: TencentPrices
) -> None:
    path = homes / "tencent" / catalog.CLOUD_FILE
    before = path.read_bytes()
    code, out, err = run("--cloud", "tencent")
    names = list(priced("tencent"))
    lacking = names[-1]
    assert code == 1, err
    assert said(err) == [
        f"tencent: kept {lacking}'s spot range: Tencent Cloud "
        f"DescribeZoneInstanceConfigInfos: no zone sells {lacking} as spot now"
    ]
    new = doc(homes, "tencent")
    for name in names:
        price = new["instances"][name]["price"]
        assert price["on_demand"] == tc.hour[name] and price["source"] == "TC-INQUIRYPRICE"
        assert "estimate" not in price
        if name == lacking:
            assert "spot" not in price
            continue
        assert price["spot"] == [
            tc.spot[(name, "ap-guangzhou-3")],
            tc.spot[(name, "ap-guangzhou-6")],
        ]
        assert (price["spot_date"], price["spot_source"]) == (TODAY, "TC-INQUIRYPRICE-SPOT")
    quotes = new["pricing"]["subscription"]["monthly"]
    for name, value in tc.month.items():
        assert quotes[name] == {"price": value, "date": TODAY, "source": "TC-INQUIRYPRICE-PREPAID"}
    only_price_lines_changed(before, path.read_bytes())
    spot_asks = [
        p
        for a, p in tc.requests
        if a == "InquiryPriceRunInstances" and p["InstanceChargeType"] == "SPOTPAID"
    ]
    assert len(spot_asks) == 2 * (len(names) - 1)  # each selling zone once
    assert all(
        p["InstanceMarketOptions"]
        == {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
        for p in spot_asks
    )
    prepaid = [
        p
        for a, p in tc.requests
        if a == "InquiryPriceRunInstances" and p["InstanceChargeType"] == "PREPAID"
    ]
    assert len(prepaid) == len(tc.month)
    assert all(p["InstanceChargePrepaid"] == {"Period": 1} for p in prepaid)
    assert all(p["Placement"]["Zone"] == "ap-guangzhou-4" for p in prepaid)
    assert f"tencent: {len(names) - 1} spot ranges from TC-INQUIRYPRICE-SPOT" in out
    assert "+10.0%" in out and fits(out) and fits(err)


def test_a_throttled_spot_history_is_asked_again_and_refreshed(
    homes: Path, ali: AliPrices, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spot(headers: dict[str, str], body: bytes) -> bool:
        return headers.get("x-acs-action") == "DescribeSpotPriceHistory"

    with cloud_fault_proxy(ali.endpoint, "alibaba", refusing(2, "Throttling.User", spot)) as px:
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", px.url)
        code, out, err = run("--cloud", "alicloud", "--dry-run")
    assert code == 1 and len(said(err)) == 1, err  # only the type without a range is said
    assert f"{len(priced('alicloud')) - 1} spot ranges from ALI-SPOTHISTORY" in out
    refused = [s for s in px.seen if s.fault == "refused"]
    assert len(refused) == 2 and all(s.status == 400 for s in refused)


def test_a_spot_history_throttled_every_time_is_said_in_one_line_and_nothing_written(
    homes: Path, ali: AliPrices, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spot(headers: dict[str, str], body: bytes) -> bool:
        return headers.get("x-acs-action") == "DescribeSpotPriceHistory"

    path = homes / "alicloud" / catalog.CLOUD_FILE
    before = path.read_bytes()
    with cloud_fault_proxy(ali.endpoint, "alibaba", refusing(99, "Throttling.User", spot)) as px:
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", px.url)
        code, out, err = run("--cloud", "alicloud")
    assert code == 1 and out == ""
    assert said(err) == [
        "alicloud: Alibaba Cloud DescribeSpotPriceHistory: Throttling.User: Throttling.User "
        "(fault proxy) (after 3 tries); nothing rewritten"
    ]
    assert len([s for s in px.seen if s.fault == "refused"]) == 3  # bounded: MAX_TRIES
    assert path.read_bytes() == before


def test_a_tencent_spot_inquiry_throttled_every_time_fails_the_cloud_in_one_line(
    homes: Path, tc: TencentPrices, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spot(headers: dict[str, str], body: bytes) -> bool:
        return b'"SPOTPAID"' in body

    path = homes / "tencent" / catalog.CLOUD_FILE
    before = path.read_bytes()
    with cloud_fault_proxy(
        tc.endpoint, "tencent", refusing(99, "RequestLimitExceeded", spot)
    ) as px:
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", px.url)
        code, out, err = run("--cloud", "tencent")
    assert code == 1 and out == ""
    problems = said(err)
    assert len(problems) == 1 and problems[0].startswith("tencent: Tencent Cloud ")
    assert "RequestLimitExceeded" in problems[0] and "(after 3 tries)" in problems[0]
    assert problems[0].endswith("nothing rewritten") and "Traceback" not in err
    assert len([s for s in px.seen if s.fault == "refused"]) == 3
    assert path.read_bytes() == before


def test_a_tencent_call_throttled_once_is_asked_again(
    homes: Path, tc: TencentPrices, monkeypatch: pytest.MonkeyPatch
) -> None:
    def any_call(headers: dict[str, str], body: bytes) -> bool:
        return True

    with cloud_fault_proxy(
        tc.endpoint, "tencent", refusing(1, "RequestLimitExceeded", any_call)
    ) as px:
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", px.url)
        code, out, err = run("--cloud", "tencent", "--dry-run")
    assert code == 1 and len(said(err)) == 1, err  # the type without spot, nothing else
    assert f"tencent: {len(priced('tencent'))} prices from TC-INQUIRYPRICE" in out


@pytest.mark.parametrize("fault", ["cut", "503"])
def test_a_failed_answer_is_one_line_and_the_cloud_is_not_written(
    homes: Path, ali: AliPrices, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    path = homes / "alicloud" / catalog.CLOUD_FILE
    before = path.read_bytes()
    with cloud_fault_proxy(ali.endpoint, "alibaba") as px:
        if fault == "cut":  # the connection reset part way through the answer's body
            px.add(Fault("cut", query="NetworkType=vpc", after=20, times=99))
        else:  # the service down: 503 every time, asked MAX_TRIES times
            px.add(Fault("status", status=503, code="ServiceUnavailable", times=99))
        monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", px.url)
        code, out, err = run("--cloud", "alicloud")
    problems = said(err)
    assert code == 1 and out == "" and len(problems) == 1, err
    assert problems[0].startswith("alicloud: Alibaba Cloud ")
    assert problems[0].endswith("nothing rewritten") and "Traceback" not in err and fits(err)
    if fault == "503":
        assert "ServiceUnavailable" in problems[0] and "(after 3 tries)" in problems[0]
        assert len(px.requests(fault="status")) == 3
    else:
        assert "DescribeSpotPriceHistory" in problems[0]
    assert path.read_bytes() == before


def test_without_credentials_each_cloud_says_in_one_line_that_spot_was_not_refreshed(
    homes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        "ALICLOUD_ACCESS_KEY",
        "ALICLOUD_SECRET_KEY",
        "TENCENTCLOUD_SECRET_ID",
        "TENCENTCLOUD_SECRET_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    files = {p: p.read_bytes() for p in homes.glob(f"*/{catalog.CLOUD_FILE}")}
    code, out, err = run("--cloud", "alicloud", "--cloud", "tencent")
    assert code == 1 and out == ""
    problems = said(err)
    assert [p.split(":")[0] for p in problems[:2]] == ["alicloud", "tencent"]
    for p in problems[:2]:
        assert "skipped: no " in p and "credentials" in p
        assert p.endswith("(not refreshed: on-demand prices, spot ranges, monthly prices)"), p
    assert problems[2:] == ["refresh_prices.py: no cloud could be asked; nothing rewritten"]
    assert "Traceback" not in err and fits(err)
    assert all(p.read_bytes() == b for p, b in files.items())


def test_a_line_without_a_spot_range_gets_one_before_its_closing_brace() -> None:
    import datetime as dt

    from scripts import refresh_prices

    text = (
        '[instances.a]\nprice = { on_demand = 1.0, date = "2024-01-01", source = "X" }  # c\n'
        '[pricing.subscription.monthly]\n"a" = { price = 700, date = "2024-01-01", '
        'source = "Y", estimate = true }  # 1x\n'
    )
    day = dt.date(2026, 12, 5)
    out = refresh_prices.rewrite(text, {}, day, "X", {"a": (0.25, 0.35)}, "Z", {"a": 650.5}, "M")
    parsed = tomllib.loads(out)
    assert parsed["instances"]["a"]["price"] == {
        "on_demand": 1.0,
        "date": "2024-01-01",
        "source": "X",
        "spot": [0.25, 0.35],
        "spot_date": "2026-12-05",
        "spot_source": "Z",
    }
    assert parsed["pricing"]["subscription"]["monthly"]["a"] == {
        "price": 650.5,
        "date": "2026-12-05",
        "source": "M",
    }
    assert out.splitlines()[1].endswith("}  # c") and out.splitlines()[3].endswith("}  # 1x")
