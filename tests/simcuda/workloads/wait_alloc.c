/* wait_alloc: a process that is already running when a tracer attaches.
 * Phase 1 (before): --before N buffers through cudaMalloc (buffer i: (i+1) MiB), kept live.
 * Prints "ready pid=<pid>" and waits for SIGUSR1 (or for --go-file PATH to exist).
 * Phase 2 (after): through the shared cudart (cuGetProcAddress pointers) and the driver
 * directly (-lcuda): --after N cudaMalloc of (i%4+1) MiB + 512*i bytes, every other one
 * freed; one cudaMallocAsync + cudaFreeAsync; a stream made with a priority and destroyed
 * (cudart) and one made directly (kept); one cudaMallocPitch; one cuMemAddressReserve,
 * cuMemCreate 4 MiB, cuMemMap (kept), one failing cudaMalloc (out of memory), one
 * cudaMemGetInfo. Prints "after live=<bytes allocated in phase 2 and still live>" and
 * waits for SIGTERM (--hold) or exits. */
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"
#include "vmm.h"

static volatile sig_atomic_t go, stop;
static void on_usr1(int s) { (void)s; go = 1; }
static void on_term(int s) { (void)s; stop = 1; }

int main(int argc, char **argv) {
    int before = arg_int(argc, argv, "--before", 4), after = arg_int(argc, argv, "--after", 10);
    int hold = has_flag(argc, argv, "--hold");
    const char *go_file = arg_val(argc, argv, "--go-file");
    handle_signal(SIGUSR1, on_usr1);
    handle_signal(SIGTERM, on_term);
    cksum_t ck;
    ck_init(&ck);
    if (cudaSetDevice(0)) DIE("cudaSetDevice");
    for (int i = 0; i < before; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, (size_t)(i + 1) * MiB)) DIE("cudaMalloc before %d", i);
        ck_add(&ck, (uint64_t)(uintptr_t)p);
    }
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    struct stat st;
    while (!go && !stop && !(go_file && stat(go_file, &st) == 0)) usleep(2000);
    if (stop) return 0;

    uint64_t live = 0;
    void **p = calloc((size_t)after + 1, sizeof *p);
    for (int i = 0; i < after; i++) {
        size_t sz = (size_t)(i % 4 + 1) * MiB + 512 * (size_t)i;
        if (cudaMalloc(&p[i], sz)) DIE("cudaMalloc after %d", i);
        ck_add(&ck, (uint64_t)(uintptr_t)p[i]);
        if (i % 2) live += sz;
    }
    for (int i = 0; i < after; i += 2) ck_add(&ck, (uint64_t)cudaFree(p[i]));
    void *a = NULL;
    if (cudaMallocAsync(&a, 3 * MiB, 0) || cudaFreeAsync(a, 0)) DIE("async");
    cudaStream_t made_and_gone;
    CUstream kept;
    if (cudaStreamCreateWithPriority(&made_and_gone, 1, -2) || cudaStreamDestroy(made_and_gone)) DIE("stream");
    if (cuStreamCreate(&kept, 0)) DIE("cuStreamCreate");
    void *pitched = NULL;
    size_t pitch = 0;
    if (cudaMallocPitch(&pitched, &pitch, 1000, 100)) DIE("pitch");
    live += pitch * 100;
    CUmemAllocationProp prop = pinned_on_device(0);
    CUdeviceptr base = 0;
    CUmemGenericAllocationHandle h = 0;
    if (cuMemAddressReserve(&base, 64 * MiB, 0, 0, 0)) DIE("reserve");
    if (cuMemCreate(&h, 4 * MiB, &prop, 0)) DIE("create");
    if (cuMemMap(base, 4 * MiB, 0, h, 0)) DIE("map");
    live += 4 * MiB;
    void *huge = NULL;
    cudaError_t e = cudaMalloc(&huge, 1ULL << 50);
    ck_add(&ck, (uint64_t)e);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    printf("after live=%llu oom=%d\n", (unsigned long long)live, (int)e);
    ck_print(&ck);
    fflush(stdout);
    while (hold && !stop) usleep(2000);
    return 0;
}
