//! The body of the `ring_reader` fuzz target (`fuzz/`), also run over random rings by this
//! crate's tests: a reader must survive any bytes a hostile writer leaves in its ring.

use super::*;

/// Makes a valid ring (capacity and lanes from the first two bytes), lets `data` overwrite
/// its cursors, counters and slots, and drives a reader over it: polls of several sizes,
/// with the writer alive and gone, commits, and a restart told some `seq`s were recorded.
pub fn ring_reader(data: &[u8]) {
    let (Some(&shape), Some(&lanes)) = (data.first(), data.get(1)) else { return };
    let capacity = 16u64 << (shape % 5);
    let lanes = 1u32 << (lanes % 5);
    let len = ring_file_size_lanes(capacity, lanes);
    let mut mem = vec![0u64; len / 8];
    let base = mem.as_mut_ptr() as *mut u8;
    let init = RingInit { capacity, pid: 7, ..RingInit::default() };
    // SAFETY: a zeroed, 8-byte aligned buffer of the ring's size, ours alone.
    unsafe { writer::RingWriter::init_lanes(base, &init, lanes, b"fuzz") };
    // The rest of the input lands on the cursors and counters (from the header's write
    // cursor on) and then on the slots.
    let rest = &data[2..];
    let cursors = std::mem::offset_of!(RingHeader, write_pos);
    let header_part = rest.len().min(META_OFFSET - cursors);
    // SAFETY: inside the buffer (META_OFFSET < HEADER_SIZE <= len).
    unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), base.add(cursors), header_part) };
    let slots = &rest[header_part..];
    let n = slots.len().min(len - HEADER_SIZE);
    // SAFETY: inside the buffer.
    unsafe { std::ptr::copy_nonoverlapping(slots.as_ptr(), base.add(HEADER_SIZE), n) };

    // SAFETY: the buffer outlives both readers.
    let Ok(mut reader) = (unsafe { RingReader::new(base, len, None) }) else { return };
    let _ = reader.check_claims(u64::MAX);
    reader.auto_commit = false;
    let mut seqs = vramhook_protocol::seqset::SeqSet::new();
    for (round, max) in [1usize, 7, 64, usize::MAX].into_iter().enumerate() {
        reader.set_generation(round as u64 + 1);
        reader.poll(max, round == 3, |e| {
            if e.kind != vramhook_protocol::record::EventKind::Dropped.code() {
                seqs.insert(e.seq);
            }
        });
        let _ = reader.pending();
        if round == 1 {
            reader.commit(1);
        }
    }
    let _ = reader.unconfirmed_seqs();
    drop(reader);
    // SAFETY: as above.
    let Ok(mut restarted) = (unsafe { RingReader::new(base, len, None) }) else { return };
    restarted.skip_recorded(seqs);
    restarted.poll(usize::MAX, true, |_| {});
    restarted.commit_all();
    restarted.mark_recorded();
}
