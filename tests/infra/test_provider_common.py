"""The helpers the cloud modules share (infra/clouds/common.py) and the pure steps the
Azure module's node and guard are made of."""

from __future__ import annotations

import json
from dataclasses import replace

from infra.clouds.azure import program as azure
from infra.clouds.common import ipv4_or_ipv6, managed_stack_tags, policy_json
from infra.components.args import guard_args
from infra.config import StackConfig, load_stack_file
from infra.nodes import plan_nodes
from infra.offline import PLACEHOLDER_SSH_KEY
from infra.reaper import tags as T
from tests.infra.conftest import STACKS


def azure_stack() -> StackConfig:
    return load_stack_file(STACKS / "Pulumi.azure-t4x1.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})


def test_an_allowed_network_is_either_ipv4_or_ipv6_never_both() -> None:
    assert ipv4_or_ipv6("203.0.113.0/24") == ("203.0.113.0/24", None)
    assert ipv4_or_ipv6("2001:db8::/32") == (None, "2001:db8::/32")


def test_policy_document_has_version_then_statements_in_that_order() -> None:
    text = policy_json("1", [{"Effect": "Deny"}])
    assert text == '{"Version": "1", "Statement": [{"Effect": "Deny"}]}'
    assert json.loads(text)["Statement"] == [{"Effect": "Deny"}]


def test_a_stop_is_scoped_to_the_managed_tag_and_the_stack_tag() -> None:
    assert dict(managed_stack_tags("s1")) == {T.MANAGED_BY: T.MANAGED_BY_VALUE, T.STACK: "s1"}
    assert [k for k, _ in managed_stack_tags("s1")] == [T.MANAGED_BY, T.STACK]


def test_azure_function_settings_are_sorted_and_reach_host_storage_through_the_identity() -> None:
    cfg = azure_stack()
    settings = azure.function_app_settings(
        guard_args(cfg), "sub", "rg", "client", "account", "https://pkg", "/identity"
    )
    names = [s.name for s in settings]
    assert names == sorted(names)
    values = {s.name: s.value for s in settings}
    assert values["AzureWebJobsStorage__credential"] == "managedidentity"
    assert values["AzureWebJobsStorage__clientId"] == "client"
    assert values["GPUFLEET_AZURE_CLIENT_ID"] == "client"
    assert values["WEBSITE_RUN_FROM_PACKAGE"] == "https://pkg"
    assert not [n for n in names if "ConnectionString" in n or n == "AzureWebJobsStorage"]


def test_azure_scratch_disk_is_attached_by_id_and_only_ever_detached() -> None:
    # the disk itself lives in the kept data group (AzureProvider._scratch_disk): the VM
    # never deletes it; a destroy with destroyData deletes it as its own resource
    cfg = replace(azure_stack(), destroy_data=False)
    spec = plan_nodes(cfg)[0]
    disk_spec = replace(spec, scratch=replace(spec.scratch, kind="disk"))
    nvme = replace(spec, scratch=replace(spec.scratch, kind="nvme"))
    assert azure.scratch_disks(nvme, "/disk") is None
    (kept,) = azure.scratch_disks(disk_spec, "/disk") or []
    assert kept.delete_option == "Detach" and kept.create_option == "Attach"
    assert kept.managed_disk.id == "/disk"
