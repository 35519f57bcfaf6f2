/*
 * A small streaming JSON writer: nested objects and arrays, commas and two-space indentation
 * handled by a per-level member count. Strings are escaped per RFC 8259; non-finite doubles,
 * which JSON cannot hold, become null.
 */
#include "cli.h"

#include <math.h>
#include <string.h>

void json_write_string(FILE *f, const char *s, size_t len, int html_safe)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || (html_safe && (c == '<' || c == '>' || c == '&')))
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void jw_init(jw *w, FILE *f)
{
    memset(w, 0, sizeof *w);
    w->f = f;
}

/* Comma, newline, indentation and "key": before a new member. */
static void member(jw *w, const char *key)
{
    if (w->depth > 0) {
        fputs(w->count[w->depth] ? ",\n" : "\n", w->f);
        w->count[w->depth]++;
        fprintf(w->f, "%*s", 2 * w->depth, "");
    } else if (w->count[0]++) {
        fputc('\n', w->f);
    }
    if (key) {
        json_write_string(w->f, key, strlen(key), 0);
        fputs(": ", w->f);
    }
}

static void open_level(jw *w, const char *key, char bracket)
{
    member(w, key);
    fputc(bracket, w->f);
    if (w->depth + 1 < JW_MAX_DEPTH)
        w->count[++w->depth] = 0;
}

static void close_level(jw *w, char bracket)
{
    int had = w->count[w->depth];
    if (w->depth > 0)
        w->depth--;
    if (had)
        fprintf(w->f, "\n%*s", 2 * w->depth, "");
    fputc(bracket, w->f);
}

void jw_begin_object(jw *w, const char *key) { open_level(w, key, '{'); }
void jw_end_object(jw *w) { close_level(w, '}'); }
void jw_begin_array(jw *w, const char *key) { open_level(w, key, '['); }
void jw_end_array(jw *w) { close_level(w, ']'); }

void jw_string(jw *w, const char *key, const char *value)
{
    member(w, key);
    json_write_string(w->f, value, strlen(value), 0);
}

void jw_u64(jw *w, const char *key, uint64_t value)
{
    member(w, key);
    fprintf(w->f, "%llu", (unsigned long long)value);
}

void jw_double(jw *w, const char *key, double value)
{
    member(w, key);
    if (isfinite(value))
        fprintf(w->f, "%.6g", value);
    else
        fputs("null", w->f);
}

void jw_raw(jw *w, const char *key, const char *json)
{
    member(w, key);
    fputs(json, w->f);
}

void jw_finish(jw *w)
{
    fputc('\n', w->f);
}
