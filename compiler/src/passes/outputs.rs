//! Makes every graph output the output of a step: an output that is a graph input, a constant,
//! or the same value as an earlier output gets an Identity copy, so that each output has its
//! own storage for the caller to receive.

use super::PassError;
use crate::ir::{Graph, Node};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let producers = g.producers();
    let mut seen = vec![false; g.values.len()];
    for k in 0..g.outputs.len() {
        let v = g.outputs[k];
        let needs_copy = producers[v].is_none() || seen[v];
        seen[v] = true;
        if !needs_copy {
            continue;
        }
        let name = g.values[v].name.clone();
        let ty = g.values[v].ty.clone();
        // The copy carries the output's ONNX name: that is the name the caller sees.
        let copy = g.add_value(name.clone(), ty);
        if g.values[v].constant.is_some() {
            g.values[v].name = format!("{name}:constant");
        }
        g.nodes.push(Node {
            name: format!("{name}:copy_to_output_{k}"),
            op: "Identity".into(),
            domain: String::new(),
            inputs: vec![Some(v)],
            outputs: vec![copy],
            attrs: Default::default(),
        });
        g.outputs[k] = copy;
    }
    Ok(())
}
