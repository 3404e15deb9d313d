//! Step orders to plan over: the model's own, and a memory-aware topological order that
//! prefers, among the ready nodes, the one that frees the most bytes for the fewest it
//! allocates (list scheduling on the live-bytes delta).

use crate::ir::Graph;
use std::collections::BTreeSet;

/// The nodes as the model lists them (import already sorted them topologically).
pub fn model_order(g: &Graph) -> Vec<usize> {
    (0..g.nodes.len()).collect()
}

/// A topological order that greedily keeps the bytes of live activations low.
pub fn memory_aware(g: &Graph) -> Vec<usize> {
    let n = g.values.len();
    let producers = g.producers();
    let bytes = |v: usize| g.values[v].ty.as_ref().map_or(0, |t| t.bytes() as i64);
    // An activation: produced by a node, not a graph output (those live to the end anyway).
    let mut counted = vec![false; n];
    for (v, p) in producers.iter().enumerate() {
        counted[v] = p.is_some();
    }
    for &o in &g.outputs {
        counted[o] = false;
    }
    let mut readers_left = vec![0usize; n];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting = vec![0usize; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for v in node.present_inputs() {
            readers_left[v] += 1;
            if seen.insert(v) && producers[v].is_some() {
                consumers[v].push(i);
                waiting[i] += 1;
            }
        }
    }
    let mut ready: BTreeSet<usize> = (0..g.nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(g.nodes.len());
    while !ready.is_empty() {
        let score = |i: usize| -> i64 {
            let node = &g.nodes[i];
            if ingot_ops::is_view(&node.op) {
                return 0;
            }
            let allocated: i64 =
                node.outputs.iter().filter(|&&o| counted[o]).map(|&o| bytes(o)).sum();
            let mut freed = 0;
            let mut seen = BTreeSet::new();
            for v in node.present_inputs() {
                let reads = node.present_inputs().filter(|&x| x == v).count();
                if counted[v] && seen.insert(v) && readers_left[v] == reads {
                    freed += bytes(v);
                }
            }
            allocated - freed
        };
        // Lowest delta first; ties keep the model's order.
        let Some(&next) = ready.iter().min_by_key(|&&i| (score(i), i)) else {
            break;
        };
        ready.remove(&next);
        order.push(next);
        for v in g.nodes[next].present_inputs() {
            readers_left[v] -= 1;
        }
        for &o in &g.nodes[next].outputs {
            for &c in &consumers[o] {
                waiting[c] -= 1;
                if waiting[c] == 0 {
                    ready.insert(c);
                }
            }
        }
    }
    order
}

/// Depth-first from the graph outputs: each node runs right after everything it needs, one
/// input's subtree at a time, so a branch finishes (and frees) before the next one starts.
pub fn depth_first(g: &Graph) -> Vec<usize> {
    let producers = g.producers();
    let mut done = vec![false; g.nodes.len()];
    let mut order = Vec::with_capacity(g.nodes.len());
    // Roots: the producers of the graph outputs, then any node nothing depends on (in model
    // order), so that every node is scheduled.
    let roots = g.outputs.iter().filter_map(|&o| producers[o]).chain(0..g.nodes.len());
    // Iterative post-order: (node, next input index to visit). A node on the stack is not
    // pushed twice: in an acyclic graph that never happens; it keeps a cycle from looping.
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut on_stack = vec![false; g.nodes.len()];
    for root in roots {
        if done[root] {
            continue;
        }
        stack.push((root, 0));
        on_stack[root] = true;
        while let Some((node, next)) = stack.last().copied() {
            match g.nodes[node].inputs.get(next) {
                Some(input) => {
                    if let Some(top) = stack.last_mut() {
                        top.1 += 1;
                    }
                    if let Some(p) = input.and_then(|v| producers[v])
                        && !done[p]
                        && !on_stack[p]
                    {
                        stack.push((p, 0));
                        on_stack[p] = true;
                    }
                }
                None => {
                    stack.pop();
                    on_stack[node] = false;
                    done[node] = true;
                    order.push(node);
                }
            }
        }
    }
    order
}
