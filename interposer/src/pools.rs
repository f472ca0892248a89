//! Stream-ordered pools' reserve, as the driver reports it (`cuMemPoolGetAttribute`).
//!
//! A pool keeps freed memory reserved (PyTorch's `backend:cudaMallocAsync` sets its release
//! threshold to the maximum, so it keeps all of it): the process holds more than its live
//! allocations, and no call we wrap says how much. So each device sample (after an
//! out-of-memory failure, and at most every `VRAMHOOK_MEMINFO_MS`) also asks the driver for
//! the reserved and used bytes of every pool the process may be using: the current pool of
//! each device it allocated on (the one `cuMemAllocAsync` uses, `cuDeviceGetMemPool`) and
//! every pool it created. A `pool_sample` is recorded when a pool's numbers changed since
//! its last one.
//!
//! Only from sampling paths, never per call: a few driver calls per pool. No allocation and
//! no lock: fixed tables of atomics. Not at process exit: our library destructor may run
//! after libcuda's, and a call into a torn-down driver is not safe.

use crate::real::{self, F};
use crate::sink::Hook;
use core::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use vramhook_protocol::record::Event;

type CUresult = i32;

/// `CUmemPool_attribute` values (cuda.h; both read a `cuuint64_t`).
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: i32 = 5;
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: i32 = 7;

/// Device ordinals tracked (a bit each in `DEVICES`).
const MAX_DEVICES: usize = 64;
/// Pools created by the process that are sampled; more are not (the first ones win).
const MAX_POOLS: usize = 32;

/// Devices the process allocated on, seen when a sample was due.
static DEVICES: AtomicU64 = AtomicU64::new(0);

/// One sampled pool: its handle (0: free slot), device, and the numbers last recorded.
struct Slot {
    handle: AtomicU64,
    device: AtomicU64,
    reserved: AtomicU64,
    used: AtomicU64,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            handle: AtomicU64::new(0),
            device: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            used: AtomicU64::new(0),
        }
    }

    /// True when (reserved, used) differ from what was last recorded; remembers them.
    fn changed(&self, reserved: u64, used: u64) -> bool {
        let was = (self.reserved.swap(reserved, Ordering::Relaxed), self.used.swap(used, Ordering::Relaxed));
        was != (reserved, used)
    }
}

/// The current pool of each device (its handle as last seen, and the numbers last recorded).
static CURRENT: [Slot; MAX_DEVICES] = [const { Slot::empty() }; MAX_DEVICES];
/// Pools the process created (`cuMemPoolCreate`), until destroyed.
static CREATED: [Slot; MAX_POOLS] = [const { Slot::empty() }; MAX_POOLS];

/// Remembers that the process allocates on `device` (its current pool is then sampled).
/// Cheap when already known: one relaxed load.
#[inline]
pub fn note_device(device: i16) {
    if (0..MAX_DEVICES as i16).contains(&device) {
        let bit = 1u64 << device;
        if DEVICES.load(Ordering::Relaxed) & bit == 0 {
            DEVICES.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// A pool the process created (`cuMemPoolCreate` succeeded) on `device`.
pub fn created(handle: u64, device: i16) {
    if handle == 0 {
        return;
    }
    for s in &CREATED {
        if s.handle.compare_exchange(0, handle, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            s.device.store(device as u16 as u64, Ordering::Relaxed);
            s.reserved.store(0, Ordering::Relaxed);
            s.used.store(0, Ordering::Relaxed);
            return;
        }
    }
}

/// A pool the process destroyed: no longer sampled.
pub fn destroyed(handle: u64) {
    if handle == 0 {
        return;
    }
    for s in &CREATED {
        if s.handle.compare_exchange(handle, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return;
        }
    }
}

/// One attribute of a pool, `None` when the driver refuses.
fn attribute(get: *mut c_void, pool: u64, attr: i32) -> Option<u64> {
    let mut value: u64 = 0;
    // SAFETY: cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void*); both
    // attributes asked for write a cuuint64_t.
    let r = unsafe {
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, i32, *mut c_void) -> CUresult>(get)(
            pool as *mut c_void,
            attr,
            (&mut value as *mut u64).cast(),
        )
    };
    (r == 0).then_some(value)
}

/// (reserved, used) of a pool.
fn numbers(get: *mut c_void, pool: u64) -> Option<(u64, u64)> {
    Some((
        attribute(get, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        attribute(get, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
    ))
}

/// The current pool of `device` (`cuDeviceGetMemPool`; its default pool from a driver
/// without it), 0 when unknown.
fn current_pool(device: i16) -> u64 {
    let mut get = real::real(F::cuDeviceGetMemPool);
    if get.is_null() {
        get = real::real(F::cuDeviceGetDefaultMemPool);
    }
    if get.is_null() {
        return 0;
    }
    let mut pool: *mut c_void = core::ptr::null_mut();
    // SAFETY: cuDeviceGetMemPool and cuDeviceGetDefaultMemPool: (CUmemoryPool*, CUdevice).
    let r = unsafe {
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *mut c_void, i32) -> CUresult>(get)(
            &mut pool,
            i32::from(device),
        )
    };
    if r == 0 {
        pool as u64
    } else {
        0
    }
}

/// Records every tracked pool whose numbers changed since its last record. Runs with the
/// device sample, before it: an incident then judges the failure with the pools' reserve.
pub fn sample(h: &Hook, device: i16) {
    note_device(device);
    let get = real::real(F::cuMemPoolGetAttribute);
    if get.is_null() {
        return;
    }
    let devices = DEVICES.load(Ordering::Relaxed);
    for (d, slot) in CURRENT.iter().enumerate() {
        if devices & (1u64 << d) == 0 {
            continue;
        }
        let dev = d as i16;
        let pool = current_pool(dev);
        if pool == 0 {
            continue;
        }
        let before = slot.handle.swap(pool, Ordering::Relaxed);
        if before != 0 && before != pool {
            // Another pool became current: its numbers are new, even if equal.
            slot.reserved.store(u64::MAX, Ordering::Relaxed);
        }
        if let Some((reserved, used)) = numbers(get, pool) {
            if slot.changed(reserved, used) {
                h.emit(Event::pool_sample(pool, reserved, used, true).on_device(dev));
            }
        }
    }
    for slot in &CREATED {
        let pool = slot.handle.load(Ordering::Acquire);
        if pool == 0 {
            continue;
        }
        let dev = slot.device.load(Ordering::Relaxed) as u16 as i16;
        let current = usize::try_from(dev).ok().and_then(|d| CURRENT.get(d));
        if current.is_some_and(|c| c.handle.load(Ordering::Relaxed) == pool) {
            continue; // sampled above as its device's current pool
        }
        if let Some((reserved, used)) = numbers(get, pool) {
            if slot.changed(reserved, used) {
                h.emit(Event::pool_sample(pool, reserved, used, false).on_device(dev));
            }
        }
    }
}
