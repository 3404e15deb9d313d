//! Quantized weights stay quantized: the decoder fixture's prefill graph quantized by
//! tools/make_quantized_models.py keeps its int8 weights int8 in the bundle, about a quarter of
//! the float graph's weight bytes, and its int4 weights int4, and an embedding lookup reads int8
//! rows; a detector's int8 conv weights (tools/make_detector_models.py) stay int8 too. What the
//! models compute is checked against ONNX Runtime in `models.rs`.

use anyhow::{Context, Result, ensure};
use ingot_compiler::CompileOptions;
use ingot_runtime::Bundle;
use ingot_schema::proto::{DataType, storage::Kind};
use ingot_tests::paths::generated;

/// The bundle of `file` (under target/), and the bytes of its weight bank.
fn compiled(file: &str) -> Result<(Bundle, u64)> {
    compiled_with(file, &CompileOptions::default())
}

/// [`compiled`] with `options`.
fn compiled_with(file: &str, options: &CompileOptions) -> Result<(Bundle, u64)> {
    let path = generated(file)?;
    let bytes =
        ingot_compiler::compile_file(&path, options).with_context(|| format!("compile {file}"))?;
    let bundle = Bundle::from_bytes(&bytes)?;
    let weights = bundle.manifest().weights.iter().map(|w| w.length).sum();
    Ok((bundle, weights))
}

/// Bytes of the 8-bit initializers of an ONNX file.
fn int8_initializer_bytes(file: &str) -> Result<u64> {
    use protobuf::Message as _;
    let model = onnx_protobuf::ModelProto::parse_from_bytes(&std::fs::read(generated(file)?)?)?;
    let int8 = |t: &&onnx_protobuf::TensorProto| [2, 3].contains(&t.data_type);
    Ok(model.graph.initializer.iter().filter(int8).map(|t| t.raw_data.len() as u64).sum())
}

#[test]
fn int8_weights_stay_int8_in_the_bundle() -> Result<()> {
    let (_, float) = compiled("decoder/prefill.onnx")?;
    for model in ["prefill_weights_int8", "prefill_dynamic", "prefill_qdq"] {
        let file = format!("models/{model}.onnx");
        let (bundle, weights) = compiled(&file)?;
        let int8: u64 = (bundle.manifest().weights.iter())
            .filter(|w| [DataType::I8 as i32, DataType::U8 as i32].contains(&w.dtype))
            .map(|w| w.length)
            .sum();
        let model_int8 = int8_initializer_bytes(&file)?;
        println!(
            "{model}: {weights} weight bytes ({int8} of them 8-bit, the model's {model_int8}); \
             the float graph's {float}"
        );
        // The float graph's matrices hold all but 3% of its weights; int8, a quarter of that.
        ensure!(weights * 10 <= float * 3, "{model}: {weights} weight bytes, float {float}");
        // The model's 8-bit weights are 8-bit in the bundle, none dequantized at compile time
        // (a few fold into smaller 8-bit constants: the position table gathered at positions
        // known at compile time).
        ensure!(int8 * 10 >= model_int8 * 9, "{model}: {int8} bytes of 8-bit weights");
    }
    Ok(())
}

/// ONNX Runtime's int4 weight-only quantizer (QDQ form, blocks of 32): every matrix stays
/// int4, one byte per value in the bundle (ONNX packs two), none dequantized at compile time.
#[test]
fn int4_weights_stay_int4_in_the_bundle() -> Result<()> {
    use protobuf::Message as _;
    let file = "models/prefill_weights_int4.onnx";
    let model = onnx_protobuf::ModelProto::parse_from_bytes(&std::fs::read(generated(file)?)?)?;
    let int4 = |t: &&onnx_protobuf::TensorProto| t.data_type == 22;
    let values: u64 = (model.graph.initializer.iter().filter(int4))
        .map(|t| t.dims.iter().product::<i64>() as u64)
        .sum();
    ensure!(values > 0, "{file} has no int4 initializer");
    let (bundle, weights) = compiled(file)?;
    let kept: u64 = (bundle.manifest().weights.iter())
        .filter(|w| w.dtype == DataType::I4 as i32)
        .map(|w| w.length)
        .sum();
    let (_, float) = compiled("decoder/prefill.onnx")?;
    println!("int4: {weights} weight bytes ({kept} of them int4, {values} values); float {float}");
    ensure!(kept == values, "{kept} bytes of int4 weights for {values} int4 values");
    // The f32 matrices' bytes become a quarter: the embeddings stay float.
    ensure!(weights * 2 <= float, "{weights} weight bytes, the float graph's {float}");
    Ok(())
}

#[test]
fn embedding_lookups_read_int8_rows() -> Result<()> {
    let (bundle, _) = compiled("models/prefill_weights_int8.onnx")?;
    let variant = &bundle.manifest().variants[0];
    let tensor = |i: u32| &variant.tensors[i as usize];
    let is_weight =
        |i: u32| matches!(tensor(i).storage.as_ref().and_then(|s| s.kind), Some(Kind::Weight(_)));
    // The token table [256, 64] is Gathered as int8 (its per-row scales too), and only the
    // rows taken are dequantized: nothing dequantizes the table itself.
    let table = variant
        .steps
        .iter()
        .filter(|s| s.op == "Gather" && is_weight(s.inputs[0]))
        .map(|s| s.inputs[0])
        .find(|&t| tensor(t).dtype == DataType::I8 as i32 && tensor(t).shape == [256, 64])
        .context("no Gather reads the int8 token table")?;
    ensure!(
        !variant.steps.iter().any(|s| s.op == "DequantizeLinear" && s.inputs[0] == table),
        "the whole table is still dequantized"
    );
    Ok(())
}

/// The products read their int8 weights and dequantize them as they load them, on the CPU (in
/// the GEMM's packing) and on Vulkan (in the kernel): no step dequantizes a weight matrix, so
/// the arena holds no float copy of one, and every product has a Vulkan kernel. (The outputs
/// are checked against ONNX Runtime on both backends in `models.rs`.)
#[test]
fn products_dequantize_int8_weights_as_they_load_them() -> Result<()> {
    for model in ["prefill_weights_int8", "prefill_qdq"] {
        let file = format!("models/{model}.onnx");
        let (bundle, _) = compiled(&file)?;
        let variant = &bundle.manifest().variants[0];
        let tensor = |i: u32| &variant.tensors[i as usize];
        let is_weight = |i: u32| {
            matches!(tensor(i).storage.as_ref().and_then(|s| s.kind), Some(Kind::Weight(_)))
        };
        let int8_matrix = |i: u32| {
            is_weight(i)
                && [DataType::I8 as i32, DataType::U8 as i32].contains(&tensor(i).dtype)
                && tensor(i).shape.len() == 2
        };
        let products: Vec<_> = (variant.steps.iter())
            .filter(|s| ["MatMul", "Gemm"].contains(&s.op.as_str()) && int8_matrix(s.inputs[1]))
            .collect();
        let dequantized: Vec<&str> = (variant.steps.iter())
            .filter(|s| ["DequantizeLinear", "Cast"].contains(&s.op.as_str()))
            .filter(|s| int8_matrix(s.inputs[0]) && tensor(s.inputs[0]).shape != [256, 64])
            .map(|s| s.name.as_str())
            .collect();
        let without_kernel: Vec<&str> =
            products.iter().filter(|s| s.vulkan.is_empty()).map(|s| s.name.as_str()).collect();
        println!("{model}: {} products read int8 weights", products.len());
        // Two layers of four attention and two MLP matrices, and the head.
        ensure!(products.len() == 13, "{model}: {} products read int8 weights", products.len());
        ensure!(dequantized.is_empty(), "{model}: steps still dequantize weights: {dequantized:?}");
        ensure!(without_kernel.is_empty(), "{model}: no Vulkan kernel for {without_kernel:?}");
    }
    Ok(())
}

/// A detector's int8 conv weights, dequantized in the graph by DequantizeLinear or by the
/// exporters' Cast/Sub/Mul chain, stay int8: every conv reads its 8-bit weights with its table
/// (`dequantize_w`) and has a Vulkan kernel, no step dequantizes a weight, and the weight bank
/// is about a quarter of the float model's.
#[test]
fn convs_read_int8_weights_as_they_load_them() -> Result<()> {
    let options = CompileOptions {
        input_shapes: vec![("images".into(), vec![1, 3, 320, 320])],
        ..Default::default()
    };
    let (_, float) = compiled_with("models/320n.onnx", &options)?;
    let file = "models/320n_weights_int8.onnx";
    let (bundle, weights) = compiled_with(file, &options)?;
    let variant = &bundle.manifest().variants[0];
    let tensor = |i: u32| &variant.tensors[i as usize];
    let narrow = |i: u32| [DataType::I8 as i32, DataType::U8 as i32].contains(&tensor(i).dtype);
    let convs: Vec<_> = variant.steps.iter().filter(|s| s.op == "Conv").collect();
    let int8: Vec<_> = convs.iter().filter(|s| narrow(s.inputs[1])).collect();
    let model_int8 = int8_initializer_bytes(file)?;
    println!(
        "{} of {} convs read int8 weights; {weights} weight bytes, the float model's {float}, \
         the model's int8 {model_int8}",
        int8.len(),
        convs.len()
    );
    // 62 of the detector's 64 convs have 1024 weights or more, which the model quantizes.
    ensure!(int8.len() == 62, "{} convs read int8 weights", int8.len());
    for s in &int8 {
        ensure!(!s.vulkan.is_empty(), "{} has no Vulkan kernel", s.name);
        ensure!(tensor(s.inputs[2]).shape[0] == 3, "{} has no table in B's place", s.name);
    }
    let dequantized: Vec<&str> = (variant.steps.iter())
        .filter(|s| ["DequantizeLinear", "Cast"].contains(&s.op.as_str()) && narrow(s.inputs[0]))
        .map(|s| s.name.as_str())
        .collect();
    ensure!(dequantized.is_empty(), "steps still dequantize weights: {dequantized:?}");
    ensure!(weights * 10 <= float * 3, "{weights} weight bytes, the float model's {float}");
    Ok(())
}

/// ONNX Runtime's dynamic quantization (`quantize_dynamic`) writes each product as
/// `MatMulInteger`, `Cast` to float, `Mul` by the scales and `Add` of the bias: each becomes
/// one `MatMulIntegerToFloat` step with its scale and bias as post-ops, the product never
/// written as int32. What they compute is checked against ONNX Runtime in `models.rs`.
#[test]
fn dynamically_quantized_products_are_one_step_each() -> Result<()> {
    use protobuf::Message as _;
    for model in ["prefill_dynamic", "prefill_dynamic_per_channel"] {
        let file = format!("models/{model}.onnx");
        let onnx = onnx_protobuf::ModelProto::parse_from_bytes(&std::fs::read(generated(&file)?)?)?;
        let products = onnx.graph.node.iter().filter(|n| n.op_type == "MatMulInteger").count();
        ensure!(products > 0, "{file} has no MatMulInteger");
        let (bundle, _) = compiled(&file)?;
        let steps = &bundle.manifest().variants[0].steps;
        let ops = |op: &str| steps.iter().filter(|s| s.op == op).count();
        let fused: Vec<Vec<&str>> = (steps.iter())
            .filter(|s| s.op == "MatMulIntegerToFloat")
            .map(|s| s.post_ops())
            .collect();
        ensure!(
            ops("MatMulInteger") == 0 && ops("Cast") == 0 && fused.len() == products,
            "{model}: {} MatMulInteger, {} Cast and {} MatMulIntegerToFloat steps for {products} \
             products",
            ops("MatMulInteger"),
            ops("Cast"),
            fused.len()
        );
        ensure!(
            fused.iter().all(|p| p.first() == Some(&"Mul")),
            "{model}: every product takes its scale as a post-op: {fused:?}"
        );
    }
    Ok(())
}

/// The same for convs: `quantize_dynamic` makes each of YOLOv8n's convs a `ConvInteger` and a
/// `Cast` to float, then a Mul by the two scales and the bias, which compile to a Conv that
/// reads the int8 weights as they are (none dequantized at compile time), the scales moved to
/// its operands and the bias into W's table, so that SiLU is a post-op again.
#[test]
fn dynamically_quantized_convs_read_their_int8_weights() -> Result<()> {
    use protobuf::Message as _;
    let file = "models/320n_dynamic.onnx";
    let onnx = onnx_protobuf::ModelProto::parse_from_bytes(&std::fs::read(generated(file)?)?)?;
    let convs = onnx.graph.node.iter().filter(|n| n.op_type == "ConvInteger").count();
    ensure!(convs > 0, "{file} has no ConvInteger");
    let options = CompileOptions {
        input_shapes: vec![("images".to_string(), vec![1, 3, 320, 320])],
        ..CompileOptions::default()
    };
    let (bundle, _) = compiled_with(file, &options)?;
    let steps = &bundle.manifest().variants[0].steps;
    let count = |op: &str| steps.iter().filter(|s| s.op == op).count();
    let int8_convs: Vec<Vec<&str>> = (steps.iter())
        .filter(|s| s.op == "Conv" && s.attributes.iter().any(|a| a.name == "dequantize_w"))
        .map(|s| s.post_ops())
        .collect();
    ensure!(
        count("ConvInteger") == 0 && count("Cast") == 0 && int8_convs.len() == convs,
        "{} ConvInteger, {} Cast and {} int8-weight Conv steps for {convs} ConvIntegers",
        count("ConvInteger"),
        count("Cast"),
        int8_convs.len()
    );
    ensure!(
        int8_convs.iter().all(|p| !p.contains(&"Mul")) && count("Swish") == 0,
        "no conv multiplies by its scale, and every SiLU is a post-op: {int8_convs:?}, {} \
         Swish steps",
        count("Swish")
    );
    let int8: u64 = (bundle.manifest().weights.iter())
        .filter(|w| [DataType::I8 as i32, DataType::U8 as i32].contains(&w.dtype))
        .map(|w| w.length)
        .sum();
    let model_int8 = int8_initializer_bytes(file)?;
    ensure!(
        int8 * 10 >= model_int8 * 9,
        "{int8} bytes of 8-bit weights of the model's {model_int8}"
    );
    Ok(())
}
