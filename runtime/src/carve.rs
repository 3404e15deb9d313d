//! One buffer cut at the ranges a piece of work writes: those become exclusive slices, the
//! gaps between them shared ones, without copies or unsafe code. A read that overlaps a
//! written range is refused (it would alias).

use std::ops::Range;

pub(crate) struct Carved<'a> {
    gaps: Vec<(usize, &'a [u8])>,
    written: Vec<(Range<usize>, Option<&'a mut [u8]>)>,
}

impl<'a> Carved<'a> {
    /// `None` if two written ranges overlap or one lies outside `bytes`.
    pub(crate) fn new(
        bytes: &'a mut [u8],
        writes: impl IntoIterator<Item = Range<usize>>,
    ) -> Option<Carved<'a>> {
        let mut ranges: Vec<Range<usize>> = writes.into_iter().filter(|r| !r.is_empty()).collect();
        ranges.sort_by_key(|r| r.start);
        ranges.dedup();
        let mut gaps = Vec::new();
        let mut written = Vec::new();
        let mut rest = bytes;
        let mut at = 0;
        for r in ranges {
            if r.start < at || r.end > at + rest.len() {
                return None;
            }
            let (gap, tail) = rest.split_at_mut(r.start - at);
            let (out, tail) = tail.split_at_mut(r.len());
            gaps.push((at, &*gap));
            written.push((r.clone(), Some(out)));
            at = r.end;
            rest = tail;
        }
        gaps.push((at, &*rest));
        Some(Carved { gaps, written })
    }

    /// The bytes of `r`, if no written range overlaps them.
    pub(crate) fn read(&self, r: &Range<usize>) -> Option<&'a [u8]> {
        if r.is_empty() {
            // Empty, but 8-byte aligned like every arena offset, so typed views accept it.
            return Some(bytemuck::cast_slice::<u64, u8>(&[]));
        }
        self.gaps.iter().find_map(|&(start, gap)| {
            (r.start >= start && r.end <= start + gap.len())
                .then(|| &gap[r.start - start..r.end - start])
        })
    }

    /// The written range `r`, once.
    pub(crate) fn take(&mut self, r: &Range<usize>) -> Option<&'a mut [u8]> {
        if r.is_empty() {
            return Some(bytemuck::cast_slice_mut::<u64, u8>(&mut []));
        }
        self.written.iter_mut().find(|(w, _)| w == r).and_then(|(_, slot)| slot.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_come_from_gaps_and_writes_are_taken_once() {
        let mut buf = [0u8, 1, 2, 3, 4, 5, 6, 7];
        let mut c = Carved::new(&mut buf, [4..6, 0..2]).unwrap();
        assert_eq!(c.read(&(2..4)), Some(&[2u8, 3][..]));
        assert_eq!(c.read(&(6..8)), Some(&[6u8, 7][..]));
        assert_eq!(c.read(&(1..3)), None, "overlaps a written range");
        assert_eq!(c.take(&(4..6)).map(|w| w.to_vec()), Some(vec![4, 5]));
        assert!(c.take(&(4..6)).is_none(), "taken once");
        assert!(c.take(&(2..4)).is_none(), "not a written range");
    }

    #[test]
    fn overlapping_or_outside_writes_are_refused() {
        let mut buf = [0u8; 8];
        assert!(Carved::new(&mut buf, [0..4, 2..6]).is_none());
        assert!(Carved::new(&mut buf, std::iter::once(6..10)).is_none());
    }
}
