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
//!
//! A graph cut into submodels ([`crate::partition`]) runs them one after another, each on its
//! own device: every submodel gets its own arena, and a tensor one submodel writes and a later
//! one reads lives in the variant's boundary buffer, planned like an arena over submodel
//! indices. A submodel's inputs stay intact while it runs, so it can be run again elsewhere.

use crate::ir::{Graph, Guard, ValueId};
use crate::partition::{Kind, Partition};
use ingot_schema::Attrs;
use std::ops::Range;

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
    /// In the arena of the submodel whose steps write and read it.
    Arena { offset: u64 },
    /// In the boundary buffer: written by one submodel, read by a later one.
    Boundary { offset: u64 },
    /// The bytes of `of` (a root: never itself a view) starting at `byte_offset`.
    View { of: ValueId, byte_offset: u64 },
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
        Target { can_run_in_place: &ingot_ops::can_run_in_place, views: true, reorder: true }
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
    /// The submodels, in execution order.
    pub submodels: Vec<Submodel>,
    /// Per node: why it has no Vulkan kernel (`None`: it has one, or nobody asked).
    pub no_vulkan: Vec<Option<String>>,
    /// Bytes of every submodel's arena together.
    pub arena_bytes: u64,
    /// The sum of the submodels' lower bounds.
    pub lower_bound_bytes: u64,
    pub boundary_bytes: u64,
    /// Sum of the bytes of every activation, as if nothing shared memory.
    pub naive_bytes: u64,
    pub strategy: &'static str,
    pub schedule: &'static str,
    pub alignment: u64,
}

/// One submodel's part of the plan.
#[derive(Clone, Debug)]
pub struct Submodel {
    pub kind: Kind,
    /// The conditions it runs under (none: always), each a root the host can read before it
    /// runs: a graph input, or a graph output or boundary tensor of an earlier submodel.
    pub guard: Guard,
    /// The run-time loop ([`crate::ir::Graph::repeats`]) whose body it is part of: it runs
    /// once per iteration, with the loop's other submodels, which are next to it.
    pub repeat: Option<usize>,
    /// Its nodes: positions in [`Plan::order`].
    pub positions: Range<usize>,
    /// The roots it reads but does not write (graph inputs, boundary tensors, graph outputs
    /// of earlier submodels), and the roots it writes that outlive it (graph outputs,
    /// boundary tensors), each in order of first use.
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The weights it reads, as indices into [`Plan::weights`], in order of first use.
    pub weights: Vec<usize>,
    pub arena_bytes: u64,
    pub lower_bound_bytes: u64,
    pub strategy: &'static str,
}

impl Plan {
    /// The nodes that run, in order.
    pub fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.iter().copied().filter(|&n| !self.elided[n])
    }

    /// The nodes of submodel `s` that run, in order.
    pub fn submodel_steps(&self, s: usize) -> impl Iterator<Item = usize> + '_ {
        self.order[self.submodels[s].positions.clone()].iter().copied().filter(|&n| !self.elided[n])
    }
}

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Plans `g` as one submodel for `target`: the best plan over every schedule and strategy.
pub fn plan(g: &Graph, target: Target) -> Plan {
    plan_parts(g, &Partition::single(g), target)
}

/// Plans `g` cut into `parts` for `target`: the best plan over every schedule and strategy.
/// Each schedule is reordered (stably) to run the submodels one after another, which keeps
/// it topological: a node only reads from its own or earlier submodels.
pub fn plan_parts(g: &Graph, parts: &Partition, target: Target) -> Plan {
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
        let p = plan_in(g, parts, order, name, target);
        let key = |p: &Plan| (p.arena_bytes + p.boundary_bytes, p.lower_bound_bytes);
        if best.as_ref().is_none_or(|b| key(&p) < key(b)) {
            best = Some(p);
        }
    }
    best.unwrap_or_else(|| plan_in(g, parts, schedule::model_order(g), "model-order", target))
}

/// Plans `g` as one submodel executed in `order`.
pub fn plan_order(g: &Graph, order: Vec<usize>, schedule: &'static str, target: Target) -> Plan {
    plan_in(g, &Partition::single(g), order, schedule, target)
}

/// Plans `g` cut into `parts`, executed in `order` (stably sorted by submodel first).
fn plan_in(
    g: &Graph,
    parts: &Partition,
    mut order: Vec<usize>,
    schedule: &'static str,
    target: Target,
) -> Plan {
    let part = &parts.part;
    order.sort_by_key(|&n| part[n]);
    let aliases = alias::analyse(g, &order, part, target.views, target.can_run_in_place);
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
                Some(a) => Storage::View { of: a.root, byte_offset: a.byte_offset },
                None => {
                    roots.push(v);
                    Storage::Arena { offset: 0 }
                }
            });
        }
    }
    roots.sort_unstable();
    let lifetimes = liveness::lifetimes(g, &order, &aliases, &roots);

    // Which submodel writes each root, and the last one that reads it.
    let mut writer = vec![usize::MAX; g.values.len()];
    let mut last_reader = vec![0usize; g.values.len()];
    for &ni in order.iter().filter(|&&n| !aliases.elided[n]) {
        let node = &g.nodes[ni];
        for v in node.present_inputs() {
            let r = aliases.root(v).root;
            last_reader[r] = last_reader[r].max(part[ni]);
        }
        for &v in &node.outputs {
            writer[aliases.root(v).root] = part[ni];
        }
    }
    // A run-time loop's submodels run again each iteration: what they read that was written
    // before the loop must last until its last submodel.
    let mut span = vec![(usize::MAX, 0); g.repeats.len()];
    for (s, r) in parts.repeats.iter().enumerate() {
        if let Some(&r) = r.as_ref() {
            span[r] = (span[r].0.min(s), span[r].1.max(s));
        }
    }
    for &ni in order.iter().filter(|&&n| !aliases.elided[n]) {
        let Some(&Some(r)) = parts.repeats.get(part[ni]) else { continue };
        for v in g.nodes[ni].present_inputs() {
            let root = aliases.root(v).root;
            if writer[root] < span[r].0 {
                last_reader[root] = last_reader[root].max(span[r].1);
            }
        }
    }
    let crosses = |v: ValueId| writer[v] != usize::MAX && last_reader[v] > writer[v];

    // Each submodel's arena over the lifetimes of the roots it alone uses.
    let mut submodels = Vec::with_capacity(parts.kinds.len());
    let mut local: Vec<Lifetime> = Vec::new();
    let mut at = 0;
    for (s, kind) in parts.kinds.iter().enumerate() {
        let end = at + order[at..].iter().take_while(|&&n| part[n] == s).count();
        let own: Vec<&Lifetime> =
            lifetimes.iter().filter(|l| !crosses(l.value) && writer[l.value] == s).collect();
        let intervals: Vec<Interval> = own
            .iter()
            .map(|l| Interval { bytes: aligned(l.bytes), first: l.first, last: l.last })
            .collect();
        let (arena_bytes, strategy, offsets) = best_layout(&intervals);
        for (l, &offset) in own.iter().zip(&offsets) {
            storage[l.value] = Some(Storage::Arena { offset });
        }
        local.extend(own.into_iter().cloned());
        submodels.push(Submodel {
            kind: kind.clone(),
            guard: parts.guards.get(s).cloned().unwrap_or_default(),
            repeat: parts.repeats.get(s).copied().flatten(),
            positions: at..end,
            inputs: Vec::new(),
            outputs: Vec::new(),
            weights: Vec::new(),
            arena_bytes,
            lower_bound_bytes: liveness::lower_bound(&intervals),
            strategy,
        });
        at = end;
    }

    // The boundary buffer: roots live from the submodel that writes them to the last that
    // reads them, both included, so a submodel's inputs and outputs never share bytes.
    let boundary: Vec<&Lifetime> = lifetimes.iter().filter(|l| crosses(l.value)).collect();
    let intervals: Vec<Interval> = boundary
        .iter()
        .map(|l| Interval {
            bytes: aligned(l.bytes),
            first: writer[l.value],
            last: last_reader[l.value],
        })
        .collect();
    let (boundary_bytes, _, offsets) = best_layout(&intervals);
    for (l, &offset) in boundary.iter().zip(&offsets) {
        storage[l.value] = Some(Storage::Boundary { offset });
    }

    // What crosses each submodel's edge, and the weights it reads.
    for (s, sub) in submodels.iter_mut().enumerate() {
        for &ni in order[sub.positions.clone()].iter().filter(|&&n| !aliases.elided[n]) {
            let node = &g.nodes[ni];
            for v in node.present_inputs() {
                let r = aliases.root(v).root;
                match storage[r] {
                    Some(Storage::Weight(w)) if !sub.weights.contains(&w) => sub.weights.push(w),
                    Some(Storage::Input(_) | Storage::Boundary { .. } | Storage::Output(_))
                        if writer[r] != s && !sub.inputs.contains(&r) =>
                    {
                        sub.inputs.push(r)
                    }
                    _ => {}
                }
            }
            for &v in &node.outputs {
                let r = aliases.root(v).root;
                let outlives =
                    matches!(storage[r], Some(Storage::Output(_) | Storage::Boundary { .. }));
                if outlives && !sub.outputs.contains(&r) {
                    sub.outputs.push(r);
                }
            }
        }
    }
    // A submodel of views alone runs nothing: its nodes join no arena and cross nothing.
    submodels.retain(|s| order[s.positions.clone()].iter().any(|&n| !aliases.elided[n]));

    let largest = submodels.iter().max_by_key(|s| s.arena_bytes);
    Plan {
        strategy: largest.map_or(GreedyBySize.name(), |s| s.strategy),
        arena_bytes: submodels.iter().map(|s| s.arena_bytes).sum(),
        lower_bound_bytes: submodels.iter().map(|s| s.lower_bound_bytes).sum(),
        order,
        elided: aliases.elided,
        in_place: aliases.in_place,
        storage,
        weights,
        lifetimes: local,
        submodels,
        no_vulkan: parts.no_vulkan.clone(),
        boundary_bytes,
        naive_bytes,
        schedule,
        alignment: ALIGNMENT,
    }
}

/// The smallest layout of `intervals` any strategy finds: (bytes, strategy, offsets).
fn best_layout(intervals: &[Interval]) -> (u64, &'static str, Vec<u64>) {
    let mut best: Option<(u64, &'static str, Vec<u64>)> = None;
    for s in STRATEGIES {
        let offsets = s.assign(intervals);
        let bytes = offsets.iter().zip(intervals).map(|(o, i)| o + i.bytes).max().unwrap_or(0);
        if best.as_ref().is_none_or(|(b, _, _)| bytes < *b) {
            best = Some((bytes, s.name(), offsets));
        }
    }
    best.unwrap_or((0, GreedyBySize.name(), Vec::new()))
}

#[cfg(test)]
mod tests;
