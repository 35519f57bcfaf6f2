/*
 * The pool lock and spin locks (lock.c): taken and dropped inline, waited for out of line;
 * the helper threads' timed waits.
 */
#ifndef GM_LOCK_H
#define GM_LOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static inline void spin_lock(atomic_flag *f)
{
    while (atomic_flag_test_and_set_explicit(f, memory_order_acquire))
        cpu_relax();
}
static inline void spin_unlock(atomic_flag *f)
{
    atomic_flag_clear_explicit(f, memory_order_release);
}

/* The pool lock: a futex mutex with three states (Drepper, "Futexes Are Tricky", mutex 2):
 * 0 free, 1 held, 2 held and maybe waited for. Taking and dropping it uncontended is one atomic
 * instruction each, inline: glibc's pthread_mutex_lock/unlock were ~53 instructions per
 * gm_alloc/gm_free on the locked path (callgrind, gpt2_train), a tenth of it. It may be held
 * across device calls (growth, release: up to milliseconds), so a waiter spins briefly, then
 * sleeps in the kernel (lock.c). Not recursive, like the default pthread mutex it replaces. */
typedef struct gm_mutex {
    _Atomic uint32_t state;
} gm_mutex;

void gm_mutex_wait(gm_mutex *m); /* the contended paths (lock.c) */
void gm_mutex_wake(gm_mutex *m);

/* The library's helper threads' timed waits (lock.c; the trace writer, the unmapping thread):
 * a condition variable timed on CLOCK_MONOTONIC, so that a wall-clock jump neither stretches
 * nor cuts a wait (0 on success, as pthread_cond_init), and a wait on it (m held) of at most
 * ns nanoseconds. */
int gm_cond_init_monotonic(pthread_cond_t *c);
void gm_cond_wait_ns(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns);

/* Take the lock; true if another thread held it and this one had to wait. */
static inline bool gm_mutex_lock_waited(gm_mutex *m)
{
    uint32_t free_state = 0;
    if (atomic_compare_exchange_strong_explicit(&m->state, &free_state, 1, memory_order_acquire,
                                                memory_order_relaxed))
        return false;
    gm_mutex_wait(m);
    return true;
}
static inline void gm_mutex_lock(gm_mutex *m)
{
    (void)gm_mutex_lock_waited(m);
}
static inline void gm_mutex_unlock(gm_mutex *m)
{
    if (atomic_exchange_explicit(&m->state, 0, memory_order_release) == 2)
        gm_mutex_wake(m);
}

#endif
