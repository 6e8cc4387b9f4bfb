"""What size.py and cost.py used to ignore silently is refused in one line, exit 2, with no
traceback (docs/exit-status.md); --list-models --json prints JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )


def refused(script: str, *argv: str) -> str:
    proc = run(script, *argv)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = problems(proc.stderr)
    return line


GPT2 = ("--model", "gpt2")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("--tokens", "1e-300"), "size.py: --tokens: '1e-300' is less than one token"),
        (
            ("--epochs", "1", "--dataset-tokens", "0.001"),
            "size.py: --dataset-tokens: '0.001' is less than one token",
        ),
        (
            ("--epochs", "1e-300", "--dataset-tokens", "1e9"),
            "size.py: --epochs: 1e-291 tokens in all is under one",
        ),
        (("--samples", "0.5"), "size.py: --samples: must be a whole number, got '0.5'"),
        (
            ("--epochs", "2", "--dataset-samples", "0.5"),
            "size.py: --dataset-samples: must be a whole number, got '0.5'",
        ),
        (
            ("--epochs", "2", "--dataset-samples", "1000", "--dataset-tokens", "1e9"),
            "size.py: give --dataset-samples or --dataset-tokens, not both",
        ),
        (
            ("--tokens", "1e9", "--dataset-tokens", "1e9"),
            "size.py: --dataset-tokens is read with --epochs only",
        ),
        (
            ("--tokens", "1e9", "--row", "2"),
            "size.py: --row picks the option --write-stack writes: give --write-stack NAME",
        ),
    ],
    ids=[
        "tiny-tokens",
        "tiny-dataset-tokens",
        "tiny-epochs",
        "half-a-sample",
        "half-a-dataset-sample",
        "both-dataset-sizes",
        "dataset-without-epochs",
        "row-without-write-stack",
    ],
)
def test_the_size_advisor_refuses_what_it_used_to_ignore(argv, said):
    assert refused("size.py", *GPT2, *argv).startswith(said)


def test_a_row_past_the_options_is_refused_and_nothing_is_written(tmp_path):
    line = refused(
        "size.py",
        *GPT2,
        *("--tokens", "1e9", "--write-stack", "x", "--row", "9999"),
        *("--stacks-dir", str(tmp_path)),
    )
    assert line.startswith("size.py: --row 9999: there are only ") and line.endswith(" options")
    assert list(tmp_path.iterdir()) == []


def test_a_whole_number_of_samples_with_a_suffix_still_sizes():
    proc = run("size.py", "--model", "resnet50", "--epochs", "2", "--dataset-samples", "1.28M")
    assert proc.returncode == 0, proc.stderr


def test_list_models_with_json_prints_every_model_as_json():
    proc = run("size.py", "--list-models", "--json")
    assert proc.returncode == 0, proc.stderr
    models = json.loads(proc.stdout)["models"]
    gpt2 = next(m for m in models if m["key"] == "gpt2")
    assert gpt2["params"] == 124_439_808 and gpt2["kind"] == "transformer"
    text = run("size.py", "--list-models").stdout
    assert [m["key"] for m in models] == [ln.split()[0] for ln in text.splitlines()[1:]]


def test_size_json_cut_by_a_closed_pipe_ends_quietly():
    proc = subprocess.run(
        f"{sys.executable} scripts/size.py --model gpt2 --tokens 1e9 --json | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.stderr == "" and proc.stdout.startswith("{")


def test_cost_refuses_sort_without_compare():
    line = refused("cost.py", "--stack", "t4x1", "--sort", "tflop-hour")
    assert line == "cost.py: --sort only applies to --compare TIER (it orders the comparison)"


def test_cost_compare_still_sorts_by_gpu_hour_unless_told():
    doc = json.loads(run("cost.py", "--compare", "t4x1", "--json").stdout)
    assert doc["sort_by"] == "gpu-hour"
    doc = json.loads(run("cost.py", "--compare", "t4x1", "--json", "--sort", "tflop-hour").stdout)
    assert doc["sort_by"] == "tflop-hour"
