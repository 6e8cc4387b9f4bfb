"""``fab data-push``, ``data-fetch`` and ``data-pull`` end to end: two real sshd "nodes" on
127.0.0.1 and a moto S3 bucket. Both nodes are this machine, so they share one disk (and
one scratch folder): the node tool takes turns per folder, and the later node finds the
bytes there already, which is what these tests count on where they add up two nodes."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bootstrap.conftest import FabResult, run_fab
from tests.bootstrap.tasks.test_train_ssh import (  # noqa: F401 (fixtures)
    BUCKET,
    CREDS,
    inventory,
    moto_url,
    place,
    s3,
    second_node,
    two_nodes,
)
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Nodes:
    """The inventory of the local nodes, their jobs folder and scratch, the moto bucket."""

    inventory: Path
    jobs: Path
    scratch: Path
    moto: str

    def fab(self, task: str, *args: str) -> FabResult:
        return run_fab(
            task,
            *args,
            "--inventory",
            str(self.inventory),
            "--jobs-dir",
            str(self.jobs),
            "--s3-endpoint",
            self.moto,
            "--node-env",
            CREDS,
            timeout=300,
        )


@pytest.fixture
def nodes(two_nodes: Path, place: dict[str, Path], moto_url: str) -> Nodes:  # noqa: F811
    return Nodes(two_nodes, place["jobs"], place["scratch"], moto_url)


def dataset(folder: Path) -> Path:
    """A small dataset: a text file, a nested binary and one more."""
    root = folder / "tinyset"
    (root / "shards").mkdir(parents=True)
    (root / "README.txt").write_text("tiny dataset\n")
    (root / "shards" / "000.bin").write_bytes(os.urandom(300_000))
    (root / "labels.csv").write_text("id,label\n1,cat\n")
    return root


def moved(result: FabResult, step: str) -> list[tuple[int, int]]:
    """(files moved, files already there) from each host's line of ``step``."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = re.findall(rf"{step}: \w+: moved (\d+) \([0-9.]+ .?B\), kept (\d+)", result.stdout)
    return [(int(a), int(b)) for a, b in found]


def files_under(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".gpufleet-")
    }


def bucket_files(moto: str, prefix: str) -> dict[str, bytes]:
    client = s3(moto)
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    # The dataset's own files: the manifest an upload writes beside them is ours.
    return {
        o["Key"][len(prefix) :]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        for o in listed
        if not o["Key"].rsplit("/", 1)[-1].startswith(".gpufleet-")
    }


@pytest.mark.slow
def test_a_folder_pushed_to_every_node_moves_again_only_what_changed(
    nodes: Nodes, tmp_path: Path
) -> None:
    src = dataset(tmp_path)
    node_copy = nodes.scratch / "data" / "tinyset"
    first = nodes.fab("data-push", str(src))
    # Two hosts, one line each; both sent every file (each under its own part names).
    assert moved(first, "data-push") == [(3, 0), (3, 0)], first.stdout
    assert files_under(node_copy) == files_under(src)

    again = nodes.fab("data-push", str(src))
    assert moved(again, "data-push") == [(0, 3), (0, 3)], again.stdout

    (src / "labels.csv").write_text("id,label\n1,cat\n2,dog\n")
    (node_copy / "extra.txt").write_text("made on the node")
    changed = nodes.fab("data-push", str(src))
    assert sorted(moved(changed, "data-push"))[-1] == (1, 2), changed.stdout
    assert (node_copy / "labels.csv").read_text().endswith("2,dog\n")
    assert (node_copy / "extra.txt").exists()  # never deleted unless asked

    pruned = nodes.fab("data-push", str(src), "--delete")
    assert "removed 1" in pruned.stdout, pruned.stdout
    assert files_under(node_copy) == files_under(src)
    # Each host's line of a step is short enough for 80 columns with a real node's label.
    for line in re.findall(r"\] (data-push: .*)", pruned.stdout):
        assert len("[node-0 (54.210.101.123)] " + line) <= 80, line


@pytest.mark.slow
def test_a_push_to_the_bucket_goes_through_the_head_and_a_rerun_sends_only_what_is_missing(
    nodes: Nodes, tmp_path: Path
) -> None:
    src = dataset(tmp_path)
    args = ("data-push", str(src), "--to", "bucket", "--name", "tiny")
    first = nodes.fab(*args)
    assert moved(first, "data-upload") == [(3, 0)], first.stdout  # the head only
    assert bucket_files(nodes.moto, "data/tiny/") == files_under(src)

    s3(nodes.moto).delete_object(Bucket=BUCKET, Key="data/tiny/shards/000.bin")
    again = nodes.fab(*args)
    assert moved(again, "data-push") == [(0, 3)], again.stdout
    assert moved(again, "data-upload") == [(1, 2)], again.stdout
    assert bucket_files(nodes.moto, "data/tiny/") == files_under(src)


@pytest.mark.slow
def test_fetch_puts_the_bucket_folder_on_every_node_and_a_cut_off_run_is_finished(
    nodes: Nodes, tmp_path: Path
) -> None:
    from boto3.s3.transfer import TransferConfig

    big = os.urandom(11 * 1024 * 1024)
    client = s3(nodes.moto)
    (tmp_path / "big.bin").write_bytes(big)
    # As `aws s3 cp` uploads it: multipart, so its ETag is no MD5 ("<md5 of md5s>-3").
    five = 5 * 1024 * 1024
    client.upload_file(
        str(tmp_path / "big.bin"),
        BUCKET,
        "data/corpus/big.bin",
        Config=TransferConfig(multipart_threshold=five, multipart_chunksize=five),
    )
    client.put_object(Bucket=BUCKET, Key="data/corpus/a/one.txt", Body=b"one\n")
    client.put_object(Bucket=BUCKET, Key="data/corpus/two.txt", Body=b"two\n")
    assert client.head_object(Bucket=BUCKET, Key="data/corpus/big.bin")["ETag"].endswith('-3"')
    node_copy = nodes.scratch / "data" / "corpus"

    first = nodes.fab("data-fetch", "corpus")
    # One disk for both nodes: one fetched the three objects, the other found them there.
    assert sorted(moved(first, "data-fetch")) == [(0, 3), (3, 0)], first.stdout
    assert files_under(node_copy) == bucket_files(nodes.moto, "data/corpus/")

    # Cut off: one file gone, the big one half way (its part file as the download left it),
    # and no record of what was fetched: the ETags alone tell what is there.
    (node_copy / "a" / "one.txt").unlink()
    (node_copy / "big.bin").unlink()
    (node_copy / "big.bin.gpufleet-part").write_bytes(big[: 3 * 1024 * 1024])
    (node_copy / "big.bin.gpufleet-part").chmod(0o666)  # written here as root, not the node
    (node_copy / ".gpufleet-data.json").unlink()
    (node_copy / ".gpufleet-digests.json").unlink()
    again = nodes.fab("data-fetch", "corpus")
    assert sorted(moved(again, "data-fetch")) == [(0, 3), (2, 1)], again.stdout
    assert (node_copy / "big.bin").read_bytes() == big
    assert not (node_copy / "big.bin.gpufleet-part").exists()

    # Files the bucket does not have stay on the nodes unless --delete asks.
    (node_copy / "local.tmp").write_text("x")
    kept = nodes.fab("data-fetch", "corpus")
    assert (node_copy / "local.tmp").exists() and "removed" not in kept.stdout
    pruned = nodes.fab("data-fetch", "corpus", "--delete")
    assert "removed 1" in pruned.stdout and not (node_copy / "local.tmp").exists()


@pytest.mark.slow
def test_pull_brings_a_nodes_copy_or_the_buckets_here_and_only_what_is_missing(
    nodes: Nodes, tmp_path: Path
) -> None:
    src = dataset(tmp_path / "src")
    pushed = nodes.fab("data-push", str(src), "--to", "bucket")
    assert pushed.returncode == 0, pushed.stderr
    shutil.rmtree(nodes.scratch / "data")  # the nodes were stopped: scratch is empty

    here = tmp_path / "here"
    got = nodes.fab("data-pull", "tinyset", "--dest", str(here))
    assert moved(got, "data-fetch") == [(3, 0)] and moved(got, "data-get") == [(3, 0)]
    assert files_under(here) == files_under(src)

    (here / "README.txt").unlink()
    (here / "mine.txt").write_text("mine")
    node = nodes.fab("data-pull", "tinyset", "--node", "node-1", "--dest", str(here))
    assert moved(node, "data-get") == [(1, 2)] and "data-fetch" not in node.stdout
    assert (here / "mine.txt").exists()
    pruned = nodes.fab("data-pull", "tinyset", "--node", "node-1", "--dest", str(here), "--delete")
    assert "removed 1" in pruned.stdout and files_under(here) == files_under(src)


def test_bad_input_is_one_line_and_exit_2_before_anything_moves(
    sshd_server: SshServer,
    place: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    src = dataset(tmp_path)
    inv = inventory(
        tmp_path,
        [(sshd_server, sshd_server.port)],
        place["scratch"],
        sshd_server.user,
        sshd_server.key_path,
    )
    bare = json.loads(inv.read_text())
    bare.pop("bucket")
    no_bucket = tmp_path / "no-bucket.json"
    no_bucket.write_text(json.dumps(bare))
    (tmp_path / "a-file").write_text("x")
    jobs = place["jobs"] / "never"
    cases: list[tuple[tuple[str, ...], Path, str]] = [
        (("data-push", str(tmp_path / "nope")), inv, "no such folder"),
        (("data-push", str(src), "--to", "laptop"), inv, "--to 'laptop': scratch"),
        (("data-push", str(src), "--to", "bucket", "--delete"), inv, "never deletes in the"),
        (("data-push", str(src), "--name", "../up"), inv, "dataset name '../up'"),
        (("data-push", str(src), "--to", "bucket"), no_bucket, "has no bucket"),
        (("data-fetch", "tinyset"), no_bucket, "has no bucket"),
        (("data-pull", "tinyset", "--node", "node-9"), inv, "--node node-9: no such host"),
        (("data-pull", "tinyset", "--dest", str(tmp_path / "a-file")), inv, "a file is in"),
        (("data-fetch", "tinyset", "--node-env", "novalue"), inv, "'novalue' is not KEY=VALUE"),
        (("data-fetch", "tinyset", "--connect-timeout", "abc"), inv, "--connect-timeout 'abc'"),
    ]
    for argv, where, said in cases:
        out = run_fab(*argv, "--inventory", str(where), "--jobs-dir", str(jobs))
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (argv, out.stdout, out.stderr)
        assert lines[0].startswith("gpufleet: ") and said in lines[0], (argv, lines)
        assert out.stdout == ""
    assert not jobs.exists() and not (place["scratch"] / "data").exists()
