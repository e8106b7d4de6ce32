"""The model-switching rule on synthetic backlogs: when a multi-model worker stays, switches or idles."""

from __future__ import annotations

import pytest

from worker.feed.switching import Backlog, DeadlineGroup, SwitchPolicy, decide, serve

NOW = 1_000_000.0
MIN = 60.0
HOUR = 3600.0
RELOAD = {"A": 90.0, "B": 90.0, "C": 90.0}
POLICY = SwitchPolicy(min_residency_seconds=300.0, default_reload_seconds=120.0)


def backlog(model: str, *groups: tuple[float, int, float]) -> Backlog:
    """groups: (deadline in seconds from NOW, requests, seconds of work)."""
    return Backlog(model, tuple(DeadlineGroup(NOW + due, n, work) for due, n, work in groups))


def run(loaded: str | None, *backlogs: Backlog, resident: float = HOUR, reload: dict[str, float] = RELOAD):  # type: ignore[no-untyped-def]
    return decide(
        loaded=loaded, resident_seconds=resident, backlogs=backlogs, reload_seconds=reload, now=NOW, policy=POLICY
    )


def test_no_work_anywhere_idles_and_keeps_the_loaded_model() -> None:
    decision = run("A", Backlog("A"), Backlog("B"))
    assert (decision.action, decision.model, decision.rule) == ("idle", "A", "idle")


def test_a_fresh_worker_loads_the_model_whose_deadline_is_nearest_not_the_biggest() -> None:
    decision = run(None, backlog("A", (20 * HOUR, 5000, 3 * HOUR)), backlog("B", (3 * HOUR, 1200, 10 * MIN)))
    assert (decision.action, decision.model, decision.rule) == ("switch", "B", "load")
    assert decision.reason == "no model loaded; loading B (1,200 requests, 10 min of work, earliest deadline in 3.0 h)"


def test_an_idle_model_is_left_at_once_even_just_after_loading_it() -> None:
    decision = run(
        "A",
        Backlog("A"),
        backlog("B", (3 * HOUR, 1200, 10 * MIN)),
        backlog("C", (5 * HOUR, 10, MIN)),
        resident=5.0,
    )
    assert (decision.action, decision.model, decision.rule) == ("switch", "B", "drained")
    assert decision.reason.startswith("A has no queued work; switching to B (1,200 requests")


def test_staying_when_the_other_models_deadline_is_far_away() -> None:
    decision = run("A", backlog("A", (20 * HOUR, 5000, 2 * HOUR)), backlog("B", (20 * HOUR, 300, 40 * MIN)))
    assert (decision.action, decision.model, decision.rule) == ("stay", "A", "stay")
    assert decision.reason == (
        "staying on A: 5,000 requests, 2.0 h of work; B (300 requests, 40 min of work) fits after it, "
        "deadline in 20.0 h; switching would cost 90 s + 90 s of reloads"
    )


def test_switching_early_when_the_other_models_deadline_is_at_risk() -> None:
    decision = run("A", backlog("A", (20 * HOUR, 5000, 2 * HOUR)), backlog("B", (45 * MIN, 1200, 40 * MIN)))
    assert (decision.action, decision.model, decision.rule) == ("switch", "B", "deadline")
    assert decision.reason == (
        "B's deadline in 45 min is at risk: A's 2.0 h of work + 90 s reload + B's 40 min of work leaves "
        "~1,200 of 1,200 requests late; switching to B"
    )


def test_the_reload_cost_counts_a_switch_that_cannot_save_anything_is_not_made() -> None:
    a = backlog("A", (20 * HOUR, 5000, 2 * HOUR))
    b = backlog("B", (45 * MIN, 1200, 40 * MIN))
    slow = {"A": 90.0, "B": 50 * MIN}  # loading B takes longer than B's window
    decision = run("A", a, b, reload=slow)
    assert (decision.action, decision.rule) == ("stay", "no_gain")
    assert "B's deadline in 45 min is at risk" in decision.reason


def test_minimum_residency_holds_a_model_with_work_even_when_another_is_at_risk() -> None:
    a = backlog("A", (20 * HOUR, 5000, 2 * HOUR))
    b = backlog("B", (45 * MIN, 1200, 40 * MIN))
    held = run("A", a, b, resident=100.0)
    assert (held.action, held.model, held.rule) == ("stay", "A", "residency")
    assert held.reason.startswith("staying on A: loaded 100 s ago (minimum residency 5 min), although B's deadline")
    assert run("A", a, b, resident=301.0).model == "B"


def test_no_switch_that_would_make_the_loaded_models_nearer_deadline_miss_instead() -> None:
    # A's own 2,000 requests are due in 50 min and need 45 of them; B's 100 are due in 60 min.
    a = backlog("A", (50 * MIN, 2000, 45 * MIN))
    b = backlog("B", (60 * MIN, 100, 20 * MIN))
    decision = run("A", a, b)
    assert (decision.action, decision.model, decision.rule) == ("stay", "A", "no_gain")


def test_the_candidate_that_saves_the_most_requests_wins() -> None:
    a = backlog("A", (20 * HOUR, 5000, 2 * HOUR))
    b = backlog("B", (30 * MIN, 10, 5 * MIN))
    c = backlog("C", (40 * MIN, 900, 20 * MIN))
    decision = run("A", a, b, c)
    assert (decision.action, decision.model) == ("switch", "C")


def test_after_a_deadline_switch_the_worker_does_not_switch_straight_back() -> None:
    a = backlog("A", (20 * HOUR, 5000, 2 * HOUR))
    b = backlog("B", (45 * MIN, 1200, 40 * MIN))
    assert run("A", a, b).model == "B"
    back = run("B", a, b, resident=HOUR)  # even with residency long past
    assert (back.action, back.model) == ("stay", "B")


def test_only_the_loaded_model_has_work() -> None:
    decision = run("A", backlog("A", (HOUR, 10, 60.0)), Backlog("B"))
    assert (decision.action, decision.model, decision.rule) == ("stay", "A", "stay")
    assert decision.reason.endswith("no other model has work")


def test_an_unmeasured_model_is_assumed_to_take_the_default_reload_time() -> None:
    a = backlog("A", (20 * HOUR, 5000, 2 * HOUR))
    b = backlog("B", (45 * MIN, 1200, 40 * MIN))
    decision = run("A", a, b, reload={"A": 90.0})
    assert "+ 2 min reload" in decision.reason


@pytest.mark.parametrize(
    ("start", "late", "end"),
    [
        (0.0, 0.0, 150.0),  # everything fits
        (60.0, 10.0, 200.0),  # the first group misses by 10 s of its 100 s: 10 of 100 requests late
        (275.0, 100.0 + 25.0, 300.0),  # the first group's deadline passed; the second loses its last half
        (400.0, 150.0, 400.0),  # everything expired before the start: nothing is served
    ],
)
def test_serving_earliest_deadline_first_counts_expired_requests_as_late(start: float, late: float, end: float) -> None:
    groups = [DeadlineGroup(300.0, 50, 50.0), DeadlineGroup(150.0, 100, 100.0)]
    served = serve(groups, start)
    assert served.late == pytest.approx(late)
    assert served.end == pytest.approx(end)


def test_worker_models_setting_lists_the_models_a_worker_switches_between() -> None:
    from storage.settings import Settings, SettingsError

    models = {"a": {"path": "fake:"}, "b": {"path": "fake:"}, "c": {"path": "fake:"}}
    assert Settings(models=models).current_worker_models() == ["a"]  # type: ignore[arg-type]
    assert Settings(models=models, worker_model="b").current_worker_models() == ["b"]  # type: ignore[arg-type]
    assert Settings(models=models, worker_models=" c, a ,c").current_worker_models() == ["c", "a"]  # type: ignore[arg-type]
    assert Settings(models=models, worker_models="all").current_worker_models() == ["a", "b", "c"]  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="BACKFILL_WORKER_MODELS='a,zz'"):
        Settings(models=models, worker_models="a,zz").current_worker_models()  # type: ignore[arg-type]
