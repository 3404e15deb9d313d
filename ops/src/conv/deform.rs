//! DeformConv (opset 19, 22): a 2-D convolution whose every tap reads X at its place moved by
//! a learnt `offset` (bilinear, zero outside X), scaled by an optional `mask` (modulated
//! deformable convolution, DCNv2): detectors with deformable heads export to it. Offsets and
//! masks come per offset group of input channels, per tap and per output position.
//!
//! Canonical form: Conv's window attributes (`kernel_shape` from W when absent, `strides`,
//! `dilations`, `pads`), `group`, `offset_group`, and `bias`, `mask` (1 where the model gives
//! that input); inputs X, W, offset and those given, in order.
//!
//! Both backends compute, for output channel m of group g at position (i, j),
//! `B[m] + Σ_c Σ_(a,b) W[m, c, a, b] · mask · X_c(i·s + a·d - pad + Δh, j·s + b·d - pad + Δw)`.
//! The CPU samples each (channel, tap) row once and multiplies the rows by W (an im2col of
//! samples); Vulkan samples per output element.

use crate::Node;
use crate::TensorDesc;
use crate::conv::{canonical_window, window_and_group};
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut};
use crate::invalid;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::{AttrValue, Attrs, DType};

pub(super) fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let (x, w) = (cx.input(0)?.shape.clone(), cx.input(1)?.shape.clone());
    if x.len() != 4 || w.len() != 4 {
        return Err(op_err!("X {x:?} and W {w:?}: Ingot runs 2-D DeformConv"));
    }
    canonical_window(node, &x[2..], Some(&w[2..]))?;
    let given = |i: usize| AttrValue::Int(i64::from(cx.has_input(i)));
    node.attrs = window_and_group(node)?
        .with("offset_group", AttrValue::Int(node.attrs.int_or("offset_group", 1)?))
        .with("bias", given(3))
        .with("mask", given(4));
    node.inputs.retain(Option::is_some);
    Ok(())
}

pub(super) fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape.as_slice()).collect();
    let g = Geometry::new(&node.attrs, &shapes).map_err(|e| op_err!("{e}"))?;
    if inputs.iter().any(|t| t.dtype != inputs[0].dtype) || !inputs[0].dtype.is_float() {
        return Err(op_err!("X, W, offset, B and mask must be of one float type"));
    }
    Ok(vec![TensorDesc::new(inputs[0].dtype, [g.n, g.m, g.oh, g.ow])])
}

/// The sizes both backends read, checked against every operand.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// The pads before each dim.
    pub pad: [usize; 2],
    pub group: usize,
    pub offset_group: usize,
    pub bias: bool,
    pub mask: bool,
}

impl Geometry {
    pub fn new(attrs: &Attrs, shapes: &[&[usize]]) -> Result<Self, String> {
        let e = |e: ingot_schema::AttrError| e.to_string();
        let ints = |name: &str| -> Result<Vec<usize>, String> {
            Ok(attrs.ints(name).map_err(e)?.iter().map(|&v| v.max(0) as usize).collect())
        };
        let int = |name: &str| attrs.int(name).map(|v| v.max(0) as usize).map_err(e);
        let (bias, mask) = (int("bias")? != 0, int("mask")? != 0);
        if shapes.len() != 3 + usize::from(bias) + usize::from(mask) {
            return Err(format!("{} operands for bias {bias} and mask {mask}", shapes.len()));
        }
        let (&[n, c, h, w], &[m, cg, kh, kw]) = (shapes[0], shapes[1]) else {
            return Err(format!("X {:?} and W {:?} are not 2-D", shapes[0], shapes[1]));
        };
        let (stride, dilation, pads) = (ints("strides")?, ints("dilations")?, ints("pads")?);
        if stride.len() != 2 || dilation.len() != 2 || pads.len() != 4 {
            return Err(format!("strides {stride:?}, dilations {dilation:?}, pads {pads:?}"));
        }
        let (group, offset_group) = (int("group")?, int("offset_group")?);
        let along = |d: usize, size: usize, k: usize| {
            let padded = size + pads[d] + pads[d + 2];
            let span = dilation[d] * (k.max(1) - 1) + 1;
            padded.checked_sub(span).map(|v| v / stride[d].max(1) + 1).unwrap_or(0)
        };
        let g = Geometry {
            n,
            c,
            h,
            w,
            m,
            kh,
            kw,
            oh: along(0, h, kh),
            ow: along(1, w, kw),
            stride: [stride[0], stride[1]],
            dilation: [dilation[0], dilation[1]],
            pad: [pads[0], pads[1]],
            group,
            offset_group,
            bias,
            mask,
        };
        let taps = offset_group * kh * kw;
        let fits = group >= 1
            && offset_group >= 1
            && c == cg * group
            && m % group == 0
            && c % offset_group == 0
            && shapes[2] == [n, 2 * taps, g.oh, g.ow]
            && (!bias || shapes[3] == [m])
            && (!mask || shapes[3 + usize::from(bias)] == [n, taps, g.oh, g.ow]);
        if !fits {
            return Err(format!(
                "operands {shapes:?} do not fit group {group}, offset_group {offset_group} \
                 and the output [{n}, {m}, {}, {}]",
                g.oh, g.ow
            ));
        }
        Ok(g)
    }

    /// X's value at (y, x) of one channel's plane, bilinear, zero outside the plane.
    pub fn sample(&self, plane: &[f32], y: f32, x: f32) -> f32 {
        let (y0, x0) = (y.floor(), x.floor());
        let (ly, lx) = (y - y0, x - x0);
        let at = |r: f32, c: f32| {
            let inside = r >= 0.0 && c >= 0.0 && r < self.h as f32 && c < self.w as f32;
            if inside { plane[r as usize * self.w + c as usize] } else { 0.0 }
        };
        (1.0 - ly) * (1.0 - lx) * at(y0, x0)
            + (1.0 - ly) * lx * at(y0, x0 + 1.0)
            + ly * (1.0 - lx) * at(y0 + 1.0, x0)
            + ly * lx * at(y0 + 1.0, x0 + 1.0)
    }
}

struct DeformConv {
    g: Geometry,
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if let Some(t) = cx.inputs.iter().find(|t| t.dtype != DType::F32) {
        return Err(cx.dtype_error(t.dtype));
    }
    let shapes: Vec<&[usize]> = cx.inputs.iter().map(|t| t.shape.as_slice()).collect();
    let g = Geometry::new(cx.attrs, &shapes).map_err(|e| invalid!("DeformConv: {e}"))?;
    if cx.outputs[0].shape != [g.n, g.m, g.oh, g.ow] {
        return Err(invalid!("DeformConv output {:?}", cx.outputs[0].shape));
    }
    Ok(Box::new(DeformConv { g }))
}

impl Kernel for DeformConv {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let g = &self.g;
        let (plane, positions, taps) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw);
        let x = input::<f32>(inputs, 0, g.n * g.c * plane)?;
        let w = input::<f32>(inputs, 1, g.m * (g.c / g.group) * taps)?;
        let offset = input::<f32>(inputs, 2, g.n * g.offset_group * taps * 2 * positions)?;
        let bias = if g.bias { Some(input::<f32>(inputs, 3, g.m)?) } else { None };
        let mask_at = 3 + usize::from(g.bias);
        let mask = match g.mask {
            true => Some(input::<f32>(inputs, mask_at, g.n * g.offset_group * taps * positions)?),
            false => None,
        };
        let y = output_mut::<f32>(outputs, 0, g.n * g.m * positions)?;
        let (cg, mg) = (g.c / g.group, g.m / g.group);
        let per_offset_group = g.c / g.offset_group;
        // One image's sampled rows: (channel, tap) by output position.
        let mut cols = vec![0.0f32; g.c * taps * positions];
        for b in 0..g.n {
            for c in 0..g.c {
                let og = c / per_offset_group;
                let plane = &x[(b * g.c + c) * plane..][..plane];
                for t in 0..taps {
                    let (ki, kj) = (t / g.kw, t % g.kw);
                    let field = (b * g.offset_group + og) * taps + t;
                    let (dy, dx) =
                        (&offset[2 * field * positions..], &offset[(2 * field + 1) * positions..]);
                    let row = &mut cols[(c * taps + t) * positions..][..positions];
                    for (p, v) in row.iter_mut().enumerate() {
                        let (i, j) = (p / g.ow, p % g.ow);
                        let y0 = (i * g.stride[0] + ki * g.dilation[0]) as f32 - g.pad[0] as f32;
                        let x0 = (j * g.stride[1] + kj * g.dilation[1]) as f32 - g.pad[1] as f32;
                        *v = g.sample(plane, y0 + dy[p], x0 + dx[p]);
                        if let Some(mask) = mask {
                            *v *= mask[field * positions + p];
                        }
                    }
                }
            }
            // Each output channel: its bias, plus its weights times its group's rows.
            for m in 0..g.m {
                let out = &mut y[(b * g.m + m) * positions..][..positions];
                out.fill(bias.map_or(0.0, |bias| bias[m]));
                let group = m / mg;
                for (k, &wk) in w[m * cg * taps..][..cg * taps].iter().enumerate() {
                    let row = &cols[(group * cg * taps + k) * positions..][..positions];
                    out.iter_mut().zip(row).for_each(|(o, &r)| *o += wk * r);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    /// A canonical 3x3 DeformConv with pads 1, `groups` groups and offset groups.
    pub(in crate::conv) fn canonical(groups: i64, bias: bool, mask: bool) -> Attrs {
        Attrs::new()
            .with("kernel_shape", AttrValue::Ints(vec![3, 3]))
            .with("strides", AttrValue::Ints(vec![1, 1]))
            .with("dilations", AttrValue::Ints(vec![1, 1]))
            .with("pads", AttrValue::Ints(vec![1, 1, 1, 1]))
            .with("group", AttrValue::Int(groups))
            .with("offset_group", AttrValue::Int(groups))
            .with("bias", AttrValue::Int(i64::from(bias)))
            .with("mask", AttrValue::Int(i64::from(mask)))
    }

    fn attrs(bias: bool, mask: bool) -> Attrs {
        canonical(1, bias, mask)
    }

    /// A plain 3x3 conv with pads 1 of `x` [1, 2, 4, 4] by `w` [1, 2, 3, 3], by hand.
    fn conv(x: &[f32], w: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0f32; 16];
        for (p, v) in y.iter_mut().enumerate() {
            let (i, j) = ((p / 4) as i64, (p % 4) as i64);
            for (k, &wk) in w.iter().enumerate() {
                let (c, a, b) = (k / 9, (k % 9 / 3) as i64, (k % 3) as i64);
                let (r, s) = (i + a - 1, j + b - 1);
                if (0..4).contains(&r) && (0..4).contains(&s) {
                    *v += wk * x[c * 16 + (r * 4 + s) as usize];
                }
            }
        }
        y
    }

    #[test]
    fn taps_move_by_their_offsets_and_scale_by_the_mask() {
        let x: Vec<f32> = (0..32).map(|v| (v % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..18).map(|v| (v % 5) as f32 * 0.5 - 1.0).collect();
        let xt = Tensor::from_vec(vec![1, 2, 4, 4], &x).unwrap();
        let wt = Tensor::from_vec(vec![1, 2, 3, 3], &w).unwrap();
        let out = || vec![TensorDesc::new(DType::F32, [1, 1, 4, 4])];
        let offsets = |dy: f32, dx: f32| {
            let v: Vec<f32> =
                (0..18 * 16).map(|k| if (k / 16) % 2 == 0 { dy } else { dx }).collect();
            Tensor::from_vec(vec![1, 18, 4, 4], &v).unwrap()
        };
        // No offset: the plain conv.
        let y = eval("DeformConv", &attrs(false, false), &[&xt, &wt, &offsets(0.0, 0.0)], &out());
        assert_eq!(y.unwrap()[0].as_slice::<f32>().unwrap(), conv(&x, &w));
        // Every tap one row down: the conv of X moved up a row (its last row zeros), but for
        // the first output row, whose top taps read X's first row where that conv reads
        // padding.
        let up: Vec<f32> = (0..32)
            .map(|k| {
                let (c, r, s) = (k / 16, k % 16 / 4, k % 4);
                if r < 3 { x[c * 16 + (r + 1) * 4 + s] } else { 0.0 }
            })
            .collect();
        let y = eval("DeformConv", &attrs(false, false), &[&xt, &wt, &offsets(1.0, 0.0)], &out());
        assert_eq!(y.unwrap()[0].as_slice::<f32>().unwrap()[4..], conv(&up, &w)[4..]);
        // A mask of 0.5 and a bias of 2: half the conv, plus 2. Half a pixel down: the mean
        // of the two (below the first row).
        let b = Tensor::from_vec(vec![1], &[2.0f32]).unwrap();
        let mask = Tensor::from_vec(vec![1, 9, 4, 4], &[0.5f32; 144]).unwrap();
        let inputs = [&xt, &wt, &offsets(0.0, 0.0), &b, &mask];
        let y = eval("DeformConv", &attrs(true, true), &inputs, &out()).unwrap();
        let want: Vec<f32> = conv(&x, &w).iter().map(|v| v * 0.5 + 2.0).collect();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), want);
        let y = eval("DeformConv", &attrs(false, false), &[&xt, &wt, &offsets(0.5, 0.0)], &out());
        let half: Vec<f32> =
            conv(&x, &w).iter().zip(conv(&up, &w)).map(|(a, b)| (a + b) / 2.0).collect();
        let got = y.unwrap()[0].as_slice::<f32>().unwrap()[4..].to_vec();
        assert!(
            got.iter().zip(&half[4..]).all(|(g, h)| (g - h).abs() < 1e-5),
            "{got:?} vs {half:?}"
        );
    }
}
