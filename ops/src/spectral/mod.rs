//! Spectral ops: `DFT` (opsets 17 to 20) and `STFT` (17), the front ends of audio models.
//! Lowering reads the constant operands (DFT's length and axis, STFT's frame step and length)
//! into attributes; the kernels are in `cpu.rs` and, for float32, `vulkan.rs`.
//!
//! Canonical forms (what `cpu.rs` reads):
//! - DFT: input X `[.., n, .., 1 or 2]` (real, or complex as real and imaginary parts);
//!   attributes `axis` (nonnegative, not the last), `length` (the transform's; the signal is
//!   cut or zero-padded to it), `inverse`, `onesided`. Y has `length` along the axis (half of
//!   it plus one for a one-sided forward transform) and 2 parts, or 1 for a one-sided inverse
//!   (numpy's `irfft`).
//! - STFT: inputs the signal `[batch, length, 1 or 2]` and the window where there is one;
//!   attributes `frame_step`, `frame_length`, `onesided`. Y is `[batch, frames, bins, 2]`.
//! - The window functions and MelWeightMatrix: constant tables, folded (`windows.rs`).

pub(crate) mod cpu;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;
mod windows;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    // Every output element reads a whole signal.
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs};

/// Why the tables have no Vulkan kernel.
const TABLE: &str = "a table of constant operands, folded at compile time";

pub const OPS: &[OpDef] = &[
    OpDef::new("DFT", lower_dft, infer_dft),
    OpDef::new("STFT", lower_stft, infer_stft),
    OpDef::new("HannWindow", windows::lower, windows::infer).cpu_only(TABLE),
    OpDef::new("HammingWindow", windows::lower, windows::infer).cpu_only(TABLE),
    OpDef::new("BlackmanWindow", windows::lower, windows::infer).cpu_only(TABLE),
    OpDef::new("MelWeightMatrix", windows::lower, windows::infer).cpu_only(TABLE),
];

/// A scalar integer operand, which must be constant (`None`: omitted).
fn const_int(cx: &LowerCx, i: usize, what: &str) -> OpResult<Option<i64>> {
    match cx.const_ints(i, what)?.as_deref() {
        None => Ok(None),
        Some(&[v]) => Ok(Some(v)),
        Some(v) => Err(op_err!("{what} (input {i}) must be one integer, got {} values", v.len())),
    }
}

fn flag(node: &Node, name: &str) -> OpResult<i64> {
    Ok((node.attrs.int_or(name, 0)? != 0) as i64)
}

fn lower_dft(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    let rank = shape.len();
    if rank < 2 || !matches!(shape[rank - 1], 1 | 2) {
        return Err(op_err!("input {shape:?}: its last dim must be 1 (real) or 2 (complex)"));
    }
    // Opset 20 moved the axis from an attribute (default 1) to input 2 (default -2).
    let axis = match cx.opset {
        ..20 => node.attrs.int_or("axis", 1)?,
        _ => const_int(cx, 2, "axis")?.unwrap_or(-2),
    };
    let axis = normalize_axis(axis, rank)?;
    if axis >= rank - 1 {
        return Err(op_err!("axis {axis} of {shape:?} is the real/imaginary dim"));
    }
    let (inverse, onesided) = (flag(node, "inverse")?, flag(node, "onesided")?);
    let n = shape[axis] as i64;
    let length = match const_int(cx, 1, "dft_length")? {
        Some(l) if l >= 1 => l,
        Some(l) => return Err(op_err!("dft_length {l} is not positive")),
        None if inverse == 1 && onesided == 1 => 2 * (n - 1),
        None => n,
    };
    if length < 1 {
        return Err(op_err!("a one-sided inverse of {n} bins has no length"));
    }
    if onesided == 1 && shape[rank - 1] == 2 && inverse == 0 {
        return Err(op_err!("a one-sided transform takes a real signal"));
    }
    node.attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis as i64))
        .with("length", AttrValue::Int(length))
        .with("inverse", AttrValue::Int(inverse))
        .with("onesided", AttrValue::Int(onesided));
    node.inputs.truncate(1);
    Ok(())
}

fn infer_dft(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [x] = inputs else {
        return Err(op_err!("expects one input, got {}", inputs.len()));
    };
    let a = &node.attrs;
    let axis = a.int("axis")? as usize;
    let length = a.int("length")? as usize;
    let (inverse, onesided) = (a.int("inverse")? != 0, a.int("onesided")? != 0);
    if axis + 1 >= x.shape.len() {
        return Err(op_err!("axis {axis} out of range for {:?}", x.shape));
    }
    let mut shape = x.shape.clone();
    shape[axis] = if onesided && !inverse { length / 2 + 1 } else { length };
    *shape.last_mut().unwrap() = if onesided && inverse { 1 } else { 2 };
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

fn lower_stft(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    if shape.len() != 3 || !matches!(shape[2], 1 | 2) {
        return Err(op_err!("signal {shape:?} must be [batch, length, 1 or 2]"));
    }
    let step = const_int(cx, 1, "frame_step")?.ok_or_else(|| op_err!("frame_step is required"))?;
    let window = cx.has_input(2).then(|| cx.input(2)).transpose()?;
    let length = match (const_int(cx, 3, "frame_length")?, window) {
        (Some(l), Some(w)) if w.shape != [l as usize] => {
            return Err(op_err!("a window of {:?} for frames of {l}", w.shape));
        }
        (Some(l), _) => l,
        (None, Some(w)) if w.shape.len() == 1 => w.shape[0] as i64,
        (None, Some(w)) => return Err(op_err!("window {:?} must be 1-d", w.shape)),
        (None, None) => shape[1] as i64,
    };
    if step < 1 || length < 1 || length as usize > shape[1] {
        return Err(op_err!("frames of {length} every {step} do not fit a signal of {}", shape[1]));
    }
    let onesided = (node.attrs.int_or("onesided", 1)? != 0) as i64;
    if onesided == 1 && shape[2] == 2 {
        return Err(op_err!("a one-sided transform takes a real signal"));
    }
    node.attrs = Attrs::new()
        .with("frame_step", AttrValue::Int(step))
        .with("frame_length", AttrValue::Int(length))
        .with("onesided", AttrValue::Int(onesided));
    let window = node.inputs.get(2).copied().flatten();
    node.inputs = [node.inputs[0], window].into_iter().flatten().map(Some).collect();
    Ok(())
}

fn infer_stft(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("expects a signal"))?;
    let a = &node.attrs;
    let (step, length) = (a.int("frame_step")? as usize, a.int("frame_length")? as usize);
    if x.shape.len() != 3 || step == 0 || length == 0 || length > x.shape[1] {
        return Err(op_err!("frames of {length} every {step} of a signal {:?}", x.shape));
    }
    let frames = 1 + (x.shape[1] - length) / step;
    let bins = if a.int("onesided")? != 0 { length / 2 + 1 } else { length };
    Ok(vec![TensorDesc::new(x.dtype, [x.shape[0], frames, bins, 2])])
}
