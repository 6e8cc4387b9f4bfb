"""A virtualenv on the node with a pinned PyTorch build matched to the node's CUDA.

The wheel index is chosen by :func:`torch_index_url` (pure): the newest CUDA build the loaded
driver can run, never newer than the GPU allows (Volta stops at cu126: CUDA 13 dropped it),
the CPU build on nodes without a GPU. ``--torch-index default`` uses whatever pip is
configured with on the node (a mirror, a local wheelhouse), ``--torch-index URL`` any index.

The torch download (0.2-0.9 GB, a minute or more) shows its progress: pip runs with a temp
dir of its own that the node polls (:func:`pip_with_download_poll`), and
:func:`read_pip_line` / :func:`download_text` (pure) turn pip's lines and the polls into one
line per host: the wheel, bytes received of its size, elapsed time.
"""

from __future__ import annotations

import json as jsonlib
import posixpath
import re
import shlex
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fabric import Connection
from invoke import Context

from bootstrap.fleet.api import (
    DEFAULT_TORCH,
    DEFAULT_TORCH_INDEX,
    DEFAULT_VENV,
    HostContext,
    Options,
    StepFailed,
    StepResult,
    step,
)
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.system import ProgressStream, apt_get, check, root_sh, sh
from bootstrap.tasks.driver import gpu_architecture

PYTORCH_INDEX = "https://download.pytorch.org/whl"

# CUDA builds published for the pinned torch release, newest first: (min driver CUDA, tag).
CUDA_BUILDS: tuple[tuple[tuple[int, int], str], ...] = (
    ((13, 0), "cu130"),
    ((12, 8), "cu128"),
    ((12, 6), "cu126"),
)
# The CUDA version the default driver branch (R580) supports, used when the driver was just
# installed and is not loaded yet (reboot pending).
BRANCH_CUDA: dict[str, tuple[int, int]] = {"580": (13, 0), "575": (12, 9), "570": (12, 8)}


def torch_build_tag(
    *, gpu_count: int, cuda_version: tuple[int, int] | None, arch: str | None
) -> str:
    """'cpu', 'cu126', 'cu128' or 'cu130' for this node."""
    if gpu_count == 0:
        return "cpu"
    if cuda_version is None:
        raise ValueError("the node has a GPU but no loaded driver: run install-driver first")
    ceiling = (12, 6) if arch == "volta" else (99, 0)
    floor = (12, 8) if arch == "blackwell" else (0, 0)
    for minimum, tag in CUDA_BUILDS:
        if minimum <= cuda_version and minimum <= ceiling and minimum >= floor:
            return tag
    have = f"{cuda_version[0]}.{cuda_version[1]}"
    raise ValueError(
        f"the driver supports CUDA {have}, older than any PyTorch build for this GPU; "
        "upgrade the driver (fab install-driver --driver-branch 580)"
    )


def torch_index_url(
    choice: str,
    *,
    gpu_count: int,
    cuda_version: tuple[int, int] | None,
    arch: str | None,
    base: str = PYTORCH_INDEX,
) -> str | None:
    """The ``--index-url`` for pip: None means "the node's own pip configuration"."""
    if choice == "default":
        return None
    if choice != "auto":
        if not choice.startswith(("https://", "http://", "file://")):
            raise ValueError(f"--torch-index must be auto, default or a URL, got {choice!r}")
        return choice
    tag = torch_build_tag(gpu_count=gpu_count, cuda_version=cuda_version, arch=arch)
    return f"{base}/{tag}"


def installed_matches(installed: str | None, wanted: str, index_url: str | None) -> bool:
    """Does the installed torch (e.g. '2.13.0+cu128') satisfy the pin and the build?"""
    if not installed:
        return False
    version, _, local = installed.partition("+")
    if version != wanted:
        return False
    if index_url is None:
        return True  # whatever the node's pip provides is what was asked for
    tag = index_url.rstrip("/").rsplit("/", 1)[-1]
    if tag.startswith("cu") or tag == "cpu":
        # PyPI's default Linux torch is a CUDA build without a local tag; only a tagged
        # build proves which index it came from.
        return local == tag
    return True


# Reads the installed version without importing torch (which takes seconds); the import
# only happens when CUDA must be checked.
_VERSION_PROBE = (
    "import json,importlib.metadata as m\n"
    "try: v=m.version('torch')\n"
    "except m.PackageNotFoundError: v=None\n"
    "print(json.dumps({'torch': v}))"
)
_CUDA_PROBE = (
    "import json,torch\n"
    "ok=torch.cuda.is_available()\n"
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
    "'available': ok, 'devices': torch.cuda.device_count() if ok else 0}))"
)


def _venv_python(venv: str) -> str:
    return f"{venv.rstrip('/')}/bin/python"


def _installed_torch(conn: Connection, venv: str) -> str | None:
    py = _venv_python(venv)
    result = sh(
        conn, f"test -x {shlex.quote(py)} && {shlex.quote(py)} -c {shlex.quote(_VERSION_PROBE)}"
    )
    if not result.ok:
        return None
    try:
        value = jsonlib.loads(result.stdout.strip().splitlines()[-1])["torch"]
    except (ValueError, IndexError, KeyError):
        return None
    return str(value) if value else None


def _ensure_venv(conn: Connection, ctx: HostContext, venv: str) -> None:
    if sh(conn, f"test -x {shlex.quote(_venv_python(venv))}").ok:
        return
    # Ubuntu splits ensurepip into python3-venv; without it `python3 -m venv` fails.
    if not sh(conn, "python3 -c 'import ensurepip, venv'").ok:
        ctx.progress("installing python3-venv")
        apt_get(conn, ctx, "install", "--no-install-recommends", "python3-venv")
    ctx.progress(f"creating virtualenv {venv}")
    check(root_sh(conn, ctx, f"python3 -m venv {shlex.quote(venv)}"), f"creating {venv}")


def pip_install_command(venv: str, version: str, index_url: str | None) -> Sequence[str]:
    cmd = [_venv_python(venv), "-m", "pip", "install", "--progress-bar", "off", f"torch=={version}"]
    if index_url:
        cmd += ["--index-url", index_url]
    return cmd


# ------------------------------------------------------------------ download progress

# pip (23 and 24 alike) writes each file it downloads to $TMPDIR/pip-unpack-*/<file name>
# as the bytes arrive, whatever its --progress-bar setting; it prints the file's size first
# ("Downloading <url or name> (191.8 MB)"). With TMPDIR a folder of its own, the sizes of
# the files there are the bytes received so far.
DOWNLOAD_MARK = "gpufleet-download"
POLL_SECONDS = 2
# pip's lines worth a line of their own (the download itself is the live line).
PIP_MILESTONES = r"^(Collecting|Downloading|Installing|Successfully|Using cached|Processing)"


def pip_with_download_poll(pip_cmd: str, poll_s: int = POLL_SECONDS) -> str:
    """``pip_cmd`` (a shell command) with its own TMPDIR, whose pip download files are
    listed as ``gpufleet-download BYTES NAME`` lines every ``poll_s`` seconds while it runs.
    The exit status is pip's; the folder is removed however the command ends."""
    listing = f"find \"$d\" -path '*/pip-unpack-*' -type f -printf '{DOWNLOAD_MARK} %s %f\\n'"
    return (
        'd=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-pip.XXXXXX") || exit 1; '
        "trap 'rm -rf \"$d\"' EXIT; "
        f'TMPDIR="$d" {pip_cmd} & p=$!; '
        f'while kill -0 "$p" 2>/dev/null; do sleep {int(poll_s)}; {listing} 2>/dev/null; done; '
        'wait "$p"'
    )


@dataclass(frozen=True)
class PipDownload:
    """What pip's output and the node's polls have said so far about the current download."""

    file: str | None = None  # the file pip said it downloads (URL-decoded base name)
    total: int | None = None  # its size as pip printed it, in bytes
    received: int = 0  # bytes of it on the node's disk at the last poll
    polled: bool = False  # a poll has seen it

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.received / self.total)


_SIZE_UNITS = {"bytes": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
_DOWNLOADING = re.compile(r"^\s*Downloading\s+(\S+)(?:\s+\(([\d.]+)\s*(bytes|kB|MB|GB)\))?")


def parse_pip_size(number: str, unit: str) -> int:
    """pip's printed size (``191.8 MB``: decimal units, as pip's format_size) in bytes."""
    return int(float(number) * _SIZE_UNITS[unit.lower()])


def read_pip_line(state: PipDownload, line: str) -> PipDownload:
    """The download state after one line of the node's output (pip's or a poll's)."""
    if line.startswith(DOWNLOAD_MARK + " "):
        parts = line.split(" ", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return state
        size, name = int(parts[1]), parts[2].strip()
        if state.file is None:
            return replace(state, file=name, received=size, polled=True)
        if name == state.file:
            return replace(state, received=size, polled=True)
        return state
    m = _DOWNLOADING.match(line)
    if m is None:
        return state
    name = urllib.parse.unquote(posixpath.basename(urllib.parse.urlsplit(m.group(1)).path))
    total = parse_pip_size(m.group(2), m.group(3)) if m.group(2) else None
    return PipDownload(file=name, total=total)


def wheel_label(file: str) -> str:
    """``torch 2.13.0+cu128`` for ``torch-2.13.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl``."""
    if file.endswith(".whl"):
        name, _, rest = file.partition("-")
        return f"{name} {rest.partition('-')[0]}".strip()
    for ext in (".tar.gz", ".zip"):
        if file.endswith(ext):
            return file[: -len(ext)]
    return file


def _megabytes(n: int, scale: int) -> str:
    """``n`` bytes in MB, with a decimal only where ``scale`` (the total) is under 10 MB."""
    return f"{n / 1e6:.1f}" if scale < 10e6 else f"{n / 1e6:.0f}"


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


def download_text(state: PipDownload, elapsed_s: float) -> str | None:
    """One short line (at most 51 characters for torch's wheels), or None before a poll."""
    if not state.polled or state.file is None:
        return None
    label, when = wheel_label(state.file), _elapsed(elapsed_s)
    if state.total is None or state.fraction is None:
        return f"{label}: {_megabytes(state.received, state.received)} MB, {when}"
    got, total = (_megabytes(n, state.total) for n in (state.received, state.total))
    return f"{label}: {got} of {total} MB ({state.fraction * 100:.0f} %), {when}"


class PipProgress:
    """pip's stdout on its way from the node: polls become the host's live download line
    (``ctx.tick``), pip's milestones stay progress lines."""

    def __init__(self, ctx: HostContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx, self.clock = ctx, clock
        self.started = clock()
        self.state = PipDownload()
        self.milestones = ProgressStream(ctx, PIP_MILESTONES)
        self.buffer = ""

    def write(self, data: str) -> int:
        self.buffer += data
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            self.state = read_pip_line(self.state, line)
            if not line.startswith(DOWNLOAD_MARK):
                self.milestones.write(line + "\n")
                continue
            text = download_text(self.state, self.clock() - self.started)
            if text:
                self.ctx.tick(text, self.state.fraction)
        return len(data)

    def flush(self) -> None:
        pass


@step("install-pytorch")
def install_pytorch_step(conn: Connection, ctx: HostContext) -> StepResult:
    f = ctx.facts
    opts = ctx.options
    gpu_count = int(f.get("gpu_count", 0))
    if gpu_count == 0 and not opts.allow_no_gpu:
        return StepResult.failed(
            f"no NVIDIA GPU on this node ({f.get('gpu_evidence', 'none detected')}); "
            "pass --allow-no-gpu to install the CPU build anyway"
        )
    names = [g.name for g in f.get("smi_gpus", [])] + list(f.get("lspci_names", []))
    arch = gpu_architecture([*names, *([ctx.tier.gpu_model] if ctx.tier.gpu_model else [])])
    cuda = f.get("cuda_driver_version")
    reboot_pending = bool(f.get("reboot_required")) and not f.get("driver_loaded")
    if gpu_count and cuda is None and reboot_pending and opts.driver_branch in BRANCH_CUDA:
        cuda = BRANCH_CUDA[opts.driver_branch]
    elif gpu_count and cuda is None and reboot_pending:
        cuda = BRANCH_CUDA["580"]
    try:
        index_url = torch_index_url(
            opts.torch_index, gpu_count=gpu_count, cuda_version=cuda, arch=arch
        )
    except ValueError as exc:
        raise StepFailed(str(exc)) from None
    details: dict[str, object] = {"venv": opts.venv, "index_url": index_url or "(node pip config)"}
    installed = _installed_torch(conn, opts.venv)
    changed = False
    if not installed_matches(installed, opts.torch_version, index_url):
        _ensure_venv(conn, ctx, opts.venv)
        cmd = " ".join(
            shlex.quote(a) for a in pip_install_command(opts.venv, opts.torch_version, index_url)
        )
        was = f" (replacing {installed})" if installed else ""
        ctx.progress(f"pip install torch=={opts.torch_version}{was} from {details['index_url']}")
        pip = root_sh(
            conn, ctx, pip_with_download_poll(cmd), timeout=3600, out_stream=PipProgress(ctx)
        )
        check(pip, "pip install torch")
        installed = _installed_torch(conn, opts.venv)
        if not installed_matches(installed, opts.torch_version, index_url):
            raise StepFailed(
                f"pip finished but the venv has torch {installed}, not {opts.torch_version}"
            )
        changed = True
    details["torch"] = installed
    f["torch_version"] = installed
    if gpu_count == 0:
        note = "CPU build; CUDA not checked (no NVIDIA GPU)"
    elif reboot_pending:
        note = "CUDA not checked: the node needs a reboot to load the driver"
    else:
        py = shlex.quote(_venv_python(opts.venv))
        probe = check(sh(conn, f"{py} -c {shlex.quote(_CUDA_PROBE)}", timeout=300), "import torch")
        info = jsonlib.loads(probe.strip().splitlines()[-1])
        details.update(cuda=info["cuda"], cuda_devices=info["devices"])
        if not info["available"]:
            raise StepFailed(
                f"torch {info['torch']} (CUDA {info['cuda']}) sees no GPU: "
                "torch.cuda.is_available() is False; check the driver (nvidia-smi)",
                **details,
            )
        note = f"torch.cuda.is_available() on {info['devices']} GPU(s)"
    if changed:
        return StepResult.changed(f"installed torch {installed} in {opts.venv}; {note}", **details)
    return StepResult.ok(f"torch {installed} already in {opts.venv}; {note}", **details)


@fleet_task(
    help={
        "venv": f"virtualenv on the node (default {DEFAULT_VENV})",
        "torch_version": f"torch version to pin (default {DEFAULT_TORCH})",
        "torch_index": "auto (CUDA-matched download.pytorch.org index), default (the node's "
        "pip config) or an index URL",
        "allow_no_gpu": "install the CPU build on nodes without an NVIDIA GPU",
    }
)
def install_pytorch(
    c: Context,
    fleet_args: FleetArgs,
    venv: str = DEFAULT_VENV,
    torch_version: str = DEFAULT_TORCH,
    torch_index: str = DEFAULT_TORCH_INDEX,
    allow_no_gpu: bool = False,
) -> None:
    """Create the node's PyTorch virtualenv with a CUDA-matched torch build."""
    options = Options(
        allow_no_gpu=allow_no_gpu, venv=venv, torch_version=torch_version, torch_index=torch_index
    )
    fleet_run(
        c,
        "install-pytorch",
        [install_pytorch_step],
        fleet_args,
        options=options,
    )
