/*
 * The shared-memory allreduce limit of this machine: two threads of one process sum two f32
 * buffers out of place, with no transport between them, the way a 2-rank allreduce over
 * shared memory must at the least (benches/compare/limits.sh prints it).
 *
 *   cc -O3 -march=native -pthread -o allreduce_limit benches/compare/allreduce_limit.c
 *   ./allreduce_limit [MiB] [repeats]
 *
 * Each thread owns one input and one output of MiB (default 64). Thread t reduces its half of
 * the elements, out_t[h_t] = in_0[h_t] + in_1[h_t], then, after a barrier, copies the other
 * thread's half of the result into its own output: the reduce-scatter and allgather of a
 * 2-rank ring with every transfer replaced by a direct read. Prints the best and the median
 * busbw over `repeats` (default 20) calls: for 2 ranks busbw = bytes / time, as the perf
 * tools count it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t n;
static int repeats;
static float *in[2], *out[2];
static double *times;
static pthread_barrier_t bar;

static void *run(void *arg)
{
    int t = (int)(size_t)arg;
    size_t half = n / 2;
    size_t lo = t ? half : 0, hi = t ? n : half;
    size_t olo = t ? 0 : half, ohi = t ? half : n;
    const float *a = in[0], *b = in[1];
    float *o = out[t];
    const float *other = out[1 - t];
    for (int r = -2; r < repeats; r++) {
        pthread_barrier_wait(&bar);
        double t0 = now();
        for (size_t i = lo; i < hi; i++)
            o[i] = a[i] + b[i];
        pthread_barrier_wait(&bar);
        memcpy(o + olo, other + olo, (ohi - olo) * sizeof(float));
        pthread_barrier_wait(&bar);
        if (t == 0 && r >= 0)
            times[r] = now() - t0;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    repeats = argc > 2 ? atoi(argv[2]) : 20;
    if (mib == 0 || repeats <= 0) {
        fprintf(stderr, "usage: %s [MiB > 0] [repeats > 0]\n", argv[0]);
        return 2;
    }
    size_t bytes = mib << 20;
    n = bytes / sizeof(float);
    for (int t = 0; t < 2; t++) {
        in[t] = aligned_alloc(64, bytes);
        out[t] = aligned_alloc(64, bytes);
        if (!in[t] || !out[t]) {
            fprintf(stderr, "out of memory allocating 4 x %zu MiB\n", mib);
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            in[t][i] = (float)(i % 1000) + t;
        memset(out[t], 0, bytes);
    }
    times = calloc((size_t)repeats, sizeof(double));
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, run, (void *)(size_t)t);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < n; i += 4099)
            if (out[t][i] != (float)(i % 1000) * 2 + 1) {
                fprintf(stderr, "wrong element %zu on thread %d\n", i, t);
                return 1;
            }
    qsort(times, (size_t)repeats, sizeof(double), cmp);
    double gb = (double)bytes / 1e9;
    printf("2-thread allreduce, f32 sum out of place, %zu MiB: best %.2f GB/s, median %.2f GB/s "
           "busbw (%d calls)\n",
           mib, gb / times[0], gb / times[repeats / 2], repeats);
    return 0;
}
