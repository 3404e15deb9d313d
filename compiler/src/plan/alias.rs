//! Aliasing decided before liveness: which values share another value's bytes.
//!
//! - **Views**: Reshape, Flatten, Squeeze, Unsqueeze, Identity and inference Dropout move no
//!   bytes; Slice and Split that select one contiguous byte range (outer-axis crops) are the
//!   input's bytes at an offset. No step runs for them.
//! - **Concat in place**: a Concat whose pieces are contiguous runs of its output (outer-axis
//!   concat) runs no step: each input's producer writes straight into its piece.
//! - **In place**: an op writes its output into an input's bytes when the runtime says its
//!   kernel can run in place over that input (any input of an elementwise op; the residual of
//!   a conv or matmul whose post-ops start with a sum), the input's root dies at the op, has
//!   the same type and shape as the output, and lives in the arena.
//!
//! Chains resolve as they are found (a view of a view is a view of the root, with the offsets
//! added), so liveness and offsets only ever see roots. A graph output never aliases: it is
//! written to the caller's buffer.
//!
//! Every write to a root happens in one submodel (`part`): an in-place write only over a root
//! produced in the same submodel, a concat in place only when every piece is produced in the
//! concat's submodel. A submodel can then be run again from its inputs, on another device.

use crate::ir::{Graph, Node, ValueId};
use ingot_schema::Attrs;

/// Where a value's bytes are, relative to its root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alias {
    pub root: ValueId,
    pub byte_offset: u64,
}

#[derive(Clone, Debug)]
pub struct Aliases {
    /// Per value: `Some` if it shares a root's bytes (never for a root itself).
    pub of: Vec<Option<Alias>>,
    /// Per node: true if it runs no step (a view, or a concat written in place).
    pub elided: Vec<bool>,
    /// Per node: the input index the node writes in place over, if any.
    pub in_place: Vec<Option<usize>>,
}

impl Aliases {
    pub fn root(&self, v: ValueId) -> Alias {
        self.of[v].unwrap_or(Alias { root: v, byte_offset: 0 })
    }
}

/// Makes `v` an alias; its root now lives as long as `v` does.
fn join(a: &mut Aliases, v: ValueId, alias: Alias, root_last: &mut [usize]) {
    a.of[v] = Some(alias);
    root_last[alias.root] = root_last[alias.root].max(root_last[v]);
}

fn bytes(g: &Graph, v: ValueId) -> u64 {
    g.values[v].ty.as_ref().map_or(0, |t| t.bytes() as u64)
}

/// Product of the dims before `axis`: 1 means pieces along `axis` are contiguous runs.
fn outer(g: &Graph, v: ValueId, axis: usize) -> Option<usize> {
    let t = g.values[v].ty.as_ref()?;
    Some(t.shape.get(..axis)?.iter().product())
}

/// The byte offset of a canonical Slice's output in its input, if it is one contiguous range.
fn contiguous_slice(g: &Graph, node: &Node, input: ValueId, output: ValueId) -> Option<u64> {
    let in_shape = &g.values[input].ty.as_ref()?.shape;
    let out_shape = &g.values[output].ty.as_ref()?.shape;
    let (starts, steps) = (node.attrs.ints("starts").ok()?, node.attrs.ints("steps").ok()?);
    let elem = g.values[input].ty.as_ref()?.dtype.size() as u64;
    // The run is contiguous if, after the last axis that is cut, every axis is whole, and
    // before it every axis has one index; a step only matters where more than one index is
    // taken.
    let last_cut = (0..in_shape.len()).rev().find(|&d| out_shape[d] != in_shape[d]);
    let mut offset = 0u64;
    let mut stride = elem;
    for d in (0..in_shape.len()).rev() {
        let fits = match last_cut {
            Some(k) if d < k => out_shape[d] == 1,
            _ => true,
        };
        if !fits || (out_shape[d] > 1 && steps[d] != 1) {
            return None;
        }
        offset += starts[d].max(0) as u64 * stride;
        stride *= in_shape[d] as u64;
    }
    Some(offset)
}

/// Decides views (when `views`) and in-place writes for `g` executed in `order` (node
/// indices), each node in submodel `part[node]`. `can_run_in_place(op, attrs, k)` says
/// whether an op's kernel accepts its output over input `k`.
pub fn analyse(
    g: &Graph,
    order: &[usize],
    part: &[usize],
    views: bool,
    can_run_in_place: &dyn Fn(&str, &Attrs, usize) -> bool,
) -> Aliases {
    let n = g.values.len();
    let mut a = Aliases {
        of: vec![None; n],
        elided: vec![false; g.nodes.len()],
        in_place: vec![None; g.nodes.len()],
    };
    let mut is_output = vec![false; n];
    for &o in &g.outputs {
        is_output[o] = true;
    }
    let mut is_input = vec![false; n];
    for &i in &g.inputs {
        is_input[i] = true;
    }
    let producers = g.producers();
    // Last position (in `order`) at which each value is read; graph outputs live to the end.
    let mut last_read = vec![0usize; n];
    for (pos, &ni) in order.iter().enumerate() {
        for v in g.nodes[ni].present_inputs() {
            last_read[v] = last_read[v].max(pos);
        }
    }
    for &o in &g.outputs {
        last_read[o] = usize::MAX;
    }
    // Last read of each root over every value aliasing it, kept up to date as aliases form.
    let mut root_last = last_read.clone();

    for (pos, &ni) in order.iter().enumerate() {
        let node = &g.nodes[ni];
        if node.outputs.iter().any(|&o| is_output[o]) {
            continue;
        }
        let first_input = node
            .inputs
            .first()
            .copied()
            .flatten()
            .filter(|&i| views && g.values[i].constant.is_none());
        if let Some(views) = first_input.and_then(|input| view_of(g, node, input, &a)) {
            for (o, alias) in views {
                join(&mut a, o, alias, &mut root_last);
            }
            a.elided[ni] = true;
            continue;
        }
        if views
            && node.op == "Concat"
            && concat_in_place(
                g,
                node,
                [&is_input, &is_output],
                &producers,
                |p| part[p] == part[ni],
                &mut a,
                &mut root_last,
            )
        {
            a.elided[ni] = true;
            continue;
        }
        let [output] = node.outputs[..] else { continue };
        let out_ty = g.values[output].ty.as_ref();
        let candidate = node.inputs.iter().enumerate().find_map(|(k, input)| {
            let input = (*input)?;
            if !can_run_in_place(&node.op, &node.attrs, k) {
                return None;
            }
            let r = a.root(input);
            let in_arena =
                !is_input[r.root] && !is_output[r.root] && g.values[r.root].constant.is_none();
            let same_type = g.values[input].ty.as_ref() == out_ty;
            let dies_here = root_last[r.root] == pos;
            let same_submodel = producers[r.root].is_some_and(|p| part[p] == part[ni]);
            // The root must not also be read through another operand of this node.
            let read_once = node
                .present_inputs()
                .enumerate()
                .all(|(j, other)| j == k || a.root(other).root != r.root);
            (in_arena && same_type && dies_here && same_submodel && read_once).then_some((k, r))
        });
        if let Some((k, r)) = candidate {
            join(&mut a, output, r, &mut root_last);
            a.in_place[ni] = Some(k);
        }
    }
    a
}

/// The aliases a view node gives its outputs: the same bytes (reshape family, BitCast), one
/// contiguous range (outer-axis Slice), or consecutive ranges (outer-axis Split).
fn view_of(g: &Graph, node: &Node, input: ValueId, a: &Aliases) -> Option<Vec<(ValueId, Alias)>> {
    let r = a.root(input);
    let at = |offset: u64| Alias { root: r.root, byte_offset: r.byte_offset + offset };
    match (node.op.as_str(), node.outputs.as_slice()) {
        (op, &[output]) if ingot_ops::is_view(op) => Some(vec![(output, r)]),
        ("Slice", &[output]) => {
            contiguous_slice(g, node, input, output).map(|off| vec![(output, at(off))])
        }
        ("Split", outputs) => {
            let axis = usize::try_from(node.attrs.int("axis").ok()?).ok()?;
            (outer(g, input, axis)? == 1).then(|| {
                let mut offset = 0;
                outputs
                    .iter()
                    .map(|&o| {
                        let alias = (o, at(offset));
                        offset += bytes(g, o);
                        alias
                    })
                    .collect()
            })
        }
        _ => None,
    }
}

/// Makes each input of an outer-axis Concat a view of its piece of the output, when every
/// input is an activation root that only this Concat places and whose producer is `local`
/// (in the concat's submodel): its producer then writes into the output directly. All or
/// nothing.
fn concat_in_place(
    g: &Graph,
    node: &Node,
    [is_input, is_output]: [&[bool]; 2],
    producers: &[Option<usize>],
    local: impl Fn(usize) -> bool,
    a: &mut Aliases,
    root_last: &mut [usize],
) -> bool {
    let [output] = node.outputs[..] else {
        return false;
    };
    let axis = node.attrs.int("axis").ok().and_then(|x| usize::try_from(x).ok());
    if axis.and_then(|axis| outer(g, output, axis)) != Some(1) {
        return false;
    }
    let inputs: Vec<ValueId> = node.present_inputs().collect();
    // Each input: a root (no alias of its own), computed by the graph (not an input, an
    // output, which lives in the caller's buffer, or a constant), placed once. A nested
    // in-place Concat qualifies: its pieces move along.
    let eligible = |&x: &ValueId| {
        let once = inputs.iter().filter(|&&y| y == x).count() == 1;
        once && producers[x].is_some_and(&local)
            && a.of[x].is_none()
            && !is_input[x]
            && !is_output[x]
            && g.values[x].constant.is_none()
    };
    if inputs.is_empty() || !inputs.iter().all(eligible) {
        return false;
    }
    let mut offset = 0;
    for &x in &inputs {
        // Everything that aliased x now aliases the concat output, shifted by x's offset.
        for v in 0..a.of.len() {
            if let Some(al) = a.of[v]
                && al.root == x
            {
                a.of[v] = Some(Alias { root: output, byte_offset: offset + al.byte_offset });
            }
        }
        a.of[x] = Some(Alias { root: output, byte_offset: offset });
        root_last[output] = root_last[output].max(root_last[x]);
        offset += bytes(g, x);
    }
    true
}
