//! Numpy multidirectional broadcasting, planned once in `prepare`.
//!
//! The output is walked in blocks along its innermost dimension. Adjacent dimensions are merged
//! wherever every input allows it, so the common cases become few long blocks: same shapes or
//! a scalar operand give one block of the whole tensor; a per-channel `[C,1,1]` against
//! `[N,C,H,W]` gives `N*C` blocks of `H*W` in which the channel value repeats. Inside a block
//! each input is either read contiguously or holds one element that repeats.

use crate::cpu::KernelError;
use crate::invalid;
use std::ops::Range;

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Broadcast<const K: usize> {
    /// Outer dimensions, outermost first: extent and each input's element stride along it.
    outer: Vec<(usize, [usize; K])>,
    /// Output elements per block (0 when the output is empty).
    block: usize,
    /// Elements of each input one block reads: `block`, or 1 when the input repeats.
    lens: [usize; K],
    /// Elements of each input and of the output, to check run-time tensors against.
    sizes: [usize; K],
    total: usize,
}

impl<const K: usize> Broadcast<K> {
    /// Plans how `inputs` broadcast to `out`; errors unless each input broadcasts to it.
    pub fn new(inputs: [&[usize]; K], out: &[usize]) -> Result<Self, KernelError> {
        let rank = out.len();
        // Each input's element strides in output coordinates, 0 along broadcast dimensions.
        let mut strides = [(); K].map(|_| vec![0usize; rank]);
        for (shape, st) in inputs.iter().zip(&mut strides) {
            let off = rank.checked_sub(shape.len()).ok_or_else(|| {
                invalid!("shape {shape:?} does not broadcast to {out:?}: rank too high")
            })?;
            let mut step = 1;
            for (d, &n) in shape.iter().enumerate().rev() {
                let o = out[off + d];
                if n == o {
                    st[off + d] = step;
                } else if n != 1 {
                    return Err(invalid!("shape {shape:?} does not broadcast to {out:?}"));
                }
                step *= n;
            }
        }
        let total = out.iter().product();
        let sizes = inputs.map(|s| s.iter().product());
        if total == 0 {
            return Ok(Self { outer: Vec::new(), block: 0, lens: [0; K], sizes, total });
        }
        // Drop unit dimensions; merge a dimension into the previous one when every input
        // steps through both as through one (contiguously, or not at all).
        let mut dims: Vec<(usize, [usize; K])> = Vec::new();
        for (d, &n) in out.iter().enumerate().filter(|&(_, &n)| n != 1) {
            let st: [usize; K] = std::array::from_fn(|k| strides[k][d]);
            match dims.last_mut() {
                Some(last) if (0..K).all(|k| last.1[k] == st[k] * n) => *last = (last.0 * n, st),
                _ => dims.push((n, st)),
            }
        }
        // The innermost stride of every input is 0 or 1: its later dimensions are all 1.
        let (block, inner) = dims.pop().unwrap_or((1, [0; K]));
        Ok(Self {
            outer: dims,
            block,
            lens: inner.map(|s| if s == 0 { 1 } else { block }),
            sizes,
            total,
        })
    }

    /// Errors unless run-time tensors have the element counts this plan was made for.
    pub fn check(&self, sizes: [usize; K], total: usize) -> Result<(), KernelError> {
        if sizes != self.sizes || total != self.total {
            return Err(invalid!(
                "prepared for inputs of {:?} elements and an output of {}, got {sizes:?} and {total}",
                self.sizes,
                self.total
            ));
        }
        Ok(())
    }

    /// The blocks in output order: `(input ranges, output range)`. An input range has the
    /// block's length, or length 1 when that input repeats along the block.
    pub fn blocks(&self) -> Blocks<'_, K> {
        Blocks { plan: self, idx: vec![0; self.outer.len()], off: [0; K], out: 0 }
    }
}

/// The walk over a [`Broadcast`] plan's blocks: an odometer over the outer dimensions.
pub(super) struct Blocks<'a, const K: usize> {
    plan: &'a Broadcast<K>,
    idx: Vec<usize>,
    /// Each input's offset, and the output's, at the next block.
    off: [usize; K],
    out: usize,
}

impl<const K: usize> Iterator for Blocks<'_, K> {
    type Item = ([Range<usize>; K], Range<usize>);

    /// Not inlined: the walk is compiled once per arity instead of into every op and type's
    /// kernel (it was 1.2 MB of an app binary), and a block's loop dwarfs the call.
    #[inline(never)]
    fn next(&mut self) -> Option<Self::Item> {
        let plan = self.plan;
        if self.out >= plan.total {
            return None;
        }
        let off = self.off;
        let item = (
            std::array::from_fn(|k| off[k]..off[k] + plan.lens[k]),
            self.out..self.out + plan.block,
        );
        self.out += plan.block;
        // Advance the odometer, innermost dimension first.
        for (d, (n, st)) in plan.outer.iter().enumerate().rev() {
            self.idx[d] += 1;
            if self.idx[d] < *n {
                self.off.iter_mut().zip(st).for_each(|(o, s)| *o += s);
                break;
            }
            self.idx[d] = 0;
            self.off.iter_mut().zip(st).for_each(|(o, s)| *o -= s * (n - 1));
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (input offsets, output offset) the plan visits, element by element.
    fn visits<const K: usize>(bc: &Broadcast<K>) -> Vec<([usize; K], usize)> {
        let mut v = Vec::new();
        for (ins, out) in bc.blocks() {
            for (j, o) in out.enumerate() {
                let at = std::array::from_fn(|k| {
                    let r = &ins[k];
                    if r.len() == 1 { r.start } else { r.start + j }
                });
                v.push((at, o));
            }
        }
        v
    }

    /// The same, by the definition: unravel each output index and ravel it into each input.
    fn reference<const K: usize>(ins: [&[usize]; K], out: &[usize]) -> Vec<([usize; K], usize)> {
        let total: usize = out.iter().product();
        (0..total)
            .map(|o| {
                let mut rem = o;
                let mut idx = vec![0; out.len()];
                for d in (0..out.len()).rev() {
                    idx[d] = rem % out[d];
                    rem /= out[d];
                }
                let at = std::array::from_fn(|k| {
                    let s = ins[k];
                    let off = out.len() - s.len();
                    s.iter()
                        .enumerate()
                        .fold(0, |acc, (d, &n)| acc * n + if n == 1 { 0 } else { idx[off + d] })
                });
                (at, o)
            })
            .collect()
    }

    #[test]
    fn common_cases_become_few_long_blocks() {
        // Same shape: one block.
        let same = Broadcast::new([&[2, 3, 4], &[2, 3, 4]], &[2, 3, 4]).unwrap();
        assert_eq!((same.outer.len(), same.block, same.lens), (0, 24, [24, 24]));
        // Scalar operand: one block, the scalar repeats.
        let scalar = Broadcast::new([&[2, 3, 4], &[]], &[2, 3, 4]).unwrap();
        assert_eq!((scalar.outer.len(), scalar.block, scalar.lens), (0, 24, [24, 1]));
        // Per-channel: N*C blocks of H*W.
        let chan = Broadcast::new([&[2, 3, 4, 5], &[3, 1, 1]], &[2, 3, 4, 5]).unwrap();
        assert_eq!(chan.outer, vec![(2, [60, 0]), (3, [20, 1])]);
        assert_eq!((chan.block, chan.lens), (20, [20, 1]));
    }

    #[test]
    fn every_element_is_visited_like_numpy() {
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[2, 3, 4], &[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[], &[2, 3, 4]),
            (&[2, 3, 4, 5], &[3, 1, 1], &[2, 3, 4, 5]),
            (&[3, 1], &[1, 4], &[3, 4]),
            (&[2, 1, 4], &[3, 1], &[2, 3, 4]),
            (&[1, 1, 5], &[5, 1, 1], &[5, 1, 5]),
            (&[1], &[1], &[1]),
            (&[], &[], &[]),
            (&[2, 1, 3, 1], &[1, 4, 1, 2], &[2, 4, 3, 2]),
        ];
        for &(a, b, out) in cases {
            let bc = Broadcast::new([a, b], out).unwrap();
            assert_eq!(visits(&bc), reference([a, b], out), "{a:?} {b:?} -> {out:?}");
        }
        let three = Broadcast::new([&[4, 1], &[1, 3], &[]], &[4, 3]).unwrap();
        assert_eq!(visits(&three), reference([&[4, 1], &[1, 3], &[]], &[4, 3]));
    }

    #[test]
    fn empty_and_mismatched_shapes() {
        let empty = Broadcast::new([&[0, 3], &[3]], &[0, 3]).unwrap();
        assert!(visits(&empty).is_empty());
        assert!(Broadcast::new([&[2, 3], &[4]], &[2, 3]).is_err());
        assert!(Broadcast::new([&[2, 2, 3]], &[2, 3]).is_err());
        let bc = Broadcast::new([&[2, 3]], &[2, 3]).unwrap();
        assert!(bc.check([6], 6).is_ok());
        assert!(bc.check([5], 6).is_err());
    }
}
