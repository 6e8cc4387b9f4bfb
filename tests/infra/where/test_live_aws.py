"""AWS's availability signal (infra/clouds/aws/availability.py) through boto3 against a moto
server on 127.0.0.1: real HTTP, real botocore, moto's copy of EC2's offerings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.clouds.availability import OFFERED, NoSignal
from infra.clouds.aws import availability
from tests.infra.where.fakes import ec2_query
from tests.support.moto_server import moto_server


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server(warm=("ec2",)) as url:
        yield url


@pytest.fixture
def ec2(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    return moto_url


def test_the_zones_offering_the_type_come_back_with_their_spot_price(ec2: str) -> None:
    zones = availability.live_zones("p4d.24xlarge", ["us-east-1", "eu-west-1"])
    names = [z.zone for z in zones]
    # moto answers from the same AWS snapshot zones.toml was written from
    assert names == ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "eu-west-1c"]
    assert {z.state for z in zones} == {OFFERED}
    assert all(z.spot_price == pytest.approx(0.00001) for z in zones)  # moto's fixed price
    # moto does not implement GetSpotPlacementScores: each zone says there is no score
    assert {z.detail for z in zones} == {"offered; no spot placement score (ResponseParserError)"}


def test_a_region_that_offers_the_type_nowhere_answers_no_zone(ec2: str) -> None:
    assert availability.live_zones("p5.48xlarge", ["af-south-1"]) == []


def test_no_credentials_is_one_line_saying_so(ec2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    with pytest.raises(NoSignal, match=r"^no AWS credentials .*offline rows only$"):
        availability.live_zones("p4d.24xlarge", ["us-east-1"])


def test_an_ec2_that_cannot_be_reached_is_one_line_naming_the_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(NoSignal, match=r"^EC2 in us-east-1: ") as info:
        availability.live_zones("p4d.24xlarge", ["us-east-1"])
    assert "\n" not in str(info.value)


def test_the_newest_spot_price_of_each_zone_wins() -> None:
    history = [
        {"AvailabilityZone": "a", "Timestamp": "2026-12-01T00:00:00Z", "SpotPrice": "1.0"},
        {"AvailabilityZone": "a", "Timestamp": "2026-12-02T00:00:00Z", "SpotPrice": "2.0"},
        {"AvailabilityZone": "b", "Timestamp": "2026-12-01T00:00:00Z", "SpotPrice": "3.0"},
    ]
    assert availability.latest_spot(history) == {"a": 2.0, "b": 3.0}


# GetSpotPlacementScores as botocore's EC2 model (2016-11-15, query protocol) shapes its
# answer: spotPlacementScoreSet of items {region, availabilityZoneId, score}, nextToken.
SCORES_XML = (
    '<GetSpotPlacementScoresResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    "<requestId>5e0a4b9c-0000-4000-8000-000000000001</requestId><spotPlacementScoreSet>"
    "<item><region>us-east-1</region><score>9</score></item>"
    "<item><region>eu-west-1</region><score>3</score></item>"
    "</spotPlacementScoreSet></GetSpotPlacementScoresResponse>"
)


def test_spot_placement_scores_are_read_per_region_from_the_models_answer() -> None:
    import boto3

    with ec2_query(lambda form: SCORES_XML) as (url, sent):
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        scores = availability.placement_scores(ec2, "p5.48xlarge", ["us-east-1", "eu-west-1"])
    assert scores == {"us-east-1": 9, "eu-west-1": 3}
    (q,) = sent
    assert q["Action"] == ["GetSpotPlacementScores"] and q["InstanceType.1"] == ["p5.48xlarge"]
    assert q["RegionName.1"] == ["us-east-1"] and q["SingleAvailabilityZone"] == ["false"]
