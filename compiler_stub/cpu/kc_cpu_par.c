/*
 * kc_cpu_par.c - the threads a CPU kernel runs on (kc_rt.parallel): OpenMP's thread team,
 * the same team oneDNN's primitives use (Debian's oneDNN is built on GNU OpenMP), so the
 * generated loops and the primitives never oversubscribe the cores between them. The only
 * file built with -fopenmp: generated kernels stay plain C (no libgomp in a cpu-so) and
 * reach the team through this callback.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "kc_cpu.h"

/* Set once this process has asked OpenMP for a thread team (libgomp is loaded lazily: a
 * process that never did must not load it only to release nothing). */
static atomic_bool team_used;

void kc_cpu_parallel(const kc_rt *rt, long n, void (*fn)(void *arg, long t), void *arg)
{
    int nt = rt->threads < n ? rt->threads : (int)n;
    atomic_store(&team_used, true);
    /* static: task t always lands on the same thread, which keeps its data in that core's
     * cache from one kernel call to the next */
#pragma omp parallel for num_threads(nt) schedule(static)
    for (long t = 0; t < n; t++)
        fn(arg, t);
}

void kc_cpu_set_threads(int threads)
{
    atomic_store(&team_used, true);
    omp_set_num_threads(threads > 0 ? threads : 1);
}

void kc_cpu_release_threads(void)
{
    /* the calling thread's idle team exits (libgomp: omp_pause_soft frees that thread's
     * pool; -1, harmless, inside a parallel region); a later region starts a new one */
    if (atomic_load(&team_used))
        (void)omp_pause_resource_all(omp_pause_soft);
}

int kc_cpu_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
