"""Parsers for what nvidia-smi, lspci and the kernel log print about NVIDIA GPUs.

Stdlib only: this file is copied to the node and run there next to verify_node.py, and the
laptop imports the same parsers to read recorded outputs in tests. Every parser is tolerant:
a field a driver version does not print comes back as None, never as an exception, so one odd
GPU cannot hide the findings about the others.

Field names follow the nvidia-smi XML schema (nvsmi_device_v11/v12 DTDs) and the
``--query-gpu`` names listed by ``nvidia-smi --help-query-gpu``; older drivers call the clock
"event reasons" "throttle reasons", and both spellings are read.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

# The fields sampled while the GPUs are under load (PCIe links train down to gen1 at idle to
# save power, so only a reading under load says what the link can do).
LOAD_QUERY_FIELDS = (
    "index",
    "pci.bus_id",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "utilization.gpu",
    "temperature.gpu",
    "clocks_throttle_reasons.active",
    "power.draw",
)

# nvmlClocksThrottleReasons bits (nvml.h); the names match the XML element suffixes.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
# "NVRM: Xid (PCI:0000:10:1c): 79, pid=..., GPU has fallen off the bus." Older drivers omit
# the "PCI:" prefix.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)")
_NVLINK_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?)(?: \(UUID: (?P<uuid>[^)]+)\))?\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (?P<link>\d+): (?P<value>.+?)\s*$")


def number(text: str | None) -> float | None:
    """The first number in a value like '40960 MiB', '33 C', '16x' or '1410 MHz'; None for N/A."""
    if text is None:
        return None
    match = _NUM.search(text)
    return float(match.group()) if match else None


def _int(text: str | None) -> int | None:
    value = number(text)
    return None if value is None else int(value)


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value or None


def _yes(text: str | None) -> bool | None:
    if text is None or text.upper() == "N/A":
        return None
    return text.strip().lower() in ("yes", "enabled", "active", "on")


def _ecc_counts(node: ET.Element | None) -> dict[str, int | None]:
    """Corrected/uncorrected totals from either ECC layout.

    Drivers before R470 nest ``single_bit``/``double_bit`` with a ``total``; newer ones list
    ``sram_*``/``dram_*`` counters (R535 splits SRAM uncorrectable into parity and SECDED).
    """
    if node is None:
        return {"corrected": None, "uncorrected": None}
    if node.find("single_bit") is not None or node.find("double_bit") is not None:
        return {
            "corrected": _int(_text(node, "single_bit/total")),
            "uncorrected": _int(_text(node, "double_bit/total")),
        }
    leaves = {child.tag: _int(child.text) for child in node if len(child) == 0}
    if "sram_uncorrectable" in leaves:
        # The split counters repeat what the summed one already counts.
        leaves = {k: v for k, v in leaves.items() if not k.startswith("sram_uncorrectable_")}
    corrected = [v for k, v in leaves.items() if k.endswith("_correctable") and v is not None]
    uncorrected = [
        v
        for k, v in leaves.items()
        if "_uncorrectable" in k and v is not None and "sources" not in k
    ]
    return {
        "corrected": sum(corrected) if corrected else None,
        "uncorrected": sum(uncorrected) if uncorrected else None,
    }


def _throttle(gpu: ET.Element) -> list[str]:
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        node = gpu.find(section)
        if node is not None:
            return [
                child.tag.removeprefix(prefix)
                for child in node
                if (child.text or "").strip().lower() == "active"
            ]
    return []


def _gpu(gpu: ET.Element) -> dict[str, Any]:
    link = gpu.find("pci/pci_gpu_link_info")
    retired = gpu.find("retired_pages")
    remap = gpu.find("remapped_rows")
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    pending_retire = _yes(_text(retired, "pending_retirement"))
    if pending_retire is None:
        pending_retire = _yes(_text(retired, "pending_blacklist"))
    return {
        "index": _int(_text(gpu, "minor_number")),
        "name": _text(gpu, "product_name"),
        "uuid": _text(gpu, "uuid"),
        "bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
        "serial": _text(gpu, "serial"),
        "vbios": _text(gpu, "vbios_version"),
        "memory_total_mib": number(_text(gpu, "fb_memory_usage/total")),
        "persistence_mode": _yes(_text(gpu, "persistence_mode")),
        "mig_current": _yes(_text(gpu, "mig_mode/current_mig")),
        "mig_pending": _yes(_text(gpu, "mig_mode/pending_mig")),
        "ecc_mode": _yes(_text(gpu, "ecc_mode/current_ecc")),
        "ecc_volatile": _ecc_counts(gpu.find("ecc_errors/volatile")),
        "ecc_aggregate": _ecc_counts(gpu.find("ecc_errors/aggregate")),
        "retired_pages": {
            "single_bit": _int(_text(retired, "multiple_single_bit_retirement/retired_count")),
            "double_bit": _int(_text(retired, "double_bit_retirement/retired_count")),
            "pending": pending_retire,
        },
        "remapped_rows": {
            "correctable": _int(_text(remap, "remapped_row_corr")),
            "uncorrectable": _int(_text(remap, "remapped_row_unc")),
            "pending": _yes(_text(remap, "remapped_row_pending")),
            "failure": _yes(_text(remap, "remapped_row_failure")),
        },
        "pcie": {
            "gen_current": _int(_text(link, "pcie_gen/current_link_gen")),
            "gen_max": _int(_text(link, "pcie_gen/max_link_gen")),
            "width_current": _int(_text(link, "link_widths/current_link_width")),
            "width_max": _int(_text(link, "link_widths/max_link_width")),
        },
        "temperature_c": number(_text(gpu, "temperature/gpu_temp")),
        "temperature_slowdown_c": number(_text(gpu, "temperature/gpu_temp_slow_threshold")),
        "throttle_reasons": _throttle(gpu),
        "power_limit_w": number(_text(power, "current_power_limit"))
        or number(_text(power, "power_limit")),
        "sm_clock_mhz": number(_text(gpu, "clocks/sm_clock")),
        "sm_clock_max_mhz": number(_text(gpu, "max_clocks/sm_clock")),
    }


def parse_smi_xml(text: str) -> dict[str, Any]:
    """``nvidia-smi -q -x`` -> driver, CUDA version and one dict per GPU, in index order.

    Raises ValueError when the text is not an nvidia-smi XML log at all.
    """
    # The DOCTYPE names a DTD file that is not on the node; ElementTree ignores it.
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi -q -x output is not XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"expected <nvidia_smi_log>, found <{root.tag}>")
    gpus = [_gpu(g) for g in root.findall("gpu")]
    for position, gpu in enumerate(gpus):
        if gpu["index"] is None:
            gpu["index"] = position
    gpus.sort(key=lambda g: g["index"])
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": _int(_text(root, "attached_gpus")),
        "gpus": gpus,
    }


def parse_query_csv(text: str, fields: tuple[str, ...] = LOAD_QUERY_FIELDS) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` -> one dict per line.

    Numbers become floats (hex bitmasks ints), '[N/A]' / 'N/A' / '[Not Supported]' None.
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields):
            continue  # a warning line or a partial write; the next sample will do
        row: dict[str, Any] = {}
        for field, value in zip(fields, values, strict=True):
            if value.startswith("[") or value.upper() == "N/A":
                row[field] = None
            elif value.lower().startswith("0x"):
                row[field] = int(value, 16)
            elif field == "pci.bus_id":
                row[field] = value
            else:
                row[field] = number(value) if _NUM.fullmatch(value) else value
        rows.append(row)
    return rows


def throttle_reasons(mask: int | None) -> list[str]:
    """Names of the bits set in a clocks_throttle_reasons.active bitmask."""
    if not mask:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def summarise_load(samples: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per GPU, what the load samples showed: best PCIe link, hottest reading, every throttle
    reason seen while the GPU was busy (idle-clock reasons mean nothing during a benchmark)."""
    by_index: dict[int, dict[str, Any]] = {}
    for sample in samples:
        for row in sample:
            index = row.get("index")
            if index is None:
                continue
            util = row.get("utilization.gpu") or 0.0
            entry = by_index.setdefault(
                int(index),
                {
                    "index": int(index),
                    "bus_id": row.get("pci.bus_id"),
                    "samples": 0,
                    "busy_samples": 0,
                    "util_max": 0.0,
                    "pcie_gen_busy_max": None,
                    "pcie_width_busy_max": None,
                    "pcie_gen_max": row.get("pcie.link.gen.max"),
                    "pcie_width_max": row.get("pcie.link.width.max"),
                    "temperature_max_c": None,
                    "power_max_w": None,
                    "throttle_reasons": [],
                },
            )
            entry["samples"] += 1
            entry["util_max"] = max(entry["util_max"], util)
            for key, field in (
                ("temperature_max_c", "temperature.gpu"),
                ("power_max_w", "power.draw"),
            ):
                value = row.get(field)
                if value is not None:
                    entry[key] = value if entry[key] is None else max(entry[key], value)
            if util < 50:
                continue
            entry["busy_samples"] += 1
            for key, field in (
                ("pcie_gen_busy_max", "pcie.link.gen.current"),
                ("pcie_width_busy_max", "pcie.link.width.current"),
            ):
                value = row.get(field)
                if value is not None:
                    entry[key] = value if entry[key] is None else max(entry[key], value)
            for reason in throttle_reasons(row.get("clocks_throttle_reasons.active")):
                if reason not in entry["throttle_reasons"]:
                    entry["throttle_reasons"].append(reason)
    return [by_index[i] for i in sorted(by_index)]


def parse_topo(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -m`` -> the GPU-to-GPU connection matrix, e.g. {'GPU0': {'GPU1': 'NV12'}}.

    NIC rows/columns and the affinity columns are dropped; the legend below the matrix too.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    header_index = next(
        (i for i, line in enumerate(lines) if line.split() and line.split()[0] == "GPU0"), None
    )
    if header_index is None:
        return {"gpus": [], "links": {}}
    gpu_columns = [h for h in lines[header_index].split() if re.fullmatch(r"GPU\d+", h)]
    links: dict[str, dict[str, str]] = {}
    for line in lines[header_index + 1 :]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            if cells and cells[0] == "Legend:":
                break
            continue
        row = cells[0]
        values = cells[1 : 1 + len(gpu_columns)]
        links[row] = {col: val for col, val in zip(gpu_columns, values, strict=False) if col != row}
    return {"gpus": sorted(links, key=lambda g: int(g[3:])), "links": links}


def parse_nvlink_status(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi nvlink --status`` -> per GPU, each link's speed in GB/s (None = inactive)."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = _NVLINK_GPU.match(line.strip())
        if head and not line.startswith((" ", "\t")):
            gpus.append(
                {
                    "index": int(head["index"]),
                    "name": head["name"],
                    "uuid": head["uuid"],
                    "links": [],
                }
            )
            continue
        link = _NVLINK_LINK.match(line)
        if link and gpus:
            value = link["value"]
            speed = None if "inactive" in value.lower() else number(value)
            gpus[-1]["links"].append({"link": int(link["link"]), "gbs": speed})
    return gpus


def parse_xids(log_text: str) -> list[dict[str, Any]]:
    """Xid events in kernel log text (dmesg or journalctl -k), oldest first."""
    events = []
    for line in log_text.splitlines():
        match = _XID.search(line)
        if match:
            events.append(
                {"xid": int(match["xid"]), "pci": match["pci"].lower(), "line": line.strip()[:300]}
            )
    return events


def count_pci_gpus(lspci_text: str) -> dict[str, int]:
    """``lspci -n -d 10de:`` -> how many NVIDIA GPUs (class 0300/0302) and NVSwitches (0680)
    the PCI bus shows, whatever the driver thinks."""
    gpus = nvswitches = 0
    for line in lspci_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        klass = parts[1].rstrip(":")
        if klass in ("0300", "0302"):
            gpus += 1
        elif klass == "0680":
            nvswitches += 1
    return {"gpus": gpus, "nvswitches": nvswitches}
