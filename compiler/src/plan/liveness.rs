//! Lifetimes of arena roots over the step order, and the lower bound they imply.

use super::Interval;
use super::alias::Aliases;
use crate::ir::{Graph, ValueId};

/// An arena root is live from the step that first writes it to the last step that reads it
/// or any value aliasing it. Steps are positions in the plan's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub value: ValueId,
    pub bytes: u64,
    pub first: usize,
    pub last: usize,
}

/// Lifetimes of the arena roots `roots`, for `g` run in `order` with `aliases`.
pub fn lifetimes(
    g: &Graph,
    order: &[usize],
    aliases: &Aliases,
    roots: &[ValueId],
) -> Vec<Lifetime> {
    let mut first = vec![usize::MAX; g.values.len()];
    let mut last = vec![0; g.values.len()];
    for (pos, &ni) in order.iter().enumerate() {
        if aliases.elided[ni] {
            continue;
        }
        let node = &g.nodes[ni];
        for v in node.present_inputs() {
            let r = aliases.root(v).root;
            last[r] = last[r].max(pos);
        }
        for &v in &node.outputs {
            let r = aliases.root(v).root;
            first[r] = first[r].min(pos);
            last[r] = last[r].max(pos);
        }
    }
    roots
        .iter()
        .map(|&v| Lifetime {
            value: v,
            bytes: g.values[v].ty.as_ref().map_or(0, |t| t.bytes() as u64),
            first: first[v].min(last[v]),
            last: last[v],
        })
        .collect()
}

/// The largest sum of bytes live at one step: no arena layout can be smaller.
pub fn lower_bound(intervals: &[Interval]) -> u64 {
    let steps = intervals.iter().map(|i| i.last + 1).max().unwrap_or(0);
    // Sweep: +bytes at `first`, -bytes after `last`.
    let mut delta = vec![0i128; steps + 1];
    for i in intervals {
        delta[i.first] += i.bytes as i128;
        delta[i.last + 1] -= i.bytes as i128;
    }
    let mut live = 0i128;
    let mut peak = 0i128;
    for d in delta {
        live += d;
        peak = peak.max(live);
    }
    peak as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_bound_is_the_peak_of_overlapping_intervals() {
        let iv = |bytes, first, last| Interval { bytes, first, last };
        // a=[0,1] 100, b=[1,2] 50, c=[2,3] 70: step 1 holds a+b = 150, step 2 holds b+c = 120.
        let ivs = [iv(100, 0, 1), iv(50, 1, 2), iv(70, 2, 3)];
        assert_eq!(lower_bound(&ivs), 150);
        assert_eq!(lower_bound(&[]), 0);
    }
}
