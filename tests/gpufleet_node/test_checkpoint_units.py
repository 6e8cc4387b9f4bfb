"""The pure parts of checkpoint versions: a version's step read from the files (names,
trainer_state.json, a torch.save file's pickle read without importing anything), the
placeholders of a job's arguments, and the lines that say a script started from scratch."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from gpufleet_node import job_sync


def test_a_step_is_read_from_step_like_names_and_the_highest_wins(tmp_path: Path) -> None:
    rels = ["checkpoint-300/model.safetensors", "checkpoint-400/optimizer.pt", "runs/x.txt"]
    assert job_sync.infer_step(tmp_path, rels) == (400, "name checkpoint-400")
    assert job_sync.infer_step(tmp_path, ["iter_000120.pt"])[0] == 120
    assert job_sync.infer_step(tmp_path, ["step-00000020/model.pt"])[0] == 20
    assert job_sync.infer_step(tmp_path, ["ckpt-5.pt"])[0] == 5
    assert job_sync.infer_step(tmp_path, ["snapshot.pt", "stepping.txt"]) == (None, "")


def test_transformers_trainer_state_gives_its_global_step(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "trainer_state.json").write_text(json.dumps({"global_step": 812}))
    assert job_sync.infer_step(tmp_path, ["out/trainer_state.json"]) == (
        812,
        "out/trainer_state.json global_step",
    )


def test_a_nanogpt_torch_save_file_gives_its_iter_num_without_torch_imports(
    tmp_path: Path,
) -> None:
    import torch

    # nanoGPT's train.py: torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt')) with
    # model/optimizer state dicts, model_args, iter_num, best_val_loss (a tensor), config.
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "model_args": {"n_layer": 2, "n_embd": 4},
        "iter_num": 2000,
        "best_val_loss": torch.tensor(1.25),
        "config": {"out_dir": "out", "init_from": "scratch"},
    }
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    assert job_sync.torch_save_step(tmp_path / "ckpt.pt") == (2000, "iter_num")
    assert job_sync.infer_step(tmp_path, ["ckpt.pt"]) == (2000, "ckpt.pt iter_num")
    torch.save({"global_step": 7, "state_dict": model.state_dict()}, tmp_path / "l.ckpt")
    assert job_sync.torch_save_step(tmp_path / "l.ckpt") == (7, "global_step")


def test_the_restricted_unpickler_never_imports_or_calls_what_a_pickle_names(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    data = pickle.dumps({"step": 3, "payload": Evil()})
    assert job_sync.pickle_step(data) == (3, "step")
    assert not marker.exists()
    assert job_sync.pickle_step(b"not a pickle") is None
    assert job_sync.pickle_step(pickle.dumps([1, 2])) is None
    assert job_sync.pickle_step(pickle.dumps({"step": True})) is None  # a bool is no step


def test_a_file_that_is_not_a_zip_or_too_big_a_pickle_has_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    (tmp_path / "old.pt").write_bytes(pickle.dumps({"iter_num": 5}))  # not torch's zip
    assert job_sync.torch_save_step(tmp_path / "old.pt") is None
    torch.save({"iter_num": 5, "w": torch.zeros(1000)}, tmp_path / "ckpt.pt")
    monkeypatch.setattr(job_sync, "MAX_PICKLE_BYTES", 10)
    assert job_sync.torch_save_step(tmp_path / "ckpt.pt") is None


def test_placeholders_expand_on_the_node_and_braces_are_doubled(tmp_path: Path) -> None:
    root = tmp_path / "scratch" / "checkpoints" / "j1"
    root.mkdir(parents=True)
    values = {
        "checkpoint_dir": str(root),
        "job": "j1",
        "attempt": "2",
        "node_rank": "0",
        "scratch": str(tmp_path / "scratch"),
    }
    args = ["--out_dir={checkpoint_dir}", "--name={job}-{attempt}-{node_rank}", "{{x}}"]
    assert job_sync.expand_args(args, values, root) == [
        f"--out_dir={root}",
        "--name=j1-2-0",
        "{x}",
    ]
    for name in ("checkpoint-300", "checkpoint-400", "checkpoint-99", "other-999"):
        (root / name).mkdir()
    newest = job_sync.expand("--resume_from_checkpoint={newest checkpoint-*}", values, root)
    assert newest == f"--resume_from_checkpoint={root / 'checkpoint-400'}"


def test_newest_skips_a_step_folder_without_its_complete_marker(tmp_path: Path) -> None:
    (tmp_path / "step-10").mkdir()
    (tmp_path / "step-10" / "model.pt").write_bytes(b"m")
    (tmp_path / "step-10" / "COMPLETE").write_text(json.dumps({"files": {"model.pt": 1}}))
    (tmp_path / "step-20").mkdir()  # a save in progress
    (tmp_path / "step-20" / "model.pt").write_bytes(b"m")
    assert job_sync.newest_entry(tmp_path, "step-*") == (tmp_path / "step-10").resolve()


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("{nope}", "unknown placeholder {nope}"),
        ("{newest checkpoint-*}", "nothing in"),
        ("a}b", "a lone '}'"),
        ("{newest }", "needs a name pattern"),
    ],
)
def test_a_placeholder_that_cannot_expand_is_one_clear_line(
    tmp_path: Path, arg: str, says: str
) -> None:
    with pytest.raises(job_sync.PlaceholderError, match=says) as err:
        job_sync.expand(arg, {"job": "j"}, tmp_path)
    assert "\n" not in str(err.value)


def test_nanogpts_from_scratch_line_is_recognised() -> None:
    log = "gpufleet: rank 0\nInitializing a new model from scratch\nstep 0: train loss 4.2\n"
    assert job_sync.started_from_scratch(log) == "Initializing a new model from scratch"
    assert job_sync.started_from_scratch("Resuming training from out\n") == ""


def test_a_step_folder_without_its_marker_is_left_out_of_a_version(tmp_path: Path) -> None:
    (tmp_path / "step-5").mkdir()
    (tmp_path / "step-5" / "model.pt").write_bytes(b"12345")
    (tmp_path / "step-5" / "COMPLETE").write_text(json.dumps({"files": {"model.pt": 99}}))
    (tmp_path / "step-6").mkdir()
    (tmp_path / "step-6" / "model.pt").write_bytes(b"1")
    (tmp_path / "log.txt").write_text("x")
    files, partial = job_sync.checkpoint_files(tmp_path)
    assert set(files) == {"log.txt"} and partial == {"step-5", "step-6"}


def test_a_version_manifest_with_an_escaping_path_or_no_digest_is_not_a_version() -> None:
    good = {"size": 1, "sha256": "a" * 64}
    doc = {"schema": job_sync.VERSION_SCHEMA, "files": {"m.pt": good}, "step": 3}
    v = job_sync.parse_version(4, doc)
    assert v is not None and v.step == 3 and v.files == {"m.pt": (1, "a" * 64)}
    assert job_sync.parse_version(4, {**doc, "files": {"../m.pt": good}}) is None
    assert job_sync.parse_version(4, {**doc, "files": {"m.pt": {"size": 1}}}) is None
    assert job_sync.parse_version(4, {**doc, "schema": "other"}) is None


def test_the_error_line_says_the_cause_and_what_to_do() -> None:
    line = job_sync.error_line("throttled", "GET x: SlowDown")
    assert line.startswith("restore failed (throttled): GET x: SlowDown; ")
    assert "again in a few minutes" in line and "\n" not in line
