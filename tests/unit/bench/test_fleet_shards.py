"""The fleet on S shards (bench/fleet_shards.py): which shard holds a tenant's batches, how the nodes split, how the
shards' figures add up, and the comparison with one database that bench/results.json records."""

from __future__ import annotations

from typing import Any

from bench.fleet_meters import stage_figures
from bench.fleet_shards import (
    compare_stages,
    process_count,
    shard_nodes,
    shard_of,
    tenants_by_shard,
    total_window,
)
from bench.measures.fleet import fleet_shards_rows


def test_a_tenant_always_lands_on_the_same_shard() -> None:
    assert all(shard_of("tenant-0", 1) == 0 for _ in range(3))
    assert [shard_of(f"tenant-{i}", 4) for i in range(8)] == [shard_of(f"tenant-{i}", 4) for i in range(8)]
    assert {shard_of(f"tenant-{i}", 4) for i in range(64)} == {0, 1, 2, 3}  # every shard gets tenants


def test_one_shard_keeps_the_four_tenants_of_one_database() -> None:
    assert tenants_by_shard(1) == [["tenant-0", "tenant-1", "tenant-2", "tenant-3"]]


def test_each_shard_holds_as_many_tenants_and_only_those_that_hash_to_it() -> None:
    for shards in (2, 3, 4):
        split = tenants_by_shard(shards)
        assert len(split) == shards
        assert len({len(names) for names in split}) == 1  # an even split
        assert sum(len(names) for names in split) >= 4
        assert all(shard_of(name, shards) == s for s, names in enumerate(split) for name in names)
        every = [name for names in split for name in names]
        assert len(every) == len(set(every))  # a tenant's batches live on one shard


def test_nodes_split_evenly_and_each_node_runs_on_a_process_of_its_shard() -> None:
    assert process_count(2, 1) == 2 and process_count(2, 2) == 2 and process_count(2, 4) == 4
    assert process_count(5, 2) == 4
    for shards in (1, 2, 3):
        procs = process_count(2, shards)
        for nodes in (1, 2, 5, 50, 101):
            counts = [shard_nodes(nodes, s, shards) for s in range(shards)]
            assert sum(counts) == nodes and max(counts) - min(counts) <= 1
            # bench/fleet.py: node n is added by process n % P, and process p serves shard p % S
            placed = [0] * shards
            for node in range(nodes):
                placed[(node % procs) % shards] += 1
            assert placed == counts


def _window(wal: float, cpu: float, queued: int) -> dict[str, Any]:
    keys = ("transactions_per_s", "rows_written_per_s", "connections", "postgres_cpu_share")
    return {
        "began": 10.0,
        "ended": 20.0,
        "wal_mb_per_s": wal,
        **dict.fromkeys(keys, 1),
        "postgres_cpu_seconds": cpu,
        "server_cpu_share": cpu / 20,
        "simulator_cpu_share": 0.1,
        "load_average": 1.5,
        "db_queued": queued,
    }


def test_the_shards_meters_add_up_over_their_common_window() -> None:
    total = total_window([_window(10.0, 2.0, 100), _window(12.5, 3.0, 50)])
    assert total["wal_mb_per_s"] == 22.5 and total["postgres_cpu_seconds"] == 5.0 and total["db_queued"] == 150
    assert total["server_cpu_share"] == 0.25 and total["connections"] == 2
    assert (total["began"], total["ended"], total["load_average"]) == (10.0, 20.0, 1.5)


def test_a_stage_counts_results_and_claims_inside_its_window_only() -> None:
    claims = [(9.0, 5.0, 5.0, 768), (11.0, 0.010, 0.008, 192), (12.0, 0.030, 0.020, 192), (21.0, 9.0, 9.0, 1)]
    committed = [(9.5, 1000), (12.0, 400), (19.0, 400), (20.0, 1000)]
    stage = stage_figures(_window(10.0, 2.0, 100), nodes=1, claims=claims, committed=committed, rate=100.0, step=0.02)
    assert stage["results_per_s"] == 80.0 and stage["demand_per_s"] == 100.0 and stage["share_of_demand"] == 0.8
    assert stage["claims"] == 2 and stage["claim_p99_ms"] == 30.0 and stage["claim_p50_ms"] == 10.0
    assert stage["postgres_cpu_ms_per_result"] == 2.5
    assert stage["saturated"]  # 0.8 of demand: under 0.95
    fed = stage_figures(_window(1, 1, 1), nodes=1, claims=claims, committed=committed, rate=80.0, step=0.04)
    assert not fed["saturated"]
    slow = stage_figures(_window(1, 1, 1), nodes=1, claims=claims, committed=committed, rate=80.0, step=0.025)
    assert slow["saturated"]  # fed, but the p99 claim (30 ms) is over one step


def _stage(nodes: int, results: float, demand: float, p99: float, shards: list[float] | None = None) -> dict[str, Any]:
    stage = {
        "nodes": nodes,
        "results_per_s": results,
        "demand_per_s": demand,
        "share_of_demand": round(results / demand, 3),
        "claim_p99_ms": p99,
        "server_cpu_share": 0.5,
        "wal_mb_per_s": 20.0,
    }
    if shards is not None:
        stage["shards"] = [{"share_of_demand": share} for share in shards]
    return stage


def test_the_comparison_divides_the_shards_figures_by_one_databases_at_each_node_count() -> None:
    one = [_stage(50, 3200.0, 4000.0, 170.0), _stage(100, 3000.0, 8000.0, 0.0)]
    sharded = [_stage(50, 3900.0, 4000.0, 85.0, [0.97, 0.98]), _stage(100, 6000.0, 8000.0, 60.0, [0.7, 0.8])]
    sharded.append(_stage(200, 6100.0, 16000.0, 90.0, [0.4, 0.36]))  # one database's ramp stopped before 200
    rows = compare_stages(one, sharded)
    assert [r["nodes"] for r in rows] == [50, 100]
    assert rows[0]["results_per_s_ratio"] == 1.219 and rows[0]["claim_p99_ratio"] == 0.5
    assert (rows[0]["fed_share_one"], rows[0]["fed_share_sharded"]) == (0.8, 0.975)
    assert rows[0]["fed_shares_per_shard"] == [0.97, 0.98]
    assert rows[1]["results_per_s_ratio"] == 2.0 and rows[1]["claim_p99_ratio"] is None  # no claim to compare with


def _run(double_claims: int = 0, per_shard: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    run = {"double_claims": double_claims, "attempts_over_1": 0, "stored": 10, "completed": 10, "step_ms": 21.87}
    if per_shard is not None:
        run["per_shard"] = per_shard
    return run


def test_results_json_rows_name_the_workload_and_nodes_and_check_exactly_once_on_every_shard() -> None:
    ratios = compare_stages([_stage(50, 3200.0, 4000.0, 170.0)], [_stage(50, 3900.0, 4000.0, 15.0, [0.97, 0.98])])
    good = [_run(), _run()]
    compared = {"shards": 2, "processes": 2, "workloads": [{"workload": "long", "one": _run(), "ratios": ratios}]}
    compared["workloads"][0]["sharded"] = _run(per_shard=good)
    rows = {row["name"]: row for row in fleet_shards_rows(compared)}
    assert rows["fleet_shards_long_50_nodes_results_per_s_ratio"]["value"] == 1.219
    assert rows["fleet_shards_long_50_nodes_fed_share"]["met"] is True
    assert rows["fleet_shards_long_50_nodes_claim_p99_ms"]["met"] is True  # 15 ms < one step of 21.87 ms
    assert rows["fleet_shards_exactly_once"]["met"] is True
    # The totals agree, but one shard stored a result its rows do not show: exactly once fails on that shard.
    compared["workloads"][0]["sharded"] = _run(per_shard=[_run(), {**_run(), "completed": 9}])
    rows = {row["name"]: row for row in fleet_shards_rows(compared)}
    assert rows["fleet_shards_exactly_once"]["met"] is False
