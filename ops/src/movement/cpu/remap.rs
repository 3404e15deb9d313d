//! One engine for every op whose output element `[i0, i1, ...]` is the input element at
//! `t0[i0] + t1[i1] + ...` (per-axis offset tables), or a fill value: Transpose, Slice, Pad,
//! Tile, Expand, DepthToSpace, SpaceToDepth, and nearest Resize.

use super::{Scalar, by_size, cast, cast_mut, input, output, same_dtype, strides};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use bytemuck::Pod;
use ingot_schema::DType;

/// How one output axis reads the input, in input elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Axis {
    /// Output index `i` reads offset `start + i * stride`.
    Affine { len: usize, start: usize, stride: isize },
    /// Output index `i` reads offset `t[i]`, or the fill value where `None`.
    Table(Vec<Option<usize>>),
}

impl Axis {
    pub(crate) fn affine(len: usize, start: usize, stride: isize) -> Axis {
        Axis::Affine { len, start, stride }
    }

    /// A table, kept as `Affine` when it is one so that axes can still merge.
    pub(crate) fn table(t: Vec<Option<usize>>) -> Axis {
        let affine = match t.as_slice() {
            [] => Some((0, 0)),
            [Some(a)] => Some((*a, 0)),
            [Some(a), Some(b), ..] => {
                let stride = *b as isize - *a as isize;
                let fits = t
                    .iter()
                    .enumerate()
                    .all(|(i, o)| *o == Some((*a as isize + i as isize * stride) as usize));
                fits.then_some((*a, stride))
            }
            _ => None,
        };
        match affine {
            Some((start, stride)) => Axis::affine(t.len(), start, stride),
            None => Axis::Table(t),
        }
    }

    fn len(&self) -> usize {
        match self {
            Axis::Affine { len, .. } => *len,
            Axis::Table(t) => t.len(),
        }
    }

    /// Every offset of the axis, `None` for fill; errors if one would be negative.
    fn offsets(&self) -> Result<Vec<Option<usize>>, KernelError> {
        match self {
            Axis::Table(t) => Ok(t.clone()),
            Axis::Affine { len, start, stride } => (0..*len)
                .map(|i| {
                    let o = *start as isize + i as isize * stride;
                    usize::try_from(o)
                        .map(Some)
                        .map_err(|_| invalid!("remap offset {o} is negative"))
                })
                .collect(),
        }
    }
}

/// Where one output row (the innermost axis) comes from, relative to the row's base.
#[derive(Debug, PartialEq)]
enum Row {
    /// `len` consecutive input elements from `start`.
    Run {
        start: usize,
        len: usize,
    },
    Table(Vec<Option<usize>>),
}

/// A prepared remap of a tensor of `in_len` elements of `esize` bytes.
#[derive(Debug)]
pub(crate) struct Remap {
    esize: usize,
    in_len: usize,
    out_len: usize,
    base: usize,
    /// Offset tables of the outer axes, outermost first.
    outer: Vec<Vec<Option<usize>>>,
    row: Row,
    fill: Vec<u8>,
}

impl Remap {
    /// Checks every offset against `in_len` so that `run` cannot read out of bounds.
    pub(crate) fn new(
        axes: Vec<Axis>,
        in_len: usize,
        esize: usize,
        fill: Vec<u8>,
    ) -> Result<Remap, KernelError> {
        if fill.len() != esize {
            return Err(invalid!("remap fill value is not one element"));
        }
        let out_len = out_elements(&axes)?;
        let mut base = 0;
        let mut merged: Vec<Axis> = Vec::new();
        for axis in axes {
            if out_len == 0 {
                break;
            }
            let axis = match axis {
                Axis::Table(t) => Axis::table(t),
                a => a,
            };
            match (&axis, merged.last_mut()) {
                (Axis::Affine { len: 1, start, .. }, _) => base += start,
                (
                    Axis::Affine { len, start, stride },
                    Some(Axis::Affine { len: olen, start: ostart, stride: ostride }),
                ) if *ostride == *stride * *len as isize => {
                    *olen *= len;
                    *ostart += start;
                    *ostride = *stride;
                }
                _ => merged.push(axis),
            }
        }
        let row = match merged.pop() {
            None => Row::Run { start: 0, len: 1 },
            Some(Axis::Affine { len, start, stride: 1 }) => Row::Run { start, len },
            Some(a) => Row::Table(a.offsets()?),
        };
        let outer = merged.iter().map(Axis::offsets).collect::<Result<Vec<_>, _>>()?;
        let max_of = |t: &[Option<usize>]| t.iter().flatten().max().copied().unwrap_or(0);
        let row_max = match &row {
            Row::Run { start, len } => start + len - 1,
            Row::Table(t) => max_of(t),
        };
        let max = base + outer.iter().map(|t| max_of(t)).sum::<usize>() + row_max;
        if out_len > 0 && max >= in_len {
            return Err(invalid!("remap reads element {max} of a tensor of {in_len}"));
        }
        Ok(Remap { esize, in_len, out_len, base, outer, row, fill })
    }

    /// A remap whose output is empty: nothing is read, so no axis needs a table (whose length,
    /// for an empty tensor, can be anything).
    pub(crate) fn empty(in_len: usize, esize: usize) -> Result<Remap, KernelError> {
        Remap::new(vec![Axis::affine(0, 0, 0)], in_len, esize, vec![0; esize])
    }

    pub(crate) fn in_bytes(&self) -> usize {
        self.in_len * self.esize
    }

    pub(crate) fn out_bytes(&self) -> usize {
        self.out_len * self.esize
    }

    pub(crate) fn apply(&self, src: &[u8], dst: &mut [u8]) -> Result<(), KernelError> {
        if src.len() != self.in_bytes() || dst.len() != self.out_bytes() {
            return Err(invalid!("remap got tensors of the wrong size"));
        }
        if self.out_len == 0 {
            return Ok(());
        }
        by_size!(self.esize, T => {
            let fill: T = bytemuck::pod_read_unaligned(&self.fill);
            self.apply_typed(cast::<T>(src)?, cast_mut::<T>(dst)?, fill);
            Ok(())
        })
    }

    fn apply_typed<T: Pod>(&self, src: &[T], dst: &mut [T], fill: T) {
        let row_len = match &self.row {
            Row::Run { len, .. } => *len,
            Row::Table(t) => t.len(),
        };
        let mut idx = vec![0usize; self.outer.len()];
        let mut prev: Option<usize> = None;
        for r in 0..self.out_len / row_len {
            let base = self
                .outer
                .iter()
                .zip(&idx)
                .try_fold(self.base, |acc, (t, &i)| t[i].map(|o| acc + o));
            let (done, rest) = dst.split_at_mut(r * row_len);
            let out = &mut rest[..row_len];
            match (base, &self.row) {
                (None, _) => out.fill(fill),
                // Rows read from the same place (upsampling, broadcasting) are copied whole.
                (Some(b), _) if prev == Some(b) => {
                    out.copy_from_slice(&done[(r - 1) * row_len..]);
                }
                (Some(b), Row::Run { start, len }) => {
                    out.copy_from_slice(&src[b + start..b + start + len]);
                }
                (Some(b), Row::Table(t)) => {
                    for (o, &e) in out.iter_mut().zip(t) {
                        *o = e.map_or(fill, |e| src[b + e]);
                    }
                }
            }
            prev = base;
            // Odometer over the outer axes.
            for (i, t) in idx.iter_mut().zip(&self.outer).rev() {
                *i += 1;
                if *i < t.len() {
                    break;
                }
                *i = 0;
            }
        }
    }
}

impl Kernel for Remap {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let src = input(inputs, 0, self.in_bytes())?;
        self.apply(src, output(outputs, 0, self.out_bytes())?)
    }
}

/// Elements of the output of `axes`, or an error if that overflows.
fn out_elements(axes: &[Axis]) -> Result<usize, KernelError> {
    axes.iter()
        .try_fold(1usize, |n, a| n.checked_mul(a.len()))
        .ok_or_else(|| invalid!("remap output is too large"))
}

/// The remap of a single-input, single-output op with no fill value.
fn remap(cx: &OpCx, axes: Vec<Axis>) -> Result<Box<dyn Kernel>, KernelError> {
    let esize = same_dtype(cx)?.size();
    // Checked before `Remap::new` turns an axis into a table as long as the axis.
    let n = out_elements(&axes)?;
    if n != cx.outputs[0].elements() {
        return Err(invalid!(
            "{} computes {n} output elements, but its output is {:?}",
            cx.op,
            cx.outputs[0]
        ));
    }
    let r = Remap::new(axes, cx.inputs[0].elements(), esize, vec![0; esize])?;
    check_out(cx, &r)?;
    Ok(Box::new(r))
}

/// The remap of an op whose input is empty, and so must be its output: nothing moves.
fn empty(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let r = Remap::empty(cx.inputs[0].elements(), same_dtype(cx)?.size())?;
    check_out(cx, &r)?;
    Ok(Box::new(r))
}

fn check_out(cx: &OpCx, r: &Remap) -> Result<(), KernelError> {
    if r.out_bytes() != cx.outputs[0].bytes() {
        return Err(invalid!(
            "{} computes {} output bytes, but its output is {:?}",
            cx.op,
            r.out_bytes(),
            cx.outputs[0]
        ));
    }
    Ok(())
}

fn ints_as_usize(cx: &OpCx, name: &str) -> Result<Vec<usize>, KernelError> {
    cx.attrs
        .ints(name)?
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| invalid!("{} {name} has {v}", cx.op)))
        .collect()
}

fn rank_check(cx: &OpCx, what: &str, n: usize, rank: usize) -> Result<(), KernelError> {
    if n != rank {
        return Err(invalid!("{} {what} has {n} entries for rank {rank}", cx.op));
    }
    Ok(())
}

pub(super) fn transpose(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let shape = &cx.inputs[0].shape;
    let st = strides(shape);
    let perm = ints_as_usize(cx, "perm")?;
    rank_check(cx, "perm", perm.len(), shape.len())?;
    let mut seen = vec![false; shape.len()];
    for &p in &perm {
        match seen.get_mut(p) {
            Some(s) if !*s => *s = true,
            _ => return Err(invalid!("Transpose perm {perm:?} is not a permutation")),
        }
    }
    let axes = perm.iter().map(|&p| Axis::affine(shape[p], 0, st[p] as isize)).collect();
    remap(cx, axes)
}

/// Slice with canonical per-axis `starts`, `ends`, `steps` (already clamped).
pub(super) fn slice(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let shape = &cx.inputs[0].shape;
    let st = strides(shape);
    let (starts, ends, steps) =
        (cx.attrs.ints("starts")?, cx.attrs.ints("ends")?, cx.attrs.ints("steps")?);
    for (what, v) in [("starts", starts), ("ends", ends), ("steps", steps)] {
        rank_check(cx, what, v.len(), shape.len())?;
    }
    let mut axes = Vec::with_capacity(shape.len());
    for d in 0..shape.len() {
        // In i128, so that no starts, ends and steps overflow.
        let (s, e, k) = (starts[d], ends[d], steps[d]);
        let span = match k {
            0 => return Err(invalid!("Slice step is 0")),
            k if k > 0 => i128::from(e) - i128::from(s),
            _ => i128::from(s) - i128::from(e),
        };
        let len = span.max(0).unsigned_abs().div_ceil(k.unsigned_abs().into());
        let len =
            usize::try_from(len).map_err(|_| invalid!("Slice of {span} elements is too large"))?;
        if len == 0 {
            axes.push(Axis::affine(0, 0, 0));
            continue;
        }
        // A non-empty slice starts and ends inside the dimension.
        let last = i128::from(s) + (len as i128 - 1) * i128::from(k);
        let inside = |i: i128| (0..shape[d] as i128).contains(&i);
        if !inside(i128::from(s)) || !inside(last) {
            return Err(invalid!(
                "Slice from {s} by {k} reads outside a dimension of {}",
                shape[d]
            ));
        }
        // With two or more elements the step is smaller than the dimension, so this is exact;
        // with one it is not used.
        let stride = (k as isize).saturating_mul(st[d] as isize);
        axes.push(Axis::affine(len, s as usize * st[d], stride));
    }
    remap(cx, axes)
}

/// Pad with canonical `pads` (begins then ends, every axis), `mode` and `value`.
pub(super) fn pad(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let desc = &cx.inputs[0];
    let (shape, rank) = (&desc.shape, desc.shape.len());
    let st = strides(shape);
    let pads = cx.attrs.ints("pads")?;
    rank_check(cx, "pads", pads.len(), 2 * rank)?;
    let mode = cx.attrs.text("mode")?;
    if !matches!(mode, "constant" | "edge" | "wrap" | "reflect") {
        return Err(invalid!("Pad mode {mode} is unknown"));
    }
    let value = Scalar::attr(cx.attrs, "value")?.encode(desc.dtype);
    // The output shape is checked before the tables, which are as long as its dims, are made.
    let mut lens = Vec::with_capacity(rank);
    for d in 0..rank {
        let len = i128::from(pads[d]) + i128::from(pads[d + rank]) + shape[d] as i128;
        let len = usize::try_from(len)
            .map_err(|_| invalid!("Pad {pads:?} does not fit dimension {d} of {shape:?}"))?;
        if shape[d] == 0 && len > 0 && mode != "constant" {
            return Err(invalid!("Pad mode {mode} cannot pad an empty dimension"));
        }
        lens.push(len);
    }
    if cx.outputs[0].shape != lens {
        return Err(invalid!(
            "Pad of {shape:?} by {pads:?} makes {lens:?}, but its output is {:?}",
            cx.outputs[0]
        ));
    }
    if lens.contains(&0) {
        return Ok(Box::new(Remap::empty(desc.elements(), desc.dtype.size())?));
    }
    let mut axes = Vec::with_capacity(rank);
    for d in 0..rank {
        // In i128: pads may be anything that sums to a valid length.
        let (n, b) = (shape[d] as i128, i128::from(pads[d]));
        let source = |j: i128| -> Option<i128> {
            let i = j - b;
            match mode {
                "edge" => Some(i.clamp(0, n - 1)),
                "wrap" => Some(i.rem_euclid(n)),
                "reflect" if n == 1 => Some(0),
                "reflect" => {
                    let period = 2 * (n - 1);
                    let k = i.rem_euclid(period);
                    Some(if k < n { k } else { period - k })
                }
                _ => (0..n).contains(&i).then_some(i),
            }
        };
        let table = (0..lens[d] as i128).map(|j| source(j).map(|i| i as usize * st[d])).collect();
        axes.push(Axis::table(table));
    }
    let r = Remap::new(axes, desc.elements(), desc.dtype.size(), value)?;
    check_out(cx, &r)?;
    Ok(Box::new(r))
}

/// Tile: output axis `d` of `r * n` is read as two axes, `r` (stride 0) then `n`.
pub(super) fn tile(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let shape = &cx.inputs[0].shape;
    let st = strides(shape);
    let reps = ints_as_usize(cx, "repeats")?;
    rank_check(cx, "repeats", reps.len(), shape.len())?;
    let axes = (0..shape.len())
        .flat_map(|d| [Axis::affine(reps[d], 0, 0), Axis::affine(shape[d], 0, st[d] as isize)])
        .collect();
    remap(cx, axes)
}

/// Expand to the canonical output `shape`: broadcast axes read with stride 0.
pub(super) fn expand(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let shape = &cx.inputs[0].shape;
    let st = strides(shape);
    let out = ints_as_usize(cx, "shape")?;
    let off = out
        .len()
        .checked_sub(shape.len())
        .ok_or_else(|| invalid!("Expand cannot lower the rank of {shape:?} to {out:?}"))?;
    let mut axes = Vec::with_capacity(out.len());
    for (d, &n) in out.iter().enumerate() {
        let axis = match d.checked_sub(off) {
            None => Axis::affine(n, 0, 0),
            Some(i) if shape[i] == n => Axis::affine(n, 0, st[i] as isize),
            Some(i) if shape[i] == 1 => Axis::affine(n, 0, 0),
            Some(i) => {
                return Err(invalid!("Expand cannot broadcast {} to {n}", shape[i]));
            }
        };
        axes.push(axis);
    }
    remap(cx, axes)
}

/// The block size, and the NCHW input dims, checked.
fn blocks(cx: &OpCx) -> Result<(usize, [usize; 4]), KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let b = usize::try_from(cx.attrs.int("blocksize")?)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| invalid!("{} blocksize must be positive", cx.op))?;
    let dims: [usize; 4] = cx.inputs[0]
        .shape
        .as_slice()
        .try_into()
        .map_err(|_| invalid!("{} takes a 4-d input", cx.op))?;
    Ok((b, dims))
}

/// DepthToSpace: output `[n, c, h*b, w*b]` read as `[n, c, h, b1, w, b2]`.
pub(super) fn depth_to_space(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let (b, [n, c, h, w]) = blocks(cx)?;
    if cx.inputs[0].elements() == 0 {
        return empty(cx);
    }
    // With `b * b` dividing a non-zero `c`, every product below is at most the input's size.
    if b.checked_mul(b).is_none_or(|bb| c % bb != 0) {
        return Err(invalid!("DepthToSpace: {c} channels do not split into {b}x{b} blocks"));
    }
    let oc = c / (b * b);
    let hw = h * w;
    // Input channel of (c', b1, b2): DCR = (b1 * b + b2) * oc + c'; CRD = (c' * b + b1) * b + b2.
    let (s_c, s_b1, s_b2) = match cx.attrs.text("mode")? {
        "DCR" => (hw, b * oc * hw, oc * hw),
        "CRD" => (b * b * hw, b * hw, hw),
        m => return Err(invalid!("DepthToSpace mode {m} is unknown")),
    };
    let axes = [(n, c * hw), (oc, s_c), (h, w), (b, s_b1), (w, 1), (b, s_b2)];
    remap(cx, axes.map(|(l, s)| Axis::affine(l, 0, s as isize)).into())
}

/// SpaceToDepth: output `[n, c*b*b, h/b, w/b]` read as `[n, b1, b2, c, h', w']` (DCR) or
/// `[n, c, b1, b2, h', w']` (CRD).
pub(super) fn space_to_depth(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let (b, [n, c, h, w]) = blocks(cx)?;
    if cx.inputs[0].elements() == 0 {
        return empty(cx);
    }
    // With `b` dividing a non-zero `h`, every product below is at most the input's size.
    if h % b != 0 || w % b != 0 {
        return Err(invalid!("SpaceToDepth: {h}x{w} does not split into {b}x{b} blocks"));
    }
    let (b1, b2, ch) = ((b, w), (b, 1), (c, h * w));
    let blocks = match cx.attrs.text("mode")? {
        "DCR" => [b1, b2, ch],
        "CRD" => [ch, b1, b2],
        m => return Err(invalid!("SpaceToDepth mode {m} is unknown")),
    };
    let axes = [(n, c * h * w)].into_iter().chain(blocks).chain([(h / b, b * w), (w / b, b)]);
    remap(cx, axes.map(|(l, s)| Axis::affine(l, 0, s as isize)).collect())
}

/// `DynamicSlice`: the window of `sizes` elements per axis from where `starts` says, found as
/// Slice finds it (a negative start counts from the end; start and end clamp to the axis),
/// copied a run of whole rows at a time. A window Slice would make shorter is an error.
pub(super) fn dynamic_slice(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
    let (axes, sizes) = (cx.attrs.ints("axes")?, cx.attrs.ints("sizes")?);
    let mut window = x.shape.clone();
    for (&a, &n) in axes.iter().zip(sizes) {
        let d = usize::try_from(a).ok().filter(|&d| d < window.len());
        let d = d.ok_or_else(|| invalid!("DynamicSlice axis {a} of rank {}", window.len()))?;
        window[d] = usize::try_from(n).map_err(|_| invalid!("a window of {n} elements"))?;
    }
    let starts = &cx.inputs[1];
    if axes.len() != sizes.len()
        || starts.elements() != axes.len()
        || !matches!(starts.dtype, DType::I32 | DType::I64)
        || y.shape != window
        || y.dtype != x.dtype
    {
        return Err(invalid!(
            "DynamicSlice of {} {:?} by {} starts {:?} to {} {:?}: the window is {window:?}",
            x.dtype,
            x.shape,
            starts.dtype,
            starts.shape,
            y.dtype,
            y.shape
        ));
    }
    let axes = axes.iter().map(|&a| a as usize).collect();
    Ok(Box::new(DynamicSlice { shape: x.shape.clone(), window, axes, size: x.dtype.size() }))
}

struct DynamicSlice {
    shape: Vec<usize>,
    window: Vec<usize>,
    axes: Vec<usize>,
    /// Bytes per element.
    size: usize,
}

impl DynamicSlice {
    /// The window's first index on each axis, from the run's starts.
    fn origin(&self, starts: &TensorRef) -> Result<Vec<usize>, KernelError> {
        let starts: Vec<i64> = match starts.dtype {
            DType::I32 => starts.as_slice::<i32>()?.iter().map(|&s| i64::from(s)).collect(),
            _ => starts.as_slice::<i64>()?.to_vec(),
        };
        let mut origin = vec![0; self.shape.len()];
        for (&d, &s) in self.axes.iter().zip(&starts) {
            let (n, len) = (self.shape[d] as i64, self.window[d] as i64);
            let fix = |v: i64| if v < 0 { v.saturating_add(n) } else { v }.clamp(0, n);
            let (first, end) = (fix(s), fix(s.saturating_add(len)));
            if end - first != len {
                return Err(invalid!(
                    "DynamicSlice: the run's start {s} on axis {d} of {n} elements takes {} of \
                     them, the plan holds {len} (a Slice from {s} to {})",
                    (end - first).max(0),
                    s.saturating_add(len)
                ));
            }
            origin[d] = first as usize;
        }
        Ok(origin)
    }
}

impl Kernel for DynamicSlice {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let starts = inputs.get(1).ok_or_else(|| invalid!("DynamicSlice takes x and starts"))?;
        let origin = self.origin(starts)?;
        let elements = |s: &[usize]| s.iter().product::<usize>();
        let x = input(inputs, 0, elements(&self.shape) * self.size)?;
        let y = output(outputs, 0, elements(&self.window) * self.size)?;
        let rank = self.shape.len();
        // Whole rows of the last axis; the axes before it walked by an odometer.
        let row = self.window.last().copied().unwrap_or(1) * self.size;
        let strides = strides(&self.shape);
        let mut at = vec![0usize; rank.saturating_sub(1)];
        for out in y.chunks_exact_mut(row.max(1)) {
            let first: usize =
                (0..rank).map(|d| (origin[d] + at.get(d).copied().unwrap_or(0)) * strides[d]).sum();
            out.copy_from_slice(&x[first * self.size..first * self.size + row]);
            for d in (0..at.len()).rev() {
                at[d] += 1;
                if at[d] < self.window[d] {
                    break;
                }
                at[d] = 0;
            }
        }
        Ok(())
    }
}
