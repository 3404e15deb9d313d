//! Resize (opsets 11 to 21): defaults, and the roi/scales/sizes operands turned into
//! attributes with the output size computed here. The kernel is `ops/src/resize/cpu.rs`.
//! GridSample (opsets 16 to 22), which samples at the positions a grid gives instead of a
//! scale's, and AffineGrid (opset 20), which makes such a grid from affine matrices:
//! `ops/src/resize/grid_sample.rs`.
//!
//! Canonical attributes: `mode`, `coordinate_transformation_mode`, `nearest_mode`,
//! `cubic_coeff_a`, `exclude_outside`, `extrapolation_value`, `antialias`, and one entry per
//! axis of the input in `scales` (the factor coordinates are mapped with), `sizes` (the output
//! shape) and `roi` (starts then ends; `[0.., 1..]` unless tf_crop_and_resize uses one).
//! `axes` and `keep_aspect_ratio_policy` (opset 18) are resolved away; only X remains.

pub(crate) mod cpu;
mod grid_sample;
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

pub const OPS: &[OpDef] = &[
    OpDef::new("Resize", lower_resize, infer_resize),
    OpDef::new("Upsample", lower_upsample, infer_resize)
        .cpu_only("lowering turns Upsample into Resize"),
    OpDef::new("GridSample", lower_grid_sample, infer_grid_sample),
    OpDef::new("AffineGrid", lower_affine_grid, infer_affine_grid),
];

/// AffineGrid: the constant `size` (N, C, spatial dims) read into an attribute.
fn lower_affine_grid(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let size = cx.const_ints(1, "size")?.ok_or_else(|| op_err!("size (input 1) is required"))?;
    if let Some(d) = size.iter().find(|&&d| d < 1) {
        return Err(op_err!("size {size:?} has {d}"));
    }
    let align = node.attrs.int_or("align_corners", 0)? != 0;
    node.attrs = Attrs::new()
        .with("size", AttrValue::Ints(size))
        .with("align_corners", AttrValue::Int(align as i64));
    node.inputs.truncate(1);
    Ok(())
}

/// theta `[N, r, r + 1]` for size `[N, C, d1..dr]` (r 2 or 3) gives `[N, d1..dr, r]`.
fn infer_affine_grid(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [theta] = inputs else {
        return Err(op_err!("expects theta, got {} inputs", inputs.len()));
    };
    let size: Vec<usize> = node.attrs.ints("size")?.iter().map(|&d| d as usize).collect();
    let r = size.len().saturating_sub(2);
    if !matches!(r, 2 | 3) || theta.shape != [size[0], r, r + 1] || !theta.dtype.is_float() {
        return Err(op_err!(
            "theta {} {:?} for size {size:?}: it must be [N, 2, 3] (2-D) or [N, 3, 4] (3-D)",
            theta.dtype,
            theta.shape
        ));
    }
    let shape = [&size[..1], &size[2..], &[r]].concat();
    Ok(vec![TensorDesc::new(theta.dtype, shape)])
}

/// GridSample: `mode` in opset 20's names (opset 16 says `bilinear` and `bicubic`),
/// `padding_mode`, `align_corners`.
fn lower_grid_sample(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let a = &node.attrs;
    let old = cx.opset < 20;
    let mode = match a.text_or("mode", if old { "bilinear" } else { "linear" })? {
        "bilinear" if old => "linear",
        "bicubic" if old => "cubic",
        m @ ("linear" | "cubic") if !old => m,
        "nearest" => "nearest",
        other => return Err(op_err!("mode {other} is not one of opset {}'s", cx.opset)),
    };
    let padding = text(a, "padding_mode", "zeros", &["zeros", "border", "reflection"])?;
    let align = a.int_or("align_corners", 0)? != 0;
    node.attrs = Attrs::new()
        .with("mode", AttrValue::Text(mode.into()))
        .with("padding_mode", AttrValue::Text(padding))
        .with("align_corners", AttrValue::Int(align as i64));
    Ok(())
}

/// `[N, C, d1..dr]` sampled at a grid `[N, h1..hr, r]` gives `[N, C, h1..hr]`.
fn infer_grid_sample(_: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let [x, grid] = inputs else {
        return Err(op_err!("expects X and grid, got {} inputs", inputs.len()));
    };
    let r = x.shape.len().saturating_sub(2);
    let g = &grid.shape;
    if r == 0 || g.len() != r + 2 || g[0] != x.shape[0] || g[r + 1] != r {
        return Err(op_err!(
            "grid {g:?} does not fit X {:?}: it must be [N, h1..hr, r] for r spatial dims",
            x.shape
        ));
    }
    if !grid.dtype.is_float() {
        return Err(op_err!("grid of {}: positions are floats", grid.dtype));
    }
    let shape = [&x.shape[..2], &g[1..=r]].concat();
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

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

/// Upsample (opsets 7 to 9), which Resize replaced: a Resize by `scales` (an attribute before
/// opset 9, input 1 from 9) with asymmetric coordinates and nearest rounding down, which is
/// what Upsample and opset 10's Resize mean. Each output dim is the input's times its scale,
/// rounded down.
fn lower_upsample(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = cx.input(0)?.shape.clone();
    let scales = match cx.opset {
        ..9 => Some(node.attrs.floats("scales")?.to_vec()),
        _ => cx.const_floats(1, "scales")?,
    };
    let scales = scales.ok_or_else(|| op_err!("scales (input 1) is required"))?;
    if scales.len() != shape.len() || scales.iter().any(|&s| s < 1.0) {
        return Err(op_err!("scales {scales:?} need one entry of 1 or more for each of {shape:?}"));
    }
    let mode = match node.attrs.text_or("mode", "nearest")? {
        "nearest" => "nearest",
        "linear" | "bilinear" => "linear",
        other => return Err(op_err!("mode '{other}' is not nearest or linear")),
    };
    let sizes: Vec<i64> =
        shape.iter().zip(&scales).map(|(&d, &s)| (d as f64 * s).floor() as i64).collect();
    let rank = shape.len();
    node.attrs = Attrs::new()
        .with("mode", AttrValue::Text(mode.into()))
        .with("coordinate_transformation_mode", AttrValue::Text("asymmetric".into()))
        .with("nearest_mode", AttrValue::Text("floor".into()))
        .with("cubic_coeff_a", AttrValue::Float(-0.75))
        .with("exclude_outside", AttrValue::Int(0))
        .with("extrapolation_value", AttrValue::Float(0.0))
        .with("antialias", AttrValue::Int(0))
        .with("scales", AttrValue::Floats(scales))
        .with("sizes", AttrValue::Ints(sizes))
        .with("roi", AttrValue::Floats([vec![0.0; rank], vec![1.0; rank]].concat()));
    node.op = "Resize".into();
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
