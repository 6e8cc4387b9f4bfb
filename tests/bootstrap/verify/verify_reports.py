"""Node reports for verify-gpu's judge tests, assembled from the recorded-format fixture files
in tests/fixtures/verify through the same functions the node runs (``nvidia_from_outputs``,
``xid_from_log``, ``summarise_load``), and the a100x8 expectation from the real catalog."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bootstrap.verify import judge as j
from gpufleet_node import verify_node, verify_smi
from infra.catalog import load_catalog
from tests.bootstrap.stack_outputs import HEAD, p4d_outputs

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "verify"

P4D_OUTPUTS: dict[str, Any] = p4d_outputs(
    nodes=[{**HEAD, "instance_id": "i-0a1", "public_ip": "3.80.1.2"}]
)


def read(name: str) -> str:
    return (FIX / name).read_text()


def node_report(
    *,
    smi: str = "a100x8_smi.xml",
    smi_rc: int = 0,
    smi_err: str = "",
    topo: str = "a100x8_topo.txt",
    nvlink: str = "a100x8_nvlink.txt",
    load: str | None = "a100x8_load.csv",
    dmesg: str = "dmesg_clean.txt",
    torch_devices: int = 8,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """A node report as verify_node.py writes it, from the fixture files."""
    nvidia = verify_node.nvidia_from_outputs(
        {"rc": smi_rc, "out": read(smi), "err": smi_err},
        topo=read(topo),
        nvlink=read(nvlink),
        lspci=read("lspci_p4d.txt"),
        nvswitch_devices=6,
    )
    report: dict[str, Any] = {
        "schema": j.NODE_SCHEMA,
        "stage": "local",
        "mode": "gpu",
        "host": {"hostname": "ip-10-0-1-5"},
        "nvidia": nvidia,
        "xid": verify_node.xid_from_log("dmesg", read(dmesg)),
        "fabric_manager": {"state": "active", "error": None},
        "torch": {
            "torch": "2.13.0+cu126",
            "torch_cuda": "12.6",
            "error": None,
            "cuda_available": True,
            "device_count": torch_devices,
            "bf16_supported": True,
            "nccl": "2.26.2",
        },
        "torchrun": json.loads(read("a100x8_bench.json")),
        "scratch": {
            "path": "/scratch",
            "bytes": 4294967296,
            "direct": True,
            "error": None,
            "is_mount": True,
            "fs_type": "xfs",
            "read_gbs": 13.9,
            "write_gbs": 7.2,
        },
        "storage": {
            "status": "ok",
            "tool": "aws-cli",
            "bucket": "gpufleet-a100x8-ab12cd",
            "put_s": 0.081,
            "get_s": 0.043,
            "delete_s": 0.031,
        },
    }
    if load:
        samples = [verify_smi.parse_query_csv(chunk) for chunk in read(load).split("\n\n")]
        report["load"] = {"count": len(samples), "gpus": verify_smi.summarise_load(samples)}
    if edit:
        edit(report)
    return report


def expected(**kwargs: Any) -> j.Expected:
    return j.expected_from(P4D_OUTPUTS, load_catalog(), **kwargs)


def statuses(verdict: j.Verdict) -> dict[str, str]:
    return {c.name: c.status for c in verdict.checks}


def cpu_report(losses: list[float]) -> dict[str, Any]:
    return {
        "schema": j.NODE_SCHEMA,
        "mode": "cpu",
        "host": {"hostname": "laptop"},
        "torch": {"torch": "2.13.0+cpu", "torch_cuda": None, "device_count": 0, "error": None},
        "scratch": {
            "path": "/scratch",
            "bytes": 16 << 20,
            "direct": True,
            "error": None,
            "is_mount": True,
            "read_gbs": 13.1,
            "write_gbs": 6.9,
        },
        "torchrun": {
            "nproc": 2,
            "nnodes": 1,
            "errors": [],
            "allreduce": {"world": 2, "bytes": 4 << 20, "correct": True, "busbw_gbs": 1.2},
            "train": {
                "world": 2,
                "backend": "gloo",
                "amp": "bf16-autocast",
                "checkpointing": True,
                "losses": losses,
                "tokens_per_s": 41000.0,
                "flops_per_token": 748032,
            },
        },
        "storage": {
            "status": "skip",
            "bucket": "gpufleet-a100x8-ab12cd",
            "reason": "neither boto3 nor the aws CLI is on the node",
        },
    }


def cross_report(busbw: float, losses: list[float]) -> dict[str, Any]:
    bench = json.loads(read("a100x8_bench.json"))
    run = {
        "nproc": 8,
        "nnodes": 2,
        "errors": [],
        "allreduce": {**bench["allreduce"], "world": 16, "busbw_gbs": busbw},
        "train": {**bench["train"], "world": 16, "losses": losses},
    }
    return {"schema": j.NODE_SCHEMA, "stage": "cross", "torchrun": run}
