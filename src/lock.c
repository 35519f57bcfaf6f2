/*
 * The contended paths of the pool lock (gm_mutex, internal.h).
 *
 * A waiter first spins a little: the lock is usually held for well under a microsecond (a
 * locked gm_alloc or gm_free), and sleeping costs two system calls. Then it marks the lock
 * "held and waited for" (2) and sleeps on the futex until a holder's unlock, seeing 2, wakes
 * one sleeper. A woken thread takes the lock as 2 again (others may still sleep): at worst one
 * wake-up too many, never a lost one.
 */
#include "internal.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <sched.h>
#endif

enum { SPINS = 100 };

void gm_mutex_wait(gm_mutex *m)
{
    for (int i = 0; i < SPINS; i++) {
        cpu_relax();
        uint32_t free_state = 0;
        if (atomic_load_explicit(&m->state, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&m->state, &free_state, 1,
                                                  memory_order_acquire, memory_order_relaxed))
            return;
    }
    while (atomic_exchange_explicit(&m->state, 2, memory_order_acquire) != 0) {
#if defined(__linux__)
        (void)syscall(SYS_futex, &m->state, FUTEX_WAIT_PRIVATE, 2u, NULL, NULL, 0);
#else
        sched_yield();
#endif
    }
}

void gm_mutex_wake(gm_mutex *m)
{
#if defined(__linux__)
    (void)syscall(SYS_futex, &m->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#else
    (void)m;
#endif
}
