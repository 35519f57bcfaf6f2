/*
 * The --json replay report: one object per trace with the text table's figures under stable
 * snake_case keys (docs/cli.md lists them), the bad-input counts, and `config`, every setting
 * the run used with defaults filled in.
 */
#include "cli.h"

static void config_members(jw *w, const cli_settings *resolved)
{
    char value[64];
    const backend_desc *backend = backend_of(resolved);
    jw_string(w, "backend", backend->name);
    for (size_t i = 0; i < settings_count(); i++) {
        if (settings_is_sim(i) && !backend->simulated)
            continue;
        settings_value_json(i, resolved, value, sizeof value);
        jw_raw(w, settings_key(i), value);
    }
}

void report_json_config(jw *w, const cli_settings *resolved)
{
    jw_begin_object(w, "config");
    config_members(w, resolved);
    jw_end_object(w);
}

/* --movable / --defrag figures; only when one of them was given (the default report is as
 * before). */
static void defrag_figures(jw *w, const replay_result *r)
{
    jw_begin_object(w, "defrag");
    jw_raw(w, "enabled", r->defrag_enabled ? "true" : "false");
    jw_double(w, "movable_fraction", r->movable_fraction);
    jw_u64(w, "movable_allocs", r->movable_allocs);
    jw_double(w, "gap_s", r->defrag_gap);
    jw_u64(w, "calls", r->defrag_calls);
    jw_u64(w, "steps", r->defrag_steps);
    jw_u64(w, "blocks_moved", r->defrag_blocks_moved);
    jw_u64(w, "bytes_moved", r->defrag_bytes_moved);
    jw_u64(w, "copy_ns", r->defrag_copy_ns);
    jw_u64(w, "host_ns", r->defrag_host_ns);
    jw_end_object(w);
}

static void stats_at_peak(jw *w, const trace *t, const replay_result *r)
{
    const gm_stats *pk = &r->at_peak;
    jw_begin_object(w, "at_peak");
    jw_u64(w, "op", t->n_ops ? t->peak_op + 1 : 0);
    jw_u64(w, "line", t->n_ops ? t->ops[t->peak_op].line : 0);
    jw_u64(w, "live_bytes", pk->live_bytes);
    jw_u64(w, "allocated_bytes", pk->allocated_bytes);
    jw_u64(w, "reserved_bytes", pk->reserved_bytes);
    jw_u64(w, "segments", pk->segments);
    jw_u64(w, "internal_frag_bytes", pk->internal_frag_bytes);
    jw_u64(w, "external_frag_bytes", pk->total_free_bytes);
    jw_u64(w, "largest_free_bytes", pk->largest_free_bytes);
    jw_double(w, "frag_rate", pk->frag_rate);
    jw_end_object(w);
}

static void bad_input(jw *w, const trace *t, const replay_result *r)
{
    jw_begin_object(w, "bad_input");
    for (int p = 0; p < TRACE_PROBLEM_COUNT; p++)
        jw_u64(w, trace_problem_key((trace_problem)p), t->problems[p]);
    jw_u64(w, "unsatisfiable_allocates", r->oom_count);
    jw_end_object(w);
}

void report_json_fields(jw *w, const trace *t, const replay_result *r)
{
    const gm_stats *fin = &r->final;
    jw_u64(w, "schema_version", REPORT_SCHEMA_VERSION);
    jw_string(w, "trace", t->path);
    jw_string(w, "device", r->device.name);
    jw_u64(w, "device_ordinal", (uint64_t)r->device.ordinal);
    jw_u64(w, "ops", r->ops);
    jw_u64(w, "allocs", fin->alloc_count + r->oom_count);
    jw_u64(w, "frees", fin->free_count);
    jw_u64(w, "peak_live_bytes", fin->peak_live_bytes);
    jw_u64(w, "peak_allocated_bytes", fin->peak_allocated_bytes);
    jw_u64(w, "peak_reserved_bytes", fin->peak_reserved_bytes);
    jw_double(w, "reserved_over_live", fin->peak_live_bytes
              ? (double)fin->peak_reserved_bytes / (double)fin->peak_live_bytes : 0.0);
    jw_raw(w, "complete", r->oom_count ? "false" : "true"); /* the headline covers the trace */
    stats_at_peak(w, t, r);
    jw_u64(w, "internal_frag_bytes", r->at_peak.internal_frag_bytes);
    jw_u64(w, "external_frag_bytes", r->at_peak.total_free_bytes);
    jw_double(w, "frag_rate_at_peak", r->at_peak.frag_rate);
    jw_double(w, "worst_frag_rate", r->worst_frag_rate);
    jw_u64(w, "worst_frag_op", r->worst_frag_op);
    jw_begin_object(w, "device_calls");
    for (int k = 0; k < GM_CALL_KINDS; k++)
        jw_u64(w, gm_call_str((gm_call)k), fin->device_calls[k]);
    jw_end_object(w);
    uint64_t memory_calls = memory_calls_of(fin);
    jw_u64(w, "memory_calls", memory_calls);
    jw_u64(w, "memory_calls_after_quarter", memory_calls - r->memory_calls_at_quarter);
    jw_begin_object(w, "device_call_ns");
    for (int k = 0; k < GM_CALL_KINDS; k++)
        jw_u64(w, gm_call_str((gm_call)k), fin->device_call_ns[k]);
    jw_end_object(w);
    jw_u64(w, "device_time_ns", fin->device_time_ns);
    jw_u64(w, "vmm_runs_recycled", fin->vmm_runs_recycled);
    jw_u64(w, "vmm_runs_recycled_across", fin->vmm_runs_recycled_across);
    jw_u64(w, "vmm_alias_pages", fin->vmm_alias_pages);
    jw_u64(w, "vmm_waits_avoided", fin->vmm_waits_avoided);
    jw_u64(w, "vmm_unmaps_async", fin->vmm_unmaps_async);
    jw_u64(w, "vmm_plans", fin->vmm_plans);
    jw_u64(w, "vmm_plan_hits", fin->vmm_plan_hits);
    jw_u64(w, "vmm_plan_misses", fin->vmm_plan_misses);
    jw_u64(w, "segments_vmm", (uint64_t)fin->segments_vmm);
    jw_u64(w, "host_ns", r->host_ns);
    jw_double(w, "ns_per_op", r->ns_per_op);
    jw_double(w, "ns_per_op_min", r->ns_per_op_min);
    jw_double(w, "ns_per_op_max", r->ns_per_op_max);
    jw_u64(w, "timed_passes", r->timed_passes);
    jw_u64(w, "timed_device_time_ns", r->timed_device_ns);
    jw_u64(w, "oom_count", r->oom_count);
    jw_u64(w, "first_oom_line", r->first_oom_line);
    jw_string(w, "first_oom_message", r->first_oom_message);
    jw_u64(w, "frees_skipped", r->frees_skipped);
    bad_input(w, t, r);
    jw_u64(w, "logged_allocate_failures", t->logged_failures);
    jw_u64(w, "zero_size_allocates", t->zero_size);
    jw_u64(w, "never_freed", t->never_freed);
    jw_u64(w, "streams", t->n_streams);
    jw_raw(w, "streams_merged", r->streams_merged ? "true" : "false");
    jw_u64(w, "recommended_initial_reserve", r->recommended_initial_reserve);
    jw_u64(w, "advice_peak_reserved_bytes", r->advice_peak_reserved);
    if (r->min_budget_done) { /* --min-budget */
        jw_u64(w, "min_budget_bytes", r->min_budget_bytes);
        jw_double(w, "min_budget_ratio", r->min_budget_ratio);
        jw_u64(w, "min_budget_replays", r->min_budget_replays);
    }
    if (!r->defrag_shown) {
        report_json_config(w, &r->resolved);
        return;
    }
    defrag_figures(w, r);
    jw_begin_object(w, "config");
    config_members(w, &r->resolved);
    jw_double(w, "movable", r->movable_fraction);
    jw_string(w, "defrag", r->defrag_enabled ? "on" : "off");
    jw_double(w, "defrag_gap", r->defrag_gap);
    jw_end_object(w);
}

void report_json(jw *w, const trace *t, const replay_result *r)
{
    jw_begin_object(w, NULL);
    report_json_fields(w, t, r);
    jw_end_object(w);
}
