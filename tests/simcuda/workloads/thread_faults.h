/* The page faults the benchmarks' timed loops take, summed over their threads (bench_calls.c,
 * bench_pair.c). RUSAGE_THREAD needs _GNU_SOURCE defined before the first include. */
#ifndef THREAD_FAULTS_H
#define THREAD_FAULTS_H

#include <sys/resource.h>

static _Atomic long minor_faults, major_faults;

/* The calling thread's usage now: taken before its timed loop. */
static inline struct rusage thread_usage(void) {
    struct rusage now;
    getrusage(RUSAGE_THREAD, &now);
    return now;
}

/* Adds the faults the calling thread took since `before` to the totals. */
static inline void add_faults_since(const struct rusage *before) {
    struct rusage now = thread_usage();
    minor_faults += now.ru_minflt - before->ru_minflt;
    major_faults += now.ru_majflt - before->ru_majflt;
}

#endif
