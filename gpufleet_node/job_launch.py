"""One rank of a ``fab train`` job: torchrun starts this module once per process.

It sends the rank's stdout and stderr to ``<log dir>/rank-<RANK>.log`` (appended, so a
resumed attempt continues the same file), then runs the user's script as ``__main__`` with
its own arguments, from the synced workdir. Standard library only.

    python -m torch.distributed.run ... --module gpufleet_node.job_launch \\
        --log-dir DIR --pid-dir DIR -- script ARGS

torchrun starts every rank in a session of its own, so a signal to torchrun's process group
does not reach them: each rank writes ``<pid dir>/rank-<RANK>.pid`` for the supervisor and
``fab cancel``, and asks the kernel to kill it when torchrun dies (PR_SET_PDEATHSIG), so a
killed torchrun never leaves ranks training on their own.
"""

from __future__ import annotations

import os
import runpy
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence

from . import modules

USAGE = (
    "usage: python -m gpufleet_node.job_launch --log-dir DIR --pid-dir DIR -- script.py [ARGS...]"
)
PR_SET_PDEATHSIG = 1


def split_argv(argv: Sequence[str]) -> tuple[str, str, str, list[str]]:
    """(log dir, pid dir, script, script args) from ``--log-dir D --pid-dir P -- script ARGS``."""
    args = list(argv)
    if len(args) < 6 or args[0] != "--log-dir" or args[2] != "--pid-dir" or args[4] != "--":
        raise SystemExit(USAGE)
    return args[1], args[3], args[5], args[6:]


def die_with_parent() -> None:
    """SIGKILL this rank when its parent (torchrun) dies; Linux only, else nothing."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call took effect
        os._exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    log_dir, pid_dir, script, script_args = split_argv(sys.argv[1:] if argv is None else argv)
    rank = os.environ.get("RANK", "0")
    die_with_parent()
    os.makedirs(pid_dir, exist_ok=True)
    with open(os.path.join(pid_dir, f"rank-{rank}.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    os.makedirs(log_dir, exist_ok=True)
    fd = os.open(
        os.path.join(log_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    print(
        f"gpufleet: rank {rank} (local {os.environ.get('LOCAL_RANK', '0')}) of "
        f"{os.environ.get('WORLD_SIZE', '1')} on {socket.gethostname()}, "
        f"attempt {os.environ.get('GPUFLEET_ATTEMPT', '1')}, "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        flush=True,
    )
    script = os.path.abspath(script)
    sys.argv = [script, *script_args]
    # sys.path[0] is the working directory (python -m): the script's own folder instead, as
    # `python script.py` would have it; the runner's package leaves the path (and PYTHONPATH,
    # for what the script starts), so the job sees the interpreter the user set up.
    sys.path[0] = os.path.dirname(script)
    sys.path[1:] = [p for p in sys.path[1:] if os.path.realpath(p) != modules.ROOT]
    if "PYTHONPATH" in os.environ:
        rest = modules.env_without(os.environ).get("PYTHONPATH")
        if rest is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = rest
    run_script(script)


def _where(filename: str) -> str:
    return filename if filename.startswith("<") else os.path.abspath(filename)


def run_script(script: str) -> None:
    """Run ``script`` as ``__main__``. An uncaught exception is printed as Python prints
    it, minus this file's and runpy's frames (they are not the job's), and exits 1 as an
    uncaught exception does; SystemExit and KeyboardInterrupt pass through as they are."""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        if done.code in (None, 0):
            end_process_group()
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # Python 3.11+ names runpy's frames "<frozen runpy>", earlier ones by its path.
        ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
        tb = exc.__traceback__
        while tb is not None and _where(tb.tb_frame.f_code.co_filename) in ours:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        sys.exit(1)
    end_process_group()


def end_process_group() -> None:
    """After a script that ended well: the process group it left open is destroyed here, as
    PyTorch asks a program to do before it exits (torch.distributed.destroy_process_group).
    Scripts that leave it to the interpreter's exit (a transformers Trainer's run_clm.py)
    can otherwise abort in the group's teardown ("terminate called without an active
    exception" on a rank whose peer left first), and the finished run counts as failed.
    Nothing is imported: a script that never used torch.distributed is left as it is."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
