"""A cloud function's wheels (the one cloud that builds from them, Alicloud, declares its
target in its reaper.py and its lock in its folder): exactly the lock, each built for FC's
python3.10 runtime, their requirements closed under the runtime's markers; and how `make
fc-wheels` fetches them for every cloud that declares wheels. Synthetic wheels in a
temporary folder: no network."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.tags import parse_tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from infra.clouds.alicloud.reaper import SDKS as ALICLOUD_SDKS
from infra.reaper import wheelhouse as wh
from infra.reaper.handler import build_function_zip

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fc_wheels.py"
FC = wh.target("alicloud")


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
    files: dict[str, bytes] | None = None,
) -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    body = files if files is not None else {f"{name.replace('-', '_')}/__init__.py": b"x = 1\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for member, data in body.items():
            zf.writestr(member, data)
        zf.writestr(f"{dist}.dist-info/METADATA", meta)
        zf.writestr(f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{tag}.whl"
    path.write_bytes(buf.getvalue())
    return path


def lock(tmp_path: Path, *pins: str) -> Path:
    path = tmp_path / "function-requirements.txt"
    path.write_text("# test lock\n" + "".join(f"{p}\n" for p in pins))
    return path


def problems(wheels: Path, roots: tuple[str, ...], lock_path: Path) -> list[str]:
    with pytest.raises(wh.WheelhouseError) as caught:
        wh.check(FC, wheels, roots, lock_path)
    return caught.value.problems


def accepted(tag: str) -> bool:
    return bool(parse_tag(tag) & wh.runtime_tags(FC))


@pytest.mark.parametrize(
    "tag",
    [
        "py3-none-any",
        "py2.py3-none-any",
        "cp310-cp310-manylinux_2_17_x86_64",
        "cp310-cp310-manylinux2014_x86_64",
        "cp310-cp310-manylinux_2_28_x86_64",
        "cp310-cp310-manylinux1_x86_64",
        "cp39-abi3-manylinux2014_x86_64",  # cryptography's
        "cp310-none-any",
    ],
)
def test_the_runtime_accepts_wheels_for_cpython_3_10_on_manylinux_x86_64(tag: str) -> None:
    assert accepted(tag)


@pytest.mark.parametrize(
    "tag",
    [
        "cp311-cp311-manylinux_2_17_x86_64",  # this venv's builds
        "cp311-abi3-manylinux_2_17_x86_64",  # abi3 from 3.11 on: not loadable by 3.10
        "cp312-cp312-manylinux_2_17_x86_64",
        "cp310-cp310-manylinux_2_34_x86_64",  # needs a glibc newer than Debian 10's 2.28
        "cp310-cp310-linux_x86_64",  # built on some host: not portable
        "cp310-cp310-musllinux_1_2_x86_64",
        "cp310-cp310-manylinux_2_17_aarch64",
        "cp310-cp310-macosx_11_0_x86_64",
        "pp310-pypy310_pp73-manylinux_2_17_x86_64",
        "py311-none-any",
    ],
)
def test_the_runtime_refuses_wheels_for_another_python_abi_or_platform(tag: str) -> None:
    assert not accepted(tag)


def test_a_missing_or_empty_wheelhouse_is_one_line_naming_make_fc_wheels(tmp_path: Path) -> None:
    for folder in (tmp_path / "absent", tmp_path):
        found = problems(folder, ("a",), lock(tmp_path, "a==1"))
        assert len(found) == 1
        assert "make fc-wheels" in found[0] and "python3.10" in found[0]
        assert "\n" not in found[0]


def test_the_zip_build_without_a_wheelhouse_raises_that_one_line(tmp_path: Path) -> None:
    with pytest.raises(wh.WheelhouseError) as caught:
        build_function_zip(provider="alicloud", wheelhouse=tmp_path / "absent")
    assert caught.value.problems == [wh.missing_message(FC, tmp_path / "absent")]
    # AWS needs no wheels: Lambda's runtime has boto3.
    assert build_function_zip(provider="aws", wheelhouse=tmp_path / "absent")


def test_a_cp311_wheel_is_refused_naming_the_file_the_runtime_and_the_fix(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    make_wheel(wheels, "sdk", "1.0", requires=("fast",))
    make_wheel(wheels, "fast", "2.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    (found,) = problems(wheels, ("sdk",), lock(tmp_path, "sdk==1.0", "fast==2.0"))
    assert found.startswith("fast-2.0-cp311-cp311-manylinux_2_17_x86_64.whl: built for")
    assert "python3.10" in found and "glibc <= 2.28" in found and "make fc-wheels" in found


def test_wheels_must_be_exactly_the_locks_pins(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    make_wheel(wheels, "sdk", "1.0")
    make_wheel(wheels, "stray", "1.0")
    make_wheel(wheels, "old", "1.0")
    found = problems(wheels, ("sdk",), lock(tmp_path, "sdk==1.0", "old==2.0", "gone==3.0"))
    assert sorted(found) == sorted(
        [
            "old-1.0-py3-none-any.whl: function-requirements.txt pins old==2.0: rerun "
            "`make fc-wheels`",
            "stray-1.0-py3-none-any.whl: function-requirements.txt does not pin stray: rerun "
            "`make fc-wheels`",
            "gone==3.0: pinned, but no wheel of it is here: rerun `make fc-wheels`",
        ]
    )


def test_a_requirement_for_python_3_10_that_the_lock_lacks_is_refused(tmp_path: Path) -> None:
    # What pip resolving on CPython 3.11 misses: aiohttp needs async-timeout below 3.11.
    wheels = tmp_path / "w"
    make_wheel(
        wheels,
        "sdk",
        "1.0",
        requires=(
            'async-timeout>=4; python_version < "3.11"',
            'backport>=1; python_version < "3.9"',  # not for 3.10
            'winthing; sys_platform == "win32"',  # not for Linux
            'speedup; extra == "fast"',  # behind an extra
        ),
    )
    (found,) = problems(wheels, ("sdk",), lock(tmp_path, "sdk==1.0"))
    assert "sdk-1.0-py3-none-any.whl needs async-timeout>=4" in found
    assert "which the lock does not pin" in found


def test_a_pin_that_breaks_a_requirement_or_that_nothing_needs_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    make_wheel(wheels, "sdk", "1.0", requires=("dep<2",))
    make_wheel(wheels, "dep", "2.0")
    make_wheel(wheels, "unused", "1.0")
    found = problems(wheels, ("sdk",), lock(tmp_path, "sdk==1.0", "dep==2.0", "unused==1.0"))
    assert sorted(found) == [
        "sdk-1.0-py3-none-any.whl needs dep<2, the lock pins 2.0",
        "unused: pinned, but nothing the function imports needs it",
    ]


def test_a_closed_lock_for_the_runtime_passes_and_lists_its_wheels(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    make_wheel(wheels, "sdk", "1.0", requires=("Fast_Lib>=1",))
    make_wheel(wheels, "fast-lib", "1.5", tag="cp310-cp310-manylinux_2_17_x86_64")
    (wheels / ".complete").touch()  # make's stamp is not a stray file
    got = wh.check(FC, wheels, ("sdk",), lock(tmp_path, "sdk==1.0", "fast_lib==1.5"))
    assert [p.name.split("-")[0] for p in got] == ["fast_lib", "sdk"]


def test_an_sdist_left_in_the_wheelhouse_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    make_wheel(wheels, "sdk", "1.0")
    (wheels / "sdk-1.0.tar.gz").write_bytes(b"")
    (found,) = problems(wheels, ("sdk",), lock(tmp_path, "sdk==1.0"))
    assert found.startswith("sdk-1.0.tar.gz: not a wheel")


def test_the_lock_is_one_exact_pin_per_line_and_a_bad_line_is_named(tmp_path: Path) -> None:
    good = lock(tmp_path, "Foo_Bar==1.2  # why", "", "baz==2026.10.19.post1")
    assert wh.read_lock(good) == {"foo-bar": Version("1.2"), "baz": Version("2026.10.19.post1")}
    bad = tmp_path / "bad.txt"
    bad.write_text("foo>=1\nbar==1\nbar==2\n==3\n")
    with pytest.raises(wh.WheelhouseError) as caught:
        wh.read_lock(bad)
    assert caught.value.problems == [
        "bad.txt:1: 'foo>=1' is not name==version",
        "bad.txt:3: bar is pinned twice",
        "bad.txt:4: '==3' is not name==version",
    ]


def test_unpack_installs_purelib_and_platlib_and_leaves_out_install_records(
    tmp_path: Path,
) -> None:
    wheel = make_wheel(
        tmp_path,
        "pkg",
        "1.0",
        files={
            "pkg/__init__.py": b"",
            "pkg/__pycache__/x.cpython-310.pyc": b"",
            "pkg-1.0.data/purelib/extra_mod.py": b"y = 2\n",
            "pkg-1.0.data/platlib/native.abi3.so": b"\x7fELF",
            "pkg-1.0.data/scripts/tool": b"#!/bin/sh\n",
            "pkg.pth": b"import os\n",
        },
    )
    names = [n for n, _ in wh.unpack([wheel])]
    assert names == [
        "extra_mod.py",
        "native.abi3.so",
        "pkg-1.0.dist-info/METADATA",
        "pkg-1.0.dist-info/WHEEL",
        "pkg/__init__.py",
    ]


def test_two_wheels_installing_one_path_with_different_bytes_are_refused(tmp_path: Path) -> None:
    a = make_wheel(tmp_path / "a", "a", "1.0", files={"shared.py": b"a = 1\n"})
    b = make_wheel(tmp_path / "b", "b", "1.0", files={"shared.py": b"b = 1\n"})
    with pytest.raises(wh.WheelhouseError) as caught:
        wh.unpack([a, b])
    assert caught.value.problems == [
        "shared.py: installed by both a-1.0-py3-none-any.whl and b-1.0-py3-none-any.whl"
    ]


def _requirements_txt() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)
    return {canonicalize_name(n): v for n, v in pins}


def test_the_lock_ships_the_sdk_versions_that_requirements_txt_tests_here() -> None:
    here = _requirements_txt()
    shipped = wh.read_lock(FC.lock)
    for name in (*ALICLOUD_SDKS, "alibabacloud-tea-openapi"):
        assert str(shipped[canonicalize_name(name)]) == here[canonicalize_name(name)], name


def test_the_lock_pins_every_sdk_the_function_imports_and_every_sdist_only_package() -> None:
    shipped = wh.read_lock(FC.lock)
    for name in (*ALICLOUD_SDKS, *FC.sdist_only):
        assert canonicalize_name(name) in shipped, name


def test_the_wheel_targets_are_the_reapers_that_build_from_wheels() -> None:
    """Alicloud's folder declares its target (reaper.py WHEELS, WHEELS_RUNTIME,
    WHEELS_SDIST_ONLY) and its lock; neither the checker nor the script names it."""
    assert [t.cloud for t in wh.targets()] == ["alicloud"]  # the one cloud with WHEELS = True
    assert FC.sdks == ALICLOUD_SDKS
    assert (FC.runtime, FC.python, FC.glibc, FC.arch) == ("python3.10", (3, 10), (2, 28), "x86_64")
    assert FC.sdist_only == ("alibabacloud-tea",)
    assert FC.lock == ROOT / "infra" / "clouds" / "alicloud" / "function-requirements.txt"
    assert FC.wheelhouse == ROOT / "build" / "wheels" / "alicloud"
    for path in (SCRIPT, ROOT / "infra" / "reaper" / "wheelhouse.py"):
        assert not re.search(r"alicloud|python3\.10|alibabacloud", path.read_text(), re.I), path
    with pytest.raises(LookupError, match="no wheels"):
        wh.target("aws")


def _load_script():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("fc_wheels_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fc_wheels_downloads_every_pin_as_a_wheel_for_cpython_3_10_manylinux(
    tmp_path: Path,
) -> None:
    cmd = _load_script().download_command("py", FC, Path("lock.txt"), tmp_path)
    assert cmd[:4] == ["py", "-m", "pip", "download"]
    joined = " ".join(cmd)
    for part in (
        "--no-deps",  # the lock is the whole closure: pip resolves nothing (it would for 3.11)
        "--only-binary=:all:",
        "--no-binary=alibabacloud-tea",
        "--platform manylinux2014_x86_64",
        "--platform manylinux_2_28_x86_64",
        "--python-version 3.10",
        "--implementation cp",
        f"--dest {tmp_path}",
        "--requirement lock.txt",
    ):
        assert part in joined, part


def test_fc_wheels_builds_the_sdist_only_ones_without_build_isolation(tmp_path: Path) -> None:
    sdist = tmp_path / "alibabacloud-tea-0.4.3.tar.gz"
    cmd = _load_script().build_command("py", [sdist], tmp_path)
    assert cmd == [
        "py", "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", str(tmp_path), str(sdist),
    ]  # fmt: skip


def test_fc_wheels_refuses_a_malformed_lock_with_exit_2_before_pip_runs(tmp_path: Path) -> None:
    bad = tmp_path / "lock.txt"
    bad.write_text("alibabacloud-tea>=0.4\n")
    into = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--lock", str(bad), "--into", str(into)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "lock.txt:1: 'alibabacloud-tea>=0.4' is not name==version\n"
    assert not into.exists() and not (into / "alicloud.partial").exists()


def test_fc_wheels_refuses_a_cloud_that_builds_no_wheels_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cloud", "aws", "--into", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "--cloud: 'aws' builds no wheels; those that do: alicloud\n"
