"""Azure RBAC against Azure's own definitions: every operation our roles name is one
Microsoft publishes, every built-in role is the one its id names, and what each identity of
a shipped stack may do follows from RBAC's documented semantics (tests/support/azure_rbac.py,
checked first on the documentation's own examples)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from infra.clouds.azure import program as azure
from infra.clouds.azure import reaper as reaper
from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from tests.support import azure_rbac as rbac
from tests.support.azure_rbac import Assignment, Role, allowed

STACKS = Path(__file__).resolve().parents[2] / "stacks"
ROLE = "azure-native:authorization:RoleDefinition"
ASSIGNMENT = "azure-native:authorization:RoleAssignment"
VM = "azure-native:compute:VirtualMachine"
CONTAINER = "azure-native:storage:BlobContainer"
IDENTITY = "azure-native:managedidentity:UserAssignedIdentity"
AZURE_STACKS = sorted(
    p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS.glob("Pulumi.azure-*.yaml")
)

DEALLOCATE = "Microsoft.Compute/virtualMachines/deallocate/action"
DELETE = "Microsoft.Compute/virtualMachines/delete"
POWER_OFF = "Microsoft.Compute/virtualMachines/powerOff/action"
START = "Microsoft.Compute/virtualMachines/start/action"
WRITE_VM = "Microsoft.Compute/virtualMachines/write"
TAGS_WRITE = "Microsoft.Resources/tags/write"
METRICS_WRITE = "Microsoft.Insights/Metrics/Write"  # a data action
BLOB_READ = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"
BLOB_WRITE = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"


# -- the evaluator, on Microsoft's own examples ------------------------------------------------

# role-definitions.md prints Contributor's definition (Actions "*", NotActions the
# Authorization writes and deletes, ...), Reader's ("*/read") and Storage Blob Data Reader's
# (shown in full there); User Access Administrator is "*/read", "Microsoft.Authorization/*",
# "Microsoft.Support/*" (built-in-roles).
CONTRIBUTOR = Role(
    "Contributor",
    actions=("*",),
    not_actions=(
        "Microsoft.Authorization/*/Delete",
        "Microsoft.Authorization/*/Write",
        "Microsoft.Authorization/elevateAccess/Action",
    ),
)
READER = Role("Reader", actions=("*/read",))
USER_ACCESS_ADMIN = Role(
    "User Access Administrator",
    actions=("*/read", "Microsoft.Authorization/*", "Microsoft.Support/*"),
)
SUB = "/subscriptions/00000000-0000-0000-0000-000000000001"
RG = f"{SUB}/resourceGroups/example-group"
VM_ID = f"{RG}/providers/Microsoft.Compute/virtualMachines/vm1"


def test_actions_minus_not_actions_as_contributor_shows():
    assert CONTRIBUTOR.allows("Microsoft.Compute/virtualMachines/write")
    assert not CONTRIBUTOR.allows("Microsoft.Authorization/roleAssignments/write")
    assert not CONTRIBUTOR.allows("Microsoft.Authorization/roleAssignments/delete")
    assert CONTRIBUTOR.allows("Microsoft.Authorization/roleAssignments/read")


def test_management_wildcards_grant_no_data_operation():
    # "Management access is not inherited to your data": Actions "*" reads no blob
    assert not CONTRIBUTOR.allows(BLOB_READ, data=True)
    blob_reader = rbac.built_in("2a2b9908-6ea1-4ae2-8e65-a410df84e7d1")
    assert blob_reader.allows(BLOB_READ, data=True)
    assert not blob_reader.allows(BLOB_WRITE, data=True)
    assert blob_reader.allows("Microsoft.Storage/storageAccounts/blobServices/containers/read")


def test_a_wildcard_covers_every_operation_it_spells_and_no_other():
    assert READER.allows("Microsoft.Compute/virtualMachines/read")
    assert not READER.allows(DEALLOCATE)
    assert rbac.matches("Microsoft.Compute/*", START)
    assert not rbac.matches("Microsoft.Compute/*", "Microsoft.Network/virtualNetworks/read")


def test_operation_names_compare_without_case():
    assert rbac.matches("microsoft.compute/VIRTUALMACHINES/Deallocate/Action", DEALLOCATE)


def test_not_actions_is_not_a_deny_another_assignment_may_grant_it():
    held = [Assignment(CONTRIBUTOR, SUB), Assignment(USER_ACCESS_ADMIN, SUB)]
    assert allowed(held, "Microsoft.Authorization/roleAssignments/write", VM_ID)
    assert not allowed(held[:1], "Microsoft.Authorization/roleAssignments/write", VM_ID)


def test_an_assignment_applies_at_its_scope_and_below_only():
    held = [Assignment(READER, RG)]
    assert allowed(held, "Microsoft.Compute/virtualMachines/read", VM_ID)
    assert allowed(held, "Microsoft.Compute/virtualMachines/read", RG)
    other = f"{SUB}/resourceGroups/other/providers/Microsoft.Compute/virtualMachines/vm1"
    assert not allowed(held, "Microsoft.Compute/virtualMachines/read", other)
    # a sibling whose name only starts like the scope is not below it
    assert not allowed(held, "Microsoft.Compute/virtualMachines/read", RG + "-2")
    assert not allowed(held, "Microsoft.Compute/virtualMachines/read", SUB)


# -- every operation and built-in role we name is one Microsoft publishes ------------------------


def test_the_snapshot_is_dated_and_cites_microsofts_pages():
    data = rbac.snapshot()
    assert isinstance(data["meta"]["retrieved"], str | dt.date)
    for section in ("operations", "roles"):
        for key, row in data[section].items():
            url = data["sources"][row["source"]]["url"]
            assert url.startswith("https://learn.microsoft.com/"), key


def test_the_snapshot_refuses_a_name_microsoft_does_not_publish():
    actions, data = rbac.published_operations()
    assert DEALLOCATE.lower() in actions
    assert "microsoft.compute/virtualmachines/deallocate" not in actions  # no /action
    assert METRICS_WRITE.lower() in data and METRICS_WRITE.lower() not in actions


def _published(name: str, *, data: bool = False) -> bool:
    actions, data_actions = rbac.published_operations()
    pool = data_actions if data else actions
    return any(rbac.matches(name, op) for op in pool)


@pytest.mark.parametrize(
    "action", sorted({*azure.NODE_ACTIONS, *reaper.ROLE_ACTIONS}), ids=lambda a: a
)
def test_every_action_our_custom_roles_hold_is_published(action: str):
    assert _published(action), f"{action}: not in tests/data/clouds/azure_rbac.toml"


@pytest.mark.parametrize("role_id", sorted(azure.BUILT_IN_ROLES))
def test_every_built_in_role_we_name_is_the_role_its_id_publishes(role_id: str):
    role = rbac.built_in(role_id)
    assert role.name == azure.BUILT_IN_ROLES[role_id]
    for name in (*role.actions, *role.not_actions):
        if not name.startswith("Microsoft.Support/"):  # a provider we do not snapshot
            assert _published(name), name
    for name in (*role.data_actions, *role.not_data_actions):
        assert _published(name, data=True), name


# -- what each identity of each shipped stack may do ----------------------------------------


def plan(name: str, **raw: Any) -> PlanResult:
    cfg = load_stack_file(STACKS / f"Pulumi.{name}.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    if raw:
        from dataclasses import replace

        cfg = replace(cfg, **raw)
    return evaluate(cfg)


@pytest.fixture(scope="module", params=AZURE_STACKS)
def shipped(request: pytest.FixtureRequest) -> PlanResult:
    return plan(request.param)


@pytest.fixture(scope="module")
def pair() -> PlanResult:
    return plan("azure-h100x8", nodes=2, max_hourly_cost=250.0)


def held_by(result: PlanResult, principal: str) -> list[Assignment]:
    """The principal's assignments in the plan, each role resolved: a custom role from its
    RoleDefinition's permissions, a built-in one from the snapshot."""
    custom = {r.id: r for r in result.of_type(ROLE)}
    out = []
    for a in result.of_type(ASSIGNMENT):
        if a.inputs["principalId"] != principal:
            continue
        role_id = str(a.inputs["roleDefinitionId"])
        if role_id in custom:
            d = custom[role_id]
            assert a.inputs["scope"] in d.inputs["assignableScopes"], "assigned off its scope"
            role = Role.from_permissions(d.inputs["roleName"], d.inputs["permissions"])
        else:
            role = rbac.built_in(role_id.rsplit("/", 1)[-1])
        out.append(Assignment(role, str(a.inputs["scope"])))
    return out


def principal(result: PlanResult, identity_name: str) -> str:
    (ident,) = [i for i in result.of_type(IDENTITY) if i.name == identity_name]
    return str(ident.outputs["principalId"])


def test_every_action_every_shipped_role_holds_is_published(shipped: PlanResult):
    for d in shipped.of_type(ROLE):
        for block in d.inputs["permissions"]:
            for name in (*block.get("actions", []), *block.get("notActions", [])):
                assert _published(name), f"{d.name}: {name}"
            for name in (*block.get("dataActions", []), *block.get("notDataActions", [])):
                assert _published(name, data=True), f"{d.name}: {name}"
    for a in shipped.of_type(ASSIGNMENT):
        role_id = str(a.inputs["roleDefinitionId"])
        if "/providers/Microsoft.Authorization/roleDefinitions/" in role_id:
            assert role_id.rsplit("/", 1)[-1] in rbac.snapshot()["roles"], a.name


def test_the_reaper_may_deallocate_and_start_the_stacks_vms_never_delete_them(shipped: PlanResult):
    (ident,) = [i for i in shipped.of_type(IDENTITY) if i.name.endswith("-reaper-identity")]
    held = held_by(shipped, str(ident.outputs["principalId"]))
    vms = shipped.of_type(VM)
    assert vms
    for vm in vms:
        assert allowed(held, DEALLOCATE, vm.id)
        assert allowed(held, "Microsoft.Compute/virtualMachines/instanceView/read", vm.id)
        # spot recovery: an evicted VM is started again (infra/reaper/recovery.py)
        assert allowed(held, START, vm.id)
        for forbidden in (DELETE, POWER_OFF, WRITE_VM, TAGS_WRITE):
            assert not allowed(held, forbidden, vm.id), forbidden
    another = vms[0].id.replace("/resourceGroups/gpufleet-", "/resourceGroups/other-")
    assert not allowed(held, DEALLOCATE, another)
    # no data: no blob of the data account, no metric written
    for c in shipped.of_type(CONTAINER):
        if c.inputs["containerName"] == azure.CONTAINER:
            assert not allowed(held, BLOB_READ, c.id + "/blobs/x", data=True)


def test_a_node_may_deallocate_tag_and_report_on_itself_only(pair: PlanResult):
    vms = {vm.name: vm for vm in pair.of_type(VM)}
    (data,) = [c for c in pair.of_type(CONTAINER) if c.inputs["containerName"] == azure.CONTAINER]
    assert len(vms) == 2
    for name, vm in vms.items():
        held = held_by(pair, principal(pair, f"{name}-identity"))
        sibling = next(v for n, v in vms.items() if n != name)
        # what the watchdog calls (AzureNode): deallocate, tags Merge, custom metrics, Blob
        assert allowed(held, DEALLOCATE, vm.id)
        assert allowed(held, TAGS_WRITE, vm.id)
        assert allowed(held, METRICS_WRITE, vm.id, data=True)
        assert allowed(held, BLOB_WRITE, data.id + "/blobs/checkpoint", data=True)
        # and nothing on its sibling, nothing destructive on itself
        for op in (DEALLOCATE, TAGS_WRITE, "Microsoft.Compute/virtualMachines/read"):
            assert not allowed(held, op, sibling.id), op
        assert not allowed(held, METRICS_WRITE, sibling.id, data=True)
        for forbidden in (DELETE, POWER_OFF, START, WRITE_VM):
            assert not allowed(held, forbidden, vm.id), forbidden


def test_a_node_reaches_no_other_container_and_no_account_key(pair: PlanResult):
    (name, *_) = [vm.name for vm in pair.of_type(VM)]
    held = held_by(pair, principal(pair, f"{name}-identity"))
    for c in pair.of_type(CONTAINER):
        if c.inputs["containerName"] != azure.CONTAINER:  # the reaper's package container
            assert not allowed(held, BLOB_READ, c.id + "/blobs/x", data=True)
    for account in pair.of_type("azure-native:storage:StorageAccount"):
        assert not allowed(held, "Microsoft.Storage/storageAccounts/listkeys/action", account.id)


def test_the_reaper_reads_its_package_and_cannot_replace_it(shipped: PlanResult):
    (ident,) = [i for i in shipped.of_type(IDENTITY) if i.name.endswith("-reaper-identity")]
    held = held_by(shipped, str(ident.outputs["principalId"]))
    (releases,) = [
        c
        for c in shipped.of_type(CONTAINER)
        if c.inputs["containerName"] == azure.PACKAGE_CONTAINER
    ]
    blob = releases.id + "/blobs/azure-reaper.zip"
    assert allowed(held, BLOB_READ, blob, data=True)
    assert not allowed(held, BLOB_WRITE, blob, data=True)


# The ARM calls the node's watchdog makes (AzureNode in infra/clouds/azure/node.py) and
# the one operation each needs, from Microsoft's REST reference ("Virtual Machines -
# Deallocate"; "Tags - Update At Scope", whose built-in Tag Contributor role grants
# Microsoft.Resources/tags/* and no read of the tagged resource). Its identity, tags and
# events come from IMDS, which RBAC does not govern.
NODE_CALLS = {
    ("POST", "{vm}/deallocate"): DEALLOCATE,
    ("PATCH", "{vm}/providers/Microsoft.Resources/tags/default"): TAGS_WRITE,
}


def test_the_nodes_own_role_holds_exactly_what_its_arm_calls_need():
    import inspect

    from tests.gpufleet_node.test_watchdog import azure_node

    source = inspect.getsource(azure_node.AzureNode)
    for (method, path), _ in NODE_CALLS.items():
        tail = path.removeprefix("{vm}")
        assert f'"{method}"' in source and tail in source, (method, path)
    assert sorted(azure.NODE_ACTIONS) == sorted(set(NODE_CALLS.values()))
