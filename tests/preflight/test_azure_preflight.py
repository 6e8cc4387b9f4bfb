"""Azure's preflight through azure-mgmt-compute against a local TLS fake of ARM on
127.0.0.1 (tests/preflight/azure_fake.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.mgmt.compute import models

from infra import preflight
from infra.clouds.azure import preflight as azure
from infra.clouds.azure import prices as azure_prices
from infra.preflight import FAIL, INFO, NOT_CHECKED, OK, UNKNOWN, Need
from tests.preflight.azure_fake import CONTRIBUTOR, FAMILY, SIZE, SUB, AzureFake, usage

CLOSED = "https://127.0.0.1:9"  # nothing listens: a request fails at once, on loopback


def need(**kw: Any) -> Need:
    base = Need(
        stack="azure-t4x1",
        provider="azure",
        region="eastus",
        zone=None,
        instance_type=SIZE,
        nodes=2,
        vcpus=4,
        gpus=1,
        billing="spot",
    )
    return dataclasses.replace(base, **kw)


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureFake]:
    with AzureFake().running(tmp_path) as f:
        monkeypatch.setenv("GPUFLEET_AZURE_ARM_ENDPOINT", f.endpoint)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(f.ca))  # requests' documented setting
        monkeypatch.setenv("GPUFLEET_AZURE_ACCESS_TOKEN", f.token)
        monkeypatch.setenv("GPUFLEET_AZURE_SUBSCRIPTION_ID", SUB)
        monkeypatch.setenv(azure_prices.URL_ENV, CLOSED)
        yield f


def by_name(report: preflight.Report) -> dict[str, preflight.Check]:
    return {c.name: c for c in report.checks}


def members(cls: type) -> set[str]:
    out = set()
    for c in cls.__mro__:
        for attr, value in vars(c).items():
            if hasattr(value, "_rest_name_input"):
                out.add(value._rest_name_input or attr)
    return out


def test_the_fake_answers_only_members_of_the_sdk_s_own_models():
    f = AzureFake()
    for row in f.usages["eastus"]:
        assert set(row) <= members(models.Usage)
        assert set(row["name"]) <= members(models.UsageName)
        parsed = models.Usage(row)  # the SDK reads it back
        assert parsed.limit == row["limit"] and parsed.name.value == row["name"]["value"]
    assert set(f.skus[0]) <= members(models.ResourceSku)
    image = {"name": "v", "location": "eastus", "id": "/x"}
    assert set(image) <= members(models.VirtualMachineImageResource)


def test_a_subscription_with_quota_passes(fake):
    report = preflight.run(need())
    got = by_name(report)
    assert got["identity"].state == OK
    assert SUB in got["identity"].detail and "ada@example.org" in got["identity"].detail
    assert got["quota spot"].state == OK
    assert got["quota spot"].detail.startswith("Total Regional Low-priority vCPUs: 24 of 24")
    assert got["quota on-demand"].state == INFO
    assert got["image"].state == OK and "22.04.202411010" in got["image"].detail
    assert got["permissions"].state == OK
    assert got["permissions"].detail.startswith(f"all {len(azure.ACTIONS)} actions")
    assert "NetworkWatcherRG (not the stack's own yet)" in got["permissions"].detail
    assert got["bucket"].state == OK and got["bucket"].detail.endswith(": free")
    assert got["offered"].state == OK
    paths = [r["path"] for r in fake.seen]
    assert paths[0] == f"/subscriptions/{SUB}"
    assert f"/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/usages" in paths


def test_a_short_spot_quota_fails_with_the_portal_request(fake):
    fake.usages["eastus"][2] = usage("lowPriorityCores", "Total Regional Low-priority vCPUs", 4, 8)
    report = preflight.run(need())
    q = by_name(report)["quota spot"]
    assert q.state == FAIL and "4 of 8 free; the stack needs 8 (2 x 4)" in q.detail
    assert "Enter a new limit: 12" in q.fix
    assert report.status == 1


def test_a_short_family_quota_fails_with_the_exact_az_quota_request(fake):
    fake.usages["eastus"][1] = usage(FAMILY, "Standard NCASv3_T4 Family vCPUs", 0, 0)
    q = by_name(preflight.run(need(billing="on-demand")))["quota on-demand"]
    assert q.state == FAIL
    assert "Standard NCASv3_T4 Family vCPUs: 0 of 0 free" in q.detail
    assert "Total Regional vCPUs: 100 of 100 free" in q.detail
    assert (
        f"`az quota update --resource-name {FAMILY} --scope /subscriptions/{SUB}/providers/"
        "Microsoft.Compute/locations/eastus --limit-object value=8 --resource-type dedicated`"
    ) in q.fix
    assert "--resource-name cores" not in q.fix


def test_the_regional_total_counts_for_on_demand_too(fake):
    fake.usages["eastus"][0] = usage("cores", "Total Regional vCPUs", 10, 12)
    q = by_name(preflight.run(need(billing="on-demand")))["quota on-demand"]
    assert q.state == FAIL and "--resource-name cores" in q.fix and "value=18" in q.fix


def test_a_disabled_subscription_is_told(fake):
    fake.state = "Disabled"
    ident = by_name(preflight.run(need()))["identity"]
    assert ident.state == FAIL and ident.detail.endswith("the subscription is Disabled")


def test_a_caller_who_may_not_read_usages_is_one_unknown_line(fake):
    fake.denied.add("usages")
    q = by_name(preflight.run(need()))["quota"]
    assert q.state == UNKNOWN and q.detail.startswith("ARM Compute Usages in eastus:")
    assert "AuthorizationFailed" in q.detail and "\n" not in q.detail


def test_a_region_without_the_image_fails(fake):
    fake.images = []
    assert by_name(preflight.run(need()))["image"].state == FAIL


def test_a_region_where_the_size_is_not_sold_fails_offered(fake):
    fake.skus = []
    got = by_name(preflight.run(need()))
    assert got["offered"].state == FAIL
    assert got["quota on-demand"].state == INFO  # the family is unknown; not judged on spot


def test_no_credentials_is_one_line_each(fake, monkeypatch):
    monkeypatch.delenv("GPUFLEET_AZURE_ACCESS_TOKEN")
    got = by_name(preflight.run(need()))
    assert got["identity"].state == UNKNOWN and got["identity"].detail == "no Azure credentials"
    assert got["quota"].detail == "not asked: no identity" and fake.seen == []


def test_no_network_is_said_and_nothing_raises(fake, monkeypatch):
    monkeypatch.setenv("GPUFLEET_AZURE_ARM_ENDPOINT", CLOSED)
    got = by_name(preflight.run(need()))
    assert got["identity"].state == UNKNOWN
    assert got["identity"].detail.startswith("ARM Subscriptions - Get:")


def test_the_token_s_caller_is_read_from_its_claims_without_failing_on_junk():
    assert azure.token_caller("not-a-jwt") == ""
    assert azure.token_caller("a.b!.c") == ""


# -- permissions: Permissions - List For Resource Group, matched as role-definitions.md says


def test_contributor_alone_lacks_the_role_writes_and_the_fix_says_which(fake):
    fake.permissions = [CONTRIBUTOR]  # notActions Microsoft.Authorization/*/Write
    p = by_name(preflight.run(need()))["permissions"]
    assert p.state == FAIL
    assert p.detail.startswith(f"2 of {len(azure.ACTIONS)} actions missing")
    assert "Microsoft.Authorization/roleDefinitions/write" in p.detail
    assert "Microsoft.Authorization/roleAssignments/write" in p.detail
    assert "User Access Administrator" in p.fix and "\n" not in p.detail


def test_a_not_action_is_no_deny_across_rows():
    rows = [CONTRIBUTOR, {"actions": ["Microsoft.Authorization/roleAssignments/write"]}]
    assert azure.allowed(rows, "Microsoft.Authorization/roleAssignments/write")
    assert not azure.allowed(rows, "Microsoft.Authorization/roleDefinitions/write")
    assert azure.allowed([CONTRIBUTOR], "microsoft.compute/VIRTUALMACHINES/write")  # no case
    mid = [{"actions": ["Microsoft.Network/*/write"], "notActions": []}]
    assert azure.allowed(mid, "Microsoft.Network/virtualNetworks/subnets/write")
    assert not azure.allowed(mid, "Microsoft.Network/networkInterfaces/join/action")
    assert not azure.allowed([{"dataActions": ["*"]}], "Microsoft.Compute/disks/write")
    assert azure.allowed([{"dataActions": ["*"]}], "Microsoft.Storage/x/blobs/read", data=True)


def test_a_reader_misses_every_action(fake):
    fake.permissions = [{"actions": ["*/read"], "notActions": []}]
    p = by_name(preflight.run(need()))["permissions"]
    n = len(azure.ACTIONS)
    assert p.state == FAIL and p.detail.startswith(f"{n} of {n} actions missing")
    assert f"and {n - 3} more" in p.detail


def test_the_stack_s_own_group_is_asked_when_it_exists(fake):
    fake.groups = ["aaa-other", "gpufleet-azure-t4x1"]
    p = by_name(preflight.run(need()))["permissions"]
    assert p.state == OK and p.detail.endswith("at resource group gpufleet-azure-t4x1")
    asked = [r["path"] for r in fake.seen if r["path"].endswith("/permissions")]
    assert asked == [
        f"/subscriptions/{SUB}/resourcegroups/gpufleet-azure-t4x1/providers/"
        "Microsoft.Authorization/permissions"
    ]


def test_no_resource_group_is_not_checked_and_a_denied_list_is_unknown(fake):
    fake.groups = []
    assert by_name(preflight.run(need()))["permissions"].state == NOT_CHECKED
    fake.groups = ["rg"]
    fake.denied.add("permissions")
    p = by_name(preflight.run(need()))["permissions"]
    assert p.state == UNKNOWN and "AuthorizationFailed" in p.detail


# -- the storage account's name: Check Name Availability


def test_a_taken_account_name_fails_and_a_bad_one_says_why(fake):
    fake.taken = {"gpfazuret4x1*"}
    b = by_name(preflight.run(need()))["bucket"]
    assert b.state == FAIL and "AlreadyExists" in b.detail and "gpfazuret4x1" in b.detail
    names = [r for r in fake.seen if r["path"].endswith("/checkNameAvailability")]
    assert len(names) == 1
    fake.taken = set()
    b = by_name(preflight.run(need(stack="UPPER")))["bucket"]
    assert b.state == FAIL and "AccountNameInvalid" in b.detail


# -- --request-quota: Azure's requests are printed, never filed


def test_request_quota_prints_the_az_quota_step_and_files_nothing(fake):
    fake.usages["eastus"][1] = usage(FAMILY, "Standard NCASv3_T4 Family vCPUs", 0, 0)
    report = preflight.run(need(billing="on-demand"))
    said: list[str] = []
    asked: list[str] = []

    def yes(question: str) -> bool:
        asked.append(question)
        return True

    status = preflight.file_requests(report, yes, said.append)
    assert status == 0 and asked == []
    assert said[0].startswith("quota on-demand: azure takes this request by hand: `az quota")
    assert "az extension add --name quota" in said[0]
    assert not [r for r in fake.seen if r["method"] != "GET" and "Quota" in r["path"]]
