"""`fab` entry point: the bootstrap tasks (see `fab --list` and bootstrap/__init__.py).

Hosts come from the Pulumi stack outputs, `--inventory FILE` or `-H user@host:port`;
every task runs on all hosts in parallel and ends with a per-host summary.
"""

from bootstrap import ns

__all__ = ["ns"]
