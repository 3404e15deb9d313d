//! Dead code elimination: drops nodes none of whose outputs is read, and constants nobody uses.

use super::PassError;
use crate::ir::Graph;

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let mut uses = g.use_counts();
    let mut keep = vec![true; g.nodes.len()];
    // Reverse order: removing a node may make its producers dead too.
    for (i, node) in g.nodes.iter().enumerate().rev() {
        if node.outputs.iter().all(|&o| uses[o] == 0) {
            keep[i] = false;
            for input in node.present_inputs() {
                uses[input] -= 1;
            }
        }
    }
    let mut k = keep.iter();
    g.nodes.retain(|_| *k.next().unwrap_or(&true));
    Ok(())
}
