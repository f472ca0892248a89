// What a CUDA context costs once kernels run (issue #12), measured rather than inferred.
// NVML's figure for a process is its context, its allocations and memory the driver takes with
// no memory call. Two candidates for the last: local memory (per-thread stacks, for every thread
// the GPU can hold) and the code of the kernels loaded. This probe creates a context, then
// launches kernels of known stack frames (cudaFuncGetAttributes' localSizeBytes), largest last,
// then creates a cuBLAS handle and runs one GEMM on a stream of its own as ggml does, and prints
// one JSON line per step with NVML's figure for this process and the device's free bytes.
// On the H200 (driver 580.159.04, docs/measurements/gpu/ollama.txt) frames of 16 B to 1 KiB added nothing:
// the cold context already holds local memory for the default 1 KiB stack limit. Between the steps named in WAIT it stops until
// DIR/go-STEP exists, after writing DIR/at-STEP, so that a checkpoint can read vramhook's live
// bytes for it there (scenarios.sh). cuBLAS is the library ggml-cuda loads (its path in
// argv[2]), opened with dlopen, as NVML is: the probe links only cudart.
//   nvcc -O2 -arch=sm_90 -o warm_probe warm_probe.cu -ldl
//   warm_probe DIR LIBCUBLAS
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

// A kernel whose stack frame holds N bytes: a volatile array indexed at run time cannot live
// in registers. `sink` is null at run time, but the compiler cannot know it.
template <int N>
__global__ void stack_kernel(int index, int *sink) {
    volatile unsigned char frame[N];
    for (int i = 0; i < N; i++) frame[i] = (unsigned char)(i + threadIdx.x);
    if (sink) sink[threadIdx.x] = frame[(index + threadIdx.x) % N];
}

// NVML through dlopen: the probe needs no NVML at link time.
struct ProcessInfo {  // nvmlProcessInfo_t (v2 and v3 share this layout)
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
};
typedef int (*nvml_init_t)();
typedef int (*nvml_handle_t)(unsigned int, void **);
typedef int (*nvml_procs_t)(void *, unsigned int *, ProcessInfo *);
static nvml_procs_t nvml_procs;
static void *nvml_device;

static void nvml_open() {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return;
    auto init = (nvml_init_t)dlsym(lib, "nvmlInit_v2");
    auto handle = (nvml_handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    nvml_procs = (nvml_procs_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!nvml_procs) nvml_procs = (nvml_procs_t)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!init || !handle || !nvml_procs || init() != 0 || handle(0, &nvml_device) != 0) nvml_procs = nullptr;
}

// NVML's bytes for this process, or -1 when NVML cannot say.
static long long nvml_self() {
    if (!nvml_procs) return -1;
    ProcessInfo procs[64];
    unsigned int n = 64;
    if (nvml_procs(nvml_device, &n, procs) != 0) return -1;
    for (unsigned int i = 0; i < n; i++)
        if (procs[i].pid == (unsigned int)getpid()) return (long long)procs[i].usedGpuMemory;
    return -1;
}

// The few cuBLAS entry points used, with the values of cublas_v2.h's and library_types.h's
// enumerators they take.
typedef int (*cublas_create_t)(void **);
typedef int (*cublas_set_stream_t)(void *, cudaStream_t);
typedef int (*cublas_set_math_mode_t)(void *, int);
typedef int (*cublas_gemm_ex_t)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *,
                                int, int, const void *, void *, int, int, int, int);
enum {
    CUBLAS_OP_N_ = 0,
    CUBLAS_OP_T_ = 1,
    CUBLAS_TF32_TENSOR_OP_MATH_ = 3,
    CUDA_R_16F_ = 2,
    CUBLAS_COMPUTE_32F_ = 68,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP_ = 99,
};

static const char *dir;

static void step(const char *name, long long stack_bytes, bool wait) {
    size_t free_b = 0, total_b = 0, limit = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaDeviceGetLimit(&limit, cudaLimitStackSize);
    printf("{\"step\":\"%s\",\"pid\":%d,\"nvml\":%lld,\"free\":%zu,\"stack_limit\":%zu,\"local_size_bytes\":%lld}\n", name,
           (int)getpid(), nvml_self(), free_b, limit, stack_bytes);
    fflush(stdout);
    if (!wait) return;
    std::string at = std::string(dir) + "/at-" + name, go = std::string(dir) + "/go-" + name;
    if (FILE *f = fopen(at.c_str(), "w")) fclose(f);
    for (int i = 0; i < 600 && access(go.c_str(), F_OK) != 0; i++) usleep(100000);
}

template <int N>
static int launch() {
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, stack_kernel<N>) != cudaSuccess) return 1;
    stack_kernel<N><<<1, 32>>>(1, nullptr);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    step(("stack-" + std::to_string(N)).c_str(), (long long)a.localSizeBytes, false);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: warm_probe DIR LIBCUBLAS\n");
        return 2;
    }
    dir = argv[1];
    nvml_open();
    if (cudaFree(nullptr) != cudaSuccess) {
        fprintf(stderr, "warm_probe: no CUDA context\n");
        return 1;
    }
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    printf("{\"device\":\"%s\",\"sms\":%d,\"max_threads_per_sm\":%d,\"nvml_available\":%s}\n", p.name,
           p.multiProcessorCount, p.maxThreadsPerMultiProcessor, nvml_procs ? "true" : "false");
    sleep(1);  // NVML's per-process figure settles after the context is made
    step("cold", 0, true);
    // Ascending, so each launch can only grow the reservation; 272 B is the largest frame in
    // ollama's libggml-cuda.so (cuobjdump -res-usage, run.sh).
    if (launch<16>() || launch<32>() || launch<64>() || launch<128>() || launch<272>() || launch<512>() ||
        launch<1024>()) {
        fprintf(stderr, "warm_probe: a stack kernel failed\n");
        return 1;
    }
    step("stacks", 0, true);
    // cuBLAS as ggml-cuda uses it: one handle, its own stream, a half-precision GEMM.
    void *cublas = dlopen(argv[2], RTLD_NOW);
    auto create = cublas ? (cublas_create_t)dlsym(cublas, "cublasCreate_v2") : nullptr;
    auto set_stream = cublas ? (cublas_set_stream_t)dlsym(cublas, "cublasSetStream_v2") : nullptr;
    auto set_math = cublas ? (cublas_set_math_mode_t)dlsym(cublas, "cublasSetMathMode") : nullptr;
    auto gemm = cublas ? (cublas_gemm_ex_t)dlsym(cublas, "cublasGemmEx") : nullptr;
    if (!create || !set_stream || !set_math || !gemm) {
        fprintf(stderr, "warm_probe: cannot use cuBLAS from %s: %s\n", argv[2], dlerror());
        return 1;
    }
    void *h = nullptr;
    if (create(&h) != 0) return 1;
    step("cublas-created", 0, false);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    set_stream(h, s);
    set_math(h, CUBLAS_TF32_TENSOR_OP_MATH_);
    const int n = 512;
    void *a = nullptr, *b = nullptr, *c = nullptr;
    cudaMalloc(&a, n * n * 2);
    cudaMalloc(&b, n * n * 2);
    cudaMalloc(&c, n * n * 2);
    const float one = 1.0f, zero = 0.0f;
    int st = gemm(h, CUBLAS_OP_T_, CUBLAS_OP_N_, n, n, n, &one, a, CUDA_R_16F_, n, b, CUDA_R_16F_, n, &zero, c,
                  CUDA_R_16F_, n, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_TENSOR_OP_);
    cudaStreamSynchronize(s);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    if (st != 0) {
        fprintf(stderr, "warm_probe: cublasGemmEx failed: %d\n", st);
        return 1;
    }
    step("cublas", 0, true);
    return 0;
}
