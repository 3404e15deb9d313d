//! Pooling over 1, 2 and 3 spatial dimensions: MaxPool (float32, int8, uint8, with optional
//! int64 argmax indices), AveragePool and LpPool (float32), and their Global forms.
//!
//! Max, sum and Lp sums are separable, so a window is reduced one dimension at a time: every
//! input row along W, then those rows along H, then planes along D. Each pass folds whole
//! rows, so it vectorises, and costs `kernel` operations per output instead of the
//! product of the kernel extents. `prepare` works out, per dimension and output position,
//! which taps land in the input; padding is never materialised. In ceil mode a window may
//! run past the end padding: those taps count for nothing, not even as padding. MaxPool with
//! Indices visits each window whole instead, to know where its maximum came from. Float Max
//! and Average pools of small windows (the 3x3 of most CNNs) take the flat path instead (see
//! [`Flat`]): a padded copy of the plane, reduced in long runs whatever its row width.

use crate::conv::cpu::{DIMS, FLAT_BLOCK, Padded, Window, fill_padded, fold_strided, span};
use crate::cpu::parallel::{for_each_chunk, with_scratch};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::cpu::{input_f32, output_mut};
use crate::invalid;
use crate::tensor::{Element, TensorMut, TensorRef};
use ingot_schema::DType;
use std::ops::Range;

/// Input floats a pooling task takes on (whole planes): enough to be worth handing to another
/// thread.
const PLANE_TASK_FLOATS: usize = 1 << 14;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "MaxPool" | "AveragePool" | "LpPool" => {
            let pool = Pool::new(cx)?;
            Ok(match pool.as_global() {
                Some(global) => Box::new(global),
                None => Box::new(pool),
            })
        }
        "GlobalMaxPool" | "GlobalAveragePool" | "GlobalLpPool" => Ok(Box::new(Global::new(cx)?)),
        "RoiAlign" => super::roi_align::prepare(cx),
        "MaxUnpool" => super::unpool::prepare(cx),
        op => Err(KernelError::UnknownOp(op.to_string())),
    }
}

#[derive(Clone, Copy, Debug)]
enum Reduce {
    Max,
    Average {
        include_pad: bool,
    },
    /// `(Σ|x|^p)^(1/p)`; padding adds nothing.
    Lp(i32),
}

impl Reduce {
    fn new(cx: &OpCx) -> Result<Self, KernelError> {
        Ok(match cx.op.trim_start_matches("Global") {
            "MaxPool" => Reduce::Max,
            "AveragePool" if cx.op == "AveragePool" => {
                Reduce::Average { include_pad: cx.attrs.int("count_include_pad")? != 0 }
            }
            "AveragePool" => Reduce::Average { include_pad: false },
            _ => {
                let p = cx.attrs.int("p")?;
                Reduce::Lp(
                    i32::try_from(p)
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| invalid!("{}: p = {p} must be positive", cx.op))?,
                )
            }
        })
    }

    /// What is summed for an input value (Average and Lp).
    fn term(self, v: f32) -> f32 {
        match self {
            Reduce::Lp(1) => v.abs(),
            Reduce::Lp(2) => v * v,
            Reduce::Lp(p) => v.abs().powi(p),
            _ => v,
        }
    }

    /// The result from the sum of terms (Average and Lp) over `count` taps.
    fn finish(self, sum: f32, count: f32) -> f32 {
        match self {
            Reduce::Lp(1) => sum,
            Reduce::Lp(2) => sum.sqrt(),
            Reduce::Lp(p) => sum.powf(1.0 / p as f32),
            _ => sum / count,
        }
    }
}

fn max_f32(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

/// `sums[q] = max or Σ of xp[q + taps[t]]` for the first `len` flat positions (at least one
/// block's worth are written; `xp` holds a block of the identity past its padded plane), in
/// blocks of [`FLAT_BLOCK`] kept in registers, the last moved back to end at `len`. Compiled
/// for the wider vector units too.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn reduce_flat(max: bool, xp: &[f32], taps: &[usize], sums: &mut [f32], len: usize) {
    #[inline(always)]
    fn block(
        xp: &[f32],
        taps: &[usize],
        j0: usize,
        f: impl Fn(f32, f32) -> f32,
        id: f32,
    ) -> [f32; FLAT_BLOCK] {
        let mut acc = [id; FLAT_BLOCK];
        for &off in taps {
            let xs: &[f32; FLAT_BLOCK] = xp[j0 + off..][..FLAT_BLOCK].try_into().unwrap();
            for (a, &x) in acc.iter_mut().zip(xs) {
                *a = f(*a, x);
            }
        }
        acc
    }
    let starts = (0..len.max(1)).step_by(FLAT_BLOCK).map(|j| j.min(len.saturating_sub(FLAT_BLOCK)));
    for j0 in starts {
        let acc = match max {
            true => block(xp, taps, j0, max_f32, f32::MIN),
            false => block(xp, taps, j0, |a, b| a + b, 0.0),
        };
        sums[j0..][..FLAT_BLOCK].copy_from_slice(&acc);
    }
}

/// The kernel taps of one output position along one dimension that land in the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Taps {
    /// Input position of the first tap inside the input.
    start: usize,
    /// Taps inside the input.
    count: usize,
    /// Taps inside the input or its padding.
    padded: usize,
}

struct Pool {
    win: Window,
    reduce: Reduce,
    dtype: DType,
    /// N * C.
    planes: usize,
    /// Per lifted dimension, per output position.
    taps: [Vec<Taps>; DIMS],
    /// Per tap along W that reaches the input: the output columns it reaches and its offset
    /// in the input row.
    cols: Vec<(Range<usize>, isize)>,
    /// Whether D is not pooled (kernel 1, stride 1, no padding): the H pass writes the output.
    flat_d: bool,
    /// AveragePool's divisor for each output position of a plane.
    divisors: Vec<f32>,
    /// MaxPool's Indices output: `Some(column_major)` when requested.
    indices: Option<bool>,
    /// The flat path, where it serves (see [`Flat`]).
    flat: Option<Flat>,
}

/// Max and Average pools of float32 planes, windows of at most [`FLAT_TAPS`] taps, no
/// Indices: each plane is copied into a plane padded with the reduction's identity and split
/// into its stride phases (the depthwise conv's [`Padded`]), and every output is reduced at
/// its flat position from taps at fixed offsets, in blocks that run the plane's length. The
/// separable passes' set-up per row and tap cost more than their sums on short rows
/// (shufflenet's 3x3 stride-2 pools over 28x28 and 14x14 planes ran at 2-5 ns an output).
#[derive(Clone, Debug)]
struct Flat {
    padded: Padded,
    /// Where each tap reads, from an output's own flat position.
    taps: Vec<usize>,
}

/// Windows past this many taps pool separably: one dimension at a time costs the sum of the
/// kernel's extents per output, flat the product.
const FLAT_TAPS: usize = 16;

impl Pool {
    fn new(cx: &OpCx) -> Result<Self, KernelError> {
        let n_out = if cx.op == "MaxPool" { cx.outputs.len().clamp(1, 2) } else { 1 };
        cx.expect_arity(1..=1, n_out)?;
        let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
        let dtype = x.dtype;
        let dtype_ok = match cx.op {
            "MaxPool" => matches!(dtype, DType::F32 | DType::I8 | DType::U8),
            _ => dtype == DType::F32,
        };
        if !dtype_ok || y.dtype != dtype {
            return Err(cx.dtype_error(if dtype_ok { y.dtype } else { dtype }));
        }
        let indices = match cx.outputs.get(1) {
            Some(i) if i.dtype != DType::I64 => return Err(cx.dtype_error(i.dtype)),
            Some(i) if i.shape != y.shape => {
                return Err(invalid!("MaxPool: Indices {:?} differ from Y {:?}", i.shape, y.shape));
            }
            Some(_) => Some(cx.attrs.int("storage_order")? != 0),
            None => None,
        };
        if x.shape.len() < 3 || y.shape.len() != x.shape.len() || y.shape[..2] != x.shape[..2] {
            return Err(invalid!(
                "{}: input {:?} and output {:?} do not match",
                cx.op,
                x.shape,
                y.shape
            ));
        }
        let kernel = cx
            .attrs
            .ints("kernel_shape")?
            .iter()
            .map(|&k| usize::try_from(k).ok())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid!("{}: kernel_shape must not be negative", cx.op))?;
        let win = Window::new(cx, &x.shape[2..], &kernel, &y.shape[2..])?;
        let ceil = cx.attrs.int("ceil_mode")? != 0;
        win.check_output(cx.op, |w, d| pooled_extent(w, d, ceil))?;
        let taps: [Vec<Taps>; DIMS] = std::array::from_fn(|d| {
            (0..win.output[d])
                .map(|o| {
                    let first = (o * win.strides[d]) as isize - win.pads_begin[d];
                    let inside = span(win.kernel[d], win.input[d], win.dilations[d], first);
                    let padded_len = win.input[d] as isize + win.pads_begin[d] + win.pads_end[d];
                    let padded = span(
                        win.kernel[d],
                        padded_len.max(0) as usize,
                        win.dilations[d],
                        (o * win.strides[d]) as isize,
                    );
                    Taps {
                        start: match inside.is_empty() {
                            true => 0,
                            false => (inside.start * win.dilations[d]).wrapping_add_signed(first),
                        },
                        count: inside.len(),
                        padded: padded.len(),
                    }
                })
                .collect()
        });
        let cols = (0..win.kernel[DIMS - 1])
            .map(|k| {
                let off = win.offset(DIMS - 1, k);
                let [_, _, ow] = win.output;
                (span(ow, win.input[DIMS - 1], win.strides[DIMS - 1], off), off)
            })
            .filter(|(range, _)| !range.is_empty())
            .collect();
        let flat_d = win.kernel[0] == 1
            && win.strides[0] == 1
            && win.pads_begin[0] == 0
            && win.output[0] == win.input[0];
        let reduce = Reduce::new(cx)?;
        let divisors = match reduce {
            Reduce::Average { include_pad } => {
                let n = |t: &Taps| if include_pad { t.padded } else { t.count };
                let [a, b, c] = &taps;
                a.iter()
                    .flat_map(|a| b.iter().flat_map(move |b| c.iter().map(move |c| (a, b, c))))
                    .map(|(a, b, c)| (n(a) * n(b) * n(c)) as f32)
                    .collect()
            }
            _ => Vec::new(),
        };
        let flat_reduce = matches!(reduce, Reduce::Max | Reduce::Average { .. });
        let flat =
            (flat_reduce && dtype == DType::F32 && indices.is_none() && win.taps() <= FLAT_TAPS)
                .then(|| Padded::new(&win))
                .map(|padded| Flat { padded, taps: padded.taps(&win) });
        Ok(Self {
            planes: x.shape[0] * x.shape[1],
            flat,
            reduce,
            dtype,
            taps,
            cols,
            flat_d,
            divisors,
            indices,
            win,
        })
    }

    /// The pool as a [`Global`] one when its one window is the whole input (a classifier's
    /// final 7x7 average): the separable path's per-row set-up cost ten times the sums.
    fn as_global(&self) -> Option<Global> {
        let w = &self.win;
        let whole = w.output == [1; DIMS]
            && w.kernel == w.input
            && w.dilations == [1; DIMS]
            && w.pads_begin == [0; DIMS]
            && w.pads_end == [0; DIMS];
        (whole && self.indices.is_none() && self.dtype == DType::F32).then(|| Global {
            reduce: self.reduce,
            planes: self.planes,
            plane: w.input_size(),
        })
    }

    /// Pools one plane with `f` from `id`, one dimension at a time through `h` (rows reduced
    /// along W) and `v` (planes reduced along H).
    fn separable<T: Copy>(
        &self,
        (xp, yp): (&[T], &mut [T]),
        id: T,
        f: impl Fn(T, T) -> T + Copy,
        (h, v): (&mut [T], &mut [T]),
    ) {
        let [depth, ih, iw] = self.win.input;
        let [_, oh, ow] = self.win.output;
        let [dd, dh, _] = self.win.dilations;
        let sw = self.win.strides[DIMS - 1];
        h.fill(id);
        for (xrow, hrow) in xp.chunks_exact(iw).zip(h.chunks_exact_mut(ow)) {
            for (range, off) in &self.cols {
                let start = (range.start * sw).wrapping_add_signed(*off);
                fold_strided(&mut hrow[range.clone()], &xrow[start..], sw, f);
            }
        }
        let planes: &mut [T] = if self.flat_d { &mut *yp } else { &mut *v };
        for (z, plane) in planes.chunks_exact_mut(oh * ow).take(depth).enumerate() {
            for (t, row) in self.taps[1].iter().zip(plane.chunks_exact_mut(ow)) {
                row.fill(id);
                for i in 0..t.count {
                    let y = t.start + i * dh;
                    fold_strided(row, &h[(z * ih + y) * ow..][..ow], 1, f);
                }
            }
        }
        if !self.flat_d {
            for (t, plane) in self.taps[0].iter().zip(yp.chunks_exact_mut(oh * ow)) {
                plane.fill(id);
                for i in 0..t.count {
                    let z = t.start + i * dd;
                    fold_strided(plane, &v[z * oh * ow..][..oh * ow], 1, f);
                }
            }
        }
    }

    /// Scratch for [`Self::separable`].
    fn scratch<T: Copy>(&self, fill: T) -> (Vec<T>, Vec<T>) {
        let [depth, ih, _] = self.win.input;
        let [_, oh, ow] = self.win.output;
        let v = if self.flat_d { 0 } else { depth * oh * ow };
        (vec![fill; depth * ih * ow], vec![fill; v])
    }

    /// The [`Flat`] path: planes in parallel, a few at a time, as [`Self::run_float`] runs.
    fn run_flat(&self, flat: &Flat, x: &[f32], y: &mut [f32]) {
        let (ip, op) = (self.win.input_size().max(1), self.win.output_size().max(1));
        let [_, oh, ow] = self.win.output;
        let [_, p1, p2] = flat.padded.phase;
        let max = matches!(self.reduce, Reduce::Max);
        let id = if max { f32::MIN } else { 0.0 };
        let len = flat.padded.flat_len(&self.win);
        let per_task = (PLANE_TASK_FLOATS / ip).max(1);
        for_each_chunk(y, op * per_task, &|t, ys| {
            let xs = &x[t * ip * per_task..];
            // The identity past the padded plane, where a short plane's block reads.
            with_scratch(flat.padded.len() + FLAT_BLOCK, |xp: &mut [f32]| {
                // Only the interior changes from plane to plane.
                xp.fill(id);
                with_scratch(len.max(FLAT_BLOCK), |sums: &mut [f32]| {
                    for (xplane, yp) in xs.chunks_exact(ip).zip(ys.chunks_exact_mut(op)) {
                        fill_padded(flat.padded, &self.win, xplane, xp);
                        reduce_flat(max, xp, &flat.taps, &mut sums[..len.max(FLAT_BLOCK)], len);
                        for (r, yrow) in yp.chunks_exact_mut(ow).enumerate() {
                            let q = (r / oh * p1 + r % oh) * p2;
                            yrow.copy_from_slice(&sums[q..][..ow]);
                        }
                        if !max {
                            for (y, &d) in yp.iter_mut().zip(&self.divisors) {
                                *y = self.reduce.finish(*y, d);
                            }
                        }
                    }
                })
            })
        });
    }

    fn run_float(&self, x: &[f32], y: &mut [f32]) {
        if let Some(flat) = &self.flat {
            return self.run_flat(flat, x, y);
        }
        let (ip, op) = (self.win.input_size().max(1), self.win.output_size().max(1));
        let [depth, ih, _] = self.win.input;
        let [_, oh, ow] = self.win.output;
        let h_len = depth * ih * ow;
        let v_len = if self.flat_d { 0 } else { depth * oh * ow };
        let t_len = if matches!(self.reduce, Reduce::Lp(_)) { ip } else { 0 };
        // Planes in parallel, a few at a time; each task's scratch from its thread's.
        let per_task = (PLANE_TASK_FLOATS / ip).max(1);
        for_each_chunk(y, op * per_task, &|t, ys| {
            let xs = &x[t * ip * per_task..];
            with_scratch(h_len + v_len + t_len, |s: &mut [f32]| {
                s.fill(0.0);
                let (h, rest) = s.split_at_mut(h_len);
                let (v, terms) = rest.split_at_mut(v_len);
                for (xp, yp) in xs.chunks_exact(ip).zip(ys.chunks_exact_mut(op)) {
                    let scratch = (&mut *h, &mut *v);
                    match self.reduce {
                        Reduce::Max => self.separable((xp, yp), f32::MIN, max_f32, scratch),
                        Reduce::Average { .. } => {
                            self.separable((xp, &mut *yp), 0.0, |a, b| a + b, scratch);
                            for (y, &d) in yp.iter_mut().zip(&self.divisors) {
                                *y = self.reduce.finish(*y, d);
                            }
                        }
                        Reduce::Lp(_) => {
                            for (t, &v) in terms.iter_mut().zip(xp) {
                                *t = self.reduce.term(v);
                            }
                            self.separable((&*terms, &mut *yp), 0.0, |a, b| a + b, scratch);
                            for y in yp.iter_mut() {
                                *y = self.reduce.finish(*y, 0.0);
                            }
                        }
                    }
                }
            })
        });
    }

    fn run_max<T: Element + Ord>(&self, x: &[T], y: &mut [T], lowest: T) {
        let (ip, op) = (self.win.input_size(), self.win.output_size());
        let (mut h, mut v) = self.scratch(lowest);
        for (xp, yp) in x.chunks_exact(ip).zip(y.chunks_exact_mut(op)) {
            self.separable((xp, yp), lowest, Ord::max, (&mut h, &mut v));
        }
    }

    /// Calls `f(output index, window)` for every output position of a plane.
    fn windows(&self, mut f: impl FnMut(usize, [Taps; DIMS])) {
        let mut o = 0;
        for &a in &self.taps[0] {
            for &b in &self.taps[1] {
                for &c in &self.taps[2] {
                    f(o, [a, b, c]);
                    o += 1;
                }
            }
        }
    }

    /// The input-plane indices of the taps of `window` that lie inside the input.
    fn inputs(&self, window: [Taps; DIMS]) -> impl Iterator<Item = usize> + '_ {
        let [_, ih, iw] = self.win.input;
        let [dd, dh, dw] = self.win.dilations;
        let [a, b, c] = window;
        (0..a.count).flat_map(move |i| {
            (0..b.count).flat_map(move |j| {
                let row = ((a.start + i * dd) * ih + b.start + j * dh) * iw + c.start;
                (0..c.count).map(move |k| row + k * dw)
            })
        })
    }

    /// MaxPool with Indices: the flat index of each window's (first) maximum.
    fn run_indices<T: Element + PartialOrd>(
        &self,
        x: &[T],
        y: &mut [T],
        indices: &mut [i64],
        lowest: T,
    ) {
        let (ip, op) = (self.win.input_size(), self.win.output_size());
        let [id, ih, iw] = self.win.input;
        let column_major = self.indices == Some(true);
        let planes = x.chunks_exact(ip).zip(y.chunks_exact_mut(op));
        for (p, ((xp, yp), ind)) in planes.zip(indices.chunks_exact_mut(op)).enumerate() {
            self.windows(|o, w| {
                let (mut best, mut arg) = (lowest, None);
                for i in self.inputs(w) {
                    if arg.is_none() || xp[i] > best {
                        (best, arg) = (xp[i], Some(i));
                    }
                }
                yp[o] = best;
                ind[o] = arg.map_or(-1, |i| {
                    let i = if column_major {
                        // (z, y, x) -> z + y * D + x * D * H; unit lifted dims drop out.
                        i / (ih * iw) + (i / iw % ih) * id + (i % iw) * id * ih
                    } else {
                        i
                    };
                    (p * ip + i) as i64
                });
            });
        }
    }
}

/// The pooled output extent along lifted dimension `d`. In ceil mode the last window must
/// start inside the input or its left padding.
fn pooled_extent(w: &Window, d: usize, ceil: bool) -> Option<usize> {
    let room = w.input[d] as isize + w.pads_begin[d] + w.pads_end[d] - w.extent(d) as isize;
    if room < 0 {
        return None;
    }
    let (room, s) = (room as usize, w.strides[d]);
    if !ceil {
        return Some(room / s + 1);
    }
    let out = room.div_ceil(s) + 1;
    let last_start = ((out - 1) * s) as isize;
    Some(if last_start >= w.input[d] as isize + w.pads_begin[d] { out - 1 } else { out })
}

impl Kernel for Pool {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let xn = self.planes * self.win.input_size();
        let yn = self.planes * self.win.output_size();
        let x = inputs.first().ok_or_else(|| invalid!("input 0 is missing"))?;
        if x.elements() != xn {
            return Err(invalid!("input 0 has {} elements, expected {xn}", x.elements()));
        }
        if yn == 0 {
            return Ok(());
        }
        let (y, rest) = outputs.split_first_mut().ok_or_else(|| invalid!("output 0 is missing"))?;
        let y = std::slice::from_mut(y);
        if self.indices.is_some() {
            let ind = output_mut::<i64>(rest, 0, yn)?;
            match self.dtype {
                DType::I8 => self.run_indices(x.as_slice()?, output_mut(y, 0, yn)?, ind, i8::MIN),
                DType::U8 => self.run_indices(x.as_slice()?, output_mut(y, 0, yn)?, ind, u8::MIN),
                _ => self.run_indices(
                    input_f32(inputs, 0, xn)?,
                    output_mut(y, 0, yn)?,
                    ind,
                    f32::MIN,
                ),
            }
            return Ok(());
        }
        match self.dtype {
            DType::I8 => self.run_max(x.as_slice::<i8>()?, output_mut(y, 0, yn)?, i8::MIN),
            DType::U8 => self.run_max(x.as_slice::<u8>()?, output_mut(y, 0, yn)?, u8::MIN),
            _ => self.run_float(input_f32(inputs, 0, xn)?, output_mut(y, 0, yn)?),
        }
        Ok(())
    }
}

/// Folds `g(x)` for the `x` in `xs` with `f` from `id`, in 8 interleaved lanes so that it
/// vectorises (the lanes change the order of a float sum, as any vectorised reduction does).
fn lanes(xs: &[f32], id: f32, g: impl Fn(f32) -> f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [id; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = f(*a, g(v));
        }
    }
    let acc = acc.into_iter().fold(id, &f);
    rest.iter().fold(acc, |a, &v| f(a, g(v)))
}

/// GlobalMaxPool, GlobalAveragePool, GlobalLpPool: one value per (n, c) plane.
struct Global {
    reduce: Reduce,
    planes: usize,
    plane: usize,
}

impl Global {
    fn new(cx: &OpCx) -> Result<Self, KernelError> {
        cx.expect_arity(1..=1, 1)?;
        let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
        if x.dtype != DType::F32 || y.dtype != DType::F32 {
            return Err(cx.dtype_error(if x.dtype != DType::F32 { x.dtype } else { y.dtype }));
        }
        let ok = x.shape.len() >= 2
            && y.shape.len() == x.shape.len()
            && y.shape[..2] == x.shape[..2]
            && y.shape[2..].iter().all(|&d| d == 1);
        if !ok {
            return Err(invalid!(
                "{}: input {:?} and output {:?} do not match",
                cx.op,
                x.shape,
                y.shape
            ));
        }
        Ok(Self {
            reduce: Reduce::new(cx)?,
            planes: x.shape[0] * x.shape[1],
            plane: x.shape[2..].iter().product(),
        })
    }
}

impl Kernel for Global {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = input_f32(inputs, 0, self.planes * self.plane)?;
        let y = output_mut::<f32>(outputs, 0, self.planes)?;
        if self.plane == 0 {
            y.fill(match self.reduce {
                Reduce::Max => f32::MIN,
                r => r.finish(0.0, 0.0),
            });
            return Ok(());
        }
        let r = self.reduce;
        for (yv, xp) in y.iter_mut().zip(x.chunks_exact(self.plane)) {
            *yv = match r {
                Reduce::Max => lanes(xp, f32::MIN, |v| v, max_f32),
                _ => r.finish(lanes(xp, 0.0, |v| r.term(v), |a, b| a + b), self.plane as f32),
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::cpu::tests::ramp;
    use crate::cpu::eval;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs};

    // Expected values: onnxruntime 1.31 on `ramp` data (see `conv::tests::ramp` for the
    // script), e.g. run("MaxPool", [ramp((1,2,5,6),1)], kernel_shape=[3,2], strides=[2,2],
    // pads=[1,0,0,0], ceil_mode=1) with the Indices output requested.

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// Canonical window attributes with dilations 1 and floor mode unless changed.
    fn window(kernel: &[i64], strides: &[i64], pads: &[i64]) -> Attrs {
        Attrs::new()
            .with("kernel_shape", ints(kernel))
            .with("strides", ints(strides))
            .with("pads", ints(pads))
            .with("dilations", ints(&vec![1; kernel.len()]))
            .with("ceil_mode", AttrValue::Int(0))
    }

    fn f32_out(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape)
    }

    fn close(got: &[f32], expected: &[f32]) {
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!((g - e).abs() <= 1e-5, "element {i}: got {g}, expected {e}");
        }
    }

    #[test]
    fn max_pool_ceil_mode_with_indices_in_both_storage_orders() {
        let x = ramp(&[1, 2, 5, 6], 1);
        let values = [
            1.5, 1.25, 0.25, -0.5, 1.5, 0.75, -0.25, 1.5, 1.0, 0.25, -0.75, 1.5, 0.75, -0.25, 1.5,
            1.0, 0.0, 1.5,
        ];
        let row_major = [1, 8, 10, 18, 14, 22, 24, 27, 28, 36, 38, 40, 48, 50, 40, 54, 56, 53];
        let col_major = [5, 11, 21, 3, 12, 23, 4, 19, 24, 31, 41, 51, 33, 43, 51, 34, 44, 58];
        for (order, want) in [(0, row_major), (1, col_major)] {
            let a = window(&[3, 2], &[2, 2], &[1, 0, 0, 0])
                .with("ceil_mode", AttrValue::Int(1))
                .with("storage_order", AttrValue::Int(order));
            let outs = [f32_out(&[1, 2, 3, 3]), TensorDesc::new(DType::I64, vec![1, 2, 3, 3])];
            let out = eval("MaxPool", &a, &[&x], &outs).unwrap();
            close(out[0].as_slice().unwrap(), &values);
            assert_eq!(out[1].as_slice::<i64>().unwrap(), &want, "storage_order {order}");
        }
        // Without Indices the separable path runs: same values.
        let a = window(&[3, 2], &[2, 2], &[1, 0, 0, 0])
            .with("ceil_mode", AttrValue::Int(1))
            .with("storage_order", AttrValue::Int(0));
        let out = eval("MaxPool", &a, &[&x], &[f32_out(&[1, 2, 3, 3])]).unwrap();
        close(out[0].as_slice().unwrap(), &values);
        // Floor mode gives 2 rows, not 3: the output desc must say so.
        let a = window(&[3, 2], &[2, 2], &[1, 0, 0, 0]).with("storage_order", AttrValue::Int(0));
        assert!(eval("MaxPool", &a, &[&x], &[f32_out(&[1, 2, 3, 3])]).is_err());
        assert!(eval("MaxPool", &a, &[&x], &[f32_out(&[1, 2, 2, 3])]).is_ok());
    }

    #[test]
    fn max_pool_1d_dilated_and_uint8() {
        // run("MaxPool", [ramp((1,1,9),2)], kernel_shape=[3], dilations=[2], pads=[1,1])
        let a = window(&[3], &[1], &[1, 1])
            .with("dilations", ints(&[2]))
            .with("storage_order", AttrValue::Int(0));
        let out = eval("MaxPool", &a, &[&ramp(&[1, 1, 9], 2)], &[f32_out(&[1, 1, 7])]).unwrap();
        close(out[0].as_slice().unwrap(), &[0.75, 1.25, 0.75, 1.25, 0.75, 1.5, -0.25]);

        let x: [u8; 16] = [30, 10, 120, 100, 80, 60, 40, 20, 0, 110, 90, 70, 50, 30, 10, 120];
        let x = Tensor::from_vec(vec![1, 1, 4, 4], &x).unwrap();
        let a = window(&[2, 2], &[2, 2], &[0; 4]).with("storage_order", AttrValue::Int(0));
        let out = eval("MaxPool", &a, &[&x], &[TensorDesc::new(DType::U8, vec![1, 1, 2, 2])]);
        assert_eq!(out.unwrap()[0].as_slice::<u8>().unwrap(), &[80, 120, 110, 120]);
    }

    #[test]
    fn average_pool_ceil_mode_with_and_without_padding_in_the_count() {
        // run("AveragePool", [ramp((1,2,4,5),4)], kernel_shape=[3,3], strides=[2,2],
        //     pads=[1,1,1,1], count_include_pad=1 or 0, ceil_mode=1)
        let x = ramp(&[1, 2, 4, 5], 4);
        let include = [
            -0.16666667,
            -0.3888889,
            0.25,
            0.1388889,
            0.0,
            -0.1388889,
            -0.041666668,
            0.375,
            0.0,
            -0.2777778,
            -0.19444445,
            0.1388889,
            0.33333334,
            -0.25,
            -0.30555555,
            0.41666666,
            0.25,
            -0.083333336,
        ];
        let exclude = [
            -0.375,
            -0.5833333,
            0.5625,
            0.20833333,
            0.0,
            -0.20833333,
            -0.125,
            0.75,
            0.0,
            -0.625,
            -0.29166666,
            0.3125,
            0.5,
            -0.25,
            -0.45833334,
            1.25,
            0.5,
            -0.25,
        ];
        for (flag, want) in [(1, include), (0, exclude)] {
            let a = window(&[3, 3], &[2, 2], &[1, 1, 1, 1])
                .with("ceil_mode", AttrValue::Int(1))
                .with("count_include_pad", AttrValue::Int(flag));
            let out = eval("AveragePool", &a, &[&x], &[f32_out(&[1, 2, 3, 3])]).unwrap();
            close(out[0].as_slice().unwrap(), &want);
        }
    }

    #[test]
    fn average_pool_last_ceil_window_starting_in_the_padding_is_dropped() {
        // By hand (ONNX's test_averagepool_2d_ceil_last_window_starts_on_pad): 2x2 input,
        // kernel 3, stride 3, pads 1, ceil: ceil((2+2-3)/3)+1 = 2 windows, but the second
        // would start at 3 >= 2 + 1, so one window, averaging 4 values over 9 taps.
        let x = Tensor::from_vec(vec![1, 1, 2, 2], &[0.8580f32, 0.0786, 0.2692, 0.1537]).unwrap();
        let a = window(&[3, 3], &[3, 3], &[1, 1, 1, 1])
            .with("ceil_mode", AttrValue::Int(1))
            .with("count_include_pad", AttrValue::Int(1));
        let out = eval("AveragePool", &a, &[&x], &[f32_out(&[1, 1, 1, 1])]).unwrap();
        close(out[0].as_slice().unwrap(), &[(0.8580 + 0.0786 + 0.2692 + 0.1537) / 9.0]);
    }

    #[test]
    fn average_pool_3d_asymmetric_pads() {
        // run("AveragePool", [ramp((1,1,3,3,4),5)], kernel_shape=[2,2,3], strides=[1,2,1],
        //     pads=[0,1,1,1,0,0])
        let expected = [
            -0.25,
            -0.5,
            -0.45833334,
            0.0,
            0.020833334,
            0.0625,
            0.25,
            0.0,
            -0.5,
            0.09375,
            -0.020833334,
            0.020833334,
            0.5,
            0.25,
            -0.25,
            -0.0625,
            -0.041666668,
            0.0,
        ];
        let a = window(&[2, 2, 3], &[1, 2, 1], &[0, 1, 1, 1, 0, 0])
            .with("count_include_pad", AttrValue::Int(0));
        let x = ramp(&[1, 1, 3, 3, 4], 5);
        let out = eval("AveragePool", &a, &[&x], &[f32_out(&[1, 1, 3, 2, 3])]).unwrap();
        close(out[0].as_slice().unwrap(), &expected);
    }

    #[test]
    fn windows_wider_than_the_input() {
        // By hand: one value under a 3-wide window padded by 1 on both sides.
        let x = Tensor::from_vec(vec![1, 1, 1], &[-4.0f32]).unwrap();
        let a = window(&[3], &[1], &[1, 1])
            .with("storage_order", AttrValue::Int(0))
            .with("count_include_pad", AttrValue::Int(1));
        for (op, want) in [("MaxPool", -4.0), ("AveragePool", -4.0 / 3.0)] {
            let out = eval(op, &a, &[&x], &[f32_out(&[1, 1, 1])]).unwrap();
            close(out[0].as_slice().unwrap(), &[want]);
        }
    }

    #[test]
    fn lp_pool() {
        // run("LpPool", [ramp((1,2,4,4),6)], kernel_shape=[2,3], p=3, strides=[2,1],
        //     pads=[0,1,0,0]); run("LpPool", [same], kernel_shape=[2,2], p=2, strides=[2,2])
        let x = ramp(&[1, 2, 4, 4], 6);
        let p3 = [
            1.3572088, 1.5205505, 1.7046155, 1.3572088, 1.8171207, 1.9533473, 1.7931453, 2.0116508,
            2.0116508, 1.7651742, 1.9533473, 1.8171207,
        ];
        let a = window(&[2, 3], &[2, 1], &[0, 1, 0, 0]).with("p", AttrValue::Int(3));
        let out = eval("LpPool", &a, &[&x], &[f32_out(&[1, 2, 2, 3])]).unwrap();
        close(out[0].as_slice().unwrap(), &p3);
        let p2 = [
            1.5411035, 1.8371173, 1.5411035, 2.1213202, 2.1065373, 2.1065373, 2.1213202, 1.5411035,
        ];
        let a = window(&[2, 2], &[2, 2], &[0; 4]).with("p", AttrValue::Int(2));
        let out = eval("LpPool", &a, &[&x], &[f32_out(&[1, 2, 2, 2])]).unwrap();
        close(out[0].as_slice().unwrap(), &p2);
    }

    #[test]
    fn pools_with_one_window_over_the_whole_input_agree_with_the_window_path() {
        // A 5x6 window over a 5x6 input runs as a global pool; the same pool over a 5x7 input
        // with a 5x6 window at stride 2 (one output, the extra column unread) runs the
        // separable window path.
        let x = ramp(&[2, 3, 5, 6], 31);
        let wide = Tensor::from_vec(
            vec![2, 3, 5, 7],
            &x.as_slice::<f32>()
                .unwrap()
                .chunks(6)
                .flat_map(|row| [row, &[9.0]].concat())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let out = [f32_out(&[2, 3, 1, 1])];
        for (op, extra) in [
            ("AveragePool", ("count_include_pad", 1)),
            ("MaxPool", ("storage_order", 0)),
            ("LpPool", ("p", 2)),
        ] {
            let a = window(&[5, 6], &[1, 1], &[0; 4]).with(extra.0, AttrValue::Int(extra.1));
            let whole = eval(op, &a, &[&x], &out).unwrap();
            let a = window(&[5, 6], &[2, 2], &[0; 4]).with(extra.0, AttrValue::Int(extra.1));
            let windowed = eval(op, &a, &[&wide], &out).unwrap();
            close(whole[0].as_slice().unwrap(), windowed[0].as_slice().unwrap());
        }
    }

    #[test]
    fn flat_max_pools_agree_with_whole_windows() {
        // Without Indices a float MaxPool runs flat over a padded plane; with them it visits
        // each window whole. Strides 1-3, dilations, asymmetric pads, ceil mode, planes
        // shorter and longer than a block, 1-D and 3-D.
        for (shape, kernel, strides, dilations, pads, ceil) in [
            (vec![2, 3, 28, 28], vec![3, 3], vec![2, 2], vec![1, 1], vec![1, 1, 1, 1], 0),
            (vec![1, 2, 7, 9], vec![3, 2], vec![1, 3], vec![2, 1], vec![2, 0, 1, 1], 1),
            (vec![1, 2, 20, 20], vec![5, 1], vec![1, 1], vec![1, 1], vec![2, 0, 2, 0], 0),
            (vec![1, 2, 5, 5], vec![2, 2], vec![2, 2], vec![1, 1], vec![0, 0, 0, 0], 1),
            (vec![1, 4, 100], vec![4], vec![3], vec![2], vec![3, 1], 1),
            (vec![1, 2, 4, 6, 5], vec![2, 2, 2], vec![1, 2, 2], vec![1, 1, 1], vec![1; 6], 0),
        ] {
            let x = ramp(&shape, 5);
            let a = window(&kernel, &strides, &pads)
                .with("dilations", ints(&dilations))
                .with("ceil_mode", AttrValue::Int(ceil))
                .with("storage_order", AttrValue::Int(0));
            let out_shape = eval_shape(&a, &shape);
            let flat = eval("MaxPool", &a, &[&x], &[f32_out(&out_shape)]).unwrap();
            let i64_out = TensorDesc::new(DType::I64, out_shape.clone());
            let windows = eval("MaxPool", &a, &[&x], &[f32_out(&out_shape), i64_out]).unwrap();
            assert_eq!(flat[0], windows[0], "{shape:?} {kernel:?} {strides:?} {pads:?}");
        }
    }

    /// The pooled shape of `shape` under `a` (floor or ceil mode, as ONNX defines them).
    fn eval_shape(a: &Attrs, shape: &[usize]) -> Vec<usize> {
        let (k, s, d, p) = (
            a.ints("kernel_shape").unwrap(),
            a.ints("strides").unwrap(),
            a.ints("dilations").unwrap(),
            a.ints("pads").unwrap(),
        );
        let ceil = a.int("ceil_mode").unwrap() != 0;
        let rank = k.len();
        let spatial = (0..rank).map(|i| {
            let room = shape[2 + i] as i64 + p[i] + p[rank + i] - ((k[i] - 1) * d[i] + 1);
            let out = if ceil { (room + s[i] - 1) / s[i] + 1 } else { room / s[i] + 1 };
            // A last window starting in the end padding is dropped.
            let out =
                if ceil && (out - 1) * s[i] >= shape[2 + i] as i64 + p[i] { out - 1 } else { out };
            out as usize
        });
        shape[..2].iter().copied().chain(spatial).collect()
    }

    #[test]
    fn global_pools() {
        // run("Global{Average,Max,Lp}Pool", [ramp((2,3,1,9),7)]) (p=2 and p=3 for Lp): nine
        // values per plane, one past the 8 lanes of the reduction.
        let x = ramp(&[2, 3, 1, 9], 7);
        let out = [f32_out(&[2, 3, 1, 1])];
        let cases: [(&str, i64, [f32; 6]); 4] = [
            (
                "GlobalAveragePool",
                2,
                [0.055555556, -0.11111111, 0.083333336, -0.083333336, 0.11111111, -0.055555556],
            ),
            ("GlobalMaxPool", 2, [1.5, 1.5, 1.25, 1.5, 1.5, 1.25]),
            ("GlobalLpPool", 2, [2.4494898, 3.1424513, 2.6339135, 2.6339135, 3.1424513, 2.4494898]),
            ("GlobalLpPool", 3, [1.9157736, 2.322727, 2.0013013, 2.0013013, 2.322727, 1.9157736]),
        ];
        for (op, p, want) in cases {
            let a = Attrs::new().with("p", AttrValue::Int(p));
            let got = eval(op, &a, &[&x], &out).unwrap();
            close(got[0].as_slice().unwrap(), &want);
        }
    }
}
