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

TEMPLATE = (fabdog.UNIT_SOURCE / fabdog.SERVICE).read_text()
ODD = '/opt/gpu fleet/it\'s 100% $HOME "x" \\y'


def _items(text: str) -> list[str]:
    """A unit setting's value split as systemd splits it: on spaces, a double-quoted item
    whole with C escapes (systemd.syntax(7), "Quoting")."""
    items, i = [], 0
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
        items.append(item)
    return items


def exec_start_argv(unit: str) -> list[str]:
    """ExecStart= read back the way systemd.service(5) "Command lines" says: items split on
    spaces, a double-quoted item with C escapes, then ``%%`` -> ``%`` (specifiers) and
    ``$$`` -> ``$`` (variables). A reader written from the man page, not from our writer."""
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    return [a.replace("%%", "%").replace("$$", "$") for a in _items(line[len("ExecStart=") :])]


def environment(unit: str) -> dict[str, str]:
    """Environment= read back the way systemd.exec(5) says: assignments split as above,
    then ``%%`` -> ``%``; a ``$`` stays as it is (no variable expansion there)."""
    env: dict[str, str] = {}
    for line in unit.splitlines():
        if line.startswith("Environment="):
            for item in _items(line[len("Environment=") :]):
                name, _, value = item.replace("%%", "%").partition("=")
                env[name] = value
    return env


def test_the_default_install_keeps_the_shipped_unit_byte_for_byte() -> None:
    assert fabdog.render_service(TEMPLATE, fabdog.PREFIX, fabdog.ETC) == TEMPLATE


def test_the_unit_runs_the_watchdog_from_the_install_paths_with_spaces_and_shell_characters() -> (
    None
):
    unit = fabdog.render_service(TEMPLATE, ODD, ODD + "/etc")
    assert exec_start_argv(unit) == [
        "/usr/bin/python3",
        "-m",
        "gpufleet_node.watchdog",
        "run",
        "--config",
        f"{ODD}/etc/watchdog.json",
    ]
    assert environment(unit) == {"PYTHONPATH": ODD}  # the package's folder, on the path
    assert "/opt/gpufleet" not in unit


def test_the_installed_service_is_the_rendered_one() -> None:
    files = fabdog.install_contents("/srv/my tools", "/srv/my etc", "/units")
    service = next(data for data, dest, _ in files if dest == f"/units/{fabdog.SERVICE}")
    assert exec_start_argv(service.decode())[1:3] == ["-m", "gpufleet_node.watchdog"]
    assert environment(service.decode()) == {"PYTHONPATH": "/srv/my tools"}
    assert "/srv/my tools/gpufleet_node/watchdog.py" in {dest for _, dest, _ in files}


def test_the_shell_commands_quote_the_paths() -> None:
    command = fabdog.watchdog_command(ODD, ODD + "/etc", "status --json")
    assert shlex.split(command) == [
        f"PYTHONPATH={ODD}",
        "python3",
        "-m",
        "gpufleet_node.watchdog",
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
    shutil.copy(fabdog.UNIT_SOURCE / fabdog.TIMER, tmp_path / fabdog.TIMER)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit), str(tmp_path / fabdog.TIMER)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not [ln for ln in done.stderr.splitlines() if "gpufleet-watchdog" in ln]
