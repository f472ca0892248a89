//! The real driver functions, resolved lazily from libcuda.

use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

macro_rules! driver_functions {
    ($($id:ident),* $(,)?) => {
        /// Every driver function we wrap or call.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(usize)]
        #[allow(non_camel_case_types, clippy::enum_variant_names)]
        pub enum F { $($id,)* }

        pub const COUNT: usize = [$(stringify!($id)),*].len();

        /// NUL-terminated exported names, indexed by `F`.
        pub const NAMES: [&[u8]; COUNT] = [$(concat!(stringify!($id), "\0").as_bytes()),*];

        pub const ALL: [F; COUNT] = [$(F::$id),*];
    };
}

driver_functions! {
    // The hottest first: their real addresses share the table's first cache line.
    cuMemAlloc_v2,
    cuMemFree_v2,
    cuMemAllocAsync,
    cuMemFreeAsync,
    cuMemAllocAsync_ptsz,
    cuMemFreeAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemAllocPitch_v2,
    cuMemAllocManaged,
    cuMemPoolTrimTo,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuArrayCreate_v2,
    cuArray3DCreate_v2,
    cuMipmappedArrayCreate,
    cuArrayDestroy,
    cuMipmappedArrayDestroy,
    cuIpcOpenMemHandle,
    cuIpcOpenMemHandle_v2,
    cuIpcCloseMemHandle,
    cuMemImportFromShareableHandle,
    cuMemGetInfo_v2,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    // Streams: the driver keeps device memory for each (about half a MiB on an H200).
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuStreamDestroy,
    cuStreamDestroy_v2,
    // Calls that change which context is current: wrapped only to forget the device a
    // thread's allocations were last attributed to (see sink::Hook::device).
    cuCtxSetCurrent,
    cuCtxPushCurrent,
    cuCtxPushCurrent_v2,
    cuCtxPopCurrent,
    cuCtxPopCurrent_v2,
    cuCtxCreate,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy,
    cuCtxDestroy_v2,
    cuDevicePrimaryCtxRelease,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset,
    cuDevicePrimaryCtxReset_v2,
    // Called, never wrapped:
    cuCtxGetDevice,
    cuMemGetAddressRange_v2,
    // Pool samples (see pools.rs): a device's current and default pool, a pool's numbers.
    cuDeviceGetMemPool,
    cuDeviceGetDefaultMemPool,
    cuMemPoolGetAttribute,
}

/// Functions whose pointers we swap for our wrappers (all but the called-only ones).
pub fn is_wrapped(f: F) -> bool {
    !matches!(
        f,
        F::cuCtxGetDevice
            | F::cuMemGetAddressRange_v2
            | F::cuDeviceGetMemPool
            | F::cuDeviceGetDefaultMemPool
            | F::cuMemPoolGetAttribute
    )
}

/// One table entry per function, the table aligned to a cache line, so that the hot
/// wrappers' entries (the first eight) take one line.
#[repr(C, align(64))]
struct Table([AtomicPtr<c_void>; COUNT]);

static REAL: Table = Table([const { AtomicPtr::new(core::ptr::null_mut()) }; COUNT]);
static RESOLVED: AtomicBool = AtomicBool::new(false);

/// The real function, resolving libcuda's table on first use.
#[inline]
pub fn real(f: F) -> *mut c_void {
    let p = REAL.0[f as usize].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    resolve_from_loaded_driver();
    REAL.0[f as usize].load(Ordering::Acquire)
}

/// Looks for an already-loaded libcuda and resolves every function from it.
#[cold]
pub fn resolve_from_loaded_driver() {
    if RESOLVED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: RTLD_NOLOAD only returns a handle if libcuda is already in the process.
    let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if !handle.is_null() {
        resolve_all(handle);
        // SAFETY: balances the reference NOLOAD took.
        unsafe { libc::dlclose(handle) };
    }
}

/// Resolves every function from `handle` if it is a CUDA driver. Idempotent and
/// race-free without a lock: every thread writes the same values.
pub fn resolve_all(handle: *mut c_void) -> bool {
    let dlsym = crate::dlsym_hook::real_dlsym();
    // SAFETY: plain dlsym lookups in a specific handle.
    unsafe {
        if dlsym(handle, c"cuInit".as_ptr()).is_null() {
            return false;
        }
        for f in ALL {
            let p = dlsym(handle, NAMES[f as usize].as_ptr() as *const libc::c_char);
            if !p.is_null() {
                let _ =
                    REAL.0[f as usize].compare_exchange(core::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }
    RESOLVED.store(true, Ordering::Release);
    true
}

/// Which wrapped function has this real address (how `cuGetProcAddress` pointers and
/// `dlsym` answers are recognised: by address, never by name prefix).
pub fn wrapped_by_real_address(addr: *mut c_void) -> Option<F> {
    if addr.is_null() {
        return None;
    }
    ALL.into_iter().find(|f| is_wrapped(*f) && REAL.0[*f as usize].load(Ordering::Acquire) == addr)
}

/// The function with this exact exported name, if we wrap it.
pub fn wrapped_by_name(name: &[u8]) -> Option<F> {
    // Cheap reject first: dlsym is called for thousands of unrelated names.
    if name.len() < 8 || &name[..2] != b"cu" {
        return None;
    }
    ALL.into_iter().find(|f| is_wrapped(*f) && &NAMES[*f as usize][..NAMES[*f as usize].len() - 1] == name)
}

/// Base names cudart asks `cuGetProcAddress` for that we intend to wrap; a pointer
/// for one of these that matches no real address is a hook miss, counted.
pub fn is_memory_base_name(name: &[u8]) -> bool {
    const BASES: &[&[u8]] = &[
        b"cuMemAlloc",
        b"cuMemAllocPitch",
        b"cuMemAllocManaged",
        b"cuMemFree",
        b"cuMemAllocAsync",
        b"cuMemAllocFromPoolAsync",
        b"cuMemFreeAsync",
        b"cuMemPoolTrimTo",
        b"cuMemPoolCreate",
        b"cuMemPoolDestroy",
        b"cuMemCreate",
        b"cuMemRelease",
        b"cuMemMap",
        b"cuMemUnmap",
        b"cuMemAddressReserve",
        b"cuMemAddressFree",
        b"cuArrayCreate",
        b"cuArray3DCreate",
        b"cuMipmappedArrayCreate",
        b"cuArrayDestroy",
        b"cuMipmappedArrayDestroy",
        b"cuIpcOpenMemHandle",
        b"cuIpcCloseMemHandle",
        b"cuMemImportFromShareableHandle",
        b"cuStreamCreate",
        b"cuStreamCreateWithPriority",
        b"cuStreamDestroy",
    ];
    BASES.contains(&name)
}

/// Base names of the calls that change a thread's current context. A pointer for one of
/// them that matches no wrapper means a context switch we would not see: the per-thread
/// device cache is then turned off (every allocation asks the driver, as before).
pub fn is_context_base_name(name: &[u8]) -> bool {
    const BASES: &[&[u8]] = &[
        b"cuCtxSetCurrent",
        b"cuCtxPushCurrent",
        b"cuCtxPopCurrent",
        b"cuCtxCreate",
        b"cuCtxDestroy",
        b"cuDevicePrimaryCtxRelease",
        b"cuDevicePrimaryCtxReset",
    ];
    BASES.contains(&name)
}
