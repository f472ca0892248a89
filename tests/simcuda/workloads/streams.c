/* streams: the driver keeps device memory for each stream, which no memory call shows
 * (about half a MiB on an H200), so vramhook counts the streams a process makes.
 *  - through the shared cudart: 4 x cudaStreamCreate, 3 x cudaStreamCreateWithPriority
 *  - directly (-lcuda): 2 x cuStreamCreate, 1 x cuStreamCreateWithPriority, one
 *    cuStreamCreate with invalid flags (fails: no stream)
 *  - destroyed: 2 through cudart, 1 through cuStreamDestroy_v2, 1 through the legacy
 *    cuStreamDestroy export
 *  - one 1 MiB cudaMalloc, kept
 * Leaves live at exit: 6 streams, 1 MiB. Prints streams_live=6. */
#include "common.h"
#include "sim_cuda.h"
#include "sim_cuda_runtime.h"

#undef cuStreamDestroy /* sim_cuda.h maps the name to _v2, as cuda.h does; libcuda exports both */
CUresult cuStreamDestroy(CUstream hStream);

int main(void) {
    if (cudaSetDevice(0)) DIE("cudaSetDevice");
    cudaStream_t rt[7];
    for (int i = 0; i < 4; i++)
        if (cudaStreamCreate(&rt[i])) DIE("cudaStreamCreate");
    for (int i = 4; i < 7; i++)
        if (cudaStreamCreateWithPriority(&rt[i], 1, -i)) DIE("cudaStreamCreateWithPriority");
    CUstream drv[3];
    if (cuStreamCreate(&drv[0], 0) || cuStreamCreate(&drv[1], 1)) DIE("cuStreamCreate");
    if (cuStreamCreateWithPriority(&drv[2], 0, -2)) DIE("cuStreamCreateWithPriority");
    CUstream bad;
    if (cuStreamCreate(&bad, 99) == CUDA_SUCCESS) DIE("cuStreamCreate with flags 99 succeeded");
    if (cudaStreamDestroy(rt[0]) || cudaStreamDestroy(rt[5])) DIE("cudaStreamDestroy");
    if (cuStreamDestroy_v2(drv[0])) DIE("cuStreamDestroy_v2");
    if (cuStreamDestroy(drv[2])) DIE("cuStreamDestroy");
    void *p;
    if (cudaMalloc(&p, 1 * MiB)) DIE("cudaMalloc");
    printf("streams_live=%d\n", 6);
    return 0;
}
