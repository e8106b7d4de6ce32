"""The profiler's step shapes (bench/engine_profile.py): what each side's engine steps carried."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.engine_profile import Shapes, step_shapes


def test_shapes_count_prompt_carrying_steps_and_sequences_a_step() -> None:
    steps = [(4, 40, 36), (4, 4, 0), (4, 4, 0), (2, 2, 0), (3, 12, 10)]
    got = step_shapes(steps)
    assert got == {
        "steps": 5,
        "steps_with_prompt_tokens": 2,
        "prompt_tokens": 46,
        "tokens": 62,
        "sequences_per_step_mean": 3.4,
        "steps_at_most_sequences": 3,
    }
    assert step_shapes([]) == {"steps": 0}


def test_shapes_read_each_step_from_the_scheduler_and_unwrap_cleanly() -> None:
    outputs = iter(
        [
            SimpleNamespace(num_scheduled_tokens={"a": 20, "b": 1}, total_num_scheduled_tokens=21),
            SimpleNamespace(num_scheduled_tokens={}, total_num_scheduled_tokens=0),  # nothing ran: not a step
            SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 1}, total_num_scheduled_tokens=2),
        ]
    )

    class Scheduler:
        def schedule(self) -> Any:
            return next(outputs)

    scheduler = Scheduler()
    engine = SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler)))
    shapes = Shapes()
    unwrap = shapes.wrap(engine)
    for _ in range(3):
        scheduler.schedule()
    unwrap()
    assert shapes.steps == [(2, 21, 20), (2, 2, 0)]
    assert "schedule" not in vars(scheduler)  # the class's own method again
