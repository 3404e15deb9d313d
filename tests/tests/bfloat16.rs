//! bfloat16, which Ingot carries as f32: weights widened exactly, inputs and outputs declared
//! bfloat16 are f32 in the bundle, and a cast to bfloat16 rounds to its precision on both
//! backends. The rounding is checked on an output declared float, which nothing else rounds
//! (the conformance harness rounds outputs declared bfloat16 before comparing them).

use anyhow::{Context, Result, ensure};
use ingot_runtime::{Device, Tensor};
use ingot_schema::DType;
use ingot_tests::model::{OnnxModel, attr_int};
use ingot_tests::paths::scratch_dir;
use ingot_tests::{check_validation, compile, run, session_on, validation_seen, vulkan};
use onnx_protobuf::tensor_proto::DataType;

const BFLOAT16: i32 = DataType::BFLOAT16 as i32;

#[test]
fn bfloat16_weights_inputs_and_casts_run_as_f32_rounded_where_cast() -> Result<()> {
    // w: 2^-8, 3 * 2^-8, 0.5, 0.25, all exact in bfloat16, stored as its 16-bit patterns.
    let w = [1.0f32 / 256.0, 3.0 / 256.0, 0.5, 0.25];
    let placeholder = Tensor::from_vec(vec![4], &w)?;
    let model = OnnxModel::new(17)
        .input("x", DType::F32, &[4])
        .initializer("w", &placeholder)
        .node("add", "Add", &["x", "w"], &["sum"], vec![])
        .node("to_bf16", "Cast", &["sum"], &["rounded"], vec![attr_int("to", BFLOAT16.into())])
        .node("to_f32", "Cast", &["rounded"], &["y"], vec![attr_int("to", 1)])
        .output("sum", DType::F32, &[4])
        .output("y", DType::F32, &[4]);
    // Declare x and sum bfloat16 and store w as bfloat16, which the builder cannot say.
    let mut proto = model.proto();
    let graph = proto.graph.as_mut().context("graph")?;
    for info in [&mut graph.input[0], &mut graph.output[0]] {
        if let Some(onnx_protobuf::type_proto::Value::TensorType(t)) =
            info.type_.as_mut().and_then(|t| t.value.as_mut())
        {
            t.elem_type = BFLOAT16;
        }
    }
    let init = &mut graph.initializer[0];
    init.data_type = BFLOAT16;
    init.raw_data = w.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect();
    let path = scratch_dir("bfloat16").join("model.onnx");
    std::fs::write(&path, protobuf::Message::write_to_bytes(&proto)?)?;
    let bundle = compile(&path, &[])?;

    // x + w in f32: 1 + 2^-8 (a tie: to the even 1), 1 + 3 * 2^-8 (a tie: to 1 + 2^-6),
    // -2.5 (exact), 100.25 (a tie between 100 and 100.5: to the even 100).
    let x = [1.0f32, 1.0, -3.0, 100.0];
    let sum: Vec<f32> = x.iter().zip(&w).map(|(a, b)| a + b).collect();
    let rounded = [1.0f32, 1.0 + 4.0 / 256.0, -2.5, 100.0];
    for (name, device) in [("cpu", Device::Cpu), ("vulkan:cpu", vulkan())] {
        let seen = validation_seen();
        let mut session = session_on(&bundle, device)?;
        ensure!(session.inputs()[0].desc.dtype == DType::F32, "{name}: x is not f32 in the bundle");
        ensure!(session.outputs()[0].desc.dtype == DType::F32, "{name}: sum is not f32");
        let out = run(&mut session, &[Tensor::from_vec(vec![4], &x)?]).context(name)?;
        check_validation(seen)?;
        ensure!(out[0].to_vec::<f32>()? == sum, "{name}: sum {:?}, want {sum:?}", out[0]);
        let y = out[1].to_vec::<f32>()?;
        ensure!(y == rounded, "{name}: rounded {y:?}, want {rounded:?}");
    }
    Ok(())
}
