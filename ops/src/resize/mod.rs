//! Resize (opsets 11 to 21): defaults, and the roi/scales/sizes operands turned into
//! attributes with the output size computed here. The kernel is `ops/src/resize/cpu.rs`.
//!
//! Canonical attributes: `mode`, `coordinate_transformation_mode`, `nearest_mode`,
//! `cubic_coeff_a`, `exclude_outside`, `extrapolation_value`, `antialias`, and one entry per
//! axis of the input in `scales` (the factor coordinates are mapped with), `sizes` (the output
//! shape) and `roi` (starts then ends; `[0.., 1..]` unless tf_crop_and_resize uses one).
//! `axes` and `keep_aspect_ratio_policy` (opset 18) are resolved away; only X remains.

pub(crate) mod cpu;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs};

pub const OPS: &[OpDef] = &[OpDef::new("Resize", lower_resize, infer_resize)];

/// A text attribute with its default, checked against the values ONNX allows.
fn text(attrs: &Attrs, name: &str, default: &str, allowed: &[&str]) -> OpResult<String> {
    let v = attrs.text_or(name, default)?;
    if !allowed.contains(&v) {
        return Err(op_err!("{name} {v} is not one of {allowed:?}"));
    }
    Ok(v.to_string())
}

/// A float attribute at full precision, with its default.
fn float(attrs: &Attrs, name: &str, default: f64) -> OpResult<AttrValue> {
    match attrs.get(name) {
        None => Ok(AttrValue::Float(default)),
        Some(AttrValue::Float(v)) => Ok(AttrValue::Float(*v)),
        Some(AttrValue::Int(v)) => Ok(AttrValue::Float(*v as f64)),
        Some(_) => Err(op_err!("{name} must be a float")),
    }
}

/// A constant operand where an empty tensor means "not given".
fn given<T>(v: Option<Vec<T>>) -> Option<Vec<T>> {
    v.filter(|v| !v.is_empty())
}

fn lower_resize(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = cx.input(0)?.shape.clone();
    let rank = shape.len();
    let a = &node.attrs;
    let mode = text(a, "mode", "nearest", &["nearest", "linear", "cubic"])?;
    let coord = text(
        a,
        "coordinate_transformation_mode",
        "half_pixel",
        &[
            "half_pixel",
            "half_pixel_symmetric",
            "pytorch_half_pixel",
            "align_corners",
            "asymmetric",
            "tf_crop_and_resize",
        ],
    )?;
    let nearest = text(
        a,
        "nearest_mode",
        "round_prefer_floor",
        &["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
    )?;
    let policy =
        text(a, "keep_aspect_ratio_policy", "stretch", &["stretch", "not_larger", "not_smaller"])?;
    let antialias = a.int_or("antialias", 0)?;
    if antialias != 0 && mode == "nearest" {
        return Err(op_err!("antialias does not apply to nearest mode"));
    }
    let axes = match a.ints_opt("axes")? {
        Some(axes) => {
            let axes =
                axes.iter().map(|&d| normalize_axis(d, rank)).collect::<OpResult<Vec<_>>>()?;
            let mut seen = axes.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != axes.len() {
                return Err(op_err!("axes {axes:?} repeat an axis"));
            }
            axes
        }
        None => (0..rank).collect(),
    };
    let n = axes.len();

    // roi matters only to tf_crop_and_resize; elsewhere it is not even read.
    let mut roi: Vec<f64> = [vec![0.0; rank], vec![1.0; rank]].concat();
    if coord == "tf_crop_and_resize"
        && let Some(r) = given(cx.const_floats(1, "roi")?)
    {
        if r.len() != 2 * n {
            return Err(op_err!("roi {r:?} needs two entries for each of {n} axes"));
        }
        for (i, &d) in axes.iter().enumerate() {
            (roi[d], roi[d + rank]) = (r[i], r[i + n]);
        }
    }

    let mut scales = vec![1.0; rank];
    let mut sizes = shape.clone();
    match (given(cx.const_floats(2, "scales")?), given(cx.const_ints(3, "sizes")?)) {
        (Some(s), None) => {
            if s.len() != n || s.iter().any(|&v| v <= 0.0) {
                return Err(op_err!("scales {s:?} need one positive entry for each of {n} axes"));
            }
            for (&d, &v) in axes.iter().zip(&s) {
                scales[d] = v;
                sizes[d] = (shape[d] as f64 * v).floor() as usize;
            }
        }
        (None, Some(s)) => {
            if s.len() != n || s.iter().any(|&v| v < 0) {
                return Err(op_err!("sizes {s:?} need one entry for each of {n} axes"));
            }
            let ratio = |i: usize| s[i] as f64 / shape[axes[i]] as f64;
            // keep_aspect_ratio_policy scales every axis alike, rounding sizes half up.
            let common = match policy.as_str() {
                "not_larger" => Some((0..n).map(ratio).fold(f64::INFINITY, f64::min)),
                "not_smaller" => Some((0..n).map(ratio).fold(0.0, f64::max)),
                _ => None,
            };
            for (i, &d) in axes.iter().enumerate() {
                (scales[d], sizes[d]) = match common {
                    Some(c) => (c, (c * shape[d] as f64 + 0.5).floor() as usize),
                    None => (ratio(i), s[i] as usize),
                };
            }
        }
        (Some(_), Some(_)) => return Err(op_err!("only one of scales and sizes may be given")),
        (None, None) => return Err(op_err!("one of scales and sizes is required")),
    }
    if let Some(d) = (0..rank).find(|&d| shape[d] == 0 && sizes[d] > 0) {
        return Err(op_err!("axis {d} is empty and cannot be resized"));
    }

    let attrs = Attrs::new()
        .with("mode", AttrValue::Text(mode))
        .with("coordinate_transformation_mode", AttrValue::Text(coord))
        .with("nearest_mode", AttrValue::Text(nearest))
        .with("cubic_coeff_a", float(a, "cubic_coeff_a", -0.75)?)
        .with("exclude_outside", AttrValue::Int(a.int_or("exclude_outside", 0)?))
        .with("extrapolation_value", float(a, "extrapolation_value", 0.0)?)
        .with("antialias", AttrValue::Int(antialias))
        .with("scales", AttrValue::Floats(scales))
        .with("sizes", AttrValue::Ints(sizes.iter().map(|&s| s as i64).collect()))
        .with("roi", AttrValue::Floats(roi));
    node.attrs = attrs;
    node.inputs.truncate(1);
    Ok(())
}

fn infer_resize(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("input 0 is required"))?;
    let sizes = node
        .attrs
        .ints("sizes")?
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| op_err!("sizes hold {s}")))
        .collect::<OpResult<Vec<_>>>()?;
    if sizes.len() != x.shape.len() {
        return Err(op_err!("sizes {sizes:?} do not match rank {}", x.shape.len()));
    }
    Ok(vec![TensorDesc::new(x.dtype, sizes)])
}

#[cfg(test)]
mod tests;
