/*
 * The one JSON writer (json.c): gm_pool_snapshot's document and the CLI's reports. A streaming
 * writer of nested objects and arrays, commas handled by a per-level member count, two-space
 * indentation (or compact, no whitespace), written through a gm_write_fn in chunks of a
 * 4 KiB buffer. Strings are escaped per RFC 8259 (a byte that starts no valid UTF-8 sequence
 * becomes U+FFFD, so the document stays valid); non-finite doubles, which JSON cannot hold,
 * become null. After the sink fails once, nothing more is written and jw_finish says so.
 */
#ifndef GM_JSON_H
#define GM_JSON_H

#include "gpumem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { JW_MAX_DEPTH = 32, JW_BUFFER = 4096 };

typedef struct jw {
    gm_write_fn write;
    void *user;
    bool compact; /* no newlines or indentation */
    bool failed;  /* the sink refused a chunk: the rest is dropped */
    int depth;
    int count[JW_MAX_DEPTH]; /* members written at each open level */
    size_t len;
    char buf[JW_BUFFER];
} jw;

void jw_init(jw *w, gm_write_fn write, void *user, bool compact);
void jw_begin_object(jw *w, const char *key); /* key NULL inside arrays / at top level */
void jw_end_object(jw *w);
void jw_begin_array(jw *w, const char *key);
void jw_end_array(jw *w);
void jw_string(jw *w, const char *key, const char *value);
void jw_u64(jw *w, const char *key, uint64_t value);
void jw_i64(jw *w, const char *key, int64_t value);
void jw_bool(jw *w, const char *key, bool value);
void jw_double(jw *w, const char *key, double value); /* %.6g; non-finite: null */
void jw_hex(jw *w, const char *key, uintptr_t value); /* "0x1f" (an address, a stream) */
void jw_raw(jw *w, const char *key, const char *json); /* value already in JSON */
/* A final newline (pretty mode), then everything buffered to the sink. 0, or -1 when the sink
 * failed at any point. */
int jw_finish(jw *w);
/* `s` (len bytes) as a JSON string literal, quotes included; `html_safe` also escapes '<', '>'
 * and '&' so the text can sit inside an HTML <script>. */
void jw_put_string(jw *w, const char *s, size_t len, bool html_safe);

#endif
