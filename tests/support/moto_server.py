"""moto over real HTTP on 127.0.0.1, shared by every test that needs one.

:func:`moto_server` starts moto's ThreadedMotoServer on a free port and hands out its URL
once each service named in ``warm`` has answered one cheap read, then stops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# One cheap read per service: moto builds a service's backend (imports its modules, maps its
# URLs) on the first request that names it, under a lock, then answers in milliseconds.
_WARM_UP = {
    "s3": lambda client: client.list_buckets(),
    "cloudwatch": lambda client: client.list_metrics(),
    "ec2": lambda client: client.describe_regions(),
    "sts": lambda client: client.get_caller_identity(),
}


@contextmanager
def moto_server(warm: tuple[str, ...] = ("s3", "cloudwatch")) -> Iterator[str]:
    """moto on 127.0.0.1, handed out once each service in ``warm`` has answered a request.

    Why: the node's own first call would otherwise pay moto's backend build inside the
    node's request timeout (10 s for CloudWatch). Measured here: 0.3 s for CloudWatch on an
    idle machine, 8.5-9 s with the test pinned to a core shared by ten busy processes; the
    watchdog then only logs "could not publish metrics" and the test that looks for its
    heartbeat fails. Waiting for the answer here moves that cost out of every node timeout.
    """
    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        # Bounded, not retried: one answer is the readiness this waits for.
        patient = Config(connect_timeout=10, read_timeout=300, retries={"total_max_attempts": 1})
        for service in warm:
            client = boto3.client(
                service,
                endpoint_url=url,
                region_name="us-east-1",
                aws_access_key_id="testing",  # module-scoped callers run before the autouse
                aws_secret_access_key="testing",  # credential fixture
                config=patient,
            )
            _WARM_UP[service](client)
        yield url
    finally:
        server.stop()


@contextmanager
def s3_bucket(url: str, name: str) -> Iterator[str]:
    """Bucket ``name`` made on the moto at ``url`` for one test (its URL handed out), then
    emptied and removed, so the next test starts from no objects."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=name)
    try:
        yield url
    finally:
        for obj in client.list_objects_v2(Bucket=name).get("Contents", []):
            client.delete_object(Bucket=name, Key=obj["Key"])
        client.delete_bucket(Bucket=name)
