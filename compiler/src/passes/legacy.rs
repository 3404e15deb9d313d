//! Opset 6 read as opset 7, where they differ in what a node computes and a node of the
//! graph must be added to say it the newer way (the `lower` walk calls [`settle`] on each node
//! before lowering it; the ops' own lowerings handle the rest, such as `is_test`):
//! - **Legacy broadcasting.** Before opset 7 the binary ops (Add, Sub, Mul, Div, Pow, And, Or,
//!   Xor, Equal, Greater, Less) broadcast only when `broadcast` = 1, and then B's dims line up
//!   with A's from `axis` on (by default, with A's trailing dims): a conv bias `[C]` added to
//!   `[N, C, H, W]` at axis 1. Opset 7's numpy broadcasting lines B up with the trailing dims,
//!   so such a B is reshaped to `[C, 1, 1]` first. Without `broadcast` the shapes are equal,
//!   which numpy broadcasting also takes.
//! - **PRelu's slope** of one value per channel, `[C]` for X `[N, C, ...]`: per channel
//!   before opset 7, along the last axis at 7; reshaped to `[C, 1, ...]`.

use super::PassError;
use crate::ir::{Const, Graph, Node, ValueId};
use ingot_ops::Tensor;
use ingot_schema::AttrValue;

/// The binary ops whose broadcasting opset 7 changed.
const BROADCASTING: &[&str] =
    &["Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"];

/// Rewrites `g.nodes[at]` to opset 7's meaning where it differs; `Ok(true)` when a node was
/// inserted before it (at `at`, to be walked first).
pub fn settle(g: &mut Graph, at: usize) -> Result<bool, PassError> {
    let node = &g.nodes[at];
    if g.opset >= 7 || !matches!(node.domain.as_str(), "" | "ai.onnx") {
        return Ok(false);
    }
    let label = node.label();
    let err = |message: String| PassError::Node { node: label.clone(), message };
    let rank = |k: usize| node.inputs.get(k).copied().flatten().and_then(|v| g.ty(v));
    let (Some(a), Some(b)) = (rank(0), rank(1)) else { return Ok(false) };
    let (a, b) = (a.shape.len(), b.shape.clone());
    let trailing_ones = if BROADCASTING.contains(&node.op.as_str()) {
        let broadcast = node.attrs.int_or("broadcast", 0).map_err(|e| err(e.to_string()))?;
        let axis = node.attrs.get("axis").cloned();
        let node = &mut g.nodes[at];
        node.attrs.remove("broadcast");
        node.attrs.remove("axis");
        let axis = match (broadcast, axis) {
            (0, _) | (_, None) => return Ok(false),
            (_, Some(AttrValue::Int(axis))) => axis,
            (_, Some(other)) => return Err(err(format!("axis {other:?} is not an integer"))),
        };
        let first = if axis < 0 { axis + a as i64 } else { axis };
        let end = usize::try_from(first).ok().map(|f| f + b.len()).filter(|&e| e <= a);
        let end = end.ok_or_else(|| {
            err(format!("B of rank {} does not fit A of rank {a} from axis {axis}", b.len()))
        })?;
        a - end
    } else if node.op == "PRelu" && a > 2 && b.len() == 1 && b[0] != 1 {
        a - 2
    } else {
        return Ok(false);
    };
    if trailing_ones == 0 {
        return Ok(false);
    }
    let b_in = g.nodes[at].inputs[1].expect("B is present");
    let shape: Vec<i64> =
        b.iter().map(|&d| d as i64).chain(std::iter::repeat_n(1, trailing_ones)).collect();
    insert_reshape(g, at, b_in, &shape)?;
    Ok(true)
}

/// Inserts `Reshape(v, shape)` before node `at`, which then reads its output as input 1.
fn insert_reshape(g: &mut Graph, at: usize, v: ValueId, shape: &[i64]) -> Result<(), PassError> {
    let name = format!("{}:opset7", g.values[v].name);
    let dims =
        Tensor::from_vec(vec![shape.len()], shape).map_err(|e| PassError::Graph(e.to_string()))?;
    let dims = g.add_constant(format!("{name}.shape"), Const::owned(dims));
    let out = g.add_value(name.clone(), None);
    g.nodes[at].inputs[1] = Some(out);
    let reshape = Node {
        name,
        op: "Reshape".into(),
        domain: String::new(),
        inputs: vec![Some(v), Some(dims)],
        outputs: vec![out],
        attrs: Default::default(),
    };
    g.nodes.insert(at, reshape);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::{Builder, data, evaluate};
    use ingot_schema::Attrs;

    /// `op(a, b)` of an opset-6 graph, with `attrs`, lowered; its output for `data` inputs.
    fn run_opset_6(op: &str, a: &[usize], b: &[usize], attrs: Attrs) -> Result<Vec<f32>, String> {
        let mut g = Builder::new();
        g.g.opset = 6;
        let (x, y) = (g.input("a", a), g.input("b", b));
        let out = g.node(op, &[x, y], attrs);
        g.g.outputs = vec![out];
        let mut graph = g.g;
        super::super::lower::run(&mut graph).map_err(|e| e.to_string())?;
        let inputs = [a, b].map(|s| {
            let n = s.iter().product();
            Tensor::from_vec(s.to_vec(), &data(n, n)).unwrap()
        });
        Ok(evaluate(&graph, &inputs)[0].as_slice::<f32>().unwrap().to_vec())
    }

    #[test]
    fn legacy_broadcasting_lines_b_up_from_its_axis() {
        // [2, 3, 4, 5] + [3, 4] from axis 1: b[c, h] is added to a[n, c, h, w].
        let attrs = || Attrs::new().with("broadcast", AttrValue::Int(1));
        let got =
            run_opset_6("Add", &[2, 3, 4, 5], &[3, 4], attrs().with("axis", AttrValue::Int(1)));
        let (a, b) = (data(120, 120), data(12, 12));
        let want: Vec<f32> = (0..120).map(|i| a[i] + b[i / 5 % 12]).collect();
        assert_eq!(got.unwrap(), want);
        // A negative axis counts from A's end; without an axis B lines up with the last dims.
        let got = run_opset_6("Mul", &[2, 3, 4], &[3], attrs().with("axis", AttrValue::Int(-2)));
        let (a, b) = (data(24, 24), data(3, 3));
        assert_eq!(got.unwrap(), (0..24).map(|i| a[i] * b[i / 4 % 3]).collect::<Vec<_>>());
        let got = run_opset_6("Sub", &[2, 3, 4], &[4], attrs());
        let (a, b) = (data(24, 24), data(4, 4));
        assert_eq!(got.unwrap(), (0..24).map(|i| a[i] - b[i % 4]).collect::<Vec<_>>());
        // B past A's end.
        let err = run_opset_6("Add", &[2, 3], &[3, 4], attrs().with("axis", AttrValue::Int(1)));
        assert!(err.unwrap_err().contains("does not fit A of rank 2 from axis 1"));
    }

    #[test]
    fn a_prelu_slope_per_channel_stays_per_channel() {
        let got = run_opset_6("PRelu", &[1, 3, 2, 2], &[3], Attrs::new()).unwrap();
        let (x, slope) = (data(12, 12), data(3, 3));
        let want: Vec<f32> =
            (0..12).map(|i| if x[i] < 0.0 { x[i] * slope[i / 4] } else { x[i] }).collect();
        assert_eq!(got, want);
    }
}
