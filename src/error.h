/*
 * Reporting failures (error.c): a failure's message, gm_last_error, the error callback, the
 * pool's unlock that publishes them.
 */
#ifndef GM_ERROR_H
#define GM_ERROR_H

#include "types.h"

/* Record the message of a failure of the call in progress; returns st. */
gm_status pool_fail_locked(gm_pool *pool, gm_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
gm_status pool_unlock(gm_pool *pool, gm_status st); /* unlock; publish a failure */
gm_status fail_no_pool(gm_status st, const char *fn, const char *what);
/* GM_ERR_INVALID_ARGUMENT for a public call's bad arguments: recorded by the pool when there is
 * one (gm_last_error(pool), the error callback), else as fail_no_pool. */
gm_status fail_arg(gm_pool *pool, const char *fn, const char *what);
/* "1.50 GiB" (binary units; whole bytes below 1 KiB) into buf: messages and gm_pool_summary. */
void pool_format_bytes(char *buf, size_t len, size_t bytes);
/* The pool is going away: this thread's message no longer names it. */
void error_forget_pool(const gm_pool *pool);

#endif
