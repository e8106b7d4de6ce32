"""Each benchmark's JSON turned into `bench/results.json` entries (name, value, unit, goal, met).

A goal's `met` is computed here from the figures, never typed in; bench/suite.py runs the benchmarks and
writes what these functions return.
"""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry
from bench.measures.fleet import fleet_rows, fleet_shards_rows, lease_renewal_rows
from bench.measures.lora import lora_rows
from bench.measures.mixed import mixed_lines_rows
from bench.measures.race import prefix_race_rows
from bench.measures.resume import handback_rows, rolling_rows
from bench.measures.timed import gpu_timed_measures, shared_sim_measures
from bench.measures.trial import trial_projection_real_rows, trial_projection_rows

ENGINE_OVERHEAD_RATIO_GOAL = 0.95  # issue 22 §7: Backfill ÷ bare LLM.generate, median of the rounds (and its plot)


def measures(parts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn each benchmark's JSON into entries; a goal's `met` is computed here, never typed in."""
    rows: list[dict[str, Any]] = []
    if engine := parts.get("engine"):
        e = engine["result"]
        ratio = e["throughput_ratio_median"]
        rows += [
            entry(
                "engine_overhead_throughput_ratio",
                ratio,
                "x bare LLM.generate (median)",
                f">= {ENGINE_OVERHEAD_RATIO_GOAL}",
                ratio >= ENGINE_OVERHEAD_RATIO_GOAL,
            ),
            entry(
                "engine_overhead_throughput_ratio_rounds",
                e.get("throughput_ratio_rounds"),
                "x bare LLM.generate, each round (first side alternating; "
                f"min {e.get('throughput_ratio_min')}, q1 {e.get('throughput_ratio_q1')}, "
                f"q3 {e.get('throughput_ratio_q3')}, max {e.get('throughput_ratio_max')}; "
                f"the median's bootstrap 5-95% interval {e.get('throughput_ratio_median_low')}"
                f"-{e.get('throughput_ratio_median_high')})",
            ),
            entry(
                "engine_overhead_ms_per_step_outside_vllm_extra",
                e.get("outside_step_ms_extra_median"),
                "ms per engine step outside vLLM's LLMEngine.step, Backfill minus bare (median of rounds; "
                f"interval {e.get('outside_step_ms_extra_median_low')}-{e.get('outside_step_ms_extra_median_high')}; "
                f"[Backfill, bare] each round {e.get('rounds_outside_step_ms')})",
            ),
            entry("engine_backfill_output_tokens_per_s", e["backfill_tokens_per_s"], "tokens/s"),
            entry("engine_vllm_generate_output_tokens_per_s", e["vllm_generate_tokens_per_s"], "tokens/s"),
            entry("engine_api_upload_and_enqueue_seconds", e["api_upload_and_enqueue_seconds"], "s"),
            entry("engine_output_file_seconds", e["output_file_seconds"], "s"),
        ]
        occupancy = e["straggler_slot_occupancy_while_queued"]  # None: work never had to wait (too few requests)
        rows += [
            entry(
                "straggler_slot_occupancy_while_queued",
                occupancy,
                "share of slots",
                ">= 0.90",
                occupancy is not None and occupancy >= 0.90,
            ),
            entry("straggler_wall_ratio_vs_static_chunks", e["straggler_wall_ratio"], "x static batching"),
            entry("straggler_static_useful_work_share", e["static_useful_work_share"], "share of slots"),
        ]
    if runbatch := parts.get("runbatch"):
        big, small = runbatch["big_wall_ratio"], runbatch["small_wall_ratio"]
        rows += [
            entry(
                "big_job_wall_ratio_vs_run_batch", big, "x run-batch", "<= 1.0", big <= 1.0 and runbatch["big_all_ok"]
            ),
            entry("big_job_backfill_seconds", runbatch["backfill_big_seconds"], "s (engine start-up counted)"),
            entry("big_job_run_batch_seconds", runbatch["run_batch_big_seconds"], "s (engine start-up counted)"),
            entry(
                "many_small_jobs_wall_ratio_vs_run_batch_per_job",
                small,
                "x run-batch",
                "<= 0.10",
                small <= 0.10 and runbatch["small_all_ok"],
            ),
            entry("many_small_jobs_backfill_seconds", runbatch["backfill_small_seconds"], "s"),
            entry("many_small_jobs_run_batch_seconds", runbatch["run_batch_small_seconds_sequential"], "s"),
        ]
    if ingest := parts.get("ingest"):
        i = ingest["result"]
        rate, ratio = i["ingest_pass_lines_per_s"], i["upload_throughput_ratio_vs_raw_boto3"]
        peak = i["api_peak_rss_mb_upload_and_ingest"]
        rows += [
            entry(
                "ingest_validate_enqueue_lines_per_s", rate, "lines/s (the worker's pass)", ">= 20000", rate >= 20000
            ),
            entry("ingest_create_to_in_progress_lines_per_s", i["validate_enqueue_lines_per_s"], "lines/s (wall)"),
            entry("ingest_upload_ratio_vs_raw_boto3", ratio, "x raw boto3 multipart (median)", ">= 0.9", ratio >= 0.9),
            entry("ingest_upload_ratio_rounds", i.get("upload_throughput_ratio_rounds"), "x raw boto3, each round"),
            entry("ingest_upload_api_peak_rss_mb", i.get("api_peak_rss_mb_upload"), "MiB (the uploads alone)"),
            entry("ingest_upload_api_cpu_seconds", i.get("api_cpu_seconds_during_upload"), "CPU s per upload (API)"),
            entry(
                "ingest_upload_s3_server_cpu_seconds_route_vs_raw",
                [i.get("s3_server_cpu_seconds_route"), i.get("s3_server_cpu_seconds_raw_boto3")],
                "CPU s per upload (moto's process): through the route, raw boto3",
            ),
            entry("ingest_end_to_end_lines_per_s", i["ingest_lines_per_s"], "lines/s (upload included)"),
            entry("ingest_api_peak_rss_mb", peak, "MiB (upload + ingest)", "< 256", peak < 256),
            entry(
                "output_file_lines_per_s",
                i["output_file_lines_per_s"],
                "lines/s",
                ">= 20000",
                i["output_file_lines_per_s"] >= 20000,
            ),
            entry(
                "output_file_peak_rss_mb",
                i["output_file_peak_rss_mb"],
                "MiB",
                "< 256",
                i["output_file_peak_rss_mb"] < 256,
            ),
        ]
    if big := parts.get("ingest-big"):
        b = big["result"]
        peak = b["api_peak_rss_mb_upload_and_ingest"]
        rows += [
            entry("gb_ingest_file_mb", b["file_mb"], "MB"),
            entry("gb_ingest_validate_enqueue_lines_per_s", b["ingest_pass_lines_per_s"], "lines/s"),
            entry("gb_ingest_api_peak_rss_mb", peak, "MiB (upload + ingest)", "< 256", peak < 256),
        ]
        if ingest:
            small_us = 1e6 / ingest["result"]["ingest_pass_lines_per_s"]
            flat = round((1e6 / b["ingest_pass_lines_per_s"]) / small_us, 2)
            rows.append(entry("gb_ingest_time_per_line_ratio_vs_50k", flat, "x", "<= 1.25", flat <= 1.25))
    if shared := parts.get("shared"):
        r = shared["result"]
        lowest = r["rates"][0]
        rows += [
            entry(
                "shared_online_ttft_p99_ratio_worst",
                r["worst_ttft_p99_ratio"],
                "x without Backfill",
                "<= 1.10",
                r["worst_ttft_p99_ratio"] <= 1.10,
            ),
            entry(
                "shared_online_tpot_p99_ratio_worst",
                r["worst_tpot_p99_ratio"],
                "x without Backfill",
                "<= 1.10",
                r["worst_tpot_p99_ratio"] <= 1.10,
            ),
            entry(
                "shared_harvest_ratio_at_lowest_online_rate",
                r["harvest_ratio_at_lowest_rate"],
                f"x batch alone ({lowest['online_rate_per_s']} online req/s)",
                ">= 0.70",
                r["harvest_ratio_at_lowest_rate"] >= 0.70,
            ),
            entry("shared_batch_alone_tokens_per_s", r["batch_alone_tokens_per_s"], "tokens/s"),
        ]
        if r.get("latency_slack"):
            slack = f"latency_slack {r['latency_slack']}"
            rows += [
                entry(
                    "shared_slack_online_ttft_p99_ratio_worst",
                    r["worst_ttft_p99_ratio_slack"],
                    f"x without Backfill ({slack})",
                    "<= 1.10",
                    r["worst_ttft_p99_ratio_slack"] <= 1.10,
                ),
                entry(
                    "shared_slack_online_tpot_p99_ratio_worst",
                    r["worst_tpot_p99_ratio_slack"],
                    f"x without Backfill ({slack})",
                    "<= 1.10",
                    r["worst_tpot_p99_ratio_slack"] <= 1.10,
                ),
                entry(
                    "shared_slack_harvest_ratio_at_lowest_online_rate",
                    r["harvest_ratio_at_lowest_rate_slack"],
                    f"x batch alone ({slack}, {lowest['online_rate_per_s']} online req/s)",
                    ">= 0.70",
                    r["harvest_ratio_at_lowest_rate_slack"] >= 0.70,
                ),
            ]
        if "worst_ttft_p99_ratio_bare" in r:
            control = "x without; control: a bare client, no Backfill, same in-flight count"
            rows += [
                entry("shared_bare_client_ttft_p99_ratio_worst", r["worst_ttft_p99_ratio_bare"], control),
                entry("shared_bare_client_tpot_p99_ratio_worst", r["worst_tpot_p99_ratio_bare"], control),
            ]
        rows += [
            entry("shared_tight_window_goodput", r["tight_window_job"]["goodput"], "on time / accepted"),
        ]
    if sim := parts.get("shared_sim"):
        rows += shared_sim_measures(sim["result"])
    if prefix := parts.get("prefix"):
        r = prefix["result"]
        rows += [
            entry("prefix_cache_hit_rate_with_ordering", r["hit_rate_on"], "share of prompt tokens"),
            entry("prefix_cache_hit_rate_without_ordering", r["hit_rate_off"], "share of prompt tokens"),
            entry("prefix_ordering_throughput_ratio", r["throughput_ratio_on_vs_off"], "x without ordering"),
        ]
    if race := parts.get("prefix-race"):
        rows += prefix_race_rows(race["result"])
    if gpu := parts.get("gpu-timed"):
        rows += gpu_timed_measures(gpu["result"])
    if queue := parts.get("queue"):
        best = queue["best_requests_per_s"]
        rows += [
            entry(
                "queue_claim_complete_per_s",
                best,
                f"requests/s ({queue['best_workers']} workers)",
                ">= 10000",
                best >= 10000,
            ),
            entry("queue_no_double_claims", queue["no_double_claims"], "bool", "true", bool(queue["no_double_claims"])),
        ]
    if workers := parts.get("workers"):
        rows += _worker_rows(workers)
    if hostile := parts.get("hostile-bodies"):
        rows += _hostile_rows(hostile)
    if handback := parts.get("handback"):
        rows += handback_rows(handback["result"])
    if rolling := parts.get("rolling-restart"):
        rows += rolling_rows(rolling["result"])
    if ahead := parts.get("render-ahead"):
        rows += _render_ahead_rows(ahead)
    if mixed := parts.get("mixed-lines"):
        rows += mixed_lines_rows(mixed)
    if fleet := parts.get("fleet"):
        rows += fleet_rows(fleet)
    if compared := parts.get("fleet-shards"):
        rows += fleet_shards_rows(compared)
    if leases := parts.get("lease_renewal"):
        rows += lease_renewal_rows(leases)
    if lora := parts.get("lora-packing"):
        rows += lora_rows(lora)
    if trial := parts.get("trial-projection"):
        rows += trial_projection_rows(trial)
    if real := parts.get("trial-projection-real"):
        rows += trial_projection_real_rows(real)
    return rows


def _render_ahead_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 22 section 7: a GPU-shaped engine thread's time beyond its GPU waits, by where requests are rendered."""
    s, a = r["summary"], r["args"]
    shape = (
        f"{a['gpu_ms']} ms GPU waits, {a['host_ms']} ms of its own work, {a['per_step']} {a['words']}-word chat "
        f"request(s) a step, claims of {a['claim']}; median of {a['rounds']} rounds"
    )
    ms = "ms a step beyond the GPU wait over no rendering"
    return [
        entry("render_ahead_engine_thread_ms_extra", s["ahead"]["ms_extra_over_none"], f"{ms} ({shape})"),
        entry("render_ahead_burst_engine_thread_ms_extra", s["ahead-burst"]["ms_extra_over_none"], f"{ms}, no yield"),
        entry("render_ahead_inline_engine_thread_ms_extra", s["inline"]["ms_extra_over_none"], f"{ms}, in add"),
        entry(
            "render_ahead_engine_thread_p99_ms",
            s["ahead"]["ms_p99_median"],
            f"ms beyond the GPU wait, p99 step (no rendering {s['none']['ms_p99_median']}, in add "
            f"{s['inline']['ms_p99_median']}, ahead without the yield {s['ahead-burst']['ms_p99_median']})",
        ),
    ]


def _hostile_rows(h: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 18: the API process's peak RSS growth and slowest /health under huge and hostile bodies."""
    create, many, attack = h["create_256mb"], h["concurrent_large_bodies"], h["depth_attack"]
    rows = [
        entry(
            "hostile_create_peak_rss_over_baseline_mb",
            create["peak_rss_over_baseline_mb"],
            f"MiB ({h['create_body_mb']} MiB Anthropic create, {h['create_requests']} requests)",
            "<= 128",
            create["peak_rss_over_baseline_mb"] <= 128 and create["statuses"] == [200],
        ),
        entry(
            "hostile_concurrent_bodies_peak_rss_over_baseline_mb",
            many["peak_rss_over_baseline_mb"],
            f"MiB ({many['bodies']} concurrent {many['body_mb']} MiB bodies of 1 MB requests)",
            "<= 1024",
            many["peak_rss_over_baseline_mb"] <= 1024 and many["statuses"] == [200],
        ),
        entry(
            "hostile_depth_attack_peak_rss_over_baseline_mb",
            attack["peak_rss_over_baseline_mb"],
            "MiB (100,000 unclosed arrays in one request)",
            "<= 16",
            attack["peak_rss_over_baseline_mb"] <= 16 and attack["statuses"] == [400],
        ),
    ]
    slowest = max(create["health_slowest_seconds"], attack["health_slowest_seconds"])
    rows.append(
        entry(
            "hostile_health_slowest_seconds", slowest, "s (during one huge or hostile body)", "<= 1.0", slowest <= 1.0
        )
    )
    return rows


def _worker_rows(w: dict[str, Any]) -> list[dict[str, Any]]:
    """N GPU workers on one queue: throughput ÷ one worker, exactly-once and fairness (bench/workers.py)."""
    goals = {"4": 3.6, "8": 7.0}
    rows = [
        entry(
            f"workers_{n}_throughput_ratio_vs_one",
            ratio,
            f"x 1 worker ({w['step_ms']:.0f} ms fake step)",
            f">= {goals[n]}" if n in goals else None,
            ratio >= goals[n] if n in goals else None,
        )
        for n, ratio in w["ratios"].items()
        if n != "1"
    ]
    kill, most = w["kill"], w["runs"][-1]
    db_share = round(sum(most["wall_share"].values()), 3)
    return [
        *rows,
        entry(f"workers_{most['workers']}_engine_busy_share", most["engine_busy_share"], "time in step / wall"),
        entry(
            f"workers_{most['workers']}_sessions_waiting_on_locks",
            most.get("sessions_waiting_on_locks_mean"),
            "database sessions, mean of 0.2 s samples",
        ),
        entry(
            f"workers_{most['workers']}_db_wall_share",
            db_share,
            f"claim+record+renew / wall (1 worker: {round(sum(w['runs'][0]['wall_share'].values()), 3)})",
        ),
        entry("workers_one_worker_requests_per_s", w["runs"][0]["requests_per_s"], "requests/s"),
        entry("workers_double_claims", w["double_claims"], "ids in two engines", "0", w["double_claims"] == 0),
        entry(
            "workers_fair_share_min_over_max",
            w["fair_share_min_over_max"],
            "least ÷ most served tenant at half-way",
            ">= 0.9",
            w["fair_share_min_over_max"] >= 0.9,
        ),
        entry(
            "workers_killed_one_every_custom_id_once",
            kill["every_custom_id_once"],
            f"bool ({kill['workers']} workers, one killed -9 at {kill['killed_at_s']} s)",
            "true",
            bool(kill["every_custom_id_once"]),
        ),
    ]
