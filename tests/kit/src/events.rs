//! Event streams for tests and benchmarks, built only through the protocol's per-kind
//! constructors (`Event::alloc`, `Event::vmm_map`, …).

use vramhook_protocol::record::{Api, Event, CUDA_ERROR_OUT_OF_MEMORY};

/// Where [`Stream::allocs_a_gib_apart`] starts.
pub const GIB_APART_BASE: u64 = 0x7f00_0000_0000;

/// `e` made by `pid`'s main thread at `ts` on `device`.
pub fn made(e: Event, pid: u32, ts: u64, device: i16) -> Event {
    e.by(pid, pid).at(ts).on_device(device)
}

/// One process's stream with a running clock (1 ms a step by default) and sequence, on
/// one device; it starts with a `process_start` (parent 1, start time `1000 + pid`).
pub struct Stream {
    pub pid: u32,
    pub seq: u64,
    pub ts: u64,
    pub step_ns: u64,
    pub device: i16,
    pub out: Vec<Event>,
}

impl Stream {
    pub fn new(pid: u32, start_ts: u64) -> Stream {
        let mut s = Stream { pid, seq: 0, ts: start_ts, step_ns: 1_000_000, device: 0, out: vec![] };
        s.push(Event::process_start(1, 1000 + u64::from(pid)));
        s
    }

    /// Adds `ev` as this process's next event, one step after the last.
    pub fn push(&mut self, ev: Event) -> &mut Self {
        self.ts += self.step_ns;
        self.out.push(made(ev, self.pid, self.ts, self.device).with_seq(self.seq));
        self.seq += 1;
        self
    }
    pub fn alloc(&mut self, api: Api, addr: u64, size: u64) -> &mut Self {
        self.push(Event::alloc(api, addr, size))
    }
    /// `n` plain allocations of `size` bytes, 1 GiB apart from 0x7f00_0000_0000.
    pub fn allocs_a_gib_apart(&mut self, n: u64, size: u64) -> &mut Self {
        for i in 0..n {
            self.alloc(Api::cuMemAlloc_v2, GIB_APART_BASE + i * (1 << 30), size);
        }
        self
    }
    pub fn oom(&mut self, api: Api, size: u64) -> &mut Self {
        self.push(Event::alloc(api, 0, size).with_result(CUDA_ERROR_OUT_OF_MEMORY))
    }
    pub fn free(&mut self, api: Api, addr: u64) -> &mut Self {
        self.push(Event::free(api, addr))
    }
    pub fn meminfo(&mut self, free: u64, total: u64) -> &mut Self {
        self.push(Event::mem_info(free, total))
    }
    pub fn reserve(&mut self, base: u64, size: u64) -> &mut Self {
        self.push(Event::vmm_reserve(base, size, 0, 0))
    }
    pub fn create(&mut self, handle: u64, size: u64) -> &mut Self {
        self.push(Event::vmm_create(Api::cuMemCreate, handle, size))
    }
    pub fn create_oom(&mut self, size: u64) -> &mut Self {
        self.push(Event::vmm_create(Api::cuMemCreate, 0, size).with_result(CUDA_ERROR_OUT_OF_MEMORY))
    }
    pub fn map(&mut self, addr: u64, size: u64, handle: u64) -> &mut Self {
        self.push(Event::vmm_map(addr, size, handle, 0))
    }
    pub fn unmap(&mut self, addr: u64, size: u64) -> &mut Self {
        self.push(Event::vmm_unmap(addr, size))
    }
    pub fn release(&mut self, handle: u64) -> &mut Self {
        self.push(Event::vmm_release(handle))
    }
    /// A `pool_sample`: the driver's reserved and used bytes of `pool` (`current`: the
    /// device's current pool, the one `cuMemAllocAsync` uses).
    pub fn pool_sample(&mut self, pool: u64, reserved: u64, used: u64, current: bool) -> &mut Self {
        self.push(Event::pool_sample(pool, reserved, used, current))
    }
    pub fn trim(&mut self, pool: u64, keep: u64) -> &mut Self {
        self.push(Event::pool_trim(pool, keep))
    }
}
