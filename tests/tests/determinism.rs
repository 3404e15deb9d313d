//! Compiling the same model twice gives byte-identical bundles: within one process (catches
//! iteration order of hash maps and sets) and across two `ingot compile` processes.

use ingot_runtime::Tensor;
use ingot_schema::DType;
use ingot_tests::cli::{expect_success, ingot};
use ingot_tests::compile;
use ingot_tests::model::{OnnxModel, attr_int, attr_ints};
use ingot_tests::paths::{generated, scratch_dir};
use std::path::Path;

/// Two branches that meet again and several initializers, so that any order the compiler
/// takes from a hash map has something to reorder.
fn branchy_model() -> OnnxModel {
    let w = |n: usize, seed: f32| -> Tensor {
        let v: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
        Tensor::from_vec(vec![n], &v).unwrap()
    };
    let conv_w: Vec<f32> = (0..4 * 3 * 3 * 3).map(|i| (i as f32 * 0.11).cos()).collect();
    OnnxModel::new(17)
        .input("x", DType::F32, &[1, 3, 8, 8])
        .initializer("conv_w", &Tensor::from_vec(vec![4, 3, 3, 3], &conv_w).unwrap())
        .initializer("conv_b", &w(4, 1.0))
        .initializer("scale", &w(8, 2.0))
        .initializer("shift", &w(8, 3.0))
        .node(
            "conv",
            "Conv",
            &["x", "conv_w", "conv_b"],
            &["c"],
            vec![attr_ints("pads", &[1, 1, 1, 1])],
        )
        .node("relu", "Relu", &["c"], &["r"], vec![])
        .node("sigmoid", "Sigmoid", &["c"], &["s"], vec![])
        .node("mul", "Mul", &["r", "s"], &["m"], vec![])
        .node("scale_mul", "Mul", &["m", "scale"], &["ms"], vec![])
        .node("shift_add", "Add", &["ms", "shift"], &["y"], vec![])
        .node("softmax", "Softmax", &["y"], &["z"], vec![attr_int("axis", -1)])
        .output("z", DType::F32, &[1, 4, 8, 8])
        .output("r", DType::F32, &[1, 4, 8, 8])
}

fn assert_same(what: &str, a: &[u8], b: &[u8]) {
    if a != b {
        let first = a.iter().zip(b).position(|(x, y)| x != y);
        panic!(
            "{what}: bundles differ ({} vs {} bytes, first difference at byte {first:?})",
            a.len(),
            b.len()
        );
    }
}

fn compile_twice(model: &Path, shapes: &[(String, Vec<usize>)]) {
    let first = compile(model, shapes).unwrap_or_else(|e| panic!("{e:#}"));
    let second = compile(model, shapes).unwrap_or_else(|e| panic!("{e:#}"));
    assert_same(&model.display().to_string(), &first, &second);
}

#[test]
fn small_model_compiles_to_identical_bytes() {
    let dir = scratch_dir("determinism/small");
    let model = dir.join("model.onnx");
    branchy_model().write(&model).unwrap();
    compile_twice(&model, &[]);
}

#[test]
fn ppocr_cls_compiles_to_identical_bytes() {
    let model =
        generated("models/ch_ppocr_mobile_v2.0_cls_infer.onnx").unwrap_or_else(|e| panic!("{e:#}"));
    compile_twice(&model, &[("x".into(), vec![1, 3, 48, 192])]);
}

/// Two processes (different hash seeds, different addresses) write the same file, and it is
/// the library's bundle.
#[test]
fn cli_compiles_to_identical_files() {
    let dir = scratch_dir("determinism/cli");
    let model = dir.join("model.onnx");
    branchy_model().write(&model).unwrap();
    let mut bundles = Vec::new();
    for i in 0..2 {
        let out = dir.join(format!("model_{i}.ingot"));
        let output = ingot(["compile".as_ref(), model.as_os_str(), "-o".as_ref(), out.as_os_str()])
            .unwrap_or_else(|e| panic!("{e:#}"));
        expect_success("ingot compile", &output).unwrap_or_else(|e| panic!("{e:#}"));
        bundles.push(std::fs::read(&out).unwrap());
    }
    assert_same("two ingot compile runs", &bundles[0], &bundles[1]);
    let library = compile(&model, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    assert_same("ingot compile and compile_file", &bundles[0], &library);
}
