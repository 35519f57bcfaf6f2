/*
 * The interfaces between the files of the `gpumem` command-line tool. The tool uses only the
 * public API (gpumem.h, gpumem_sim.h); nothing here is part of the library.
 *
 *   trace.c        RMM CSV reader (plain or gzip) -> an array of resolved operations
 *   settings.c     the table of --set keys, size parsing, config printing
 *   backends.c     the backend registry: name, simulated or not, open, device count, streams
 *   replay.c       the replay engine (the CLI's, the Python package's and bench_replay's):
 *                  replays a parsed trace against a pool, timing only gm_alloc / gm_free
 *   report_text.c  the human-readable table          report_json.c  --json
 *   report_html.c  the self-contained HTML page       jsonw.c        a small JSON writer
 *   compare.c      `gpumem compare`                   info.c         `gpumem info`
 *   main.c         subcommand dispatch and the options replay, compare and info share
 */
#ifndef GM_CLI_H
#define GM_CLI_H

#include "gpumem_sim.h"
#include "json.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes of the tool (docs/cli.md). EXIT_OOM: the replay ran and reported, but allocations
 * failed with out-of-memory, so its figures cover only part of the trace (--allow-oom: 0). */
enum { EXIT_OK_ = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_OOM = 3 };

/* ---- trace.c --------------------------------------------------------------------------- */

enum { TRACE_ALLOC = 0, TRACE_FREE = 1 };

/* One resolved operation. Pointers are resolved at parse time: every allocation gets a slot
 * (its index among allocations) and a free names the slot it ends, so replay needs no hashing. */
typedef struct trace_op {
    uint64_t size;   /* bytes of the allocation (for a free: of the allocation it ends) */
    uint64_t line;   /* line in the file, for messages */
    double time;     /* the Time column (seconds); that of the line before when absent or bad */
    uint32_t slot;   /* allocation index */
    uint32_t stream; /* index into trace.streams; 0 = the default stream */
    uint8_t kind;    /* TRACE_ALLOC or TRACE_FREE */
    uint8_t implied; /* a free the log lacked, put before a re-allocate of a live pointer */
} trace_op;

/* Kinds of bad trace input found while parsing (sizes that cannot be satisfied show up only
 * at replay, as out-of-memory failures). */
typedef enum trace_problem {
    TRACE_MALFORMED = 0, /* wrong field count, unknown action, bad number */
    TRACE_UNKNOWN_FREE,  /* free of a pointer that is not live */
    TRACE_DOUBLE_ALLOC,  /* allocate of a pointer that is still live */
    TRACE_TRUNCATED,     /* gzip stream ends early or is corrupt */
    TRACE_PROBLEM_COUNT
} trace_problem;

typedef struct trace {
    char *path;
    trace_op *ops;
    size_t n_ops, cap_ops;
    uint64_t *streams; /* distinct logged stream values; streams[0] = 0 (default stream) */
    uint32_t n_streams, cap_streams;
    uint32_t n_slots;           /* allocations */
    uint64_t lines;             /* lines read, header included */
    uint64_t logged_failures;   /* `allocate failure` lines (skipped) */
    uint64_t zero_size;         /* allocations of 0 bytes (skipped, with their frees) */
    uint64_t problems[TRACE_PROBLEM_COUNT];
    uint64_t first_problem_line[TRACE_PROBLEM_COUNT];
    uint64_t peak_live_bytes;   /* from a pre-scan of the ops, by logged sizes */
    size_t peak_op;             /* index of the op after which live bytes first peak */
    uint64_t never_freed;       /* allocations still live at the end of the trace */
} trace;

typedef struct trace_read_options {
    int strict;             /* the first bad input is fatal */
    FILE *warn;             /* where non-fatal problems are reported (NULL: nowhere) */
    unsigned max_warnings;  /* per kind; the rest are only counted */
} trace_read_options;

/* Read and resolve a whole trace. Returns 0, or -1 with a message in err ("FILE:LINE: ...").
 * On failure *out is released. */
int trace_read(const char *path, const trace_read_options *opt, trace *out, char *err,
               size_t errlen);
/* The same from an open descriptor (left open; read from its current offset), named `name` in
 * messages: what the Python package reads a file it opened through. */
int trace_read_fd(int fd, const char *name, const trace_read_options *opt, trace *out, char *err,
                  size_t errlen);
void trace_free(trace *t);
const char *trace_problem_str(trace_problem p);  /* "malformed line" */
const char *trace_problem_key(trace_problem p);  /* "malformed_lines" (JSON) */

/* ---- settings.c ------------------------------------------------------------------------ */

/* A row of the backend registry (backends.c); backend_kind is its index. */
typedef enum backend_kind { BACKEND_SIM = 0, BACKEND_CUDA, BACKEND_COUNT } backend_kind;

/* Everything a run is configured with: the pool, the simulated device, the backend. */
typedef struct cli_settings {
    gm_config pool;
    gm_sim_config sim;
    unsigned sim_devices; /* simulated devices of the machine (sim.devices); 0 = the default */
    backend_kind backend;
    int device;           /* --device: which device of the machine (default 0) */
} cli_settings;

/* Parse "KEY=VALUE" (one --set) into s. Returns 0, or -1 with a message in err. */
int settings_set(cli_settings *s, const char *assignment, char *err, size_t errlen);
/* Parse a byte size: plain bytes, or a number (fractions allowed) with K/M/G/T or
 * KiB/MiB/GiB/TiB (both binary). Returns 0 or -1. */
int parse_size(const char *text, size_t *out);
/* The valid keys, one per line with default and meaning (help text and error messages). */
void settings_print_keys(FILE *f);
/* Number of keys, and key i's name. */
size_t settings_count(void);
const char *settings_key(size_t i);
/* Whether key i belongs to the simulated device ("sim.*"). */
int settings_is_sim(size_t i);
/* Key i's value in s: as JSON (a number, string or boolean), or as short text for tables. */
void settings_value_json(size_t i, const cli_settings *s, char *buf, size_t n);
void settings_value_text(size_t i, const cli_settings *s, char *buf, size_t n);
/* "1.58 GiB" style. */
void format_bytes(uint64_t bytes, char *buf, size_t n);

/* ---- backends.c: the backend registry ------------------------------------------------- */

typedef struct backend_desc {
    const char *name; /* --backend NAME, Pool(NAME), gm_device_info.backend */
    const char *note; /* said beside the name in messages ("the simulated GPU"), or NULL */
    bool simulated;   /* device time is the cost model's; sim.* settings and controls apply */
    gm_status (*open)(const cli_settings *s, gm_backend **out); /* device s->device */
    int (*device_count)(const cli_settings *s);
    gm_status (*stream_create)(gm_backend *b, gm_stream *out);
    gm_status (*stream_destroy)(gm_backend *b, gm_stream stream);
} backend_desc;

/* The row of s's backend. */
const backend_desc *backend_of(const cli_settings *s);
/* The backend called `name` into *out: 0, or -1 when none is. */
int backend_find(const char *name, backend_kind *out);
/* Whether a device whose gm_device_info.backend is `name` is simulated (reports). */
int backend_named_simulated(const char *name);
/* Every backend's name for messages: "sim or cuda"; quoted: "\"sim\" (the simulated GPU) or
 * \"cuda\"". */
void backend_names(char *buf, size_t n, int quoted);
/* Open the backend the settings name: device s->device (sim: of a simulated machine of
 * sim.devices devices). Returns EXIT_OK_ or EXIT_RUNTIME with a message. */
int backend_open(const cli_settings *s, gm_backend **out, char *err, size_t errlen);
/* The same, returning why: GM_ERR_INVALID_ARGUMENT (no such sim device) or the backend's status
 * (GM_ERR_NO_DEVICE without a driver or GPU, ...), with the message in err. */
gm_status backend_open_status(const cli_settings *s, gm_backend **out, char *err, size_t errlen);
/* How many devices the settings' backend has (sim: sim.devices; cuda: what the driver sees, 1
 * when it cannot tell: opening the device then says why). */
int backend_device_count(const cli_settings *s);
/* The backend and a pool on it with s->pool: GM_OK, or the failing call's status with err
 * saying why ("cannot open the cuda backend: ...", "cannot create the pool: ..."), nothing left
 * open. info (may be NULL): gm_backend_info of the device before the pool reserved anything.
 * refused (may be NULL): set when the pool refused the settings (invalid or unsupported). */
gm_status pool_open(const cli_settings *s, gm_backend **backend, gm_pool **pool,
                    gm_device_info *info, bool *refused, char *err, size_t errlen);

/* ---- JSON: the library's writer (src/json.h), to a FILE -------------------------------- */

static inline int jw_file_write(void *f, const char *data, size_t len)
{
    return fwrite(data, 1, len, (FILE *)f) == len ? 0 : -1;
}

/* Pretty-printed (two-space indentation) JSON to f; jw_finish writes what is buffered. */
static inline void jw_init_file(jw *w, FILE *f)
{
    jw_init(w, jw_file_write, f, false);
}

/* ---- replay.c -------------------------------------------------------------------------- */

typedef struct timeline_point {
    uint64_t op; /* ops replayed when sampled */
    uint64_t live, allocated, reserved;
    double frag_rate;
} timeline_point;

typedef struct replay_options {
    cli_settings settings;
    int strict;       /* the first allocation that fails (out of memory) is fatal */
    int progress;     /* draw a progress bar on stderr (the caller checked isatty) */
    int check;        /* gm_pool_check at every sample and at the end */
    int snapshot;     /* keep gm_pool_snapshot's JSON at the peak-live op */
    int summary;      /* keep gm_pool_summary's table at the peak-live op */
    unsigned max_warnings;
    double movable;    /* --movable: fraction of allocations made movable (0 = none) */
    int defrag;        /* --defrag on: a gm_defrag_maybe step in every time gap >= defrag_gap */
    double defrag_gap; /* seconds; 0 = DEFRAG_GAP_DEFAULT */
    int min_budget;    /* --min-budget: bisect reserve_limit for the smallest that runs */
    int single_stream; /* every op on the default stream (bench_replay: the host cost alone) */
} replay_options;

/* Device calls that reserve, create, map, unmap or release memory (GM_CALL_MEM_ALLOC through
 * GM_CALL_UNMAP): the "memory calls" of the reports. */
static inline uint64_t memory_calls_of(const gm_stats *s)
{
    uint64_t n = 0;
    for (int k = GM_CALL_MEM_ALLOC; k <= GM_CALL_UNMAP; k++)
        n += s->device_calls[k];
    return n;
}

/* Default --defrag-gap: a gap of 1 ms between two ops of the trace gets a defragmentation step. */
#define DEFRAG_GAP_DEFAULT 0.001

typedef struct replay_result {
    gm_device_info device;
    cli_settings resolved;   /* settings with every default filled in (gm_pool_config) */
    gm_stats final;          /* at the end of the replay */
    gm_stats at_peak;        /* right after the op where live bytes peak */
    uint64_t ops;            /* gm_alloc + gm_free calls made */
    uint64_t host_ns;        /* time inside those calls, in the timed pass (replay.c) */
    double ns_per_op;
    uint64_t timed_device_ns; /* device time of the timed pass's calls (part of host_ns) */
    uint64_t oom_count;      /* allocations that failed with GM_ERR_OUT_OF_MEMORY */
    uint64_t first_oom_line;
    char first_oom_message[512];
    uint64_t frees_skipped;  /* frees of allocations that had failed */
    double worst_frag_rate;  /* over the sampled timeline (docs/cli.md has the rule) */
    uint64_t worst_frag_op;
    uint64_t memory_calls_at_quarter; /* memory calls made by the end of the first quarter of
                                       * the ops: the rest are the steady state's */
    uint64_t recommended_initial_reserve; /* 0: none (it would raise peak reserved here) */
    uint64_t advice_peak_reserved; /* peak reserved of a run started with that advice */
    double ns_per_op_min, ns_per_op_max; /* fastest and slowest of the timed passes */
    unsigned timed_passes;   /* timed passes; ns_per_op and host_ns are the median one's */
    int streams_merged;      /* the backend cannot create streams: all ran on the default */
    timeline_point *timeline;
    size_t n_timeline;
    char *snapshot;          /* JSON text, or NULL */
    char *summary;           /* gm_pool_summary at the peak-live op (--summary), or NULL */
    size_t snapshot_len;
    /* Movable blocks and defragmentation: reported when defrag_shown (--movable > 0 or
     * --defrag on), so the default report stays as it was. */
    int defrag_shown;
    int defrag_enabled;
    double movable_fraction;
    double defrag_gap;
    uint64_t movable_allocs;   /* allocations made with gm_alloc_movable */
    uint64_t defrag_calls;     /* gm_defrag_maybe calls made in time gaps */
    uint64_t defrag_steps;     /* compaction passes (gm_stats: gap steps and OOM-ladder ones) */
    uint64_t defrag_blocks_moved, defrag_bytes_moved;
    uint64_t defrag_copy_ns;   /* gm_defrag_result.copy_time_ns summed over the gap steps */
    uint64_t defrag_host_ns;   /* host time inside gm_defrag_maybe (not in host_ns) */
    /* --min-budget (min_budget_done): the smallest reserve_limit found under which the trace
     * ran with no out-of-memory, and the replays the bisection took. */
    int min_budget_done;
    uint64_t min_budget_bytes;
    double min_budget_ratio; /* min_budget_bytes / final.peak_live_bytes */
    unsigned min_budget_replays;
} replay_result;

/* One pass of the engine on a fresh backend and pool (replay_open): the trace's pointer slots,
 * its streams, the options' movable blocks and defragmentation. replay_run makes its passes of
 * these; bench_replay times replay_step with its own clocks. */
typedef struct replay_session {
    const trace *t;
    const replay_options *o;
    replay_result *r;
    const backend_desc *desc; /* the settings' backend */
    gm_backend *backend;
    gm_pool *pool;
    gm_stream *streams;
    void **ptrs;         /* live pointer of each allocation slot; NULL when free or failed */
    gm_handle **handles; /* --movable: handle of each movable slot; NULL otherwise */
    double gap;          /* --defrag on: seconds of trace time that get a step; 0 = off */
    bool lagged;         /* sim.kernel_ns: work lags the host (follow_trace) */
    double trace_time;   /* lagged: the Time of the last op replayed */
    uint64_t defrag_failures;
    size_t sample_every;
    unsigned progress_shown; /* per mille drawn last */
    char *err;
    size_t errlen;
} replay_session;

/* Open a pass of t with o into *x, results into *r (zeroed; r->device, r->resolved filled).
 * Returns EXIT_OK_, or EXIT_RUNTIME / EXIT_USAGE (the pool rejected the config) with a message
 * in err and nothing left open. */
int replay_open(replay_session *x, const trace *t, const replay_options *o, replay_result *r,
                char *err, size_t errlen);
/* Replay ops [from, to) of the trace. Returns the index reached: `to`, or the op that failed
 * fatally (err says why). *excluded gets the host time spent in defragmentation steps. Counts
 * go to the session's result: ops, oom_count, frees_skipped, ... */
size_t replay_step(replay_session *x, size_t from, size_t to, uint64_t *excluded);
/* Destroy what replay_open made (the pool forced, its streams, the backend). */
void replay_close(replay_session *x);

/* Replay t. Returns EXIT_OK_, EXIT_RUNTIME or EXIT_USAGE (the pool rejected the config), with
 * a message in err on failure. */
int replay_run(const trace *t, const replay_options *o, replay_result *r, char *err,
               size_t errlen);
void replay_result_free(replay_result *r);
/* When allocations failed with out-of-memory, the note that flags the report's headline
 * ("INCOMPLETE: 678 allocations failed with out-of-memory; ...") in buf, and 1; else 0. */
int replay_incomplete_note(const replay_result *r, char *buf, size_t n);
/* calloc, with one byte of every page written: the page faults of a large table (calloc gives
 * untouched zero pages) come before a timed loop, not inside it, as with torch_replay.py's
 * pointer table, which is written when it is made. */
void *calloc_touched(size_t n, size_t size);

/* ---- reports --------------------------------------------------------------------------- */

/* `schema_version` of the JSON reports (replay, compare): raised when a key changes meaning or
 * goes away; new keys may appear without it. docs/cli.md lists the keys of each version. */
#define REPORT_SCHEMA_VERSION 1

void report_text(FILE *f, const trace *t, const replay_result *r);
void report_json(jw *w, const trace *t, const replay_result *r);
/* The members of report_json's object, for callers that add their own (compare). */
void report_json_fields(jw *w, const trace *t, const replay_result *r);
/* The config object of a JSON report: every setting used, defaults filled in. */
void report_json_config(jw *w, const cli_settings *resolved);
/* One page for n replays. Returns 0, or -1 if the file cannot be written. */
int report_html(const char *path, const trace *const *traces, const replay_result *const *results,
                size_t n);

/* ---- main.c: options shared by the subcommands ------------------------------------------ */

typedef struct cli_options {
    cli_settings settings;
    int json, strict, check, no_progress, summary;
    const char *html;
    const char **paths;
    size_t n_paths;
    double movable;    /* replay only: --movable, --defrag, --defrag-gap */
    int defrag;
    double defrag_gap;
    int device_given;  /* --device was on the command line */
    int min_budget;    /* replay only: --min-budget */
    int allow_oom;     /* replay only: --allow-oom (exit 0 when allocations failed) */
    double memory_tolerance; /* compare only: --memory-tolerance (the recommendation's) */
} cli_options;

/* Which options a subcommand accepts: --backend, --device and --set; --strategy and --segments; --json;
 * --html; --strict, --check, --no-progress and trace paths; --movable, --defrag and
 * --defrag-gap (and replay's other own options); --memory-tolerance. */
enum {
    OPT_DEVICE = 1, OPT_POOL = 2, OPT_JSON = 4, OPT_HTML = 8, OPT_TRACE = 16, OPT_DEFRAG = 32,
    OPT_COMPARE = 64
};

/* compare's default --memory-tolerance: rows within 5 % of the lowest reserved/live compete on
 * device time. */
#define MEMORY_TOLERANCE_DEFAULT 0.05

/* Parse argv (after the subcommand name). Returns -1 when it parsed, or an exit code to return
 * now (EXIT_OK_ after --help, EXIT_USAGE with a message printed). */
int cli_parse(int argc, char **argv, const char *command, unsigned accepted, const char *usage,
              cli_options *o);
/* Read one trace with the reporting rules the subcommands share. */
int cli_read_trace(const char *path, const cli_options *o, trace *t);

int cmd_replay(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_info(int argc, char **argv);

#endif /* GM_CLI_H */
