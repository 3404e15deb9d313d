//! The audio front ends' constant tables (opset 17): the `HannWindow`, `HammingWindow` and
//! `BlackmanWindow` of a length, and the `MelWeightMatrix` that maps a spectrum's bins to mel
//! bands. Their operands must be constants: lowering reads them into attributes, and the
//! node, left without inputs, is folded at compile time by the kernel here.
//!
//! Canonical form: no inputs; `dtype` (the output's ONNX type code, float32 or float64);
//! windows `size` and `periodic`; MelWeightMatrix `num_mel_bins`, `dft_length`,
//! `sample_rate`, `lower_edge_hertz`, `upper_edge_hertz`.

use crate::Node;
use crate::TensorDesc;
use crate::cpu::{Kernel, KernelError, OpCx, write_f64s};
use crate::invalid;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::{AttrValue, Attrs, DType};
use std::f64::consts::{LN_10, PI};

pub const OPS: [&str; 4] = ["HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"];

/// The output's type: `output_datatype`, float32 by default.
fn dtype(node: &Node) -> OpResult<DType> {
    let code = node.attrs.int_or("output_datatype", 1)?;
    match i32::try_from(code).ok().and_then(DType::from_onnx_code) {
        Some(d @ (DType::F32 | DType::F64)) => Ok(d),
        _ => Err(op_err!("output_datatype {code}: Ingot makes float32 or float64 tables")),
    }
}

/// Operand `i`, one number, which must be constant.
fn scalar(cx: &LowerCx, i: usize, what: &str) -> OpResult<f64> {
    match cx.const_floats(i, what)?.as_deref() {
        Some(&[v]) => Ok(v),
        Some(_) => Err(op_err!("{what} (input {i}) must be one number")),
        None => Err(op_err!("{what} (input {i}) must be a constant once shapes are static")),
    }
}

pub(super) fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let dtype = dtype(node)?;
    let count = |v: f64, what: &str| match v {
        v if v >= 0.0 && v.fract() == 0.0 && v < 1e9 => Ok(v as i64),
        v => Err(op_err!("{what} {v} is not a count")),
    };
    let mut attrs = Attrs::new().with("dtype", AttrValue::Int(dtype.onnx_code().into()));
    if node.op == "MelWeightMatrix" {
        let bins = count(scalar(cx, 0, "num_mel_bins")?, "num_mel_bins")?;
        let dft = count(scalar(cx, 1, "dft_length")?, "dft_length")?;
        let rate = count(scalar(cx, 2, "sample_rate")?, "sample_rate")?;
        let (low, high) = (scalar(cx, 3, "lower_edge_hertz")?, scalar(cx, 4, "upper_edge_hertz")?);
        if rate == 0 || !(0.0..=high).contains(&low) {
            return Err(op_err!("sample rate {rate}, band {low} to {high} Hz"));
        }
        attrs = attrs
            .with("num_mel_bins", AttrValue::Int(bins))
            .with("dft_length", AttrValue::Int(dft))
            .with("sample_rate", AttrValue::Int(rate))
            .with("lower_edge_hertz", AttrValue::Float(low))
            .with("upper_edge_hertz", AttrValue::Float(high));
    } else {
        let size = count(scalar(cx, 0, "size")?, "size")?;
        let periodic = i64::from(node.attrs.int_or("periodic", 1)? != 0);
        attrs = attrs.with("size", AttrValue::Int(size)).with("periodic", AttrValue::Int(periodic));
    }
    node.attrs = attrs;
    node.inputs.clear();
    Ok(())
}

fn shape(attrs: &Attrs, op: &str) -> Result<Vec<usize>, ingot_schema::AttrError> {
    let dim = |name| attrs.int(name).map(|v| v as usize);
    Ok(match op {
        "MelWeightMatrix" => vec![dim("dft_length")? / 2 + 1, dim("num_mel_bins")?],
        _ => vec![dim("size")?],
    })
}

pub(super) fn infer(node: &Node, _: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let code = node.attrs.int("dtype")?;
    let dtype = i32::try_from(code).ok().and_then(DType::from_onnx_code);
    let dtype = dtype.ok_or_else(|| op_err!("dtype {code}"))?;
    Ok(vec![TensorDesc::new(dtype, shape(&node.attrs, &node.op)?)])
}

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(0..=0, 1)?;
    let out = &cx.outputs[0];
    if out.shape != shape(cx.attrs, cx.op)? || !matches!(out.dtype, DType::F32 | DType::F64) {
        return Err(invalid!("{} declares {out:?}", cx.op));
    }
    let values = match cx.op {
        "MelWeightMatrix" => mel(cx.attrs)?,
        op => {
            let size = out.shape[0];
            let n = if cx.attrs.int("periodic")? != 0 { size } else { size.saturating_sub(1) };
            let turn = |i: usize, k: f64| (k * 2.0 * PI * i as f64 / n as f64).cos();
            let w: fn(&dyn Fn(usize, f64) -> f64, usize) -> f64 = match op {
                "HannWindow" => |c, i| 0.5 - 0.5 * c(i, 1.0),
                "HammingWindow" => |c, i| 25.0 / 46.0 - (21.0 / 46.0) * c(i, 1.0),
                "BlackmanWindow" => |c, i| 0.42 - 0.5 * c(i, 1.0) + 0.08 * c(i, 2.0),
                op => return Err(KernelError::UnknownOp(op.to_string())),
            };
            (0..size).map(|i| w(&turn, i)).collect()
        }
    };
    Ok(Box::new(Table { values }))
}

/// Triangular bands, evenly spaced in mels (`2595 log10(1 + f / 700)`) from the lower to the
/// upper edge, each rising from the bin of its lower neighbour's centre to its own and
/// falling to its upper neighbour's, as ONNX's reference computes them: the edges' mels in
/// float32, the rest in float64, bins floored.
fn mel(attrs: &Attrs) -> Result<Vec<f64>, KernelError> {
    let bands = attrs.int("num_mel_bins")? as usize;
    let dft = attrs.int("dft_length")? as f64;
    let rate = attrs.int("sample_rate")? as f64;
    let to_mel = |hz: f32| f64::from(2595.0 * (hz / 700.0).ln_1p()) / LN_10;
    let (low, high) =
        (to_mel(attrs.float("lower_edge_hertz")?), to_mel(attrs.float("upper_edge_hertz")?));
    let step = (high - low) / (bands + 2) as f64;
    let bins: Vec<usize> = (0..bands + 2)
        .map(|i| {
            let hz = 700.0 * ((i as f64 * step + low) / 2595.0 * LN_10).exp_m1();
            ((dft + 1.0) * hz / rate).floor().max(0.0) as usize
        })
        .collect();
    let rows = dft as usize / 2 + 1;
    let mut table = vec![0.0; rows * bands];
    let mut set = |row: usize, band: usize, v: f64| match table.get_mut(row * bands + band) {
        Some(t) => {
            *t = v;
            Ok(())
        }
        None => Err(invalid!("MelWeightMatrix: band {band} reaches bin {row} of {rows}")),
    };
    for band in 0..bands {
        let (left, centre, right) = (bins[band], bins[band + 1], bins[band + 2]);
        match centre.checked_sub(left) {
            Some(0) => set(centre, band, 1.0)?,
            Some(rise) => {
                for j in left..=centre {
                    set(j, band, (j - left) as f64 / rise as f64)?;
                }
            }
            None => return Err(invalid!("MelWeightMatrix: band {band} is reversed")),
        }
        let fall = right.saturating_sub(centre);
        for j in centre..right {
            set(j, band, (right - j) as f64 / fall as f64)?;
        }
    }
    Ok(table)
}

/// A table computed once, written by every run (in practice once: it is folded).
struct Table {
    values: Vec<f64>,
}

impl Kernel for Table {
    fn run(&self, _: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let out = outputs.first_mut().ok_or_else(|| invalid!("the table has no output"))?;
        write_f64s(out, &self.values)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu;
    use crate::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn window(op: &str, size: usize, periodic: bool) -> Vec<f64> {
        let attrs = Attrs::new()
            .with("dtype", AttrValue::Int(11))
            .with("size", AttrValue::Int(size as i64))
            .with("periodic", AttrValue::Int(i64::from(periodic)));
        let out = [TensorDesc::new(DType::F64, vec![size])];
        let got: Vec<Tensor> = cpu::eval(op, &attrs, &[], &out).unwrap();
        got[0].as_slice::<f64>().unwrap().to_vec()
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12), "{got:?} vs {want:?}");
    }

    #[test]
    fn windows_are_their_cosine_sums() {
        // Periodic: the period is the size; symmetric: one less, so both ends are 0 (or a0-a1).
        close(&window("HannWindow", 4, true), &[0.0, 0.5, 1.0, 0.5]);
        close(&window("HannWindow", 5, false), &[0.0, 0.5, 1.0, 0.5, 0.0]);
        let edge = 25.0 / 46.0 - 21.0 / 46.0;
        close(&window("HammingWindow", 3, false), &[edge, 1.0, edge]);
        close(&window("BlackmanWindow", 3, false), &[0.0, 1.0, 0.0]);
        close(&window("BlackmanWindow", 4, true), &[0.0, 0.34, 1.0, 0.34]);
    }
}
