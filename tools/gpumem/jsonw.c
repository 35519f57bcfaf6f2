/*
 * A small streaming JSON writer: nested objects and arrays, commas and two-space indentation
 * handled by a per-level member count. Strings are escaped per RFC 8259; non-finite doubles,
 * which JSON cannot hold, become null.
 */
#include "cli.h"

#include <math.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at s[0..len) (RFC 3629: no overlong forms, no
 * surrogates, at most U+10FFFF), or 0 if it is not one. */
static size_t utf8_sequence(const unsigned char *s, size_t len)
{
    size_t n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : 2;
    if (s[0] < 0xC2 || s[0] > 0xF4 || n > len)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F) ||
        (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))
        return 0;
    return n;
}

void json_write_string(FILE *f, const char *s, size_t len, int html_safe)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            /* JSON text is UTF-8: a byte that starts no valid sequence (a file name in another
             * encoding, say) becomes U+FFFD, so the document stays valid. */
            size_t n = utf8_sequence((const unsigned char *)s + i, len - i);
            if (n == 0) {
                fputs("\\ufffd", f);
                continue;
            }
            fwrite(s + i, 1, n, f);
            i += n - 1;
        } else if (c == '"' || c == '\\')
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
