"""Every renderer prints dynamic text as it is and fits the width it is given.

Markup-like (`[bold]`) and emoji-like (`:guard:`) strings go in as resource types, names,
hosts, messages and prices, and must come back verbatim: rich reads both by default
(`gpufleet:guard:IdleGuard` used to print as `gpufleet💂IdleGuard`).
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import re
from pathlib import Path
from types import ModuleType

import pytest

from bootstrap.fleet.api import Host, StepResult
from bootstrap.fleet.runner import (
    FleetReport,
    HostReport,
    StepRecord,
    _Printer,
    summary_table,
    verdict_line,
)
from bootstrap.tasks.status import render_status
from bootstrap.verify.verdict import Check, Verdict
from bootstrap.verify.verdict_text import DETAIL_INDENT, verdict_text
from infra.plan_view import render_plan
from infra.pricing.compare import compare_tier
from infra.render import literal_console, number, output_width, value_text, wrap

ROOT = Path(__file__).resolve().parents[1]
TRICKY = "[bold]loud[/bold] :guard: [red]"


def load_cost_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufleet_cost_render", ROOT / "scripts/cost.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cost_cli = load_cost_script()


def printed(renderable: object, width: int = 200) -> str:
    console = literal_console()
    console.file = io.StringIO()
    console.width = width
    console.print(renderable)
    return console.file.getvalue()


# --- the helpers ------------------------------------------------------------------------------


def test_whole_numbers_print_without_a_fraction_and_others_as_they_are() -> None:
    assert [number(22.0), number(300), number(21.958), number(True)] == [
        "22",
        "300",
        "21.958",
        "true",
    ]
    assert value_text({"fromPort": 22.0, "ratio": 0.5}) == '{"fromPort": 22, "ratio": 0.5}'


def test_wrapping_keeps_every_character_and_the_width() -> None:
    text = "arn:aws:iam::123456789012:role/" + "x" * 150 + " and more words here"
    lines = wrap(text, 60, "    key: ", "      ")
    assert all(len(line) <= 60 for line in lines) and len(lines) > 3
    assert lines[0].startswith("    key: arn:") and all(ln.startswith("      ") for ln in lines[1:])
    joined = lines[0][len("    key: ") :] + "".join(ln[6:] for ln in lines[1:])
    assert joined.replace(" ", "") == text.replace(" ", "")
    assert wrap(text, None, "k: ") == ["k: " + text]


def test_without_a_terminal_or_columns_there_is_no_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_width(io.StringIO()) is None
    monkeypatch.setenv("COLUMNS", "80")
    assert output_width(io.StringIO()) == 80


def test_the_literal_console_prints_markup_and_emoji_codes_verbatim() -> None:
    assert printed(TRICKY).strip() == TRICKY
    assert printed("gpufleet:guard:IdleGuard").strip() == "gpufleet:guard:IdleGuard"


# --- plan -------------------------------------------------------------------------------------


def tricky_plan() -> dict:
    stack = "urn:pulumi:s::gpufleet::pulumi:pulumi:Stack::gpufleet-s"
    guard = "urn:pulumi:s::gpufleet::gpufleet:guard:IdleGuard::g"
    return {
        "stack": "s",
        "stack_urn": stack,
        "resources": [
            {"type": "gpufleet:guard:IdleGuard", "name": "g", "urn": guard, "parent": stack},
            {
                "type": "aws:lambda/function:Function",
                "name": TRICKY,
                "urn": guard + "$aws:lambda/function:Function::x",
                "parent": guard,
                "inputs": {"handler": TRICKY, "runtime": ":snake:"},
            },
        ],
        "outputs": {"note": TRICKY},
        "cost": {
            "amount": 1.5,
            "currency": ":dollar:",
            "nodes": 1,
            "instance_type": "[i]t[/i]",
            "billing": "spot",
            "price_date": "2026-01-01",
            "source": "[link]",
            "estimate": False,
        },
    }


@pytest.mark.parametrize("width", [80, None])
def test_the_plan_tree_prints_markup_and_emoji_codes_verbatim(width: int | None) -> None:
    text = render_plan(tricky_plan(), [TRICKY], f"Policies:\n    {TRICKY}", width)
    assert "gpufleet:guard:IdleGuard" in text and "aws:lambda:Function" in text
    assert text.count(TRICKY) == 5  # name, handler, output, policies, note
    assert ":snake:" in text and ":dollar:/h" in text and "[i]t[/i]" in text
    assert "source: [link]" in " ".join(text.split())


# --- cost -------------------------------------------------------------------------------------


def test_cost_console_prints_markup_and_emoji_codes_verbatim() -> None:
    out = io.StringIO()
    cost_cli._console(out).print(TRICKY)
    assert out.getvalue().strip() == TRICKY


@pytest.mark.parametrize("tier", ["a100x8", "t4x1", "h100x8"])
def test_compare_keeps_every_figure_whole_at_80_columns(
    tier: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    cmp = compare_tier(tier)
    cost_cli.render_comparison(cmp, out)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for offer in cmp.offers:
        assert f"{offer.per_gpu_hour:.3f}" in text and offer.instance_type in text
    assert "Left out at 80 columns:" in text


def test_compare_shows_every_column_when_piped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    cost_cli.render_comparison(compare_tier("a100x8"), out)
    text = out.getvalue()
    assert "Left out" not in text and "price date" in text and "node-h, native" in text


def test_the_bill_keeps_figures_whole_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = tmp_path / "Pulumi.bill.yaml"
    stack.write_text(
        "config:\n  gpufleet:provider: alicloud\n  gpufleet:tier: a100x1\n"
        "  gpufleet:billing: subscription\n  gpufleet:sshCidrs: ['203.0.113.7/32']\n"
    )
    args = ["--stack-file", str(stack), "--storage-gb", "1000000", "--egress-gb", "50000"]

    def bill(columns: str | None) -> str:
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", columns)
        out, err = io.StringIO(), io.StringIO()
        assert cost_cli.main(args, out, err) == 0, err.getvalue()
        return out.getvalue()

    piped, narrow = bill(None), bill("80")
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "…" not in narrow
    figures = re.findall(r"\d[\d,]*\.\d\d(?: - \d[\d,]*\.\d\d)?", piped)
    assert len(figures) > 8
    for figure in figures:
        assert figure in narrow, figure


# --- fab --------------------------------------------------------------------------------------


def tricky_report() -> FleetReport:
    host = Host(TRICKY, user="u", port=2222, name=":guard:")
    down = Host("[down]", port=22)
    return FleetReport(
        "status",
        [
            HostReport(
                host,
                steps=[
                    StepRecord("status", StepResult.ok(TRICKY, **status_details()), 0.1),
                ],
            ),
            HostReport(down, connection_error="unreachable", connection_message=TRICKY),
        ],
        0.2,
    )


def status_details() -> dict:
    return {
        "gpu_count": 1,
        "gpu_model": ":guard:",
        "driver": "[b]580[/b]",
        "cuda": "12.8",
        "torch": ":fire:",
        "scratch": {"mounted": False},
        "scratch_path": "/scratch",
        "reboot_required": False,
        "uptime_s": 60,
    }


def test_the_fab_summary_and_status_tables_print_markup_and_emoji_codes_verbatim() -> None:
    report = tricky_report()
    summary = printed(summary_table(report), width=300)
    assert TRICKY in summary and ":guard:" in summary and "[down]" in summary
    status = "".join(printed(r, width=300) for r in render_status(report))
    assert ":guard:" in status and "[b]580[/b]" in status and ":fire:" in status
    assert status.count(TRICKY) == 2  # the host's label row and the unreachable host's reason


def test_progress_lines_print_markup_and_emoji_codes_verbatim() -> None:
    console = literal_console()
    console.file = io.StringIO()
    _Printer(console).line(Host(":guard:"), TRICKY, "bold red")
    assert console.file.getvalue().strip() == f"[:guard:] {TRICKY}"


def test_read_only_tasks_do_not_end_with_nothing_changed() -> None:
    report = FleetReport(
        "status", [HostReport(Host("h"), steps=[StepRecord("s", StepResult.ok("x"), 0)])], 0
    )
    assert verdict_line(report, read_only=True) == "all 1 host(s) answered"
    assert "nothing changed" in verdict_line(report)


def test_fab_jobs_table_prints_job_names_and_log_lines_verbatim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bootstrap.tasks import train  # the console fab jobs prints with
    from bootstrap.train.jobs import JobRow, jobs_table

    row = JobRow(
        job="j-1",
        name=TRICKY,
        state="running",
        started_at="2026-12-01T10:00:00Z",
        runtime_s=65.0,
        nnodes=1,
        attempt=1,
        last_line=":guard: [bold]",
        spec={},
    )
    train.literal_console().print(jobs_table([row]))
    out = capsys.readouterr().out
    # with markup on, rich would swallow every [bold] and draw :guard: as an emoji
    assert "[bold]" in out and ":guard:" in out and "💂" not in out


def test_a_plan_note_sets_a_long_command_on_continued_lines_a_shell_can_paste() -> None:
    command = (
        "az resource invoke-action --action syncfunctiontriggers --resource-type "
        "Microsoft.Web/sites -g gpufleet-some-long-stack -n gpufleet-some-long-stack-reaper"
    )
    short = "az provider register -n Microsoft.Compute"
    note = f"after each deploy sync it: `{command}` (else it never runs), then `{short}`"
    text = render_plan(tricky_plan(), [note, note], "Policies:", 80)
    note_lines = text[text.index("note: after") :].splitlines()
    assert all(len(line) <= 80 for line in note_lines)
    # the command's own lines: joined as a shell joins backslash-newline, it is the command
    block = [line for line in note_lines if line.startswith("        ")]
    assert block[0].startswith("        az resource") and block[0].endswith(" \\")
    pasted = " ".join(line.strip().removesuffix("\\").strip() for line in block[:3])
    assert pasted == command
    assert not any(line.endswith("-n \\") or line.endswith("-g \\") for line in block)
    # a command that fits the line is never split, and no character of the prose is lost
    assert sum(f"`{short}`" in line for line in note_lines) == 2
    assert "(else it never runs), then" in text.replace("\n      ", " ")
    piped = render_plan(tricky_plan(), [note], "Policies:", None)
    assert f"note: {note}\n" in piped


# --- verify-gpu -------------------------------------------------------------------------------


def failing_verdict() -> Verdict:
    """An 8x A100 whose GEMM is slow and whose GPU 5 has ECC and remap trouble: the checks
    with the longest details verify-gpu writes."""
    from bootstrap.verify import judge
    from tests.bootstrap.verify.verify_reports import expected, node_report

    def broken(r: dict) -> None:
        r["torchrun"]["gemm"][4]["tflops"] = 124.8
        gpu = r["nvidia"]["gpus"][5]
        gpu["ecc_volatile"]["uncorrected"] = 2
        gpu["remapped_rows"].update(pending=True, uncorrectable=1)

    return judge.judge(node_report(edit=broken), expected(), host="a100x8-0")


def test_the_verify_report_fits_80_columns_with_one_line_per_check() -> None:
    v = failing_verdict()
    text = printed(verdict_text(v, "verify-gpu a100x8-0", 80), width=80)
    lines = text.splitlines()
    assert lines[0] == "verify-gpu a100x8-0: FAIL"
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    # each check's headline starts with its status and name, in the verdict's order
    heads = [line for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert [h.split()[1] for h in heads] == [c.name for c in v.checks]
    gemm = v.check("gemm")
    head = next(h for h in heads if h.split()[1] == "gemm")
    assert head.split()[0] == "FAIL" and f"{gemm.measured}  (want {gemm.expected})" in head
    # the details sit beneath it, each finding starting a line, every word kept
    below = list(
        itertools.takewhile(lambda ln: ln.startswith(DETAIL_INDENT), lines[lines.index(head) + 1 :])
    )
    starts = [
        ln.strip()
        for ln in below
        if ln.startswith(DETAIL_INDENT) and not ln.startswith(DETAIL_INDENT + " ")
    ]
    assert len(below) > len(gemm.detail.split("; "))  # the first finding is longer than 80
    assert " ".join(" ".join(below).split()) == " ".join(gemm.detail.replace("; ", " ").split())
    assert all(any(p.startswith(s) for s in starts) for p in gemm.detail.split("; "))


def test_the_verify_report_piped_is_never_wrapped() -> None:
    v = failing_verdict()
    text = printed(verdict_text(v, "verify-gpu a100x8-0", None), width=1000)
    for c in v.checks:
        want = c.expected not in ("", "-", c.measured)
        figure = f"{c.measured}  (want {c.expected})" if want else c.measured
        assert any(f" {c.name} " in line and line.endswith(figure) for line in text.splitlines())
        for part in filter(None, c.detail.split("; ")):
            assert f"\n{DETAIL_INDENT}{part.strip()}\n" in text + "\n"


def test_the_verify_report_prints_markup_and_emoji_codes_verbatim() -> None:
    v = Verdict("h", "gpu", (Check(TRICKY, "FAIL", TRICKY, TRICKY, detail=TRICKY),))
    text = printed(verdict_text(v, f"verify-gpu {TRICKY}", 80), width=80)
    assert text.count(TRICKY) == 4 and "💂" not in text
