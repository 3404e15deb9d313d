//! Pooling: MaxPool, AveragePool, LpPool and their Global forms, RoiAlign (a pool over each
//! region of interest, `roi_align.rs`) and MaxUnpool (`unpool.rs`). Attribute defaults and shape rules; the kernels
//! are in `ops/src/pool/cpu.rs`.
//!
//! Canonical attributes are exactly what the kernels read: `kernel_shape`, `strides`,
//! `dilations`, explicit `pads` (auto_pad resolved, as for Conv) and `ceil_mode` (0 whenever
//! auto_pad chose the pads: the SAME and VALID output sizes are the floor ones), plus
//! MaxPool's `storage_order`, AveragePool's `count_include_pad` and LpPool's and
//! GlobalLpPool's `p`. GlobalAveragePool and GlobalMaxPool have none. RoiAlign's are
//! `coordinate_transformation_mode` (opset 10's implied `output_half_pixel`, else the model's
//! or `half_pixel`), `mode`, `output_height`, `output_width`, `sampling_ratio` and
//! `spatial_scale`, all explicit.

pub(crate) mod cpu;
pub(crate) mod roi_align;
pub(crate) mod unpool;
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
use crate::conv::{Window, canonical_window};
use crate::lower::{LowerCx, OpResult, op_err};
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("MaxPool", lower_pool, infer_pool),
    OpDef::new("AveragePool", lower_pool, infer_pool),
    OpDef::new("LpPool", lower_pool, infer_pool),
    OpDef::new("GlobalMaxPool", lower_global, infer_global),
    OpDef::new("GlobalAveragePool", lower_global, infer_global),
    OpDef::new("GlobalLpPool", lower_global, infer_global),
    OpDef::new("RoiAlign", roi_align::lower, roi_align::infer),
    OpDef::new("MaxUnpool", unpool::lower, unpool::infer),
];

/// X's spatial extents: X is [N, C, D1, ..] with at least one spatial dim.
fn spatial(x: &TensorDesc) -> OpResult<&[usize]> {
    match x.shape.get(2..) {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(op_err!("X {:?} needs N, C and at least one spatial dim", x.shape)),
    }
}

/// LpPool's `p`: an integer since opset 2; a float holding an integer is accepted.
fn p_attr(node: &Node) -> OpResult<AttrValue> {
    let p = match node.attrs.get("p") {
        None => 2,
        Some(AttrValue::Int(p)) => *p,
        Some(AttrValue::Float(p)) if p.fract() == 0.0 => *p as i64,
        Some(other) => return Err(op_err!("p = {other:?} must be an integer")),
    };
    if p < 1 {
        return Err(op_err!("p = {p} must be positive"));
    }
    Ok(AttrValue::Int(p))
}

fn lower_pool(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let input = spatial(cx.input(0)?)?.to_vec();
    let ceil = node.attrs.int_or("ceil_mode", 0)?;
    let extra = match node.op.as_str() {
        "MaxPool" => ("storage_order", AttrValue::Int(node.attrs.int_or("storage_order", 0)?)),
        "AveragePool" => {
            ("count_include_pad", AttrValue::Int(node.attrs.int_or("count_include_pad", 0)?))
        }
        _ => ("p", p_attr(node)?),
    };
    let auto = canonical_window(node, &input, None)?;
    let mut attrs = Attrs::new();
    for name in ["kernel_shape", "strides", "dilations", "pads"] {
        if let Some(v) = node.attrs.get(name) {
            attrs.set(name, v.clone());
        }
    }
    attrs.set("ceil_mode", AttrValue::Int(if auto { 0 } else { ceil }));
    attrs.set(extra.0, extra.1);
    node.attrs = attrs;
    Ok(())
}

fn lower_global(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    let p = (node.op == "GlobalLpPool").then(|| p_attr(node)).transpose()?;
    node.attrs = Attrs::new();
    if let Some(p) = p {
        node.attrs.set("p", p);
    }
    Ok(())
}

fn infer_pool(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("X is required"))?;
    let input = spatial(x)?;
    let win = Window::of(node, input.len())?;
    let out = win.output(input, node.attrs.int("ceil_mode")? != 0)?;
    let shape = [&x.shape[..2], &out].concat();
    let mut outs = vec![TensorDesc::new(x.dtype, shape.clone())];
    match node.outputs.len() {
        1 => {}
        2 if node.op == "MaxPool" => outs.push(TensorDesc::new(DType::I64, shape)),
        n => {
            return Err(op_err!(
                "{} has 1 output{}, not {n}",
                node.op,
                if node.op == "MaxPool" { " or 2" } else { "" }
            ));
        }
    }
    Ok(outs)
}

fn infer_global(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("X is required"))?;
    if x.shape.len() < 2 {
        return Err(op_err!("X {:?} needs N and C", x.shape));
    }
    let shape: Vec<usize> =
        x.shape.iter().enumerate().map(|(i, &d)| if i < 2 { d } else { 1 }).collect();
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::tests::{f32, ints, lower_and_infer, node};

    fn def(op: &str) -> &'static OpDef {
        OPS.iter().find(|d| d.name == op).unwrap()
    }

    #[test]
    fn max_pool_ceil_mode_and_indices() {
        // ONNX test_maxpool_2d_ceil: 4x4, kernel 3, stride 2, ceil -> 2x2.
        let x = f32(&[1, 1, 4, 4]);
        let attrs = Attrs::new()
            .with("kernel_shape", ints(&[3, 3]))
            .with("strides", ints(&[2, 2]))
            .with("ceil_mode", AttrValue::Int(1));
        let mut n = node("MaxPool", 1, 2, attrs);
        let out = lower_and_infer(def("MaxPool"), &mut n, &[Some(&x)]);
        assert_eq!(out, [f32(&[1, 1, 2, 2]), TensorDesc::new(DType::I64, [1, 1, 2, 2])]);
        let expected = Attrs::new()
            .with("kernel_shape", ints(&[3, 3]))
            .with("strides", ints(&[2, 2]))
            .with("dilations", ints(&[1, 1]))
            .with("pads", ints(&[0, 0, 0, 0]))
            .with("ceil_mode", AttrValue::Int(1))
            .with("storage_order", AttrValue::Int(0));
        assert_eq!(n.attrs, expected);
        // test_maxpool_2d_ceil_output_size_reduce_by_one: 2x2, kernel 1, stride 2 -> 1x1
        // (a second window would start past the input).
        let attrs = Attrs::new()
            .with("kernel_shape", ints(&[1, 1]))
            .with("strides", ints(&[2, 2]))
            .with("ceil_mode", AttrValue::Int(1));
        let mut n = node("MaxPool", 1, 1, attrs);
        assert_eq!(
            lower_and_infer(def("MaxPool"), &mut n, &[Some(&f32(&[1, 1, 2, 2]))]),
            [f32(&[1, 1, 1, 1])]
        );
    }

    #[test]
    fn auto_pad_becomes_pads_and_floor_mode() {
        // 5 wide, kernel 2, stride 1: total padding 1, at the end for SAME_UPPER.
        let x = f32(&[1, 3, 5, 5]);
        for (mode, pads, shape) in [
            ("SAME_UPPER", [0, 0, 1, 1], [1, 3, 5, 5]),
            ("SAME_LOWER", [1, 1, 0, 0], [1, 3, 5, 5]),
            ("VALID", [0, 0, 0, 0], [1, 3, 4, 4]),
        ] {
            let attrs = Attrs::new()
                .with("kernel_shape", ints(&[2, 2]))
                .with("auto_pad", AttrValue::Text(mode.into()))
                .with("ceil_mode", AttrValue::Int(1));
            let mut n = node("AveragePool", 1, 1, attrs);
            assert_eq!(lower_and_infer(def("AveragePool"), &mut n, &[Some(&x)]), [f32(&shape)]);
            assert_eq!(n.attrs.ints("pads").unwrap(), &pads, "{mode}");
            assert_eq!(n.attrs.int("ceil_mode").unwrap(), 0);
            assert_eq!(n.attrs.int("count_include_pad").unwrap(), 0);
            assert!(!n.attrs.contains("auto_pad"));
        }
    }

    #[test]
    fn lp_and_global_pools() {
        let x = f32(&[2, 3, 7]);
        let attrs = Attrs::new().with("kernel_shape", ints(&[3])).with("pads", ints(&[1, 1]));
        let mut n = node("LpPool", 1, 1, attrs);
        assert_eq!(lower_and_infer(def("LpPool"), &mut n, &[Some(&x)]), [f32(&[2, 3, 7])]);
        assert_eq!(n.attrs.int("p").unwrap(), 2);
        let x = f32(&[2, 3, 4, 5, 6]);
        for op in ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"] {
            let mut n = node(op, 1, 1, Attrs::new());
            assert_eq!(lower_and_infer(def(op), &mut n, &[Some(&x)]), [f32(&[2, 3, 1, 1, 1])]);
        }
        // A window larger than the padded input has no output.
        let x = f32(&[1, 1, 4]);
        let mut bad = node("AveragePool", 1, 1, Attrs::new().with("kernel_shape", ints(&[9])));
        let cx = LowerCx { opset: 21, inputs: vec![Some(&x)], consts: vec![None] };
        lower_pool(&mut bad, &cx).unwrap();
        assert!(infer_pool(&bad, &[&x]).is_err());
    }
}
