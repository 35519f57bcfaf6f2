/*
 * `gpumem`: subcommand dispatch, the options the subcommands share, and `gpumem replay`.
 *
 * Options may come before or after the trace paths, as `--opt VALUE` or `--opt=VALUE`; `--`
 * ends them. Exit codes: 0 done, 1 runtime error (bad trace under --strict, no device, pool
 * failure), 2 usage error (bad option or value; a config the pool rejects), 3 replay done but
 * allocations failed with out-of-memory (its figures cover part of the trace; --allow-oom: 0).
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { PROGRESS_MIN_OPS = 100000, MAX_WARNINGS = 5 };

static const char REPLAY_USAGE[] =
    "usage: gpumem replay [options] TRACE...\n"
    "\n"
    "Replay RMM-format allocation traces (CSV, plain or .gz; - reads standard input) against a gpumem pool on a\n"
    "simulated or real GPU and report memory and speed figures (docs/cli.md). Each trace\n"
    "runs twice, each time on a fresh pool: first sampled (every figure but the time), then\n"
    "timed, with nothing between the calls (host ns/op).\n"
    "\n"
    "options:\n"
    "  --backend sim|cuda   device to replay on (default sim: a simulated H200)\n"
    "  --device N           which device of the machine (default 0; sim: one of\n"
    "                       --set sim.devices=K simulated devices)\n"
    "  --strategy NAME      block placement strategy (same as --set strategy=NAME)\n"
    "  --segments plain|vmm|auto  segment mode (same as --set segments=MODE; auto: VMM\n"
    "                       where the device supports it, plain elsewhere)\n"
    "  --set KEY=VALUE      any pool or simulated-device setting (repeatable; keys below)\n"
    "  --json               print JSON instead of the text table (an array for several traces)\n"
    "  --html FILE          also write a self-contained HTML report with timelines and a\n"
    "                       segment map at peak live (its folder must exist)\n"
    "  --movable FRACTION   allocate this fraction (0..1, default 0) of the trace's allocations\n"
    "                       with gm_alloc_movable (chosen by a fixed hash of the allocation's\n"
    "                       index: the same ones every run) and free them with gm_free_handle\n"
    "  --defrag on|off      on: after an op followed by a time gap >= --defrag-gap in the\n"
    "                       trace's Time column, run gm_defrag_maybe (default budget) on that\n"
    "                       op's stream (default off; threshold: --set defrag_threshold=X)\n"
    "  --defrag-gap SECONDS the gap that gets a defragmentation step (default 0.001 = 1 ms)\n"
    "  --min-budget         also find the smallest reserve_limit under which the trace runs\n"
    "                       with no out-of-memory (bisection over timed replays, to 2 MiB),\n"
    "                       reported as a multiple of peak live\n"
    "  --summary            also print the pool's gm_pool_summary table at peak live\n"
    "  --allow-oom          exit 0 even when allocations failed with out-of-memory (the\n"
    "                       report flags its headline INCOMPLETE either way; default: exit 3)\n"
    "  --strict             stop at the first bad trace line or unsatisfiable allocation\n"
    "  --check              run gm_pool_check at every timeline sample (slow; for debugging)\n"
    "  --no-progress        no progress bar (drawn on a terminal for traces over 100k ops)\n"
    "  -h, --help           this help\n";

static const char MAIN_USAGE[] =
    "usage: gpumem COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  replay TRACE...   replay allocation traces and report fragmentation and speed\n"
    "  compare TRACE...  replay under every strategy / segment mode / release policy\n"
    "  info              describe the simulated or real device\n"
    "  help COMMAND      help for one command\n"
    "\n"
    "options:\n"
    "  --version         print the version and exit\n"
    "  -h, --help        this help\n"
    "\n"
    "gpumem COMMAND --help shows the options; docs/cli.md has everything.\n";

static int usage_error(const char *command, const char *fmt, const char *arg)
{
    fputs("gpumem: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see gpumem %s --help)\n", command);
    return EXIT_USAGE;
}

static void print_help(const char *usage, unsigned accepted)
{
    fputs(usage, stdout);
    if (accepted & OPT_DEVICE) {
        puts("\n--set keys (sizes: bytes, or K/M/G/T or KiB/MiB/GiB/TiB, all binary;"
             " 0 = default):");
        settings_print_keys(stdout);
    }
}

/* The value of option `name` at argv[*i]: "--name=VALUE" or "--name VALUE". NULL if absent. */
static const char *option_value(int argc, char **argv, int *i, const char *name, int *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != 0)
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int flag_option(const char *a, unsigned accepted, cli_options *o)
{
    if ((accepted & OPT_JSON) && strcmp(a, "--json") == 0)
        return o->json = 1;
    if ((accepted & OPT_TRACE) && strcmp(a, "--strict") == 0)
        return o->strict = 1;
    if ((accepted & OPT_TRACE) && strcmp(a, "--check") == 0)
        return o->check = 1;
    if ((accepted & OPT_HTML) && strcmp(a, "--summary") == 0)
        return o->summary = 1;
    if ((accepted & OPT_TRACE) && strcmp(a, "--no-progress") == 0)
        return o->no_progress = 1;
    if ((accepted & OPT_DEFRAG) && strcmp(a, "--min-budget") == 0) /* replay only */
        return o->min_budget = 1;
    if ((accepted & OPT_DEFRAG) && strcmp(a, "--allow-oom") == 0) /* replay only */
        return o->allow_oom = 1;
    return 0;
}

/* --movable, --defrag, --defrag-gap. Returns 1 if consumed, 0 if not one of them, or an exit
 * code + 2 on error. */
static int defrag_option(int argc, char **argv, int *i, const char *command, cli_options *o)
{
    static const char *const names[] = {"--movable", "--defrag", "--defrag-gap"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        int missing = 0;
        const char *v = option_value(argc, argv, i, names[k], &missing);
        if (missing)
            return 2 + usage_error(command, "%s needs a value", names[k]);
        if (!v)
            continue;
        if (k == 1) {
            if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
                return 2 + usage_error(command, "--defrag: \"%s\" is not on or off", v);
            o->defrag = strcmp(v, "on") == 0;
            return 1;
        }
        char *end;
        double x = strtod(v, &end);
        if (end == v || *end || !(k == 0 ? x >= 0 && x <= 1 : x > 0 && x < 1e9))
            return 2 + usage_error(command, k == 0 ? "--movable: \"%s\" is not a number from 0 "
                                   "to 1" : "--defrag-gap: \"%s\" is not a number of seconds "
                                   "above 0", v);
        if (k == 0)
            o->movable = x;
        else
            o->defrag_gap = x;
        return 1;
    }
    return 0;
}

/* compare's --memory-tolerance FRACTION. Returns 1 if consumed, 0 if not it, or an exit code + 2
 * on error. */
static int tolerance_option(int argc, char **argv, int *i, const char *command, cli_options *o)
{
    int missing = 0;
    const char *v = option_value(argc, argv, i, "--memory-tolerance", &missing);
    if (missing)
        return 2 + usage_error(command, "%s needs a value", "--memory-tolerance");
    if (!v)
        return 0;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 0 && x <= 10))
        return 2 + usage_error(command, "--memory-tolerance: \"%s\" is not a fraction from 0 "
                               "to 10 (0.05 = within 5 %% of the lowest reserved/live)", v);
    o->memory_tolerance = x;
    return 1;
}

/* A value option. Returns 1 if consumed, 0 if not this kind, or an exit code + 2 on error. */
static int value_option(int argc, char **argv, int *i, unsigned accepted, const char *command,
                        cli_options *o)
{
    static const struct {
        const char *name;
        unsigned needs;
        const char *key; /* --set key it stands for; NULL: handled here */
    } table[] = {{"--backend", OPT_DEVICE, NULL},
                 {"--device", OPT_DEVICE, NULL},
                 {"--set", OPT_DEVICE, ""},
                 {"--strategy", OPT_POOL, "strategy"},
                 {"--segments", OPT_POOL, "segments"},
                 {"--html", OPT_HTML, NULL}};
    for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
        if (!(accepted & table[k].needs))
            continue;
        int missing = 0;
        const char *v = option_value(argc, argv, i, table[k].name, &missing);
        if (missing)
            return 2 + usage_error(command, "%s needs a value", table[k].name);
        if (!v)
            continue;
        if (strcmp(table[k].name, "--html") == 0) {
            o->html = v;
        } else if (strcmp(table[k].name, "--backend") == 0) {
            if (backend_find(v, &o->settings.backend) != 0) {
                char what[256], names[128];
                backend_names(names, sizeof names, 0);
                snprintf(what, sizeof what, "--backend: \"%.64s\" is not %s", v, names);
                return 2 + usage_error(command, "%s", what);
            }
        } else if (strcmp(table[k].name, "--device") == 0) {
            char *end;
            long d = strtol(v, &end, 10);
            if (!*v || *end || d < 0 || d > 63)
                return 2 + usage_error(command, "--device: \"%s\" is not a device number "
                                       "0..63", v);
            o->settings.device = (int)d;
            o->device_given = 1;
        } else {
            char assignment[512], err[1024];
            if (*table[k].key)
                snprintf(assignment, sizeof assignment, "%s=%s", table[k].key, v);
            else
                snprintf(assignment, sizeof assignment, "%s", v);
            if (settings_set(&o->settings, assignment, err, sizeof err) != 0)
                return 2 + usage_error(command, "%s", err);
        }
        return 1;
    }
    return 0;
}

int cli_parse(int argc, char **argv, const char *command, unsigned accepted, const char *usage,
              cli_options *o)
{
    memset(o, 0, sizeof *o);
    o->memory_tolerance = MEMORY_TOLERANCE_DEFAULT;
    o->paths = calloc((size_t)argc + 1, sizeof *o->paths);
    if (!o->paths)
        return EXIT_RUNTIME;
    int options_done = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && a[0] == '-' && a[1] != 0) {
            if (strcmp(a, "--") == 0) {
                options_done = 1;
                continue;
            }
            if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                print_help(usage, accepted);
                return EXIT_OK_;
            }
            if (flag_option(a, accepted, o))
                continue;
            int rc = value_option(argc, argv, &i, accepted, command, o);
            if (rc == 0 && (accepted & OPT_DEFRAG))
                rc = defrag_option(argc, argv, &i, command, o);
            if (rc == 0 && (accepted & OPT_COMPARE))
                rc = tolerance_option(argc, argv, &i, command, o);
            if (rc >= 2)
                return rc - 2;
            if (rc == 1)
                continue;
            return usage_error(command, "unknown option %s", a);
        }
        if (!(accepted & OPT_TRACE))
            return usage_error(command, "unexpected argument %s", a);
        o->paths[o->n_paths++] = a;
    }
    if ((accepted & OPT_TRACE) && o->n_paths == 0)
        return usage_error(command, "%s", "no trace given");
    return -1;
}

int cli_read_trace(const char *path, const cli_options *o, trace *t)
{
    char err[1024];
    trace_read_options ro = {.strict = o->strict, .warn = stderr, .max_warnings = MAX_WARNINGS};
    if (trace_read(path, &ro, t, err, sizeof err) != 0) {
        fprintf(stderr, "gpumem: error: %s\n", err);
        return EXIT_RUNTIME;
    }
    for (int p = 0; p < TRACE_PROBLEM_COUNT; p++)
        if (t->problems[p] > MAX_WARNINGS)
            fprintf(stderr, "gpumem: warning: %s: %llu %s in all (first at line %llu)\n", path,
                    (unsigned long long)t->problems[p], trace_problem_str((trace_problem)p),
                    (unsigned long long)t->first_problem_line[p]);
    if (t->n_ops == 0) { /* an all-zero report would read as a result */
        fprintf(stderr, "gpumem: error: %s: no allocations to replay (%llu line%s read)\n",
                t->path, (unsigned long long)t->lines, t->lines == 1 ? "" : "s");
        trace_free(t);
        return EXIT_RUNTIME;
    }
    return EXIT_OK_;
}

/* Whether the folder `path` would be written in exists and is writable: checked before a
 * replay, so that a typo in --html fails at once, not after the whole replay. */
static int output_folder_ok(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof dir)
        return 0;
    memcpy(dir, path, n);
    strcpy(dir + n, n ? "" : (slash ? "/" : "."));
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && access(dir, W_OK | X_OK) == 0;
}

static int write_outputs(const cli_options *o, trace *traces, replay_result *results, size_t n)
{
    if (o->json) {
        jw w;
        jw_init_file(&w, stdout);
        if (n > 1)
            jw_begin_array(&w, NULL);
        for (size_t i = 0; i < n; i++)
            report_json(&w, &traces[i], &results[i]);
        if (n > 1)
            jw_end_array(&w);
        jw_finish(&w);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (i)
                putchar('\n');
            report_text(stdout, &traces[i], &results[i]);
        }
    }
    if (o->html) {
        const trace **tp = calloc(n, sizeof *tp);
        const replay_result **rp = calloc(n, sizeof *rp);
        int failed = !tp || !rp;
        for (size_t i = 0; !failed && i < n; i++) {
            tp[i] = &traces[i];
            rp[i] = &results[i];
        }
        failed = failed || report_html(o->html, tp, rp, n) != 0;
        free(tp);
        free(rp);
        if (failed) {
            fprintf(stderr, "gpumem: error: cannot write %s\n", o->html);
            return EXIT_RUNTIME;
        }
        fprintf(stderr, "gpumem: wrote %s\n", o->html);
    }
    return fflush(stdout) == 0 ? EXIT_OK_ : EXIT_RUNTIME;
}

int cmd_replay(int argc, char **argv)
{
    cli_options o;
    unsigned accepted = OPT_DEVICE | OPT_POOL | OPT_JSON | OPT_HTML | OPT_TRACE | OPT_DEFRAG;
    int rc = cli_parse(argc, argv, "replay", accepted, REPLAY_USAGE, &o);
    if (rc >= 0) {
        free(o.paths);
        return rc;
    }
    if (o.html && !output_folder_ok(o.html)) {
        fprintf(stderr, "gpumem: error: --html %s: cannot write there (its folder does not "
                "exist or is not writable)\n", o.html);
        free(o.paths);
        return EXIT_RUNTIME;
    }
    trace *traces = calloc(o.n_paths, sizeof *traces);
    replay_result *results = calloc(o.n_paths, sizeof *results);
    size_t done = 0;
    rc = traces && results ? EXIT_OK_ : EXIT_RUNTIME;
    for (; rc == EXIT_OK_ && done < o.n_paths; done++) {
        rc = cli_read_trace(o.paths[done], &o, &traces[done]);
        if (rc != EXIT_OK_)
            break;
        char err[1024];
        replay_options ro = {.settings = o.settings, .strict = o.strict, .check = o.check,
                             .snapshot = o.html != NULL, .summary = o.summary,
                             .max_warnings = MAX_WARNINGS,
                             .movable = o.movable, .defrag = o.defrag,
                             .defrag_gap = o.defrag_gap, .min_budget = o.min_budget};
        ro.progress = !o.no_progress && isatty(STDERR_FILENO) &&
                      traces[done].n_ops > PROGRESS_MIN_OPS;
        rc = replay_run(&traces[done], &ro, &results[done], err, sizeof err);
        if (rc != EXIT_OK_) {
            fprintf(stderr, "gpumem: error: %s\n", err);
            trace_free(&traces[done]);
        }
    }
    if (rc == EXIT_OK_)
        rc = write_outputs(&o, traces, results, o.n_paths);
    for (size_t i = 0; rc == EXIT_OK_ && i < o.n_paths; i++)
        if (results[i].oom_count && !o.allow_oom) /* a partial replay is not a result */
            rc = EXIT_OOM;
    for (size_t i = 0; rc == EXIT_OOM && i < o.n_paths; i++)
        if (results[i].oom_count)
            fprintf(stderr, "gpumem: %s: %llu allocation%s failed with out-of-memory: the "
                    "report covers only the rest (exit 3; --allow-oom: exit 0)\n",
                    traces[i].path, (unsigned long long)results[i].oom_count,
                    results[i].oom_count == 1 ? "" : "s");
    for (size_t i = 0; i < done && traces && results; i++) {
        trace_free(&traces[i]);
        replay_result_free(&results[i]);
    }
    free(traces);
    free(results);
    free(o.paths);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {{"replay", cmd_replay}, {"compare", cmd_compare}, {"info", cmd_info}};
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(MAIN_USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : EXIT_OK_;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("gpumem %s\n", gm_version());
        return EXIT_OK_;
    }
    int help = strcmp(argv[1], "help") == 0;
    if (help && argc < 3) {
        fputs(MAIN_USAGE, stdout);
        return EXIT_OK_;
    }
    const char *name = argv[help ? 2 : 1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) != 0)
            continue;
        if (help) {
            char help_flag[] = "--help";
            char *args[] = {help_flag, NULL};
            return commands[i].run(1, args);
        }
        return commands[i].run(argc - 2, argv + 2);
    }
    fprintf(stderr, "gpumem: unknown command \"%s\"\n\n%s", name, MAIN_USAGE);
    return EXIT_USAGE;
}
