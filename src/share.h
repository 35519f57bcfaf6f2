/*
 * Peer access and IPC exports (share.c; docs/multi-gpu.md): the parts other files call.
 */
#ifndef GM_SHARE_H
#define GM_SHARE_H

#include "types.h"

/* gm_free of a block flagged BLOCK_EXPORTED or BLOCK_HELD: defer it (or report a double free). */
gm_status share_free_exported_locked(gm_pool *pool, gm_block *b, gm_stream stream);
void share_fini(gm_pool *pool); /* at destroy: unexport everything */
void share_stats_locked(const gm_pool *pool, gm_stats *out);
size_t share_block_exports_locked(const gm_pool *pool, const gm_block *b);
/* The records agree with the blocks: `exported_in_spans` live blocks flagged exported. */
gm_status share_check_locked(gm_pool *pool, size_t exported_in_spans);

#endif
