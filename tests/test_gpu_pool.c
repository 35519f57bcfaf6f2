/*
 * The pool on a real GPU (label gpu; exits 77, reported as skipped, without a device).
 *
 *   conformance   every strategy x segment mode: many sizes at once, each block filled on the
 *                 device with its own byte and read back, so blocks that overlapped in device
 *                 memory would show; everything freed and trimmed, nothing left on the device
 *   random        a seeded model-based run on device memory: each block is filled on the
 *                 device at alloc and every byte is checked at free
 *   cross-stream  a block freed on stream A while work queued on A still writes it (a memset
 *                 held back behind a host function) is not handed to stream B until that work
 *                 has run; afterwards its bytes are the memset's
 *   vmm           pages mapped on demand, unmapped by gm_trim, mapped again, bytes intact
 *   sleep         blocks tagged "weights" keep their bytes and addresses through gm_pool_sleep /
 *                 gm_pool_wake, the others' memory too goes back to the device meanwhile, and
 *                 allocation is refused; twice (the second reuses the pinned buffer)
 *   oom           allocate until the device is full, get GM_ERR_OUT_OF_MEMORY with its message,
 *                 recover, and go on
 */
#include "check.h"
#include "conformance.h"
#include "cuda_oracle.h"

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

static void fill(gm_backend *be, void *p, size_t size, unsigned char v)
{
    device_fill(be, (uintptr_t)p, size, v);
}

static void conformance(gm_backend *be)
{
    for (size_t c = 0; c < conf_case_count(); c++) {
        const conf_case *cc = &conf_cases[c];
        gm_pool *p = NULL;
        REQUIRE_OK(gm_pool_create(be, &cc->cfg, &p));
        enum { N = 40 };
        void *ptr[N];
        size_t size[N];
        unsigned long before = check_failed_;
        for (int i = 0; i < N; i++) {
            size[i] = ((size_t)1 << (9 + i % 17)) + (size_t)i * 4099;
            CHECK_OK(gm_alloc(p, size[i], NULL, &ptr[i]));
            CHECK_EQ_U((uintptr_t)ptr[i] % GM_ALIGNMENT, 0);
            fill(be, ptr[i], size[i], (unsigned char)(i + 1));
        }
        for (int i = 0; i < N; i++)
            CHECK(device_bytes_are((uintptr_t)ptr[i], size[i], (unsigned char)(i + 1)));
        for (int i = 0; i < N; i++)
            CHECK_OK(gm_free(p, ptr[i], NULL));
        CHECK_OK(gm_pool_check(p));
        CHECK_OK(gm_trim(p, 0));
        gm_stats st;
        CHECK_OK(gm_pool_stats(p, &st));
        CHECK_EQ_U(st.reserved_bytes, 0);
        CHECK_OK(gm_pool_destroy(p));
        printf("conformance %-28s %s\n", cc->name, check_failed_ == before ? "ok" : "FAILED");
    }
}

static void random_run(gm_backend *be, gm_segments seg, uint64_t seed)
{
    gm_config cfg = {0};
    cfg.segments = seg;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    enum { LIVE = 64, OPS = 6000 };
    void *ptr[LIVE] = {0};
    size_t size[LIVE] = {0};
    unsigned char val[LIVE] = {0};
    uint64_t rng = seed;
    unsigned long before = check_failed_;
    for (int op = 0; op < OPS && check_failed_ == before; op++) {
        int i = (int)(check_rand(&rng) % LIVE);
        if (ptr[i]) {
            CHECK(device_bytes_are((uintptr_t)ptr[i], size[i], val[i]));
            CHECK_OK(gm_free(p, ptr[i], NULL));
            ptr[i] = NULL;
        } else {
            uint64_t r = check_rand(&rng);
            size[i] = 1 + (size_t)(r % (r & 1 ? 64 * KiB : 6 * MiB));
            val[i] = (unsigned char)(check_rand(&rng) | 1u);
            CHECK_OK(gm_alloc(p, size[i], NULL, &ptr[i]));
            fill(be, ptr[i], size[i], val[i]);
        }
        if (op % 500 == 0)
            CHECK_OK(gm_pool_check(p));
    }
    for (int i = 0; i < LIVE; i++)
        if (ptr[i]) {
            CHECK(device_bytes_are((uintptr_t)ptr[i], size[i], val[i]));
            CHECK_OK(gm_free(p, ptr[i], NULL));
        }
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    printf("random %s seed %llu: %s\n", gm_segments_str(seg), (unsigned long long)seed,
           check_failed_ == before ? "ok" : "FAILED");
}

static void cross_stream(gm_backend *be)
{
    gm_stream a = oracle_stream_create(), b = oracle_stream_create();
    gm_config cfg = {0};
    cfg.thread_cache_blocks = GM_THREAD_CACHE_OFF; /* the pool's cache serves other streams */
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    const size_t n = 4 * MiB;
    void *blk, *keep, *other;
    CHECK_OK(gm_alloc(p, n, a, &blk));
    CHECK_OK(gm_alloc(p, n, a, &keep)); /* keeps the segment */
    fill(be, blk, n, 0x11);
    hold_stream(a); /* a "long kernel": everything queued on a after this waits */
    oracle_push();
    REQUIRE(cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)blk, 0xAB, n, (CUstream)(void *)a) == 0);
    oracle_pop();
    CHECK_OK(gm_free(p, blk, a)); /* freed while work on a still writes it */
    CHECK_OK(gm_alloc(p, n, b, &other));
    CHECK(other != blk); /* not handed to b before a's work has run */
    fill(be, other, n, 0x22);
    atomic_store(&gate_open, 1);
    oracle_push();
    REQUIRE(cu.cuStreamSynchronize((CUstream)(void *)a) == 0);
    oracle_pop();
    CHECK(device_bytes_are((uintptr_t)blk, n, 0xAB)); /* the queued write landed, untouched */
    CHECK(device_bytes_are((uintptr_t)other, n, 0x22));
    void *later;
    CHECK_OK(gm_alloc(p, n, b, &later)); /* a's work is done: blk may go to b now */
    CHECK(later == blk);
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.cross_stream_reuses, 1);
    CHECK_OK(gm_free(p, later, b));
    CHECK_OK(gm_free(p, other, b));
    CHECK_OK(gm_free(p, keep, a));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    oracle_stream_destroy(a);
    oracle_stream_destroy(b);
}

static void vmm(gm_backend *be)
{
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.cache_disable = 1;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    void *x, *y;
    CHECK_OK(gm_alloc(p, 40 * MiB, NULL, &x));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &y));
    fill(be, x, 40 * MiB, 0x5A);
    fill(be, y, 3 * MiB, 0xA5);
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 40 * MiB + 4 * MiB);
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_trim(p, 0)); /* x's pages unmapped; y's stay */
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 4 * MiB);
    CHECK_GE_U(st.device_calls[GM_CALL_UNMAP], 2); /* x's 20 pages: runs of at most 16 */
    CHECK(device_bytes_are((uintptr_t)y, 3 * MiB, 0xA5));
    CHECK_OK(gm_alloc(p, 40 * MiB, NULL, &x)); /* mapped again */
    fill(be, x, 40 * MiB, 0x3C);
    CHECK(device_bytes_are((uintptr_t)x, 40 * MiB, 0x3C));
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_free(p, y, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
}

static size_t device_free_bytes(gm_backend *be)
{
    size_t fr = 0, total = 0;
    REQUIRE_OK(be->ops->mem_info(be, &fr, &total));
    return fr;
}

static void sleep_wake(gm_backend *be)
{
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    const size_t wsize[] = {80 * MiB, 3 * MiB, 4 * KiB};
    void *w[3], *kv[2];
    REQUIRE_OK(gm_tag_push("weights"));
    for (int i = 0; i < 3; i++)
        REQUIRE_OK(gm_alloc(p, wsize[i], NULL, &w[i]));
    REQUIRE_OK(gm_tag_pop());
    for (int i = 0; i < 2; i++)
        REQUIRE_OK(gm_alloc(p, 64 * MiB, NULL, &kv[i]));
    for (int i = 0; i < 3; i++)
        fill(be, w[i], wsize[i], (unsigned char)(0x11 * (i + 1)));
    for (int round = 0; round < 2; round++) {
        gm_stats st;
        CHECK_OK(gm_pool_stats(p, &st));
        size_t reserved = st.reserved_bytes, free0 = device_free_bytes(be);
        CHECK_OK(gm_pool_sleep(p, "weights"));
        CHECK_GE_U(device_free_bytes(be) - free0, reserved);
        CHECK_OK(gm_pool_stats(p, &st));
        CHECK(st.asleep);
        CHECK_EQ_U(st.reserved_bytes, 0);
        void *x = NULL;
        CHECK_STATUS(gm_alloc(p, MiB, NULL, &x), GM_ERR_ASLEEP);
        CHECK_OK(gm_pool_check(p));
        CHECK_OK(gm_pool_wake(p));
        for (int i = 0; i < 3; i++)
            CHECK(device_bytes_are((uintptr_t)w[i], wsize[i], (unsigned char)(0x11 * (i + 1))));
        fill(be, kv[0], 64 * MiB, 0x42); /* the discarded blocks are mapped again */
        CHECK(device_bytes_are((uintptr_t)kv[0], 64 * MiB, 0x42));
        CHECK_OK(gm_pool_check(p));
    }
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(p, w[i], NULL));
    for (int i = 0; i < 2; i++)
        CHECK_OK(gm_free(p, kv[i], NULL));
    CHECK_OK(gm_pool_destroy(p));
}

static void out_of_memory(gm_backend *be)
{
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, NULL, &p));
    enum { MAX = 256 };
    static void *blk[MAX];
    int n = 0;
    gm_status st = GM_OK;
    while (n < MAX && (st = gm_alloc(p, (size_t)4 << 30, NULL, &blk[n])) == GM_OK)
        n++;
    CHECK_STATUS(st, GM_ERR_OUT_OF_MEMORY);
    CHECK_GE_U(n, 16); /* an H200 holds about 34 of them */
    CHECK_STR_CONTAINS(gm_last_error(p), "the device is full");
    CHECK_OK(gm_pool_check(p));
    for (int i = 0; i < n; i += 2)
        CHECK_OK(gm_free(p, blk[i], NULL));
    void *big;
    CHECK_OK(gm_alloc(p, (size_t)8 << 30, NULL, &big)); /* needs freed segments released */
    fill(be, big, 64 * MiB, 0x77);
    CHECK(device_bytes_are((uintptr_t)big, 64 * MiB, 0x77));
    CHECK_OK(gm_free(p, big, NULL));
    for (int i = 1; i < n; i += 2)
        CHECK_OK(gm_free(p, blk[i], NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    printf("oom: %d blocks of 4 GiB before the device was full\n", n);
}

int main(void)
{
    gm_backend *be = oracle_backend_or_skip();
    conformance(be);
    random_run(be, GM_SEGMENTS_PLAIN, check_seed(7));
    random_run(be, GM_SEGMENTS_VMM, 8);
    cross_stream(be);
    vmm(be);
    sleep_wake(be);
    out_of_memory(be);
    gm_backend_destroy(be);
    oracle_close();
    return check_summary();
}
