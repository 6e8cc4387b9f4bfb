"""``fab train``'s request and job spec (with its network environment), and the judgement
of a node's facts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bootstrap.fleet.api import Host
from bootstrap.fleet.interconnect import network_env
from bootstrap.train.spec import (
    ResumeOptions,
    TrainError,
    TrainRequest,
    check_bucket_home,
    job_spec,
    judge_check,
    parse_request,
    rank_of,
    resume_changes,
    resume_spec,
)
from gpufleet_node import job_runner
from tests.bootstrap.train.samples import NOW, fleet, make_tree


def request(tmp_path: Path, **overrides: object) -> TrainRequest:
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
    return parse_request(**kwargs)  # type: ignore[arg-type]


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
    with pytest.raises(TrainError) as err:
        request(tmp_path, **overrides)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_efa_tiers_get_the_efa_provider_and_rdma_only_where_the_catalog_says() -> None:
    assert network_env({"efa": True, "instance_type": "p4d.24xlarge"}, "aws") == {
        "FI_PROVIDER": "efa",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "FI_EFA_USE_DEVICE_RDMA": "1",
    }
    g5 = network_env({"efa": True, "instance_type": "g5.48xlarge"}, "aws")
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5
    assert network_env({"efa": False, "instance_type": "ecs.gn7i-c8g1.2xlarge"}, "alicloud") == {}


@pytest.mark.parametrize(
    ("provider", "region", "says"),
    [("", "us-east-1", 'without its provider: add "provider"'), ("aws", "", 'add "region"')],
)
def test_a_bucket_without_its_cloud_or_region_is_refused_in_one_line(
    provider: str, region: str, says: str
) -> None:
    f = fleet(provider=provider)
    f = replace(f, outputs={**f.outputs, "region": region})
    with pytest.raises(TrainError) as err:
        check_bucket_home(f)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_stack_without_a_bucket_or_with_its_cloud_and_region_passes() -> None:
    check_bucket_home(fleet())
    f = fleet(provider="")
    check_bucket_home(replace(f, outputs={**f.outputs, "bucket": None}))


def test_an_nd_stack_trains_with_the_infiniband_env_and_the_users_env_over_it(
    tmp_path: Path,
) -> None:
    tier = {"name": "h100x8", "instance_type": "Standard_ND96isr_H100_v5", "efa": False}
    f = fleet({**tier, "infiniband": True}, provider="azure")
    req = request(tmp_path, node_env="NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=eth1")
    spec = job_spec(req, f, job="j1", nproc=8, master_addr="10.0.0.1", master_port=29555, now=NOW)
    env = spec["env"]
    assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
    assert env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1" and env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == "eth1" and env["NCCL_DEBUG"] == "INFO"  # the user's
    assert "FI_PROVIDER" not in env


def test_the_spec_carries_the_contract_rendezvous_and_bucket_layout(tmp_path: Path) -> None:
    f = fleet()
    spec = job_spec(
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
    assert [rank_of(spec, h) for h in f.hosts] == [0, 1]
    assert rank_of(spec, Host("198.51.100.9")) is None
    env = job_runner.rank_env(spec, 1)
    assert env["GPUFLEET_JOB"] == "j1" and env["GPUFLEET_BUCKET"] == "gpufleet-s"
    assert env["GPUFLEET_CHECKPOINT_DIR"] == "/scratch/checkpoints/j1"
    assert env["GPUFLEET_BUCKET_PREFIX"] == "checkpoints/n0/j1/"


def test_torchrun_meets_on_the_head_and_runs_the_launcher(tmp_path: Path) -> None:
    spec = job_spec(
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
    # torchrun's logs stay with the job, not in a /tmp/torchelastic_* folder per launch
    launcher = argv.index("gpufleet_node.job_launch")
    assert argv[launcher - 1] == "--module"  # each rank: python -m gpufleet_node.job_launch
    assert argv.index("--log-dir=/jobs/j1/node-1/torchelastic") < launcher
    assert argv[argv.index("--") + 1 :] == [
        f"{spec['workdir']}/train_lm.py",
        "--steps",
        "5",
        "--name",
        "a b",
    ]


def test_resume_keeps_the_job_and_bumps_the_attempt(tmp_path: Path) -> None:
    spec = job_spec(
        request(tmp_path), fleet(), job="j1", nproc=1, master_addr="a", master_port=1, now=NOW
    )
    changes = resume_changes(spec, ResumeOptions(stop_when_done=True))
    again = resume_spec(spec, master_addr="b", master_port=2, changes=changes)
    assert (again["job"], again["attempt"], again["resume"]) == ("j1", 2, True)
    assert again["script"] == spec["script"] and again["args"] == spec["args"]
    assert again["stop_when_done"] is True and again["master_port"] == 2
    assert again["changed"] == ["stop_when_done"]
    # A resume whose restore failed started nothing: its number is taken again.
    assert resume_spec(again, master_addr="b", master_port=2, attempt=1)["attempt"] == 2


def test_placeholders_stay_as_typed_in_the_spec_and_resume_args_are_recorded(
    tmp_path: Path,
) -> None:
    req = request(
        tmp_path,
        args="--out_dir={checkpoint_dir} --tag {job}-{attempt}-{node_rank} --json '{{}}'",
        resume_args="--resume_from_checkpoint {newest checkpoint-*} --x '{newest  y-*}'",
    )
    spec = job_spec(req, fleet(), job="j1", nproc=1, master_addr="a", master_port=1, now=NOW)
    assert spec["args"] == [
        "--out_dir={checkpoint_dir}", "--tag", "{job}-{attempt}-{node_rank}", "--json", "{{}}",
    ]  # fmt: skip
    # `{newest GLOB}` is one argument, quoted or not.
    assert spec["resume_args"] == [
        "--resume_from_checkpoint", "{newest checkpoint-*}", "--x", "{newest y-*}",
    ]  # fmt: skip
    assert request(tmp_path).resume_args == ()


@pytest.mark.parametrize(
    ("option", "text", "says"),
    [
        ("args", "--out {ckpt}", "unknown placeholder {ckpt}"),
        ("args", "--config '{\"lr\": 1}'", 'unknown placeholder {"lr": 1}'),
        ("args", "--x a{b", "a lone '{' at character 2"),
        ("args", "--x }", "a lone '}' at character 1"),
        ("resume_args", "--from {newest}", "{newest} needs a pattern"),
        ("resume_args", "--from {newest a/b-*}", "directly in the folder"),
        ("resume_args", "--from {Job}", "unknown placeholder {Job}"),
    ],
)
def test_a_bad_placeholder_is_refused_in_one_line_listing_the_known_names(
    tmp_path: Path, option: str, text: str, says: str
) -> None:
    with pytest.raises(TrainError) as err:
        request(tmp_path, **{option: text})
    line = str(err.value)
    flag = "--" + option.replace("_", "-")
    assert line.startswith(f"{flag} ") and says in line and "\n" not in line
    assert line.endswith(
        "known: {checkpoint_dir}, {job}, {attempt}, {node_rank}, {scratch}, "
        "{newest GLOB} ({{ and }} write a brace)"
    )


def test_options_given_with_resume_are_applied_and_recorded(tmp_path: Path) -> None:
    spec = job_spec(
        request(tmp_path, cpu=True), fleet(), job="j1", nproc=1, master_addr="a",
        master_port=1, now=NOW,
    )  # fmt: skip
    given = ResumeOptions(
        args="--init_from=resume --out_dir={checkpoint_dir}",
        resume_args="--init_from=resume",
        nproc_per_node=3,
        cpu=True,  # as recorded: nothing to change
        venv="/opt/other-venv/",
        sync_interval=5.0,
        node_env="HF_HOME=/scratch/hf,CUDA_VISIBLE_DEVICES=",
        s3_endpoint="http://127.0.0.1:9000",
        detach="fork",
    )
    again = resume_spec(spec, master_addr="a", master_port=1, changes=resume_changes(spec, given))
    assert again["args"] == ["--init_from=resume", "--out_dir={checkpoint_dir}"]
    assert again["resume_args"] == ["--init_from=resume"]
    assert again["nproc_per_node"] == 3 and again["python"] == "/opt/other-venv/bin/python"
    assert again["sync_interval_s"] == 5.0 and again["detach"] == "fork"
    assert again["s3_endpoint"] == "http://127.0.0.1:9000"
    # --node-env adds to the recorded environment; a variable it names wins.
    assert again["env"]["HF_HOME"] == "/scratch/hf"
    assert set(spec["env"]) <= set(again["env"])
    assert again["changed"] == [
        "args", "detach", "env", "nproc_per_node", "python", "resume_args", "s3_endpoint",
        "sync_interval_s",
    ]  # fmt: skip
    # An empty --args (or --resume-args) clears them; not giving them keeps the record.
    cleared = resume_changes(again, ResumeOptions(args="", resume_args=""))
    assert cleared == {"args": [], "resume_args": []}
    assert resume_changes(again, ResumeOptions()) == {}


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (ResumeOptions(workdir="elsewhere"), "--workdir: job j1 runs from its recorded workdir"),
        (ResumeOptions(name="other"), "--name: job j1 keeps its name"),
        (ResumeOptions(cpu=True), "--cpu: job j1 ran on GPUs and resumes on them"),
        (ResumeOptions(args="--x {nope}"), "unknown placeholder {nope}"),
        (ResumeOptions(resume_args="'open"), "--resume-args"),
        (ResumeOptions(detach="screen"), "--detach 'screen'"),
        (ResumeOptions(node_env="NOEQUALS"), "not KEY=VALUE"),
    ],
)
def test_options_a_resume_cannot_apply_are_refused_in_one_line(
    tmp_path: Path, given: ResumeOptions, says: str
) -> None:
    spec = job_spec(
        request(tmp_path), fleet(), job="j1", nproc=8, master_addr="a", master_port=1, now=NOW
    )
    with pytest.raises(TrainError) as err:
        resume_changes(spec, given)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_recorded_argument_the_node_could_not_expand_is_refused_on_resume() -> None:
    old = {"job": "j0", "args": ["--config", '{"lr": 1}'], "env": {}}
    with pytest.raises(TrainError) as err:
        resume_changes(old, ResumeOptions())
    assert str(err.value).startswith("job j0's recorded --args '{\"lr\": 1}': unknown")
    assert str(err.value).endswith("give --args again")
    assert resume_changes(old, ResumeOptions(args="--config '{{\"lr\": 1}}'")) == {
        "args": ["--config", '{{"lr": 1}}']
    }


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
    why = judge_check(facts, cpu=cpu, venv="/v", host="n1 (10.0.0.2)")
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
    assert judge_check(facts, cpu=cpu, venv="/v", host="h", nproc=nproc) == f"h: {says}"


@pytest.mark.parametrize(("nproc", "cpu"), [(8, False), (4, True), (0, False)])
def test_up_to_the_node_s_count_runs(nproc: int, cpu: bool) -> None:
    facts = {**READY, "cpus": "4"}
    assert judge_check(facts, cpu=cpu, venv="/v", host="h", nproc=nproc) is None


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
    assert judge_check(facts, cpu=False, venv="/v", host="h") is None


def test_sync_quiet_is_recorded_with_the_nodes_default_and_applied_on_resume(
    tmp_path: Path,
) -> None:
    """--sync-quiet: how long the checkpoint folder stays unchanged before a periodic push
    (the node reads job.json's sync_quiet_s); not given, the node's own QUIET_S."""
    quiet = job_spec(
        request(tmp_path), fleet(), job="j1", nproc=1, master_addr="a", master_port=1, now=NOW
    )
    assert quiet["sync_quiet_s"] == job_runner.job_sync.QUIET_S == 2.0
    given = job_spec(
        request(tmp_path, sync_quiet=0.25), fleet(), job="j1", nproc=1, master_addr="a",
        master_port=1, now=NOW,
    )  # fmt: skip
    assert given["sync_quiet_s"] == 0.25
    changes = resume_changes(given, ResumeOptions(sync_quiet=10.0))
    again = resume_spec(given, master_addr="a", master_port=1, changes=changes)
    assert again["sync_quiet_s"] == 10.0 and again["changed"] == ["sync_quiet_s"]
    assert resume_changes(again, ResumeOptions()) == {}  # not given: the record stays
    for refused in (
        lambda: request(tmp_path, sync_quiet=-1.0),
        lambda: resume_changes(given, ResumeOptions(sync_quiet=-1.0)),
    ):
        with pytest.raises(TrainError, match=r"^--sync-quiet must be above 0 seconds$"):
            refused()
