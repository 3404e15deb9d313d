//! Data-dependent lengths (`ingot_ops::bounded`): which values a run fills only up to a
//! count, and along which dim. `lower` calls [`propagate`] on each node as it infers its
//! types (so a Shape of such a value is refused before it is folded to the bound); this pass,
//! the last, covers the nodes later passes made and lists each bounded graph output's count
//! among the graph outputs, after the caller's, so that it outlives the run.

use super::PassError;
use crate::ir::{Bound, Graph, Node, ValueId};
use ingot_ops::TensorDesc;
use ingot_ops::bounded::{self, Length};
use ingot_ops::lower::OpError;

/// The bounds of `node`'s outputs, from its inputs' (`g.bounded`) and its op's rule.
pub(super) fn propagate(
    g: &Graph,
    node: &Node,
    inputs: &[&TensorDesc],
    outputs: &[TensorDesc],
) -> Result<Vec<(ValueId, Bound)>, OpError> {
    let present: Vec<ValueId> = node.present_inputs().collect();
    let bounds: Vec<Option<&Bound>> = present.iter().map(|v| g.bounded.get(v)).collect();
    let mut counts = bounds.iter().flatten().map(|b| b.count);
    if let Some(first) = counts.next()
        && let Some(other) = counts.find(|&c| c != first)
    {
        return Err(OpError(format!(
            "its inputs have data-dependent lengths counted by two different ops ('{}' and \
             '{}'), which need not agree",
            g.values[first].name, g.values[other].name
        )));
    }
    let axes: Vec<Option<usize>> = bounds.iter().map(|b| b.map(|b| b.axis)).collect();
    let out = bounded::outputs(node, inputs, &axes, outputs)?;
    Ok(node
        .outputs
        .iter()
        .zip(out)
        .filter_map(|(&v, b)| {
            let b = b?;
            let count = match b.length {
                Length::Input(k) => bounds[k]?.count,
                Length::Output(k) => *node.outputs.get(k)?,
            };
            Some((v, Bound { axis: b.axis, count }))
        })
        .collect())
}

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        let known = |v: &ValueId| g.bounded.contains_key(v);
        if !node.present_inputs().any(|v| known(&v)) || node.outputs.iter().all(known) {
            continue;
        }
        let types = |ids: &mut dyn Iterator<Item = ValueId>| -> Option<Vec<TensorDesc>> {
            ids.map(|v| g.values[v].ty.clone()).collect()
        };
        let at = |message: String| PassError::Node { node: node.label(), message };
        let ins = types(&mut node.present_inputs()).ok_or_else(|| at("untyped input".into()))?;
        let outs =
            types(&mut node.outputs.iter().copied()).ok_or_else(|| at("untyped output".into()))?;
        let refs: Vec<&TensorDesc> = ins.iter().collect();
        let found = propagate(g, node, &refs, &outs).map_err(|e| at(e.0))?;
        g.bounded.extend(found);
    }
    let counts: Vec<ValueId> =
        g.outputs.iter().filter_map(|o| g.bounded.get(o)).map(|b| b.count).collect();
    for c in counts {
        if !g.outputs.contains(&c) {
            g.outputs.push(c);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Const;
    use crate::passes::{lower, testing::Builder};
    use ingot_ops::Tensor;
    use ingot_schema::{AttrValue, Attrs, DType};

    /// NonMaxSuppression of 2 classes x 5 boxes, at most 3 a class, then `then` on its rows.
    fn nms_then(then: &str, attrs: Attrs) -> (Result<(), PassError>, Graph, ValueId) {
        let mut b = Builder::new();
        let boxes = b.input("boxes", &[1, 5, 4]);
        let scores = b.input("scores", &[1, 2, 5]);
        let int = |v: &[i64], shape: Vec<usize>| Const::owned(Tensor::from_vec(shape, v).unwrap());
        let max = b.g.add_constant("max", int(&[3], vec![1]));
        let column = b.g.add_constant("column", int(&[2], vec![]));
        let selected = b.op("NonMaxSuppression", &[boxes, scores, max]);
        let inputs = if then == "Shape" { vec![selected] } else { vec![selected, column] };
        let out = b.node(then, &inputs, attrs);
        let mut g = b.g;
        g.outputs = vec![out];
        let result = lower::run(&mut g).and_then(|()| run(&mut g));
        (result, g, out)
    }

    #[test]
    fn rows_a_run_counts_stay_bounded_through_a_gather_and_their_count_is_an_output() {
        let (result, g, out) = nms_then("Gather", Attrs::new().with("axis", AttrValue::Int(1)));
        result.unwrap();
        let nms = g.nodes.iter().find(|n| n.op == "NonMaxSuppression").unwrap();
        let [selected, count] = nms.outputs[..] else { panic!("{:?}", nms.outputs) };
        // 1 batch x 2 classes x min(5 boxes, 3) rows, planned at that bound.
        assert_eq!(g.ty(selected).unwrap(), &TensorDesc::new(DType::I64, [6, 3]));
        assert_eq!(g.ty(out).unwrap(), &TensorDesc::new(DType::I64, [6]));
        assert_eq!(g.ty(count).unwrap(), &TensorDesc::new(DType::I64, []));
        for v in [selected, out] {
            assert_eq!(g.bounded.get(&v), Some(&Bound { axis: 0, count }));
        }
        assert_eq!(g.outputs, [out, count]);
    }

    #[test]
    fn a_shape_of_such_rows_is_refused_before_it_folds_to_the_bound() {
        let (result, ..) = nms_then("Shape", Attrs::new());
        let err = result.unwrap_err().to_string();
        assert!(err.contains("(Shape)"), "{err}");
        assert!(
            err.contains("input 0 has a data-dependent length along dim 0 (at most 6"),
            "{err}"
        );
        assert!(err.contains("its value would be the bound"), "{err}");
    }

    #[test]
    fn a_bounded_graph_output_lists_its_count_after_the_callers_outputs() {
        let mut g = Graph::default();
        let x = g.add_value("x", Some(TensorDesc::new(DType::I64, [9, 3])));
        let count = g.add_value("count", Some(TensorDesc::new(DType::I64, [])));
        let y = g.add_value("y", Some(TensorDesc::new(DType::I64, [9, 3])));
        g.inputs = vec![x, count];
        g.bounded.insert(x, Bound { axis: 0, count });
        g.nodes.push(Node {
            name: "copy".into(),
            op: "Identity".into(),
            domain: String::new(),
            inputs: vec![Some(x)],
            outputs: vec![y],
            attrs: Default::default(),
        });
        g.outputs = vec![y];
        run(&mut g).unwrap();
        assert_eq!(g.bounded.get(&y), Some(&Bound { axis: 0, count }));
        assert_eq!(g.outputs, [y, count]);
    }
}
