//! Vulkan kernels of the recurrent layers (ops: ops/src/rnn/cpu.rs): LSTM, GRU and RNN in
//! float32, with every canonical attribute (direction, layout, clip, activations with their
//! alpha/beta, sequence lengths of int32 or int64, initial states, peepholes, input_forget,
//! linear_before_reset) and any of the outputs `Y`, `Y_h`, `Y_c`.
//!
//! Every step needs all of the previous hidden state and the ABI has no scratch memory, so one
//! workgroup runs one (batch entry, direction) through the time steps with the hidden state in
//! workgroup memory. Invocation `lid` owns the hidden units `lid, lid + WG, ...`: per step it
//! computes all the gates of its units (`x·Wᵀ` and `h·Rᵀ` in one pass each, every load of `x`
//! and `h` shared by the gates, four floats per loop iteration), then a barrier, then it stores
//! the new state over the old one (and into `Y`), then a barrier. An LSTM cell state never
//! leaves the invocation that owns its unit. GRU without `linear_before_reset` needs `r ⊙ h` of
//! every unit before the candidate, so its second phase does that product.
//!
//! One dispatch runs as many steps as fit in lavapipe's loop limit (a chunk; all of a short
//! sequence). A longer sequence takes several dispatches of the same module, the state carried
//! in the outputs: h in `Y_h`, or else in `Y` at the last step run; c in `Y_c`, or else in `Y` at
//! the next step to run (which that step overwrites). The chunk's first step cannot be a literal
//! without one module per chunk (each one JIT-compiled on lavapipe) and the push constants hold
//! only binding offsets, so the dispatch size carries it: chunk k runs `batch * dirs + k`
//! workgroups, reads `num_workgroups`, and the k extra ones return at once.

use crate::elementwise::vulkan::unary_expr;
use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, KernelCx, MAX_GROUPS, NoKernel, f32_lit, header};
use ingot_schema::DType;
use std::fmt::Write;

/// Loop iterations one invocation may run in one dispatch: lavapipe silently stops an
/// invocation after about 65535 in total.
const LOOP_BUDGET: usize = 32768;
/// Most invocations per workgroup (every Vulkan device takes 128).
const MAX_WORKGROUP: usize = 128;
/// Workgroup memory every Vulkan device has.
const WORKGROUP_BYTES: usize = 16384;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Lstm { input_forget: bool },
    Gru { linear_before_reset: bool },
    Rnn,
}

impl Cell {
    /// Gate blocks in W and R.
    fn gates(self) -> usize {
        match self {
            Cell::Lstm { .. } => 4,
            Cell::Gru { .. } => 3,
            Cell::Rnn => 1,
        }
    }

    /// Activation functions per direction.
    fn acts(self) -> usize {
        match self {
            Cell::Lstm { .. } => 3,
            Cell::Gru { .. } => 2,
            Cell::Rnn => 1,
        }
    }

    /// GRU that needs `r ⊙ h` of every unit before its candidate (a second dot product).
    fn reset_first(self) -> bool {
        self == Cell::Gru { linear_before_reset: false }
    }
}

/// Where each optional input sits among the canonical inputs.
#[derive(Clone, Copy, Debug, Default)]
struct Slots {
    bias: Option<usize>,
    lens: Option<usize>,
    h0: Option<usize>,
    c0: Option<usize>,
    peep: Option<usize>,
}

/// One layer as its kernel sees it.
struct Layer {
    cell: Cell,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    dirs: usize,
    /// `layout = 1`: `X`, `Y` and the states are batch-major.
    batch_major: bool,
    /// `direction = reverse`.
    reverse: bool,
    clip: Option<f32>,
    /// Per direction, the activations (f, g, h as the cell has them) as WGSL expressions of `v`.
    acts: Vec<Vec<String>>,
    slots: Slots,
    /// `sequence_lens` is int64 (read as pairs of u32).
    lens_i64: bool,
    /// How many of `Y`, `Y_h`, `Y_c` the step has.
    outputs: usize,
    /// Vector loads of X, W, R (their rows are whole 16-byte vectors).
    vec4: [bool; 3],
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let layer = Layer::new(cx)?;
    if layer.batch == 0 {
        return Ok(Vec::new()); // every output is empty
    }
    let steps = layer.steps_per_dispatch()?;
    let chunks = layer.seq.div_ceil(steps).max(1);
    let groups = layer.batch * layer.dirs;
    if groups + chunks - 1 > MAX_GROUPS as usize {
        return Err(no_kernel!(
            "{} with {groups} (batch entry, direction) pairs and {chunks} chunks",
            cx.op
        ));
    }
    let bindings = layer.bindings();
    let wgsl = layer.kernel(&bindings, steps);
    let label = format!(
        "{}_s{}_b{}_i{}_h{}_d{}",
        cx.op.to_lowercase(),
        layer.seq,
        layer.batch,
        layer.input,
        layer.hidden,
        layer.dirs
    );
    Ok((0..chunks)
        .map(|k| Dispatch {
            label: format!("{label}_chunk{k}"),
            wgsl: wgsl.clone(),
            groups: [(groups + k) as u32, 1, 1],
            bindings: bindings.clone(),
            ..Default::default()
        })
        .collect())
}

impl Layer {
    fn new(cx: &KernelCx) -> Result<Layer, NoKernel> {
        let a = cx.attrs;
        let int = |name: &str| a.int(name).map_err(|e| no_kernel!("{e}"));
        let flag = |name: &str| int(name).map(|v| v != 0);
        let cell = match cx.op {
            "LSTM" => Cell::Lstm { input_forget: flag("input_forget")? },
            "GRU" => Cell::Gru { linear_before_reset: flag("linear_before_reset")? },
            "RNN" => Cell::Rnn,
            op => return Err(no_kernel!("{op} is not a recurrent layer")),
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
        if cx.inputs.len() != next || !(1..=max_outputs).contains(&cx.outputs.len()) {
            return Err(no_kernel!(
                "{} with {} inputs and {} outputs",
                cx.op,
                cx.inputs.len(),
                cx.outputs.len()
            ));
        }
        if cx.in_place().is_some() {
            return Err(no_kernel!("{} in place", cx.op));
        }
        let inputs = cx.inputs.iter().enumerate();
        let dtypes = inputs.map(|(i, o)| (o, Some(i) == slots.lens));
        for (o, lens) in dtypes.chain(cx.outputs.iter().map(|o| (o, false))) {
            let ok = match lens {
                true => matches!(o.desc.dtype, DType::I32 | DType::I64),
                false => o.desc.dtype == DType::F32,
            };
            if !ok {
                return Err(cx.dtype(o.desc.dtype));
            }
        }
        let lens_i64 = slots.lens.is_some_and(|i| cx.inputs[i].desc.dtype == DType::I64);

        let (dirs, reverse) = match a.text("direction").map_err(|e| no_kernel!("{e}"))? {
            "forward" => (1, false),
            "reverse" => (1, true),
            "bidirectional" => (2, false),
            d => return Err(no_kernel!("{}: direction '{d}'", cx.op)),
        };
        let hidden = usize::try_from(int("hidden_size")?)
            .ok()
            .filter(|&h| h > 0)
            .ok_or_else(|| no_kernel!("{}: hidden_size must be positive", cx.op))?;
        let batch_major = match int("layout")? {
            0 => false,
            1 => true,
            l => return Err(no_kernel!("{}: layout {l}", cx.op)),
        };
        let clip = a.float("clip").map_err(|e| no_kernel!("{e}"))?;
        if clip.is_nan() || clip <= 0.0 {
            return Err(no_kernel!("{}: clip {clip}", cx.op));
        }

        let names: Vec<&str> =
            a.text("activations").map_err(|e| no_kernel!("{e}"))?.split(',').collect();
        let floats = |name| a.floats(name).map_err(|e| no_kernel!("{e}"));
        let (alphas, betas) = (floats("activation_alpha")?, floats("activation_beta")?);
        let per_dir = cell.acts();
        if names.len() != per_dir * dirs
            || alphas.len() != names.len()
            || betas.len() != names.len()
        {
            return Err(no_kernel!(
                "{}: {} activations, {} alphas and {} betas",
                cx.op,
                names.len(),
                alphas.len(),
                betas.len()
            ));
        }
        let acts = names
            .iter()
            .zip(alphas.iter().zip(betas))
            .map(|(name, (&alpha, &beta))| activation(name, alpha as f32, beta as f32))
            .collect::<Result<Vec<_>, _>>()?
            .chunks_exact(per_dir)
            .map(<[String]>::to_vec)
            .collect();

        let x = &cx.inputs[0].desc.shape;
        let [s0, s1, input] = x[..] else {
            return Err(no_kernel!("{}: X of shape {x:?}", cx.op));
        };
        let (seq, batch) = if batch_major { (s1, s0) } else { (s0, s1) };
        let layer = Layer {
            cell,
            seq,
            batch,
            input,
            hidden,
            dirs,
            batch_major,
            reverse,
            clip: (clip < f32::MAX).then_some(clip),
            acts,
            slots,
            lens_i64,
            outputs: cx.outputs.len(),
            vec4: [
                input.is_multiple_of(4) && cx.inputs[0].aligned16(),
                input.is_multiple_of(4) && cx.inputs[1].aligned16(),
                hidden.is_multiple_of(4) && cx.inputs[2].aligned16(),
            ],
        };
        layer.check_shapes(cx)?;
        if seq == 0 || input == 0 {
            return Err(no_kernel!("{} of empty X {x:?}", cx.op));
        }
        if layer.workgroup_bytes() > WORKGROUP_BYTES {
            return Err(no_kernel!(
                "{} of hidden_size {hidden} needs more workgroup memory than devices have",
                cx.op
            ));
        }
        Ok(layer)
    }

    /// Fails unless every operand has the shape the attributes and X give it.
    fn check_shapes(&self, cx: &KernelCx) -> Result<(), NoKernel> {
        let (d, b, h) = (self.dirs, self.batch, self.hidden);
        let gh = self.cell.gates() * h;
        let by_layout = |outer: usize, rest: usize| match self.batch_major {
            true => vec![b, outer, rest],
            false => vec![outer, b, rest],
        };
        let state = by_layout(d, h);
        let mut want = vec![
            (0, by_layout(self.seq, self.input)),
            (1, vec![d, gh, self.input]),
            (2, vec![d, gh, h]),
        ];
        let s = self.slots;
        let optional = [
            (s.bias, vec![d, 2 * gh]),
            (s.lens, vec![b]),
            (s.h0, state.clone()),
            (s.c0, state.clone()),
            (s.peep, vec![d, 3 * h]),
        ];
        want.extend(optional.into_iter().filter_map(|(i, w)| Some((i?, w))));
        let y = match self.batch_major {
            true => vec![b, self.seq, d, h],
            false => vec![self.seq, d, b, h],
        };
        let operands = want
            .iter()
            .map(|(i, w)| (&cx.inputs[*i], w))
            .chain(cx.outputs.iter().zip([&y, &state, &state]));
        for (o, w) in operands {
            if &o.desc.shape != w {
                return Err(no_kernel!(
                    "{}: an operand of shape {:?} where {w:?} was expected",
                    cx.op,
                    o.desc.shape
                ));
            }
        }
        Ok(())
    }

    fn workgroup_size(&self) -> usize {
        self.hidden.min(MAX_WORKGROUP).next_multiple_of(8)
    }

    /// Hidden units per invocation.
    fn units(&self) -> usize {
        self.hidden.div_ceil(self.workgroup_size())
    }

    fn workgroup_bytes(&self) -> usize {
        4 * self.hidden * if self.cell.reset_first() { 2 } else { 1 }
    }

    /// The most steps one dispatch may run within [`LOOP_BUDGET`]: per step, the step loop, two
    /// loops over the units, and for each unit the dot products' loops of 4 floats per turn.
    fn steps_per_dispatch(&self) -> Result<usize, NoKernel> {
        let (units, h4) = (self.units(), self.hidden / 4);
        let second = if self.cell.reset_first() { h4 } else { 0 };
        let per_step = 1 + units * (2 + self.input / 4 + h4 + second);
        let fixed = 2 * units + 16;
        match LOOP_BUDGET.saturating_sub(fixed) / per_step {
            0 => Err(no_kernel!(
                "one step of input {} and hidden {} exceeds the loop limit of one invocation",
                self.input,
                self.hidden
            )),
            n => Ok(n),
        }
    }

    fn bindings(&self) -> Vec<Binding> {
        let ty = |vec4: bool| if vec4 { "vec4<f32>" } else { "f32" };
        let mut b = vec![
            Binding::input("x", 0, ty(self.vec4[0])),
            Binding::input("w", 1, ty(self.vec4[1])),
            Binding::input("r", 2, ty(self.vec4[2])),
        ];
        let s = self.slots;
        let lens_ty = if self.lens_i64 { "u32" } else { "i32" };
        let optional = [
            ("bias", s.bias, "f32"),
            ("lens", s.lens, lens_ty),
            ("h0", s.h0, "f32"),
            ("c0", s.c0, "f32"),
            ("peep", s.peep, "f32"),
        ];
        for (name, slot, ty) in optional {
            if let Some(i) = slot {
                b.push(Binding::input(name, i, ty));
            }
        }
        for (k, name) in ["y", "yh", "yc"].iter().take(self.outputs).enumerate() {
            b.push(Binding::output(name, k, "f32"));
        }
        b
    }

    /// The module every chunk of the layer runs.
    fn kernel(&self, bindings: &[Binding], steps: usize) -> String {
        let (h, gh) = (self.hidden, self.cell.gates() * self.hidden);
        let (wg, units) = (self.workgroup_size(), self.units());
        let hw = Arr::workgroup("hw", h);
        let rh = Arr::workgroup("rh", h);
        let mut s = header(bindings);
        let _ = writeln!(s, "var<workgroup> hw: {};", hw.ty(h));
        if self.cell.reset_first() {
            let _ = writeln!(s, "var<workgroup> rh: {};", rh.ty(h));
        }
        s.push_str(&self.helpers());

        let dirs = self.dirs;
        let pairs = u(self.batch * dirs);
        let rev = match (self.reverse, dirs) {
            (true, _) => "true",
            (false, 2) => "d == 1u",
            (false, _) => "false",
        };
        let _ = write!(
            s,
            "
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) count: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    // Workgroups past one per (batch entry, direction) only count the chunk (see rnn.rs).
    if (wid.x >= {pairs}) {{ return; }}
    let chunk = count.x - {pairs};
    let b = wid.x / {dirs}u;
    let d = wid.x % {dirs}u;
    let rev = {rev};
    let len = {len};
    let s0 = chunk * {steps}u;
    let s1 = min(s0 + {steps}u, {seq}u);
    let st = state_at(d, b);
    let row = d * {gh}u;
",
            len = self.len_expr(),
            seq = self.seq,
        );
        let lstm = matches!(self.cell, Cell::Lstm { .. });
        let private = match (lstm, self.cell.reset_first()) {
            (true, _) => &["hn", "cs"][..],
            (_, true) => &["zs", "xs"],
            _ => &["hn"],
        };
        for p in private {
            let _ = writeln!(s, "    var {p}: array<f32, {units}>;");
        }

        // The state at step s0: the initial one, or what the previous chunk left.
        let state = |name: &str| format!("{name}[offsets.{name} + st + u]");
        let (mut decl, mut first, mut carry) =
            ("var hv = 0.0;\n".to_string(), String::new(), String::new());
        if self.slots.h0.is_some() {
            first += &format!("hv = {};\n", state("h0"));
        }
        if self.outputs >= 2 {
            carry += &format!("hv = {};\n", state("yh"));
        } else {
            carry += "if (s0 <= len) {\n    let tp = select(s0 - 1u, len - s0, rev);\n";
            carry += "    hv = y[offsets.y + y_at(tp, d, b) + u];\n}\n";
        }
        let mut store = format!("{};\n", hw.put("u", "hv"));
        if lstm {
            decl += "var cv = 0.0;\n";
            if self.slots.c0.is_some() {
                first += &format!("cv = {};\n", state("c0"));
            }
            if self.outputs >= 3 {
                carry += &format!("cv = {};\n", state("yc"));
            } else {
                carry += "if (s0 < len) {\n    let tn = select(s0, len - 1u - s0, rev);\n";
                carry += "    cv = y[offsets.y + y_at(tn, d, b) + u];\n}\n";
            }
            store += "cs[m] = cv;\n";
        }
        let branch = match first.is_empty() {
            true => format!("if (chunk != 0u) {{\n{}}}\n", indent(&carry, 1)),
            false => format!(
                "if (chunk == 0u) {{\n{}}} else {{\n{}}}\n",
                indent(&first, 1),
                indent(&carry, 1)
            ),
        };
        let load = format!("{decl}{branch}{store}");
        s += &each_unit(units, wg, h, "", &load, 1);
        s.push_str("    workgroupBarrier();\n");

        let _ = write!(
            s,
            "    for (var s = s0; s < s1; s++) {{
        let live = s < len;
        // The time index of step s (while live).
        let t = select(s, len - 1u - s, rev);
        let xr = x_row(t, b);
"
        );
        s += &each_unit(units, wg, h, "live && ", &self.first_phase(), 2);
        s.push_str("        workgroupBarrier();\n");
        let second = format!(
            "if (live) {{\n{}}} else {{\n    y[offsets.y + y_at(s, d, b) + u] = 0.0;\n}}\n",
            indent(&self.second_phase(), 1)
        );
        s += &each_unit(units, wg, h, "", &second, 2);
        s.push_str("        workgroupBarrier();\n    }\n");

        // The final state (zero for an empty sequence), which is also the carry to the next
        // chunk; without Y_c, an LSTM's cell state waits in Y where its next step will write.
        let mut fin = String::new();
        if self.outputs >= 2 {
            let _ = writeln!(s, "    let empty = s1 == {}u && len == 0u;", self.seq);
            let hv = hw.get("u");
            let _ = writeln!(fin, "yh[offsets.yh + st + u] = select({hv}, 0.0, empty);");
        }
        if self.outputs >= 3 {
            fin += "yc[offsets.yc + st + u] = select(cs[m], 0.0, empty);\n";
        } else if lstm {
            fin += "if (s1 < len) {\n    let tn = select(s1, len - 1u - s1, rev);\n";
            fin += "    y[offsets.y + y_at(tn, d, b) + u] = cs[m];\n}\n";
        }
        if !fin.is_empty() {
            s += &each_unit(units, wg, h, "", &fin, 1);
        }
        s.push_str("}\n");
        s
    }

    /// Per unit `u` (slot `m`), what reads the previous state: the gates, and the new state in
    /// `hn` (or GRU's `r ⊙ h` in `rh`).
    fn first_phase(&self) -> String {
        let (h, i) = (self.hidden, self.input);
        let gates = self.cell.gates();
        let x = Arr::storage("x", self.vec4[0]);
        let w = Arr::storage("w", self.vec4[1]);
        let r = Arr::storage("r", self.vec4[2]);
        let hw = Arr::workgroup("hw", h);
        // Accumulator k sums gate k; GRU keeps the candidate's x and h parts apart (a2, a3).
        let gru = matches!(self.cell, Cell::Gru { .. });
        let lbr = self.cell == Cell::Gru { linear_before_reset: true };
        let mut s = String::new();
        let bias = |g: usize, recurrent: bool| {
            let at = |k: usize| format!("bias[offsets.bias + d * {}u + {}u + u]", 2 * gates * h, k);
            match self.slots.bias {
                None => "0.0".to_string(),
                Some(_) if recurrent => at(gates * h + g * h),
                Some(_) => at(g * h),
            }
        };
        for g in 0..gates {
            // The candidate of GRU with linear_before_reset adds Rbh inside the reset product.
            let init = match (gru && g == 2, lbr) {
                (true, true) => bias(g, false),
                _ => format!("{} + {}", bias(g, false), bias(g, true)),
            };
            let init = init.replace("0.0 + 0.0", "0.0");
            let _ = writeln!(s, "var a{g} = {init};");
        }
        if lbr {
            let _ = writeln!(s, "var a3 = {};", bias(2, true));
        }
        let row = |g: usize, len: usize| format!("(row + {}u + u) * {len}u", g * h);
        let x_terms: Vec<(String, &Arr, String)> =
            (0..gates).map(|g| (format!("a{g}"), &w, row(g, i))).collect();
        s += &dot(i, (&x, "xr"), &x_terms);
        let h_terms: Vec<(String, &Arr, String)> = (0..gates)
            .filter(|&g| !(gru && g == 2) || lbr)
            .map(|g| {
                let acc = if gru && g == 2 { 3 } else { g };
                (format!("a{acc}"), &r, row(g, h))
            })
            .collect();
        s += &dot(h, (&hw, "0u"), &h_terms);

        let clip = |e: &str| match self.clip {
            Some(_) => format!("clip({e})"),
            None => e.to_string(),
        };
        let peep = |k: usize, c: &str| match self.slots.peep {
            Some(_) => format!(" + peep[offsets.peep + d * {}u + {}u + u] * {c}", 3 * h, k * h),
            None => String::new(),
        };
        match self.cell {
            Cell::Lstm { input_forget } => {
                // Gates i, o, f, c; peepholes i, o, f.
                s += "let cp = cs[m];\n";
                let _ =
                    writeln!(s, "let ig = act_f(d, {});", clip(&format!("a0{}", peep(0, "cp"))));
                if input_forget {
                    s += "let fg = 1.0 - ig;\n";
                } else {
                    let _ = writeln!(
                        s,
                        "let fg = act_f(d, {});",
                        clip(&format!("a2{}", peep(2, "cp")))
                    );
                }
                let _ = writeln!(s, "let cn = fg * cp + ig * act_g(d, {});", clip("a3"));
                let _ =
                    writeln!(s, "let og = act_f(d, {});", clip(&format!("a1{}", peep(1, "cn"))));
                s += "cs[m] = cn;\nhn[m] = og * act_h(d, cn);\n";
            }
            Cell::Gru { linear_before_reset } => {
                // Gates z, r, h.
                let _ = writeln!(s, "let z = act_f(d, {});", clip("a0"));
                let _ = writeln!(s, "let rg = act_f(d, {});", clip("a1"));
                if linear_before_reset {
                    let _ = writeln!(s, "let cand = act_g(d, {});", clip("a2 + rg * a3"));
                    let _ = writeln!(s, "hn[m] = (1.0 - z) * cand + z * {};", hw.get("u"));
                } else {
                    s += "zs[m] = z;\nxs[m] = a2;\n";
                    let rh = Arr::workgroup("rh", h);
                    let _ = writeln!(s, "{};", rh.put("u", &format!("rg * {}", hw.get("u"))));
                }
            }
            Cell::Rnn => {
                let _ = writeln!(s, "hn[m] = act_f(d, {});", clip("a0"));
            }
        }
        s
    }

    /// Per unit `u` of an active step: the new state over the old one, and into `Y`.
    fn second_phase(&self) -> String {
        let h = self.hidden;
        let hw = Arr::workgroup("hw", h);
        let mut s = String::new();
        let value = if self.cell.reset_first() {
            // The candidate's h part waits for every unit's r ⊙ h.
            let r = Arr::storage("r", self.vec4[2]);
            s += "var a2 = xs[m];\n";
            let terms = [("a2".to_string(), &r, format!("(row + {}u + u) * {h}u", 2 * h))];
            s += &dot(h, (&Arr::workgroup("rh", h), "0u"), &terms);
            let clip = match self.clip {
                Some(_) => "clip(a2)",
                None => "a2",
            };
            let _ =
                writeln!(s, "let hv = (1.0 - zs[m]) * act_g(d, {clip}) + zs[m] * {};", hw.get("u"));
            "hv"
        } else {
            "hn[m]"
        };
        let _ = writeln!(s, "{};", hw.put("u", value));
        let _ = writeln!(s, "y[offsets.y + y_at(t, d, b) + u] = {value};");
        s
    }

    /// The sequence length of batch entry `b`, within 0..=seq.
    fn len_expr(&self) -> String {
        let seq = self.seq;
        match (self.slots.lens, self.lens_i64) {
            (None, _) => format!("{seq}u"),
            (Some(_), false) => format!("u32(clamp(lens[offsets.lens + b], 0i, {seq}i))"),
            (Some(_), true) => format!(
                "select(select(min(lens[offsets.lens + 2u * b], {seq}u), {seq}u, \
                 bitcast<i32>(lens[offsets.lens + 2u * b + 1u]) > 0i), 0u, \
                 bitcast<i32>(lens[offsets.lens + 2u * b + 1u]) < 0i)"
            ),
        }
    }

    /// Index helpers, clip and the activations.
    fn helpers(&self) -> String {
        let (seq, batch, dirs, h, i) = (self.seq, self.batch, self.dirs, self.hidden, self.input);
        let (x_row, y_at, state_at) = match self.batch_major {
            true => (
                format!("(b * {seq}u + t) * {i}u"),
                format!("((b * {seq}u + t) * {dirs}u + d) * {h}u"),
                format!("(b * {dirs}u + d) * {h}u"),
            ),
            false => (
                format!("(t * {batch}u + b) * {i}u"),
                format!("((t * {dirs}u + d) * {batch}u + b) * {h}u"),
                format!("(d * {batch}u + b) * {h}u"),
            ),
        };
        let mut s = format!(
            "
fn x_row(t: u32, b: u32) -> u32 {{ return {x_row}; }}
fn y_at(t: u32, d: u32, b: u32) -> u32 {{ return {y_at}; }}
fn state_at(d: u32, b: u32) -> u32 {{ return {state_at}; }}
"
        );
        if let Some(c) = self.clip {
            let c = f32_lit(c);
            let _ = writeln!(s, "fn clip(v: f32) -> f32 {{ return clamp(v, -{c}, {c}); }}");
        }
        for (k, name) in ["f", "g", "h"].iter().take(self.cell.acts()).enumerate() {
            let body = match &self.acts[..] {
                [one] => format!("return {};", one[k]),
                [fw, bw] if fw[k] == bw[k] => format!("return {};", fw[k]),
                [fw, bw] => format!("if (d == 0u) {{ return {}; }}\n    return {};", fw[k], bw[k]),
                _ => unreachable!("one or two directions"),
            };
            let _ = writeln!(s, "fn act_{name}(d: u32, v: f32) -> f32 {{\n    {body}\n}}");
        }
        s
    }
}

/// The WGSL expression of an ONNX recurrent activation of `v` (names and parameters as
/// `ops/src/rnn/mod.rs` canonicalises them; formulas as ops/src/rnn/cpu.rs).
fn activation(name: &str, alpha: f32, beta: f32) -> Result<String, NoKernel> {
    let (a, b) = (f32_lit(alpha), f32_lit(beta));
    let unary = |op: &str, x: &str| unary_expr(op, x).ok_or_else(|| no_kernel!("{op}"));
    Ok(match name {
        "Sigmoid" | "Tanh" | "Softsign" | "Softplus" => unary(name, "v")?,
        "Relu" => "max(v, 0.0)".into(),
        "LeakyRelu" => format!("select({a} * v, v, v >= 0.0)"),
        "ThresholdedRelu" => format!("select(0.0, v, v > {a})"),
        "ScaledTanh" => format!("{a} * ({})", unary("Tanh", &format!("({b} * v)"))?),
        "HardSigmoid" => format!("clamp({a} * v + {b}, 0.0, 1.0)"),
        "Elu" => format!("select({a} * (exp(v) - 1.0), v, v >= 0.0)"),
        "Affine" => format!("{a} * v + {b}"),
        _ => return Err(no_kernel!("activation {name}")),
    })
}

/// A float array a dot product reads: a storage binding (indexed from its push-constant
/// offset) or workgroup memory, of f32 or of vec4 (then read only at multiples of 4).
struct Arr {
    name: &'static str,
    vec4: bool,
    storage: bool,
}

impl Arr {
    fn storage(name: &'static str, vec4: bool) -> Arr {
        Arr { name, vec4, storage: true }
    }

    /// A state array of `len` floats in workgroup memory, vec4 when it divides.
    fn workgroup(name: &'static str, len: usize) -> Arr {
        Arr { name, vec4: len.is_multiple_of(4), storage: false }
    }

    /// The WGSL type of a workgroup array of `len` floats.
    fn ty(&self, len: usize) -> String {
        match self.vec4 {
            true => format!("array<vec4<f32>, {}>", len / 4),
            false => format!("array<f32, {len}>"),
        }
    }

    /// The array index of float `at` (a multiple of 4 for vec4 arrays).
    fn index(&self, at: &str) -> String {
        let i = match self.vec4 {
            true => format!("({at}) / 4u"),
            false => at.to_string(),
        };
        match self.storage {
            true => format!("offsets.{} + {i}", self.name),
            false => i,
        }
    }

    /// Floats `4k .. 4k + 4` from array index `p` as a vec4.
    fn quad(&self, p: &str, k: &str) -> String {
        let n = self.name;
        match self.vec4 {
            true => format!("{n}[{p} + {k}]"),
            false => {
                let e: Vec<String> =
                    (0..4).map(|j| format!("{n}[{p} + 4u * {k} + {j}u]")).collect();
                format!("vec4<f32>({})", e.join(", "))
            }
        }
    }

    /// Float `j` from array index `p` of a scalar array.
    fn at(&self, p: &str, j: usize) -> String {
        format!("{}[{p} + {j}u]", self.name)
    }

    /// Float `i` of a workgroup array, to read.
    fn get(&self, i: &str) -> String {
        match self.vec4 {
            true => format!("{}[{i} / 4u][{i} % 4u]", self.name),
            false => format!("{}[{i}]", self.name),
        }
    }

    /// The statement that stores `v` as float `i` of a workgroup array.
    fn put(&self, i: &str, v: &str) -> String {
        format!("{} = {v}", self.get(i))
    }
}

/// `acc += Σ_j a[j] · b[j]` over `n` floats for each (acc, b, b's first float): one loop turn
/// per 4 floats, each load of `a` shared by every `b`, the remainder unrolled.
fn dot(n: usize, (a, a_at): (&Arr, &str), terms: &[(String, &Arr, String)]) -> String {
    let mut s = String::from("{\n");
    let _ = writeln!(s, "    let pa = {};", a.index(a_at));
    for (k, (_, b, at)) in terms.iter().enumerate() {
        let _ = writeln!(s, "    let p{k} = {};", b.index(at));
    }
    if n >= 4 {
        let _ = writeln!(s, "    for (var k = 0u; k < {}u; k++) {{", n / 4);
        let _ = writeln!(s, "        let q = {};", a.quad("pa", "k"));
        for (k, (acc, b, _)) in terms.iter().enumerate() {
            let _ = writeln!(s, "        {acc} += dot(q, {});", b.quad(&format!("p{k}"), "k"));
        }
        s.push_str("    }\n");
    }
    // A remainder means n % 4 != 0, so every array is scalar.
    for j in n / 4 * 4..n {
        for (k, (acc, b, _)) in terms.iter().enumerate() {
            let _ = writeln!(s, "    {acc} += {} * {};", a.at("pa", j), b.at(&format!("p{k}"), j));
        }
    }
    s.push_str("}\n");
    s
}

/// `body` for each hidden unit `u` this invocation owns (slot `m`), under `cond`, indented
/// `depth` levels.
fn each_unit(
    units: usize,
    wg: usize,
    hidden: usize,
    cond: &str,
    body: &str,
    depth: usize,
) -> String {
    let body =
        format!("let u = lid + m * {wg}u;\nif ({cond}u < {hidden}u) {{\n{}}}\n", indent(body, 1));
    let s = format!("for (var m = 0u; m < {units}u; m++) {{\n{}}}\n", indent(&body, 1));
    indent(&s, depth)
}

/// `text` with every line indented `depth` more levels.
fn indent(text: &str, depth: usize) -> String {
    let pad = "    ".repeat(depth);
    text.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// A u32 literal.
fn u(v: usize) -> String {
    format!("{v}u")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{DeviceClass, Operand, compile, lower_f32_all_classes};
    use ingot_schema::{AttrValue, Attrs};

    /// Canonical attributes with no optional input and `acts` for every direction.
    fn attrs(direction: &str, hidden: usize, acts: &str) -> Attrs {
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

    fn on(a: Attrs, flags: &[&str]) -> Attrs {
        flags.iter().fold(a, |a, f| a.with(f, AttrValue::Int(1)))
    }

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
                assert_eq!(d[0].bindings.len(), 3 + optional.len() + outputs);
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
            assert!(d[0].wgsl.contains("clip("));
            assert!(d[0].wgsl.contains("1.0 - ig"));
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
                    assert_eq!(d[0].wgsl.contains("var<workgroup> rh"), lbr == 0);
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
        for k in &d {
            compile(&k.wgsl, &[]).unwrap_or_else(|e| panic!("{e}\n{}", k.wgsl));
        }
        d
    }

    #[test]
    fn sequence_lengths_of_int32_and_int64() {
        let d = with_lengths(DType::I32);
        assert!(d[0].bindings.iter().any(|b| b.name == "lens" && b.ty == "i32"));
        let d = with_lengths(DType::I64);
        assert!(d[0].bindings.iter().any(|b| b.name == "lens" && b.ty == "u32"));
    }

    #[test]
    fn long_sequences_run_in_chunks_of_one_module() {
        let a = attrs("bidirectional", 256, "Sigmoid,Tanh,Tanh,Sigmoid,Tanh,Tanh");
        let s = shapes((300, 3, 256, 256, 2, 4), &[], 3);
        let d = lower_all("LSTM", &a, &s, 0);
        let cpu = &d[..d.len() / 2];
        assert!(cpu.len() > 2, "{} chunks", cpu.len());
        for (k, c) in cpu.iter().enumerate() {
            assert_eq!(c.wgsl, cpu[0].wgsl);
            assert_eq!(c.groups, [6 + k as u32, 1, 1]);
        }
        // Each invocation stays within the loop budget: 2 units, 64 + 64 quads per unit.
        let layer_steps = LOOP_BUDGET / (1 + 2 * (2 + 64 + 64));
        assert_eq!(cpu.len(), 300usize.div_ceil(layer_steps));
        assert!(cpu[0].wgsl.contains("cv = yc[") && cpu[0].wgsl.contains("hv = yh["));
        // Without Y_c (and Y_h) the states wait in Y between chunks.
        let d = lower_all("LSTM", &a, &shapes((300, 3, 256, 256, 2, 4), &[], 1), 0);
        assert!(d.len() > 2 && d[0].wgsl.contains("cv = y[") && d[0].wgsl.contains("hv = y["));
        let gru = attrs("forward", 256, "Sigmoid,Tanh");
        let d = lower_all("GRU", &gru, &shapes((300, 1, 256, 256, 1, 3), &[], 2), 0);
        assert!(d.len() > 2 && d[0].wgsl.contains("hv = yh["));
        let rnn = attrs("reverse", 512, "Tanh");
        let d = lower_all("RNN", &rnn, &shapes((300, 1, 512, 512, 1, 1), &[], 1), 0);
        assert!(d.len() > 2 && d[0].wgsl.contains("hv = y["));
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
