//! Float16 steps of ops that compute in float32 only (Conv, MatMul, the norms, the
//! reductions, Softmax, ...): their f16 inputs are cast to f32 before them and their f32 results cast
//! back to f16 after, in the graph. This is what ONNX Runtime does for such nodes and what the
//! CPU kernels did inside the step (`ingot_ops::cpu` widen); done here, every backend sees an
//! f32 step and two casts, so a float16 model runs on Vulkan's f32 kernels instead of falling
//! back to the CPU step by step. The numbers are the CPU's: inputs widened exactly, the f32
//! kernel, each f16 output rounded once. f16 storage stays f16: only the step's own operands
//! are f32, for as long as the step needs them (the plan reuses their bytes).
//!
//! Constants are not cast each run. A weight that the f32 kernels read as f16 themselves
//! (`ingot_ops::takes_f16_weights`: a Conv's W) stays as it is: half the bytes in the bundle
//! and in memory, widened as the kernel loads it. A constant of at most one dimension (a bias,
//! a norm's scale) is widened here, once: a few KiB. Any other f16 weight (a MatMul's B) is
//! cast as the step runs.
//!
//! Which ops these are is the CPU kernels' answer (`ingot_ops::cpu::widens_f16`); an op whose
//! CPU kernel takes f16 itself (Attention, which rounds as ONNX's reference does) is left
//! alone. A cast of a value is shared by consecutive steps that read it under the same guard
//! and loop (the three projections of one input). Steps whose outputs have a data-dependent
//! length keep the CPU's own widening: their bound belongs to the step that computes it.

use super::PassError;
use crate::ir::{Const, Graph, Guard, Node, ValueId};
use ingot_ops::cpu::{OpCx, widens_f16};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs, DType};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let nodes = std::mem::take(&mut g.nodes);
    let mut out = Vec::with_capacity(nodes.len());
    // (f16 value, where its reader runs) -> the f32 copy, for the next steps that read it.
    let mut widened: Vec<(ValueId, Context, ValueId)> = Vec::new();
    // f16 constant -> its f32 constant, for every reader.
    let mut folded: Vec<(ValueId, ValueId)> = Vec::new();
    for mut node in nodes {
        if !widens(g, &node) {
            widened.clear();
            out.push(node);
            continue;
        }
        // A copy serves consecutive readers only: kept for a later one, it would hold f32
        // bytes in the arena all the steps between.
        widened.retain(|(v, _, _)| node.inputs.contains(&Some(*v)));
        let context = Context::of(g, &node);
        for slot in 0..node.inputs.len() {
            let Some(v) = node.inputs[slot].filter(|&v| is_f16(g, v)) else {
                continue;
            };
            if let Some(c) = g.constant(v) {
                if ingot_ops::takes_f16_weights(&node.op, &node.attrs, slot) {
                    continue;
                }
                if c.desc().shape.len() <= 1 {
                    let half = c.tensor();
                    node.inputs[slot] = Some(widened_constant(g, v, &half, &mut folded)?);
                    continue;
                }
            }
            let known = widened.iter().find(|(w, c, _)| *w == v && *c == context);
            let wide = match known {
                Some(&(_, _, wide)) => wide,
                None => {
                    let wide = add_like(g, v, DType::F32, "f32");
                    if let Some(&step) = node.outputs.first() {
                        g.inherit(step, wide);
                    }
                    out.push(cast(g, v, wide, DType::F32));
                    widened.push((v, context.clone(), wide));
                    wide
                }
            };
            node.inputs[slot] = Some(wide);
        }
        let mut narrowing = Vec::new();
        for slot in 0..node.outputs.len() {
            let v = node.outputs[slot];
            if !is_f16(g, v) {
                continue;
            }
            let wide = add_like(g, v, DType::F32, "f32");
            g.inherit(v, wide);
            node.outputs[slot] = wide;
            narrowing.push(cast(g, wide, v, DType::F16));
        }
        out.push(node);
        out.extend(narrowing);
    }
    g.nodes = out;
    Ok(())
}

/// The f32 constant of f16 constant `v`, whose value is `half`, made once.
fn widened_constant(
    g: &mut Graph,
    v: ValueId,
    half: &Tensor,
    folded: &mut Vec<(ValueId, ValueId)>,
) -> Result<ValueId, PassError> {
    if let Some(&(_, wide)) = folded.iter().find(|(h, _)| *h == v) {
        return Ok(wide);
    }
    let desc = TensorDesc::new(DType::F32, half.desc().shape.clone());
    let to = Attrs::new().with("to", AttrValue::Int(i64::from(DType::F32.onnx_code())));
    let wide = ingot_ops::cpu::eval("Cast", &to, &[half], std::slice::from_ref(&desc))
        .map_err(|e| PassError::Graph(format!("widening f16 constant {}: {e}", g.values[v].name)))?
        .remove(0);
    let name = format!("{}:f32", g.values[v].name);
    let wide = g.add_constant(name, Const::owned(wide));
    folded.push((v, wide));
    Ok(wide)
}

/// Whether `node` has f16 operands that its CPU kernel would widen, and no bounded ones: what
/// this pass widens (and `fuse` asks before it fuses post-ops into an f16 step).
pub(super) fn widens(g: &Graph, node: &Node) -> bool {
    let values = || node.present_inputs().chain(node.outputs.iter().copied());
    if !values().any(|v| is_f16(g, v)) || values().any(|v| g.bounded.contains_key(&v)) {
        return false;
    }
    let descs = |vs: &mut dyn Iterator<Item = ValueId>| -> Option<Vec<TensorDesc>> {
        vs.map(|v| g.ty(v).cloned()).collect()
    };
    let (Some(inputs), Some(outputs)) =
        (descs(&mut node.present_inputs()), descs(&mut node.outputs.iter().copied()))
    else {
        return false;
    };
    widens_f16(&OpCx { op: &node.op, attrs: &node.attrs, inputs: &inputs, outputs: &outputs })
}

fn is_f16(g: &Graph, v: ValueId) -> bool {
    g.ty(v).is_some_and(|t| t.dtype == DType::F16)
}

/// A new value of `v`'s shape in `dtype`, named after it.
fn add_like(g: &mut Graph, v: ValueId, dtype: DType, suffix: &str) -> ValueId {
    let shape = g.ty(v).map(|t| t.shape.clone()).unwrap_or_default();
    let name = format!("{}:{suffix}", g.values[v].name);
    g.add_value(name, Some(TensorDesc::new(dtype, shape)))
}

/// `Cast` of `from` into `to`, in its canonical form.
fn cast(g: &Graph, from: ValueId, to: ValueId, dtype: DType) -> Node {
    Node {
        name: format!("{}:cast", g.values[to].name),
        op: "Cast".into(),
        domain: String::new(),
        inputs: vec![Some(from)],
        outputs: vec![to],
        attrs: Attrs::new().with("to", AttrValue::Int(i64::from(dtype.onnx_code()))),
    }
}

/// Where a step runs: under which guard and in which run-time loop. A cast made for one step
/// serves another only where both run under the same.
#[derive(Clone, PartialEq)]
struct Context {
    guard: Option<Guard>,
    repeat: Option<usize>,
}

impl Context {
    fn of(g: &Graph, node: &Node) -> Context {
        let guard = node.outputs.first().and_then(|o| g.guards.get(o).cloned());
        Context { guard, repeat: g.repeat_of(node) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::{Builder, data, evaluate};
    use ingot_ops::Tensor;

    fn to(dtype: DType) -> Attrs {
        Attrs::new().with("to", AttrValue::Int(i64::from(dtype.onnx_code())))
    }

    /// An f16 model: `h = f16(x)`, two MatMuls of `h` by f16 weights (the CPU widens an f16
    /// MatMul), a Relu of one (f16 native) and their sum, returned as f32.
    fn half_model() -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[3, 4]);
        let h = b.node("Cast", &[x], to(DType::F16));
        let (w1, w2) = (b.constant("w1", &[4, 5], &[], 1), b.constant("w2", &[4, 5], &[], 2));
        let w1 = b.node("Cast", &[w1], to(DType::F16));
        let w2 = b.node("Cast", &[w2], to(DType::F16));
        let p = b.op("MatMul", &[h, w1]);
        let q = b.op("MatMul", &[h, w2]);
        let r = b.op("Relu", &[p]);
        let s = b.op("Add", &[r, q]);
        let y = b.node("Cast", &[s], to(DType::F32));
        b.finish(&[y])
    }

    fn ops(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.op.as_str()).collect()
    }

    #[test]
    fn f16_steps_the_cpu_widens_get_casts_and_compute_the_same() {
        let original = half_model();
        let mut g = original.clone();
        run(&mut g).unwrap();
        crate::ir::check(&g).unwrap();
        // h widened once for both products, each product rounded to f16; the products read
        // their f16 weights themselves.
        let widened = ["Cast", "Cast", "MatMul", "Cast", "MatMul", "Cast"];
        assert_eq!(ops(&g), [&widened[..], &["Relu", "Add", "Cast"]].concat());
        for n in g.nodes.iter().filter(|n| n.op == "MatMul") {
            let operands = n.present_inputs().chain(n.outputs.iter().copied());
            let dtypes: Vec<DType> = operands.map(|v| g.ty(v).unwrap().dtype).collect();
            assert_eq!(dtypes, [DType::F32, DType::F16, DType::F32], "{}", n.label());
            assert!(g.constant(n.inputs[1].unwrap()).is_some(), "{}", n.label());
        }
        // Bit for bit what the CPU's widened kernels compute.
        let x = Tensor::from_vec(vec![3, 4], &data(12, 7)).unwrap();
        let bits = |g: &Graph| evaluate(g, std::slice::from_ref(&x))[0].bytes().to_vec();
        assert_eq!(bits(&g), bits(&original));
        // A second run finds nothing left to widen.
        let once = ops(&g).len();
        run(&mut g).unwrap();
        assert_eq!(ops(&g).len(), once);
    }

    #[test]
    fn a_conv_reads_its_f16_weights_itself_and_its_bias_is_widened_once() {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 5, 5]);
        let h = b.node("Cast", &[x], to(DType::F16));
        let w = b.constant("w", &[6, 4, 3, 3], &[], 1);
        let w = b.node("Cast", &[w], to(DType::F16));
        let bias = b.constant("b", &[6], &[], 2);
        let bias = b.node("Cast", &[bias], to(DType::F16));
        let pads = AttrValue::Ints(vec![1; 4]);
        let conv = b.node("Conv", &[h, w, bias], Attrs::new().with("pads", pads));
        let y = b.node("Cast", &[conv], to(DType::F32));
        let original = b.finish(&[y]);
        let mut g = original.clone();
        run(&mut g).unwrap();
        crate::ir::check(&g).unwrap();
        // X widened and Y rounded each run; W and the bias are not cast each run.
        assert_eq!(ops(&g), ["Cast", "Cast", "Conv", "Cast", "Cast"]);
        let conv = g.nodes.iter().find(|n| n.op == "Conv").unwrap();
        let dtypes: Vec<DType> = conv.present_inputs().map(|v| g.ty(v).unwrap().dtype).collect();
        assert_eq!(dtypes, [DType::F32, DType::F16, DType::F32]);
        assert!(conv.present_inputs().skip(1).all(|v| g.constant(v).is_some()));
        let x = Tensor::from_vec(vec![1, 4, 5, 5], &data(100, 3)).unwrap();
        let bits = |g: &Graph| evaluate(g, std::slice::from_ref(&x))[0].bytes().to_vec();
        assert_eq!(bits(&g), bits(&original));
        let once = ops(&g).len();
        run(&mut g).unwrap();
        assert_eq!(ops(&g).len(), once);
    }
}
