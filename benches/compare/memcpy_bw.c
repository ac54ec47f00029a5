/*
 * Single-core memcpy bandwidth: the ceiling of any one-thread copy or reduction loop on this
 * machine (benches/compare/limits.sh prints it beside the TCP figures).
 *
 *   cc -O2 -o memcpy_bw benches/compare/memcpy_bw.c && ./memcpy_bw [MiB] [repeats]
 *
 * Copies a buffer of MiB (default 64) `repeats` times (default 20) and prints the best and the
 * median rate, counting bytes copied (read + write traffic is twice that).
 */
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

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    if (mib == 0 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: %s [MiB >= 1] [repeats 1..1000]\n", argv[0]);
        return 2;
    }
    size_t bytes = mib << 20;
    char *src = malloc(bytes), *dst = malloc(bytes);
    double rates[1000];
    if (!src || !dst) {
        fprintf(stderr, "memcpy_bw: cannot allocate 2 x %zu bytes\n", bytes);
        return 1;
    }
    for (size_t i = 0; i < bytes; i++)
        src[i] = (char)(i * 31);
    memset(dst, 1, bytes);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        memcpy(dst, src, bytes);
        double t = now() - t0;
        rates[r] = (double)bytes / t / 1e9;
        src[r] ^= dst[bytes - 1 - (size_t)r]; /* keep the copies observable */
    }
    qsort(rates, (size_t)reps, sizeof rates[0], cmp);
    printf("memcpy %zu MiB, 1 thread: best %.2f GB/s, median %.2f GB/s (bytes copied per second)\n",
           mib, rates[reps - 1], rates[reps / 2]);
    free(src);
    free(dst);
    return 0;
}
