//! Which scale (and zero point) each element of a quantized tensor takes: one for the whole
//! tensor, one per index along `axis`, or one per block of `block` indices along it (the scale
//! then has X's shape with that dim `ceil(dim / block)`). Parsed once from the shapes, for
//! inference and both backends' kernels.

use std::ops::Range;

/// How the scales cover X.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Per {
    Tensor,
    Axis,
    /// Blocks of this many indices along the axis.
    Block(usize),
}

/// X as `[outer, dim, inner]` around the quantization axis, and how its scales cover it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scales {
    pub per: Per,
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
}

/// How the scale index moves along a piece of consecutive elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Every element of the piece takes the same scale.
    Same,
    /// Element j of the piece takes scale `first + j`.
    Each,
}

impl Scales {
    /// The layout of `scale` for an X of shape `x` quantized along `axis` (canonical, in
    /// range) in blocks of `block` (0: per tensor or per axis, told by the scale's shape).
    pub fn new(x: &[usize], scale: &[usize], axis: usize, block: usize) -> Result<Scales, String> {
        let count: usize = scale.iter().product();
        let (outer, dim, inner) = match x.get(axis) {
            Some(&dim) => (x[..axis].iter().product(), dim, x[axis + 1..].iter().product()),
            None => (1, x.iter().product(), 1),
        };
        let whole = Scales { per: Per::Tensor, outer: 1, dim: outer * dim * inner, inner: 1 };
        if block == 0 {
            return match scale {
                _ if count == 1 && scale.len() <= 1 => Ok(whole),
                [n] if axis < x.len() && *n == dim => {
                    Ok(Scales { per: Per::Axis, outer, dim, inner })
                }
                _ => Err(format!(
                    "a scale of shape {scale:?} is neither one value nor one per index of axis \
                     {axis} of {x:?}"
                )),
            };
        }
        let fits = axis < x.len()
            && scale.len() == x.len()
            && scale
                .iter()
                .zip(x)
                .enumerate()
                .all(|(i, (&s, &d))| if i == axis { s == d.div_ceil(block) } else { s == d });
        if !fits {
            return Err(format!(
                "a scale of shape {scale:?} does not hold one value per block of {block} along \
                 axis {axis} of {x:?}"
            ));
        }
        Ok(Scales { per: Per::Block(block), outer, dim, inner })
    }

    /// How many scales there are.
    pub fn len(&self) -> usize {
        match self.per {
            Per::Tensor => 1,
            Per::Axis => self.dim,
            Per::Block(b) => self.outer * self.dim.div_ceil(b) * self.inner,
        }
    }

    /// Splits elements `range` of X into pieces whose scales step alike:
    /// `f(piece, index of the piece's first scale, step)`. A piece never crosses a row of
    /// `inner` elements (or, for a last-axis quantization, of `dim`), so a piece costs a few
    /// divisions however long it is.
    pub fn pieces(&self, range: Range<usize>, mut f: impl FnMut(Range<usize>, usize, Step)) {
        let Scales { per, dim, inner, .. } = *self;
        let mut e = range.start;
        while e < range.end {
            let (end, first, step) = match per {
                Per::Tensor => (range.end, 0, Step::Same),
                Per::Axis if inner == 1 => (e - e % dim + dim, e % dim, Step::Each),
                Per::Axis => (e - e % inner + inner, (e / inner) % dim, Step::Same),
                Per::Block(b) if inner == 1 => {
                    let (o, d) = (e / dim, e % dim);
                    let end = (o * dim + (d - d % b + b).min(dim)).min(range.end);
                    (end, o * dim.div_ceil(b) + d / b, Step::Same)
                }
                Per::Block(b) => {
                    let (row, j) = (e / inner, e % inner);
                    let (o, d) = (row / dim, row % dim);
                    (e - j + inner, (o * dim.div_ceil(b) + d / b) * inner + j, Step::Each)
                }
            };
            let end = end.min(range.end);
            f(e..end, first, step);
            e = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each element's scale, as the pieces say.
    fn indices(s: &Scales, range: Range<usize>) -> Vec<usize> {
        let mut out = Vec::new();
        s.pieces(range, |piece, first, step| {
            for j in 0..piece.len() {
                out.push(if step == Step::Each { first + j } else { first });
            }
        });
        out
    }

    /// ONNX's reference, one element at a time: the scale broadcast or repeated to X's shape.
    fn reference(s: &Scales, e: usize) -> usize {
        let (o, d, i) = (e / (s.dim * s.inner), (e / s.inner) % s.dim, e % s.inner);
        match s.per {
            Per::Tensor => 0,
            Per::Axis => d,
            Per::Block(b) => (o * s.dim.div_ceil(b) + d / b) * s.inner + i,
        }
    }

    #[test]
    fn pieces_give_every_element_its_scale() {
        // X's shape, the scale's, the axis, the block size, and the layout they make.
        type Case = (&'static [usize], &'static [usize], usize, usize, Per);
        let cases: &[Case] = &[
            (&[2, 3, 4], &[], 1, 0, Per::Tensor),
            (&[2, 3, 4], &[1], 1, 0, Per::Tensor),
            (&[2, 3, 4], &[3], 1, 0, Per::Axis),
            (&[2, 3, 4], &[4], 2, 0, Per::Axis),
            (&[2, 5, 4], &[2, 3, 4], 1, 2, Per::Block(2)),
            (&[3, 7], &[3, 3], 1, 3, Per::Block(3)),
            (&[7, 3], &[3, 3], 0, 3, Per::Block(3)),
        ];
        for &(x, scale, axis, block, per) in cases {
            let s = Scales::new(x, scale, axis, block).unwrap();
            assert_eq!(s.per, per, "{x:?} {scale:?}");
            let n: usize = x.iter().product();
            let want: Vec<usize> = (0..n).map(|e| reference(&s, e)).collect();
            assert!(want.iter().all(|&i| i < s.len()), "{x:?} {scale:?}");
            assert_eq!(indices(&s, 0..n), want, "{x:?} {scale:?}");
            // Any piece of the elements, as parallel tasks cut them.
            for (lo, hi) in [(1, n - 1), (5, 6), (n / 2, n)] {
                assert_eq!(indices(&s, lo..hi), want[lo..hi], "{x:?} {scale:?} {lo}..{hi}");
            }
        }
    }

    #[test]
    fn misfit_scales_are_errors() {
        for (scale, block) in [(&[2][..], 0), (&[3, 1][..], 0), (&[2, 2][..], 0), (&[2, 2][..], 3)]
        {
            assert!(Scales::new(&[2, 3], scale, 1, block).is_err(), "{scale:?} {block}");
        }
        // A scalar X takes one scale only.
        assert_eq!(Scales::new(&[], &[], 0, 0).unwrap().len(), 1);
        assert!(Scales::new(&[], &[2], 0, 0).is_err());
    }
}
