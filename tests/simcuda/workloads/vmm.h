/* Helpers for the workloads that call the driver's virtual memory API (include after
 * sim_cuda.h). */
#ifndef SIM_WORKLOAD_VMM_H
#define SIM_WORKLOAD_VMM_H
#include <string.h>

/* Properties of pinned device memory on device dev, every other field zero. */
static inline CUmemAllocationProp pinned_on_device(int dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}
#endif
