//! Vulkan kernels of the recurrent layers (ops: ops/src/rnn/cpu.rs): LSTM, GRU and RNN in
//! float32, every canonical attribute, one module (`rnn.wgsl`, which says how it works) per
//! layer configuration. This file checks a layer against what the kernel takes, counts the steps
//! one dispatch may run and specialises the file.

use super::layer::{Act, Cell, Layer, LayerError};
use crate::TensorDesc;
use crate::elementwise::vulkan::unary_expr;
use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, KernelCx, MAX_GROUPS, NoKernel, Spec, Wgsl, f32_lit};
use ingot_schema::DType;

static RNN: Wgsl = crate::wgsl!("rnn/rnn.wgsl");

/// Loop iterations one invocation may run in one dispatch: lavapipe silently stops an
/// invocation after about 65535 in total.
const LOOP_BUDGET: usize = 32768;
/// Most invocations per workgroup (every Vulkan device takes 128).
const MAX_WORKGROUP: usize = 128;
/// Workgroup memory every Vulkan device has.
const WORKGROUP_BYTES: usize = 16384;

/// A layer as its kernel takes it.
struct Recurrence {
    layer: Layer,
    /// `sequence_lens` is int64 (read as pairs of words).
    lens_i64: bool,
    /// Vector loads of X, W, R (their rows are whole aligned 16-byte vectors).
    vec4: [bool; 3],
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let k = Recurrence::new(cx)?;
    let d = k.layer.dims;
    if d.batch == 0 {
        return Ok(Vec::new()); // every output is empty
    }
    let steps = k.steps_per_dispatch()?.min(d.seq);
    let chunks = d.seq.div_ceil(steps).max(1);
    let groups = d.batch * d.dirs;
    if groups + chunks - 1 > MAX_GROUPS as usize {
        return Err(no_kernel!(
            "{} with {groups} (batch entry, direction) pairs and {chunks} chunks",
            cx.op
        ));
    }
    let spec = k.spec()?;
    let (bindings, params) = (k.bindings(), k.params(steps));
    let label = format!(
        "{}_s{}_b{}_i{}_h{}_d{}",
        cx.op.to_lowercase(),
        d.seq,
        d.batch,
        d.input,
        d.hidden,
        d.dirs
    );
    (0..chunks)
        .map(|k| {
            let groups = [(groups + k) as u32, 1, 1];
            spec.dispatch(format!("{label}_chunk{k}"), groups, bindings.clone(), params.clone())
        })
        .collect()
}

impl Recurrence {
    fn new(cx: &KernelCx) -> Result<Recurrence, NoKernel> {
        let inputs: Vec<&TensorDesc> = cx.inputs.iter().map(|o| &o.desc).collect();
        let outputs: Vec<&TensorDesc> = cx.outputs.iter().map(|o| &o.desc).collect();
        let layer = Layer::new(cx.op, cx.attrs, &inputs, &outputs).map_err(|e| match e {
            LayerError::UnknownOp => no_kernel!("{} is not a recurrent layer", cx.op),
            LayerError::DType(dtype) => cx.dtype(dtype),
            LayerError::Invalid(why) => NoKernel(why),
        })?;
        if cx.in_place().is_some() {
            return Err(no_kernel!("{} in place", cx.op));
        }
        let d = layer.dims;
        if d.seq == 0 || d.input == 0 {
            return Err(no_kernel!("{} of empty X {:?}", cx.op, inputs[0].shape));
        }
        let lens_i64 = layer.slots.lens.is_some_and(|i| inputs[i].dtype == DType::I64);
        let vec4 = [
            d.input.is_multiple_of(4) && cx.inputs[0].aligned16(),
            d.input.is_multiple_of(4) && cx.inputs[1].aligned16(),
            d.hidden.is_multiple_of(4) && cx.inputs[2].aligned16(),
        ];
        let k = Recurrence { layer, lens_i64, vec4 };
        if k.workgroup_bytes() > WORKGROUP_BYTES {
            return Err(no_kernel!(
                "{} of hidden_size {} needs more workgroup memory than devices have",
                cx.op,
                d.hidden
            ));
        }
        Ok(k)
    }

    /// GRU that needs `r ⊙ h` of every unit before its candidate (a second dot product).
    fn reset_first(&self) -> bool {
        self.layer.cell == Cell::Gru { linear_before_reset: false }
    }

    fn workgroup_size(&self) -> usize {
        self.layer.dims.hidden.min(MAX_WORKGROUP).next_multiple_of(8)
    }

    /// Hidden units per invocation.
    fn units(&self) -> usize {
        self.layer.dims.hidden.div_ceil(self.workgroup_size())
    }

    /// The state (and GRU's r ⊙ h), each rounded up to whole vectors of 4 floats.
    fn workgroup_bytes(&self) -> usize {
        4 * self.layer.dims.hidden.next_multiple_of(4) * if self.reset_first() { 2 } else { 1 }
    }

    /// The most steps one dispatch may run within [`LOOP_BUDGET`]: per step, the step loop, two
    /// loops over the units, and for each unit the dot products' loops: one turn per 4 floats,
    /// then one per float left.
    fn steps_per_dispatch(&self) -> Result<usize, NoKernel> {
        let d = self.layer.dims;
        let turns = |n: usize| n / 4 + n % 4;
        let units = self.units();
        let second = if self.reset_first() { turns(d.hidden) } else { 0 };
        let per_step = 1 + units * (2 + turns(d.input) + turns(d.hidden) + second);
        let fixed = 2 * units + 16;
        match LOOP_BUDGET.saturating_sub(fixed) / per_step {
            0 => Err(no_kernel!(
                "one step of input {} and hidden {} exceeds the loop limit of one invocation",
                d.input,
                d.hidden
            )),
            n => Ok(n),
        }
    }

    /// Every slot up to the last one the layer uses, in `rnn.wgsl`'s order; an absent input's
    /// slot holds X again (never read).
    fn bindings(&self) -> Vec<Binding> {
        let s = self.layer.slots;
        let optional =
            [("bias", s.bias), ("lens", s.lens), ("h0", s.h0), ("c0", s.c0), ("peep", s.peep)];
        let mut b = vec![
            Binding::input("x", 0, vec_type(self.vec4[0])),
            Binding::input("w", 1, vec_type(self.vec4[1])),
            Binding::input("r", 2, vec_type(self.vec4[2])),
            Binding::output("y", 0, "f32"),
        ];
        let outputs = self.layer.outputs;
        let last = match outputs {
            1 => optional.iter().rposition(|(_, slot)| slot.is_some()).map_or(0, |k| k + 1),
            _ => optional.len(),
        };
        for &(name, slot) in &optional[..last] {
            let lens = slot.is_some() && slot == s.lens;
            b.push(Binding::input(name, slot.unwrap_or(0), if lens { "u32" } else { "f32" }));
        }
        for (k, name) in ["yh", "yc"].iter().enumerate().take(outputs - 1) {
            b.push(Binding::output(name, k + 1, "f32"));
        }
        b
    }

    /// `rnn.wgsl` specialised for the layer.
    fn spec(&self) -> Result<Spec, NoKernel> {
        let l = &self.layer;
        let (cell, input_forget, linear_before_reset) = match l.cell {
            Cell::Lstm { input_forget } => (0, input_forget, false),
            Cell::Gru { linear_before_reset } => (1, false, linear_before_reset),
            Cell::Rnn => (2, false, false),
        };
        let state = l.dims.hidden.next_multiple_of(4) as u32;
        let s = l.slots;
        let mut spec = Spec::new(&RNN)
            .alias("XT", vec_type(self.vec4[0]))
            .alias("WT", vec_type(self.vec4[1]))
            .alias("RT", vec_type(self.vec4[2]))
            .alias("Units", format!("array<f32, {}>", self.units()))
            .set("CELL", cell)
            .set("GATES", l.cell.gates() as u32)
            .set("INPUT_FORGET", input_forget)
            .set("LINEAR_BEFORE_RESET", linear_before_reset)
            .set("X_VEC", self.vec4[0])
            .set("W_VEC", self.vec4[1])
            .set("R_VEC", self.vec4[2])
            .set("WG", self.workgroup_size() as u32)
            .set("UNITS", self.units() as u32)
            .set("STATE", state)
            .set("RESET_STATE", if self.reset_first() { state } else { 4 })
            .set("HAS_BIAS", s.bias.is_some())
            .set("HAS_LENS", s.lens.is_some())
            .set("LENS_I64", self.lens_i64)
            .set("HAS_H0", s.h0.is_some())
            .set("HAS_C0", s.c0.is_some())
            .set("HAS_PEEP", s.peep.is_some())
            .set("OUTPUTS", l.outputs as u32)
            .set("BATCH_MAJOR", l.dims.batch_major)
            .set("REVERSE", l.reverse)
            .set("CLIP", l.clip < f32::MAX);
        for (k, name) in ["act_f", "act_g", "act_h"].into_iter().enumerate().take(l.cell.acts()) {
            let per_dir: Vec<String> =
                l.acts.iter().map(|a| a[k].wgsl("v")).collect::<Result<_, _>>()?;
            let body = match &per_dir[..] {
                [fw, bw] if fw != bw => {
                    format!("    if (d == 0u) {{\n        return {fw};\n    }}\n    return {bw};")
                }
                [one, ..] => format!("    return {one};"),
                [] => unreachable!("one or two directions"),
            };
            spec = spec.hook(name, format!("fn {name}(d: u32, v: f32) -> f32 {{\n{body}\n}}\n"));
        }
        Ok(spec)
    }

    /// The push-constant params after the offsets: seq, batch, input, hidden, dirs, steps per
    /// dispatch, clip.
    fn params(&self, steps: usize) -> Vec<u32> {
        let d = self.layer.dims;
        let sizes = [d.seq, d.batch, d.input, d.hidden, d.dirs, steps];
        let mut params: Vec<u32> = sizes.iter().map(|&v| v as u32).collect();
        params.push(self.layer.clip.to_bits());
        params
    }
}

fn vec_type(vec4: bool) -> &'static str {
    if vec4 { "vec4<f32>" } else { "f32" }
}

impl Act {
    /// The WGSL expression of the function of `v` (formulas as [`Act::apply`]).
    fn wgsl(self, v: &str) -> Result<String, NoKernel> {
        let unary = |op: &str, x: &str| unary_expr(op, x).ok_or_else(|| no_kernel!("{op}"));
        Ok(match self {
            Act::Sigmoid => unary("Sigmoid", v)?,
            Act::Tanh => unary("Tanh", v)?,
            Act::Softsign => unary("Softsign", v)?,
            Act::Softplus => unary("Softplus", v)?,
            Act::Relu => format!("max({v}, 0.0)"),
            Act::LeakyRelu(a) => format!("select({} * {v}, {v}, {v} >= 0.0)", f32_lit(a)),
            Act::ThresholdedRelu(a) => format!("select(0.0, {v}, {v} > {})", f32_lit(a)),
            Act::ScaledTanh(a, b) => {
                format!("{} * ({})", f32_lit(a), unary("Tanh", &format!("({} * {v})", f32_lit(b)))?)
            }
            Act::HardSigmoid(a, b) => {
                format!("clamp({} * {v} + {}, 0.0, 1.0)", f32_lit(a), f32_lit(b))
            }
            Act::Elu(a) => format!("select({} * (exp({v}) - 1.0), {v}, {v} >= 0.0)", f32_lit(a)),
            Act::Affine(a, b) => format!("{} * {v} + {}", f32_lit(a), f32_lit(b)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::matmul::vulkan::tests::specialised;
    use crate::rnn::layer::{test_attrs as attrs, with_flags as on};
    use crate::vulkan::{DeviceClass, Operand, Slot, lower_f32_all_classes, valid};
    use ingot_schema::{AttrValue, Attrs};

    /// Shapes of a layer of `dirs` directions (layout 0): X, W, R, then B, initial_h,
    /// initial_c, P as `optional` asks (no sequence_lens), and the first `outputs` outputs.
    struct Shapes {
        inputs: Vec<Vec<usize>>,
        outputs: Vec<Vec<usize>>,
    }

    fn shapes(
        (seq, batch, input, hidden, dirs, gates): (usize, usize, usize, usize, usize, usize),
        optional: &[&str],
        outputs: usize,
    ) -> Shapes {
        let gh = gates * hidden;
        let state = vec![dirs, batch, hidden];
        let mut inputs =
            vec![vec![seq, batch, input], vec![dirs, gh, input], vec![dirs, gh, hidden]];
        for (flag, shape) in [
            ("has_bias", vec![dirs, 2 * gh]),
            ("has_initial_h", state.clone()),
            ("has_initial_c", state.clone()),
            ("has_peepholes", vec![dirs, 3 * hidden]),
        ] {
            if optional.contains(&flag) {
                inputs.push(shape);
            }
        }
        let y = vec![seq, dirs, batch, hidden];
        Shapes { inputs, outputs: [y, state.clone(), state].into_iter().take(outputs).collect() }
    }

    /// The value of override `name`.
    fn set(d: &Dispatch, name: &str) -> f64 {
        d.overrides.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name}")).1
    }

    /// What each slot binds.
    fn slots(d: &Dispatch) -> Vec<(&str, Slot)> {
        d.bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect()
    }

    #[test]
    fn the_family_is_one_file() {
        crate::vulkan::assert_all_files_listed("rnn", &[&RNN]);
    }

    /// Lowers and compiles for both classes (operands `skew` bytes off 16-byte alignment).
    fn lower_all(op: &str, a: &Attrs, s: &Shapes, skew: u64) -> Vec<Dispatch> {
        let ins: Vec<&[usize]> = s.inputs.iter().map(Vec::as_slice).collect();
        let outs: Vec<&[usize]> = s.outputs.iter().map(Vec::as_slice).collect();
        lower_f32_all_classes(lower, op, a, &ins, &outs, skew)
    }

    #[test]
    fn lstm_with_every_input_and_output_configuration() {
        let all = ["has_bias", "has_initial_h", "has_initial_c", "has_peepholes"];
        let acts = "Sigmoid,Tanh,Tanh";
        for (direction, dirs) in [("forward", 1), ("reverse", 1), ("bidirectional", 2)] {
            let names = vec![acts; dirs].join(",");
            for (optional, outputs) in [(&all[..], 3), (&[][..], 1), (&all[..2], 2)] {
                let a = on(attrs(direction, 3, &names), optional);
                let s = shapes((5, 2, 2, 3, dirs, 4), optional, outputs);
                let d = lower_all("LSTM", &a, &s, 0);
                // One chunk: the same module for both classes, one workgroup per pair.
                assert_eq!(d.len(), 2);
                assert_eq!(d[0].wgsl, d[1].wgsl);
                assert_eq!(d[0].groups, [2 * dirs as u32, 1, 1]);
                let bound = slots(&d[0]);
                assert_eq!(
                    bound[..4],
                    [
                        ("x", Slot::Input(0)),
                        ("w", Slot::Input(1)),
                        ("r", Slot::Input(2)),
                        ("y", Slot::Output(0))
                    ]
                );
                // Up to the last slot used; bias, h0 (and c0, peep) are inputs 3, 4 (5, 6).
                let want: &[(&str, Slot)] = match outputs {
                    3 => &[
                        ("bias", Slot::Input(3)),
                        ("lens", Slot::Input(0)),
                        ("h0", Slot::Input(4)),
                        ("c0", Slot::Input(5)),
                        ("peep", Slot::Input(6)),
                        ("yh", Slot::Output(1)),
                        ("yc", Slot::Output(2)),
                    ],
                    2 => &[
                        ("bias", Slot::Input(3)),
                        ("lens", Slot::Input(0)),
                        ("h0", Slot::Input(4)),
                        ("c0", Slot::Input(0)),
                        ("peep", Slot::Input(0)),
                        ("yh", Slot::Output(1)),
                    ],
                    _ => &[],
                };
                assert_eq!(bound[4..], *want);
                assert_eq!(d[0].params[..5], [5, 2, 2, 3, dirs as u32]);
                assert_eq!(set(&d[0], "REVERSE"), (direction == "reverse") as u8 as f64);
            }
        }
        let coupled = on(attrs("forward", 4, acts), &["has_peepholes"])
            .with("input_forget", AttrValue::Int(1))
            .with("clip", AttrValue::Float(0.5))
            .with("layout", AttrValue::Int(1));
        // Layout 1: X [batch, seq, input], Y [batch, seq, dirs, hidden], states [batch, dirs, hidden].
        let s = Shapes {
            inputs: vec![vec![2, 5, 8], vec![1, 16, 8], vec![1, 16, 4], vec![1, 12]],
            outputs: vec![vec![2, 5, 1, 4], vec![2, 1, 4], vec![2, 1, 4]],
        };
        for skew in [0, 4] {
            let d = lower_all("LSTM", &coupled, &s, skew);
            assert_eq!((set(&d[0], "CLIP"), set(&d[0], "INPUT_FORGET")), (1.0, 1.0));
            assert_eq!(set(&d[0], "BATCH_MAJOR"), 1.0);
            assert_eq!(d[0].params[6], 0.5f32.to_bits());
            // Input and hidden of 4k floats take vector loads when aligned.
            let vec4 = d[0].bindings.iter().filter(|b| b.ty == "vec4<f32>").count();
            assert_eq!(vec4, if skew == 0 { 3 } else { 0 });
        }
    }

    #[test]
    fn gru_both_reset_forms_and_rnn_every_activation() {
        for lbr in [0, 1] {
            for (direction, dirs) in [("reverse", 1), ("bidirectional", 2)] {
                let names = vec!["Sigmoid,Tanh"; dirs].join(",");
                let a = on(attrs(direction, 5, &names), &["has_bias", "has_initial_h"])
                    .with("linear_before_reset", AttrValue::Int(lbr));
                for outputs in [1, 2] {
                    let s = shapes((3, 2, 3, 5, dirs, 3), &["has_bias", "has_initial_h"], outputs);
                    let d = lower_all("GRU", &a, &s, 0);
                    // r ⊙ h waits in workgroup memory (5 floats: 8 with padding) without lbr.
                    assert_eq!(set(&d[0], "RESET_STATE"), if lbr == 0 { 8.0 } else { 4.0 });
                }
            }
        }
        let names = "Relu,Tanh,Sigmoid,LeakyRelu,ThresholdedRelu,ScaledTanh,HardSigmoid,Elu,\
                     Softsign,Softplus,Affine";
        for act in names.split(',') {
            let both = format!("{act},Tanh");
            let a = attrs("bidirectional", 4, &both)
                .with("activation_alpha", AttrValue::Floats(vec![0.5, 0.0]))
                .with("activation_beta", AttrValue::Floats(vec![0.25, 0.0]));
            let s = shapes((4, 1, 2, 4, 2, 1), &[], 2);
            let d = lower_all("RNN", &a, &s, 0);
            assert!(d[0].wgsl.contains("if (d == 0u)") != (act == "Tanh"), "{act}");
        }
        let bad = attrs("forward", 4, "Gelu");
        let s = shapes((4, 1, 2, 4, 1, 1), &[], 1);
        let cx_inputs: Vec<&[usize]> = s.inputs.iter().map(Vec::as_slice).collect();
        let ops: Vec<Operand> = cx_inputs
            .iter()
            .map(|s| Operand::arena(TensorDesc::new(DType::F32, s.to_vec()), 0))
            .collect();
        let out = [Operand::arena(TensorDesc::new(DType::F32, s.outputs[0].clone()), 4096)];
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "RNN",
            name: "n",
            attrs: &bad,
            inputs: &ops,
            outputs: &out,
        };
        assert!(lower(&cx).is_err());
    }

    /// An LSTM of `lens` sequence lengths of `dtype` with its Y and Y_h.
    fn with_lengths(dtype: DType) -> Vec<Dispatch> {
        let a = on(
            attrs("bidirectional", 3, "Sigmoid,Tanh,Tanh,Sigmoid,Tanh,Tanh"),
            &["has_sequence_lens"],
        );
        let f32s = |s: &[usize]| TensorDesc::new(DType::F32, s.to_vec());
        let descs = [
            f32s(&[4, 2, 2]),
            f32s(&[2, 12, 2]),
            f32s(&[2, 12, 3]),
            TensorDesc::new(dtype, vec![2]),
        ];
        let inputs: Vec<Operand> =
            descs.into_iter().enumerate().map(|(i, d)| Operand::weight(d, i as u64)).collect();
        let outputs =
            [Operand::arena(f32s(&[4, 2, 2, 3]), 0), Operand::arena(f32s(&[2, 2, 3]), 256)];
        let cx = KernelCx {
            class: DeviceClass::Gpu,
            op: "LSTM",
            name: "n",
            attrs: &a,
            inputs: &inputs,
            outputs: &outputs,
        };
        let d = lower(&cx).unwrap();
        valid(&d);
        d
    }

    #[test]
    fn sequence_lengths_of_int32_and_int64() {
        for (dtype, i64) in [(DType::I32, 0.0), (DType::I64, 1.0)] {
            let d = with_lengths(dtype);
            assert!(d[0].bindings.iter().any(|b| b.name == "lens" && b.slot == Slot::Input(3)));
            assert_eq!((set(&d[0], "HAS_LENS"), set(&d[0], "LENS_I64")), (1.0, i64));
        }
        insta::assert_snapshot!(
            "lstm_lengths_i64",
            specialised(&with_lengths(DType::I64)[0], &RNN)
        );
    }

    #[test]
    fn long_sequences_run_in_chunks_of_one_module() {
        let a = attrs("bidirectional", 256, "Sigmoid,Tanh,Tanh,Sigmoid,Tanh,Tanh");
        let s = shapes((300, 3, 256, 256, 2, 4), &[], 3);
        let d = lower_all("LSTM", &a, &s, 0);
        let cpu = &d[..d.len() / 2];
        assert!(cpu.len() > 2, "{} chunks", cpu.len());
        for (k, c) in cpu.iter().enumerate() {
            assert_eq!(
                (&c.wgsl, &c.overrides, &c.params),
                (&cpu[0].wgsl, &cpu[0].overrides, &cpu[0].params)
            );
            assert_eq!(c.groups, [6 + k as u32, 1, 1]);
        }
        // Each invocation stays within the loop budget: 2 units, 64 + 64 quads per unit.
        let layer_steps = LOOP_BUDGET / (1 + 2 * (2 + 64 + 64));
        assert_eq!(cpu.len(), 300usize.div_ceil(layer_steps));
        assert_eq!(cpu[0].params[5] as usize, layer_steps);
        // The states are carried in Y_h and Y_c, or without them in Y (rnn.wgsl).
        assert_eq!(set(&cpu[0], "OUTPUTS"), 3.0);
        let d = lower_all("LSTM", &a, &shapes((300, 3, 256, 256, 2, 4), &[], 1), 0);
        assert!(d.len() > 2 && set(&d[0], "OUTPUTS") == 1.0);
        let gru = attrs("forward", 256, "Sigmoid,Tanh");
        let d = lower_all("GRU", &gru, &shapes((300, 1, 256, 256, 1, 3), &[], 2), 0);
        // GRU takes a second pass over the state per step: 64 more turns.
        assert_eq!(d[0].params[5] as usize, LOOP_BUDGET / (1 + 2 * (2 + 3 * 64)));
        let rnn = attrs("reverse", 512, "Tanh");
        let d = lower_all("RNN", &rnn, &shapes((300, 1, 512, 512, 1, 1), &[], 1), 0);
        assert!(d.len() > 2 && set(&d[0], "UNITS") == 4.0);
    }

    #[test]
    fn hidden_states_beyond_workgroup_memory_have_no_kernel() {
        let a = attrs("forward", 4096, "Sigmoid,Tanh");
        let s = shapes((1, 1, 4, 4096, 1, 3), &[], 1);
        let inputs: Vec<Operand> = s
            .inputs
            .iter()
            .map(|s| Operand::weight(TensorDesc::new(DType::F32, s.clone()), 0))
            .collect();
        let outputs = [Operand::arena(TensorDesc::new(DType::F32, s.outputs[0].clone()), 0)];
        let cx = KernelCx {
            class: DeviceClass::Gpu,
            op: "GRU",
            name: "n",
            attrs: &a,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).unwrap_err().0.contains("workgroup memory"));
    }
}
