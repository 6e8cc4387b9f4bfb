"""``fab data-push``, ``data-fetch`` and ``data-pull`` under the faults S3 and its
compatibles produce every day, on a real sshd node, with the fault-injecting proxy
(tests/support/fault_proxy.py, behind the strict front that refuses a damaged request body
as S3 does: tests/support/strict_s3.py) between the node's bucket client and moto.

Each fault class ends either in the exact bytes or in one clear line with nothing damaged
kept under a real name, and a rerun once the fault is gone finishes: 503 SlowDown then OK,
bodies cut mid-way, a byte flipped in a GET body, an object replaced between a cut and the
rerun, a trickle (bounded by --min-rate / --deadline), fab killed with SIGKILL mid-fetch,
a killed push's part files, two pushes at once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bootstrap.conftest import REPO, FabResult, run_fab, unwrap_progress
from tests.bootstrap.tasks.test_data_ssh import bucket_files, dataset, files_under, moved
from tests.bootstrap.tasks.test_train_ssh import (  # noqa: F401 (fixtures)
    BUCKET,
    CREDS,
    inventory,
    moto_url,
    place,
    s3,
)
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.sshd import SshServer
from tests.support.strict_s3 import strict_s3

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MIB = 1024 * 1024
PART = ".gpufleet-part"


@dataclass(frozen=True)
class Node:
    """One sshd node, its scratch, moto behind the fault proxy."""

    inventory: Path
    jobs: Path
    scratch: Path
    moto: str
    proxy: FaultProxy

    def argv(self, task: str, *args: str) -> list[str]:
        return [task, *args, "--inventory", str(self.inventory), "--jobs-dir", str(self.jobs),
                "--s3-endpoint", self.proxy.url, "--node-env", CREDS]  # fmt: skip

    def fab(self, task: str, *args: str, timeout: float = 300) -> FabResult:
        return run_fab(*self.argv(task, *args), timeout=timeout)

    def copy(self, name: str) -> Path:
        return self.scratch / "data" / name


@pytest.fixture
def node(
    sshd_server: SshServer,
    place: dict[str, Path],  # noqa: F811
    moto_url: str,  # noqa: F811
    tmp_path: Path,
) -> Iterator[Node]:
    inv = inventory(tmp_path, [(sshd_server, sshd_server.port)], place["scratch"],
                    sshd_server.user, sshd_server.key_path)  # fmt: skip
    with strict_s3(moto_url) as proxy:
        yield Node(inv, place["jobs"], place["scratch"], moto_url, proxy)


def failed_line(result: FabResult) -> str:
    """The one line that says why the node tool failed (fab exits 1)."""
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    out = unwrap_progress(result.stdout)  # a long line is whole again
    lines = [line for line in out.splitlines() if "failed: " in line]
    assert lines, result.stdout
    return lines[0]


def parts_under(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(f"*{PART}")) if root.exists() else []


def put(moto: str, key: str, data: bytes, sha256: str = "") -> None:
    meta = {"gpufleetsha256": sha256} if sha256 else {}
    s3(moto).put_object(Bucket=BUCKET, Key=key, Body=data, Metadata=meta)


def ranges_of(proxy: FaultProxy, path: str) -> list[tuple[str, str]]:
    """(Range, If-Match) of each GET of ``path`` the proxy saw."""
    return [
        (s.headers.get("range", ""), s.headers.get("if-match", ""))
        for s in proxy.requests("GET")
        if s.path.endswith(path)
    ]


# ---------------------------------------------------------------------------- what held


def test_slowdown_then_ok_and_cut_bodies_end_in_the_exact_bytes(node: Node, tmp_path: Path) -> None:
    src = dataset(tmp_path / "src")
    # Every upload answered 503 SlowDown twice first: retried (backing off), then stored.
    node.proxy.add(Fault("status", method="PUT", path=r"/data/tinyset/", times=2))
    pushed = node.fab("data-push", str(src), "--to", "bucket")
    assert moved(pushed, "data-upload") == [(3, 0)], pushed.stdout
    assert len(node.proxy.requests("PUT", fault="status")) == 2
    assert bucket_files(node.moto, "data/tinyset/") == files_under(src)

    # The fetch's GETs: 503 twice, then the big one cut twice mid-body; each try goes on
    # after the bytes it has.
    shutil.rmtree(node.copy("tinyset"))  # the head's copy: the pull must read the bucket
    node.proxy.clear()
    node.proxy.add(
        Fault("status", method="GET", path=r"/data/tinyset/shards/000\.bin$", times=2),
        Fault("cut", method="GET", path=r"/data/tinyset/shards/000\.bin$", after=70_000, times=2),
    )
    here = tmp_path / "here"
    got = node.fab("data-pull", "tinyset", "--dest", str(here))
    assert moved(got, "data-fetch") == [(3, 0)] and moved(got, "data-get") == [(3, 0)]
    assert files_under(here) == files_under(src)
    assert files_under(node.copy("tinyset")) == files_under(src)
    assert len(node.proxy.requests("GET", fault="cut")) == 2
    starts = [r for r, _ in ranges_of(node.proxy, "shards/000.bin")]
    assert starts[-1].startswith("bytes=140000-"), starts  # after what the cuts left
    assert parts_under(node.copy("tinyset")) == []


# ---------------------------------------------------------------------------- damage


@pytest.mark.parametrize("how", ["manifest", "metadata", "md5"])
def test_a_flipped_byte_in_a_get_body_is_one_line_and_nothing_takes_its_name(
    node: Node, tmp_path: Path, how: str
) -> None:
    big = os.urandom(3 * MIB)
    key = "data/flip/big.bin"
    if how == "manifest":  # pushed by fab: the manifest records its SHA-256
        (tmp_path / "flip").mkdir()
        (tmp_path / "flip" / "big.bin").write_bytes(big)
        assert node.fab("data-push", str(tmp_path / "flip"), "--to", "bucket").returncode == 0
        (node.copy("flip") / "big.bin").unlink()  # the head's copy: the fetch must read it
    else:  # another tool's upload: its metadata, or only its (single-part) MD5 ETag
        put(node.moto, key, big, hashlib.sha256(big).hexdigest() if how == "metadata" else "")
    node.proxy.clear()
    node.proxy.add(Fault("flip_response", method="GET", path=r"/data/flip/big\.bin$",
                         after=2 * MIB + 5, times=10))  # fmt: skip
    for _ in range(2):  # and a rerun while the fault lasts: still nothing kept
        bad = node.fab("data-fetch", "flip")
        line = failed_line(bad)
        assert "damaged: " in line and "run it again" in line, line
        assert not (node.copy("flip") / "big.bin").exists()
        assert parts_under(node.copy("flip")) == []
    node.proxy.clear()  # the fault is gone: the same command finishes
    good = node.fab("data-fetch", "flip")
    assert moved(good, "data-fetch") == [(1, 0)], good.stdout
    assert (node.copy("flip") / "big.bin").read_bytes() == big


def test_a_flipped_byte_in_an_upload_is_refused_by_the_store_and_a_rerun_sends_it(
    node: Node, tmp_path: Path
) -> None:
    src = dataset(tmp_path / "src")
    # The strict front answers BadDigest, as S3 does for a body unlike its Content-MD5.
    node.proxy.add(Fault("flip_request", method="PUT", path=r"/shards/000\.bin$", after=99,
                         times=1))  # fmt: skip
    bad = node.fab("data-push", str(src), "--to", "bucket")
    line = failed_line(bad)
    assert "damaged: " in line and "nothing damaged was stored" in line, line
    assert "shards/000.bin" not in bucket_files(node.moto, "data/tinyset/")
    node.proxy.clear()
    again = node.fab("data-push", str(src), "--to", "bucket")
    assert again.returncode == 0, again.stdout[-3000:]
    assert bucket_files(node.moto, "data/tinyset/") == files_under(src)


# ---------------------------------------------------------------------------- versions


def test_a_cut_download_goes_on_only_from_the_same_object_version(
    node: Node, tmp_path: Path
) -> None:
    old, new = os.urandom(2 * MIB), os.urandom(2 * MIB)  # the same size
    key = "data/ver/x.bin"
    put(node.moto, key, old)
    # Cut after 700 kB, then refused (403) for good: the run ends with its part file.
    node.proxy.add(
        Fault("cut", method="GET", path=r"/data/ver/x\.bin$", after=700_000),
        Fault("status", method="GET", path=r"/data/ver/x\.bin$", status=403,
              code="AccessDenied", times=10),
    )  # fmt: skip
    cut = node.fab("data-fetch", "ver")
    assert "denied: " in failed_line(cut)
    assert not (node.copy("ver") / "x.bin").exists()
    part = node.copy("ver") / f"x.bin{PART}"
    assert part.stat().st_size == 700_000

    put(node.moto, key, new)  # replaced, same size, before the rerun
    node.proxy.clear()
    again = node.fab("data-fetch", "ver")
    assert moved(again, "data-fetch") == [(1, 0)], again.stdout
    assert (node.copy("ver") / "x.bin").read_bytes() == new  # whole: not old head + new tail
    (first_range, if_match), *_ = ranges_of(node.proxy, "ver/x.bin")
    assert first_range.startswith("bytes=0-") and if_match, (first_range, if_match)
    assert parts_under(node.copy("ver")) == []


# ---------------------------------------------------------------------------- time


def test_a_trickle_ends_in_bounded_time_with_one_line_and_a_single_one_is_outlived(
    node: Node, tmp_path: Path
) -> None:
    data = os.urandom(300_000)
    put(node.moto, "data/slow/x.bin", data)
    # One trickling answer: given up after the rate's grace, tried again, fetched whole.
    node.proxy.add(Fault("trickle", method="GET", path=r"/data/slow/x\.bin$", interval=0.2))
    started = time.monotonic()
    once = node.fab("data-fetch", "slow", "--min-rate", "0.05")
    assert moved(once, "data-fetch") == [(1, 0)], once.stdout
    assert (node.copy("slow") / "x.bin").read_bytes() == data
    assert time.monotonic() - started < 60

    # Every answer trickles. With the defaults alone (--min-rate 0.1 MB/s after 10 s, a
    # day's --deadline), the run ends with one line once the tries are spent; with a
    # short --deadline, at the deadline. Nothing is kept under the file's name.
    (node.copy("slow") / "x.bin").unlink()
    for options, cause, bound in (((), "slow", 90.0), (("--deadline", "5"), "deadline", 40.0)):
        node.proxy.clear()
        node.proxy.add(Fault("trickle", method="GET", path=r"/data/slow/x\.bin$",
                             interval=0.2, times=1000, max_seconds=100))  # fmt: skip
        started = time.monotonic()
        stuck = node.fab("data-fetch", "slow", *options)
        took = time.monotonic() - started
        line = failed_line(stuck)
        print(f"lasting trickle {options}: {took:.1f} s: {line}")
        assert f"fetch: {cause}: " in line and took < bound, (took, line)
        assert ("--min-rate" if cause == "slow" else "--deadline") in line, line
        assert not (node.copy("slow") / "x.bin").exists()


def test_bad_deadline_or_rate_is_one_line_and_exit_2(node: Node, tmp_path: Path) -> None:
    for flag, value in (("--deadline", "0"), ("--deadline", "soon"), ("--min-rate", "-1")):
        out = run_fab(*node.argv("data-fetch", "tinyset", flag, value))
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and flag in lines[0], out.stderr
    help_text = run_fab("--help", "data-fetch").stdout
    assert "MB/s" in help_text and "86400" in help_text


# ---------------------------------------------------------------------------- kill -9


def test_fab_killed_mid_fetch_then_a_rerun_converges(node: Node, tmp_path: Path) -> None:
    data = os.urandom(3 * MIB)
    put(node.moto, "data/kill/x.bin", data, hashlib.sha256(data).hexdigest())
    put(node.moto, "data/kill/y.txt", b"y\n")
    # Slow enough that fab is killed while bytes are on their way.
    node.proxy.add(Fault("cut", method="GET", path=r"/data/kill/x\.bin$", after=MIB),
                   Fault("trickle", method="GET", path=r"/data/kill/x\.bin$", interval=0.05,
                         times=1, max_seconds=30))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", *node.argv("data-fetch", "kill")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    part = node.copy("kill") / f"x.bin{PART}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (part.exists() and part.stat().st_size):
            time.sleep(0.1)
        assert part.exists(), "the fetch never began"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not (node.copy("kill") / "x.bin").exists()
    node.proxy.clear()
    again = node.fab("data-fetch", "kill")
    assert again.returncode == 0, again.stdout[-3000:]
    assert files_under(node.copy("kill")) == {"x.bin": data, "y.txt": b"y\n"}
    assert parts_under(node.copy("kill")) == []
    twice = node.fab("data-fetch", "kill")
    assert moved(twice, "data-fetch") == [(0, 2)], twice.stdout


def test_a_killed_pushs_part_files_are_removed_by_a_later_run_once_an_hour_old(
    node: Node, tmp_path: Path
) -> None:
    src = dataset(tmp_path / "src")
    assert node.fab("data-push", str(src)).returncode == 0
    # What a push killed mid-file leaves: its own part name, never reused by a later push.
    left = node.copy("tinyset") / f"shards/000.bin.0badc0de{PART}"
    left.write_bytes(b"half a file")
    left.chmod(0o666)
    fresh = node.fab("data-push", str(src))
    assert moved(fresh, "data-push") == [(0, 3)] and left.exists()  # young: maybe in use
    hours_ago = time.time() - 2 * 3600
    os.utime(left, (hours_ago, hours_ago))
    later = node.fab("data-push", str(src))
    assert moved(later, "data-push") == [(0, 3)] and not left.exists()
    assert files_under(node.copy("tinyset")) == files_under(src)


# ---------------------------------------------------------------------------- two at once


def test_two_pushes_to_the_bucket_at_once_leave_a_manifest_true_to_the_objects(
    node: Node, tmp_path: Path
) -> None:
    one, two = dataset(tmp_path / "one"), dataset(tmp_path / "two")
    (two / "labels.csv").write_text("id,label\n1,dog\n")
    results: dict[str, FabResult] = {}

    def push(src: Path) -> None:
        results[src.parent.name] = node.fab("data-push", str(src), "--to", "bucket")

    threads = [threading.Thread(target=push, args=(src,)) for src in (one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(r.returncode == 0 for r in results.values()), results
    in_bucket = bucket_files(node.moto, "data/tinyset/")
    assert in_bucket in (files_under(one), files_under(two))
    manifest = json.loads(
        s3(node.moto)
        .get_object(Bucket=BUCKET, Key="data/tinyset/.gpufleet-dataset.json")["Body"]
        .read()
    )
    for rel, item in manifest["files"].items():
        assert item["sha256"] == hashlib.sha256(in_bucket[rel]).hexdigest(), rel
    # A node with nothing fetches it all, each file checked by its SHA-256.
    shutil.rmtree(node.copy("tinyset"))
    got = node.fab("data-fetch", "tinyset", "--json")
    assert got.returncode == 0, got.stdout[-2000:]
    assert files_under(node.copy("tinyset")) == in_bucket
