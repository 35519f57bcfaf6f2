/*
 * `gpumem compare`: replay one trace under a set of configurations and print them side by side,
 * marking the recommended configuration (*) and the fastest host ns/op (+).
 *
 * The recommendation weighs memory against device work: among the rows whose reserved/live is
 * within --memory-tolerance (default 5 %) of the lowest, the least device time, then the fewest
 * device calls, then the lowest reserved/live. Memory alone picked configurations that buy the
 * last half percent with thousands of device calls (gpt2_train: vmm release=eager, 1.005 with
 * 71,997 calls and 1.9 s of device time, where rows within 1 % cost 60 ms).
 *
 * The set is built from the public enums, so new strategies, segment modes and release policies
 * join by themselves: every strategy x segment mode (default release), every release policy x
 * segment mode (default strategy), and the design document's settings (min_block = 256 KiB) x
 * segment mode. Rows whose resolved configuration (gm_config_resolve) equals an earlier row's
 * are dropped before replaying. Rows with out-of-memory failures are not eligible for the marks.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_ROWS = 256, LABEL_LEN = 96, CONFIG_TEXT = 2048, PROGRESS_MIN_OPS = 100000 };
static const size_t DESIGN_MIN_BLOCK = 256u << 10; /* the design document's 256 KB granularity */

static const char COMPARE_USAGE[] =
    "usage: gpumem compare [options] TRACE...\n"
    "\n"
    "Replay each trace under every strategy x segment mode, every release policy x segment mode\n"
    "(default strategy unless --set strategy=NAME), and the design document's settings\n"
    "(min_block=256KiB) x segment mode; print one table per trace, mark the recommended\n"
    "configuration (*) and the fastest host ns/op (+: the median of the timed passes, marked only\n"
    "when its slowest pass beats every other row's fastest), and say why the recommended one.\n"
    "The recommendation: among the rows within --memory-tolerance of the lowest reserved/live,\n"
    "the least device time, then the fewest device calls, then the lowest reserved/live. Rows\n"
    "that hit out-of-memory are not marked. --set values apply to every row.\n"
    "\n"
    "options:\n"
    "  --backend sim|cuda   device to replay on (default sim)\n"
    "  --device N           which device of the machine (default 0)\n"
    "  --strategy NAME      the strategy of the release-policy and design rows (same as\n"
    "                       --set strategy=NAME; the strategy rows try every one)\n"
    "  --segments plain|vmm|auto  only the rows of this segment mode (default: plain and vmm)\n"
    "  --set KEY=VALUE      a setting applied to every configuration (keys below)\n"
    "  --memory-tolerance FRACTION  how far above the lowest reserved/live a configuration may\n"
    "                       be and still be recommended for less device time (default 0.05:\n"
    "                       within 5 %; 0: the lowest reserved/live, ties by device time)\n"
    "  --json               print one JSON array: an object per configuration and trace\n"
    "  --strict, --check, --no-progress   as for gpumem replay\n"
    "  -h, --help           this help\n";

typedef struct row {
    char label[LABEL_LEN];
    cli_settings settings;
    char error[512]; /* the configuration could not run */
    replay_result result;
    int ran;
} row;

typedef struct row_set {
    row *rows;
    size_t n;
    char (*resolved)[CONFIG_TEXT];
    gm_backend *backend;    /* the device the rows' configurations are resolved against */
    char backend_error[512]; /* why it could not be opened */
} row_set;

/* Every setting of a pool's resolved configuration (gm_config_resolve: no pool is made) as one
 * string, for spotting duplicates. */
static int resolve(const row_set *set, const cli_settings *s, char *out, char *err,
                   size_t errlen)
{
    if (!set->backend) {
        snprintf(err, errlen, "%s", set->backend_error);
        return -1;
    }
    gm_config c;
    gm_status st = gm_config_resolve(set->backend, &s->pool, &c);
    if (st != GM_OK) {
        snprintf(err, errlen, "%s: %s", gm_status_str(st), gm_last_error(NULL));
        return -1;
    }
    size_t used = gm_config_format(&c, out, CONFIG_TEXT);
    if (used + 1 < CONFIG_TEXT) {
        out[used++] = ',';
        gm_sim_config_format(&s->sim, out + used, CONFIG_TEXT - used);
    }
    return 0;
}

static void add_row(row_set *set, const cli_settings *s, const char *label)
{
    if (set->n == MAX_ROWS)
        return;
    row *r = &set->rows[set->n];
    memset(r, 0, sizeof *r);
    r->settings = *s;
    snprintf(r->label, sizeof r->label, "%s", label);
    if (resolve(set, s, set->resolved[set->n], r->error, sizeof r->error) == 0)
        for (size_t i = 0; i < set->n; i++)
            if (strcmp(set->resolved[i], set->resolved[set->n]) == 0)
                return; /* same pool as row i */
    set->n++;
}

static void build_rows(row_set *set, const cli_settings *base)
{
    static const gm_segments both[] = {GM_SEGMENTS_PLAIN, GM_SEGMENTS_VMM};
    const gm_segments *modes = both;
    unsigned n_modes = 2;
    if (base->pool.segments != GM_SEGMENTS_DEFAULT) { /* --segments: that mode's rows only */
        modes = &base->pool.segments;
        n_modes = 1;
    }
    char label[LABEL_LEN];
    backend_open(base, &set->backend, set->backend_error, sizeof set->backend_error);
    for (unsigned m = 0; m < n_modes; m++) {
        const char *seg = gm_segments_str(modes[m]);
        for (unsigned k = 1; k < GM_STRATEGY_COUNT; k++) {
            cli_settings s = *base;
            s.pool.strategy = (gm_strategy)k;
            s.pool.segments = modes[m];
            snprintf(label, sizeof label, "%s %s", gm_strategy_str(s.pool.strategy), seg);
            add_row(set, &s, label);
        }
        for (unsigned k = 1; k < GM_RELEASE_COUNT; k++) {
            cli_settings s = *base;
            s.pool.release = (gm_release)k;
            s.pool.segments = modes[m];
            snprintf(label, sizeof label, "%s release=%s", seg, gm_release_str(s.pool.release));
            add_row(set, &s, label);
        }
        for (unsigned k = 1; modes[m] == GM_SEGMENTS_PLAIN && k < GM_GROWTH_COUNT; k++) {
            cli_settings s = *base; /* growth sizes plain segments only */
            s.pool.growth = (gm_growth)k;
            s.pool.segments = modes[m];
            snprintf(label, sizeof label, "%s growth=%s", seg, gm_growth_str(s.pool.growth));
            add_row(set, &s, label);
        }
        cli_settings s = *base;
        s.pool.segments = modes[m];
        s.pool.min_block_bytes = DESIGN_MIN_BLOCK;
        snprintf(label, sizeof label, "design doc %s min_block=256KiB", seg);
        add_row(set, &s, label);
    }
    gm_backend_destroy(set->backend);
    set->backend = NULL;
}

static double over_live(const replay_result *r)
{
    return r->final.peak_live_bytes
               ? (double)r->final.peak_reserved_bytes / (double)r->final.peak_live_bytes : 0;
}

static int eligible(const row *r)
{
    return r->ran && !r->result.oom_count;
}

static uint64_t total_calls(const replay_result *x)
{
    uint64_t calls = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++)
        calls += x->final.device_calls[k];
    return calls;
}

/* Index of the eligible row with the lowest reserved/live (by_speed: median ns/op), or n if
 * none ran cleanly. */
static size_t best_row(const row_set *set, int by_speed)
{
    size_t best = set->n;
    for (size_t i = 0; i < set->n; i++) {
        const row *r = &set->rows[i];
        if (!eligible(r))
            continue;
        if (best == set->n)
            best = i;
        else if (by_speed ? r->result.ns_per_op < set->rows[best].result.ns_per_op
                          : over_live(&r->result) < over_live(&set->rows[best].result))
            best = i;
    }
    return best;
}

/* Whether row r may be recommended: eligible, and its reserved/live within the tolerance of the
 * lowest (a relative 1e-9 of slack, so that a row equal to the limit in print counts). */
static int within_tolerance(const row *r, double lowest, double tolerance)
{
    return eligible(r) && over_live(&r->result) <= lowest * (1 + tolerance) * (1 + 1e-9);
}

/* The recommended row (n if none ran cleanly): among the rows within the memory tolerance of the
 * lowest reserved/live, the least device time, then the fewest device calls, then the lowest
 * reserved/live, then the first. *candidates gets how many rows were within the tolerance. */
static size_t recommended_row(const row_set *set, double tolerance, size_t *candidates)
{
    size_t lowest = best_row(set, 0), pick = set->n;
    *candidates = 0;
    if (lowest == set->n)
        return pick;
    double limit = over_live(&set->rows[lowest].result);
    for (size_t i = 0; i < set->n; i++) {
        const row *r = &set->rows[i];
        if (!within_tolerance(r, limit, tolerance))
            continue;
        ++*candidates;
        if (pick == set->n) {
            pick = i;
            continue;
        }
        const replay_result *x = &r->result, *p = &set->rows[pick].result;
        uint64_t xc = total_calls(x), pc = total_calls(p);
        if (x->final.device_time_ns != p->final.device_time_ns
                ? x->final.device_time_ns < p->final.device_time_ns
                : xc != pc ? xc < pc : over_live(x) < over_live(p))
            pick = i;
    }
    return pick;
}

/* The one-line reason for the recommendation ("recommended: LABEL: ..."). */
static void recommendation(const row_set *set, double tolerance, char *buf, size_t n)
{
    size_t candidates, pick = recommended_row(set, tolerance, &candidates);
    size_t lowest = best_row(set, 0);
    if (pick == set->n) {
        snprintf(buf, n, "recommended: none: every configuration failed or ran out of memory");
        return;
    }
    const replay_result *x = &set->rows[pick].result, *l = &set->rows[lowest].result;
    int used = snprintf(buf, n, "recommended: %s: reserved/live %.3f, within %g%% of the lowest "
                        "(%.3f, %s); the least device time of the %zu row%s within it: "
                        "%.3f ms in %llu device calls", set->rows[pick].label, over_live(x),
                        100 * tolerance, over_live(l), set->rows[lowest].label, candidates,
                        candidates == 1 ? "" : "s", (double)x->final.device_time_ns / 1e6,
                        (unsigned long long)total_calls(x));
    if (pick != lowest && used > 0 && (size_t)used < n)
        snprintf(buf + used, n - (size_t)used, " (%s: %.3f ms in %llu)", set->rows[lowest].label,
                 (double)l->final.device_time_ns / 1e6, (unsigned long long)total_calls(l));
}

/* The fastest eligible row by median ns/op, but only if it is faster beyond the spread: its
 * slowest timed pass beats every other eligible row's fastest. Else n (no mark): a mark that
 * moves from run to run with the noise says nothing. */
static size_t fastest_row(const row_set *set)
{
    size_t best = best_row(set, 1);
    for (size_t i = 0; best < set->n && i < set->n; i++) {
        const row *r = &set->rows[i];
        if (i != best && eligible(r) &&
            !(set->rows[best].result.ns_per_op_max < r->result.ns_per_op_min))
            return set->n;
    }
    return best;
}

static void print_table(const trace *t, const row_set *set, double tolerance)
{
    size_t candidates, best = recommended_row(set, tolerance, &candidates);
    size_t fastest = fastest_row(set);
    printf("%s: %zu ops, peak live by the trace %.2f GiB\n", t->path, t->n_ops,
           (double)t->peak_live_bytes / (double)(1u << 30));
    printf("   %-40s %9s %13s %9s %6s %10s %12s %8s %5s\n", "configuration", "res/live",
           "peak reserved", "frag@peak", "worst", "dev calls", "dev time ms", "ns/op", "OOM");
    for (size_t i = 0; i < set->n; i++) {
        const row *r = &set->rows[i];
        if (!r->ran) {
            printf("   %-40s error: %s\n", r->label, r->error);
            continue;
        }
        const replay_result *x = &r->result;
        char reserved[32];
        uint64_t calls = total_calls(x);
        format_bytes(x->final.peak_reserved_bytes, reserved, sizeof reserved);
        printf("%c%c %-40s %9.3f %13s %9.3f %6.3f %10llu %12.3f %8.1f %5llu\n",
               i == best ? '*' : ' ', i == fastest ? '+' : ' ', r->label, over_live(x), reserved,
               x->at_peak.frag_rate, x->worst_frag_rate, (unsigned long long)calls,
               (double)x->final.device_time_ns / 1e6, x->ns_per_op,
               (unsigned long long)x->oom_count);
    }
    printf("* recommended: the least device time among the rows within %g%% of the lowest "
           "reserved/live (--memory-tolerance), then the fewest device calls\n"
           "+ fastest host ns/op (median of %u timed passes; marked only when its slowest pass "
           "beats every other row's fastest)   rows with OOM are never marked\n", 100 * tolerance,
           set->n ? set->rows[0].result.timed_passes : 0);
    char why[1024];
    recommendation(set, tolerance, why, sizeof why);
    printf("%s\n", why);
}

static void json_rows(jw *w, const trace *t, const row_set *set, double tolerance)
{
    size_t candidates, pick = recommended_row(set, tolerance, &candidates);
    size_t best = best_row(set, 0), fastest = fastest_row(set);
    char why[1024];
    recommendation(set, tolerance, why, sizeof why);
    for (size_t i = 0; i < set->n; i++) {
        const row *r = &set->rows[i];
        jw_begin_object(w, NULL);
        jw_string(w, "label", r->label);
        jw_raw(w, "best_reserved_over_live", i == best ? "true" : "false");
        jw_raw(w, "fastest", i == fastest ? "true" : "false");
        jw_raw(w, "recommended", i == pick ? "true" : "false");
        if (i == pick)
            jw_string(w, "recommendation", why);
        jw_double(w, "memory_tolerance", tolerance);
        if (r->ran) {
            report_json_fields(w, t, &r->result);
        } else {
            jw_u64(w, "schema_version", REPORT_SCHEMA_VERSION);
            jw_string(w, "trace", t->path);
            jw_string(w, "error", r->error);
        }
        jw_end_object(w);
    }
}

/* Replay every row; a row that fails records its error. Fatal only for --strict failures. */
static int run_rows(const trace *t, const cli_options *o, row_set *set)
{
    for (size_t i = 0; i < set->n; i++) {
        row *r = &set->rows[i];
        if (r->error[0])
            continue;
        replay_options ro = {.settings = r->settings, .strict = o->strict, .check = o->check};
        ro.progress = !o->no_progress && isatty(STDERR_FILENO) && t->n_ops > PROGRESS_MIN_OPS;
        int rc = replay_run(t, &ro, &r->result, r->error, sizeof r->error);
        if (rc != EXIT_OK_ && o->strict) {
            fprintf(stderr, "gpumem: error: %s: %s\n", r->label, r->error);
            return rc;
        }
        r->ran = rc == EXIT_OK_;
    }
    return EXIT_OK_;
}

static int compare_trace(const char *path, const cli_options *o, jw *w)
{
    trace t;
    int rc = cli_read_trace(path, o, &t);
    if (rc != EXIT_OK_)
        return rc;
    row_set set = {.rows = calloc(MAX_ROWS, sizeof(row)),
                   .resolved = calloc(MAX_ROWS, CONFIG_TEXT)};
    if (!set.rows || !set.resolved) {
        rc = EXIT_RUNTIME;
    } else {
        build_rows(&set, &o->settings);
        rc = run_rows(&t, o, &set);
    }
    if (rc == EXIT_OK_ && w)
        json_rows(w, &t, &set, o->memory_tolerance);
    else if (rc == EXIT_OK_)
        print_table(&t, &set, o->memory_tolerance);
    for (size_t i = 0; i < set.n; i++)
        replay_result_free(&set.rows[i].result);
    free(set.rows);
    free(set.resolved);
    trace_free(&t);
    return rc;
}

int cmd_compare(int argc, char **argv)
{
    cli_options o;
    int rc = cli_parse(argc, argv, "compare",
                       OPT_DEVICE | OPT_POOL | OPT_JSON | OPT_TRACE | OPT_COMPARE, COMPARE_USAGE,
                       &o);
    if (rc >= 0) {
        free(o.paths);
        return rc;
    }
    jw w;
    jw_init_file(&w, stdout);
    if (o.json)
        jw_begin_array(&w, NULL);
    rc = EXIT_OK_;
    for (size_t i = 0; i < o.n_paths && rc == EXIT_OK_; i++) {
        if (i && !o.json)
            putchar('\n');
        rc = compare_trace(o.paths[i], &o, o.json ? &w : NULL);
    }
    if (o.json && rc == EXIT_OK_) {
        jw_end_array(&w);
        jw_finish(&w);
    }
    free(o.paths);
    return rc;
}
