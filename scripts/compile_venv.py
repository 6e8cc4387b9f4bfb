#!/usr/bin/env python3
"""Compile the venv's installed Python to bytecode, except the provider SDK services that
nothing here imports.

`make setup` installs with `pip install --no-compile` and then runs this. pip compiles every
installed file, and the three provider SDKs (pulumi_aws, pulumi_azure_native,
pulumi_alicloud) are 11,600 generated modules, nearly all in services the programs never
import: on a 2-core machine pip spent about 150 of its 194 CPU s compiling, measured on one
install. Each cloud's folder names its SDK (infra/clouds/<cloud>/catalog.toml [sdk] package).
The services the code does use are those pyproject.toml's mypy section follows
(tests/test_lint_config.py checks every one the code uses is there), or, for an SDK mypy
skips (one with 2,400 generated modules that are not valid Python to mypy), those its cloud
lists ([sdk] services); they, the SDKs' own top-level modules and every other package are
compiled, on every core.

A module left uncompiled still imports: Python compiles it then, and writes its bytecode
unless PYTHONDONTWRITEBYTECODE is set. Files that do not compile (a package's Python 2 test
data) are skipped, as pip skips them.

    python scripts/compile_venv.py              # this interpreter's site-packages
    python scripts/compile_venv.py --list-skipped
"""

from __future__ import annotations

import compileall
import re
import sys
import sysconfig
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from infra import clouds  # noqa: E402
from infra.usage import OneLineParser  # noqa: E402

CATALOG = "catalog.toml"


def sdks(homes: Sequence[Path] | None = None) -> dict[str, frozenset[str] | None]:
    """{SDK package: the services its cloud lists, or None where mypy's section says} from
    each cloud folder's catalog.toml [sdk] table (a cloud without one adds no SDK)."""
    found: dict[str, frozenset[str] | None] = {}
    for folder in clouds.folders(CATALOG, homes).values():
        data = tomllib.loads((folder / CATALOG).read_text(encoding="utf-8"))
        sdk = data.get("sdk")
        if sdk:
            services = sdk.get("services")
            found[sdk["package"]] = None if services is None else frozenset(services)
    return found


def used_services(
    pyproject: Path = ROOT / "pyproject.toml", homes: Sequence[Path] | None = None
) -> dict[str, set[str]]:
    """{SDK package: its services that mypy follows (or those its cloud lists)}, from
    pyproject.toml's overrides and the clouds' [sdk] tables."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    declared = sdks(homes)
    used: dict[str, set[str]] = {sdk: set(listed or ()) for sdk, listed in declared.items()}
    for override in config["tool"]["mypy"]["overrides"]:
        if override.get("follow_imports") != "normal":
            continue
        for module in override["module"]:
            sdk, _, rest = module.partition(".")
            if sdk in used and declared[sdk] is None and rest:
                used[sdk].add(rest.split(".")[0])
    return used


def skipped_pattern(used: dict[str, set[str]]) -> re.Pattern[str]:
    """Matches a path inside an SDK service folder that is not used; an SDK's top-level
    modules (pulumi_aws/provider.py, get_zones.py) and every other package never match."""
    parts = []
    for sdk, services in sorted(used.items()):
        keep = "|".join(re.escape(s) for s in sorted(services))
        ahead = f"(?!(?:{keep})/)" if keep else ""
        parts.append(rf"/{re.escape(sdk)}/{ahead}[^/]+/")
    return re.compile("|".join(parts))


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="compile_venv.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--into", type=Path, default=None, help="a site-packages folder")
    parser.add_argument(
        "--list-skipped", action="store_true", help="print the SDK folders left uncompiled"
    )
    args = parser.parse_args(argv)
    root = args.into or site_packages()
    if not root.is_dir():
        print(f"compile_venv.py: {root} is not a folder: give a site-packages", file=sys.stderr)
        return 2
    skip = skipped_pattern(used_services())
    if args.list_skipped:
        for sdk in sdks():
            for folder in sorted((root / sdk).glob("*/")):
                if folder.name == "__pycache__":
                    continue
                if skip.search(f"{folder.as_posix()}/"):
                    print(folder.relative_to(root))
        return 0
    start = time.monotonic()
    # quiet=2: no listing and no error output; a file that does not compile is left, as
    # pip leaves it. The result is not an error for the same reason.
    compileall.compile_dir(root, quiet=2, rx=skip, workers=0)
    print(f"compile_venv.py: compiled {root} in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
