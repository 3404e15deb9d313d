//! The plan verifier, independent of the planner: it re-derives what each step reads and
//! writes from the graph and the storage map alone, and checks that
//! - every value a step touches has storage; views point at roots and lie inside them;
//! - arena roots are aligned and inside the arena, and no two roots live at one step overlap;
//! - every step reads bytes that hold what it expects: written before it and not overwritten
//!   since. This is what makes in-place writes, shared views and in-place concats safe;
//! - submodels cover the order in runs; an arena root is touched by one submodel only and fits
//!   its arena; a boundary root is written by one submodel, and no two boundary roots whose
//!   submodel spans meet share bytes;
//! - a guarded submodel holds the nodes of its guard only, and the host can read each of its
//!   conditions when it starts: a graph input, or a graph output or boundary tensor written
//!   before.

use super::{Plan, Storage};
use crate::ir::{Condition, Graph, ValueId};

/// Byte ranges of a root and which value's write each must hold.
type Pieces = Vec<(u64, u64, ValueId)>;

pub fn verify(g: &Graph, plan: &Plan) -> Result<(), String> {
    let name = |v: ValueId| g.values[v].name.as_str();
    let bytes = |v: ValueId| g.values[v].ty.as_ref().map_or(0, |t| t.bytes() as u64);
    if plan.order.len() != g.nodes.len() || plan.elided.len() != g.nodes.len() {
        return Err("the plan's order does not cover the graph's nodes".into());
    }
    let mut scheduled = vec![false; g.nodes.len()];
    for &n in &plan.order {
        if n >= g.nodes.len() || std::mem::replace(&mut scheduled[n], true) {
            return Err(format!("node {n} appears twice or does not exist in the order"));
        }
    }

    // Where each value's bytes are: (root, start, end).
    let place = |v: ValueId| -> Result<(ValueId, u64, u64), String> {
        match &plan.storage[v] {
            None => Err(format!("'{}' has no storage", name(v))),
            Some(Storage::View { of, byte_offset }) => {
                if matches!(
                    plan.storage.get(*of),
                    Some(Some(Storage::View { .. })) | Some(None) | None
                ) {
                    return Err(format!(
                        "'{}' is a view of '{}', which is not a root",
                        name(v),
                        name(*of)
                    ));
                }
                let end = byte_offset + bytes(v);
                if end > bytes(*of) {
                    return Err(format!(
                        "view '{}' [{byte_offset}, {end}) exceeds its root '{}'",
                        name(v),
                        name(*of)
                    ));
                }
                Ok((*of, *byte_offset, end))
            }
            Some(_) => Ok((v, 0, bytes(v))),
        }
    };

    // What each root's bytes hold as steps run: (start, end, the value whose write it is).
    let mut contents: Vec<Pieces> = vec![Vec::new(); g.values.len()];
    // What reading each value must find: its own write, or for values of elided nodes, the
    // writes they are made of (a view is its input's bytes; a concat its inputs' bytes).
    let mut expect: Vec<Pieces> = vec![Vec::new(); g.values.len()];
    for (v, s) in plan.storage.iter().enumerate() {
        if matches!(s, Some(Storage::Input(_) | Storage::Weight(_))) {
            contents[v].push((0, bytes(v), v));
            expect[v] = vec![(0, bytes(v), v)];
        }
    }
    let mut first = vec![usize::MAX; g.values.len()];
    let mut last = vec![0usize; g.values.len()];
    // The submodel of each position, and the submodels that write each root.
    let mut part = vec![usize::MAX; plan.order.len()];
    for (k, sub) in plan.submodels.iter().enumerate() {
        match part.get_mut(sub.positions.clone()) {
            Some(slots) if slots.iter().all(|&p| p == usize::MAX) => slots.fill(k),
            _ => return Err(format!("submodel {k} overlaps another or leaves the order")),
        }
    }
    for (k, sub) in plan.submodels.iter().enumerate() {
        for &ni in &plan.order[sub.positions.clone()] {
            if !plan.elided[ni] && g.guard(&g.nodes[ni]) != sub.guard.as_slice() {
                return Err(format!(
                    "submodel {k} holds {}, whose guard is not the submodel's",
                    g.nodes[ni].label()
                ));
            }
        }
        for c in &sub.guard {
            let (root, _, _) = place(c.value)?;
            let host = matches!(
                plan.storage[root],
                Some(Storage::Input(_) | Storage::Output(_) | Storage::Boundary { .. })
            );
            if !host {
                return Err(format!(
                    "submodel {k} tests '{}', which the host cannot read",
                    name(c.value)
                ));
            }
        }
    }
    // Per position: the conditions read there, those of the submodel whose first step it is.
    let mut tested: Vec<&[Condition]> = vec![&[]; plan.order.len()];
    for sub in &plan.submodels {
        if let Some(pos) = sub.positions.clone().find(|&p| !plan.elided[plan.order[p]]) {
            tested[pos] = &sub.guard;
        }
    }
    let mut writers: Vec<Vec<usize>> = vec![Vec::new(); g.values.len()];
    for (pos, &ni) in plan.order.iter().enumerate() {
        let node = &g.nodes[ni];
        if plan.elided[ni] {
            elided_expectations(g, ni, &place, &mut expect)?;
            continue;
        }
        for v in tested[pos].iter().map(|c| c.value).chain(node.present_inputs()) {
            let (root, start, end) = place(v)?;
            let expected: u64 = expect[v].iter().map(|&(s, e, _)| e - s).sum();
            if expected != end - start {
                return Err(format!(
                    "step {pos} {} reads '{}' before it is written",
                    node.label(),
                    name(v)
                ));
            }
            for &(s, e, who) in &expect[v] {
                let covered: u64 = contents[root]
                    .iter()
                    .filter(|&&(_, _, w)| w == who)
                    .map(|&(cs, ce, _)| ce.min(e).saturating_sub(cs.max(s)))
                    .sum();
                if covered != e - s {
                    return Err(format!(
                        "step {pos} {} reads '{}', whose bytes do not hold it (never written, or overwritten)",
                        node.label(),
                        name(v)
                    ));
                }
            }
            last[root] = last[root].max(pos);
        }
        for &v in &node.outputs {
            let (root, start, end) = place(v)?;
            if matches!(plan.storage[root], Some(Storage::Input(_) | Storage::Weight(_))) {
                return Err(format!("step {pos} {} writes into an input or weight", node.label()));
            }
            first[root] = first[root].min(pos);
            last[root] = last[root].max(pos);
            if !writers[root].contains(&part[pos]) {
                writers[root].push(part[pos]);
            }
            // The written range now holds `v`; what was there is cut around it.
            let mut kept = Vec::with_capacity(contents[root].len() + 2);
            for &(s, e, who) in &contents[root] {
                if e <= start || s >= end {
                    kept.push((s, e, who));
                    continue;
                }
                if s < start {
                    kept.push((s, start, who));
                }
                if e > end {
                    kept.push((end, e, who));
                }
            }
            kept.push((start, end, v));
            contents[root] = kept;
            expect[v] = vec![(start, end, v)];
        }
    }

    // Arena roots: one submodel's, inside its arena. Boundary roots: one writer, inside the
    // buffer. Both then must not overlap a root live at the same time, positions for arena
    // roots and submodels for boundary roots.
    let mut arena: Vec<(ValueId, u64, u64)> = Vec::new();
    let mut boundary: Vec<(ValueId, u64, u64)> = Vec::new();
    for (v, s) in plan.storage.iter().enumerate() {
        let (offset, is_arena) = match s {
            Some(Storage::Arena { offset }) => (*offset, true),
            Some(Storage::Boundary { offset }) => (*offset, false),
            _ => continue,
        };
        if offset % plan.alignment != 0 {
            return Err(format!(
                "'{}' at offset {offset} is not {}-aligned",
                name(v),
                plan.alignment
            ));
        }
        if first[v] == usize::MAX {
            continue;
        }
        let end = offset + bytes(v);
        let (from, to) = (part[first[v]], part[last[v]]);
        if is_arena {
            let capacity = plan.submodels.get(from).map_or(0, |s| s.arena_bytes);
            if from != to {
                return Err(format!(
                    "arena tensor '{}' is used by submodels {from} and {to}",
                    name(v)
                ));
            }
            if end > capacity {
                return Err(format!(
                    "'{}' [{offset}, {end}) overruns submodel {from}'s {capacity}-byte arena",
                    name(v)
                ));
            }
            arena.push((v, offset, end));
        } else {
            if writers[v].len() > 1 {
                return Err(format!(
                    "boundary tensor '{}' is written by submodels {:?}",
                    name(v),
                    writers[v]
                ));
            }
            if end > plan.boundary_bytes {
                return Err(format!(
                    "'{}' [{offset}, {end}) overruns the {}-byte boundary buffer",
                    name(v),
                    plan.boundary_bytes
                ));
            }
            // Its span in submodels, kept in `first`/`last` from here on.
            first[v] = from;
            last[v] = to;
            boundary.push((v, offset, end));
        }
    }
    for roots in [&mut arena, &mut boundary] {
        // Sorted by offset, a root can only collide with those that start before it ends.
        roots.sort_by_key(|&(v, start, _)| (start, v));
        for (i, &(a, a0, a1)) in roots.iter().enumerate() {
            for &(b, b0, b1) in roots[i + 1..].iter().take_while(|&&(_, b0, _)| b0 < a1) {
                let live_together = first[a] <= last[b] && first[b] <= last[a];
                if live_together && a0 < b1 && b0 < a1 {
                    return Err(format!(
                        "'{}' [{a0}, {a1}) and '{}' [{b0}, {b1}) are live at the same time and \
                         overlap",
                        name(a),
                        name(b)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// For a node that runs no step, checks that its outputs really alias its inputs and derives
/// what reading each output must find.
fn elided_expectations(
    g: &Graph,
    ni: usize,
    place: &dyn Fn(ValueId) -> Result<(ValueId, u64, u64), String>,
    expect: &mut [Pieces],
) -> Result<(), String> {
    let node = &g.nodes[ni];
    let bad =
        || Err(format!("{} runs no step, but its output is not its input's bytes", node.label()));
    let inputs: Vec<ValueId> = node.present_inputs().collect();
    // The part of `pieces` (absolute ranges) inside [s, e).
    let clip = |pieces: &Pieces, s: u64, e: u64| -> Pieces {
        pieces
            .iter()
            .filter(|&&(ps, pe, _)| ps < e && pe > s)
            .map(|&(ps, pe, w)| (ps.max(s), pe.min(e), w))
            .collect()
    };
    if node.op == "Concat" {
        let [output] = node.outputs[..] else {
            return bad();
        };
        let (ro, so, eo) = place(output)?;
        let mut at = so;
        let mut pieces = Vec::new();
        for &x in &inputs {
            let (rx, sx, ex) = place(x)?;
            if rx != ro || sx != at {
                return bad();
            }
            pieces.extend(expect[x].iter().copied());
            at = ex;
        }
        if at != eo {
            return bad();
        }
        expect[output] = pieces;
        return Ok(());
    }
    let Some(&input) = inputs.first() else {
        return bad();
    };
    let (ri, si, ei) = place(input)?;
    for &o in &node.outputs {
        let (ro, so, eo) = place(o)?;
        if ro != ri || so < si || eo > ei {
            return bad();
        }
        expect[o] = clip(&expect[input], so, eo);
    }
    Ok(())
}
