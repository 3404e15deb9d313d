//! Normalization chains on small graphs built as exporters write them: each test checks the
//! nodes left and that the rewritten graph computes what the chain does (CPU kernels).

use super::*;
use crate::passes::testing::{Builder, assert_agrees};

fn reduce_mean(b: &mut Builder, x: ValueId, axes: &[i64], keepdims: i64) -> ValueId {
    let attrs = Attrs::new()
        .with("axes", AttrValue::Ints(axes.to_vec()))
        .with("keepdims", AttrValue::Int(keepdims));
    b.node("ReduceMean", &[x], attrs)
}

/// How a chain spells its pieces.
#[derive(Clone, Copy)]
struct Form {
    centred: bool,
    /// d² as `d * d` rather than `Pow(d, 2)`.
    mul_square: bool,
    /// `d * Reciprocal(s)` (1), `d * (1 / s)` (2) rather than `d / s` (0).
    reciprocal: u8,
    /// γ's shape, if any, and whether β follows.
    scale: Option<&'static [usize]>,
    bias: bool,
    /// The means' `keepdims`.
    keepdims: i64,
}

const TORCH: Form = Form {
    centred: true,
    mul_square: false,
    reciprocal: 0,
    scale: Some(&[8]),
    bias: true,
    keepdims: 1,
};

/// The chain of `form` over `axes` of an input of `shape`, then a Relu reading its output.
fn chain(shape: &[usize], axes: &[i64], form: Form) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", shape);
    let d = if form.centred {
        let m = reduce_mean(&mut b, x, axes, form.keepdims);
        b.op("Sub", &[x, m])
    } else {
        x
    };
    let square = if form.mul_square {
        b.op("Mul", &[d, d])
    } else {
        let two = b.constant("two", &[], &[2.0], 0);
        b.op("Pow", &[d, two])
    };
    let var = reduce_mean(&mut b, square, axes, form.keepdims);
    let eps = b.constant("eps", &[], &[1e-5], 0);
    let v = b.op("Add", &[var, eps]);
    let s = b.op("Sqrt", &[v]);
    let mut y = match form.reciprocal {
        0 => b.op("Div", &[d, s]),
        1 => {
            let r = b.op("Reciprocal", &[s]);
            b.op("Mul", &[r, d])
        }
        _ => {
            let one = b.constant("one", &[1], &[1.0], 0);
            let r = b.op("Div", &[one, s]);
            b.op("Mul", &[d, r])
        }
    };
    if let Some(shape) = form.scale {
        let gamma = b.constant("gamma", shape, &[], 1);
        y = b.op("Mul", &[gamma, y]);
    }
    if form.bias {
        let beta = b.constant("beta", &[8], &[], 2);
        y = b.op("Add", &[y, beta]);
    }
    let out = b.op("Relu", &[y]);
    b.finish(&[out])
}

/// Rewrites `g`, checks the ops left and that the outputs agree. Returns the new graph.
fn rewritten(g: &Graph, ops: &[&str]) -> Graph {
    let mut r = g.clone();
    run(&mut r).unwrap();
    crate::ir::check(&r).unwrap();
    let left: Vec<&str> = r.nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(left, ops);
    assert_agrees(&r, g);
    r
}

fn the_norm(g: &Graph) -> &Node {
    g.nodes.iter().find(|n| n.op.ends_with("Normalization")).unwrap()
}

#[test]
fn torch_and_tf_layer_norms_become_one_node() {
    let tf = Form { mul_square: true, reciprocal: 1, ..TORCH };
    let one_over = Form { reciprocal: 2, ..TORCH };
    for form in [TORCH, tf, one_over] {
        let g = rewritten(&chain(&[2, 3, 8], &[-1], form), &["LayerNormalization", "Relu"]);
        let n = the_norm(&g);
        assert_eq!((n.attrs.int("axis").unwrap(), n.inputs.len()), (2, 3));
        assert_eq!(n.attrs.float("epsilon").unwrap(), 1e-5);
    }
}

#[test]
fn several_trailing_axes_and_missing_affine_parts() {
    // Over the last two axes; γ of [1, 1, 8] (its leading ones dropped), no β.
    let form = Form { scale: Some(&[1, 1, 8]), bias: false, ..TORCH };
    let g = rewritten(&chain(&[2, 3, 8], &[1, 2], form), &["LayerNormalization", "Relu"]);
    let n = the_norm(&g);
    assert_eq!((n.attrs.int("axis").unwrap(), n.inputs.len()), (1, 2));
    assert_eq!(g.ty(n.inputs[1].unwrap()).unwrap().shape, [8]);
    // Neither γ nor β: a γ of ones.
    let bare = Form { scale: None, bias: false, ..TORCH };
    let g = rewritten(&chain(&[4, 8], &[1], bare), &["LayerNormalization", "Relu"]);
    let scale = g.constant(the_norm(&g).inputs[1].unwrap()).unwrap();
    assert_eq!(scale.tensor().to_vec::<f32>().unwrap(), [1.0; 8]);
}

#[test]
fn rms_norms_become_one_node() {
    let llama = Form { centred: false, reciprocal: 1, bias: false, ..TORCH };
    let g = rewritten(&chain(&[2, 3, 8], &[2], llama), &["RMSNormalization", "Relu"]);
    assert_eq!(the_norm(&g).inputs.len(), 2);
    // A β after an RMS norm stays an Add.
    let with_bias = Form { centred: false, ..TORCH };
    rewritten(&chain(&[3, 8], &[1], with_bias), &["RMSNormalization", "Add", "Relu"]);
}

#[test]
fn chains_that_are_not_normalizations_stay() {
    let all = |g: &Graph| g.nodes.iter().map(|n| n.op.clone()).collect::<Vec<_>>();
    let unchanged = |g: Graph| {
        let ops = all(&g);
        let refs: Vec<&str> = ops.iter().map(String::as_str).collect();
        rewritten(&g, &refs);
    };
    // Axes that are not the trailing ones.
    unchanged(chain(&[2, 3, 8], &[1], TORCH));
    unchanged(chain(&[2, 3, 8], &[0, 1], Form { scale: None, bias: false, ..TORCH }));
    // Means without kept dims (over [8, 8]'s last axis, broadcast along it).
    unchanged(chain(&[8, 8], &[1], Form { keepdims: 0, ..TORCH }));
}

#[test]
fn an_inner_value_read_elsewhere_keeps_its_nodes() {
    // d read by a second consumer: the mean stays, and what follows is an RMS norm of d.
    let mut g = chain(&[3, 8], &[1], TORCH);
    let sub = g.nodes.iter().position(|n| n.op == "Sub").unwrap();
    let d = g.nodes[sub].outputs[0];
    g.outputs.push(d);
    rewritten(&g, &["ReduceMean", "Sub", "RMSNormalization", "Add", "Relu"]);
    // The variance read elsewhere: nothing changes.
    let mut g = chain(&[3, 8], &[1], TORCH);
    let var = g.nodes.iter().filter(|n| n.op == "ReduceMean").nth(1).unwrap().outputs[0];
    g.outputs.push(var);
    let ops: Vec<String> = g.nodes.iter().map(|n| n.op.clone()).collect();
    rewritten(&g, &ops.iter().map(String::as_str).collect::<Vec<_>>());
}
