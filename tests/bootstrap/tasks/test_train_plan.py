"""``fab train``'s pure parts: workdir selection and diff, the job spec and its network
environment, merging the nodes' job states, and the checkpoint rules of the node side."""

from __future__ import annotations

import ast
import datetime as dt
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from bootstrap.fleet.api import Host
from bootstrap.fleet.hosts import parse_stack_outputs
from bootstrap.remote import job_runner, job_sync
from bootstrap.tasks import train

NOW = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ---------------------------------------------------------------------------- workdir


def test_walk_honours_gitignore_negation_folders_and_never_enters_dot_git(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "w",
        {
            ".gitignore": "*.pt\ndata/\n!keep.pt\n/build\n",
            "train.py": "x",
            "model.pt": "big",
            "keep.pt": "small",
            "data/shard-0": "d",
            "src/data/ok.py": "not under the ignored top-level data/? still ignored: no anchor",
            "build/out": "o",
            "src/build/kept.py": "anchored /build only matches at the top",
            ".git/config": "secret",
            "sub/.gitignore": "*.log\n",
            "sub/run.log": "l",
            "sub/mod.py": "m",
        },
    )
    files = train.walk_files(root)
    assert "train.py" in files and "keep.pt" in files and "sub/mod.py" in files
    assert "src/build/kept.py" in files
    for gone in ("model.pt", "data/shard-0", "src/data/ok.py", "build/out", "sub/run.log"):
        assert gone not in files
    assert not any(f.startswith(".git/") for f in files)


def test_inside_a_git_repo_git_decides_what_is_copied(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "repo", {".gitignore": "ckpt/\n", "a.py": "1", "ckpt/x": "2"})
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    assert train.workdir_files(root) == [".gitignore", "a.py"]


def test_a_workdir_over_the_limit_is_refused_naming_the_largest_files(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "w", {"train.py": "x", "weights.bin": "w" * 5000})
    with pytest.raises(train.TrainError) as err:
        train.build_manifest(root, ["train.py", "weights.bin"], limit_bytes=1000)
    text = str(err.value)
    assert "over the 0 MB limit" in text and "weights.bin" in text and ".gitignore" in text
    assert "\n" not in text


def test_a_rerun_sends_only_changed_files_and_deletes_only_what_it_synced(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "w", {"a.py": "1", "b.py": "2"})
    first = train.build_manifest(root, ["a.py", "b.py"], 1e9)
    assert train.diff_manifest(first, {}) == (["a.py", "b.py"], [])
    assert train.diff_manifest(first, first) == ([], [])
    (root / "b.py").write_text("changed")
    (root / "a.py").unlink()
    make_tree(root, {"c.py": "3"})
    second = train.build_manifest(root, ["b.py", "c.py"], 1e9)
    send, delete = train.diff_manifest(second, first)
    assert send == ["b.py", "c.py"]
    assert delete == ["a.py"]  # only files an earlier sync put there


def test_unpack_on_the_node_applies_the_update_and_keeps_files_it_did_not_sync(
    tmp_path: Path,
) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "new", "pkg/b.py": "b"})
    node = make_tree(tmp_path / "node", {"a.py": "old", "old.py": "x", "outputs/log": "mine"})
    manifest = train.build_manifest(src, ["a.py", "pkg/b.py"], 1e9)
    tar = tmp_path / "u.tar.gz"
    tar.write_bytes(
        train.pack(src, ["a.py", "pkg/b.py"], {"files": manifest, "delete": ["old.py"]})
    )
    out = job_runner.unpack(node, tar)
    assert out == {"ok": True, "placed": 2, "removed": 1}
    assert (node / "a.py").read_text() == "new" and (node / "pkg/b.py").read_text() == "b"
    assert not (node / "old.py").exists() and (node / "outputs/log").read_text() == "mine"
    assert json.loads((node / train.SYNC_MANIFEST).read_text())["files"] == manifest


# ---------------------------------------------------------------------------- request + spec


def request(tmp_path: Path, **overrides: object) -> train.TrainRequest:
    make_tree(tmp_path / "proj", {"train_lm.py": "print(1)"})
    kwargs: dict[str, object] = {
        "script": "proj/train_lm.py",
        "args": "--steps 5 --name 'a b'",
        "workdir": "",
        "name": "",
        "nproc_per_node": 0,
        "cpu": False,
        "stop_when_done": False,
        "venv": "",
        "jobs_dir": "",
        "max_workdir_mb": 200.0,
        "sync_interval": 60.0,
        "node_env": "",
        "s3_endpoint": "",
        "master_port": 0,
        "detach": "auto",
        "cwd": tmp_path,
    }
    kwargs.update(overrides)
    return train.parse_request(**kwargs)  # type: ignore[arg-type]


def test_a_request_takes_the_scripts_folder_and_name_and_splits_the_args(tmp_path: Path) -> None:
    req = request(tmp_path)
    assert req.workdir == tmp_path / "proj" and req.script == "train_lm.py"
    assert req.name == "train-lm" and req.args == ("--steps", "5", "--name", "a b")


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"script": ""}, "--script is required"),
        ({"script": "nope.py"}, "no such file"),
        ({"workdir": "missing"}, "no such folder"),
        ({"workdir": "elsewhere"}, "is not inside the workdir"),
        ({"name": "bad name!"}, "--name"),
        ({"args": "'unclosed"}, "--args"),
        ({"node_env": "NOEQUALS"}, "not KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(
    tmp_path: Path, overrides: dict[str, object], says: str
) -> None:
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(train.TrainError) as err:
        request(tmp_path, **overrides)
    assert says in str(err.value) and "\n" not in str(err.value)


def fleet(tier: dict[str, object] | None = None, provider: str = "aws", nodes: int = 2):
    return parse_stack_outputs(
        {
            "stack": "s",
            "provider": provider,
            "region": "us-east-1",
            "bucket": "gpufleet-s",
            "tier": tier or {"name": "a100x8", "instance_type": "p4d.24xlarge", "efa": True},
            "nodes": [
                {
                    "name": f"n{i}",
                    "role": "head" if i == 0 else "worker",
                    "public_ip": f"203.0.113.{i + 1}",
                    "private_ip": f"10.0.0.{i + 1}",
                }
                for i in range(nodes)
            ],
            "scratch": {"path": "/scratch", "kind": "nvme"},
            "hourly_cost": {"currency": "USD", "billing": "on-demand", "amount": 40.0},
        }
    )


def test_efa_tiers_get_the_efa_provider_and_rdma_only_where_the_catalog_says() -> None:
    assert train.network_env({"efa": True, "instance_type": "p4d.24xlarge"}, "aws") == {
        "FI_PROVIDER": "efa",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }
    g5 = train.network_env({"efa": True, "instance_type": "g5.48xlarge"}, "aws")
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5
    assert (
        train.network_env({"efa": False, "instance_type": "ecs.gn7i-c8g1.2xlarge"}, "alicloud")
        == {}
    )


def test_an_nd_stack_trains_with_the_infiniband_env_and_the_users_env_over_it(
    tmp_path: Path,
) -> None:
    tier = {"name": "h100x8", "instance_type": "Standard_ND96isr_H100_v5", "efa": False}
    f = fleet({**tier, "infiniband": True}, provider="azure")
    req = request(tmp_path, node_env="NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=eth1")
    spec = train.job_spec(
        req, f, job="j1", nproc=8, master_addr="10.0.0.1", master_port=29555, now=NOW
    )
    env = spec["env"]
    assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
    assert env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1" and env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == "eth1" and env["NCCL_DEBUG"] == "INFO"  # the user's
    assert "FI_PROVIDER" not in env


def test_the_spec_carries_the_contract_rendezvous_and_bucket_layout(tmp_path: Path) -> None:
    f = fleet()
    spec = train.job_spec(
        request(tmp_path, cpu=True),
        f,
        job="j1",
        nproc=2,
        master_addr="10.0.0.1",
        master_port=29555,
        now=NOW,
    )
    assert spec["nnodes"] == 2 and spec["nproc_per_node"] == 2
    assert (spec["master_addr"], spec["master_port"]) == ("10.0.0.1", 29555)
    assert spec["checkpoint_dir"] == "/scratch/checkpoints/j1"
    # The watchdog already uploads <scratch>/checkpoints to checkpoints/<node>/.
    assert spec["bucket_prefix"] == "checkpoints/n0/j1/"
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == ""  # --cpu on a GPU node is still CPU
    assert spec["env"]["FI_PROVIDER"] == "efa"
    assert [train.rank_of(spec, h) for h in f.hosts] == [0, 1]
    assert train.rank_of(spec, Host("198.51.100.9")) is None
    env = job_runner.rank_env(spec, 1)
    assert env["GPUFLEET_JOB"] == "j1" and env["GPUFLEET_BUCKET"] == "gpufleet-s"
    assert env["GPUFLEET_CHECKPOINT_DIR"] == "/scratch/checkpoints/j1"
    assert env["GPUFLEET_BUCKET_PREFIX"] == "checkpoints/n0/j1/"


def test_torchrun_meets_on_the_head_and_runs_the_launcher(tmp_path: Path) -> None:
    spec = train.job_spec(
        request(tmp_path),
        fleet(),
        job="j1",
        nproc=8,
        master_addr="10.0.0.1",
        master_port=29555,
        now=NOW,
    )
    argv = job_runner.torchrun_argv(spec, 1, Path("/jobs/j1"))
    assert argv[:3] == ["/opt/gpufleet/venv/bin/python", "-m", "torch.distributed.run"]
    assert "--nnodes=2" in argv and "--node-rank=1" in argv and "--nproc-per-node=8" in argv
    assert "--master-addr=10.0.0.1" in argv and "--master-port=29555" in argv
    assert argv[argv.index("--") + 1 :] == [
        f"{spec['workdir']}/train_lm.py",
        "--steps",
        "5",
        "--name",
        "a b",
    ]


def test_resume_keeps_the_job_and_bumps_the_attempt(tmp_path: Path) -> None:
    spec = train.job_spec(
        request(tmp_path), fleet(), job="j1", nproc=1, master_addr="a", master_port=1, now=NOW
    )
    again = train.resume_spec(spec, master_addr="b", master_port=2, stop_when_done=True)
    assert (again["job"], again["attempt"], again["resume"]) == ("j1", 2, True)
    assert again["script"] == spec["script"] and again["args"] == spec["args"]
    assert again["stop_when_done"] is True and again["master_port"] == 2


def test_systemd_unit_runs_the_supervisor_as_the_user_and_outlives_ssh() -> None:
    argv = job_runner.systemd_argv(Path("/jobs/j1"), 0, "j1", sudo=True)
    assert argv[:3] == ["sudo", "-n", "systemd-run"]
    assert "--unit=gpufleet-job-j1-n0" in argv and "--collect" in argv
    assert any(a.startswith("--uid=") for a in argv)
    assert argv[-3:] == ["supervise", "--job-dir=/jobs/j1", "--node-rank=0"]


# ---------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("facts", "cpu", "says"),
    [
        ({"python3": "3.8", "torch": "2.1"}, True, "python3 >= 3.10"),
        ({"python3": "3.10", "torch": ""}, True, "run `fab setup`"),
        ({"python3": "3.12", "torch": "2.1", "gpus": "0"}, False, "pass --cpu"),
        (
            {"python3": "3.12", "torch": "2.1", "gpus": "0", "jobs_dir": "root-only"},
            True,
            "no write access, no sudo",
        ),
    ],
)
def test_a_node_that_cannot_run_the_job_is_named_with_the_fix(
    facts: dict[str, str], cpu: bool, says: str
) -> None:
    why = train.judge_check(facts, cpu=cpu, venv="/v", host="n1 (10.0.0.2)")
    assert why is not None and says in why and why.startswith("n1 (10.0.0.2)")


@pytest.mark.parametrize(
    ("nproc", "cpu", "says"),
    [
        (9, False, "--nproc-per-node 9: the node has 8 GPU(s); give at most 8"),
        (100000, True, "--nproc-per-node 100000: the node has 4 CPU(s); give at most 4"),
    ],
)
def test_more_processes_than_the_node_has_gpus_or_cpus_are_refused(
    nproc: int, cpu: bool, says: str
) -> None:
    facts = {**READY, "cpus": "4"}
    assert train.judge_check(facts, cpu=cpu, venv="/v", host="h", nproc=nproc) == f"h: {says}"


@pytest.mark.parametrize(("nproc", "cpu"), [(8, False), (4, True), (0, False)])
def test_up_to_the_node_s_count_runs(nproc: int, cpu: bool) -> None:
    facts = {**READY, "cpus": "4"}
    assert train.judge_check(facts, cpu=cpu, venv="/v", host="h", nproc=nproc) is None


READY = {
    "python3": "3.10",
    "torch": "2.13.0",
    "gpus": "8",
    "jobs_dir": "writable",
    "ckpt_dir": "writable",
}


def test_a_ready_node_passes_the_check() -> None:
    facts = {
        "python3": "3.10",
        "torch": "2.13.0",
        "gpus": "8",
        "jobs_dir": "writable",
        "ckpt_dir": "writable",
    }
    assert train.judge_check(facts, cpu=False, venv="/v", host="h") is None


# ---------------------------------------------------------------------------- job table


def record(job: str, rank: int, state: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "job": job,
        "name": "lm",
        "node_rank": rank,
        "attempt": 1,
        "state": state,
        "effective": state,
        "started_at": "2026-12-01T09:00:00Z",
        "heartbeat_at": "2026-12-01T09:30:00Z",
        "ended_at": None,
        "spec": {"nnodes": 2, "nproc_per_node": 2, "created_at": "2026-12-01T09:00:00Z"},
    }
    base.update(kw)
    return base


def test_nodes_disagreeing_show_the_worst_state_and_a_shared_disk_counts_once() -> None:
    recs = [
        record("a", 0, "succeeded", ended_at="2026-12-01T09:30:00Z", last_line="done"),
        record("a", 1, "succeeded", ended_at="2026-12-01T09:29:00Z"),
        record("a", 1, "succeeded", ended_at="2026-12-01T09:29:00Z"),  # same disk, read twice
        record("b", 0, "running", effective="interrupted"),
        record("b", 1, "running"),
    ]
    rows = {r.job: r for r in train.merge_jobs(recs, now=NOW, outputs=fleet().outputs)}
    assert rows["a"].state == "succeeded" and rows["a"].runtime_s == 1800
    assert rows["a"].cost == pytest.approx(20.0 * 2 * 0.5)  # 40 USD/h for 2 nodes, 30 min
    assert rows["b"].state == "interrupted"
    # An interrupted job cost money until its last heartbeat, not until now.
    assert rows["b"].runtime_s == 1800


def test_the_jobs_table_keeps_the_start_of_a_long_last_line() -> None:
    # Issue 24: the table showed the last 40 characters, so a line lost its beginning.
    line = "epoch 12 loss 0.4312 lr 0.0003 tokens/s 18234.5 grad-norm 0.81"
    recs = [record("a", 0, "running", last_line=line), record("a", 1, "running")]
    rows = train.merge_jobs(recs, now=NOW, outputs=fleet().outputs)
    out = io.StringIO()
    Console(file=out, width=200).print(train.jobs_table(rows))
    assert line[:37] + "..." in out.getvalue() and "grad-norm" not in out.getvalue()


def test_a_running_job_runs_until_now_and_earlier_attempts_add_up() -> None:
    recs = [record("c", 0, "running", runtime_s_before=600.0), record("c", 1, "running")]
    (row,) = train.merge_jobs(recs, now=NOW, outputs={})
    assert row.state == "running" and row.runtime_s == 3600 + 600 and row.cost is None


def test_a_job_is_found_by_id_or_by_its_newest_name_else_one_line() -> None:
    rows = train.merge_jobs(
        [
            record("lm-1", 0, "failed"),
            record(
                "lm-2",
                0,
                "running",
                started_at="2026-12-01T09:10:00Z",
                spec={"nnodes": 1, "created_at": "2026-12-01T09:10:00Z"},
            ),
        ],
        now=NOW,
        outputs={},
    )
    assert train.find_job(rows, "lm-1").job == "lm-1"
    assert train.find_job(rows, "lm").job == "lm-2"
    with pytest.raises(train.TrainError, match="no job 'zz' on these nodes"):
        train.find_job(rows, "zz")


def test_state_files_of_a_dead_supervisor_or_another_boot_read_as_interrupted() -> None:
    st = {"state": "running", "boot_id": "b1"}
    assert job_runner.effective_state(st, alive=True, current_boot="b1") == "running"
    assert job_runner.effective_state(st, alive=False, current_boot="b1") == "interrupted"
    assert job_runner.effective_state(st, alive=True, current_boot="b2") == "interrupted"
    done = {"state": "succeeded", "boot_id": "b1"}
    assert job_runner.effective_state(done, alive=False, current_boot="b2") == "succeeded"


# ---------------------------------------------------------------------------- checkpoints


def marker(files: dict[str, int], step: int = 0) -> str:
    return json.dumps({"step": step, "files": files})


def test_the_newest_complete_checkpoint_wins_and_half_written_ones_are_skipped() -> None:
    listing = {
        "step-10/model.pt": 100,
        "step-10/COMPLETE": 30,
        "step-20/model.pt": 100,
        "step-20/COMPLETE": 30,
        "step-30/model.pt": 40,
        "step-30/COMPLETE": 30,  # cut off: marker says 100
        "step-40/model.pt": 100,  # no marker yet
        "notes.txt": 5,
    }
    markers = {f"step-{s}": marker({"model.pt": 100}, s) for s in (10, 20, 30)}
    best = job_sync.newest_complete(listing, markers.get)
    assert best is not None and best.folder == "step-20" and best.step == 20


def test_a_marker_that_is_not_json_or_lists_escaping_paths_is_not_complete() -> None:
    assert job_sync.parse_marker("{not json") is None
    assert job_sync.parse_marker(json.dumps({"files": {"../x": 1}})) is None
    assert job_sync.parse_marker(json.dumps({"files": {}})) is None


class DictStore:
    """An in-memory bucket with the Store protocol (moto covers the real HTTP elsewhere)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def list(self, prefix: str) -> dict[str, int]:
        return {k: len(v) for k, v in self.objects.items() if k.startswith(prefix)}

    def get(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.objects[key])

    def put(self, source: Path, key: str) -> None:
        self.objects[key] = source.read_bytes()

    def push(self, root: Path, prefix: str) -> None:
        for rel in job_sync.local_listing(root):
            self.put(root / rel, f"{prefix}{rel}")


def write_checkpoint(root: Path, step: int, payload: bytes, *, complete: bool = True) -> None:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(payload)
    if complete:
        (folder / "COMPLETE").write_text(marker({"model.pt": len(payload)}, step))


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_the_watchdogs_sync_uploads_a_job_and_restore_fetches_only_the_newest(
    tmp_path: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(
        Bucket="ckpt-roundtrip"
    )
    node = tmp_path / "scratch" / "checkpoints" / "j1"
    write_checkpoint(node, 10, b"a" * 10)
    write_checkpoint(node, 20, b"b" * 20)
    store = job_sync.make_store("aws", "ckpt-roundtrip", "us-east-1", moto_url)
    assert store is not None
    out = job_sync.push(node, store, "n0")
    assert out.ok and out.uploaded == 4 and out.newest_step == 20, out
    assert job_sync.push(node, store, "n0").uploaded == 0  # the record says all is saved

    reader = job_sync.BucketReader(store)
    assert set(reader.list("checkpoints/n0/j1/")) == {
        f"checkpoints/n0/j1/step-000000{s}0/{f}" for s in (1, 2) for f in ("model.pt", "COMPLETE")
    }
    fresh = tmp_path / "fresh"
    back = job_sync.restore(fresh, reader, "checkpoints/n0/j1/")
    assert back.ok and back.newest_step == 20
    assert (fresh / "step-00000020" / "model.pt").read_bytes() == b"b" * 20
    assert not (fresh / "step-00000010").exists()  # only the newest is fetched


def test_a_test_endpoint_without_credentials_never_asks_the_metadata_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    store = job_sync.make_store("aws", "b", "us-east-1", "http://127.0.0.1:9")
    assert store is not None and store.credentials() is None


def test_restore_ignores_a_newer_checkpoint_cut_off_in_the_bucket(tmp_path: Path) -> None:
    store = DictStore()
    node = tmp_path / "n"
    write_checkpoint(node, 10, b"x" * 10)
    store.push(node, "p/")
    # A node stopped while uploading step 20: its marker reached the bucket, half the data.
    store.objects["p/step-00000020/model.pt"] = b"y" * 5
    store.objects["p/step-00000020/COMPLETE"] = marker({"model.pt": 20}, 20).encode()
    out = job_sync.restore(tmp_path / "fresh", store, "p/")
    assert out.newest_step == 10 and "step-00000010" in out.detail


def test_fab_train_ships_exactly_what_the_job_runner_imports() -> None:
    """No more and no less: the runner's own files and, following their imports, the
    bucket client, the node clouds and the names (not the watchdog: fab setup installs it)."""
    from tests.bootstrap.remote.test_watchdog_alone import imports_of

    remote = train.REMOTE_DIR
    wanted: set[str] = set()
    todo = ["job_runner.py", "job_launch.py", "job_sync.py"]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        path = remote / name
        if path.name == "__init__.py":  # a package: every module in it is imported
            todo += [f"{path.parent.name}/{p.name}" for p in path.parent.glob("*.py")]
        for module in imports_of(ast.parse(path.read_text())):
            for candidate in (f"{module}.py", f"{module}/__init__.py"):
                if (remote / candidate).is_file():
                    todo.append(candidate)
    assert set(train.REMOTE_FILES) == wanted


def test_the_node_files_run_on_a_bare_interpreter_with_only_the_shipped_files(
    tmp_path: Path,
) -> None:
    """The boundary: job_*.py need nothing from the repo, only their shipped neighbours."""
    for name in train.REMOTE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((train.REMOTE_DIR / name).read_bytes())
    code = "import job_runner, job_sync, job_launch; print(job_runner.STATE_SCHEMA)"
    done = subprocess.run(
        # -S: no site-packages (so not the editable install of this repo); -E: no PYTHONPATH.
        [sys.executable, "-S", "-E", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gpufleet.job-state/1"
