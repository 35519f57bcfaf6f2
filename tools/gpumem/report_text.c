/*
 * The human-readable replay report: one "name  value" row per figure (docs/cli.md lists them).
 */
#include "cli.h"

#include <stdarg.h>
#include <string.h>

/* 1234567 -> "1,234,567". */
static const char *grouped(uint64_t v, char *buf, size_t n)
{
    char digits[24];
    int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

static const char *bytes(uint64_t v, char *buf, size_t n)
{
    format_bytes(v, buf, n);
    return buf;
}

static void row(FILE *f, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row(FILE *f, const char *name, const char *fmt, ...)
{
    va_list ap;
    fprintf(f, "  %-22s ", name);
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
}

static void device_calls(FILE *f, const gm_stats *st)
{
    char list[512] = "";
    size_t used = 0;
    uint64_t total = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        uint64_t c = st->device_calls[k];
        total += c;
        if (c && used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s %llu",
                                     used ? ", " : "", gm_call_str((gm_call)k),
                                     (unsigned long long)c);
    }
    row(f, "device calls", "%llu%s%s%s", (unsigned long long)total, total ? " (" : "", list,
        total ? ")" : "");
}

static void bad_input(FILE *f, const trace *t, const replay_result *r)
{
    char list[512] = "";
    size_t used = 0;
    for (int p = 0; p < TRACE_PROBLEM_COUNT; p++) {
        if (t->problems[p] && used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used,
                                     "%s%llu %s (first at line %llu)", used ? ", " : "",
                                     (unsigned long long)t->problems[p],
                                     trace_problem_str((trace_problem)p),
                                     (unsigned long long)t->first_problem_line[p]);
    }
    row(f, "bad trace input", "%s", used ? list : "none");
    if (t->logged_failures || t->zero_size || t->never_freed)
        row(f, "also in the trace", "%llu logged allocate failures, %llu zero-byte allocations "
            "(skipped), %llu allocations never freed", (unsigned long long)t->logged_failures,
            (unsigned long long)t->zero_size, (unsigned long long)t->never_freed);
}

void report_text(FILE *f, const trace *t, const replay_result *r)
{
    char a[64], b[64], c[64];
    const gm_stats *fin = &r->final, *pk = &r->at_peak;
    const cli_settings *s = &r->resolved;
    fprintf(f, "%s\n", t->path);
    row(f, "device", "%s, %s", r->device.name, bytes(r->device.total_bytes, a, sizeof a));
    row(f, "pool", "strategy=%s segments=%s growth=%s release=%s (--json shows every setting)",
        gm_strategy_str(s->pool.strategy), gm_segments_str(s->pool.segments),
        gm_growth_str(s->pool.growth), gm_release_str(s->pool.release));
    row(f, "ops", "%s (%s allocs, %s frees)", grouped(r->ops, a, sizeof a),
        grouped(fin->alloc_count + r->oom_count, b, sizeof b),
        grouped(fin->free_count, c, sizeof c));
    row(f, "peak live", "%s", bytes(fin->peak_live_bytes, a, sizeof a));
    row(f, "peak reserved", "%s", bytes(fin->peak_reserved_bytes, a, sizeof a));
    char note[256] = "";
    replay_incomplete_note(r, note, sizeof note);
    row(f, "reserved / live", "%.3f%s%s", fin->peak_live_bytes
        ? (double)fin->peak_reserved_bytes / (double)fin->peak_live_bytes : 0.0,
        *note ? "  " : "", note);
    row(f, "at peak live", "op %zu (line %llu): %s live, %s reserved, %zu segments",
        t->n_ops ? t->peak_op + 1 : 0,
        t->n_ops ? (unsigned long long)t->ops[t->peak_op].line : 0ull,
        bytes(pk->live_bytes, a, sizeof a), bytes(pk->reserved_bytes, b, sizeof b), pk->segments);
    row(f, "  internal frag", "%s (granted - requested)",
        bytes(pk->internal_frag_bytes, a, sizeof a));
    row(f, "  external frag", "%s free in reserved memory, largest free block %s",
        bytes(pk->total_free_bytes, a, sizeof a), bytes(pk->largest_free_bytes, b, sizeof b));
    row(f, "  frag rate", "%.3f (1 - largest free / total free)", pk->frag_rate);
    row(f, "worst frag rate", "%.3f at op %llu (sampled; free >= 1%% of reserved)",
        r->worst_frag_rate, (unsigned long long)r->worst_frag_op);
    device_calls(f, fin);
    row(f, "device time", "%.3f ms (%s)", (double)fin->device_time_ns / 1e6,
        backend_named_simulated(r->device.backend) ? "simulated H200 cost model" : "measured");
    char in_device[64] = ""; /* the sim's cost model charges time, spends none */
    if (!backend_named_simulated(r->device.backend))
        snprintf(in_device, sizeof in_device, ", %.3f ms of it in device calls",
                 (double)r->timed_device_ns / 1e6);
    row(f, "host time", "%.1f ns/op, median of %u timed passes (%.1f-%.1f; the median pass: "
        "%.3f s in gm_alloc/gm_free%s)", r->ns_per_op, r->timed_passes, r->ns_per_op_min,
        r->ns_per_op_max, (double)r->host_ns / 1e9, in_device);
    if (r->defrag_shown) {
        row(f, "movable", "%.3f of allocations (%llu made with gm_alloc_movable)",
            r->movable_fraction, (unsigned long long)r->movable_allocs);
        if (r->defrag_enabled)
            row(f, "defrag", "on: %llu calls in time gaps >= %g s, %llu steps",
                (unsigned long long)r->defrag_calls, r->defrag_gap,
                (unsigned long long)r->defrag_steps);
        else
            row(f, "defrag", "off: %llu steps (out-of-memory ladder only)",
                (unsigned long long)r->defrag_steps);
        row(f, "  moved", "%llu blocks, %s", (unsigned long long)r->defrag_blocks_moved,
            bytes(r->defrag_bytes_moved, a, sizeof a));
        row(f, "  copy time", "%.3f ms (%s; gap steps), %.3f ms host",
            (double)r->defrag_copy_ns / 1e6,
            backend_named_simulated(r->device.backend) ? "simulated"
                                                   : "measured: each step until its copies ended",
            (double)r->defrag_host_ns / 1e6);
    }
    if (r->oom_count)
        row(f, "out of memory", "%llu allocation%s failed (first at line %llu: %s); %llu of their "
            "frees skipped", (unsigned long long)r->oom_count, r->oom_count == 1 ? "" : "s",
            (unsigned long long)r->first_oom_line, r->first_oom_message,
            (unsigned long long)r->frees_skipped);
    else
        row(f, "out of memory", "0");
    bad_input(f, t, r);
    if (r->streams_merged)
        row(f, "streams", "the backend cannot create streams: all ops ran on the default stream");
    if (r->recommended_initial_reserve) {
        row(f, "recommended pool", "initial_reserve = %s (the large arena's peak, 2 MiB pages; "
            "replayed with it: peak reserved %s)", bytes(r->recommended_initial_reserve, a,
            sizeof a), bytes(r->advice_peak_reserved, b, sizeof b));
        row(f, "", "use it with: --set initial_reserve=%llu",
            (unsigned long long)r->recommended_initial_reserve);
    } else {
        row(f, "recommended pool", "no initial_reserve: on this trace one raises peak reserved");
    }
    if (r->min_budget_done)
        row(f, "smallest budget", "%s = %.3f x peak live (reserve_limit, bisection to 2 MiB over "
            "%u replays: no out-of-memory at it)", bytes(r->min_budget_bytes, a, sizeof a),
            r->min_budget_ratio, r->min_budget_replays);
    if (r->summary)
        fprintf(f, "  pool at peak live (gm_pool_summary):\n%s", r->summary);
}
