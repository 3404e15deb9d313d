//! Ingot's ahead-of-time compiler: ONNX in, memory-planned bundle out.
//!
//! ```text
//! model.onnx ──onnx::import──> ir::Graph ──passes──> static, canonical Graph ──plan──> Plan
//!            ──bundle::write──> bundle bytes
//! ```

pub mod bundle;
pub mod ir;
pub mod kernels;
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
    /// Which planning mechanisms may share memory (all by default).
    pub sharing: Sharing,
}

/// The planner's memory-sharing mechanisms, each of which can be turned off (to measure what
/// it saves, or to check that results do not depend on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharing {
    /// Views, outer-axis slices and splits, concats written in place.
    pub views: bool,
    /// Ops written over an input whose root dies there (elementwise ops, a conv or matmul over
    /// its residual-add operand).
    pub in_place: bool,
    /// Step orders other than the model's.
    pub reorder: bool,
}

impl Default for Sharing {
    fn default() -> Self {
        Sharing {
            views: true,
            in_place: true,
            reorder: true,
        }
    }
}

impl Sharing {
    /// Every value in its own arena interval, in the model's order.
    pub const NONE: Sharing = Sharing {
        views: false,
        in_place: false,
        reorder: false,
    };
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Import(#[from] onnx::ImportError),
    #[error(transparent)]
    Pass(#[from] passes::PassError),
    #[error("the memory plan failed verification: {0}")]
    Plan(String),
    #[error(transparent)]
    Write(#[from] bundle::WriteError),
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
    let no_in_place = |_: &str, _: &ingot_schema::Attrs, _: usize| false;
    let cpu = plan::Target::cpu();
    let target = plan::Target {
        can_run_in_place: if options.sharing.in_place {
            cpu.can_run_in_place
        } else {
            &no_in_place
        },
        views: options.sharing.views,
        reorder: options.sharing.reorder,
    };
    let plan = plan::plan(&graph, target);
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
