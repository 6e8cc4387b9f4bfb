"""`cost.py --live` for Azure: the CLI against the local Retail Prices fake (its pages in
tests/infra/test_azure_prices.py), never the real API."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.clouds.azure.prices import retail_filter
from scripts import cost
from tests.infra.test_azure_prices import PAGES, FakeRetailPrices, _serve

pytestmark = pytest.mark.integration


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRetailPrices]:
    server = FakeRetailPrices(PAGES)
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", server.url)
    yield from _serve(server)


def _stack(tmp_path: Path, tier: str) -> Path:
    path = tmp_path / f"Pulumi.azure-{tier}.yaml"
    path.write_text(
        "config:\n"
        "  gpufleet:provider: azure\n"
        f"  gpufleet:tier: {tier}\n"
        '  gpufleet:sshCidrs: ["203.0.113.7/32"]\n'
    )
    return path


def _run(*argv: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = cost.main([*argv, "--json"], out=out, err=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def test_azure_live_price_follows_next_page_link_and_takes_the_linux_pay_as_you_go_row(
    fake: FakeRetailPrices, tmp_path: Path
):
    code, doc, err = _run("--stack-file", str(_stack(tmp_path, "a100x1")), "--live")
    assert code == 0, err
    assert doc["live"]["ok"] is True
    assert doc["live"]["live"] == pytest.approx(3.40)
    assert doc["live"]["currency"] == "USD"
    assert len(fake.requests) == 2  # the second page came through NextPageLink
    sent = fake.requests[0]["$filter"][0]
    assert sent == retail_filter("Standard_NC24ads_A100_v4", "eastus")


def test_azure_live_without_a_reachable_api_says_so_and_still_prints_the_bill(tmp_path: Path):
    # the autouse fixture points the API at a closed port on 127.0.0.1
    code, doc, err = _run("--stack-file", str(_stack(tmp_path, "t4x1")), "--live")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert "Azure Retail Prices API" in err and doc["live"]["ok"] is False
    assert doc["hourly"]["on_demand"] == pytest.approx(0.526)
