// Read bandwidth of this machine: T threads each sum their slice of a MiB-sized buffer of floats, best
// of 10 passes. The figure decode is compared against (scripts/bench_llamacpp.py --membw).
// Usage: membw THREADS MIB      prints "read bandwidth: N GB/s"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const float* p;
  size_t n;
  float sum;
} Slice;

static void* sum_slice(void* arg) {
  Slice* s = (Slice*)arg;
  float acc[16] = {0};
  for (size_t i = 0; i + 16 <= s->n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += s->p[i + k];  // vectorised by -O3 -march=native
  for (int k = 0; k < 16; k++) s->sum += acc[k];
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  const size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
  if (threads < 1 || threads > 256 || mib < 1) {
    fprintf(stderr, "usage: membw THREADS MIB\n");
    return 2;
  }
  const size_t n = mib * 1048576 / sizeof(float);
  float* buf = aligned_alloc(64, n * sizeof(float));
  if (!buf) {
    fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
    return 1;
  }
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
  double best = 1e30;
  float total = 0;
  for (int pass = 0; pass < 10; pass++) {
    pthread_t tid[256];
    Slice sl[256];
    const double t0 = now();
    for (int t = 0; t < threads; t++) {
      sl[t].p = buf + n / threads * t;
      sl[t].n = n / threads;
      sl[t].sum = 0;
      pthread_create(&tid[t], NULL, sum_slice, &sl[t]);
    }
    for (int t = 0; t < threads; t++) {
      pthread_join(tid[t], NULL);
      total += sl[t].sum;
    }
    const double dt = now() - t0;
    if (dt < best) best = dt;
  }
  printf("read bandwidth (%d threads, %zu MiB, checksum %g): %.2f GB/s\n", threads, mib, (double)total,
         (double)(n / threads * threads) * sizeof(float) / best / 1e9);
  free(buf);
  return 0;
}
