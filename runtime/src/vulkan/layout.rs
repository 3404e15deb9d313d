//! The arithmetic of the backend, free of Vulkan calls: device choice, the IO buffer's layout,
//! descriptor ranges and push-constant words, and where barriers go.

use crate::backend::DeviceChoice;
use std::ops::Range;

/// Graph inputs and outputs start at multiples of this in the IO buffer (the compiler's
/// `IO_ALIGN`: it predicts the buffer's size with the same rule).
pub const IO_ALIGN: u64 = 16;

/// How much `DeviceChoice::Best` prefers a device type (`VkPhysicalDeviceType` as our kind
/// names): discrete > integrated > virtual, the hardware devices it picks among; 0 for the
/// kinds it never picks. A CPU-type device (lavapipe, SwiftShader) runs Ingot's models several
/// times slower and in several times the memory of Ingot's own CPU backend, so it is used only
/// where the list names it (`vulkan:cpu`, `vulkan:N`); an "other" device only by index.
pub fn rank(kind: &str) -> u8 {
    match kind {
        "discrete" => 3,
        "integrated" => 2,
        "virtual" => 1,
        _ => 0,
    }
}

/// Why [`pick`] found no device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unpicked {
    /// No device fits the choice.
    None,
    /// `DeviceChoice::Best` found no usable hardware device, only the usable CPU-type devices
    /// at these indices (which it never picks).
    CpuTypeOnly(Vec<usize>),
}

/// The index `choice` picks among `devices` (each one's kind name and whether Ingot can use
/// it, in enumeration order): for `Best` the first usable device of the highest [`rank`]
/// above 0, for `CpuType` the first usable CPU-type device, for `Index` that index whether
/// usable or not (the caller says why not).
pub fn pick(devices: &[(&str, bool)], choice: &DeviceChoice) -> Result<usize, Unpicked> {
    let usable = |kind: fn(&str) -> bool| {
        devices.iter().enumerate().filter(move |(_, (k, usable))| *usable && kind(k))
    };
    match choice {
        // The first of the best rank: `max_by_key` would keep the last.
        DeviceChoice::Best => usable(|k| rank(k) > 0)
            .min_by_key(|(i, (k, _))| (std::cmp::Reverse(rank(k)), *i))
            .map(|(i, _)| i)
            .ok_or_else(|| {
                let cpus: Vec<usize> = usable(|k| k == "cpu").map(|(i, _)| i).collect();
                if cpus.is_empty() { Unpicked::None } else { Unpicked::CpuTypeOnly(cpus) }
            }),
        DeviceChoice::Index(i) => (*i < devices.len()).then_some(*i).ok_or(Unpicked::None),
        DeviceChoice::CpuType => {
            usable(|k| k == "cpu").map(|(i, _)| i).next().ok_or(Unpicked::None)
        }
    }
}

/// Byte ranges of tensors of `bytes` laid one after another at [`IO_ALIGN`]-aligned offsets,
/// and the total size (the sum of the aligned sizes). `None` on overflow.
pub fn io_layout(bytes: impl IntoIterator<Item = u64>) -> Option<(Vec<Range<u64>>, u64)> {
    let mut end = 0u64;
    let mut ranges = Vec::new();
    for b in bytes {
        ranges.push(end..end.checked_add(b)?);
        end = end.checked_add(b.checked_next_multiple_of(IO_ALIGN)?)?;
    }
    Some((ranges, end))
}

/// The range to bind for a tensor of `bytes` at byte `start` of its buffer: it starts at the
/// largest multiple of `alignment` (a power of two) at or below `start`, and ends at the
/// tensor's end rounded up to a whole 4-byte word. Returns (offset, range).
pub fn descriptor_range(start: u64, bytes: u64, alignment: u64) -> (u64, u64) {
    let offset = start - start % alignment.max(1);
    let end = (start + bytes).next_multiple_of(4);
    (offset, end - offset)
}

/// Bytes `start..end` of buffer `buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub buffer: usize,
    pub start: u64,
    pub end: u64,
}

impl Region {
    /// The region of whole 4-byte words that holds `bytes`: kernels access memory in words,
    /// so two tensors that share a word conflict.
    pub fn words(buffer: usize, bytes: Range<u64>) -> Region {
        Region { buffer, start: bytes.start - bytes.start % 4, end: bytes.end.next_multiple_of(4) }
    }

    fn overlaps(&self, other: &Region) -> bool {
        self.buffer == other.buffer && self.start < other.end && other.start < self.end
    }
}

/// The accesses since the last barrier, to put a barrier only before a dispatch that depends on
/// one of them: one that reads or writes what an earlier dispatch wrote (read-after-write,
/// write-after-write) or writes what an earlier dispatch read (write-after-read).
#[derive(Debug, Default)]
pub struct Hazards {
    reads: Vec<Region>,
    writes: Vec<Region>,
}

impl Hazards {
    /// Records a dispatch that reads `reads` and writes `writes`; returns whether a barrier
    /// must come before it (the earlier accesses are then forgotten).
    pub fn dispatch(&mut self, reads: &[Region], writes: &[Region]) -> bool {
        let after_write =
            reads.iter().chain(writes).any(|r| self.writes.iter().any(|w| w.overlaps(r)));
        let after_read = writes.iter().any(|w| self.reads.iter().any(|r| r.overlaps(w)));
        let barrier = after_write || after_read;
        if barrier {
            self.reads.clear();
            self.writes.clear();
        }
        self.reads.extend_from_slice(reads);
        self.writes.extend_from_slice(writes);
        barrier
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_rank_discrete_first_and_cpu_type_not_at_all() {
        let mut kinds = ["integrated", "discrete", "virtual"];
        kinds.sort_by_key(|k| std::cmp::Reverse(rank(k)));
        assert_eq!(kinds, ["discrete", "integrated", "virtual"]);
        assert!(kinds.iter().all(|k| rank(k) > 0));
        assert_eq!((rank("cpu"), rank("other")), (0, 0));
    }

    #[test]
    fn the_best_device_is_a_usable_gpu_never_a_cpu_type_one() {
        let best = |devices: &[(&str, bool)]| pick(devices, &DeviceChoice::Best);
        // Discrete over integrated over virtual, whatever the order; the first of a rank.
        let gpus =
            [("virtual", true), ("integrated", true), ("discrete", true), ("discrete", true)];
        assert_eq!(best(&gpus), Ok(2));
        assert_eq!(best(&[("cpu", true), ("integrated", true), ("virtual", true)]), Ok(1));
        // An unusable device is passed over.
        assert_eq!(best(&[("discrete", false), ("cpu", true), ("virtual", true)]), Ok(2));
        // CPU-type devices alone: none is picked, and the usable ones are named.
        let cpus = [("cpu", true), ("discrete", false), ("cpu", false), ("cpu", true)];
        assert_eq!(best(&cpus), Err(Unpicked::CpuTypeOnly(vec![0, 3])));
        assert_eq!(best(&[("cpu", true)]), Err(Unpicked::CpuTypeOnly(vec![0])));
        // No device, no usable one, or only kinds `vulkan` never picks.
        assert_eq!(best(&[]), Err(Unpicked::None));
        assert_eq!(best(&[("cpu", false), ("discrete", false)]), Err(Unpicked::None));
        assert_eq!(best(&[("other", true)]), Err(Unpicked::None));
    }

    #[test]
    fn cpu_type_devices_are_picked_by_name() {
        let devices = [("discrete", true), ("cpu", false), ("cpu", true), ("integrated", true)];
        assert_eq!(pick(&devices, &DeviceChoice::CpuType), Ok(2));
        assert_eq!(pick(&devices[..2], &DeviceChoice::CpuType), Err(Unpicked::None));
        // By index, usable or not (the caller says why not), and only where one exists.
        assert_eq!(pick(&devices, &DeviceChoice::Index(2)), Ok(2));
        assert_eq!(pick(&devices, &DeviceChoice::Index(1)), Ok(1));
        assert_eq!(pick(&devices, &DeviceChoice::Index(4)), Err(Unpicked::None));
    }

    #[test]
    fn io_tensors_start_at_16_byte_multiples() {
        let (ranges, total) = io_layout([12, 0, 16, 1]).unwrap();
        assert_eq!(ranges, [0..12, 16..16, 16..32, 32..33]);
        assert_eq!(total, 48);
        assert_eq!(io_layout([u64::MAX]), None);
    }

    #[test]
    fn descriptor_ranges_start_aligned_and_end_on_a_word() {
        // Tensor at 100, 10 bytes, alignment 16: bound from 96 to 112 (110 rounded up).
        assert_eq!(descriptor_range(100, 10, 16), (96, 16));
        assert_eq!(descriptor_range(64, 32, 64), (64, 32));
        assert_eq!(descriptor_range(260, 8, 256), (256, 12));
        assert_eq!(descriptor_range(0, 3, 16), (0, 4));
    }

    #[test]
    fn barriers_only_between_conflicting_dispatches() {
        let r = |buffer, start, end| Region::words(buffer, start..end);
        let mut h = Hazards::default();
        // a -> b in the arena, then c reads the weight and writes elsewhere: no conflict.
        assert!(!h.dispatch(&[r(0, 0, 64)], &[r(1, 0, 64)]));
        assert!(!h.dispatch(&[r(0, 0, 64)], &[r(1, 64, 128)]));
        // Read after write.
        assert!(h.dispatch(&[r(1, 0, 16)], &[r(1, 128, 192)]));
        // Write after read (of 1:0..16 by the previous dispatch).
        assert!(h.dispatch(&[], &[r(1, 8, 12)]));
        // Write after write.
        assert!(h.dispatch(&[], &[r(1, 8, 12)]));
        // Same bytes in another buffer, and bytes sharing no word: no conflict.
        assert!(!h.dispatch(&[r(2, 8, 12)], &[r(1, 12, 16)]));
        // A tensor sharing a word with a written one conflicts.
        assert!(h.dispatch(&[r(1, 15, 16)], &[]));
        // In place: reading and writing the same bytes in one dispatch needs no barrier, and
        // after a barrier only what came after it counts.
        assert!(!h.dispatch(&[r(3, 0, 4)], &[r(3, 0, 4)]));
        assert!(!h.dispatch(&[r(1, 8, 12)], &[]));
    }
}
