/*
 * The contended paths of the pool lock (gm_mutex, lock.h).
 *
 * A waiter first spins a little: the lock is usually held for well under a microsecond (a
 * locked gm_alloc or gm_free), and sleeping costs two system calls. Then it marks the lock
 * "held and waited for" (2) and sleeps on the futex until a holder's unlock, seeing 2, wakes
 * one sleeper. A woken thread takes the lock as 2 again (others may still sleep): at worst one
 * wake-up too many, never a lost one.
 *
 * Also the helper threads' timed waits (gm_cond_wait_ns).
 */
#include "lock.h"
#include "types.h"

#include <time.h>

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

int gm_cond_init_monotonic(pthread_cond_t *c)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

void gm_cond_wait_ns(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t nsec = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(nsec / 1000000000u);
    ts.tv_nsec = (long)(nsec % 1000000000u);
    (void)pthread_cond_timedwait(c, m, &ts);
}
