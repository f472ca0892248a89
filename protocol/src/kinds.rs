//! What each event kind keeps in the record's four payload words, in one place.
//!
//! The wire format predates this module and reuses words: a pool allocation keeps its
//! stream in `aux` and its pool in `stream`, a process start keeps its parent's pid in
//! `addr`, a device sample its free bytes in `addr`. The constructors and accessors below
//! are the only code that knows which word is which; everything else writes and reads
//! events through them.
//!
//! | kind | `addr` | `size` | `aux` | `stream` |
//! |---|---|---|---|---|
//! | `alloc` | address (array handle) | bytes (requested, when failed) | pitch, managed flags, mip levels, or stream (pool allocations) | stream, or pool (pool allocations) |
//! | `free` | address | 0 | 0 | stream |
//! | `vmm_create` | 0 | bytes | handle | 0 |
//! | `vmm_release` | 0 | 0 | handle | 0 |
//! | `vmm_reserve` | address | bytes | requested address | alignment |
//! | `vmm_address_free`, `vmm_unmap` | address | bytes | 0 | 0 |
//! | `vmm_map` | address | bytes | handle | offset in the handle |
//! | `pool_create`, `pool_destroy` | 0 | 0 | 0 | pool |
//! | `pool_trim` | 0 | bytes to keep | 0 | pool |
//! | `mem_info` | device free bytes | device total bytes | 0 | 0 |
//! | `pool_sample` | reserved bytes | used bytes | 1: the device's current pool, 0: an explicit one | pool |
//! | `stream_create` | priority (as `i64`) | 0 | flags | stream |
//! | `stream_destroy` | 0 | 0 | 0 | stream |
//! | `process_start` | parent pid | 0 | process start time | 0 |
//! | `process_exit` | 0 | 0 | 0 | 0 |
//! | `dropped` | 0 | events lost | of which lost in flight (slots taken, never published) | 0 |
//! | `hook_miss` | symbol name, 32 bytes over all four words; version in `device`, flags in `caller` | | | |
//! | `frameworks` | `FrameworkId` bit mask | 0 | 0 | 0 |
//! | `framework_sample` | reserved bytes | allocated bytes | largest free block (`u64::MAX`: unknown) | segments |
//! | `framework_oom` | requested bytes | reserved bytes | allocated bytes | largest free block (`u64::MAX`: unknown) |
//! | `framework_segment` | segment address | segment bytes | allocated bytes in it | its largest free block |
//! | `framework_stats` | stranded bytes (free in split blocks; `u64::MAX`: unknown) | the framework's limit (`u64::MAX`: none known) | its largest allocation (0 or `u64::MAX`: unknown) | 0 |
//! | `gpu_process` | holder pid | its bytes (NVML, context included) | command name, bytes 0..8 | command name, bytes 8..16 |
//!
//! The three lens kinds keep the framework (`FrameworkId`) in `caller`, except
//! `framework_segment`, which keeps there its number of free pieces (saturated to 255): a
//! segment always follows its `framework_oom`.

use crate::record::{Api, Caller, Event, EventKind, FrameworkId};

/// A lens's "not known" for a byte count it could not measure.
pub const UNKNOWN_BYTES: u64 = u64::MAX;

/// One constructor per row: `name(args) => kind, api, [addr, size, aux, stream];`.
macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) => $kind:expr, $api:expr, [$addr:expr, $size:expr, $aux:expr, $stream:expr];)*) => {
        $(
            $(#[$doc])*
            #[inline(always)]
            pub const fn $name($($arg: $ty),*) -> Event {
                Event::words($kind, $api, $addr, $size, $aux, $stream)
            }
        )*
    };
}

/// Builder-style setters of one common field each (`ev.at(ts)`).
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($field:ident: $ty:ty);)*) => {
        $(
            $(#[$doc])*
            #[inline(always)]
            pub const fn $name(mut self, $field: $ty) -> Event {
                self.$field = $field;
                self
            }
        )*
    };
}

impl Event {
    /// A record of `kind` from `api` with its four payload words in wire order (`addr`,
    /// `size`, `aux`, `stream`: the table above): device unknown (-1), the rest zero. Only
    /// the constructors below call it, each in the order of its own row.
    #[inline(always)]
    const fn words(kind: EventKind, api: Api, addr: u64, size: u64, aux: u64, stream: u64) -> Event {
        Event {
            seq: 0,
            ts_ns: 0,
            addr,
            size,
            aux,
            stream,
            pid: 0,
            tid: 0,
            result: 0,
            device: -1,
            kind: kind as u8,
            caller: 0,
            api: api as u16,
        }
    }

    // ---- the fields every kind has ------------------------------------------------------

    /// The process and thread that made the call.
    #[inline(always)]
    pub const fn by(mut self, pid: u32, tid: u32) -> Event {
        self.pid = pid;
        self.tid = tid;
        self
    }

    setters! {
        /// When it happened (ns, the capture's clock).
        at(ts_ns: u64);
        /// Its position in its process's stream.
        with_seq(seq: u64);
        /// The device ordinal (-1: unknown, the default).
        on_device(device: i16);
        /// The CUresult the call returned (0, the default, is success).
        with_result(result: u32);
    }

    /// The runtime call that led to this driver call.
    #[inline(always)]
    pub const fn with_caller(mut self, caller: Caller) -> Event {
        self.caller = caller as u8;
        self
    }

    // ---- constructors, one per kind (and per allocation shape): each is one row of the
    // table above, its arguments named for what they are.

    constructors! {
        /// An allocation with no second word: `cuMemAlloc_v2`, arrays, IPC opens, imports.
        /// A failed one has `addr` 0 and the requested `size`.
        alloc(api: Api, addr: u64, size: u64) => EventKind::Alloc, api, [addr, size, 0, 0];
        /// `cuMemAllocPitch_v2`: `size` is pitch × height.
        alloc_pitch(addr: u64, size: u64, pitch: u64) => EventKind::Alloc, Api::cuMemAllocPitch_v2, [addr, size, pitch, 0];
        /// `cuMemAllocManaged` with its flags.
        alloc_managed(addr: u64, size: u64, flags: u64) => EventKind::Alloc, Api::cuMemAllocManaged, [addr, size, flags, 0];
        /// `cuMipmappedArrayCreate`: all levels' bytes, and the level count.
        mipmapped_array(handle: u64, size: u64, levels: u64) => EventKind::Alloc, Api::cuMipmappedArrayCreate, [handle, size, levels, 0];
        /// A stream-ordered allocation from the device's current pool (`cuMemAllocAsync*`).
        alloc_async(api: Api, addr: u64, size: u64, stream: u64) => EventKind::Alloc, api, [addr, size, 0, stream];
        /// A stream-ordered allocation from an explicit pool (`cuMemAllocFromPoolAsync*`).
        pool_alloc(api: Api, addr: u64, size: u64, pool: u64, stream: u64) => EventKind::Alloc, api, [addr, size, stream, pool];
        /// A free of anything an allocation handed out (`cuMemFree_v2`, arrays, IPC closes).
        free(api: Api, addr: u64) => EventKind::Free, api, [addr, 0, 0, 0];
        /// A stream-ordered free (`cuMemFreeAsync*`).
        free_async(api: Api, addr: u64, stream: u64) => EventKind::Free, api, [addr, 0, 0, stream];
        /// A VMM physical handle made (`cuMemCreate`) or imported (size 0: unknown).
        vmm_create(api: Api, handle: u64, size: u64) => EventKind::VmmCreate, api, [0, size, handle, 0];
        /// `cuMemRelease`.
        vmm_release(handle: u64) => EventKind::VmmRelease, Api::cuMemRelease, [0, 0, handle, 0];
        /// `cuMemAddressReserve`: the range handed out, and the address and alignment asked for.
        vmm_reserve(addr: u64, size: u64, requested_addr: u64, alignment: u64) => EventKind::VmmReserve, Api::cuMemAddressReserve, [addr, size, requested_addr, alignment];
        /// `cuMemAddressFree`.
        vmm_address_free(addr: u64, size: u64) => EventKind::VmmAddressFree, Api::cuMemAddressFree, [addr, size, 0, 0];
        /// `cuMemMap`: `size` bytes of `handle`, from `offset` in it, at `addr`.
        vmm_map(addr: u64, size: u64, handle: u64, offset: u64) => EventKind::VmmMap, Api::cuMemMap, [addr, size, handle, offset];
        /// `cuMemUnmap`.
        vmm_unmap(addr: u64, size: u64) => EventKind::VmmUnmap, Api::cuMemUnmap, [addr, size, 0, 0];
        /// `cuMemPoolCreate` (the new pool's handle; 0 when the call failed).
        pool_create(pool: u64) => EventKind::PoolCreate, Api::cuMemPoolCreate, [0, 0, 0, pool];
        /// `cuMemPoolDestroy`.
        pool_destroy(pool: u64) => EventKind::PoolDestroy, Api::cuMemPoolDestroy, [0, 0, 0, pool];
        /// `cuMemPoolTrimTo`: the pool keeps at least `keep_bytes` reserved.
        pool_trim(pool: u64, keep_bytes: u64) => EventKind::PoolTrim, Api::cuMemPoolTrimTo, [0, keep_bytes, 0, pool];
        /// The driver's numbers for one stream-ordered pool (`cuMemPoolGetAttribute`:
        /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` and `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`);
        /// `current` when it is its device's current pool (the one `cuMemAllocAsync` uses).
        pool_sample(pool: u64, reserved: u64, used: u64, current: bool) => EventKind::PoolSample, Api::cuMemPoolGetAttribute, [reserved, used, current as u64, pool];
        /// A stream made (`cuStreamCreate`, `cuStreamCreateWithPriority`; 0 when the call failed).
        stream_create(api: Api, stream: u64, flags: u64, priority: i32) => EventKind::StreamCreate, api, [priority as i64 as u64, 0, flags, stream];
        /// A stream destroyed (`cuStreamDestroy`, `cuStreamDestroy_v2`).
        stream_destroy(api: Api, stream: u64) => EventKind::StreamDestroy, api, [0, 0, 0, stream];
        /// A device sample (`cuMemGetInfo_v2`).
        mem_info(free_bytes: u64, total_bytes: u64) => EventKind::MemInfo, Api::cuMemGetInfo_v2, [free_bytes, total_bytes, 0, 0];
        /// The interposer's first record in a process.
        process_start(ppid: u32, start_time: u64) => EventKind::ProcessStart, Api::Interposer, [ppid as u64, 0, start_time, 0];
        /// The interposer's last record in a process (its library destructor ran).
        process_exit() => EventKind::ProcessExit, Api::Interposer, [0, 0, 0, 0];
        /// `count` events lost, `lost_in_flight` of them slots a writer reserved but never published.
        dropped(count: u64, lost_in_flight: u64) => EventKind::Dropped, Api::Interposer, [0, count, lost_in_flight, 0];
        /// The frameworks the process has loaded (a mask of `FrameworkId::bit`s).
        frameworks(mask: u64) => EventKind::Frameworks, Api::Interposer, [mask, 0, 0, 0];
    }

    /// A lens's sample of `framework`'s cache on one device: reserved and allocated bytes,
    /// the largest free block ([`UNKNOWN_BYTES`] when not measured) and the segment count.
    pub const fn framework_sample(
        framework: FrameworkId,
        reserved: u64,
        allocated: u64,
        largest_free_block: u64,
        segments: u64,
    ) -> Event {
        Event::words(EventKind::FrameworkSample, Api::Lens, reserved, allocated, largest_free_block, segments)
            .with_framework(framework)
    }

    /// A lens at `framework`'s out-of-memory: the framework's own request, and its cache then.
    pub const fn framework_oom(
        framework: FrameworkId,
        requested: u64,
        reserved: u64,
        allocated: u64,
        largest_free_block: u64,
    ) -> Event {
        Event::words(EventKind::FrameworkOom, Api::Lens, requested, reserved, allocated, largest_free_block)
            .with_framework(framework)
    }

    /// One cache segment as a lens saw it at an OOM: its bytes, the allocated bytes in it,
    /// its largest free block and its number of free pieces.
    pub const fn framework_segment(
        base: u64,
        size: u64,
        allocated: u64,
        largest_free_block: u64,
        free_pieces: u64,
    ) -> Event {
        let mut e = Event::words(EventKind::FrameworkSegment, Api::Lens, base, size, allocated, largest_free_block);
        e.caller = if free_pieces > 255 { 255 } else { free_pieces as u8 };
        e
    }

    /// What a lens knows of `framework`'s cache beyond its totals: the free bytes inside
    /// split blocks (stranded), the framework's own limit for the process, and the largest
    /// allocation it serves (PyTorch: the largest active block of its latest snapshot; JAX:
    /// `largest_alloc_size`), each [`UNKNOWN_BYTES`] when not known (older lenses wrote 0
    /// for the last, read as unknown too).
    pub const fn framework_stats(framework: FrameworkId, stranded: u64, limit: u64, largest_allocation: u64) -> Event {
        Event::words(EventKind::FrameworkStats, Api::Lens, stranded, limit, largest_allocation, 0)
            .with_framework(framework)
    }

    /// NVML's usage of process `holder` on one device (`bytes`, context included), entry
    /// `index` of `count` of sample `sample`; `name` is its command (cut to 16 bytes).
    pub fn gpu_process(sample: u64, count: u32, holder: u32, bytes: u64, name: &[u8]) -> Event {
        let mut packed = [0u8; 16];
        let n = name.len().min(16);
        packed[..n].copy_from_slice(&name[..n]);
        let (lo, hi) = packed.split_at(8);
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            u64::from_le_bytes(w)
        };
        let mut e = Event::words(EventKind::GpuProcess, Api::Interposer, holder as u64, bytes, word(lo), word(hi));
        e.seq = sample;
        e.tid = count;
        e
    }

    const fn with_framework(mut self, framework: FrameworkId) -> Event {
        self.caller = framework as u8;
        self
    }

    /// An entry point the driver handed out that no wrapper matched: its name (cut to 32
    /// bytes), the version asked for (clamped to i16) and the flags (saturated to u8).
    pub fn hook_miss(name: &[u8], version: i32, flags: u64) -> Event {
        let mut packed = [0u8; 32];
        let n = name.len().min(32);
        packed[..n].copy_from_slice(&name[..n]);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&packed[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let mut e = Event::words(EventKind::HookMiss, Api::Interposer, word(0), word(1), word(2), word(3));
        e.device = version.clamp(i16::MIN as i32, i16::MAX as i32) as i16;
        e.caller = flags.min(255) as u8;
        e
    }

    // ---- accessors for the words whose meaning depends on the kind ----------------------

    /// True for `cuMemAllocFromPoolAsync*`, whose words differ from every other allocation.
    #[inline(always)]
    fn is_explicit_pool_api(&self) -> bool {
        self.api == Api::cuMemAllocFromPoolAsync as u16 || self.api == Api::cuMemAllocFromPoolAsync_ptsz as u16
    }

    /// The explicit pool: of a pool allocation, or of a pool create/destroy/trim. 0 for
    /// anything else (an `alloc_async` comes from the device's current pool).
    #[inline(always)]
    pub fn pool(&self) -> u64 {
        // Raw code compares, not `EventKind::from_code`: this runs for every allocation the
        // model applies, and the full decode cost about 25 instructions there.
        let k = self.kind;
        let pooled = if k == EventKind::Alloc as u8 {
            self.is_explicit_pool_api()
        } else {
            k == EventKind::PoolCreate as u8
                || k == EventKind::PoolDestroy as u8
                || k == EventKind::PoolTrim as u8
                || k == EventKind::PoolSample as u8
        };
        if pooled {
            self.stream
        } else {
            0
        }
    }

    /// The CUDA stream of a stream-ordered allocation or free (0: none, or the legacy stream).
    #[inline]
    pub fn cuda_stream(&self) -> u64 {
        let k = self.kind;
        if k == EventKind::Alloc as u8 && self.is_explicit_pool_api() {
            self.aux
        } else if k == EventKind::Alloc as u8
            || k == EventKind::Free as u8
            || k == EventKind::StreamCreate as u8
            || k == EventKind::StreamDestroy as u8
        {
            self.stream
        } else {
            0
        }
    }

    /// The row pitch of a `cuMemAllocPitch_v2`.
    #[inline]
    pub fn pitch(&self) -> Option<u64> {
        (self.api == Api::cuMemAllocPitch_v2 as u16).then_some(self.aux)
    }

    /// The flags of a `cuMemAllocManaged`.
    #[inline]
    pub fn managed_flags(&self) -> Option<u64> {
        (self.api == Api::cuMemAllocManaged as u16).then_some(self.aux)
    }

    /// The level count of a `cuMipmappedArrayCreate`.
    #[inline]
    pub fn mip_levels(&self) -> Option<u64> {
        (self.api == Api::cuMipmappedArrayCreate as u16).then_some(self.aux)
    }

    /// The VMM physical handle of a create, release or map.
    #[inline(always)]
    pub fn handle(&self) -> u64 {
        self.aux
    }

    /// Where in its handle a `vmm_map` starts.
    #[inline(always)]
    pub fn map_offset(&self) -> u64 {
        self.stream
    }

    /// The address a `vmm_reserve` asked for (0: anywhere).
    #[inline]
    pub fn requested_addr(&self) -> u64 {
        self.aux
    }

    /// The alignment a `vmm_reserve` asked for.
    #[inline]
    pub fn alignment(&self) -> u64 {
        self.stream
    }

    /// The bytes a `pool_trim` keeps.
    #[inline(always)]
    pub fn keep_bytes(&self) -> u64 {
        self.size
    }

    /// The device's free bytes in a `mem_info` sample.
    #[inline(always)]
    pub fn free_bytes(&self) -> u64 {
        self.addr
    }

    /// The device's total bytes in a `mem_info` sample.
    #[inline(always)]
    pub fn total_bytes(&self) -> u64 {
        self.size
    }

    /// The pool's reserved bytes in a `pool_sample` (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    #[inline]
    pub fn pool_reserved(&self) -> u64 {
        self.addr
    }

    /// The pool's used bytes in a `pool_sample` (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    #[inline]
    pub fn pool_used(&self) -> u64 {
        self.size
    }

    /// A `pool_sample` of its device's current pool (the one `cuMemAllocAsync` uses).
    #[inline]
    pub fn pool_is_current(&self) -> bool {
        self.aux != 0
    }

    /// The priority a `stream_create` asked for (0: the default).
    #[inline]
    pub fn stream_priority(&self) -> i32 {
        self.addr as i64 as i32
    }

    /// The flags of a `stream_create`.
    #[inline]
    pub fn stream_flags(&self) -> u64 {
        self.aux
    }

    /// The parent's pid in a `process_start`.
    #[inline(always)]
    pub fn ppid(&self) -> u32 {
        self.addr as u32
    }

    /// The process start time (`/proc/<pid>/stat` field 22) in a `process_start`.
    #[inline(always)]
    pub fn start_time(&self) -> u64 {
        self.aux
    }

    /// The events a `dropped` marker counts.
    #[inline(always)]
    pub fn dropped_count(&self) -> u64 {
        self.size
    }

    /// Of [`Event::dropped_count`], the slots reserved but never published.
    #[inline(always)]
    pub fn lost_in_flight(&self) -> u64 {
        self.aux
    }

    /// The `FrameworkId` mask of a `frameworks` record.
    #[inline]
    pub fn framework_mask(&self) -> u64 {
        self.addr
    }

    /// The framework a `framework_sample` or `framework_oom` speaks for.
    #[inline]
    pub fn framework(&self) -> FrameworkId {
        FrameworkId::from_code(self.caller).unwrap_or(FrameworkId::Unknown)
    }

    /// Reserved bytes of a `framework_sample` or `framework_oom`.
    #[inline]
    pub fn framework_reserved(&self) -> u64 {
        self.word_if(EventKind::FrameworkOom, self.size, self.addr)
    }

    /// Allocated bytes of a `framework_sample`, `framework_oom` or `framework_segment`.
    #[inline]
    pub fn framework_allocated(&self) -> u64 {
        self.word_if(EventKind::FrameworkSample, self.size, self.aux)
    }

    /// The largest free block of a lens record (`None`: not measured).
    #[inline]
    pub fn largest_free_block(&self) -> Option<u64> {
        let v = self.word_if(EventKind::FrameworkSample, self.aux, self.stream);
        (v != UNKNOWN_BYTES).then_some(v)
    }

    /// `then` for a record of `kind`, `otherwise` for the others (the lens kinds keep a
    /// number in different words).
    #[inline]
    fn word_if(&self, kind: EventKind, then: u64, otherwise: u64) -> u64 {
        if self.kind == kind as u8 {
            then
        } else {
            otherwise
        }
    }

    /// The segment count of a `framework_sample`.
    #[inline]
    pub fn framework_segments(&self) -> u64 {
        self.stream
    }

    /// The framework's own request in a `framework_oom`.
    #[inline]
    pub fn framework_request(&self) -> u64 {
        self.addr
    }

    /// The stranded bytes of a `framework_stats` (`None`: not measured).
    #[inline]
    pub fn framework_stranded(&self) -> Option<u64> {
        (self.addr != UNKNOWN_BYTES).then_some(self.addr)
    }

    /// The framework's own limit in a `framework_stats` (`None`: none known).
    #[inline]
    pub fn framework_limit(&self) -> Option<u64> {
        (self.size != UNKNOWN_BYTES && self.size != 0).then_some(self.size)
    }

    /// The largest allocation in a `framework_stats` (`None`: not known).
    #[inline]
    pub fn framework_largest_allocation(&self) -> Option<u64> {
        (self.aux != UNKNOWN_BYTES && self.aux != 0).then_some(self.aux)
    }

    /// The holder's pid in a `gpu_process` (0: the sample found no process on the device).
    #[inline]
    pub fn gpu_holder(&self) -> u32 {
        self.addr.min(u64::from(u32::MAX)) as u32
    }

    /// The holder's command name in a `gpu_process` (up to 16 bytes, lossy UTF-8).
    pub fn gpu_holder_name(&self) -> String {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.aux.to_le_bytes());
        b[8..].copy_from_slice(&self.stream.to_le_bytes());
        let n = b.iter().position(|c| *c == 0).unwrap_or(16);
        String::from_utf8_lossy(&b[..n]).into_owned()
    }

    /// The free pieces of a `framework_segment` (saturated to 255).
    #[inline]
    pub fn free_pieces(&self) -> u64 {
        u64::from(self.caller)
    }

    /// The version a `hook_miss` entry point was asked for.
    #[inline]
    pub fn hook_miss_version(&self) -> i16 {
        self.device
    }

    /// The `cuGetProcAddress` flags of a `hook_miss` (saturated to 255).
    #[inline]
    pub fn hook_miss_flags(&self) -> u8 {
        self.caller
    }
}

#[cfg(test)]
mod tests {
    use crate::record::{Api, Caller, Event, EventKind, FrameworkId, RawRecord};
    use zerocopy::{FromBytes, IntoBytes};

    /// Through the wire and back: the bytes a reader sees are the ones written.
    fn wire(e: Event) -> Event {
        let raw = e.to_raw();
        let back = RawRecord::read_from_bytes(raw.as_bytes()).expect("64 bytes");
        Event::from_raw(&back)
    }

    #[test]
    fn every_kind_round_trips_through_its_constructor_and_accessors() {
        let common = |e: Event| e.by(11, 12).at(13).with_seq(14).on_device(3);
        let mut kinds_seen = Vec::new();
        let mut check = |e: Event, assert: &dyn Fn(&Event)| {
            let back = wire(common(e));
            assert_eq!((back.pid, back.tid, back.ts_ns, back.seq), (11, 12, 13, 14), "{back:?}");
            assert(&back);
            kinds_seen.push(back.kind().expect("known kind"));
        };

        check(Event::alloc(Api::cuMemAlloc_v2, 0x1000, 4096), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.addr, e.size, e.device),
                (Some(EventKind::Alloc), Some(Api::cuMemAlloc_v2), 0x1000, 4096, 3)
            );
            assert_eq!((e.pool(), e.cuda_stream(), e.pitch(), e.managed_flags()), (0, 0, None, None));
        });
        check(Event::alloc_pitch(0x2000, 96, 32), &|e| {
            assert_eq!((e.api(), e.addr, e.size, e.pitch()), (Some(Api::cuMemAllocPitch_v2), 0x2000, 96, Some(32)));
        });
        check(Event::alloc_managed(0x3000, 10, 1), &|e| {
            assert_eq!((e.api(), e.managed_flags(), e.pitch()), (Some(Api::cuMemAllocManaged), Some(1), None));
        });
        check(Event::mipmapped_array(0x4000, 700, 5), &|e| {
            assert_eq!(
                (e.api(), e.addr, e.size, e.mip_levels()),
                (Some(Api::cuMipmappedArrayCreate), 0x4000, 700, Some(5))
            );
        });
        check(Event::alloc_async(Api::cuMemAllocAsync_ptsz, 0x5000, 64, 77), &|e| {
            assert_eq!((e.api(), e.addr, e.size), (Some(Api::cuMemAllocAsync_ptsz), 0x5000, 64));
            assert_eq!((e.cuda_stream(), e.pool()), (77, 0));
        });
        check(Event::pool_alloc(Api::cuMemAllocFromPoolAsync, 0x6000, 65, 88, 77), &|e| {
            assert_eq!((e.api(), e.addr, e.size), (Some(Api::cuMemAllocFromPoolAsync), 0x6000, 65));
            assert_eq!((e.pool(), e.cuda_stream()), (88, 77));
        });
        check(Event::free(Api::cuMemFree_v2, 0x1000), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.addr, e.cuda_stream()),
                (Some(EventKind::Free), Some(Api::cuMemFree_v2), 0x1000, 0)
            );
        });
        check(Event::free_async(Api::cuMemFreeAsync, 0x5000, 77), &|e| {
            assert_eq!((e.api(), e.addr, e.cuda_stream(), e.pool()), (Some(Api::cuMemFreeAsync), 0x5000, 77, 0));
        });
        check(Event::vmm_create(Api::cuMemCreate, 42, 1 << 21), &|e| {
            assert_eq!((e.kind(), e.handle(), e.size), (Some(EventKind::VmmCreate), 42, 1 << 21));
        });
        check(Event::vmm_release(42), &|e| {
            assert_eq!((e.kind(), e.api(), e.handle()), (Some(EventKind::VmmRelease), Some(Api::cuMemRelease), 42));
        });
        check(Event::vmm_reserve(0x7000, 1 << 30, 0x8000, 1 << 21), &|e| {
            assert_eq!((e.kind(), e.addr, e.size), (Some(EventKind::VmmReserve), 0x7000, 1 << 30));
            assert_eq!((e.requested_addr(), e.alignment()), (0x8000, 1 << 21));
        });
        check(Event::vmm_address_free(0x7000, 1 << 30), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.addr, e.size),
                (Some(EventKind::VmmAddressFree), Some(Api::cuMemAddressFree), 0x7000, 1 << 30)
            );
        });
        check(Event::vmm_map(0x7000, 1 << 21, 42, 4096), &|e| {
            assert_eq!(
                (e.kind(), e.addr, e.size, e.handle(), e.map_offset()),
                (Some(EventKind::VmmMap), 0x7000, 1 << 21, 42, 4096)
            );
        });
        check(Event::vmm_unmap(0x7000, 1 << 21), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.addr, e.size),
                (Some(EventKind::VmmUnmap), Some(Api::cuMemUnmap), 0x7000, 1 << 21)
            );
        });
        check(Event::stream_create(Api::cuStreamCreateWithPriority, 77, 1, -3), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.cuda_stream(), e.stream_flags(), e.stream_priority()),
                (Some(EventKind::StreamCreate), Some(Api::cuStreamCreateWithPriority), 77, 1, -3)
            )
        });
        check(Event::stream_destroy(Api::cuStreamDestroy_v2, 77), &|e| {
            assert_eq!((e.kind(), e.cuda_stream(), e.pool()), (Some(EventKind::StreamDestroy), 77, 0))
        });
        check(Event::pool_create(88), &|e| assert_eq!((e.kind(), e.pool()), (Some(EventKind::PoolCreate), 88)));
        check(Event::pool_destroy(88), &|e| assert_eq!((e.kind(), e.pool()), (Some(EventKind::PoolDestroy), 88)));
        check(Event::pool_trim(88, 1 << 20), &|e| {
            assert_eq!((e.kind(), e.pool(), e.keep_bytes()), (Some(EventKind::PoolTrim), 88, 1 << 20));
        });
        check(Event::pool_sample(88, 96 << 20, 40 << 20, false), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.pool(), e.pool_reserved(), e.pool_used(), e.pool_is_current()),
                (Some(EventKind::PoolSample), Some(Api::cuMemPoolGetAttribute), 88, 96 << 20, 40 << 20, false)
            );
        });
        check(Event::pool_sample(99, 1, 0, true), &|e| assert!(e.pool_is_current() && e.pool() == 99));
        check(Event::mem_info(5 << 30, 16 << 30), &|e| {
            assert_eq!((e.kind(), e.free_bytes(), e.total_bytes()), (Some(EventKind::MemInfo), 5 << 30, 16 << 30));
        });
        check(Event::process_start(1, 123_456), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.ppid(), e.start_time()),
                (Some(EventKind::ProcessStart), Some(Api::Interposer), 1, 123_456)
            );
        });
        check(Event::process_exit(), &|e| {
            assert_eq!((e.kind(), e.api()), (Some(EventKind::ProcessExit), Some(Api::Interposer)))
        });
        check(Event::dropped(9, 4), &|e| {
            assert_eq!((e.kind(), e.dropped_count(), e.lost_in_flight()), (Some(EventKind::Dropped), 9, 4));
        });
        check(Event::frameworks(FrameworkId::PyTorch.bit() | FrameworkId::Ggml.bit()), &|e| {
            assert_eq!(e.kind(), Some(EventKind::Frameworks));
            let got: Vec<FrameworkId> = FrameworkId::in_mask(e.framework_mask()).collect();
            assert_eq!(got, vec![FrameworkId::PyTorch, FrameworkId::Ggml]);
        });
        check(Event::framework_sample(FrameworkId::PyTorch, 100, 60, 30, 4), &|e| {
            assert_eq!(
                (e.kind(), e.api(), e.framework()),
                (Some(EventKind::FrameworkSample), Some(Api::Lens), FrameworkId::PyTorch)
            );
            assert_eq!(
                (e.framework_reserved(), e.framework_allocated(), e.largest_free_block(), e.framework_segments()),
                (100, 60, Some(30), 4)
            );
        });
        check(Event::framework_sample(FrameworkId::CuPy, 1, 1, crate::kinds::UNKNOWN_BYTES, 0), &|e| {
            assert_eq!((e.framework(), e.largest_free_block()), (FrameworkId::CuPy, None));
        });
        check(Event::framework_oom(FrameworkId::PyTorch, 2 << 30, 100 << 30, 60 << 30, 400 << 20), &|e| {
            assert_eq!(
                (e.kind(), e.framework(), e.framework_request()),
                (Some(EventKind::FrameworkOom), FrameworkId::PyTorch, 2 << 30)
            );
            assert_eq!(
                (e.framework_reserved(), e.framework_allocated(), e.largest_free_block()),
                (100 << 30, 60 << 30, Some(400 << 20))
            );
            assert!(!e.failed(), "a lens record is not a failed call");
        });
        check(Event::framework_segment(0x9000, 1 << 30, 600 << 20, 424 << 20, 300), &|e| {
            assert_eq!((e.kind(), e.addr, e.size), (Some(EventKind::FrameworkSegment), 0x9000, 1 << 30));
            assert_eq!(
                (e.framework_allocated(), e.largest_free_block(), e.free_pieces()),
                (600 << 20, Some(424 << 20), 255)
            );
        });
        check(Event::framework_stats(FrameworkId::PyTorch, 50 << 30, 4_499_000_000, 2 << 30), &|e| {
            assert_eq!((e.kind(), e.framework()), (Some(EventKind::FrameworkStats), FrameworkId::PyTorch));
            assert_eq!((e.framework_stranded(), e.framework_limit()), (Some(50 << 30), Some(4_499_000_000)));
            assert_eq!(e.framework_largest_allocation(), Some(2 << 30));
        });
        let unknown = crate::kinds::UNKNOWN_BYTES;
        for largest in [unknown, 0] {
            check(Event::framework_stats(FrameworkId::Jax, unknown, unknown, largest), &|e| {
                assert_eq!((e.framework_stranded(), e.framework_limit()), (None, None));
                assert_eq!(e.framework_largest_allocation(), None);
            });
        }
        // An NVML sample entry is a reader's record (no process's): seq and tid carry the
        // sample's number and size, so it is checked apart from `common`.
        let nvml = wire(Event::gpu_process(7, 2, 4242, 100 << 30, b"llama-server-with-a-long-name"));
        assert_eq!((nvml.kind(), nvml.gpu_holder(), nvml.size), (Some(EventKind::GpuProcess), 4242, 100 << 30));
        assert_eq!((nvml.seq, nvml.tid, nvml.gpu_holder_name().as_str()), (7, 2, "llama-server-wit"));
        kinds_seen.push(EventKind::GpuProcess);
        // A hook miss keeps its own version in `device`: `common`'s device is overwritten here.
        let miss = wire(Event::hook_miss(b"cuMemAllocFromPoolAsync_ptsz_and_more", 12_000, 300).by(11, 12));
        assert_eq!(miss.kind(), Some(EventKind::HookMiss));
        assert_eq!(miss.hook_miss_symbol(), "cuMemAllocFromPoolAsync_ptsz_and");
        assert_eq!((miss.hook_miss_version(), miss.hook_miss_flags()), (12_000, 255));
        assert_eq!(wire(Event::hook_miss(b"cuIpcOpenMemHandle", 99_999, 2)).hook_miss_version(), i16::MAX);
        kinds_seen.push(EventKind::HookMiss);

        let mut all: Vec<EventKind> = EventKind::ALL.to_vec();
        kinds_seen.sort();
        kinds_seen.dedup();
        all.sort();
        assert_eq!(kinds_seen, all, "every kind has a constructor checked here");
    }

    #[test]
    fn the_common_fields_default_to_unknown_and_success() {
        let e = Event::free(Api::cuMemFree_v2, 1);
        assert_eq!((e.device, e.result, e.caller, e.pid, e.ts_ns), (-1, 0, 0, 0, 0));
        let e = e.with_result(2).with_caller(Caller::cudaFree);
        assert!(e.is_oom() && e.failed());
        assert_eq!(e.caller(), Some(Caller::cudaFree));
    }

    /// The layout the interposer wrote before these constructors existed, word for word.
    #[test]
    fn constructors_keep_the_wire_layout() {
        let pool_alloc = Event::pool_alloc(Api::cuMemAllocFromPoolAsync_ptsz, 1, 2, 3, 4);
        assert_eq!((pool_alloc.addr, pool_alloc.size, pool_alloc.aux, pool_alloc.stream), (1, 2, 4, 3));
        let start = Event::process_start(5, 6);
        assert_eq!((start.addr, start.aux), (5, 6));
        let sample = Event::pool_sample(1, 2, 3, true);
        assert_eq!((sample.addr, sample.size, sample.aux, sample.stream), (2, 3, 1, 1));
        let info = Event::mem_info(7, 8);
        assert_eq!((info.addr, info.size), (7, 8));
        let reserve = Event::vmm_reserve(1, 2, 3, 4);
        assert_eq!((reserve.addr, reserve.size, reserve.aux, reserve.stream), (1, 2, 3, 4));
        let map = Event::vmm_map(1, 2, 3, 4);
        assert_eq!((map.addr, map.size, map.aux, map.stream), (1, 2, 3, 4));
    }
}
