//! Planner tests on small graphs built by hand (no ONNX, no kernels): each checks one
//! mechanism and that the verifier accepts the result; bad plans check the verifier.

use super::*;
use crate::ir::{Const, Graph, Node};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::DType;

fn f32s(shape: &[usize]) -> Option<TensorDesc> {
    Some(TensorDesc::new(DType::F32, shape.to_vec()))
}

fn node(g: &mut Graph, op: &str, inputs: &[usize], outputs: &[usize]) {
    g.nodes.push(Node {
        name: format!("n{}", g.nodes.len()),
        op: op.into(),
        domain: String::new(),
        inputs: inputs.iter().map(|&i| Some(i)).collect(),
        outputs: outputs.to_vec(),
        attrs: Default::default(),
    });
}

fn in_place_elementwise(op: &str, _: &ingot_schema::Attrs, _: usize) -> bool {
    matches!(op, "Relu" | "Add" | "Sigmoid")
}

fn target() -> Target<'static> {
    Target { can_run_in_place: &in_place_elementwise, views: true, reorder: true }
}

fn no_in_place() -> Target<'static> {
    Target { can_run_in_place: &|_, _, _| false, ..target() }
}

fn arena(p: &Plan, v: usize) -> u64 {
    match p.storage[v] {
        Some(Storage::Arena { offset }) => offset,
        ref s => panic!("value {v} is {s:?}, not an arena root"),
    }
}

/// x -> Conv -> a -> Relu -> b -> Conv -> c -> Add(b, c) -> d -> Conv -> y
fn residual() -> (Graph, [usize; 6]) {
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[1, 8, 4, 4]));
    let a = g.add_value("a", f32s(&[1, 8, 4, 4]));
    let b = g.add_value("b", f32s(&[1, 8, 4, 4]));
    let c = g.add_value("c", f32s(&[1, 8, 4, 4]));
    let d = g.add_value("d", f32s(&[1, 8, 4, 4]));
    let y = g.add_value("y", f32s(&[1, 8, 4, 4]));
    let w = g.add_constant(
        "w",
        Const::owned(Tensor::zeros(TensorDesc::new(DType::F32, vec![8, 8, 1, 1]))),
    );
    node(&mut g, "Conv", &[x, w], &[a]);
    node(&mut g, "Relu", &[a], &[b]);
    node(&mut g, "Conv", &[b, w], &[c]);
    node(&mut g, "Add", &[b, c], &[d]);
    node(&mut g, "Conv", &[d, w], &[y]);
    g.inputs = vec![x];
    g.outputs = vec![y];
    (g, [x, a, b, c, d, y])
}

#[test]
fn residual_add_and_relu_run_in_place() {
    let (g, [_, a, b, c, d, _]) = residual();
    let p = plan(&g, target());
    verify(&g, &p).unwrap();
    // Relu overwrites a (dead after it); the Add overwrites b or c, whichever is last read there.
    assert_eq!(p.storage[b], Some(Storage::View { of: a, byte_offset: 0 }));
    assert_eq!(p.in_place[1], Some(0));
    assert!(p.in_place[3].is_some());
    assert!(matches!(p.storage[d], Some(Storage::View { .. })));
    // Two activations of 512 bytes are live at once at most: that is the whole arena.
    assert_eq!((p.arena_bytes, p.lower_bound_bytes), (1024, 1024));
    assert_ne!(arena(&p, a), arena(&p, c));
}

#[test]
fn a_conv_with_a_leading_add_post_op_writes_over_its_residual() {
    // x -> Exp -> s -> Conv -> a -> Relu -> b -> Conv(b) + s [post-op Add] -> d -> Conv -> y:
    // s dies at the fused conv, which writes d over it; with "Relu,Add" the sum comes last
    // and s must stay intact until then, so d gets its own bytes.
    for (post_ops, over_residual) in [("Add", true), ("Add,Relu", true), ("Relu,Add", false)] {
        let mut g = Graph { opset: 17, ..Default::default() };
        let t = |g: &mut Graph, name: &str| g.add_value(name, f32s(&[1, 8, 4, 4]));
        let (x, s, a, b, d, y) = (
            t(&mut g, "x"),
            t(&mut g, "s"),
            t(&mut g, "a"),
            t(&mut g, "b"),
            t(&mut g, "d"),
            t(&mut g, "y"),
        );
        let zeros =
            |shape: &[usize]| Const::owned(Tensor::zeros(TensorDesc::new(DType::F32, shape)));
        let w = g.add_constant("w", zeros(&[8, 8, 1, 1]));
        let bias = g.add_constant("bias", zeros(&[8]));
        let post = |ops: &str| {
            ingot_schema::Attrs::new()
                .with("post_ops", ingot_schema::AttrValue::Text(ops.into()))
                .with("post_params", ingot_schema::AttrValue::Floats(vec![]))
        };
        node(&mut g, "Exp", &[x], &[s]);
        node_with(&mut g, "Conv", &[s, w], &[a], post(""));
        node(&mut g, "Relu", &[a], &[b]);
        node_with(&mut g, "Conv", &[b, w, bias, s], &[d], post(post_ops));
        node_with(&mut g, "Conv", &[d, w], &[y], post(""));
        g.inputs = vec![x];
        g.outputs = vec![y];
        let p = plan(&g, Target::cpu());
        verify(&g, &p).unwrap();
        assert_eq!(p.in_place[1], None, "a conv without a sum never runs in place");
        if over_residual {
            assert_eq!(p.in_place[3], Some(3), "{post_ops}");
            assert_eq!(p.storage[d], Some(Storage::View { of: s, byte_offset: 0 }));
        } else {
            assert_eq!(p.in_place[3], None, "{post_ops}");
            assert!(matches!(p.storage[d], Some(Storage::Arena { .. })));
        }
    }
}

#[test]
fn without_in_place_every_activation_is_a_root() {
    let (g, [_, a, b, c, d, _]) = residual();
    let p = plan(&g, no_in_place());
    verify(&g, &p).unwrap();
    for v in [a, b, c, d] {
        arena(&p, v);
    }
    // b and c and the Add output are live together at the Add.
    assert_eq!(p.lower_bound_bytes, 3 * 512);
}

#[test]
fn view_chains_resolve_to_one_root_that_lives_to_the_last_reader() {
    // x -> Relu -> a -> Reshape -> r -> Flatten -> f -> Conv -> y ; a is also read by nobody else.
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[2, 8]));
    let a = g.add_value("a", f32s(&[2, 8]));
    let r = g.add_value("r", f32s(&[4, 4]));
    let f = g.add_value("f", f32s(&[16]));
    let s = g.add_value("s", f32s(&[16]));
    let y = g.add_value("y", f32s(&[16]));
    node(&mut g, "Exp", &[x], &[a]);
    node(&mut g, "Reshape", &[a], &[r]);
    node(&mut g, "Flatten", &[r], &[f]);
    node(&mut g, "Exp", &[x], &[s]); // unrelated step between the views and the reader
    node(&mut g, "Add", &[f, s], &[y]);
    g.inputs = vec![x];
    g.outputs = vec![y];
    let p = plan_order(&g, schedule::model_order(&g), "model-order", no_in_place());
    verify(&g, &p).unwrap();
    assert_eq!(p.storage[r], Some(Storage::View { of: a, byte_offset: 0 }));
    assert_eq!(p.storage[f], Some(Storage::View { of: a, byte_offset: 0 }));
    assert!(p.elided[1] && p.elided[2]);
    assert_eq!(p.steps().collect::<Vec<_>>(), vec![0, 3, 4]);
    let la = p.lifetimes.iter().find(|l| l.value == a).unwrap();
    assert_eq!((la.first, la.last), (0, 4), "a lives until f is read");
    assert_ne!(arena(&p, a), arena(&p, s), "a and s are live together");
}

#[test]
fn a_graph_output_is_never_a_view() {
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[2, 8]));
    let a = g.add_value("a", f32s(&[2, 8]));
    let y = g.add_value("y", f32s(&[16]));
    node(&mut g, "Exp", &[x], &[a]);
    node(&mut g, "Reshape", &[a], &[y]);
    g.inputs = vec![x];
    g.outputs = vec![y];
    let p = plan(&g, target());
    verify(&g, &p).unwrap();
    assert_eq!(p.storage[y], Some(Storage::Output(0)));
    assert!(!p.elided[1], "the reshape copies into the caller's buffer");
}

#[test]
fn memory_aware_order_lowers_the_bound_of_a_branchy_graph() {
    // Two branches from x: a big one (x -> A1 (4 KiB) -> A2 (16 B)) and a long thin one
    // (x -> B1 -> B2 -> B3, 16 B each); the model lists A1 first, so A1 stays alive while the
    // B chain runs unless the order runs A2 right after A1.
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[4]));
    let a1 = g.add_value("a1", f32s(&[1024]));
    let b1 = g.add_value("b1", f32s(&[4]));
    let b2 = g.add_value("b2", f32s(&[4]));
    let b3 = g.add_value("b3", f32s(&[4]));
    let a2 = g.add_value("a2", f32s(&[4]));
    let y = g.add_value("y", f32s(&[4]));
    node(&mut g, "Tile", &[x], &[a1]);
    node(&mut g, "Exp", &[x], &[b1]);
    node(&mut g, "Exp", &[b1], &[b2]);
    node(&mut g, "Exp", &[b2], &[b3]);
    node(&mut g, "ReduceSum", &[a1], &[a2]);
    node(&mut g, "Add", &[a2, b3], &[y]);
    g.inputs = vec![x];
    g.outputs = vec![y];
    let no_in_place = no_in_place();
    let model = plan_order(&g, schedule::model_order(&g), "model-order", no_in_place);
    let best = plan(&g, no_in_place);
    verify(&g, &best).unwrap();
    // In model order a1 is live with two B values at once; finishing the A branch first
    // holds a1 with at most one small value.
    assert_eq!(model.lower_bound_bytes, 4096 + 16 + 16);
    assert_eq!(best.schedule, "depth-first");
    assert_eq!(best.lower_bound_bytes, 4096 + 16);
    assert!(best.arena_bytes < model.arena_bytes);
}

#[test]
fn verifier_rejects_overlap_misalignment_and_clobbering() {
    let (g, [_, a, b, c, _, _]) = residual();
    let good = plan(&g, no_in_place());
    verify(&g, &good).unwrap();

    let mut overlap = good.clone();
    overlap.storage[c] = overlap.storage[b].clone(); // b and c are live together at the Add
    assert!(verify(&g, &overlap).unwrap_err().contains("overlap"));

    let mut misaligned = good.clone();
    misaligned.storage[a] = Some(Storage::Arena { offset: 4 });
    assert!(verify(&g, &misaligned).unwrap_err().contains("aligned"));

    let mut outside = good.clone();
    outside.submodels[0].arena_bytes = 16;
    assert!(verify(&g, &outside).unwrap_err().contains("overruns"));

    // c written over b while b is still to be read by the Add: the verifier sees b clobbered.
    let mut clobber = good.clone();
    clobber.storage[c] = Some(Storage::View { of: b, byte_offset: 0 });
    assert!(verify(&g, &clobber).unwrap_err().contains("do not hold"));

    let mut view_out_of_bounds = good.clone();
    view_out_of_bounds.storage[c] = Some(Storage::View { of: b, byte_offset: 16 });
    assert!(verify(&g, &view_out_of_bounds).unwrap_err().contains("exceeds"));
}

fn node_with(
    g: &mut Graph,
    op: &str,
    inputs: &[usize],
    outputs: &[usize],
    attrs: ingot_schema::Attrs,
) {
    node(g, op, inputs, outputs);
    if let Some(n) = g.nodes.last_mut() {
        n.attrs = attrs;
    }
}

fn ints(v: &[i64]) -> ingot_schema::AttrValue {
    ingot_schema::AttrValue::Ints(v.to_vec())
}

#[test]
fn outer_axis_slice_is_a_view_with_an_offset_and_inner_slices_are_not() {
    // x [4, 8] -> Exp -> a -> Slice rows 1..3 -> s (view of a at 1 row = 32 bytes)
    //                      -> Slice cols 0..4 -> t (a copy: rows are not contiguous)
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[4, 8]));
    let a = g.add_value("a", f32s(&[4, 8]));
    let s = g.add_value("s", f32s(&[2, 8]));
    let t = g.add_value("t", f32s(&[4, 4]));
    let y = g.add_value("y", f32s(&[2, 8]));
    let z = g.add_value("z", f32s(&[4, 4]));
    let slice = |starts: &[i64], ends: &[i64]| {
        ingot_schema::Attrs::new()
            .with("starts", ints(starts))
            .with("ends", ints(ends))
            .with("steps", ints(&[1, 1]))
    };
    node(&mut g, "Exp", &[x], &[a]);
    node_with(&mut g, "Slice", &[a], &[s], slice(&[1, 0], &[3, 8]));
    node_with(&mut g, "Slice", &[a], &[t], slice(&[0, 0], &[4, 4]));
    node(&mut g, "Exp", &[s], &[y]);
    node(&mut g, "Exp", &[t], &[z]);
    g.inputs = vec![x];
    g.outputs = vec![y, z];
    let p = plan(&g, no_in_place());
    verify(&g, &p).unwrap();
    assert_eq!(p.storage[s], Some(Storage::View { of: a, byte_offset: 32 }));
    assert!(matches!(p.storage[t], Some(Storage::Arena { .. })));
    assert_eq!(p.steps().count(), 4);
}

#[test]
fn split_on_the_outer_axis_is_views_and_concat_is_written_in_place() {
    // x [4, 2] -> Split(axis 0, 1/1/2) -> p q r; each -> Exp -> Concat(axis 0) four ways
    // with a fourth Exp of x: the Exps write straight into the concat's output.
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[4, 2]));
    let a = g.add_value("a", f32s(&[4, 2]));
    let pieces: Vec<usize> = [1, 1, 2]
        .iter()
        .enumerate()
        .map(|(i, &r)| g.add_value(format!("p{i}"), f32s(&[r, 2])))
        .collect();
    let exps: Vec<usize> = [1, 1, 2, 4]
        .iter()
        .enumerate()
        .map(|(i, &r)| g.add_value(format!("e{i}"), f32s(&[r, 2])))
        .collect();
    let c = g.add_value("c", f32s(&[8, 2]));
    let y = g.add_value("y", f32s(&[8, 2]));
    node(&mut g, "Exp", &[x], &[a]);
    node_with(
        &mut g,
        "Split",
        &[a],
        &pieces,
        ingot_schema::Attrs::new()
            .with("axis", ingot_schema::AttrValue::Int(0))
            .with("split", ints(&[1, 1, 2])),
    );
    for (k, &p) in pieces.iter().enumerate() {
        node(&mut g, "Exp", &[p], &[exps[k]]);
    }
    node(&mut g, "Exp", &[x], &[exps[3]]);
    node_with(
        &mut g,
        "Concat",
        &exps,
        &[c],
        ingot_schema::Attrs::new().with("axis", ingot_schema::AttrValue::Int(0)),
    );
    node(&mut g, "Exp", &[c], &[y]);
    g.inputs = vec![x];
    g.outputs = vec![y];
    let p = plan(&g, no_in_place());
    verify(&g, &p).unwrap();
    assert_eq!(p.storage[pieces[0]], Some(Storage::View { of: a, byte_offset: 0 }));
    assert_eq!(p.storage[pieces[1]], Some(Storage::View { of: a, byte_offset: 8 }));
    assert_eq!(p.storage[pieces[2]], Some(Storage::View { of: a, byte_offset: 16 }));
    for (k, off) in [0u64, 8, 16, 32].into_iter().enumerate() {
        assert_eq!(p.storage[exps[k]], Some(Storage::View { of: c, byte_offset: off }));
    }
    let ops: Vec<&str> = p.steps().map(|n| g.nodes[n].op.as_str()).collect();
    assert_eq!(ops, ["Exp"; 6], "no Split or Concat step runs");
}

#[test]
fn a_concat_piece_that_is_a_graph_output_keeps_the_concat_a_step() {
    // x -> Exp -> a, x -> Neg -> b (also a graph output), Concat(a, b) -> c -> Exp -> y: b
    // is written to the caller's buffer, so it cannot be a piece of c.
    let mut g = Graph { opset: 17, ..Default::default() };
    let x = g.add_value("x", f32s(&[2, 4]));
    let a = g.add_value("a", f32s(&[2, 4]));
    let b = g.add_value("b", f32s(&[2, 4]));
    let c = g.add_value("c", f32s(&[4, 4]));
    let y = g.add_value("y", f32s(&[4, 4]));
    node(&mut g, "Exp", &[x], &[a]);
    node(&mut g, "Neg", &[x], &[b]);
    let axis0 = ingot_schema::Attrs::new().with("axis", ingot_schema::AttrValue::Int(0));
    node_with(&mut g, "Concat", &[a, b], &[c], axis0);
    node(&mut g, "Exp", &[c], &[y]);
    g.inputs = vec![x];
    g.outputs = vec![y, b];
    let p = plan(&g, target());
    verify(&g, &p).unwrap();
    assert!(!p.elided[2], "the concat copies");
    assert_eq!(p.storage[b], Some(Storage::Output(1)));
}

#[test]
fn random_dags_plan_and_verify() {
    // Random graphs of views, slices, concats and elementwise ops with fan-in and fan-out;
    // every plan, under every target, must pass the verifier.
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut next = |m: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    };
    for case in 0..300 {
        let mut g = Graph { opset: 17, ..Default::default() };
        let x = g.add_value("x", f32s(&[4, 4]));
        g.inputs = vec![x];
        let mut pool = vec![x];
        for i in 0..(5 + next(25)) {
            let a = pool[next(pool.len())];
            let b = pool[next(pool.len())];
            let v = g.add_value(format!("v{i}"), f32s(&[4, 4]));
            match next(6) {
                0 => node(&mut g, "Reshape", &[a], &[v]),
                1 => node(&mut g, "Add", &[a, b], &[v]),
                2 => {
                    // Bottom half of a, and Exp of the top half of b, concatenated.
                    let rows = |from: i64, to: i64| {
                        ingot_schema::Attrs::new()
                            .with("starts", ints(&[from, 0]))
                            .with("ends", ints(&[to, 4]))
                            .with("steps", ints(&[1, 1]))
                    };
                    let h = g.add_value(format!("h{i}"), f32s(&[2, 4]));
                    let k0 = g.add_value(format!("k{i}"), f32s(&[2, 4]));
                    let k = g.add_value(format!("e{i}"), f32s(&[2, 4]));
                    node_with(&mut g, "Slice", &[a], &[h], rows(2, 4));
                    node_with(&mut g, "Slice", &[b], &[k0], rows(0, 2));
                    node(&mut g, "Exp", &[k0], &[k]);
                    let axis0 =
                        ingot_schema::Attrs::new().with("axis", ingot_schema::AttrValue::Int(0));
                    node_with(&mut g, "Concat", &[h, k], &[v], axis0);
                }
                3 => node(&mut g, "Relu", &[a], &[v]),
                _ => node(&mut g, "Exp", &[a], &[v]),
            }
            pool.push(v);
        }
        // A couple of outputs, possibly also read inside the graph.
        g.outputs = vec![pool[pool.len() - 1], pool[1 + next(pool.len() - 1)]];
        g.outputs.dedup();
        crate::ir::check(&g).unwrap_or_else(|e| panic!("case {case}: bad fixture: {e}"));
        for t in [target(), no_in_place()] {
            let p = plan(&g, t);
            verify(&g, &p).unwrap_or_else(|e| panic!("case {case}: {e}"));
            assert!(p.arena_bytes >= p.lower_bound_bytes);
        }
    }
}

/// The residual graph with its Relu and Add needing the CPU: Conv | Relu | Conv | Add | Conv.
fn split_residual() -> (Graph, [usize; 6], Partition) {
    let (g, values) = residual();
    let mut no_vulkan = vec![None; g.nodes.len()];
    no_vulkan[1] = Some("a test says so".to_string());
    no_vulkan[3] = Some("a test says so".to_string());
    let parts = Partition::new(&g, &no_vulkan);
    (g, values, parts)
}

#[test]
fn tensors_crossing_submodels_live_in_the_boundary_buffer() {
    let (g, [x, a, b, c, d, y], parts) = split_residual();
    assert_eq!(parts.part, [0, 1, 2, 3, 4]);
    let p = plan_parts(&g, &parts, target());
    verify(&g, &p).unwrap();
    assert_eq!(p.submodels.len(), 5);
    // Every activation crosses a submodel edge; b is read by two later submodels.
    for v in [a, b, c, d] {
        assert!(matches!(p.storage[v], Some(Storage::Boundary { .. })), "{v}: {:?}", p.storage[v]);
    }
    // The Relu cannot write over a (made by another submodel), nor the Add over c.
    assert_eq!(p.in_place, vec![None; 5]);
    assert_eq!(p.submodels[0].inputs, [x]);
    assert_eq!(p.submodels[0].outputs, [a]);
    assert_eq!(p.submodels[3].inputs, [b, c]);
    assert_eq!(p.submodels[4].outputs, [y]);
    assert_eq!(p.submodels[2].weights, [0]);
    // b lives from submodel 1 to 3, so c (2 to 3) and d (3 to 4) cannot share its bytes;
    // a (0 to 1) and c can.
    let at = |v| match p.storage[v] {
        Some(Storage::Boundary { offset }) => offset,
        _ => unreachable!(),
    };
    assert_ne!(at(b), at(c));
    assert_ne!(at(b), at(d));
    assert_eq!(p.boundary_bytes, 3 * 512);
    assert_eq!(p.arena_bytes, 0);
}

#[test]
fn the_verifier_checks_submodel_storage() {
    let (g, [_, a, b, _, _, _], parts) = split_residual();
    let good = plan_parts(&g, &parts, target());
    verify(&g, &good).unwrap();

    let mut shared = good.clone();
    shared.storage[b] = shared.storage[a].clone(); // a (0..1) and b (1..3) meet at submodel 1
    assert!(verify(&g, &shared).unwrap_err().contains("overlap"));

    let mut arena = good.clone();
    arena.storage[b] = Some(Storage::Arena { offset: 0 });
    arena.submodels[1].arena_bytes = 512;
    assert!(verify(&g, &arena).unwrap_err().contains("used by submodels 1 and 3"));

    let mut small = good.clone();
    small.boundary_bytes = 512;
    assert!(verify(&g, &small).unwrap_err().contains("boundary buffer"));
}

#[test]
fn one_submodel_plans_as_before() {
    let (g, _) = residual();
    let single = plan(&g, target());
    let parted = plan_parts(&g, &Partition::new(&g, &[None, None, None, None, None]), target());
    assert_eq!(single.storage, parted.storage);
    assert_eq!(single.arena_bytes, parted.arena_bytes);
    assert_eq!(parted.boundary_bytes, 0);
    assert_eq!(parted.submodels.len(), 1);
}

#[test]
fn what_a_loop_reads_from_before_it_lives_until_its_last_submodel() {
    // x -> Relu -> a (before the loop); the body: Relu(a) -> b, Cast(b) -> c (CPU-only),
    // Relu(c) -> d, Identity(d) -> next, which the runtime holds. a is read in the loop's
    // first submodel only, but every iteration reads it again: it must outlive c, which the
    // loop's second submodel writes and its third reads.
    let mut g = Graph::default();
    let [x, a, b, c, d, next, iteration] =
        ["x", "a", "b", "c", "d", "next", "i"].map(|n| g.add_value(n, f32s(&[128])));
    g.inputs = vec![x];
    node(&mut g, "Relu", &[x], &[a]);
    node(&mut g, "Relu", &[a], &[b]);
    node(&mut g, "Cast", &[b], &[c]);
    node(&mut g, "Relu", &[c], &[d]);
    node(&mut g, "Identity", &[d], &[next]);
    g.repeats = vec![crate::ir::Repeat::bare(iteration)];
    g.in_repeat = [(b, 0), (c, 0), (d, 0), (next, 0)].into();
    g.outputs = vec![next];
    let mut no_vulkan = vec![None; g.nodes.len()];
    no_vulkan[2] = Some("a test says so".to_string());
    let parts = Partition::new(&g, &no_vulkan);
    assert_eq!(parts.repeats, [None, Some(0), Some(0), Some(0)]);
    let p = plan_parts(&g, &parts, target());
    verify(&g, &p).unwrap();
    let at = |v| match p.storage[v] {
        Some(Storage::Boundary { offset }) => offset,
        ref s => panic!("{v}: {s:?}"),
    };
    assert_ne!(at(a), at(c));
    assert_eq!(p.submodels.iter().map(|s| s.repeat).collect::<Vec<_>>(), parts.repeats);
}
