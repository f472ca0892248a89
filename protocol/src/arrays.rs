//! Device bytes of CUDA arrays. Arrays are opaque handles whose size the driver does not
//! report, so their bytes are an estimate (documented in the README): width × height ×
//! depth × the element's bytes, summed over the levels of a mipmapped array. One rule for
//! the interposer and the eBPF decoder, so both modes count an array alike; the simulated
//! driver charges the same.

/// Bytes per element of a `CUarray_format` times `channels` (an unknown format counts 1).
#[inline]
pub fn element_bytes(format: i32, channels: u32) -> u64 {
    let per = match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 1,
    };
    per * u64::from(channels.max(1))
}

/// One array (or one level): a 0 extent counts as 1 (1D and 2D arrays leave height and
/// depth 0). Saturates instead of wrapping on hostile extents.
#[inline]
pub fn array_bytes(width: u64, height: u64, depth: u64, format: i32, channels: u32) -> u64 {
    width
        .max(1)
        .saturating_mul(height.max(1))
        .saturating_mul(depth.max(1))
        .saturating_mul(element_bytes(format, channels))
}

/// A mipmapped array of `levels` levels (clamped to 1..=64), each level halving every
/// non-zero extent down to 1.
pub fn mipmapped_array_bytes(width: u64, height: u64, depth: u64, format: i32, channels: u32, levels: u32) -> u64 {
    let shrink = |v: u64, level: u32| if v == 0 { 0 } else { (v >> level).max(1) };
    (0..levels.clamp(1, 64))
        .map(|l| array_bytes(shrink(width, l), shrink(height, l), shrink(depth, l), format, channels))
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOAT: i32 = 0x20;
    const HALF: i32 = 0x10;

    #[test]
    fn an_array_is_its_extents_times_its_element() {
        assert_eq!(element_bytes(FLOAT, 4), 16);
        assert_eq!(element_bytes(HALF, 0), 2, "0 channels count as 1");
        assert_eq!(element_bytes(0x7f, 2), 2, "an unknown format counts 1 byte");
        assert_eq!(array_bytes(1024, 0, 0, FLOAT, 1), 4096, "a 1D array: height and depth 0");
        assert_eq!(array_bytes(64, 32, 2, HALF, 2), 64 * 32 * 2 * 4);
    }

    #[test]
    fn mipmap_levels_halve_each_extent_down_to_one() {
        // 8x4 floats: levels 8x4, 4x2, 2x1, 1x1 (then clamped at 1).
        let levels = [8 * 4, 4 * 2, 2, 1, 1].map(|n| n * 4);
        assert_eq!(mipmapped_array_bytes(8, 4, 0, FLOAT, 1, 5), levels.iter().sum::<u64>());
        assert_eq!(mipmapped_array_bytes(8, 4, 0, FLOAT, 1, 0), 8 * 4 * 4, "0 levels count as 1");
        assert_eq!(mipmapped_array_bytes(1, 1, 1, FLOAT, 1, 1000), 64 * 4, "at most 64 levels");
    }

    #[test]
    fn hostile_extents_saturate() {
        assert_eq!(array_bytes(u64::MAX, 2, 2, FLOAT, 4), u64::MAX);
        assert_eq!(mipmapped_array_bytes(u64::MAX, u64::MAX, 1, FLOAT, 4, 64), u64::MAX);
    }
}
