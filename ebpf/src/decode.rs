//! The BPF program's wire record (`struct vh_event` in bpf/vramhook.bpf.c, 128 bytes)
//! decoded into vramhook's event, filling each field exactly as the interposer's hook for
//! the same function does (interposer/src/hooks.rs).
//!
//! Ring-buffer records are untrusted input: the length, the magic, the function code and
//! the process id are checked, and every size is computed with saturating arithmetic.

use vramhook_protocol::arrays::{array_bytes, mipmapped_array_bytes};
use vramhook_protocol::record::{Api, Event, EventKind};

/// Bytes of one `struct vh_event`.
pub const WIRE_SIZE: usize = 128;
/// `VH_MAGIC`: "vheb".
pub const WIRE_MAGIC: u32 = 0x7668_6562;

const OUT0: u32 = 1;
const OUT1: u32 = 2;
const EXTRA: u32 = 4;

/// The functions the probes attach to: the interposer's list (`_ptsz` variants and the
/// legacy `cuIpcOpenMemHandle` included), each with the `Api` code sent as its cookie.
pub const PROBED: &[Api] = &[
    Api::cuMemAlloc_v2,
    Api::cuMemAllocPitch_v2,
    Api::cuMemAllocManaged,
    Api::cuMemFree_v2,
    Api::cuMemAllocAsync,
    Api::cuMemAllocAsync_ptsz,
    Api::cuMemAllocFromPoolAsync,
    Api::cuMemAllocFromPoolAsync_ptsz,
    Api::cuMemFreeAsync,
    Api::cuMemFreeAsync_ptsz,
    Api::cuMemPoolTrimTo,
    Api::cuMemPoolCreate,
    Api::cuMemPoolDestroy,
    Api::cuMemCreate,
    Api::cuMemRelease,
    Api::cuMemMap,
    Api::cuMemUnmap,
    Api::cuMemAddressReserve,
    Api::cuMemAddressFree,
    Api::cuArrayCreate_v2,
    Api::cuArray3DCreate_v2,
    Api::cuMipmappedArrayCreate,
    Api::cuArrayDestroy,
    Api::cuMipmappedArrayDestroy,
    Api::cuIpcOpenMemHandle,
    Api::cuIpcOpenMemHandle_v2,
    Api::cuIpcCloseMemHandle,
    Api::cuMemImportFromShareableHandle,
    Api::cuMemGetInfo_v2,
    Api::cuStreamCreate,
    Api::cuStreamCreateWithPriority,
    Api::cuStreamDestroy,
    Api::cuStreamDestroy_v2,
];

/// Why a ring-buffer record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {0} bytes, not {WIRE_SIZE}")]
    Length(usize),
    #[error("bad magic {0:#x}")]
    Magic(u32),
    #[error("function code {0} is not probed")]
    Api(u32),
    #[error("process id 0")]
    Pid,
}

/// One decoded call, with what only the BPF side knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    pub event: Event,
    /// Monotonic ns when the call entered (the event's `ts_ns` is its return).
    pub entry_ns: u64,
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

/// The fields of one `struct vh_event` as the probe wrote them, before they are read as a
/// call: the one place that knows the offsets, for decoding and for building records
/// (tests, fuzzing). The magic sits at byte 116.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireRecord {
    /// Monotonic ns when the call returned.
    pub ts_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// The `Api` code the probe was attached with.
    pub api: u32,
    /// The driver's `CUresult`.
    pub result: i32,
    /// The call's first five arguments.
    pub args: [u64; 5],
    /// What the call wrote through its out-pointers (valid where `flags` says).
    pub out: [u64; 2],
    /// Descriptor or properties words copied from user memory (valid where `flags` says).
    pub extra: [u64; 4],
    /// `OUT0 | OUT1 | EXTRA`: which of `out` and `extra` were read.
    pub flags: u32,
    /// Monotonic ns when the call entered.
    pub entry_ns: u64,
}

impl WireRecord {
    /// Reads the fields of a record of exactly [`WIRE_SIZE`] bytes with the right magic.
    pub fn parse(b: &[u8]) -> Result<Self, DecodeError> {
        if b.len() != WIRE_SIZE {
            return Err(DecodeError::Length(b.len()));
        }
        let magic = u32_at(b, 116);
        if magic != WIRE_MAGIC {
            return Err(DecodeError::Magic(magic));
        }
        Ok(WireRecord {
            ts_ns: u64_at(b, 0),
            tgid: u32_at(b, 8),
            tid: u32_at(b, 12),
            api: u32_at(b, 16),
            result: u32_at(b, 20) as i32,
            args: std::array::from_fn(|i| u64_at(b, 24 + 8 * i)),
            out: [u64_at(b, 64), u64_at(b, 72)],
            extra: std::array::from_fn(|i| u64_at(b, 80 + 8 * i)),
            flags: u32_at(b, 112),
            entry_ns: u64_at(b, 120),
        })
    }

    /// The record's bytes, magic included.
    pub fn encode(&self) -> [u8; WIRE_SIZE] {
        let mut b = [0u8; WIRE_SIZE];
        b[0..8].copy_from_slice(&self.ts_ns.to_le_bytes());
        b[8..12].copy_from_slice(&self.tgid.to_le_bytes());
        b[12..16].copy_from_slice(&self.tid.to_le_bytes());
        b[16..20].copy_from_slice(&self.api.to_le_bytes());
        b[20..24].copy_from_slice(&self.result.to_le_bytes());
        for (i, a) in self.args.iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        b[64..72].copy_from_slice(&self.out[0].to_le_bytes());
        b[72..80].copy_from_slice(&self.out[1].to_le_bytes());
        for (i, x) in self.extra.iter().enumerate() {
            b[80 + 8 * i..88 + 8 * i].copy_from_slice(&x.to_le_bytes());
        }
        b[112..116].copy_from_slice(&self.flags.to_le_bytes());
        b[116..120].copy_from_slice(&WIRE_MAGIC.to_le_bytes());
        b[120..128].copy_from_slice(&self.entry_ns.to_le_bytes());
        b
    }
}

/// Decodes one record. `seq` is left 0 (the source numbers each process's events).
pub fn decode(b: &[u8]) -> Result<Wire, DecodeError> {
    let WireRecord { ts_ns, tgid, tid, api: code, result, args, out, extra, flags, entry_ns } = WireRecord::parse(b)?;
    let api = u16::try_from(code)
        .ok()
        .and_then(Api::from_code)
        .filter(|a| PROBED.contains(a))
        .ok_or(DecodeError::Api(code))?;
    if tgid == 0 {
        return Err(DecodeError::Pid);
    }
    let ok = result == 0;
    let out0 = if ok && flags & OUT0 != 0 { out[0] } else { 0 };
    let out1 = if ok && flags & OUT1 != 0 { out[1] } else { 0 };
    let has_extra = flags & EXTRA != 0;
    let location = if has_extra { extra[0] as u32 as i32 as i16 } else { -1 };
    let mut ev =
        Event { ts_ns, pid: tgid, tid, result: result as u32, device: -1, api: api.code(), ..Event::default() };
    use Api as A;
    let (kind, addr, size, aux, stream) = match api {
        A::cuMemAlloc_v2 => (EventKind::Alloc, out0, args[1], 0, 0),
        A::cuMemAllocPitch_v2 => {
            let (width, height) = (args[2], args[3]);
            let size = if ok { out1.saturating_mul(height) } else { width.saturating_mul(height) };
            (EventKind::Alloc, out0, size, out1, 0)
        }
        A::cuMemAllocManaged => (EventKind::Alloc, out0, args[1], u64::from(args[2] as u32), 0),
        A::cuMemFree_v2 | A::cuArrayDestroy | A::cuMipmappedArrayDestroy | A::cuIpcCloseMemHandle => {
            (EventKind::Free, args[0], 0, 0, 0)
        }
        A::cuMemAllocAsync | A::cuMemAllocAsync_ptsz => (EventKind::Alloc, out0, args[1], 0, args[2]),
        A::cuMemAllocFromPoolAsync | A::cuMemAllocFromPoolAsync_ptsz => {
            (EventKind::Alloc, out0, args[1], args[3], args[2])
        }
        A::cuMemFreeAsync | A::cuMemFreeAsync_ptsz => (EventKind::Free, args[0], 0, 0, args[1]),
        A::cuMemPoolTrimTo => (EventKind::PoolTrim, 0, args[1], 0, args[0]),
        A::cuMemPoolCreate => {
            ev.device = location;
            (EventKind::PoolCreate, 0, 0, 0, out0)
        }
        A::cuMemPoolDestroy => (EventKind::PoolDestroy, 0, 0, 0, args[0]),
        A::cuMemCreate => {
            ev.device = location;
            (EventKind::VmmCreate, 0, args[1], out0, 0)
        }
        A::cuMemRelease => (EventKind::VmmRelease, 0, 0, args[0], 0),
        A::cuMemMap => (EventKind::VmmMap, args[0], args[1], args[3], args[2]),
        A::cuMemUnmap => (EventKind::VmmUnmap, args[0], args[1], 0, 0),
        A::cuMemAddressReserve => (EventKind::VmmReserve, out0, args[1], args[3], args[2]),
        A::cuMemAddressFree => (EventKind::VmmAddressFree, args[0], args[1], 0, 0),
        A::cuArrayCreate_v2 => {
            // CUDA_ARRAY_DESCRIPTOR: width, height, format (i32), channels (u32).
            let size = if has_extra {
                array_bytes(extra[0], extra[1], 1, extra[2] as u32 as i32, (extra[2] >> 32) as u32)
            } else {
                0
            };
            (EventKind::Alloc, out0, size, 0, 0)
        }
        A::cuArray3DCreate_v2 | A::cuMipmappedArrayCreate => {
            // CUDA_ARRAY3D_DESCRIPTOR: width, height, depth, format (i32), channels (u32).
            let (w, h, d) = (extra[0], extra[1], extra[2]);
            let (format, channels) = (extra[3] as u32 as i32, (extra[3] >> 32) as u32);
            let size = if !has_extra {
                0
            } else if api == A::cuArray3DCreate_v2 {
                array_bytes(w, h, d, format, channels)
            } else {
                mipmapped_array_bytes(w, h, d, format, channels, args[2] as u32)
            };
            let aux = if api == A::cuMipmappedArrayCreate { u64::from(args[2] as u32) } else { 0 };
            (EventKind::Alloc, out0, size, aux, 0)
        }
        // The interposer sizes an IPC import with cuMemGetAddressRange; a probe cannot call
        // the driver, so the size is unknown (0). IPC memory is not in live bytes anyway.
        A::cuIpcOpenMemHandle | A::cuIpcOpenMemHandle_v2 => (EventKind::Alloc, out0, 0, 0, 0),
        A::cuMemImportFromShareableHandle => (EventKind::VmmCreate, 0, 0, out0, 0),
        A::cuMemGetInfo_v2 => (EventKind::MemInfo, out0, out1, 0, 0),
        // As `Event::stream_create` lays them out: priority, flags, the new stream.
        A::cuStreamCreate => (EventKind::StreamCreate, 0, 0, u64::from(args[1] as u32), out0),
        A::cuStreamCreateWithPriority => {
            (EventKind::StreamCreate, args[2] as u32 as i32 as i64 as u64, 0, u64::from(args[1] as u32), out0)
        }
        A::cuStreamDestroy | A::cuStreamDestroy_v2 => (EventKind::StreamDestroy, 0, 0, 0, args[0]),
        _ => return Err(DecodeError::Api(code)),
    };
    ev.kind = kind.code();
    ev.addr = addr;
    ev.size = size;
    ev.aux = aux;
    ev.stream = stream;
    Ok(Wire { event: ev, entry_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A successful call of `api` by pid 1, tid 1 at 1 ns, with nothing read beyond its
    /// arguments: each test sets what it is about.
    fn call(api: Api, args: [u64; 5]) -> WireRecord {
        WireRecord { ts_ns: 1, tgid: 1, tid: 1, api: api.code().into(), args, entry_ns: 1, ..WireRecord::default() }
    }

    #[test]
    fn alloc_reads_the_out_pointer_only_on_success() {
        let alloc = WireRecord {
            ts_ns: 5,
            tgid: 10,
            tid: 11,
            out: [0xabc, 0],
            flags: OUT0,
            ..call(Api::cuMemAlloc_v2, [0x7f00, 4096, 0, 0, 0])
        };
        let e = decode(&alloc.encode()).unwrap().event;
        assert_eq!(
            (e.kind(), e.addr, e.size, e.pid, e.tid, e.result),
            (Some(EventKind::Alloc), 0xabc, 4096, 10, 11, 0)
        );
        let oom = WireRecord { result: 2, args: [0x7f00, 1 << 40, 0, 0, 0], ..alloc };
        let e = decode(&oom.encode()).unwrap().event;
        assert_eq!((e.addr, e.size, e.result, e.is_oom()), (0, 1 << 40, 2, true));
    }

    #[test]
    fn pitch_and_arrays_are_sized_like_the_interposer() {
        let pitch =
            WireRecord { out: [0x100, 1024], flags: OUT0 | OUT1, ..call(Api::cuMemAllocPitch_v2, [1, 2, 1000, 10, 4]) };
        let e = decode(&pitch.encode()).unwrap().event;
        assert_eq!((e.addr, e.size, e.aux), (0x100, 10240, 1024));
        // 2D array: 100 x 10, float (0x20) x 4 channels
        let array = WireRecord {
            out: [0x55, 0],
            extra: [100, 10, 0x20 | (4 << 32), 0],
            flags: OUT0 | EXTRA,
            ..call(Api::cuArrayCreate_v2, [1, 2, 0, 0, 0])
        };
        assert_eq!(decode(&array.encode()).unwrap().event.size, 100 * 10 * 16);
        // mipmapped: 8x8x0, 2 levels, u8 x 1
        let mipmapped = WireRecord {
            out: [0x55, 0],
            extra: [8, 8, 0, 0x01 | (1 << 32)],
            flags: OUT0 | EXTRA,
            ..call(Api::cuMipmappedArrayCreate, [1, 2, 2, 0, 0])
        };
        let e = decode(&mipmapped.encode()).unwrap().event;
        assert_eq!((e.size, e.aux), (64 + 16, 2));
    }

    #[test]
    fn fields_come_back_as_written() {
        let r = WireRecord {
            ts_ns: 9,
            tgid: 7,
            tid: 8,
            api: 3,
            result: -1,
            args: [1, 2, 3, 4, 5],
            out: [6, 7],
            extra: [8, 9, 10, 11],
            flags: 12,
            entry_ns: 13,
        };
        assert_eq!(WireRecord::parse(&r.encode()), Ok(r));
    }

    #[test]
    fn hostile_records_are_refused() {
        assert_eq!(decode(&[0u8; 64]), Err(DecodeError::Length(64)));
        let mut b = call(Api::cuMemAlloc_v2, [0; 5]).encode();
        b[116] ^= 1;
        assert!(matches!(decode(&b), Err(DecodeError::Magic(_))));
        let b = call(Api::Interposer, [0; 5]).encode();
        assert_eq!(decode(&b), Err(DecodeError::Api(0xFFFF)));
        let b = WireRecord { tgid: 0, ..call(Api::cuMemAlloc_v2, [0; 5]) }.encode();
        assert_eq!(decode(&b), Err(DecodeError::Pid));
        // Any bytes of the right length decode or are refused, never panic.
        for seed in 0..2000u64 {
            let mut b = [0u8; WIRE_SIZE];
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            b[116..120].copy_from_slice(&WIRE_MAGIC.to_le_bytes());
            b[16..20].copy_from_slice(&((seed % 32) as u32).to_le_bytes());
            let _ = decode(&b);
        }
    }

    #[test]
    fn streams_decode_as_the_interposer_records_them() {
        let made = WireRecord {
            out: [0x5a00, 0],
            flags: OUT0,
            ..call(Api::cuStreamCreateWithPriority, [0x7f10, 1, (-3i32) as u32 as u64, 0, 0])
        };
        let e = decode(&made.encode()).unwrap().event;
        let want = Event::stream_create(Api::cuStreamCreateWithPriority, 0x5a00, 1, -3);
        assert_eq!(
            (e.kind(), e.cuda_stream(), e.stream_flags(), e.stream_priority(), e.addr, e.size, e.aux),
            (want.kind(), 0x5a00, 1, -3, want.addr, want.size, want.aux)
        );
        let failed = WireRecord { result: 1, ..made };
        assert_eq!(decode(&failed.encode()).unwrap().event.cuda_stream(), 0, "no stream when the call failed");
        let gone = call(Api::cuStreamDestroy, [0x5a00, 0, 0, 0, 0]);
        let e = decode(&gone.encode()).unwrap().event;
        assert_eq!((e.kind(), e.cuda_stream()), (Some(EventKind::StreamDestroy), 0x5a00));
    }

    #[test]
    fn create_takes_the_device_from_its_properties() {
        let create = WireRecord {
            out: [0x77, 0],
            extra: [1, 0, 0, 0],
            flags: OUT0 | EXTRA,
            ..call(Api::cuMemCreate, [1, 2 << 20, 3, 0, 0])
        };
        let e = decode(&create.encode()).unwrap().event;
        assert_eq!((e.kind(), e.device, e.size, e.aux), (Some(EventKind::VmmCreate), 1, 2 << 20, 0x77));
    }
}
