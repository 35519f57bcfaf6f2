/*
 * The configuration (config.c): gm_pool_create's resolution of the settings.
 */
#ifndef GM_CONFIG_H
#define GM_CONFIG_H

#include "types.h"

/* Fill every default of `in` (NULL = all defaults) into *out and check the result, as
 * gm_pool_create does; `be` NULL leaves the device-dependent parts (vmm_reserve_bytes, the VMM
 * check). On failure *out is untouched and `why` says what is wrong (no function prefix). */
gm_status config_resolve(const gm_backend *be, const gm_config *in, gm_config *out, char *why,
                         size_t why_len);

#endif
