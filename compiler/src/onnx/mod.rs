//! ONNX `ModelProto` -> [`Graph`].
//!
//! What import does, and what it leaves to the passes:
//! - initializers and `Constant` nodes become constant values (no node); an initializer that
//!   is also listed as a graph input is a **constant**, not a runtime input (ONNX lets a caller
//!   override such an input; a compiled bundle does not);
//! - graph inputs get their dtype and a static shape: from the model, or fixed by
//!   [`ImportOptions::input_shapes`] (`--input-shape x=1x3x48x192`); a dim that stays symbolic
//!   is an error that says how to fix it;
//! - nodes keep their ONNX op type, attributes (converted to [`Attrs`]) and value names; they
//!   are sorted topologically; intermediate values are left untyped for shape inference;
//! - every op is checked against [`ingot_ops::lookup`] up front, and all unsupported nodes
//!   are reported in one error.
//!
//! The default domain is accepted at opsets [`OPSETS`].

use crate::ir::{Const, Container, Graph, Node, ValueId};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::Attrs;
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use onnx_protobuf::{tensor_shape_proto::dimension, type_proto};
use petgraph::graph::{DiGraph, NodeIndex};
use protobuf::Message;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

mod attrs;
mod external;
mod tensor;

use external::ExternalData;
pub(crate) use tensor::checked_bytes;

/// Opsets of the default ONNX domain that Ingot imports. The op lowering reads each op's
/// semantics for the model's opset (`LowerCx::opset`); opsets 11 to 21 are the ones the
/// project commits to. Older ones (6..10: the model zoo's classic nets, PyTorch's first
/// exporter; opset 6's legacy broadcasting is restated as opset 7's by `passes/legacy.rs`) and
/// newer ones are accepted too: 22..28 changed the supported ops by adding element types, plus attributes
/// whose defaults keep the old meaning (Cast `round_mode`, Range `stash_type`, SpaceToDepth
/// `mode`). The ONNX backend tests, generated at each op's own latest version, check both ends.
pub const OPSETS: RangeInclusive<i64> = 6..=28;

#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Static shapes for graph inputs (`--input-shape NAME=dims`), by input name.
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// Graph inputs bound to a value at compile time (`--constant-input NAME=FILE.npy`): they
    /// become constants, so what depends on them folds (a shape operand, a fixed mask).
    pub constant_inputs: Vec<(String, Tensor)>,
    /// The shapes of the elements of sequence inputs (`--input-sequence NAME=DIMS,...`): the
    /// input becomes one tensor input per element, `NAME[0]`, `NAME[1]`, ...
    pub sequence_inputs: Vec<(String, Vec<Vec<usize>>)>,
    /// Optional inputs that hold nothing (`--absent-input NAME`); an optional input not
    /// named here holds its element, an input of the element's type.
    pub absent_inputs: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read ONNX model {path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("{model}: not a valid ONNX model (truncated or corrupt file?): {cause}")]
    Parse { model: String, cause: protobuf::Error },
    #[error("{model}: {message}")]
    Opset { model: String, message: String },
    #[error("{model}: tensor '{tensor}': {message}")]
    Tensor { model: String, tensor: String, message: String },
    #[error(
        "{model}: {} node(s) use ops Ingot does not support ({}):\n  {}",
        nodes.len(), ops.join(", "), nodes.join("\n  ")
    )]
    Unsupported {
        model: String,
        /// Distinct op types, in order of first use.
        ops: Vec<String>,
        /// One line per node: `node 'foo' (NonMaxSuppression, domain ai.onnx, opset 13)`.
        nodes: Vec<String>,
    },
    #[error("{model}: {message}")]
    InputShape { model: String, message: String },
    #[error("{model}: {message}")]
    Graph { model: String, message: String },
}

/// Imports an ONNX file; external data is looked up beside it.
pub fn import_file(path: &Path, options: &ImportOptions) -> Result<Graph, ImportError> {
    let bytes =
        std::fs::read(path).map_err(|cause| ImportError::Io { path: path.to_path_buf(), cause })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    import(&path.display().to_string(), &bytes, Some(dir), options, &default_support)
}

/// Imports a serialized model; `base_dir` is where its external data files are, if any.
pub fn import_bytes(
    bytes: &[u8],
    base_dir: Option<&Path>,
    options: &ImportOptions,
) -> Result<Graph, ImportError> {
    import("in-memory ONNX model", bytes, base_dir, options, &default_support)
}

/// Decodes one serialized TensorProto (the test harness reads ONNX test-data .pb files with it).
pub fn read_tensor_proto(bytes: &[u8]) -> Result<(String, Tensor), ImportError> {
    const MODEL: &str = "serialized TensorProto";
    let proto = TensorProto::parse_from_bytes(bytes)
        .map_err(|cause| ImportError::Parse { model: MODEL.into(), cause })?;
    let value = tensor::to_const(&proto, &mut ExternalData::new(None)).map_err(|message| {
        ImportError::Tensor { model: MODEL.into(), tensor: proto.name.clone(), message }
    })?;
    Ok((proto.name, std::sync::Arc::unwrap_or_clone(value.tensor())))
}

/// Which (domain, op) pairs the compiler accepts; a parameter so tests do not depend on which
/// op families exist yet.
type Support<'a> = &'a dyn Fn(&str, &str) -> bool;

fn default_support(domain: &str, op: &str) -> bool {
    domain.is_empty() && ingot_ops::lookup(op).is_some()
}

fn import(
    model: &str,
    bytes: &[u8],
    base_dir: Option<&Path>,
    options: &ImportOptions,
    supported: Support,
) -> Result<Graph, ImportError> {
    let proto = ModelProto::parse_from_bytes(bytes)
        .map_err(|cause| ImportError::Parse { model: model.into(), cause })?;
    Importer {
        model,
        options,
        ext: ExternalData::new(base_dir),
        graph: Graph::default(),
        names: HashMap::new(),
        taken: HashSet::new(),
        used: HashSet::new(),
    }
    .run(&proto, supported)
}

/// "" and "ai.onnx" both name the default domain; the graph stores it as "".
fn normalize_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

/// How messages name a node: by name, or by its index in the model's node list.
fn node_label(index: usize, n: &NodeProto) -> String {
    if n.name.is_empty() {
        format!("unnamed node #{index} ({})", n.op_type)
    } else {
        format!("node '{}' ({})", n.name, n.op_type)
    }
}

fn is_constant_node(n: &NodeProto) -> bool {
    n.op_type == "Constant" && normalize_domain(&n.domain).is_empty()
}

/// One dim of a graph input as the model declares it.
enum Dim {
    Fixed(usize),
    /// A `dim_param` name, `?` for a dim with neither value nor name, or a negative value.
    Symbolic(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(v) => write!(f, "{v}"),
            Dim::Symbolic(s) => f.write_str(s),
        }
    }
}

fn fmt_dims(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(Dim::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// A shape as `--input-shape` spells it: `1x3x48x192`.
fn fmt_cli(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(usize::to_string).collect();
    parts.join("x")
}

/// A graph input's declared type: a tensor's element type and dims (`None` dims: rank
/// unknown), or a sequence of such tensors, or an optional of either.
enum Declared {
    Tensor(ingot_schema::DType, Option<Vec<Dim>>),
    Sequence(ingot_schema::DType, Option<Vec<Dim>>),
    Optional(Box<Declared>),
}

fn input_type(vi: &ValueInfoProto) -> Result<Declared, String> {
    let name = &vi.name;
    match vi.type_.as_ref().and_then(|t| t.value.as_ref()) {
        Some(t) => declared(name, t),
        None => Err(format!("input '{name}' has no type")),
    }
}

fn declared(name: &str, t: &type_proto::Value) -> Result<Declared, String> {
    let inner = |t: Option<&onnx_protobuf::TypeProto>| match t.and_then(|t| t.value.as_ref()) {
        Some(t) => declared(name, t),
        None => Err(format!("input '{name}' has no element type")),
    };
    Ok(match t {
        type_proto::Value::TensorType(t) => {
            let (dtype, dims) = tensor_type(name, t)?;
            Declared::Tensor(dtype, dims)
        }
        type_proto::Value::SequenceType(s) => match inner(s.elem_type.as_ref())? {
            Declared::Tensor(dtype, dims) => Declared::Sequence(dtype, dims),
            _ => return Err(format!("input '{name}' is a sequence of sequences or optionals")),
        },
        type_proto::Value::OptionalType(o) => match inner(o.elem_type.as_ref())? {
            Declared::Optional(_) => return Err(format!("input '{name}' is an optional optional")),
            d => Declared::Optional(Box::new(d)),
        },
        _ => return Err(format!("input '{name}' is a map or sparse tensor")),
    })
}

fn tensor_type(
    name: &str,
    t: &type_proto::Tensor,
) -> Result<(ingot_schema::DType, Option<Vec<Dim>>), String> {
    let dtype = tensor::dtype(t.elem_type).map_err(|m| format!("input '{name}': {m}"))?;
    let dims = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(v)) => match usize::try_from(*v) {
                    Ok(v) => Dim::Fixed(v),
                    Err(_) => Dim::Symbolic(v.to_string()),
                },
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::Symbolic(p.clone()),
                _ => Dim::Symbolic("?".into()),
            })
            .collect()
    });
    Ok((dtype, dims))
}

struct Importer<'a> {
    model: &'a str,
    options: &'a ImportOptions,
    ext: ExternalData,
    graph: Graph,
    /// The names in scope: the main graph's, and inside a subgraph its own and its parents'.
    names: HashMap<String, ValueId>,
    /// Every name the model uses anywhere, so that names made up for unnamed values never
    /// collide with one.
    taken: HashSet<String>,
    /// The names of the graph's values so far (two subgraphs may each define a name).
    used: HashSet<String>,
}

impl Importer<'_> {
    fn graph_err(&self, message: String) -> ImportError {
        ImportError::Graph { model: self.model.into(), message }
    }

    fn tensor_err(&self, tensor: &str, message: String) -> ImportError {
        ImportError::Tensor { model: self.model.into(), tensor: tensor.into(), message }
    }

    fn shape_err(&self, message: String) -> ImportError {
        ImportError::InputShape { model: self.model.into(), message }
    }

    fn run(mut self, proto: &ModelProto, supported: Support) -> Result<Graph, ImportError> {
        let g = proto.graph.as_ref().ok_or_else(|| {
            self.graph_err("the file holds no graph (is it an ONNX model?)".into())
        })?;
        let opsets = self.opsets(proto)?;
        self.check_ops(g, &opsets, supported)?;
        collect_names(g, &mut self.taken);
        self.initializers(g)?;
        self.add_inputs(g)?;
        self.graph.nodes = self.nodes(g)?;

        for o in &g.output {
            let id = *self.names.get(&o.name).ok_or_else(|| {
                self.graph_err(format!(
                    "graph output '{}' is not produced by any node, initializer or input",
                    o.name
                ))
            })?;
            self.graph.outputs.push(id);
        }
        Ok(self.graph)
    }

    /// Records the opset of every imported domain and checks the default domain's.
    fn opsets<'p>(&mut self, proto: &'p ModelProto) -> Result<HashMap<&'p str, i64>, ImportError> {
        let opsets: HashMap<&str, i64> =
            proto.opset_import.iter().map(|o| (normalize_domain(&o.domain), o.version)).collect();
        let err = |message: String| ImportError::Opset { model: self.model.into(), message };
        let (lo, hi) = (*OPSETS.start(), *OPSETS.end());
        let version = *opsets
            .get("")
            .ok_or_else(|| err("the model imports no opset of the default ONNX domain".into()))?;
        if version < lo {
            return Err(err(format!(
                "opset {version} of the default ONNX domain is older than Ingot supports \
                 ({lo}..={hi}); upgrade the model first, e.g. with \
                 onnx.version_converter.convert_version(model, 17)"
            )));
        }
        if version > hi {
            return Err(err(format!(
                "opset {version} of the default ONNX domain is newer than Ingot supports \
                 ({lo}..={hi})"
            )));
        }
        self.graph.opset = version;
        Ok(opsets)
    }

    /// One error listing every node whose op is not supported, subgraphs included.
    fn check_ops(
        &self,
        g: &GraphProto,
        opsets: &HashMap<&str, i64>,
        supported: Support,
    ) -> Result<(), ImportError> {
        let mut ops: Vec<String> = Vec::new();
        let mut nodes = Vec::new();
        unsupported_nodes(g, "", opsets, supported, &mut ops, &mut nodes);
        if nodes.is_empty() {
            Ok(())
        } else {
            Err(ImportError::Unsupported { model: self.model.into(), ops, nodes })
        }
    }

    /// A new value of the graph, named `name` unless another value has that name already (a
    /// name defined in two subgraphs), in which case the name gets a suffix.
    fn add_value(&mut self, name: String, ty: Option<TensorDesc>) -> ValueId {
        let name = if self.used.contains(&name) { self.fresh(&name) } else { name };
        self.used.insert(name.clone());
        self.graph.add_value(name, ty)
    }

    fn add_constant(&mut self, name: String, value: Const) -> ValueId {
        let id = self.add_value(name, Some(value.desc().clone()));
        self.graph.values[id].constant = Some(value);
        id
    }

    /// `base`, or `base_1`, `base_2`, ...: the first that neither the model nor the graph uses.
    fn fresh(&self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while self.taken.contains(&name) || self.used.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        name
    }

    /// `g`'s initializers, as constants in scope.
    fn initializers(&mut self, g: &GraphProto) -> Result<(), ImportError> {
        if let Some(s) = g.sparse_initializer.first() {
            let name = s.values.as_ref().map_or("", |v| v.name.as_str());
            return Err(self.tensor_err(name, "sparse initializers are not supported".into()));
        }
        for t in &g.initializer {
            if t.name.is_empty() {
                return Err(self.graph_err("an initializer has no name".into()));
            }
            let value =
                tensor::to_const(t, &mut self.ext).map_err(|m| self.tensor_err(&t.name, m))?;
            let id = self.add_constant(t.name.clone(), value);
            self.define(&t.name, id, || "an initializer".into())?;
        }
        Ok(())
    }

    /// `g`'s nodes in execution order, after its `Constant` nodes became constants. Every
    /// output is defined before any input is resolved: nodes may come in any order.
    fn nodes(&mut self, g: &GraphProto) -> Result<Vec<Node>, ImportError> {
        let unnamed = |i: usize, n: &NodeProto, slot: usize| {
            if n.name.is_empty() {
                format!("{}#{i}:{slot}", n.op_type)
            } else {
                format!("{}:{slot}", n.name)
            }
        };
        let mut pending = Vec::new();
        for (i, n) in g.node.iter().enumerate() {
            if is_constant_node(n) {
                let value = attrs::constant_value(n, &mut self.ext)
                    .map_err(|m| self.graph_err(format!("{}: {m}", node_label(i, n))))?;
                match n.output.first() {
                    Some(o) if !o.is_empty() => {
                        let id = self.add_constant(o.clone(), value);
                        self.define(o, id, || node_label(i, n))?;
                    }
                    _ => {
                        let name = self.fresh(&unnamed(i, n, 0));
                        self.add_constant(name, value);
                    }
                }
                continue;
            }
            let mut outputs = Vec::with_capacity(n.output.len());
            for (slot, o) in n.output.iter().enumerate() {
                // An omitted optional output still gets a value, so every output slot exists.
                let id = if o.is_empty() {
                    let name = self.fresh(&unnamed(i, n, slot));
                    self.add_value(name, None)
                } else {
                    let id = self.add_value(o.clone(), None);
                    self.define(o, id, || node_label(i, n))?;
                    id
                };
                outputs.push(id);
            }
            pending.push((i, outputs));
        }
        let mut nodes = Vec::with_capacity(pending.len());
        let mut origin = Vec::with_capacity(pending.len());
        for (i, outputs) in pending {
            nodes.push(self.node(i, &g.node[i], outputs)?);
            origin.push(i);
        }
        self.order(nodes, &origin, g)
    }

    /// Imports subgraph `g` (the graph attribute `attr` of `owner`) into [`Graph::bodies`]
    /// and returns its index. Its names are in scope only inside it.
    fn body(&mut self, owner: &str, attr: &str, g: &GraphProto) -> Result<usize, ImportError> {
        let outer = self.names.clone();
        self.initializers(g)?;
        let mut inputs = Vec::with_capacity(g.input.len());
        for vi in &g.input {
            // A body input's type may leave dims open: the values bound to it give them.
            let ty = match input_type(vi) {
                Ok(Declared::Tensor(dtype, Some(dims))) => dims
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(v) => Some(*v),
                        Dim::Symbolic(_) => None,
                    })
                    .collect::<Option<Vec<usize>>>()
                    .map(|shape| TensorDesc::new(dtype, shape)),
                _ => None,
            };
            let id = self.add_value(vi.name.clone(), ty);
            self.define(&vi.name, id, || format!("an input of {attr} of {owner}"))?;
            inputs.push(id);
        }
        let nodes = self.nodes(g)?;
        let outputs = g
            .output
            .iter()
            .map(|o| {
                self.names.get(&o.name).copied().ok_or_else(|| {
                    self.graph_err(format!(
                        "output '{}' of {attr} of {owner} is not produced by any node, \
                         initializer or input",
                        o.name
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.names = outer;
        self.graph.bodies.push(crate::ir::Body { inputs, nodes, outputs });
        Ok(self.graph.bodies.len() - 1)
    }

    /// Binds `name` to `id`; `by` describes the definition for the duplicate error.
    fn define(
        &mut self,
        name: &str,
        id: ValueId,
        by: impl FnOnce() -> String,
    ) -> Result<(), ImportError> {
        if self.names.insert(name.to_string(), id).is_some() {
            return Err(self.graph_err(format!(
                "value '{name}' is defined twice; the second definition is {}",
                by()
            )));
        }
        Ok(())
    }

    /// Graph inputs that are not initializers, with static shapes.
    fn add_inputs(&mut self, g: &GraphProto) -> Result<(), ImportError> {
        let runtime: Vec<&ValueInfoProto> =
            g.input.iter().filter(|vi| !self.names.contains_key(&vi.name)).collect();
        let mut given: HashMap<&str, &[usize]> = HashMap::new();
        for (name, dims) in &self.options.input_shapes {
            if given.insert(name, dims).is_some() {
                return Err(self.shape_err(format!("--input-shape gives '{name}' twice")));
            }
            if runtime.iter().all(|vi| vi.name != *name) {
                let real: Vec<&str> = runtime.iter().map(|vi| vi.name.as_str()).collect();
                let what = if self.names.contains_key(name) {
                    "is an initializer (a constant), not a runtime input"
                } else {
                    "is not a graph input"
                };
                return Err(self.shape_err(format!(
                    "--input-shape {name}=...: '{name}' {what}; the inputs are: {}",
                    real.join(", ")
                )));
            }
        }

        for (name, _) in &self.options.constant_inputs {
            if runtime.iter().all(|vi| vi.name != *name) || given.contains_key(name.as_str()) {
                let real: Vec<&str> = runtime.iter().map(|vi| vi.name.as_str()).collect();
                return Err(self.shape_err(format!(
                    "--constant-input {name}=...: '{name}' is not a runtime graph input, or also \
                     has an --input-shape; the inputs are: {}",
                    real.join(", ")
                )));
            }
        }

        let mut dynamic = Vec::new();
        for vi in &runtime {
            let name = vi.name.as_str();
            let absent = self.options.absent_inputs.iter().any(|n| n == name);
            // An optional input holds nothing, or is its element.
            let held = match input_type(vi).map_err(|m| self.shape_err(m))? {
                Declared::Optional(_) if absent => {
                    let id = self.add_value(name.into(), None);
                    self.graph.containers.insert(id, Container::Optional(None));
                    self.define(name, id, || "a graph input".into())?;
                    continue;
                }
                Declared::Optional(inner) => *inner,
                declared => declared,
            };
            let (dtype, dims) = match held {
                Declared::Tensor(dtype, dims) => (dtype, dims),
                Declared::Sequence(dtype, dims) => {
                    self.add_sequence(name, dtype, dims, &mut dynamic)?;
                    continue;
                }
                Declared::Optional(_) => {
                    return Err(self.shape_err(format!("input '{name}' is an optional optional")));
                }
            };
            if let Some((_, value)) = self.options.constant_inputs.iter().find(|(n, _)| n == name) {
                self.bind_constant(name, dtype, dims.as_deref(), value)?;
                continue;
            }
            let shape = match (dims, given.get(name)) {
                (Some(dims), Some(&fixed)) => {
                    if dims.len() != fixed.len() {
                        return Err(self.shape_err(format!(
                            "--input-shape {name}={} has {} dims, but input '{name}' has {}: {}",
                            fmt_cli(fixed),
                            fixed.len(),
                            dims.len(),
                            fmt_dims(&dims)
                        )));
                    }
                    let clash = dims
                        .iter()
                        .zip(fixed)
                        .position(|(d, &f)| matches!(d, Dim::Fixed(v) if *v != f));
                    if let Some(k) = clash {
                        return Err(self.shape_err(format!(
                            "--input-shape {name}={} does not match input '{name}' of shape {} \
                             (dim {k} is {})",
                            fmt_cli(fixed),
                            fmt_dims(&dims),
                            dims[k]
                        )));
                    }
                    fixed.to_vec()
                }
                (None, Some(&fixed)) => fixed.to_vec(),
                (Some(dims), None) => {
                    let fixed: Option<Vec<usize>> = dims
                        .iter()
                        .map(|d| match d {
                            Dim::Fixed(v) => Some(*v),
                            Dim::Symbolic(_) => None,
                        })
                        .collect();
                    match fixed {
                        Some(shape) => shape,
                        None => {
                            dynamic.push(dynamic_message(name, &dims));
                            continue;
                        }
                    }
                }
                (None, None) => {
                    dynamic.push(format!(
                        "input '{name}' has no shape in the model; give it one with \
                         --input-shape {name}=DIMS (e.g. {name}=1x3x224x224)"
                    ));
                    continue;
                }
            };
            if tensor::checked_bytes(dtype, &shape).is_none() {
                return Err(
                    self.shape_err(format!("input '{name}' of shape {shape:?} is too large"))
                );
            }
            let id = self.add_value(name.into(), Some(TensorDesc::new(dtype, shape)));
            self.define(name, id, || "a graph input".into())?;
            self.graph.inputs.push(id);
        }
        let declared = |name: &str, sequence: bool| {
            runtime.iter().any(|vi| {
                vi.name == name
                    && match input_type(vi) {
                        Ok(Declared::Optional(inner)) => {
                            !sequence || matches!(*inner, Declared::Sequence(..))
                        }
                        Ok(Declared::Sequence(..)) => sequence,
                        _ => false,
                    }
            })
        };
        let inputs = || runtime.iter().map(|vi| vi.name.as_str()).collect::<Vec<_>>().join(", ");
        for (name, _) in &self.options.sequence_inputs {
            if !declared(name, true) {
                return Err(self.shape_err(format!(
                    "--input-sequence {name}=...: '{name}' is not a sequence input; the inputs \
                     are: {}",
                    inputs()
                )));
            }
        }
        for name in &self.options.absent_inputs {
            if !declared(name, false) {
                return Err(self.shape_err(format!(
                    "--absent-input {name}: '{name}' is not an optional input; the inputs are: {}",
                    inputs()
                )));
            }
        }
        if dynamic.is_empty() {
            Ok(())
        } else {
            Err(self
                .shape_err(format!("Ingot compiles static shapes:\n  {}", dynamic.join("\n  "))))
        }
    }

    /// Sequence input `name` as a tensor input per element (`name[i]`), the shapes given by
    /// `--input-sequence`, or a message for `dynamic` if none are.
    fn add_sequence(
        &mut self,
        name: &str,
        dtype: ingot_schema::DType,
        dims: Option<Vec<Dim>>,
        dynamic: &mut Vec<String>,
    ) -> Result<(), ImportError> {
        let Some((_, shapes)) = self.options.sequence_inputs.iter().find(|(n, _)| n == name) else {
            dynamic.push(format!(
                "input '{name}' is a sequence of {dtype} tensors; give its length and its \
                 elements' shapes with --input-sequence {name}=DIMS,DIMS,... (a scalar is (), \
                 an empty sequence {name}=)"
            ));
            return Ok(());
        };
        let mut elements = Vec::with_capacity(shapes.len());
        for (i, shape) in shapes.iter().enumerate() {
            let fits = dims.as_ref().is_none_or(|dims| {
                dims.len() == shape.len()
                    && dims.iter().zip(shape).all(|(d, &v)| !matches!(d, Dim::Fixed(f) if *f != v))
            });
            if !fits {
                return Err(self.shape_err(format!(
                    "--input-sequence {name}: element {i} of shape {shape:?} does not match the \
                     sequence's element shape {}",
                    dims.as_deref().map_or("?".into(), fmt_dims)
                )));
            }
            if tensor::checked_bytes(dtype, shape).is_none() {
                return Err(self.shape_err(format!(
                    "input '{name}': element {i} of shape {shape:?} is too large"
                )));
            }
            let id =
                self.add_value(format!("{name}[{i}]"), Some(TensorDesc::new(dtype, shape.clone())));
            self.graph.inputs.push(id);
            elements.push(id);
        }
        let id = self.add_value(name.into(), None);
        self.graph.containers.insert(id, Container::Sequence(elements));
        self.define(name, id, || "a graph input".into())
    }

    /// Makes graph input `name` the constant `value`, after checking it fits the declaration.
    fn bind_constant(
        &mut self,
        name: &str,
        dtype: ingot_schema::DType,
        dims: Option<&[Dim]>,
        value: &Tensor,
    ) -> Result<(), ImportError> {
        let shape = value.shape();
        let fits = dims.is_none_or(|dims| {
            dims.len() == shape.len()
                && dims.iter().zip(shape).all(|(d, &v)| !matches!(d, Dim::Fixed(f) if *f != v))
        });
        if value.dtype() != dtype || !fits {
            return Err(self.shape_err(format!(
                "--constant-input {name}: the value is {} {:?}, the input is declared {dtype} {}",
                value.dtype(),
                shape,
                dims.map_or("without a shape".into(), fmt_dims)
            )));
        }
        let id = self.add_constant(name.into(), Const::owned(value.clone()));
        self.define(name, id, || "a graph input bound to a constant".into())
    }

    fn node(
        &mut self,
        i: usize,
        n: &NodeProto,
        outputs: Vec<ValueId>,
    ) -> Result<Node, ImportError> {
        let mut inputs = n
            .input
            .iter()
            .map(|name| {
                if name.is_empty() {
                    return Ok(None); // an omitted optional input
                }
                self.names.get(name).map(|&id| Some(id)).ok_or_else(|| {
                    self.graph_err(format!(
                        "{} reads '{name}', which no node, initializer or graph input defines",
                        node_label(i, n)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A subgraph attribute becomes its body's index in `Graph::bodies`; the outer values
        // its nodes read join the node's inputs, after the model's own. The passes trust those
        // indices and keep state in `ingot.*` attributes, so a model may set neither.
        let control = n.domain.is_empty() && matches!(n.op_type.as_str(), "If" | "Loop" | "Scan");
        for a in &n.attribute {
            let graph = a.type_.enum_value() == Ok(AttributeType::GRAPH);
            let names_body = matches!(a.name.as_str(), "then_branch" | "else_branch" | "body");
            let problem = if a.name.starts_with("ingot.") {
                "has a name Ingot reserves"
            } else if control && names_body && !graph {
                "is not a subgraph"
            } else {
                continue;
            };
            let label = node_label(i, n);
            return Err(self.graph_err(format!("{label}: attribute '{}' {problem}", a.name)));
        }
        let first_inner = self.graph.values.len();
        let mut bodies = Vec::new();
        for a in n.attribute.iter().filter(|a| a.type_.enum_value() == Ok(AttributeType::GRAPH)) {
            let g = a.g.as_ref().ok_or_else(|| {
                self.graph_err(format!("{}: attribute '{}' has no graph", node_label(i, n), a.name))
            })?;
            bodies.push((a.name.as_str(), self.body(&node_label(i, n), &a.name, g)?));
        }
        let mut attrs: Attrs = attrs::convert(&n.attribute)
            .map_err(|m| self.graph_err(format!("{}: {m}", node_label(i, n))))?;
        let mut captured = std::collections::BTreeSet::new();
        for &(name, b) in &bodies {
            attrs.set(name, ingot_schema::AttrValue::Int(b as i64));
            let body = &self.graph.bodies[b];
            let read = body.nodes.iter().flat_map(Node::present_inputs);
            captured.extend(read.chain(body.outputs.iter().copied()).filter(|&v| v < first_inner));
        }
        inputs.extend(captured.into_iter().map(Some));
        Ok(Node {
            name: n.name.clone(),
            op: n.op_type.clone(),
            domain: normalize_domain(&n.domain).to_string(),
            inputs,
            outputs,
            attrs,
        })
    }

    /// The nodes in a valid execution order: the model's own if it is one (ONNX requires it),
    /// else a topological sort. `origin[k]` is node k's index in the model, for messages.
    fn order(
        &self,
        nodes: Vec<Node>,
        origin: &[usize],
        g: &GraphProto,
    ) -> Result<Vec<Node>, ImportError> {
        let mut producer = vec![None; self.graph.values.len()];
        for (k, n) in nodes.iter().enumerate() {
            for &o in &n.outputs {
                producer[o] = Some(k);
            }
        }
        let in_order = nodes
            .iter()
            .enumerate()
            .all(|(k, n)| n.present_inputs().all(|v| producer[v].is_none_or(|p| p < k)));
        if in_order {
            return Ok(nodes);
        }
        let mut dag = DiGraph::<(), ()>::with_capacity(nodes.len(), nodes.len());
        for _ in &nodes {
            dag.add_node(());
        }
        for (k, n) in nodes.iter().enumerate() {
            for p in n.present_inputs().filter_map(|v| producer[v]) {
                dag.add_edge(NodeIndex::new(p), NodeIndex::new(k), ());
            }
        }
        let sorted = petgraph::algo::toposort(&dag, None).map_err(|cycle| {
            let i = origin[cycle.node_id().index()];
            self.graph_err(format!("the graph has a cycle through {}", node_label(i, &g.node[i])))
        })?;
        let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
        Ok(sorted.into_iter().filter_map(|ix| slots[ix.index()].take()).collect())
    }
}

/// Control-flow and sequence ops, which the passes expand into the graph
/// (`passes/control.rs`, `passes/sequences.rs`) rather than an op family running them.
fn is_expanded(op: &str) -> bool {
    matches!(op, "If" | "Loop" | "Scan") || crate::passes::sequences::OPS.contains(&op)
}

/// Appends to `nodes` a line for each node of `g` and its subgraphs whose op is not
/// supported, and each such op to `ops` once; `within` says which subgraph `g` is.
fn unsupported_nodes(
    g: &GraphProto,
    within: &str,
    opsets: &HashMap<&str, i64>,
    supported: Support,
    ops: &mut Vec<String>,
    nodes: &mut Vec<String>,
) {
    for (i, n) in g.node.iter().enumerate() {
        let domain = normalize_domain(&n.domain);
        let who = if n.name.is_empty() {
            format!("unnamed node #{i}")
        } else {
            format!("node '{}'", n.name)
        };
        let expanded = (domain.is_empty() && is_expanded(&n.op_type))
            || crate::passes::contrib::is_restated(domain, &n.op_type);
        if is_constant_node(n) || expanded || supported(domain, &n.op_type) {
            for a in &n.attribute {
                if let Some(sub) = a.g.as_ref() {
                    let within = format!(" in {} of {who}{within}", a.name);
                    unsupported_nodes(sub, &within, opsets, supported, ops, nodes);
                }
            }
            continue;
        }
        let shown = if domain.is_empty() { "ai.onnx" } else { domain };
        let opset = opsets.get(domain).map_or("no opset imported".into(), |v| format!("opset {v}"));
        nodes.push(format!("{who} ({}, domain {shown}, {opset}){within}", n.op_type));
        if !ops.contains(&n.op_type) {
            ops.push(n.op_type.clone());
        }
    }
}

/// Every value name `g` and its subgraphs use.
fn collect_names(g: &GraphProto, names: &mut HashSet<String>) {
    names.extend(g.initializer.iter().map(|t| t.name.clone()));
    names.extend(g.input.iter().chain(&g.output).map(|v| v.name.clone()));
    for n in &g.node {
        names.extend(n.input.iter().chain(&n.output).cloned());
        for a in &n.attribute {
            for sub in a.g.as_ref().into_iter().chain(&a.graphs) {
                collect_names(sub, names);
            }
        }
    }
}

/// `input 'x' has dynamic shape [p2o.DynamicDimension.0, 3, ?, ?]; ... --input-shape x=Ax3xBxC`.
fn dynamic_message(name: &str, dims: &[Dim]) -> String {
    let mut letters = Vec::new();
    let template: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(v) => v.to_string(),
            Dim::Symbolic(_) => {
                let k = letters.len();
                let letter = match u8::try_from(k) {
                    Ok(k) if k < 26 => char::from(b'A' + k).to_string(),
                    _ => format!("D{k}"),
                };
                letters.push(letter.clone());
                letter
            }
        })
        .collect();
    format!(
        "input '{name}' has dynamic shape {}; fix it with --input-shape {name}={} \
         (a size for each of {})",
        fmt_dims(dims),
        template.join("x"),
        letters.join(", ")
    )
}

#[cfg(test)]
mod tests;
