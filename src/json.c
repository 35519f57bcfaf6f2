/*
 * The one JSON writer (json.h has the contract).
 */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void flush(jw *w)
{
    if (w->len && !w->failed && w->write(w->user, w->buf, w->len) != 0)
        w->failed = true;
    w->len = 0;
}

static void put(jw *w, const char *s, size_t n)
{
    while (n) {
        if (w->len == sizeof w->buf)
            flush(w);
        size_t k = sizeof w->buf - w->len < n ? sizeof w->buf - w->len : n;
        memcpy(w->buf + w->len, s, k);
        w->len += k;
        s += k;
        n -= k;
    }
}

static void puts_(jw *w, const char *s)
{
    put(w, s, strlen(s));
}

static void putc_(jw *w, char c)
{
    put(w, &c, 1);
}

static void indent(jw *w)
{
    putc_(w, '\n');
    for (int i = 0; i < w->depth; i++)
        put(w, "  ", 2);
}

void jw_init(jw *w, gm_write_fn write, void *user, bool compact)
{
    memset(w, 0, offsetof(jw, buf));
    w->write = write;
    w->user = user;
    w->compact = compact;
}

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

void jw_put_string(jw *w, const char *s, size_t len, bool html_safe)
{
    putc_(w, '"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c >= 0x80) {
            /* JSON text is UTF-8: a byte that starts no valid sequence (a file name in another
             * encoding, say) becomes U+FFFD, so the document stays valid. */
            size_t n = utf8_sequence((const unsigned char *)s + i, len - i);
            if (n == 0) {
                puts_(w, "\\ufffd");
                continue;
            }
            put(w, s + i, n);
            i += n - 1;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(w, esc, 2);
        } else if (c == '\n') {
            puts_(w, "\\n");
        } else if (c == '\t') {
            puts_(w, "\\t");
        } else if (c < 0x20 || (html_safe && (c == '<' || c == '>' || c == '&'))) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_(w, esc);
        } else {
            putc_(w, (char)c);
        }
    }
    putc_(w, '"');
}

/* Comma, newline, indentation and "key": before a new member. */
static void member(jw *w, const char *key)
{
    if (w->depth > 0) {
        if (w->count[w->depth]++)
            putc_(w, ',');
        if (!w->compact)
            indent(w);
    } else if (w->count[0]++ && !w->compact) {
        putc_(w, '\n');
    }
    if (key) {
        jw_put_string(w, key, strlen(key), false);
        puts_(w, w->compact ? ":" : ": ");
    }
}

static void open_level(jw *w, const char *key, char bracket)
{
    member(w, key);
    putc_(w, bracket);
    if (w->depth + 1 < JW_MAX_DEPTH)
        w->count[++w->depth] = 0;
}

static void close_level(jw *w, char bracket)
{
    int had = w->count[w->depth];
    if (w->depth > 0)
        w->depth--;
    if (had && !w->compact)
        indent(w);
    putc_(w, bracket);
}

void jw_begin_object(jw *w, const char *key) { open_level(w, key, '{'); }
void jw_end_object(jw *w) { close_level(w, '}'); }
void jw_begin_array(jw *w, const char *key) { open_level(w, key, '['); }
void jw_end_array(jw *w) { close_level(w, ']'); }

void jw_string(jw *w, const char *key, const char *value)
{
    member(w, key);
    jw_put_string(w, value, strlen(value), false);
}

static void number(jw *w, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void number(jw *w, const char *key, const char *fmt, ...)
{
    char b[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    member(w, key);
    put(w, b, n > 0 ? (size_t)n : 0);
}

void jw_u64(jw *w, const char *key, uint64_t value) { number(w, key, "%" PRIu64, value); }
void jw_i64(jw *w, const char *key, int64_t value) { number(w, key, "%" PRId64, value); }
void jw_hex(jw *w, const char *key, uintptr_t value) { number(w, key, "\"0x%" PRIxPTR "\"", value); }

void jw_bool(jw *w, const char *key, bool value)
{
    member(w, key);
    puts_(w, value ? "true" : "false");
}

void jw_double(jw *w, const char *key, double value)
{
    if (isfinite(value))
        number(w, key, "%.6g", value);
    else
        jw_raw(w, key, "null");
}

void jw_raw(jw *w, const char *key, const char *json)
{
    member(w, key);
    puts_(w, json);
}

int jw_finish(jw *w)
{
    putc_(w, '\n');
    flush(w);
    return w->failed ? -1 : 0;
}
