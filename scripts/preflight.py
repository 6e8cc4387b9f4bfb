#!/usr/bin/env python3
"""Before `pulumi up`: what the user's own cloud account says about a stack, read only.

    python scripts/preflight.py --stack a100x4 [--json]
    python scripts/preflight.py --stack-file FILE
    python scripts/preflight.py --stack a100x4 --request-quota [--yes]

One line per check with its fix (docs/preflight.md). Exit status (docs/exit-status.md):
0 every check passed (or cannot be proven without creating things: "not checked"); 1 a
check failed, or could not be asked (no credentials, no network); 2 bad input (no such
stack, an invalid stack file, --request-quota with neither a terminal nor --yes).

--request-quota asks, for each short quota, "file a request for N vCPUs of <family> in
<region>? [y/N]" and files it where the cloud has a request API (AWS Service Quotas);
elsewhere it prints the documented step. --yes answers yes for scripts; without a
terminal and without --yes it refuses before asking the cloud anything.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra import preflight  # noqa: E402
from infra.catalog import CatalogError  # noqa: E402
from infra.config import ConfigError, load_stack_file  # noqa: E402
from infra.short_lived import one_command  # noqa: E402
from infra.stackfiles import StackNotFound, find_stack  # noqa: E402
from infra.usage import OneLineParser, fit  # noqa: E402


def parser() -> OneLineParser:
    p = OneLineParser(
        prog="preflight.py",
        description="What your cloud account says about a stack before `pulumi up` (read only).",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", metavar="NAME", help="stacks/Pulumi.NAME.yaml")
    which.add_argument("--stack-file", metavar="FILE", type=Path, help="a Pulumi.<stack>.yaml")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument(
        "--request-quota",
        action="store_true",
        help="file a request for each short quota (asks first; see --yes)",
    )
    p.add_argument("--yes", action="store_true", help="with --request-quota: file without asking")
    return p


def tty_confirm(question: str, out: TextIO, answer: TextIO) -> bool:
    """y or yes (any case) from the terminal; anything else, or no line at all, is no."""
    out.write(question)
    out.flush()
    try:
        line = answer.readline()
    except (OSError, KeyboardInterrupt):
        line = ""
    if not line:
        out.write("\n")
    return line.strip().lower() in ("y", "yes")


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    answer: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    answer = answer or sys.stdin
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.yes and not args.request_quota:
        err.write("preflight.py: --yes goes with --request-quota (it answers its question)\n")
        return 2
    if args.request_quota and args.json:
        err.write("preflight.py: --request-quota asks questions: leave out --json\n")
        return 2
    if args.request_quota and not args.yes and not answer.isatty():
        err.write(
            fit("preflight.py: --request-quota asks first: run it in a terminal, or add --yes")
            + "\n"
        )
        return 2
    try:
        path = args.stack_file or find_stack(args.stack)
        cfg = load_stack_file(path)
        need = preflight.need_of(cfg)
    except StackNotFound as exc:
        err.write(fit(f"preflight.py: {exc}") + "\n")
        return 2
    except ConfigError as exc:
        for problem in exc.problems:
            err.write(fit(f"preflight.py: {' '.join(str(problem).split())}") + "\n")
        return 2
    except CatalogError as exc:
        err.write(fit(f"preflight.py: the catalog data is broken: {exc}") + "\n")
        return 1
    report = preflight.run(need)
    if args.json:
        out.write(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        out.write("\n".join(preflight.render(report)) + "\n")
    if args.request_quota:

        def confirm(question: str) -> bool:
            asked = fit(question.rstrip()) + " "  # 80 columns, the [y/N] on the last line
            if args.yes:
                out.write(asked + "yes (--yes)\n")
                return True
            return tty_confirm(asked, out, answer)

        def say(line: str) -> None:
            out.write(fit(line) + "\n")

        out.flush()
        filed = preflight.file_requests(report, confirm, say)
        return max(report.status, filed)
    return report.status


if __name__ == "__main__":
    one_command()  # a one-shot command: no cyclic GC, none at exit (infra/short_lived.py)
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `preflight.py | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 0
    sys.exit(status)
