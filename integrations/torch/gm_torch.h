/*
 * libgpumem_torch.so: gpumem as PyTorch's pluggable CUDA allocator (docs/torch.md).
 *
 * One gpumem pool per device (0..63), created on first use from the `device` argument and one
 * configuration: the environment variable GPUMEM_CONF (comma-separated KEY=VALUE with the keys of
 * `gpumem --set`, plus backend=cuda|sim), read once, or gm_torch_configure called before the
 * first pool. With backend=sim the devices are one simulated machine of sim.devices devices
 * (default 8); a device it lacks fails with a message.
 * Every function is thread-safe. Includes no CUDA header.
 */
#ifndef GM_TORCH_H
#define GM_TORCH_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GM_TORCH_API __attribute__((visibility("default")))
#else
#define GM_TORCH_API
#endif

/* The CUDA runtime's stream type (ABI-identical to gm_stream). */
typedef struct CUstream_st *cudaStream_t;

/* PyTorch's alloc function: `size` bytes on `device` for `stream`, GM_ALIGNMENT-aligned.
 * size 0 returns NULL and records nothing; a failure returns NULL and records the message
 * (gm_torch_last_error(device)). */
GM_TORCH_API void *gm_torch_alloc(ssize_t size, int device, cudaStream_t stream);

/* PyTorch's free function. NULL is ignored. A pointer that is not a live block of `device`'s
 * pool is looked up in the other devices' pools; if it is nobody's (or already freed), that is
 * reported on stderr once per kind of error and per device, and ignored. */
GM_TORCH_API void gm_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream);

/* Set the configuration (GPUMEM_CONF's syntax) for the pools not yet created; the environment
 * variable is then not read. Returns 0, or -1 (nothing changed, message in
 * gm_torch_last_error(-1)) on a bad entry or once a pool exists. */
GM_TORCH_API int gm_torch_configure(const char *conf);

/* The configuration text in effect ("" = all defaults on cuda). Thread-local copy. */
GM_TORCH_API const char *gm_torch_config_string(void);

/* gm_stats of `device`'s pool as one JSON object, snprintf-style: writes at most len bytes
 * (NUL included) into buf and returns the full length, or -1 on failure. */
GM_TORCH_API int gm_torch_stats_json(int device, char *buf, size_t len);

/* gm_pool_snapshot of `device`'s pool into *out (malloc'd, NUL-terminated; free it with
 * gm_torch_string_free). Returns 0 or -1. */
GM_TORCH_API int gm_torch_snapshot(int device, char **out);
GM_TORCH_API void gm_torch_string_free(char *s);

/* gm_trim on `device`'s pool: at most `keep` bytes stay reserved. Returns 0 or -1. */
GM_TORCH_API int gm_torch_trim(int device, size_t keep);

/* The last message recorded for `device` ("" if none); a device outside 0..63 gives the last
 * message that belonged to no device (configuration, bad device numbers). Thread-local copy,
 * valid until this thread's next call. */
GM_TORCH_API const char *gm_torch_last_error(int device);

#ifdef __cplusplus
}
#endif
#endif /* GM_TORCH_H */
