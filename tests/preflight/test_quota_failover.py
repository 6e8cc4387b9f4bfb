"""`make up --quota`: a `zone: auto` stack skips the places where the account's quota is
short (each cloud's preflight quota check, against the local fakes on 127.0.0.1), and the
failover log says for each place why it was skipped or failed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import failover
from infra.config import parse_config
from infra.preflight import quota_asker
from tests.infra.test_failover import Fake
from tests.preflight.azure_fake import SUB, AzureFake, sku, usage
from tests.preflight.tencent_fake import TencentFake, quota_row

TENCENT_STACK = (
    "config:\n  gpufleet:provider: tencent\n  gpufleet:tier: t4x1\n"
    "  gpufleet:region: ap-guangzhou\n  gpufleet:zone: auto\n  gpufleet:billing: spot\n"
    "  gpufleet:sshCidrs: [203.0.113.0/24]\n"
)


@pytest.fixture()
def tencent(monkeypatch: pytest.MonkeyPatch) -> Iterator[TencentFake]:
    with TencentFake() as f:
        monkeypatch.setenv("TENCENTCLOUD_SECRET_ID", "AKIDtesting")
        monkeypatch.setenv("TENCENTCLOUD_SECRET_KEY", "testing")
        monkeypatch.setenv("TENCENTCLOUD_CVM_ENDPOINT", f.endpoint)
        monkeypatch.setenv("TENCENTCLOUD_STS_ENDPOINT", f.endpoint)
        yield f


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_make_up_skips_a_zone_whose_spot_quota_is_short_and_lands_in_the_next(
    tencent: TencentFake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scripts import up

    (tmp_path / "Pulumi.tq.yaml").write_text(TENCENT_STACK)
    monkeypatch.setattr(up, "STACKS_DIR", tmp_path)
    tencent.spot_paid = [
        quota_row("ap-guangzhou-2", 4, 4),  # none left
        quota_row("ap-guangzhou-3", 30, 0),
    ]
    fake = Fake(1)
    code = up.main(["--stack", "tq", "--quota"], engine_for=lambda _s: fake)
    assert code == failover.EXIT_LANDED
    updates = [k for kind, k in fake.calls if kind == "update"]
    assert updates == ["tencent/ap-guangzhou/ap-guangzhou-3/GN7.2XLARGE32"]
    out = capsys.readouterr().out.splitlines()
    (line,) = [x for x in out if x.startswith("skip tencent ap-guangzhou-2 GN7.2XLARGE32:")]
    assert line.startswith("skip tencent ap-guangzhou-2 GN7.2XLARGE32: quota spot short: ")
    assert "0 instances left of 4" in line and "fix: ask for more" in line
    # zones 6 and 7 answer no quota row: said per place, and tried as planned
    said = "\n".join(out)
    assert "quota at tencent ap-guangzhou-6 GN7.2XLARGE32: SpotPaidQuotaSet: no row" in said
    log = rows(tmp_path / ".gpufleet" / "tq-up.jsonl")
    skipped = {r["candidate"]: r["reason"] for r in log if r["outcome"] == "skipped"}
    assert set(skipped) == {
        "tencent/ap-guangzhou/ap-guangzhou-2/GN7.2XLARGE32",
        "tencent/ap-guangzhou/ap-guangzhou-2/GN7.5XLARGE80",
    }
    assert log[-1]["outcome"] == "landed"
    asked = [p for a, p in tencent.requests if a == "DescribeAccountQuota"]
    assert len(asked) == 8  # once per (zone, type): the quota is counted per zone


@pytest.fixture()
def azure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureFake]:
    f = AzureFake()
    f.skus.append(sku("Standard_NC4as_T4_v3", "westus2", "standardNCASv3_T4Family", ["1"]))
    f.usages["westus2"] = [
        usage("cores", "Total Regional vCPUs", 0, 100),
        usage("lowPriorityCores", "Total Regional Low-priority vCPUs", 0, 100),
    ]
    f.usages["eastus"][2] = usage("lowPriorityCores", "Total Regional Low-priority vCPUs", 0, 0)
    with f.running(tmp_path) as running:
        monkeypatch.setenv("GPUFLEET_AZURE_ARM_ENDPOINT", running.endpoint)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(running.ca))
        monkeypatch.setenv("GPUFLEET_AZURE_ACCESS_TOKEN", running.token)
        monkeypatch.setenv("GPUFLEET_AZURE_SUBSCRIPTION_ID", SUB)
        yield running


def azure_stack(**extra: Any) -> Any:
    raw = {
        "provider": "azure",
        "tier": "t4x1",
        "region": "eastus",
        "zone": "auto",
        "billing": "spot",
        "allowedRegions": ["eastus", "westus2"],
        "sshCidrs": ["203.0.113.0/24"],
        **extra,
    }
    return parse_config(raw, "az")


def test_a_region_without_spot_quota_is_skipped_whole_and_the_next_region_tried(
    azure: AzureFake, tmp_path: Path
) -> None:
    cfg = azure_stack()
    said: list[str] = []
    skip = failover.quota_screen(cfg.placement.candidates, quota_asker(cfg), said.append)
    assert said == []
    assert {k.split("/")[1] for k in skip} == {"eastus"} and len(skip) == 6
    reason = skip["azure/eastus/1/Standard_NC4as_T4_v3"]
    assert reason.startswith("quota spot short: Total Regional Low-priority vCPUs: 0 of 0")
    usages = [r for r in azure.seen if r["path"].endswith("/usages")]
    assert len(usages) == 4  # once per (region, type), never per zone
    fake = Fake(1)
    log = failover.Log(tmp_path / "az-up.jsonl")
    assert failover.up(cfg.placement, fake, log, said.append, skip=skip) == 0
    assert [k for kind, k in fake.calls if kind == "update"] == [
        "azure/westus2/1/Standard_NC4as_T4_v3"
    ]


def test_when_every_place_is_short_nothing_is_tried_and_each_place_says_why(
    azure: AzureFake, tmp_path: Path
) -> None:
    spot = usage("lowPriorityCores", "Total Regional Low-priority vCPUs", 2, 4)
    azure.usages["westus2"][1] = spot
    cfg = azure_stack()
    skip = failover.quota_screen(cfg.placement.candidates, quota_asker(cfg))
    fake = Fake(1)
    said: list[str] = []
    log = failover.Log(tmp_path / "az-up.jsonl")
    assert failover.up(cfg.placement, fake, log, said.append, skip=skip) == failover.EXIT_ALL_OUT
    assert fake.calls == []  # no update, no destroy: nothing was made
    tail = said[said.index("every place was skipped, and why:") + 1 :]
    assert len(tail) == 12 and all(": skipped, quota spot short: " in x for x in tail)
    assert any("2 of 4 free" in x for x in tail) and any("0 of 0 free" in x for x in tail)
    last = rows(log.path)[-1]
    assert last["outcome"] == "all-out" and len(last["why"]) == 12


def test_capacity_failures_and_quota_skips_are_both_in_the_last_word(
    azure: AzureFake, tmp_path: Path
) -> None:
    cfg = azure_stack()
    skip = failover.quota_screen(cfg.placement.candidates, quota_asker(cfg))
    fake = Fake(1)
    fake.script = {c.key: ["azure-full"] for c in cfg.placement.candidates}
    said: list[str] = []
    log = failover.Log(tmp_path / "az-up.jsonl")
    assert failover.up(cfg.placement, fake, log, said.append, skip=skip) == failover.EXIT_ALL_OUT
    tail = said[said.index("every place, and why:") + 1 :][:12]
    assert all(x.startswith("  azure ") for x in tail)
    assert sum("skipped, quota spot short" in x for x in tail) == 6
    assert sum("failed, capacity: ZonalAllocationFailed" in x for x in tail) == 6
    places = [r for r in rows(log.path) if r["outcome"] == "places"]
    assert len(places) == 1 and len(places[0]["why"]) == 12


def test_a_quota_that_cannot_be_asked_skips_nothing_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("GPUFLEET_AZURE_ACCESS_TOKEN", "GPUFLEET_AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(name, raising=False)
    cfg = azure_stack()
    said: list[str] = []
    assert failover.quota_screen(cfg.placement.candidates, quota_asker(cfg), said.append) == {}
    assert said == ["quota of azure: no Azure credentials; its candidates are tried as planned"]
