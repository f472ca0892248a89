/* late_framework: a framework library loaded after the process's first CUDA call (issue
 * #10: "not attributed until its lens speaks"). A cudaMalloc first (the ring is made and
 * scans the libraries mapped then: none of a framework), then dlopen of a library named
 * like CuPy's (fake-late/libcupy_late.so, by its full path; `--bare`: by its name alone,
 * found through this program's RUNPATH, then a dlsym in it), then it fills the device with
 * 100 MiB allocations and asks for 500 MiB: the driver refuses it.
 * `--no-dlopen`: the same without the library. Prints what it did; exits 0. */
#include "common.h"
#include "sim_cuda_runtime.h"
#include <dlfcn.h>
#include <libgen.h>
#include <unistd.h>

int main(int argc, char **argv) {
    void *first = NULL;
    if (cudaMalloc(&first, 1 * MiB) != cudaSuccess) return 2;
    if (!has_flag(argc, argv, "--no-dlopen")) {
        void *h;
        if (has_flag(argc, argv, "--bare")) {
            h = dlopen("libcupy_late.so", RTLD_NOW);
            if (h && !dlsym(h, "vramhook_sim_fake_cupy")) return 3;
        } else {
            char exe[4096], path[4200];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            if (n <= 0) return 4;
            exe[n] = 0;
            snprintf(path, sizeof path, "%s/../fake-late/libcupy_late.so", dirname(exe));
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 5;
        }
        printf("loaded the framework library\n");
    }
    void *p;
    int n = 0;
    while (cudaMalloc(&p, 100 * MiB) == cudaSuccess) n++;
    cudaError_t e = cudaMalloc(&p, 500 * MiB);
    printf("allocations=%d oom=%d\n", n, e == cudaErrorMemoryAllocation);
    return 0;
}
