"""Requests in flight shared between replicas, with a clock the test holds: what is reported when,
and how long another replica's report counts."""

from __future__ import annotations

from llmgw.routing.channel import LoadReport, decode, encode
from llmgw.routing.load import REFRESH_SECONDS, SERVED_SECONDS, TTL_SECONDS, SharedLoad


def test_a_report_is_sent_only_when_the_counts_changed() -> None:
    load = SharedLoad("here")
    assert load.report(0.0) is None  # idle, and nothing was ever reported
    load.enter("a:m")
    load.enter("a:m")
    assert load.report(0.0) == LoadReport("here", {"a:m": 2}, TTL_SECONDS)
    assert load.report(0.25) is None
    load.leave("a:m")
    assert load.report(0.5) == LoadReport("here", {"a:m": 1}, TTL_SECONDS)
    load.leave("a:m")
    assert load.report(0.75) == LoadReport("here", {}, TTL_SECONDS)  # idle again: said once
    assert load.report(10.0) is None


def test_a_busy_replica_refreshes_its_report_before_it_expires() -> None:
    load = SharedLoad("here")
    load.enter("a:m")
    assert load.report(0.0) is not None
    assert load.report(REFRESH_SECONDS - 0.01) is None
    assert load.report(REFRESH_SECONDS) == LoadReport("here", {"a:m": 1}, TTL_SECONDS)
    assert REFRESH_SECONDS * 2 < TTL_SECONDS  # one lost refresh does not lapse it


def test_a_report_names_the_busiest_deployments_only() -> None:
    load = SharedLoad("here")
    for n in range(200):
        for _ in range(n % 7 + 1):
            load.enter(f"p{n}:m")
    report = load.report(0.0)
    assert report is not None
    assert len(report.in_flight) == 50
    assert min(report.in_flight.values()) >= max(
        count for label, count in load.own.items() if label not in report.in_flight
    )


def test_others_reports_add_to_its_own_counts_until_they_expire() -> None:
    load = SharedLoad("here")
    load.enter("a:m")
    load.receive(LoadReport("there", {"a:m": 2, "b:m": 1}, ttl=3.0), now=10.0)
    load.receive(LoadReport("elsewhere", {"a:m": 4}, ttl=1.0), now=10.0)
    assert load.in_flight("a:m", 10.5) == 7
    assert load.in_flight("b:m", 10.5) == 1
    assert load.in_flight("a:m", 11.0) == 3  # "elsewhere" stopped reporting: it may have died
    assert load.in_flight("a:m", 13.0) == 1
    load.receive(LoadReport("there", {"a:m": 5}, ttl=3.0), now=13.0)  # a newer one replaces
    assert load.in_flight("a:m", 13.0) == 6
    load.receive(LoadReport("there", {}, ttl=3.0), now=13.5)  # idle again
    assert load.in_flight("a:m", 13.5) == 1


def test_its_own_report_coming_back_is_not_counted_twice() -> None:
    load = SharedLoad("here")
    load.enter("a:m")
    report = load.report(0.0)
    assert report is not None
    load.receive(report, now=0.0)
    assert load.in_flight("a:m", 0.0) == 1


def test_callers_a_deployment_answered_are_reported_for_a_while_and_told_apart() -> None:
    here, there = SharedLoad("here"), SharedLoad("there")
    here.served("a:m", "alice", 0.0)
    assert here.others_served("a:m", "mallory", 1.0)
    assert not here.others_served("a:m", "alice", 1.0), "alice is no other caller to herself"
    report = here.report(0.0)
    assert report is not None
    assert report.served == {"a:m": ["alice"]}
    assert decode(encode(report)) == report
    there.receive(report, now=0.5)
    assert there.others_served("a:m", "mallory", 1.0)
    assert not there.others_served("b:m", "mallory", 1.0)
    assert not there.others_served("a:m", "mallory", 0.5 + TTL_SECONDS), "its report lapsed"
    assert here.report(REFRESH_SECONDS) is not None, "refreshed while it names a caller"
    assert not here.others_served("a:m", "mallory", SERVED_SECONDS)
    assert here.report(SERVED_SECONDS) == LoadReport("here", {}, TTL_SECONDS)  # forgotten
    for n in range(5):
        here.served("a:m", f"caller{n}", SERVED_SECONDS + n)
    assert here.report(SERVED_SECONDS + 5) == LoadReport(
        "here", {}, TTL_SECONDS, {"a:m": ["caller3", "caller4"]}
    )


def test_a_report_of_an_older_version_without_callers_is_read() -> None:
    assert decode(b'{"replica": "old", "in_flight": {"a:m": 1}, "ttl": 3.0}') == LoadReport(
        "old", {"a:m": 1}, 3.0
    )
    assert decode(b'{"replica": "bad", "in_flight": {}, "ttl": 3.0, "served": {"a:m": 1}}') is None
