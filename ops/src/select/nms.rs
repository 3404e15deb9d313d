//! NonMaxSuppression (opsets 10, 11 to 24): per batch and class, the boxes that score above
//! a threshold, best first, each kept unless it overlaps one kept before by more than an IoU
//! threshold. How many it keeps depends on the data: the output is planned for its upper
//! bound and the op writes how many rows it filled (see `crate::bounded`).
//!
//! Canonical form (what `cpu.rs` reads):
//! - inputs: boxes [B, N, 4] and scores [B, C, N] (f32), then those of
//!   `max_output_boxes_per_class`, `iou_threshold` and `score_threshold` that are computed at
//!   run time, in that order.
//! - attributes: `center_point_box` (0: corners [y1, x1, y2, x2] in either order; 1: [x, y,
//!   w, h]); `filter_scores` (1 when a score threshold is given); and each of the three
//!   scalars that is a constant (or omitted: 0, 0.0, none) as an attribute of its name; a
//!   scalar without its attribute is the next run-time input.
//! - outputs: selected_indices [bound, 3] int64, rows (batch, class, box) in ONNX's order, the
//!   rows past the count zero; then the count, an int64 scalar. `bound` is B x C x
//!   min(N, max_output_boxes_per_class) where that is a constant, else B x C x N. The
//!   compiler appends the count output to the model's node.

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, checked_product, op_err};
use ingot_schema::{AttrValue, Attrs, DType};

/// The three scalar operands (inputs 2 to 4) by name.
pub(crate) const SCALARS: [&str; 3] =
    ["max_output_boxes_per_class", "iou_threshold", "score_threshold"];

pub(super) fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if node.inputs.len() < 2 || node.inputs.len() > 5 {
        return Err(op_err!("NonMaxSuppression takes 2 to 5 inputs, got {}", node.inputs.len()));
    }
    let center = node.attrs.int_or("center_point_box", 0)?;
    if !matches!(center, 0 | 1) {
        return Err(op_err!("center_point_box must be 0 or 1, got {center}"));
    }
    let mut attrs = Attrs::new()
        .with("center_point_box", AttrValue::Int(center))
        .with("filter_scores", AttrValue::Int(i64::from(cx.has_input(4))));
    let mut inputs = node.inputs[..2].to_vec();
    for (k, name) in SCALARS.into_iter().enumerate() {
        let i = k + 2;
        if !cx.has_input(i) {
            // Omitted: no boxes kept per class, IoU threshold 0, no score filter.
            if k == 0 {
                attrs.set(name, AttrValue::Int(0));
            } else if k == 1 {
                attrs.set(name, AttrValue::Float(0.0));
            }
            continue;
        }
        let desc = cx.input(i)?;
        if desc.elements() != 1 {
            return Err(op_err!("{name} (input {i}) must hold one value, got {:?}", desc.shape));
        }
        let want = if k == 0 { DType::I64 } else { DType::F32 };
        if desc.dtype != want {
            return Err(op_err!("{name} (input {i}) must be {want}, got {}", desc.dtype));
        }
        match cx.consts.get(i).copied().flatten() {
            Some(c) if k == 0 => {
                let v = c.to_i64s().and_then(|v| v.first().copied()).unwrap_or(0);
                attrs.set(name, AttrValue::Int(v.max(0)));
            }
            Some(c) => {
                let v = c.to_f64s().and_then(|v| v.first().copied()).unwrap_or(0.0);
                attrs.set(name, AttrValue::Float(v));
            }
            None => inputs.push(node.inputs[i]),
        }
    }
    node.attrs = attrs;
    node.inputs = inputs;
    Ok(())
}

/// Boxes [B, N, 4] and scores [B, C, N] as (B, C, N), checked.
pub(crate) fn dims(boxes: &TensorDesc, scores: &TensorDesc) -> OpResult<(usize, usize, usize)> {
    if boxes.dtype != DType::F32 || scores.dtype != DType::F32 {
        return Err(op_err!(
            "NonMaxSuppression takes f32 boxes and scores, got {} and {}",
            boxes.dtype,
            scores.dtype
        ));
    }
    match (&boxes.shape[..], &scores.shape[..]) {
        (&[b, n, 4], &[b2, c, n2]) if b == b2 && n == n2 => Ok((b, c, n)),
        _ => Err(op_err!(
            "boxes must be [B, N, 4] and scores [B, C, N], got {:?} and {:?}",
            boxes.shape,
            scores.shape
        )),
    }
}

/// Rows of selected_indices planned for: every box of every class where the count per class
/// is not a constant.
pub(crate) fn bound(attrs: &Attrs, (b, c, n): (usize, usize, usize)) -> OpResult<usize> {
    let per_class = match attrs.contains("max_output_boxes_per_class") {
        true => n.min(usize::try_from(attrs.int("max_output_boxes_per_class")?).unwrap_or(0)),
        false => n,
    };
    checked_product(&[b, c, per_class]).ok_or_else(|| op_err!("{b} x {c} x {n} boxes overflow"))
}

/// Which scalars are run-time inputs, in order.
pub(crate) fn runtime_scalars(attrs: &Attrs) -> impl Iterator<Item = &'static str> + '_ {
    let filter = attrs.int_or("filter_scores", 0) == Ok(1);
    SCALARS.into_iter().filter(move |&s| !attrs.contains(s) && (s != "score_threshold" || filter))
}

pub(super) fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let runtime = runtime_scalars(&node.attrs).count();
    let [boxes, scores, rest @ ..] = inputs else {
        return Err(op_err!(
            "NonMaxSuppression takes boxes and scores, got {} inputs",
            inputs.len()
        ));
    };
    if rest.len() != runtime {
        return Err(op_err!(
            "NonMaxSuppression reads {runtime} scalars at run time, got {} inputs for them",
            rest.len()
        ));
    }
    let bound = bound(&node.attrs, dims(boxes, scores)?)?;
    Ok(vec![TensorDesc::new(DType::I64, [bound, 3]), TensorDesc::new(DType::I64, [])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;
    use crate::node::Constant;
    use std::sync::Arc;

    /// Lowers then infers; `consts[k]` is input k's value where it is a constant.
    fn run(inputs: usize, consts: &[Option<Tensor>]) -> OpResult<(Node, Vec<TensorDesc>)> {
        let descs = [
            TensorDesc::new(DType::F32, [2, 5, 4]),
            TensorDesc::new(DType::F32, [2, 3, 5]),
            TensorDesc::new(DType::I64, [1]),
            TensorDesc::new(DType::F32, [1]),
            TensorDesc::new(DType::F32, []),
        ];
        let mut n = Node {
            name: "nms".into(),
            op: "NonMaxSuppression".into(),
            domain: String::new(),
            inputs: (0..inputs).map(Some).collect(),
            outputs: vec![10, 11],
            attrs: Attrs::new(),
        };
        let consts: Vec<Option<Arc<Tensor>>> =
            (0..inputs).map(|k| consts.get(k).cloned().flatten().map(Arc::new)).collect();
        let cx = LowerCx {
            opset: 11,
            inputs: (0..inputs).map(|k| Some(&descs[k])).collect(),
            consts: consts.iter().map(|c| c.as_ref().map(|c| c as &dyn Constant)).collect(),
        };
        lower(&mut n, &cx)?;
        let present: Vec<&TensorDesc> = n.present_inputs().map(|i| &descs[i]).collect();
        let out = infer(&n, &present)?;
        Ok((n, out))
    }

    #[test]
    fn constant_scalars_become_attributes_and_bound_the_output() {
        let max = Tensor::from_vec(vec![1], &[2i64]).unwrap();
        let iou = Tensor::from_vec(vec![1], &[0.5f32]).unwrap();
        let (n, out) = run(4, &[None, None, Some(max), Some(iou)]).unwrap();
        assert_eq!(n.inputs, [Some(0), Some(1)]);
        assert_eq!(n.attrs.int("max_output_boxes_per_class").unwrap(), 2);
        assert_eq!(n.attrs.int("filter_scores").unwrap(), 0);
        // 2 batches x 3 classes x min(5 boxes, 2).
        assert_eq!(out[0], TensorDesc::new(DType::I64, [12, 3]));
        assert_eq!(out[1], TensorDesc::new(DType::I64, []));
    }

    #[test]
    fn run_time_scalars_stay_inputs_and_the_bound_is_every_box() {
        let (n, out) = run(5, &[]).unwrap();
        assert_eq!(n.inputs, [Some(0), Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(runtime_scalars(&n.attrs).collect::<Vec<_>>(), SCALARS);
        assert_eq!(out[0].shape, [30, 3]);
        // Omitted: nothing kept per class.
        let (n, out) = run(2, &[]).unwrap();
        assert_eq!(n.attrs.int("max_output_boxes_per_class").unwrap(), 0);
        assert_eq!(runtime_scalars(&n.attrs).count(), 0);
        assert_eq!(out[0].shape, [0, 3]);
    }
}
