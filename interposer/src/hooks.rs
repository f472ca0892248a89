//! The wrappers. Each is exported under the driver's exact versioned name and has that
//! function's exact ABI, so the same address serves programs linked with `-lcuda`,
//! `dlsym` answers and swapped `cuGetProcAddress` pointers.

use crate::config;
use crate::pools;
use crate::real::{self, F};
use crate::sink::{self, Hook};
use core::ffi::c_void;
use libc::c_char;
use vramhook_protocol::arrays;
use vramhook_protocol::record::{Api, Event};

type CUresult = i32;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;

/// `CUipcMemHandle`: 64 bytes passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    reserved: [u8; 64],
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: i32,
    channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: i32,
    channels: u32,
    flags: u32,
}

/// The real function `$name` of this signature, or a return of
/// `CUDA_ERROR_NOT_INITIALIZED` from the wrapper when libcuda has none.
macro_rules! real_or_not_initialized {
    ($name:ident ( $($t:ty),* )) => {{
        let p = real::real(F::$name);
        if p.is_null() {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        // SAFETY: `p` is libcuda's function of this exact name and signature.
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p)
    }};
}

/// Defines an exported wrapper: resolves the real function, passes straight through when
/// disabled or re-entered, otherwise calls it and runs `$record` (never letting a panic
/// out) with the result bound to `$r`. Events are stamped when they are recorded, after
/// the driver returned: the ring's reader takes a lane's unpublished events to be stamped
/// later than its poll began (its causal watermark), which a stamp taken on entry, a whole
/// driver call before publication, would break. A `release` wrapper (a free, an unmap, a
/// destroy: the driver may hand what it releases to another thread before this one
/// returns) is the exception: its event is stamped before the call, and the lane carries a
/// release marker through the call that tells the reader so (`Hook::begin_release`); its
/// `$record` records with `emit_release`. An `alloc` wrapper is an ordinary one, but for
/// the `bench-parts` build's `ALLOC_STAMP_BEFORE`, which times it stamped as a release.
macro_rules! hook {
    (release $name:ident ( $($arg:ident : $t:ty),* ) |$r:ident, $h:ident| $record:block) => {
        hook!(@wrap $name ($($arg: $t),*) |$r, $h| { $h.begin_release(); } $record { $h.end_release(); });
    };
    (alloc $name:ident ( $($arg:ident : $t:ty),* ) |$r:ident, $h:ident| $record:block) => {
        hook!(@wrap $name ($($arg: $t),*) |$r, $h| {
            if config::bench_skips(config::ALLOC_STAMP_BEFORE) { $h.begin_release(); }
        } $record {
            if config::bench_skips(config::ALLOC_STAMP_BEFORE) { $h.end_release(); }
        });
    };
    ($name:ident ( $($arg:ident : $t:ty),* ) |$r:ident, $h:ident| $record:block) => {
        hook!(@wrap $name ($($arg: $t),*) |$r, $h| {} $record {});
    };
    (@wrap $name:ident ( $($arg:ident : $t:ty),* ) |$r:ident, $h:ident| $before:block $record:block $after:block) => {
        #[unsafe(no_mangle)]
        /// # Safety
        /// Same contract as the CUDA driver function of this name.
        pub unsafe extern "C" fn $name($($arg: $t),*) -> CUresult {
            let real_fn = real_or_not_initialized!($name($($t),*));
            if config::disabled() {
                return real_fn($($arg),*);
            }
            let Some($h) = Hook::enter() else {
                return real_fn($($arg),*);
            };
            $before
            let $r = real_fn($($arg),*);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $record));
            $after
            $r
        }
    };
}

/// The current context's device as the driver says, -1 when there is none (a call of
/// 10 to 16 ns on an H200: asked once per thread and context, see `thread_device`).
#[cold]
#[inline(never)]
fn current_device() -> i16 {
    let p = real::real(F::cuCtxGetDevice);
    if p.is_null() {
        return -1;
    }
    let mut dev: i32 = -1;
    // SAFETY: cuCtxGetDevice(CUdevice*).
    let r = unsafe { core::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut i32) -> CUresult>(p)(&mut dev) };
    if r == 0 {
        dev as i16
    } else {
        -1
    }
}

/// The device of the calling thread's current context. The current context is the
/// thread's own and changes only through calls we wrap (`cuCtxSetCurrent`, push, pop,
/// create, and destroy or reset anywhere), so the driver is asked once and again only
/// after one of those. `check` (every `TICK_EVERY`th allocation of a thread) asks the driver
/// anyway and turns the cache off for good if it was wrong: a context switched some way we
/// do not see costs at most 255 misattributed allocations per thread.
#[inline(always)]
fn thread_device(h: &Hook, check: bool) -> i16 {
    if config::bench_skips(config::SKIP_DEVICE) {
        return -1;
    }
    if !check {
        if let Some(device) = h.cached_device() {
            return device;
        }
    }
    ask_device(h, check)
}

#[cold]
#[inline(never)]
fn ask_device(h: &Hook, check: bool) -> i16 {
    let device = current_device();
    if !h.remember_device(device, check) && config::DEBUG.load(std::sync::atomic::Ordering::Relaxed) {
        let msg = b"vramhook: the current context changed without a call we see; device cache off\n";
        // SAFETY: writing our buffer to stderr.
        unsafe { libc::write(2, msg.as_ptr() as *const c_void, msg.len()) };
    }
    device
}

/// `location.id` of a `CUmemAllocationProp` or `CUmemPoolProps` (offset 12 in both).
unsafe fn location_id(props: *const c_void) -> i16 {
    if props.is_null() {
        return -1;
    }
    core::ptr::read_unaligned((props as *const u8).add(12) as *const i32) as i16
}

#[inline(always)]
unsafe fn read_ptr(p: *const u64, ok: bool) -> u64 {
    if ok && !p.is_null() {
        *p
    } else {
        0
    }
}

/// Records the pools' reserve (`pools::sample`), then a device free/total sample
/// (`cuMemGetInfo` costs about 4 µs: only after an out-of-memory failure, and at most every
/// `VRAMHOOK_MEMINFO_MS` otherwise).
#[cold]
#[inline(never)]
fn sample_meminfo(h: &Hook, device: i16) {
    pools::sample(h, device);
    let p = real::real(F::cuMemGetInfo_v2);
    if p.is_null() {
        return;
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: cuMemGetInfo_v2(size_t*, size_t*).
    let r = unsafe {
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult>(p)(
            &mut free, &mut total,
        )
    };
    h.emit(Event::mem_info(free as u64, total as u64).on_device(device).with_result(r as u32));
}

/// After an allocating call: every OOM gets a device sample, others a periodic one.
#[inline(always)]
fn after_alloc(h: &Hook, result: CUresult, device: i16) {
    if result == CUDA_ERROR_OUT_OF_MEMORY || h.periodic_sample_due() {
        sample_meminfo(h, device);
    }
}

/// Records an allocation (made by one of `Event`'s allocation constructors) on the
/// current device, then samples the device when due.
#[inline(always)]
fn alloc_event(h: &Hook, r: CUresult, ev: Event) {
    let tick = h.alloc_tick();
    let device = thread_device(h, tick);
    let ev = ev.on_device(device).with_result(r as u32);
    if config::bench_skips(config::ALLOC_STAMP_BEFORE) {
        h.emit_release(ev);
    } else {
        h.emit(ev);
    }
    if r == CUDA_ERROR_OUT_OF_MEMORY || (tick && tick_sample_due(device)) {
        sample_meminfo(h, device);
    }
}

/// On a thread's every `TICK_EVERY`th allocation: notes its device (whose current pool the
/// samples then read) and says whether a periodic sample is due.
#[cold]
#[inline(never)]
fn tick_sample_due(device: i16) -> bool {
    pools::note_device(device);
    sink::sample_clock_due()
}

/// Records a free (its device is the allocation's, known to the model).
#[inline(always)]
fn free_event(h: &Hook, r: CUresult, ev: Event) {
    h.emit_release(ev.with_result(r as u32));
}

hook!(alloc cuMemAlloc_v2(dptr: *mut u64, size: usize) |r, h| {
    alloc_event(&h, r, Event::alloc(Api::cuMemAlloc_v2, read_ptr(dptr, r == 0), size as u64));
});

hook!(cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: u32) |r, h| {
    let _ = elem;
    let pitch_bytes = if r == 0 && !pitch.is_null() { *pitch } else { 0 };
    let size = if r == 0 { pitch_bytes * height } else { width * height };
    alloc_event(&h, r, Event::alloc_pitch(read_ptr(dptr, r == 0), size as u64, pitch_bytes as u64));
});

hook!(cuMemAllocManaged(dptr: *mut u64, size: usize, flags: u32) |r, h| {
    alloc_event(&h, r, Event::alloc_managed(read_ptr(dptr, r == 0), size as u64, u64::from(flags)));
});

hook!(release cuMemFree_v2(dptr: u64) |r, h| {
    free_event(&h, r, Event::free(Api::cuMemFree_v2, dptr));
});

hook!(alloc cuMemAllocAsync(dptr: *mut u64, size: usize, stream: *mut c_void) |r, h| {
    alloc_event(&h, r, Event::alloc_async(Api::cuMemAllocAsync, read_ptr(dptr, r == 0), size as u64, stream as u64));
});

hook!(alloc cuMemAllocAsync_ptsz(dptr: *mut u64, size: usize, stream: *mut c_void) |r, h| {
    alloc_event(&h, r, Event::alloc_async(Api::cuMemAllocAsync_ptsz, read_ptr(dptr, r == 0), size as u64, stream as u64));
});

hook!(alloc cuMemAllocFromPoolAsync(dptr: *mut u64, size: usize, pool: *mut c_void, stream: *mut c_void) |r, h| {
    alloc_event(&h, r, Event::pool_alloc(Api::cuMemAllocFromPoolAsync, read_ptr(dptr, r == 0), size as u64, pool as u64, stream as u64));
});

hook!(alloc cuMemAllocFromPoolAsync_ptsz(dptr: *mut u64, size: usize, pool: *mut c_void, stream: *mut c_void) |r, h| {
    alloc_event(&h, r, Event::pool_alloc(Api::cuMemAllocFromPoolAsync_ptsz, read_ptr(dptr, r == 0), size as u64, pool as u64, stream as u64));
});

hook!(release cuMemFreeAsync(dptr: u64, stream: *mut c_void) |r, h| {
    free_event(&h, r, Event::free_async(Api::cuMemFreeAsync, dptr, stream as u64));
});

hook!(release cuMemFreeAsync_ptsz(dptr: u64, stream: *mut c_void) |r, h| {
    free_event(&h, r, Event::free_async(Api::cuMemFreeAsync_ptsz, dptr, stream as u64));
});

hook!(cuMemPoolTrimTo(pool: *mut c_void, min_bytes_to_keep: usize) |r, h| {
    h.emit(Event::pool_trim(pool as u64, min_bytes_to_keep as u64).with_result(r as u32));
});

hook!(cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) |r, h| {
    let handle = if r == 0 && !pool.is_null() { *pool as u64 } else { 0 };
    let device = location_id(props);
    h.emit(Event::pool_create(handle).on_device(device).with_result(r as u32));
    pools::created(handle, device);
});

hook!(release cuMemPoolDestroy(pool: *mut c_void) |r, h| {
    h.emit_release(Event::pool_destroy(pool as u64).with_result(r as u32));
    if r == 0 {
        pools::destroyed(pool as u64);
    }
});

hook!(cuStreamCreate(stream: *mut *mut c_void, flags: u32) |r, h| {
    stream_created(&h, r, Api::cuStreamCreate, stream, flags, 0);
});

hook!(cuStreamCreateWithPriority(stream: *mut *mut c_void, flags: u32, priority: i32) |r, h| {
    stream_created(&h, r, Api::cuStreamCreateWithPriority, stream, flags, priority);
});

hook!(release cuStreamDestroy(stream: *mut c_void) |r, h| {
    h.emit_release(Event::stream_destroy(Api::cuStreamDestroy, stream as u64).with_result(r as u32));
});

hook!(release cuStreamDestroy_v2(stream: *mut c_void) |r, h| {
    h.emit_release(Event::stream_destroy(Api::cuStreamDestroy_v2, stream as u64).with_result(r as u32));
});

/// A stream made on the current context's device: the model counts the driver's memory
/// for it, which no memory call shows.
fn stream_created(h: &Hook, r: CUresult, api: Api, stream: *mut *mut c_void, flags: u32, priority: i32) {
    // SAFETY: on success the driver wrote the new stream where `stream` points.
    let handle = unsafe { read_ptr(stream as *const u64, r == 0) };
    let device = thread_device(h, false);
    h.emit(Event::stream_create(api, handle, flags as u64, priority).on_device(device).with_result(r as u32));
}

hook!(cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) |r, h| {
    let _ = flags;
    let device = location_id(prop);
    h.emit(Event::vmm_create(Api::cuMemCreate, read_ptr(handle, r == 0), size as u64).on_device(device).with_result(r as u32));
    after_alloc(&h, r, device);
});

hook!(release cuMemRelease(handle: u64) |r, h| {
    h.emit_release(Event::vmm_release(handle).with_result(r as u32));
});

hook!(cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) |r, h| {
    let _ = flags;
    h.emit(Event::vmm_map(ptr, size as u64, handle, offset as u64).with_result(r as u32));
});

hook!(release cuMemUnmap(ptr: u64, size: usize) |r, h| {
    h.emit_release(Event::vmm_unmap(ptr, size as u64).with_result(r as u32));
});

hook!(cuMemAddressReserve(ptr: *mut u64, size: usize, alignment: usize, addr: u64, flags: u64) |r, h| {
    let _ = flags;
    h.emit(Event::vmm_reserve(read_ptr(ptr, r == 0), size as u64, addr, alignment as u64).with_result(r as u32));
});

hook!(release cuMemAddressFree(ptr: u64, size: usize) |r, h| {
    h.emit_release(Event::vmm_address_free(ptr, size as u64).with_result(r as u32));
});

/// Device bytes of an array of these extents (an estimate: see `vramhook_protocol::arrays`).
fn array_bytes(width: usize, height: usize, depth: usize, format: i32, channels: u32) -> u64 {
    arrays::array_bytes(width as u64, height as u64, depth as u64, format, channels)
}

hook!(cuArrayCreate_v2(handle: *mut *mut c_void, desc: *const ArrayDescriptor) |r, h| {
    let size = if desc.is_null() { 0 } else {
        let d = &*desc;
        array_bytes(d.width, d.height, 1, d.format, d.channels)
    };
    let addr = if r == 0 && !handle.is_null() { *handle as u64 } else { 0 };
    alloc_event(&h, r, Event::alloc(Api::cuArrayCreate_v2, addr, size));
});

hook!(cuArray3DCreate_v2(handle: *mut *mut c_void, desc: *const Array3dDescriptor) |r, h| {
    let size = if desc.is_null() { 0 } else {
        let d = &*desc;
        array_bytes(d.width, d.height, d.depth, d.format, d.channels)
    };
    let addr = if r == 0 && !handle.is_null() { *handle as u64 } else { 0 };
    alloc_event(&h, r, Event::alloc(Api::cuArray3DCreate_v2, addr, size));
});

hook!(cuMipmappedArrayCreate(handle: *mut *mut c_void, desc: *const Array3dDescriptor, levels: u32) |r, h| {
    let size = if desc.is_null() { 0 } else {
        let d = &*desc;
        arrays::mipmapped_array_bytes(d.width as u64, d.height as u64, d.depth as u64, d.format, d.channels, levels)
    };
    let addr = if r == 0 && !handle.is_null() { *handle as u64 } else { 0 };
    alloc_event(&h, r, Event::mipmapped_array(addr, size, u64::from(levels)));
});

hook!(release cuArrayDestroy(handle: *mut c_void) |r, h| {
    free_event(&h, r, Event::free(Api::cuArrayDestroy, handle as u64));
});

hook!(release cuMipmappedArrayDestroy(handle: *mut c_void) |r, h| {
    free_event(&h, r, Event::free(Api::cuMipmappedArrayDestroy, handle as u64));
});

/// Records an IPC import, sized with `cuMemGetAddressRange` (IPC opens are rare).
fn ipc_open_event(h: &Hook, api: Api, r: CUresult, dptr: *mut u64) {
    // SAFETY: the driver wrote *dptr when r == 0.
    let addr = unsafe { read_ptr(dptr, r == 0) };
    let mut size = 0usize;
    let range = real::real(F::cuMemGetAddressRange_v2);
    if r == 0 && !range.is_null() {
        let mut base = 0u64;
        // SAFETY: cuMemGetAddressRange_v2(CUdeviceptr*, size_t*, CUdeviceptr).
        let f: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> CUresult = unsafe { core::mem::transmute(range) };
        // SAFETY: valid out pointers.
        if unsafe { f(&mut base, &mut size, addr) } != 0 {
            size = 0;
        }
    }
    alloc_event(h, r, Event::alloc(api, addr, size as u64));
}

hook!(cuIpcOpenMemHandle(dptr: *mut u64, handle: IpcMemHandle, flags: u32) |r, h| {
    let _ = (handle, flags);
    ipc_open_event(&h, Api::cuIpcOpenMemHandle, r, dptr);
});

hook!(cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcMemHandle, flags: u32) |r, h| {
    let _ = (handle, flags);
    ipc_open_event(&h, Api::cuIpcOpenMemHandle_v2, r, dptr);
});

hook!(release cuIpcCloseMemHandle(dptr: u64) |r, h| {
    free_event(&h, r, Event::free(Api::cuIpcCloseMemHandle, dptr));
});

hook!(cuMemImportFromShareableHandle(handle: *mut u64, os_handle: *mut c_void, handle_type: i32) |r, h| {
    let _ = (os_handle, handle_type);
    h.emit(Event::vmm_create(Api::cuMemImportFromShareableHandle, read_ptr(handle, r == 0), 0).with_result(r as u32));
});

hook!(cuMemGetInfo_v2(free: *mut usize, total: *mut usize) |r, h| {
    // The program's own queries are free samples for us, with the pools' reserve; kept
    // rate-limited. The clock is looked at on every query (the call itself costs 4 µs), so
    // a query after a quiet `VRAMHOOK_MEMINFO_MS` always samples: a program can ask for
    // an exact reading at a point of its choosing (scripts/gpu/pools does).
    if r == 0 && !free.is_null() && !total.is_null() && sink::sample_clock_due() {
        let device = thread_device(&h, false);
        pools::sample(&h, device);
        h.emit(Event::mem_info(*free as u64, *total as u64).on_device(device).with_result(r as u32));
    }
});

/// Defines an exported wrapper of a call that changes which context is current: the
/// call goes through untouched, then the thread (`Here`) or every thread (`Everywhere`:
/// a context destroyed or reset may be current on others) forgets its cached device.
macro_rules! context_hook {
    ($name:ident ( $($arg:ident : $t:ty),* ) $scope:ident) => {
        #[unsafe(no_mangle)]
        /// # Safety
        /// Same contract as the CUDA driver function of this name.
        pub unsafe extern "C" fn $name($($arg: $t),*) -> CUresult {
            let real_fn = real_or_not_initialized!($name($($t),*));
            let r = real_fn($($arg),*);
            context_hook!(@forget $scope);
            r
        }
    };
    (@forget Here) => { sink::context_changed_on_this_thread() };
    (@forget Everywhere) => { sink::contexts_changed_everywhere() };
}

type Ctx = *mut c_void;
context_hook!(cuCtxSetCurrent(ctx: Ctx) Here);
context_hook!(cuCtxPushCurrent(ctx: Ctx) Here);
context_hook!(cuCtxPushCurrent_v2(ctx: Ctx) Here);
context_hook!(cuCtxPopCurrent(pctx: *mut Ctx) Here);
context_hook!(cuCtxPopCurrent_v2(pctx: *mut Ctx) Here);
context_hook!(cuCtxCreate(pctx: *mut Ctx, flags: u32, dev: i32) Here);
context_hook!(cuCtxCreate_v2(pctx: *mut Ctx, flags: u32, dev: i32) Here);
context_hook!(cuCtxCreate_v3(pctx: *mut Ctx, params: *mut c_void, num_params: i32, flags: u32, dev: i32) Here);
context_hook!(cuCtxCreate_v4(pctx: *mut Ctx, params: *mut c_void, flags: u32, dev: i32) Here);
context_hook!(cuCtxDestroy(ctx: Ctx) Everywhere);
context_hook!(cuCtxDestroy_v2(ctx: Ctx) Everywhere);
context_hook!(cuDevicePrimaryCtxRelease(dev: i32) Everywhere);
context_hook!(cuDevicePrimaryCtxRelease_v2(dev: i32) Everywhere);
context_hook!(cuDevicePrimaryCtxReset(dev: i32) Everywhere);
context_hook!(cuDevicePrimaryCtxReset_v2(dev: i32) Everywhere);

/// Swaps a pointer the driver handed out for our wrapper of the same function.
unsafe fn swap_entry_point(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
    if pfn.is_null() || (*pfn).is_null() {
        return;
    }
    real::resolve_from_loaded_driver();
    if let Some(f) = real::wrapped_by_real_address(*pfn) {
        *pfn = wrapper(f);
    } else if !symbol.is_null() && real::is_context_base_name(core::ffi::CStr::from_ptr(symbol).to_bytes()) {
        // Context switches through this pointer would go unseen: ask the driver per call.
        sink::turn_off_device_cache();
        if config::DEBUG.load(std::sync::atomic::Ordering::Relaxed) {
            report_miss(core::ffi::CStr::from_ptr(symbol).to_bytes(), version, flags);
        }
    } else if !symbol.is_null() && real::is_memory_base_name(core::ffi::CStr::from_ptr(symbol).to_bytes()) {
        sink::hook_miss(core::ffi::CStr::from_ptr(symbol).to_bytes(), version, flags);
        if config::DEBUG.load(std::sync::atomic::Ordering::Relaxed) {
            report_miss(core::ffi::CStr::from_ptr(symbol).to_bytes(), version, flags);
        }
    }
}

/// `vramhook: no wrapper for cuFoo@12000 flags 0` on stderr (VRAMHOOK_DEBUG only).
fn report_miss(name: &[u8], version: i32, flags: u64) {
    let mut line = [0u8; 200];
    let mut n = 0;
    let mut put = |b: &[u8]| {
        let take = b.len().min(line.len() - n);
        line[n..n + take].copy_from_slice(&b[..take]);
        n += take;
    };
    put(b"vramhook: no wrapper for ");
    put(name);
    put(b"@");
    put(version.to_string().as_bytes());
    put(b" flags ");
    put(flags.to_string().as_bytes());
    put(b"\n");
    // SAFETY: writing our buffer to stderr.
    unsafe { libc::write(2, line.as_ptr() as *const c_void, n) };
}

#[unsafe(no_mangle)]
/// # Safety
/// Same contract as the driver's `cuGetProcAddress_v2`.
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
    symbol_status: *mut i32,
) -> CUresult {
    let p = real::real(F::cuGetProcAddress_v2);
    if p.is_null() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuGetProcAddress_v2.
    let real_fn: unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult =
        core::mem::transmute(p);
    let r = real_fn(symbol, pfn, cuda_version, flags, symbol_status);
    if r == 0 && !config::disabled() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            swap_entry_point(symbol, pfn, cuda_version, flags)
        }));
    }
    r
}

#[unsafe(no_mangle)]
/// # Safety
/// Same contract as the driver's `cuGetProcAddress` (CUDA 11 form).
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
) -> CUresult {
    let p = real::real(F::cuGetProcAddress);
    if p.is_null() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuGetProcAddress.
    let real_fn: unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult = core::mem::transmute(p);
    let r = real_fn(symbol, pfn, cuda_version, flags);
    if r == 0 && !config::disabled() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            swap_entry_point(symbol, pfn, cuda_version, flags)
        }));
    }
    r
}

/// Our wrapper for a wrapped function.
pub fn wrapper(f: F) -> *mut c_void {
    (match f {
        F::cuMemAlloc_v2 => cuMemAlloc_v2 as *const () as usize,
        F::cuMemAllocPitch_v2 => cuMemAllocPitch_v2 as *const () as usize,
        F::cuMemAllocManaged => cuMemAllocManaged as *const () as usize,
        F::cuMemFree_v2 => cuMemFree_v2 as *const () as usize,
        F::cuMemAllocAsync => cuMemAllocAsync as *const () as usize,
        F::cuMemAllocAsync_ptsz => cuMemAllocAsync_ptsz as *const () as usize,
        F::cuMemAllocFromPoolAsync => cuMemAllocFromPoolAsync as *const () as usize,
        F::cuMemAllocFromPoolAsync_ptsz => cuMemAllocFromPoolAsync_ptsz as *const () as usize,
        F::cuMemFreeAsync => cuMemFreeAsync as *const () as usize,
        F::cuMemFreeAsync_ptsz => cuMemFreeAsync_ptsz as *const () as usize,
        F::cuMemPoolTrimTo => cuMemPoolTrimTo as *const () as usize,
        F::cuMemPoolCreate => cuMemPoolCreate as *const () as usize,
        F::cuMemPoolDestroy => cuMemPoolDestroy as *const () as usize,
        F::cuMemCreate => cuMemCreate as *const () as usize,
        F::cuMemRelease => cuMemRelease as *const () as usize,
        F::cuMemMap => cuMemMap as *const () as usize,
        F::cuMemUnmap => cuMemUnmap as *const () as usize,
        F::cuMemAddressReserve => cuMemAddressReserve as *const () as usize,
        F::cuMemAddressFree => cuMemAddressFree as *const () as usize,
        F::cuArrayCreate_v2 => cuArrayCreate_v2 as *const () as usize,
        F::cuArray3DCreate_v2 => cuArray3DCreate_v2 as *const () as usize,
        F::cuMipmappedArrayCreate => cuMipmappedArrayCreate as *const () as usize,
        F::cuArrayDestroy => cuArrayDestroy as *const () as usize,
        F::cuMipmappedArrayDestroy => cuMipmappedArrayDestroy as *const () as usize,
        F::cuIpcOpenMemHandle => cuIpcOpenMemHandle as *const () as usize,
        F::cuIpcOpenMemHandle_v2 => cuIpcOpenMemHandle_v2 as *const () as usize,
        F::cuIpcCloseMemHandle => cuIpcCloseMemHandle as *const () as usize,
        F::cuMemImportFromShareableHandle => cuMemImportFromShareableHandle as *const () as usize,
        F::cuMemGetInfo_v2 => cuMemGetInfo_v2 as *const () as usize,
        F::cuGetProcAddress => cuGetProcAddress as *const () as usize,
        F::cuGetProcAddress_v2 => cuGetProcAddress_v2 as *const () as usize,
        F::cuStreamCreate => cuStreamCreate as *const () as usize,
        F::cuStreamCreateWithPriority => cuStreamCreateWithPriority as *const () as usize,
        F::cuStreamDestroy => cuStreamDestroy as *const () as usize,
        F::cuStreamDestroy_v2 => cuStreamDestroy_v2 as *const () as usize,
        F::cuCtxSetCurrent => cuCtxSetCurrent as *const () as usize,
        F::cuCtxPushCurrent => cuCtxPushCurrent as *const () as usize,
        F::cuCtxPushCurrent_v2 => cuCtxPushCurrent_v2 as *const () as usize,
        F::cuCtxPopCurrent => cuCtxPopCurrent as *const () as usize,
        F::cuCtxPopCurrent_v2 => cuCtxPopCurrent_v2 as *const () as usize,
        F::cuCtxCreate => cuCtxCreate as *const () as usize,
        F::cuCtxCreate_v2 => cuCtxCreate_v2 as *const () as usize,
        F::cuCtxCreate_v3 => cuCtxCreate_v3 as *const () as usize,
        F::cuCtxCreate_v4 => cuCtxCreate_v4 as *const () as usize,
        F::cuCtxDestroy => cuCtxDestroy as *const () as usize,
        F::cuCtxDestroy_v2 => cuCtxDestroy_v2 as *const () as usize,
        F::cuDevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease as *const () as usize,
        F::cuDevicePrimaryCtxRelease_v2 => cuDevicePrimaryCtxRelease_v2 as *const () as usize,
        F::cuDevicePrimaryCtxReset => cuDevicePrimaryCtxReset as *const () as usize,
        F::cuDevicePrimaryCtxReset_v2 => cuDevicePrimaryCtxReset_v2 as *const () as usize,
        F::cuCtxGetDevice
        | F::cuMemGetAddressRange_v2
        | F::cuDeviceGetMemPool
        | F::cuDeviceGetDefaultMemPool
        | F::cuMemPoolGetAttribute => 0,
    }) as *mut c_void
}
