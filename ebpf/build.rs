//! Compiles the BPF programs (bpf/vramhook.bpf.c) with clang into OUT_DIR/vramhook.bpf.o,
//! which src/probe.rs embeds. clang and the libbpf headers (`libbpf-dev`) are required;
//! without them the build stops with one line saying what to install.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/vramhook.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("vramhook.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let (define, multiarch) = match arch.as_str() {
        "x86_64" => ("-D__TARGET_ARCH_x86", "/usr/include/x86_64-linux-gnu"),
        "aarch64" => ("-D__TARGET_ARCH_arm64", "/usr/include/aarch64-linux-gnu"),
        other => {
            println!("cargo:warning=vramhook-ebpf: no BPF register layout for target arch {other}");
            ("-D__TARGET_ARCH_unsupported", "/usr/include")
        }
    };
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", define])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!(
                "vramhook-ebpf: `{clang} -target bpf` failed ({s}) on {src}; are the libbpf headers installed \
                 (apt-get install libbpf-dev)?"
            );
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!(
                "vramhook-ebpf: cannot run `{clang}` ({e}): clang is needed to build the BPF programs \
                 (apt-get install clang llvm libbpf-dev, or set CLANG=/path/to/clang)"
            );
            std::process::exit(1);
        }
    }
}
