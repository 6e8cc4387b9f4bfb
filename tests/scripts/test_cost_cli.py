"""scripts/cost.py from the outside: the JSON contract, exit status 2 on bad input, the chart."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from infra.pricing.compare import compare_tier
from tests.support.stderr import problems

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cost.py"
SHIPPED_STACKS = sorted((REPO / "stacks").glob("Pulumi.*.yaml"))


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufleet_cost_cli", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = load_script()


def write_stack(tmp_path: Path, name: str = "demo", **config: Any) -> Path:
    lines = ["config:", '  gpufleet:sshCidrs: ["203.0.113.7/32"]']
    lines += [f"  gpufleet:{k}: {json.dumps(v)}" for k, v in config.items()]
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_json(*argv: str) -> dict[str, Any]:
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


# --- the --stack contract --------------------------------------------------------------------


def test_json_carries_currency_nodes_hourly_for_all_nodes_and_monthly(tmp_path: Path):
    stack = write_stack(tmp_path, provider="alicloud", tier="a100x1", nodes=2)
    doc = run_json("--stack-file", str(stack), "--hours-per-month", "100")
    assert doc["currency"] == "CNY" and doc["nodes"] == 2
    hourly = doc["hourly"]
    assert hourly["on_demand"] == pytest.approx(63.16)  # 31.58 x 2
    assert hourly["spot"] == pytest.approx([18.948, 44.212])  # x [0.3, 0.7]
    assert hourly["subscription"] == pytest.approx(41.5342, abs=1e-3)  # 15160 / 730 x 2
    monthly = doc["monthly"]
    assert monthly["hours"] == 100
    assert monthly["compute"]["on_demand"] == pytest.approx(6316.0)
    # default disks: 2 x 200 GB PL0 root (0.5) + 2 x 500 GB PL1 scratch (1.0)
    assert monthly["storage_total"] == pytest.approx(200 + 1000)
    assert monthly["selected"] == pytest.approx(7516.0)
    assert doc["break_even"]["hours_per_month"] == pytest.approx(480.1)  # 15160 / 31.58
    assert doc["stack"] == "demo" and doc["tier"] == "a100x1"


def test_json_for_aws_has_no_subscription_and_the_observed_spot_range(tmp_path: Path):
    stack = write_stack(tmp_path, provider="aws", tier="a100x8", billing="spot")
    doc = run_json("--stack-file", str(stack), "--egress-gb", "300", "--storage-gb", "1000")
    assert doc["currency"] == "USD" and doc["nodes"] == 1
    assert doc["hourly"]["on_demand"] == pytest.approx(21.958)
    assert doc["hourly"]["spot"] == [2.47, 8.19]
    assert doc["hourly"]["subscription"] is None
    items = {i["item"]: i["amount"] for i in doc["monthly"]["storage"]}
    assert items["data transfer out"] == pytest.approx(18.0)  # (300 - 100) x 0.09
    assert items["bucket (STANDARD)"] == pytest.approx(23.0)  # 1000 x 0.023
    assert doc["spot_saving"]["caveat"].startswith("AWS reclaims spot capacity")


def test_currency_flag_converts_the_whole_bill(tmp_path: Path):
    stack = write_stack(tmp_path, provider="alicloud", tier="a100x4")
    doc = run_json("--stack-file", str(stack), "--currency", "USD")
    assert doc["currency"] == "USD"
    assert doc["hourly"]["on_demand"] == pytest.approx(126.33 / 7.15, abs=1e-4)
    assert doc["fx"]["date"] == "2025-09-01"


def test_the_alicloud_2023_prices_warn_in_the_output(tmp_path: Path):
    stack = write_stack(tmp_path, provider="alicloud", tier="a100x4")
    doc = run_json("--stack-file", str(stack))
    assert any("ACH dated 2023-06-01" in w for w in doc["warnings"])


def test_stack_name_reads_stacks_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write_stack(tmp_path, name="mine", provider="aws", tier="t4x1")
    monkeypatch.setattr(cli, "STACKS_DIR", tmp_path)
    doc = run_json("--stack", "mine")
    assert doc["instance_type"] == "g4dn.xlarge"


@pytest.mark.parametrize("path", SHIPPED_STACKS, ids=lambda p: p.name)
def test_every_shipped_stack_has_a_bill(path: Path):
    doc = run_json("--stack-file", str(path))
    assert doc["currency"] in ("USD", "CNY")
    assert doc["hourly"]["on_demand"] > 0


def test_human_output_shows_break_even_spot_caveat_and_warnings(tmp_path: Path):
    stack = write_stack(tmp_path, provider="alicloud", tier="a100x1")
    code, out, _ = run("--stack-file", str(stack), "--hours-per-month", "200")
    assert code == 0
    assert "Break-even: the subscription is cheaper above 480 running hours" in out
    assert "Spot saves 30%-70%" in out and "Caveat:" in out
    assert "Warnings" in out and "days old" in out


def test_a_spot_price_seen_once_is_said_as_one_observation_not_a_zero_width_range(
    tmp_path: Path,
):
    # Standard_NC24ads_A100_v4's spot is one SCAZ figure (spot = [0.4444, 0.4444])
    stack = write_stack(tmp_path, provider="azure", tier="a100x1", region="eastus")
    code, out, _ = run("--stack-file", str(stack))
    assert code == 0
    text = " ".join(out.split())
    assert "spot (one observation)" in text and "0.44 - 0.44" not in text
    assert "Spot saves 88% (3.23 USD/h, one observation, 2024-06-01, SCAZ)" in text
    assert "88%-88%" not in text


def test_the_compare_table_shows_a_single_spot_observation_as_one_figure():
    assert cli._spot_range_cell((0.37, 0.37)) == "0.37 (one obs.)"
    assert cli._spot_range_cell((0.31, 1.02)) == "0.31-1.02"


# --- bad input: exit 2, a clear line on stderr -------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--hours-per-month", "-5"], "hours per month must be between 0 and 744"),
        (["--hours-per-month", "800"], "got 800"),
        (["--currency", "EUR"], "unknown currency 'EUR'"),
        (["--egress-gb", "-1"], "egress GB must be >= 0"),
        (["--bucket-class", "GLACIER"], "bucket class 'GLACIER' is unknown on aws"),
        (["--plot", "x.png"], "--plot only applies to --compare"),
    ],
)
def test_bad_usage_exits_2_with_the_reason_on_stderr(
    tmp_path: Path, extra: list[str], message: str
):
    stack = write_stack(tmp_path, provider="aws", tier="t4x1")
    code, out, err = run("--stack-file", str(stack), *extra)
    assert code == 2 and out == ""
    assert message in err


def test_unknown_stack_name_lists_the_known_ones(tmp_path: Path):
    write_stack(tmp_path, name="a100x4", provider="alicloud", tier="a100x4")
    with pytest.raises(cli.UsageError, match=r"no stack 'a100x3'.*did you mean 'a100x4'"):
        cli.stack_path("a100x3", tmp_path)
    code, _, err = run("--stack", "surely-not-a-stack")
    assert code == 2 and "no stack 'surely-not-a-stack'" in err


def test_an_invalid_stack_file_reports_every_config_problem(tmp_path: Path):
    stack = write_stack(tmp_path, provider="aws", tier="a100x9", nodes=-1)
    code, _, err = run("--stack-file", str(stack))
    assert code == 2
    assert "gpufleet:tier" in err and "gpufleet:nodes" in err


def test_unknown_tier_to_compare_exits_2_with_suggestion():
    code, _, err = run("--compare", "h100x4")
    assert code == 2 and "unknown tier 'h100x4'" in err and "did you mean" in err


def test_the_real_entry_point_exits_2_on_negative_hours(tmp_path: Path):
    stack = write_stack(tmp_path, provider="aws", tier="t4x1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--stack-file", str(stack), "--hours-per-month", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "hours per month must be between 0 and 744" in proc.stderr


# --- --compare ----------------------------------------------------------------------------------


def test_compare_json_is_sorted_and_spans_providers_and_billing_modes():
    doc = run_json("--compare", "a100x8")
    offers = doc["offers"]
    assert [o["per_gpu_hour"] for o in offers] == sorted(o["per_gpu_hour"] for o in offers)
    assert {o["provider"] for o in offers} == {"aws", "alicloud", "tencent", "azure"}
    assert {o["billing"] for o in offers} >= {"on-demand", "spot", "subscription-month"}
    assert doc["currency"] == "USD"


def test_compare_table_lists_every_offer():
    code, out, _ = run("--compare", "t4x1")
    assert code == 0
    for itype in ("g4dn.xlarge", "ecs.gn6i-c4g1.xlarge", "ecs.gn6i-c8g1.2xlarge"):
        assert itype in out


def test_the_chart_has_one_bar_per_offer_in_both_panels_coloured_by_billing():
    cmp = compare_tier("a10x1")
    fig = cli.comparison_figure(cmp)
    ax_gpu, ax_tf = fig.axes
    n = len(cmp.offers)
    for ax, metric in ((ax_gpu, "per_gpu_hour"), (ax_tf, "per_tflop_hour")):
        by_label = {c.get_label(): c for c in ax.containers if hasattr(c, "patches")}
        assert set(by_label) == {o.billing for o in cmp.offers}
        assert sum(len(c.patches) for c in by_label.values()) == n
        for billing, container in by_label.items():
            rows = [o for o in cmp.offers if o.billing == billing]
            scale = 1000 if metric == "per_tflop_hour" else 1
            widths = sorted(p.get_width() for p in container.patches)
            assert widths == pytest.approx(sorted(getattr(o, metric) * scale for o in rows))
    # cheapest on top: the y tick labels read the sorted offers from top to bottom
    labels = [t.get_text() for t in ax_gpu.get_yticklabels()]
    ticks = list(ax_gpu.get_yticks())
    top_down = [label for _, label in sorted(zip(ticks, labels, strict=True), reverse=True)]
    assert top_down == [o.label for o in cmp.offers]
    # estimates hatched, so a reader sees at a glance which bars are not quoted prices
    hatched = sum(1 for c in ax_gpu.containers for p in getattr(c, "patches", []) if p.get_hatch())
    assert hatched == sum(1 for o in cmp.offers if o.estimate)


def test_plot_writes_a_valid_png(tmp_path: Path):
    target = tmp_path / "a100x8.png"
    code, out, err = run("--compare", "a100x8", "--plot", str(target))
    assert code == 0, err
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    pixels = imread(target)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 800  # readable, not a thumbnail
    assert str(target) in out


def test_plot_refuses_a_non_png_name(tmp_path: Path):
    code, _, err = run("--compare", "a100x8", "--plot", str(tmp_path / "chart.jpg"))
    assert code == 2 and "--plot writes PNG" in err


def test_compare_and_currency_names_are_case_blind_on_the_command_line():
    shouted = run_json("--compare", "A100x8", "--currency", "cny")
    plain = run_json("--compare", "a100x8", "--currency", "CNY")
    assert shouted == plain
    assert (shouted["tier"], shouted["currency"]) == ("a100x8", "CNY")


def test_a_stack_bill_takes_its_currency_in_any_case(tmp_path: Path):
    stack = write_stack(tmp_path, provider="aws", tier="t4x1")
    assert run_json("--stack-file", str(stack), "--currency", "cny")["currency"] == "CNY"


@pytest.mark.parametrize("argv", [["--stack", "a100x4"], ["--compare", "a100x8"]])
def test_piped_at_80_columns_every_line_fits_and_none_is_padded(argv: list[str]) -> None:
    import os

    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "80"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line for line in lines if line != line.rstrip()] == []  # rich padded 5-25 lines


@pytest.mark.parametrize(
    "argv",
    [
        ["--stack", "t4x1", "--currency", ""],
        ["--compare", "a100x8", "--currency", " "],
        ["--stack", "t4x1", "--bucket-class", ""],
    ],
)
def test_an_empty_value_is_refused_not_read_as_the_default(argv: list[str]) -> None:
    code, out, err = run(*argv)
    assert (code, out) == (2, "")
    (line,) = problems(err)
    flag = argv[2]
    assert line == f"cost.py: {flag} '': give a value or leave the flag out (see --help)"
