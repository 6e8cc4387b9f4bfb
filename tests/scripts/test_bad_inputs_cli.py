"""Every command-line entry point, fed every kind of bad input we could think of, ends the same
way: exit status 2, exactly one line on stderr that names what is wrong, never a traceback.

Each case runs the real CLI in a fresh process (scripts/plan.py, scripts/cost.py, and `fab`
tasks that load an inventory through bootstrap/fleet/hosts.py). The cases started as the 17 inputs
an independent test found printing tracebacks, then grew by kind: files that are directories,
not UTF-8, not JSON/YAML or the wrong shape; values of the wrong type; NaN, infinity, huge and
negative numbers; empty strings; over-broad CIDRs and odd paths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "scripts" / "plan.py")
COST = str(ROOT / "scripts" / "cost.py")
FAB = str(Path(sys.executable).with_name("fab"))
GOOD = {
    "gpufleet:provider": "aws",
    "gpufleet:tier": "t4x1",
    "gpufleet:sshCidrs": ["203.0.113.0/24"],
}
GOOD_YAML = (
    b"config:\n  gpufleet:provider: aws\n  gpufleet:tier: t4x1\n"
    b"  gpufleet:sshCidrs: [203.0.113.0/24]\n"
)
# ten levels of nine aliases: 9**10 values once expanded (PyYAML builds them all)
ALIAS_BOMB = b"  bomb0: &b0 [x, x, x, x, x, x, x, x, x]\n" + b"".join(
    f"  bomb{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]\n".encode() for i in range(1, 10)
)
GOOD_NODE = {"name": "n-0", "role": "head", "public_ip": "127.0.0.1"}


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Path], list[str]]  # given a scratch directory with the inputs written
    says: str  # a fragment the one stderr line must contain
    env: Callable[[Path], dict[str, str]] | None = None
    lines: int = 1  # one problem per input: an input with two problems prints two


def stack_file(config: dict[str, object], name: str = "Pulumi.bad.yaml") -> Callable[[Path], str]:
    def write(d: Path) -> str:
        path = d / name
        path.write_text(yaml.safe_dump({"config": {**GOOD, **config}}))
        return str(path)

    return write


def raw_file(name: str, content: bytes) -> Callable[[Path], str]:
    def write(d: Path) -> str:
        (d / name).write_bytes(content)
        return str(d / name)

    return write


def directory(name: str) -> Callable[[Path], str]:
    def make(d: Path) -> str:
        (d / name).mkdir(exist_ok=True)
        return str(d / name)

    return make


def json_file(doc: object, name: str = "doc.json") -> Callable[[Path], str]:
    return raw_file(name, json.dumps(doc).encode())


def inventory(**changes: object) -> Callable[[Path], str]:
    doc: dict[str, object] = {"stack": "bad", "ssh_user": "ubuntu", "nodes": [GOOD_NODE]}
    doc.update(changes)
    return json_file(doc, "hosts.json")


def plan(*parts: str | Callable[[Path], str]) -> Callable[[Path], list[str]]:
    return lambda d: [sys.executable, PLAN, *[p(d) if callable(p) else p for p in parts]]


def cost(*parts: str | Callable[[Path], str]) -> Callable[[Path], list[str]]:
    return lambda d: [sys.executable, COST, *[p(d) if callable(p) else p for p in parts]]


def fab(*parts: str | Callable[[Path], str]) -> Callable[[Path], list[str]]:
    return lambda d: [FAB, "idle-status", *[p(d) if callable(p) else p for p in parts]]


NOT_UTF8 = b"config:\n  gpufleet:tier: \xff\xfe\n"
PC = "--policy-config"

TENCENT = {"gpufleet:provider": "tencent", "gpufleet:region": "ap-guangzhou"}

CASES = [
    # --- Tencent Cloud: refused before any resource, each in one line ---------------------------
    Case(
        "plan-tencent-scratch-class-of-another-cloud",
        plan("--stack-file", stack_file({**TENCENT, "gpufleet:scratchClass": "PL3"})),
        "'PL3' is not one of CLOUD_PREMIUM, CLOUD_SSD, CLOUD_HSSD",
    ),
    Case(
        "plan-tencent-tier-it-does-not-sell",
        plan("--stack-file", stack_file({**TENCENT, "gpufleet:tier": "h100x8"})),
        "tencent does not offer tier 'h100x8'",
    ),
    Case(
        "plan-tencent-zone-of-another-region",
        plan("--stack-file", stack_file({**TENCENT, "gpufleet:zone": "ap-shanghai-4"})),
        "is not a zone of region 'ap-guangzhou'",
    ),
    Case(
        "cost-tencent-region-misspelt",
        cost("--stack-file", stack_file({**TENCENT, "gpufleet:region": "ap-guangzho"})),
        "did you mean 'ap-guangzhou'?",
    ),
    # --- plan.py: the stack file ---------------------------------------------------------------
    Case(
        "plan-stack-file-is-a-directory",
        plan("--stack-file", directory("Pulumi.d.yaml")),
        "is a directory",
    ),
    Case(
        "plan-stack-file-is-a-plain-directory",
        plan("--stack-file", directory("stacks")),
        "is a directory",
    ),
    Case(
        "plan-stack-file-not-utf8",
        plan("--stack-file", raw_file("Pulumi.b.yaml", NOT_UTF8)),
        "not UTF-8",
    ),
    Case(
        "plan-stack-file-missing",
        plan("--stack-file", "/nonexistent/Pulumi.x.yaml"),
        "no such stack file",
    ),
    Case(
        "plan-stack-file-not-yaml",
        plan("--stack-file", raw_file("Pulumi.y.yaml", b"config: [unclosed\n")),
        "not valid YAML",
    ),
    Case(
        "plan-stack-file-top-level-list",
        plan("--stack-file", raw_file("Pulumi.l.yaml", b"- a\n- b\n")),
        "'config:' must be",
    ),
    Case(
        "plan-stack-file-config-is-a-list",
        plan("--stack-file", raw_file("Pulumi.c.yaml", b"config: [1, 2]\n")),
        "'config:' must",
    ),
    # yaml.v3's reading (the Pulumi CLI's), not PyYAML's YAML 1.1: see infra/stack_yaml.py
    Case(
        "plan-stack-file-duplicate-key",
        plan("--stack-file", raw_file("Pulumi.k.yaml", GOOD_YAML + b"  gpufleet:tier: h100x8\n")),
        "gpufleet:tier is set twice (first at line 3)",
    ),
    Case(
        "cost-stack-file-duplicate-key",
        cost("--stack-file", raw_file("Pulumi.k.yaml", GOOD_YAML + b"  gpufleet:tier: h100x8\n")),
        "the Pulumi CLI refuses that",
    ),
    Case(
        "plan-stack-file-base-60-ttl",
        plan("--stack-file", raw_file("Pulumi.t.yaml", GOOD_YAML + b"  gpufleet:ttlHours: 1:30\n")),
        "'1:30' is not a whole number",
    ),
    Case(
        "plan-stack-file-alias-bomb",
        plan("--stack-file", raw_file("Pulumi.a.yaml", GOOD_YAML + ALIAS_BOMB)),
        "once its aliases are expanded",
    ),
    Case(
        "cost-stack-file-alias-bomb",
        cost("--stack-file", raw_file("Pulumi.a.yaml", GOOD_YAML + ALIAS_BOMB)),
        "once its aliases are expanded",
    ),
    Case(
        "plan-stack-file-oversized",
        plan("--stack-file", raw_file("Pulumi.o.yaml", GOOD_YAML + b"# padding\n" * 40_000)),
        "limit 262,144",
    ),
    Case(
        "plan-stack-file-number-key",
        plan("--stack-file", raw_file("Pulumi.n.yaml", GOOD_YAML + b"  1: x\n")),
        "the key 1 is read as a number, not text",
    ),
    Case(
        "plan-stack-file-secret-value",
        plan(
            "--stack-file",
            raw_file("Pulumi.s.yaml", GOOD_YAML + b"  gpufleet:ttlHours:\n    secure: AAABAHd=\n"),
        ),
        "is a Pulumi secret (secure:)",
    ),
    Case(
        "plan-stack-file-misnamed",
        plan("--stack-file", raw_file("mystack.yaml", b"config: {}")),
        "Pulumi.<stack>.yaml",
    ),
    Case(
        "plan-world-in-halves",
        plan("--stack-file", stack_file({"gpufleet:sshCidrs": ["0.0.0.0/1", "128.0.0.0/1"]})),
        "sshCidrs",
        lines=2,
    ),
    Case(
        "plan-scratch-path-double-slash",
        plan("--stack-file", stack_file({"gpufleet:scratchPath": "//etc"})),
        "scratchPath",
    ),
    Case(
        "plan-scratch-path-dot-dot",
        plan("--stack-file", stack_file({"gpufleet:scratchPath": "/scratch/../etc"})),
        "scratchPath",
    ),
    Case(
        "plan-idle-minutes-1e12",
        plan("--stack-file", stack_file({"gpufleet:idleMinutes": 1e12})),
        "<= 1440",
    ),
    Case(
        "plan-ttl-hours-nan",
        plan("--stack-file", stack_file({"gpufleet:ttlHours": float("nan")})),
        "ttlHours",
    ),
    Case(
        "plan-root-disk-huge",
        plan("--stack-file", stack_file({"gpufleet:rootDiskGb": 10**12})),
        "rootDiskGb",
    ),
    Case(
        "plan-archive-days-huge",
        plan("--stack-file", stack_file({"gpufleet:bucketArchiveDays": 10**6})),
        "bucketArchiveDays",
    ),
    Case(
        "plan-tag-value-null",
        plan("--stack-file", stack_file({"gpufleet:tags": {"a": None}})),
        "null",
    ),
    Case(
        "plan-tag-value-nested",
        plan("--stack-file", stack_file({"gpufleet:tags": {"a": {"b": 1}}})),
        "flat",
    ),
    Case(
        "plan-reserved-tag-upper-case",
        plan("--stack-file", stack_file({"gpufleet:tags": {"GPUFLEET:x": "1"}})),
        "reserved",
    ),
    # --- plan.py: flags and the policy config -----------------------------------------------------
    Case("plan-empty-stack-name", plan("--stack", ""), "no stack ''"),
    Case("plan-unknown-stack", plan("--stack", "a100x3"), "did you mean"),
    Case("plan-no-arguments", plan(), "--stack"),
    Case(
        "plan-stack-and-stack-file",
        plan("--stack", "t4x1", "--stack-file", "x"),
        "not allowed with",
    ),
    Case("plan-unknown-flag", plan("--stack", "t4x1", "--bogus"), "--bogus"),
    Case(
        "plan-policy-config-is-a-directory",
        plan("--stack", "t4x1", PC, directory("pc")),
        "is a directory",
    ),
    Case(
        "plan-policy-config-not-utf8",
        plan("--stack", "t4x1", PC, raw_file("pc.json", b'{"a": "\xff"}')),
        "not UTF-8",
    ),
    Case(
        "plan-policy-config-is-yaml",
        plan("--stack", "t4x1", PC, raw_file("pc.json", b"cost-ceiling: advisory\n")),
        "not valid JSON",
    ),
    Case(
        "plan-policy-config-is-a-list",
        plan("--stack", "t4x1", PC, json_file([1, 2])),
        "expected a JSON object",
    ),
    Case(
        "plan-policy-config-missing",
        plan("--stack", "t4x1", PC, "/nonexistent/pc.json"),
        "no such policy config file",
    ),
    Case(
        "plan-policy-config-unknown-policy",
        plan("--stack", "t4x1", PC, json_file({"no-such-policy": "advisory"})),
        "no such policy",
    ),
    Case(
        "plan-policy-config-bad-level",
        plan("--stack", "t4x1", PC, json_file({"cost-ceiling": "loud"})),
        "not one of",
    ),
    Case(
        "plan-policy-config-ceiling-is-text",
        plan("--stack", "t4x1", PC, json_file({"cost-ceiling": {"maxHourlyCost": "abc"}})),
        "expected a number",
    ),
    Case(
        "plan-policy-config-ceiling-is-nan",
        plan(
            "--stack", "t4x1", PC, raw_file("pc.json", b'{"cost-ceiling": {"maxHourlyCost": NaN}}')
        ),
        "finite",
    ),
    Case(
        "plan-policy-config-unknown-setting",
        plan("--stack", "t4x1", PC, json_file({"cost-ceiling": {"maxHourly": 5}})),
        "no such setting",
    ),
    Case(
        "plan-policy-config-dev-tiers-not-a-list",
        plan("--stack", "t4x1", PC, json_file({"dev-stacks-use-spot": {"devTiers": "t4x1"}})),
        "expected a list",
    ),
    # --- cost.py ----------------------------------------------------------------------------------
    Case("cost-hours-abc", cost("--stack", "t4x1", "--hours", "abc"), "invalid float value"),
    Case("cost-hours-nan", cost("--stack", "t4x1", "--hours-per-month", "nan"), "not a number"),
    Case("cost-hours-inf", cost("--stack", "t4x1", "--hours", "inf"), "not a number"),
    Case("cost-hours-overflow", cost("--stack", "t4x1", "--hours", "1e400"), "not a number"),
    Case("cost-hours-negative", cost("--stack", "t4x1", "--hours=-5"), "between 0 and 744"),
    Case("cost-egress-nan", cost("--stack", "t4x1", "--egress-gb", "nan"), "--egress-gb"),
    Case("cost-storage-inf", cost("--stack", "t4x1", "--storage-gb", "inf"), "--storage-gb"),
    Case(
        "cost-snapshot-overflow", cost("--stack", "t4x1", "--snapshot-gb", "1e309"), "--snapshot-gb"
    ),
    Case("cost-egress-absurd", cost("--stack", "t4x1", "--egress-gb", "1e300"), "<= 1e+09"),
    Case("cost-compare-empty", cost("--compare", ""), "give a tier name"),
    Case("cost-compare-blank", cost("--compare", "   "), "give a tier name"),
    Case("cost-compare-unknown", cost("--compare", "a100x3"), "unknown tier"),
    Case("cost-empty-stack-name", cost("--stack", ""), "no stack ''"),
    Case(
        "cost-stack-file-is-a-directory",
        cost("--stack-file", directory("Pulumi.d.yaml")),
        "is a directory",
    ),
    Case(
        "cost-stack-file-not-utf8",
        cost("--stack-file", raw_file("Pulumi.b.yaml", NOT_UTF8)),
        "not UTF-8",
    ),
    Case(
        "cost-stack-file-absurd-idle",
        cost("--stack-file", stack_file({"gpufleet:idleMinutes": "1e12"})),
        "idleMinutes",
    ),
    Case("cost-unknown-currency", cost("--stack", "t4x1", "--currency", "EUR"), "unknown currency"),
    Case(
        "cost-plot-onto-a-directory",
        cost("--compare", "a100x8", "--plot", directory("c.png")),
        "cannot write",
    ),
    Case("cost-plot-not-png", cost("--compare", "a100x8", "--plot", "chart.jpg"), "PNG"),
    Case("cost-unknown-sort", cost("--compare", "a100x8", "--sort", "price"), "invalid choice"),
    Case(
        "cost-stack-and-compare", cost("--stack", "t4x1", "--compare", "a100x8"), "not allowed with"
    ),
    # --- fab: inventories (bootstrap/fleet/hosts.py) --------------------------------------------
    Case("fab-inventory-is-a-directory", fab("--inventory", directory("inv")), "is a directory"),
    Case(
        "fab-inventory-not-utf8",
        fab("--inventory", raw_file("h.json", b'{"nodes": ["\xff"]}')),
        "not UTF-8",
    ),
    Case(
        "fab-inventory-is-yaml",
        fab("--inventory", raw_file("h.json", b"nodes: []\n")),
        "not valid JSON",
    ),
    Case("fab-inventory-missing", fab("--inventory", "/nonexistent/hosts.json"), "does not exist"),
    Case(
        "fab-inventory-is-a-list",
        fab("--inventory", json_file([GOOD_NODE])),
        "expected a JSON object",
    ),
    Case(
        "fab-inventory-nodes-not-a-list",
        fab("--inventory", inventory(nodes={"a": 1})),
        "nodes: expected list",
    ),
    Case("fab-inventory-no-nodes", fab("--inventory", inventory(nodes=[])), "'nodes' is empty"),
    Case(
        "fab-inventory-node-not-an-object",
        fab("--inventory", inventory(nodes=["10.0.0.1"])),
        "expected an object",
    ),
    Case(
        "fab-inventory-tier-is-text",
        fab("--inventory", inventory(tier="a100x8")),
        "tier: expected an object",
    ),
    Case(
        "fab-inventory-scratch-is-text",
        fab("--inventory", inventory(scratch="/scratch")),
        "scratch: expected an object",
    ),
    Case(
        "fab-inventory-scratch-path-double-slash",
        fab("--inventory", inventory(scratch={"path": "//etc"})),
        "plain absolute path",
    ),
    Case(
        "fab-inventory-scratch-path-dot-dot",
        fab("--inventory", inventory(scratch={"path": "/scratch/../etc"})),
        "plain absolute path",
    ),
    Case(
        "fab-inventory-scratch-path-number",
        fab("--inventory", inventory(scratch={"path": 5})),
        "expected a path",
    ),
    Case(
        "fab-inventory-scratch-size-text",
        fab("--inventory", inventory(scratch={"size_gb": "big"})),
        "size_gb",
    ),
    Case(
        "fab-inventory-scratch-kind-unknown",
        fab("--inventory", inventory(scratch={"kind": "tmpfs"})),
        "kind",
    ),
    Case(
        "fab-inventory-gpu-count-text",
        fab("--inventory", inventory(tier={"gpu_count": "eight"})),
        "gpu_count",
    ),
    Case(
        "fab-inventory-nvswitch-text",
        fab("--inventory", inventory(tier={"nvswitch": "yes"})),
        "nvswitch",
    ),
    Case(
        "fab-inventory-port-text",
        fab("--inventory", inventory(ssh_port="ssh")),
        "port must be an integer",
    ),
    Case(
        "fab-inventory-port-out-of-range",
        fab("--inventory", inventory(ssh_port=70000)),
        "outside 1-65535",
    ),
    Case("fab-inventory-user-number", fab("--inventory", inventory(ssh_user=5)), "ssh_user"),
    Case(
        "fab-inventory-node-name-list",
        fab("--inventory", inventory(nodes=[{**GOOD_NODE, "name": ["a"]}])),
        "name",
    ),
    Case(
        "fab-inventory-node-without-address",
        fab("--inventory", inventory(nodes=[{"name": "n-0"}])),
        "no address",
    ),
    Case(
        "fab-inventory-host-keys-not-a-list",
        fab("--inventory", inventory(nodes=[{**GOOD_NODE, "host_keys": "ssh-ed25519 AAAA"}])),
        "host_keys",
    ),
    Case("fab-inventory-stack-number", fab("--inventory", inventory(stack=7)), "stack"),
    Case(
        "fab-inventory-from-env-is-a-directory",
        fab(),
        "is a directory",
        env=lambda d: {"GPUFLEET_INVENTORY": directory("env-inv")(d)},
    ),
]


def test_the_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_exits_2_with_one_line_and_no_traceback(case: Case, tmp_path: Path) -> None:
    argv = case.argv(tmp_path)
    env = {**os.environ, **(case.env(tmp_path) if case.env else {})}
    proc = subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False
    )
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    # the scripts' problems fit 80 columns, continued on indented lines (infra.usage.fit);
    # the fab tasks' are one line each, as long as they are
    fab_task = argv[0] == FAB
    lines = proc.stderr.strip().splitlines() if fab_task else problems(proc.stderr)
    assert len(lines) == case.lines, proc.stderr
    assert all(case.says in line for line in lines), lines
    assert proc.stdout.strip() == "", proc.stdout
