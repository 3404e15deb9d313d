//! Cuts a graph into submodels: maximal runs of nodes that one kind of device can execute
//! (DESIGN.md, "Submodels and the device fallback list").
//!
//! The CPU runs every op; Vulkan runs the nodes that have a kernel. Which nodes those are is
//! asked of the op families before planning (`kernels::capability`: op, dtypes, attributes,
//! shapes); the few a plan takes away (an output written over an input, an offset a kernel
//! cannot read) are cut again after it (see `crate::plan_graph`).
//!
//! The cut follows a capability-aware topological order: Kahn's algorithm that keeps taking
//! ready nodes of the current kind before it switches, so a CPU-only op on a side branch
//! does not split the Vulkan run around it. Views (the Reshape family) run no kernel and join
//! whichever run is current.
//!
//! Nodes in a branch of a run-time `If` carry a guard ([`Graph::guards`]): a run holds nodes
//! of one guard only, so that the runtime can skip it whole, and comes after the node that
//! computes each condition it tests.

use crate::ir::{self, Condition, Graph, Guard};
use std::collections::BTreeSet;

/// The kind of device a submodel needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Every node has a Vulkan kernel (the CPU can run it too).
    Vulkan,
    /// Some node runs only on the CPU; `why` names the first one and the reason.
    Cpu { why: String },
}

impl Kind {
    /// The device kinds that can run it, best first, as `ingot plan` prints them.
    pub fn devices(&self) -> &'static str {
        match self {
            Kind::Vulkan => "vulkan, cpu",
            Kind::Cpu { .. } => "cpu",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Per node: the index of its submodel. Submodels are numbered in execution order, and a
    /// node only reads values of nodes in the same or earlier submodels.
    pub part: Vec<usize>,
    /// Per submodel: what can run it.
    pub kinds: Vec<Kind>,
    /// Per node: why it has no Vulkan kernel (`None`: it has one).
    pub no_vulkan: Vec<Option<String>>,
    /// Per submodel: the conditions it runs under (none: always).
    pub guards: Vec<Guard>,
    /// Per submodel: the run-time loop ([`Graph::repeats`]) whose body it is part of. A
    /// loop's submodels are consecutive and hold nothing else.
    pub repeats: Vec<Option<usize>>,
}

impl Partition {
    /// Everything in one submodel that Vulkan can run, unguarded (a guarded node then runs
    /// whether or not its branch is taken).
    pub fn single(g: &Graph) -> Partition {
        Partition {
            part: vec![0; g.nodes.len()],
            kinds: vec![Kind::Vulkan],
            no_vulkan: vec![None; g.nodes.len()],
            guards: vec![Guard::new()],
            repeats: vec![None],
        }
    }

    /// Cuts `g` given, per node, why it has no Vulkan kernel (`None`: it has one).
    pub fn new(g: &Graph, no_vulkan: &[Option<String>]) -> Partition {
        let class = |n: usize| match &no_vulkan[n] {
            Some(_) => Class::Cpu,
            None if ingot_ops::is_view(&g.nodes[n].op) => Class::Either,
            None => Class::Vulkan,
        };
        let producers = g.producers();
        let repeat_of: Vec<Option<usize>> = g.nodes.iter().map(|n| g.repeat_of(n)).collect();
        let deps_of = |node: &ir::Node| -> BTreeSet<usize> {
            // A guarded node waits for its conditions too: the runtime reads them first.
            let conditions = g.guard(node).iter().map(|c| c.value);
            node.present_inputs().chain(conditions).filter_map(|v| producers[v]).collect()
        };
        // A run-time loop's body runs as consecutive submodels, so nothing may come between
        // its nodes: each waits for everything any of them needs from outside, and whatever
        // reads what the runtime holds for it (its final carried values) waits for all of them.
        let mut body: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); g.repeats.len()];
        let mut entry: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); g.repeats.len()];
        for (n, node) in g.nodes.iter().enumerate() {
            if let Some(r) = repeat_of[n] {
                body[r].insert(n);
                entry[r].extend(deps_of(node).into_iter().filter(|&d| repeat_of[d] != Some(r)));
            }
        }
        let mut held_by = vec![None; g.values.len()];
        for (r, repeat) in g.repeats.iter().enumerate() {
            for v in repeat.held() {
                held_by[v] = Some(r);
            }
            // What first writes a stacked scan output comes after the body in the graph.
            entry[r].extend(repeat.scans.iter().filter_map(|&(_, stacked)| producers[stacked]));
        }
        // A node that reads only constants (a weight widened to f32, a table dequantized at
        // run time) would be ready from the start, and taken early its output would hold
        // memory until its reader runs, maybe submodels later: it waits for what its first
        // reader waits for instead (every one of those comes before that reader in the
        // model's order, so none of them depends on this node).
        let reads_constants_only = |node: &ir::Node| {
            node.present_inputs().next().is_some()
                && node.present_inputs().all(|v| g.constant(v).is_some())
        };
        let mut first_reader: Vec<Option<usize>> = vec![None; g.nodes.len()];
        for (n, node) in g.nodes.iter().enumerate() {
            for p in node.present_inputs().filter_map(|v| producers[v]) {
                first_reader[p].get_or_insert(n);
            }
        }
        let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
        let mut waiting = vec![0usize; g.nodes.len()];
        for (n, node) in g.nodes.iter().enumerate() {
            // (Only inside the reader's own loop body or outside any: a node outside a body
            // that waited for body nodes could never run before the body ends.)
            let beside = |&r: &usize| reads_constants_only(node) && repeat_of[r] == repeat_of[n];
            let mut deps = match first_reader[n].filter(beside) {
                Some(reader) => deps_of(&g.nodes[reader])
                    .into_iter()
                    .filter(|&d| !reads_constants_only(&g.nodes[d]))
                    .collect(),
                None => deps_of(node),
            };
            if let Some(r) = repeat_of[n] {
                deps.extend(&entry[r]);
            }
            for r in node.present_inputs().filter_map(|v| held_by[v]) {
                if repeat_of[n] != Some(r) {
                    deps.extend(&body[r]);
                }
            }
            waiting[n] = deps.len();
            for d in deps {
                consumers[d].push(n);
            }
        }
        let mut ready: BTreeSet<usize> = (0..g.nodes.len()).filter(|&n| waiting[n] == 0).collect();
        let mut p = Partition {
            part: vec![0; g.nodes.len()],
            kinds: Vec::new(),
            no_vulkan: no_vulkan.to_vec(),
            guards: Vec::new(),
            repeats: Vec::new(),
        };
        // The current run: its class (`Either` until a node decides it), its guard, why it
        // needs the CPU (its first CPU-only node), and how many nodes it has.
        let mut current = Class::Either;
        let mut guard: &[Condition] = &[];
        let mut repeat = None;
        let mut why = None;
        let mut len = 0;
        while let Some(&first_ready) = ready.first() {
            let fits = |n: usize| {
                let c = class(n);
                let kind = current == Class::Either || c == Class::Either || c == current;
                kind && g.guard(&g.nodes[n]) == guard && repeat_of[n] == repeat
            };
            let n = match ready.iter().copied().find(|&n| fits(n)) {
                Some(n) => n,
                None => {
                    // Nothing more of this kind is ready: the run ends here. A loop's body
                    // goes on in the next run while any of it is left.
                    if len > 0 {
                        p.close(current, why.take(), guard, repeat);
                    }
                    current = Class::Either;
                    len = 0;
                    let same_loop = repeat
                        .and_then(|_| ready.iter().copied().find(|&n| repeat_of[n] == repeat));
                    same_loop.unwrap_or(first_ready)
                }
            };
            ready.remove(&n);
            if len == 0 {
                guard = g.guard(&g.nodes[n]);
                repeat = repeat_of[n];
            }
            if current == Class::Either {
                current = class(n);
            }
            if why.is_none() {
                why = no_vulkan[n].as_ref().map(|r| format!("{}: {r}", g.nodes[n].label()));
            }
            p.part[n] = p.kinds.len();
            len += 1;
            for &c in &consumers[n] {
                waiting[c] -= 1;
                if waiting[c] == 0 {
                    ready.insert(c);
                }
            }
        }
        if len > 0 {
            p.close(current, why, guard, repeat);
        }
        p
    }

    fn close(
        &mut self,
        class: Class,
        why: Option<String>,
        guard: &[Condition],
        repeat: Option<usize>,
    ) {
        self.kinds.push(match (class, why) {
            (Class::Cpu, why) => Kind::Cpu { why: why.unwrap_or_default() },
            _ => Kind::Vulkan,
        });
        self.guards.push(guard.to_vec());
        self.repeats.push(repeat);
    }
}

/// What one node needs: a Vulkan kernel, the CPU, or nothing (a view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Vulkan,
    Cpu,
    Either,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Node;
    use ingot_ops::TensorDesc;
    use ingot_schema::DType;

    /// A graph of unary nodes: `(op, input value)` per node, node k writing value k + 1;
    /// value 0 is the input.
    fn graph(nodes: &[(&str, usize)]) -> Graph {
        let mut g = Graph::default();
        let ty = || Some(TensorDesc::new(DType::F32, vec![4]));
        for k in 0..=nodes.len() {
            g.add_value(format!("v{k}"), ty());
        }
        for (k, &(op, input)) in nodes.iter().enumerate() {
            g.nodes.push(Node {
                name: format!("n{k}"),
                op: op.into(),
                domain: String::new(),
                inputs: vec![Some(input)],
                outputs: vec![k + 1],
                attrs: Default::default(),
            });
        }
        g.inputs = vec![0];
        g
    }

    fn cpu_at(n: usize, at: &[usize]) -> Vec<Option<String>> {
        (0..n).map(|k| at.contains(&k).then(|| "no kernel".to_string())).collect()
    }

    #[test]
    fn a_cpu_op_in_a_chain_makes_three_submodels() {
        let g = graph(&[("Relu", 0), ("Cast", 1), ("Relu", 2)]);
        let p = Partition::new(&g, &cpu_at(3, &[1]));
        assert_eq!(p.part, [0, 1, 2]);
        assert_eq!(
            p.kinds,
            [Kind::Vulkan, Kind::Cpu { why: "'n1' (Cast): no kernel".into() }, Kind::Vulkan]
        );
    }

    #[test]
    fn a_cpu_op_on_a_side_branch_does_not_split_the_vulkan_run() {
        // n0 and n2 read the input, n1 (CPU) too: in the model's order V C V, cut as V V | C.
        let g = graph(&[("Relu", 0), ("Cast", 0), ("Relu", 0)]);
        let p = Partition::new(&g, &cpu_at(3, &[1]));
        assert_eq!(p.part, [0, 1, 0]);
        assert_eq!(p.kinds.len(), 2);
    }

    #[test]
    fn a_node_of_constants_runs_beside_its_reader() {
        // n2 widens a weight for n3, which also reads n1's output (CPU): ready from the
        // start, n2 would join n0's run and its output live across n1's.
        let mut g = graph(&[("Relu", 0), ("Cast", 1), ("Cast", 0), ("Add", 2)]);
        let w = ingot_ops::Tensor::from_vec(vec![4], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let w = g.add_constant("w", crate::ir::Const::owned(w));
        g.nodes[2].inputs = vec![Some(w)];
        g.nodes[3].inputs.push(Some(3));
        let p = Partition::new(&g, &cpu_at(4, &[1]));
        assert_eq!(p.part, [0, 1, 2, 2]);
    }

    #[test]
    fn views_join_the_current_run() {
        let g = graph(&[("Relu", 0), ("Reshape", 1), ("Cast", 2), ("Reshape", 3)]);
        let p = Partition::new(&g, &cpu_at(4, &[2]));
        assert_eq!(p.part, [0, 0, 1, 1]);
        // A graph of views alone is one submodel.
        let g = graph(&[("Reshape", 0), ("Flatten", 1)]);
        assert_eq!(Partition::new(&g, &cpu_at(2, &[])).kinds, [Kind::Vulkan]);
    }

    #[test]
    fn each_guard_is_a_run_of_its_own_after_its_condition() {
        // v2 (n1) is the condition; n0 runs when it holds, n2 when not, n3 always (reads v1).
        let mut g = graph(&[("Relu", 0), ("Relu", 0), ("Relu", 0), ("Relu", 1)]);
        let when = |holds| vec![Condition { value: 2, holds }];
        g.guards = [(1, when(true)), (3, when(false))].into();
        let p = Partition::new(&g, &cpu_at(4, &[]));
        // n0 comes first in the model, but waits for its condition.
        assert_eq!(p.part, [1, 0, 2, 3]);
        assert_eq!(p.guards, [vec![], when(true), when(false), vec![]]);
    }

    #[test]
    fn a_run_time_loops_body_is_consecutive_submodels_of_its_own() {
        // n1, n3, n4 are a loop's body (n3 CPU-only); n2, outside it and CPU-only, is ready
        // once n0 has run, before n3, but goes after the whole body, not between its runs.
        let mut g = graph(&[("Relu", 0), ("Relu", 0), ("Cast", 1), ("Cast", 2), ("Relu", 4)]);
        let iteration = g.add_value("iteration", None);
        g.repeats = vec![ir::Repeat::bare(iteration)];
        g.in_repeat = [(2, 0), (4, 0), (5, 0)].into();
        let p = Partition::new(&g, &cpu_at(5, &[2, 3]));
        assert_eq!(p.part, [0, 1, 4, 2, 3]);
        assert_eq!(p.repeats, [None, Some(0), Some(0), Some(0), None]);
    }

    #[test]
    fn everything_on_one_kind_is_one_submodel() {
        let g = graph(&[("Relu", 0), ("Relu", 1)]);
        assert_eq!(Partition::new(&g, &cpu_at(2, &[])), Partition::single(&g));
        let all_cpu = Partition::new(&g, &cpu_at(2, &[0, 1]));
        assert_eq!(all_cpu.part, [0, 0]);
        assert!(matches!(all_cpu.kinds[..], [Kind::Cpu { .. }]));
    }
}
