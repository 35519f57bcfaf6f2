/*
 * gm_pool_sleep / gm_pool_wake (sleep.c; docs/sleep.md): the parts other files call.
 */
#ifndef GM_SLEEP_H
#define GM_SLEEP_H

#include "types.h"

/* gm_trim on a sleeping pool: release again what the sleep could not give back. */
gm_status sleep_trim_locked(gm_pool *pool);
/* At destruction: free the host copies (the pool lock held). Returns the releases that failed. */
uint64_t sleep_fini_locked(gm_pool *pool);
/* gm_pool_check's part while asleep: nothing may allocate, no old mapping remains, the free
 * bytes (`free_bytes`, on pages still mapped) fit in what is held, the saved blocks in the host
 * buffer. */
gm_status sleep_check_locked(gm_pool *pool, size_t free_bytes, size_t unreleased);
/* The reserve limit to apply now: `limit` awake, kept for the wake while asleep. */
void sleep_set_limit_locked(gm_pool *pool, size_t limit);

#endif
