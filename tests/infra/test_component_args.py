"""Each component gets its own part of the stack's config (infra/components/args.py), and
no cloud's program is handed the whole StackConfig for a part of the graph."""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any

import pytest

from infra.catalog import load_catalog, provider_names
from infra.clouds import base
from infra.components import args as A
from infra.config import StackConfig, load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY
from tests.infra.conftest import STACK_FILES, STACKS, stack_id

# What only one part of the graph is about (StackConfig field names).
BUCKET = {"bucket_archive_days"}
SSH_NETWORKS = {"ssh_cidrs"}
SSH_KEY = {"ssh_public_key"}
GUARD_LIMITS = {"idle_minutes", "ttl_hours"}  # the node's tags carry them, from its spec
NODE_BUYING = {"billing", "spot_max_price", "subscription_months", "root_disk_gb"}


class Reads:
    """A StackConfig that records which of its fields are read."""

    def __init__(self, cfg: StackConfig):
        self._cfg = cfg
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._cfg, name)


def config(stack: str) -> StackConfig:
    return load_stack_file(STACKS / f"Pulumi.{stack}.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})


def reads(build: typing.Callable[..., object], stack: str, *extra: object) -> set[str]:
    cfg = config(stack)
    seen = Reads(cfg)
    build(seen, *extra)
    return seen.read


STACK_NAMES = [stack_id(path) for path in STACK_FILES]  # every cloud, every billing mode


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_building_a_nodes_args_reads_no_bucket_ssh_or_guard_field(stack: str) -> None:
    read = reads(A.node_args, stack)
    assert not read & (BUCKET | SSH_NETWORKS | SSH_KEY | GUARD_LIMITS)
    assert read >= NODE_BUYING


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_building_the_buckets_args_reads_nothing_of_nodes_or_ssh(stack: str) -> None:
    read = reads(A.storage_args, stack)
    assert not read & (NODE_BUYING | SSH_NETWORKS | SSH_KEY | GUARD_LIMITS)
    assert not read & {"instance_type", "nodes", "zone"}


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_the_network_the_key_and_the_guard_read_only_their_own_fields(stack: str) -> None:
    network = reads(A.network_args, stack, load_catalog())
    access = reads(A.access_args, stack)
    guard = reads(A.guard_args, stack)
    assert not network & (BUCKET | SSH_KEY | NODE_BUYING | GUARD_LIMITS)
    assert not access & (BUCKET | SSH_NETWORKS | NODE_BUYING | GUARD_LIMITS)
    assert not guard & (BUCKET | SSH_NETWORKS | SSH_KEY | NODE_BUYING)


@pytest.mark.parametrize(
    "part", [A.NetworkArgs, A.StorageArgs, A.AccessArgs, A.NodeArgs, A.GuardArgs]
)
def test_every_part_holds_fewer_fields_than_the_whole_config(part: type) -> None:
    assert len(fields(part)) < len(fields(StackConfig)) // 2


def test_the_stacks_args_are_built_in_one_call_with_the_same_tags_everywhere() -> None:
    cfg = config("a100x8")
    built = A.component_args(cfg, load_catalog())
    tags = [built.network.tags, built.storage.tags, built.access.tags]
    assert all(t == built.node.tags == built.guard.tags for t in tags)
    assert built.node.billing == A.billing_of(cfg)


PARTS = ("provider_resource", "network", "storage", "access", "node", "guard")


def takes_the_whole_config(method: object) -> list[str]:
    hints = typing.get_type_hints(method)
    return [name for name, hint in hints.items() if hint is StackConfig]


@pytest.mark.parametrize("part", PARTS)
def test_the_protocol_hands_each_part_its_own_args(part: str) -> None:
    assert not takes_the_whole_config(getattr(base.CloudProvider, part))


@pytest.mark.parametrize("name", provider_names())
def test_no_clouds_program_takes_the_whole_config_for_a_part_of_the_graph(name: str) -> None:
    provider = base.get_provider(name)
    assert {part: takes_the_whole_config(getattr(provider, part)) for part in PARTS} == {
        part: [] for part in PARTS
    }
