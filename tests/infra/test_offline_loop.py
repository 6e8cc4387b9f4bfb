"""An offline evaluation leaves no event loop or executor thread for the interpreter to collect.

At exit, Pulumi's per-thread event loops used to be collected after their self-pipe sockets and
printed "Exception ignored in BaseEventLoop.__del__ ... Invalid file descriptor" now and then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio, gc, json, threading
from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
for stack in ("t4x1", "a10x1"):
    cfg = load_stack_file(f"stacks/Pulumi.{stack}.yaml", {"sshPublicKey": PLACEHOLDER_SSH_KEY})
    result = evaluate(cfg)
gc.collect()
loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
print(json.dumps({
    "open_loops": sum(not loop.is_closed() for loop in loops),
    "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
    "resources": len(result.resources),
}))
"""


def test_evaluate_closes_its_event_loops_and_stops_its_threads() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["resources"] > 10
    assert (found["open_loops"], found["threads"]) == (0, [])
    # -X dev shows ResourceWarnings such as "unclosed event loop": none may remain
    assert "unclosed" not in done.stderr and "Invalid file descriptor" not in done.stderr
