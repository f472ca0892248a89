#![doc = include_str!("../README.md")]
//!
//! `libvramhook.so`: records every device-memory call of an unmodified CUDA process.
//!
//! How calls are caught (see docs/how-programs-reach-the-driver.md for why all three exist):
//! - we export the driver's memory functions, for programs linked with `-lcuda`;
//! - we export `dlsym`, for programs that look driver functions up by name;
//! - we export `dlopen` (x86-64), so that a framework library loaded after the ring was
//!   made is attributed (it changes nothing about what is loaded: see `dlopen_hook`);
//! - we export `cuGetProcAddress` and `cuGetProcAddress_v2`, through which cudart gets
//!   every entry point: each pointer the driver hands out is swapped, by address, for our
//!   wrapper of that exact function (version, flags and status stay as the driver said).
//!
//! Rules for code in this crate, which runs inside other people's processes:
//! no allocation, lock or extra syscall on the hot path; a thread-local re-entrancy
//! guard; no panic crosses the FFI boundary; nothing happens until CUDA is used.

mod config;
mod dlopen_hook;
mod dlsym_hook;
mod hooks;
mod lens;
mod pools;
mod real;
mod sink;

/// Runs when the library is loaded: reads the environment, nothing else.
extern "C" fn vramhook_constructor() {
    config::load_from_env();
}

/// Runs at normal process exit: marks the ring closed.
extern "C" fn vramhook_destructor() {
    let _ = std::panic::catch_unwind(sink::process_exit);
}

#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = vramhook_constructor;

#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = vramhook_destructor;
