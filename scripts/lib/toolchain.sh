# Sourced by scripts/setup.sh and scripts/test.sh. rust-toolchain.toml pins the compiler
# this machine has (1.95.0); nothing can be downloaded here, so where rustup knows that
# compiler only as `stable`, the pinned name is linked to it, never installed.
pin_toolchain() {
    command -v rustup >/dev/null || return 0
    local want have
    want=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
    rustup toolchain list | grep -q "^$want" && return 0
    have=$(RUSTUP_TOOLCHAIN=stable rustc --version 2>/dev/null | cut -d' ' -f2)
    if [ "$have" = "$want" ]; then
        # `rustup toolchain link` refuses a release's name: the same link, made by hand.
        local sysroot
        sysroot=$(RUSTUP_TOOLCHAIN=stable rustc --print sysroot)
        echo "toolchain: naming the installed stable Rust $want (rust-toolchain.toml)"
        ln -s "$sysroot" "$(dirname "$sysroot")/$want-$(basename "$sysroot" | sed 's/^stable-//')"
    else
        echo "toolchain: rust-toolchain.toml pins Rust $want; rustup has no such toolchain, and stable is ${have:-missing}" >&2
        return 1
    fi
}
