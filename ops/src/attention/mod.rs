//! Attention (opsets 23 to 25): scaled dot-product attention with grouped key/value heads,
//! masks, caches and soft-capping. Attribute defaults and operand checks; the sizes both
//! stages read are parsed in `geometry.rs`, the kernels are in `cpu.rs` and `vulkan.rs`.
//!
//! Canonical form (what the kernels read):
//! - inputs: Q, K, V, then only the optional inputs that are present, in ONNX order:
//!   attn_mask, past_key and past_value (together), nonpad_kv_seqlen; the flags
//!   `has_attn_mask`, `has_past_kv`, `has_nonpad_kv_seqlen` say which.
//! - attributes: `q_num_heads`, `kv_num_heads` (from the shapes of 4-D inputs), `scale`
//!   (1/sqrt(head size) where the model leaves it out), `is_causal`, `softcap` (0: none),
//!   `qk_matmul_output_mode` (as ONNX's reference and node tests read it: 0 and 1 the
//!   soft-capped scores, 2 with the bias added, 3 the probabilities), `softmax_precision`
//!   (ONNX's number of Q's element type where left out),
//!   `left_window_size` and `right_window_size` (opset 25; -1: unbounded).
//! - outputs: as in the model (Y, present_key, present_value, qk_matmul_output); the kernel
//!   computes every one it is given.

pub(crate) mod cpu;
mod geometry;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    // Every output element reads whole rows of Q, K and V.
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::registry::{Family, OpDef, never};
use geometry::Geometry;
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[OpDef::new("Attention", lower, infer)];

/// ONNX's numbers for the element types softmax_precision may name.
const PRECISIONS: &[(i64, DType)] = &[(1, DType::F32), (10, DType::F16), (11, DType::F64)];

fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    for (i, what) in ["Q", "K", "V"].iter().enumerate() {
        if !cx.has_input(i) {
            return Err(op_err!("Attention needs its {what} input"));
        }
    }
    let most = if cx.opset >= 24 { 7 } else { 6 };
    if node.inputs.iter().skip(most).any(Option::is_some) {
        return Err(op_err!("Attention takes at most {most} inputs at opset {}", cx.opset));
    }
    let (has_mask, has_past, has_nonpad) = (cx.has_input(3), cx.has_input(4), cx.has_input(6));
    if has_past != cx.has_input(5) {
        return Err(op_err!("past_key and past_value must be given together"));
    }
    if has_nonpad && has_past {
        return Err(op_err!("nonpad_kv_seqlen cannot be combined with past_key/past_value"));
    }
    let (q, k) = (&cx.input(0)?.shape, &cx.input(1)?.shape);
    let a = &node.attrs;
    let (q_heads, kv_heads, head) = match (q.as_slice(), k.as_slice()) {
        ([_, h, _, d], [_, hk, _, _]) => (*h as i64, *hk as i64, *d),
        ([_, _, hidden], [_, _, _]) => {
            let (hq, hkv) = (a.int_or("q_num_heads", 0)?, a.int_or("kv_num_heads", 0)?);
            if hq <= 0 || hkv <= 0 || *hidden as i64 % hq != 0 {
                return Err(op_err!(
                    "3-D inputs need q_num_heads and kv_num_heads, positive and dividing the \
                     hidden sizes; got {hq} and {hkv} for Q of hidden size {hidden}"
                ));
            }
            (hq, hkv, *hidden / hq as usize)
        }
        _ => {
            return Err(op_err!("Q and K must be both 3-D or both 4-D, got {q:?} and {k:?}"));
        }
    };
    let scale = match a.get("scale") {
        Some(_) => a.float("scale")? as f64,
        None => 1.0 / (head as f64).sqrt(),
    };
    let mode = a.int_or("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(op_err!("qk_matmul_output_mode must be 0 to 3, got {mode}"));
    }
    let q_type = cx.input(0)?.dtype;
    let own = PRECISIONS.iter().find(|p| p.1 == q_type).map_or(1, |p| p.0);
    let precision = a.int_or("softmax_precision", own)?;
    if !PRECISIONS.iter().any(|p| p.0 == precision) {
        return Err(op_err!(
            "softmax_precision {precision} is not float (1), float16 (10) or double (11)"
        ));
    }
    let window = |name| -> OpResult<i64> {
        match a.int_or(name, -1)? {
            w if w >= -1 => Ok(w),
            w => Err(op_err!("{name} must be -1 or nonnegative, got {w}")),
        }
    };
    let flag = |b: bool| AttrValue::Int(b.into());
    let attrs = Attrs::new()
        .with("has_attn_mask", flag(has_mask))
        .with("has_past_kv", flag(has_past))
        .with("has_nonpad_kv_seqlen", flag(has_nonpad))
        .with("q_num_heads", AttrValue::Int(q_heads))
        .with("kv_num_heads", AttrValue::Int(kv_heads))
        .with("is_causal", flag(a.int_or("is_causal", 0)? != 0))
        .with("qk_matmul_output_mode", AttrValue::Int(mode))
        .with("scale", AttrValue::Float(scale))
        .with("softcap", AttrValue::Float(a.float_or("softcap", 0.0)? as f64))
        .with("softmax_precision", AttrValue::Int(precision))
        .with("left_window_size", AttrValue::Int(window("left_window_size")?))
        .with("right_window_size", AttrValue::Int(window("right_window_size")?));
    node.inputs = node.inputs.iter().take(most).copied().flatten().map(Some).collect();
    node.attrs = attrs;
    Ok(())
}

/// Y, present_key, present_value and qk_matmul_output, as many as the node has, after
/// checking every operand.
fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|d| d.shape.as_slice()).collect();
    let g = Geometry::new(&node.attrs, &shapes).map_err(|e| op_err!("{e}"))?;
    let t = inputs[0].dtype;
    if !matches!(t, DType::F32 | DType::F16 | DType::F64) {
        return Err(op_err!("Attention takes float Q, K and V, got {t}"));
    }
    let mut at = 1;
    let mut check = |what: &str, ok: &dyn Fn(DType) -> bool| -> OpResult<()> {
        match inputs.get(at) {
            Some(d) if !ok(d.dtype) => {
                Err(op_err!("{what} is {}, which does not fit Q's {t}", d.dtype))
            }
            _ => {
                at += 1;
                Ok(())
            }
        }
    };
    check("K", &|d| d == t)?;
    check("V", &|d| d == t)?;
    if g.mask.is_some() {
        check("attn_mask", &|d| d == t || d == DType::Bool)?;
    }
    if g.past > 0 || node.attrs.int("has_past_kv")? != 0 {
        check("past_key", &|d| d == t)?;
        check("past_value", &|d| d == t)?;
    }
    if g.nonpad {
        check("nonpad_kv_seqlen", &|d| d == DType::I64)?;
    }
    let shapes = [g.y_shape(), g.present_key_shape(), g.present_value_shape(), g.qk_shape()];
    match node.outputs.len() {
        n @ 1..=4 => Ok(shapes.into_iter().take(n).map(|s| TensorDesc::new(t, s)).collect()),
        n => Err(op_err!("Attention has 1 to 4 outputs, got {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(inputs: Vec<Option<usize>>, outputs: usize, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: "Attention".into(),
            domain: String::new(),
            inputs,
            outputs: (10..10 + outputs).collect(),
            attrs,
        }
    }

    /// Lowers then infers, as the compiler's passes do (a bool mask, an int64
    /// nonpad_kv_seqlen).
    fn run(n: &mut Node, opset: i64, inputs: &[&[usize]]) -> OpResult<Vec<TensorDesc>> {
        let descs: Vec<TensorDesc> = inputs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let t = [(3, DType::Bool), (6, DType::I64)].iter().find(|p| p.0 == i);
                TensorDesc::new(t.map_or(DType::F32, |p| p.1), s.to_vec())
            })
            .collect();
        let cx = LowerCx {
            opset,
            inputs: n.inputs.iter().map(|i| i.map(|i| &descs[i])).collect(),
            consts: vec![None; n.inputs.len()],
        };
        lower(n, &cx)?;
        let present: Vec<&TensorDesc> = n.present_inputs().map(|i| &descs[i]).collect();
        infer(n, &present)
    }

    #[test]
    fn defaults_become_explicit() {
        // 4-D with an omitted mask and caches, nonpad_kv_seqlen given; Y and the scores.
        let inputs = vec![Some(0), Some(1), Some(2), None, None, None, Some(6)];
        let mut n = node(inputs, 4, Attrs::new().with("is_causal", AttrValue::Int(3)));
        let shapes: [&[usize]; 7] =
            [&[2, 4, 3, 16], &[2, 2, 5, 16], &[2, 2, 5, 6], &[], &[], &[], &[2]];
        let out = run(&mut n, 24, &shapes).unwrap();
        let f = |s: &[usize]| TensorDesc::new(DType::F32, s.to_vec());
        assert_eq!(out, [f(&[2, 4, 3, 6]), f(&[2, 2, 5, 16]), f(&[2, 2, 5, 6]), f(&[2, 4, 3, 5])]);
        assert_eq!(n.inputs, [Some(0), Some(1), Some(2), Some(6)]);
        let a = &n.attrs;
        assert_eq!((a.int("q_num_heads").unwrap(), a.int("kv_num_heads").unwrap()), (4, 2));
        assert_eq!((a.int("is_causal").unwrap(), a.int("has_nonpad_kv_seqlen").unwrap()), (1, 1));
        assert_eq!(a.float("scale").unwrap(), 0.25);
        assert_eq!(a.int("softmax_precision").unwrap(), 1);
        assert_eq!(a.int("left_window_size").unwrap(), -1);
        // 3-D with a mask and caches: the heads come from the attributes.
        let heads = Attrs::new()
            .with("q_num_heads", AttrValue::Int(3))
            .with("kv_num_heads", AttrValue::Int(3))
            .with("scale", AttrValue::Float(0.5));
        let mut n = node((0..6).map(Some).collect(), 3, heads);
        let shapes: [&[usize]; 6] =
            [&[2, 4, 24], &[2, 6, 24], &[2, 6, 30], &[4, 18], &[2, 3, 12, 8], &[2, 3, 12, 10]];
        let out = run(&mut n, 23, &shapes).unwrap();
        assert_eq!(out, [f(&[2, 4, 30]), f(&[2, 3, 18, 8]), f(&[2, 3, 18, 10])]);
        assert_eq!(n.attrs.float("scale").unwrap(), 0.5);
        assert_eq!(n.attrs.int("has_past_kv").unwrap(), 1);
    }

    #[test]
    fn bad_nodes_are_refused() {
        let shapes: [&[usize]; 3] = [&[2, 4, 24], &[2, 6, 24], &[2, 6, 24]];
        let err = run(&mut node((0..3).map(Some).collect(), 1, Attrs::new()), 23, &shapes);
        assert!(err.unwrap_err().0.contains("q_num_heads"));
        let four: [&[usize]; 6] =
            [&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8], &[4, 6], &[2, 3, 1, 8], &[2, 3, 1, 8]];
        let half_cache = vec![Some(0), Some(1), Some(2), None, Some(4), None];
        let err = run(&mut node(half_cache, 1, Attrs::new()), 23, &four).unwrap_err();
        assert!(err.0.contains("together"), "{err}");
        let mode = Attrs::new().with("qk_matmul_output_mode", AttrValue::Int(4));
        let err = run(&mut node((0..3).map(Some).collect(), 1, mode), 23, &four[..3]).unwrap_err();
        assert!(err.0.contains("qk_matmul_output_mode"), "{err}");
        let err = run(&mut node((0..3).map(Some).collect(), 5, Attrs::new()), 23, &four[..3]);
        assert!(err.unwrap_err().0.contains("1 to 4 outputs"));
        let mut bad_mask = four;
        bad_mask[3] = &[5, 6];
        let err = run(&mut node((0..4).map(Some).collect(), 1, Attrs::new()), 23, &bad_mask[..4]);
        assert!(err.unwrap_err().0.contains("does not broadcast"));
    }
}
