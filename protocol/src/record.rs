//! The 64-byte event record: the same bytes in the ring and in a capture file.
//!
//! Every field is little-endian and unaligned (zerocopy's byte-order types), so a
//! record can be read straight out of a memory map or a byte buffer on any host.

use zerocopy::little_endian::{I16, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of one record in bytes. Part of the format: never change it.
pub const RECORD_SIZE: usize = 64;

/// One record as laid out in memory and on disk.
///
/// In the ring, `seq` holds the slot's publication stamp; readers rewrite it to the
/// event's position in its process's stream before handing the record on.
#[derive(Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawRecord {
    pub seq: U64,
    pub ts_ns: U64,
    pub addr: U64,
    pub size: U64,
    /// Second size or handle: pitch, VMM handle, start time (see `kinds` for each kind).
    pub aux: U64,
    /// Stream, pool, or mapping offset (see `kinds`).
    pub stream: U64,
    pub pid: U32,
    pub tid: U32,
    /// CUresult, saturated to u16::MAX.
    pub result: U16,
    /// Device ordinal, -1 when unknown.
    pub device: I16,
    pub kind: u8,
    /// Runtime API that led to this driver call (`Caller`), 0 when none is known.
    pub caller: u8,
    /// Exact driver function (`Api`).
    pub api: U16,
}

const _: () = assert!(std::mem::size_of::<RawRecord>() == RECORD_SIZE);

impl std::fmt::Debug for RawRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Event::from_raw(self).fmt(f)
    }
}

/// An enum of wire codes and names. A variant's name is its identifier unless `=> "text"`
/// gives another (the driver's function names are their own; the kinds are snake case).
macro_rules! code_enum {
    (@text $variant:ident $text:literal) => { $text };
    (@text $variant:ident) => { stringify!($variant) };
    ($(#[$meta:meta])* $name:ident : $repr:ty { $($(#[$vmeta:meta])* $variant:ident = $value:literal $(=> $text:literal)?,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr($repr)]
        #[allow(non_camel_case_types)]
        pub enum $name { $($(#[$vmeta])* $variant = $value,)* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            #[inline]
            pub fn from_code(code: $repr) -> Option<Self> {
                match code { $($value => Some($name::$variant),)* _ => None }
            }

            #[inline]
            pub fn code(self) -> $repr { self as $repr }

            pub fn name(self) -> &'static str {
                match self { $($name::$variant => code_enum!(@text $variant $($text)?),)* }
            }

            pub fn from_name(name: &str) -> Option<Self> {
                match name { $(code_enum!(@text $variant $($text)?) => Some($name::$variant),)* _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

code_enum! {
    /// What happened. Failed calls keep their kind and carry a non-zero result.
    EventKind: u8 {
        Alloc = 1 => "alloc",
        Free = 2 => "free",
        VmmCreate = 3 => "vmm_create",
        VmmRelease = 4 => "vmm_release",
        VmmReserve = 5 => "vmm_reserve",
        VmmAddressFree = 6 => "vmm_address_free",
        VmmMap = 7 => "vmm_map",
        VmmUnmap = 8 => "vmm_unmap",
        PoolTrim = 9 => "pool_trim",
        PoolCreate = 10 => "pool_create",
        PoolDestroy = 11 => "pool_destroy",
        MemInfo = 12 => "mem_info",
        ProcessStart = 13 => "process_start",
        ProcessExit = 14 => "process_exit",
        Dropped = 15 => "dropped",
        /// The driver handed out a memory entry point no wrapper matched: calls through
        /// it are not recorded. The symbol name is packed into addr..stream (32 bytes),
        /// the requested version is in `device`, the flags in `caller`.
        HookMiss = 16 => "hook_miss",
        /// The frameworks whose libraries the process has loaded (a `FrameworkId` bit
        /// mask in `addr`): written when the ring is made and again at an OOM if it changed.
        Frameworks = 17 => "frameworks",
        /// A framework lens's periodic sample of its cache on one device.
        FrameworkSample = 18 => "framework_sample",
        /// A framework lens at the moment the framework gave up on a request (PyTorch's
        /// out-of-memory observer): its request and its cache then.
        FrameworkOom = 19 => "framework_oom",
        /// One segment of a framework's cache, as a lens saw it at its OOM.
        FrameworkSegment = 20 => "framework_segment",
        /// The driver's own numbers for one stream-ordered pool (`cuMemPoolGetAttribute`):
        /// reserved bytes in `addr`, used bytes in `size`, 1 in `aux` when it is the
        /// device's current pool (the one `cuMemAllocAsync` uses), the pool in `stream`.
        /// Sampled with the device samples (periodically and after an OOM).
        PoolSample = 21 => "pool_sample",
        /// A stream made (`cuStreamCreate`, `cuStreamCreateWithPriority`): the stream in
        /// `stream`, its flags in `aux`, its priority in `addr`. The driver keeps device
        /// memory for each stream that no memory call shows (about half a MiB on an H200).
        StreamCreate = 22 => "stream_create",
        /// A stream destroyed (`cuStreamDestroy`, `cuStreamDestroy_v2`): the stream in `stream`.
        StreamDestroy = 23 => "stream_destroy",
        /// A lens's figures beside its sample or OOM record that the cache's totals do not
        /// give: the free bytes inside split blocks (stranded: `empty_cache()` cannot give
        /// them back) in `addr`, the framework's own limit for the process in `size`
        /// (`u64::MAX`: unknown or none), the framework in `caller`.
        FrameworkStats = 24 => "framework_stats",
        /// NVML's per-process usage on one device, written by a reader (the agent, `vramhook
        /// run`), never by a traced process: the holder's pid in `addr`, its bytes in `size`
        /// (with its context and libraries), its 16-byte command name in `aux` and `stream`,
        /// the sample's number in `seq`, the processes in the sample in `tid`. A sample with no
        /// process on the device is one record with pid 0 and `tid` 0.
        GpuProcess = 25 => "gpu_process",
    }
}

code_enum! {
    /// A framework that keeps its own cache of device memory (a library it loads names it).
    FrameworkId: u8 {
        Unknown = 0 => "unknown",
        PyTorch = 1 => "pytorch",
        CuPy = 2 => "cupy",
        Jax = 3 => "jax",
        TensorFlow = 4 => "tensorflow",
        Ggml = 5 => "ggml",
        TensorRt = 6 => "tensorrt",
    }
}

// The enum comes from `code_enum!`, which derives no `Default`.
#[allow(clippy::derivable_impls)]
impl Default for FrameworkId {
    fn default() -> Self {
        FrameworkId::Unknown
    }
}

impl FrameworkId {
    /// Its bit in a `frameworks` mask.
    pub const fn bit(self) -> u64 {
        1 << (self as u8)
    }

    /// The frameworks named by a `frameworks` mask, in code order.
    pub fn in_mask(mask: u64) -> impl Iterator<Item = FrameworkId> {
        FrameworkId::ALL.iter().copied().filter(move |f| *f != FrameworkId::Unknown && mask & f.bit() != 0)
    }

    /// True for frameworks that keep freed device memory for reuse (a cache the driver
    /// cannot see into); ggml sub-allocates from buffers it sizes up front instead.
    pub const fn caches(self) -> bool {
        matches!(self, FrameworkId::PyTorch | FrameworkId::CuPy | FrameworkId::Jax | FrameworkId::TensorFlow)
    }

    /// The framework of a library file name (`libc10_cuda.so`, `libggml-cuda.so`, …), if any.
    pub fn of_library(file_name: &[u8]) -> Option<FrameworkId> {
        const NAMES: &[(&[u8], FrameworkId)] = &[
            (b"libc10_cuda.so", FrameworkId::PyTorch),
            (b"libtorch_cuda.so", FrameworkId::PyTorch),
            (b"cupy_backends", FrameworkId::CuPy),
            (b"libcupy", FrameworkId::CuPy),
            (b"xla_extension", FrameworkId::Jax),
            (b"jaxlib", FrameworkId::Jax),
            (b"libtensorflow_framework.so", FrameworkId::TensorFlow),
            (b"_pywrap_tensorflow_internal.so", FrameworkId::TensorFlow),
            (b"libggml-cuda.so", FrameworkId::Ggml),
            (b"libnvinfer.so", FrameworkId::TensorRt),
        ];
        NAMES.iter().find(|(n, _)| contains(file_name, n)).map(|(_, f)| *f)
    }

    /// What to say to its users about seeing inside its cache.
    pub fn display_name(self) -> &'static str {
        match self {
            FrameworkId::Unknown => "a framework",
            FrameworkId::PyTorch => "PyTorch",
            FrameworkId::CuPy => "CuPy",
            FrameworkId::Jax => "JAX/XLA",
            FrameworkId::TensorFlow => "TensorFlow",
            FrameworkId::Ggml => "ggml",
            FrameworkId::TensorRt => "TensorRT",
        }
    }
}

/// `needle` occurs in `hay` (no allocation: used inside traced processes).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(feature = "serde")]
impl serde::Serialize for FrameworkId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for FrameworkId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(FrameworkId::from_name(&name).unwrap_or(FrameworkId::Unknown))
    }
}

code_enum! {
    /// The exact driver entry point that was called (versioned name, `_ptsz` kept apart).
    Api: u16 {
        None = 0 => "none",
        cuMemAlloc_v2 = 1,
        cuMemAllocPitch_v2 = 2,
        cuMemAllocManaged = 3,
        cuMemFree_v2 = 4,
        cuMemAllocAsync = 5,
        cuMemAllocAsync_ptsz = 6,
        cuMemAllocFromPoolAsync = 7,
        cuMemAllocFromPoolAsync_ptsz = 8,
        cuMemFreeAsync = 9,
        cuMemFreeAsync_ptsz = 10,
        cuMemPoolTrimTo = 11,
        cuMemCreate = 12,
        cuMemRelease = 13,
        cuMemMap = 14,
        cuMemUnmap = 15,
        cuMemAddressReserve = 16,
        cuMemAddressFree = 17,
        cuArrayCreate_v2 = 18,
        cuArray3DCreate_v2 = 19,
        cuMipmappedArrayCreate = 20,
        cuArrayDestroy = 21,
        cuMipmappedArrayDestroy = 22,
        cuIpcOpenMemHandle_v2 = 23,
        cuIpcCloseMemHandle = 24,
        cuMemImportFromShareableHandle = 25,
        cuMemGetInfo_v2 = 26,
        cuMemPoolCreate = 27,
        cuMemPoolDestroy = 28,
        /// The legacy entry point cudart 13 still asks for (version 4010); same ABI as _v2.
        cuIpcOpenMemHandle = 29,
        /// A pool sample (`cuMemPoolGetAttribute`, reserved and used bytes).
        cuMemPoolGetAttribute = 30,
        cuStreamCreate = 31,
        cuStreamCreateWithPriority = 32,
        cuStreamDestroy = 33,
        cuStreamDestroy_v2 = 34,
        /// A framework lens (in-process, e.g. the PyTorch lens) wrote the record.
        Lens = 0xFFFE => "lens",
        Interposer = 0xFFFF => "vramhook",
    }
}

code_enum! {
    /// The runtime call (shared libcudart only) that led to a driver call.
    Caller: u8 {
        None = 0 => "",
        cudaMalloc = 1,
        cudaFree = 2,
        cudaMallocPitch = 3,
        cudaMallocManaged = 4,
        cudaMallocAsync = 5,
        cudaFreeAsync = 6,
        cudaMallocFromPoolAsync = 7,
        cudaMemPoolTrimTo = 8,
    }
}

/// What kind of device memory an allocation API hands out. With serde, by its lower-case
/// name ([`MemClass::name`]) in JSON and by its variant index in postcard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum MemClass {
    Plain,
    Pitch,
    Managed,
    Pool,
    Vmm,
    Array,
    Ipc,
    Import,
}

impl MemClass {
    pub const ALL: [MemClass; 8] = [
        MemClass::Plain,
        MemClass::Pitch,
        MemClass::Managed,
        MemClass::Pool,
        MemClass::Vmm,
        MemClass::Array,
        MemClass::Ipc,
        MemClass::Import,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// The class of an index (taken modulo the number of classes).
    pub fn from_index(i: u8) -> MemClass {
        MemClass::ALL[(i as usize) % 8]
    }

    /// Bytes the process owns (counted in its live bytes): everything but IPC-opened and
    /// imported memory, which belongs to the exporting process.
    pub fn owned(self) -> bool {
        !matches!(self, MemClass::Ipc | MemClass::Import)
    }

    /// Bytes resident on the device: owned, and not managed (managed memory migrates and
    /// may live in host memory).
    pub fn resident(self) -> bool {
        self.owned() && self != MemClass::Managed
    }

    pub fn name(self) -> &'static str {
        match self {
            MemClass::Plain => "plain",
            MemClass::Pitch => "pitch",
            MemClass::Managed => "managed",
            MemClass::Pool => "pool",
            MemClass::Vmm => "vmm",
            MemClass::Array => "array",
            MemClass::Ipc => "ipc",
            MemClass::Import => "import",
        }
    }
}

impl Api {
    /// The memory class of the bytes an allocating call hands out.
    #[inline]
    pub fn mem_class(self) -> Option<MemClass> {
        use Api::*;
        Some(match self {
            cuMemAlloc_v2 => MemClass::Plain,
            cuMemAllocPitch_v2 => MemClass::Pitch,
            cuMemAllocManaged => MemClass::Managed,
            cuMemAllocAsync | cuMemAllocAsync_ptsz | cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz => {
                MemClass::Pool
            }
            cuMemCreate => MemClass::Vmm,
            cuMemImportFromShareableHandle => MemClass::Import,
            cuArrayCreate_v2 | cuArray3DCreate_v2 | cuMipmappedArrayCreate => MemClass::Array,
            cuIpcOpenMemHandle | cuIpcOpenMemHandle_v2 => MemClass::Ipc,
            _ => return Option::None,
        })
    }
}

/// CUDA_ERROR_OUT_OF_MEMORY.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

/// A decoded record with native types. Unknown codes are kept raw so that nothing is lost.
/// Laid out as [`RawRecord`] up to `tid`, so decoding is mostly a block copy.
///
/// `addr`, `size`, `aux` and `stream` are the record's four payload words; what each
/// holds depends on the kind (and, for allocations, on the API). Write and read them
/// through the per-kind constructors (`Event::pool_alloc`, `Event::vmm_map`, …) and
/// accessors (`ev.pool()`, `ev.handle()`, …) below: only code that moves whole records
/// (ring, capture, checkpoints) touches the words directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Event {
    pub seq: u64,
    pub ts_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub aux: u64,
    pub stream: u64,
    pub pid: u32,
    pub tid: u32,
    pub result: u32,
    pub device: i16,
    pub kind: u8,
    pub caller: u8,
    pub api: u16,
}

impl RawRecord {
    /// The record as eight words, each holding the value of its 8 bytes read as a little-endian
    /// `u64` (`words[0]` is `seq`): what a writer stores word by word. Made from the fields,
    /// so that a record built in registers goes to its slot without a trip through memory.
    #[inline(always)]
    pub fn to_words(&self) -> [u64; 8] {
        [
            self.seq.get(),
            self.ts_ns.get(),
            self.addr.get(),
            self.size.get(),
            self.aux.get(),
            self.stream.get(),
            u64::from(self.pid.get()) | u64::from(self.tid.get()) << 32,
            u64::from(self.result.get())
                | u64::from(self.device.get() as u16) << 16
                | u64::from(self.kind) << 32
                | u64::from(self.caller) << 40
                | u64::from(self.api.get()) << 48,
        ]
    }
}

impl Event {
    #[inline]
    pub fn from_raw(raw: &RawRecord) -> Self {
        Event {
            seq: raw.seq.get(),
            ts_ns: raw.ts_ns.get(),
            pid: raw.pid.get(),
            tid: raw.tid.get(),
            kind: raw.kind,
            api: raw.api.get(),
            caller: raw.caller,
            result: u32::from(raw.result.get()),
            device: raw.device.get(),
            addr: raw.addr.get(),
            size: raw.size.get(),
            aux: raw.aux.get(),
            stream: raw.stream.get(),
        }
    }

    pub fn to_raw(&self) -> RawRecord {
        RawRecord {
            seq: U64::new(self.seq),
            ts_ns: U64::new(self.ts_ns),
            addr: U64::new(self.addr),
            size: U64::new(self.size),
            aux: U64::new(self.aux),
            stream: U64::new(self.stream),
            pid: U32::new(self.pid),
            tid: U32::new(self.tid),
            result: U16::new(saturate_result(self.result)),
            device: I16::new(self.device),
            kind: self.kind,
            caller: self.caller,
            api: U16::new(self.api),
        }
    }

    #[inline]
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_code(self.kind)
    }

    #[inline]
    pub fn api(&self) -> Option<Api> {
        Api::from_code(self.api)
    }

    #[inline]
    pub fn caller(&self) -> Option<Caller> {
        Caller::from_code(self.caller)
    }

    #[inline]
    pub fn failed(&self) -> bool {
        self.result != 0
    }

    /// For a `HookMiss`: the entry point's name (up to 32 bytes).
    pub fn hook_miss_symbol(&self) -> String {
        let mut bytes = Vec::with_capacity(32);
        for v in [self.addr, self.size, self.aux, self.stream] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    #[inline]
    pub fn is_oom(&self) -> bool {
        self.result == CUDA_ERROR_OUT_OF_MEMORY
    }
}

/// CUresult values fit in 16 bits today (the largest is 999); anything larger saturates.
pub fn saturate_result(result: u32) -> u16 {
    u16::try_from(result).unwrap_or(u16::MAX)
}

/// Name of a CUresult, for people.
pub fn result_name(result: u32) -> &'static str {
    match result {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        500 => "CUDA_ERROR_NOT_FOUND",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "CUDA_ERROR_OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn record_layout_is_fixed_little_endian() {
        let ev = Event {
            seq: 1,
            ts_ns: 2,
            pid: 3,
            tid: 4,
            kind: EventKind::Alloc.code(),
            api: Api::cuMemAllocAsync_ptsz.code(),
            caller: Caller::cudaMallocAsync.code(),
            result: 2,
            device: -1,
            addr: 0x1122_3344_5566_7788,
            size: 9,
            aux: 10,
            stream: 11,
        };
        let raw = ev.to_raw();
        let bytes = raw.as_bytes();
        assert_eq!(bytes.len(), 64);
        assert_eq!(&bytes[0..8], &1u64.to_le_bytes());
        assert_eq!(&bytes[16..24], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&bytes[48..52], &3u32.to_le_bytes());
        assert_eq!(&bytes[56..58], &2u16.to_le_bytes());
        assert_eq!(&bytes[58..60], &(-1i16).to_le_bytes());
        assert_eq!(bytes[60], 1);
        assert_eq!(bytes[61], 5);
        assert_eq!(&bytes[62..64], &6u16.to_le_bytes());
        assert_eq!(Event::from_raw(&raw), ev);
    }

    proptest::proptest! {
        /// The words a writer stores are the record's bytes, whatever the fields hold.
        #[test]
        fn words_are_the_records_bytes(
            words in proptest::array::uniform8(proptest::prelude::any::<u64>()),
        ) {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let raw = <RawRecord as zerocopy::FromBytes>::read_from_bytes(&bytes[..]).expect("64 bytes");
            proptest::prop_assert_eq!(raw.to_words(), words);
        }
    }

    #[test]
    fn names_round_trip() {
        for api in Api::ALL {
            assert_eq!(Api::from_name(api.name()), Some(*api));
            assert_eq!(Api::from_code(api.code()), Some(*api));
        }
        assert_eq!(
            FrameworkId::of_library(b"/opt/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so"),
            Some(FrameworkId::PyTorch)
        );
        assert_eq!(FrameworkId::of_library(b"/usr/lib/ollama/libggml-cuda.so"), Some(FrameworkId::Ggml));
        assert_eq!(FrameworkId::of_library(b"/usr/lib/x86_64-linux-gnu/libcudart.so.13"), None);
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_code(kind.code()), Some(*kind));
        }
        assert_eq!(Api::from_code(999), None);
        // A name is the identifier unless the table gives another.
        assert_eq!((Api::cuMemAlloc_v2.name(), Api::Lens.name()), ("cuMemAlloc_v2", "lens"));
        assert_eq!((Caller::cudaMalloc.name(), Caller::None.name()), ("cudaMalloc", ""));
    }

    #[test]
    fn hook_miss_symbol_round_trips_up_to_32_bytes() {
        assert_eq!(Event::hook_miss(b"cuIpcOpenMemHandle", 0, 0).hook_miss_symbol(), "cuIpcOpenMemHandle");
        assert_eq!(Event::hook_miss(b"cuMemAllocFromPoolAsync_ptsz_and_more", 0, 0).hook_miss_symbol().len(), 32);
    }

    #[test]
    fn results_saturate() {
        assert_eq!(saturate_result(70_000), u16::MAX);
        assert_eq!(saturate_result(2), 2);
    }
}
