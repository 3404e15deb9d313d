//! `ingot._native`: the compiler and the runtime as a Python extension module. The Python
//! package (`python/ingot/__init__.py`) wraps it; this file only turns Python arguments into
//! the library calls the CLI makes and their results and errors back into Python objects.
//!
//! Arrays cross as raw bytes, a numpy type string (`<f4`) and a shape, and numpy rebuilds
//! them on the Python side: no numpy crate, nothing numpy-version-specific in the wheel.
//!
//! Errors become `ingot.IngotError` with the whole chain as one line, `{:#}` (`cannot open
//! x.ingot: cannot read bundle x.ingot: No such file or directory (os error 2)`), the CLI's
//! causes in one message.

// No `allow(unsafe_code)`: pyo3's macros mark their own FFI glue, so the workspace's
// `deny(unsafe_code)` holds here as everywhere.

use anyhow::{Context, Result, anyhow, bail};
use ingot_compiler::plan::render;
use ingot_compiler::{CompileOptions, VariantSource, bundle, compile_graph};
use ingot_runtime::{Bundle, Device, IoInfo, Session, SessionOptions, Tensor, TensorDesc};
use ingot_schema::DType;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

create_exception!(
    ingot,
    IngotError,
    PyException,
    "An Ingot error: a model that does not compile, a bundle that does not open or validate, \
     inputs that do not match the bundle's. The message is the whole chain of causes."
);

/// The Python exception for `e`, with every cause (`outer: cause: cause`).
fn py_err(e: anyhow::Error) -> PyErr {
    IngotError::new_err(format!("{e:#}"))
}

/// Input shapes as Python passes them: (input name, dims).
type Shapes = Vec<(String, Vec<usize>)>;

/// A bundle as Python passes it: bytes, or a path (`str` or `os.PathLike`).
#[derive(FromPyObject)]
enum Source<'py> {
    Bytes(Bound<'py, PyBytes>),
    Path(PathBuf),
}

/// Compiles graphs into one bundle, as `ingot compile` does: `sources` are (variant name,
/// ONNX path, that variant's input shapes), `input_shapes` apply to all. Writes the bundle to
/// `output` and returns `None`, or returns its bytes when `output` is `None`.
#[pyfunction]
#[pyo3(signature = (sources, input_shapes, output=None, verify=false, max_loop_iterations=None, f16_weights=false))]
fn compile(
    py: Python<'_>,
    sources: Vec<(String, PathBuf, Shapes)>,
    input_shapes: Shapes,
    output: Option<PathBuf>,
    verify: bool,
    max_loop_iterations: Option<usize>,
    f16_weights: bool,
) -> PyResult<Option<Py<PyBytes>>> {
    let sources: Vec<VariantSource> = sources
        .into_iter()
        .map(|(name, model, input_shapes)| VariantSource { name, model, input_shapes })
        .collect();
    let options = CompileOptions {
        input_shapes,
        verify,
        max_loop_iterations,
        f16_weights,
        ..CompileOptions::default()
    };
    let models = || sources.iter().map(|s| s.model.display().to_string()).collect::<Vec<_>>();
    match output {
        Some(path) => {
            py.detach(|| {
                ingot_compiler::compile_variants_to(&sources, &options, &path)
                    .with_context(|| format!("cannot compile into {}", path.display()))
            })
            .map_err(py_err)?;
            Ok(None)
        }
        None => {
            let bytes = py
                .detach(|| {
                    ingot_compiler::compile_variants(&sources, &options)
                        .with_context(|| format!("cannot compile {}", models().join(", ")))
                })
                .map_err(py_err)?;
            Ok(Some(PyBytes::new(py, &bytes).unbind()))
        }
    }
}

/// A bundle from bytes or a file, with the CLI's context on failure.
fn open_bundle(source: &Source<'_>) -> Result<Bundle> {
    match source {
        Source::Bytes(b) => Bundle::from_bytes(b.as_bytes())
            .with_context(|| format!("cannot open the bundle ({} bytes)", b.as_bytes().len())),
        Source::Path(p) => Bundle::open(p).with_context(|| format!("cannot open {}", p.display())),
    }
}

/// The memory plan of an ONNX model (compiled on the fly, as variant `variant` or `main`) or
/// of a bundle's variant (default: the first), as `ingot plan` prints it: (text, JSON text).
#[pyfunction]
#[pyo3(signature = (model, input_shapes, variant=None))]
fn plan(
    py: Python<'_>,
    model: Source<'_>,
    input_shapes: Shapes,
    variant: Option<String>,
) -> PyResult<(String, String)> {
    let onnx = match &model {
        Source::Path(p)
            if !ingot_runtime::bundle::is_bundle_file(p).map_err(|e| py_err(e.into()))? =>
        {
            Some(p.clone())
        }
        _ => None,
    };
    let v = match onnx {
        Some(path) => py.detach(|| -> Result<_> {
            let options = CompileOptions { input_shapes, ..CompileOptions::default() };
            let c = compile_graph(&path, &options)
                .with_context(|| format!("cannot compile {}", path.display()))?;
            Ok(bundle::variant(&c.variant(variant.as_deref().unwrap_or("main")), &[]))
        }),
        None => (|| {
            if !input_shapes.is_empty() {
                bail!("input_shapes apply to ONNX models; a bundle has static shapes");
            }
            let b = open_bundle(&model)?;
            let index = match &variant {
                Some(name) => b.variant_index(name)?,
                None => 0,
            };
            b.manifest().variants.get(index).cloned().context("the bundle has no variants")
        })(),
    }
    .map_err(py_err)?;
    let json = serde_json::to_string(&render::json(&v)).map_err(|e| py_err(e.into()))?;
    Ok((render::text(&v), json))
}

/// (name, shape, numpy type string) of an input or output.
fn io_tuple(info: &IoInfo) -> (String, Vec<usize>, &'static str) {
    (info.name.clone(), info.desc.shape.clone(), info.desc.dtype.numpy_descr())
}

/// Submodel placement as Python sees it: (index, first step, end step, ops, device,
/// [(skipped device, stage, reason)]).
type SubmodelTuple = (usize, usize, usize, String, String, Vec<(String, String, String)>);

/// One variant of a bundle, prepared on devices (`ingot.Session` wraps it).
#[pyclass(module = "ingot._native", name = "Session", frozen)]
struct PySession {
    // `run` needs `&mut Session`; the lock also makes the class `Sync`, as pyo3 requires.
    session: Mutex<Session>,
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
}

impl PySession {
    fn lock(&self) -> std::sync::MutexGuard<'_, Session> {
        // A panic inside a run poisons the lock; the session itself is still whole (the
        // runtime checks everything before it writes), so keep using it.
        self.session.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[pymethods]
impl PySession {
    /// Opens `bundle` (bytes or a path) and prepares `variant` (default: the first) with each
    /// submodel on the first of `devices` that works (default: vulkan, then cpu).
    #[new]
    #[pyo3(signature = (bundle, devices=None, threads=None, variant=None, failover=true, spin=true))]
    fn new(
        py: Python<'_>,
        bundle: Source<'_>,
        devices: Option<Vec<String>>,
        threads: Option<usize>,
        variant: Option<String>,
        failover: bool,
        spin: bool,
    ) -> PyResult<PySession> {
        // Every name is checked before the bundle is read or any device tried.
        let devices = match devices {
            Some(names) => names
                .iter()
                .map(|name| Device::parse(name.trim()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| py_err(e.into()))?,
            None => Device::default_list(),
        };
        if threads == Some(0) {
            return Err(py_err(anyhow!("threads must be at least 1")));
        }
        let bundle = Arc::new(open_bundle(&bundle).map_err(py_err)?);
        let options =
            SessionOptions { variant, devices, failover, threads, spin, ..Default::default() };
        let session = py
            .detach(|| Session::new(bundle, options).map_err(anyhow::Error::from))
            .map_err(py_err)?;
        Ok(PySession {
            inputs: session.inputs().to_vec(),
            outputs: session.outputs().to_vec(),
            session: Mutex::new(session),
        })
    }

    /// The graph inputs: (name, shape, numpy type string).
    #[getter]
    fn inputs(&self) -> Vec<(String, Vec<usize>, &'static str)> {
        self.inputs.iter().map(io_tuple).collect()
    }

    /// The graph outputs: (name, shape, numpy type string).
    #[getter]
    fn outputs(&self) -> Vec<(String, Vec<usize>, &'static str)> {
        self.outputs.iter().map(io_tuple).collect()
    }

    /// The devices the submodels run on, joined with ` + ` when they differ.
    #[getter]
    fn device(&self) -> String {
        self.lock().device()
    }

    /// The CPU backend's thread count.
    #[getter]
    fn threads(&self) -> usize {
        self.lock().threads()
    }

    /// Whether the CPU backend's idle threads spin a while for work during a run.
    #[getter]
    fn spin(&self) -> bool {
        self.lock().spin()
    }

    /// Where each submodel runs and what was skipped why: (the runtime's report as text,
    /// one tuple per submodel).
    #[getter]
    fn placement(&self) -> (String, Vec<SubmodelTuple>) {
        let p = self.lock().placement();
        let subs =
            p.0.iter()
                .map(|s| {
                    let skipped = s
                        .skipped
                        .iter()
                        .map(|k| (k.device.clone(), k.stage.to_string(), k.reason.clone()))
                        .collect();
                    (s.index, s.steps.start, s.steps.end, s.ops.clone(), s.device.clone(), skipped)
                })
                .collect();
        (p.to_string(), subs)
    }

    /// Runs the variant. `inputs` are (name, bytes, numpy type string, shape), C-ordered;
    /// returns the outputs as (name, bytearray, numpy type string, shape) in the bundle's order.
    #[allow(clippy::type_complexity)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(String, Bound<'py, PyBytes>, String, Vec<usize>)>,
    ) -> PyResult<Vec<(String, Bound<'py, PyByteArray>, &'static str, Vec<usize>)>> {
        let names = || self.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
        // The CLI's checks (`ingot run`): every input given, no unknown name.
        for (name, ..) in &inputs {
            if !self.inputs.iter().any(|i| &i.name == name) {
                let msg = format!("the bundle has no input '{name}'; its inputs: {}", names());
                return Err(py_err(anyhow!(msg)));
            }
        }
        let mut tensors = Vec::with_capacity(self.inputs.len());
        for info in &self.inputs {
            let Some((_, bytes, descr, shape)) = inputs.iter().find(|(n, ..)| n == &info.name)
            else {
                let msg =
                    format!("missing input '{}' (the bundle's inputs: {})", info.name, names());
                return Err(py_err(anyhow!(msg)));
            };
            let tensor = (|| -> Result<Tensor> {
                let dtype = DType::from_numpy_descr(descr).with_context(|| {
                    format!("unsupported element type {descr} (ingot takes bool, ints, floats)")
                })?;
                Ok(Tensor::from_bytes(TensorDesc::new(dtype, shape.clone()), bytes.as_bytes())?)
            })()
            .with_context(|| format!("input '{}'", info.name))
            .map_err(py_err)?;
            tensors.push(tensor);
        }
        let outputs =
            py.detach(|| self.lock().run(&tensors).map_err(anyhow::Error::from)).map_err(py_err)?;
        Ok(self
            .outputs
            .iter()
            .zip(&outputs)
            .map(|(info, t)| {
                let bytes = PyByteArray::new(py, t.bytes());
                (info.name.clone(), bytes, t.dtype().numpy_descr(), t.shape().to_vec())
            })
            .collect())
    }

    fn __repr__(&self) -> String {
        let names =
            |list: &[IoInfo]| list.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
        format!(
            "Session(device={:?}, inputs=[{}], outputs=[{}])",
            self.device(),
            names(&self.inputs),
            names(&self.outputs)
        )
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("IngotError", m.py().get_type::<IngotError>())?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_class::<PySession>()?;
    Ok(())
}
