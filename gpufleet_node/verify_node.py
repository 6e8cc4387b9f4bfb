"""Measure one node for ``fab verify-gpu`` and write the raw measurements as one JSON document.

Copied to a temp dir on the node together with verify_smi.py, verify_train.py and the node's
bucket client (bucket.py, clouds/, fleet_names.py: the watchdog's own) and run with the node's
own Python (the venv that install-pytorch made): stdlib here, torch only in the torchrun
workers. Nothing is judged on the node; the laptop compares the numbers with the
catalog. Every probe records its own failure instead of raising, so one broken tool (say,
dmesg without root) never hides the rest of the evidence.

Stages:
- ``--stage local`` (default): inventory and health from nvidia-smi, lspci, the kernel log and
  systemd; GEMM / HBM / all-reduce / training under torchrun on every local GPU while a sampler
  thread reads the PCIe link and throttle reasons under load; scratch and object storage probes.
- ``--stage cross``: the all-reduce and training step across nodes (torchrun with a static
  rendezvous on the head's private IP); run on every node at the same time.

Progress goes to stderr; the JSON goes to --out (stdout with ``--out -``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import mmap
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import verify_smi as smi

SCHEMA = "gpufleet.verify/1"
HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def log(message: str) -> None:
    print(f"verify: {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """Run a command; never raises. ``missing`` says the tool is not installed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return {"rc": None, "out": "", "err": f"{cmd[0]}: not found", "missing": True}
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return {"rc": None, "out": out, "err": f"timed out after {timeout:.0f} s", "missing": False}
    except OSError as exc:
        return {"rc": None, "out": "", "err": str(exc), "missing": False}
    return {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr, "missing": False}


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def collect_nvidia() -> dict[str, Any]:
    """Driver-level inventory and health, topology and NVLink state, PCI ground truth."""
    lspci = run(["lspci", "-n", "-d", "10de:"])
    nvswitch_devices = len(glob.glob("/dev/nvidia-nvswitch*"))
    if shutil.which("nvidia-smi") is None:
        return nvidia_from_outputs(
            None,
            lspci=None if lspci["missing"] else lspci["out"],
            nvswitch_devices=nvswitch_devices,
        )
    q = run(["nvidia-smi", "-q", "-x"], timeout=120)
    topo = run(["nvidia-smi", "topo", "-m"])
    nvlink = run(["nvidia-smi", "nvlink", "--status"])
    return nvidia_from_outputs(
        q,
        topo=topo["out"] if topo["rc"] == 0 else None,
        nvlink=nvlink["out"] if nvlink["rc"] == 0 else None,
        lspci=None if lspci["missing"] else lspci["out"],
        nvswitch_devices=nvswitch_devices,
    )


def nvidia_from_outputs(
    query: dict[str, Any] | None,
    *,
    topo: str | None = None,
    nvlink: str | None = None,
    lspci: str | None = None,
    nvswitch_devices: int = 0,
) -> dict[str, Any]:
    """The ``nvidia`` section of the report from the tools' raw outputs (pure: recorded
    outputs in tests take exactly this path). ``query`` is run()'s result for
    ``nvidia-smi -q -x``; None when nvidia-smi is not installed."""
    out: dict[str, Any] = {"available": False, "error": None, "gpus": []}
    out["pci"] = None if lspci is None else smi.count_pci_gpus(lspci)
    out["nvswitch_devices"] = nvswitch_devices
    if query is None:
        out["error"] = "nvidia-smi not found (no NVIDIA driver installed?)"
        return out
    if "<nvidia_smi_log" not in query["out"]:
        # e.g. "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        out["error"] = f"nvidia-smi -q -x failed: {_tail(query['out'] + query['err'], 3)}"
        return out
    try:
        out.update(smi.parse_smi_xml(query["out"]))
    except ValueError as exc:
        out["error"] = str(exc)
        return out
    out["available"] = bool(out["gpus"])
    if query["rc"] != 0:
        # A GPU that fell off the bus makes nvidia-smi list the others and exit non-zero.
        out["smi_stderr"] = _tail(query["err"] or query["out"], 5)
    out["topology"] = smi.parse_topo(topo) if topo is not None else None
    out["nvlink"] = smi.parse_nvlink_status(nvlink) if nvlink is not None else None
    return out


def collect_xids() -> dict[str, Any]:
    """Xid events since boot. dmesg needs root on most distros (kernel.dmesg_restrict=1)."""
    attempts = [
        ("dmesg", ["dmesg"]),
        ("sudo dmesg", ["sudo", "-n", "dmesg"]),
        ("journalctl -k", ["journalctl", "-k", "-b", "--no-pager", "-q"]),
    ]
    errors = []
    for source, cmd in attempts:
        result = run(cmd, timeout=30)
        if result["rc"] == 0 and result["out"].strip():
            return xid_from_log(source, result["out"])
        errors.append(f"{source}: {_tail(result['err'], 1) or 'no output'}")
    return {"source": None, "events": [], "error": "; ".join(errors)}


def xid_from_log(source: str, text: str) -> dict[str, Any]:
    return {"source": source, "events": smi.parse_xids(text), "error": None}


def collect_fabric_manager() -> dict[str, Any]:
    """nvidia-fabricmanager must run on NVSwitch systems or CUDA sees no peer links."""
    result = run(["systemctl", "is-active", "nvidia-fabricmanager"], timeout=15)
    if result["missing"]:
        return {"state": None, "error": "systemctl not found"}
    return {"state": result["out"].strip() or "unknown", "error": None}


IB_SYSFS = "/sys/class/infiniband"
IB_DEV = "/dev/infiniband"
# The environment the collectives ran with, as the node's process saw it (the report says
# which fabric settings reached NCCL, user overrides included).
NETWORK_ENV_PREFIXES = ("NCCL_", "FI_", "UCX_")
NETWORK_ENV_KEYS = ("CUDA_DEVICE_ORDER",)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def collect_infiniband(sysfs: str = IB_SYSFS, dev: str = IB_DEV) -> dict[str, Any]:
    """InfiniBand HCAs and their ports from sysfs (stdlib only, nothing to install): the
    device nodes NCCL opens under /dev/infiniband, and per port its state ("4: ACTIVE"),
    physical state, link layer (InfiniBand, or Ethernet for RoCE NICs) and rate."""
    dev_path, root = Path(dev), Path(sysfs)
    out: dict[str, Any] = {
        "dev": dev_path.is_dir(),
        "dev_entries": sorted(p.name for p in dev_path.iterdir()) if dev_path.is_dir() else [],
        "sysfs": root.is_dir(),
        "ports": [],
    }
    if not root.is_dir():
        return out
    for hca in sorted(root.iterdir()):
        ports = hca / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir()):
            out["ports"].append(
                {
                    "device": hca.name,
                    "port": port.name,
                    "state": _read_text(port / "state"),
                    "phys_state": _read_text(port / "phys_state"),
                    "link_layer": _read_text(port / "link_layer"),
                    "rate": _read_text(port / "rate"),
                }
            )
    return out


def network_environment(environ: Any = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(NETWORK_ENV_PREFIXES) or k in NETWORK_ENV_KEYS
    }


def collect_host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpus": os.cpu_count(),
    }


_TORCH_PROBE = """
import json, sys
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": f"import torch failed: {type(exc).__name__}: {exc}"}))
    sys.exit(0)
info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "error": None}
try:
    info["cuda_available"] = torch.cuda.is_available()
    info["device_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
    if info["device_count"]:
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            info["nccl"] = None
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(info))
"""


def probe_torch() -> dict[str, Any]:
    """torch's view of the GPUs, in a child process: a CUDA library mismatch can crash the
    interpreter, and the parent must survive to report it."""
    result = run([sys.executable, "-c", _TORCH_PROBE], timeout=120)
    try:
        info: dict[str, Any] = json.loads(result["out"].strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"torch probe crashed (exit {result['rc']}): {_tail(result['err'], 5)}"}
    return info


class LoadSampler(threading.Thread):
    """Reads nvidia-smi every ``interval`` s while the benchmarks run."""

    def __init__(self, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[list[dict[str, Any]]] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        cmd = [
            "nvidia-smi",
            f"--query-gpu={','.join(smi.LOAD_QUERY_FIELDS)}",
            "--format=csv,noheader,nounits",
        ]
        while not self._stop_event.is_set():
            result = run(cmd, timeout=30)
            if result["rc"] == 0:
                self.samples.append(smi.parse_query_csv(result["out"]))
            elif len(self.errors) < 3:
                self.errors.append(_tail(result["err"] or result["out"], 2))
            self._stop_event.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join(timeout=30)
        return {
            "count": len(self.samples),
            "gpus": smi.summarise_load(self.samples),
            "errors": self.errors,
        }


def torchrun_command(
    args: argparse.Namespace,
    *,
    nproc: int,
    phases: str,
    tag: str,
    workdir: Path,
    outdir: Path,
    nnodes: int,
) -> list[str]:
    """The torchrun launch of verify_train.py for one stage."""
    # Without --log-dir torchrun makes a /tmp/torchelastic_* folder per launch and never
    # removes it; inside the workdir it goes away with the verify run's own temp folder.
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--log-dir={workdir / f'torchelastic-{tag}'}",
    ]
    if nnodes > 1:
        cmd += [
            f"--nnodes={nnodes}",
            f"--node-rank={args.node_rank}",
            f"--master-addr={args.master_addr}",
            f"--master-port={args.master_port}",
        ]
    else:
        cmd += ["--standalone", "--nnodes=1"]
    cmd += [
        str(HERE / "verify_train.py"),
        f"--outdir={outdir}",
        f"--phases={phases}",
        f"--mode={args.mode}",
        f"--dtype={args.dtype}",
        f"--tag={tag}",
        f"--bench-seconds={args.bench_seconds}",
    ]
    if args.steps:
        cmd.append(f"--steps={args.steps}")
    return cmd


def torchrun(
    args: argparse.Namespace,
    *,
    nproc: int,
    phases: str,
    tag: str,
    workdir: Path,
    nnodes: int = 1,
) -> dict[str, Any]:
    """Launch verify_train.py on every local GPU (or ``nproc`` CPU processes) and merge the
    per-rank JSON files."""
    outdir = workdir / f"out-{tag}"
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(
        args, nproc=nproc, phases=phases, tag=tag, workdir=workdir, outdir=outdir, nnodes=nnodes
    )
    env = dict(os.environ)
    # torchrun otherwise prints a banner about this on every launch.
    env.setdefault("OMP_NUM_THREADS", "1")
    log_path = workdir / f"torchrun-{tag}.log"
    started = time.monotonic()
    with log_path.open("w") as fh:
        # Own process group, so a timeout takes the workers down with the launcher.
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    merged: dict[str, Any] = {
        "command": " ".join([*cmd[1:3], f"--nproc-per-node={nproc}", f"--nnodes={nnodes}"]),
        "nproc": nproc,
        "nnodes": nnodes,
        "rc": rc,
        "seconds": round(time.monotonic() - started, 2),
        "errors": [],
    }
    if rc is None:
        merged["errors"].append(f"torchrun timed out after {args.timeout:.0f} s and was killed")
    ranks = []
    for path in sorted(outdir.glob(f"{tag}-rank*.json")):
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            merged["errors"].append(f"{path.name}: unreadable ({exc})")
    ranks.sort(key=lambda r: r.get("rank", 0))
    local = [r for r in ranks if "local_rank" in r]
    for r in ranks:
        merged["errors"].extend(r.get("errors", []))
    if rc not in (0, None) and not merged["errors"]:
        merged["errors"].append(f"torchrun exited {rc}: {_tail(log_path.read_text(), 6)}")
    if merged["errors"]:
        merged["log_tail"] = _tail(log_path.read_text(), 30)
    if local:
        merged["runtime"] = local[0].get("runtime")
    merged["gemm"] = [dict(r["gemm"], local_rank=r["local_rank"]) for r in local if "gemm" in r]
    merged["hbm"] = [dict(r["hbm"], local_rank=r["local_rank"]) for r in local if "hbm" in r]
    first = ranks[0] if ranks else {}
    if "allreduce" in first:
        merged["allreduce"] = first["allreduce"]
    if "train" in first:
        merged["train"] = first["train"]
    return merged


def _aligned_buffer(size: int) -> mmap.mmap:
    """Page-aligned memory (O_DIRECT needs aligned buffers) filled with incompressible bytes."""
    buf = mmap.mmap(-1, size)
    chunk = os.urandom(MiB)
    for offset in range(0, size, MiB):
        buf[offset : offset + MiB] = chunk[: min(MiB, size - offset)]
    return buf


def scratch_probe(path: str, size_mb: int, block_mb: int = 8, threads: int = 8) -> dict[str, Any]:
    """Sequential write (fsync'd) then read of one file on the scratch volume.

    ``threads`` requests of ``block_mb`` are in flight at once: one synchronous stream cannot
    keep a RAID 0 of several NVMe devices busy. O_DIRECT bypasses the page cache so the
    numbers are the device's; file systems that refuse it (tmpfs, overlayfs) fall back to
    buffered I/O with fsync and a page-cache drop, and the result says which one was measured.
    """
    result: dict[str, Any] = {"path": path, "bytes": 0, "direct": False, "error": None}
    target = Path(path)
    if not target.is_dir():
        result["error"] = f"{path} does not exist or is not a directory (is scratch mounted?)"
        return result
    result["is_mount"] = os.path.ismount(path)
    result["fs_type"] = _fs_type(path)
    block = block_mb * MiB
    usage = shutil.disk_usage(path)
    size = min(size_mb * MiB, int(usage.free * 0.5)) // block * block
    if size <= 0:
        result["error"] = f"{path} has only {usage.free // MiB} MiB free"
        return result
    threads = max(1, min(threads, size // block))
    buffers = [_aligned_buffer(block) for _ in range(threads)]
    file = target / f".gpufleet-verify-{os.getpid()}.bin"
    direct = getattr(os, "O_DIRECT", 0)
    try:
        try:
            write_s = _file_io(file, buffers, size, direct, write=True)
            result["direct"] = bool(direct)
        except OSError:
            direct = 0
            write_s = _file_io(file, buffers, size, 0, write=True)
        read_s = _file_io(file, buffers, size, direct, write=False)
        result.update(
            bytes=size,
            threads=threads,
            block_bytes=block,
            write_s=round(write_s, 4),
            read_s=round(read_s, 4),
            write_gbs=size / write_s / 1e9,
            read_gbs=size / read_s / 1e9,
        )
    except OSError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for buf in buffers:
            buf.close()
        with contextlib.suppress(OSError):
            file.unlink()
    return result


def _fs_type(path: str) -> str | None:
    best, fs = "", None
    with contextlib.suppress(OSError), open("/proc/mounts") as fh:
        for line in fh:
            parts = line.split()
            mount = parts[1] if len(parts) >= 3 else ""
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if mount and inside and len(mount) > len(best):
                best, fs = mount, parts[2]
    return fs


def _file_io(file: Path, buffers: list[mmap.mmap], size: int, flags: int, *, write: bool) -> float:
    """Seconds to write (and fsync) or read ``size`` bytes, one thread per buffer, each thread
    taking every n-th block so the file is covered front to back."""
    block, n = len(buffers[0]), len(buffers)
    mode = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY
    fd = os.open(file, mode | flags, 0o600)
    try:
        if write:
            os.ftruncate(fd, size)

        def worker(k: int) -> None:
            buf = buffers[k]
            for offset in range(k * block, size, n * block):
                done = os.pwrite(fd, buf, offset) if write else os.preadv(fd, [buf], offset)
                if done != block:
                    raise OSError(f"short {'write' if write else 'read'} at {offset}: {done}")

        with ThreadPoolExecutor(max_workers=n) as pool:
            started = time.perf_counter()
            list(pool.map(worker, range(n)))  # re-raises a worker's OSError here
        if write:
            os.fsync(fd)
        elapsed = time.perf_counter() - started
        if write and not flags and hasattr(os, "posix_fadvise"):
            # Drop the just-written pages so the read that follows hits the device, not RAM.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return elapsed
    finally:
        os.close(fd)


def storage_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Put, get and delete a probe object in the stack's bucket with the node's own bucket
    client (bucket.py, the one the watchdog saves scratch with) and the node's own role
    credentials (its cloud's metadata service: clouds/<name>.py); the same on every cloud.
    SKIP, with the reason, when the node has no credentials."""
    if not args.bucket:
        return {"status": "skip", "reason": "the stack has no bucket"}
    payload = os.urandom(MiB)
    key = f"gpufleet-verify/{socket.gethostname()}-{int(time.time())}.probe"
    base = {"bucket": args.bucket, "key": key, "bytes": len(payload)}
    return {**base, **_bucket_round_trip(args, key, payload)}


# What the probe reports as its tool: the node's stdlib client, whichever the cloud.
BUCKET_TOOL = "bucket.py"


def _node_bucket() -> tuple[Any, Any]:
    """The package's bucket client and node clouds (bucket.py, clouds/ beside this file),
    imported only here: only the probe needs them."""
    from . import bucket, clouds

    return bucket, clouds


def node_store(args: argparse.Namespace) -> Any:
    """The stack's bucket through the node's own client and identity: its cloud's node
    module (clouds/<provider>.py) says which store, where, and with which credentials. A
    ValueError names a provider this node has no module for."""
    _, clouds = _node_bucket()
    cloud = clouds.node_cloud(args.provider, args.region, "", args.metadata_url)
    return cloud.bucket_store.for_node(
        endpoint=cloud.bucket_endpoint(),
        region=args.region,
        bucket=args.bucket,
        credentials=cloud.credentials,
        endpoint_url=args.s3_endpoint or "",
    )


def _store_failure(bucket: Any, exc: Exception) -> dict[str, Any]:
    """A bucket error as a result: SKIP when the node has no credentials, else ERROR."""
    code = getattr(exc, "code", "")
    status = "skip" if code == "NoCredentials" else "error"
    reason = f"{code}: {exc}" if code and code not in str(exc) else str(exc)
    return {"status": status, "tool": BUCKET_TOOL, "reason": reason}


# Where fab verify-gpu's saved reports go in the stack's bucket.
REPORT_PREFIX = "gpufleet/verify/"


def upload_report(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """Copy a saved verify report (fab verify-gpu ships it to the head) into the stack's
    bucket under REPORT_PREFIX, with the probe's client and the node's own identity, so
    the laptop needs no bucket credentials of any cloud. Never raises."""
    if not args.bucket:
        return {"status": "skip", "reason": "the stack has no bucket"}
    bucket, _ = _node_bucket()
    key = REPORT_PREFIX + path.name
    try:
        store = node_store(args)
        store.put(key, path.read_bytes(), time.monotonic() + 300)
    except ValueError as exc:  # a provider this node has no module for
        return {"status": "error", "tool": BUCKET_TOOL, "reason": str(exc)}
    except bucket.StoreError as exc:
        return _store_failure(bucket, exc)
    except OSError as exc:
        return {"status": "error", "tool": BUCKET_TOOL, "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "tool": BUCKET_TOOL, "url": store.url(key)}


def _bucket_round_trip(args: argparse.Namespace, key: str, payload: bytes) -> dict[str, Any]:
    bucket, _ = _node_bucket()
    timings: dict[str, float] = {}
    try:
        store = node_store(args)
        deadline = time.monotonic() + 300
        t = time.perf_counter()
        store.put(key, payload, deadline)
        timings["put_s"] = time.perf_counter() - t
        t = time.perf_counter()
        _, _, body = store.request("GET", key, deadline=deadline)
        timings["get_s"] = time.perf_counter() - t
        t = time.perf_counter()
        store.request("DELETE", key, deadline=deadline)
        timings["delete_s"] = time.perf_counter() - t
    except ValueError as exc:  # a provider this node has no module for
        return {"status": "error", "tool": BUCKET_TOOL, "reason": str(exc)}
    except bucket.StoreError as exc:
        return {**_store_failure(bucket, exc), **timings}
    return _verified(BUCKET_TOOL, payload, body, timings)


def _verified(tool: str, payload: bytes, body: bytes, timings: dict[str, float]) -> dict[str, Any]:
    if hashlib.sha256(body).digest() != hashlib.sha256(payload).digest():
        return {"status": "error", "tool": tool, "reason": "object read back differs", **timings}
    return {"status": "ok", "tool": tool, **{k: round(v, 4) for k, v in timings.items()}}


def _phases(args: argparse.Namespace) -> str:
    if args.quick:
        return "gemm" if args.mode == "gpu" else ""
    return "gemm,hbm,allreduce,train" if args.mode == "gpu" else "allreduce,train"


def local_stage(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"host": collect_host()}
    timings: dict[str, float] = {}

    def timed(name: str, fn: Any, *a: Any) -> Any:
        log(f"{name} ...")
        t = time.monotonic()
        value = fn(*a)
        timings[name] = round(time.monotonic() - t, 2)
        return value

    report["nvidia"] = timed("nvidia-smi", collect_nvidia)
    report["xid"] = timed("kernel log", collect_xids)
    report["fabric_manager"] = timed("fabric manager", collect_fabric_manager)
    report["infiniband"] = timed("infiniband", collect_infiniband)
    report["torch"] = timed("torch probe", probe_torch)
    gpus = int(report["torch"].get("device_count") or 0)
    phases = _phases(args)
    if args.mode == "gpu" and not gpus:
        why = report["nvidia"].get("error") or report["torch"].get("error") or "no CUDA device"
        report["skipped"] = f"GPU benchmarks not run: {why}"
        log(report["skipped"])
    elif phases:
        nproc = gpus if args.mode == "gpu" else args.nproc
        sampler = LoadSampler() if args.mode == "gpu" and report["nvidia"]["available"] else None
        if sampler:
            sampler.start()
        report["torchrun"] = timed(
            "torchrun",
            lambda: torchrun(args, nproc=nproc, phases=phases, tag="local", workdir=workdir),
        )
        if sampler:
            report["load"] = sampler.stop()
        if args.mode == "gpu":
            add_mfu(report["torchrun"], args.peak_tflops)
    if not args.quick:
        report["scratch"] = timed("scratch", scratch_probe, args.scratch, args.scratch_mb)
    report["storage"] = timed("object storage", storage_probe, args)
    report["timings"] = timings
    return report


def cross_stage(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"host": collect_host(), "network_env": network_environment()}
    nproc = args.nproc
    if args.mode == "gpu":
        nproc = int(probe_torch().get("device_count") or 0)
        if not nproc:
            return {**report, "skipped": "no CUDA device: cross-node stage not run"}
    log(f"cross-node torchrun: node {args.node_rank} of {args.nnodes}, master {args.master_addr}")
    report["torchrun"] = torchrun(
        args,
        nproc=nproc,
        phases="allreduce,train",
        tag="cross",
        workdir=workdir,
        nnodes=args.nnodes,
    )
    add_mfu(report["torchrun"], args.peak_tflops)
    return report


def add_mfu(run: dict[str, Any], peak_tflops: float) -> None:
    """Model FLOPs utilisation against the peak the caller names (the catalog's, per GPU)."""
    train = run.get("train")
    if not train or not peak_tflops or not train.get("tokens_per_s"):
        return
    achieved = train["tokens_per_s"] * train["flops_per_token"]
    train["achieved_tflops"] = achieved / 1e12
    train["mfu"] = achieved / (train["world"] * peak_tflops * 1e12)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="-", help="where to write the JSON report ('-': stdout)")
    p.add_argument("--stage", choices=("local", "cross"), default="local")
    p.add_argument("--mode", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--quick", action="store_true", help="skip training and bandwidth tests")
    p.add_argument("--nproc", type=int, default=2, help="processes in CPU mode")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float16"), default="auto")
    p.add_argument("--steps", type=int, default=0, help="training steps (0: the worker's default)")
    p.add_argument("--bench-seconds", type=float, default=1.5)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before torchrun is killed")
    p.add_argument("--scratch", default="/scratch")
    p.add_argument("--scratch-mb", type=int, default=4096)
    p.add_argument("--bucket", default="")
    p.add_argument(
        "--provider",
        default="",
        help="the stack's cloud: which node module (clouds/<name>.py) reaches the bucket",
    )
    p.add_argument("--region", default="")
    p.add_argument("--s3-endpoint", default=None, help="bucket API override (tests, MinIO)")
    p.add_argument("--metadata-url", default="", help="metadata service override (tests)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="per-GPU peak, for MFU")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29512)
    p.add_argument("--workdir", default=None, help="scratch space for logs (default: a temp dir)")
    p.add_argument(
        "--upload-report",
        default="",
        help="copy this saved report into the bucket (no stage runs); the result as JSON",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.upload_report:
        print(json.dumps(upload_report(args, Path(args.upload_report))))
        return 0
    started = time.monotonic()
    # A workdir made here is removed at the end (the report keeps the log tails); one given
    # with --workdir belongs to the caller (fab removes the whole verify folder on the node).
    own_workdir = not args.workdir
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpufleet-verify-run-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "stage": args.stage,
        "mode": args.mode,
        "quick": args.quick,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        stage = local_stage if args.stage == "local" else cross_stage
        report.update(stage(args, workdir))
    except Exception as exc:  # the report must still come back, with the reason
        report["fatal"] = f"{type(exc).__name__}: {exc}"
    if own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    report["wall_s"] = round(time.monotonic() - started, 2)
    text = json.dumps(report, indent=1, default=str)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
    log(f"done in {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
