/*
 * Tags (tag.c; docs/sleep.md): the thread's current tag, names interned.
 */
#ifndef GM_TAG_H
#define GM_TAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "gpumem.h"

/* The calling thread's current tag (0 = "default"): both allocation paths store it in the
 * block (gm_block.tag_id). */
extern _Thread_local uint8_t gm_tag_tls;
const char *tag_name(unsigned id); /* "?" for an id no name has */
/* The id of tag `name` (len bytes, not NUL-terminated). `add`: interned if new (fails when the
 * table is full); else GM_TAG_MAX + 1 for a name no block can have. A bad name:
 * GM_ERR_INVALID_ARGUMENT; *why says what is wrong. */
gm_status tag_lookup(const char *name, size_t len, bool add, unsigned *out, const char **why);

#endif
