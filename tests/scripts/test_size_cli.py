"""scripts/size.py: the --json contract, the report people read, bad input, --write-stack."""

from __future__ import annotations

import atexit
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from infra.catalog import Feature, ProviderInfo, load_catalog
from tests.support.real import missing_real_part
from tests.support.stderr import problems

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "size.py"


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = _load("size_cli", SCRIPT)
# a folder with no verify-gpu reports in it (a --reports folder that does not exist is refused)
NO_REPORTS = Path(tempfile.mkdtemp(prefix="gpufleet-no-reports-"))
atexit.register(shutil.rmtree, NO_REPORTS, True)  # one per process that imports this file


def run(*argv: str, reports: Path | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = [*argv, "--reports", str(reports or NO_REPORTS)]
    code = cli.main(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_json(*argv: str, reports: Path | None = None) -> dict[str, Any]:
    code, out, err = run(*argv, "--json", reports=reports)
    assert code == 0, err
    return json.loads(out)


# --- the --json contract -----------------------------------------------------------------------


def test_json_for_gpt2_lists_every_option_best_first_with_the_contract_keys():
    doc = run_json("--model", "gpt2", "--tokens", "1e9")
    assert doc["params"] == 124_439_808 and doc["tokens"] == 1e9
    assert doc["flops"] == pytest.approx(6 * 124_439_808 * 1e9)
    mem = doc["memory"]
    assert mem["weights_gb"] == pytest.approx(0.25, abs=0.01)  # 2 B x 124.4M
    assert mem["optimizer_gb"] == pytest.approx(1.49, abs=0.01)  # 12 B x 124.4M
    first = doc["options"][0]
    assert first["fits"] and first["why"] is None and first["status"] == "ok"
    assert first["common_currency"] == "USD"
    costs = [o["cost_common"] for o in doc["options"] if o["status"] == "ok"]
    assert costs == sorted(costs)
    t4 = next(o for o in doc["options"] if o["tier"] == "t4x1" and o["provider"] == "aws")
    assert t4["fits"] and t4["gpu_model"] == "T4" and t4["peak_tflops"] == 65.0


def test_json_reports_a_filtered_option_with_its_reason():
    doc = run_json("--params", "1B", "--tokens", "10B", "--deadline-hours", "10")
    slow = [o for o in doc["options"] if o["status"] == "filtered" and "deadline" in o["why"]]
    assert slow and all(o["hours"] > 10 for o in slow)
    assert doc["filters"]["deadline_hours"] == 10
    assert doc["memory"]["activations_gb"] is None  # no shape given
    assert any("activations are not counted" in w for w in doc["warnings"])


def test_samples_and_epochs_turn_into_tokens():
    doc = run_json("--model", "gpt2", "--samples", "1000")
    assert doc["tokens"] == 1000 * 1024
    doc = run_json("--model", "resnet50", "--epochs", "2", "--dataset-samples", "1.28M")
    assert doc["tokens"] == pytest.approx(2.56e6)  # images
    assert doc["flops"] == pytest.approx(24_299_077_632 * 2.56e6)


# --- the report people read --------------------------------------------------------------------


def test_the_report_fits_80_columns_and_shows_each_memory_part_and_the_mfu_source():
    code, out, _ = run("--model", "llama-2-7b", "--tokens", "1e9", "--strategy", "fsdp")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    for part in ("weights", "gradients", "optimizer", "activations", "overhead"):
        assert f"  {part}" in out
    assert "fp32 master copy" in out and "Korthikanti" in out and "ZeRO" in out
    assert "catalog expected_mfu (an unverified estimate)" in out
    assert "Options ranked by the cost of the whole run in USD" in out


def test_when_nothing_fits_the_report_says_by_how_much_and_shows_the_fix_and_exits_1():
    code, out, _ = run("--model", "llama-2-7b", "--tokens", "1e9")
    assert code == 1  # the answer is "nothing fits": not a success (docs/exit-status.md)
    assert "Nothing fits as asked. With --strategy fsdp, the best options would be:" in out
    assert "fits with --strategy fsdp: a100x8" in out
    assert "h100x1 56.1 GB over" in out  # 128.1 GB needed, 72.0 usable
    assert max(len(line) for line in out.splitlines()) <= 80


def test_thousands_separators_and_suffixes_still_read_as_numbers():
    doc = run_json("--model", "gpt2", "--tokens", "1,500,000,000")
    assert doc["tokens"] == 1.5e9
    assert run_json("--model", "gpt2", "--tokens", "1.5B")["tokens"] == 1.5e9


def test_the_does_not_fit_list_says_gb_over_and_names_a_gpu_other_than_the_tiers():
    code, out, _ = run("--params", "3B", "--tokens", "1e10", "--layers", "26", "--hidden", "3072")
    assert code == 0
    text = " ".join(out.split())
    assert "a100x8 13.5 GB over" in text  # was 'a100x8 13.5', which reads like a label
    assert "v100x1 (V100-32GB) 20.7 GB over" in text  # the 32 GB card a cloud sells as v100x1
    assert "a100x1 (A100-PCIE-80GB)" not in text  # Azure's 80 GB a100x1 fits: not listed
    assert " -22.5" not in text  # the negative excess of judging it as a 40 GB card


def test_a_deadline_ranks_the_cheapest_option_that_finishes_in_time_across_node_counts():
    argv = ("--params", "3B", "--tokens", "1e11", "--layers", "26", "--hidden", "3072")
    doc = run_json(*argv, "--deadline", "7d")
    assert doc["filters"]["deadline_hours"] == 168 and doc["filters"]["max_nodes"] == 64
    ok = [o for o in doc["options"] if o["status"] == "ok"]
    assert ok and all(o["hours"] <= 168 for o in ok)
    assert ok[0]["nodes"] >= 8  # one to four nodes of any tier take longer than a week
    assert run_json(*argv, "--deadline", "2w")["filters"]["deadline_hours"] == 336
    assert run_json(*argv, "--deadline", "36h")["filters"]["deadline_hours"] == 36


def test_a_run_of_months_without_a_deadline_gets_a_hint_to_give_one():
    code, out, _ = run("--params", "3B", "--tokens", "1e11", "--layers", "26", "--hidden", "3072")
    assert code == 0
    text = " ".join(out.split())
    assert "The cheapest option takes 367 days" in text and "--deadline 7d" in text


def test_a_spot_price_seen_once_is_said_as_such_not_as_a_zero_width_range():
    code, out, _ = run("--params", "3B", "--tokens", "1e10", "--layers", "26", "--hidden", "3072")
    assert code == 0
    text = " ".join(out.split())
    assert "(spot price: one observation, 2024-06-01, SCAZ)" in text
    assert "392-392" not in text and "range" not in text.split("Best:")[1].split(".")[0]


def test_when_every_option_is_filtered_out_the_status_is_1_with_json_too():
    # a budget only a subscription meets is still a budget: nothing is left, not bad input
    code, out, _ = run("--model", "llama-2-7b", "--tokens", "1e9", "--json")
    assert code == 1 and json.loads(out)["options"]


def test_a_recorded_report_changes_the_mfu_and_the_output_says_so(tmp_path: Path):
    from tests.infra.pricing.test_sizing import write_report

    # a path that rich would read as markup if markup were on
    reports = tmp_path / "[bold]reports[/bold]"
    write_report(reports, 0.40, "2026-12-01T08:00:00Z")
    code, out, _ = run("--model", "gpt2", "--tokens", "1e9", "--all", reports=reports)
    assert code == 0
    assert "A100-40GB: MFU 40%, measured by verify-gpu" in out
    assert "[bold]reports[/bold]" in " ".join(out.split())  # printed as text, not as markup
    doc = run_json("--model", "gpt2", "--tokens", "1e9", reports=reports)
    a100 = next(o for o in doc["options"] if o["gpu_model"] == "A100-40GB")
    assert a100["mfu"] == 0.4 and "measured by verify-gpu" in a100["mfu_source"]
    assert doc["calibrations"]["A100-40GB"]["mfu"] == 0.4


def _cloud(name: str, billing: tuple[str, ...], **why: str) -> ProviderInfo:
    unsupported = {Feature[k.upper()]: v for k, v in why.items()}
    return ProviderInfo(
        name, "USD", "r-1", "r-1", "u", billing, title=name.title(), unsupported=unsupported
    )


def test_billing_note_names_the_clouds_that_sell_a_subscription_and_why_the_others_do_not():
    note = cli.billing_note(
        [
            _cloud("north", ("on-demand", "spot", "subscription")),
            _cloud("east", ("on-demand",), subscription="reserved terms are sold apart"),
            _cloud("south", ("on-demand", "subscription")),
        ],
        0.1,
    )
    assert "+10% hours for interruptions" in note
    assert "Subscription: whole months on North and South, only when cheaper" in note
    assert note.endswith("No subscription on East: reserved terms are sold apart.")


def test_billing_note_without_a_cloud_that_sells_one_says_only_why_not():
    note = cli.billing_note([_cloud("east", ("spot",), subscription="terms are sold apart")], 0.2)
    assert "whole months" not in note
    assert note.endswith(
        "+20% hours for interruptions and restarts. No subscription on East: terms are sold apart."
    )


def test_the_footnote_reads_each_clouds_billing_from_the_catalog_for_the_clouds_ranked():
    providers = load_catalog().providers
    code, out, _ = run("--model", "gpt2", "--tokens", "1e9")
    assert code == 0
    text = " ".join(out.split())
    selling = [p.title for p in providers.values() if "subscription" in p.billing]
    assert f"Subscription: whole months on {', '.join(selling[:-1])} and {selling[-1]}," in text
    for p in providers.values():
        if "subscription" not in p.billing:
            why = " ".join(p.unsupported[Feature.SUBSCRIPTION].split())
            assert f"No subscription on {p.title}: {why}." in text
    one = next(iter(providers))
    code, out, _ = run("--model", "gpt2", "--tokens", "1e9", "--providers", one)
    others = [p.title for name, p in providers.items() if name != one]
    assert code == 0 and not any(f"on {title}" in " ".join(out.split()) for title in others)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_piped_output_has_no_terminal_escapes():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "gpt2", "--tokens", "1e9"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and "Options ranked" in proc.stdout


def test_list_models_names_each_model_and_its_source():
    code, out, _ = run("--list-models")
    assert code == 0 and "llama-3-8b" in out and "LLAMA3" in out


# --- bad input: exit 2, one line per problem, no traceback -------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--params", "-7e9", "--tokens", "1e9"], ["--params: must be above 0"]),
        (["--params", "seven", "--tokens", "1e9"], ["--params: 'seven' is not a number"]),
        (["--model", "lama-2-7b", "--tokens", "1e9"], ["did you mean 'llama-2-7b'?"]),
        (["--model", "gpt2", "--tokens", "x", "--layers", "1.5"], ["--layers", "--tokens"]),
        (["--model", "gpt2"], ["give the data"]),
        (["--model", "gpt2", "--tokens", "inf"], ["--tokens: must be a finite number"]),
        (["--model", "gpt2", "--tokens", "nan"], ["--tokens: must be a finite number"]),
        (
            ["--model", "gpt2", "--tokens", "1e9", "--deadline-hours", "0.0001"],
            ["deadline 0.36 s is impossible: the fastest fitting option"],
        ),
        (
            ["--model", "gpt2", "--tokens", "1e9", "--precision", "bff16", "--budget", "lots"],
            ["did you mean 'bf16'?", "--budget: 'lots' is not an amount"],
        ),
        # token counts: a decimal comma would read as 15B, an exponent with a suffix as 1e18
        (["--model", "gpt2", "--tokens", "1,5B"], ["a comma only groups thousands"]),
        (["--model", "gpt2", "--tokens", "1,00"], ["a comma only groups thousands"]),
        (["--model", "gpt2", "--tokens", "1e9B"], ["both an exponent and a suffix"]),
        (["--params", "2.5E3M", "--tokens", "1e9"], ["both an exponent and a suffix"]),
        # shapes
        (
            [
                "--params",
                "7B",
                "--layers",
                "32",
                "--hidden",
                "4096",
                "--heads",
                "30",
                "--tokens",
                "1e9",
            ],
            ["30 heads do not divide the hidden size 4096"],
        ),
        (
            ["--params", "7B", "--layers", "2", "--hidden", "64", "--tokens", "1e9"],
            ["--layers 2 --hidden 64 make a model of about"],
        ),
        (
            ["--model", "llama-2-7b", "--hidden", "512", "--tokens", "1e9"],
            ["parameters, not 6.74B"],
        ),
        # a CNN has no sequence, attention, heads or vocabulary
        (["--model", "resnet50", "--tokens", "1e6", "--seq-len", "4096"], ["--seq-len: resnet50"]),
        (
            ["--model", "resnet50", "--tokens", "1e6", "--attention", "eager"],
            ["--attention: resnet50 is a CNN"],
        ),
        (
            ["--model", "resnet50", "--tokens", "1e6", "--heads", "8", "--vocab", "10"],
            ["--heads, --vocab: resnet50 is a CNN"],
        ),
        # nodes and deadlines
        (
            ["--model", "gpt2", "--tokens", "1e9", "--max-nodes", "65"],
            ["more than a stack allows (64 nodes"],
        ),
        (["--model", "gpt2", "--tokens", "1e9", "--deadline", "7x"], ["is not a duration"]),
        (["--model", "gpt2", "--tokens", "1e9", "--deadline", "0d"], ["--deadline: must be above"]),
        (
            ["--model", "gpt2", "--tokens", "1e9", "--deadline", "1d", "--deadline-hours", "24"],
            ["give --deadline or --deadline-hours, not both"],
        ),
        (
            ["--model", "gpt2", "--tokens", "1e12", "--deadline", "1m"],
            ["deadline 1 min is impossible: the fastest fitting option (h100x8 x64 on aws"],
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_per_problem(argv, expected):
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    lines = problems(err)
    assert len(lines) >= len(expected)
    assert all(line.startswith("size.py: ") for line in lines)
    for want in expected:
        assert any(want in line for line in lines), (want, lines)
    assert "Traceback" not in err


def test_every_problem_is_reported_at_once():
    code, _, err = run("--params", "-1", "--tokens", "abc", "--optimizer", "adam")
    assert code == 2
    assert len(problems(err)) == 3


def test_bad_input_from_the_command_line_leaves_no_traceback():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "gpt3", "--tokens", "-5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(problems(proc.stderr)) == 2


# --- --write-stack -----------------------------------------------------------------------------


def test_write_stack_writes_a_stack_that_plans_cleanly(tmp_path: Path):
    plan_cli = _load("plan_cli", REPO / "scripts" / "plan.py")
    stacks = tmp_path / "stacks"
    code, out, err = run(
        "--model",
        "gpt2",
        "--tokens",
        "1e9",
        "--providers",
        "aws,alicloud",  # the choice this test pins (Azure's spot T4 is cheaper for gpt2)
        "--write-stack",
        "gpt2-run",
        "--stacks-dir",
        str(stacks),
    )
    assert code == 0, err
    path = stacks / "Pulumi.gpt2-run.yaml"
    assert f"Wrote {path}" in " ".join(out.split())
    text = path.read_text()
    assert "gpufleet:tier: a100x8" in text and "gpufleet:billing: spot" in text
    doc, _ = plan_cli.plan(path)
    assert doc["stack"] == "gpt2-run"
    assert doc["policies"]["passed"], doc["policies"]
    assert doc["cost"]["billing"] == "spot"


def test_write_stack_of_a_two_node_row_sets_nodes_and_a_ttl_longer_than_the_run(tmp_path: Path):
    plan_cli = _load("plan_cli", REPO / "scripts" / "plan.py")
    stacks = tmp_path / "stacks"
    argv = ("--params", "1B", "--tokens", "10B", "--providers", "aws", "--billing", "on-demand")
    doc = run_json(*argv)
    row, o = next(
        (i, o)
        for i, o in enumerate(doc["options"], 1)
        if o["status"] == "ok" and o["tier"] == "a100x8" and o["nodes"] == 2
    )
    code, _, err = run(
        *argv, "--write-stack", "two", "--row", str(row), "--stacks-dir", str(stacks)
    )
    assert code == 0, err
    path = stacks / "Pulumi.two.yaml"
    text = path.read_text()
    assert "gpufleet:nodes: 2" in text and "gpufleet:billing" not in text  # on-demand default
    ttl = int(text.split("gpufleet:ttlHours: ")[1].split()[0])
    assert o["hours"] * 1.25 <= ttl <= o["hours"] * 1.25 + 2  # ceil(hours x 1.25) + 1
    planned, _ = plan_cli.plan(path)
    assert planned["policies"]["passed"], planned["policies"]
    assert planned["cost"]["nodes"] == 2


def test_write_stack_of_a_subscription_row_sets_months_and_caps_the_ttl(tmp_path: Path):
    stacks = tmp_path / "stacks"
    doc = run_json("--params", "1B", "--tokens", "25B", "--providers", "alicloud")
    row = next(
        i
        for i, o in enumerate(doc["options"], 1)
        if o["status"] == "ok" and o["billing"] == "subscription" and o["tier"] == "a100x1"
    )
    code, _, err = run(
        "--params",
        "1B",
        "--tokens",
        "25B",
        "--providers",
        "alicloud",
        "--write-stack",
        "sub",
        "--row",
        str(row),
        "--stacks-dir",
        str(stacks),
    )
    assert code == 0, err
    text = (stacks / "Pulumi.sub.yaml").read_text()
    assert "gpufleet:billing: subscription" in text
    assert "gpufleet:subscriptionMonths: 1" in text
    # ceil(667.7 x 1.25) + 1 = 836 h is over the 336 h the guards read: capped, and said
    assert "gpufleet:ttlHours: 336   # the longest TTL; the run needs ~668 h" in text
    from infra.config import load_stack_file

    cfg = load_stack_file(stacks / "Pulumi.sub.yaml")
    assert cfg.tier == "a100x1" and cfg.subscription_months == 1


def test_write_stack_refuses_to_replace_a_file_or_write_a_bad_name(tmp_path: Path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    existing = stacks / "Pulumi.mine.yaml"
    existing.write_text("config: {}\n")
    args = ("--model", "gpt2", "--tokens", "1e9", "--stacks-dir", str(stacks))
    code, _, err = run(*args, "--write-stack", "mine")
    assert code == 2 and "exists" in err and existing.read_text() == "config: {}\n"
    code, _, err = run(*args, "--write-stack", "../evil")
    assert code == 2 and "is not a stack name" in err
    assert sorted(p.name for p in stacks.iterdir()) == ["Pulumi.mine.yaml"]


def test_write_stack_when_nothing_fits_writes_nothing(tmp_path: Path):
    stacks = tmp_path / "stacks"
    code, _, err = run(
        "--model",
        "llama-2-7b",
        "--tokens",
        "1e9",
        "--write-stack",
        "x",
        "--stacks-dir",
        str(stacks),
    )
    assert code == 2 and "is not usable" in " ".join(problems(err))
    assert not stacks.exists()


def test_the_make_target_runs_the_advisor(tmp_path: Path):
    if shutil.which("make") is None:
        missing_real_part("no make on PATH", package="make")
    proc = subprocess.run(
        # -o: never reinstall the venv from a test
        [
            "make",
            "-s",
            "-o",
            ".venv/.installed",
            "-C",
            str(REPO),
            "size",
            "ARGS=--model gpt2 --tokens 1e9 --json",
            "PY=" + sys.executable,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert doc["params"] == 124_439_808


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # an empty value was read as "not given" and the next problem said instead
        (["--tokens", ""], "--tokens: '' is not a number"),
        # past any real run the table's hours and costs overflowed their columns
        (["--tokens", "1e30"], "--tokens: 1e+30 tokens is over 1e+15"),
        (["--samples", "1e13", "--seq-len", "1024"], "--samples: 1.02e+16 tokens is over"),
        # silently ignored: no stack written, no calibration read, exit 0
        (["--tokens", "1e9", "--write-stack", ""], "--write-stack: '' is not a stack name"),
    ],
)
def test_an_empty_or_impossible_value_is_one_line_and_exit_2(argv: list[str], said: str) -> None:
    code, out, err = run("--model", "gpt2", *argv)
    assert (code, out) == (2, ""), err
    (line,) = problems(err)
    assert line.startswith(f"size.py: {said}"), line


@pytest.mark.parametrize("folder", ["", "/nonexistent/reports"])
def test_a_reports_folder_that_is_not_there_is_refused(folder: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--model", "gpt2", "--tokens", "1e9", "--reports", folder], out, err)
    assert (code, out.getvalue()) == (2, "")
    assert (
        err.getvalue() == f"size.py: --reports {folder!r}: no such folder (verify-gpu's reports)\n"
    )


def test_a_parser_error_ends_pointing_to_help() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["--model", "gpt2", "--tokens"], out, err) == 2
    assert err.getvalue() == "size.py: argument --tokens: expected one argument (see --help)\n"
