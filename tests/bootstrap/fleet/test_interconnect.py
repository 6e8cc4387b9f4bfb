"""The one function that picks the NCCL/UCX environment for the nodes' fabric, read from the
stack's tier output and the real catalog (EFA on AWS, InfiniBand on Azure ND, TCP elsewhere)."""

from __future__ import annotations

from bootstrap.fleet.interconnect import EFA, INFINIBAND, TCP, FabricEnv, fabric_env, network_env
from infra.catalog import load_catalog

CAT = load_catalog()


def nd(itype: str, **tier: object) -> dict[str, object]:
    return {"name": "h100x8", "instance_type": itype, "efa": False, "infiniband": True, **tier}


def test_an_efa_tier_gets_the_efa_provider_and_rdma_where_the_type_has_it() -> None:
    got = fabric_env({"efa": True, "instance_type": "p4d.24xlarge"}, "aws")
    assert got.fabric == EFA
    assert got.env == {
        "FI_PROVIDER": "efa",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }
    g5 = fabric_env({"efa": True, "instance_type": "g5.48xlarge"}, "aws")
    assert "FI_EFA_USE_DEVICE_RDMA" not in g5.env and "NCCL_IB_DISABLE" not in g5.env


def test_nd_h100_v5_gets_microsofts_infiniband_settings_and_the_ndv5_topology() -> None:
    got = fabric_env(nd("Standard_ND96isr_H100_v5"), "azure")
    assert got.fabric == INFINIBAND
    assert got.env == {
        "NCCL_IB_DISABLE": "0",
        "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        "UCX_IB_PCI_RELAXED_ORDERING": "on",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_TOPO_FILE": "/opt/microsoft/ndv5-topo.xml",
    }
    assert not any(k.startswith("FI_") for k in got.env)
    # Every size-specific value names where it comes from, and the source is in the catalog.
    assert got.source and all(tag.strip() in CAT.sources for tag in got.source.split(","))


def test_both_nd_a100_v4_sizes_get_the_ndv4_topology() -> None:
    for itype in ("Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"):
        env = fabric_env(nd(itype), "azure").env
        assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv4-topo.xml", itype
        assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_IB_DISABLE"] == "0"


def test_a_plain_tcp_tier_sets_nothing() -> None:
    got = fabric_env({"efa": False, "instance_type": "ecs.gn7i-c8g1.2xlarge"}, "alicloud")
    assert got == FabricEnv(TCP, {})
    nc = {"efa": False, "infiniband": False, "instance_type": "Standard_NC96ads_A100_v4"}
    assert fabric_env(nc, "azure").env == {}
    assert fabric_env({}, None).fabric == TCP
    assert "nothing set" in fabric_env({}, None).describe()


def test_the_tier_output_decides_over_the_catalog_when_it_says_no_infiniband() -> None:
    # e.g. a stack on a cloud whose catalog marks InfiniBand unsupported
    assert fabric_env(nd("Standard_ND96isr_H100_v5", infiniband=False), "azure").fabric == TCP


def test_a_stack_deployed_before_the_infiniband_output_falls_back_to_the_catalog() -> None:
    old = {"name": "h100x8", "instance_type": "Standard_ND96isr_H100_v5", "efa": False}
    assert fabric_env(old, "azure").fabric == INFINIBAND
    assert fabric_env({"instance_type": "p4d.24xlarge"}, "aws").fabric == TCP  # efa says no


def test_an_instance_type_the_catalog_lacks_still_gets_the_generic_infiniband_env() -> None:
    got = fabric_env(nd("Standard_ND_unknown"), "azure")
    assert got.fabric == INFINIBAND and got.env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    assert "NCCL_TOPO_FILE" not in got.env and got.source == ""


def test_the_users_env_always_wins_over_the_defaults() -> None:
    got = fabric_env(nd("Standard_ND96asr_v4"), "azure")
    merged = got.merged({"NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "INFO"})
    assert merged["NCCL_SOCKET_IFNAME"] == "ib0" and merged["NCCL_DEBUG"] == "INFO"
    assert merged["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv4-topo.xml"
    assert got.env["NCCL_SOCKET_IFNAME"] == "eth0"  # the defaults are not changed


def test_network_env_is_the_environment_alone_and_describe_lists_it() -> None:
    tier = nd("Standard_ND96isr_H100_v5")
    assert network_env(tier, "azure") == dict(fabric_env(tier, "azure").env)
    line = fabric_env(tier, "azure").describe()
    assert line.startswith("infiniband: NCCL_IB_DISABLE=0 ")
    assert "NCCL_TOPO_FILE=/opt/microsoft/ndv5-topo.xml" in line
