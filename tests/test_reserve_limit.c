/*
 * gm_pool_set_reserve_limit: the cap on reserved bytes changed at run time (PyTorch's
 * set_per_process_memory_fraction goes through it), on the simulated GPU.
 */
#include "sim_setup.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* A fresh request of `size` bytes on the default stream: its status, the block freed again. */
static gm_status try_alloc(gm_pool *p, size_t size)
{
    void *ptr = NULL;
    gm_status st = gm_alloc(p, size, NULL, &ptr);
    if (st == GM_OK)
        CHECK_OK(gm_free(p, ptr, NULL));
    return st;
}

int main(void)
{
    gm_backend *be = sim_new(4 * GiB, 0, 0);
    gm_config cfg = {0};
    cfg.release = GM_RELEASE_EAGER; /* free segments go back at once: reserved tracks live */
    gm_pool *p = pool_new(be, &cfg);

    /* No cap at first: 1 GiB fits. */
    CHECK_OK(try_alloc(p, GiB));

    /* An absolute cap: what fits under it is granted, what does not fails and says why. */
    CHECK_OK(gm_pool_set_reserve_limit(p, 512 * MiB, 0.0));
    gm_config now;
    CHECK_OK(gm_pool_config(p, &now));
    CHECK_EQ_U(now.reserve_limit_bytes, 512 * MiB);
    CHECK_STATUS(try_alloc(p, GiB), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "reserve limit");
    void *a = NULL;
    CHECK_OK(gm_alloc(p, 256 * MiB, NULL, &a));
    CHECK_STATUS(try_alloc(p, 300 * MiB), GM_ERR_OUT_OF_MEMORY);
    CHECK_LE_U(stats_of(p).reserved_bytes, 512 * MiB);

    /* A fraction of the device (1/4 of 4 GiB): the smaller of the two caps applies. */
    CHECK_OK(gm_pool_set_reserve_limit(p, 0, 0.25));
    CHECK_OK(gm_pool_config(p, &now));
    CHECK_EQ_U(now.reserve_limit_bytes, 0);
    CHECK_EQ_D(now.reserve_limit_fraction, 0.25, 1e-12);
    CHECK_OK(try_alloc(p, 700 * MiB));
    CHECK_STATUS(try_alloc(p, 800 * MiB), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(gm_pool_set_reserve_limit(p, 600 * MiB, 0.25)); /* 600 MiB < 1 GiB */
    CHECK_STATUS(try_alloc(p, 400 * MiB), GM_ERR_OUT_OF_MEMORY);

    /* A bad fraction is refused and the cap stays as it was. */
    CHECK_STATUS(gm_pool_set_reserve_limit(p, 0, 1.5), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "not in [0, 1]");
    CHECK_STATUS(gm_pool_set_reserve_limit(p, 0, -0.1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(try_alloc(p, 400 * MiB), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(gm_pool_config(p, &now));
    CHECK_EQ_U(now.reserve_limit_bytes, 600 * MiB);

    /* A cap below what is live: the live block stays valid and can be freed; new growth fails. */
    CHECK_OK(gm_pool_set_reserve_limit(p, 64 * MiB, 0.0));
    CHECK_STATUS(try_alloc(p, 128 * MiB), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_trim(p, 0));
    CHECK_OK(try_alloc(p, 32 * MiB));

    /* Lifting the cap (0, 0) restores the device's capacity as the only bound. */
    CHECK_OK(gm_pool_set_reserve_limit(p, 0, 0.0));
    CHECK_OK(try_alloc(p, 3 * GiB));
    CHECK_OK(gm_pool_check(p));

    CHECK_STATUS(gm_pool_set_reserve_limit(NULL, 0, 0.0), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "gm_pool_set_reserve_limit");

    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
    return check_summary();
}
