"""The reaper zips written for the SDKs that take a file path (Tencent's SCF, Azure's blob):
one per function is left in the build folder, and nothing else there is touched."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from infra import reaper_deploy


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """What function_zip returns per provider: a test sets it to stand for a new build."""
    contents = {"tencent": b"tencent zip v1", "azure": b"azure zip v1"}
    monkeypatch.setattr(reaper_deploy, "function_zip", lambda provider: contents[provider])
    return contents


def name_of(provider: str, data: bytes) -> str:
    return f"{provider}-reaper-{hashlib.sha256(data).hexdigest()[:16]}.zip"


def test_the_zip_is_named_by_its_digest_and_written_once(tmp_path: Path, builds) -> None:
    path = reaper_deploy.function_zip_file("tencent", tmp_path)
    assert path == tmp_path / name_of("tencent", b"tencent zip v1")
    assert path.read_bytes() == b"tencent zip v1"
    os.utime(path, ns=(1, 1))
    assert reaper_deploy.function_zip_file("tencent", tmp_path) == path
    assert path.stat().st_mtime_ns == 1  # the same content is not written again


def test_a_zip_whose_bytes_were_changed_is_written_again(tmp_path: Path, builds) -> None:
    path = reaper_deploy.function_zip_file("tencent", tmp_path)
    path.write_bytes(b"tampered")
    assert reaper_deploy.function_zip_file("tencent", tmp_path).read_bytes() == b"tencent zip v1"


def test_a_new_build_removes_the_older_zips_of_that_function(tmp_path: Path, builds) -> None:
    old = reaper_deploy.function_zip_file("tencent", tmp_path)
    left_by_a_crash = tmp_path / name_of("tencent", b"older").replace(".zip", ".tmp")
    left_by_a_crash.write_bytes(b"half")
    builds["tencent"] = b"tencent zip v2"
    new = reaper_deploy.function_zip_file("tencent", tmp_path)
    assert new != old and new.read_bytes() == b"tencent zip v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [new.name]


def test_pruning_keeps_other_functions_and_files_gpufleet_did_not_write(
    tmp_path: Path, builds
) -> None:
    azure = reaper_deploy.function_zip_file("azure", tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-target.zip"
    outside.write_bytes(b"not ours")
    foreign = [
        "tencent-reaper-notes.txt",
        "tencent-reaper-0123.zip",  # not a 16-digit digest
        "tencent-reaper-0123456789ABCDEF.zip",  # not how the digest is written
        "my-tencent-reaper-0123456789abcdef.zip",
        "reaper.zip",
    ]
    for name in foreign:
        (tmp_path / name).write_bytes(b"kept")
    (tmp_path / "tencent-reaper-fedcba9876543210.zip").symlink_to(outside)
    (tmp_path / "tencent-reaper-0123456789abcdef.zip").mkdir()
    tencent = reaper_deploy.function_zip_file("tencent", tmp_path)
    assert azure.is_file() and tencent.is_file()
    for name in foreign:
        assert (tmp_path / name).read_bytes() == b"kept", name
    assert (tmp_path / "tencent-reaper-fedcba9876543210.zip").is_symlink()
    assert outside.read_bytes() == b"not ours"
    assert (tmp_path / "tencent-reaper-0123456789abcdef.zip").is_dir()


def test_the_build_folder_is_made_when_missing(tmp_path: Path, builds) -> None:
    folder = tmp_path / "not-yet" / ".gpufleet-build"
    assert reaper_deploy.function_zip_file("azure", folder).parent == folder
    assert reaper_deploy.stale_function_zips(tmp_path / "absent", "azure", keep="x") == []


def test_the_build_folder_is_the_repositorys_ignored_one() -> None:
    root = Path(reaper_deploy.__file__).resolve().parents[1]
    build_dir = reaper_deploy.BUILD_DIR
    assert build_dir == root / ".gpufleet-build"
    assert ".gpufleet-build/" in (root / ".gitignore").read_text().splitlines()


# --- the zip itself, built once per digest of its inputs ---------------------------------------


@pytest.fixture
def zip_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache folder, and function_zip without its per-process memo."""
    folder = tmp_path / "zip-cache"
    monkeypatch.setattr(reaper_deploy, "ZIP_CACHE", folder)
    reaper_deploy.function_zip.cache_clear()
    yield folder
    reaper_deploy.function_zip.cache_clear()


def test_a_built_zip_is_kept_by_its_inputs_digest_and_reused_without_building(
    zip_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.reaper import handler

    built = reaper_deploy.function_zip("aws")
    assert built == handler.build_function_zip(provider="aws")  # the same bytes as a build
    key = handler.function_zip_inputs("aws")[:16]
    assert sorted(p.name for p in zip_cache.iterdir()) == [f"aws-inputs-{key}.zip"]

    def no_build(**_: object) -> bytes:
        raise AssertionError("rebuilt although nothing it reads changed")

    monkeypatch.setattr(handler, "build_function_zip", no_build)
    reaper_deploy.function_zip.cache_clear()  # as a new plan process would start
    assert reaper_deploy.function_zip("aws") == built


def test_a_change_in_what_the_zip_carries_changes_its_key_and_replaces_the_old_zip(
    zip_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.reaper import catalog_data, handler

    reaper_deploy.function_zip("aws")
    before = handler.function_zip_inputs("aws")
    real = catalog_data.table_json
    monkeypatch.setattr(catalog_data, "table_json", lambda cat: real(cat) + b"\n")
    after = handler.function_zip_inputs("aws")
    assert after != before
    reaper_deploy.function_zip.cache_clear()
    new = reaper_deploy.function_zip("aws")
    assert sorted(p.name for p in zip_cache.iterdir()) == [f"aws-inputs-{after[:16]}.zip"]
    assert new == handler.build_function_zip(provider="aws")


def test_every_cloud_has_an_inputs_digest_and_the_clouds_differ() -> None:
    from infra.reaper import handler

    keys = {name: handler.function_zip_inputs(name) for name in handler.CLOUDS}
    assert len(set(keys.values())) == len(keys)
    assert all(len(k) == 64 for k in keys.values())


def test_a_reinstalled_distribution_changes_the_key_of_a_cloud_that_vendors_its_sdk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    from importlib import metadata

    from infra.reaper import handler

    # a cloud whose package copies installed distributions (not one built from wheels)
    vendoring = next(
        name
        for name, c in handler.CLOUDS.items()
        if (c.layout is not None or c.vendor_sdk) and not (c.wheels and c.layout is None)
    )
    info = tmp_path / "fakedist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist\nVersion: 1.0\n")
    (info / "RECORD").write_text("fakedist/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the same distributions importlib.metadata finds, by their folders
    names = {n.rsplit("/", 1)[1] for n, _ in handler.installed_distributions()}
    assert "fakedist-1.0.dist-info" in names
    dists = {f"{d.metadata['Name']}".lower().replace("-", "_") for d in metadata.distributions()}
    assert {n.split("-")[0].lower() for n in names if n.endswith(".dist-info")} <= dists
    before = handler.function_zip_inputs(vendoring)
    assert handler.function_zip_inputs(vendoring) == before
    (info / "RECORD").write_text("fakedist/__init__.py,,\nfakedist/new.py,,\n")  # pip rewrote it
    st = (info / "RECORD").stat()
    os.utime(info / "RECORD", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert handler.function_zip_inputs(vendoring) != before
