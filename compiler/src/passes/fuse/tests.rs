//! Fusion on small graphs built by hand and lowered like a model: each test checks which
//! steps remain and that the fused graph computes what the unfused one does, both evaluated
//! node by node with the CPU kernels.

use super::*;
use crate::ir;
use crate::passes::testing::{self, Builder, assert_agrees, data};
use ingot_ops::cpu::post;

fn float(v: f64) -> AttrValue {
    AttrValue::Float(v)
}

/// Fuses `g`, checks the ops left (in order) and that the outputs agree with the unfused
/// graph's on the same inputs. Returns the fused graph.
fn fused(g: &Graph, ops: &[&str]) -> Graph {
    let mut f = g.clone();
    run(&mut f).unwrap();
    ir::check(&f).unwrap();
    let left: Vec<&str> = f.nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(left, ops);
    assert_agrees(&f, g);
    f
}

/// The one node of `g` running `op`.
fn the<'g>(g: &'g Graph, op: &str) -> &'g Node {
    let mut found = g.nodes.iter().filter(|n| n.op == op);
    let n = found.next().unwrap();
    assert!(found.next().is_none());
    n
}

fn post_ops(n: &Node) -> (&str, &[f64]) {
    (n.attrs.text("post_ops").unwrap(), n.attrs.floats("post_params").unwrap())
}

fn conv_attrs(group: i64, pads: i64) -> Attrs {
    Attrs::new().with("group", AttrValue::Int(group)).with("pads", AttrValue::Ints(vec![pads; 4]))
}

/// BatchNormalization's four parameters for `m` channels (variances positive).
fn bn_params(b: &mut Builder, m: usize) -> [ValueId; 4] {
    let var: Vec<f32> = data(m, 4).iter().map(|v| v.abs() + 0.3).collect();
    [
        b.constant("scale", &[m], &[], 1),
        b.constant("shift", &[m], &[], 2),
        b.constant("mean", &[m], &[], 3),
        b.constant("var", &[m], &var, 0),
    ]
}

fn batch_norm(b: &mut Builder, x: ValueId, m: usize) -> ValueId {
    let [s, t, mean, var] = bn_params(b, m);
    let eps = Attrs::new().with("epsilon", float(1e-3));
    b.node("BatchNormalization", &[x, s, t, mean, var], eps)
}

#[test]
fn batch_norm_folds_into_conv_with_and_without_bias() {
    for bias in [false, true] {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 5, 5]);
        let w = b.constant("w", &[6, 2, 3, 3], &[], 5);
        let mut ins = vec![x, w];
        if bias {
            ins.push(b.constant("b", &[6], &[], 6));
        }
        let y = b.node("Conv", &ins, conv_attrs(2, 1));
        let z = batch_norm(&mut b, y, 6);
        let g = b.finish(&[z]);
        let f = fused(&g, &["Conv"]);
        let conv = the(&f, "Conv");
        assert_eq!(conv.outputs, [z], "the conv writes the BN's output");
        assert_eq!(conv.inputs.len(), 3, "the folded conv has a bias");
        assert_eq!(post_ops(conv), ("", &[][..]));
    }
}

#[test]
fn batch_norm_folds_into_grouped_conv_transpose_and_gemm() {
    let mut b = Builder::new();
    let x = b.input("x", &[1, 4, 3, 3]);
    let w = b.constant("w", &[4, 3, 2, 2], &[], 7);
    let attrs =
        Attrs::new().with("group", AttrValue::Int(2)).with("strides", AttrValue::Ints(vec![2, 2]));
    let y = b.node("ConvTranspose", &[x, w], attrs);
    let z = batch_norm(&mut b, y, 6);
    let g = b.finish(&[z]);
    fused(&g, &["ConvTranspose"]);

    // Gemm, B as [K, N] and transposed, C per column and absent, beta not 1.
    for (trans_b, with_c) in [(0, true), (1, true), (1, false)] {
        let mut b = Builder::new();
        let a = b.input("a", &[3, 4]);
        let w_shape = if trans_b == 1 { [5, 4] } else { [4, 5] };
        let w = b.constant("w", &w_shape, &[], 8);
        let mut ins = vec![a, w];
        if with_c {
            ins.push(b.constant("c", &[1, 5], &[], 9));
        }
        let attrs = Attrs::new()
            .with("transB", AttrValue::Int(trans_b))
            .with("alpha", float(0.5))
            .with("beta", float(2.0));
        let y = b.node("Gemm", &ins, attrs);
        let z = batch_norm(&mut b, y, 5);
        let g = b.finish(&[z]);
        let f = fused(&g, &["Gemm"]);
        let gemm = the(&f, "Gemm");
        assert_eq!(gemm.attrs.float("beta"), Ok(1.0));
        assert_eq!(f.ty(gemm.inputs[2].unwrap()).unwrap().shape, [5]);
    }
}

#[test]
fn per_channel_and_scalar_constants_fold_into_the_weights() {
    // Conv, then * [M, 1, 1], + scalar, - [1, M, 1, 1], / scalar: one conv is left.
    let mut b = Builder::new();
    let x = b.input("x", &[1, 3, 4, 4]);
    let w = b.constant("w", &[4, 3, 1, 1], &[], 1);
    let y = b.node("Conv", &[x, w], conv_attrs(1, 0));
    let k = b.constant("k", &[4, 1, 1], &[], 2);
    let y = b.op("Mul", &[k, y]);
    let one = b.constant("one", &[1], &[0.25], 0);
    let y = b.op("Add", &[y, one]);
    let k = b.constant("k2", &[1, 4, 1, 1], &[], 3);
    let y = b.op("Sub", &[y, k]);
    let d = b.constant("d", &[], &[3.0], 0);
    let y = b.op("Div", &[y, d]);
    let g = b.finish(&[y]);
    fused(&g, &["Conv"]);

    // A constant that varies along another axis, or a subtrahend on the left, stays a step.
    let mut b = Builder::new();
    let x = b.input("x", &[1, 3, 4, 4]);
    let w = b.constant("w", &[4, 3, 1, 1], &[], 1);
    let y = b.node("Conv", &[x, w], conv_attrs(1, 0));
    let k = b.constant("k", &[4, 1], &[], 2);
    let y = b.op("Mul", &[y, k]);
    let g = b.finish(&[y]);
    fused(&g, &["Conv", "Mul"]);
    let mut b = Builder::new();
    let x = b.input("x", &[1, 3, 4, 4]);
    let w = b.constant("w", &[4, 3, 1, 1], &[], 1);
    let y = b.node("Conv", &[x, w], conv_attrs(1, 0));
    let k = b.constant("k", &[4, 1, 1], &[], 2);
    let y = b.op("Sub", &[k, y]);
    let g = b.finish(&[y]);
    fused(&g, &["Conv", "Sub"]);
}

/// `x * Clip(x + 3, 0, 6)` through `finish`, with x = Exp(input).
fn hard_swish_graph(form: usize) -> Graph {
    let mut b = Builder::new();
    let i = b.input("i", &[2, 3, 4]);
    let x = b.op("Exp", &[i]);
    let three = b.constant("three", &[], &[3.0], 0);
    let six = b.constant("six", &[1], &[6.0], 0);
    let sixth = b.constant("sixth", &[], &[1.0 / 6.0], 0);
    let zero = b.constant("zero", &[], &[0.0], 0);
    let relu6 = |b: &mut Builder, x| {
        let s = b.op("Add", &[three, x]);
        b.op("Clip", &[s, zero, six])
    };
    let y = match form {
        // (x * relu6(x + 3)) / 6
        0 => {
            let r = relu6(&mut b, x);
            let m = b.op("Mul", &[x, r]);
            b.op("Div", &[m, six])
        }
        // (relu6(x + 3) * x) * (1/6)
        1 => {
            let r = relu6(&mut b, x);
            let m = b.op("Mul", &[r, x]);
            b.op("Mul", &[sixth, m])
        }
        // x * (relu6(x + 3) / 6)
        2 => {
            let r = relu6(&mut b, x);
            let h = b.op("Div", &[r, six]);
            b.op("Mul", &[x, h])
        }
        // HardSigmoid(x) * x
        _ => {
            let attrs = Attrs::new().with("alpha", float(0.1666667)).with("beta", float(0.5));
            let h = b.node("HardSigmoid", &[x], attrs);
            b.op("Mul", &[h, x])
        }
    };
    b.finish(&[y])
}

#[test]
fn decomposed_hard_swish_becomes_one_node() {
    for form in 0..4 {
        let g = hard_swish_graph(form);
        let f = fused(&g, &["Exp", "HardSwish"]);
        assert_eq!(f.outputs, g.outputs, "form {form} keeps its output value");
    }
    // Another alpha is not HardSwish; an inner value read twice keeps the pattern apart.
    let mut b = Builder::new();
    let x = b.input("x", &[4]);
    let attrs = Attrs::new().with("alpha", float(0.2)).with("beta", float(0.5));
    let h = b.node("HardSigmoid", &[x], attrs);
    let y = b.op("Mul", &[x, h]);
    let g = b.finish(&[y, h]);
    fused(&g, &["HardSigmoid", "Mul"]);
    let g = {
        let mut g = hard_swish_graph(0);
        let clip = g.nodes.iter().find(|n| n.op == "Clip").unwrap().outputs[0];
        g.outputs.push(clip);
        g
    };
    fused(&g, &["Exp", "Add", "Clip", "Mul", "Div"]);
}

#[test]
fn silu_becomes_one_swish_and_then_a_post_op() {
    // Conv, then y * Sigmoid(y) in either order: one Conv with a Swish post-op.
    for sigmoid_first in [false, true] {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.constant("w", &[3, 2, 3, 3], &[], 1);
        let y = b.node("Conv", &[x, w], conv_attrs(1, 1));
        let s = b.op("Sigmoid", &[y]);
        let z = if sigmoid_first { b.op("Mul", &[s, y]) } else { b.op("Mul", &[y, s]) };
        let f = fused(&b.finish(&[z]), &["Conv"]);
        assert_eq!(post_ops(the(&f, "Conv")), ("Swish", &[1.0][..]));
    }
    // Without a host it is one Swish node; a sigmoid read twice, or of another value, is not
    // part of one.
    let mut b = Builder::new();
    let x = b.input("x", &[4]);
    let s = b.op("Sigmoid", &[x]);
    let y = b.op("Mul", &[x, s]);
    fused(&b.finish(&[y]), &["Swish"]);
    let mut b = Builder::new();
    let x = b.input("x", &[4]);
    let s = b.op("Sigmoid", &[x]);
    let y = b.op("Mul", &[x, s]);
    fused(&b.finish(&[y, s]), &["Sigmoid", "Mul"]);
    let mut b = Builder::new();
    let (x, other) = (b.input("x", &[4]), b.input("other", &[4]));
    let s = b.op("Sigmoid", &[other]);
    let y = b.op("Mul", &[x, s]);
    fused(&b.finish(&[y]), &["Sigmoid", "Mul"]);
}

/// Exact GELU in pieces, `form` 0: `(x * e) * 0.5` (PyTorch's F.gelu), 1: `(x * 0.5) * e`
/// (Hugging Face's gelu), 2: `x * (0.5 * e)`, with e = `1 + Erf(x / √2)`, or with
/// `x * (1/√2)` inside when `by_reciprocal`. `erf_also_output` makes Erf's output a graph
/// output too.
fn gelu_graph(form: usize, by_reciprocal: bool, erf_also_output: bool) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 8]);
    let half = b.constant("half", &[], &[0.5], 0);
    let one = b.constant("one", &[], &[1.0], 0);
    let scaled = if by_reciprocal {
        let k = b.constant("k", &[], &[std::f32::consts::FRAC_1_SQRT_2], 0);
        b.op("Mul", &[k, x])
    } else {
        let k = b.constant("k", &[], &[std::f32::consts::SQRT_2], 0);
        b.op("Div", &[x, k])
    };
    let erf = b.op("Erf", &[scaled]);
    let e = b.op("Add", &[erf, one]);
    let y = match form {
        0 => {
            let p = b.op("Mul", &[x, e]);
            b.op("Mul", &[p, half])
        }
        1 => {
            let h = b.op("Mul", &[half, x]);
            b.op("Mul", &[h, e])
        }
        _ => {
            let h = b.op("Mul", &[half, e]);
            b.op("Mul", &[x, h])
        }
    };
    let outputs = if erf_also_output { vec![y, erf] } else { vec![y] };
    b.finish(&outputs)
}

/// GELU's tanh approximation in pieces, as Hugging Face's `gelu_new` writes it:
/// `0.5 * x * (1 + Tanh(√(2/π) * (x + 0.044715 * x³)))`, the cube `Pow(x, 3)` or, with
/// `cube_by_mul`, `x * (x * x)`.
fn gelu_tanh_graph(cube_by_mul: bool) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 8]);
    let cube = if cube_by_mul {
        let square = b.op("Mul", &[x, x]);
        b.op("Mul", &[x, square])
    } else {
        let three = b.constant("three", &[], &[3.0], 0);
        b.op("Pow", &[x, three])
    };
    let k = b.constant("k", &[], &[0.044715], 0);
    let m = b.op("Mul", &[k, cube]);
    let u = b.op("Add", &[x, m]);
    let c = b.constant("c", &[], &[(2.0 / std::f32::consts::PI).sqrt()], 0);
    let t = b.op("Mul", &[c, u]);
    let tanh = b.op("Tanh", &[t]);
    let one = b.constant("one", &[], &[1.0], 0);
    let e = b.op("Add", &[one, tanh]);
    let half = b.constant("half", &[], &[0.5], 0);
    let h = b.op("Mul", &[half, x]);
    let y = b.op("Mul", &[h, e]);
    b.finish(&[y])
}

#[test]
fn decomposed_gelu_becomes_one_node() {
    for cube_by_mul in [false, true] {
        let f = fused(&gelu_tanh_graph(cube_by_mul), &["Gelu"]);
        assert_eq!(the(&f, "Gelu").attrs.text("approximate").unwrap(), "tanh");
    }
    for form in 0..3 {
        for by_reciprocal in [false, true] {
            let g = gelu_graph(form, by_reciprocal, false);
            let f = fused(&g, &["Gelu"]);
            assert_eq!(f.outputs, g.outputs, "form {form} keeps its output value");
            assert_eq!(the(&f, "Gelu").attrs.text("approximate").unwrap(), "none");
        }
    }
    // An inner value read elsewhere keeps the pattern apart.
    fused(&gelu_graph(0, false, true), &["Div", "Erf", "Add", "Mul", "Mul"]);
}

#[test]
fn a_biased_product_and_its_gelu_become_one_matmul() {
    for (form, param) in [("none", 0.0), ("tanh", 1.0)] {
        for bias_shape in [&[5][..], &[1, 1, 5]] {
            let mut b = Builder::new();
            let x = b.input("x", &[2, 3, 4]);
            let w = b.constant("w", &[4, 5], &[], 1);
            let bias = b.constant("bias", bias_shape, &[], 2);
            let y = b.op("MatMul", &[x, w]);
            let z = b.op("Add", &[bias, y]);
            let gelu = Attrs::new().with("approximate", AttrValue::Text(form.into()));
            let out = b.node("Gelu", &[z], gelu);
            let f = fused(&b.finish(&[out]), &["MatMul"]);
            assert_eq!(post_ops(the(&f, "MatMul")), ("Add,Gelu", &[param][..]));
        }
    }
    // An operand along the rows is no bias, and a Conv takes none along its last dim.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4]);
    let w = b.constant("w", &[4, 5], &[], 1);
    let rows = b.constant("rows", &[3, 1], &[], 2);
    let y = b.op("MatMul", &[x, w]);
    let z = b.op("Add", &[y, rows]);
    fused(&b.finish(&[z]), &["MatMul", "Add"]);
}

#[test]
fn attention_scores_their_scale_and_mask_become_one_matmul() {
    // softmax(q kᵀ / √d + mask) as BERT-style encoders export it, the mask [S, S] or
    // [1, 1, S, S] against scores [1, H, S, S].
    for mask_shape in [&[3, 3][..], &[1, 1, 3, 3]] {
        let mut b = Builder::new();
        let q = b.input("q", &[1, 2, 3, 4]);
        let kt = b.input("kt", &[1, 2, 4, 3]);
        let root_d = b.constant("root_d", &[], &[2.0], 0);
        let mask = b.constant("mask", mask_shape, &[], 3);
        let scores = b.op("MatMul", &[q, kt]);
        let scaled = b.op("Div", &[scores, root_d]);
        let masked = b.op("Add", &[scaled, mask]);
        let out = b.node("Softmax", &[masked], Attrs::new().with("axis", AttrValue::Int(-1)));
        let f = fused(&b.finish(&[out]), &["MatMul", "Softmax"]);
        let matmul = the(&f, "MatMul");
        assert_eq!(post_ops(matmul).0, "Mul,Add");
        let reciprocal = f.constant(matmul.inputs[2].unwrap()).unwrap();
        assert_eq!(reciprocal.tensor().to_vec::<f32>().unwrap(), [0.5]);
    }
    // A mask over the leading dims, a divisor that is no constant or is zero: not fused.
    let mut b = Builder::new();
    let q = b.input("q", &[2, 3, 4]);
    let kt = b.input("kt", &[2, 4, 3]);
    let d = b.input("d", &[1]);
    let zero = b.constant("zero", &[], &[0.0], 0);
    let lead = b.constant("lead", &[2, 1, 1], &[], 3);
    let scores = b.op("MatMul", &[q, kt]);
    let by_input = b.op("Div", &[scores, d]);
    let other = b.op("MatMul", &[q, kt]);
    let by_zero = b.op("Div", &[other, zero]);
    let masked = b.op("Add", &[by_zero, lead]);
    fused(&b.finish(&[by_input, masked]), &["MatMul", "Div", "MatMul", "Div", "Add"]);
}

#[test]
fn activations_become_post_ops_with_their_parameters() {
    let cases: [(&str, Attrs, &[f64]); 8] = [
        ("Relu", Attrs::new(), &[]),
        ("LeakyRelu", Attrs::new().with("alpha", float(0.25)), &[0.25]),
        ("Sigmoid", Attrs::new(), &[]),
        (
            "HardSigmoid",
            Attrs::new().with("alpha", float(0.25)).with("beta", float(0.375)),
            &[0.25, 0.375],
        ),
        ("HardSwish", Attrs::new(), &[]),
        ("Tanh", Attrs::new(), &[]),
        ("Swish", Attrs::new().with("alpha", float(0.75)), &[0.75]),
        ("Clip", Attrs::new(), &[-0.5, 0.75]),
    ];
    for (op, attrs, params) in cases {
        for host in ["Conv", "MatMul", "Gemm"] {
            let mut b = Builder::new();
            let y = match host {
                "Conv" => {
                    let x = b.input("x", &[1, 2, 4, 4]);
                    let w = b.constant("w", &[3, 2, 3, 3], &[], 1);
                    b.node("Conv", &[x, w], conv_attrs(1, 1))
                }
                _ => {
                    let x = b.input("x", &[3, 4]);
                    let w = b.constant("w", &[4, 5], &[], 1);
                    b.op(host, &[x, w])
                }
            };
            let z = if op == "Clip" {
                let lo = b.constant("lo", &[], &[-0.5], 0);
                let hi = b.constant("hi", &[], &[0.75], 0);
                b.op("Clip", &[y, lo, hi])
            } else {
                b.node(op, &[y], attrs.clone())
            };
            let g = b.finish(&[z]);
            let f = fused(&g, &[host]);
            assert_eq!(post_ops(the(&f, host)), (op, params), "{host} + {op}");
        }
    }
}

#[test]
fn sums_differences_and_products_with_a_residual_become_post_ops() {
    // r = Exp(x); y = Conv(x); then r + y, y - r, r - y, y * r, each followed by Relu.
    for (op, swap, name) in
        [("Add", true, "Add"), ("Sub", false, "Sub"), ("Sub", true, "RSub"), ("Mul", false, "Mul")]
    {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 3, 4, 4]);
        let r = b.op("Exp", &[x]);
        let w = b.constant("w", &[3, 3, 3, 3], &[], 1);
        let y = b.node("Conv", &[x, w], conv_attrs(1, 1));
        let s = b.op(op, &if swap { [r, y] } else { [y, r] });
        let z = b.op("Relu", &[s]);
        let g = b.finish(&[z]);
        let f = fused(&g, &["Exp", "Conv"]);
        let conv = the(&f, "Conv");
        assert_eq!(post_ops(conv), (format!("{name},Relu").as_str(), &[][..]));
        let bias = conv.inputs[2].unwrap();
        assert_eq!(f.ty(bias).unwrap().shape, [3], "a zero bias comes before R");
        assert_eq!(conv.inputs[3], Some(r));
        let reads_r = ingot_ops::can_run_in_place("Conv", &conv.attrs, 3);
        assert_eq!(reads_r, name == "Add", "only a leading sum may run over R");
    }
}

#[test]
fn post_op_chains_take_scalar_constants() {
    // The PP-OCR block: Conv, * s + t (folded), HardSwish, * s2 + t2 (post-ops), as the
    // exporter writes it.
    let mut b = Builder::new();
    let x = b.input("x", &[1, 3, 4, 4]);
    let w = b.constant("w", &[4, 3, 1, 1], &[], 1);
    let bias = b.constant("b", &[4], &[], 2);
    let y = b.node("Conv", &[x, w, bias], conv_attrs(1, 0));
    let (s, t) = (b.constant("s", &[1], &[1.5], 0), b.constant("t", &[1], &[0.5], 0));
    let y = b.op("Mul", &[s, y]);
    let y = b.op("Add", &[y, t]);
    let y = b.op("HardSwish", &[y]);
    let (s, t) = (b.constant("s2", &[1], &[0.75], 0), b.constant("t2", &[1], &[-0.5], 0));
    let y = b.op("Mul", &[s, y]);
    let y = b.op("Add", &[y, t]);
    let g = b.finish(&[y]);
    let f = fused(&g, &["Conv"]);
    let conv = the(&f, "Conv");
    assert_eq!(post_ops(conv), ("HardSwish,Mul,Add", &[][..]));
    assert_eq!(conv.inputs[3..], [Some(s), Some(t)]);
}

#[test]
fn nothing_fuses_across_a_shared_or_output_value() {
    let conv = |b: &mut Builder| {
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.constant("w", &[2, 2, 1, 1], &[], 1);
        (x, b.node("Conv", &[x, w], conv_attrs(1, 0)))
    };
    // The conv's output read by three nodes: BN, Relu and Add stay steps.
    let mut b = Builder::new();
    let (x, y) = conv(&mut b);
    let n = batch_norm(&mut b, y, 2);
    let r = b.op("Relu", &[y]);
    let s = b.op("Add", &[y, x]);
    let g = b.finish(&[n, r, s]);
    fused(&g, &["Conv", "BatchNormalization", "Relu", "Add"]);
    // The conv's output is a graph output, read once.
    for op in ["BatchNormalization", "Relu", "Add"] {
        let mut b = Builder::new();
        let (x, y) = conv(&mut b);
        let z = match op {
            "Relu" => b.op(op, &[y]),
            "Add" => b.op(op, &[x, y]),
            _ => batch_norm(&mut b, y, 2),
        };
        let g = b.finish(&[y, z]);
        fused(&g, &["Conv", op]);
    }
}

#[test]
fn the_activation_vocabulary_is_the_runtimes() {
    let ours: Vec<(&str, usize)> =
        ACTIVATION_ATTRS.iter().map(|(op, attrs)| (*op, attrs.len())).collect();
    assert_eq!(ours, post::ACTIVATIONS);
    let hosts: Vec<&str> = HOSTS.iter().map(|(op, _)| *op).collect();
    for (op, own) in HOSTS {
        let add = Attrs::new().with("post_ops", AttrValue::Text("Add".into()));
        assert_eq!(post::in_place_input(op, &add), Some(*own), "{op}");
    }
    assert_eq!(hosts, ["Conv", "ConvTranspose", "Gemm", "MatMul", "MatMulIntegerToFloat"]);
}

#[test]
fn an_f16_conv_takes_post_ops_which_run_in_f32_once_widened() {
    // Float16 as converters write it: Conv(x) + r, then SiLU, all f16.
    let half = || Attrs::new().with("to", AttrValue::Int(10));
    let mut b = Builder::new();
    let x = b.input("x", &[1, 3, 4, 4]);
    let r = b.op("Exp", &[x]);
    let (x16, r16) = (b.node("Cast", &[x], half()), b.node("Cast", &[r], half()));
    let w = b.constant("w", &[3, 3, 3, 3], &[], 1);
    let w16 = b.node("Cast", &[w], half());
    let y = b.node("Conv", &[x16, w16], conv_attrs(1, 1));
    let s = b.op("Add", &[y, r16]);
    let sigmoid = b.op("Sigmoid", &[s]);
    let z = b.op("Mul", &[s, sigmoid]);
    let out = b.node("Cast", &[z], Attrs::new().with("to", AttrValue::Int(1)));
    let g = b.finish(&[out]);
    let mut f = g.clone();
    run(&mut f).unwrap();
    let left: Vec<&str> = f.nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(left, ["Exp", "Cast", "Cast", "Conv", "Cast"]);
    assert_eq!(post_ops(the(&f, "Conv")), ("Add,Swish", &[1.0][..]));
    // Widened, the conv and its post-ops are one f32 step between casts (W, a constant, stays
    // f16: the conv widens it as it loads it).
    crate::passes::widen_f16::run(&mut f).unwrap();
    ir::check(&f).unwrap();
    let conv = the(&f, "Conv");
    for (slot, v) in conv.present_inputs().chain(conv.outputs.iter().copied()).enumerate() {
        let want = if slot == 1 { DType::F16 } else { DType::F32 };
        assert_eq!(f.ty(v).unwrap().dtype, want, "{}", f.values[v].name);
    }
    // The post-ops in f32 before one rounding, where the model rounds after each op: within
    // a couple of f16 ulps.
    let inputs = [ingot_ops::Tensor::from_vec(vec![1, 3, 4, 4], &data(48, 3)).unwrap()];
    let (got, want) = (testing::evaluate(&f, &inputs), testing::evaluate(&g, &inputs));
    let (got, want) = (got[0].as_slice::<f32>().unwrap(), want[0].as_slice::<f32>().unwrap());
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= 2e-3 * b.abs().max(1.0), "{a}, unfused {b}");
    }
}
