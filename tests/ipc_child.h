/*
 * Two-process tests (docs/multi-gpu.md): the parent hands a gm_ipc_handle to a fresh copy of the
 * test binary (fork + exec of /proc/self/exe), which opens it as another process would. Exec
 * matters on CUDA -- a forked child cannot use the parent's driver state -- and keeps the sim
 * honest too: the child shares no mapping with the parent, only what the handle names.
 *
 *   run_child("MODE", &handle, "ARG", ...)   exit status of `argv0 --child MODE HEX ARG...`
 *   child_handle(hex, &handle)               decode the handle in the child
 */
#ifndef GM_TEST_IPC_CHILD_H
#define GM_TEST_IPC_CHILD_H

#include "gpumem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CHILD_MAX_ARGS = 8 };

static inline void handle_to_hex(const gm_ipc_handle *h, char *hex)
{
    for (size_t i = 0; i < sizeof h->bytes; i++)
        snprintf(hex + 2 * i, 3, "%02x", h->bytes[i]);
}

static inline int child_handle(const char *hex, gm_ipc_handle *h)
{
    if (strlen(hex) != 2 * sizeof h->bytes)
        return -1;
    for (size_t i = 0; i < sizeof h->bytes; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        h->bytes[i] = (unsigned char)v;
    }
    return 0;
}

/* Run this binary as `--child mode HEX args...` (NULL-terminated) and return its exit status
 * (128 + signal when killed, -1 when it could not run). */
static inline int run_child(const char *mode, const gm_ipc_handle *h, ...)
{
    static char hex[2 * GM_IPC_HANDLE_BYTES + 1];
    handle_to_hex(h, hex);
    char *argv[CHILD_MAX_ARGS + 5] = {"ipc-child", "--child", (char *)mode, hex};
    int argc = 4;
    va_list ap;
    va_start(ap, h);
    for (const char *a; argc < CHILD_MAX_ARGS + 4 && (a = va_arg(ap, const char *));)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#endif /* GM_TEST_IPC_CHILD_H */
