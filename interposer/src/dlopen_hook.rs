//! Our `dlopen`: a framework library loaded after the ring was made gets attributed.
//!
//! glibc's `dlopen` is caller-relative too: it takes the caller's return address to find
//! the caller's object, whose namespace the new object joins, whose `RPATH`/`RUNPATH`
//! is searched for a name without a `/`, and whose origin a `$ORIGIN` in the name expands
//! to. Called from here, all three would be ours. So on x86-64 `dlopen` is a naked
//! function that asks `decide` which way to go and jumps there with the caller's frame
//! and return address untouched:
//! - to glibc's `dlopen` itself (the caller's meaning kept exactly) for a null name, a
//!   name without a `/` or with a `$`, `RTLD_NOLOAD`, a caller in another link-map
//!   namespace than ours, before this process's ring exists (its creation scans every
//!   library loaded by then), or when tracing is off;
//! - otherwise to `dlopen_then_look`, which calls glibc's `dlopen` and, when it succeeded,
//!   looks at what the loader loaded since the last look (`lens::after_load`). For a path
//!   with a `/` and no `$` the caller's object decides only the namespace, and `decide`
//!   checked that it is ours, so the same object is loaded into the same namespace.
//!
//! Loads made the first way are still seen at the next look (a later `dlopen` of ours, or
//! a `dlsym` in a specific handle: Python looks up `PyInit_*`, ctypes its functions).
//! `dlmopen` is not wrapped: an object loaded into another namespace is not attributed.

#[cfg(target_arch = "x86_64")]
mod imp {
    use core::ffi::c_void;
    use libc::{c_char, c_int};
    use std::sync::atomic::{AtomicUsize, Ordering};

    type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

    static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
    /// Our own link-map namespace, once known (`usize::MAX`: not known).
    static OUR_LMID: AtomicUsize = AtomicUsize::new(usize::MAX - 1);

    const RTLD_DI_LMID: c_int = 1;
    const RTLD_DL_LINKMAP: c_int = 2;

    unsafe extern "C" {
        fn dladdr1(addr: *const c_void, info: *mut libc::Dl_info, extra: *mut *mut c_void, flags: c_int) -> c_int;
        fn dlinfo(handle: *mut c_void, request: c_int, arg: *mut c_void) -> c_int;
    }

    unsafe extern "C" fn dlopen_unavailable(_: *const c_char, _: c_int) -> *mut c_void {
        core::ptr::null_mut()
    }

    /// glibc's `dlopen`.
    fn real_dlopen() -> usize {
        crate::dlsym_hook::glibc_function(c"dlopen", &REAL_DLOPEN, dlopen_unavailable as *const () as usize)
    }

    /// The link-map namespace of the object that holds `addr`, if the loader says.
    fn namespace_of(addr: *const c_void) -> Option<usize> {
        // SAFETY: out-parameters of ours; dladdr1 fills `map` with the object's link map
        // (its handle), which dlinfo accepts.
        unsafe {
            let mut info: libc::Dl_info = core::mem::zeroed();
            let mut map: *mut c_void = core::ptr::null_mut();
            if dladdr1(addr, &mut info, &mut map, RTLD_DL_LINKMAP) == 0 || map.is_null() {
                return None;
            }
            let mut lmid: libc::c_long = -1;
            if dlinfo(map, RTLD_DI_LMID, (&raw mut lmid).cast()) != 0 || lmid < 0 {
                return None;
            }
            Some(lmid as usize)
        }
    }

    fn our_namespace() -> Option<usize> {
        let v = OUR_LMID.load(Ordering::Relaxed);
        if v != usize::MAX - 1 {
            return (v != usize::MAX).then_some(v);
        }
        let ns = namespace_of(real_dlopen as *const () as *const c_void);
        OUR_LMID.store(ns.unwrap_or(usize::MAX), Ordering::Relaxed);
        ns
    }

    /// Where the naked `dlopen` jumps: glibc's `dlopen`, or `dlopen_then_look`.
    unsafe extern "C" fn decide(file: *const c_char, mode: c_int, caller: *const c_void) -> usize {
        let real = real_dlopen();
        std::panic::catch_unwind(|| {
            if file.is_null() || mode & libc::RTLD_NOLOAD != 0 || !crate::lens::ring_scanned() {
                return real;
            }
            if crate::config::disabled() {
                return real;
            }
            // SAFETY: a NUL-terminated name from the caller, per dlopen's contract.
            let name = unsafe { core::ffi::CStr::from_ptr(file) }.to_bytes();
            if !name.contains(&b'/') || name.contains(&b'$') {
                return real;
            }
            match (namespace_of(caller), our_namespace()) {
                (Some(a), Some(b)) if a == b => dlopen_then_look as *const () as usize,
                _ => real,
            }
        })
        .unwrap_or(real)
    }

    /// glibc's `dlopen` (for a name whose resolution does not depend on the caller), then a
    /// look at what it loaded. `errno` and `dlerror()` stay as `dlopen` left them.
    unsafe extern "C" fn dlopen_then_look(file: *const c_char, mode: c_int) -> *mut c_void {
        // SAFETY: REAL_DLOPEN was set by `decide` before it sent the call here.
        let real = unsafe { core::mem::transmute::<usize, DlopenFn>(real_dlopen()) };
        // SAFETY: the caller's arguments, unchanged.
        let handle = unsafe { real(file, mode) };
        if !handle.is_null() {
            // SAFETY: errno is this thread's.
            let errno = unsafe { *libc::__errno_location() };
            let _ = std::panic::catch_unwind(crate::lens::after_load);
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = errno };
        }
        handle
    }

    #[unsafe(no_mangle)]
    #[unsafe(naked)]
    /// # Safety
    /// Same contract as glibc's `dlopen`.
    pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "mov rdx, [rsp + 24]",
            "call {decide}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "jmp rax",
            decide = sym decide,
        )
    }
}
