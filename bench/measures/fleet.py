"""bench/fleet.py's figures as results.json rows (issue 41 section 2): fleet sizes reached, with their goals."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry

GOALS = {"long": 1000, "short": 250}  # nodes of 8xH100 one Postgres should carry (issue 41)


def fleet_rows(fleet: dict[str, Any]) -> list[dict[str, Any]]:
    """Per workload: the largest fleet the database kept fed, its p99 claim latency against a step, double claims,
    and the figures at the largest stage run (rows/s, WAL, connections, Postgres CPU) to scale to another server."""
    rows: list[dict[str, Any]] = []
    for w in fleet["workloads"]:
        name, goal = w["workload"], GOALS[w["workload"]]
        fed = [s for s in w["stages"] if not s["saturated"]]
        best = fed[-1] if fed else w["stages"][0]  # none fed: the smallest fleet's figure
        top = max(w["stages"], key=lambda s: s["results_per_s"])
        p99 = best["claim_p99_ms"]
        once = w["double_claims"] == 0 and w["attempts_over_1"] == 0 and w["stored"] == w["completed"]
        rows += [
            entry(
                f"fleet_{name}_nodes_fed",
                w["nodes_reached"],
                f"nodes (8xH100, 70B FP8) kept >= 95% fed, p99 claim < one step ({w['step_ms']} ms); stages "
                + ", ".join(f"{s['nodes']}: {s['share_of_demand']}" for s in w["stages"])
                + f"; {fleet.get('cores')} shared cores",
                f">= {goal}",
                w["nodes_reached"] >= goal,
            ),
            entry(
                f"fleet_{name}_claim_p99_ms",
                p99,
                f"ms at {best['nodes']} nodes (one step: {w['step_ms']} ms; database time alone "
                f"{best['claim_db_p99_ms']} ms)",
                f"< {w['step_ms']}",
                bool(fed) and p99 < w["step_ms"],
            ),
            entry(f"fleet_{name}_exactly_once", once, "bool (no double claim, each stored once)", "true", once),
            entry(
                f"fleet_{name}_results_per_s_max",
                top["results_per_s"],
                f"results/s at {top['nodes']} nodes (demand {top['demand_per_s']}/s; WAL {top['wal_mb_per_s']} MB/s, "
                f"{top['transactions_per_s']} transactions/s, {top['connections']} connections, Postgres "
                f"{top['postgres_cpu_share']} of the cores, simulator {top['simulator_cpu_share']}, load "
                f"{top['load_average']})",
            ),
            entry(
                f"fleet_{name}_postgres_cpu_ms_per_result",
                top["postgres_cpu_ms_per_result"],
                f"ms of Postgres CPU per stored result at {top['nodes']} nodes (claim, record, renewals)",
            ),
            entry(
                f"fleet_{name}_backlog_scan_ms",
                w["backlog_scan_ms"],
                f"ms per urgency-horizon backlog sum at {w['queued_at_start']} queued rows (once per model for the whole fleet"
                " every 15 s; the other workers read its row)",
            ),
        ]
    return rows


def lease_renewal_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """bench/lease_renewal.py: rows and WAL per renewal (a lease per claim: O(claims), not O(rows in flight)), and
    claim + record per request."""
    rows: list[dict[str, Any]] = []
    claims_per_worker = max(1, -(-768 // r["claim_size"]))  # a runner's 768 rows in flight, claimed by claim_size
    for run in r["renewals"]:
        n = run["inflight"]
        goal = -(-n // r["claim_size"])  # one row write per claim held
        rows += [
            entry(
                f"lease_renewal_rows_written_{n}_inflight",
                run["rows_written_per_renewal"],
                f"row versions per renewal of {n} rows in flight (claims of {r['claim_size']}; {run['renewals_per_s']}"
                f" renewals/s, {run['statements_per_renewal']} statements each)",
                f"<= {goal} (one per claim)",
                run["rows_written_per_renewal"] <= goal,
            ),
            entry(f"lease_renewal_wal_bytes_{n}_inflight", run["wal_bytes_per_renewal"], "bytes of WAL per renewal"),
        ]
    c = r["claim_record"]
    rows += [
        entry(
            "lease_renewal_claim_record_wal_bytes_per_request",
            c["wal_bytes_per_request"],
            f"bytes of WAL per request, claim + record ({c['rows_written_per_request']} rows written, "
            f"{c['statements_per_request']} statements, {c['transactions_per_request']} transactions per request; "
            f"~2 KB result bodies; {claims_per_worker} claims per worker)",
        ),
    ]
    return rows


def fleet_shards_rows(compared: dict[str, Any]) -> list[dict[str, Any]]:
    """bench/fleet.py --compare-shards S: per workload and node count, S shards against one database (results/s
    ratio, fed share, p99 claim), and exactly once on every shard of both runs."""
    shards, rows = compared["shards"], []
    for w in compared["workloads"]:
        name, step = w["workload"], w["sharded"]["step_ms"]
        for r in w["ratios"]:
            n = r["nodes"]
            rows += [
                entry(
                    f"fleet_shards_{name}_{n}_nodes_results_per_s_ratio",
                    r["results_per_s_ratio"],
                    f"x one database ({shards} shards {r['results_per_s_sharded']} results/s, one database "
                    f"{r['results_per_s_one']}, demand {r['demand_per_s']}; Postgres servers' share of the cores "
                    f"{r['server_cpu_share_sharded']} vs {r['server_cpu_share_one']}, WAL {r['wal_mb_per_s_sharded']}"
                    f" vs {r['wal_mb_per_s_one']} MB/s; {compared['processes']} simulator processes in both)",
                ),
                entry(
                    f"fleet_shards_{name}_{n}_nodes_fed_share",
                    r["fed_share_sharded"],
                    f"share of demand on {shards} shards (each {r['fed_shares_per_shard']}; one database "
                    f"{r['fed_share_one']})",
                    ">= 0.95",
                    r["fed_share_sharded"] >= 0.95,
                ),
                entry(
                    f"fleet_shards_{name}_{n}_nodes_claim_p99_ms",
                    r["claim_p99_ms_sharded"],
                    f"ms p99 claim on {shards} shards (one database {r['claim_p99_ms_one']} ms, ratio "
                    f"{r['claim_p99_ratio']}; one step {step} ms)",
                    f"< {step}",
                    r["claim_p99_ms_sharded"] < step,
                ),
            ]
    runs = [run for w in compared["workloads"] for run in (w["one"], w["sharded"])]
    once = all(_exactly_once(part) for run in runs for part in run.get("per_shard", [run]))
    rows.append(
        entry("fleet_shards_exactly_once", once, "bool (every shard: no double claim, each stored once)", "true", once)
    )
    return rows


def _exactly_once(part: dict[str, Any]) -> bool:
    return part["double_claims"] == 0 and part["attempts_over_1"] == 0 and part["stored"] == part["completed"]
