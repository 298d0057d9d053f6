/*
 * swarm_driver.c -- the swarm-mode oracle's driver for `gradtool emit-cuda --abi swarm`.
 *
 * It does what swarm-mcp's compute_iterate worker does with the emitted
 * function, serially: it includes the file "swarm_grad.cu" (put its folder on
 * the include path), defines the accumulator swarm_g_add(g, j, val) as
 * g[j] = g[j] + val, zeroes the K-vector g, calls
 *
 *     grad(x[k], v[k], g, p)        (grad(x[k], g, p) with -DSWARM_NO_V)
 *
 * for k = 0 .. N-1 in that order, and prints the accumulated gradient as raw
 * IEEE-754 bits, one line per param: "g <j> <16 hex digits>".
 * `gradtool backward TAPE --data DATA.npz --json --hex` computes the same sums
 * from the tape, one example at a time in the same order
 * (scripts/emitc_harness.py swarm-compare checks every bit).
 *
 * Input (the file named by argv[1]): whitespace-separated tokens
 *     K  p[0] ... p[K-1]  N  x[0] v[0]  x[1] v[1] ... x[N-1] v[N-1]
 * with K, N and every x[k] decimal integers, and every p[j], v[k] the 16 hex
 * digits of a double's bit pattern (exact, NaN payloads included).
 *
 * Builds:
 *   cc -std=c99 -O2 -ffp-contract=off -I DIR -o driver swarm_driver.c -lm
 *   nvcc -arch=sm_90 -x cu -I DIR -o driver swarm_driver.c
 * Under nvcc the loop runs on the GPU in one thread (the same order); the
 * accumulator is then the __device__ function the worker would declare.
 * Exit status: 0 printed; 2 unreadable input; 1 a CUDA error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swarm_grad.cu"

#ifndef SWARM_GRAD
#  define SWARM_GRAD grad
#endif

__device__ void swarm_g_add(double* g, long long j, double val)
{
    g[j] = GT_ADD(g[j], val);
}

static double from_bits(unsigned long long u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void print_bits(long long j, double d)
{
    unsigned long long u;
    memcpy(&u, &d, sizeof u);
    printf("g %lld %016llx\n", j, u);
}

static void bad_input(const char *path, const char *what)
{
    fprintf(stderr, "swarm_driver: %s: %s\n", path, what);
    exit(2);
}

/* every example in order; the caller zeroed g */
static __device__ void run_all(long long n, const long long *xs, const double *vs, double *g,
                               const double *p)
{
    for (long long k = 0; k < n; ++k) {
#ifdef SWARM_NO_V
        (void)vs;
        SWARM_GRAD(xs[k], g, p);
#else
        SWARM_GRAD(xs[k], vs[k], g, p);
#endif
    }
}

#ifdef __CUDACC__
__global__ void swarm_driver_kernel(long long n, const long long *xs, const double *vs,
                                    double *g, const double *p)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) run_all(n, xs, vs, g, p);
}

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "swarm_driver: %s: %s\n", what, cudaGetErrorString(err));
        exit(1);
    }
}

static void run_device(long long n, long long k, const long long *xs, const double *vs,
                       double *g, const double *p)
{
    long long *d_xs;
    double *d_vs, *d_g, *d_p;
    size_t nx = (size_t)(n > 0 ? n : 1), nk = (size_t)(k > 0 ? k : 1);
    check(cudaMalloc((void **)&d_xs, nx * sizeof *d_xs), "cudaMalloc");
    check(cudaMalloc((void **)&d_vs, nx * sizeof *d_vs), "cudaMalloc");
    check(cudaMalloc((void **)&d_g, nk * sizeof *d_g), "cudaMalloc");
    check(cudaMalloc((void **)&d_p, nk * sizeof *d_p), "cudaMalloc");
    check(cudaMemcpy(d_xs, xs, nx * sizeof *xs, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(d_vs, vs, nx * sizeof *vs, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(d_g, g, nk * sizeof *g, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(d_p, p, nk * sizeof *p, cudaMemcpyHostToDevice), "cudaMemcpy");
    swarm_driver_kernel<<<1, 1>>>(n, d_xs, d_vs, d_g, d_p);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(g, d_g, nk * sizeof *g, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cudaFree(d_xs); cudaFree(d_vs); cudaFree(d_g); cudaFree(d_p);
}
#endif

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: swarm_driver DATA.txt\n");
        return 2;
    }
    const char *path = argv[1];
    FILE *f = fopen(path, "r");
    if (!f) bad_input(path, "cannot open");
    long long k, n;
    if (fscanf(f, "%lld", &k) != 1 || k < 0 || k > 1000000) bad_input(path, "bad K");
    double *p = (double *)calloc((size_t)(k > 0 ? k : 1), sizeof *p);
    double *g = (double *)calloc((size_t)(k > 0 ? k : 1), sizeof *g);
    if (!p || !g) bad_input(path, "out of memory");
    for (long long j = 0; j < k; ++j) {
        unsigned long long u;
        if (fscanf(f, "%llx", &u) != 1) bad_input(path, "bad p[j]");
        p[j] = from_bits(u);
    }
    if (fscanf(f, "%lld", &n) != 1 || n < 0 || n > 100000000) bad_input(path, "bad N");
    long long *xs = (long long *)calloc((size_t)(n > 0 ? n : 1), sizeof *xs);
    double *vs = (double *)calloc((size_t)(n > 0 ? n : 1), sizeof *vs);
    if (!xs || !vs) bad_input(path, "out of memory");
    for (long long i = 0; i < n; ++i) {
        unsigned long long u;
        if (fscanf(f, "%lld %llx", &xs[i], &u) != 2) bad_input(path, "bad (x, v) pair");
        vs[i] = from_bits(u);
    }
    fclose(f);
    for (long long j = 0; j < k; ++j) g[j] = 0.0;
#ifdef __CUDACC__
    run_device(n, k, xs, vs, g, p);
#else
    run_all(n, xs, vs, g, p);
#endif
    for (long long j = 0; j < k; ++j) print_bits(j, g[j]);
    free(p); free(g); free(xs); free(vs);
    return 0;
}
