"""A multi-node run's meeting place: attempt records in the job's bucket prefix.

Standard library only, Python 3.10+. There is no controller: each node has its own
supervisor (job_runner.py) and the bucket that already holds the run's checkpoint
versions holds these small JSON records too (``P`` is the job's ``bucket_prefix``)::

    P.gpufleet/attempts/<n>.json          the head's (node 0's) attempt n, written after
                                          its restore and BEFORE its torchrun starts:
                                          attempt, rdzv_id, version (the exact checkpoint
                                          version seq it restored, or None), step, after
                                          (why the previous attempt ended), node (which)
    P.gpufleet/attempts/<n>/node-<r>.json node r's part of attempt n: state (running,
                                          ended), rc, why, rank, progress_t (its ranks'
                                          last new output, epoch s), boot_id, at
    P.gpufleet/run-end.json               the run's end: attempt, state, reason

The head owns the attempt number: it decides (job_policy.after_attempt), restores, writes
attempt n, then starts its torchrun. Every other node waits for attempt n, restores
exactly that version (job_sync.restore(version=...)), writes its running record and
starts its torchrun for attempt n; when its attempt ends it writes its end record, and
it stops its ranks as soon as a newer attempt or the run's end appears. torchrun's
rendezvous is static (node rank = group rank: rank 0 on the head saves, and only the head
pushes) with an id per attempt (``<job>-a<n>``: the agents' keys are prefixed with it, so
a leftover of an older attempt never joins) and a join timeout: a node that does not
come makes the head's torchrun fail without a rank started (the head then waits for
that node, in a new attempt that uses up no restart).

Every bucket call here is bounded (the store's deadline) and a failed one is None or
False, never an exception: a bucket hiccup costs a poll, not the run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from . import bucket

SCHEMA = "gpufleet.job-attempt/1"
ATTEMPTS = ".gpufleet/attempts/"
RUN_END = ".gpufleet/run-end.json"
# How long one record's request may take (the store retries within it).
REQUEST_S = 20.0
# The rendezvous's join timeout when job.json gives none (rdzv_join_timeout_s): a node
# that has not joined by then makes the head wait for it, in a new attempt.
JOIN_TIMEOUT_S = 600.0
# How long a run waits for a node that does not come (node_wait_s in job.json), counted
# from the last attempt that started every node; --max-cost bounds it too.
NODE_WAIT_S = 3600.0
# How long a worker waits for the head's next attempt record before it gives up.
WORKER_WAIT_S = 2 * 3600.0
# How long the head waits, after its own attempt ended, for the others' end records (a
# node without one by then is lost: reclaimed or deleted).
END_RECORDS_S = 15.0

ERRORS = (OSError, ValueError, bucket.StoreError)


def rdzv_id(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}"


def _key(prefix: str, rel: str) -> str:
    return f"{prefix.rstrip('/')}/{rel}" if prefix else rel


def attempt_key(prefix: str, attempt: int) -> str:
    return _key(prefix, f"{ATTEMPTS}{attempt:08d}.json")


def node_key(prefix: str, attempt: int, node_rank: int) -> str:
    return _key(prefix, f"{ATTEMPTS}{attempt:08d}/node-{node_rank}.json")


def _put(store: bucket.BucketStore, key: str, doc: Mapping[str, Any]) -> bool:
    body = json.dumps({"schema": SCHEMA, **doc}, sort_keys=True).encode()
    try:
        store.put(key, body, time.monotonic() + REQUEST_S)
    except ERRORS:
        return False
    return True


def _get(store: bucket.BucketStore, key: str) -> dict[str, Any] | None:
    try:
        _, _, body = store.request("GET", key, deadline=time.monotonic() + REQUEST_S)
        doc = json.loads(body)
    except ERRORS:
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def write_attempt(store: bucket.BucketStore, prefix: str, doc: Mapping[str, Any]) -> bool:
    return _put(store, attempt_key(prefix, int(doc["attempt"])), doc)


def write_node(
    store: bucket.BucketStore, prefix: str, attempt: int, node_rank: int, doc: Mapping[str, Any]
) -> bool:
    record = {**doc, "attempt": attempt, "node_rank": node_rank}
    return _put(store, node_key(prefix, attempt, node_rank), record)


def read_attempt(store: bucket.BucketStore, prefix: str, attempt: int) -> dict[str, Any] | None:
    return _get(store, attempt_key(prefix, attempt))


def newest_attempt(store: bucket.BucketStore, prefix: str) -> dict[str, Any] | None:
    """The head's newest attempt record, None when there is none (or the bucket did not
    answer)."""
    base = _key(prefix, ATTEMPTS)
    try:
        keys = store.list_entries(base)
    except ERRORS:
        return None
    seqs = [int(m.group(1)) for k in keys if (m := re.fullmatch(r"(\d{8})\.json", k[len(base) :]))]
    return _get(store, attempt_key(prefix, max(seqs))) if seqs else None


def node_records(store: bucket.BucketStore, prefix: str, attempt: int) -> dict[int, dict[str, Any]]:
    """Every node's record of ``attempt`` by node rank ({} when none or no answer)."""
    base = _key(prefix, f"{ATTEMPTS}{attempt:08d}/")
    try:
        keys = store.list_entries(base)
    except ERRORS:
        return {}
    out = {}
    for key in keys:
        m = re.fullmatch(r"node-(\d+)\.json", key[len(base) :])
        doc = _get(store, key) if m else None
        if m and doc is not None:
            out[int(m.group(1))] = doc
    return out


def write_run_end(store: bucket.BucketStore, prefix: str, doc: Mapping[str, Any]) -> bool:
    return _put(store, _key(prefix, RUN_END), doc)


def run_end(store: bucket.BucketStore, prefix: str, since: int) -> dict[str, Any] | None:
    """The run's end record when it is of attempt ``since`` or later (an older one is a
    previous run's, before a ``fab train --resume``)."""
    doc = _get(store, _key(prefix, RUN_END))
    if doc is None or int(doc.get("attempt") or 0) < since:
        return None
    return doc


# ---------------------------------------------------------------------------- decisions


def missing_nodes(nnodes: int, records: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """The nodes other than the head with no record of the attempt: they never came."""
    return [r for r in range(1, nnodes) if r not in records]


def failed_node(records: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The worker record that ended first with a failure (a rank's crash), None if none."""
    failed = [
        r
        for r in records.values()
        if r.get("state") == "ended" and r.get("why") == "exit" and r.get("rc") not in (0, None)
    ]
    failed.sort(key=lambda r: str(r.get("at") or ""))
    return dict(failed[0]) if failed else None


def lost_nodes(records: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """Workers that started the attempt and never said it ended: reclaimed, deleted, or
    their supervisor killed."""
    return sorted(r for r, doc in records.items() if r and doc.get("state") != "ended")


def newest_progress(records: Mapping[int, Mapping[str, Any]]) -> float | None:
    """The latest ``progress_t`` (epoch seconds) any worker reported."""
    times = []
    for doc in records.values():
        try:
            times.append(float(doc["progress_t"]))
        except (KeyError, TypeError, ValueError):
            continue
    return max(times) if times else None
