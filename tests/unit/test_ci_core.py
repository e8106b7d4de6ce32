"""CI's core (tests/conftest.py CI_CORE): the tests CI keeps out of the `long` end-to-end runs and fault drills.
A renamed file or a dropped seed would silently leave CI without its only real-engine and fault-run proofs."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.main import parse_seeds
from tests.chaos.test_chaos_runs import CI_SEEDS
from tests.conftest import CI_CORE, LONG_EMBEDDED

ROOT = Path(__file__).resolve().parents[2]


def test_every_core_entry_names_a_test_file_that_exists() -> None:
    missing = [entry for entry in (*CI_CORE, *LONG_EMBEDDED) if not (ROOT / entry.split("::")[0]).is_file()]
    assert not missing, f"CI_CORE or LONG_EMBEDDED names files that are gone: {missing}"


def test_the_core_seeded_fault_run_is_one_of_the_seeds_the_chaos_file_runs() -> None:
    seeds = [entry.split("[")[1].split("-")[0] for entry in CI_CORE if "[" in entry]
    assert seeds and all(int(seed) in parse_seeds(CI_SEEDS) for seed in seeds)
