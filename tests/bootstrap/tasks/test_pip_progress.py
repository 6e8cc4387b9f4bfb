"""install-pytorch's download progress: pip's recorded output and the node's size polls,
read into one short line per host (bytes of the wheel received, of its size, and elapsed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bootstrap.fleet.api import Host, HostContext
from bootstrap.tasks.pytorch import (
    PipDownload,
    PipProgress,
    download_text,
    parse_pip_size,
    pip_with_download_poll,
    read_pip_line,
    wheel_label,
)

SAMPLES = Path(__file__).parent / "samples"
CPU_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def read_all(lines: list[str]) -> list[PipDownload]:
    states, state = [], PipDownload()
    for line in lines:
        state = read_pip_line(state, line)
        states.append(state)
    return states


def sample(name: str) -> list[str]:
    return (SAMPLES / name).read_text().splitlines()


def test_pip_23_download_line_gives_the_decoded_wheel_name_and_its_size() -> None:
    states = read_all(sample("pip_23.0.1_download_poll.txt"))
    assert states[2] == PipDownload(file=CPU_WHEEL, total=24_000_000)
    assert not states[2].polled


def test_each_poll_of_the_recorded_download_moves_the_bytes_received() -> None:
    lines = sample("pip_23.0.1_download_poll.txt")
    received = [
        s.received for line, s in zip(lines, read_all(lines), strict=True) if "gpufleet-" in line
    ]
    assert received == [6553600, 13885440, 21227520]
    final = read_all(lines)[-1]
    assert final.fraction == pytest.approx(21227520 / 24_000_000)


@pytest.mark.parametrize(
    "name", ["pip_23.0.1_two_downloads_poll.txt", "pip_24.0_two_downloads_poll.txt"]
)
def test_a_second_download_takes_over_and_the_finished_file_is_not_counted(name: str) -> None:
    lines = sample(name)
    states = read_all(lines)
    second = next(i for i, line in enumerate(lines) if "Downloading" in line and "nccl" in line)
    assert states[second - 1].file == "torch-2.13.0-py3-none-any.whl"
    after = states[second:]
    assert {s.file for s in after} == {"nvidia_nccl_cu12-2.27.3-py3-none-any.whl"}
    # the finished torch file is still listed by the polls; it never counts for the new one
    assert all(s.received <= 12_001_291 for s in after)
    assert after[-1].total == 12_000_000


def test_pypi_style_line_names_the_file_alone() -> None:
    # files.pythonhosted.org downloads are printed by name only (pip's show_url)
    state = read_pip_line(PipDownload(), "  Downloading torch-2.13.0-cp312-cp312-x.whl (888.1 MB)")
    assert (state.file, state.total) == ("torch-2.13.0-cp312-cp312-x.whl", 888_100_000)


def test_a_download_line_without_a_size_leaves_the_total_unknown() -> None:
    state = read_pip_line(PipDownload(), "Downloading https://h/whl/torch-2.13.0-x.whl")
    assert (state.file, state.total, state.fraction) == ("torch-2.13.0-x.whl", None, None)


def test_a_poll_before_pip_names_the_file_takes_the_polled_file() -> None:
    state = read_pip_line(PipDownload(), f"gpufleet-download 1000 {CPU_WHEEL}")
    assert (state.file, state.received, state.polled) == (CPU_WHEEL, 1000, True)


def test_a_garbled_poll_line_changes_nothing() -> None:
    start = PipDownload(file="a.whl", total=10)
    assert read_pip_line(start, "gpufleet-download lots a.whl") == start
    assert read_pip_line(start, "Requirement already satisfied: filelock") == start


@pytest.mark.parametrize(
    ("number", "unit", "size"),
    [
        ("191.8", "MB", 191_800_000),
        ("512", "kB", 512_000),
        ("2.1", "GB", 2_100_000_000),
        ("999", "bytes", 999),
    ],
)
def test_pip_sizes_are_decimal_units(number: str, unit: str, size: int) -> None:
    assert parse_pip_size(number, unit) == size


def test_wheel_label_is_the_name_and_version() -> None:
    assert wheel_label("torch-2.13.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl") == (
        "torch 2.13.0+cu128"
    )
    assert wheel_label("nvidia_nccl_cu12-2.27.3-py3-none-any.whl") == "nvidia_nccl_cu12 2.27.3"
    assert wheel_label("somepkg-1.0.tar.gz") == "somepkg-1.0"


def test_the_line_says_received_of_total_percent_and_elapsed() -> None:
    state = PipDownload(file=CPU_WHEEL, total=888_100_000, received=312_400_000, polled=True)
    assert download_text(state, 65.2) == "torch 2.13.0+cpu: 312 of 888 MB (35 %), 1m05s"
    small = PipDownload(file=CPU_WHEEL, total=9_000_000, received=4_500_000, polled=True)
    assert download_text(small, 3) == "torch 2.13.0+cpu: 4.5 of 9.0 MB (50 %), 3 s"


def test_no_line_before_the_first_poll_and_none_without_a_size_but_bytes() -> None:
    assert download_text(PipDownload(file=CPU_WHEEL, total=10), 5) is None
    unknown = PipDownload(file=CPU_WHEEL, received=50_000_000, polled=True)
    assert download_text(unknown, 12) == "torch 2.13.0+cpu: 50 MB, 12 s"


def test_the_longest_torch_line_leaves_room_for_the_host_in_80_columns() -> None:
    wheel = "torch-2.13.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    state = PipDownload(file=wheel, total=2_999_000_000, received=2_998_000_000, polled=True)
    text = download_text(state, 3599)
    assert text is not None
    # a stack node's label: its name and private address
    assert len("[a100x8-0 (10.100.200.250)] ") + len(text) <= 80, text


def test_the_stream_turns_polls_into_ticks_and_keeps_pip_milestones_as_lines() -> None:
    ticks: list[tuple[str, float | None]] = []
    lines: list[str] = []
    ctx = HostContext(Host("10.0.0.1"))
    ctx.tick = lambda message, fraction: ticks.append((message, fraction))
    ctx.progress = lines.append
    clock = iter(range(0, 100, 2))
    stream = PipProgress(ctx, clock=lambda: float(next(clock)))
    text = (SAMPLES / "pip_23.0.1_download_poll.txt").read_text()
    for i in range(0, len(text), 37):  # arbitrary chunks, as SSH delivers them
        stream.write(text[i : i + 37])
    assert [m for m, _ in ticks] == [
        "torch 2.13.0+cpu: 7 of 24 MB (27 %), 2 s",
        "torch 2.13.0+cpu: 14 of 24 MB (58 %), 4 s",
        "torch 2.13.0+cpu: 21 of 24 MB (88 %), 6 s",
    ]
    assert ticks[0][1] == pytest.approx(6553600 / 24e6)
    assert [line.split()[1] for line in lines] == [
        "Collecting",
        "Downloading",
        "Installing",
        "Successfully",
    ]
    assert not any("gpufleet-download" in line for line in lines)


def run_poll(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake-pip"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    return subprocess.run(
        ["sh", "-c", pip_with_download_poll(str(fake), poll_s=1)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
        check=False,
    )


def test_the_poll_lists_files_in_pip_unpack_folders_only_and_removes_its_folder(
    tmp_path: Path,
) -> None:
    done = run_poll(
        tmp_path,
        'mkdir "$TMPDIR/pip-unpack-x" "$TMPDIR/pip-build-y"\n'
        'head -c 1234 /dev/zero > "$TMPDIR/pip-unpack-x/torch-2.13.0-py3-none-any.whl"\n'
        'head -c 99 /dev/zero > "$TMPDIR/pip-build-y/setup.py"\n'
        "sleep 1.5\n",
    )
    assert done.returncode == 0, done.stderr
    polls = [line for line in done.stdout.splitlines() if line.startswith("gpufleet-")]
    assert polls and set(polls) == {"gpufleet-download 1234 torch-2.13.0-py3-none-any.whl"}
    assert [p.name for p in tmp_path.iterdir()] == ["fake-pip"]  # its own folder is gone


def test_the_poll_keeps_pips_exit_status_and_stderr(tmp_path: Path) -> None:
    done = run_poll(tmp_path, "echo 'ERROR: No matching distribution' >&2\nexit 3\n")
    assert done.returncode == 3
    assert "No matching distribution" in done.stderr
