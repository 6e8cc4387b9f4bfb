"""A job's recovery policy on its node: after each attempt, another one or the end.

Standard library only, Python 3.10+. Pure functions and small records; the supervisor
(``job_runner.py``) does what they decide. The options come from ``fab train``:

    --max-restarts N       crashes and hangs this supervisor may restart (default 0)
    --hang-after DURATION  no new output on any rank's log and no new checkpoint version
                           for that long: the ranks are stopped (an attempt that hung)
    --max-cost AMOUNT      the run's spend (every node-hour of every attempt, backoff
                           waits included: the nodes are paid for then too) at the stack's
                           hourly price per node; reaching it pushes the checkpoint and stops

Why the supervisor restarts torchrun and torchrun runs with ``--max-restarts=0``:
torchrun's elastic agent restarts its worker group with the argv it was started with and
the checkpoint folder as the crash left it. It can neither restore the newest complete
version from the bucket first (the local folder may hold a torn save that the push
refused) nor add the job's resume arguments (nanoGPT's ``--init_from=resume``: without
them the restarted script starts again from step 0, as gpufleet promises never to do
unasked). A restart by the supervisor is a new torchrun: push, restore, resume arguments,
an attempt in the job's record. On one node that costs a second or two of interpreter
start more than the agent's in-process restart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Between restarts: 10 s, doubled after each, at most 5 min (a crash loop costs at most a
# few restarts' worth of node time before --max-restarts ends it).
BACKOFF_FIRST_S = 10.0
BACKOFF_CAP_S = 300.0
# Lines of each rank's log kept in the record of a hang.
HANG_TAIL_LINES = 5

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``30s``, ``10m`` or ``2h`` (above 0); ValueError with one line."""
    found = _DURATION.match(str(text).lower())
    if not found:
        raise ValueError(f"{text!r}: give seconds or a number with s, m or h (e.g. 30s, 10m, 2h)")
    seconds = float(found.group(1)) * _UNIT_S[found.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r}: must be above 0")
    return seconds


def backoff_s(
    restarts_done: int, first: float = BACKOFF_FIRST_S, cap: float = BACKOFF_CAP_S
) -> float:
    """The wait before restart number ``restarts_done + 1``: ``first``, doubled each time,
    at most ``cap``."""
    return float(min(cap, first * (2 ** max(0, restarts_done))))


def spend(price_per_node_hour: float | None, nnodes: int, seconds: float) -> float | None:
    """What ``nnodes`` nodes cost for ``seconds`` at the hourly price of one; None when the
    price is unknown."""
    if price_per_node_hour is None:
        return None
    return float(price_per_node_hour) * max(1, int(nnodes)) * max(0.0, seconds) / 3600.0


@dataclass(frozen=True)
class Policy:
    max_restarts: int = 0
    hang_after_s: float | None = None
    max_cost: float | None = None
    price_per_node_hour: float | None = None
    currency: str = ""
    backoff_first_s: float = BACKOFF_FIRST_S

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Policy:
        def number(key: str) -> float | None:
            value = spec.get(key)
            return None if value in (None, "", 0) else float(value)

        return cls(
            max_restarts=int(spec.get("max_restarts") or 0),
            hang_after_s=number("hang_after_s"),
            max_cost=number("max_cost"),
            price_per_node_hour=number("hourly_price"),
            currency=str(spec.get("currency") or ""),
            backoff_first_s=float(spec.get("restart_backoff_s") or BACKOFF_FIRST_S),
        )

    def over_budget(self, spent: float | None) -> bool:
        return self.max_cost is not None and spent is not None and spent >= self.max_cost


@dataclass(frozen=True)
class Decision:
    """``restart`` (after ``wait_s``) or ``end`` with the job's ``state`` and ``reason``."""

    action: str
    state: str = ""
    reason: str = ""
    wait_s: float = 0.0
    detail: str = ""
    counts: bool = True  # a restart that uses up one of --max-restarts


# Attempts that end because a node is not there (a spot reclaim, a node that has not
# come back yet): restarted without using up --max-restarts, after the first backoff
# (never doubled: nothing is crashing), while the wait limit and the budget allow.
NODE_GONE = ("reclaimed", "waiting")


def after_attempt(
    policy: Policy,
    *,
    why: str,
    rc: int | None,
    restarts_done: int,
    spent: float | None,
    waited_s: float = 0.0,
    wait_limit_s: float = 3600.0,
) -> Decision:
    """What follows an attempt that ended ``why`` (exit, hang, budget, cancel, reclaimed,
    waiting) with torchrun's ``rc``: a cancel or the budget ends the run whatever else; a
    clean exit succeeds; a crash or a hang is restarted while restarts are left; a node
    that is gone is waited for (``waited_s`` so far) up to ``wait_limit_s``."""
    if why == "cancel":
        return Decision("end", "cancelled", "cancelled")
    if why == "budget" or policy.over_budget(spent):
        return Decision("end", "cancelled", "budget", detail="budget reached")
    if why == "exit" and rc == 0:
        return Decision("end", "succeeded", "succeeded")
    if why in NODE_GONE:
        if waited_s >= wait_limit_s:
            detail = f"no node came back within {wait_limit_s:g} s"
            return Decision("end", "failed", why, detail=detail)
        return Decision("restart", reason=why, wait_s=policy.backoff_first_s, counts=False)
    reason = "hang" if why == "hang" else "crash"
    if restarts_done >= policy.max_restarts:
        used = f"{restarts_done} of {policy.max_restarts} restart(s) used"
        return Decision("end", "failed", reason, detail=used)
    wait = backoff_s(
        restarts_done, policy.backoff_first_s, max(BACKOFF_CAP_S, policy.backoff_first_s)
    )
    return Decision("restart", reason=reason, wait_s=wait)


_FAILED_AT = re.compile(r"time\s*:\s*(\S+)")
_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL | re.IGNORECASE)


def failure_of(torchrun_output: str) -> dict[str, Any]:
    """The first failed rank torchrun names in its summary (``Root Cause``), with its exit
    code and, for a negative one, the signal that killed it; {} when it names none."""
    text = torchrun_output
    at = text.rfind("Root Cause")
    found = _ROOT_CAUSE.search(text[at:] if at >= 0 else text)
    if not found:
        return {}
    code = int(found.group(2))
    out: dict[str, Any] = {"rank": int(found.group(1)), "exit_code": code}
    when = _FAILED_AT.search(text[at:] if at >= 0 else text)
    if when:
        out["failed_at"] = when.group(1)
    if code < 0:
        import signal

        try:
            out["signal"] = signal.Signals(-code).name
        except ValueError:
            out["signal"] = f"signal {-code}"
    return out


# What a rank prints when its collective lost a peer: the failure is another node's.
# gloo's tcp transport (gloo/transport/tcp/pair.cc, as torch 2.13 prints it): "Connection
# closed by peer ... typically caused by a remote worker crashing"; NCCL's ncclRemoteError
# ("remote process exited or there was a network error").
PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote process exited or there was a network error",
    "ncclRemoteError",
)


def peer_lost(lines: list[str]) -> bool:
    """Whether a failed rank's last lines say it failed because a peer went away."""
    return any(p in line for line in lines for p in PEER_LOST)


def nccl_env(user_env: Mapping[str, str], hang_after_s: float | None) -> dict[str, str]:
    """NCCL's own guards against a collective that never finishes, for the variables the
    user did not set (their values win). PyTorch, ProcessGroupNCCL Environment Variables,
    https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html (read
    2026-12-05):

    - TORCH_NCCL_ASYNC_ERROR_HANDLING=1: on an error or a collective timeout, abort the
      communicator and tear the process down (torchrun sets 1 for its workers too, when
      unset: torch/distributed/elastic/agent/server/local_elastic_agent.py), so the rank
      exits and the supervisor sees a crash, not a spin.
    - TORCH_NCCL_ENABLE_MONITORING=1 with TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: a monitor
      thread aborts the process when the NCCL watchdog thread itself is stuck (a CUDA or
      NCCL call that hangs) for that long; with --hang-after, that long (at least 60 s).

    The collective timeout itself is ``init_process_group(timeout=...)`` (10 min for NCCL
    by default: torch/distributed/constants.py); no environment variable sets it, so it
    stays the script's choice. TORCH_NCCL_BLOCKING_WAIT is left alone: the asynchronous
    handling above already ends the process, without making every wait() block."""
    out = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ENABLE_MONITORING": "1"}
    if hang_after_s:
        out["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(int(max(60.0, hang_after_s)))
    return {k: v for k, v in out.items() if k not in user_env}


def attempt_line(rec: Mapping[str, Any]) -> str:
    """One attempt of the job's record in a line: ``attempt 2: crash (rank 0 exit 1) after
    12s, steps 40 -> 80``."""
    why = str(rec.get("reason") or "?")
    cause = []
    if rec.get("waiting_for"):
        cause.append("for node " + ", ".join(str(r) for r in rec["waiting_for"]))
    elif rec.get("node") is not None:
        cause.append(f"node {rec['node']}")
    if rec.get("rank") is not None:
        cause.append(f"rank {rec['rank']}")
    if rec.get("signal"):
        cause.append(str(rec["signal"]))
    elif rec.get("exit_code") is not None:
        cause.append(f"exit {rec['exit_code']}")
    if why == "hang" and rec.get("silent_s") is not None:
        cause.append(f"no progress for {float(rec['silent_s']):.0f}s")
    said = f"attempt {rec.get('attempt')}: {why}" + (f" ({', '.join(cause)})" if cause else "")
    said += f" after {float(rec.get('seconds') or 0):.0f}s"
    start = (rec.get("resumed_from") or {}).get("step")
    end = rec.get("newest_step")
    if start is not None or end is not None:
        said += f", steps {'0' if start is None else start} -> {'-' if end is None else end}"
    if rec.get("lost_s") is not None and why != "succeeded":
        lost = f", lost {float(rec['lost_s']):.0f}s"
        if rec.get("lost_steps") is not None:
            lost += f" (~{int(rec['lost_steps'])} steps)"
        said += lost
    return said
