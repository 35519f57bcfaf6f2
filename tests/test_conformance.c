/*
 * Conformance suite: behaviour every strategy and segment mode must show (conformance.h).
 */
#include "sim_setup.h"
#include "conformance.h"

static const size_t MiB = (size_t)1 << 20;

/* Many sizes at once: aligned, disjoint, bytes kept, all freed, nothing left. */
static void conf_sizes(const conf_case *cc)
{
    gm_backend *be = sim_new(1024 * MiB, 1, 0);
    gm_pool *p = pool_new(be, &cc->cfg);
    enum { N = 48 };
    void *ptr[N];
    size_t size[N];
    for (int i = 0; i < N; i++) {
        size[i] = ((size_t)1 << (i % 26)) + (size_t)i * 37;
        CHECK_OK(gm_alloc(p, size[i], NULL, &ptr[i]));
        CHECK_EQ_U((uintptr_t)ptr[i] % GM_ALIGNMENT, 0);
        void *h = NULL;
        REQUIRE_OK(gm_sim_host_ptr(be, ptr[i], &h));
        memset(h, i + 1, size[i]);
        CHECK_OK(gm_pool_check(p));
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            CHECK((char *)ptr[i] + size[i] <= (char *)ptr[j] ||
                  (char *)ptr[j] + size[j] <= (char *)ptr[i]);
    for (int i = 0; i < N; i += 2) {
        unsigned char *h = NULL;
        REQUIRE_OK(gm_sim_host_ptr(be, ptr[i], (void **)&h));
        CHECK_EQ_U(h[0], (unsigned)(i + 1));
        CHECK_EQ_U(h[size[i] - 1], (unsigned)(i + 1));
        CHECK_OK(gm_free(p, ptr[i], NULL));
    }
    for (int i = 1; i < N; i += 2)
        CHECK_OK(gm_free(p, ptr[i], NULL));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.live_bytes, 0);
    CHECK_EQ_U(st.allocated_bytes, 0);
    CHECK_EQ_U(st.total_free_bytes, st.reserved_bytes);
    CHECK_EQ_D(st.frag_rate, st.total_free_bytes
                                 ? 1.0 - (double)st.largest_free_bytes / (double)st.total_free_bytes
                                 : 0.0, 1e-12);
    CHECK_OK(gm_trim(p, 0));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* A freed block serves the same request again on its stream without device calls (sizes the
 * cache holds: up to its 32 MiB floor when little else is live). */
static void conf_reuse(const conf_case *cc)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &cc->cfg);
    size_t sizes[] = {512, 100000, 3 * MiB, 24 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *a, *b;
        CHECK_OK(gm_alloc(p, sizes[i], NULL, &a));
        CHECK_OK(gm_alloc(p, 512, NULL, &b)); /* keeps the segment in use */
        gm_stats before, after;
        CHECK_OK(gm_pool_stats(p, &before));
        CHECK_OK(gm_free(p, a, NULL));
        CHECK_OK(gm_alloc(p, sizes[i], NULL, &a));
        CHECK_OK(gm_pool_stats(p, &after));
        uint64_t calls_before = 0, calls_after = 0;
        for (int k = 0; k < GM_CALL_KINDS; k++) {
            calls_before += before.device_calls[k];
            calls_after += after.device_calls[k];
        }
        if (cc->cfg.release != GM_RELEASE_EAGER)
            CHECK_EQ_U(calls_after, calls_before);
        CHECK_EQ_U(after.reserved_bytes, before.reserved_bytes);
        CHECK_OK(gm_free(p, a, NULL));
        CHECK_OK(gm_free(p, b, NULL));
        CHECK_OK(gm_pool_check(p));
    }
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Filling a small device: OOM with a message, the pool valid, then recovery. */
static void conf_out_of_memory(const conf_case *cc)
{
    gm_backend *be = sim_new(64 * MiB, 0, 0);
    gm_pool *p = pool_new(be, &cc->cfg);
    void *ptr[64];
    int n = 0;
    gm_status st = GM_OK;
    while (n < 64 && (st = gm_alloc(p, 3 * MiB, NULL, &ptr[n])) == GM_OK)
        n++;
    CHECK_STATUS(st, GM_ERR_OUT_OF_MEMORY);
    CHECK_GE_U(n, 10);
    CHECK_STR_CONTAINS(gm_last_error(p), "out of memory");
    CHECK_STR_CONTAINS(gm_last_error(p), "fragmentation rate");
    CHECK_OK(gm_pool_check(p));
    gm_stats s;
    CHECK_OK(gm_pool_stats(p, &s));
    CHECK_EQ_U(s.oom_count, 1);
    CHECK_LE_U(s.reserved_bytes, 64 * MiB);
    for (int i = 0; i < n; i++)
        CHECK_OK(gm_free(p, ptr[i], NULL));
    void *big;
    CHECK_OK(gm_alloc(p, 48 * MiB, NULL, &big)); /* needs the freed memory released first */
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Every failure status leaves the pool valid. */
static void conf_bad_input(const conf_case *cc)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &cc->cfg);
    void *a, *keep, *x = NULL;
    CHECK_OK(gm_alloc(p, 5000, NULL, &a));
    CHECK_OK(gm_alloc(p, 5000, NULL, &keep)); /* holds the segment, so a's memory stays ours */
    CHECK_STATUS(gm_free(p, (char *)a + 4096, NULL), GM_ERR_UNKNOWN_POINTER);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_STATUS(gm_free(p, a, NULL), GM_ERR_DOUBLE_FREE);
    CHECK_STATUS(gm_alloc(p, 0, NULL, &x), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_alloc(p, SIZE_MAX, NULL, &x), GM_ERR_OUT_OF_MEMORY);
    CHECK(x == NULL);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, keep, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

int main(void)
{
    for (size_t i = 0; i < conf_case_count(); i++) {
        const conf_case *cc = &conf_cases[i];
        unsigned long before = check_failed_;
        conf_sizes(cc);
        conf_reuse(cc);
        conf_out_of_memory(cc);
        conf_bad_input(cc);
        printf("%-28s %s\n", cc->name, check_failed_ == before ? "ok" : "FAILED");
    }
    return check_summary();
}
