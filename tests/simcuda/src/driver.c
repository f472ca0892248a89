/* Simulated CUDA driver (libcuda.so.1) for vramhook tests.
 *
 * Every exported function is a thin shell around static helpers, so calls inside
 * the library never go through an exported (interposable) symbol; the library is
 * also linked with -Bsymbolic. See ../README.md for what is simulated. */
#define _GNU_SOURCE
#include "sim_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long u64;

#define MAXDEV 16
#define GRAN (2ULL << 20)
#define VA_BASE 0x200000000000ULL
#define VA_PER_DEV 0x40000000000ULL /* 4 TiB of address space per device */
#define VA_FAST_BASE 0x680000000000ULL
#define DEFAULT_CAP 17179869184ULL

static u64 round_up(u64 v, u64 a) { return (v + a - 1) / a * a; }

/* ---------- configuration and global state ---------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int g_ndev = 1;
static u64 g_cap = DEFAULT_CAP;
static int g_fast;
static char g_logdir[4096];
static int g_inited;      /* cuInit called in this process (reset in a fork child) */
static int g_ever_used;   /* a memory call was made: write a summary at exit */
static _Atomic u64 local_used[MAXDEV];
static _Atomic u64 *dev_used = local_used; /* per-process, or the shared file */
static int g_shared;
static u64 proc_phys[MAXDEV]; /* physical bytes this process holds */
static u64 va_next[MAXDEV];
static _Atomic u64 fast_va = VA_FAST_BASE;
static int log_fd = -1;
static u64 next_vmm_handle = 0x10000;
static u64 next_array_handle = 0x5a0000001000ULL;

#define CTX_MAGIC 0x5c7c7c7cU
struct ctx {
    unsigned magic;
    int dev;
    int primary;
    int refcount;
};
static struct ctx primary_ctx[MAXDEV];
static __thread struct ctx *tl_ctx;

#define STREAM_MAGIC 0x57ea5eadU
struct stream {
    unsigned magic;
    int dev;
};

#define POOL_MAGIC 0x9001900fU
struct pool {
    unsigned magic;
    int dev;
    int is_default;
    int dead;
    u64 reserve; /* physical bytes held by the pool */
    u64 inuse;   /* requested bytes of live allocations */
    u64 max_size;
    u64 reserve_high, inuse_high;
    /* A synchronize gives back the reserve above this (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD).
     * The real driver's default is 0; the sim's is "never" unless a program sets one, so
     * that a pool's reserve stays after frees as PyTorch's cudaMallocAsync backend keeps it
     * (it sets the threshold to the maximum). */
    u64 release_threshold;
    struct pool *next;
};
static struct pool default_pool[MAXDEV];
static struct pool *created_pools;
/* The pool cuMemAllocAsync uses on each device (cuDeviceGetMemPool / cuDeviceSetMemPool). */
static struct pool *current_pool[MAXDEV];
/* A pool grows by multiples of this (VRAMHOOK_SIM_POOL_CHUNK_BYTES, rounded up to GRAN;
 * default GRAN): the real driver grows a pool's reserve in chunks larger than one request. */
static u64 g_pool_chunk = GRAN;

enum { OBJ_ALLOC = 1, OBJ_HANDLE, OBJ_ARRAY, OBJ_IPC };
enum { K_PLAIN = 1, K_PITCH, K_MANAGED, K_ASYNC };

struct obj {
    struct obj *next;
    int type;
    int kind;
    int dev;
    int released;
    int imported;
    int map_count;
    int export_ok;
    u64 key;  /* address or handle */
    u64 size; /* requested (or charged for pitch / arrays) bytes */
    u64 phys; /* physical bytes charged */
    struct pool *pool;
};

#define NBUCKET 65536
static struct obj *table[NBUCKET];

static unsigned bucket(int type, u64 key) {
    u64 h = (key ^ ((u64)type << 56)) * 0x9E3779B97F4A7C15ULL;
    return (unsigned)(h >> 48) & (NBUCKET - 1);
}

static struct obj *obj_find(int type, u64 key) {
    for (struct obj *o = table[bucket(type, key)]; o; o = o->next)
        if (o->type == type && o->key == key) return o;
    return NULL;
}

static struct obj *obj_add(int type, u64 key) {
    struct obj *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->type = type;
    o->key = key;
    unsigned b = bucket(type, key);
    o->next = table[b];
    table[b] = o;
    return o;
}

static void obj_del(struct obj *o) {
    struct obj **pp = &table[bucket(o->type, o->key)];
    while (*pp && *pp != o) pp = &(*pp)->next;
    if (*pp) *pp = o->next;
    free(o);
}

/* VMM reservations and mappings: short lists scanned for range checks */
struct resv {
    u64 addr, size;
    int dev;
    struct resv *next;
};
struct mapping {
    u64 addr, size, offset, handle;
    struct mapping *next;
};
static struct resv *resvs;
static struct mapping *mappings;

/* ---------- logging ---------- */

static long sim_gettid(void) { return syscall(SYS_gettid); }

static void log_open(void) {
    if (log_fd >= 0 || !g_logdir[0]) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/%d.jsonl", g_logdir, (int)getpid());
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        buf += w;
        n -= (size_t)w;
    }
}

/* Caller holds mu. */
static void logc(const char *fn, CUresult res, u64 addr, u64 size, u64 aux, int dev) {
    g_ever_used = 1;
    if (!g_logdir[0]) return;
    log_open();
    if (log_fd < 0) return;
    char buf[512];
    int n = snprintf(buf, sizeof buf,
                     "{\"fn\":\"%s\",\"result\":%d,\"addr\":%llu,\"size\":%llu,\"aux\":%llu,"
                     "\"device\":%d,\"tid\":%ld}\n",
                     fn, (int)res, addr, size, aux, dev, sim_gettid());
    if (n > 0 && n < (int)sizeof buf) write_all(log_fd, buf, (size_t)n);
}

/* ---------- physical accounting ---------- */

static int charge(int dev, u64 bytes) {
    u64 cur = atomic_load(&dev_used[dev]);
    do {
        if (cur + bytes < cur || cur + bytes > g_cap) return 0;
    } while (!atomic_compare_exchange_weak(&dev_used[dev], &cur, cur + bytes));
    proc_phys[dev] += bytes;
    return 1;
}

static void uncharge(int dev, u64 bytes) {
    atomic_fetch_sub(&dev_used[dev], bytes);
    proc_phys[dev] -= bytes;
}

/* VRAMHOOK_SIM_REUSE_VA=1: a freed allocation's range is handed out again to the next
 * allocation of the same size (most recently freed first), as a real driver reuses
 * addresses; by default every allocation gets a new range. */
static int g_reuse_va;
#define REUSE_SLOTS 64
static struct { u64 addr, size; } reusable[MAXDEV][REUSE_SLOTS];
static unsigned n_reusable[MAXDEV];

static void va_release(int dev, u64 addr, u64 size) {
    if (!g_reuse_va || !addr || n_reusable[dev] == REUSE_SLOTS) return;
    reusable[dev][n_reusable[dev]].addr = addr;
    reusable[dev][n_reusable[dev]].size = size;
    n_reusable[dev]++;
}

static u64 va_alloc(int dev, u64 size, u64 align) {
    for (unsigned i = n_reusable[dev]; i-- > 0;) {
        if (reusable[dev][i].size == size && reusable[dev][i].addr % align == 0) {
            u64 a = reusable[dev][i].addr;
            reusable[dev][i] = reusable[dev][--n_reusable[dev]];
            return a;
        }
    }
    u64 end = VA_BASE + (u64)(dev + 1) * VA_PER_DEV;
    u64 a = round_up(va_next[dev], align);
    if (size > end || a > end - size) return 0;
    va_next[dev] = a + size;
    return a;
}

/* ---------- init, fork, exit ---------- */

static u64 parse_u64(const char *s, u64 dflt) {
    if (!s || !*s) return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return dflt;
    return v;
}

static void reset_process_state(void) {
    for (unsigned b = 0; b < NBUCKET; b++) table[b] = NULL; /* leaked on purpose (fork child) */
    for (int d = 0; d < MAXDEV; d++) n_reusable[d] = 0;
    resvs = NULL;
    mappings = NULL;
    created_pools = NULL;
    for (int d = 0; d < MAXDEV; d++) {
        proc_phys[d] = 0;
        memset(&default_pool[d], 0, sizeof default_pool[d]);
        default_pool[d].magic = POOL_MAGIC;
        default_pool[d].dev = d;
        default_pool[d].is_default = 1;
        default_pool[d].release_threshold = ~0ULL;
        current_pool[d] = &default_pool[d];
        primary_ctx[d].magic = CTX_MAGIC;
        primary_ctx[d].dev = d;
        primary_ctx[d].primary = 1;
        primary_ctx[d].refcount = 0;
    }
}

static void atfork_prepare(void) { pthread_mutex_lock(&mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&mu); }
static void atfork_child(void) {
    /* The child holds no device memory and must initialise CUDA again. */
    pthread_mutex_init(&mu, NULL);
    if (log_fd >= 0) close(log_fd);
    log_fd = -1;
    g_inited = 0;
    g_ever_used = 0;
    tl_ctx = NULL;
    reset_process_state();
}

static _Atomic u64 g_raise_at_bytes;
/* VRAMHOOK_SIM_RAISE_AT_FREE_BYTES=N: the same inside the first cuMemFree_v2 of an
 * allocation of N bytes, after the driver released it (another thread may be handed its
 * address while the freeing thread is still in the call). */
static _Atomic u64 g_raise_at_free_bytes;
static __thread u64 tl_freed_size;

/* VRAMHOOK_SIM_TOUCH_BYTES=N (with VRAMHOOK_SIM_FAST): each fast cuMemAlloc_v2/cuMemFree_v2
 * reads N bytes of a buffer of the thread's own, a line at a time, as a real driver's call
 * walks its own structures: a hook's lines are then no longer in the nearest caches when
 * the call returns (the H200's real calls cost the hook more than the simulated ones). */
static u64 g_touch_bytes;
static __thread unsigned char *tl_touch;

static void touch_like_a_driver(void) {
    if (!tl_touch) {
        tl_touch = malloc(g_touch_bytes);
        if (!tl_touch) return;
        memset(tl_touch, 1, g_touch_bytes);
    }
    u64 sum = 0;
    for (u64 i = 0; i < g_touch_bytes; i += 64) sum += tl_touch[i];
    __asm__ volatile("" : : "r"(sum));
}

__attribute__((constructor)) static void sim_init(void) {
    int n = (int)parse_u64(getenv("VRAMHOOK_SIM_DEVICES"), 1);
    if (n < 1) n = 1;
    if (n > MAXDEV) n = MAXDEV;
    g_ndev = n;
    g_cap = parse_u64(getenv("VRAMHOOK_SIM_VRAM_BYTES"), DEFAULT_CAP);
    g_pool_chunk = round_up(parse_u64(getenv("VRAMHOOK_SIM_POOL_CHUNK_BYTES"), GRAN), GRAN);
    if (!g_pool_chunk) g_pool_chunk = GRAN;
    atomic_store(&g_raise_at_bytes, parse_u64(getenv("VRAMHOOK_SIM_RAISE_AT_BYTES"), 0));
    g_touch_bytes = parse_u64(getenv("VRAMHOOK_SIM_TOUCH_BYTES"), 0);
    const char *f = getenv("VRAMHOOK_SIM_FAST");
    g_fast = f && *f && strcmp(f, "0") != 0;
    const char *ld = getenv("VRAMHOOK_SIM_LOG_DIR");
    if (ld && *ld && strlen(ld) < sizeof g_logdir) strcpy(g_logdir, ld);
    for (int d = 0; d < MAXDEV; d++) va_next[d] = VA_BASE + (u64)d * VA_PER_DEV + GRAN;
    g_reuse_va = parse_u64(getenv("VRAMHOOK_SIM_REUSE_VA"), 0) != 0;
    atomic_store(&g_raise_at_free_bytes, parse_u64(getenv("VRAMHOOK_SIM_RAISE_AT_FREE_BYTES"), 0));
    reset_process_state();
    const char *sh = getenv("VRAMHOOK_SIM_SHARED");
    if (sh && *sh) {
        int fd = open(sh, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && st.st_size < 4096) {
                if (ftruncate(fd, 4096) != 0) { /* ignore: mmap below will fail */ }
            }
            void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) {
                dev_used = (_Atomic u64 *)p;
                g_shared = 1;
            }
            close(fd);
        }
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

__attribute__((destructor)) static void sim_fini(void) {
    /* Do not hang if another thread still holds the lock at exit. */
    int locked = 0;
    for (int i = 0; i < 200; i++) {
        if (pthread_mutex_trylock(&mu) == 0) {
            locked = 1;
            break;
        }
        struct timespec ts = {0, 500000};
        nanosleep(&ts, NULL);
    }
    if (g_ever_used && g_logdir[0]) {
        u64 live[MAXDEV] = {0}, cnt[MAXDEV] = {0};
        for (unsigned b = 0; b < NBUCKET; b++)
            for (struct obj *o = table[b]; o; o = o->next) {
                if (o->dev < 0 || o->dev >= MAXDEV) continue;
                if (o->type == OBJ_ALLOC || o->type == OBJ_ARRAY) {
                    live[o->dev] += o->size;
                    cnt[o->dev]++;
                } else if (o->type == OBJ_HANDLE && !o->imported) {
                    live[o->dev] += o->size;
                    cnt[o->dev]++;
                }
            }
        char buf[4096];
        int n = snprintf(buf, sizeof buf, "{\"summary\":true,\"pid\":%d,\"devices\":[", (int)getpid());
        for (int d = 0; d < g_ndev && n < (int)sizeof buf - 200; d++)
            n += snprintf(buf + n, sizeof buf - (size_t)n,
                          "%s{\"ordinal\":%d,\"capacity\":%llu,\"used_physical\":%llu,\"live_bytes\":%llu,"
                          "\"live_allocations\":%llu}",
                          d ? "," : "", d, g_cap, proc_phys[d], live[d], cnt[d]);
        n += snprintf(buf + n, sizeof buf - (size_t)n, "]}\n");
        log_open();
        if (log_fd >= 0) write_all(log_fd, buf, (size_t)n);
    }
    if (g_shared) /* like the real driver: a process's memory goes back when it exits */
        for (int d = 0; d < g_ndev; d++)
            if (proc_phys[d]) atomic_fetch_sub(&dev_used[d], proc_phys[d]);
    if (locked) pthread_mutex_unlock(&mu);
}

/* ---------- common checks ---------- */

static CUresult cur_dev(int *dev) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!tl_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = tl_ctx->dev;
    return CUDA_SUCCESS;
}

/* The checks a device query starts with: initialised, an out pointer, a device in range. */
static CUresult device_query(const void *out, CUdevice dev) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    return dev >= 0 && dev < g_ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* A memory call holds mu from its first check to its log line. These take mu and make the
 * first check: initialised, or a current context (whose device goes to *dev). */
static CUresult lock_inited(void) {
    pthread_mutex_lock(&mu);
    return g_inited ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult lock_cur_dev(int *dev) {
    pthread_mutex_lock(&mu);
    return cur_dev(dev);
}

/* Logs the call, leaves mu and returns the call's result. */
static CUresult log_unlock(const char *fn, CUresult r, u64 addr, u64 size, u64 aux, int dev) {
    logc(fn, r, addr, size, aux, dev);
    pthread_mutex_unlock(&mu);
    return r;
}

static int stream_ok(CUstream s) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return 1;
    return ((struct stream *)s)->magic == STREAM_MAGIC;
}

static struct pool *pool_check(CUmemoryPool p) {
    for (int d = 0; d < g_ndev; d++)
        if ((struct pool *)p == &default_pool[d]) return &default_pool[d];
    for (struct pool *q = created_pools; q; q = q->next)
        if ((struct pool *)p == q && !q->dead) return q;
    return NULL;
}

/* ---------- device and context ---------- */

EXPORT CUresult cuInit(unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    g_inited = 1;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult r = device_query(device, ordinal);
    if (!r) *device = ordinal;
    return r;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    CUresult r = device_query(count, 0); /* device 0 always exists */
    if (!r) *count = g_ndev;
    return r;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult r = device_query(bytes, dev);
    if (!r) *bytes = g_cap;
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CUresult r = device_query(pctx, dev);
    if (r) return r;
    pthread_mutex_lock(&mu);
    primary_ctx[dev].refcount++;
    pthread_mutex_unlock(&mu);
    *pctx = (CUcontext)&primary_ctx[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    if (primary_ctx[dev].refcount <= 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else primary_ctx[dev].refcount--; /* sim: memory stays; the context is never torn down */
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    CUresult r = device_query(pctx, dev);
    if (r) return r;
    struct ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->refcount = 1;
    tl_ctx = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx && ((struct ctx *)ctx)->magic != CTX_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
    tl_ctx = (struct ctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)tl_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    int dev;
    CUresult r = cur_dev(&dev);
    if (r) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = dev;
    return CUDA_SUCCESS;
}

static void pools_release_on_sync(int dev);

EXPORT CUresult cuCtxSynchronize(void) {
    int dev;
    CUresult r = cur_dev(&dev);
    if (!r) pools_release_on_sync(dev);
    return r;
}

/* Stream calls go to the log too (the stream in aux, as pools): vramhook counts streams,
 * whose device memory no memory call shows. */
static CUresult stream_create(const char *fname, CUstream *phStream, unsigned int Flags, int priority) {
    int dev;
    CUresult r = cur_dev(&dev);
    if (r) return r;
    struct stream *s = NULL;
    if (!phStream || Flags > 1) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!(s = calloc(1, sizeof *s))) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        s->magic = STREAM_MAGIC;
        s->dev = dev;
        *phStream = (CUstream)s;
    }
    pthread_mutex_lock(&mu);
    return log_unlock(fname, r, (u64)(int64_t)priority, 0, (u64)(uintptr_t)s, dev);
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return stream_create("cuStreamCreate", phStream, Flags, 0);
}

/* Any priority is taken (the real driver clamps it to its range, 0 to -5 on an H200). */
EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    return stream_create("cuStreamCreateWithPriority", phStream, flags, priority);
}

static CUresult stream_destroy(const char *fname, CUstream hStream);

#undef cuStreamDestroy /* cuda.h maps the name to _v2; libcuda exports both */
CUresult cuStreamDestroy(CUstream hStream);
EXPORT CUresult cuStreamDestroy(CUstream hStream) {
    return stream_destroy("cuStreamDestroy", hStream);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    return stream_destroy("cuStreamDestroy_v2", hStream);
}

static CUresult stream_destroy(const char *fname, CUstream hStream) {
    int dev;
    CUresult r = cur_dev(&dev);
    if (r) return r;
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD || !stream_ok(hStream)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        ((struct stream *)hStream)->magic = 0;
        free(hStream);
    }
    pthread_mutex_lock(&mu);
    return log_unlock(fname, r, 0, 0, (u64)(uintptr_t)hStream, dev);
}

EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
    int dev;
    CUresult r = cur_dev(&dev);
    if (r) return r;
    if (!stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
    pools_release_on_sync(dev);
    return CUDA_SUCCESS;
}

static const struct {
    CUresult code;
    const char *name;
} err_names[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"},
};

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof err_names / sizeof err_names[0]; i++)
        if (err_names[i].code == error) {
            *pStr = err_names[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---------- plain allocations ---------- */

/* A new object of `type` at `key` (0: none, as va_alloc gives when out of address space)
 * on `dev`, of `size` bytes, or NULL. Caller holds mu. */
static struct obj *obj_new(int type, u64 key, int dev, u64 size) {
    struct obj *o = key ? obj_add(type, key) : NULL;
    if (o) {
        o->dev = dev;
        o->size = size;
    }
    return o;
}

/* A new OBJ_ALLOC of `kind` for `size` bytes at fresh address space of `dev`, or NULL. */
static struct obj *alloc_obj(int dev, u64 size, int kind) {
    struct obj *o = obj_new(OBJ_ALLOC, va_alloc(dev, round_up(size, 512), 512), dev, size);
    if (o) o->kind = kind;
    return o;
}

/* Charges `phys` bytes on `dev` for a new object of `type`, keyed by the handle *next_key
 * (then advanced by `step`); or charges nothing, takes no handle and returns NULL. */
static struct obj *obj_charged(int type, u64 *next_key, u64 step, int dev, u64 size, u64 phys) {
    if (!charge(dev, phys)) return NULL;
    u64 key = *next_key;
    *next_key += step;
    struct obj *o = obj_new(type, key, dev, size);
    if (o) o->phys = phys;
    else uncharge(dev, phys);
    return o;
}

/* What an allocation writes through its out pointer: the address, or 0 when out of memory. */
static void put_dptr(CUdeviceptr *dptr, CUresult r, u64 addr) {
    if (r == CUDA_SUCCESS) *dptr = addr;
    else if (dptr && r == CUDA_ERROR_OUT_OF_MEMORY) *dptr = 0;
}

/* An allocation whose arguments are invalid: logged as the driver's error (the context's
 * if there is none). */
static CUresult refuse_invalid(const char *fn, u64 size, u64 aux) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    if (!r) r = CUDA_ERROR_INVALID_VALUE;
    return log_unlock(fn, r, 0, size, aux, dev);
}

static CUresult alloc_common(const char *fn, CUdeviceptr *dptr, u64 size, u64 aux, int kind) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    if (r == CUDA_SUCCESS && (!dptr || size == 0)) r = CUDA_ERROR_INVALID_VALUE;
    u64 addr = 0, phys = round_up(size, GRAN);
    if (r == CUDA_SUCCESS && !charge(dev, phys)) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        struct obj *o = alloc_obj(dev, size, kind);
        if (o) {
            o->phys = phys;
            addr = o->key;
        } else {
            uncharge(dev, phys);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    put_dptr(dptr, r, addr);
    return log_unlock(fn, r, addr, size, aux, dev);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    /* VRAMHOOK_SIM_RAISE_AT_BYTES=N: a signal that lands inside a driver call. The first
     * cuMemAlloc_v2 of N bytes raises SIGUSR1 after its work, before it returns (so into
     * whatever called the driver). A plain load first: other calls pay nothing locked. */
    u64 at = atomic_load_explicit(&g_raise_at_bytes, memory_order_relaxed);
    if (at && at == bytesize && atomic_exchange(&g_raise_at_bytes, 0) == at) {
        CUresult r = alloc_common("cuMemAlloc_v2", dptr, bytesize, 0, K_PLAIN);
        raise(SIGUSR1);
        return r;
    }
    if (g_fast) {
        if (!tl_ctx) return g_inited ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
        if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
        if (g_touch_bytes) touch_like_a_driver();
        /* per-thread bump inside 1 GiB chunks taken from a shared atomic: no lock, no sharing */
        static __thread u64 next, end;
        u64 sz = round_up(bytesize, 512);
        if (next + sz > end || next + sz < next) {
            u64 chunk = sz > (1ULL << 30) ? round_up(sz, 1ULL << 30) : (1ULL << 30);
            next = atomic_fetch_add_explicit(&fast_va, chunk, memory_order_relaxed);
            end = next + chunk;
        }
        *dptr = next;
        next += sz;
        return CUDA_SUCCESS;
    }
    return alloc_common("cuMemAlloc_v2", dptr, bytesize, 0, K_PLAIN);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes) {
    if (!pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
        return refuse_invalid("cuMemAllocPitch_v2", 0, 0);
    }
    u64 pitch = round_up(WidthInBytes, 512);
    CUresult r = alloc_common("cuMemAllocPitch_v2", dptr, pitch * Height, pitch, K_PITCH);
    if (r == CUDA_SUCCESS) *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
        return refuse_invalid("cuMemAllocManaged", bytesize, flags);
    }
    return alloc_common("cuMemAllocManaged", dptr, bytesize, flags, K_MANAGED);
}

static void pool_trim_locked(struct pool *p, u64 keep) {
    u64 target = round_up(p->inuse, GRAN);
    if (round_up(keep, GRAN) > target) target = round_up(keep, GRAN);
    if (p->reserve > target) {
        uncharge(p->dev, p->reserve - target);
        p->reserve = target;
    }
}

/* Free an OBJ_ALLOC; caller holds mu. */
static void free_alloc_locked(struct obj *o) {
    va_release(o->dev, o->key, round_up(o->size, 512));
    if (o->kind == K_ASYNC && o->pool) {
        struct pool *p = o->pool;
        p->inuse -= o->size; /* reserve stays with the pool */
        if (p->dead) pool_trim_locked(p, 0);
    } else {
        uncharge(o->dev, o->phys);
    }
    obj_del(o);
}

static CUresult free_common(const char *fn, CUdeviceptr dptr, int async, CUstream s) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    u64 size = 0, aux = 0;
    if (r == CUDA_SUCCESS && async && !stream_ok(s)) r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) {
        struct obj *o = dptr ? obj_find(OBJ_ALLOC, dptr) : NULL;
        if (!o) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else {
            size = o->size;
            tl_freed_size = size;
            dev = o->dev;
            if (o->kind == K_ASYNC && o->pool) aux = (u64)(uintptr_t)o->pool;
            free_alloc_locked(o);
        }
    }
    return log_unlock(fn, r, dptr, size, aux, dev);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (g_fast) {
        if (!tl_ctx) return g_inited ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_INITIALIZED;
        if (g_touch_bytes) touch_like_a_driver();
        return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    tl_freed_size = 0;
    CUresult r = free_common("cuMemFree_v2", dptr, 0, NULL);
    u64 at = atomic_load_explicit(&g_raise_at_free_bytes, memory_order_relaxed);
    if (at && at == tl_freed_size && atomic_exchange(&g_raise_at_free_bytes, 0) == at) raise(SIGUSR1);
    return r;
}

/* ---------- stream-ordered pools ---------- */

static CUresult async_alloc(const char *fn, CUdeviceptr *dptr, u64 size, CUmemoryPool hpool, int use_default,
                            CUstream s) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    struct pool *p = NULL;
    u64 addr = 0;
    if (r == CUDA_SUCCESS) {
        if (use_default) p = current_pool[dev];
        else if (!(p = pool_check(hpool))) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (p) dev = p->dev;
    if (r == CUDA_SUCCESS && (!dptr || size == 0)) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !stream_ok(s)) r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) {
        u64 need = p->inuse + size;
        if (need > p->reserve) {
            u64 grow = round_up(need - p->reserve, g_pool_chunk);
            if ((p->max_size && p->reserve + grow > p->max_size) || !charge(dev, grow))
                r = CUDA_ERROR_OUT_OF_MEMORY;
            else p->reserve += grow;
        }
    }
    struct obj *o = r == CUDA_SUCCESS ? alloc_obj(dev, size, K_ASYNC) : NULL;
    if (o) {
        o->pool = p;
        p->inuse += size;
        if (p->inuse > p->inuse_high) p->inuse_high = p->inuse;
        if (p->reserve > p->reserve_high) p->reserve_high = p->reserve;
        addr = o->key;
    } else if (r == CUDA_SUCCESS) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    put_dptr(dptr, r, addr);
    return log_unlock(fn, r, addr, size, (u64)(uintptr_t)p, dev);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return async_alloc("cuMemAllocAsync", dptr, bytesize, NULL, 1, hStream);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return async_alloc("cuMemAllocAsync_ptsz", dptr, bytesize, NULL, 1, hStream);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    return async_alloc("cuMemAllocFromPoolAsync", dptr, bytesize, pool, 0, hStream);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream) {
    return async_alloc("cuMemAllocFromPoolAsync_ptsz", dptr, bytesize, pool, 0, hStream);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    return free_common("cuMemFreeAsync", dptr, 1, hStream);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    return free_common("cuMemFreeAsync_ptsz", dptr, 1, hStream);
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    int dev = 0;
    CUresult r = lock_inited();
    struct pool *p = NULL;
    if (r == CUDA_SUCCESS && (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
                              props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
                              props->location.id >= g_ndev))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        dev = props->location.id;
        p = calloc(1, sizeof *p);
        if (!p) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        p->magic = POOL_MAGIC;
        p->dev = dev;
        p->max_size = props->maxSize;
        p->release_threshold = ~0ULL;
        p->next = created_pools;
        created_pools = p;
        *pool = (CUmemoryPool)p;
    }
    return log_unlock("cuMemPoolCreate", r, 0, 0, (u64)(uintptr_t)p, dev);
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    int dev = 0;
    CUresult r = lock_inited();
    struct pool *p = NULL;
    u64 released = 0;
    if (r == CUDA_SUCCESS && (!(p = pool_check(pool)) || p->is_default)) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        dev = p->dev;
        u64 before = p->reserve;
        p->dead = 1; /* outstanding allocations keep their share until freed */
        pool_trim_locked(p, 0);
        released = before - p->reserve;
    }
    return log_unlock("cuMemPoolDestroy", r, 0, released, (u64)(uintptr_t)pool, dev);
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    int dev = 0;
    CUresult r = lock_inited();
    struct pool *p = NULL;
    if (r == CUDA_SUCCESS && !(p = pool_check(pool))) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        dev = p->dev;
        pool_trim_locked(p, minBytesToKeep);
    }
    return log_unlock("cuMemPoolTrimTo", r, 0, minBytesToKeep, (u64)(uintptr_t)pool, dev);
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    CUresult r = device_query(pool_out, dev);
    if (!r) *pool_out = (CUmemoryPool)&default_pool[dev];
    return r;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    pthread_mutex_lock(&mu);
    CUresult r = device_query(pool, dev);
    if (!r) *pool = (CUmemoryPool)current_pool[dev];
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    pthread_mutex_lock(&mu);
    CUresult r = device_query(&pool, dev);
    struct pool *p = r ? NULL : pool_check(pool);
    if (!r && (!p || p->dev != dev)) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) current_pool[dev] = p;
    pthread_mutex_unlock(&mu);
    return r;
}

/* Not logged: the ground truth of a pool is its reserve, which the log's charges show. */
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult r = lock_inited();
    struct pool *p = r ? NULL : pool_check(pool);
    if (!r && (!p || !value)) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        u64 v = 0;
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->release_threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = p->reserve; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = p->reserve_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = p->inuse; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = p->inuse_high; break;
        default: r = CUDA_ERROR_INVALID_VALUE; /* the reuse flags: not simulated */
        }
        if (!r) memcpy(value, &v, sizeof v);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult r = lock_inited();
    struct pool *p = r ? NULL : pool_check(pool);
    if (!r && (!p || !value)) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        u64 v;
        memcpy(&v, value, sizeof v);
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = v; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: p->reserve_high = p->reserve; break; /* reset */
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: p->inuse_high = p->inuse; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* A synchronize on `dev`: each of its pools gives back its reserve above its release
 * threshold (never below what is in use). */
static void pools_release_on_sync(int dev) {
    pthread_mutex_lock(&mu);
    for (int d = 0; d < MAXDEV; d++)
        if (d == dev && default_pool[d].release_threshold != ~0ULL)
            pool_trim_locked(&default_pool[d], default_pool[d].release_threshold);
    for (struct pool *q = created_pools; q; q = q->next)
        if (q->dev == dev && !q->dead && q->release_threshold != ~0ULL) pool_trim_locked(q, q->release_threshold);
    pthread_mutex_unlock(&mu);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    u64 f = 0;
    if (r == CUDA_SUCCESS && (!free_b || !total)) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        u64 used = atomic_load(&dev_used[dev]);
        f = used >= g_cap ? 0 : g_cap - used;
        *free_b = f;
        *total = g_cap;
    }
    return log_unlock("cuMemGetInfo_v2", r, 0, f, g_cap, dev);
}

/* ---------- virtual memory management ---------- */

static int prop_ok(const CUmemAllocationProp *prop) {
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           prop->location.id >= 0 && prop->location.id < g_ndev;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!granularity || !prop_ok(prop) || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                           option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRAN;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    int dev = 0;
    CUresult r = lock_inited();
    u64 h = 0;
    if (r == CUDA_SUCCESS && prop_ok(prop)) dev = prop->location.id;
    if (r == CUDA_SUCCESS && (!handle || !prop_ok(prop) || flags != 0 || size == 0 || size % GRAN))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct obj *o = obj_charged(OBJ_HANDLE, &next_vmm_handle, 1, dev, size, size);
        if (!o) r = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            o->export_ok = (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
            *handle = h = o->key;
        }
    }
    return log_unlock("cuMemCreate", r, 0, size, h, dev);
}

static void handle_drop_if_dead(struct obj *o) {
    if (o->released && o->map_count == 0) {
        if (o->phys) uncharge(o->dev, o->phys);
        obj_del(o);
    }
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    int dev = 0;
    CUresult r = lock_inited();
    u64 size = 0;
    struct obj *o = NULL;
    if (r == CUDA_SUCCESS && (!(o = obj_find(OBJ_HANDLE, handle)) || o->released)) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        dev = o->dev;
        size = o->size;
        o->released = 1; /* physical memory goes when the last mapping goes */
        handle_drop_if_dead(o);
    }
    return log_unlock("cuMemRelease", r, 0, size, handle, dev);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    u64 a = 0;
    (void)addr; /* the hint is ignored, as the driver may */
    if (r == CUDA_SUCCESS && (!ptr || size == 0 || size % GRAN || flags != 0 ||
                              (alignment & (alignment - 1))))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        u64 al = alignment > GRAN ? alignment : GRAN;
        a = va_alloc(dev, size, al);
        struct resv *rv = a ? calloc(1, sizeof *rv) : NULL;
        if (!rv) {
            a = 0;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            rv->addr = a;
            rv->size = size;
            rv->dev = dev;
            rv->next = resvs;
            resvs = rv;
            *ptr = a;
        }
    }
    return log_unlock("cuMemAddressReserve", r, a, size, alignment, dev);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    int dev = 0;
    CUresult r = lock_inited();
    struct resv **pp = &resvs;
    if (r == CUDA_SUCCESS) {
        while (*pp && !((*pp)->addr == ptr && (*pp)->size == size)) pp = &(*pp)->next;
        if (!*pp) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        dev = (*pp)->dev;
        for (struct mapping *m = mappings; m; m = m->next)
            if (m->addr < ptr + size && ptr < m->addr + m->size) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        struct resv *rv = *pp;
        *pp = rv->next;
        free(rv);
    }
    return log_unlock("cuMemAddressFree", r, ptr, size, 0, dev);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    int dev = 0;
    CUresult r = lock_inited();
    struct obj *o = NULL;
    struct resv *rv = NULL;
    if (r == CUDA_SUCCESS && (!(o = obj_find(OBJ_HANDLE, handle)) || o->released)) r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) dev = o->dev;
    if (r == CUDA_SUCCESS && (flags != 0 || size == 0 || size % GRAN || offset % GRAN || ptr % GRAN ||
                              offset > o->size || size > o->size - offset))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        for (rv = resvs; rv; rv = rv->next)
            if (ptr >= rv->addr && ptr - rv->addr < rv->size && size <= rv->size - (ptr - rv->addr)) break;
        if (!rv) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS)
        for (struct mapping *m = mappings; m; m = m->next)
            if (m->addr < ptr + size && ptr < m->addr + m->size) {
                r = CUDA_ERROR_INVALID_VALUE;
                break;
            }
    if (r == CUDA_SUCCESS) {
        struct mapping *m = calloc(1, sizeof *m);
        if (!m) r = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            m->addr = ptr;
            m->size = size;
            m->offset = offset;
            m->handle = handle;
            m->next = mappings;
            mappings = m;
            o->map_count++;
        }
    }
    return log_unlock("cuMemMap", r, ptr, size, handle, dev);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    int dev = 0;
    CUresult r = lock_inited();
    u64 first_handle = 0;
    int found = 0;
    if (r == CUDA_SUCCESS && size == 0) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        /* every mapping touched must lie wholly inside the range, and one must start at ptr */
        for (struct mapping *m = mappings; m; m = m->next) {
            if (!(m->addr < ptr + size && ptr < m->addr + m->size)) continue;
            if (m->addr < ptr || m->addr + m->size > ptr + size) r = CUDA_ERROR_INVALID_VALUE;
            if (m->addr == ptr) {
                found = 1;
                first_handle = m->handle;
            }
        }
        if (!found) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        struct mapping **pp = &mappings;
        while (*pp) {
            struct mapping *m = *pp;
            if (m->addr >= ptr && m->addr + m->size <= ptr + size) {
                *pp = m->next;
                struct obj *o = obj_find(OBJ_HANDLE, m->handle);
                if (o) {
                    dev = o->dev;
                    o->map_count--;
                    handle_drop_if_dead(o);
                }
                free(m);
            } else {
                pp = &m->next;
            }
        }
    }
    return log_unlock("cuMemUnmap", r, ptr, size, first_handle, dev);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= g_ndev)
            return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    /* the whole range must be covered by mappings */
    u64 covered = 0;
    for (struct mapping *m = mappings; m; m = m->next) {
        u64 lo = m->addr > ptr ? m->addr : ptr;
        u64 hi = m->addr + m->size < ptr + size ? m->addr + m->size : ptr + size;
        if (lo < hi) covered += hi - lo;
    }
    pthread_mutex_unlock(&mu);
    return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------- arrays ---------- */

static u64 elem_size(int fmt) {
    switch (fmt) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static u64 max1(u64 v) { return v ? v : 1; }

/* levels == 0: a plain array */
static u64 array_bytes(u64 w, u64 h, u64 d, int fmt, unsigned ch, unsigned levels) {
    u64 es = elem_size(fmt);
    if (!es || w == 0 || (ch != 1 && ch != 2 && ch != 4)) return 0;
    if (levels == 0) return w * max1(h) * max1(d) * ch * es;
    u64 total = 0;
    for (unsigned l = 0; l < levels; l++) {
        total += max1(w) * max1(h) * max1(d) * ch * es;
        w = max1(w >> 1);
        h = h ? max1(h >> 1) : 0;
        d = d ? max1(d >> 1) : 0;
    }
    return total;
}

static CUresult array_create(const char *fn, void **out, u64 bytes, int kind) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    u64 h = 0;
    if (r == CUDA_SUCCESS && (!out || bytes == 0)) r = CUDA_ERROR_INVALID_VALUE;
    struct obj *o = r ? NULL : obj_charged(OBJ_ARRAY, &next_array_handle, 0x40, dev, bytes, round_up(bytes, GRAN));
    if (o) {
        o->kind = kind;
        h = o->key;
        *out = (void *)(uintptr_t)h;
    } else if (!r) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    return log_unlock(fn, r, h, bytes, 0, dev);
}

static CUresult array_destroy(const char *fn, u64 h, int kind) {
    int dev = 0;
    CUresult r = lock_inited();
    u64 size = 0;
    struct obj *o = NULL;
    if (r == CUDA_SUCCESS && (!(o = obj_find(OBJ_ARRAY, h)) || o->kind != kind)) r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) {
        dev = o->dev;
        size = o->size;
        uncharge(o->dev, o->phys);
        obj_del(o);
    }
    return log_unlock(fn, r, h, size, 0, dev);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    u64 bytes = d ? array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 0) : 0;
    return array_create("cuArrayCreate_v2", (void **)pHandle, bytes, 1);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    u64 bytes = d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 0) : 0;
    return array_create("cuArray3DCreate_v2", (void **)pHandle, bytes, 1);
}

EXPORT CUresult cuArrayDestroy(CUarray hArray) {
    return array_destroy("cuArrayDestroy", (u64)(uintptr_t)hArray, 1);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int numMipmapLevels) {
    u64 bytes = d && numMipmapLevels ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                                                   numMipmapLevels)
                                     : 0;
    return array_create("cuMipmappedArrayCreate", (void **)pHandle, bytes, 2);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return array_destroy("cuMipmappedArrayDestroy", (u64)(uintptr_t)hMipmappedArray, 2);
}

/* ---------- IPC and shareable handles ---------- */

#define IPC_MAGIC 0x53494d4950434d48ULL /* "SIMIPCMH" */
struct ipc_payload {
    u64 magic;
    u64 addr;
    u64 size;
    int dev;
    int pid;
};

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    struct obj *o = NULL;
    if (r == CUDA_SUCCESS && (!pHandle || !(o = obj_find(OBJ_ALLOC, dptr)) || o->kind != K_PLAIN))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct ipc_payload pl = {IPC_MAGIC, dptr, o->size, o->dev, (int)getpid()};
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle->reserved, &pl, sizeof pl);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult ipc_open(const char *fname, CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    struct ipc_payload pl;
    memcpy(&pl, handle.reserved, sizeof pl);
    u64 a = 0;
    if (r == CUDA_SUCCESS && (!pdptr || (Flags & ~1U) || pl.magic != IPC_MAGIC || pl.size == 0 || pl.dev < 0 ||
                              pl.dev >= g_ndev))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        dev = pl.dev;
        struct obj *o = obj_new(OBJ_IPC, va_alloc(dev, round_up(pl.size, GRAN), GRAN), dev, pl.size);
        if (!o) r = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            o->imported = 1; /* takes no physical bytes in the importer */
            *pdptr = a = o->key;
        }
    }
    return log_unlock(fname, r, a, r == CUDA_SUCCESS ? pl.size : 0, pl.magic == IPC_MAGIC ? pl.addr : 0, dev);
}

/* Base and size of the allocation containing dptr (exact base addresses only in the sim). */
#undef cuIpcOpenMemHandle /* cuda.h maps the name to _v2; libcuda exports both */
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);

/* cudart 13 asks for "cuIpcOpenMemHandle" at version 4010 and gets this legacy entry
 * point (measured on an H200, driver 580); _v2 is the answer from 11000 on. */
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    return ipc_open("cuIpcOpenMemHandle", pdptr, handle, Flags);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    return ipc_open("cuIpcOpenMemHandle_v2", pdptr, handle, Flags);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    pthread_mutex_lock(&mu);
    struct obj *o = obj_find(OBJ_ALLOC, dptr);
    if (!o) o = obj_find(OBJ_IPC, dptr);
    CUresult r = o ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    if (o) {
        if (pbase) *pbase = dptr;
        if (psize) *psize = o->size;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    int dev = 0;
    CUresult r = lock_cur_dev(&dev);
    u64 size = 0;
    struct obj *o = NULL;
    if (r == CUDA_SUCCESS && !(o = obj_find(OBJ_IPC, dptr))) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        dev = o->dev;
        size = o->size;
        obj_del(o);
    }
    return log_unlock("cuIpcCloseMemHandle", r, dptr, size, 0, dev);
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType, unsigned long long flags) {
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!shareableHandle || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    struct obj *o = obj_find(OBJ_HANDLE, handle);
    CUresult r = CUDA_SUCCESS;
    struct ipc_payload pl = {0, 0, 0, 0, 0};
    if (!o || o->released || !o->export_ok) r = CUDA_ERROR_INVALID_VALUE;
    else {
        pl.magic = IPC_MAGIC;
        pl.addr = handle;
        pl.size = o->size;
        pl.dev = o->dev;
        pl.pid = (int)getpid();
    }
    pthread_mutex_unlock(&mu);
    if (r) return r;
    int fd = memfd_create("simcuda-shareable", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (pwrite(fd, &pl, sizeof pl, 0) != (ssize_t)sizeof pl) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType) {
    int dev = 0;
    CUresult r = lock_inited();
    struct ipc_payload pl = {0, 0, 0, 0, 0};
    u64 h = 0;
    if (r == CUDA_SUCCESS && shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) r = CUDA_ERROR_NOT_SUPPORTED;
    if (r == CUDA_SUCCESS) {
        int fd = (int)(intptr_t)osHandle;
        if (!handle || pread(fd, &pl, sizeof pl, 0) != (ssize_t)sizeof pl || pl.magic != IPC_MAGIC || pl.dev < 0 ||
            pl.dev >= g_ndev)
            r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) dev = pl.dev;
    struct obj *o = r ? NULL : obj_new(OBJ_HANDLE, next_vmm_handle++, dev, pl.size);
    if (o) {
        o->imported = 1; /* no new physical bytes */
        *handle = h = o->key;
    } else if (!r) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    return log_unlock("cuMemImportFromShareableHandle", r, 0, pl.size, h, dev);
}

/* ---------- cuGetProcAddress ---------- */

#define FN(f) ((void *)(f))
struct proc_entry {
    const char *name;
    int minver;     /* lowest cudaVersion that knows the symbol */
    void *fn;       /* answer below v2ver (NULL: no such export in the sim) */
    int v2ver;      /* from this version on, fn_v2 is the answer */
    void *fn_v2;
    void *fn_ptsz;  /* answer with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
};

static const struct proc_entry *proc_table(size_t *n);

static CUresult gpa_impl(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *st) {
    if (!symbol || !pfn || (flags & ~3ULL)) return CUDA_ERROR_INVALID_VALUE;
    size_t n;
    const struct proc_entry *t = proc_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(t[i].name, symbol) != 0) continue;
        void *f = NULL;
        if (ver >= t[i].minver) {
            f = t[i].fn;
            if (t[i].fn_v2 && ver >= t[i].v2ver) f = t[i].fn_v2;
            if (f && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && t[i].fn_ptsz) f = t[i].fn_ptsz;
        }
        if (!f) {
            *pfn = NULL;
            if (st) *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = f;
        if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return gpa_impl(symbol, pfn, cudaVersion, flags, NULL);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus) {
    return gpa_impl(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* Rows of the table, named once: a symbol known from version `since` with one entry point;
 * one answered by its _v2 from version `v2` on (the sim has no older entry point); one with
 * both; one with a _ptsz variant for per-thread default streams. */
#define SYM(f, since) {#f, since, FN(f), 0, NULL, NULL}
#define SYM_V2(f, since, v2) {#f, since, NULL, v2, FN(f##_v2), NULL}
#define SYM_AND_V2(f, since, v2) {#f, since, FN(f), v2, FN(f##_v2), NULL}
#define SYM_PTSZ(f, since) {#f, since, FN(f), 0, NULL, FN(f##_ptsz)}

static const struct proc_entry *proc_table(size_t *n) {
    static const struct proc_entry t[] = {
        SYM(cuInit, 2000),
        SYM(cuDriverGetVersion, 2020),
        SYM(cuDeviceGet, 2000),
        SYM(cuDeviceGetCount, 2000),
        SYM_V2(cuDeviceTotalMem, 2000, 3020),
        SYM(cuDevicePrimaryCtxRetain, 7000),
        SYM_V2(cuDevicePrimaryCtxRelease, 7000, 11000),
        SYM_V2(cuCtxCreate, 2000, 3020),
        SYM(cuCtxSetCurrent, 4000),
        SYM(cuCtxGetCurrent, 4000),
        SYM(cuCtxGetDevice, 2000),
        SYM(cuCtxSynchronize, 2000),
        SYM(cuStreamCreate, 2000),
        SYM(cuStreamCreateWithPriority, 5050),
        SYM_AND_V2(cuStreamDestroy, 2000, 4000),
        SYM(cuStreamSynchronize, 2000),
        SYM_AND_V2(cuGetProcAddress, 11030, 12000),
        SYM(cuGetErrorName, 6000),
        SYM_V2(cuMemGetInfo, 2000, 3020),
        SYM_V2(cuMemAlloc, 2000, 3020),
        SYM_V2(cuMemAllocPitch, 2000, 3020),
        SYM(cuMemAllocManaged, 6000),
        SYM_V2(cuMemFree, 2000, 3020),
        SYM_PTSZ(cuMemAllocAsync, 11020),
        SYM_PTSZ(cuMemAllocFromPoolAsync, 11020),
        SYM_PTSZ(cuMemFreeAsync, 11020),
        SYM(cuMemPoolCreate, 11020),
        SYM(cuMemPoolDestroy, 11020),
        SYM(cuMemPoolTrimTo, 11020),
        SYM(cuDeviceGetDefaultMemPool, 11020),
        SYM(cuDeviceGetMemPool, 11020),
        SYM(cuDeviceSetMemPool, 11020),
        SYM(cuMemPoolGetAttribute, 11020),
        SYM(cuMemPoolSetAttribute, 11020),
        SYM(cuMemGetAllocationGranularity, 10020),
        SYM(cuMemCreate, 10020),
        SYM(cuMemRelease, 10020),
        SYM(cuMemAddressReserve, 10020),
        SYM(cuMemAddressFree, 10020),
        SYM(cuMemMap, 10020),
        SYM(cuMemUnmap, 10020),
        SYM(cuMemSetAccess, 10020),
        SYM_V2(cuArrayCreate, 2000, 3020),
        SYM_V2(cuArray3DCreate, 2000, 3020),
        SYM(cuArrayDestroy, 2000),
        SYM(cuMipmappedArrayCreate, 5000),
        SYM(cuMipmappedArrayDestroy, 5000),
        SYM(cuIpcGetMemHandle, 4010),
        SYM_AND_V2(cuIpcOpenMemHandle, 4010, 11000),
        SYM(cuIpcCloseMemHandle, 4010),
        SYM_V2(cuMemGetAddressRange, 2000, 3020),
        SYM(cuMemExportToShareableHandle, 10020),
        SYM(cuMemImportFromShareableHandle, 10020),
    };
    *n = sizeof t / sizeof t[0];
    return t;
}
