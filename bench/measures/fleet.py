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
        best = fed[-1] if fed else None
        top = max(w["stages"], key=lambda s: s["results_per_s"])
        p99 = best["claim_p99_ms"] if best else None
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
                f"ms at {best['nodes'] if best else 0} nodes (one step: {w['step_ms']} ms)",
                f"< {w['step_ms']}",
                p99 is not None and p99 < w["step_ms"],
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
                f"ms per urgency-horizon backlog read at {w['queued_at_start']} queued rows (each worker, every 15 s)",
            ),
        ]
    return rows
