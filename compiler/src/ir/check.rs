//! IR invariants, checked after every pass in debug builds and tests.

use super::Graph;

/// Every id in range, every value produced at most once, every node after its inputs'
/// producers, every graph output produced or constant or a graph input.
pub fn check(g: &Graph) -> Result<(), String> {
    let n = g.values.len();
    let mut available = vec![false; n];
    for &i in &g.inputs {
        if i >= n {
            return Err(format!("graph input id {i} out of range"));
        }
        available[i] = true;
    }
    for (i, v) in g.values.iter().enumerate() {
        if v.constant.is_some() {
            available[i] = true;
        }
    }
    for node in &g.nodes {
        for i in node.present_inputs() {
            if i >= n {
                return Err(format!("{} reads value id {i}, out of range", node.label()));
            }
            if !available[i] {
                return Err(format!(
                    "{} reads '{}' before anything writes it",
                    node.label(),
                    g.values[i].name
                ));
            }
        }
        for &o in &node.outputs {
            if o >= n {
                return Err(format!("{} writes value id {o}, out of range", node.label()));
            }
            if available[o] {
                return Err(format!(
                    "{} writes '{}', which is already defined",
                    node.label(),
                    g.values[o].name
                ));
            }
            available[o] = true;
        }
    }
    for &o in &g.outputs {
        if o >= n || !available[o] {
            return Err(format!("graph output id {o} is never produced"));
        }
    }
    Ok(())
}
