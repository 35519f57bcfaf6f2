/*
 * The one hash map (src/hashmap.h), alone: random inserts and erases checked against a plain
 * array after every step, under a good hash and under one that piles every key onto 7 homes
 * (long probe runs that wrap around the end of the slots, the backward shift's hard cases);
 * the probe-run invariant (no empty slot between an entry and its home); growth; and a host
 * allocation failure while growing, which leaves the map as it was. (The live map, the other
 * form, GM_HASHMAP over block records, is exercised by every pool test.)
 */
#include "check.h"
#include "hashmap.h"

/* The hash: Fibonacci, or 7 homes, the last 7 slots whatever the cap (runs wrap around). */
static bool clustered;

static uint64_t test_hash(uintptr_t k)
{
    if (clustered)
        return (uint64_t)(0xFFFFFFFFu - k % 7) << 32;
    return (uint64_t)k * 0x9E3779B97F4A7C15ull;
}

GM_HASHMAP_KV(tmap, test_map, unsigned, test_hash)
typedef tmap_entry entry;

static bool tmap_grow(test_map *m)
{
    return tmap_resize(m, m->cap ? m->cap * 2 : 4);
}

enum { KEYS = 300 };

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Every entry lies in the probe run from its home; the count and the load are right; every key
 * of the reference is found with its value, every other key is not. */
static void check_map(const test_map *m, const unsigned *ref)
{
    size_t filled = 0, live = 0;
    for (size_t j = 0; j < m->cap; j++) {
        if (tmap_empty(m->slots[j]))
            continue;
        filled++;
        for (size_t k = tmap_slot(m, m->slots[j].key); k != j; k = (k + 1) & (m->cap - 1))
            if (!CHECK(!tmap_empty(m->slots[k])))
                return;
    }
    for (uintptr_t key = 1; key <= KEYS; key++) {
        size_t slot = SIZE_MAX;
        entry e = tmap_find_entry(m, key, &slot);
        if (ref[key]) {
            live++;
            if (!CHECK(e.key == key && e.val == ref[key] && slot < m->cap &&
                       m->slots[slot].key == key))
                return;
        } else if (!CHECK(tmap_empty(e) && slot == SIZE_MAX && tmap_find(m, key) == SIZE_MAX)) {
            return;
        }
    }
    CHECK_EQ_U(filled, live);
    CHECK_EQ_U(m->count, live);
    CHECK(m->cap == 0 || 2 * m->count <= m->cap);
}

static void random_ops(bool clustered_hash, unsigned steps)
{
    clustered = clustered_hash;
    test_map m = {0};
    unsigned ref[KEYS + 1] = {0};
    check_map(&m, ref);
    for (unsigned i = 1; i <= steps; i++) {
        uintptr_t key = 1 + next_rand() % KEYS;
        if (ref[key]) {
            size_t j = tmap_find(&m, key);
            REQUIRE(j != SIZE_MAX);
            tmap_erase(&m, j);
            ref[key] = 0;
        } else {
            REQUIRE(tmap_insert(&m, (entry){key, i}));
            ref[key] = i;
        }
        check_map(&m, ref);
        if (check_failed_)
            break;
    }
    free(m.slots);
}

/* Growth fails: false, and every entry still where it was. */
static void grow_failure(void)
{
    clustered = false;
    test_map m = {0};
    unsigned ref[KEYS + 1] = {0};
    for (uintptr_t key = 1; !tmap_full(&m) || m.cap == 0; key++) {
        REQUIRE(tmap_insert(&m, (entry){key, (unsigned)key}));
        ref[key] = (unsigned)key;
    }
    size_t cap = m.cap;
    entry *slots = m.slots;
    gm_host_fault_set(1, false);
    CHECK(!tmap_insert(&m, (entry){KEYS, 7}));
    gm_host_fault_clear();
    CHECK(m.slots == slots);
    CHECK_EQ_U(m.cap, cap);
    check_map(&m, ref);
    CHECK(tmap_insert(&m, (entry){KEYS, 7})); /* room again */
    ref[KEYS] = 7;
    CHECK_EQ_U(m.cap, 2 * cap);
    check_map(&m, ref);
    free(m.slots);
}

int main(void)
{
    random_ops(false, 20000);
    random_ops(true, 20000);
    grow_failure();
    return check_summary();
}
