"""scripts/gpus.py: every GPU model and instance type of the catalog, per provider, with prices."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import pytest

from infra.catalog import load_catalog
from tests.support.stderr import problems

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpus_cli", REPO / "scripts" / "gpus.py")
assert spec and spec.loader
cli = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli)
CAT = load_catalog()


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_json(*argv: str) -> dict[str, Any]:
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_lists_every_gpu_model_and_every_instance_type_once():
    doc = run_json()
    assert [g["gpu"] for g in doc["gpus"]] == list(CAT.gpus)
    listed = {(r["provider"], r["instance_type"]) for g in doc["gpus"] for r in g["instances"]}
    assert listed == set(CAT.instances)


def test_prices_per_hour_and_per_gpu_hour_with_their_dates():
    doc = run_json("--gpu", "A100-80GB", "--provider", "aws")
    (gpu,) = doc["gpus"]
    (p4de,) = gpu["instances"]
    assert p4de["instance_type"] == "p4de.24xlarge" and p4de["tier"] == "a100-80gx8"
    assert p4de["on_demand"] == 27.447 and p4de["on_demand_per_gpu"] == pytest.approx(3.4309)
    assert p4de["spot"] == [8.65, 9.97] and p4de["spot_estimated"] is False
    assert p4de["spot_per_gpu"] == pytest.approx([1.0812, 1.2462], abs=1e-4)
    assert p4de["price_date"] == "2026-07-20" and p4de["spot_date"] == "2025-07-01"
    assert "NVSwitch" in p4de["interconnect"] and "4 EFA" in p4de["interconnect"]


def test_a_type_without_an_observed_spot_range_shows_the_band_as_estimated():
    doc = run_json("--gpu", "A100-40GB", "--provider", "alicloud")
    one = next(r for r in doc["gpus"][0]["instances"] if r["gpus"] == 1)
    assert one["spot"] == pytest.approx([31.58 * 0.3, 31.58 * 0.7], abs=1e-3)
    assert one["spot_estimated"] is True and one["currency"] == "CNY"


def test_the_gpu_filter_matches_key_or_name_and_keeps_variants_apart():
    doc = run_json("--gpu", "a100")
    keys = {g["gpu"] for g in doc["gpus"]}
    assert keys == {"A100-40GB", "A100-PCIE-40GB", "A100-80GB", "A100-PCIE-80GB"}
    pcie = next(g for g in doc["gpus"] if g["gpu"] == "A100-PCIE-80GB")
    assert pcie["bandwidth_gbs"] == 1935 and {i["provider"] for i in pcie["instances"]} == {"azure"}
    a10g = run_json("--gpu", "A10G")["gpus"][0]
    assert "fp32_tflops" in a10g["unverified"]


def test_the_table_fits_80_columns_and_marks_estimated_spot():
    code, out, _ = run()
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "p4de.24xlarge" in out and "~" in out and "no instance type in the catalog" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--gpu", "A1000"], "no GPU model matches 'A1000'"),
        (["--provider", "awz"], "did you mean 'aws'?"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, expected):
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    assert len(problems(err)) == 1 and expected in err


def test_every_row_has_a_common_currency_figure_beside_the_clouds_own():
    doc = run_json("--gpu", "A100-40GB", "--provider", "alicloud")
    one = next(r for r in doc["gpus"][0]["instances"] if r["gpus"] == 1)
    rate = one["fx_rate"]["rate"]  # pricing.toml's CNY->USD
    assert one["currency"] == "CNY" and one["common_currency"] == "USD"
    assert one["on_demand_common"] == pytest.approx(one["on_demand"] * rate, abs=1e-3)
    assert run("--gpu", "A100-40GB")[0] == 0
    _, out, _ = run("--gpu", "A100-40GB")
    text = " ".join(out.split())
    # the row is in USD for every cloud; the line under it keeps the cloud's own price
    assert "USD/h" in text and f"{one['on_demand']:,.2f} CNY/h" in text
    assert f"1 CNY = {rate:g} USD" in text


def test_the_common_currency_can_be_chosen_and_an_unknown_one_is_refused():
    doc = run_json("--gpu", "A100-40GB", "--provider", "aws", "--currency", "cny")
    (p4d,) = doc["gpus"][0]["instances"]
    assert p4d["common_currency"] == "CNY" and p4d["on_demand_common"] > p4d["on_demand"]
    code, out, err = run("--currency", "EURO")
    assert code == 2 and out == "" and "--currency: 'EURO' is unknown" in err


def test_a_spot_price_seen_once_is_one_figure_with_its_date_and_source():
    _, out, _ = run("--gpu", "A100-40GB", "--provider", "azure")
    text = " ".join(out.split())
    assert "spot: one observation, 2024-06-01, SCAZ" in text
    assert "0.37-0.37" not in text and "2.99-2.99" not in text


def test_infiniband_is_named_with_the_interconnect():
    doc = run_json("--gpu", "A100-40GB", "--provider", "azure")
    (nd,) = doc["gpus"][0]["instances"]
    assert "1600 Gbps InfiniBand" in nd["interconnect"]


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_gpu_is_refused_not_read_as_every_model(value: str) -> None:
    code, out, err = run("--gpu", value)
    assert (code, out) == (2, "")
    assert err == "gpus.py: --gpu '': give part of a GPU model's key or name (e.g. A100)\n"
