/* Simulated CUDA runtime (libcudart.so.13 / libcudart_static.a) for vramhook tests.
 *
 * It reaches the driver the way real cudart 13 does: dlopen("libcuda.so.1"),
 * dlsym(handle, "cuGetProcAddress_v2"), ask that for "cuGetProcAddress" @12000,
 * and resolve every other entry point through the pointer it got back. */
#define _GNU_SOURCE
#define SIM_CUDA_NO_API_DEFINES
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 16

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
    gpa_v2_t gpa;
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned, int);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*cuMemPoolDestroy)(CUmemoryPool);
    CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*cuArray3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*cuArrayDestroy)(CUarray);
    CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
} D;

static pthread_mutex_t rt_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int rt_state; /* 0: not yet, 1: ready, 2: failed */
static cudaError_t rt_init_err;
static int rt_ndev;
static CUcontext prim[MAXDEV];
static int atfork_registered;

static __thread int tl_dev;
static __thread int tl_ctx_dev = -1; /* device whose primary context we made current */
static __thread cudaError_t tl_last;

static void rt_atfork_child(void) {
    /* The driver forgets everything in a fork child; start again there. */
    pthread_mutex_init(&rt_mu, NULL);
    atomic_store(&rt_state, 0);
    memset(prim, 0, sizeof prim);
    tl_ctx_dev = -1;
}

static cudaError_t map_err(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
    }
}

static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) tl_last = e;
    return e;
}

static int resolve(const char *name, void **slot, int ver, cuuint64_t flags) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = D.gpa(name, slot, ver, flags, &st);
    return r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && *slot;
}

static cudaError_t do_init_locked(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return cudaErrorInsufficientDriver;
    gpa_v2_t first = (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!first) return cudaErrorInsufficientDriver;
    /* Like cudart 13: ask the driver for cuGetProcAddress itself, then use only that. */
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (first("cuGetProcAddress", &p, 12000, 0, &st) != CUDA_SUCCESS || !p) return cudaErrorInsufficientDriver;
    D.gpa = (gpa_v2_t)p;
    /* cudart 13 also asks for the CUDA 11 form (measured: versions 11030 and 12000) */
    void *p11 = NULL;
    D.gpa("cuGetProcAddress", &p11, 11030, 0, &st);
    int ok = 1;
#define R(field, name, ver, fl) ok &= resolve(name, (void **)&D.field, ver, fl)
    R(cuInit, "cuInit", 12000, 0);
    R(cuDeviceGetCount, "cuDeviceGetCount", 12000, 0);
    R(cuDeviceGet, "cuDeviceGet", 12000, 0);
    R(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 12000, 0);
    R(cuCtxSetCurrent, "cuCtxSetCurrent", 12000, 0);
    R(cuCtxSynchronize, "cuCtxSynchronize", 12000, 0);
    R(cuStreamCreate, "cuStreamCreate", 12000, 0);
    R(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", 12000, 0);
    R(cuStreamDestroy, "cuStreamDestroy", 12000, 0);
    R(cuMemAlloc, "cuMemAlloc", 13000, 0);
    R(cuMemFree, "cuMemFree", 13000, 0);
    R(cuMemAllocPitch, "cuMemAllocPitch", 12000, 0);
    R(cuMemAllocManaged, "cuMemAllocManaged", 12000, 0);
    R(cuMemAllocAsync, "cuMemAllocAsync", 12000, 0);
    R(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    R(cuMemFreeAsync, "cuMemFreeAsync", 12000, 0);
    R(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    R(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 12000, 0);
    R(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    R(cuMemPoolCreate, "cuMemPoolCreate", 12000, 0);
    R(cuMemPoolDestroy, "cuMemPoolDestroy", 12000, 0);
    R(cuMemPoolTrimTo, "cuMemPoolTrimTo", 12000, 0);
    R(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 12000, 0);
    R(cuMemGetInfo, "cuMemGetInfo", 12000, 0);
    R(cuArrayCreate, "cuArrayCreate", 12000, 0);
    R(cuArray3DCreate, "cuArray3DCreate", 12000, 0);
    R(cuArrayDestroy, "cuArrayDestroy", 12000, 0);
    R(cuIpcGetMemHandle, "cuIpcGetMemHandle", 12000, 0);
    R(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, 0); /* as the real cudart 13 does */
    R(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 12000, 0);
#undef R
    if (!ok) return cudaErrorInsufficientDriver;
    if (D.cuInit(0) != CUDA_SUCCESS) return cudaErrorInitializationError;
    if (D.cuDeviceGetCount(&rt_ndev) != CUDA_SUCCESS || rt_ndev < 1) return cudaErrorNoDevice;
    if (rt_ndev > MAXDEV) rt_ndev = MAXDEV;
    return cudaSuccess;
}

static cudaError_t rt_init(void) {
    int s = atomic_load_explicit(&rt_state, memory_order_acquire);
    if (s == 1) return cudaSuccess;
    if (s == 2) return rt_init_err;
    pthread_mutex_lock(&rt_mu);
    if (!atfork_registered) {
        atfork_registered = 1;
        pthread_atfork(NULL, NULL, rt_atfork_child);
    }
    if (atomic_load(&rt_state) == 0) {
        rt_init_err = do_init_locked();
        atomic_store_explicit(&rt_state, rt_init_err == cudaSuccess ? 1 : 2, memory_order_release);
    }
    pthread_mutex_unlock(&rt_mu);
    return rt_init_err;
}

/* Lazy init plus the calling thread's current device's primary context. */
static cudaError_t ensure(void) {
    cudaError_t e = rt_init();
    if (e != cudaSuccess) return e;
    if (tl_ctx_dev == tl_dev) return cudaSuccess;
    pthread_mutex_lock(&rt_mu);
    CUresult r = CUDA_SUCCESS;
    if (!prim[tl_dev]) r = D.cuDevicePrimaryCtxRetain(&prim[tl_dev], tl_dev);
    CUcontext c = prim[tl_dev];
    pthread_mutex_unlock(&rt_mu);
    if (r == CUDA_SUCCESS) r = D.cuCtxSetCurrent(c);
    if (r != CUDA_SUCCESS) return map_err(r);
    tl_ctx_dev = tl_dev;
    return cudaSuccess;
}

#define ENSURE()                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = ensure();                                                                                     \
        if (e_ != cudaSuccess) return ret(e_);                                                                         \
    } while (0)

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    cudaError_t e = rt_init();
    if (e != cudaSuccess) return ret(e);
    if (!count) return ret(cudaErrorInvalidValue);
    *count = rt_ndev;
    return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device) {
    cudaError_t e = rt_init();
    if (e != cudaSuccess) return ret(e);
    if (device < 0 || device >= rt_ndev) return ret(cudaErrorInvalidDevice);
    tl_dev = device;
    ENSURE();
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device) {
    cudaError_t e = rt_init();
    if (e != cudaSuccess) return ret(e);
    if (!device) return ret(cudaErrorInvalidValue);
    *device = tl_dev;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
    ENSURE();
    return ret(map_err(D.cuCtxSynchronize()));
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    ENSURE();
    if (!pStream) return ret(cudaErrorInvalidValue);
    return ret(map_err(D.cuStreamCreate((CUstream *)pStream, 0)));
}

EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
    ENSURE();
    if (!pStream) return ret(cudaErrorInvalidValue);
    return ret(map_err(D.cuStreamCreateWithPriority((CUstream *)pStream, flags, priority)));
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    ENSURE();
    return ret(map_err(D.cuStreamDestroy((CUstream)stream)));
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
    ENSURE();
    if (!devPtr) return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = D.cuMemAlloc(&p, size);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return ret(map_err(r));
}

EXPORT cudaError_t cudaFree(void *devPtr) {
    ENSURE();
    if (!devPtr) return cudaSuccess;
    return ret(map_err(D.cuMemFree((CUdeviceptr)(uintptr_t)devPtr)));
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    ENSURE();
    if (!devPtr || !pitch) return ret(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult r = D.cuMemAllocPitch(&p, pitch, width, height, 4);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return ret(map_err(r));
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    ENSURE();
    if (!devPtr) return ret(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult r = D.cuMemAllocManaged(&p, size, flags);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return ret(map_err(r));
}

static cudaError_t malloc_async(CUresult (*f)(CUdeviceptr *, size_t, CUstream), void **devPtr, size_t size,
                                cudaStream_t s) {
    ENSURE();
    if (!devPtr) return ret(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult r = f(&p, size, (CUstream)s);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return ret(map_err(r));
}

static cudaError_t malloc_pool(CUresult (*f)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), void **devPtr,
                               size_t size, cudaMemPool_t pool, cudaStream_t s) {
    ENSURE();
    if (!devPtr) return ret(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult r = f(&p, size, (CUmemoryPool)pool, (CUstream)s);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return ret(map_err(r));
}

static cudaError_t free_async(CUresult (*f)(CUdeviceptr, CUstream), void *devPtr, cudaStream_t s) {
    ENSURE();
    return ret(map_err(f((CUdeviceptr)(uintptr_t)devPtr, (CUstream)s)));
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s) {
    ENSURE();
    return malloc_async(D.cuMemAllocAsync, devPtr, size, s);
}
EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s) {
    ENSURE();
    return malloc_async(D.cuMemAllocAsync_ptsz, devPtr, size, s);
}
EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s) {
    ENSURE();
    return free_async(D.cuMemFreeAsync, devPtr, s);
}
EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s) {
    ENSURE();
    return free_async(D.cuMemFreeAsync_ptsz, devPtr, s);
}
EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t s) {
    ENSURE();
    return malloc_pool(D.cuMemAllocFromPoolAsync, ptr, size, pool, s);
}
EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t s) {
    ENSURE();
    return malloc_pool(D.cuMemAllocFromPoolAsync_ptsz, ptr, size, pool, s);
}

EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *props) {
    ENSURE();
    return ret(map_err(D.cuMemPoolCreate((CUmemoryPool *)memPool, (const CUmemPoolProps *)props)));
}
EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
    ENSURE();
    return ret(map_err(D.cuMemPoolDestroy((CUmemoryPool)memPool)));
}
EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
    ENSURE();
    return ret(map_err(D.cuMemPoolTrimTo((CUmemoryPool)memPool, minBytesToKeep)));
}
EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
    ENSURE();
    return ret(map_err(D.cuDeviceGetDefaultMemPool((CUmemoryPool *)memPool, device)));
}
EXPORT cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    ENSURE();
    return ret(map_err(D.cuMemGetInfo(free_b, total)));
}

static int chan_format(const struct cudaChannelFormatDesc *d, unsigned *nch) {
    int bits[4] = {d->x, d->y, d->z, d->w};
    unsigned n = 0;
    for (int i = 0; i < 4; i++)
        if (bits[i]) {
            if (bits[i] != d->x) return -1;
            n++;
        }
    if (n == 3 || n == 0) return -1;
    *nch = n;
    switch (d->f) {
    case cudaChannelFormatKindSigned:
        return d->x == 8 ? CU_AD_FORMAT_SIGNED_INT8 : d->x == 16 ? CU_AD_FORMAT_SIGNED_INT16
                                                     : d->x == 32 ? CU_AD_FORMAT_SIGNED_INT32 : -1;
    case cudaChannelFormatKindUnsigned:
        return d->x == 8 ? CU_AD_FORMAT_UNSIGNED_INT8 : d->x == 16 ? CU_AD_FORMAT_UNSIGNED_INT16
                                                       : d->x == 32 ? CU_AD_FORMAT_UNSIGNED_INT32 : -1;
    case cudaChannelFormatKindFloat: return d->x == 16 ? CU_AD_FORMAT_HALF : d->x == 32 ? CU_AD_FORMAT_FLOAT : -1;
    default: return -1;
    }
}

EXPORT cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc, size_t width,
                                   size_t height, unsigned int flags) {
    ENSURE();
    unsigned nch = 0;
    int fmt;
    if (!array || !desc || flags != 0 || (fmt = chan_format(desc, &nch)) < 0) return ret(cudaErrorInvalidValue);
    CUDA_ARRAY_DESCRIPTOR d = {width, height, (CUarray_format)fmt, nch};
    return ret(map_err(D.cuArrayCreate((CUarray *)array, &d)));
}

EXPORT cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                     struct cudaExtent extent, unsigned int flags) {
    ENSURE();
    unsigned nch = 0;
    int fmt;
    if (!array || !desc || flags != 0 || (fmt = chan_format(desc, &nch)) < 0) return ret(cudaErrorInvalidValue);
    CUDA_ARRAY3D_DESCRIPTOR d = {extent.width, extent.height, extent.depth, (CUarray_format)fmt, nch, 0};
    return ret(map_err(D.cuArray3DCreate((CUarray *)array, &d)));
}

EXPORT cudaError_t cudaFreeArray(cudaArray_t array) {
    ENSURE();
    if (!array) return cudaSuccess;
    return ret(map_err(D.cuArrayDestroy((CUarray)array)));
}

EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
    ENSURE();
    return ret(map_err(D.cuIpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)(uintptr_t)devPtr)));
}

EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
    ENSURE();
    if (!devPtr) return ret(cudaErrorInvalidValue);
    CUipcMemHandle h;
    memcpy(&h, &handle, sizeof h);
    CUdeviceptr p = 0;
    CUresult r = D.cuIpcOpenMemHandle(&p, h, flags);
    if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return ret(map_err(r));
}

EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
    ENSURE();
    return ret(map_err(D.cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)devPtr)));
}

EXPORT const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

EXPORT cudaError_t cudaGetLastError(void) {
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e;
}
