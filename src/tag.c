/*
 * Tags (docs/sleep.md): a per-thread current tag names the blocks the thread allocates, so that
 * gm_pool_sleep can keep some groups' contents ("weights") and drop others ("kv_cache").
 *
 * Names are interned process-wide in a table of at most GM_TAG_MAX (255) entries, id 0 being
 * "default"; an id is one byte, stored in the block record (gm_block.tag_id) at allocation. The
 * table only grows, under a mutex; a reader indexes it without the lock (an entry is written
 * before the count that publishes it, release/acquire). Each thread keeps a stack of ids
 * (depth <= GM_TAG_DEPTH_MAX); its top is gm_tag_tls, which both allocation paths read: one load
 * of a thread-local byte (TLS descriptors, -mtls-dialect=gnu2) and one store into the record.
 * The lowest layer: every layer may read the current tag or a name.
 */
#include "error.h"
#include "tag.h"
#include "types.h"

#include <string.h>

static pthread_mutex_t tag_lock = PTHREAD_MUTEX_INITIALIZER;
static char tag_names[GM_TAG_MAX + 1][GM_TAG_NAME_MAX + 1] = {"default"};
static _Atomic unsigned tag_count = 1;

_Thread_local uint8_t gm_tag_tls;
static _Thread_local uint8_t tag_stack[GM_TAG_DEPTH_MAX];
static _Thread_local unsigned tag_depth;

const char *tag_name(unsigned id)
{
    return id < atomic_load_explicit(&tag_count, memory_order_acquire) ? tag_names[id] : "?";
}

/* Why `name` is not a valid tag name, or NULL if it is. */
static const char *tag_name_invalid(const char *name, size_t len)
{
    if (!len)
        return "a tag name is 1 to 31 characters; this one is empty";
    if (len > GM_TAG_NAME_MAX)
        return "a tag name is 1 to 31 characters; this one is longer";
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return "a tag name is made of letters, digits, '_', '.' and '-'";
    }
    return NULL;
}

gm_status tag_lookup(const char *name, size_t len, bool add, unsigned *out, const char **why)
{
    const char *bad = tag_name_invalid(name, len);
    if (bad) {
        *why = bad;
        return GM_ERR_INVALID_ARGUMENT;
    }
    unsigned n = atomic_load_explicit(&tag_count, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (strncmp(tag_names[i], name, len) == 0 && tag_names[i][len] == '\0') {
            *out = i;
            return GM_OK;
        }
    if (!add) {
        *out = GM_TAG_MAX + 1; /* no block has it */
        return GM_OK;
    }
    pthread_mutex_lock(&tag_lock);
    gm_status st = GM_OK;
    n = atomic_load_explicit(&tag_count, memory_order_relaxed);
    unsigned i = 0;
    while (i < n && !(strncmp(tag_names[i], name, len) == 0 && tag_names[i][len] == '\0'))
        i++;
    if (i == n) { /* still new: another thread did not add it meanwhile */
        if (n > GM_TAG_MAX) {
            *why = "the process has 255 tag names already (GM_TAG_MAX)";
            st = GM_ERR_HOST_MEMORY;
        } else {
            memcpy(tag_names[n], name, len);
            tag_names[n][len] = '\0';
            atomic_store_explicit(&tag_count, n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&tag_lock);
    *out = i;
    return st;
}

gm_status gm_tag_push(const char *name)
{
    if (!name)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_tag_push", "name is NULL");
    if (tag_depth >= GM_TAG_DEPTH_MAX)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_tag_push",
                            "tags nest at most 16 deep (GM_TAG_DEPTH_MAX): a gm_tag_pop missing?");
    unsigned id = 0;
    const char *why = NULL;
    gm_status st = tag_lookup(name, strlen(name), true, &id, &why);
    if (st != GM_OK)
        return fail_no_pool(st, "gm_tag_push", why);
    tag_stack[tag_depth++] = gm_tag_tls;
    gm_tag_tls = (uint8_t)id;
    return GM_OK;
}

gm_status gm_tag_pop(void)
{
    if (!tag_depth)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_tag_pop",
                            "no tag is pushed on this thread");
    gm_tag_tls = tag_stack[--tag_depth];
    return GM_OK;
}

const char *gm_tag_current(void)
{
    return tag_name(gm_tag_tls);
}
