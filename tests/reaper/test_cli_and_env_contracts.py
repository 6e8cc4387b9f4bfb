"""The reaper's smaller contracts: a 200 with HTML is an error, the endpoint comes only from a
flag (or a logged opt-in in the function), GPUFLEET_MAX_ATTEMPTS counts attempts, and bad
command-line input is one line with exit status 2."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.clouds.alicloud.reaper import AlicloudCloud
from infra.clouds.aws.reaper import AwsCloud, MalformedAnswer
from infra.reaper.handler import ConfigError, make_cloud, run
from scripts import teardown
from tests.reaper.alicloud_fake import FakeAlicloud
from tests.reaper.faultproxy import FaultProxy
from tests.support.stderr import problems

pytestmark = pytest.mark.integration


@contextmanager
def html_server() -> Iterator[tuple[str, list[str]]]:
    """Answers every request 200 with a web page, as a captive portal or a wrong URL does."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            body = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_html_page_answering_describe_instances_is_an_error_not_zero_instances() -> None:
    with html_server() as (url, _), pytest.raises(MalformedAnswer, match="reservation list"):
        AwsCloud("us-east-1", endpoint_url=url).scan("s")


def test_an_html_page_answering_get_metric_data_makes_metrics_unreadable() -> None:
    from datetime import datetime, timedelta

    from gpufleet_node.idle_rules import UTC

    now = datetime.now(UTC)
    with html_server() as (url, _):
        got = AwsCloud("us-east-1", endpoint_url=url).metrics(
            ["i-1"], start=now - timedelta(hours=1), end=now
        )
    assert got["i-1"].error and "MetricDataResults" in got["i-1"].error


def test_an_html_page_answering_the_ecs_api_is_an_error() -> None:
    fake = FakeAlicloud()
    fake.html_actions.add("DescribeInstances")
    with fake.running() as url:
        cloud = AlicloudCloud(
            "cn-beijing",
            endpoint=url,
            access_key_id="a",
            access_key_secret="b",
            account_id="1",
            max_attempts=1,
        )
        with pytest.raises(Exception):  # noqa: B017 - the SDK's or ours: never a result
            cloud.scan("s")


def test_teardown_reports_an_html_endpoint_as_a_failed_scan_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with html_server() as (url, _):
        code = teardown.main(["--provider", "aws", "--region", "us-east-1", "--endpoint-url", url])
    err = capsys.readouterr().err
    assert code == 2
    assert "scan failed, nothing stopped" in err
    assert "0 managed" not in err


def test_teardown_ignores_gpufleet_endpoint_url_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with html_server() as (url, seen):
        monkeypatch.setenv("GPUFLEET_ENDPOINT_URL", url)
        monkeypatch.setenv("GPUFLEET_MAX_ATTEMPTS", "1")
        # The real endpoint is unreachable here; what matters is that the variable is not used.
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        teardown.main(["--provider", "aws", "--region", "us-east-1"])
    assert seen == []
    assert "GPUFLEET_ENDPOINT_URL is ignored here" in capsys.readouterr().err


def test_the_function_uses_gpufleet_endpoint_url_only_with_a_logged_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with html_server() as (url, seen), pytest.raises(MalformedAnswer):
        run(
            "aws",
            {"GPUFLEET_STACK": "s", "GPUFLEET_REGION": "us-east-1", "GPUFLEET_ENDPOINT_URL": url},
        )
    assert seen
    assert "GPUFLEET_ENDPOINT_URL" in capsys.readouterr().out


def test_make_cloud_never_reads_the_endpoint_from_the_environment() -> None:
    cloud = make_cloud("aws", {"GPUFLEET_REGION": "us-east-1", "GPUFLEET_ENDPOINT_URL": "x"})
    assert cloud.endpoint_url is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("attempts", [1, 3])
def test_max_attempts_counts_attempts_not_retries(moto_url: str, attempts: int) -> None:
    proxy = FaultProxy(moto_url, rate=0.0)
    proxy.fail_ops = {"DescribeInstances": None}
    with proxy.running():
        env = {"GPUFLEET_REGION": "us-east-1", "GPUFLEET_MAX_ATTEMPTS": str(attempts)}
        cloud = make_cloud("aws", env, endpoint=proxy.url)
        with pytest.raises(Exception):  # noqa: B017 - throttled on every attempt
            cloud.scan("s")
    assert proxy.requests == attempts


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_max_attempts_below_one_or_not_a_number_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="GPUFLEET_MAX_ATTEMPTS"):
        make_cloud("aws", {"GPUFLEET_REGION": "us-east-1", "GPUFLEET_MAX_ATTEMPTS": bad})


@pytest.mark.parametrize(
    "argv",
    [
        ["--provider", "gcp", "--region", "us-east-1"],
        ["--provider", "aws", "--region", "Virginia"],
        ["--provider", "aws"],
        ["--provider", "aws", "--region", "us-east-1", "--stack", "a b"],
        ["--provider", "aws", "--region", "us-east-1", "--endpoint-url", "ftp://x"],
        ["--provider", "aws", "--region", "us-east-1", "--bogus"],
    ],
)
def test_bad_teardown_input_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        teardown.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert len(problems(err)) == 1, err  # one problem, each of its lines in 80 columns
    assert err.startswith("teardown: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "value"), [("GPUFLEET_MAX_ATTEMPTS", "x"), ("GPUFLEET_RETRY_MODE", "legacy")]
)
def test_bad_teardown_environment_is_one_line_and_exit_2(
    name: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    assert teardown.main(["--provider", "aws", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    (line,) = problems(err)
    assert name in line, err
