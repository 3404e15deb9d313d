//! The model's memory plan, pinned. When the model or the compiler changes what the plan
//! costs, this test fails and `cargo insta review` shows the diff to accept or reject.

use ingot_compiler::{CompileOptions, plan_text};
use std::path::Path;

#[test]
fn model_plan_is_unchanged() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("model.onnx");
    let options = CompileOptions {
        input_shapes: vec![("x".into(), vec![1, 3, 32, 32])],
        ..CompileOptions::default()
    };
    insta::assert_snapshot!(plan_text(&model, &options).expect("the model compiles"));
}
