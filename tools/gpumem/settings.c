/*
 * The --set keys are the library's (src/config.c: gm_config_keys, gm_sim_config_keys, parsed by
 * gm_config_parse_with_sim); this file adds the CLI's views of them: the help list, and each
 * value as JSON or as short text for tables. Key i counts the pool's keys first, then the
 * simulated device's ("sim.*").
 *
 * Sizes accept plain bytes or a number with K/M/G/T or KiB/MiB/GiB/TiB (both binary: K = 1024).
 */
#include "cli.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Key i of both tables, and whether it is the device's. */
static const gm_config_key *key_at(size_t i, int *sim)
{
    size_t n_pool;
    const gm_config_key *pool = gm_config_keys(&n_pool);
    *sim = i >= n_pool;
    return *sim ? &gm_sim_config_keys(NULL)[i - n_pool] : &pool[i];
}

int parse_size(const char *text, size_t *out)
{
    return gm_size_parse(text, out) == GM_OK ? 0 : -1;
}

int settings_set(cli_settings *s, const char *assignment, char *err, size_t errlen)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        snprintf(err, errlen, "--set wants KEY=VALUE, got \"%s\"", assignment);
        return -1;
    }
    cli_settings trial = *s;
    if (gm_config_parse_with_sim(&trial.pool, &trial.sim, assignment) != GM_OK) {
        const char *msg = gm_last_error(NULL); /* "gm_config_parse_with_sim: KEY: bad value" */
        const char *colon = strchr(msg, ':');
        snprintf(err, errlen, "--set %s", colon ? colon + 2 : msg);
        return -1;
    }
    trial.sim_devices = trial.sim.devices; /* the torch shim still reads sim_devices */
    *s = trial;
    return 0;
}

void settings_print_keys(FILE *f)
{
    for (size_t i = 0; i < settings_count(); i++) {
        int sim;
        const gm_config_key *k = key_at(i, &sim);
        fprintf(f, "  %-26s %s [default: %s]\n", k->name, k->help, k->default_text);
    }
}

size_t settings_count(void)
{
    size_t n_pool, n_sim;
    gm_config_keys(&n_pool);
    gm_sim_config_keys(&n_sim);
    return n_pool + n_sim;
}

const char *settings_key(size_t i)
{
    int sim;
    return key_at(i, &sim)->name;
}

int settings_is_sim(size_t i)
{
    int sim;
    key_at(i, &sim);
    return sim;
}

void format_bytes(uint64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, n, "%.2f %s", v, units[u]);
}

/* v as a JSON string literal in buf (quotes, backslashes and control characters escaped);
 * null when it does not fit. */
static void json_quote(const char *v, char *buf, size_t n)
{
    size_t used = 0;
    buf[used++] = '"';
    for (const unsigned char *c = (const unsigned char *)v; *c; c++) {
        char esc[8];
        int len = *c == '"' || *c == '\\' ? snprintf(esc, sizeof esc, "\\%c", *c)
                  : *c < 0x20             ? snprintf(esc, sizeof esc, "\\u%04x", *c)
                                          : snprintf(esc, sizeof esc, "%c", *c);
        if (used + (size_t)len + 2 > n) {
            snprintf(buf, n, "null");
            return;
        }
        memcpy(buf + used, esc, (size_t)len);
        used += (size_t)len;
    }
    buf[used++] = '"';
    buf[used] = 0;
}

static void value_of(size_t i, const cli_settings *s, char *buf, size_t n, int json)
{
    int sim;
    const gm_config_key *k = key_at(i, &sim);
    char v[1024]; /* the longest value: a path (gm_config.trace_file) */
    gm_status st = sim ? gm_sim_config_get(&s->sim, k->name, v, sizeof v)
                       : gm_config_get(&s->pool, k->name, v, sizeof v);
    if (st != GM_OK) {
        snprintf(buf, n, json ? "null" : "?");
        return;
    }
    static const char *const numbers[] = {"size", "unsigned", "u64", "fraction", "ratio", "bool"};
    int is_text = 1; /* enums and paths: JSON strings */
    for (size_t j = 0; j < sizeof numbers / sizeof numbers[0]; j++)
        is_text &= strcmp(k->type, numbers[j]) != 0;
    if (!json && strcmp(k->type, "size") == 0)
        format_bytes(strtoull(v, NULL, 10), buf, n);
    else if (json && is_text)
        json_quote(v, buf, n);
    else
        snprintf(buf, n, "%s", v);
}

void settings_value_json(size_t i, const cli_settings *s, char *buf, size_t n)
{
    value_of(i, s, buf, n, 1);
}

void settings_value_text(size_t i, const cli_settings *s, char *buf, size_t n)
{
    value_of(i, s, buf, n, 0);
}
