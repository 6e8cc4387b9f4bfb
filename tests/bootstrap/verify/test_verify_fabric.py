"""verify-gpu on InfiniBand tiers: the expectation knows the fabric, the node's InfiniBand
ports are read from sysfs (a fake tree in tmp_path here) and judged, the cross-node command
carries the fabric's NCCL environment with the user's --node-env over it, and the cluster
verdict says which environment the collectives ran with."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from bootstrap.fleet.interconnect import EFA, INFINIBAND, TCP, fabric_env
from bootstrap.verify.checks import collective, health
from bootstrap.verify.checks.base import CROSS, GPU, Node
from bootstrap.verify.expected import Expected, expected_from
from bootstrap.verify.judge import judge_cluster
from bootstrap.verify.ship import VerifyOptions, node_command
from bootstrap.verify.verdict import FAIL, NOT_RUN, PASS, SKIP, WARN, Check
from gpufleet_node.verify_node import collect_infiniband, network_environment
from infra.catalog import load_catalog
from tests.bootstrap.stack_outputs import ND_TIER, p4d_outputs
from tests.bootstrap.verify.verify_reports import cross_report

CAT = load_catalog()


def nd_outputs(**tier: Any) -> dict[str, Any]:
    return p4d_outputs(
        stack="h100x8", provider="azure", region="eastus", tier={**ND_TIER, **tier}, bucket=None
    )


def nd_expected(**tier: Any) -> Expected:
    return expected_from(nd_outputs(**tier), CAT, nodes=2)


def fake_sysfs(
    root: Path,
    ports: list[tuple[str, str, str, str]],
    *,
    dev: bool = True,
) -> tuple[str, str]:
    """A /sys/class/infiniband and /dev/infiniband under ``root``: one port 1 per
    (device, state, link layer, rate), as the kernel lays them out."""
    sysfs, devdir = root / "sys/class/infiniband", root / "dev/infiniband"
    sysfs.mkdir(parents=True)
    for name, state, layer, rate in ports:
        port = sysfs / name / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
        (port / "link_layer").write_text(layer + "\n")
        (port / "rate").write_text(rate + "\n")
    if dev:
        devdir.mkdir(parents=True)
        for i in range(len(ports)):
            (devdir / f"uverbs{i}").write_text("")
    return str(sysfs), str(devdir)


def nd_ports(active: int = 8, rate: str = "400 Gb/sec (4X NDR)") -> list[tuple[str, ...]]:
    ib = [
        (f"mlx5_ib{i}", "4: ACTIVE" if i < active else "1: DOWN", "InfiniBand", rate)
        for i in range(8)
    ]
    # The accelerated-networking NIC shows up too, as an Ethernet link layer: not an IB port.
    return [*ib, ("mlx5_an0", "4: ACTIVE", "Ethernet", "100 Gb/sec (4X EDR)")]


def ib_check(tmp_path: Path, ports: list[tuple[str, ...]], exp: Expected, **kw: Any) -> Check:
    sysfs, dev = fake_sysfs(tmp_path, ports, **kw)  # type: ignore[arg-type]
    node = Node({"infiniband": collect_infiniband(sysfs, dev)}, exp, run_kind=GPU)
    (line,) = health.infiniband(node, exp.thresholds)
    return line


# ------------------------------------------------------------------------ the expectation


def test_an_nd_stack_is_expected_to_run_on_infiniband_at_the_sizes_rate() -> None:
    exp = nd_expected()
    assert (exp.fabric, exp.infiniband_gbps, exp.network_gbps) == (INFINIBAND, 3200.0, 80)
    assert exp.summary()["fabric"] == INFINIBAND
    assert expected_from(p4d_outputs(), CAT).fabric == EFA
    assert expected_from(None, CAT, tier="t4x1").fabric == TCP


def test_an_nd_stack_deployed_before_the_infiniband_output_is_still_an_infiniband_tier() -> None:
    old = {k: v for k, v in ND_TIER.items() if not k.startswith("infiniband")}
    exp = expected_from(p4d_outputs(provider="azure", tier=old), CAT)
    assert (exp.fabric, exp.infiniband_gbps) == (INFINIBAND, 3200.0)


# ------------------------------------------------------------------ the node's IB ports


def test_the_node_reads_every_hca_port_from_sysfs(tmp_path: Path) -> None:
    sysfs, dev = fake_sysfs(tmp_path, nd_ports(active=7))  # type: ignore[arg-type]
    got = collect_infiniband(sysfs, dev)
    assert got["dev"] is True and len(got["dev_entries"]) == 9
    assert len(got["ports"]) == 9
    first = got["ports"][0]
    assert first == {
        "device": "mlx5_an0",
        "port": "1",
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "link_layer": "Ethernet",
        "rate": "100 Gb/sec (4X EDR)",
    }
    assert [p["state"] for p in got["ports"] if p["device"] == "mlx5_ib7"] == ["1: DOWN"]


def test_a_node_without_infiniband_reports_nothing_rather_than_failing(tmp_path: Path) -> None:
    got = collect_infiniband(str(tmp_path / "no-sys"), str(tmp_path / "no-dev"))
    assert got == {"dev": False, "dev_entries": [], "sysfs": False, "ports": []}


def test_eight_active_ndr_ports_pass_at_the_sizes_rate(tmp_path: Path) -> None:
    line = ib_check(tmp_path, nd_ports(), nd_expected())
    assert line.status == PASS
    assert line.measured == "8 of 8 ports active, 3200 Gb/s"


def test_no_dev_infiniband_fails_and_says_how_to_get_the_driver(tmp_path: Path) -> None:
    line = ib_check(tmp_path, nd_ports(), nd_expected(), dev=False)
    assert (line.status, line.measured) == (FAIL, "no /dev/infiniband")
    assert "Ubuntu HPC image" in line.detail and "TCP" in line.detail


def test_only_ethernet_rdma_ports_fail_as_no_infiniband(tmp_path: Path) -> None:
    eth = [("mlx5_an0", "4: ACTIVE", "Ethernet", "100 Gb/sec (4X EDR)")]
    line = ib_check(tmp_path, eth, nd_expected())
    assert (line.status, line.measured) == (FAIL, "no InfiniBand ports")


def test_no_active_port_fails(tmp_path: Path) -> None:
    line = ib_check(tmp_path, nd_ports(active=0), nd_expected())
    assert (line.status, line.measured) == (FAIL, "0 of 8 ports active")
    assert "mlx5_ib0/1: 1: DOWN" in line.detail


def test_one_port_down_is_a_warning_that_names_it(tmp_path: Path) -> None:
    line = ib_check(tmp_path, nd_ports(active=7), nd_expected())
    assert (line.status, line.measured) == (WARN, "7 of 8 ports active")
    assert "mlx5_ib7/1" in line.detail


def test_ports_linked_at_a_lower_rate_than_the_size_is_sold_with_warn(tmp_path: Path) -> None:
    line = ib_check(tmp_path, nd_ports(rate="200 Gb/sec (4X HDR)"), nd_expected())
    assert line.status == WARN and "1600 of 3200 Gb/s" in line.detail


def test_the_ib_check_is_not_run_on_a_tier_without_infiniband(tmp_path: Path) -> None:
    line = ib_check(tmp_path, [], expected_from(p4d_outputs(), CAT), dev=False)
    assert (line.status, line.detail) == (NOT_RUN, "not an InfiniBand tier")


def test_a_report_without_the_ib_probe_is_skipped() -> None:
    exp = nd_expected()
    (line,) = health.infiniband(Node({}, exp, run_kind=GPU), exp.thresholds)
    assert line.status == SKIP


# --------------------------------------------------------------- the cross-node command


def env_of(command: str) -> dict[str, str]:
    """The KEY=VALUE words of the command's leading ``env``, up to the interpreter, but
    PYTHONPATH (where the node package was shipped: the command's own, not a setting)."""
    words = shlex.split(command)
    if words[0] != "env":
        return {}
    env = {}
    for word in words[1:]:
        if "=" not in word:
            break
        key, _, value = word.partition("=")
        env[key] = value
    assert env.pop("PYTHONPATH") == "/tmp/v"
    return env


def test_the_cross_node_command_carries_the_infiniband_env_and_the_user_wins() -> None:
    exp = nd_expected()
    opts = VerifyOptions(
        fabric=fabric_env(ND_TIER, "azure"),
        node_env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth1"},
    )
    cross = env_of(node_command("/tmp/v", opts, exp, stage="cross", nnodes=2, node_rank=1))
    assert cross["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
    assert cross["NCCL_IB_PCI_RELAXED_ORDERING"] == "1" and cross["NCCL_IB_DISABLE"] == "0"
    assert cross["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert cross["NCCL_SOCKET_IFNAME"] == "eth1" and cross["NCCL_DEBUG"] == "INFO"
    # The one-node stage keeps only what the user asked for.
    local = env_of(node_command("/tmp/v", opts, exp, stage="local"))
    assert local == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth1"}


def test_a_plain_tcp_tier_adds_nothing_to_the_cross_node_command() -> None:
    exp = expected_from(None, CAT, tier="t4x1")
    opts = VerifyOptions(fabric=fabric_env({"efa": False}, "aws"))
    assert env_of(node_command("/tmp/v", opts, exp, stage="cross", nnodes=2)) == {}


def test_the_node_reports_only_the_network_part_of_its_environment() -> None:
    env = {"NCCL_TOPO_FILE": "/t.xml", "FI_PROVIDER": "efa", "UCX_TLS": "rc", "HOME": "/root"}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    assert network_environment(env) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FI_PROVIDER": "efa",
        "NCCL_TOPO_FILE": "/t.xml",
        "UCX_TLS": "rc",
    }


# ------------------------------------------------------------- the cluster's verdict


def cross(busbw: float, env: dict[str, str] | None) -> dict[str, Any]:
    report = cross_report(busbw, [6.9 - 0.2 * i for i in range(30)])
    if env is not None:
        report["network_env"] = env
    return report


IB_ENV = dict(fabric_env(ND_TIER, "azure").env)


def test_the_cluster_verdict_names_the_infiniband_env_the_run_used() -> None:
    verdict = judge_cluster({"n0": cross(300.0, IB_ENV), "n1": cross(300.0, IB_ENV)}, nd_expected())
    line = verdict.check("fabric")
    assert (line.status, line.measured, line.expected) == (PASS, "infiniband env", "InfiniBand")
    assert "NCCL_TOPO_FILE=/opt/microsoft/ndv5-topo.xml" in line.detail


def test_a_user_env_that_disables_infiniband_is_flagged() -> None:
    env = {**IB_ENV, "NCCL_IB_DISABLE": "1"}
    line = judge_cluster({"n0": cross(300.0, env)}, nd_expected()).check("fabric")
    assert (line.status, line.measured) == (WARN, "NCCL_IB_DISABLE=1")
    assert "did not use InfiniBand" in line.detail


def test_an_efa_run_with_another_libfabric_provider_is_flagged() -> None:
    env = {"FI_PROVIDER": "tcp", "NCCL_SOCKET_IFNAME": "^lo,docker"}
    exp = expected_from(p4d_outputs(), CAT, nodes=2)
    line = judge_cluster({"n0": cross(30.0, env)}, exp).check("fabric")
    assert (line.status, line.measured) == (WARN, "FI_PROVIDER=tcp")


def test_a_node_report_without_its_env_leaves_the_fabric_line_skipped() -> None:
    line = judge_cluster({"n0": cross(300.0, None)}, nd_expected()).check("fabric")
    assert line.status == SKIP


def test_cross_node_bandwidth_on_infiniband_is_judged_against_the_infiniband_rate() -> None:
    exp = nd_expected()  # 0.5 x 3200 Gbit/s / 8 = 200 GB/s
    good = judge_cluster({"n0": cross(250.0, IB_ENV)}, exp).check("allreduce.cross")
    assert good.status == PASS and "3200 Gbit/s InfiniBand" in good.detail
    # What a run that fell back to the 80 Gbit/s Ethernet NIC would show: not a pass.
    tcp = judge_cluster({"n0": cross(9.0, IB_ENV)}, exp).check("allreduce.cross")
    assert tcp.status == FAIL


def test_the_cross_checks_list_the_fabric_line_last() -> None:
    verdict = judge_cluster({"n0": cross(250.0, IB_ENV)}, nd_expected())
    assert [c.name for c in verdict.checks][-1] == "fabric"
    assert CROSS in collective.fabric.runs
