"""The watchdog's service unit as `fab install-watchdog` renders it for --prefix / --etc: the
armed timer must run the watchdog where the install put it, whatever the paths hold."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bootstrap.tasks import watchdog as fabdog
from tests.support.real import missing_real_part

TEMPLATE = (fabdog.REMOTE_DIR / fabdog.SERVICE).read_text()
ODD = '/opt/gpu fleet/it\'s 100% $HOME "x" \\y'


def exec_start_argv(unit: str) -> list[str]:
    """ExecStart= read back the way systemd.service(5) "Command lines" says: items split on
    spaces, a double-quoted item with C escapes, then ``%%`` -> ``%`` (specifiers) and
    ``$$`` -> ``$`` (variables). A reader written from the man page, not from our writer."""
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    text, argv, i = line.removeprefix("ExecStart="), [], 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        item = ""
        if text[i] == '"':
            i += 1
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                item += text[i]
                i += 1
            i += 1
        else:
            while i < len(text) and text[i] != " ":
                item += text[i]
                i += 1
        argv.append(item.replace("%%", "%").replace("$$", "$"))
    return argv


def test_the_default_install_keeps_the_shipped_unit_byte_for_byte() -> None:
    assert fabdog.render_service(TEMPLATE, fabdog.PREFIX, fabdog.ETC) == TEMPLATE


def test_the_unit_runs_the_watchdog_from_the_install_paths_with_spaces_and_shell_characters() -> (
    None
):
    unit = fabdog.render_service(TEMPLATE, ODD, ODD + "/etc")
    assert exec_start_argv(unit) == [
        "/usr/bin/python3",
        f"{ODD}/watchdog.py",
        "run",
        "--config",
        f"{ODD}/etc/watchdog.json",
    ]
    assert "/opt/gpufleet" not in unit


def test_the_installed_service_is_the_rendered_one() -> None:
    files = fabdog.install_contents("/srv/my tools", "/srv/my etc", "/units")
    service = next(data for data, dest, _ in files if dest == f"/units/{fabdog.SERVICE}")
    assert exec_start_argv(service.decode())[1] == "/srv/my tools/watchdog.py"


def test_the_shell_commands_quote_the_paths() -> None:
    command = fabdog.watchdog_command(ODD, ODD + "/etc", "status --json")
    assert shlex.split(command) == [
        "python3",
        f"{ODD}/watchdog.py",
        "status",
        "--json",
        "--config",
        f"{ODD}/etc/watchdog.json",
    ]


def test_sha256sum_lines_with_spaces_in_the_path_are_read_whole() -> None:
    text = "ab12  /opt/my dir/watchdog.py\ncd34  /etc/x.json\n"
    assert fabdog.parse_sha256sum(text) == {
        "/opt/my dir/watchdog.py": "ab12",
        "/etc/x.json": "cd34",
    }


@pytest.mark.parametrize("prefix", ["/opt/gpufleet", ODD])
def test_systemd_itself_accepts_the_rendered_unit(tmp_path: Path, prefix: str) -> None:
    if shutil.which("systemd-analyze") is None:
        missing_real_part("no systemd-analyze on PATH", package="systemd")
    unit = tmp_path / fabdog.SERVICE
    unit.write_text(fabdog.render_service(TEMPLATE, prefix, prefix + "/etc"))
    shutil.copy(fabdog.REMOTE_DIR / fabdog.TIMER, tmp_path / fabdog.TIMER)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit), str(tmp_path / fabdog.TIMER)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not [ln for ln in done.stderr.splitlines() if "gpufleet-watchdog" in ln]
