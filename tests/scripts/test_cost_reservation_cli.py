"""`cost.py --reservation 1y|3y`: a reservation priced beside the bill, end to end.

Live prices come from the local Retail Prices fake in tests/infra/test_azure_prices.py (FAKE
round numbers: 3.40/h pay-as-you-go, 17,520 for 1 year, 35,040 for 3 years), never the real
API; the autouse fixture points the API at a closed port on 127.0.0.1 otherwise.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.clouds.azure.prices import reservation_filter
from scripts import cost
from tests.infra.test_azure_prices import (
    PAGES,
    RESERVATION_PAGES,
    SIZE,
    FakeRetailPrices,
    _serve,
)
from tests.support.stderr import problems

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRetailPrices]:
    server = FakeRetailPrices(PAGES, reservation_pages=RESERVATION_PAGES)
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", server.url)
    yield from _serve(server)


def _stack(tmp_path: Path, tier: str = "a100x1", billing: str = "on-demand") -> Path:
    path = tmp_path / f"Pulumi.azure-{tier}.yaml"
    path.write_text(
        "config:\n"
        "  gpufleet:provider: azure\n"
        f"  gpufleet:tier: {tier}\n"
        f"  gpufleet:billing: {billing}\n"
        '  gpufleet:sshCidrs: ["203.0.113.7/32"]\n'
    )
    return path


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cost.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _json(*argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = _run(*argv, "--json")
    return code, json.loads(out) if out else {}, err


def test_live_1y_reservation_shows_total_rate_share_commitment_and_break_even(
    fake: FakeRetailPrices, tmp_path: Path
):
    code, doc, err = _json(
        "--stack-file", str(_stack(tmp_path)), "--live", "--reservation", "1y",
        "--hours-per-month", "200",
    )  # fmt: skip
    assert code == 0, err
    r = doc["reservation"]
    assert r["term"] == "1y" and r["months"] == 12 and r["term_hours"] == 8760
    assert r["total"] == r["committed"] == 17520.0  # owed whatever the VM does
    assert r["effective_hourly"] == 2.0  # 17,520 / 8,760
    assert r["payg_hourly"] == 3.4  # the live pay-as-you-go row, like with like
    assert r["payg_source"] == "live, eastus"
    assert r["break_even"]["utilisation"] == pytest.approx(2.0 / 3.4, abs=1e-4)  # 58.8 %
    assert r["break_even"]["hours_per_month"] == pytest.approx(730 * 2.0 / 3.4, abs=0.1)
    assert r["run_share_per_month"] == 400.0  # 200 h at 2.00
    assert r["per_month"] == 1460.0 and r["unused_per_month"] == 1060.0
    assert r["payg_per_month"] == 680.0  # 200 h at 3.40: at this use, pay-as-you-go wins
    assert r["live"] is True and r["bought_separately"] is True
    assert doc["billing"] == "on-demand"  # the VM the stack deploys is pay-as-you-go
    assert doc["live"]["reservation"]["ok"] is True
    # the on-demand check, then the reservation items through NextPageLink (2 + 2 pages)
    filters = [q["$filter"][0] for q in fake.requests]
    assert filters.count(reservation_filter(SIZE, "eastus")) == 2
    assert len(filters) == 4


def test_live_3y_reservation_takes_the_linux_row_from_the_second_page(
    fake: FakeRetailPrices, tmp_path: Path
):
    code, doc, err = _json("--stack-file", str(_stack(tmp_path)), "--live", "--reservation", "3y")
    assert code == 0, err
    r = doc["reservation"]
    assert r["total"] == 35040.0  # not the Windows row's 52,000 on the first page
    assert r["term_hours"] == 26280
    assert r["effective_hourly"] == pytest.approx(1.3333, abs=1e-4)
    assert r["break_even"]["utilisation"] == pytest.approx(35040 / 26280 / 3.4, abs=1e-4)


def test_the_human_output_says_it_is_bought_separately_and_fits_80_columns(
    fake: FakeRetailPrices, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("COLUMNS", "80")
    argv = ("--stack-file", str(_stack(tmp_path)), "--live", "--reservation", "1y")
    code, out, err = _run(*argv, "--hours-per-month", "200")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    text = " ".join(out.split())
    assert "Reservation, 1-year, for 1 node (bought separately, not set on the VM)" in text
    assert "17,520.00 USD for the term, owed whatever the VMs do" in text
    assert "2.0000 USD/h (the total over the term's 8,760 h)" in text
    assert "400.00 of it for the 200 running hours" in text
    assert "1,060.00 for reserved hours left unused" in text
    assert "the VMs must run 58.8% of the term's hours (429 h a month)" in text
    assert "at 200 h a month it costs more" in text
    assert "The stack still deploys pay-as-you-go VMs" in text
    assert "(quantity 1, one per VM)" in text
    assert "`az reservations reservation-order purchase`" in text


def test_piped_output_keeps_each_sentence_on_one_line(fake: FakeRetailPrices, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cost.py"), "--stack-file",
         str(_stack(tmp_path)), "--live", "--reservation", "1y"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("  break-even") and "costs less" in line for line in lines)
    assert not any("\x1b[" in line for line in lines)  # no colour codes in a file


def test_offline_a_reservation_is_one_line_naming_the_size_and_live(tmp_path: Path):
    code, out, err = _run("--stack-file", str(_stack(tmp_path)), "--reservation", "1y")
    assert code == 2 and out == ""
    assert problems(err) == [
        f"cost.py: azure {SIZE}: the catalog carries no dated 1-year reservation price; "
        "add --live to fetch it from Azure's Retail Prices API (no account needed)"
    ]


def test_live_without_a_reachable_api_prints_the_bill_and_says_the_reservation_is_not_priced(
    tmp_path: Path,
):
    # the autouse fixture points the API at a closed port on 127.0.0.1
    code, doc, err = _json("--stack-file", str(_stack(tmp_path)), "--live", "--reservation", "1y")
    assert code == 1  # --live did not compare (docs/exit-status.md)
    assert doc["reservation"] is None
    assert doc["live"]["reservation"]["ok"] is False
    assert "reservation: Azure Retail Prices API" in " ".join(problems(err))
    assert doc["hourly"]["on_demand"] == pytest.approx(3.673)
    code, out, _ = _run("--stack-file", str(_stack(tmp_path)), "--live", "--reservation", "1y")
    assert "Reservation (1-year): not priced: Azure Retail Prices API" in " ".join(out.split())


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--reservation", "2y"], "cost.py: --reservation: '2y' is not a term: use one of 1y, 3y"),
        (
            ["--reservation", "1yr"],
            "cost.py: --reservation: '1yr' is not a term: use one of 1y, 3y (did you mean '1y'?)",
        ),
        (
            ["--reservation", "3years"],
            "cost.py: --reservation: '3years' is not a term: use one of 1y, 3y "
            "(did you mean '3y'?)",
        ),
        (
            ["--reservation", "forever"],
            "cost.py: --reservation: 'forever' is not a term: use one of 1y, 3y",
        ),
        (["--reservation", ""], "cost.py: --reservation: '' is not a term: use one of 1y, 3y"),
    ],
)
def test_a_bad_term_is_refused_in_one_line_before_the_stack_is_read(argv: list[str], line: str):
    code, out, err = _run("--stack", "no-such-stack", *argv)
    assert (code, out, problems(err)) == (2, "", [line])


def test_a_reservation_on_a_cloud_that_sells_none_is_one_line(tmp_path: Path):
    code, out, err = _run("--stack", "t4x1", "--reservation", "1y", "--live")
    assert code == 2 and out == ""
    (line,) = problems(err)
    assert "sells no reservations through this tool" in line


def test_a_reservation_on_a_spot_stack_is_one_line(tmp_path: Path, fake: FakeRetailPrices):
    path = _stack(tmp_path, billing="spot")
    code, out, err = _run("--stack-file", str(path), "--reservation", "3y", "--live")
    assert code == 2 and out == ""
    assert problems(err) == [
        "cost.py: azure reservations discount on-demand VMs, not spot: set billing to "
        "on-demand (the reservation is bought separately)"
    ]
    assert fake.requests == []  # refused before any request


def test_compare_refuses_a_reservation():
    assert _run("--compare", "a100x1", "--reservation", "1y") == (
        2,
        "",
        "cost.py: --reservation does not apply to --compare\n",
    )


def test_without_reservation_the_json_has_no_reservation_key(tmp_path: Path):
    code, doc, _ = _json("--stack-file", str(_stack(tmp_path)))
    assert code == 0 and "reservation" not in doc
