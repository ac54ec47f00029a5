/*
 * Allreduce, allgather and broadcast bandwidth of an MPI library, timed like nccl-tests and
 * like benches/compare/gloo_allreduce.py, so the three can share one table.
 *
 *   mpicc -O2 -o mpi_allreduce benches/compare/mpi_allreduce.c
 *   mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader ./mpi_allreduce \
 *       -b 64 -e 64M -f 4 -n 20 -w 5 -c all
 *
 * Flags: -b/-e smallest/largest size (K, M, G suffixes), -f step factor, -n timed iterations,
 * -w warm-up iterations, -c allreduce|allgather|broadcast|all.
 *
 * Rules shared with the other two programs:
 *   - float32 data; allreduce sums; broadcast from rank 0; out of place where the call has
 *     two buffers (allreduce, allgather);
 *   - "size" is nccl-tests' size: the buffer of allreduce and broadcast, the whole gathered
 *     buffer of allgather, whose per-rank block is rounded down to a multiple of 16 bytes;
 *   - a 10 ms busy wait before the first size (ferroccl's perf tools do the same);
 *   - per size: `-w` warm-up calls, a barrier, `-n` timed calls; the time of one call is the
 *     mean over ranks of (elapsed / n) (nccl-tests' default `-a 1`);
 *   - algbw = size / time; busbw = algbw * 2(n-1)/n (allreduce), * (n-1)/n (allgather),
 *     * 1 (broadcast);
 *   - after timing, one call on fresh inputs is checked element by element; a wrong value
 *     makes the program exit 1.
 *
 * Output (rank 0): `# ` comment lines, then rows `coll size count time_us algbw busbw wrong`.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    size_t mul = 1;
    if (end && *end) {
        switch (*end) {
        case 'K': case 'k': mul = (size_t)1 << 10; break;
        case 'M': case 'm': mul = (size_t)1 << 20; break;
        case 'G': case 'g': mul = (size_t)1 << 30; break;
        default:
            fprintf(stderr, "mpi_allreduce: bad size '%s'\n", s);
            exit(2);
        }
    }
    return (size_t)(v * (double)mul);
}

enum coll { ALLREDUCE, ALLGATHER, BROADCAST, NCOLL };
static const char *coll_name[NCOLL] = {"allreduce", "allgather", "broadcast"};

/* Elements per rank for nccl-tests' size `bytes`; the size actually moved in *reported. */
static size_t layout(enum coll c, size_t bytes, int n, size_t *reported)
{
    size_t count;
    if (c == ALLGATHER) {
        size_t block = bytes / (size_t)n / 16 * 16;
        count = block / sizeof(float);
        *reported = block * (size_t)n;
    } else {
        count = bytes / sizeof(float);
        *reported = count * sizeof(float);
    }
    return count;
}

static double bus_factor(enum coll c, int n)
{
    switch (c) {
    case ALLREDUCE: return 2.0 * (n - 1) / n;
    case ALLGATHER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Input element i of rank r: small integers, so float sums are exact. */
static float input(int r, size_t i, int salt)
{
    return (float)((i * 7 + (size_t)r * 13 + (size_t)salt) % 1021);
}

static void call(enum coll c, float *send, float *recv, size_t count)
{
    switch (c) {
    case ALLREDUCE:
        MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    default:
        MPI_Bcast(send, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
}

/* Runs one checked call with inputs salted by `salt`; returns the wrong elements here. */
static long check(enum coll c, float *send, float *recv, size_t count, int rank, int n, int salt)
{
    long wrong = 0;
    for (size_t i = 0; i < count; i++)
        send[i] = input(rank, i, salt);
    call(c, send, recv, count);
    if (c == ALLREDUCE) {
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += input(r, i, salt);
            wrong += recv[i] != want;
        }
    } else if (c == ALLGATHER) {
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                wrong += recv[(size_t)r * count + i] != input(r, i, salt);
    } else {
        for (size_t i = 0; i < count; i++)
            wrong += send[i] != input(0, i, salt);
    }
    return wrong;
}

int main(int argc, char **argv)
{
    size_t minb = 64, maxb = 64 << 20;
    long factor = 4, iters = 20, warmup = 5;
    int which[NCOLL] = {1, 1, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v || a[0] != '-' || strlen(a) != 2) {
            fprintf(stderr, "usage: %s [-b 64] [-e 64M] [-f 4] [-n 20] [-w 5] "
                            "[-c allreduce|allgather|broadcast|all]\n", argv[0]);
            return 2;
        }
        i++;
        switch (a[1]) {
        case 'b': minb = parse_size(v); break;
        case 'e': maxb = parse_size(v); break;
        case 'f': factor = atol(v); break;
        case 'n': iters = atol(v); break;
        case 'w': warmup = atol(v); break;
        case 'c':
            if (strcmp(v, "all") != 0) {
                int found = 0;
                for (int c = 0; c < NCOLL; c++) {
                    which[c] = strcmp(v, coll_name[c]) == 0;
                    found |= which[c];
                }
                if (!found) {
                    fprintf(stderr, "mpi_allreduce: unknown collective '%s'\n", v);
                    return 2;
                }
            }
            break;
        default:
            fprintf(stderr, "mpi_allreduce: unknown flag %s\n", a);
            return 2;
        }
    }
    if (factor < 2 || iters < 1 || warmup < 0 || minb > maxb) {
        fprintf(stderr, "mpi_allreduce: need -f >= 2, -n >= 1, -w >= 0, -b <= -e\n");
        return 2;
    }

    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    float *send = malloc(maxb + 64);
    float *recv = malloc(maxb + 64);
    if (!send || !recv) {
        fprintf(stderr, "mpi_allreduce: rank %d: cannot allocate %zu bytes\n", rank, maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, maxb + 64);
    memset(recv, 0, maxb + 64);
    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        char *nl = strchr(version, '\n');
        if (nl)
            *nl = 0;
        printf("# mpi: %s, %d ranks\n", version, n);
        printf("# %-9s %12s %12s %10s %7s %7s %6s\n", "coll", "size", "count", "time", "algbw",
               "busbw", "wrong");
    }
    long total_wrong = 0;
    /* As ferroccl's perf tools (FERRO_PERF_SETTLE_MS): busy-wait 10 ms before the first
     * warm-up, so both programs start timing from the same kind of placement. */
    for (double t = MPI_Wtime(); MPI_Wtime() - t < 0.010;)
        ;
    for (int c = 0; c < NCOLL; c++) {
        if (!which[c])
            continue;
        for (size_t bytes = minb; bytes <= maxb; bytes *= (size_t)factor) {
            size_t reported;
            size_t count = layout((enum coll)c, bytes, n, &reported);
            if (count == 0)
                continue;
            for (long w = 0; w < warmup; w++)
                call((enum coll)c, send, recv, count);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long it = 0; it < iters; it++)
                call((enum coll)c, send, recv, count);
            double dt = (MPI_Wtime() - t0) / (double)iters, sum = 0;
            MPI_Allreduce(&dt, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            double t = sum / n;
            long wrong = check((enum coll)c, send, recv, count, rank, n, (int)(bytes % 97)), all = 0;
            MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            total_wrong += all;
            double algbw = (double)reported / t / 1e9;
            if (rank == 0)
                printf("  %-9s %12zu %12zu %10.2f %7.2f %7.2f %6ld\n", coll_name[c], reported,
                       count, t * 1e6, algbw, algbw * bus_factor((enum coll)c, n), all);
            fflush(stdout);
        }
    }
    if (rank == 0)
        printf("# wrong elements: %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    free(send);
    free(recv);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
