/*
 * gpumem as CuPy's device allocator, through cupy.cuda.memory.CFunctionAllocator (CuPy 14):
 * CuPy calls gmpy_cupy_malloc(param, size, device) / gmpy_cupy_free(param, ptr, device) with
 * the GIL held, so no Python code runs per allocation. python/gpumem/cupy.py sets it up.
 *
 * Streams: every allocation and free is made on CuPy's current stream, read through CuPy's own
 * C API (get_current_stream_ptr, exported by its Cython module as a capsule; cupy.py finds it).
 * A block freed on another stream than the one it was allocated on waits behind an event, as
 * gm_free promises, so this is safe whatever stream an array dies on.
 *
 * Out of memory: malloc raises cupy.cuda.memory.OutOfMemoryError (gpumem's diagnosis added as
 * a note) and returns (void *)-1, the value CuPy's Cython caller checks for a pending
 * exception (its `except? -1`); gmpy_cupy_free ignores that value, should CuPy ever hand it
 * back. Pools are made lazily, one per device, on the CUDA backend.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gpumem.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define GMPY_API __attribute__((visibility("default")))
enum { MAX_DEVICES = 64 };
#define FAILED_PTR ((void *)(intptr_t)-1)

typedef intptr_t (*stream_fn)(void);

typedef struct gmpy_cupy {
    char conf[4096];               /* GPUMEM_CONF-style settings for every device's pool */
    stream_fn current_stream;      /* CuPy's get_current_stream_ptr; NULL: default stream */
    PyObject *oom_error;           /* cupy.cuda.memory.OutOfMemoryError (owned reference) */
    gm_backend *backends[MAX_DEVICES];
    gm_pool *pools[MAX_DEVICES];
    uint64_t failed_frees;         /* frees gpumem refused (a pointer not from these pools) */
    int trace_stopped;             /* gmpy_cupy_trace_stop ran: pools made later do not trace */
} gmpy_cupy;

GMPY_API gmpy_cupy *gmpy_cupy_new(const char *conf, void *current_stream, PyObject *oom_error)
{
    gmpy_cupy *c = PyMem_RawCalloc(1, sizeof *c);
    if (!c)
        return NULL;
    snprintf(c->conf, sizeof c->conf, "%s", conf ? conf : "");
    c->current_stream = (stream_fn)current_stream;
    Py_XINCREF(oom_error);
    c->oom_error = oom_error;
    return c;
}

/* Device `device`'s pool, made on first use. NULL with a Python exception set on failure. */
GMPY_API gm_pool *gmpy_cupy_pool(gmpy_cupy *c, int device)
{
    if (device < 0 || device >= MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "gpumem.cupy: device %d is out of range", device);
        return NULL;
    }
    if (c->pools[device])
        return c->pools[device];
    gm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    gm_status st = gm_config_parse(&cfg, c->conf);
    if (st == GM_OK && c->trace_stopped)
        cfg.trace_file[0] = '\0';
    if (st == GM_OK) /* a trace file of its own per device */
        st = gm_config_trace_for_device(&cfg, device);
    if (st != GM_OK) {
        PyErr_Format(PyExc_ValueError, "gpumem.cupy: %s", gm_last_error(NULL));
        return NULL;
    }
    gm_backend *b = NULL;
    st = gm_cuda_backend_create(device, &b);
    if (st != GM_OK) {
        PyErr_Format(PyExc_RuntimeError, "gpumem.cupy: cannot open CUDA device %d: %s: %s", device,
                     gm_status_str(st), gm_backend_last_error());
        return NULL;
    }
    gm_pool *p = NULL;
    st = gm_pool_create(b, &cfg, &p);
    if (st != GM_OK) {
        PyErr_Format(PyExc_RuntimeError, "gpumem.cupy: cannot create the pool: %s: %s",
                     gm_status_str(st), gm_last_error(NULL));
        gm_backend_destroy(b);
        return NULL;
    }
    c->backends[device] = b;
    c->pools[device] = p;
    return p;
}

static gm_stream current_stream(gmpy_cupy *c)
{
    return c->current_stream ? (gm_stream)c->current_stream() : NULL;
}

static void raise_oom(gmpy_cupy *c, gm_pool *pool, size_t size)
{
    char why[1024]; /* copied first: a later call may replace the pool's message */
    snprintf(why, sizeof why, "%s", gm_last_error(pool));
    gm_stats st;
    size_t reserved = gm_pool_stats(pool, &st) == GM_OK ? st.reserved_bytes : 0;
    PyObject *exc = c->oom_error ? PyObject_CallFunction(c->oom_error, "nn", (Py_ssize_t)size,
                                                         (Py_ssize_t)reserved)
                                 : NULL;
    if (!exc) {
        PyErr_Clear();
        PyErr_Format(PyExc_MemoryError, "gpumem: %s", why);
        return;
    }
    PyObject *note = PyObject_CallMethod(exc, "add_note", "s", why); /* Python >= 3.11 */
    if (!note)
        PyErr_Clear();
    Py_XDECREF(note);
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
}

GMPY_API void *gmpy_cupy_malloc(void *param, size_t size, int device)
{
    gmpy_cupy *c = param;
    gm_pool *pool = gmpy_cupy_pool(c, device);
    if (!pool)
        return FAILED_PTR;
    gm_stream stream = current_stream(c);
    if ((intptr_t)stream == -1 && PyErr_Occurred())
        return FAILED_PTR;
    void *p = NULL;
    gm_status st = gm_alloc(pool, size, stream, &p);
    if (st == GM_OK)
        return p;
    if (st == GM_ERR_OUT_OF_MEMORY)
        raise_oom(c, pool, size);
    else
        PyErr_Format(PyExc_RuntimeError, "gpumem: gm_alloc of %zu bytes failed: %s: %s", size,
                     gm_status_str(st), gm_last_error(pool));
    return FAILED_PTR;
}

GMPY_API void gmpy_cupy_free(void *param, void *ptr, int device)
{
    gmpy_cupy *c = param;
    if (!ptr || ptr == FAILED_PTR || device < 0 || device >= MAX_DEVICES || !c->pools[device])
        return;
    gm_stream stream = current_stream(c);
    if ((intptr_t)stream == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* a free cannot fail in CuPy: the block waits behind an event instead */
        stream = NULL;
    }
    if (gm_free(c->pools[device], ptr, stream) != GM_OK)
        c->failed_frees++;
}

/* The pool of `device` if it was made (NULL otherwise): for stats, summary, trim. */
GMPY_API gm_pool *gmpy_cupy_existing_pool(gmpy_cupy *c, int device)
{
    return device >= 0 && device < MAX_DEVICES ? c->pools[device] : NULL;
}

GMPY_API uint64_t gmpy_cupy_failed_frees(gmpy_cupy *c)
{
    return c->failed_frees;
}

/* Stop tracing on every pool and complete the files (gm_pool_trace_stop): the pools live
 * until the process ends, so this is what ends a trace. */
GMPY_API void gmpy_cupy_trace_stop(gmpy_cupy *c)
{
    c->trace_stopped = 1;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (c->pools[d])
            (void)gm_pool_trace_stop(c->pools[d]);
}

/* Destroy every pool (live blocks too: call it only when CuPy holds no more arrays). */
GMPY_API void gmpy_cupy_destroy(gmpy_cupy *c)
{
    if (!c)
        return;
    for (int d = 0; d < MAX_DEVICES; d++) {
        if (c->pools[d])
            gm_pool_destroy_force(c->pools[d]);
        if (c->backends[d])
            gm_backend_destroy(c->backends[d]);
    }
    Py_XDECREF(c->oom_error);
    PyMem_RawFree(c);
}
