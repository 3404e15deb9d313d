//! A recurrent layer as both backends take it: the canonical attributes (made by
//! `ops/src/rnn/mod.rs`) parsed once, checked against the operands, typed.

use crate::TensorDesc;
use crate::elementwise::cpu::{exp_f32, tanh_f32};
use ingot_schema::{Attrs, DType};

/// What differs between LSTM, GRU and RNN cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    Lstm { input_forget: bool },
    Gru { linear_before_reset: bool },
    Rnn,
}

impl Cell {
    /// Gate blocks in W and R.
    pub fn gates(self) -> usize {
        match self {
            Cell::Lstm { .. } => 4,
            Cell::Gru { .. } => 3,
            Cell::Rnn => 1,
        }
    }

    /// Activation functions per direction.
    pub fn acts(self) -> usize {
        match self {
            Cell::Lstm { .. } => 3,
            Cell::Gru { .. } => 2,
            Cell::Rnn => 1,
        }
    }
}

/// The activation functions ONNX allows in recurrent layers, each with its CPU function
/// ([`Act::apply`]) and its WGSL expression (`Act::wgsl`, in `vulkan.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Act {
    Sigmoid,
    Tanh,
    Relu,
    LeakyRelu(f32),
    ThresholdedRelu(f32),
    ScaledTanh(f32, f32),
    HardSigmoid(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
    Affine(f32, f32),
}

impl Act {
    fn new(name: &str, alpha: f32, beta: f32) -> Option<Act> {
        Some(match name {
            "Sigmoid" => Act::Sigmoid,
            "Tanh" => Act::Tanh,
            "Relu" => Act::Relu,
            "LeakyRelu" => Act::LeakyRelu(alpha),
            "ThresholdedRelu" => Act::ThresholdedRelu(alpha),
            "ScaledTanh" => Act::ScaledTanh(alpha, beta),
            "HardSigmoid" => Act::HardSigmoid(alpha, beta),
            "Elu" => Act::Elu(alpha),
            "Softsign" => Act::Softsign,
            "Softplus" => Act::Softplus,
            "Affine" => Act::Affine(alpha, beta),
            _ => return None,
        })
    }

    /// Applies the function in place (one match per call, not per element), with the
    /// elementwise kernels' vectorisable exp and tanh.
    pub fn apply(self, xs: &mut [f32]) {
        fn each(xs: &mut [f32], f: impl Fn(f32) -> f32) {
            xs.iter_mut().for_each(|x| *x = f(*x));
        }
        match self {
            Act::Sigmoid => each(xs, |x| 1.0 / (1.0 + exp_f32(-x))),
            Act::Tanh => each(xs, tanh_f32),
            Act::Relu => each(xs, |x| x.max(0.0)),
            Act::LeakyRelu(a) => each(xs, |x| if x >= 0.0 { x } else { a * x }),
            Act::ThresholdedRelu(a) => each(xs, |x| if x > a { x } else { 0.0 }),
            Act::ScaledTanh(a, b) => each(xs, |x| a * tanh_f32(b * x)),
            Act::HardSigmoid(a, b) => each(xs, |x| (a * x + b).clamp(0.0, 1.0)),
            Act::Elu(a) => each(xs, |x| if x >= 0.0 { x } else { a * (exp_f32(x) - 1.0) }),
            Act::Softsign => each(xs, |x| x / (1.0 + x.abs())),
            Act::Softplus => each(xs, |x| if x > 20.0 { x } else { x.exp().ln_1p() }),
            Act::Affine(a, b) => each(xs, |x| a * x + b),
        }
    }
}

/// Static sizes of one layer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
    pub dirs: usize,
    /// `layout = 1`: batch-major `X`, `Y` and states.
    pub batch_major: bool,
}

impl Dims {
    /// Row of `X` (and of its projection) for step `t` of batch entry `b`.
    pub fn x_row(&self, t: usize, b: usize) -> usize {
        if self.batch_major { b * self.seq + t } else { t * self.batch + b }
    }

    /// Offset in `Y` of step `t`, direction `d`, batch entry `b`.
    pub fn y_at(&self, t: usize, d: usize, b: usize) -> usize {
        let i = if self.batch_major {
            (b * self.seq + t) * self.dirs + d
        } else {
            (t * self.dirs + d) * self.batch + b
        };
        i * self.hidden
    }

    /// Offset in `initial_h`, `Y_h` (and the `c` states) of direction `d`, batch entry `b`.
    pub fn state_at(&self, d: usize, b: usize) -> usize {
        let i = if self.batch_major { b * self.dirs + d } else { d * self.batch + b };
        i * self.hidden
    }

    fn x_shape(&self) -> Vec<usize> {
        self.by_layout(self.seq, self.batch, &[self.input])
    }

    fn y_shape(&self) -> Vec<usize> {
        let (s, d, b, h) = (self.seq, self.dirs, self.batch, self.hidden);
        if self.batch_major { vec![b, s, d, h] } else { vec![s, d, b, h] }
    }

    fn state_shape(&self) -> Vec<usize> {
        self.by_layout(self.dirs, self.batch, &[self.hidden])
    }

    /// `[outer, batch, rest..]`, or `[batch, outer, rest..]` when batch-major.
    fn by_layout(&self, outer: usize, batch: usize, rest: &[usize]) -> Vec<usize> {
        let mut s = if self.batch_major { vec![batch, outer] } else { vec![outer, batch] };
        s.extend_from_slice(rest);
        s
    }
}

/// Where each optional input sits among the canonical inputs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slots {
    pub bias: Option<usize>,
    pub lens: Option<usize>,
    pub h0: Option<usize>,
    pub c0: Option<usize>,
    pub peep: Option<usize>,
}

/// One layer: its cell, sizes and attributes.
#[derive(Clone, Debug)]
pub(crate) struct Layer {
    pub cell: Cell,
    pub dims: Dims,
    /// `direction = reverse`: the only direction runs backwards.
    pub reverse: bool,
    /// Per direction, the activations `[f, g, h]` (unused slots repeat `f`, then `g`).
    pub acts: Vec<[Act; 3]>,
    /// `f32::MAX` for no clipping.
    pub clip: f32,
    pub slots: Slots,
    /// How many of `Y`, `Y_h`, `Y_c` the step has (the Vulkan kernel binds that many).
    #[cfg_attr(not(feature = "wgsl"), allow(dead_code))]
    pub outputs: usize,
}

/// Why a step is not a layer either backend runs.
#[derive(Debug)]
pub(crate) enum LayerError {
    /// The op is not LSTM, GRU or RNN.
    UnknownOp,
    /// An operand of a type the layer does not take.
    DType(DType),
    Invalid(String),
}

macro_rules! invalid {
    ($($arg:tt)*) => { LayerError::Invalid(format!($($arg)*)) };
}

impl Layer {
    /// The layer of a canonical `op` step with these operands.
    pub fn new(
        op: &str,
        a: &Attrs,
        inputs: &[&TensorDesc],
        outputs: &[&TensorDesc],
    ) -> Result<Layer, LayerError> {
        let attr = |e: ingot_schema::AttrError| invalid!("{op}: {e}");
        let flag = |name: &str| a.int(name).map(|v| v != 0).map_err(attr);
        let cell = match op {
            "LSTM" => Cell::Lstm { input_forget: flag("input_forget")? },
            "GRU" => Cell::Gru { linear_before_reset: flag("linear_before_reset")? },
            "RNN" => Cell::Rnn,
            _ => return Err(LayerError::UnknownOp),
        };
        let lstm = matches!(cell, Cell::Lstm { .. });

        // The present optional inputs follow X, W, R in ONNX order.
        let mut next = 3;
        let mut slot = |present: bool| {
            present.then(|| {
                next += 1;
                next - 1
            })
        };
        let slots = Slots {
            bias: slot(flag("has_bias")?),
            lens: slot(flag("has_sequence_lens")?),
            h0: slot(flag("has_initial_h")?),
            c0: slot(lstm && flag("has_initial_c")?),
            peep: slot(lstm && flag("has_peepholes")?),
        };
        let max_outputs = if lstm { 3 } else { 2 };
        if inputs.len() != next || !(1..=max_outputs).contains(&outputs.len()) {
            return Err(invalid!(
                "{op} takes {next} inputs (by its has_* flags) and 1 to {max_outputs} outputs, got {} and {}",
                inputs.len(),
                outputs.len()
            ));
        }

        let (dirs, reverse) = match a.text("direction").map_err(attr)? {
            "forward" => (1, false),
            "reverse" => (1, true),
            "bidirectional" => (2, false),
            d => return Err(invalid!("{op}: unknown direction '{d}'")),
        };
        let hidden = usize::try_from(a.int("hidden_size").map_err(attr)?)
            .ok()
            .filter(|&h| h > 0)
            .ok_or_else(|| invalid!("{op}: hidden_size must be positive"))?;
        let batch_major = match a.int("layout").map_err(attr)? {
            0 => false,
            1 => true,
            l => return Err(invalid!("{op}: layout {l} is not 0 or 1")),
        };
        let clip = a.float("clip").map_err(attr)?;
        if clip.is_nan() || clip <= 0.0 {
            return Err(invalid!("{op}: clip must be positive, got {clip}"));
        }

        let names: Vec<&str> = a.text("activations").map_err(attr)?.split(',').collect();
        let alphas = a.floats("activation_alpha").map_err(attr)?;
        let betas = a.floats("activation_beta").map_err(attr)?;
        let per_dir = cell.acts();
        if names.len() != per_dir * dirs
            || alphas.len() != names.len()
            || betas.len() != names.len()
        {
            return Err(invalid!(
                "{op}: expected {} activations with as many alphas and betas, got {}, {} and {}",
                per_dir * dirs,
                names.len(),
                alphas.len(),
                betas.len()
            ));
        }
        let mut funcs = Vec::with_capacity(names.len());
        for ((name, &alpha), &beta) in names.iter().zip(alphas).zip(betas) {
            funcs.push(
                Act::new(name, alpha as f32, beta as f32)
                    .ok_or_else(|| invalid!("{op}: unknown activation '{name}'"))?,
            );
        }
        let acts = funcs
            .chunks_exact(per_dir)
            .map(|f| [f[0], f[per_dir.min(2) - 1], f[per_dir - 1]])
            .collect();

        let x = inputs[0];
        let &[s0, s1, input] = &x.shape[..] else {
            return Err(invalid!("{op}: X must have rank 3, got {:?}", x.shape));
        };
        let (seq, batch) = if batch_major { (s1, s0) } else { (s0, s1) };
        let dims = Dims { seq, batch, input, hidden, dirs, batch_major };
        let gh = cell
            .gates()
            .checked_mul(hidden)
            .ok_or_else(|| invalid!("{op}: hidden_size {hidden} is too large"))?;
        let expect = |i: Option<usize>, what: &str, shape: &[usize]| -> Result<(), LayerError> {
            let Some(i) = i else { return Ok(()) };
            let d = inputs[i];
            let dtype_ok = match what {
                "sequence_lens" => matches!(d.dtype, DType::I32 | DType::I64),
                _ => d.dtype == DType::F32,
            };
            if !dtype_ok {
                return Err(LayerError::DType(d.dtype));
            }
            if d.shape != shape {
                return Err(invalid!("{op}: {what} must have shape {shape:?}, got {:?}", d.shape));
            }
            Ok(())
        };
        expect(Some(0), "X", &dims.x_shape())?;
        expect(Some(1), "W", &[dirs, gh, input])?;
        expect(Some(2), "R", &[dirs, gh, hidden])?;
        expect(slots.bias, "B", &[dirs, 2 * gh])?;
        expect(slots.lens, "sequence_lens", &[batch])?;
        expect(slots.h0, "initial_h", &dims.state_shape())?;
        expect(slots.c0, "initial_c", &dims.state_shape())?;
        expect(slots.peep, "P", &[dirs, 3 * hidden])?;
        for (i, o) in outputs.iter().enumerate() {
            let want = if i == 0 { dims.y_shape() } else { dims.state_shape() };
            if o.dtype != DType::F32 || o.shape != want {
                return Err(invalid!(
                    "{op}: output {i} must be f32 {want:?}, is declared {} {:?}",
                    o.dtype,
                    o.shape
                ));
            }
        }
        Ok(Layer { cell, dims, reverse, acts, clip, slots, outputs: outputs.len() })
    }
}

/// For the backends' tests: canonical attributes of a layer with no optional input, `hidden`
/// units and the activations `acts` (every direction's, comma-separated, no alpha or beta).
#[cfg(test)]
pub(crate) fn test_attrs(direction: &str, hidden: usize, acts: &str) -> Attrs {
    use ingot_schema::AttrValue;
    let n = acts.split(',').count();
    let mut a = Attrs::new();
    for (k, v) in [
        ("direction", AttrValue::Text(direction.into())),
        ("hidden_size", AttrValue::Int(hidden as i64)),
        ("layout", AttrValue::Int(0)),
        ("clip", AttrValue::Float(f32::MAX as f64)),
        ("activations", AttrValue::Text(acts.into())),
        ("activation_alpha", AttrValue::Floats(vec![0.0; n])),
        ("activation_beta", AttrValue::Floats(vec![0.0; n])),
        ("has_bias", AttrValue::Int(0)),
        ("has_sequence_lens", AttrValue::Int(0)),
        ("has_initial_h", AttrValue::Int(0)),
        ("has_initial_c", AttrValue::Int(0)),
        ("has_peepholes", AttrValue::Int(0)),
        ("input_forget", AttrValue::Int(0)),
        ("linear_before_reset", AttrValue::Int(0)),
    ] {
        a.set(k, v);
    }
    a
}

/// `a` with the flags set to 1.
#[cfg(test)]
pub(crate) fn with_flags(a: Attrs, flags: &[&str]) -> Attrs {
    flags.iter().fold(a, |a, f| a.with(f, ingot_schema::AttrValue::Int(1)))
}
