"""The node health checks' parsers: what DCGM, nvidia-smi, the kernel log and the InfiniBand
tools print, turned into plain findings the laptop judges (bootstrap/verify/health/verdict.py).

Stdlib only, like verify_smi.py beside it (whose nvidia-smi XML and Xid parsers this file
reuses rather than repeats): it is copied to the node and run there, and the laptop imports
the same parsers to read recorded outputs in tests. Every parser is tolerant of a field a
version does not print (None, never an exception) and strict about text that is not the
tool's output at all (ValueError with one line saying what was found).

The last verdict is stored on the node, beside the watchdog's state, so the node itself
(and whatever reads it over SSH) knows it without the laptop: :func:`store_verdict`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import verify_node as node
from . import verify_smi as smi

SCHEMA = "gpufleet.health/1"
# The watchdog keeps its lease and history here (gpufleet_node/watchdog.py STATE_DIR).
STATE_DIR = Path("/var/lib/gpufleet")
VERDICT_FILE = "health/verdict.json"
# A failed node set aside for replacement (fab health --quarantine): fab train and the
# node's watchdog leave it alone until the node is replaced (a new node has no such file).
QUARANTINE_FILE = "health/quarantine.json"
# Where the verdict is kept in the stack's bucket: one object per node, the latest verdict.
BUCKET_PREFIX = "gpufleet/health/"

# `dcgmi diag -j`: the keys DCGM writes (nvvs/include/NvvsJsonStrings.h, NVIDIA/DCGM).
_DIAG = "DCGM Diagnostic"
# `nvidia-smi nvlink -e`: "\t Link 0: Replay Errors: 0"
_NVLINK_ERR = re.compile(r"^\s*Link (?P<link>\d+): (?P<name>[A-Za-z ]+?) Errors?: (?P<n>\S+)\s*$")
# `ibstat`: "CA 'mlx5_0'", then "\tPort 1:", then "\t\tState: Active" lines.
_IB_CA = re.compile(r"^CA '(?P<ca>[^']+)'")
_IB_PORT = re.compile(r"^\s+Port (?P<port>\d+):\s*$")
_IB_FIELD = re.compile(r"^\s+(?P<key>[A-Za-z ]+):\s*(?P<value>.*?)\s*$")


def parse_dcgm_diag(text: str) -> dict[str, Any]:
    """``dcgmi diag -r N -j`` -> the DCGM version, any runtime error and one entry per test:
    its category, name, overall status and, per GPU, the status and DCGM's warnings (with
    their error id, category and severity, dcgm_errors.h numbering).

    Layout: testing/python3/dcgm_diag_schema.json in NVIDIA/DCGM."""
    try:
        data = json.loads(text[text.find("{") :] if "{" in text else text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"dcgmi diag -j output is not JSON ({exc.msg} at char {exc.pos})"
        ) from None
    diag = data.get(_DIAG) if isinstance(data, dict) else None
    if not isinstance(diag, dict):
        raise ValueError(f"dcgmi diag -j output has no {_DIAG!r} object")
    tests = []
    for category in diag.get("test_categories") or []:
        for test in category.get("tests") or []:
            tests.append(
                {
                    "category": category.get("category"),
                    "name": test.get("name"),
                    "status": (test.get("test_summary") or {}).get("status"),
                    "gpus": [_diag_result(r) for r in test.get("results") or []],
                }
            )
    return {
        "version": (data.get("metadata") or {}).get("version"),
        "driver": (data.get("metadata") or {}).get("Driver Version Detected"),
        "runtime_error": diag.get("runtime_error"),
        "tests": tests,
    }


def _diag_result(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "entity": result.get("entity_group") or "GPU",
        "gpu": result.get("entity_id"),
        "status": result.get("status"),
        "warnings": [
            {
                "error_id": w.get("error_id"),
                "category": w.get("error_category"),
                "severity": w.get("error_severity"),
                "text": str(w.get("warning") or "")[:300],
            }
            for w in result.get("warnings") or []
        ],
    }


def parse_nvlink_errors(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi nvlink -e`` -> per GPU, per link, its error counters by name
    (``replay``, ``recovery``, ``crc``; a counter the driver cannot read is None)."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = smi._NVLINK_GPU.match(line.strip())
        if head and not line.startswith((" ", "\t")):
            gpus.append({"index": int(head["index"]), "links": {}})
            continue
        counter = _NVLINK_ERR.match(line)
        if counter and gpus:
            link = gpus[-1]["links"].setdefault(int(counter["link"]), {})
            value = smi.number(counter["n"])
            link[counter["name"].strip().lower()] = None if value is None else int(value)
    return [
        {"index": g["index"], "links": [{"link": k, **v} for k, v in sorted(g["links"].items())]}
        for g in gpus
    ]


def parse_ibstat(text: str) -> list[dict[str, Any]]:
    """``ibstat`` -> one entry per HCA port: state, physical state, rate (Gb/s) and link layer
    (InfiniBand, or Ethernet for a RoCE port). Lines ibstat prints about a device it cannot
    open (``ibpanic: ...``) are skipped: the ports it did print still count."""
    ports: list[dict[str, Any]] = []
    ca = None
    for line in text.splitlines():
        if match := _IB_CA.match(line):
            ca = match["ca"]
            continue
        if (match := _IB_PORT.match(line)) and ca:
            ports.append({"device": ca, "port": int(match["port"])})
            continue
        field = _IB_FIELD.match(line)
        if not field or not ports or not line.startswith(("\t\t", "        ")):
            continue
        key, value = field["key"].strip().lower(), field["value"]
        if key == "state":
            ports[-1]["state"] = value
        elif key == "physical state":
            ports[-1]["phys_state"] = value
        elif key == "rate":
            ports[-1]["rate_gbps"] = smi.number(value)
        elif key == "link layer":
            ports[-1]["link_layer"] = value
    return ports


def port_from_sysfs(port: dict[str, Any]) -> dict[str, Any]:
    """One port as verify_node.collect_infiniband reads /sys/class/infiniband ("4: ACTIVE",
    "5: LinkUp", "400 Gb/sec (4X NDR)") in ibstat's words ("Active", "LinkUp", 400.0)."""

    def word(value: Any) -> str | None:
        text = str(value or "").strip()
        return text.split(":", 1)[-1].strip().capitalize() or None

    phys = str(port.get("phys_state") or "").split(":", 1)[-1].strip() or None
    return {
        "device": port.get("device"),
        "port": port.get("port"),
        "state": word(port.get("state")),
        "phys_state": phys,
        "rate_gbps": smi.number(str(port.get("rate") or "")),
        "link_layer": port.get("link_layer"),
    }


def gpu_health(gpu: dict[str, Any]) -> dict[str, Any]:
    """The health fields of one GPU as verify_smi.parse_smi_xml reads them."""
    keys = (
        "index",
        "name",
        "bus_id",
        "serial",
        "ecc_mode",
        "ecc_volatile",
        "ecc_aggregate",
        "retired_pages",
        "remapped_rows",
        "pcie",
        "temperature_c",
        "temperature_slowdown_c",
        "throttle_reasons",
    )
    return {k: gpu.get(k) for k in keys}


def snapshot(
    *,
    taken_at: str,
    smi_xml: str | None = None,
    nvlink_status: str | None = None,
    nvlink_errors: str | None = None,
    kernel_log: str | None = None,
    kernel_source: str | None = None,
    ibstat: str | None = None,
    dcgm: str | None = None,
    dcgm_level: int | None = None,
    lspci: str | None = None,
    fabric_manager: str | None = None,
) -> dict[str, Any]:
    """Every finding from the outputs the node could record (None: that tool was not there,
    or not asked for), as the JSON the laptop's judge reads. A tool whose output does not
    parse is named in ``errors``, and the others still count."""
    doc: dict[str, Any] = {"schema": SCHEMA, "taken_at": taken_at, "errors": []}
    parsers = (
        ("nvidia", smi_xml, lambda t: smi.parse_smi_xml(t)),
        ("nvlink", nvlink_status, smi.parse_nvlink_status),
        ("nvlink_errors", nvlink_errors, parse_nvlink_errors),
        ("infiniband", ibstat, parse_ibstat),
        ("dcgm", dcgm, parse_dcgm_diag),
    )
    for key, text, parse in parsers:
        if text is None:
            continue
        try:
            doc[key] = parse(text)
        except ValueError as exc:
            doc["errors"].append(f"{key}: {exc}")
    if "nvidia" in doc:
        doc["nvidia"] = {
            "driver_version": doc["nvidia"].get("driver_version"),
            "gpus": [gpu_health(g) for g in doc["nvidia"].get("gpus") or []],
        }
    if "dcgm" in doc:
        doc["dcgm"]["level"] = dcgm_level
    if lspci is not None:
        # What the PCI bus shows, whatever the driver thinks (a GPU off the bus still counts).
        doc["pci"] = smi.count_pci_gpus(lspci)
    if fabric_manager is not None:  # `systemctl is-active nvidia-fabricmanager`
        doc["fabric_manager"] = fabric_manager.strip() or "unknown"
    if kernel_log is not None:
        doc["xid"] = {"source": kernel_source, "events": smi.parse_xids(kernel_log)}
    return doc


def store_verdict(
    verdict: dict[str, Any], state_dir: Path = STATE_DIR, name: str = VERDICT_FILE
) -> Path:
    """Write the verdict where the node keeps it, atomically (a reader never sees half),
    readable by every user: fab train and fab status read it without sudo."""
    path = state_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verdict-")
    with os.fdopen(fd, "w") as out:
        json.dump(verdict, out, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def object_key(host: str) -> str:
    """The verdict's key in the bucket: the host's label with only safe characters."""
    return BUCKET_PREFIX + (re.sub(r"[^A-Za-z0-9._-]+", "_", host).strip("_") or "node") + ".json"


def put_verdict(verdict: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The verdict into the stack's bucket with the node's own bucket client (bucket.py)
    and role credentials, as verify's storage probe and the watchdog use them. What
    happened, never an exception: the verdict on the node counts even when this fails."""
    if not args.bucket:
        return {"status": "skip", "reason": "the stack has no bucket"}
    bucket, _ = node._node_bucket()
    key = object_key(str(verdict.get("host") or ""))
    try:
        store = node.node_store(args)
        body = json.dumps(verdict, indent=1, sort_keys=True).encode()
        store.put(key, body, time.monotonic() + 60)
    except ValueError as exc:  # a provider this node has no module for
        return {"status": "error", "reason": str(exc)}
    except bucket.StoreError as exc:
        status = "skip" if exc.code == "NoCredentials" else "error"
        return {"status": status, "reason": str(exc)[:300]}
    return {"status": "ok", "key": key, "url": f"{args.bucket}/{key}"}


def read_verdict(state_dir: Path = STATE_DIR) -> dict[str, Any] | None:
    """The stored verdict, or None when the node has none (or an unreadable one)."""
    try:
        data = json.loads((state_dir / VERDICT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# What the fast check asks (each bounded; a tool that is not installed is simply not read).
COMMANDS = {
    "smi_xml": ["nvidia-smi", "-q", "-x"],
    "nvlink_status": ["nvidia-smi", "nvlink", "--status"],
    "nvlink_errors": ["nvidia-smi", "nvlink", "-e"],
    "lspci": ["lspci", "-n", "-d", "10de:"],
    "fabric_manager": ["systemctl", "is-active", "nvidia-fabricmanager"],
    "ibstat": ["ibstat"],
}
# `dcgmi diag -r 3` runs about half an hour on 8 GPUs; level 1 well under a minute.
DCGM_TIMEOUT_S = {1: 120.0, 2: 900.0, 3: 3600.0}


def collect(
    taken_at: str,
    dcgm_level: int | None = None,
    run: Callable[..., dict[str, Any]] = node.run,
) -> dict[str, Any]:
    """Run the tools and read their outputs into a snapshot, with the seconds each took."""
    texts: dict[str, str | None] = {}
    timings: dict[str, float] = {}
    for key, cmd in {
        **COMMANDS,
        **({"dcgm": ["dcgmi", "diag", "-r", str(dcgm_level), "-j"]} if dcgm_level else {}),
    }.items():
        start = time.monotonic()
        limit = DCGM_TIMEOUT_S[dcgm_level] if key == "dcgm" and dcgm_level else 60.0
        result = run(cmd, timeout=limit)
        timings[key] = round(time.monotonic() - start, 3)
        # `systemctl is-active` exits 3 for an inactive unit and still prints its state; dcgmi
        # exits non-zero when a test fails and still prints the JSON.
        printed = result["out"] if result["out"].strip() else None
        texts[key] = None if result.get("missing") else printed
    # Without infiniband-diags (no ibstat), the ports as sysfs shows them.
    ports = node.collect_infiniband().get("ports") if texts["ibstat"] is None else None
    doc = snapshot(taken_at=taken_at, dcgm_level=dcgm_level, **texts)
    if texts["smi_xml"] is None:  # no nvidia-smi, or one that printed nothing
        doc["nvidia_smi"] = "missing"
    if texts["ibstat"] is None and ports:
        doc["infiniband"] = ports
    start = time.monotonic()
    doc["xid"] = node.collect_xids()
    timings["kernel_log"] = round(time.monotonic() - start, 3)
    doc["timings"] = timings
    return doc


def save(args: argparse.Namespace) -> dict[str, Any]:
    """``--save FILE``: the laptop's verdict kept on the node and in the bucket;
    ``--quarantine``: the node also set aside until it is replaced."""
    verdict = json.loads(Path(args.save).read_text())
    state = Path(args.state_dir)
    out: dict[str, Any] = {"file": str(store_verdict(verdict, state))}
    if args.quarantine:
        mark = {"host": verdict.get("host"), "since": verdict.get("taken_at")}
        out["quarantine"] = str(store_verdict({**mark, "verdict": verdict}, state, QUARANTINE_FILE))
    elif args.release:
        (state / QUARANTINE_FILE).unlink(missing_ok=True)
        out["quarantine"] = "released"
    out["bucket"] = put_verdict(verdict, args)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gpufleet node health snapshot (JSON)")
    parser.add_argument("--dcgm-level", type=int, choices=(1, 2, 3), default=None)
    parser.add_argument("--out", default="-", help="file to write (default: stdout)")
    parser.add_argument("--save", default="", help="a verdict (JSON file) to store instead")
    parser.add_argument("--state-dir", default=str(STATE_DIR))
    parser.add_argument("--quarantine", action="store_true", help="with --save: set aside")
    parser.add_argument("--release", action="store_true", help="with --save: lift it")
    parser.add_argument("--bucket", default="")
    parser.add_argument("--provider", default="")
    parser.add_argument("--region", default="")
    parser.add_argument("--s3-endpoint", default="", help="bucket API override (tests)")
    parser.add_argument("--metadata-url", default="", help="metadata service override (tests)")
    args = parser.parse_args(argv)
    if args.save:
        print(json.dumps(save(args), sort_keys=True))
        return 0
    taken = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc = collect(taken, args.dcgm_level)
    text = json.dumps(doc, indent=1, sort_keys=True)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
