/* misc_api: the less common calls, through the shared cudart and directly (-lcuda):
 * pitch, managed, 2D/3D arrays (cudart), a 2D array and a mipmapped array (driver),
 * IPC get/open/close in the same process, export/import of a POSIX-fd shareable
 * handle (the import is mapped, unmapped and released), cuMemGetInfo, a free of an
 * unknown pointer and a double free (both must fail with cudaErrorInvalidValue), and
 * with VRAMHOOK_SIM_DEVICES>=2 allocations on device 1.
 * Leaves live at exit: nothing on device 0; with >= 2 devices one 3 MiB buffer on
 * device 1. */
#include <unistd.h>

#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"
#include "vmm.h"

static cksum_t ck;

#define EXPECT(call, want)                                                                                             \
    do {                                                                                                               \
        int got_ = (int)(call);                                                                                        \
        ck_add(&ck, (uint64_t)got_);                                                                                   \
        if (got_ != (int)(want)) DIE("%s:%d: %s returned %d, expected %d", __FILE__, __LINE__, #call, got_, (int)(want)); \
    } while (0)

int main(void) {
    ck_init(&ck);
    EXPECT(cudaSetDevice(0), cudaSuccess);

    /* pitch */
    void *pp = NULL;
    size_t pitch = 0;
    EXPECT(cudaMallocPitch(&pp, &pitch, 1000, 300), cudaSuccess);
    ck_add(&ck, pitch);
    ck_add(&ck, (uint64_t)(uintptr_t)pp);
    EXPECT(cudaFree(pp), cudaSuccess);

    /* managed */
    void *mp = NULL;
    EXPECT(cudaMallocManaged(&mp, 5 * MiB, cudaMemAttachGlobal), cudaSuccess);
    ck_add(&ck, (uint64_t)(uintptr_t)mp);
    EXPECT(cudaFree(mp), cudaSuccess);

    /* arrays through cudart */
    struct cudaChannelFormatDesc f4 = {32, 32, 32, 32, cudaChannelFormatKindFloat};
    struct cudaChannelFormatDesc u8 = {8, 0, 0, 0, cudaChannelFormatKindUnsigned};
    cudaArray_t a2 = NULL, a3 = NULL;
    EXPECT(cudaMallocArray(&a2, &f4, 1024, 512, 0), cudaSuccess); /* 8 MiB */
    struct cudaExtent ext = {64, 64, 64};
    EXPECT(cudaMalloc3DArray(&a3, &u8, ext, 0), cudaSuccess); /* 256 KiB */
    EXPECT(cudaFreeArray(a2), cudaSuccess);
    EXPECT(cudaFreeArray(a3), cudaSuccess);

    /* arrays through the driver */
    CUarray da = NULL;
    CUDA_ARRAY_DESCRIPTOR d2 = {300, 200, CU_AD_FORMAT_HALF, 2};
    EXPECT(cuArrayCreate(&da, &d2), CUDA_SUCCESS);
    CUmipmappedArray mm = NULL;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {256, 256, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    EXPECT(cuMipmappedArrayCreate(&mm, &d3, 9), CUDA_SUCCESS);
    EXPECT(cuArrayDestroy(da), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayDestroy(mm), CUDA_SUCCESS);
    EXPECT(cuArrayDestroy(da), CUDA_ERROR_INVALID_HANDLE);

    /* IPC in the same process */
    void *ip = NULL, *opened = NULL;
    EXPECT(cudaMalloc(&ip, 6 * MiB), cudaSuccess);
    cudaIpcMemHandle_t ih;
    EXPECT(cudaIpcGetMemHandle(&ih, ip), cudaSuccess);
    EXPECT(cudaIpcOpenMemHandle(&opened, ih, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    ck_add(&ck, (uint64_t)(uintptr_t)opened);
    if (opened == ip) DIE("IPC open returned the exporter's own address");
    EXPECT(cudaIpcCloseMemHandle(opened), cudaSuccess);
    EXPECT(cudaIpcCloseMemHandle(opened), cudaErrorInvalidValue);
    EXPECT(cudaFree(ip), cudaSuccess);

    /* shareable handle export/import */
    CUmemAllocationProp prop = pinned_on_device(0);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0, imported = 0;
    EXPECT(cuMemCreate(&h, 3 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE); /* not a granularity multiple */
    EXPECT(cuMemCreate(&h, 4 * MiB, &prop, 0), CUDA_SUCCESS);
    int fd = -1;
    EXPECT(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    EXPECT(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_SUCCESS);
    close(fd);
    CUdeviceptr va = 0;
    EXPECT(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(va, 4 * MiB, 0, imported, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(va + 2 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* overlaps */
    EXPECT(cuMemUnmap(va + 4 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);         /* nothing mapped there */
    EXPECT(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);             /* still mapped */
    EXPECT(cuMemUnmap(va, 4 * MiB), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(va, 8 * MiB), CUDA_SUCCESS);
    EXPECT(cuMemRelease(imported), CUDA_SUCCESS);
    EXPECT(cuMemRelease(h), CUDA_SUCCESS);
    EXPECT(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);

    /* cuMemGetInfo, directly */
    size_t fr = 0, tot = 0;
    EXPECT(cuMemGetInfo(&fr, &tot), CUDA_SUCCESS);
    ck_add(&ck, tot - fr);

    /* errors */
    EXPECT(cudaFree((void *)(uintptr_t)0xdeadbeef000ULL), cudaErrorInvalidValue);
    void *df = NULL;
    EXPECT(cudaMalloc(&df, 1 * MiB), cudaSuccess);
    EXPECT(cudaFree(df), cudaSuccess);
    EXPECT(cudaFree(df), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaSuccess);

    /* a second device */
    int ndev = 0;
    EXPECT(cudaGetDeviceCount(&ndev), cudaSuccess);
    ck_add(&ck, (uint64_t)ndev);
    if (ndev >= 2) {
        EXPECT(cudaSetDevice(1), cudaSuccess);
        void *d1a = NULL, *d1b = NULL;
        EXPECT(cudaMalloc(&d1a, 5 * MiB), cudaSuccess);
        EXPECT(cudaMalloc(&d1b, 3 * MiB), cudaSuccess); /* left live */
        ck_add(&ck, (uint64_t)(uintptr_t)d1a);
        ck_add(&ck, (uint64_t)(uintptr_t)d1b);
        EXPECT(cudaFree(d1a), cudaSuccess);
        EXPECT(cudaSetDevice(0), cudaSuccess);
    }
    ck_print(&ck);
    return 0;
}
