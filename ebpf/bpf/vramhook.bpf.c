// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * vramhook's eBPF programs: one uprobe and one uretprobe, each attached to every memory
 * entry point of libcuda that the interposer wraps. The attach cookie says which
 * function fired (vramhook's `Api` code).
 *
 *  - entry: for a traced process (tgid in `targets`, or every process when `trace_all`),
 *    saves the arguments and the stack pointer in `inflight`, keyed by thread.
 *  - return: matches the thread's saved entry by stack pointer (only the outermost
 *    memory call of a thread is recorded, as the interposer does), reads the result and
 *    the out-pointers (`CUdeviceptr*`, handles, pitch, free/total) now that the driver
 *    has written them, and sends one `struct vh_event` through the `events` ring buffer.
 *    A full ring buffer counts the event in `drops` instead.
 *
 * The agent decodes `vh_event` into vramhook's 64-byte record (ebpf/src/decode.rs) and
 * treats it as untrusted input.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

typedef __u64 u64;
typedef __u32 u32;
typedef __s32 s32;

/* The registers a uprobe sees (the kernel's pt_regs, which is the user ABI's layout). */
#if defined(__TARGET_ARCH_x86)
struct vh_regs {
    u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
#define ARG0(r) ((r)->di)
#define ARG1(r) ((r)->si)
#define ARG2(r) ((r)->dx)
#define ARG3(r) ((r)->cx)
#define ARG4(r) ((r)->r8)
#define RET(r) ((r)->ax)
#define SP(r) ((r)->sp)
/* After `ret` the return address has been popped. */
#define RET_SP_DELTA 8
#elif defined(__TARGET_ARCH_arm64)
struct vh_regs {
    u64 regs[31];
    u64 sp, pc, pstate;
};
#define ARG0(r) ((r)->regs[0])
#define ARG1(r) ((r)->regs[1])
#define ARG2(r) ((r)->regs[2])
#define ARG3(r) ((r)->regs[3])
#define ARG4(r) ((r)->regs[4])
#define RET(r) ((r)->regs[0])
#define SP(r) ((r)->sp)
#define RET_SP_DELTA 0
#else
#error "define __TARGET_ARCH_x86 or __TARGET_ARCH_arm64"
#endif

/* Api codes (protocol/src/record.rs) whose calls need reads at return. */
enum {
    API_cuMemAllocPitch_v2 = 2,
    API_cuMemCreate = 12,
    API_cuArrayCreate_v2 = 18,
    API_cuArray3DCreate_v2 = 19,
    API_cuMipmappedArrayCreate = 20,
    API_cuMemGetInfo_v2 = 26,
    API_cuMemPoolCreate = 27,
    API_MAX = 64,
};

/* Api codes whose first argument is an out-pointer the driver writes: cuMemAlloc_v2 (1),
 * Pitch_v2 (2), Managed (3), AllocAsync[_ptsz] (5, 6), AllocFromPoolAsync[_ptsz] (7, 8),
 * cuMemCreate (12), cuMemAddressReserve (16), array creates (18, 19, 20),
 * cuIpcOpenMemHandle_v2 (23), cuMemImportFromShareableHandle (25), cuMemGetInfo_v2 (26),
 * cuMemPoolCreate (27), cuIpcOpenMemHandle (29), cuStreamCreate (31),
 * cuStreamCreateWithPriority (32). */
#define OUT0_APIS                                                                                                  \
    ((1ull << 1) | (1ull << 2) | (1ull << 3) | (1ull << 5) | (1ull << 6) | (1ull << 7) | (1ull << 8) | (1ull << 12) | \
     (1ull << 16) | (1ull << 18) | (1ull << 19) | (1ull << 20) | (1ull << 23) | (1ull << 25) | (1ull << 26) |        \
     (1ull << 27) | (1ull << 29) | (1ull << 31) | (1ull << 32))

/* Bits of vh_event.flags. */
#define VH_OUT0 1u  /* out[0] = *(u64 *)args[0] was read */
#define VH_OUT1 2u  /* out[1] = *(u64 *)args[1] was read */
#define VH_EXTRA 4u /* extra[] was read (descriptor or properties) */

/* One call, as sent to the agent. Layout shared with ebpf/src/decode.rs (WIRE_SIZE 128). */
struct vh_event {
    u64 ts_ns;    /* bpf_ktime_get_ns at return: CLOCK_MONOTONIC */
    u32 tgid;
    u32 tid;
    u32 api;      /* the attach cookie */
    s32 result;   /* CUresult */
    u64 args[5];  /* arguments at entry */
    u64 out[2];   /* values the driver wrote behind args[0] / args[1] */
    u64 extra[4]; /* an array descriptor, or a properties structure's location id */
    u32 flags;
    u32 magic;    /* VH_MAGIC: a record from this program */
    u64 entry_ns; /* bpf_ktime_get_ns at entry */
};
#define VH_MAGIC 0x76686562u /* "vheb" */
_Static_assert(sizeof(struct vh_event) == 128, "vh_event is 128 bytes");
_Static_assert(__builtin_offsetof(struct vh_event, extra) == 80 && __builtin_offsetof(struct vh_event, flags) == 112 &&
                   __builtin_offsetof(struct vh_event, magic) == 116 && __builtin_offsetof(struct vh_event, entry_ns) == 120,
               "vh_event layout (ebpf/src/decode.rs)");

struct inflight {
    u64 args[5];
    u64 sp;
    u64 entry_ns;
    u32 api;
    u32 pad;
};

/* Set by the agent before load: trace every process that maps libcuda. */
const volatile u32 trace_all = 0;

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Processes to trace (tgid -> 1) when not tracing all. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, u32);
} targets SEC(".maps");

/* Entries waiting for their return, by thread. LRU: a thread that dies inside a call
 * cannot fill it. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, u64);
    __type(value, struct inflight);
} inflight SEC(".maps");

/* [0]: events lost to a full ring buffer; [1]: returns whose entry was gone (evicted or
 * attached mid-call); [2]: nested memory calls skipped (inside another memory call). */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 4);
    __type(key, u32);
    __type(value, u64);
} counters SEC(".maps");

/* Events lost to a full ring buffer, by process (tgid -> count). */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, u64);
} lost SEC(".maps");

static __always_inline void lose(u32 tgid) {
    u64 *v = bpf_map_lookup_elem(&lost, &tgid);
    if (v) {
        __sync_fetch_and_add(v, 1);
        return;
    }
    u64 one = 1;
    if (bpf_map_update_elem(&lost, &tgid, &one, BPF_NOEXIST) != 0) {
        v = bpf_map_lookup_elem(&lost, &tgid);
        if (v) __sync_fetch_and_add(v, 1);
    }
}

static __always_inline void count(u32 idx) {
    u64 *v = bpf_map_lookup_elem(&counters, &idx);
    if (v) *v += 1;
}

static __always_inline int wanted(u32 tgid) {
    if (trace_all) return 1;
    return bpf_map_lookup_elem(&targets, &tgid) != 0;
}

SEC("uprobe")
int vh_entry(struct vh_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    if (!wanted((u32)(id >> 32))) return 0;
    u64 sp = SP(ctx);
    struct inflight *cur = bpf_map_lookup_elem(&inflight, &id);
    /* A saved frame higher on the stack is a call still running: this one is nested
     * inside it (the driver calling itself), and is not recorded. */
    if (cur && cur->sp > sp) {
        count(2);
        return 0;
    }
    struct inflight f = {};
    f.args[0] = ARG0(ctx);
    f.args[1] = ARG1(ctx);
    f.args[2] = ARG2(ctx);
    f.args[3] = ARG3(ctx);
    f.args[4] = ARG4(ctx);
    f.sp = sp;
    f.entry_ns = bpf_ktime_get_ns();
    f.api = (u32)bpf_get_attach_cookie(ctx);
    bpf_map_update_elem(&inflight, &id, &f, BPF_ANY);
    return 0;
}

SEC("uretprobe")
int vh_return(struct vh_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct inflight *f = bpf_map_lookup_elem(&inflight, &id);
    if (!f) {
        if (wanted((u32)(id >> 32))) count(1);
        return 0;
    }
    u64 sp = SP(ctx);
    u32 api = (u32)bpf_get_attach_cookie(ctx);
    if (sp != f->sp + RET_SP_DELTA || api != f->api) {
        /* A nested call returning (lower on the stack) or a stale frame (higher). */
        if (sp > f->sp + RET_SP_DELTA) bpf_map_delete_elem(&inflight, &id);
        return 0;
    }
    struct vh_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
    if (!e) {
        count(0);
        lose((u32)(id >> 32));
        bpf_map_delete_elem(&inflight, &id);
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->tgid = (u32)(id >> 32);
    e->tid = (u32)id;
    e->api = api;
    e->result = (s32)RET(ctx);
    e->entry_ns = f->entry_ns;
    e->magic = VH_MAGIC;
    e->flags = 0;
    e->out[0] = 0;
    e->out[1] = 0;
    e->extra[0] = 0;
    e->extra[1] = 0;
    e->extra[2] = 0;
    e->extra[3] = 0;
#pragma unroll
    for (int i = 0; i < 5; i++) e->args[i] = f->args[i];
    bpf_map_delete_elem(&inflight, &id);

    /* Out-pointers: read only for the functions whose first argument is one (reading a
     * device address as user memory would fault: correct, but slow); the agent uses the
     * value only on success. */
    if (api < 64 && ((OUT0_APIS >> api) & 1) && e->args[0] &&
        bpf_probe_read_user(&e->out[0], 8, (void *)e->args[0]) == 0)
        e->flags |= VH_OUT0;
    if ((api == API_cuMemAllocPitch_v2 || api == API_cuMemGetInfo_v2) && e->args[1] &&
        bpf_probe_read_user(&e->out[1], 8, (void *)e->args[1]) == 0)
        e->flags |= VH_OUT1;
    if (api == API_cuArrayCreate_v2 && e->args[1]) {
        if (bpf_probe_read_user(&e->extra[0], 24, (void *)e->args[1]) == 0) e->flags |= VH_EXTRA;
    } else if ((api == API_cuArray3DCreate_v2 || api == API_cuMipmappedArrayCreate) && e->args[1]) {
        if (bpf_probe_read_user(&e->extra[0], 32, (void *)e->args[1]) == 0) e->flags |= VH_EXTRA;
    } else if (api == API_cuMemCreate && e->args[2]) {
        /* CUmemAllocationProp.location.id at offset 12 */
        if (bpf_probe_read_user(&e->extra[0], 4, (void *)(e->args[2] + 12)) == 0) e->flags |= VH_EXTRA;
    } else if (api == API_cuMemPoolCreate && e->args[1]) {
        if (bpf_probe_read_user(&e->extra[0], 4, (void *)(e->args[1] + 12)) == 0) e->flags |= VH_EXTRA;
    }
    bpf_ringbuf_submit(e, 0);
    return 0;
}

/* GPL-2.0 (one of this file's two licences): the kernel lets only GPL-compatible programs read user memory. */
char LICENSE[] SEC("license") = "GPL";
