"""The test fleet's moto speed-ups answer exactly like moto itself."""

from __future__ import annotations

from datetime import datetime, timedelta

from moto.cloudwatch.models import CloudWatchBackend

from infra.reaper.idle_rules import UTC
from tests.reaper.fleet import client, moto_get_metric_data, speed_up_moto_metrics


def test_indexed_get_metric_data_answers_like_moto(moto_url: str) -> None:
    cw = client("cloudwatch", moto_url)
    now = datetime.now(UTC).replace(microsecond=0)
    data = []
    for n, iid in enumerate(["i-a", "i-b", "i-c"]):
        dims = [{"Name": "InstanceId", "Value": iid}]
        for minutes in (1, 3, 20 + n, 59, -12):  # -12: a node whose clock runs fast
            at = now - timedelta(minutes=minutes)
            data.append(
                {"MetricName": "Heartbeat", "Dimensions": dims, "Timestamp": at, "Value": 1.0}
            )
            data.append(
                {
                    "MetricName": "GPUUtilization",
                    "Dimensions": dims,
                    "Timestamp": at,
                    "Value": 7.0 * n,
                }
            )
    cw.put_metric_data(Namespace="speedup-test", MetricData=data)

    def queries(period_h: int, period_u: int) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for n, iid in enumerate(["i-a", "i-b", "i-c", "i-missing"]):
            for prefix, name, period, stat in (
                ("h", "Heartbeat", period_h, "Maximum"),
                ("u", "GPUUtilization", period_u, "Maximum"),
                ("s", "Heartbeat", period_h, "SampleCount"),
            ):
                out.append(
                    {
                        "Id": f"{prefix}{n}",
                        "MetricStat": {
                            "Metric": {
                                "Namespace": "speedup-test",
                                "MetricName": name,
                                "Dimensions": [{"Name": "InstanceId", "Value": iid}],
                            },
                            "Period": period,
                            "Stat": stat,
                        },
                    }
                )
        return out

    def ask(periods: tuple[int, int], scan: str) -> list[object]:
        r = cw.get_metric_data(
            MetricDataQueries=queries(*periods),
            StartTime=now - timedelta(minutes=75),
            EndTime=now + timedelta(minutes=15),
            ScanBy=scan,
        )
        return r["MetricDataResults"]

    cases = [((60, 5400), "TimestampDescending"), ((300, 60), "TimestampAscending")]
    installed = CloudWatchBackend.get_metric_data
    CloudWatchBackend.get_metric_data = moto_get_metric_data()  # type: ignore[method-assign]
    try:
        plain = [ask(p, s) for p, s in cases]
        undo = speed_up_moto_metrics()
        fast = [ask(p, s) for p, s in cases]
        undo()
    finally:
        CloudWatchBackend.get_metric_data = installed  # type: ignore[method-assign]
    assert fast == plain
    assert any(r["Values"] for r in plain[0])  # the comparison compared datapoints
