//! RoiAlign: each region of interest `[x1, y1, x2, y2]` (times `spatial_scale`, less half a
//! pixel in `half_pixel` mode) cut into `output_height` x `output_width` bins, each bin the
//! average (or the maximum) of a grid of bilinear samples of its image's feature map. The
//! grid has `sampling_ratio` samples a side, or as many as the bin is pixels (rounded up).
//!
//! This follows ONNX's reference and ONNX Runtime to the letter: a sample more than a pixel
//! outside the map counts as zero, one within a pixel of it is clamped to the edge, and `max`
//! takes the largest of the four weighted corners of each sample (not the interpolated
//! value), as ONNX Runtime does. In `output_half_pixel` mode (opset 10's) a region is at
//! least one pixel a side. Arithmetic is in f32, as ONNX Runtime's.

use crate::Node;
use crate::TensorDesc;
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut};
use crate::invalid;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::{AttrValue, DType};

pub(super) fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let default_mode = if cx.opset < 16 { "output_half_pixel" } else { "half_pixel" };
    let transform = node.attrs.text_or("coordinate_transformation_mode", default_mode)?;
    if cx.opset < 16 && transform != "output_half_pixel" {
        return Err(op_err!("coordinate_transformation_mode came with opset 16"));
    }
    let transform = transform.to_string();
    let mode = node.attrs.text_or("mode", "avg")?.to_string();
    if !matches!(transform.as_str(), "half_pixel" | "output_half_pixel") {
        return Err(op_err!("coordinate_transformation_mode {transform} is unknown"));
    }
    if !matches!(mode.as_str(), "avg" | "max") {
        return Err(op_err!("mode {mode} is unknown (avg or max)"));
    }
    let size = |name: &str| -> OpResult<AttrValue> {
        match node.attrs.int_or(name, 1)? {
            v if v >= 1 => Ok(AttrValue::Int(v)),
            v => Err(op_err!("{name} {v} must be positive")),
        }
    };
    let (height, width) = (size("output_height")?, size("output_width")?);
    let ratio = node.attrs.int_or("sampling_ratio", 0)?;
    if ratio < 0 {
        return Err(op_err!("sampling_ratio {ratio} must not be negative"));
    }
    let scale = node.attrs.float_or("spatial_scale", 1.0)?;
    let attrs = &mut node.attrs;
    attrs.set("coordinate_transformation_mode", AttrValue::Text(transform));
    attrs.set("mode", AttrValue::Text(mode));
    attrs.set("output_height", height);
    attrs.set("output_width", width);
    attrs.set("sampling_ratio", AttrValue::Int(ratio));
    attrs.set("spatial_scale", AttrValue::Float(scale.into()));
    Ok(())
}

/// X `[N, C, H, W]`, rois `[R, 4]` of X's type, batch_indices `[R]` int64: `[R, C, oh, ow]`.
pub(super) fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [x, rois, batch] = inputs else {
        return Err(op_err!("takes X, rois and batch_indices, not {} inputs", inputs.len()));
    };
    let r = rois.shape.first().copied().unwrap_or(0);
    if x.shape.len() != 4
        || !matches!(x.dtype, DType::F32 | DType::F16 | DType::F64)
        || rois.dtype != x.dtype
        || rois.shape != [r, 4]
        || batch.dtype != DType::I64
        || batch.shape != [r]
    {
        return Err(op_err!(
            "X {} {:?}, rois {} {:?} and batch_indices {} {:?} should be float [N, C, H, W], \
             the same float [R, 4] and int64 [R]",
            x.dtype,
            x.shape,
            rois.dtype,
            rois.shape,
            batch.dtype,
            batch.shape
        ));
    }
    let size = |name: &str| node.attrs.int(name).map(|v| v as usize);
    let shape = vec![r, x.shape[1], size("output_height")?, size("output_width")?];
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

/// The attributes both backends read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoiAlign {
    pub half_pixel: bool,
    pub max: bool,
    pub out_h: usize,
    pub out_w: usize,
    pub sampling_ratio: usize,
    pub spatial_scale: f32,
}

impl RoiAlign {
    pub fn parse(attrs: &ingot_schema::Attrs) -> Result<Self, ingot_schema::AttrError> {
        Ok(RoiAlign {
            half_pixel: attrs.text("coordinate_transformation_mode")? == "half_pixel",
            max: attrs.text("mode")? == "max",
            out_h: attrs.int("output_height")? as usize,
            out_w: attrs.int("output_width")? as usize,
            sampling_ratio: attrs.int("sampling_ratio")? as usize,
            spatial_scale: attrs.float("spatial_scale")?,
        })
    }
}

struct Kernel2d {
    op: RoiAlign,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    rois: usize,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(3..=3, 1)?;
    let (x, rois) = (&cx.inputs[0], &cx.inputs[1]);
    if x.dtype != DType::F32 {
        return Err(cx.dtype_error(x.dtype));
    }
    let &[n, c, h, w] = x.shape.as_slice() else {
        return Err(invalid!("RoiAlign of X {:?}", x.shape));
    };
    if h == 0 || w == 0 {
        return Err(invalid!("RoiAlign of an empty feature map {:?}", x.shape));
    }
    let r = rois.shape.first().copied().unwrap_or(0);
    let op = RoiAlign::parse(cx.attrs)?;
    if rois.shape != [r, 4] || cx.outputs[0].shape != [r, c, op.out_h, op.out_w] {
        return Err(invalid!("RoiAlign of rois {:?} to {:?}", rois.shape, cx.outputs[0].shape));
    }
    Ok(Box::new(Kernel2d { op, n, c, h, w, rois: r }))
}

/// One bilinear sample: the offsets of its four corners in a feature map and their weights
/// (all zero outside the map).
#[derive(Clone, Copy, Default)]
struct Sample {
    at: [usize; 4],
    weight: [f32; 4],
}

impl Kernel2d {
    /// The samples of every bin of region `roi`, bin by bin, and how many a bin has.
    fn samples(&self, roi: &[f32]) -> (Vec<Sample>, usize) {
        let op = &self.op;
        let offset = if op.half_pixel { 0.5 } else { 0.0 };
        let [x1, y1, x2, y2] = [0, 1, 2, 3].map(|k| roi[k] * op.spatial_scale - offset);
        let (mut roi_w, mut roi_h) = (x2 - x1, y2 - y1);
        if !op.half_pixel {
            (roi_w, roi_h) = (roi_w.max(1.0), roi_h.max(1.0));
        }
        let (bin_h, bin_w) = (roi_h / op.out_h as f32, roi_w / op.out_w as f32);
        let grid = |bin: f32| match op.sampling_ratio {
            0 => bin.ceil().max(0.0) as usize,
            r => r,
        };
        let (grid_h, grid_w) = (grid(bin_h), grid(bin_w));
        let (h, w) = (self.h as f32, self.w as f32);
        let mut out = Vec::with_capacity(op.out_h * op.out_w * grid_h * grid_w);
        for ph in 0..op.out_h {
            for pw in 0..op.out_w {
                for iy in 0..grid_h {
                    let y = y1 + ph as f32 * bin_h + (iy as f32 + 0.5) * bin_h / grid_h as f32;
                    for ix in 0..grid_w {
                        let x = x1 + pw as f32 * bin_w + (ix as f32 + 0.5) * bin_w / grid_w as f32;
                        out.push(self.sample(y, x, h, w));
                    }
                }
            }
        }
        (out, grid_h * grid_w)
    }

    fn sample(&self, y: f32, x: f32, h: f32, w: f32) -> Sample {
        if y < -1.0 || y > h || x < -1.0 || x > w {
            return Sample::default();
        }
        let corner = |v: f32, n: usize| {
            let low = v.max(0.0) as usize;
            if low >= n - 1 { (n - 1, n - 1, (n - 1) as f32) } else { (low, low + 1, v.max(0.0)) }
        };
        let (y0, y1, y) = corner(y, self.h);
        let (x0, x1, x) = corner(x, self.w);
        let (ly, lx) = (y - y0 as f32, x - x0 as f32);
        let (hy, hx) = (1.0 - ly, 1.0 - lx);
        Sample {
            at: [y0 * self.w + x0, y0 * self.w + x1, y1 * self.w + x0, y1 * self.w + x1],
            weight: [hy * hx, hy * lx, ly * hx, ly * lx],
        }
    }
}

impl Kernel for Kernel2d {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let plane = self.h * self.w;
        let x = input::<f32>(inputs, 0, self.n * self.c * plane)?;
        let rois = input::<f32>(inputs, 1, self.rois * 4)?;
        let batch = input::<i64>(inputs, 2, self.rois)?;
        let bins = self.op.out_h * self.op.out_w;
        let y = output_mut::<f32>(outputs, 0, self.rois * self.c * bins)?;
        if bins == 0 || self.c == 0 {
            return Ok(());
        }
        for (r, out) in y.chunks_exact_mut(self.c * bins).enumerate() {
            let b = usize::try_from(batch[r]).ok().filter(|&b| b < self.n).ok_or_else(|| {
                KernelError::Data(format!(
                    "RoiAlign batch index {} is out of range for {} images",
                    batch[r], self.n
                ))
            })?;
            let (samples, count) = self.samples(&rois[r * 4..r * 4 + 4]);
            if count == 0 {
                out.fill(0.0); // bins of no samples (an empty region)
                continue;
            }
            for (c, out) in out.chunks_exact_mut(bins).enumerate() {
                let map = &x[(b * self.c + c) * plane..][..plane];
                for (v, bin) in out.iter_mut().zip(samples.chunks(count)) {
                    *v = pool(&self.op, map, bin, count);
                }
            }
        }
        Ok(())
    }
}

/// One bin of samples of `map`: their average over `count` (at least 1), or the largest
/// weighted corner.
fn pool(op: &RoiAlign, map: &[f32], bin: &[Sample], count: usize) -> f32 {
    if op.max {
        let corners = bin.iter().map(|s| {
            let v = |k: usize| s.weight[k] * map[s.at[k]];
            v(0).max(v(1)).max(v(2)).max(v(3))
        });
        corners.reduce(f32::max).unwrap_or(0.0)
    } else {
        let sum: f32 = bin
            .iter()
            .map(|s| (0..4).map(|k| s.weight[k] * map[s.at[k]]).fold(0.0, |a, b| a + b))
            .sum();
        sum / count.max(1) as f32
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    /// RoiAlign of the 4x4 map `4 i + j` over one region, one bin of one sample (by hand).
    fn one_bin(roi: [f32; 4], transform: &str, mode: &str) -> f32 {
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let x = Tensor::from_vec(vec![1, 1, 4, 4], &x).unwrap();
        let rois = Tensor::from_vec(vec![1, 4], &roi).unwrap();
        let batch = Tensor::from_vec(vec![1], &[0i64]).unwrap();
        let a = Attrs::new()
            .with("coordinate_transformation_mode", AttrValue::Text(transform.into()))
            .with("mode", AttrValue::Text(mode.into()))
            .with("output_height", AttrValue::Int(1))
            .with("output_width", AttrValue::Int(1))
            .with("sampling_ratio", AttrValue::Int(1))
            .with("spatial_scale", AttrValue::Float(1.0));
        let out = TensorDesc::new(DType::F32, [1, 1, 1, 1]);
        let y = eval("RoiAlign", &a, &[&x, &rois, &batch], &[out]).unwrap();
        y[0].as_slice::<f32>().unwrap()[0]
    }

    #[test]
    fn samples_are_bilinear_and_pooled_as_onnx_runtime_does() {
        // [0, 0, 3, 3] without the half-pixel shift: the sample at (1.5, 1.5) is 7.5.
        assert_eq!(one_bin([0.0, 0.0, 3.0, 3.0], "output_half_pixel", "avg"), 7.5);
        // max takes the largest weighted corner: 0.25 x 10.
        assert_eq!(one_bin([0.0, 0.0, 3.0, 3.0], "output_half_pixel", "max"), 2.5);
        // Half a pixel back, the sample is pixel (1, 1) itself.
        assert_eq!(one_bin([0.0, 0.0, 3.0, 3.0], "half_pixel", "avg"), 5.0);
        // A region more than a pixel off the map samples nothing.
        assert_eq!(one_bin([10.0, 10.0, 12.0, 12.0], "half_pixel", "avg"), 0.0);
        // Within a pixel of the far edge, a sample is clamped to it: pixel (3, 3).
        assert_eq!(one_bin([3.5, 3.5, 4.5, 4.5], "half_pixel", "avg"), 15.0);
    }
}
