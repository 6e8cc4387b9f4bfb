"""One exit-status convention for every command (docs/exit-status.md): a usage error is one
line on stderr and status 2, never a traceback or argparse's usage block."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stderr import problems

REPO = Path(__file__).resolve().parents[1]
# every script with a command line, none left out
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))


def test_the_convention_page_names_the_three_statuses_and_plans_third():
    text = (REPO / "docs" / "exit-status.md").read_text()
    for status in ("| 0 |", "| 1 |", "| 2 |", "| 3 |"):
        assert status in text


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_flag_is_one_line_and_exit_2(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), "--no-such-flag"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = problems(proc.stderr)  # one problem, each of its lines in 80 columns
    assert line.startswith(f"{script.removesuffix('.py')}") or line.startswith(script), line
    assert line.endswith("(see --help)"), line


def test_cost_live_that_cannot_compare_exits_1_and_still_prints_the_bill(tmp_path: Path):
    import os

    stack = tmp_path / "Pulumi.live.yaml"
    stack.write_text(
        "config:\n  gpufleet:provider: alicloud\n  gpufleet:tier: a100x1\n"
        '  gpufleet:sshCidrs: ["203.0.113.7/32"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALIBABA_CLOUD_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cost.py"), "--stack-file", str(stack), "--live"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 1
    assert "Compute, all nodes" in proc.stdout and "Live: not checked" in proc.stdout
    assert proc.stderr.startswith("cost.py --live: no Alibaba Cloud credentials")
