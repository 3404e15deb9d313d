//! Ingot's ahead-of-time compiler: ONNX in, memory-planned bundle out.
//!
//! ```text
//! model.onnx ─onnx::import─> ir::Graph ─passes─> canonical, static Graph
//!   ─kernels::capability─> partition ─plan─> Plan ─kernels::lower─> Lowered
//!   ─KernelSet::compile─> SPIR-V modules ─bundle::write─> bundle bytes
//! ```

pub mod bundle;
pub mod ir;
pub mod kernels;
pub mod onnx;
pub mod partition;
pub mod passes;
pub mod plan;
pub mod weights;

use std::path::Path;

/// Options of one compilation.
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    /// Static shapes for graph inputs, by name (`--input-shape x=1x3x48x192`).
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// Graph inputs bound to a value at compile time (`--constant-input x=FILE.npy`).
    pub constant_inputs: Vec<(String, ingot_ops::Tensor)>,
    /// The element shapes of sequence inputs (`--input-sequence x=2x3,4`): such an input is
    /// one tensor input per element, `x[0]`, `x[1]`, ...
    pub sequence_inputs: Vec<(String, Vec<Vec<usize>>)>,
    /// Optional inputs that hold nothing (`--absent-input x`).
    pub absent_inputs: Vec<String>,
    /// Run the plan verifier (`--verify`); it also runs in debug builds.
    pub verify: bool,
    /// Which planning mechanisms may share memory (all by default).
    pub sharing: Sharing,
    /// Leave the Vulkan kernels out (`ingot compile --devices cpu`): every step is planned
    /// for the CPU backend alone and the bundle has no kernels section; a runtime skips
    /// Vulkan for it, saying why.
    pub cpu_only: bool,
    /// The most iterations a `Loop` whose trip count is known only at run time may run where
    /// it has scan outputs (`--max-loop-iterations N`): their storage is planned for that
    /// many rows, and a run that would go past them stops with an error naming the loop.
    /// Without it such a loop is refused at compile time.
    pub max_loop_iterations: Option<usize>,
    /// Store the float32 weights of convs, matrix products and embedding tables as float16
    /// (`--f16-weights`): about half the bundle's and the device's weight bytes, arithmetic
    /// still f32, outputs moved by the weights' rounding (`passes/half_weights.rs`).
    pub f16_weights: bool,
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
        Sharing { views: true, in_place: true, reorder: true }
    }
}

impl Sharing {
    /// Every value in its own arena interval, in the model's order.
    pub const NONE: Sharing = Sharing { views: false, in_place: false, reorder: false };
}

/// One graph of a bundle: its variant name, its ONNX file and the shapes its inputs take.
#[derive(Clone, Debug)]
pub struct VariantSource {
    pub name: String,
    pub model: std::path::PathBuf,
    pub input_shapes: Vec<(String, Vec<usize>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("two variants are named '{0}'")]
    DuplicateVariant(String),
    #[error("variant '{variant}': {cause}")]
    Variant { variant: String, cause: Box<CompileError> },
    #[error(transparent)]
    Import(#[from] onnx::ImportError),
    #[error(transparent)]
    Pass(#[from] passes::PassError),
    #[error("the memory plan failed verification: {0}")]
    Plan(String),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(transparent)]
    Write(#[from] bundle::WriteError),
}

/// A model after import, passes, planning and lowering: what `compile`, `plan` and `inspect`
/// share.
pub struct Compiled {
    pub graph: ir::Graph,
    pub plan: plan::Plan,
    pub lowered: kernels::Lowered,
}

impl Compiled {
    /// The bundle writer's view of it, as variant `name`.
    pub fn variant<'a>(&'a self, name: &'a str) -> bundle::CompiledVariant<'a> {
        bundle::CompiledVariant {
            name,
            graph: &self.graph,
            plan: &self.plan,
            lowered: &self.lowered,
        }
    }
}

/// Imports, lowers and plans the model at `model`.
pub fn compile_graph(model: &Path, options: &CompileOptions) -> Result<Compiled, CompileError> {
    let import_options = onnx::ImportOptions {
        input_shapes: options.input_shapes.clone(),
        constant_inputs: options.constant_inputs.clone(),
        sequence_inputs: options.sequence_inputs.clone(),
        absent_inputs: options.absent_inputs.clone(),
    };
    let mut graph = onnx::import_file(model, &import_options)?;
    graph.max_loop_iterations = options.max_loop_iterations;
    graph.f16_weights = options.f16_weights;
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
    let (plan, lowered) = plan_graph(&graph, target, !options.cpu_only);
    if options.verify || cfg!(debug_assertions) {
        plan::verify(&graph, &plan).map_err(CompileError::Plan)?;
    }
    Ok(Compiled { graph, plan, lowered })
}

/// Cuts `graph` into submodels, plans it and lowers its Vulkan steps: the pipeline's middle
/// stages, each computed once. The cut starts from [`kernels::capability`] (which nodes have
/// a Vulkan kernel at all); a step that has none only once planned (written over an input, a
/// view at an offset its kernel cannot read) moves to the CPU and the graph is planned again,
/// which only ever moves steps to the CPU, so it ends. Without `vulkan`, every step is the
/// CPU's.
pub fn plan_graph(
    graph: &ir::Graph,
    target: plan::Target,
    vulkan: bool,
) -> (plan::Plan, kernels::Lowered) {
    let mut no_vulkan = match vulkan {
        true => kernels::capability(graph),
        false => vec![Some("compiled for the CPU only".to_string()); graph.nodes.len()],
    };
    loop {
        let parts = partition::Partition::new(graph, &no_vulkan);
        let plan = plan::plan_parts(graph, &parts, target);
        let lowered = kernels::lower(graph, &plan);
        if lowered.missing.is_empty() {
            return (plan, lowered);
        }
        for (node, why) in lowered.missing {
            no_vulkan[node] = Some(why.0);
        }
    }
}

/// Compiles the ONNX model at `model` into bundle bytes.
pub fn compile_file(model: &Path, options: &CompileOptions) -> Result<Vec<u8>, CompileError> {
    let c = compile_graph(model, options)?;
    let variants = [c.variant("main")];
    let kernels = kernels::KernelSet::compile(&variants)?;
    Ok(bundle::write(&variants, &kernels, options.cpu_only)?)
}

/// Compiles several graphs into one bundle: variant `name` from `model` with its input
/// shapes (the same file may appear under several names with different shapes). Weights
/// equal in content are stored once whichever variant or file they come from.
/// `options.input_shapes` applies to every variant, before its own.
pub fn compile_variants(
    variants: &[VariantSource],
    options: &CompileOptions,
) -> Result<Vec<u8>, CompileError> {
    let mut out = std::io::Cursor::new(Vec::new());
    compile_variants_into(variants, options, &mut out)?;
    Ok(out.into_inner())
}

/// [`compile_variants`] straight into the file at `path`, streaming the weights: what
/// `ingot compile` does. Returns the bundle's manifest.
pub fn compile_variants_to(
    variants: &[VariantSource],
    options: &CompileOptions,
    path: &Path,
) -> Result<ingot_schema::proto::Manifest, CompileError> {
    // Written beside the target and renamed at the end: a failed compile leaves no bundle.
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let written = (|| {
        let file = std::fs::File::create(&partial).map_err(bundle::WriteError::Io)?;
        let mut out = std::io::BufWriter::new(file);
        let manifest = compile_variants_into(variants, options, &mut out)?;
        use std::io::Write as _;
        out.flush().map_err(bundle::WriteError::Io)?;
        drop(out);
        std::fs::rename(&partial, path).map_err(bundle::WriteError::Io)?;
        Ok(manifest)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

fn compile_variants_into<W: std::io::Write + std::io::Seek>(
    variants: &[VariantSource],
    options: &CompileOptions,
    out: &mut W,
) -> Result<ingot_schema::proto::Manifest, CompileError> {
    let mut compiled = Vec::with_capacity(variants.len());
    for (k, v) in variants.iter().enumerate() {
        if variants[..k].iter().any(|earlier| earlier.name == v.name) {
            return Err(CompileError::DuplicateVariant(v.name.clone()));
        }
        let options = CompileOptions {
            input_shapes: [&options.input_shapes[..], &v.input_shapes[..]].concat(),
            ..options.clone()
        };
        let c = compile_graph(&v.model, &options)
            .map_err(|e| CompileError::Variant { variant: v.name.clone(), cause: Box::new(e) })?;
        compiled.push(c);
    }
    let variants: Vec<bundle::CompiledVariant> =
        variants.iter().zip(&compiled).map(|(v, c)| c.variant(&v.name)).collect();
    let kernels = kernels::KernelSet::compile(&variants)?;
    Ok(bundle::write_to(&variants, &kernels, options.cpu_only, out)?)
}

/// The plan of the model at `model` as deterministic text: what `ingot plan` prints, and what
/// a model's own snapshot test asserts (`insta::assert_snapshot!(plan_text(path, &opts)?)`).
pub fn plan_text(model: &Path, options: &CompileOptions) -> Result<String, CompileError> {
    let c = compile_graph(model, options)?;
    Ok(plan::render::text(&bundle::variant(&c.variant("main"), &[])))
}
