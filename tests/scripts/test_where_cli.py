"""scripts/where.py: where a tier or a type can be had, offline and with --live."""

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
spec = importlib.util.spec_from_file_location("where_cli", REPO / "scripts" / "where.py")
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
    doc: dict[str, Any] = json.loads(out)
    return doc


@pytest.fixture
def no_cloud_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cloud's endpoint a closed port on loopback, and no credentials at all."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:9")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_ENDPOINT", "127.0.0.1:9")
    monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", "127.0.0.1:9")
    monkeypatch.setenv("GPUFLEET_AZURE_ARM_ENDPOINT", "http://127.0.0.1:9")


def test_a_tier_lists_a_row_per_cloud_region_sorted_by_price() -> None:
    doc = run_json("a100x8")
    assert doc["kind"] == "tier" and doc["live"] is None
    assert {r["provider"] for r in doc["rows"]} == set(CAT.tiers["a100x8"].offers)
    usd = [r["usd_per_hour"] for r in doc["rows"] if r["usd_per_hour"] is not None]
    assert usd == sorted(usd)


def test_an_unknown_tier_is_one_line_with_the_nearest_and_exit_2() -> None:
    code, out, err = run("a100x9")
    assert (code, out) == (2, "")
    (line,) = problems(err)
    assert "did you mean 'a100x8'?" in line


def test_an_unknown_name_points_to_the_list_instead_of_printing_every_tier() -> None:
    code, _, err = run("p4d.24xlarg")  # 235 columns in one line when it listed the tiers
    assert code == 2
    assert problems(err) == [
        "where.py: 'p4d.24xlarg' is neither a tier nor an instance type"
        " (did you mean 'p4d.24xlarge'?); see `make gpus`"
    ]
    assert "(did you mean 'p4d.24xlarge'?)" in err  # a suggestion is never split


def test_region_without_live_is_refused_before_anything_is_asked() -> None:
    code, _, err = run("a100x8", "--region", "us-east-1")
    assert code == 2 and "--region only narrows --live" in err


def test_the_human_table_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run("t4x1")
    assert code == 0 and "sorted by on-demand USD/h" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_live_without_credentials_says_so_per_cloud_and_keeps_the_offline_rows(
    no_cloud_reachable: None,
) -> None:
    code, out, err = run("a100x8", "--live")
    assert code == 0, err
    assert "aws p4d.24xlarge: no AWS credentials" in out
    for provider in CAT.tiers["a100x8"].offers:
        assert any(line.startswith(f"  {provider} ") for line in out.splitlines()), provider
    assert out.count("us-east-1") >= 1 and "Traceback" not in out + err
    doc = run_json("a100x8", "--live")
    assert all(a["error"] for a in doc["live"]) and doc["rows"]


def test_live_shows_a_clouds_zones_from_its_signal_and_why_others_have_none(
    no_cloud_reachable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.infra.where.fakes import serving
    from tests.infra.where.test_live_tencent import ZONES

    def answer(
        method: str, path: str, q: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        rows = ZONES.get(headers.get("x-tc-region", ""), [])
        return 200, {"Response": {"InstanceTypeQuotaSet": rows, "RequestId": "r"}}

    with serving(answer) as (endpoint, seen):
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", endpoint)
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDfake")
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "fake-secret")
        code, out, err = run("a100x8", "--live", "--region", "ap-guangzhou")
    assert code == 0, err
    assert "    ap-guangzhou-6: available (SELL, UnderStock)" in out
    assert "    ap-guangzhou-3: sold out (SOLD_OUT, 售罄)" in out
    assert "aws p4d.24xlarge: no --region given is one of its regions" in out
    assert [r["headers"]["x-tc-region"] for r in seen] == ["ap-guangzhou"]


@pytest.fixture
def nothing_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """where.live raises: a refused input must never reach any cloud's signal."""

    def live(*_a: object, **_k: object) -> None:
        raise AssertionError("bad input must be refused before any cloud is asked")

    monkeypatch.setattr(cli.where, "live", live)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["a100x9"], "'a100x9' is neither a tier nor an instance type"),
        (["h100x3", "--json"], "'h100x3' is neither a tier nor an instance type"),
        ([""], "'' is neither a tier nor an instance type"),
        (["p4d.24xlarg"], "(did you mean 'p4d.24xlarge'?); see `make gpus`"),
        (["a100x8", "--live", "--region", "us-east-9"], "--region 'us-east-9' is not a region"),
        (["a100x8", "--live", "--region", "eastus", "--region", ""], "--region '' is not"),
        (["h100x1", "--live", "--region", "eastus"], "'eastus' is not a region of aws"),
        (
            ["a100x8", "--live", "--region", "us-east-"],
            "'us-east-' is not a region of alicloud, aws, azure, tencent"
            " (did you mean 'us-east-2'?)",
        ),
        (["a100x8", "--live", "--region"], "argument --region: expected one argument"),
        (["a100x8", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: TIER|INSTANCE_TYPE"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_cloud_is_asked(
    argv: list[str], said: str, nothing_asked: None, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code, out, err = run(*argv)
    except SystemExit as stop:  # the parser's own refusals (OneLineParser)
        code, out, err = stop.code, "", capsys.readouterr().err  # type: ignore[assignment]
    assert code == 2 and out == "" and "Traceback" not in err
    (line,) = problems(err)  # and each of its lines fits 80 columns
    assert line.startswith("where.py: ") and said in line, line


def test_a_usage_error_ends_pointing_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        run("a100x8", "--bogus")
    assert stop.value.code == 2
    assert capsys.readouterr().err == "where.py: unrecognized arguments: --bogus (see --help)\n"


def test_help_still_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        run("--help")
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: where.py ")
    for flag in ("TIER|INSTANCE_TYPE", "--json", "--live", "--region REGION"):
        assert flag in text, flag
