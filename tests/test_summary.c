/*
 * gm_pool_summary (issue 20): the table shows the pool's own figures, current and peak; a buffer
 * that is too small fails with the size it needs and is left untouched; NULL is refused.
 */
#include "gpumem.h"
#include "sim_setup.h"

#include <string.h>

/* The row of `name` in the summary (its line), or NULL. */
static const char *row_of(const char *text, const char *name, char *line, size_t n)
{
    const char *p = strstr(text, name);
    if (!p)
        return NULL;
    while (p > text && p[-1] != '\n')
        p--;
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len >= n)
        len = n - 1;
    memcpy(line, p, len);
    line[len] = 0;
    return line;
}

static void test_figures(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_PLAIN;
    gm_pool *p = pool_new(be, &cfg);
    void *a, *b, *c;
    CHECK_OK(gm_alloc(p, 3u << 20, NULL, &a));  /* 3 MiB */
    CHECK_OK(gm_alloc(p, 1u << 20, NULL, &b));  /* 1 MiB */
    CHECK_OK(gm_alloc(p, 1000, NULL, &c));      /* rounded to 1024: internal fragmentation */
    CHECK_OK(gm_free(p, a, NULL));              /* peak live 4 MiB + 1000, live 1 MiB + 1000 */
    char text[GM_SUMMARY_BYTES], line[256];
    CHECK_OK(gm_pool_summary(p, text, sizeof text));
    CHECK_STR_CONTAINS(text, "gpumem pool summary");
    CHECK_STR_CONTAINS(text, "plain segments");
    REQUIRE(row_of(text, "live (requested)", line, sizeof line) != NULL);
    CHECK_STR_CONTAINS(line, "1.00 MiB"); /* current: 1 MiB + 1000 B */
    CHECK_STR_CONTAINS(line, "4.00 MiB"); /* peak */
    REQUIRE(row_of(text, "allocations", line, sizeof line) != NULL);
    CHECK_STR_CONTAINS(line, " 3 |");
    REQUIRE(row_of(text, "frees", line, sizeof line) != NULL);
    CHECK_STR_CONTAINS(line, " 1 |");
    REQUIRE(row_of(text, "live blocks", line, sizeof line) != NULL);
    CHECK_STR_CONTAINS(line, " 2 |");
    REQUIRE(row_of(text, "internal fragmentation", line, sizeof line) != NULL);
    CHECK_STR_CONTAINS(line, " 24 B |");
    REQUIRE(row_of(text, "mem_alloc", line, sizeof line) != NULL); /* device calls by kind */
    gm_stats st = stats_of(p);
    char want[64];
    snprintf(want, sizeof want, " %llu |", (unsigned long long)st.device_calls[GM_CALL_MEM_ALLOC]);
    CHECK_STR_CONTAINS(line, want);
    REQUIRE(row_of(text, "segments", line + 0, sizeof line) != NULL);
    CHECK(strlen(text) < GM_SUMMARY_BYTES);
    CHECK(text[strlen(text) - 1] == '\n');

    /* Too small: refused with the size needed; buf untouched. */
    char small[64];
    memset(small, 'x', sizeof small);
    CHECK_STATUS(gm_pool_summary(p, small, sizeof small), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "needs");
    CHECK(small[0] == 'x' && small[sizeof small - 1] == 'x');
    size_t need = strlen(text) + 1;
    CHECK_STATUS(gm_pool_summary(p, text, need - 1), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_pool_summary(p, text, need));
    CHECK_STATUS(gm_pool_summary(NULL, text, sizeof text), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_summary(p, NULL, 10), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_pool_check(p)); /* the pool is as it was */
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

int main(void)
{
    test_figures();
    return check_summary();
}
