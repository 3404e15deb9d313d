//! The memory plan of small fixture graphs, as `ingot plan` prints it, under insta snapshots:
//! each fixture shows one planning mechanism doing its job, and a change to the planner that
//! costs (or saves) memory shows up as a reviewed diff. Every fixture also runs on the CPU and
//! must give the same outputs as the same model planned with nothing shared.

use ingot_compiler::{CompileOptions, Sharing, compile_file, plan_text};
use ingot_runtime::Tensor;
use ingot_schema::DType;
use ingot_tests::model::{OnnxModel, attr_int, attr_ints};
use ingot_tests::paths::scratch_dir;
use std::path::PathBuf;

const F32: DType = DType::F32;

/// A deterministic weight: small values that differ per element.
fn weight(shape: &[usize], salt: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| (((i * 7 + salt * 13) % 17) as f32 - 8.0) / 16.0).collect();
    Tensor::from_vec(shape.to_vec(), &data).unwrap()
}

fn write(name: &str, model: OnnxModel) -> PathBuf {
    // One scratch dir per fixture: the tests run in parallel and a scratch dir starts empty.
    let path = scratch_dir(&format!("plan_snapshots/{name}")).join("model.onnx");
    model.write(&path).unwrap();
    path
}

/// The plan text of `model`, after checking that running it gives bit-identical outputs to the
/// same model planned with nothing shared.
fn plan(name: &str, model: OnnxModel) -> String {
    let path = write(name, model);
    let run = |sharing: Sharing| {
        let options = CompileOptions { sharing, ..CompileOptions::default() };
        let bundle = compile_file(&path, &options).unwrap();
        let mut session = ingot_tests::session(&bundle).unwrap();
        let inputs: Vec<Tensor> = session
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, i)| weight(&i.desc.shape, 100 + k))
            .collect();
        ingot_tests::run(&mut session, &inputs).unwrap()
    };
    assert_eq!(run(Sharing::default()), run(Sharing::NONE), "{name}: sharing changed the outputs");
    plan_text(&path, &CompileOptions::default()).unwrap()
}

fn conv(m: OnnxModel, name: &str, x: &str, w: &str, y: &str) -> OnnxModel {
    m.node(name, "Conv", &[x, w], &[y], vec![attr_ints("pads", &[1, 1, 1, 1])])
}

#[test]
fn residual_block_adds_in_place() {
    // x -> conv -> relu -> conv -> add(relu, conv) -> relu -> y
    let m = OnnxModel::new(17)
        .input("x", F32, &[1, 8, 16, 16])
        .initializer("w1", &weight(&[8, 8, 3, 3], 1))
        .initializer("w2", &weight(&[8, 8, 3, 3], 2));
    let m = conv(m, "conv1", "x", "w1", "a");
    let m = m.node("relu1", "Relu", &["a"], &["b"], vec![]);
    let m = conv(m, "conv2", "b", "w2", "c");
    let m = m
        .node("add", "Add", &["b", "c"], &["d"], vec![])
        .node("relu2", "Relu", &["d"], &["y"], vec![])
        .output("y", F32, &[1, 8, 16, 16]);
    insta::assert_snapshot!(plan("residual", m));
}

#[test]
fn slice_reshape_conv_is_a_view_that_keeps_its_root_alive() {
    // conv -> a [1,8,8,8]; slice channels 4..8 (contiguous: N = 1) -> reshape -> conv
    let m = OnnxModel::new(17)
        .input("x", F32, &[1, 8, 8, 8])
        .initializer("w1", &weight(&[8, 8, 3, 3], 3))
        .initializer("w2", &weight(&[4, 4, 3, 3], 4))
        .initializer("starts", &Tensor::from_vec(vec![1], &[4i64]).unwrap())
        .initializer("ends", &Tensor::from_vec(vec![1], &[8i64]).unwrap())
        .initializer("axes", &Tensor::from_vec(vec![1], &[1i64]).unwrap())
        .initializer("shape", &Tensor::from_vec(vec![4], &[1i64, 4, 4, 16]).unwrap());
    let m = conv(m, "conv1", "x", "w1", "a");
    let m = m.node("crop", "Slice", &["a", "starts", "ends", "axes"], &["s"], vec![]).node(
        "reshape",
        "Reshape",
        &["s", "shape"],
        &["r"],
        vec![],
    );
    let m = conv(m, "conv2", "r", "w2", "y").output("y", F32, &[1, 4, 4, 16]);
    insta::assert_snapshot!(plan("slice_reshape_conv", m));
}

#[test]
fn four_way_concat_is_written_in_place() {
    let mut m = OnnxModel::new(17).input("x", F32, &[1, 4, 8, 8]);
    for k in 0..4 {
        m = m.initializer(&format!("w{k}"), &weight(&[4, 4, 3, 3], 10 + k));
        m = conv(m, &format!("branch{k}"), "x", &format!("w{k}"), &format!("b{k}"));
    }
    let m = m
        .node("concat", "Concat", &["b0", "b1", "b2", "b3"], &["c"], vec![attr_int("axis", 1)])
        .initializer("w", &weight(&[4, 16, 1, 1], 20))
        .node("mix", "Conv", &["c", "w"], &["y"], vec![])
        .output("y", F32, &[1, 4, 8, 8]);
    insta::assert_snapshot!(plan("concat", m));
}

#[test]
fn a_graph_output_that_is_a_view_is_copied_to_the_caller() {
    let m = OnnxModel::new(17)
        .input("x", F32, &[2, 8])
        .initializer("shape", &Tensor::from_vec(vec![1], &[16i64]).unwrap())
        .node("exp", "Exp", &["x"], &["a"], vec![])
        .node("reshape", "Reshape", &["a", "shape"], &["y"], vec![])
        .output("y", F32, &[16]);
    insta::assert_snapshot!(plan("output_view", m));
}

#[test]
fn an_elementwise_chain_runs_in_place() {
    let m = OnnxModel::new(17)
        .input("x", F32, &[1, 16, 8, 8])
        .initializer("w", &weight(&[16, 16, 3, 3], 5));
    let m = conv(m, "conv", "x", "w", "a")
        .node("tanh", "Tanh", &["a"], &["s"], vec![])
        .node("gate", "Mul", &["a", "s"], &["m"], vec![])
        .node("neg", "Neg", &["m"], &["n"], vec![])
        .node("abs", "Abs", &["n"], &["b"], vec![])
        .node("sqrt", "Sqrt", &["b"], &["q"], vec![]);
    let m = conv(m, "conv_out", "q", "w", "y").output("y", F32, &[1, 16, 8, 8]);
    insta::assert_snapshot!(plan("elementwise_chain", m));
}

#[test]
fn reordering_lowers_the_bound_of_a_branchy_graph() {
    // Branch A makes a big tensor and reduces it; branch B is a chain of small ones. The
    // model lists A's first op first, so its big tensor lives through B unless reordered.
    let m = OnnxModel::new(17)
        .input("x", F32, &[1, 4, 8, 8])
        .initializer("wide", &weight(&[64, 4, 1, 1], 6))
        .initializer("axes", &Tensor::from_vec(vec![1], &[1i64]).unwrap())
        .node("a_wide", "Conv", &["x", "wide"], &["a1"], vec![])
        .node("b1", "Exp", &["x"], &["b1"], vec![])
        .node("b2", "Neg", &["b1"], &["b2"], vec![])
        .node("b3", "Exp", &["b2"], &["b3"], vec![])
        .node("a_reduce", "ReduceSum", &["a1", "axes"], &["a2"], vec![attr_int("keepdims", 1)])
        .node("join", "Add", &["a2", "b3"], &["y"], vec![])
        .output("y", F32, &[1, 4, 8, 8]);
    insta::assert_snapshot!(plan("branchy", m));
}
