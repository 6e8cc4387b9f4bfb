"""The Azure program under Pulumi's mocks: what each shipped Azure stack declares, and the
bad Azure inputs refused before any resource exists."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest

from infra.catalog import load_catalog
from infra.clouds.azure import program as azure
from infra.config import ConfigError, load_stack_file, parse_config
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from infra.reaper import tags as T

STACKS = Path(__file__).resolve().parents[2] / "stacks"
VM = "azure-native:compute:VirtualMachine"
NSG = "azure-native:network:NetworkSecurityGroup"
ACCOUNT = "azure-native:storage:StorageAccount"
CONTAINER = "azure-native:storage:BlobContainer"
ROLE = "azure-native:authorization:RoleDefinition"
ASSIGNMENT = "azure-native:authorization:RoleAssignment"
APP = "azure-native:web:WebApp"
PPG = "azure-native:compute:ProximityPlacementGroup"
AVSET = "azure-native:compute:AvailabilitySet"


def stack(name: str, **overrides: Any) -> PlanResult:
    cfg = load_stack_file(STACKS / f"Pulumi.{name}.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    if overrides:
        raw = {
            "provider": cfg.provider,
            "tier": cfg.tier,
            "region": cfg.region,
            "sshCidrs": list(cfg.ssh_cidrs),
            "billing": cfg.billing,
            "sshPublicKey": PLACEHOLDER_SSH_KEY,
            **overrides,
        }
        cfg = parse_config(raw, name)
    return evaluate(cfg)


@pytest.fixture(scope="module")
def t4() -> PlanResult:
    return stack("azure-t4x1")


@pytest.fixture(scope="module")
def h100_pair() -> PlanResult:
    return stack("azure-h100x8", nodes=2, maxHourlyCost=250)


def test_the_spot_dev_box_deallocates_on_eviction_and_never_deletes(t4: PlanResult):
    (vm,) = t4.of_type(VM)
    assert vm.inputs["priority"] == "Spot"
    assert vm.inputs["evictionPolicy"] == "Deallocate"
    assert vm.inputs["billingProfile"]["maxPrice"] == -1  # up to on-demand, never above


def test_a_spot_max_price_from_config_becomes_the_vm_max_price():
    result = stack("azure-t4x1", spotMaxPrice="0.3")
    (vm,) = result.of_type(VM)
    assert vm.inputs["billingProfile"]["maxPrice"] == pytest.approx(0.3)


def test_the_vm_size_is_the_catalog_offer_for_the_tier(t4: PlanResult):
    (vm,) = t4.of_type(VM)
    want = load_catalog().resolve("t4x1", "azure").name
    assert vm.inputs["hardwareProfile"]["vmSize"] == want == "Standard_NC4as_T4_v3"


def test_a_vm_logs_in_with_the_ssh_key_only(t4: PlanResult):
    (vm,) = t4.of_type(VM)
    linux = vm.inputs["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    (key,) = linux["ssh"]["publicKeys"]
    assert key["keyData"] == PLACEHOLDER_SSH_KEY
    assert "adminPassword" not in vm.inputs["osProfile"]


def test_disks_are_encrypted_at_host_and_networking_is_accelerated(t4: PlanResult):
    (vm,) = t4.of_type(VM)
    assert vm.inputs["securityProfile"]["encryptionAtHost"] is True
    (nic,) = t4.of_type("azure-native:network:NetworkInterface")
    assert nic.inputs["enableAcceleratedNetworking"] is True


def test_ssh_is_open_only_to_the_configured_networks(t4: PlanResult):
    (nsg,) = t4.of_type(NSG)
    rules = nsg.inputs["securityRules"]
    ssh = [r for r in rules if r.get("destinationPortRange") == "22"]
    assert [r["sourceAddressPrefix"] for r in ssh] == ["203.0.113.0/24"]
    for rule in rules:
        assert rule["sourceAddressPrefix"] not in ("*", "0.0.0.0/0", "Internet", "Any")
    (intra,) = [r for r in rules if r["name"] == "intra-stack"]
    assert intra["sourceAddressPrefix"] == intra["destinationAddressPrefix"] == azure.SUBNET_CIDR


def test_the_storage_account_is_private_tls12_and_keyless(t4: PlanResult):
    data = [a for a in t4.of_type(ACCOUNT) if a.name == "azure-t4x1-account"]
    (account,) = data
    assert account.inputs["allowBlobPublicAccess"] is False
    assert account.inputs["allowSharedKeyAccess"] is False
    assert account.inputs["minimumTlsVersion"] == "TLS1_2"
    assert account.inputs["enableHttpsTrafficOnly"] is True
    assert len(account.inputs["accountName"]) <= 24
    containers = [c for c in t4.of_type(CONTAINER) if c.inputs["containerName"] == "gpufleet"]
    assert [c.inputs["publicAccess"] for c in containers] == ["None"]
    (blob,) = t4.of_type("azure-native:storage:BlobServiceProperties")
    assert blob.inputs["isVersioningEnabled"] is True


def test_old_blobs_go_to_cool_then_archive(t4: PlanResult):
    (policy,) = t4.of_type("azure-native:storage:ManagementPolicy")
    (rule,) = policy.inputs["policy"]["rules"]
    base = rule["definition"]["actions"]["baseBlob"]
    cool = base["tierToCool"]["daysAfterModificationGreaterThan"]
    archive = base["tierToArchive"]["daysAfterModificationGreaterThan"]
    assert 0 < cool < archive


def test_the_node_identity_reaches_only_the_stack_container(t4: PlanResult):
    (container,) = [c for c in t4.of_type(CONTAINER) if c.inputs["containerName"] == "gpufleet"]
    blob_roles = [
        a
        for a in t4.of_type(ASSIGNMENT)
        if azure.BLOB_DATA_CONTRIBUTOR in str(a.inputs["roleDefinitionId"])
    ]
    assert [a.inputs["scope"] for a in blob_roles] == [container.id]


def test_the_reaper_role_holds_exactly_the_contract_actions_on_the_stack_group(t4: PlanResult):
    _, actions = azure.reaper_contract()
    (role,) = [r for r in t4.of_type(ROLE) if r.name.endswith("-reaper-role")]
    (perm,) = role.inputs["permissions"]
    assert sorted(perm["actions"]) == sorted(actions)
    assert not any("delete" in a.lower() or a.endswith("/write") for a in perm["actions"])
    (rg,) = [
        g
        for g in t4.of_type("azure-native:resources:ResourceGroup")
        if g.name.endswith("-rg") and not g.name.endswith("-data-rg")
    ]
    assert role.inputs["assignableScopes"] == [rg.id]
    (assignment,) = [a for a in t4.of_type(ASSIGNMENT) if a.name.endswith("-reaper-assignment")]
    assert assignment.inputs["scope"] == rg.id and assignment.inputs["roleDefinitionId"] == role.id


def test_the_function_app_carries_every_setting_the_reaper_requires(t4: PlanResult):
    required, _ = azure.reaper_contract()
    (app,) = t4.of_type(APP)
    settings = {s["name"]: s["value"] for s in app.inputs["siteConfig"]["appSettings"]}
    for name in required:
        assert settings[name], name
    assert settings["GPUFLEET_STACK"] == "azure-t4x1"
    assert settings["GPUFLEET_APPLY"] == "true"
    assert settings["GPUFLEET_PROVIDER"] == "azure"
    assert settings["GPUFLEET_SCHEDULE"] == azure.AZURE_SCHEDULE
    assert "AzureWebJobsStorage" not in settings  # identity, not a connection string
    assert app.inputs["kind"] == "functionapp,linux"


def test_the_workbook_charts_gpu_memory_and_heartbeat_of_every_node(h100_pair: PlanResult):
    (book,) = h100_pair.of_type("azure-native:applicationinsights:Workbook")
    body = json.loads(book.inputs["serializedData"])
    charts = [i for i in body["items"] if i["type"] == 10]
    assert len(charts) == 3
    for chart in charts:
        assert len(chart["content"]["resourceIds"]) == 2


def test_a_multi_node_nd_stack_shares_one_placement_group_and_one_infiniband_set(
    h100_pair: PlanResult,
):
    (ppg,) = h100_pair.of_type(PPG)
    (avset,) = h100_pair.of_type(AVSET)
    vms = h100_pair.of_type(VM)
    assert len(vms) == 2
    for vm in vms:
        assert vm.inputs["proximityPlacementGroup"]["id"] == ppg.id
        assert vm.inputs["availabilitySet"]["id"] == avset.id
        assert vm.inputs["storageProfile"]["imageReference"]["offer"] == "ubuntu-hpc"
    roles = sorted(vm.inputs["tags"][T.ROLE] for vm in vms)
    assert roles == ["head", "worker"]


def test_a_single_node_stack_has_no_placement_group(t4: PlanResult):
    assert t4.of_type(PPG) == [] and t4.of_type(AVSET) == []


def test_local_nvme_is_the_scratch_where_the_size_has_it():
    result = stack("azure-a100x1")
    (vm,) = result.of_type(VM)
    assert not vm.inputs["storageProfile"].get("dataDisks")
    assert result.outputs["scratch"]["kind"] == "nvme"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"region": "east-us"}, "Azure has no region 'east-us' (did you mean 'eastus'?)"),
        ({"zone": "eastus-1"}, "Azure has no zone 'eastus-1'"),
        ({"billing": "spot", "spotMaxPrice": "-1"}, "spotMaxPrice"),
        ({"billing": "subscription"}, "azure sells no subscription billing"),
        ({"tier": "v100x1"}, "azure does not offer tier 'v100x1'"),
    ],
)
def test_bad_azure_inputs_are_refused_before_any_resource(overrides: dict[str, Any], message: str):
    raw = {
        "provider": "azure",
        "tier": "t4x1",
        "sshCidrs": ["203.0.113.0/24"],
        "sshPublicKey": PLACEHOLDER_SSH_KEY,
        **overrides,
    }
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, "azure-bad")
    assert message in str(exc.value)


def test_spot_is_refused_for_nodes_that_must_share_an_infiniband_availability_set():
    raw = {
        "provider": "azure",
        "tier": "h100x8",
        "nodes": 2,
        "billing": "spot",
        "sshCidrs": ["203.0.113.0/24"],
        "sshPublicKey": PLACEHOLDER_SSH_KEY,
    }
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, "azure-spot-pair")
    (line,) = [p for p in exc.value.problems if "InfiniBand" in p]
    assert "Azure Spot VMs cannot join an availability set" in line
    assert "billing: on-demand" in line and "\n" not in line


def test_spot_stays_allowed_where_no_infiniband_set_is_needed():
    base = {"provider": "azure", "billing": "spot", "sshCidrs": ["203.0.113.0/24"]}
    base["sshPublicKey"] = PLACEHOLDER_SSH_KEY
    one_h100 = parse_config({**base, "tier": "h100x8"}, "azure-spot-one")
    two_t4 = parse_config({**base, "tier": "t4x1", "nodes": 2}, "azure-spot-t4-pair")
    assert (one_h100.billing, one_h100.nodes) == ("spot", 1)
    assert (two_t4.billing, two_t4.nodes) == ("spot", 2)


def test_a_storage_account_name_is_short_lower_case_and_keeps_its_suffix():
    name = azure.storage_account_name("a-very-long-stack-name-indeed", "abc123")
    assert len(name) <= 24 and name.endswith("abc123") and name.isalnum() and name.islower()


def test_each_node_runs_as_its_own_identity_with_roles_on_its_own_vm(h100_pair: PlanResult):
    identities = {
        i.name: i
        for i in h100_pair.of_type("azure-native:managedidentity:UserAssignedIdentity")
        if not i.name.endswith("-reaper-identity")
    }
    vms = {vm.name: vm for vm in h100_pair.of_type(VM)}
    assert set(identities) == {f"{n}-identity" for n in vms}
    for name, vm in vms.items():
        ident = identities[f"{name}-identity"]
        assert vm.inputs["identity"]["userAssignedIdentities"] == [ident.id]
        principal = ident.outputs["principalId"]
        held = [a for a in h100_pair.of_type(ASSIGNMENT) if a.inputs["principalId"] == principal]
        scopes = sorted(str(a.inputs["scope"]) for a in held)
        container = [a for a in held if azure.BLOB_DATA_CONTRIBUTOR in a.inputs["roleDefinitionId"]]
        assert len(held) == 3 and len(container) == 1
        assert scopes.count(vm.id) == 2  # its self-deallocate role and the metrics publisher
    (role,) = [r for r in h100_pair.of_type(ROLE) if r.name == "azure-h100x8-0-self-role"]
    assert role.inputs["assignableScopes"] == [vms["azure-h100x8-0"].id]
    assert (
        "Microsoft.Compute/virtualMachines/delete" not in role.inputs["permissions"][0]["actions"]
    )


def test_the_schedule_setting_is_the_one_the_package_timer_runs_on():
    # function_app.py imports azure.functions (the Functions host's): read its constant as text
    import ast

    source = (
        Path(__file__).resolve().parents[2] / "infra/clouds/azure/function_app.py"
    ).read_text()
    (value,) = [
        node.value.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["SCHEDULE"]
        and isinstance(node.value, ast.Constant)
    ]
    assert value == azure.AZURE_SCHEDULE


# -- the reaper's package: an upload the provider can make, a URL that changes with it ------

BLOB = "azure-native:storage:Blob"


def _account_of(result: PlanResult, account_name: Any) -> Any:
    (account,) = [a for a in result.of_type(ACCOUNT) if a.outputs["name"] == account_name]
    return account


def test_the_package_blob_goes_to_an_account_that_allows_the_providers_key_upload(
    t4: PlanResult,
):
    # pulumi-azure-native uploads a Blob with the account key (ListKeys, then a shared key
    # credential): into an account with allowSharedKeyAccess false, `pulumi up` fails.
    (blob,) = t4.of_type(BLOB)
    account = _account_of(t4, blob.inputs["accountName"])
    assert account.inputs["allowSharedKeyAccess"] is True
    assert account.inputs["allowBlobPublicAccess"] is False
    assert account.inputs["minimumTlsVersion"] == "TLS1_2"
    assert account.inputs["defaultToOAuthAuthentication"] is True
    # that account holds the package container and nothing else
    name = blob.inputs["accountName"]
    held = [c for c in t4.of_type(CONTAINER) if c.inputs["accountName"] == name]
    assert [c.inputs["containerName"] for c in held] == [azure.PACKAGE_CONTAINER]


def test_every_other_storage_account_still_refuses_shared_keys(t4: PlanResult):
    (blob,) = t4.of_type(BLOB)
    others = [a for a in t4.of_type(ACCOUNT) if a.outputs["name"] != blob.inputs["accountName"]]
    assert len(others) == 2  # the data account and the Functions host's own
    assert all(a.inputs["allowSharedKeyAccess"] is False for a in others)


def test_the_package_url_is_content_addressed_so_a_new_package_restarts_the_app(t4: PlanResult):
    from infra import reaper_deploy

    (blob,) = t4.of_type(BLOB)
    want = reaper_deploy.function_zip_file("azure").name
    assert blob.inputs["blobName"] == want
    assert re.fullmatch(r"azure-reaper-[0-9a-f]{16}\.zip", want)
    (app,) = t4.of_type(APP)
    settings = {s["name"]: s["value"] for s in app.inputs["siteConfig"]["appSettings"]}
    assert settings["WEBSITE_RUN_FROM_PACKAGE"].endswith("/" + want)


def test_the_reaper_reads_its_package_as_blob_data_reader_on_the_package_container_only(
    t4: PlanResult,
):
    (releases,) = [
        c for c in t4.of_type(CONTAINER) if c.inputs["containerName"] == azure.PACKAGE_CONTAINER
    ]
    readers = [
        a
        for a in t4.of_type(ASSIGNMENT)
        if azure.BLOB_DATA_READER in str(a.inputs["roleDefinitionId"])
    ]
    assert [a.inputs["scope"] for a in readers] == [releases.id]


# -- the scratch disk survives a destroy: it lives in the kept data group --------------------

DISK = "azure-native:compute:Disk"


def _groups(result: PlanResult) -> dict[str, Any]:
    groups = result.of_type("azure-native:resources:ResourceGroup")
    return {g.inputs["resourceGroupName"]: g for g in groups}


def test_the_scratch_disk_lives_in_the_kept_data_group_and_the_vm_only_attaches_it(
    t4: PlanResult,
):
    assert t4.outputs["scratch"]["kind"] == "disk"
    (disk,) = t4.of_type(DISK)
    groups = _groups(t4)
    data = groups["gpufleet-azure-t4x1-data"]
    assert disk.inputs["resourceGroupName"] == data.outputs["name"]
    assert data.retain_on_delete and disk.retain_on_delete
    # deleting the compute group deletes every disk in it: the disk must not be there
    assert not groups["gpufleet-azure-t4x1"].retain_on_delete
    (vm,) = t4.of_type(VM)
    (attached,) = vm.inputs["storageProfile"]["dataDisks"]
    assert attached["createOption"] == "Attach"
    assert attached["managedDisk"]["id"] == disk.id
    assert attached["deleteOption"] == "Detach"
    assert disk.inputs["creationData"]["createOption"] == "Empty"
    assert disk.inputs["sku"]["name"] == "Premium_LRS"  # the catalog's default class


def test_destroy_data_lets_the_scratch_disk_go_with_the_stack():
    result = stack("azure-t4x1", destroyData=True)
    (disk,) = result.of_type(DISK)
    assert not disk.retain_on_delete
    assert not _groups(result)["gpufleet-azure-t4x1-data"].retain_on_delete


# -- what the plan tells whoever deploys: prerequisites, the step after, deadlines -----------


def test_the_plan_says_to_register_encryption_at_host_before_the_first_vm():
    from infra.catalog import plan_notes

    notes = plan_notes("azure", "azure-t4x1", dt.date(2026, 12, 1))
    (eah,) = [n for n in notes if "EncryptionAtHost" in n]
    assert "`az feature register --namespace Microsoft.Compute --name EncryptionAtHost`" in eah
    assert "`az provider register -n Microsoft.Compute`" in eah


def test_the_plan_says_how_to_sync_the_reapers_timer_trigger_after_deploy():
    from infra import reaper_deploy
    from infra.catalog import plan_notes

    notes = plan_notes("azure", "azure-t4x1", dt.date(2026, 12, 1))
    (sync,) = [n for n in notes if "syncfunctiontriggers" in n]
    app = reaper_deploy.function_name("azure-t4x1")
    # ARM's POST .../Microsoft.Web/sites/{app}/syncfunctiontriggers, in the az account's
    # own subscription (no placeholder to fill in)
    command = sync[sync.index("`az resource") + 1 :].split("`")[0].split()
    assert command[:4] == ["az", "resource", "invoke-action", "--action"]
    assert command[4] == "syncfunctiontriggers"
    pairs = dict(zip(command[5::2], command[6::2], strict=True))
    assert pairs == {
        "--resource-type": "Microsoft.Web/sites",
        "-g": "gpufleet-azure-t4x1",
        "-n": app,
    }


def test_a_deadline_is_noted_inside_its_window_and_silent_before():
    from infra.catalog import Deadline

    plan = Deadline("Linux Consumption retires", dt.date(2028, 9, 30), "AZ-FUNC-VERSIONS", 365)
    assert plan.note("Azure", dt.date(2027, 9, 30)) is None  # 366 days: 2028 is a leap year
    assert "in 365 days" in (plan.note("Azure", dt.date(2027, 10, 1)) or "")
    assert "3 days ago" in (plan.note("Azure", dt.date(2028, 10, 3)) or "")


def test_the_azure_catalog_deadlines_are_cited_and_none_has_passed():
    import warnings

    from infra.catalog import deadlines, load_catalog

    found = deadlines("azure")
    whats = " ".join(d.what for d in found)
    assert "Linux Consumption" in whats and "Python 3.11" in whats
    today = dt.date.today()
    for d in found:
        assert load_catalog().sources[d.source].url.startswith("https://learn.microsoft.com/")
        assert d.days_left(today) >= 0, f"{d.what} on {d.date}: move the reaper off it"
        if d.note("Azure", today):
            warnings.warn(f"{d.what} on {d.date}: {d.days_left(today)} days left", stacklevel=1)
