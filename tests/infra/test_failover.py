"""infra/failover.py and scripts/up.py: `make up` fails over through the engine seam.

The engine is a fake that keeps the stack's nodes and zones as the state would; its failures
are pulumi.automation's own CommandError (the installed SDK's errors.create_command_error on
a CommandResult, so str() is what the Automation API raises), with a stdout laid out as the
CLI prints a failed update: the resource lines, then "Diagnostics:" with one block per
failed resource ("  <type> (<name>):" then "    error: ..."), as recorded in
https://github.com/pulumi/pulumi/issues/12942 and https://github.com/pulumi/pulumi/issues/6041.
The provider error inside is quoted from the clouds' issue trackers (each cited beside it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import CommandError, create_command_error

from infra import failover
from infra.config import parse_config
from infra.placement import Candidate
from tests.support.stderr import problems

# https://github.com/hashicorp/terraform-provider-aws/issues/15183 (the provider pulumi-aws
# wraps), with the zone and type of the attempt put in
AWS_FULL = (
    "creating EC2 Instance: InsufficientInstanceCapacity: We currently do not have "
    "sufficient {itype} capacity in the Availability Zone you requested ({zone}). Our system "
    "will be working on provisioning additional capacity. You can currently get {itype} "
    "capacity by not specifying an Availability Zone in your request or choosing us-east-1b."
)
# https://github.com/hashicorp/terraform-provider-aws/issues/9113: the region does not offer
# the configuration; "Unsupported" without the zone's words is not capacity
AWS_UNSUPPORTED = (
    "Error launching source instance: Unsupported: The requested configuration is currently "
    "not supported. Please check the documentation for supported configurations."
)
# https://github.com/bentoml/bentoctl/issues/202: a quota, not a full zone
AWS_QUOTA = (
    "creating EC2 Instance: VcpuLimitExceeded: You have requested more vCPU capacity than "
    "your current vCPU limit of 32 allows for the instance bucket that the specified "
    "instance type belongs to."
)
# https://github.com/openshift/release/pull/5182
AZURE_FULL = (
    'Code="ZonalAllocationFailed" Message="Allocation failed. We do not have sufficient '
    "capacity for the requested VM size in this zone. Read more about improving likelihood "
    'of allocation success at http://aka.ms/allocation-guidance"'
)


def engine_error(stack: str, rtype: str, name: str, message: str) -> str:
    """str() of the CommandError the Automation API raises for a failed `up`."""
    stdout = (
        f"Updating ({stack})\n\n"
        f" +  pulumi:pulumi:Stack gpufleet-{stack} creating (0s)\n"
        f" +  {rtype} {name} creating (2s) error: {message}\n"
        f" +  {rtype} {name} **creating failed** error: {message}\n"
        f"    pulumi:pulumi:Stack gpufleet-{stack} **failed** 1 error\n"
        "Diagnostics:\n"
        f"  {rtype} ({name}):\n"
        f"    error: {message}\n\n"
        "Resources:\n    + 9 created\n    1 errored\n\nDuration: 14s\n"
    )
    err = create_command_error(CommandResult(stdout, "", 255))
    assert type(err) is CommandError  # not one of the SDK's named kinds
    return str(err)


@dataclass
class Fake:
    """The engine seam over a stack's state: nodes by name -> zone, the config's placement."""

    nodes: int
    script: dict[str, list[str]] = field(default_factory=dict)  # key -> outcomes, in turn
    state: dict[str, str] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def update(self, c: Candidate) -> None:
        self.calls.append(("update", c.key))
        todo = self.script.get(c.key, [])
        outcome = todo.pop(0) if todo else "ok"
        zone = c.zone or "-"
        if outcome == "ok":
            # the zone is an input the cloud cannot change in place: every node is replaced
            self.state = {f"node-{i}": zone for i in range(self.nodes)}
            self.state["subnet"] = zone
            return
        made = int(outcome.split(":")[1]) if ":" in outcome else 0
        self.state["subnet"] = zone
        for i in range(made):  # a partial success: the first nodes made in this zone
            self.state[f"node-{i}"] = zone
        if outcome.startswith("interrupt"):
            raise KeyboardInterrupt
        kind = outcome.split(":")[0]
        message = {
            "aws-full": AWS_FULL,
            "aws-quota": AWS_QUOTA,
            "aws-unsupported": AWS_UNSUPPORTED,
            "azure-full": AZURE_FULL,
        }[kind].format(itype=c.instance_type, zone=zone)
        rtype = "azure-native:compute:VirtualMachine" if kind.startswith("azure") else (
            "aws:ec2:Instance"
        )  # fmt: skip
        raise failover.UpdateFailed(engine_error("s", rtype, f"s-node-{made}", message))

    def destroy(self) -> None:
        self.calls.append(("destroy", ""))
        self.state.clear()

    def refresh(self) -> None:
        self.calls.append(("refresh", ""))

    def resource_count(self) -> int:
        return len(self.state)

    def recorded(self) -> str | None:
        return self.config.get("placement")

    def record(self, key: str | None) -> None:
        if key is None:
            self.config.pop("placement", None)
        else:
            self.config["placement"] = key

    def node_zones(self) -> set[str]:
        return {z for k, z in self.state.items() if k.startswith("node-")}


def placement(nodes: int = 1, **extra: Any):
    raw = {
        "provider": "aws",
        "tier": "a10x1",
        "region": "us-east-1",
        "zone": "auto",
        "nodes": nodes,
        "sshCidrs": ["203.0.113.0/24"],
        **extra,
    }
    if nodes > 1:
        raw["tier"] = "h100x8"
    p = parse_config(raw, "s").placement
    assert p is not None
    return p


def run(p, fake: Fake, tmp_path: Path) -> tuple[int, list[str], list[dict[str, Any]]]:
    said: list[str] = []
    log = failover.Log(tmp_path / ".gpufleet" / "s-up.jsonl")
    code = failover.up(p, fake, log, said.append)
    rows = [json.loads(x) for x in log.path.read_text().splitlines()]
    return code, said, rows


def test_a_full_zone_moves_to_the_next_zone_and_records_where_it_landed(tmp_path: Path) -> None:
    p = placement()
    first, second = p.order()[0], p.order()[1]
    assert (first.region, first.instance_type) == (second.region, second.instance_type)
    fake = Fake(1, {first.key: ["aws-full"]})
    code, said, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_LANDED
    assert fake.config["placement"] == second.key and fake.node_zones() == {second.zone}
    assert said[1].startswith("attempt 1/") and "capacity: InsufficientInstanceCapacity" in said[1]
    assert f"next aws {second.zone}" in said[1]
    outcomes = [(r["candidate"], r["outcome"]) for r in rows]
    assert outcomes == [
        (first.key, "started"),
        (first.key, "capacity"),
        (second.key, "started"),
        (second.key, "landed"),
    ]
    assert rows[1]["code"] == "InsufficientInstanceCapacity"


def test_a_type_out_in_every_zone_moves_to_the_sibling_type_with_the_same_gpus(
    tmp_path: Path,
) -> None:
    p = placement()
    first_type = p.order()[0].instance_type
    out = {c.key: ["aws-full"] for c in p.order() if c.instance_type == first_type}
    sibling = next(c for c in p.order() if c.instance_type != first_type)
    assert sibling.region == p.order()[0].region  # a sibling type before another region
    fake = Fake(1, out)
    code, _, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_LANDED and fake.config["placement"] == sibling.key
    assert [r["outcome"] for r in rows].count("capacity") == len(out)


def test_all_out_exits_clearly_and_leaves_nothing(tmp_path: Path) -> None:
    p = placement(allowedRegions=["us-east-1", "us-west-2"])
    fake = Fake(1, {c.key: ["aws-full:1"] for c in p.order()})
    code, said, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_ALL_OUT
    assert fake.state == {} and "placement" not in fake.config
    assert ("destroy", "") in fake.calls
    assert said[-1].startswith("nothing is left")
    assert rows[-1] == {**rows[-1], "outcome": "all-out", "action": "destroyed"}
    assert [r["outcome"] for r in rows].count("capacity") == len(p.order())


def test_a_multi_node_partial_success_is_replaced_in_the_next_zone_never_split(
    tmp_path: Path,
) -> None:
    p = placement(nodes=2)
    first, second = p.order()[0], p.order()[1]
    fake = Fake(2, {first.key: ["aws-full:1"]})  # node-0 made in the first zone, node-1 not
    seen: list[set[str]] = []
    real_update = fake.update

    def update(c: Candidate) -> None:
        try:
            real_update(c)
        finally:
            seen.append(fake.node_zones())

    fake.update = update  # type: ignore[method-assign]
    code, _, _ = run(p, fake, tmp_path)
    assert seen[0] == {first.zone}  # the partial success: one node in the full zone
    assert code == failover.EXIT_LANDED
    assert fake.node_zones() == {second.zone}
    assert len([k for k in fake.state if k.startswith("node-")]) == 2


def test_a_multi_node_stack_that_finds_no_zone_is_destroyed_not_left_split(
    tmp_path: Path,
) -> None:
    p = placement(nodes=2)
    fake = Fake(2, {c.key: ["aws-full:1"] for c in p.order()})
    code, _, _ = run(p, fake, tmp_path)
    assert code == failover.EXIT_ALL_OUT and fake.node_zones() == set()


def test_ctrl_c_is_logged_and_the_next_run_refreshes_and_finishes_there(
    tmp_path: Path,
) -> None:
    p = placement()
    first = p.order()[0]
    fake = Fake(1, {first.key: ["interrupt:1"]})
    code, said, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_INTERRUPTED and rows[-1]["outcome"] == "interrupted"
    assert "next `make up` refreshes" in said[-1]
    fake.calls.clear()
    code, _, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_LANDED
    assert fake.calls == [("refresh", ""), ("update", first.key)]
    assert fake.node_zones() == {first.zone} and rows[-1]["outcome"] == "landed"


def test_a_run_killed_mid_update_is_finished_by_the_next_as_after_ctrl_c(
    tmp_path: Path,
) -> None:
    p = placement()
    second = p.order()[1]
    log = failover.Log(tmp_path / ".gpufleet" / "s-up.jsonl")
    log.write(attempt=2, candidate=second.key, outcome="started")  # then SIGKILL
    fake = Fake(1)
    code, _, _ = run(p, fake, tmp_path)
    assert code == failover.EXIT_LANDED
    assert fake.calls[:2] == [("refresh", ""), ("update", second.key)]


@pytest.mark.parametrize("kind", ["aws-quota", "aws-unsupported"])
def test_a_non_capacity_error_stops_at_once_with_exit_1(kind: str, tmp_path: Path) -> None:
    p = placement()
    first = p.order()[0]
    fake = Fake(1, {first.key: [kind]})
    code, said, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_ERROR
    assert [c for c in fake.calls if c[0] == "update"] == [("update", first.key)]
    assert ("destroy", "") not in fake.calls
    assert said[1].startswith("attempt 1/") and "stopped, not capacity" in said[1]
    assert rows[-1]["outcome"] == "error"


def test_another_clouds_capacity_code_moves_on_to_the_next_cloud(tmp_path: Path) -> None:
    p = placement(
        tier="a100x8", allowedClouds=["azure", "aws"], allowedRegions=["eastus", "us-east-1"]
    )
    azure = [c for c in p.order() if c.provider == "azure"]
    fake = Fake(1, {c.key: ["azure-full"] for c in azure})
    code, _, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_LANDED and fake.config["placement"].startswith("aws/")
    assert {r.get("code") for r in rows if r["outcome"] == "capacity"} == {"ZonalAllocationFailed"}


def test_a_stack_that_had_landed_is_put_back_when_all_are_out(tmp_path: Path) -> None:
    p = placement()
    fake = Fake(1, {c.key: ["aws-full"] for c in p.order()})
    home = p.order()[2]
    fake.state = {"node-0": home.zone or "-", "subnet": home.zone or "-"}
    fake.config["placement"] = home.key
    fake.script[home.key] = ["aws-full", "ok"]  # full in the loop, fine on the way back
    code, _, rows = run(p, fake, tmp_path)
    assert code == failover.EXIT_ALL_OUT
    assert fake.config["placement"] == home.key and fake.node_zones() == {home.zone}
    assert rows[-1]["action"] == "restored" and ("destroy", "") not in fake.calls


def test_up_refuses_a_bad_stack_in_one_line_before_any_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts import up

    (tmp_path / "Pulumi.bad.yaml").write_text(
        "config:\n  gpufleet:provider: aws\n  gpufleet:tier: a10x1\n  gpufleet:zone: auto\n"
        "  gpufleet:allowedClouds: [aws, azur]\n  gpufleet:sshCidrs: [203.0.113.0/24]\n"
    )
    monkeypatch.setattr(up, "STACKS_DIR", tmp_path)

    def no_engine(stack: str) -> Fake:
        raise AssertionError("no engine may start for a bad stack")

    assert up.main(["--stack", "bad"], engine_for=no_engine) == up.EXIT_INVALID
    (line,) = problems(capsys.readouterr().err)
    assert line.startswith("gpufleet:allowedClouds[1]: 'azur'")


def test_up_logs_beside_the_stack_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scripts import up

    (tmp_path / "Pulumi.ok.yaml").write_text(
        "config:\n  gpufleet:provider: aws\n  gpufleet:tier: a10x1\n  gpufleet:zone: auto\n"
        "  gpufleet:sshCidrs: [203.0.113.0/24]\n"
    )
    monkeypatch.setattr(up, "STACKS_DIR", tmp_path)
    fake = Fake(1)
    assert up.main(["--stack", "ok"], engine_for=lambda _s: fake) == failover.EXIT_LANDED
    rows = (tmp_path / ".gpufleet" / "ok-up.jsonl").read_text().splitlines()
    assert json.loads(rows[-1])["outcome"] == "landed" and fake.config["placement"]


def test_a_pinned_stack_is_tried_once_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripts import up

    (tmp_path / "Pulumi.pin.yaml").write_text(
        "config:\n  gpufleet:provider: aws\n  gpufleet:tier: a10x1\n"
        "  gpufleet:zone: us-east-1b\n  gpufleet:sshCidrs: [203.0.113.0/24]\n"
    )
    monkeypatch.setattr(up, "STACKS_DIR", tmp_path)
    fake = Fake(1)
    fake.script = {"aws/us-east-1/us-east-1b/g5.xlarge": ["aws-full"]}
    code = up.main(["--stack", "pin"], engine_for=lambda _s: fake)
    assert code == failover.EXIT_ALL_OUT and fake.config == {}
    assert [c for c in fake.calls if c[0] == "update"] == [
        ("update", "aws/us-east-1/us-east-1b/g5.xlarge")
    ]


def test_the_live_signal_skips_a_sold_out_zone_before_any_update(tmp_path: Path) -> None:
    from infra.clouds.availability import AVAILABLE, SOLD_OUT, ZoneSignal

    p = placement()
    first, second = p.order()[0], p.order()[1]
    asked: list[tuple[str, list[str]]] = []

    def live_zones(itype: str, regions: list[str]) -> list[ZoneSignal]:
        asked.append((itype, list(regions)))
        if itype != first.instance_type:
            return []
        return [
            ZoneSignal(first.region, first.zone or "", SOLD_OUT, None, "WithoutStock"),
            ZoneSignal(second.region, second.zone or "", AVAILABLE),
        ]

    skip = failover.live_screen(p.candidates, lambda provider: live_zones)
    assert skip == {first.key: "live signal: sold out (WithoutStock)"}
    assert {t for t, _ in asked} == {c.instance_type for c in p.candidates}
    fake = Fake(1)
    said: list[str] = []
    log = failover.Log(tmp_path / "s-up.jsonl")
    assert failover.up(p, fake, log, said.append, skip=skip) == failover.EXIT_LANDED
    assert [c for c in fake.calls if c[0] == "update"] == [("update", second.key)]
    assert said[0].startswith(f"skip aws {first.zone}") and "sold out" in said[0]


def test_a_live_signal_that_fails_skips_nothing_and_says_why() -> None:
    from infra.clouds.availability import NoSignal

    def live_zones(itype: str, regions: list[str]) -> list[Any]:
        raise NoSignal("no AWS credentials")

    said: list[str] = []
    assert failover.live_screen(placement().candidates, lambda _p: live_zones, said.append) == {}
    assert said == ["live signal of aws: no AWS credentials; its candidates are tried as planned"]
