"""`scripts/plan.py`: the offline main job, as a person and a machine call it."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stderr import problems

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "scripts" / "plan.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped: lines whole
    return subprocess.run(
        [sys.executable, str(PLAN), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )


def test_plan_json_lists_resources_outputs_and_cost():
    proc = run("--stack", "h100x8x2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"resources", "outputs", "cost"} <= set(doc)
    types = [r["type"] for r in doc["resources"]]
    assert types.count("aws:ec2/instance:Instance") == 2
    assert all({"type", "name", "inputs"} <= set(r) for r in doc["resources"])
    assert doc["cost"]["amount"] == 110.08 and doc["cost"]["currency"] == "USD"
    assert len(doc["outputs"]["nodes"]) == 2


def test_plan_prints_a_readable_tree_for_people():
    proc = run("--stack", "a100x4")
    assert proc.returncode == 0, proc.stderr
    assert "ecs.gn7-c13g1.13xlarge" in proc.stdout and "CNY/h" in proc.stdout
    assert "placeholder key" in proc.stdout


def test_invalid_config_exits_2_with_one_line_per_problem_and_nothing_else(tmp_path):
    bad = tmp_path / "Pulumi.broken.yaml"
    bad.write_text(
        "config:\n"
        "  gpufleet:provider: aws\n"
        "  gpufleet:tier: a100x4\n"
        "  gpufleet:nodes: 0\n"
        "  gpufleet:sshCidrs: ['0.0.0.0/0']\n"
    )
    proc = run("--stack-file", str(bad))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = problems(proc.stderr)
    assert len(lines) == 3
    assert lines[0].startswith("gpufleet:tier: aws does not offer tier 'a100x4'")
    assert lines[1].startswith("gpufleet:nodes:") and lines[2].startswith("gpufleet:sshCidrs[0]:")


def test_a_stack_past_a_cloud_limit_exits_2_with_one_line_before_anything_is_planned(tmp_path):
    # 61 SSH networks: 62 inbound rules in one AWS security group, whose quota is 60
    nets = "".join(f"    - 203.0.113.{i}/32\n" for i in range(61))
    bad = tmp_path / "Pulumi.many-networks.yaml"
    bad.write_text(
        "config:\n  gpufleet:provider: aws\n  gpufleet:tier: t4x1\n  gpufleet:sshCidrs:\n" + nets
    )
    proc = run("--stack-file", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = problems(proc.stderr)
    assert line.startswith("gpufleet:sshCidrs: 61 IPv4 networks make 62 inbound IPv4 rules")
    assert "AWS allows 60" in line and "list at most 59 IPv4 networks" in line


def test_unknown_stack_name_gets_a_suggestion():
    proc = run("--stack", "a100x44")
    assert proc.returncode == 2 and "did you mean 'a100x4'" in proc.stderr


def test_component_types_are_printed_as_they_are_not_as_emoji():
    proc = run("--stack", "t4x1")
    assert proc.returncode == 0, proc.stderr
    assert "gpufleet:guard:IdleGuard" in proc.stdout and "💂" not in proc.stdout


def test_a_closed_pipe_ends_the_plan_quietly():
    proc = subprocess.run(
        f"{sys.executable} {PLAN} --stack a100x8 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.stdout.startswith("Previewing update (a100x8)")
    assert proc.stderr == ""


def run_without_wheels(wheelhouse, *args):
    """plan.py in its own process, with the Alicloud function's wheelhouse pointed at a
    folder that has no wheels (as on a checkout where `make fc-wheels` never ran)."""
    code = (
        "import runpy, sys\n"
        "from pathlib import Path\n"
        "import infra.reaper.wheelhouse as wh\n"
        f"wh.WHEELHOUSES = Path({str(wheelhouse)!r})\n"
        f"sys.argv = [{str(PLAN)!r}, *{list(args)!r}]\n"
        f"runpy.run_path({str(PLAN)!r}, run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env
    )


def test_alicloud_plan_without_the_function_wheels_exits_2_with_one_line_naming_the_target(
    tmp_path,
):
    proc = run_without_wheels(tmp_path / "fc-wheels", "--stack", "a100x4")
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = problems(proc.stderr)
    assert "fc-wheels/alicloud: no wheels for the alicloud reaper function" in line
    assert "run `make fc-wheels`" in line and "Traceback" not in proc.stderr


def test_aws_plan_needs_no_function_wheels(tmp_path):
    proc = run_without_wheels(tmp_path / "fc-wheels", "--stack", "t4x1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stack"] == "t4x1"


# The SDK's own words on the instance's charge type (tencentcloud-iac-pulumi 0.2.3,
# instance.InstanceArgs instance_charge_type): which types an International account buys.
INTERNATIONAL_ONLY = re.compile(r"TencentCloud International only supports (.+?)\. ")


def international_charge_types() -> set[str]:
    import tencentcloud_iac_pulumi.instance as tc_instance

    doc = inspect.getdoc(tc_instance.InstanceArgs.__init__) or ""
    found = INTERNATIONAL_ONLY.search(doc)
    assert found, "the SDK no longer says which charge types International accounts buy"
    return set(re.findall(r"`([A-Z_]+)`", found.group(1)))


@pytest.mark.parametrize("stack", ["tencent-t4x1", "tencent-a100x1-monthly", "tencent-a100x4"])
def test_a_tencent_plan_says_when_its_billing_needs_a_china_site_account(stack: str) -> None:
    from infra.clouds.tencent.program import charge_args
    from infra.components.args import billing_of
    from infra.config import load_stack_file
    from infra.offline import PLACEHOLDER_SSH_KEY

    path = ROOT / "stacks" / f"Pulumi.{stack}.yaml"
    cfg = load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    charge_type = charge_args(billing_of(cfg), cfg.instance_type)["instance_charge_type"]
    proc = run("--stack", stack, "--json")
    assert proc.returncode == 0, proc.stderr
    china_only = [n for n in json.loads(proc.stdout)["notes"] if "China-site account" in n]
    if charge_type in international_charge_types():
        assert china_only == []
    else:
        (note,) = china_only
        assert charge_type in note and "International" in note


AUTO_STACK = """config:
  gpufleet:provider: aws
  gpufleet:tier: h100x8
  gpufleet:nodes: 2
  gpufleet:zone: auto
  gpufleet:allowedRegions: [us-east-1, us-west-2]
  gpufleet:sshCidrs: [203.0.113.0/24]
"""


def test_a_zone_auto_plan_says_its_choice_in_one_line_and_lists_the_candidates(
    tmp_path: Path,
) -> None:
    stack = tmp_path / "Pulumi.auto-h100.yaml"
    stack.write_text(AUTO_STACK)
    doc = json.loads(run("--stack-file", str(stack), "--json").stdout)
    chosen = doc["placement"]["chosen"]
    assert chosen == doc["placement"]["candidates"][0]["key"]
    zones = {r["inputs"].get("availabilityZone") for r in doc["resources"]}
    assert chosen.split("/")[2] in zones and len(doc["placement"]["candidates"]) > 1
    human = run("--stack-file", str(stack))
    assert human.returncode == 0, human.stderr
    (line,) = [x for x in human.stdout.splitlines() if "placed: aws" in x]
    assert len(line) <= 80 and chosen.split("/")[2] in line


def test_a_bad_allowed_list_is_refused_in_one_line_before_any_plan(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.auto-h100.yaml"
    stack.write_text(AUTO_STACK.replace("us-west-2]", "us-wset-2]"))
    proc = run("--stack-file", str(stack))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = problems(proc.stderr)
    assert "allowedRegions[1]: 'us-wset-2'" in line and "did you mean 'us-west-2'" in line


# --- assets and archives in plan --json: where, how big, which digest; never the bytes -------


def _walk(value, key=None):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    else:
        yield key, value


def test_an_inline_function_zip_is_shown_by_its_size_and_digest_not_as_base64():
    import base64
    import hashlib

    from infra import reaper_deploy

    proc = run("--stack", "a100x4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) < 200_000  # was 14.8 MB: the zip as base64
    doc = json.loads(proc.stdout)
    (fn,) = [r for r in doc["resources"] if r["type"] == "alicloud:fc/v3Function:V3Function"]
    shown = fn["inputs"]["code"]["zipFile"]["InlineZip"]
    data = reaper_deploy.function_zip("alicloud")
    assert shown == {
        "base64_chars": len(base64.b64encode(data)),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert max(len(v) for _, v in _walk(doc) if isinstance(v, str)) < 10_000


def test_a_file_asset_is_shown_with_its_path_size_and_digest():
    import hashlib

    proc = run("--stack", "azure-a100x1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (blob,) = [r for r in doc["resources"] if "FileAsset" in json.dumps(r["inputs"])]
    shown = blob["inputs"]["source"]["FileAsset"]
    data = Path(shown["path"]).read_bytes()
    assert shown["size"] == len(data) and shown["sha256"] == hashlib.sha256(data).hexdigest()


def test_an_inline_archive_is_shown_member_by_member_with_size_and_digest():
    import hashlib
    import io
    import zipfile

    from infra import reaper_deploy

    proc = run("--stack", "a100x8", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (fn,) = [r for r in doc["resources"] if r["type"] == "aws:lambda/function:Function"]
    members = fn["inputs"]["code"]["AssetArchive"]
    with zipfile.ZipFile(io.BytesIO(reaper_deploy.function_zip("aws"))) as zf:
        want = {
            n: {"StringAsset": {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()}}
            for n in zf.namelist()
            for b in [zf.read(n)]
        }
    assert members == want


def test_an_azure_vm_shows_its_size_priority_and_eviction_in_the_tree():
    proc = run("--stack", "azure-t4x1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "azure-native:compute:VirtualMachine" in line)
    shown = " ".join(line.strip(" │") for line in lines[at + 1 : at + 5])
    assert 'hardwareProfile: {"vmSize": "Standard_NC4as_T4_v3"}' in shown
    assert "priority: Spot" in shown and "evictionPolicy: Deallocate" in shown


# ---------------------------------------------------------------- the hard TTL, said plainly


@functools.cache
def plan_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpufleet_plan_ttl", PLAN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plan_says_in_one_line_when_the_ttl_stops_a_busy_node():
    proc = subprocess.run(
        [sys.executable, str(PLAN), "--stack", "a100x8"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    line = "TTL: each node stops 12 h after it boots, even mid-job (gpufleet:ttlHours)"
    assert line in lines  # x8 tiers: 12 h, on one line of its own
    note = " ".join(x.strip() for x in lines[lines.index(line) :])
    assert "warns a running job 60 and 10 min before the TTL" in note
    assert "fab keep-alive --hours N" in note and "(N <= 336)" in note
    assert max(len(x) for x in lines[lines.index(line) - 1 :]) <= 80


def test_a_plan_with_the_ttl_off_says_so_in_its_json_and_its_line(tmp_path):
    stack = tmp_path / "Pulumi.t4off.yaml"
    stack.write_text((ROOT / "stacks/Pulumi.t4x1.yaml").read_text() + "  gpufleet:ttlHours: 0\n")
    proc = run("--stack-file", str(stack), "--json")
    assert proc.returncode == 0, proc.stderr
    ttl = json.loads(proc.stdout)["ttl"]
    assert (ttl["hours"], ttl["off"], ttl["stops_even_if_busy"]) == (None, True, False)
    assert ttl["line"].startswith("TTL: off (gpufleet:ttlHours is 0)")
    assert "idle rules apply" in ttl["line"]


@pytest.mark.parametrize("hours", [0, 1, 24, 12, 336])
def test_every_ttl_line_fits_80_columns_and_says_what_the_guards_do(hours):
    ttl = plan_module().ttl_summary(hours)
    assert len(ttl["line"]) <= 80 and ttl["line"].startswith("TTL: ")
    if hours:
        assert f"stops {hours} h after it boots, even mid-job" in ttl["line"]
        assert ttl["hours"] == hours and ttl["stops_even_if_busy"]
    else:
        assert ttl["off"] and ttl["hours"] is None


@pytest.mark.parametrize("hours", [337, 720])
def test_a_ttl_the_guards_could_not_read_is_refused_before_anything_is_planned(tmp_path, hours):
    # idle_rules reads a ttlHours tag over 336 as unreadable (the node would be kept as if
    # busy for 14 days): the stack file is refused instead, in one line.
    stack = tmp_path / "Pulumi.t4long.yaml"
    text = (ROOT / "stacks/Pulumi.t4x1.yaml").read_text()
    stack.write_text(text + f"  gpufleet:ttlHours: {hours}\n")
    proc = run("--stack-file", str(stack))
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr
    (line,) = problems(proc.stderr)
    assert "ttlHours" in line and "<= 336" in line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # a traceback (did_you_mean of None): '' read as no --stack-file, then no --stack
        (["--stack-file", ""], "--stack-file '': give the path of a Pulumi.<stack>.yaml file"),
        # silently planned without the policy config
        (
            ["--stack", "t4x1", "--policy-config", ""],
            "--policy-config: '': give the path of a policy pack config (JSON)",
        ),
    ],
)
def test_an_empty_path_is_one_line_and_exit_2(argv: list[str], line: str) -> None:
    proc = run(*argv)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert problems(proc.stderr) == [line]
