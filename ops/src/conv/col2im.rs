//! Col2Im (opset 18): the inverse of im2col. Input `[N, C·K, L]` holds, for each of the L
//! positions of a block (a window of `block_shape`, K elements) sliding over an image of
//! `image_shape` (with `strides`, `dilations` and `pads`), that block's values; the output
//! `[N, C, image..]` sums every block's values into the pixels they cover. PyTorch's `Fold`
//! exports to it, and so does the overlap-add of an inverse STFT.
//!
//! Canonical form: `image_shape` and `block_shape` (constant inputs) as attributes, and
//! `strides`, `dilations` and `pads` explicit; one input. Both backends gather: each output
//! pixel sums, over the block's offsets in order, the block positions that put that offset on
//! it.

use crate::Node;
use crate::TensorDesc;
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut};
use crate::invalid;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::{AttrValue, Attrs, DType};

pub(super) fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let image = cx.const_ints(1, "image_shape")?;
    let block = cx.const_ints(2, "block_shape")?;
    let (Some(image), Some(block)) = (image, block) else {
        return Err(op_err!("image_shape and block_shape must be constants"));
    };
    let n = image.len();
    if n == 0 || block.len() != n {
        return Err(op_err!("image_shape {image:?} and block_shape {block:?} differ in length"));
    }
    let ones = vec![1; n];
    let strides = node.attrs.ints_opt("strides")?.map_or(ones.clone(), <[i64]>::to_vec);
    let dilations = node.attrs.ints_opt("dilations")?.map_or(ones, <[i64]>::to_vec);
    let pads = node.attrs.ints_opt("pads")?.map_or(vec![0; 2 * n], <[i64]>::to_vec);
    if strides.len() != n || dilations.len() != n || pads.len() != 2 * n {
        return Err(op_err!("strides, dilations and pads must have {n}, {n} and {} values", 2 * n));
    }
    let positive = |v: &[i64]| v.iter().all(|&v| v >= 1);
    if !positive(&image) || !positive(&block) || !positive(&strides) || !positive(&dilations) {
        return Err(op_err!("image_shape, block_shape, strides and dilations must be positive"));
    }
    if pads.iter().any(|&p| p < 0) {
        return Err(op_err!("pads {pads:?} must not be negative"));
    }
    let mut attrs = Attrs::new();
    for (name, v) in [
        ("image_shape", image),
        ("block_shape", block),
        ("strides", strides),
        ("dilations", dilations),
        ("pads", pads),
    ] {
        attrs.set(name, AttrValue::Ints(v));
    }
    node.attrs = attrs;
    node.inputs.truncate(1);
    Ok(())
}

pub(super) fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("has no input"))?;
    let g = Geometry::new(&node.attrs).map_err(|e| op_err!("{e}"))?;
    let k = g.block.iter().product::<usize>();
    match x.shape.as_slice() {
        &[n, ck, l] if ck % k == 0 && l == g.positions() && x.dtype.is_float() => {
            let shape = [&[n, ck / k][..], &g.image].concat();
            Ok(vec![TensorDesc::new(x.dtype, shape)])
        }
        _ => Err(op_err!(
            "input {} {:?} should be float [N, C x {k}, {}] for blocks {:?} over {:?}",
            x.dtype,
            x.shape,
            g.positions(),
            g.block,
            g.image
        )),
    }
}

/// The canonical attributes, as sizes.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub image: Vec<usize>,
    pub block: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    /// All begins, then all ends.
    pub pads: Vec<usize>,
}

impl Geometry {
    pub fn new(attrs: &Attrs) -> Result<Self, String> {
        let sizes = |name: &str| -> Result<Vec<usize>, String> {
            let v = attrs.ints(name).map_err(|e| e.to_string())?;
            Ok(v.iter().map(|&v| v.max(0) as usize).collect())
        };
        let g = Geometry {
            image: sizes("image_shape")?,
            block: sizes("block_shape")?,
            strides: sizes("strides")?,
            dilations: sizes("dilations")?,
            pads: sizes("pads")?,
        };
        let n = g.image.len();
        let positive = |v: &[usize]| v.len() == n && v.iter().all(|&v| v > 0);
        let fits = n > 0
            && positive(&g.image)
            && positive(&g.block)
            && positive(&g.strides)
            && positive(&g.dilations)
            && g.pads.len() == 2 * n;
        if !fits {
            return Err(format!("the geometry {g:?} is inconsistent"));
        }
        Ok(g)
    }

    /// How many positions the block takes along dim `d` (none where it does not fit).
    pub fn along(&self, d: usize) -> usize {
        let n = self.image.len();
        let padded = self.image[d] + self.pads[d] + self.pads[n + d];
        let span = self.dilations[d] * (self.block[d] - 1) + 1;
        if padded < span { 0 } else { (padded - span) / self.strides[d] + 1 }
    }

    /// L: the block's positions over the padded image.
    pub fn positions(&self) -> usize {
        (0..self.image.len()).map(|d| self.along(d)).product()
    }
}

struct Col2Im {
    g: Geometry,
    batch: usize,
    channels: usize,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let x = &cx.inputs[0];
    if x.dtype != DType::F32 {
        return Err(cx.dtype_error(x.dtype));
    }
    let g = Geometry::new(cx.attrs).map_err(|e| invalid!("Col2Im: {e}"))?;
    let k = g.block.iter().product::<usize>();
    let &[batch, ck, l] = x.shape.as_slice() else {
        return Err(invalid!("Col2Im of {:?}", x.shape));
    };
    if k == 0 || ck % k != 0 || l != g.positions() {
        return Err(invalid!("Col2Im of {:?} for blocks {:?}", x.shape, g.block));
    }
    Ok(Box::new(Col2Im { g, batch, channels: ck / k }))
}

impl Kernel for Col2Im {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let g = &self.g;
        let (k, l) = (g.block.iter().product::<usize>(), g.positions());
        let pixels = g.image.iter().product::<usize>();
        let planes = self.batch * self.channels;
        let x = input::<f32>(inputs, 0, planes * k * l)?;
        let y = output_mut::<f32>(outputs, 0, planes * pixels)?;
        let n = g.image.len();
        let along: Vec<usize> = (0..n).map(|d| g.along(d)).collect();
        let (mut p, mut o, mut b) = (vec![0; n], vec![0; n], vec![0; n]);
        for (plane, y) in y.chunks_exact_mut(pixels.max(1)).take(planes).enumerate() {
            let x = &x[plane * k * l..][..k * l];
            for (at, v) in y.iter_mut().enumerate() {
                unflatten(at, &g.image, &mut p);
                let mut sum = 0.0f32;
                for offset in 0..k {
                    unflatten(offset, &g.block, &mut o);
                    // The block position that puts offset `o` on pixel `p`, if any.
                    let hit = (0..n).all(|d| {
                        let shifted = p[d] + g.pads[d];
                        let tap = o[d] * g.dilations[d];
                        shifted >= tap && (shifted - tap).is_multiple_of(g.strides[d]) && {
                            b[d] = (shifted - tap) / g.strides[d];
                            b[d] < along[d]
                        }
                    });
                    if hit {
                        sum += x[offset * l + flatten(&b, &along)];
                    }
                }
                *v = sum;
            }
        }
        Ok(())
    }
}

/// Row-major coordinates of flat index `at` in `dims`.
fn unflatten(mut at: usize, dims: &[usize], into: &mut [usize]) {
    for (c, &d) in into.iter_mut().zip(dims).rev() {
        *c = at % d;
        at /= d;
    }
}

fn flatten(coords: &[usize], dims: &[usize]) -> usize {
    coords.iter().zip(dims).fold(0, |acc, (&c, &d)| acc * d + c)
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    #[test]
    fn overlapping_blocks_add_up() {
        // A 1-D image of 5 from blocks of 3 at stride 1: pixel i sums the blocks covering
        // it. With every block value 1, that is how many cover it: 1, 2, 3, 2, 1.
        let a = Attrs::new()
            .with("image_shape", AttrValue::Ints(vec![5]))
            .with("block_shape", AttrValue::Ints(vec![3]))
            .with("strides", AttrValue::Ints(vec![1]))
            .with("dilations", AttrValue::Ints(vec![1]))
            .with("pads", AttrValue::Ints(vec![0, 0]));
        let x = Tensor::from_vec(vec![1, 3, 3], &[1.0f32; 9]).unwrap();
        let y = eval("Col2Im", &a, &[&x], &[TensorDesc::new(DType::F32, [1, 1, 5])]).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), [1.0, 2.0, 3.0, 2.0, 1.0]);
        // Stride 2, pad 1 each side: blocks at padded 0, 2, 4 cover pixels -1..1, 1..3, 3..5;
        // block j's offset o holds 10 j + o.
        let a =
            a.with("strides", AttrValue::Ints(vec![2])).with("pads", AttrValue::Ints(vec![1, 1]));
        let x: Vec<f32> = (0..3).flat_map(|o| (0..3).map(move |j| (10 * j + o) as f32)).collect();
        let x = Tensor::from_vec(vec![1, 3, 3], &x).unwrap();
        let y = eval("Col2Im", &a, &[&x], &[TensorDesc::new(DType::F32, [1, 1, 5])]).unwrap();
        // Pixel 0: block 0 offset 1; pixel 1: block 0 offset 2 + block 1 offset 0; ...
        assert_eq!(y[0].as_slice::<f32>().unwrap(), [1.0, 12.0, 11.0, 32.0, 21.0]);
    }
}
