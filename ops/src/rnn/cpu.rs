//! Recurrent layers: LSTM, GRU and RNN, in float32.
//!
//! Canonical form (made by `ops/src/rnn/mod.rs`):
//! - inputs: `X`, `W`, `R`, then only the optional inputs that are present, in ONNX order:
//!   `B`, `sequence_lens` (int32 or int64), `initial_h`, and for LSTM `initial_c`, `P`. The
//!   flags `has_bias`, `has_sequence_lens`, `has_initial_h` (and for LSTM `has_initial_c`,
//!   `has_peepholes`) say which are there. An absent bias, initial state or peephole is zero;
//!   absent sequence lengths are all `seq_length`.
//! - attributes: `direction` (`forward`, `reverse`, `bidirectional`), `hidden_size`, `layout`
//!   (0: `X` is `[seq, batch, input]`; 1: `[batch, seq, input]`), `clip` (`f32::MAX` means no
//!   clip), `activations` (comma-separated ONNX names, `f,g,h` for LSTM, `f,g` for GRU, `f` for
//!   RNN, repeated for each direction), `activation_alpha`/`activation_beta` (one per
//!   activation, 0 where unused), `input_forget` (LSTM), `linear_before_reset` (GRU).
//! - outputs: the first one to three of `Y`, `Y_h`, `Y_c` (LSTM only); all are computed.
//!
//! Sequence lengths follow onnxruntime: batch entry `b` runs `lens[b]` steps (the reverse
//! direction starts at step `lens[b] - 1`), `Y` is zero past its end, and `Y_h`/`Y_c` hold the
//! state after its last step (zero when `lens[b] == 0`).

use crate::TensorDesc;
use crate::cpu::gemm::{Layout, gemm};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::rnn::layer::{Act, Cell, Layer, LayerError};
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let inputs: Vec<&TensorDesc> = cx.inputs.iter().collect();
    let outputs: Vec<&TensorDesc> = cx.outputs.iter().collect();
    match Layer::new(cx.op, cx.attrs, &inputs, &outputs) {
        Ok(layer) => Ok(Box::new(layer)),
        Err(LayerError::UnknownOp) => Err(KernelError::UnknownOp(cx.op.to_string())),
        Err(LayerError::DType(dtype)) => Err(cx.dtype_error(dtype)),
        Err(LayerError::Invalid(why)) => Err(KernelError::Invalid(why)),
    }
}

/// `c = a · bᵀ` for row-major `a` (m×k) and `b` (n×k), into the first `n` columns of the rows
/// of `c`, which are `ldc` apart.
fn gemm_abt(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
) -> Result<(), KernelError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if a.len() < m * k || b.len() < n * k || ldc < n || c.len() < (m - 1) * ldc + n {
        return Err(invalid!("gemm operands are too short for {m}x{k}x{n}"));
    }
    if k == 0 {
        c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
        return Ok(());
    }
    if m <= SMALL_M {
        // A recurrent step of a small batch is a few matrix-vector products: contiguous dot
        // products beat the GEMM library, which repacks all of `b` on every call.
        for (a, c) in a.chunks_exact(k).zip(c.chunks_mut(ldc)).take(m) {
            for (c, b) in c[..n].iter_mut().zip(b.chunks_exact(k)) {
                *c = dot(a, b);
            }
        }
        return Ok(());
    }
    gemm(
        1.0,
        a,
        Layout::row_major(m, k),
        b,
        Layout::new(k, n, 1, k),
        0.0,
        c,
        Layout::new(m, n, ldc, 1),
    )
}

/// Up to this many rows of `a`, `gemm_abt` computes dot products instead of calling the GEMM.
const SMALL_M: usize = 4;

/// `Σ a[i] * b[i]`, in eight independent sums so that it vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn add(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, x)| *a += x);
}

/// `acc += p * c`, a peephole term.
fn add_product(acc: &mut [f32], p: &[f32], c: &[f32]) {
    for ((a, p), c) in acc.iter_mut().zip(p).zip(c) {
        *a += p * c;
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<(), KernelError> {
    if got != want {
        return Err(invalid!("{what} has {got} elements, expected {want}"));
    }
    Ok(())
}

impl Kernel for Layer {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let d = self.dims;
        if d.batch == 0 {
            return Ok(()); // every output is empty
        }
        let gh = self.cell.gates() * d.hidden;
        let state_len = d.dirs * d.batch * d.hidden;
        let input = |i: usize, what: &str, len: usize| -> Result<&[f32], KernelError> {
            let s = inputs[i].as_slice::<f32>()?;
            check_len(what, s.len(), len)?;
            Ok(s)
        };
        let optional = |slot: Option<usize>, what: &str, len: usize| {
            slot.map(|i| input(i, what, len)).transpose()
        };
        let x = input(0, "X", d.seq * d.batch * d.input)?;
        let w = input(1, "W", d.dirs * gh * d.input)?;
        let r = input(2, "R", d.dirs * gh * d.hidden)?;
        let bias = optional(self.slots.bias, "B", d.dirs * 2 * gh)?;
        let h0 = optional(self.slots.h0, "initial_h", state_len)?;
        let c0 = optional(self.slots.c0, "initial_c", state_len)?;
        let peep = optional(self.slots.peep, "P", d.dirs * 3 * d.hidden)?;
        let lens = self.lens(inputs)?;

        let mut outs = outputs.iter_mut();
        let mut next = |len: usize| {
            outs.next()
                .map(|t| -> Result<&mut [f32], KernelError> {
                    let s = t.as_slice_mut::<f32>()?;
                    check_len("an output", s.len(), len)?;
                    Ok(s)
                })
                .transpose()
        };
        let mut y = next(d.seq * state_len)?;
        let mut y_h = next(state_len)?;
        let mut y_c = next(state_len)?;
        if let Some(y) = y.as_deref_mut() {
            // Steps past a sequence's end stay zero.
            y.fill(0.0);
        }

        for dir in 0..d.dirs {
            let mut st = DirState {
                dir,
                reverse: self.reverse || dir == 1,
                lens: &lens,
                xw: vec![0.0; d.seq * d.batch * gh],
                h: self.initial(h0, dir),
                c: self.initial(c0, dir),
                rec: vec![0.0; d.batch * gh],
            };
            gemm_abt(
                (d.seq * d.batch, d.input, gh),
                x,
                &w[dir * gh * d.input..][..gh * d.input],
                &mut st.xw,
                gh,
            )?;
            let b = bias.map(|b| &b[dir * 2 * gh..][..2 * gh]);
            if let Some(b) = b {
                let (wb, rb) = b.split_at(gh);
                let mut both: Vec<f32> = wb.iter().zip(rb).map(|(w, r)| w + r).collect();
                if let Cell::Gru { linear_before_reset: true } = self.cell {
                    // Rbh is added inside the reset gate's product (see `gru_step`).
                    both[2 * d.hidden..].copy_from_slice(&wb[2 * d.hidden..]);
                }
                st.xw.chunks_exact_mut(gh).for_each(|row| add(row, &both));
            }
            let r = &r[dir * gh * d.hidden..][..gh * d.hidden];
            let acts = self.acts[dir];
            for s in 0..d.seq {
                match self.cell {
                    Cell::Lstm { input_forget } => {
                        let p = peep.map(|p| &p[dir * 3 * d.hidden..][..3 * d.hidden]);
                        self.lstm_step(&mut st, s, r, p, acts, input_forget, y.as_deref_mut())?
                    }
                    Cell::Gru { linear_before_reset } => {
                        let rbh = match (linear_before_reset, b) {
                            (true, Some(b)) => Some(&b[gh + 2 * d.hidden..][..d.hidden]),
                            _ => None,
                        };
                        self.gru_step(
                            &mut st,
                            s,
                            r,
                            rbh,
                            linear_before_reset,
                            acts,
                            y.as_deref_mut(),
                        )?
                    }
                    Cell::Rnn => self.rnn_step(&mut st, s, r, acts, y.as_deref_mut())?,
                }
            }
            // Final states; an empty sequence has zero ones.
            let finals = [(y_h.as_deref_mut(), &st.h), (y_c.as_deref_mut(), &st.c)];
            for (out, state) in finals {
                let Some(out) = out else { continue };
                for (b, row) in state.chunks_exact(d.hidden).enumerate() {
                    let dst = &mut out[d.state_at(dir, b)..][..d.hidden];
                    if lens[b] == 0 {
                        dst.fill(0.0);
                    } else {
                        dst.copy_from_slice(row);
                    }
                }
            }
        }
        Ok(())
    }
}

/// One direction's running state.
struct DirState<'a> {
    dir: usize,
    reverse: bool,
    lens: &'a [usize],
    /// `X·Wᵀ` plus the biases that do not depend on the state, one row per `X` row.
    xw: Vec<f32>,
    /// Hidden and cell state, `[batch, hidden]`.
    h: Vec<f32>,
    c: Vec<f32>,
    /// `H·Rᵀ` of the current step, `[batch, gates * hidden]`.
    rec: Vec<f32>,
}

impl DirState<'_> {
    /// Per batch entry, the time step it processes at step `s`, if its sequence is that long.
    fn times(&self, s: usize) -> Vec<Option<usize>> {
        let at = |len: usize| (s < len).then(|| if self.reverse { len - 1 - s } else { s });
        self.lens.iter().map(|&len| at(len)).collect()
    }
}

impl Layer {
    /// Sequence lengths per batch entry, checked against `seq_length`.
    fn lens(&self, inputs: &[TensorRef]) -> Result<Vec<usize>, KernelError> {
        let d = self.dims;
        let Some(i) = self.slots.lens else {
            return Ok(vec![d.seq; d.batch]);
        };
        let t = &inputs[i];
        let raw: Vec<i64> = match t.dtype {
            DType::I32 => t.as_slice::<i32>()?.iter().map(|&v| v as i64).collect(),
            _ => t.as_slice::<i64>()?.to_vec(),
        };
        check_len("sequence_lens", raw.len(), d.batch)?;
        raw.iter()
            .map(|&l| {
                usize::try_from(l)
                    .ok()
                    .filter(|&l| l <= d.seq)
                    .ok_or_else(|| invalid!("sequence length {l} is outside 0..={}", d.seq))
            })
            .collect()
    }

    /// Direction `dir`'s initial state from `init` (`[batch, hidden]`), or zeros.
    fn initial(&self, init: Option<&[f32]>, dir: usize) -> Vec<f32> {
        let d = self.dims;
        let mut s = vec![0.0; d.batch * d.hidden];
        if let Some(init) = init {
            for (b, row) in s.chunks_exact_mut(d.hidden).enumerate() {
                row.copy_from_slice(&init[d.state_at(dir, b)..][..d.hidden]);
            }
        }
        s
    }

    fn clip(&self, xs: &mut [f32]) {
        let c = self.clip;
        if c < f32::MAX {
            xs.iter_mut().for_each(|x| *x = x.max(-c).min(c));
        }
    }

    /// Copies batch entry `b`'s new hidden state for time `t` of direction `dir` into `Y`.
    fn emit(&self, y: Option<&mut [f32]>, dir: usize, t: usize, b: usize, h: &[f32]) {
        if let Some(y) = y {
            y[self.dims.y_at(t, dir, b)..][..h.len()].copy_from_slice(h);
        }
    }

    /// Gates `i, o, f, c`; `p` holds the peepholes `i, o, f`.
    #[allow(clippy::too_many_arguments)]
    fn lstm_step(
        &self,
        st: &mut DirState,
        s: usize,
        r: &[f32],
        p: Option<&[f32]>,
        [f, g, h_act]: [Act; 3],
        input_forget: bool,
        mut y: Option<&mut [f32]>,
    ) -> Result<(), KernelError> {
        let d = self.dims;
        let hs = d.hidden;
        let gh = 4 * hs;
        let times = st.times(s);
        gemm_abt((d.batch, hs, gh), &st.h, r, &mut st.rec, gh)?;
        let rows = st.rec.chunks_exact_mut(gh);
        let states = st.h.chunks_exact_mut(hs).zip(st.c.chunks_exact_mut(hs));
        for (b, (gates, (h, c))) in rows.zip(states).enumerate() {
            let Some(t) = times[b] else { continue };
            add(gates, &st.xw[d.x_row(t, b) * gh..][..gh]);
            let (gi, rest) = gates.split_at_mut(hs);
            let (go, rest) = rest.split_at_mut(hs);
            let (gf, gc) = rest.split_at_mut(hs);
            if let Some(p) = p {
                add_product(gi, &p[..hs], c);
                add_product(gf, &p[2 * hs..], c);
            }
            self.clip(gi);
            f.apply(gi);
            if input_forget {
                gf.iter_mut().zip(gi.iter()).for_each(|(f, i)| *f = 1.0 - i);
            } else {
                self.clip(gf);
                f.apply(gf);
            }
            self.clip(gc);
            g.apply(gc);
            for (((c, f), i), g) in c.iter_mut().zip(&*gf).zip(&*gi).zip(&*gc) {
                *c = f * *c + i * g;
            }
            if let Some(p) = p {
                add_product(go, &p[hs..2 * hs], c);
            }
            self.clip(go);
            f.apply(go);
            gc.copy_from_slice(c);
            h_act.apply(gc);
            for ((h, o), v) in h.iter_mut().zip(&*go).zip(&*gc) {
                *h = o * v;
            }
            self.emit(y.as_deref_mut(), st.dir, t, b, h);
        }
        Ok(())
    }

    /// Gates `z, r, h`. With `linear_before_reset` the candidate is
    /// `g(Xh + r * (H·Rhᵀ + Rbh))` (`rbh` is `Rbh`); otherwise `g(Xh + (r * H)·Rhᵀ)`, with `Rbh`
    /// already in `xw`.
    #[allow(clippy::too_many_arguments)]
    fn gru_step(
        &self,
        st: &mut DirState,
        s: usize,
        r: &[f32],
        rbh: Option<&[f32]>,
        linear_before_reset: bool,
        [f, g, _]: [Act; 3],
        mut y: Option<&mut [f32]>,
    ) -> Result<(), KernelError> {
        let d = self.dims;
        let hs = d.hidden;
        let gh = 3 * hs;
        let times = st.times(s);
        // H·Rᵀ for z and r, and for h too when it does not wait for r.
        let first = if linear_before_reset { gh } else { 2 * hs };
        gemm_abt((d.batch, hs, first), &st.h, &r[..first * hs], &mut st.rec, gh)?;
        // (r * H), only needed without linear_before_reset.
        let mut reset_h = vec![0.0; if linear_before_reset { 0 } else { d.batch * hs }];
        for (b, gates) in st.rec.chunks_exact_mut(gh).enumerate() {
            let Some(t) = times[b] else { continue };
            let zr = &mut gates[..2 * hs];
            add(zr, &st.xw[d.x_row(t, b) * gh..][..2 * hs]);
            self.clip(zr);
            f.apply(zr);
            if !linear_before_reset {
                let dst = &mut reset_h[b * hs..][..hs];
                for ((o, r), h) in dst.iter_mut().zip(&zr[hs..]).zip(&st.h[b * hs..][..hs]) {
                    *o = r * h;
                }
            }
        }
        if !linear_before_reset {
            gemm_abt((d.batch, hs, hs), &reset_h, &r[2 * hs * hs..], &mut st.rec[2 * hs..], gh)?;
        }
        let rows = st.rec.chunks_exact_mut(gh).zip(st.h.chunks_exact_mut(hs));
        for (b, (gates, h)) in rows.enumerate() {
            let Some(t) = times[b] else { continue };
            let (zr, cand) = gates.split_at_mut(2 * hs);
            let (z, rg) = zr.split_at(hs);
            if linear_before_reset {
                for (i, (c, r)) in cand.iter_mut().zip(rg).enumerate() {
                    *c = r * (*c + rbh.map_or(0.0, |rb| rb[i]));
                }
            }
            add(cand, &st.xw[d.x_row(t, b) * gh + 2 * hs..][..hs]);
            self.clip(cand);
            g.apply(cand);
            for ((h, z), c) in h.iter_mut().zip(z).zip(&*cand) {
                *h = (1.0 - z) * c + z * *h;
            }
            self.emit(y.as_deref_mut(), st.dir, t, b, h);
        }
        Ok(())
    }

    fn rnn_step(
        &self,
        st: &mut DirState,
        s: usize,
        r: &[f32],
        [f, _, _]: [Act; 3],
        mut y: Option<&mut [f32]>,
    ) -> Result<(), KernelError> {
        let d = self.dims;
        let hs = d.hidden;
        let times = st.times(s);
        gemm_abt((d.batch, hs, hs), &st.h, r, &mut st.rec, hs)?;
        let rows = st.rec.chunks_exact_mut(hs).zip(st.h.chunks_exact_mut(hs));
        for (b, (gates, h)) in rows.enumerate() {
            let Some(t) = times[b] else { continue };
            add(gates, &st.xw[d.x_row(t, b) * hs..][..hs]);
            self.clip(gates);
            f.apply(gates);
            h.copy_from_slice(gates);
            self.emit(y.as_deref_mut(), st.dir, t, b, h);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::rnn::layer::{test_attrs as attrs, with_flags as on};
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    // Inputs and expected outputs come from this onnxruntime 1.31 script (its `data` is
    // mirrored by `data` below; onnxruntime has no layout=1, see case 2):
    // # Expected values for ops/src/rnn/cpu.rs tests, from onnxruntime.
    // import numpy as np, onnx, onnxruntime as ort
    // from onnx import helper, TensorProto
    //
    // def data(shape, salt):
    //     n = int(np.prod(shape))
    //     v = np.array([((i * 7 + salt) % 11) - 5 for i in range(n)], np.float32) / np.float32(10)
    //     return v.reshape(shape)
    //
    // def run(op, inputs, n_out, **attrs):
    //     names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    //     ins, feeds = [], {}
    //     for name, v in zip(names, inputs):
    //         if v is None:
    //             ins.append(""); continue
    //         ins.append(name); feeds[name] = v
    //     outs = ["Y", "Y_h", "Y_c"][:n_out]
    //     node = helper.make_node(op, ins, outs, **attrs)
    //     vi = lambda n, v: helper.make_tensor_value_info(n, TensorProto.INT32 if v.dtype == np.int32 else TensorProto.FLOAT, v.shape)
    //     g = helper.make_graph([node], "g", [vi(k, v) for k, v in feeds.items()],
    //                           [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    //     m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    //     s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    //     return s.run(None, feeds)
    //
    // def show(name, res):
    //     for o, v in zip(["y", "y_h", "y_c"], res):
    //         vals = ", ".join(np.format_float_positional(x, trim="0") for x in v.astype(np.float32).ravel())
    //         print(f"        // {name} {o} {list(v.shape)}\n        &[{vals}],")
    //
    // S, N, I, H = 3, 2, 2, 3
    // # 1. LSTM, bidirectional, every optional input, sequence lengths [3, 2].
    // show("lstm_bidi", run("LSTM", [data([S, N, I], 0), data([2, 4*H, I], 1), data([2, 4*H, H], 2), data([2, 8*H], 3),
    //     np.array([3, 2], np.int32), data([2, N, H], 4), data([2, N, H], 5), data([2, 3*H], 6)], 3,
    //     direction="bidirectional", hidden_size=H))
    // # 2. LSTM, batch-major, input_forget, clip 0.3, no optional inputs.
    // # onnxruntime has no layout=1: run layout 0 on the transposed input, transpose the outputs.
    // y, y_h, y_c = run("LSTM", [data([N, S, I], 0).transpose(1, 0, 2), data([1, 4*H, I], 1), data([1, 4*H, H], 2)], 3,
    //     hidden_size=H, input_forget=1, clip=0.3)
    // show("lstm_layout1", [y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)])
    // # 3. GRU, reverse, linear_before_reset=0, bias, lengths [1, 3], initial_h.
    // show("gru_reverse", run("GRU", [data([S, N, I], 0), data([1, 3*H, I], 1), data([1, 3*H, H], 2), data([1, 6*H], 3),
    //     np.array([1, 3], np.int32), data([1, N, H], 4)], 2, direction="reverse", hidden_size=H))
    // # 4. GRU, bidirectional, linear_before_reset=1, bias, HardSigmoid/LeakyRelu on the reverse direction.
    // show("gru_bidi_lbr", run("GRU", [data([S, N, I], 0), data([2, 3*H, I], 1), data([2, 3*H, H], 2), data([2, 6*H], 3)], 2,
    //     direction="bidirectional", hidden_size=H, linear_before_reset=1,
    //     activations=["Sigmoid", "Tanh", "HardSigmoid", "LeakyRelu"], activation_alpha=[0.3, 0.2], activation_beta=[0.6]))
    // # 5. RNN, forward, Relu, bias and initial_h.
    // show("rnn_relu", run("RNN", [data([S, N, I], 0), data([1, H, I], 1), data([1, H, H], 2), data([1, 2*H], 3), None,
    //     data([1, N, H], 4)], 2, hidden_size=H, activations=["Relu"]))

    fn data(shape: &[usize], salt: usize) -> Tensor {
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (((i * 7 + salt) % 11) as f32 - 5.0) / 10.0).collect();
        Tensor::from_vec(shape.to_vec(), &v).unwrap()
    }

    fn check(op: &str, attrs: &Attrs, inputs: &[Tensor], outs: &[&[usize]], want: &[&[f32]]) {
        let ins: Vec<&Tensor> = inputs.iter().collect();
        let descs: Vec<TensorDesc> =
            outs.iter().map(|s| TensorDesc::new(DType::F32, s.to_vec())).collect();
        let got = eval(op, attrs, &ins, &descs).unwrap();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let g = g.as_slice::<f32>().unwrap();
            assert_eq!(g.len(), w.len());
            for (a, b) in g.iter().zip(*w) {
                assert!((a - b).abs() < 1e-5, "output {i}: {g:?} vs {w:?}");
            }
        }
    }

    #[test]
    fn lstm_bidirectional_with_every_optional_input() {
        let a = on(
            attrs("bidirectional", 3, "Sigmoid,Tanh,Tanh,Sigmoid,Tanh,Tanh"),
            &["has_bias", "has_sequence_lens", "has_initial_h", "has_initial_c", "has_peepholes"],
        );
        let lens = Tensor::from_vec(vec![2], &[3i32, 2]).unwrap();
        let inputs = [
            data(&[3, 2, 2], 0),
            data(&[2, 12, 2], 1),
            data(&[2, 12, 3], 2),
            data(&[2, 24], 3),
            lens,
            data(&[2, 2, 3], 4),
            data(&[2, 2, 3], 5),
            data(&[2, 9], 6),
        ];
        #[rustfmt::skip]
        let want: [&[f32]; 3] = [
        // lstm_bidi y [3, 2, 2, 3]
        &[-0.027920857, -0.327042, 0.11246507, -0.20713471, -0.10708533, 0.12937313, 0.08910846, 0.3299732, -0.050395645, 0.09276246, 0.2933805, -0.10863898, -0.020244267, -0.22491905, 0.057346847, -0.16622338, 0.008061933, 0.08808232, 0.08799096, 0.31448203, 0.0054853903, 0.07087973, 0.25256127, 0.006526831, -0.09238019, -0.28187695, 0.09131011, 0.0, 0.0, 0.0, 0.04518712, 0.3013916, 0.0024355128, 0.0, 0.0, 0.0],
        // lstm_bidi y_h [2, 2, 3]
        &[-0.09238019, -0.28187695, 0.09131011, -0.16622338, 0.008061933, 0.08808232, 0.08910846, 0.3299732, -0.050395645, 0.09276246, 0.2933805, -0.10863898],
        // lstm_bidi y_c [2, 2, 3]
        &[-0.1991098, -0.436378, 0.24049929, -0.32025298, 0.0150762275, 0.2297951, 0.20026304, 0.7358028, -0.101778015, 0.20626771, 0.68750644, -0.21449636],
        ];
        check("LSTM", &a, &inputs, &[&[3, 2, 2, 3], &[2, 2, 3], &[2, 2, 3]], &want);
    }

    #[test]
    fn lstm_batch_major_with_coupled_gates_and_clip() {
        let a = attrs("forward", 3, "Sigmoid,Tanh,Tanh")
            .with("layout", AttrValue::Int(1))
            .with("input_forget", AttrValue::Int(1))
            .with("clip", AttrValue::Float(0.3));
        let inputs = [data(&[2, 3, 2], 0), data(&[1, 12, 2], 1), data(&[1, 12, 3], 2)];
        #[rustfmt::skip]
        let want: [&[f32]; 3] = [
        // lstm_layout1 y [2, 3, 1, 3]
        &[-0.027354065, -0.053454053, 0.05650381, -0.04712013, -0.053150516, 0.07121221, 0.0071558976, -0.01292053, 0.003719624, 0.010112283, 0.036466215, -0.041154444, -0.037061352, -0.016371071, 0.03588415, 0.015172821, -0.015136903, -0.010128471],
        // lstm_layout1 y_h [2, 1, 3]
        &[0.0071558976, -0.01292053, 0.003719624, 0.015172821, -0.015136903, -0.010128471],
        // lstm_layout1 y_c [2, 1, 3]
        &[0.01453251, -0.02866752, 0.0071686283, 0.032479607, -0.033622637, -0.01865368],
        ];
        check("LSTM", &a, &inputs, &[&[2, 3, 1, 3], &[2, 1, 3], &[2, 1, 3]], &want);
    }

    #[test]
    fn gru_reverse_with_short_sequences() {
        let a = on(
            attrs("reverse", 3, "Sigmoid,Tanh"),
            &["has_bias", "has_sequence_lens", "has_initial_h"],
        );
        let lens = Tensor::from_vec(vec![2], &[1i64, 3]).unwrap();
        let inputs = [
            data(&[3, 2, 2], 0),
            data(&[1, 9, 2], 1),
            data(&[1, 9, 3], 2),
            data(&[1, 18], 3),
            lens,
            data(&[1, 2, 3], 4),
        ];
        #[rustfmt::skip]
        let want: [&[f32]; 2] = [
        // gru_reverse y [3, 1, 2, 3]
        &[-0.08407147, -0.08503628, -0.0013694614, -0.15301384, 0.30980372, -0.37539706, 0.0, 0.0, 0.0, -0.032199934, 0.28786188, -0.4222725, 0.0, 0.0, 0.0, -0.09451148, 0.42307198, -0.25844213],
        // gru_reverse y_h [1, 2, 3]
        &[-0.08407147, -0.08503628, -0.0013694614, -0.15301384, 0.30980372, -0.37539706],
        ];
        check("GRU", &a, &inputs, &[&[3, 1, 2, 3], &[1, 2, 3]], &want);
    }

    #[test]
    fn gru_bidirectional_linear_before_reset_with_alpha_beta() {
        let a = on(
            attrs("bidirectional", 3, "Sigmoid,Tanh,HardSigmoid,LeakyRelu"),
            &["has_bias", "linear_before_reset"],
        )
        .with("activation_alpha", AttrValue::Floats(vec![0.0, 0.0, 0.3, 0.2]))
        .with("activation_beta", AttrValue::Floats(vec![0.0, 0.0, 0.6, 0.0]));
        let inputs =
            [data(&[3, 2, 2], 0), data(&[2, 9, 2], 1), data(&[2, 9, 3], 2), data(&[2, 18], 3)];
        #[rustfmt::skip]
        let want: [&[f32]; 2] = [
        // gru_bidi_lbr y [3, 2, 2, 3]
        &[-0.21691296, 0.18174869, -0.034909163, -0.176465, 0.17773777, 0.021808663, 0.07348576, -0.03810533, 0.39957, 0.034010038, -0.03913469, 0.49627203, -0.18974034, 0.16980195, -0.22780779, -0.1129719, 0.14207572, -0.15612926, 0.045683727, -0.012269003, 0.37234128, -0.020112295, 0.016310021, 0.4710386, -0.32060564, 0.25136915, -0.15538758, -0.1937495, 0.15176672, -0.3281719, 0.0769894, -0.029421603, 0.1254715, -0.011341761, 0.060133994, 0.245514],
        // gru_bidi_lbr y_h [2, 2, 3]
        &[-0.32060564, 0.25136915, -0.15538758, -0.1937495, 0.15176672, -0.3281719, 0.07348576, -0.03810533, 0.39957, 0.034010038, -0.03913469, 0.49627203],
        ];
        check("GRU", &a, &inputs, &[&[3, 2, 2, 3], &[2, 2, 3]], &want);
    }

    #[test]
    fn rnn_relu_with_bias_and_initial_state() {
        let a = on(attrs("forward", 3, "Relu"), &["has_bias", "has_initial_h"]);
        let inputs = [
            data(&[3, 2, 2], 0),
            data(&[1, 3, 2], 1),
            data(&[1, 3, 3], 2),
            data(&[1, 6], 3),
            data(&[1, 2, 3], 4),
        ];
        #[rustfmt::skip]
        let want: [&[f32]; 2] = [
        // rnn_relu y [3, 1, 2, 3]
        &[0.0, 0.71999997, 0.0, 0.0, 0.89, 0.14000002, 0.0, 1.2559999, 0.324, 0.0, 1.1129999, 0.33, 0.2524, 1.1343999, 0.14639997, 0.0, 1.4609, 0.3366],
        // rnn_relu y_h [1, 2, 3]
        &[0.2524, 1.1343999, 0.14639997, 0.0, 1.4609, 0.3366],
        ];
        check("RNN", &a, &inputs, &[&[3, 1, 2, 3], &[1, 2, 3]], &want);
        // Only Y asked for.
        check("RNN", &a, &inputs, &[&[3, 1, 2, 3]], &want[..1]);
    }

    #[test]
    fn a_large_batch_runs_like_its_rows_alone() {
        // Batches above SMALL_M take the GEMM path for the recurrent product; each row must
        // match the dot-product path on that row alone (checked against onnxruntime above).
        let a = on(attrs("forward", 3, "Sigmoid,Tanh"), &["has_bias"]);
        let (seq, batch) = (3, 6);
        let x = data(&[seq, batch, 2], 0);
        let (w, r, b) = (data(&[1, 9, 2], 1), data(&[1, 9, 3], 2), data(&[1, 18], 3));
        let y_desc = |n: usize| [TensorDesc::new(DType::F32, vec![seq, 1, n, 3])];
        let all = eval("GRU", &a, &[&x, &w, &r, &b], &y_desc(batch)).unwrap();
        let all = all[0].as_slice::<f32>().unwrap();
        let xs = x.as_slice::<f32>().unwrap();
        for row in 0..batch {
            let xr: Vec<f32> =
                (0..seq).flat_map(|t| xs[(t * batch + row) * 2..][..2].to_vec()).collect();
            let xr = Tensor::from_vec(vec![seq, 1, 2], &xr).unwrap();
            let one = eval("GRU", &a, &[&xr, &w, &r, &b], &y_desc(1)).unwrap();
            for (t, got) in one[0].as_slice::<f32>().unwrap().chunks(3).enumerate() {
                let want = &all[(t * batch + row) * 3..][..3];
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() < 1e-6, "row {row} step {t}: {got:?} vs {want:?}");
                }
            }
        }
    }

    #[test]
    fn bad_lengths_and_shapes_are_errors() {
        let a = on(attrs("forward", 3, "Tanh"), &["has_sequence_lens"]);
        let lens = Tensor::from_vec(vec![2], &[4i32, 1]).unwrap();
        let inputs = [data(&[3, 2, 2], 0), data(&[1, 3, 2], 1), data(&[1, 3, 3], 2), lens];
        let ins: Vec<&Tensor> = inputs.iter().collect();
        let out = [TensorDesc::new(DType::F32, vec![3, 1, 2, 3])];
        assert!(eval("RNN", &a, &ins, &out).is_err(), "length 4 > seq_length 3");
        let short = [TensorDesc::new(DType::F32, vec![3, 2, 3])];
        assert!(eval("RNN", &a, &ins, &short).is_err());
    }
}
