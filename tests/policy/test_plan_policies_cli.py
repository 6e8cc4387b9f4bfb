"""`make plan` runs the guardrails offline and prints them the way `pulumi preview` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from policy import rules as R
from policy.plan_check import EXIT_MANDATORY
from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "scripts" / "plan.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # piped and no COLUMNS (pytest's children inherit COLUMNS=80): each line whole
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, str(PLAN), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )


@pytest.fixture
def world_ssh_stack(tmp_path: Path) -> Path:
    """A valid config (the user explicitly allowed it) that the mandatory SSH policy refuses."""
    path = tmp_path / "Pulumi.openbox.yaml"
    path.write_text(
        "config:\n"
        "  gpufleet:provider: aws\n"
        "  gpufleet:tier: t4x1\n"
        "  gpufleet:billing: spot\n"
        "  gpufleet:sshCidrs: ['0.0.0.0/0']\n"
        "  gpufleet:allowWorldSsh: true\n"
    )
    return path


def test_plan_json_carries_the_policy_verdict() -> None:
    proc = run("--stack", "h100x8x2", "--json")
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)["policies"]
    assert section["pack"] == R.PACK_NAME and section["passed"] is True
    assert section["policies"] == [r.name for r in R.RULES]
    assert section["mandatory"] == 0 and section["violations"] == []


def test_an_advisory_is_printed_but_does_not_fail_the_plan(tmp_path: Path) -> None:
    devbox = tmp_path / "Pulumi.devbox.yaml"
    devbox.write_text(
        "config:\n"
        "  gpufleet:provider: alicloud\n"
        "  gpufleet:tier: a10x1\n"
        "  gpufleet:sshCidrs: ['203.0.113.0/24']\n"
        "  gpufleet:tags: {purpose: dev}\n"
    )
    proc = run("--stack-file", str(devbox))
    assert proc.returncode == 0, proc.stderr
    assert "Policies:" in proc.stdout
    assert "- [advisory]  dev-stacks-use-spot  (alicloud:ecs/instance:Instance: devbox-0)" in (
        proc.stdout
    )


def test_a_mandatory_violation_prints_the_plan_and_exits_3(world_ssh_stack: Path) -> None:
    proc = run("--stack-file", str(world_ssh_stack))
    assert proc.returncode == EXIT_MANDATORY == 3, proc.stderr
    assert "g4dn.xlarge" in proc.stdout  # the plan itself is still shown
    assert "❌ gpufleet-guardrails@v0.1.0" in proc.stdout
    assert "- [mandatory]  ssh-not-open-to-world" in proc.stdout
    assert "openbox-ssh-0" in proc.stdout and "gpufleet:sshCidrs" in proc.stdout


def test_pack_config_can_downgrade_a_policy_as_pulumi_does(
    world_ssh_stack: Path, tmp_path: Path
) -> None:
    config = tmp_path / "policy-config.json"
    config.write_text(json.dumps({"ssh-not-open-to-world": "advisory"}))
    proc = run("--stack-file", str(world_ssh_stack), "--policy-config", str(config), "--json")
    assert proc.returncode == 0, proc.stderr
    section = json.loads(proc.stdout)["policies"]
    assert section["passed"] is True and section["advisory"] == 1
    [v] = section["violations"]
    assert v["policy"] == "ssh-not-open-to-world" and v["level"] == "advisory"
    assert v["resource_name"] == "openbox-ssh-0"


def test_a_wrong_policy_config_is_invalid_input(tmp_path: Path) -> None:
    config = tmp_path / "policy-config.json"
    config.write_text(json.dumps({"ssh-open": "advisory"}))
    proc = run("--stack", "t4x1", "--policy-config", str(config))
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = problems(proc.stderr)
    assert line.startswith("--policy-config: ssh-open: no such policy")
