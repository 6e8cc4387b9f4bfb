"""Which workdir files ``fab train`` copies, the manifest diff, and the node applying it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bootstrap.train.spec import TrainError
from bootstrap.train.workdir import (
    SYNC_MANIFEST,
    build_manifest,
    diff_manifest,
    kept_back,
    pack,
    walk_files,
    workdir_files,
)
from gpufleet_node import job_runner
from tests.bootstrap.train.samples import make_tree


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
    files = walk_files(root)
    assert "train.py" in files and "keep.pt" in files and "sub/mod.py" in files
    assert "src/build/kept.py" in files
    for gone in ("model.pt", "data/shard-0", "src/data/ok.py", "build/out", "sub/run.log"):
        assert gone not in files
    assert not any(f.startswith(".git/") for f in files)


def test_inside_a_git_repo_git_decides_what_is_copied(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "repo", {".gitignore": "ckpt/\n", "a.py": "1", "ckpt/x": "2"})
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    assert workdir_files(root) == [".gitignore", "a.py"]


def test_a_workdir_over_the_limit_is_refused_naming_the_largest_files(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "w", {"train.py": "x", "weights.bin": "w" * 5000})
    with pytest.raises(TrainError) as err:
        build_manifest(root, ["train.py", "weights.bin"], limit_bytes=1000)
    text = str(err.value)
    assert "over the 0 MB limit" in text and "weights.bin" in text and ".gitignore" in text
    assert "\n" not in text


def test_a_rerun_sends_only_changed_files_and_deletes_only_what_it_synced(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "w", {"a.py": "1", "b.py": "2"})
    first = build_manifest(root, ["a.py", "b.py"], 1e9)
    assert diff_manifest(first, {}) == (["a.py", "b.py"], [])
    assert diff_manifest(first, first) == ([], [])
    (root / "b.py").write_text("changed")
    (root / "a.py").unlink()
    make_tree(root, {"c.py": "3"})
    second = build_manifest(root, ["b.py", "c.py"], 1e9)
    send, delete = diff_manifest(second, first)
    assert send == ["b.py", "c.py"]
    assert delete == ["a.py"]  # only files an earlier sync put there


def test_unpack_on_the_node_applies_the_update_and_keeps_files_it_did_not_sync(
    tmp_path: Path,
) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "new", "pkg/b.py": "b"})
    node = make_tree(tmp_path / "node", {"a.py": "old", "old.py": "x", "outputs/log": "mine"})
    manifest = build_manifest(src, ["a.py", "pkg/b.py"], 1e9)
    tar = tmp_path / "u.tar.gz"
    tar.write_bytes(pack(src, ["a.py", "pkg/b.py"], {"files": manifest, "delete": ["old.py"]}))
    out = job_runner.unpack(node, tar)
    assert out == {"ok": True, "placed": 2, "removed": 1}
    assert (node / "a.py").read_text() == "new" and (node / "pkg/b.py").read_text() == "b"
    assert not (node / "old.py").exists() and (node / "outputs/log").read_text() == "mine"
    assert json.loads((node / SYNC_MANIFEST).read_text())["files"] == manifest


def test_train_start_names_what_gitignore_keeps_back_and_points_to_data_push(
    tmp_path: Path,
) -> None:
    # nanoGPT's layout: data/<name>/*.bin made by prepare.py, ignored by `*.bin`.
    root = make_tree(
        tmp_path / "nanogpt",
        {
            ".gitignore": "*.bin\n*.pkl\n__pycache__/\n.venv/\nout/\n",
            "train.py": "x",
            "data/shakespeare_char/prepare.py": "x",
            "data/shakespeare_char/train.bin": "t" * 2_000_000,
            "data/shakespeare_char/val.bin": "v" * 200_000,
            "data/shakespeare_char/meta.pkl": "m",
            "__pycache__/model.cpython-311.pyc": "c",
            ".venv/pyvenv.cfg": "home = /usr",
            "out/ckpt.pt": "p",
        },
    )
    for with_git in (False, True):
        if with_git:
            subprocess.run(["git", "init", "-q", str(root)], check=True)
        kept = kept_back(root)
        assert [f for f, _ in kept.files] == [
            "data/shakespeare_char/train.bin",
            "data/shakespeare_char/val.bin",
            "data/shakespeare_char/meta.pkl",
        ]
        assert kept.folders == ("out/",) and kept.count == 4
        lines = kept.lines(80)
        assert all(len(line) <= 80 for line in lines), lines
        text = " ".join(lines)
        assert lines[0] == (
            "gpufleet: .gitignore kept 3 file(s) (2.2 MB) and 1 folder(s) from the nodes:"
        )
        assert lines[1] == "  data/shakespeare_char/train.bin (2.0 MB)"
        assert lines[4] == "  and 1 more"
        assert "`fab data-push data/shakespeare_char`" in text
    assert kept_back(make_tree(tmp_path / "clean", {"a.py": "x"})).lines(80) == []
