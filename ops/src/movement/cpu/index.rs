//! Ops driven by an index tensor read at run time: Gather, GatherElements, GatherND, ScatterND,
//! ScatterElements, TensorScatter, OneHot, ReverseSequence. Indices are checked as they are read; a bad one is
//! an error.

use super::{
    Numeric, by_numeric, by_size, cast, cast_mut, input, output, read_ints, strides, wrap_index,
};
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{TensorDesc, TensorMut, TensorRef};
use bytemuck::Pod;
use ingot_schema::DType;

fn axis_attr(cx: &OpCx, rank: usize) -> Result<usize, KernelError> {
    usize::try_from(cx.attrs.int("axis")?)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| invalid!("{} axis is out of range for rank {rank}", cx.op))
}

fn expect_indices(cx: &OpCx, d: &TensorDesc) -> Result<(), KernelError> {
    match d.dtype {
        DType::I64 | DType::I32 => Ok(()),
        dt => Err(invalid!("{} indices must be i32 or i64, not {dt}", cx.op)),
    }
}

fn expect_output(cx: &OpCx, dtype: DType, shape: &[usize]) -> Result<(), KernelError> {
    let o = &cx.outputs[0];
    if o.dtype != dtype || o.shape != shape {
        return Err(invalid!("{} produces {dtype} {shape:?}, but its output is {o:?}", cx.op));
    }
    Ok(())
}

// ---- Gather ----

/// `data[outer, n, inner]` gathered along the middle axis.
struct Gather {
    outer: usize,
    n: usize,
    /// Bytes per gathered block.
    block: usize,
    indices: TensorDesc,
}

impl Kernel for Gather {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let src = input(inputs, 0, self.outer * self.n * self.block)?;
        let count = self.indices.elements();
        let idx = read_ints(inputs, 1, count)?
            .iter()
            .map(|&i| wrap_index(i, self.n))
            .collect::<Result<Vec<_>, _>>()?;
        let dst = output(outputs, 0, self.outer * count * self.block)?;
        let b = self.block;
        if dst.is_empty() {
            return Ok(());
        }
        for (o, dst) in dst.chunks_exact_mut(count * b).enumerate() {
            let src = &src[o * self.n * b..(o + 1) * self.n * b];
            for (d, &j) in dst.chunks_exact_mut(b).zip(&idx) {
                d.copy_from_slice(&src[j * b..(j + 1) * b]);
            }
        }
        Ok(())
    }
}

pub(super) fn gather(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let (data, indices) = (&cx.inputs[0], &cx.inputs[1]);
    expect_indices(cx, indices)?;
    let axis = axis_attr(cx, data.shape.len())?;
    let shape = [&data.shape[..axis], &indices.shape[..], &data.shape[axis + 1..]].concat();
    expect_output(cx, data.dtype, &shape)?;
    Ok(Box::new(Gather {
        outer: data.shape[..axis].iter().product(),
        n: data.shape[axis],
        block: data.shape[axis + 1..].iter().product::<usize>() * data.dtype.size(),
        indices: indices.clone(),
    }))
}

// ---- GatherElements and ScatterElements ----

/// For each position of `indices` (same rank as `data`), the data offset it names: its own
/// coordinates with the one along `axis` replaced by the index.
fn element_offsets(
    data: &[usize],
    idx_shape: &[usize],
    axis: usize,
    idx: &[i64],
) -> Result<Vec<usize>, KernelError> {
    let st = strides(data);
    let mut pos = vec![0usize; idx_shape.len()];
    let mut out = Vec::with_capacity(idx.len());
    for &i in idx {
        let j = wrap_index(i, data[axis])?;
        let off: usize = pos
            .iter()
            .zip(&st)
            .enumerate()
            .map(|(d, (&p, &s))| if d == axis { j * s } else { p * s })
            .sum();
        out.push(off);
        for (p, &n) in pos.iter_mut().zip(idx_shape).rev() {
            *p += 1;
            if *p < n {
                break;
            }
            *p = 0;
        }
    }
    Ok(out)
}

/// Shapes of an elements op: same rank, and the indices fit inside the data off the axis.
fn elements_shapes(cx: &OpCx, data: &[usize], idx: &[usize]) -> Result<usize, KernelError> {
    let axis = axis_attr(cx, data.len())?;
    let fits = idx.len() == data.len()
        && idx.iter().zip(data).enumerate().all(|(d, (i, n))| d == axis || i <= n);
    if !fits {
        return Err(invalid!("{} indices {idx:?} do not fit data {data:?}", cx.op));
    }
    Ok(axis)
}

struct Elements {
    data: Vec<usize>,
    indices: Vec<usize>,
    axis: usize,
    dtype: DType,
    /// `None` for GatherElements.
    scatter: Option<Reduction>,
}

impl Kernel for Elements {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let esize = self.dtype.size();
        let n_data = self.data.iter().product::<usize>() * esize;
        let n_idx = self.indices.iter().product::<usize>();
        let data = input(inputs, 0, n_data)?;
        let idx = read_ints(inputs, 1, n_idx)?;
        let offs = element_offsets(&self.data, &self.indices, self.axis, &idx)?;
        if let Some(r) = self.scatter {
            let updates = input(inputs, 2, n_idx * esize)?;
            let dst = output(outputs, 0, n_data)?;
            dst.copy_from_slice(data);
            scatter(self.dtype, r, dst, &offs, 1, updates)
        } else {
            let dst = output(outputs, 0, n_idx * esize)?;
            by_size!(esize, T => {
                let (dst, src) = (cast_mut::<T>(dst)?, cast::<T>(data)?);
                for (d, &o) in dst.iter_mut().zip(&offs) {
                    *d = src[o];
                }
                Ok(())
            })
        }
    }
}

pub(super) fn gather_elements(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let (data, indices) = (&cx.inputs[0], &cx.inputs[1]);
    expect_indices(cx, indices)?;
    let axis = elements_shapes(cx, &data.shape, &indices.shape)?;
    expect_output(cx, data.dtype, &indices.shape)?;
    Ok(Box::new(Elements {
        data: data.shape.clone(),
        indices: indices.shape.clone(),
        axis,
        dtype: data.dtype,
        scatter: None,
    }))
}

/// How a scatter combines an update with the value already there.
#[derive(Clone, Copy, Debug)]
enum Reduction {
    Replace,
    Add,
    Mul,
    Max,
    Min,
}

impl Reduction {
    fn parse(cx: &OpCx) -> Result<Reduction, KernelError> {
        let r = match cx.attrs.text("reduction")? {
            "none" => Reduction::Replace,
            "add" => Reduction::Add,
            "mul" => Reduction::Mul,
            "max" => Reduction::Max,
            "min" => Reduction::Min,
            r => return Err(invalid!("{} reduction {r} is unknown", cx.op)),
        };
        let dt = cx.inputs[0].dtype;
        if dt == DType::Bool && !matches!(r, Reduction::Replace) {
            return Err(cx.dtype_error(dt));
        }
        Ok(r)
    }

    fn apply<T: Numeric>(self, old: T, new: T) -> T {
        match self {
            Reduction::Replace => new,
            Reduction::Add => old.add(new),
            Reduction::Mul => old.mul(new),
            Reduction::Max if new > old => new,
            Reduction::Min if new < old => new,
            Reduction::Max | Reduction::Min => old,
        }
    }
}

/// Writes `slice` elements of `updates` at each offset of `dst`, in order (a later update to
/// the same place sees the earlier ones).
fn scatter(
    dtype: DType,
    r: Reduction,
    dst: &mut [u8],
    offsets: &[usize],
    slice: usize,
    updates: &[u8],
) -> Result<(), KernelError> {
    if slice == 0 {
        return Ok(());
    }
    if let Reduction::Replace = r {
        let b = slice * dtype.size();
        for (&o, u) in offsets.iter().zip(updates.chunks_exact(b)) {
            let at = o * dtype.size();
            dst[at..at + b].copy_from_slice(u);
        }
        return Ok(());
    }
    by_numeric!(dtype, T => {
        let (dst, upd) = (cast_mut::<T>(dst)?, cast::<T>(updates)?);
        for (&o, u) in offsets.iter().zip(upd.chunks_exact(slice)) {
            for (d, &u) in dst[o..o + slice].iter_mut().zip(u) {
                *d = r.apply(*d, u);
            }
        }
        Ok(())
    })
}

pub(super) fn scatter_elements(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(3..=3, 1)?;
    let reduction = Reduction::parse(cx)?;
    let (data, indices, updates) = (&cx.inputs[0], &cx.inputs[1], &cx.inputs[2]);
    expect_indices(cx, indices)?;
    let axis = elements_shapes(cx, &data.shape, &indices.shape)?;
    if updates.shape != indices.shape || updates.dtype != data.dtype {
        return Err(invalid!("ScatterElements updates {updates:?} do not match the indices"));
    }
    expect_output(cx, data.dtype, &data.shape)?;
    Ok(Box::new(Elements {
        data: data.shape.clone(),
        indices: indices.shape.clone(),
        axis,
        dtype: data.dtype,
        scatter: Some(reduction),
    }))
}

// ---- TensorScatter ----

/// The cache `[outer, max, inner]` (outer: the batch and the dims before the axis, `per_batch`
/// of them to a batch) with the update `[outer, seq, inner]` written from each batch's write
/// index on: in order, or modulo `max` when `circular`. Rows are `row` bytes.
struct TensorScatter {
    outer: usize,
    per_batch: usize,
    max: usize,
    seq: usize,
    row: usize,
    circular: bool,
}

pub(super) fn tensor_scatter(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=3, 1)?;
    let (cache, update) = (&cx.inputs[0], &cx.inputs[1]);
    let axis = axis_attr(cx, cache.shape.len())?;
    let fits = axis > 0
        && update.dtype == cache.dtype
        && update.shape.len() == cache.shape.len()
        && (update.shape.iter().zip(&cache.shape).enumerate())
            .all(|(i, (&u, &c))| if i == axis { u <= c } else { u == c });
    if !fits {
        return Err(invalid!("TensorScatter of {update:?} into {cache:?} along axis {axis}"));
    }
    if let Some(w) = cx.inputs.get(2)
        && (w.dtype != DType::I64 || w.shape != [cache.shape[0]])
    {
        return Err(invalid!("TensorScatter write_indices {w:?}"));
    }
    expect_output(cx, cache.dtype, &cache.shape)?;
    let circular = match cx.attrs.text("mode")? {
        "linear" => false,
        "circular" => true,
        mode => return Err(invalid!("TensorScatter mode {mode}")),
    };
    let inner = cache.shape[axis + 1..].iter().product::<usize>();
    Ok(Box::new(TensorScatter {
        outer: cache.shape[..axis].iter().product(),
        per_batch: cache.shape[1..axis].iter().product(),
        max: cache.shape[axis],
        seq: update.shape[axis],
        row: inner * cache.dtype.size(),
        circular,
    }))
}

impl TensorScatter {
    /// Where each batch writes its first row; an index that would write past the cache in
    /// linear mode, or a negative one, is an error.
    fn starts(&self, inputs: &[TensorRef]) -> Result<Vec<usize>, KernelError> {
        let batches = self.outer / self.per_batch.max(1);
        let given = match inputs.len() {
            3 => read_ints(inputs, 2, batches)?,
            _ => vec![0; batches],
        };
        let fits = |&w: &i64| {
            usize::try_from(w).ok().filter(|&w| self.circular || w + self.seq <= self.max)
        };
        given
            .iter()
            .map(|w| {
                fits(w).ok_or_else(|| {
                    KernelError::Data(format!(
                        "TensorScatter write index {w} with {} rows does not fit a cache of {}",
                        self.seq, self.max
                    ))
                })
            })
            .collect()
    }

    /// Writes the update's rows over the cache's bytes `y`.
    fn write(&self, starts: &[usize], update: &[u8], y: &mut [u8]) {
        let r = self.row;
        for o in 0..self.outer {
            let start = starts[o / self.per_batch.max(1)];
            for s in 0..self.seq {
                let j = if self.circular { (start + s) % self.max } else { start + s };
                let (from, to) = ((o * self.seq + s) * r, (o * self.max + j) * r);
                y[to..to + r].copy_from_slice(&update[from..from + r]);
            }
        }
    }
}

impl Kernel for TensorScatter {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let bytes = self.outer * self.max * self.row;
        let cache = input(inputs, 0, bytes)?;
        let update = input(inputs, 1, self.outer * self.seq * self.row)?;
        let starts = self.starts(inputs)?;
        let y = output(outputs, 0, bytes)?;
        y.copy_from_slice(cache);
        self.write(&starts, update, y);
        Ok(())
    }
}

// ---- GatherND and ScatterND ----

/// The index-tuple layout of an ND op.
struct Nd {
    data: Vec<usize>,
    indices: Vec<usize>,
    batch: usize,
    dtype: DType,
    /// `None` for GatherND.
    scatter: Option<Reduction>,
}

impl Nd {
    /// Validates the shapes; returns the layout and the gathered (or scattered) shape.
    fn new(
        cx: &OpCx,
        batch: usize,
        scatter: Option<Reduction>,
    ) -> Result<(Nd, Vec<usize>), KernelError> {
        let (data, indices) = (&cx.inputs[0], &cx.inputs[1]);
        expect_indices(cx, indices)?;
        let (r, q) = (data.shape.len(), indices.shape.len());
        let k = indices.shape.last().copied().unwrap_or(0);
        if q == 0 || batch >= r.min(q) || k > r - batch {
            return Err(invalid!(
                "{} cannot index {:?} with {:?} and {batch} batch dims",
                cx.op,
                data.shape,
                indices.shape
            ));
        }
        if data.shape[..batch] != indices.shape[..batch] {
            return Err(invalid!("{} batch dims of data and indices differ", cx.op));
        }
        let slices = [&indices.shape[..q - 1], &data.shape[batch + k..]].concat();
        let nd = Nd {
            data: data.shape.clone(),
            indices: indices.shape.clone(),
            batch,
            dtype: data.dtype,
            scatter,
        };
        Ok((nd, slices))
    }

    /// Element offset of every index tuple's slice, and the slice length in elements.
    fn offsets(&self, idx: &[i64]) -> Result<(Vec<usize>, usize), KernelError> {
        let b = self.batch;
        let k = self.indices.last().copied().unwrap_or(0);
        let st = strides(&self.data);
        let slice: usize = self.data[b + k..].iter().product();
        let batch_stride: usize = self.data[b..].iter().product();
        let tuples_per_batch: usize = self.indices[b..self.indices.len() - 1].iter().product();
        let mut out = Vec::with_capacity(idx.len() / k.max(1));
        let tuples = self.indices[..self.indices.len() - 1].iter().product::<usize>();
        for t in 0..tuples {
            let tuple = &idx[t * k..(t + 1) * k];
            let mut off = (t / tuples_per_batch.max(1)) * batch_stride;
            for (j, &i) in tuple.iter().enumerate() {
                off += wrap_index(i, self.data[b + j])? * st[b + j];
            }
            out.push(off);
        }
        Ok((out, slice))
    }
}

impl Kernel for Nd {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let esize = self.dtype.size();
        let n_data = self.data.iter().product::<usize>() * esize;
        let data = input(inputs, 0, n_data)?;
        let idx = read_ints(inputs, 1, self.indices.iter().product())?;
        let (offs, slice) = self.offsets(&idx)?;
        let b = slice * esize;
        if let Some(r) = self.scatter {
            let updates = input(inputs, 2, offs.len() * b)?;
            let dst = output(outputs, 0, n_data)?;
            dst.copy_from_slice(data);
            scatter(self.dtype, r, dst, &offs, slice, updates)
        } else {
            let dst = output(outputs, 0, offs.len() * b)?;
            for (&o, d) in offs.iter().zip(dst.chunks_exact_mut(b.max(1))) {
                d.copy_from_slice(&data[o * esize..o * esize + b]);
            }
            Ok(())
        }
    }
}

pub(super) fn gather_nd(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let batch = usize::try_from(cx.attrs.int("batch_dims")?)
        .map_err(|_| invalid!("GatherND batch_dims must not be negative"))?;
    let (nd, shape) = Nd::new(cx, batch, None)?;
    expect_output(cx, cx.inputs[0].dtype, &shape)?;
    Ok(Box::new(nd))
}

pub(super) fn scatter_nd(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(3..=3, 1)?;
    let (nd, shape) = Nd::new(cx, 0, Some(Reduction::parse(cx)?))?;
    let (data, updates) = (&cx.inputs[0], &cx.inputs[2]);
    if updates.shape != shape || updates.dtype != data.dtype {
        return Err(invalid!(
            "ScatterND updates should be {} {shape:?}, not {updates:?}",
            data.dtype
        ));
    }
    expect_output(cx, data.dtype, &data.shape)?;
    Ok(Box::new(nd))
}

// ---- OneHot ----

/// Output `[outer, depth, inner]`: `on` where the index at `[outer, inner]` equals the middle
/// coordinate (negative indices count from `depth`), `off` elsewhere.
struct OneHot {
    outer: usize,
    depth: usize,
    inner: usize,
    esize: usize,
}

impl Kernel for OneHot {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let idx = read_ints(inputs, 0, self.outer * self.inner)?;
        let values = input(inputs, 1, 2 * self.esize)?;
        let dst = output(outputs, 0, idx.len() * self.depth * self.esize)?;
        by_size!(self.esize, T => {
            let (dst, v) = (cast_mut::<T>(dst)?, cast::<T>(values)?);
            fill_one_hot(self, &idx, dst, v[0], v[1]);
            Ok(())
        })
    }
}

fn fill_one_hot<T: Pod>(k: &OneHot, idx: &[i64], dst: &mut [T], off: T, on: T) {
    dst.fill(off);
    let depth = k.depth as i64;
    for (p, &i) in idx.iter().enumerate() {
        let j = if i < 0 { i + depth } else { i };
        if (0..depth).contains(&j) {
            let (o, q) = (p / k.inner, p % k.inner);
            dst[(o * k.depth + j as usize) * k.inner + q] = on;
        }
    }
}

pub(super) fn one_hot(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let (indices, values) = (&cx.inputs[0], &cx.inputs[1]);
    let axis = axis_attr(cx, indices.shape.len() + 1)?;
    let depth = usize::try_from(cx.attrs.int("depth")?)
        .map_err(|_| invalid!("OneHot depth must not be negative"))?;
    if values.elements() != 2 {
        return Err(invalid!("OneHot values must hold [off, on], got {values:?}"));
    }
    let shape = [&indices.shape[..axis], &[depth][..], &indices.shape[axis..]].concat();
    expect_output(cx, values.dtype, &shape)?;
    Ok(Box::new(OneHot {
        outer: indices.shape[..axis].iter().product(),
        depth,
        inner: indices.shape[axis..].iter().product(),
        esize: values.dtype.size(),
    }))
}

// ---- ReverseSequence ----

/// `[d0, d1, inner]` with the time and batch axes 0 and 1 (in either order): each batch's
/// first `sequence_lens[b]` steps reversed, the rest copied.
struct ReverseSequence {
    dims: [usize; 2],
    time_axis: usize,
    /// Bytes per (time, batch) block.
    block: usize,
}

impl Kernel for ReverseSequence {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let bytes = self.dims[0] * self.dims[1] * self.block;
        let src = input(inputs, 0, bytes)?;
        let (steps, batches) = (self.dims[self.time_axis], self.dims[1 - self.time_axis]);
        let lens = read_ints(inputs, 1, batches)?;
        let dst = output(outputs, 0, bytes)?;
        // The byte offset of step t of batch b.
        let at = |t: usize, b: usize| {
            let (i, j) = if self.time_axis == 0 { (t, b) } else { (b, t) };
            (i * self.dims[1] + j) * self.block
        };
        for (b, &len) in lens.iter().enumerate() {
            let len = usize::try_from(len)
                .ok()
                .filter(|&l| l <= steps)
                .ok_or_else(|| invalid!("ReverseSequence length {len} for {steps} steps"))?;
            for t in 0..steps {
                let from = if t < len { len - 1 - t } else { t };
                dst[at(t, b)..][..self.block].copy_from_slice(&src[at(from, b)..][..self.block]);
            }
        }
        Ok(())
    }
}

pub(super) fn reverse_sequence(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(2..=2, 1)?;
    let (x, lens) = (&cx.inputs[0], &cx.inputs[1]);
    expect_indices(cx, lens)?;
    expect_output(cx, x.dtype, &x.shape)?;
    let time_axis = usize::try_from(cx.attrs.int("time_axis")?).unwrap_or(2);
    let batch_axis = usize::try_from(cx.attrs.int("batch_axis")?).unwrap_or(2);
    if x.shape.len() < 2 || time_axis + batch_axis != 1 {
        return Err(invalid!(
            "ReverseSequence of {:?} with time axis {time_axis}, batch axis {batch_axis}",
            x.shape
        ));
    }
    if lens.shape != [x.shape[batch_axis]] {
        return Err(invalid!("ReverseSequence lengths {:?} for {:?}", lens.shape, x.shape));
    }
    let inner: usize = x.shape[2..].iter().product();
    Ok(Box::new(ReverseSequence {
        dims: [x.shape[0], x.shape[1]],
        time_axis,
        block: inner * x.dtype.size(),
    }))
}
