"""The product thread pool's back-off after a late worker (csrc/gt_matmul.h, gt_pool_wanted).

A late wait (a worker descheduled while it holds a chunk) makes the products of the
next milliseconds serial.  The spell is a time: once it has passed, the next product
uses the workers again, however many products ran during it (a count of serial runs,
up to 4096, once kept a training step's products serial for seconds after another
library's threads had spun on the other core for a moment).  Throughout, every
product has the serial product's bits, on 2, 3 and 7 threads, with spinning threads
competing for the cores.  Nothing here asserts a time: the program waits for the
spell's end, read from the pool itself.
"""

from __future__ import annotations

from support_backends import run_c_program

POOL_BACKOFF = r"""
#include <stdio.h>
#include "gt_matmul.h"

#define M 200
#define K 64
#define N 200
static double A[M * K], B[K * N], C[M * N], R[M * N];
static atomic_int stop;

static void *spin(void *arg) { (void)arg; while (!atomic_load(&stop)) {} return NULL; }

static int product_ok(void)
{
    gt_mm_run(C, A, 0, K, 1, B, 0, N, 1, 1, M, K, N, 0);
    for (int i = 0; i < M * N; ++i)
        if (C[i] != R[i]) return 0;
    return 1;
}

static void sleep_past(long long t)
{
    while (gt_now_ns() <= t) {
        struct timespec d = {0, 200000};
        nanosleep(&d, NULL);
    }
}

int main(void)
{
    for (int i = 0; i < M * K; ++i) A[i] = (i % 17) * 0.25 - 2 + i * 1e-9;
    for (int i = 0; i < K * N; ++i) B[i] = (i % 13) * 0.5 - 3 + i * 1e-9;
    gt_mm_set_threads_impl(1);
    gt_mm_run(R, A, 0, K, 1, B, 0, N, 1, 1, M, K, N, 0);
    long long spells = 0;
    const int counts[3] = {2, 3, 7};
    for (int c = 0; c < 3; ++c) {
        const int t = counts[c];
        gt_mm_set_threads_impl(t);
        pthread_t th[2];
        atomic_store(&stop, 0);
        for (int s = 0; s < 2; ++s) pthread_create(&th[s], NULL, spin, NULL);
        for (int rep = 0; rep < 100; ++rep) {
            if (!product_ok()) { printf("mismatch: %d threads, busy, run %d\n", t, rep); return 1; }
            if (atomic_load(&gt_pool.serial_until) > gt_now_ns()) ++spells;
        }
        atomic_store(&stop, 1);
        for (int s = 0; s < 2; ++s) pthread_join(th[s], NULL);
        /* whatever the busy spell left, once its serial time has passed the very next
         * product is threaded again */
        sleep_past(atomic_load(&gt_pool.serial_until));
        long long before = atomic_load(&gt_pool.threaded);
        if (!product_ok()) { printf("mismatch: %d threads, after\n", t); return 1; }
        if (atomic_load(&gt_pool.threaded) != before + 1) {
            printf("%d threads: still serial after the spell\n", t);
            return 1;
        }
        /* a spell in force: serial products (the workers unused), the same bits */
        atomic_store(&gt_pool.serial_until, gt_now_ns() + 3600000000000LL);
        before = atomic_load(&gt_pool.threaded);
        for (int rep = 0; rep < 50; ++rep)
            if (!product_ok()) { printf("mismatch: %d threads, serial spell\n", t); return 1; }
        if (atomic_load(&gt_pool.threaded) != before) {
            printf("%d threads: threaded during a spell\n", t);
            return 1;
        }
        atomic_store(&gt_pool.serial_until, 0);
        if (!product_ok() || atomic_load(&gt_pool.threaded) != before + 1) {
            printf("%d threads: not threaded once the spell ended\n", t);
            return 1;
        }
    }
    printf("ok %lld %lld\n", (long long)atomic_load(&gt_pool.threaded), spells);
    return 0;
}
"""


def test_serial_spell_after_a_late_worker_ends_and_never_changes_bits(tmp_path):
    run_c_program(tmp_path, POOL_BACKOFF, "backoff")

