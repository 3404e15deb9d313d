//! NonMaxSuppression as ONNX Runtime computes it: candidates above the score threshold
//! (strictly), best score first and equal scores by box index, each kept unless its IoU with a
//! box kept before in its class is above the threshold (strictly); a pair whose intersection,
//! area or union is not positive never suppresses.

use crate::cpu::{Kernel, KernelError, OpCx, input, input_f32, output_mut};
use crate::invalid;
use crate::select::nms::{SCALARS, bound, dims, runtime_scalars};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub(super) fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let runtime: Vec<&str> = runtime_scalars(cx.attrs).collect();
    cx.expect_arity(2 + runtime.len()..=2 + runtime.len(), 2)?;
    let (b, c, n) = dims(&cx.inputs[0], &cx.inputs[1]).map_err(|e| invalid!("{e}"))?;
    let rows = bound(cx.attrs, (b, c, n)).map_err(|e| invalid!("{e}"))?;
    for (name, desc) in runtime.iter().zip(&cx.inputs[2..]) {
        let want = if *name == SCALARS[0] { DType::I64 } else { DType::F32 };
        if desc.dtype != want || desc.elements() != 1 {
            return Err(invalid!("{name} must be one {want}, got {} {:?}", desc.dtype, desc.shape));
        }
    }
    let (selected, count) = (&cx.outputs[0], &cx.outputs[1]);
    if selected.dtype != DType::I64 || selected.shape != [rows, 3] {
        return Err(invalid!(
            "NonMaxSuppression declares selected_indices {} {:?}, expected int64 [{rows}, 3]",
            selected.dtype,
            selected.shape
        ));
    }
    if count.dtype != DType::I64 || count.elements() != 1 {
        return Err(invalid!("NonMaxSuppression's count must be one int64"));
    }
    let attr = |name: &str| cx.attrs.get(name).is_some();
    Ok(Box::new(Nms {
        batches: b,
        classes: c,
        boxes: n,
        rows,
        center: cx.attrs.int("center_point_box")? == 1,
        max_per_class: attr(SCALARS[0]).then(|| cx.attrs.int(SCALARS[0])).transpose()?,
        iou: attr(SCALARS[1]).then(|| cx.attrs.float(SCALARS[1])).transpose()?,
        score: match cx.attrs.int("filter_scores")? {
            0 => Threshold::None,
            _ if attr(SCALARS[2]) => Threshold::Fixed(cx.attrs.float(SCALARS[2])?),
            _ => Threshold::Input,
        },
    }))
}

struct Nms {
    batches: usize,
    classes: usize,
    boxes: usize,
    /// Rows of the output: its bound.
    rows: usize,
    center: bool,
    /// Constants; `None` where the scalar is a run-time input.
    max_per_class: Option<i64>,
    iou: Option<f32>,
    score: Threshold,
}

enum Threshold {
    None,
    Fixed(f32),
    Input,
}

/// A box as its extent on each axis and its area.
#[derive(Clone, Copy)]
struct Extent {
    x: (f32, f32),
    y: (f32, f32),
    area: f32,
}

impl Extent {
    fn new(b: &[f32], center: bool) -> Extent {
        let span = |a: f32, b: f32| if a <= b { (a, b) } else { (b, a) };
        let (x, y) = if center {
            ((b[0] - b[2] / 2.0, b[0] + b[2] / 2.0), (b[1] - b[3] / 2.0, b[1] + b[3] / 2.0))
        } else {
            (span(b[1], b[3]), span(b[0], b[2]))
        };
        Extent { x, y, area: (x.1 - x.0) * (y.1 - y.0) }
    }

    /// Whether `self` overlaps `other` by more than `threshold` (intersection over union).
    fn suppresses(&self, other: &Extent, threshold: f32) -> bool {
        let (x0, x1) = (self.x.0.max(other.x.0), self.x.1.min(other.x.1));
        let (y0, y1) = (self.y.0.max(other.y.0), self.y.1.min(other.y.1));
        if x1 <= x0 || y1 <= y0 {
            return false;
        }
        let inter = (x1 - x0) * (y1 - y0);
        let union = self.area + other.area - inter;
        if inter <= 0.0 || self.area <= 0.0 || other.area <= 0.0 || union <= 0.0 {
            return false;
        }
        inter / union > threshold
    }
}

impl Kernel for Nms {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let (b, c, n) = (self.batches, self.classes, self.boxes);
        let boxes = input_f32(inputs, 0, b * n * 4)?;
        let scores = input_f32(inputs, 1, b * c * n)?;
        let mut next = 2;
        let mut scalar = |given: Option<f64>, int: bool| -> Result<f64, KernelError> {
            if let Some(v) = given {
                return Ok(v);
            }
            next += 1;
            Ok(if int {
                input::<i64>(inputs, next - 1, 1)?[0] as f64
            } else {
                f64::from(input_f32(inputs, next - 1, 1)?[0])
            })
        };
        let max = scalar(self.max_per_class.map(|v| v as f64), true)?.max(0.0) as usize;
        let iou = scalar(self.iou.map(f64::from), false)? as f32;
        let score = match self.score {
            Threshold::None => None,
            Threshold::Fixed(t) => Some(t),
            Threshold::Input => Some(scalar(None, false)? as f32),
        };
        let selected = output_mut::<i64>(outputs, 0, self.rows * 3)?;
        let mut rows = 0;
        let mut extents = Vec::with_capacity(n);
        let mut order: Vec<(f32, usize)> = Vec::with_capacity(n);
        let mut kept: Vec<usize> = Vec::new();
        for batch in 0..b {
            extents.clear();
            extents.extend(
                boxes[batch * n * 4..][..n * 4]
                    .chunks_exact(4)
                    .map(|b| Extent::new(b, self.center)),
            );
            for class in 0..c {
                let s = &scores[(batch * c + class) * n..][..n];
                order.clear();
                order.extend(
                    s.iter()
                        .enumerate()
                        .filter(|&(_, &v)| score.is_none_or(|t| v > t))
                        .map(|(i, &v)| (v, i)),
                );
                // Best first, equal scores by index; NaN last.
                order.sort_unstable_by(|a, b| {
                    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
                    key(b.0).total_cmp(&key(a.0)).then(a.1.cmp(&b.1))
                });
                kept.clear();
                for &(_, i) in &order {
                    if kept.len() >= max {
                        break;
                    }
                    if kept.iter().all(|&k| !extents[i].suppresses(&extents[k], iou)) {
                        kept.push(i);
                    }
                }
                for &i in &kept {
                    let row = selected.get_mut(rows * 3..rows * 3 + 3).ok_or_else(|| {
                        invalid!("NonMaxSuppression kept more boxes than its bound {}", self.rows)
                    })?;
                    row.copy_from_slice(&[batch as i64, class as i64, i as i64]);
                    rows += 1;
                }
            }
        }
        selected[rows * 3..].fill(0);
        output_mut::<i64>(outputs, 1, 1)?[0] = rows as i64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    /// Runs a canonical node with constant scalars over boxes [1, N, 4] and scores [1, C, N];
    /// returns the filled rows.
    fn nms(
        boxes: &[[f32; 4]],
        scores: &[&[f32]],
        max: i64,
        iou: f64,
        score: Option<f64>,
        center: bool,
    ) -> Vec<[i64; 3]> {
        let n = boxes.len();
        let mut attrs = Attrs::new()
            .with("center_point_box", AttrValue::Int(center as i64))
            .with("filter_scores", AttrValue::Int(score.is_some() as i64))
            .with("max_output_boxes_per_class", AttrValue::Int(max))
            .with("iou_threshold", AttrValue::Float(iou));
        if let Some(s) = score {
            attrs.set("score_threshold", AttrValue::Float(s));
        }
        let flat: Vec<f32> = boxes.iter().flatten().copied().collect();
        let s: Vec<f32> = scores.iter().flat_map(|s| s.iter().copied()).collect();
        let inputs = [
            Tensor::from_vec(vec![1, n, 4], &flat).unwrap(),
            Tensor::from_vec(vec![1, scores.len(), n], &s).unwrap(),
        ];
        let rows = scores.len() * n.min(max as usize);
        let out = [TensorDesc::new(DType::I64, [rows, 3]), TensorDesc::new(DType::I64, [])];
        let outs = eval("NonMaxSuppression", &attrs, &[&inputs[0], &inputs[1]], &out).unwrap();
        let count = outs[1].to_vec::<i64>().unwrap()[0] as usize;
        let sel = outs[0].to_vec::<i64>().unwrap();
        assert!(sel[count * 3..].iter().all(|&v| v == 0), "rows past the count are zero");
        sel[..count * 3].chunks(3).map(|r| [r[0], r[1], r[2]]).collect()
    }

    #[test]
    fn keeps_the_best_box_of_each_overlapping_group_in_score_order() {
        // Two boxes overlapping by IoU 0.6 (corners given flipped for one), one far away.
        let boxes = [[0.0, 0.0, 1.0, 1.0], [1.0, 1.25, 0.0, 0.25], [5.0, 5.0, 6.0, 6.0]];
        assert_eq!(nms(&boxes, &[&[0.9, 0.95, 0.5]], 10, 0.5, None, false), [[0, 0, 1], [0, 0, 2]]);
        // Above the overlap, both stay; the score threshold is strict.
        assert_eq!(
            nms(&boxes, &[&[0.9, 0.95, 0.5]], 10, 0.7, Some(0.5), false),
            [[0, 0, 1], [0, 0, 0]]
        );
        // At most one per class, per class.
        assert_eq!(
            nms(&boxes, &[&[0.9, 0.95, 0.5], &[0.1, 0.2, 0.3]], 1, 0.5, None, false),
            [[0, 0, 1], [0, 1, 2]]
        );
    }

    #[test]
    fn equal_scores_go_by_index_and_degenerate_boxes_never_suppress() {
        let same = [[0.0, 0.0, 1.0, 1.0]; 3];
        assert_eq!(nms(&same, &[&[0.5, 0.5, 0.5]], 3, 0.5, None, false), [[0, 0, 0]]);
        let flat = [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]];
        assert_eq!(nms(&flat, &[&[0.5, 0.6]], 3, 0.0, None, false), [[0, 0, 1], [0, 0, 0]]);
        // Centre format: [x, y, w, h]; these two overlap by IoU 1/3.
        let centred = [[0.5, 0.5, 1.0, 1.0], [1.0, 0.5, 1.0, 1.0]];
        assert_eq!(nms(&centred, &[&[0.9, 0.8]], 2, 0.3, None, true), [[0, 0, 0]]);
        assert_eq!(nms(&centred, &[&[0.9, 0.8]], 2, 0.34, None, true), [[0, 0, 0], [0, 0, 1]]);
    }
}
