"""`fab` entry point: the bootstrap tasks (see `fab --list` and bootstrap/__init__.py).

Hosts come from the Pulumi stack outputs, `--inventory FILE` or `-H user@host:port`;
every task runs on all hosts in parallel and ends with a per-host summary.
"""

import fabric.main

from infra.short_lived import no_collection, skip_exit_collection

# The task collection's imports without cyclic GC, and no collection at exit: 0.48-0.66 ->
# 0.34-0.43 CPU s for a fab that stops at a bad --inventory. Tasks run with the collector
# on: `fab top` and `--follow` may run for hours.
with no_collection():
    from bootstrap import ns
    from bootstrap.fleet.parse_errors import exit_2_on_parse_errors
skip_exit_collection()

# invoke's own parse errors (a flag that needs a value, an unknown flag or task) exit 2,
# as every gpufleet usage error does (docs/exit-status.md)
exit_2_on_parse_errors(fabric.main.program)

__all__ = ["ns"]
