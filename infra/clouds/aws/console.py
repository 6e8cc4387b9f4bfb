"""AWS's console reader: one instance's serial console output (EC2 GetConsoleOutput).

bootstrap.fleet.console_keys reads the SSH host keys cloud-init prints there, so the first
connection to a new node is already checked. A cloud whose catalog file lists
Feature.CONSOLE_HOST_KEYS as supported has a ``console.py`` with a ``fetcher``; a test holds
the two together.
"""

from __future__ import annotations

from collections.abc import Callable


def fetcher(region: str) -> Callable[[str], str]:
    """Reads one instance's console output with the caller's own AWS credentials."""
    import boto3

    client = boto3.client("ec2", region_name=region)

    def fetch(instance_id: str) -> str:
        answer = client.get_console_output(InstanceId=instance_id, Latest=True)
        return str(answer.get("Output") or "")

    return fetch
