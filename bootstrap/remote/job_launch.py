"""One rank of a ``fab train`` job: torchrun starts this file once per process.

It sends the rank's stdout and stderr to ``<log dir>/rank-<RANK>.log`` (appended, so a
resumed attempt continues the same file), then runs the user's script as ``__main__`` with
its own arguments, from the synced workdir. Standard library only.

    python -m torch.distributed.run ... job_launch.py --log-dir DIR -- script.py ARGS...
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import time
from collections.abc import Sequence


def split_argv(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """(log dir, script, script args) from ``--log-dir DIR -- script ARGS``."""
    args = list(argv)
    if len(args) < 4 or args[0] != "--log-dir" or args[2] != "--":
        raise SystemExit("usage: job_launch.py --log-dir DIR -- script.py [ARGS...]")
    return args[1], args[3], args[4:]


def main(argv: Sequence[str] | None = None) -> None:
    log_dir, script, script_args = split_argv(sys.argv[1:] if argv is None else argv)
    rank = os.environ.get("RANK", "0")
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
    # sys.path[0] is this file's folder (the runner's files): the script's own folder instead,
    # as `python script.py` would have it.
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
