"""scripts/compile_venv.py: the venv compiled but for the SDK services nothing imports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra import clouds
from tests.support.scripts import load_script
from tests.test_lint_config import followed

ROOT = Path(__file__).resolve().parents[2]
compile_venv = load_script("compile_venv")
SKIP = compile_venv.skipped_pattern(compile_venv.used_services())
# what Tencent's folder lists (mypy skips its SDK), written out here so a change shows
TENCENT_SERVICES = frozenset(
    (
        "cam",
        "config",
        "cos",
        "images",
        "instance",
        "key",
        "scf",
        "security",
        "subnet",
        "user",
        "vpc",
    )
)


def test_the_services_compiled_are_those_mypy_follows() -> None:
    used = compile_venv.used_services()
    assert {"ec2", "iam", "s3"} <= used["pulumi_aws"]
    assert {"compute", "network", "web"} <= used["pulumi_azure_native"]
    assert {"ecs", "fc", "oss"} <= used["pulumi_alicloud"]
    declared = compile_venv.sdks()
    for sdk, listed in declared.items():
        if listed is None:
            assert {f"{sdk}.{s}" for s in used[sdk]} <= followed()
        else:
            assert used[sdk] == set(listed)
    assert declared["tencentcloud_iac_pulumi"] == TENCENT_SERVICES


def test_each_clouds_folder_names_its_sdk() -> None:
    """The SDKs come from the clouds' folders (catalog.toml [sdk]), one per cloud with a
    program, and only an SDK mypy skips lists its services."""
    declared = compile_venv.sdks()
    assert set(declared) == {
        "pulumi_aws",
        "pulumi_azure_native",
        "pulumi_alicloud",
        "tencentcloud_iac_pulumi",
    }
    assert len(declared) == len(clouds.names("program.py"))
    assert [sdk for sdk, listed in declared.items() if listed is not None] == [
        "tencentcloud_iac_pulumi"
    ]


def test_a_new_clouds_sdk_is_compiled_by_its_own_declaration(tmp_path: Path) -> None:
    """A fifth cloud adds its SDK in its own folder; the script reads it with no edit."""
    folder = tmp_path / "newcloud"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "catalog.toml").write_text(
        '[provider]\nname = "newcloud"\n\n[sdk]\npackage = "pulumi_newcloud"\n'
        'services = ["compute"]\n'
    )
    homes = [*clouds.__path__, str(tmp_path)]
    assert compile_venv.sdks([Path(h) for h in homes])["pulumi_newcloud"] == {"compute"}
    skip = compile_venv.skipped_pattern(compile_venv.used_services(homes=[Path(h) for h in homes]))
    assert skip.search("/v/site-packages/pulumi_newcloud/storage/bucket.py")
    assert not skip.search("/v/site-packages/pulumi_newcloud/compute/vm.py")
    assert skip.search("/v/site-packages/pulumi_aws/accessanalyzer/analyzer.py")


def test_the_tencent_services_listed_are_every_one_its_program_reads() -> None:
    """mypy skips Tencent's SDK, so nothing else checks the list against the code."""
    program = (ROOT / "infra" / "clouds" / "tencent" / "program.py").read_text()
    code = "\n".join(ln for ln in program.splitlines() if not ln.lstrip().startswith("#"))
    read = set(re.findall(r"\btc\.([a-z_]+)\.", code))
    assert read and read <= TENCENT_SERVICES, read - TENCENT_SERVICES


@pytest.mark.parametrize(
    ("path", "skipped"),
    [
        ("/v/site-packages/pulumi_aws/accessanalyzer/analyzer.py", True),
        ("/v/site-packages/pulumi_aws/ec2transitgateway/vpc.py", True),  # not ec2
        ("/v/site-packages/pulumi_azure_native/sql/v20230801/server.py", True),
        ("/v/site-packages/pulumi_alicloud/ack/one_cluster.py", True),
        ("/v/site-packages/pulumi_aws/ec2/instance.py", False),
        ("/v/site-packages/pulumi_aws/ec2/_inputs.py", False),
        ("/v/site-packages/pulumi_aws/provider.py", False),
        ("/v/site-packages/pulumi_alicloud/get_zones.py", False),
        ("/v/site-packages/pulumi_azure_native/network/v20240101/x.py", False),
        ("/v/site-packages/pulumi/resource.py", False),
        ("/v/site-packages/torch/nn/modules/linear.py", False),
        ("/v/site-packages/tencentcloud_iac_pulumi/instance.py", False),
        ("/v/site-packages/tencentcloud_iac_pulumi/antiddos/pkg.py", True),
        ("/v/site-packages/tencentcloud_iac_pulumi/cvm/instance.py", True),  # not used
        ("/v/site-packages/tencentcloud_iac_pulumi/instance/instance.py", False),
        ("/v/site-packages/tencentcloud_iac_pulumi/_inputs.py", False),
    ],
)
def test_only_unused_sdk_services_are_left_uncompiled(path: str, skipped: bool) -> None:
    assert bool(SKIP.search(path)) is skipped


def test_every_sdk_module_the_plans_import_is_compiled() -> None:
    """The truth of the list: plan a stack of each cloud whose SDK is pruned and read which
    of its files Python opened (source or bytecode)."""
    code = """
import sys
from pathlib import Path
opened = set()
def record(event, args):
    if event == "open" and isinstance(args[0], str) and (
        "/pulumi_" in args[0] or "/tencentcloud_iac_pulumi/" in args[0]
    ):
        opened.add(args[0])
sys.addaudithook(record)
from infra.config import load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
for name in ("a100x8", "a100x4", "azure-t4x1", "h100x8x2", "tencent-a100x4", "tencent-t4x1"):
    path = Path("stacks") / f"Pulumi.{name}.yaml"
    evaluate(load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY}))
print("\\n".join(sorted(opened)))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # a module's bytecode read for its source: compileall matches the pattern on sources
    files = [re.sub(r"/__pycache__/(\w+)\.[^/]+\.pyc$", r"/\1.py", f) for f in done.stdout.split()]
    sdks = {f.split("site-packages/")[1].split("/")[0] for f in files if "site-packages/" in f}
    assert set(compile_venv.sdks()) <= sdks
    assert not [f for f in files if SKIP.search(f)]


def test_it_compiles_all_but_the_unused_services_and_passes_over_a_broken_file(
    tmp_path: Path,
) -> None:
    for rel in (
        "pulumi_aws/ec2/instance.py",
        "pulumi_aws/provider.py",
        "pulumi_aws/acm/certificate.py",
        "other/mod.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("X = 1\n")
    (tmp_path / "other" / "py2.py").write_text("print 'old'\n")
    assert compile_venv.main(["--into", str(tmp_path)]) == 0
    compiled = {p.parent.parent.name + "/" + p.name.split(".")[0] for p in tmp_path.rglob("*.pyc")}
    assert compiled == {"ec2/instance", "pulumi_aws/provider", "other/mod"}


def test_a_missing_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compile_venv.main(["--into", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a folder" in err


def test_setup_installs_uncompiled_and_then_compiles() -> None:
    done = subprocess.run(
        ["make", "-s", "-n", "-B", ".venv/.installed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    installs = [line for line in done.stdout.splitlines() if "pip install" in line]
    assert installs and all("--no-compile" in line for line in installs if "-r " in line)
    assert done.stdout.rstrip().splitlines()[-2].endswith("scripts/compile_venv.py")
