/*
 * The mix of blocks the defragmentation integrity tests compact (tests/test_defrag.c on the
 * sim, tests/test_gpu_defrag.c on the device): by index, plain blocks (never move), pinned
 * movable blocks (never move), movable blocks another stream used (move, ordered by events)
 * and plain movable blocks. Each test fills and checks the bytes its own way.
 */
#ifndef GM_TEST_DEFRAG_MIX_H
#define GM_TEST_DEFRAG_MIX_H

#include "check.h"

#include <stdbool.h>

typedef struct mix_block {
    gm_handle *h; /* movable, or NULL */
    void *plain;  /* plain block, or NULL */
    void *addr;   /* address as last seen */
    size_t size;  /* 0 = no block */
    unsigned id;
    uint64_t sum; /* the device test's checksum */
    bool pinned, recorded;
} mix_block;

/* Block i of the mix: `size` bytes on `stream`; every `record_every`-th movable block that is
 * not pinned is recorded on stream `other`. */
static inline void mix_alloc(gm_pool *p, mix_block *b, unsigned i, size_t size, gm_stream stream,
                             gm_stream other, unsigned record_every)
{
    *b = (mix_block){.size = size, .id = i + 1};
    if (i % 7 == 3) {
        REQUIRE_OK(gm_alloc(p, size, stream, &b->plain));
        b->addr = b->plain;
        return;
    }
    REQUIRE_OK(gm_alloc_movable(p, size, stream, &b->h));
    REQUIRE_OK(gm_handle_ptr(p, b->h, &b->addr));
    if (i % 11 == 2) {
        CHECK_OK(gm_pin(p, b->h));
        CHECK_OK(gm_pin(p, b->h)); /* counted: two pins, one unpin stays pinned */
        CHECK_OK(gm_unpin(p, b->h));
        b->pinned = true;
    } else if (i % record_every == 4) {
        CHECK_OK(gm_record_stream(p, b->addr, other));
        b->recorded = true;
    }
}

/* The block's address now; if it moved, check that it may have and note it. Returns whether it
 * moved. */
static inline bool mix_moved(gm_pool *p, mix_block *b)
{
    void *now = b->plain;
    if (b->h)
        REQUIRE_OK(gm_handle_ptr(p, b->h, &now));
    if (now == b->addr)
        return false;
    CHECK(b->h && !b->pinned); /* only these ever move */
    CHECK_LT_U((uintptr_t)now, (uintptr_t)b->addr); /* always downwards */
    b->addr = now;
    return true;
}

static inline void mix_free(gm_pool *p, mix_block *b, gm_stream stream)
{
    if (b->h)
        CHECK_OK(gm_free_handle(p, b->h, stream));
    else if (b->plain)
        CHECK_OK(gm_free(p, b->plain, stream));
    *b = (mix_block){0};
}

#endif
