"""Every fault scenario (tests/reaper/scenarios.py) on moto behind the fault proxy: zero wrong
stops everywhere; a missed stop only where the API is unreachable or incomplete, and then the
run fails saying why."""

from __future__ import annotations

import pytest

from tests.reaper.scenarios import SCENARIOS, Scenario, run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_no_wrong_stop_and_no_silent_missed_stop(moto_url: str, scenario: Scenario) -> None:
    outcome = run(moto_url, scenario)
    assert outcome.wrong == [], f"{scenario.fault}: stopped {outcome.wrong}"
    if scenario.unreachable:
        assert outcome.exit_code != 0, f"{scenario.fault}: the run did not fail"
        assert outcome.why
    else:
        assert outcome.missed == [], f"{scenario.fault}: kept {outcome.missed} ({outcome.why})"
        assert outcome.exit_code == 0, outcome.why
    assert outcome.ok
