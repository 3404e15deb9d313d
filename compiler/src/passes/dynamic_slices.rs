//! Slices whose start is a value of the run: a Slice whose `starts` are computed at run time
//! but whose `ends` are those starts plus a constant, `x[i : i + n]` (what a loop body writes
//! to take its iteration's row), has a static shape all the same. The `lower` walk calls
//! [`settle`] on each node before lowering it; such a Slice becomes `DynamicSlice` (the
//! movement family's), which finds the window at run time as Slice would and fails where
//! Slice would take fewer than `n` elements.
//!
//! The ends are matched to the starts by following both back through the ops that keep a
//! value (Identity, Unsqueeze, Squeeze, Reshape, Flatten) and
//! the additions and subtractions of constants: `Unsqueeze(i)` and `Unsqueeze(Add(i, 1))` are
//! `i + 0` and `i + 1`. One axis, steps of 1.

use super::PassError;
use crate::ir::{Graph, ValueId};
use ingot_ops::Constant as _;
use ingot_schema::{AttrValue, Attrs, DType};

/// Rewrites `g.nodes[at]` to a `DynamicSlice` if it is such a Slice.
pub fn settle(g: &mut Graph, at: usize) -> Result<(), PassError> {
    let node = &g.nodes[at];
    if node.op != "Slice" || g.opset < 10 || !matches!(node.domain.as_str(), "" | "ai.onnx") {
        return Ok(());
    }
    let input = |k: usize| node.inputs.get(k).copied().flatten();
    let (Some(x), Some(starts), Some(ends)) = (input(0), input(1), input(2)) else {
        return Ok(());
    };
    let one = |v: ValueId| g.ty(v).is_some_and(|t| t.elements() == 1 && t.shape.len() == 1);
    if g.constant(starts).is_some() || !one(starts) || !one(ends) {
        return Ok(());
    }
    let constant = |k: usize| -> Option<Option<Vec<i64>>> {
        match input(k) {
            None => Some(None),
            Some(v) => g.constant(v)?.to_i64s().map(Some),
        }
    };
    let (Some(axes), Some(steps)) = (constant(3), constant(4)) else {
        return Ok(());
    };
    if steps.is_some_and(|s| s != [1]) {
        return Ok(());
    }
    let Some(rank) = g.ty(x).map(|t| t.shape.len() as i64) else {
        return Ok(());
    };
    let axis = match axes.as_deref() {
        None => 0,
        Some(&[a]) if (-rank..rank).contains(&a) => a.rem_euclid(rank),
        Some(_) => return Ok(()),
    };
    let ((from, first), (to, last)) = (offset_of(g, starts), offset_of(g, ends));
    let size = last.checked_sub(first).filter(|&n| from == to && n > 0);
    let Some(size) = size else {
        return Ok(());
    };
    let node = &mut g.nodes[at];
    node.op = "DynamicSlice".into();
    node.inputs = vec![Some(x), Some(starts)];
    node.attrs = Attrs::new()
        .with("axes", AttrValue::Ints(vec![axis]))
        .with("sizes", AttrValue::Ints(vec![size]));
    Ok(())
}

/// `v` as a value it was computed from plus a constant: `(base, offset)`.
fn offset_of(g: &Graph, mut v: ValueId) -> (ValueId, i64) {
    let producers = g.producers();
    let mut offset = 0i64;
    let integer = |v: ValueId| {
        g.ty(v).is_some_and(|t| matches!(t.dtype, DType::I32 | DType::I64) && t.elements() == 1)
    };
    let constant = |v: ValueId| match g.constant(v)?.to_i64s()?[..] {
        [c] if integer(v) => Some(c),
        _ => None,
    };
    while let Some(p) = producers[v].map(|p| &g.nodes[p]) {
        let operand = |k: usize| p.inputs.get(k).copied().flatten();
        let next = match (p.op.as_str(), operand(0), operand(1)) {
            ("Identity" | "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten", Some(a), _)
                if integer(a) =>
            {
                a
            }
            ("Add", Some(a), Some(b)) => match (constant(a), constant(b)) {
                (_, Some(c)) if integer(a) => {
                    offset = offset.saturating_add(c);
                    a
                }
                (Some(c), _) if integer(b) => {
                    offset = offset.saturating_add(c);
                    b
                }
                _ => break,
            },
            ("Sub", Some(a), Some(b)) => match constant(b) {
                Some(c) if integer(a) => {
                    offset = offset.saturating_sub(c);
                    a
                }
                _ => break,
            },
            _ => break,
        };
        v = next;
    }
    (v, offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Const, Node};
    use crate::passes::lower;
    use crate::passes::testing::evaluate;
    use ingot_ops::{Tensor, TensorDesc};

    /// `Slice(x, Unsqueeze(i + a), Unsqueeze(i + b), [axis])` over x [3, 4] and a scalar
    /// int64 input i; `ends_of_j`: the ends come from another input j instead.
    fn window(a: i64, b: i64, axis: i64, ends_of_j: bool) -> Graph {
        let mut g = Graph { opset: 13, ..Default::default() };
        let x = g.add_value("x", Some(TensorDesc::new(DType::F32, vec![3, 4])));
        let scalar = || Some(TensorDesc::new(DType::I64, vec![]));
        let i = g.add_value("i", scalar());
        let j = g.add_value("j", scalar());
        g.inputs = vec![x, i, j];
        let c = |g: &mut Graph, name: &str, v: Vec<i64>, dims: Vec<usize>| {
            g.add_constant(name, Const::owned(Tensor::from_vec(dims, &v).unwrap()))
        };
        let (ca, cb) = (c(&mut g, "a", vec![a], vec![]), c(&mut g, "b", vec![b], vec![]));
        let zero = c(&mut g, "zero", vec![0], vec![1]);
        let axes = c(&mut g, "axes", vec![axis], vec![1]);
        let node = |g: &mut Graph, op: &str, inputs: &[ValueId]| {
            let out = g.add_value(format!("v{}", g.values.len()), None);
            let name = format!("n{}", g.nodes.len());
            g.nodes.push(Node {
                name,
                op: op.into(),
                domain: String::new(),
                inputs: inputs.iter().map(|&v| Some(v)).collect(),
                outputs: vec![out],
                attrs: Attrs::new(),
            });
            out
        };
        let from = node(&mut g, "Add", &[i, ca]);
        let to = node(&mut g, "Add", &[if ends_of_j { j } else { i }, cb]);
        let (from, to) =
            (node(&mut g, "Unsqueeze", &[from, zero]), node(&mut g, "Unsqueeze", &[to, zero]));
        let y = node(&mut g, "Slice", &[x, from, to, axes]);
        g.outputs = vec![y];
        g
    }

    fn run(g: &Graph, i: i64) -> Vec<f32> {
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let x = Tensor::from_vec(vec![3, 4], &x).unwrap();
        let (i, j) =
            (Tensor::from_vec(vec![], &[i]).unwrap(), Tensor::from_vec(vec![], &[0i64]).unwrap());
        evaluate(g, &[x, i, j])[0].to_vec::<f32>().unwrap()
    }

    #[test]
    fn a_window_from_a_run_time_start_is_a_dynamic_slice() {
        let mut g = window(1, 2, 0, false);
        lower::run(&mut g).unwrap();
        let slice = g.nodes.iter().find(|n| n.op == "DynamicSlice").expect("a DynamicSlice");
        assert_eq!(slice.attrs.ints("sizes").unwrap(), [1]);
        // Rows i + 1 for i = 0 and 1, then a start past the end: an error, not a short row.
        assert_eq!(run(&g, 0), [4.0, 5.0, 6.0, 7.0]);
        assert_eq!(run(&g, 1), [8.0, 9.0, 10.0, 11.0]);
        let mut g = window(-1, 1, -1, false);
        lower::run(&mut g).unwrap();
        assert_eq!(run(&g, 2), [1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
    }

    #[test]
    fn a_window_of_run_time_size_stays_an_error() {
        for g in [window(0, 1, 0, true), window(2, 2, 0, false)] {
            let mut g = g;
            let e = lower::run(&mut g).unwrap_err().to_string();
            assert!(e.contains("must be a constant"), "{e}");
        }
    }
}
