//! The memory plan: where every value of a graph lives and, for activations, when.
//!
//! Graph inputs and outputs live in the caller's buffers, constants in the weight bank, and
//! every other value either aliases another (a view, or an in-place write) or is a root in
//! the activation arena at an offset chosen from its lifetime (DESIGN.md, "The memory plan").
//! Everything is decided here, before anything is allocated, and checked by an independent
//! verifier.
//!
//! The planner tries every step order in [`schedule`] and every offset strategy in
//! [`assign::STRATEGIES`], and keeps the smallest arena.

use crate::ir::{Graph, ValueId};
use ingot_schema::Attrs;

pub mod alias;
mod assign;
mod liveness;
pub mod render;
pub mod schedule;
mod stats;
mod verify;

pub use assign::{
    GreedyByFirstUse, GreedyByLifetime, GreedyBySize, Interval, STRATEGIES, Strategy,
};
pub use liveness::Lifetime;
pub use stats::{Stats, stats};
pub use verify::verify;

/// Every arena offset is a multiple of this.
pub const ALIGNMENT: u64 = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Index into the graph's inputs.
    Input(usize),
    /// Index into the graph's outputs.
    Output(usize),
    /// Index into [`Plan::weights`].
    Weight(usize),
    Arena {
        offset: u64,
    },
    /// The bytes of `of` (a root: never itself a view) starting at `byte_offset`.
    View {
        of: ValueId,
        byte_offset: u64,
    },
}

/// What the planner may assume about the backends, and which mechanisms it may use (all by
/// default; turning one off measures what it is worth).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// Whether the kernel of an op (with its canonical attributes) accepts its output over
    /// input `k`: `can_run_in_place(op, attrs, k)`.
    pub can_run_in_place: &'a dyn Fn(&str, &Attrs, usize) -> bool,
    /// Views, outer-axis slices and splits, and concats written in place.
    pub views: bool,
    /// Try step orders other than the model's.
    pub reorder: bool,
}

impl Target<'_> {
    /// What the CPU backend supports.
    pub fn cpu() -> Target<'static> {
        Target {
            can_run_in_place: &ingot_runtime::cpu::can_run_in_place,
            views: true,
            reorder: true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// The nodes in execution order, views included.
    pub order: Vec<usize>,
    /// Per node: true if it is a view and runs no step.
    pub elided: Vec<bool>,
    /// Per node: the input it writes its output over, if it runs in place.
    pub in_place: Vec<Option<usize>>,
    /// Per value of the graph; `None` for values no step or graph output uses.
    pub storage: Vec<Option<Storage>>,
    /// The constants the steps read, in order of first use.
    pub weights: Vec<ValueId>,
    /// Lifetimes of the arena roots, in value order.
    pub lifetimes: Vec<Lifetime>,
    pub arena_bytes: u64,
    pub lower_bound_bytes: u64,
    /// Sum of the bytes of every activation, as if nothing shared memory.
    pub naive_bytes: u64,
    pub strategy: &'static str,
    pub schedule: &'static str,
    pub alignment: u64,
}

impl Plan {
    /// The nodes that run, in order.
    pub fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.iter().copied().filter(|&n| !self.elided[n])
    }
}

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Plans `g` for `target`: the best plan over every schedule and strategy.
pub fn plan(g: &Graph, target: Target) -> Plan {
    let orders: [(&'static str, Vec<usize>); 3] = [
        ("model-order", schedule::model_order(g)),
        ("memory-aware", schedule::memory_aware(g)),
        ("depth-first", schedule::depth_first(g)),
    ];
    let mut best: Option<Plan> = None;
    for (name, order) in orders {
        if !target.reorder && name != "model-order" {
            continue;
        }
        if order.len() != g.nodes.len() {
            continue; // not a complete order (cannot happen for a checked IR)
        }
        let p = plan_order(g, order, name, target);
        if best.as_ref().is_none_or(|b| {
            (p.arena_bytes, p.lower_bound_bytes) < (b.arena_bytes, b.lower_bound_bytes)
        }) {
            best = Some(p);
        }
    }
    best.unwrap_or_else(|| plan_order(g, schedule::model_order(g), "model-order", target))
}

/// Plans `g` executed in `order`.
pub fn plan_order(g: &Graph, order: Vec<usize>, schedule: &'static str, target: Target) -> Plan {
    let aliases = alias::analyse(g, &order, target.views, target.can_run_in_place);
    let mut storage: Vec<Option<Storage>> = vec![None; g.values.len()];
    for (i, &v) in g.inputs.iter().enumerate() {
        storage[v] = Some(Storage::Input(i));
    }
    for (k, &v) in g.outputs.iter().enumerate() {
        storage[v] = Some(Storage::Output(k));
    }
    let mut weights = Vec::new();
    let mut roots = Vec::new();
    let mut naive_bytes = 0;
    for &ni in &order {
        let node = &g.nodes[ni];
        for v in node.present_inputs().chain(node.outputs.iter().copied()) {
            if storage[v].is_some() {
                continue;
            }
            if g.values[v].constant.is_some() {
                storage[v] = Some(Storage::Weight(weights.len()));
                weights.push(v);
                continue;
            }
            naive_bytes += g.values[v].ty.as_ref().map_or(0, |t| t.bytes() as u64);
            storage[v] = Some(match aliases.of[v] {
                Some(a) => Storage::View {
                    of: a.root,
                    byte_offset: a.byte_offset,
                },
                None => {
                    roots.push(v);
                    Storage::Arena { offset: 0 }
                }
            });
        }
    }
    roots.sort_unstable();
    let lifetimes = liveness::lifetimes(g, &order, &aliases, &roots);
    let intervals: Vec<Interval> = lifetimes
        .iter()
        .map(|l| Interval {
            bytes: aligned(l.bytes),
            first: l.first,
            last: l.last,
        })
        .collect();
    let mut best: Option<(u64, &'static str, Vec<u64>)> = None;
    for s in STRATEGIES {
        let offsets = s.assign(&intervals);
        let arena = offsets
            .iter()
            .zip(&intervals)
            .map(|(o, i)| o + i.bytes)
            .max()
            .unwrap_or(0);
        if best.as_ref().is_none_or(|(b, _, _)| arena < *b) {
            best = Some((arena, s.name(), offsets));
        }
    }
    let (arena_bytes, strategy, offsets) = best.unwrap_or((0, GreedyBySize.name(), Vec::new()));
    for (l, &offset) in lifetimes.iter().zip(&offsets) {
        storage[l.value] = Some(Storage::Arena { offset });
    }
    Plan {
        order,
        elided: aliases.elided,
        in_place: aliases.in_place,
        storage,
        weights,
        lower_bound_bytes: liveness::lower_bound(&intervals),
        lifetimes,
        arena_bytes,
        naive_bytes,
        strategy,
        schedule,
        alignment: ALIGNMENT,
    }
}

#[cfg(test)]
mod tests;
