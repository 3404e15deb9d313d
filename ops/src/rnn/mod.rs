//! Recurrent layers: LSTM, GRU, RNN.
//!
//! Canonical form (what `ops/src/rnn/cpu.rs` reads):
//! - inputs: `X`, `W`, `R`, then only the optional inputs that are present, in ONNX order:
//!   `B`, `sequence_lens`, `initial_h`, and for LSTM `initial_c`, `P`; the flags `has_bias`,
//!   `has_sequence_lens`, `has_initial_h` (LSTM also `has_initial_c`, `has_peepholes`) say
//!   which. Constant sequence lengths that all equal `seq_length` are dropped.
//! - attributes: `direction`, `hidden_size`, `layout`, `clip` (`f32::MAX` for none),
//!   `activations` (comma-separated ONNX names, all of them: `f,g,h` per direction for LSTM,
//!   `f,g` for GRU, `f` for RNN), `activation_alpha`/`activation_beta` (one per activation,
//!   defaults filled in, 0 where unused), `input_forget` (LSTM), `linear_before_reset` (GRU).
//! - outputs: as in the model (`Y`, `Y_h`, `Y_c`); the kernel computes every one it is given.

pub(crate) mod cpu;
mod layer;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

const fn def(name: &'static str) -> OpDef {
    OpDef::new(name, lower, infer)
}

pub const OPS: &[OpDef] = &[def("LSTM"), def("GRU"), def("RNN")];

/// What differs between the three layers.
struct Cell {
    /// Gate blocks stacked in W and R.
    gates: usize,
    /// Default activations of one direction.
    activations: &'static [&'static str],
    /// ONNX input names after X, W, R, with the canonical flag of each.
    optional: &'static [&'static str],
    max_outputs: usize,
}

fn cell(op: &str) -> OpResult<Cell> {
    const COMMON: [&str; 3] = ["has_bias", "has_sequence_lens", "has_initial_h"];
    Ok(match op {
        "LSTM" => Cell {
            gates: 4,
            activations: &["Sigmoid", "Tanh", "Tanh"],
            optional: &[COMMON[0], COMMON[1], COMMON[2], "has_initial_c", "has_peepholes"],
            max_outputs: 3,
        },
        "GRU" => {
            Cell { gates: 3, activations: &["Sigmoid", "Tanh"], optional: &COMMON, max_outputs: 2 }
        }
        "RNN" => Cell { gates: 1, activations: &["Tanh"], optional: &COMMON, max_outputs: 2 },
        op => return Err(op_err!("{op} is not a recurrent layer")),
    })
}

/// ONNX activation names with (uses alpha, uses beta, default alpha, default beta). Defaults
/// are those of the ONNX operator of the same name (onnxruntime uses 0 for ThresholdedRelu,
/// ScaledTanh and Affine).
const ACTIVATIONS: &[(&str, bool, bool, f64, f64)] = &[
    ("Relu", false, false, 0.0, 0.0),
    ("Tanh", false, false, 0.0, 0.0),
    ("Sigmoid", false, false, 0.0, 0.0),
    ("Affine", true, true, 1.0, 0.0),
    ("LeakyRelu", true, false, 0.01, 0.0),
    ("ThresholdedRelu", true, false, 1.0, 0.0),
    ("ScaledTanh", true, true, 1.0, 1.0),
    ("HardSigmoid", true, true, 0.2, 0.5),
    ("Elu", true, false, 1.0, 0.0),
    ("Softsign", false, false, 0.0, 0.0),
    ("Softplus", false, false, 0.0, 0.0),
];

/// The activations with one alpha and one beta each. As in onnxruntime, the given
/// `activation_alpha`/`activation_beta` lists are consumed in order, only by the functions
/// that take the parameter; names match case-insensitively.
fn activations(
    names: &[String],
    alphas: &[f64],
    betas: &[f64],
) -> OpResult<(Vec<&'static str>, Vec<f64>, Vec<f64>)> {
    let (mut alphas, mut betas) = (alphas.iter(), betas.iter());
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for name in names {
        let &(canon, uses_a, uses_b, def_a, def_b) = ACTIVATIONS
            .iter()
            .find(|a| a.0.eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| op_err!("activation '{name}' is not supported"))?;
        let take = |uses: bool, list: &mut std::slice::Iter<f64>, default: f64| {
            if uses { list.next().copied().unwrap_or(default) } else { 0.0 }
        };
        out.0.push(canon);
        out.1.push(take(uses_a, &mut alphas, def_a));
        out.2.push(take(uses_b, &mut betas, def_b));
    }
    Ok(out)
}

fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let cell = cell(&node.op)?;
    let a = &node.attrs;
    let lstm = node.op == "LSTM";

    let direction = a.text_or("direction", "forward")?.to_string();
    let dirs = match direction.as_str() {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        d => return Err(op_err!("unknown direction '{d}'")),
    };
    let x = cx.input(0)?;
    let w = cx.input(1)?;
    if x.shape.len() != 3 || w.shape.len() != 3 {
        return Err(op_err!("X and W must have rank 3, got {:?} and {:?}", x.shape, w.shape));
    }
    let hidden = match a.contains("hidden_size") {
        true => a.int("hidden_size")?,
        false => (w.shape[1] / cell.gates) as i64,
    };
    let gates = usize::try_from(hidden).ok().and_then(|h| h.checked_mul(cell.gates));
    if hidden <= 0 || gates != Some(w.shape[1]) {
        return Err(op_err!(
            "W {:?} does not hold {} gates of hidden_size {hidden}",
            w.shape,
            cell.gates
        ));
    }
    let layout = a.int_or("layout", 0)?;
    let seq_len = x.shape[if layout == 0 { 0 } else { 1 }];

    // Activations: one list for all directions; a single direction's list is repeated.
    let names: Vec<String> = match a.get("activations") {
        None => cell.activations.iter().map(|s| s.to_string()).collect(),
        Some(AttrValue::Text(s)) => s.split(',').map(str::to_string).collect(),
        Some(_) => return Err(op_err!("activations must be a list of names")),
    };
    let per_dir = cell.activations.len();
    let names = match names.len() {
        n if n == per_dir * dirs => names,
        n if n == per_dir => names.iter().cycle().take(per_dir * dirs).cloned().collect(),
        n => {
            return Err(op_err!("expected {} activations, got {n}", per_dir * dirs));
        }
    };
    let alphas = a.floats_opt("activation_alpha")?.unwrap_or_default();
    let betas = a.floats_opt("activation_beta")?.unwrap_or_default();
    let (names, alphas, betas) = activations(&names, alphas, betas)?;

    let mut attrs = Attrs::new()
        .with("direction", AttrValue::Text(direction))
        .with("hidden_size", AttrValue::Int(hidden))
        .with("layout", AttrValue::Int(layout))
        .with("clip", AttrValue::Float(a.float_or("clip", f32::MAX)? as f64))
        .with("activations", AttrValue::Text(names.join(",")))
        .with("activation_alpha", AttrValue::Floats(alphas))
        .with("activation_beta", AttrValue::Floats(betas));
    if lstm {
        attrs.set("input_forget", flag(a.int_or("input_forget", 0)?));
    }
    if node.op == "GRU" {
        let lbr = a.int_or("linear_before_reset", 0)?;
        attrs.set("linear_before_reset", flag(lbr));
    }

    // Keep X, W, R and the present optional inputs; flag which they are.
    let mut inputs = node.inputs.iter().copied().take(3).collect::<Vec<_>>();
    for (k, name) in cell.optional.iter().enumerate() {
        let i = 3 + k;
        let mut present = cx.has_input(i);
        if *name == "has_sequence_lens" && present {
            // Lengths that are all the full sequence change nothing.
            if let Ok(Some(lens)) = cx.const_ints(i, "sequence_lens") {
                present = lens.iter().any(|&l| l != seq_len as i64);
            }
        }
        if present {
            inputs.push(node.inputs.get(i).copied().flatten());
        }
        attrs.set(name, flag(present as i64));
    }
    let most = 3 + cell.optional.len();
    if node.inputs.iter().skip(most).any(Option::is_some) {
        return Err(op_err!("{} takes at most {most} inputs", node.op));
    }
    if inputs.len() < 3 || inputs.iter().any(Option::is_none) {
        return Err(op_err!("X, W and R are required"));
    }
    node.inputs = inputs;
    node.attrs = attrs;
    Ok(())
}

fn flag(v: i64) -> AttrValue {
    AttrValue::Int((v != 0) as i64)
}

fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let cell = cell(&node.op)?;
    let a = &node.attrs;
    let x = inputs.first().ok_or_else(|| op_err!("X is required"))?;
    let [s0, s1, _] = x.shape[..] else {
        return Err(op_err!("X must have rank 3, got {:?}", x.shape));
    };
    let dirs = if a.text("direction")? == "bidirectional" { 2 } else { 1 };
    let hidden = a.int("hidden_size")? as usize;
    let n = node.outputs.len();
    if !(1..=cell.max_outputs).contains(&n) {
        return Err(op_err!("{} has 1 to {} outputs, got {n}", node.op, cell.max_outputs));
    }
    // Layout 0: X [seq, batch, input], Y [seq, dirs, batch, hidden], states [dirs, batch,
    // hidden]. Layout 1: X [batch, seq, input], Y [batch, seq, dirs, hidden], states [batch,
    // dirs, hidden].
    let (y, state) = if a.int("layout")? == 0 {
        (vec![s0, dirs, s1, hidden], vec![dirs, s1, hidden])
    } else {
        (vec![s0, s1, dirs, hidden], vec![s0, dirs, hidden])
    };
    Ok((0..n)
        .map(|i| TensorDesc::new(DType::F32, if i == 0 { y.clone() } else { state.clone() }))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Constant;
    use crate::Tensor;
    use std::sync::Arc;

    fn f32s(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape.to_vec())
    }

    #[test]
    fn lstm_defaults_and_optional_inputs() {
        // X [seq 5, batch 2, input 4], hidden 3: W [1, 12, 4], R [1, 12, 3], no B,
        // full-length constant sequence_lens, initial_h given, no initial_c, P given.
        let (x, w, r, h0, p) = (
            f32s(&[5, 2, 4]),
            f32s(&[1, 12, 4]),
            f32s(&[1, 12, 3]),
            f32s(&[1, 2, 3]),
            f32s(&[1, 9]),
        );
        let lens = Arc::new(Tensor::from_vec(vec![2], &[5i32, 5]).unwrap());
        let mut n = Node {
            name: "lstm".into(),
            op: "LSTM".into(),
            domain: String::new(),
            inputs: vec![Some(0), Some(1), Some(2), None, Some(4), Some(5), None, Some(7)],
            outputs: vec![8, 9],
            attrs: Attrs::new().with("activation_alpha", AttrValue::Floats(vec![])),
        };
        let cx = LowerCx {
            opset: 14,
            inputs: vec![
                Some(&x),
                Some(&w),
                Some(&r),
                None,
                Some(lens.desc()),
                Some(&h0),
                None,
                Some(&p),
            ],
            consts: vec![None, None, None, None, Some(&lens as &dyn Constant), None, None, None],
        };
        lower(&mut n, &cx).unwrap();
        assert_eq!(n.inputs, [Some(0), Some(1), Some(2), Some(5), Some(7)]);
        let a = &n.attrs;
        let flags: Vec<i64> =
            ["has_bias", "has_sequence_lens", "has_initial_h", "has_initial_c", "has_peepholes"]
                .iter()
                .map(|f| a.int(f).unwrap())
                .collect();
        assert_eq!(flags, [0, 0, 1, 0, 1]);
        assert_eq!(a.int("hidden_size").unwrap(), 3);
        assert_eq!(a.text("activations").unwrap(), "Sigmoid,Tanh,Tanh");
        assert_eq!(a.floats("activation_alpha").unwrap(), [0.0; 3]);
        assert_eq!(a.float("clip").unwrap(), f32::MAX);
        let out = infer(&n, &[&x, &w, &r, &h0, &p]).unwrap();
        assert_eq!(out, [f32s(&[5, 1, 2, 3]), f32s(&[1, 2, 3])]);
    }

    #[test]
    fn gru_bidirectional_activations_batch_major() {
        let (x, w, r) = (f32s(&[2, 5, 4]), f32s(&[2, 9, 4]), f32s(&[2, 9, 3]));
        let mut n = Node {
            name: "gru".into(),
            op: "GRU".into(),
            domain: String::new(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3, 4],
            attrs: Attrs::new()
                .with("direction", AttrValue::Text("bidirectional".into()))
                .with("layout", AttrValue::Int(1))
                .with("activations", AttrValue::Text("sigmoid,tanh,HardSigmoid,LeakyRelu".into()))
                .with("activation_alpha", AttrValue::Floats(vec![0.3]))
                .with("linear_before_reset", AttrValue::Int(1)),
        };
        let cx = LowerCx {
            opset: 14,
            inputs: vec![Some(&x), Some(&w), Some(&r)],
            consts: vec![None; 3],
        };
        lower(&mut n, &cx).unwrap();
        let a = &n.attrs;
        assert_eq!(a.text("activations").unwrap(), "Sigmoid,Tanh,HardSigmoid,LeakyRelu");
        // HardSigmoid takes the given alpha and the default beta, LeakyRelu the default alpha.
        assert_eq!(a.floats("activation_alpha").unwrap(), [0.0, 0.0, 0.3, 0.01]);
        assert_eq!(a.floats("activation_beta").unwrap(), [0.0, 0.0, 0.5, 0.0]);
        assert_eq!(a.int("linear_before_reset").unwrap(), 1);
        assert!(!a.contains("has_initial_c"));
        let out = infer(&n, &[&x, &w, &r]).unwrap();
        assert_eq!(out, [f32s(&[2, 5, 2, 3]), f32s(&[2, 2, 3])]);
    }

    #[test]
    fn rnn_repeats_one_direction_of_activations() {
        let (x, w, r) = (f32s(&[5, 2, 4]), f32s(&[2, 3, 4]), f32s(&[2, 3, 3]));
        let mut n = Node {
            name: "rnn".into(),
            op: "RNN".into(),
            domain: String::new(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3],
            attrs: Attrs::new()
                .with("direction", AttrValue::Text("bidirectional".into()))
                .with("activations", AttrValue::Text("Relu".into())),
        };
        let cx = LowerCx {
            opset: 11,
            inputs: vec![Some(&x), Some(&w), Some(&r)],
            consts: vec![None; 3],
        };
        lower(&mut n, &cx).unwrap();
        assert_eq!(n.attrs.text("activations").unwrap(), "Relu,Relu");
        let mut bad = n.clone();
        bad.attrs.set("activations", AttrValue::Text("Gelu".into()));
        assert!(lower(&mut bad, &cx).is_err());
    }
}
