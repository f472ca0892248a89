/* A fake NVML (libnvidia-ml.so.1) for tests: the per-process usage calls vramhook's
 * readers make, answered from a file the test writes.
 *
 *   VRAMHOOK_SIM_NVML     path of a file of lines `device pid bytes [g]` (bytes may be `na`:
 *                         NVML_VALUE_NOT_AVAILABLE; `g`: listed as a graphics process instead
 *                         of a compute one; `#` starts a comment), re-read at every call, so a
 *                         test can change the answer while a reader runs. Unset, or a file
 *                         that cannot be read: no process on any device.
 *   VRAMHOOK_SIM_DEVICES  device count (default 1, as the simulated driver's).
 *
 * Built twice: the full library (v1, v2 and v3 of the process calls) and, with
 * -DFAKE_NVML_V1_ONLY, one that exports only the v1 calls (16-byte entries), as an old
 * driver's does. Like NVML, the process calls answer NVML_ERROR_INSUFFICIENT_SIZE with the
 * count needed when the caller's buffer is too small, and every call but init fails with
 * NVML_ERROR_UNINITIALIZED before nvmlInit_v2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
};
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)
#define MAX_DEVICES 16
#define MAX_ENTRIES 4096

typedef struct nvmlDevice_st *nvmlDevice_t;
struct nvmlDevice_st {
    unsigned int index;
};
static struct nvmlDevice_st g_devices[MAX_DEVICES];
static int g_init; /* nvmlInit_v2 calls not yet shut down */

/* nvmlProcessInfo_v1_t (16 bytes) and nvmlProcessInfo_t / _v2_t (24 bytes). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "v1 entry");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "v2/v3 entry");

static unsigned device_count(void) {
    const char *v = getenv("VRAMHOOK_SIM_DEVICES");
    long n = v && *v ? strtol(v, NULL, 10) : 1;
    if (n < 1) n = 1;
    if (n > MAX_DEVICES) n = MAX_DEVICES;
    return (unsigned)n;
}

struct entry {
    unsigned pid;
    unsigned long long bytes;
};

/* The processes of `device` of one kind (graphics or compute) in the file, at most `max`. */
static unsigned read_entries(unsigned device, int graphics, struct entry *out, unsigned max) {
    const char *path = getenv("VRAMHOOK_SIM_NVML");
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    char line[256];
    unsigned n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        unsigned dev, pid;
        char bytes[32], kind[8] = "";
        int got = sscanf(line, "%u %u %31s %7s", &dev, &pid, bytes, kind);
        if (got < 3 || dev != device) continue;
        if ((strcmp(kind, "g") == 0) != (graphics != 0)) continue;
        out[n].pid = pid;
        out[n].bytes = strcmp(bytes, "na") == 0 ? NVML_VALUE_NOT_AVAILABLE : strtoull(bytes, NULL, 10);
        n++;
    }
    fclose(f);
    return n;
}

/* The process calls of every version: entries of `stride` bytes (16 or 24). */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, size_t stride, int graphics) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!device || device < g_devices || device >= g_devices + device_count() || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct entry *all = calloc(MAX_ENTRIES, sizeof *all);
    if (!all) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = read_entries(device->index, graphics, all, MAX_ENTRIES);
    if (*count < n || (n > 0 && !infos)) {
        *count = n;
        free(all);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        if (stride == sizeof(nvmlProcessInfo_t)) {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
            p->pid = all[i].pid;
            p->usedGpuMemory = all[i].bytes;
            p->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            p->computeInstanceId = 0xFFFFFFFFu;
        } else {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = all[i].pid;
            p->usedGpuMemory = all[i].bytes;
        }
    }
    *count = n;
    free(all);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) {
    for (unsigned i = 0; i < MAX_DEVICES; i++) g_devices[i].index = i;
    g_init++;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

API nvmlReturn_t nvmlShutdown(void) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    g_init--;
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!g_init) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos) {
    return processes(d, count, infos, sizeof *infos, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos) {
    return processes(d, count, infos, sizeof *infos, 1);
}

#ifndef FAKE_NVML_V1_ONLY
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, count, infos, sizeof *infos, 0);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, count, infos, sizeof *infos, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, count, infos, sizeof *infos, 1);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, count, infos, sizeof *infos, 1);
}
#endif
