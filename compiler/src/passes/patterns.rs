//! What the passes that recognise exported patterns (decomposed activations, normalization
//! chains) share: who produces each value, how many read it, and small constant tests.

use crate::ir::{Graph, Node, ValueId};
use ingot_ops::Constant as _;

/// A graph's producers and use counts, for matching a pattern backwards from its last node.
pub(super) struct Patterns<'g> {
    pub(super) g: &'g Graph,
    pub(super) uses: Vec<usize>,
    pub(super) producers: Vec<Option<usize>>,
}

impl<'g> Patterns<'g> {
    pub(super) fn new(g: &'g Graph) -> Self {
        Patterns { g, uses: g.use_counts(), producers: g.producers() }
    }

    /// The node producing `v` if `v` is read once (by the node being matched), and its op.
    pub(super) fn only_use(&self, v: ValueId, op: &str) -> Option<&'g Node> {
        let n = &self.g.nodes[self.producers[v]?];
        (self.uses[v] == 1 && n.op == op).then_some(n)
    }

    /// The node producing `v` if its op is `op`, however many read `v`.
    pub(super) fn produced_by(&self, v: ValueId, op: &str) -> Option<&'g Node> {
        let n = &self.g.nodes[self.producers[v]?];
        (n.op == op).then_some(n)
    }

    /// Both operand orders of a binary node.
    pub(super) fn pairs(n: &Node) -> Option<[(ValueId, ValueId); 2]> {
        match n.inputs[..] {
            [Some(a), Some(b)] => Some([(a, b), (b, a)]),
            _ => None,
        }
    }

    /// `x` if it is a float of `out`'s type.
    pub(super) fn same_float(&self, x: ValueId, out: ValueId) -> Option<ValueId> {
        let float = self.g.ty(x).is_some_and(|t| t.dtype.is_float());
        (float && self.g.ty(x) == self.g.ty(out)).then_some(x)
    }
}

/// The value of a one-element float constant.
pub(super) fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    match g.constant(v)?.to_f64s()?[..] {
        [x] => Some(x),
        _ => None,
    }
}

/// `a` equals `b` up to a constant's rounding to f32.
pub(super) fn near(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs()
}
