//! Our `dlsym`.
//!
//! glibc resolves `RTLD_NEXT` relative to the caller's return address. If we forwarded
//! with an ordinary call, a program's own `dlsym(RTLD_NEXT, …)` would silently start from
//! our library. So on x86-64 `dlsym` is a naked function: it asks `decide` first and, when
//! there is nothing to substitute, tail-jumps to the real `dlsym` with the caller's frame
//! and return address untouched.

use core::ffi::c_void;
use libc::c_char;
use std::sync::atomic::{AtomicUsize, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Address of glibc's `dlsym`; read by the naked function's tail jump (a local symbol,
/// so the jump is a plain RIP-relative load).
static VRAMHOOK_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn dlsym_unavailable(_: *mut c_void, _: *const c_char) -> *mut c_void {
    core::ptr::null_mut()
}

/// glibc's function `name` (its GLIBC_2.34 version, else GLIBC_2.2.5), found with `dlvsym`,
/// which we do not interpose, and kept in `cache`; `unavailable` where glibc has neither.
pub(crate) fn glibc_function(name: &core::ffi::CStr, cache: &AtomicUsize, unavailable: usize) -> usize {
    let mut p = cache.load(Ordering::Acquire);
    if p == 0 {
        // SAFETY: dlvsym with NUL-terminated names.
        unsafe {
            let mut f = libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), c"GLIBC_2.34".as_ptr());
            if f.is_null() {
                f = libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), c"GLIBC_2.2.5".as_ptr());
            }
            p = if f.is_null() { unavailable } else { f as usize };
        }
        cache.store(p, Ordering::Release);
    }
    p
}

/// glibc's `dlsym`.
pub fn real_dlsym() -> DlsymFn {
    let p = glibc_function(c"dlsym", &VRAMHOOK_REAL_DLSYM, dlsym_unavailable as *const () as usize);
    // SAFETY: p is either glibc's dlsym or our stand-in, both with dlsym's ABI.
    unsafe { core::mem::transmute::<usize, DlsymFn>(p) }
}

/// Returns the answer to give instead of the real `dlsym`'s, or null to forward.
/// Also makes sure the tail jump has a target.
unsafe extern "C" fn decide(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    std::panic::catch_unwind(|| decide_inner(handle, symbol)).unwrap_or(core::ptr::null_mut())
}

fn decide_inner(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let real = real_dlsym();
    if symbol.is_null() || crate::config::disabled() {
        return core::ptr::null_mut();
    }
    // RTLD_DEFAULT already finds our exported wrappers; RTLD_NEXT must keep the caller's
    // meaning. Only lookups in a specific handle (libcuda's) need substituting.
    if handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT {
        return core::ptr::null_mut();
    }
    // A lookup in a library's handle: the library may have been loaded where our `dlopen`
    // did not look (a name without a `/`); one callback when nothing was loaded since.
    crate::lens::after_load();
    // SAFETY: symbol is a NUL-terminated string from the caller.
    let name = unsafe { core::ffi::CStr::from_ptr(symbol) }.to_bytes();
    let Some(f) = crate::real::wrapped_by_name(name) else {
        return core::ptr::null_mut();
    };
    // SAFETY: a lookup in a specific handle does not depend on the caller's address.
    let answer = unsafe { real(handle, symbol) };
    if answer.is_null() {
        return core::ptr::null_mut();
    }
    crate::real::resolve_all(handle);
    match crate::real::wrapped_by_real_address(answer) {
        Some(g) if g == f => crate::hooks::wrapper(f),
        _ => answer,
    }
}

#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
/// # Safety
/// Same contract as glibc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym decide,
        real = sym VRAMHOOK_REAL_DLSYM,
    )
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
/// # Safety
/// Same contract as glibc's `dlsym`. On this architecture forwarding is an ordinary
/// call, so `RTLD_NEXT` lookups made through it start after our library.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let sub = decide(handle, symbol);
    if !sub.is_null() {
        return sub;
    }
    real_dlsym()(handle, symbol)
}
