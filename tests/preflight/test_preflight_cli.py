"""scripts/preflight.py as a person and a machine call it: exit statuses, one line per
problem, never a traceback, and nothing but loopback reached."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]
CLOSED = "http://127.0.0.1:9"


def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    base.update(
        AWS_ENDPOINT_URL=CLOSED,  # every AWS call fails at once, on loopback
        AWS_ENDPOINT_URL_PRICING=CLOSED,
    )
    base.update(env)
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "preflight.py"), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=base,
    )


def test_an_unknown_stack_is_one_line_and_exit_2():
    proc = run("--stack", "t4x")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = problems(proc.stderr)
    assert line.startswith("preflight.py: no stack 't4x'") and "did you mean 't4x1'" in line


def test_an_invalid_stack_file_is_refused_before_any_cloud_is_asked(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(
        "config:\n  gpufleet:provider: aws\n  gpufleet:tier: t4x1\n"
        "  gpufleet:zone: us-east-1zz\n  gpufleet:sshCidrs: [203.0.113.0/24]\n"
    )
    proc = run("--stack-file", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert problems(proc.stderr)[0].startswith("preflight.py: gpufleet:zone: 'us-east-1zz'")


def test_no_network_is_one_line_per_check_and_exit_1_without_a_traceback():
    proc = run("--stack", "t4x1")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0] == "preflight t4x1: 1 x g4dn.xlarge (aws us-east-1, spot)"
    assert lines[1].startswith("[unknown] identity: STS GetCallerIdentity:")
    assert all(len(ln) <= 80 for ln in lines)


def test_json_lists_every_check_with_its_state_and_the_calls_made():
    proc = run("--stack", "t4x1", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["provider"] == "aws"
    assert {c["check"] for c in doc["checks"]} >= {"identity", "quota", "offered", "price"}
    assert all(set(c) == {"check", "state", "detail", "fix"} for c in doc["checks"])


def test_request_quota_without_a_terminal_or_yes_is_refused_before_any_call():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "preflight.py"),
            "--stack",
            "t4x1",
            "--request-quota",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "AWS_ENDPOINT_URL": CLOSED},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = problems(proc.stderr)
    assert line == "preflight.py: --request-quota asks first: run it in a terminal, or add --yes"


def test_yes_alone_and_request_quota_with_json_are_refused():
    proc = run("--stack", "t4x1", "--yes")
    assert proc.returncode == 2 and "--yes goes with --request-quota" in proc.stderr
    proc = run("--stack", "t4x1", "--request-quota", "--yes", "--json")
    assert proc.returncode == 2 and "leave out --json" in proc.stderr


def test_request_quota_with_yes_and_no_network_files_nothing_and_says_so():
    proc = run("--stack", "t4x1", "--request-quota", "--yes")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout.splitlines()[-1] == "--request-quota: no short quota to request"


class Terminal(io.StringIO):
    """What a person types, as a terminal: isatty() is True."""

    def isatty(self) -> bool:
        return True


def test_only_y_or_yes_from_the_terminal_files(capsys):
    from scripts import preflight as script

    out = io.StringIO()
    for typed, said in (("y\n", True), ("YES\n", True), ("n\n", False), ("\n", False), ("", False)):
        assert script.tty_confirm("file? [y/N] ", out, Terminal(typed)) is said
    assert out.getvalue().startswith("file? [y/N] ")


def test_request_quota_at_a_terminal_runs_the_checks_then_asks(monkeypatch):
    from scripts import preflight as script

    monkeypatch.setenv("AWS_ENDPOINT_URL", CLOSED)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", CLOSED)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    out, err = io.StringIO(), io.StringIO()
    code = script.main(["--stack", "t4x1", "--request-quota"], out, err, Terminal("y\n"))
    assert code == 1 and err.getvalue() == ""  # no network: unknown lines, nothing to file
    assert out.getvalue().splitlines()[-1] == "--request-quota: no short quota to request"
