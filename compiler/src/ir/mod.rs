//! The compiler's graph: values (tensors) and nodes, in the model's order.
//!
//! Nodes live in a `Vec` in a valid execution order once import has sorted them; algorithms
//! that need graph structure (topological order, cycle detection) build a petgraph view.

use ingot_ops::{Tensor, TensorDesc};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

mod check;
pub use check::check;

pub use ingot_ops::{Node, ValueId};

/// A tensor of the graph.
#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    /// Element type and static shape; `None` until shape inference has reached it.
    pub ty: Option<TensorDesc>,
    /// Set for initializers, Constant nodes and everything folded from them.
    pub constant: Option<Const>,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Opset version of the default ONNX domain.
    pub opset: i64,
    /// The subgraphs of control-flow nodes; such a node's graph attribute (an `If`'s
    /// `then_branch`) holds its body's index here. The passes inline them, so none is left
    /// once `passes::run_all` returns.
    pub bodies: Vec<Body>,
    /// What a node in a branch of a run-time `If` runs under, by the node's outputs: every
    /// condition must hold (outermost first). A node whose outputs are not here always runs.
    /// Keyed by value, not node, so that it survives passes that move and merge nodes: a
    /// node that absorbs a consumer takes over its outputs, and with them its guard.
    pub guards: BTreeMap<ValueId, Guard>,
    /// Values with a data-dependent length along one dim (see `ingot_ops::bounded`): their
    /// type holds the upper bound there.
    pub bounded: BTreeMap<ValueId, Bound>,
    /// The `Loop`s that run at run time, as repeated submodels (see `passes/control.rs`).
    pub repeats: Vec<Repeat>,
    /// What a node in the body of such a loop belongs to, by the node's outputs (as
    /// [`Graph::guards`]): the index of its [`Repeat`]. Nodes not here run once.
    pub in_repeat: BTreeMap<ValueId, usize>,
    /// The most iterations a run-time loop may stack scan outputs for where its trip count is
    /// not a constant (`CompileOptions::max_loop_iterations`); none: such a loop is refused.
    pub max_loop_iterations: Option<usize>,
    /// Store the weights that kernels read as float16 so (`CompileOptions::f16_weights`;
    /// `passes/half_weights.rs`).
    pub f16_weights: bool,
    /// Values that hold tensors rather than being one: sequences and optionals
    /// (`passes/sequences.rs`). The importer puts the graph inputs of those types here, each
    /// holding tensor inputs of its own; the `lower` walk adds what the sequence ops make and
    /// leaves none behind: a graph output of such a value becomes its tensors.
    pub containers: BTreeMap<ValueId, Container>,
}

/// What a sequence or optional value holds: tensor values, or other containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Container {
    Sequence(Vec<ValueId>),
    Optional(Option<ValueId>),
}

/// A `Loop` whose body runs at run time until its trip count or its condition ends it. Its
/// body's nodes are in the graph once, as one iteration; what passes from one iteration to
/// the next lives in values the runtime holds (graph outputs after the caller's), each
/// written once before the loop by a copy the graph makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repeat {
    /// The `Loop`'s name (or op), and how messages name it (`'loop' (Loop)`).
    pub name: String,
    pub label: String,
    /// The iteration number (int64, one element): the body reads it, the runtime adds one
    /// after each iteration.
    pub iteration: ValueId,
    /// The trip count (int64, one element), where the loop has one: it ends once
    /// `iteration` reaches it.
    pub trip_count: Option<ValueId>,
    /// The condition (bool, one element), where the loop has one: it ends once it is false
    /// before an iteration. It is also the state of the first of `carried`.
    pub condition: Option<ValueId>,
    /// `(state, next)`: the body reads `state` and writes `next`, which the runtime copies
    /// over `state` after each iteration (the same type, checked when inferred).
    pub carried: Vec<(ValueId, ValueId)>,
    /// The conditions the whole loop runs under (a run-time `If` branch it is in): the
    /// runtime tests them before the first iteration, since the copies before the loop
    /// ran only where they hold.
    pub guard: Guard,
    /// `(slice, stacked)`: the body writes `slice`, which the runtime copies into row
    /// `iteration` of `stacked` after each iteration: a scan output, as long as the trip
    /// count where it is a constant, else as `Graph::max_loop_iterations`, and filled as far
    /// as `iteration` goes (its bound).
    pub scans: Vec<(ValueId, ValueId)>,
}

impl Repeat {
    /// A loop named `loop` that holds only its iteration: what planner tests start from.
    #[cfg(test)]
    pub fn bare(iteration: ValueId) -> Repeat {
        Repeat {
            name: "loop".into(),
            label: "'loop' (Loop)".into(),
            iteration,
            trip_count: None,
            condition: None,
            carried: Vec::new(),
            guard: Vec::new(),
            scans: Vec::new(),
        }
    }

    /// Every value the runtime reads or writes around the body.
    pub fn held(&self) -> impl Iterator<Item = ValueId> + '_ {
        std::iter::once(self.iteration)
            .chain(self.trip_count)
            .chain(self.carried.iter().flat_map(|&(s, n)| [s, n]))
            .chain(self.scans.iter().flat_map(|&(s, n)| [s, n]))
    }
}

/// A value whose dim `axis` a run fills only up to `count`, an int64 scalar value of the
/// graph (what the op that made the rows wrote).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub axis: usize,
    pub count: ValueId,
}

/// The conditions a guarded node runs under, outermost first; empty: always.
pub type Guard = Vec<Condition>;

/// A one-element bool `value` that must equal `holds` for a node to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Condition {
    pub value: ValueId,
    pub holds: bool,
}

/// A subgraph of a control-flow node. Its nodes read values of the enclosing graphs
/// directly (ONNX scopes names lexically); the node lists those outer values among its own
/// inputs, so that ordering and dead-code elimination see them. Its values, constants
/// included, live in the graph's value table.
#[derive(Clone, Debug, Default)]
pub struct Body {
    /// The body's own inputs (a `Loop` or `Scan` body's); an `If` branch has none.
    pub inputs: Vec<ValueId>,
    /// In a valid execution order.
    pub nodes: Vec<Node>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    pub fn add_value(&mut self, name: impl Into<String>, ty: Option<TensorDesc>) -> ValueId {
        self.values.push(Value { name: name.into(), ty, constant: None });
        self.values.len() - 1
    }

    pub fn add_constant(&mut self, name: impl Into<String>, value: Const) -> ValueId {
        let id = self.add_value(name, Some(value.desc().clone()));
        self.values[id].constant = Some(value);
        id
    }

    pub fn ty(&self, id: ValueId) -> Option<&TensorDesc> {
        self.values[id].ty.as_ref()
    }

    pub fn constant(&self, id: ValueId) -> Option<&Const> {
        self.values[id].constant.as_ref()
    }

    /// For each value, the index of the node that produces it.
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &o in &n.outputs {
                p[o] = Some(i);
            }
        }
        p
    }

    /// The conditions `node` runs under (none: always).
    pub fn guard(&self, node: &Node) -> &[Condition] {
        node.outputs.first().and_then(|o| self.guards.get(o)).map_or(&[], Vec::as_slice)
    }

    /// The run-time loop whose body `node` is in, if any.
    pub fn repeat_of(&self, node: &Node) -> Option<usize> {
        node.outputs.first().and_then(|o| self.in_repeat.get(o)).copied()
    }

    /// Puts value `to`, new, where `from` is: under its guard and in its loop body.
    pub fn inherit(&mut self, from: ValueId, to: ValueId) {
        if let Some(guard) = self.guards.get(&from).cloned() {
            self.guards.insert(to, guard);
        }
        if let Some(&r) = self.in_repeat.get(&from) {
            self.in_repeat.insert(to, r);
        }
    }

    /// For each value, how many node inputs and graph outputs read it.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.values.len()];
        for n in &self.nodes {
            for i in n.present_inputs() {
                c[i] += 1;
            }
        }
        for &o in &self.outputs {
            c[o] += 1;
        }
        c
    }
}

/// A constant's bytes: owned, or a range of a mapped external-data file (never read whole).
#[derive(Clone)]
pub struct Const {
    desc: TensorDesc,
    data: ConstData,
}

#[derive(Clone)]
enum ConstData {
    Owned(Arc<Tensor>),
    Mapped { map: Arc<memmap2::Mmap>, range: Range<usize> },
}

impl std::fmt::Debug for Const {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Const({} {:?})", self.desc.dtype, self.desc.shape)
    }
}

impl Const {
    pub fn owned(t: Tensor) -> Self {
        Self { desc: t.desc().clone(), data: ConstData::Owned(Arc::new(t)) }
    }

    /// A constant backed by `map[range]`; the caller has checked `range` fits `desc`.
    pub fn mapped(desc: TensorDesc, map: Arc<memmap2::Mmap>, range: Range<usize>) -> Self {
        debug_assert_eq!(range.len(), desc.bytes());
        Self { desc, data: ConstData::Mapped { map, range } }
    }

    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            ConstData::Owned(t) => t.bytes(),
            ConstData::Mapped { map, range } => &map[range.clone()],
        }
    }

    /// Lets the OS drop the pages of a mapped constant that reading it made resident: the
    /// bundle writer reads each weight twice (hash, write) and would otherwise keep every
    /// external-data byte in memory. The next read faults them in from the file again.
    #[allow(unsafe_code)]
    pub fn release_pages(&self) {
        if let ConstData::Mapped { map, range } = &self.data {
            // SAFETY: the map is a read-only mapping of a file nobody writes while we compile
            // (see onnx/external.rs); MADV_DONTNEED on it only discards clean page-cache pages
            // of this process's view, and later reads see the file's bytes again, so no
            // reference into the map observes a change.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
    }

    /// The value as an owned tensor (cheap for owned constants, a copy for mapped ones).
    pub fn tensor(&self) -> Arc<Tensor> {
        match &self.data {
            ConstData::Owned(t) => t.clone(),
            ConstData::Mapped { .. } => Arc::new(
                Tensor::from_bytes(self.desc.clone(), self.bytes())
                    .expect("mapped range was checked against the descriptor"),
            ),
        }
    }
}

impl ingot_ops::Constant for Const {
    fn desc(&self) -> &TensorDesc {
        &self.desc
    }
    fn value(&self) -> Arc<Tensor> {
        self.tensor()
    }
}
