//! Ingot's ahead-of-time compiler: ONNX in, memory-planned bundle out.
//!
//! ```text
//! model.onnx ──onnx::import──> ir::Graph ──passes──> static, canonical Graph ──plan──> Plan
//!            ──bundle::write──> bundle bytes
//! ```

pub mod bundle;
pub mod ir;
pub mod onnx;
pub mod ops;
pub mod passes;
pub mod plan;

use std::path::Path;

/// Options of one compilation.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    /// Static shapes for graph inputs, by name (`--input-shape x=1x3x48x192`).
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// Graph inputs bound to a value at compile time (`--constant-input x=FILE.npy`).
    pub constant_inputs: Vec<(String, ingot_runtime::Tensor)>,
    /// Run the plan verifier (`--verify`); it also runs in debug builds.
    pub verify: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Import(#[from] onnx::ImportError),
    #[error(transparent)]
    Pass(#[from] passes::PassError),
    #[error("the memory plan failed verification: {0}")]
    Plan(String),
    #[error("cannot write the bundle: {0}")]
    Write(#[from] std::io::Error),
}

/// A model after import, passes and planning: what `compile`, `plan` and `inspect` share.
pub struct Compiled {
    pub graph: ir::Graph,
    pub plan: plan::Plan,
}

/// Imports, lowers and plans the model at `model`.
pub fn compile_graph(model: &Path, options: &CompileOptions) -> Result<Compiled, CompileError> {
    let import_options = onnx::ImportOptions {
        input_shapes: options.input_shapes.clone(),
        constant_inputs: options.constant_inputs.clone(),
    };
    let mut graph = onnx::import_file(model, &import_options)?;
    passes::run_all(&mut graph)?;
    let plan = plan::plan(&graph, plan::Target::cpu());
    if options.verify || cfg!(debug_assertions) {
        plan::verify(&graph, &plan).map_err(CompileError::Plan)?;
    }
    Ok(Compiled { graph, plan })
}

/// Compiles the ONNX model at `model` into bundle bytes.
pub fn compile_file(model: &Path, options: &CompileOptions) -> Result<Vec<u8>, CompileError> {
    let c = compile_graph(model, options)?;
    Ok(bundle::write(&[bundle::CompiledVariant {
        name: "main",
        graph: &c.graph,
        plan: &c.plan,
    }])?)
}

/// The plan of the model at `model` as deterministic text: what `ingot plan` prints, and what
/// a model's own snapshot test asserts (`insta::assert_snapshot!(plan_text(path, &opts)?)`).
pub fn plan_text(model: &Path, options: &CompileOptions) -> Result<String, CompileError> {
    let c = compile_graph(model, options)?;
    let v = bundle::variant(
        &bundle::CompiledVariant {
            name: "main",
            graph: &c.graph,
            plan: &c.plan,
        },
        0,
    );
    Ok(plan::render::text(&v))
}
