/*
 * The configuration by name (src/config.c): every key type, bad values and their messages,
 * overflow, unknown keys, all-or-nothing parsing, get/format round trips, gm_config_resolve
 * against the configuration a real pool reports, and (with `--docs FILE`) that docs/cli.md's
 * key table lists exactly the library's keys.
 */
#include "check.h"
#include "gpumem_sim.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static const size_t KiB = 1024, MiB = (size_t)1 << 20, GiB = (size_t)1 << 30;

/* gm_config_set succeeded with `text` for `key`. */
static gm_config set_ok(const char *key, const char *text)
{
    gm_config c = {0};
    gm_status st = gm_config_set(&c, key, text);
    if (!CHECK(st == GM_OK))
        fprintf(stderr, "    %s=%s: %s\n", key, text, gm_last_error(NULL));
    return c;
}

/* gm_config_set failed with `text` for `key`, left the config alone, and said why: the key,
 * the value and `want` appear in the message. */
static void set_bad(const char *key, const char *text, const char *want)
{
    gm_config c = {0}, before;
    c.min_block_bytes = 4096; /* something non-zero to see that nothing changes */
    c.defrag_step_ns = 7;
    c.growth_fraction = 0.5;
    before = c;
    CHECK_STATUS(gm_config_set(&c, key, text), GM_ERR_INVALID_ARGUMENT);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    const char *msg = gm_last_error(NULL);
    CHECK_STR_CONTAINS(msg, "gm_config_set");
    CHECK_STR_CONTAINS(msg, key);
    CHECK_STR_CONTAINS(msg, text);
    CHECK_STR_CONTAINS(msg, want);
}

static void test_key_tables(void)
{
    size_t np = 0, ns = 0;
    const gm_config_key *pk = gm_config_keys(&np);
    const gm_config_key *sk = gm_sim_config_keys(&ns);
    REQUIRE(pk && sk);
    CHECK(gm_config_keys(NULL) == pk);
    CHECK_GE_U(np, 40);
    CHECK_EQ_U(ns, 7);
    for (size_t i = 0; i < np + ns; i++) {
        const gm_config_key *k = i < np ? &pk[i] : &sk[i - np];
        CHECK(k->name && *k->name && k->type && *k->type && k->default_text &&
              *k->default_text && k->help && *k->help);
        CHECK((strncmp(k->name, "sim.", 4) == 0) == (i >= np));
        for (size_t j = 0; j < i; j++) {
            const gm_config_key *o = j < np ? &pk[j] : &sk[j - np];
            CHECK(strcmp(k->name, o->name) != 0);
        }
        /* every key can be read back from a zeroed config */
        char v[64];
        if (i < np) {
            gm_config c = {0};
            CHECK_OK(gm_config_get(&c, k->name, v, sizeof v));
        } else {
            gm_sim_config s = {0};
            CHECK_OK(gm_sim_config_get(&s, k->name, v, sizeof v));
        }
    }
}

static void test_sizes(void)
{
    size_t v = 0;
    CHECK_OK(gm_size_parse("4096", &v));
    CHECK_EQ_U(v, 4096);
    CHECK_OK(gm_size_parse("256K", &v));
    CHECK_EQ_U(v, 256 * KiB);
    CHECK_OK(gm_size_parse("2MiB", &v));
    CHECK_EQ_U(v, 2 * MiB);
    CHECK_OK(gm_size_parse("1.5g", &v));
    CHECK_EQ_U(v, 3 * GiB / 2);
    CHECK_OK(gm_size_parse("0.5K", &v));
    CHECK_EQ_U(v, 512);
    CHECK_OK(gm_size_parse("1T", &v));
    CHECK_EQ_U(v, (uint64_t)1 << 40);
    CHECK_OK(gm_size_parse("18446744073709551615", &v));
    CHECK_EQ_U(v, SIZE_MAX);
    CHECK_OK(gm_size_parse("16777214T", &v));
    CHECK_EQ_U(v, (uint64_t)16777214 << 40);
    v = 77;
    CHECK_STATUS(gm_size_parse("18446744073709551616", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("99999999999999999999999", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("16777216T", &v), GM_ERR_INVALID_ARGUMENT); /* 2^64 */
    CHECK_STATUS(gm_size_parse("17179869184G", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("1.5", &v), GM_ERR_INVALID_ARGUMENT); /* a fraction of a byte */
    CHECK_STATUS(gm_size_parse("12X", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("-1", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse(" 1", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("1.", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse(NULL, &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(v, 77); /* failures write nothing */
}

/* One key of every type, set and read back. */
static void test_every_type(void)
{
    char v[64];
    gm_config c = set_ok("reserve_limit", "1.5G"); /* size */
    CHECK_EQ_U(c.reserve_limit_bytes, 3 * GiB / 2);
    CHECK_OK(gm_config_get(&c, "reserve_limit", v, sizeof v));
    CHECK(strcmp(v, "1610612736") == 0);

    c = set_ok("thread_cache_blocks", "4294967295"); /* unsigned */
    CHECK_EQ_U(c.thread_cache_blocks, GM_THREAD_CACHE_OFF);
    c = set_ok("defrag_step_ns", "18446744073709551615"); /* u64 */
    CHECK_EQ_U(c.defrag_step_ns, UINT64_MAX);
    CHECK_OK(gm_config_get(&c, "defrag_step_ns", v, sizeof v));
    CHECK(strcmp(v, "18446744073709551615") == 0);

    c = set_ok("growth_fraction", "0.2"); /* fraction */
    CHECK(c.growth_fraction == 0.2);
    CHECK_OK(gm_config_get(&c, "growth_fraction", v, sizeof v));
    CHECK(strcmp(v, "0.2") == 0); /* the shortest text that reads back */
    c = set_ok("reserve_fraction", "1");
    CHECK(c.reserve_limit_fraction == 1.0);

    c = set_ok("defrag_copy_bandwidth", "2.5e12"); /* ratio */
    CHECK(c.defrag_copy_bandwidth == 2.5e12);

    static const char *const yes[] = {"1", "true", "TRUE", "yes", "on"};
    static const char *const no[] = {"0", "false", "No", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) { /* bool */
        c = set_ok("cache_disable", yes[i]);
        CHECK_EQ_U(c.cache_disable, 1);
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        c = set_ok("stream_wait", no[i]);
        CHECK_EQ_U(c.stream_wait, 0);
    }

    /* every enum, every name */
    for (unsigned i = 0; i < GM_STRATEGY_COUNT; i++)
        CHECK_EQ_U(set_ok("strategy", gm_strategy_str((gm_strategy)i)).strategy, i);
    for (unsigned i = 0; i < GM_SEGMENTS_COUNT; i++)
        CHECK_EQ_U(set_ok("segments", gm_segments_str((gm_segments)i)).segments, i);
    for (unsigned i = 0; i < GM_RELEASE_COUNT; i++)
        CHECK_EQ_U(set_ok("release", gm_release_str((gm_release)i)).release, i);
    for (unsigned i = 0; i < GM_GROWTH_COUNT; i++)
        CHECK_EQ_U(set_ok("growth", gm_growth_str((gm_growth)i)).growth, i);
    for (unsigned i = 0; i < GM_MATCH_COUNT; i++)
        CHECK_EQ_U(set_ok("cache_match.medium", gm_match_str((gm_match)i))
                       .cache_match[GM_CACHE_MEDIUM], i);
    for (unsigned i = 0; i < GM_EVICT_COUNT; i++)
        CHECK_EQ_U(set_ok("cache_evict.large", gm_evict_str((gm_evict)i))
                       .cache_evict[GM_CACHE_LARGE], i);
    c = set_ok("cache_match.small", "best"); /* the bucket's own slot, not its neighbours */
    CHECK_EQ_U(c.cache_match[GM_CACHE_SMALL], GM_MATCH_BEST);
    CHECK_EQ_U(c.cache_match[GM_CACHE_MEDIUM], GM_MATCH_DEFAULT);
    CHECK_OK(gm_config_get(&c, "cache_match.small", v, sizeof v));
    CHECK(strcmp(v, "best") == 0);

    c = set_ok("trace", "/tmp/gm trace.csv.gz"); /* path */
    CHECK(strcmp(c.trace_file, "/tmp/gm trace.csv.gz") == 0);
    CHECK_OK(gm_config_get(&c, "trace", v, sizeof v));
    CHECK(strcmp(v, "/tmp/gm trace.csv.gz") == 0);
    c = set_ok("trace", "");
    CHECK_EQ_U(c.trace_file[0], 0);

    gm_sim_config s = {0}; /* the device's keys, with and without "sim." */
    CHECK_OK(gm_sim_config_set(&s, "sim.capacity", "8G"));
    CHECK_OK(gm_sim_config_set(&s, "granularity", "4MiB"));
    CHECK_OK(gm_sim_config_set(&s, "host_backed", "yes"));
    CHECK_OK(gm_sim_config_set(&s, "sim.no_vmm", "on"));
    CHECK_OK(gm_sim_config_set(&s, "sim.no_costs", "1"));
    CHECK_OK(gm_sim_config_set(&s, "devices", "3"));
    CHECK_EQ_U(s.capacity, 8 * GiB);
    CHECK_EQ_U(s.vmm_granularity, 4 * MiB);
    CHECK(s.host_backed == 1 && s.no_vmm == 1 && s.no_costs == 1 && s.devices == 3);
    CHECK_OK(gm_sim_config_get(&s, "capacity", v, sizeof v));
    CHECK(strcmp(v, "8589934592") == 0);
}

static void test_bad_values(void)
{
    set_bad("min_block", "lots", "a byte size");
    set_bad("min_block", "1.5", "a byte size");
    set_bad("reserve_limit", "-1", "a byte size");
    set_bad("roundup_power2_divisions", "-4", "whole number");
    set_bad("roundup_power2_divisions", "4x", "whole number");
    set_bad("defrag_step_ns", "-5", "whole number");
    set_bad("defrag_step_ns", " 5", "whole number");
    set_bad("growth_fraction", "1.5", "from 0 to 1");
    set_bad("growth_fraction", "-0.1", "from 0 to 1");
    set_bad("growth_fraction", "nan", "from 0 to 1");
    set_bad("defrag_threshold", "", "from 0 to 1");
    set_bad("cache_cap_live_ratio", "-1", "finite number");
    set_bad("defrag_copy_bandwidth", "inf", "finite number");
    set_bad("cache_disable", "maybe", "true or false");
    set_bad("strategy", "bogus", "tlsf, buddy, slab, fixed, auto");
    set_bad("segments", "VMM", "plain, vmm"); /* names are exact */
    set_bad("release", "never", "before_grow, on_oom, eager");
    set_bad("growth", "linear", "geometric, exact");
    set_bad("cache_match.large", "close", "exact, approx, best");
    set_bad("cache_evict.small", "random", "lru, fifo");
    set_bad("trace", "a,b.csv", "without a comma"); /* format's text would not parse back */
    char long_path[GM_TRACE_PATH_BYTES + 1];
    memset(long_path, 'p', sizeof long_path - 1);
    long_path[sizeof long_path - 1] = 0;
    gm_config c0 = {0};
    CHECK_STATUS(gm_config_set(&c0, "trace", long_path), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(c0.trace_file[0], 0);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "shorter than GM_TRACE_PATH_BYTES");

    gm_sim_config s = {0};
    CHECK_STATUS(gm_sim_config_set(&s, "sim.capacity", "big"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "sim.capacity: bad value \"big\"");
    CHECK_EQ_U(s.capacity, 0);

    gm_config c = {0};
    CHECK_STATUS(gm_config_set(NULL, "strategy", "tlsf"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, NULL, "tlsf"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "strategy", NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "NULL");
}

/* Every number that does not fit its field is refused (strtoull's overflow used to be a value:
 * SET_U64 took 2^64 as UINT64_MAX). */
static void test_overflow(void)
{
    set_bad("defrag_step_ns", "18446744073709551616", "whole number");
    set_bad("defrag_step_ns", "99999999999999999999999", "whole number");
    set_bad("thread_cache_blocks", "4294967296", "whole number");
    set_bad("fixed_reserve_blocks", "18446744073709551616", "whole number");
    set_bad("reserve_limit", "18446744073709551616", "a byte size");
    set_bad("initial_reserve", "16777216T", "a byte size");
    set_bad("growth_fraction", "1e999", "from 0 to 1");
    set_bad("defrag_copy_bandwidth", "1e999", "finite number");
    gm_sim_config s = {0};
    CHECK_STATUS(gm_sim_config_set(&s, "devices", "4294967296"), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(s.devices, 0);
}

static void test_unknown_keys(void)
{
    gm_config c = {0};
    CHECK_STATUS(gm_config_set(&c, "nope", "1"), GM_ERR_INVALID_ARGUMENT);
    const char *msg = gm_last_error(NULL);
    CHECK_STR_CONTAINS(msg, "unknown key \"nope\"");
    CHECK_STR_CONTAINS(msg, "valid keys:");
    CHECK_STR_CONTAINS(msg, "initial_reserve");
    CHECK_STR_CONTAINS(msg, "defrag_copy_bandwidth"); /* the last key fits in the message */
    /* the pool's setter does not take the device's keys, and keys are whole names */
    CHECK_STATUS(gm_config_set(&c, "sim.capacity", "8G"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "strateg", "tlsf"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "strategy.x", "tlsf"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "", "tlsf"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "cache_match", "exact"), GM_ERR_INVALID_ARGUMENT);
    gm_config zero = {0};
    CHECK(memcmp(&c, &zero, sizeof c) == 0);

    gm_sim_config s = {0};
    CHECK_STATUS(gm_sim_config_set(&s, "strategy", "tlsf"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "sim.capacity");
    CHECK_STATUS(gm_sim_config_set(&s, "sim.sim.capacity", "1G"), GM_ERR_INVALID_ARGUMENT);

    char v[64];
    CHECK_STATUS(gm_config_get(&c, "nope", v, sizeof v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "unknown key \"nope\"");
}

static void test_parse(void)
{
    gm_config c = {0};
    CHECK_OK(gm_config_parse(&c, " strategy=slab , min_block = 4K,,release=eager,"));
    CHECK_EQ_U(c.strategy, GM_STRATEGY_SLAB);
    CHECK_EQ_U(c.min_block_bytes, 4 * KiB);
    CHECK_EQ_U(c.release, GM_RELEASE_EAGER);
    CHECK_OK(gm_config_parse(&c, "min_block=8K,min_block=16K")); /* a later key wins */
    CHECK_EQ_U(c.min_block_bytes, 16 * KiB);
    CHECK_OK(gm_config_parse(&c, "")); /* nothing to do */
    CHECK_EQ_U(c.min_block_bytes, 16 * KiB);

    /* all or nothing: the good items before a bad one are not applied */
    gm_config before = c;
    CHECK_STATUS(gm_config_parse(&c, "strategy=buddy,reserve_limit=1G,min_block=lots"),
                 GM_ERR_INVALID_ARGUMENT);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "gm_config_parse: min_block: bad value \"lots\"");
    CHECK_STATUS(gm_config_parse(&c, "strategy=buddy,nope=1"), GM_ERR_INVALID_ARGUMENT);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "unknown key \"nope\"");
    CHECK_STATUS(gm_config_parse(&c, "strategy=buddy,min_block"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "item 2 \"min_block\": want KEY=VALUE");
    CHECK_STATUS(gm_config_parse(&c, "=4K"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_parse(&c, "sim.capacity=8G"), GM_ERR_INVALID_ARGUMENT);
    char big[700];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_STATUS(gm_config_parse(&c, big), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "too long");
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    CHECK_STATUS(gm_config_parse(NULL, "strategy=slab"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_parse(&c, NULL), GM_ERR_INVALID_ARGUMENT);

    /* the device alone, and both together */
    gm_sim_config s = {0};
    CHECK_OK(gm_sim_config_parse(&s, "capacity=16G,sim.no_costs=true"));
    CHECK(s.capacity == 16 * GiB && s.no_costs == 1);
    gm_sim_config sb = s;
    CHECK_STATUS(gm_sim_config_parse(&s, "capacity=1G,devices=x"), GM_ERR_INVALID_ARGUMENT);
    CHECK(memcmp(&s, &sb, sizeof s) == 0);

    gm_config p = {0};
    CHECK_OK(gm_config_parse_with_sim(&p, &s, "strategy=fixed,sim.devices=2,fixed_block=2M"));
    CHECK(p.strategy == GM_STRATEGY_FIXED && p.fixed_block_bytes == 2 * MiB && s.devices == 2);
    CHECK_OK(gm_config_parse_with_sim(&p, &s, "sim.kernel_ns=350000"));
    CHECK_EQ_U(s.kernel_ns, 350000);
    CHECK_STATUS(gm_config_parse_with_sim(&p, &s, "sim.kernel_ns=-1"), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(s.kernel_ns, 350000);
    s.kernel_ns = 0;
    gm_config pb = p;
    sb = s;
    /* atomic over both structs: the sim item before the bad one is not applied either */
    CHECK_STATUS(gm_config_parse_with_sim(&p, &s, "sim.capacity=1G,strategy=nope"),
                 GM_ERR_INVALID_ARGUMENT);
    CHECK(memcmp(&p, &pb, sizeof p) == 0 && memcmp(&s, &sb, sizeof s) == 0);
    CHECK_STATUS(gm_config_parse_with_sim(&p, &s, "sim.bogus=1"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "unknown key \"sim.bogus\"");
    CHECK_STATUS(gm_config_parse_with_sim(&p, &s, "bogus=1"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "sim.capacity"); /* both tables listed */
    CHECK_STATUS(gm_config_parse_with_sim(&p, NULL, "sim.capacity=1G"), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_config_parse_with_sim(&p, NULL, "strategy=tlsf"));
    CHECK_EQ_U(p.strategy, GM_STRATEGY_TLSF);
}

static void test_get_and_format(void)
{
    gm_config c = {0};
    REQUIRE_OK(gm_config_parse(&c, "strategy=auto,reserve_fraction=0.75,cache_cap_live_ratio="
                                   "0.05,defrag_step_ns=123456789,cache_evict.medium=fifo"));
    char small[4];
    CHECK_STATUS(gm_config_get(&c, "defrag_step_ns", small, sizeof small),
                 GM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(small, "123") == 0); /* truncated, terminated */
    CHECK_STR_CONTAINS(gm_last_error(NULL), "defrag_step_ns");

    size_t need = gm_config_format(&c, NULL, 0);
    CHECK_GT_U(need, 100);
    char *text = malloc(need + 1);
    REQUIRE(text);
    CHECK_EQ_U(gm_config_format(&c, text, need), need); /* one byte short: truncated */
    CHECK_EQ_U(strlen(text), need - 1);
    CHECK_EQ_U(gm_config_format(&c, text, need + 1), need);
    CHECK_EQ_U(strlen(text), need);
    CHECK_STR_CONTAINS(text, "strategy=auto,");
    CHECK_STR_CONTAINS(text, ",reserve_fraction=0.75,");
    CHECK_STR_CONTAINS(text, ",cache_evict.medium=fifo,");
    gm_config back = {0};
    CHECK_OK(gm_config_parse(&back, text));
    CHECK(memcmp(&back, &c, sizeof c) == 0);
    free(text);

    gm_sim_config s = {.capacity = 3 * GiB, .host_backed = 1, .devices = 4};
    char st[512];
    CHECK_LT_U(gm_sim_config_format(&s, st, sizeof st), sizeof st);
    CHECK_STR_CONTAINS(st, "sim.capacity=3221225472,");
    gm_sim_config sback = {0};
    CHECK_OK(gm_sim_config_parse(&sback, st));
    CHECK(memcmp(&sback, &s, sizeof s) == 0);
}

/* gm_config_resolve gives what a pool created with the same configuration reports. */
static void test_resolve(void)
{
    gm_backend *dev = NULL, *novmm = NULL;
    gm_sim_config sc = {.capacity = 64 * GiB};
    REQUIRE_OK(gm_sim_backend_create(&sc, &dev));
    sc.no_vmm = 1;
    REQUIRE_OK(gm_sim_backend_create(&sc, &novmm));
    static const char *const texts[] = {
        "",
        "strategy=slab,segments=vmm,release=eager",
        "growth=exact,min_block=256K,cache_match.small=approx,thread_cache_blocks=4294967295",
        "strategy=fixed,fixed_block=2M,fixed_reserve_blocks=4,cache_disable=1",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        gm_config in = {0}, out, from_pool;
        REQUIRE_OK(gm_config_parse(&in, texts[i]));
        CHECK_OK(gm_config_resolve(dev, &in, &out));
        gm_pool *pool = NULL;
        REQUIRE_OK(gm_pool_create(dev, &in, &pool));
        REQUIRE_OK(gm_pool_config(pool, &from_pool));
        gm_stats st;
        REQUIRE_OK(gm_pool_stats(pool, &st));
        CHECK_EQ_U(st.reserved_bytes, 0);
        CHECK_OK(gm_pool_destroy(pool));
        char a[4096], b[4096];
        gm_config_format(&out, a, sizeof a);
        gm_config_format(&from_pool, b, sizeof b);
        if (!CHECK(strcmp(a, b) == 0))
            fprintf(stderr, "    resolve: %s\n    pool:    %s\n", a, b);
        CHECK_EQ_U(out.vmm_reserve_bytes, 64 * GiB);
    }
    /* defaults, with and without a device; out may be in */
    gm_config c = {0};
    CHECK_OK(gm_config_resolve(NULL, NULL, &c));
    CHECK_EQ_U(c.strategy, GM_STRATEGY_TLSF);
    CHECK_EQ_U(c.min_block_bytes, 512);
    CHECK_EQ_U(c.growth_max, GiB);
    CHECK_EQ_U(c.vmm_reserve_bytes, 0); /* device capacity, unknown without one */
    CHECK(c.cache_cap_fraction == 0.20);
    gm_config same = {.segments = GM_SEGMENTS_VMM};
    CHECK_OK(gm_config_resolve(dev, &same, &same));
    CHECK_EQ_U(same.segments, GM_SEGMENTS_VMM);
    CHECK_EQ_U(same.strategy, GM_STRATEGY_TLSF);

    /* bad configurations fail as gm_pool_create does, *out untouched */
    gm_config bad = {0}, out = {.min_block_bytes = 99};
    REQUIRE_OK(gm_config_parse(&bad, "min_block=1000"));
    CHECK_STATUS(gm_config_resolve(dev, &bad, &out), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "gm_config_resolve: invalid config: min_block_bytes");
    CHECK_EQ_U(out.min_block_bytes, 99);
    REQUIRE_OK(gm_config_parse(&bad, "min_block=0,growth_min=2G,growth_max=1G"));
    CHECK_STATUS(gm_config_resolve(NULL, &bad, &out), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "growth_min");
    gm_config vmm = {.segments = GM_SEGMENTS_VMM};
    CHECK_STATUS(gm_config_resolve(novmm, &vmm, &out), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "VMM");
    CHECK_OK(gm_config_resolve(NULL, &vmm, &out)); /* no device: not checked */
    gm_pool *pool = NULL;
    CHECK_STATUS(gm_pool_create(novmm, &vmm, &pool), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "gm_pool_create: segments=vmm");
    /* segments=auto: VMM where the device has it, plain where not, undecided without a device */
    gm_config autoseg = {0};
    REQUIRE_OK(gm_config_parse(&autoseg, "segments=auto"));
    CHECK_EQ_U(autoseg.segments, GM_SEGMENTS_AUTO);
    CHECK_OK(gm_config_resolve(dev, &autoseg, &out));
    CHECK_EQ_U(out.segments, GM_SEGMENTS_VMM);
    CHECK_OK(gm_config_resolve(novmm, &autoseg, &out));
    CHECK_EQ_U(out.segments, GM_SEGMENTS_PLAIN);
    CHECK_OK(gm_config_resolve(NULL, &autoseg, &out));
    CHECK_EQ_U(out.segments, GM_SEGMENTS_AUTO);
    gm_backend *both[2] = {dev, novmm};
    for (int i = 0; i < 2; i++) {
        gm_stats st;
        void *x;
        REQUIRE_OK(gm_pool_create(both[i], &autoseg, &pool));
        CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &x));
        CHECK_OK(gm_pool_stats(pool, &st));
        CHECK_EQ_U(st.segments_vmm, i == 0);
        if (i == 0)
            CHECK_EQ_U(st.reserved_bytes, 4 * MiB); /* VMM: two 2 MiB pages mapped */
        CHECK_OK(gm_free(pool, x, NULL));
        CHECK_OK(gm_pool_destroy(pool));
    }
    CHECK_STATUS(gm_config_resolve(dev, NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    gm_backend_destroy(novmm);
    gm_backend_destroy(dev);
}

/* docs/cli.md's "--set keys" table lists exactly the library's keys. */
static void test_docs(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!CHECK(f != NULL)) {
        fprintf(stderr, "    cannot open %s\n", path);
        return;
    }
    size_t np, ns;
    const gm_config_key *pk = gm_config_keys(&np), *sk = gm_sim_config_keys(&ns);
    bool *seen = calloc(np + ns, sizeof *seen);
    REQUIRE(seen);
    char line[2048];
    bool in_section = false;
    unsigned rows = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "## ", 3) == 0) {
            in_section = strstr(line, "`--set` keys") != NULL;
            continue;
        }
        if (!in_section || strncmp(line, "| `", 3) != 0)
            continue;
        char *name = line + 3, *end = strchr(name, '`');
        if (!end)
            continue;
        *end = 0;
        rows++;
        size_t i = 0;
        for (; i < np + ns; i++)
            if (strcmp(name, i < np ? pk[i].name : sk[i - np].name) == 0)
                break;
        if (!CHECK(i < np + ns))
            fprintf(stderr, "    docs/cli.md lists \"%s\", which is not a key\n", name);
        else if (!CHECK(!seen[i]))
            fprintf(stderr, "    docs/cli.md lists \"%s\" twice\n", name);
        else
            seen[i] = true;
    }
    fclose(f);
    for (size_t i = 0; i < np + ns; i++)
        if (!CHECK(seen[i]))
            fprintf(stderr, "    docs/cli.md does not list \"%s\"\n",
                    i < np ? pk[i].name : sk[i - np].name);
    CHECK_EQ_U(rows, np + ns);
    free(seen);
}

/* vmm_run_scale: a new run holds at most 1/N of the pages the pool holds with it, or a 48th of
 * the stretch it fills if that is more (2 MiB pages on the sim). 8 MiB, then 1 GiB, then 8 MiB
 * into an empty pool: at the default (768) the small blocks map page by page, 4 creates each
 * ((0 + 4) / 768 and (516 + 4) / 768 are under a page), and the large one in runs of 10 pages
 * (512 / 48; 51 of them and one of 2): 4 + 52 + 4 creates; at 64 the last small block is one
 * run ((516 + 4) / 64 = 8 pages): 4 + 52 + 1; at 1 each stretch is one run of up to 16 pages:
 * 1 + 32 + 1. */
static void test_vmm_run_scale(void)
{
    static const char *scale[] = {NULL, "64", "1"};
    static const uint64_t creates[][3] = {{4, 56, 60}, {4, 56, 57}, {1, 33, 34}};
    for (size_t i = 0; i < 3; i++) {
        gm_config cfg = {.segments = GM_SEGMENTS_VMM};
        if (scale[i])
            REQUIRE_OK(gm_config_set(&cfg, "vmm_run_scale", scale[i]));
        gm_backend *dev;
        gm_pool *pool;
        REQUIRE_OK(gm_sim_backend_create(NULL, &dev));
        REQUIRE_OK(gm_pool_create(dev, &cfg, &pool));
        static const size_t sizes[] = {8 * MiB, 1024 * MiB, 8 * MiB};
        void *p[3];
        for (size_t j = 0; j < 3; j++) {
            CHECK_OK(gm_alloc(pool, sizes[j], NULL, &p[j]));
            gm_stats s;
            CHECK_OK(gm_pool_stats(pool, &s));
            CHECK_EQ_U(s.device_calls[GM_CALL_PHYS_CREATE], creates[i][j]);
        }
        gm_stats s;
        CHECK_OK(gm_pool_stats(pool, &s));
        CHECK_EQ_U(s.reserved_bytes, 1040 * MiB); /* never more than the blocks' pages */
        for (size_t j = 0; j < 3; j++)
            CHECK_OK(gm_free(pool, p[j], NULL));
        CHECK_OK(gm_pool_check(pool));
        gm_pool_destroy(pool);
        gm_backend_destroy(dev);
    }
}

/* vmm_run_pages: how many pages one device call creates; 17 is refused. */
static void test_vmm_run_pages(void)
{
    gm_config out;
    gm_config c = set_ok("vmm_run_pages", "17");
    CHECK_STATUS(gm_config_resolve(NULL, &c, &out), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "vmm_run_pages");
    static const unsigned runs[] = {1, 0};
    static const uint64_t creates[] = {4, 1}; /* an 8 MiB block = 4 pages of 2 MiB */
    for (size_t i = 0; i < 2; i++) {
        gm_backend *dev;
        gm_pool *pool;
        void *p;
        REQUIRE_OK(gm_sim_backend_create(NULL, &dev));
        gm_config cfg = {.segments = GM_SEGMENTS_VMM, .vmm_run_pages = runs[i],
                         .vmm_run_scale = 1}; /* runs at any pool size */
        REQUIRE_OK(gm_pool_create(dev, &cfg, &pool));
        CHECK_OK(gm_alloc(pool, 8 * MiB, NULL, &p));
        gm_stats s;
        CHECK_OK(gm_pool_stats(pool, &s));
        CHECK(s.device_calls[GM_CALL_PHYS_CREATE] == creates[i]);
        CHECK(s.reserved_bytes == 8 * MiB);
        CHECK_OK(gm_free(pool, p, NULL));
        CHECK_OK(gm_pool_check(pool));
        gm_pool_destroy(pool);
        gm_backend_destroy(dev);
    }
}

/* gm_config_trace_for_device: device 0 keeps the name, device d gets ".devD" before the
 * ".csv[.gz]" / ".gz" ending (or at the end), off stays off, a name that would not fit fails
 * and leaves cfg as it was. */
static void test_trace_for_device(void)
{
    static const struct {
        const char *in;
        int device;
        const char *want;
    } cases[] = {{"run.csv.gz", 0, "run.csv.gz"},     {"run.csv.gz", 1, "run.dev1.csv.gz"},
                 {"/t/run.csv", 12, "/t/run.dev12.csv"}, {"x.gz", 3, "x.dev3.gz"},
                 {"trace", 2, "trace.dev2"},           {".csv", 1, ".csv.dev1"},
                 {"", 5, ""}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gm_config c;
        memset(&c, 0, sizeof c);
        snprintf(c.trace_file, sizeof c.trace_file, "%s", cases[i].in);
        CHECK_OK(gm_config_trace_for_device(&c, cases[i].device));
        CHECK(strcmp(c.trace_file, cases[i].want) == 0);
    }
    gm_config c;
    memset(&c, 0, sizeof c);
    memset(c.trace_file, 'a', sizeof c.trace_file - 1); /* as long as a name can be */
    CHECK_STATUS(gm_config_trace_for_device(&c, 1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "device 1");
    CHECK(strlen(c.trace_file) == sizeof c.trace_file - 1 && c.trace_file[0] == 'a');
    CHECK_STATUS(gm_config_trace_for_device(&c, -1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_trace_for_device(NULL, 0), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "NULL");
}


/* gm_config_format's doubles read back exactly, every value the parser accepts: the parser
 * refused denormals ("5e-324": strtod's ERANGE), which the format wrote. Fractions in [0, 1]
 * and ratios in [0, DBL_MAX], the edges and 20,000 random bit patterns per key, through
 * gm_config_get / gm_config_set and through the whole gm_config_format / gm_config_parse. */
static void test_double_round_trip(void)
{
    static const char *const keys[] = {"growth_fraction", "cache_cap_live_ratio",
                                       "defrag_threshold", "defrag_copy_bandwidth"};
    static const double edges[] = {0.0, -0.0, 5e-324, DBL_TRUE_MIN, 2 * DBL_TRUE_MIN,
                                   2.2250738585072009e-308, DBL_MIN, 1e-300, 0.1, 0.375,
                                   0.9999999999999999, 1.0, 1.0000000000000002, 3.0, 1e300,
                                   DBL_MAX};
    uint64_t seed = 0x9E3779B97F4A7C15u;
    unsigned bad = 0;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        bool fraction = strstr(keys[k], "ratio") == NULL && strstr(keys[k], "bandwidth") == NULL;
        for (int i = 0; i < 20000 + (int)(sizeof edges / sizeof edges[0]); i++) {
            double d;
            if (i < (int)(sizeof edges / sizeof edges[0])) {
                d = edges[i];
            } else {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                uint64_t bits = seed & ~((uint64_t)1 << 63); /* non-negative */
                if (i % 4 == 0)
                    bits &= ((uint64_t)1 << 52) - 1; /* a denormal */
                memcpy(&d, &bits, sizeof d);
                if (fraction && i % 2)
                    d = (double)(seed >> 11) / 9007199254740992.0; /* in [0, 1) */
            }
            if (!isfinite(d) || (fraction && d > 1.0))
                continue; /* not a value of the key's type */
            char text[64], back[64];
            snprintf(text, sizeof text, "%.17g", d);
            gm_config c = {0};
            if (gm_config_set(&c, keys[k], text) != GM_OK) { /* %.17g reads back exactly */
                if (bad++ < 5)
                    fprintf(stderr, "%s=%s refused: %s\n", keys[k], text, gm_last_error(NULL));
                continue;
            }
            gm_config again = {0};
            if (gm_config_get(&c, keys[k], back, sizeof back) != GM_OK ||
                gm_config_set(&again, keys[k], back) != GM_OK ||
                memcmp(&c, &again, sizeof c) != 0) {
                if (bad++ < 5)
                    fprintf(stderr, "%s=%s did not read back (got \"%s\")\n", keys[k], text,
                            back);
                continue;
            }
            if (i % 97 == 0 || i < (int)(sizeof edges / sizeof edges[0])) { /* the whole text */
                char all[4096];
                gm_config whole = {0};
                if (gm_config_format(&c, all, sizeof all) >= sizeof all ||
                    gm_config_parse(&whole, all) != GM_OK || memcmp(&whole, &c, sizeof c) != 0)
                    if (bad++ < 5)
                        fprintf(stderr, "%s=%s: gm_config_format did not parse back\n",
                                keys[k], text);
            }
        }
    }
    CHECK_EQ_U(bad, 0);
    /* what still fails: values that are not the key's type, and an underflow to 0 */
    gm_config c = {0};
    CHECK_STATUS(gm_config_set(&c, "growth_fraction", "1e-400"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "growth_fraction", "1.0000000000000002"),
                 GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "cache_cap_live_ratio", "1e309"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_config_set(&c, "cache_cap_live_ratio", "-5e-324"), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_config_set(&c, "cache_cap_live_ratio", "5e-324"));
    CHECK(c.cache_cap_live_ratio == DBL_TRUE_MIN);
}

/* A size that is not zero but rounds to 0 bytes is refused, with a message (it gave 0, which
 * every key reads as "the default"); one that rounds to a nonzero count of bytes is rounded to
 * the nearest byte. 0 itself, with or without a unit, stays 0. */
static void test_size_rounding_to_zero(void)
{
    size_t v = 77;
    CHECK_STATUS(gm_size_parse("0.0001K", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "0.0001K");
    CHECK_STR_CONTAINS(gm_last_error(NULL), "0 bytes");
    CHECK_STATUS(gm_size_parse("0.0000000000001T", &v), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_size_parse("0.0004K", &v), GM_ERR_INVALID_ARGUMENT); /* 0.41 bytes */
    CHECK_EQ_U(v, 77);
    CHECK_OK(gm_size_parse("0.0005K", &v)); /* 0.512 bytes: 1 */
    CHECK_EQ_U(v, 1);
    CHECK_OK(gm_size_parse("0.0K", &v));
    CHECK_EQ_U(v, 0);
    CHECK_OK(gm_size_parse("0", &v));
    CHECK_EQ_U(v, 0);
    CHECK_OK(gm_size_parse("0.00000G", &v));
    CHECK_EQ_U(v, 0);
    CHECK_OK(gm_size_parse("1.0001K", &v)); /* 1024.1024: the nearest byte */
    CHECK_EQ_U(v, 1024);
    gm_config c = {0};
    CHECK_STATUS(gm_config_set(&c, "reserve_limit", "0.0001K"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "reserve_limit");
    CHECK_EQ_U(c.reserve_limit_bytes, 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--docs") == 0) {
        test_docs(argv[2]);
        return check_summary();
    }
    test_key_tables();
    test_sizes();
    test_every_type();
    test_bad_values();
    test_overflow();
    test_unknown_keys();
    test_parse();
    test_get_and_format();
    test_resolve();
    test_vmm_run_pages();
    test_vmm_run_scale();
    test_trace_for_device();
    test_double_round_trip();
    test_size_rounding_to_zero();
    return check_summary();
}
