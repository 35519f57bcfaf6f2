/*
 * libgpumem_torch.so driven from C on the simulated GPU: the exported functions only, linked
 * like any user of the library. Runs everywhere, including under ASan/UBSan and TSan, where the
 * Python test (test_torch_shim.py) does not.
 */
#include "check.h"

#include "gm_torch.h"

#include <pthread.h>
#include <stdint.h>

/* One number out of the stats JSON ("key": value). */
static unsigned long long stat_of(int device, const char *key)
{
    char buf[8192], pat[64];
    int n = gm_torch_stats_json(device, buf, sizeof buf);
    if (n < 0 || (size_t)n >= sizeof buf)
        return ~0ull;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(buf, pat);
    return p ? strtoull(p + strlen(pat), NULL, 10) : ~0ull;
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < 500; i++) {
        ssize_t size = 512 * (1 + (i * 13 + t) % 300);
        void *p = gm_torch_alloc(size, 1, NULL);
        if (!p || (uintptr_t)p % GM_ALIGNMENT)
            return (void *)1;
        gm_torch_free(p, size, 1, NULL);
    }
    return NULL;
}

int main(void)
{
    CHECK(gm_torch_configure("backend=sim,bad_key=1") == -1);
    CHECK_STR_CONTAINS(gm_torch_last_error(-1), "bad_key");
    REQUIRE(gm_torch_configure("backend=sim,sim.capacity=4GiB,segments=vmm") == 0);
    CHECK(strcmp(gm_torch_config_string(), "backend=sim,sim.capacity=4GiB,segments=vmm") == 0);

    void *a = gm_torch_alloc(1000, 0, NULL);
    void *b = gm_torch_alloc(3 << 20, 0, NULL);
    REQUIRE(a && b);
    CHECK_EQ_U((uintptr_t)a % GM_ALIGNMENT, 0);
    CHECK_EQ_U((uintptr_t)b % GM_ALIGNMENT, 0);
    CHECK_EQ_U(stat_of(0, "live_bytes"), 1000 + (3 << 20));
    CHECK(gm_torch_alloc(0, 0, NULL) == NULL);
    CHECK(gm_torch_alloc((ssize_t)5 << 30, 0, NULL) == NULL);
    CHECK_STR_CONTAINS(gm_torch_last_error(0), "out of memory");
    CHECK(gm_torch_configure("backend=sim") == -1); /* a pool exists now */

    char *snap = NULL;
    REQUIRE(gm_torch_snapshot(0, &snap) == 0);
    CHECK_STR_CONTAINS(snap, "\"segments\"");
    CHECK_STR_CONTAINS(snap, "\"live\"");
    gm_torch_string_free(snap);
    CHECK(gm_torch_snapshot(0, NULL) == -1);

    char tiny[8];
    int full = gm_torch_stats_json(0, tiny, sizeof tiny);
    CHECK(full > (int)sizeof tiny && strlen(tiny) == sizeof tiny - 1);

    gm_torch_free(a, 1000, 0, NULL);
    gm_torch_free(b, 3 << 20, 0, NULL);
    gm_torch_free(a, 1000, 0, NULL);                 /* double free: reported, no crash */
    gm_torch_free((void *)(uintptr_t)0x1234000, 1, 0, NULL); /* foreign: reported */
    gm_torch_free((void *)(uintptr_t)0x1234000, 1, 70, NULL); /* bad device: reported */
    gm_torch_free(NULL, 0, 0, NULL);
    CHECK_EQ_U(stat_of(0, "live_bytes"), 0);
    CHECK(gm_torch_trim(0, 0) == 0);
    CHECK_EQ_U(stat_of(0, "reserved_bytes"), 0);
    CHECK(gm_torch_alloc(10, 64, NULL) == NULL);
    CHECK(gm_torch_trim(-1, 0) == -1);
    CHECK_STR_CONTAINS(gm_torch_last_error(-1), "out of range");

    /* Eight threads race to create device 1's pool and use it. */
    pthread_t th[8];
    for (int t = 0; t < 8; t++)
        REQUIRE(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < 8; t++) {
        void *r;
        pthread_join(th[t], &r);
        CHECK(r == NULL);
    }
    CHECK_EQ_U(stat_of(1, "alloc_count"), 8 * 500);
    CHECK_EQ_U(stat_of(1, "live_bytes"), 0);
    /* The simulated machine has 8 devices by default: device 1's pool is on sim device 1, and
     * device 8 does not exist. */
    CHECK_EQ_U(stat_of(1, "ordinal"), 1);
    CHECK(gm_torch_alloc(4096, 8, NULL) == NULL);
    CHECK_STR_CONTAINS(gm_torch_last_error(8), "has 8 devices");
    return check_summary();
}
