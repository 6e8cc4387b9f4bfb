"""Issue 39: widely used public scripts, unmodified where they touch checkpoints, really
continue at their last saved step after a kill, a wiped checkpoint folder and
``fab train --resume``.

- karpathy/nanoGPT's train.py (examples/nanogpt/, two CPU edits marked): ``out_dir`` is the
  job's ``{checkpoint_dir}``, and it resumes only with ``--init_from=resume``, the job's
  ``--resume-args``.
- transformers' run_clm.py (examples/hf_trainer/, unmodified): ``--output_dir
  {checkpoint_dir}``, resumed with ``--resume_from_checkpoint {newest checkpoint-*}``.

Each trains on one sshd node (1 process) and on two (1 process each: a gloo job of 2 ranks)
with a moto bucket, is killed as a spot reclaim kills it (SIGKILL of the supervisor,
torchrun and the ranks) once the bucket holds a version, loses the node's checkpoint folder
(a stop wipes instance-store NVMe), and is resumed. The proof is the script's own output:
nanoGPT's "Resuming training from" and its first eval/iter lines at the bucket version's
step; the Trainer's "Resuming training from checkpoint with epoch E and global step N".
Without ``--resume-args`` nanoGPT starts from scratch: ``fab jobs`` says so, and the bucket's
newer version stays the one a restore takes.

Both sshd "nodes" are this machine with one scratch folder, so on two nodes the second
node's restore finds what the first restored (the contract's flock); its own restore
record is checked, not a separate disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.bootstrap.conftest import FabResult, node_dir, run_fab
from tests.bootstrap.tasks.test_train_ssh import (
    BUCKET,
    CREDS,
    inventory,
    kill_job,
    known_venvs,
    known_venvs_dir,
    moto_url,
    one_job,
    place,
    s3,
    second_node,
    stop_live_jobs,
    wait_for,
)
from tests.support.sshd import SshServer

# the fixtures this module takes from test_train_ssh
__all__ = ["known_venvs", "known_venvs_dir", "moto_url", "place", "second_node"]

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NANOGPT = "examples/nanogpt/train.py"
RUN_CLM = "examples/hf_trainer/run_clm.py"
# nanoGPT's configurator reads --key=value only. A model of 1 layer x 32 wide on 32-token
# blocks of a 64-token vocabulary: a few ms an iteration on a CPU. A checkpoint every 50
# iterations (always_save_checkpoint), 600 in all.
NANO_ITERS = 600
NANO_ARGS = (
    "--device=cpu --compile=False --dtype=float32 --backend=gloo --dataset={data} "
    "--out_dir={{checkpoint_dir}} --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 "
    "--batch_size=4 --gradient_accumulation_steps=2 --eval_interval=50 --eval_iters=2 "
    f"--log_interval=10 --max_iters={NANO_ITERS} --warmup_iters=10 "
    f"--lr_decay_iters={NANO_ITERS} --always_save_checkpoint=True"
)
NANO_RESUME = "--init_from=resume"
CLM_STEPS = 600
CLM_ARGS = (
    "--config_name {model} --tokenizer_name {model} --train_file {model}/train.txt "
    "--do_train --output_dir {{checkpoint_dir}} --cache_dir {cache}/{{node_rank}} "
    "--per_device_train_batch_size 4 --block_size 32 "
    f"--max_steps {CLM_STEPS} --save_steps 100 --logging_steps 100 --use_cpu --report_to none"
)
CLM_RESUME = "--resume_from_checkpoint {newest checkpoint-*}"
# What the Trainer writes into every checkpoint-N (transformers 5.23, one process per node).
TRAINER_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")

EVAL_LINE = re.compile(r"step (\d+): train loss [0-9.]+, val loss [0-9.]+")
ITER_LINE = re.compile(r"\biter (\d+): loss ")
TRAINER_RESUMED = re.compile(
    r"Resuming training from checkpoint with epoch \d+ and global step (\d+)"
)
TRAINER_SAVED = re.compile(r"Saving model checkpoint to \S*/checkpoint-(\d+)\b")


def nanogpt_data(folder: Path) -> None:
    """train.bin / val.bin as nanoGPT's prepare.py scripts write them (uint16 token ids) and
    meta.pkl with the vocabulary size: a repeating sequence, which the model learns."""
    import numpy as np

    folder.mkdir(mode=0o755)
    tokens = np.arange(20_000) % 61
    tokens.astype(np.uint16).tofile(folder / "train.bin")
    tokens[:4_000].astype(np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 64}, f)


def clm_model(folder: Path) -> None:
    """A local --config_name / --tokenizer_name folder: a tiny GPT-2 config and a
    word-level tokenizer.json (tokenizers' own format), plus a train.txt, so the script
    never asks the hub for anything."""
    folder.mkdir(mode=0o755)
    words = [f"w{i}" for i in range(40)]
    vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    special = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, i in (("<unk>", 0), ("<eos>", 1))
    ]  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
        "eos_token": "<eos>", "model_max_length": 64,
    }))  # fmt: skip
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": len(vocab),
        "n_positions": 64, "n_embd": 32, "n_layer": 1, "n_head": 2, "bos_token_id": 1,
        "eos_token_id": 1,
    }))  # fmt: skip
    lines = (" ".join(words[(i + j) % 40] for j in range(16)) for i in range(400))
    (folder / "train.txt").write_text("\n".join(lines) + "\n")


@dataclass(frozen=True)
class Fleet:
    """One or two sshd nodes, the session's node venv, a jobs folder, the moto bucket and a
    folder of the test's inputs that the SSH user reads (and a cache it writes)."""

    inventory: Path
    venv: Path
    jobs: Path
    scratch: Path
    moto: str
    inputs: Path
    nodes: int

    def train(self, script: str, args: str, *extra: str) -> FabResult:
        return run_fab(
            "train", "--inventory", str(self.inventory), "--script", script, "--cpu",
            "--nproc-per-node", "1", "--venv", str(self.venv), "--jobs-dir", str(self.jobs),
            "--s3-endpoint", self.moto, "--node-env", NODE_ENV.format(hf_home=self.inputs / "hf"),
            "--sync-interval", "1", "--args", args, *extra, timeout=400,
        )  # fmt: skip

    def resume(self, job: str, *extra: str) -> FabResult:
        return run_fab(
            "train", "--resume", job, "--inventory", str(self.inventory), "--jobs-dir",
            str(self.jobs), *extra, timeout=400,
        )  # fmt: skip

    def row(self) -> dict[str, Any]:
        return one_job(self.inventory, self.jobs)


# The hub stays out of reach on the node too; the Trainer's caches go where the SSH user
# writes (its home is not the tests' concern).
NODE_ENV = (
    CREDS + ",HF_HUB_OFFLINE=1,HF_DATASETS_OFFLINE=1,HF_HOME={hf_home},TOKENIZERS_PARALLELISM=false"
)


@pytest.fixture(params=[1, 2], ids=["one-node", "two-nodes"])
def fleet(
    request: pytest.FixtureRequest,
    sshd_server: SshServer,
    place: dict[str, Path],
    moto_url: str,
    tmp_path: Path,
    hf_node_venv: Path,
    known_venvs: Path,
) -> Iterator[Fleet]:
    nodes: list[tuple[SshServer | None, int]] = [(sshd_server, sshd_server.port)]
    if request.param == 2:
        other: SshServer = request.getfixturevalue("second_node")
        nodes.append((other, other.port))
    inv = inventory(tmp_path, nodes, place["scratch"], sshd_server.user, sshd_server.key_path)
    inputs = node_dir("gpufleet-examples-")
    (inputs / "hf").mkdir(mode=0o777)
    (inputs / "hf").chmod(0o777)
    (inputs / "cache").mkdir(mode=0o777)
    (inputs / "cache").chmod(0o777)
    try:
        yield Fleet(inv, hf_node_venv, place["jobs"], place["scratch"], moto_url, inputs,
                    request.param)  # fmt: skip
    finally:
        stop_live_jobs(place["jobs"])
        subprocess.run(["rm", "-rf", str(inputs)], check=False)


def started(result: FabResult, nodes: int) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = re.search(rf"job (\S+) running on {nodes} node", result.stdout)
    assert found, result.stdout[-3000:]
    return found.group(1)


def versions(moto: str, job: str) -> list[dict[str, Any]]:
    """The job's checkpoint versions in the bucket (the contract's manifests), oldest first."""
    client = s3(moto)
    prefix = f"checkpoints/node-0/{job}/.gpufleet/versions/"
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    docs = []
    for obj in sorted(listed, key=lambda o: o["Key"]):
        body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
        docs.append(json.loads(body))
    return docs


def newest(moto: str, job: str) -> dict[str, Any] | None:
    """The version a restore takes: the newest that did not regress."""
    kept = [v for v in versions(moto, job) if not v.get("regressed")]
    return kept[-1] if kept else None


def bucket_step_at_least(moto: str, job: str, step: int) -> int | None:
    version = newest(moto, job)
    found = version.get("step") if version else None
    return found if isinstance(found, int) and found >= step else None


def torch_zip_ok(path: Path) -> bool:
    """Whether ``path`` is a whole torch.save file (a zip whose every member reads back)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


class _Inert(dict):  # type: ignore[type-arg,unused-ignore]
    """Whatever a pickle names (a class, torch's tensor rebuild): built, filled, ignored."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return dict.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass


class _NoImports(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return None


def nanogpt_saved(folder: Path) -> int | None:
    """The iter_num of the whole ckpt.pt in nanoGPT's out_dir, or None; read without torch
    (the zip's data.pkl, every class it names left inert)."""
    path = folder / "ckpt.pt"
    if not torch_zip_ok(path):
        return None
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        saved = _NoImports(z.open(name)).load()
    step = saved.get("iter_num") if isinstance(saved, dict) else None
    return step if isinstance(step, int) else None


def trainer_saved(folder: Path) -> int | None:
    """The newest checkpoint-N in the Trainer's output_dir holding all its files, or None."""
    steps = sorted(
        (int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*") if p.name[11:].isdigit()),
        reverse=True,
    )
    for step in steps:
        ckpt = folder / f"checkpoint-{step}"
        if all((ckpt / f).exists() for f in TRAINER_FILES) and all(
            torch_zip_ok(p) for p in ckpt.glob("*.pt")
        ):
            with contextlib.suppress(OSError, ValueError):
                if json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == step:
                    return step
    return None


def ranks(fleet: Fleet, job: str) -> list[int]:
    """The live ranks of the job on every node (each writes rank-<G>.pid in its node's
    folder), each checked to be a python process before it is signalled."""
    pids = []
    for rank in range(fleet.nodes):
        for pidfile in (fleet.jobs / job / f"node-{rank}").glob("rank-*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip())
                if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(pid)
    return pids


def signal_ranks(fleet: Fleet, job: str, sig: signal.Signals) -> None:
    for pid in ranks(fleet, job):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def hold_at_a_checkpoint(
    fleet: Fleet, job: str, saved: Callable[[Path], int | None], want: Callable[[int], bool]
) -> int:
    """Freeze the script's ranks (SIGSTOP) where its checkpoint folder holds a whole save
    whose step is one ``want`` accepts; that step.

    The scripts save every few hundred ms here; the node's sync pushes a folder only once it
    has been quiet for 2 s (job_sync.QUIET_S), which a real run's minutes between saves
    give and these do not. Frozen, the folder is quiet and whole, and the next sync pushes
    it; the test then kills the job as a spot reclaim would."""
    folder = fleet.scratch / "checkpoints" / job
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        step = saved(folder)
        if step is not None and want(step) and ranks(fleet, job):
            signal_ranks(fleet, job, signal.SIGSTOP)
            time.sleep(0.2)  # a write under way when the signal came has stopped too
            if saved(folder) == step:
                return step
            signal_ranks(fleet, job, signal.SIGCONT)  # caught mid-save: let it finish
        assert fleet.row()["state"] == "running", fleet.row()
        time.sleep(0.05)
    raise AssertionError(f"no whole checkpoint wanted in {folder}")


def held_and_pushed(
    fleet: Fleet, job: str, saved: Callable[[Path], int | None], at_least: int
) -> int:
    """The script held at a whole save of step ``at_least`` or later, once the bucket's
    newest version is that save; its step."""
    step = hold_at_a_checkpoint(fleet, job, saved, lambda s: s >= at_least)
    wait_for(f"step {step} as a version in the bucket",
             lambda: bucket_step_at_least(fleet.moto, job, step))  # fmt: skip
    return step


def kill_and_wipe(fleet: Fleet, job: str, step: int) -> dict[str, Any]:
    """A spot reclaim then a stop: every job process SIGKILLed (nothing saved on the way
    out), then the node's checkpoint folder gone. The bucket's newest version, as the
    resume will find it: the step the script was held at."""
    kill_job(fleet.jobs, job)
    wait_for("the job read as interrupted", lambda: fleet.row()["state"] == "interrupted")
    version = newest(fleet.moto, job)
    assert version is not None and version.get("step") == step, versions(fleet.moto, job)
    shutil.rmtree(fleet.scratch / "checkpoints" / job)
    return version


def regress_or_scratch(warnings: list[str]) -> list[str]:
    """The warnings that say an attempt went back: a regressed version or a fresh start.
    (A run saving every few hundred ms may also be told its folder was never quiet for a
    push, job_sync.QUIET_S: true here, and not what these tests are about.)"""
    return [w for w in warnings if re.search(r"\bregress|\bscratch\b|\bolder\b", w)]


def check_every_node_restored(fleet: Fleet, job: str, version: dict[str, Any]) -> None:
    """Each node restored that version for the resume (attempt 2) itself: its restore.json
    and its state's ``restore`` name it."""
    for rank in range(fleet.nodes):
        node = fleet.jobs / job / f"node-{rank}"
        record = json.loads((node / "restore.json").read_text())
        record = record.get("restore", record)  # the command's line, or its restore part
        assert record["ok"] is True and record["version"] == version["seq"], record
        assert json.loads((node / "restore.json").read_text())["attempt"] == 2, record
        state = json.loads((node / "state.json").read_text())
        assert state["restore"]["version"] == version["seq"], state["restore"]
        assert state["resumed_from"] == {"version": version["seq"], "step": version["step"]}


@pytest.mark.timeout(900)  # the session's node venv may be built in this setup (minutes)
def test_nanogpt_continues_at_its_last_saved_iter_after_a_kill_and_a_wiped_node(
    fleet: Fleet,
) -> None:
    nanogpt_data(fleet.inputs / "tiny")
    job = started(
        fleet.train(NANOGPT, NANO_ARGS.format(data=fleet.inputs / "tiny"), "--resume-args",
                    NANO_RESUME),
        fleet.nodes,
    )  # fmt: skip
    saved = held_and_pushed(fleet, job, nanogpt_saved, 100)
    version = kill_and_wipe(fleet, job, saved)
    assert saved % 50 == 0 and saved < NANO_ITERS, version

    resumed = fleet.resume(job, "--follow")
    out = resumed.stdout
    assert resumed.returncode == 0, out[-3000:] + resumed.stderr[-3000:]
    assert f"job {job} resumed on {fleet.nodes} node" in out, out[-3000:]
    # nanoGPT's own words: it loaded the checkpoint, and its counters go on from it.
    assert "Resuming training from " in out and "Initializing a new model from scratch" not in out
    evals = [int(n) for n in EVAL_LINE.findall(out)]
    iters = [int(n) for n in ITER_LINE.findall(out)]
    assert evals[0] == saved and iters[0] == saved, (saved, evals[:3], iters[:3])
    assert evals[-1] == NANO_ITERS and iters[-1] == NANO_ITERS, (evals[-3:], iters[-3:])
    assert "iter 0: loss" not in out

    row = fleet.row()
    assert (row["state"], row["attempt"]) == ("succeeded", 2), row
    assert row["resumed_from"]["step"] == saved, row
    assert not regress_or_scratch(row["warnings"]), row["warnings"]
    check_every_node_restored(fleet, job, version)
    final = newest(fleet.moto, job)
    assert final is not None and final["step"] == NANO_ITERS, final


@pytest.mark.timeout(900)
def test_run_clm_continues_from_the_newest_trainer_checkpoint_after_a_kill_and_a_wiped_node(
    fleet: Fleet,
) -> None:
    clm_model(fleet.inputs / "model")
    args = CLM_ARGS.format(model=fleet.inputs / "model", cache=fleet.inputs / "cache")
    job = started(fleet.train(RUN_CLM, args, "--resume-args", CLM_RESUME), fleet.nodes)
    saved = held_and_pushed(fleet, job, trainer_saved, 200)
    version = kill_and_wipe(fleet, job, saved)
    assert saved % 100 == 0 and saved < CLM_STEPS, version
    assert f"checkpoint-{saved}/trainer_state.json" in version["files"], sorted(version["files"])

    resumed = fleet.resume(job, "--follow")
    out = resumed.stdout
    assert resumed.returncode == 0, out[-3000:] + resumed.stderr[-3000:]
    assert f"job {job} resumed on {fleet.nodes} node" in out, out[-3000:]
    # The Trainer's own words: the newest checkpoint-N came back and was loaded.
    assert re.search(rf"Loading model from \S*/checkpoint-{saved}\.", out), out[-3000:]
    # (logged by each node's first process: log_on_each_node)
    assert [int(n) for n in TRAINER_RESUMED.findall(out)] == [saved] * fleet.nodes, out[-3000:]
    checkpoints = [int(n) for n in TRAINER_SAVED.findall(out)]
    assert checkpoints[0] == saved + 100 and checkpoints[-1] == CLM_STEPS, checkpoints

    row = fleet.row()
    assert (row["state"], row["attempt"]) == ("succeeded", 2), row
    assert row["resumed_from"]["step"] == saved, row
    assert not regress_or_scratch(row["warnings"]), row["warnings"]
    check_every_node_restored(fleet, job, version)
    final = newest(fleet.moto, job)
    assert final is not None and final["step"] == CLM_STEPS, final


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fleet", [1], ids=["one-node"], indirect=True)
def test_nanogpt_resumed_without_its_resume_flag_is_reported_and_never_replaces_the_bucket(
    fleet: Fleet,
) -> None:
    nanogpt_data(fleet.inputs / "tiny")
    job = started(fleet.train(NANOGPT, NANO_ARGS.format(data=fleet.inputs / "tiny")), 1)
    saved = held_and_pushed(fleet, job, nanogpt_saved, 300)
    version = kill_and_wipe(fleet, job, saved)

    # No --resume-args: the files come back, but the script starts from iter 0 and its
    # first checkpoints (iter 50, 100, ...) are older than the one restored.
    log = fleet.jobs / job / "logs" / "rank-0.log"
    attempt_start = len(log.read_bytes())  # the killed attempt writes no more
    resumed = fleet.resume(job)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    def second_attempt_version() -> dict[str, Any] | None:
        mine = [v for v in versions(fleet.moto, job) if v.get("attempt") == 2]
        return mine[0] if mine else None

    # Held at its first checkpoint (iter 50), the restarted script's save goes up.
    hold_at_a_checkpoint(fleet, job, nanogpt_saved, lambda s: 0 < s < saved)
    older = wait_for("the restarted script's checkpoint in the bucket", second_attempt_version)
    stop_live_jobs(fleet.jobs, job)
    text = log.read_bytes()[attempt_start:].decode(errors="replace")
    assert "Initializing a new model from scratch" in text, text[-2000:]
    assert older["regressed"] is True and older["step"] < saved, older
    # The newest version a restore takes is still the one the first attempt saved.
    kept = newest(fleet.moto, job)
    assert kept is not None and (kept["seq"], kept["step"]) == (version["seq"], saved), kept

    # fab jobs says both: the script said it started from scratch, and what it wrote is
    # older than what it was given.
    warnings = fleet.row()["warnings"]
    assert any("from scratch" in w for w in warnings), warnings
    assert any("regress" in w or "older" in w for w in warnings), warnings
    table = run_fab("jobs", "--inventory", str(fleet.inventory), "--jobs-dir", str(fleet.jobs))
    assert table.returncode == 0, table.stderr
    shown = " ".join(table.stdout.split())
    for warning in warnings:
        assert " ".join(warning.split())[:60] in shown, (warning, table.stdout)
