//! Ops that move bytes: reshapes and copies, transposes, slices, pads, concatenation, gathers
//! and scatters, plus the few shape-like ops that compute (CumSum, Range, ConstantOfShape).
//!
//! Moving ops work on raw bytes with an element size, never per dtype: most of them are one
//! [`Remap`] (every output element reads one input element, or a fill value), built in
//! `prepare` from per-axis offset tables and run by one loop for all of them.

mod index;
mod numeric;
mod remap;

pub(crate) use remap::{Axis, Remap};

use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use bytemuck::Pod;
use ingot_schema::{AttrValue, Attrs, DType};

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => copy(cx),
        "Dropout" => dropout(cx),
        "BitCast" => bitcast(cx),
        "Concat" => concat(cx),
        "Split" => split(cx),
        "Transpose" => remap::transpose(cx),
        "Slice" => remap::slice(cx),
        "DynamicSlice" => remap::dynamic_slice(cx),
        "Pad" | "CenterCropPad" => remap::pad(cx),
        "Tile" => remap::tile(cx),
        "Expand" => remap::expand(cx),
        "DepthToSpace" => remap::depth_to_space(cx),
        "SpaceToDepth" => remap::space_to_depth(cx),
        "Gather" => index::gather(cx),
        "GatherElements" => index::gather_elements(cx),
        "GatherND" => index::gather_nd(cx),
        "ScatterND" => index::scatter_nd(cx),
        // Lowering renames Scatter; the kernel is the same.
        "ScatterElements" | "Scatter" => index::scatter_elements(cx),
        "OneHot" => index::one_hot(cx),
        "TensorScatter" => index::tensor_scatter(cx),
        "ReverseSequence" => index::reverse_sequence(cx),
        "Trilu" => numeric::trilu(cx),
        "CumSum" | "CumProd" => numeric::cumulative(cx),
        "ConstantOfShape" => numeric::constant_of_shape(cx),
        "Range" => numeric::range(cx),
        "EyeLike" => numeric::eye_like(cx),
        _ => Err(KernelError::UnknownOp(cx.op.to_string())),
    }
}

// ---- helpers shared by the family (and by resize) ----

/// Row-major strides, in elements.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Input `i`'s bytes, checked to be `len` long.
pub(crate) fn input<'a>(
    inputs: &[TensorRef<'a>],
    i: usize,
    len: usize,
) -> Result<&'a [u8], KernelError> {
    match inputs.get(i) {
        Some(t) if t.bytes.len() == len => Ok(t.bytes),
        Some(t) => Err(invalid!("input {i} has {} bytes, expected {len}", t.bytes.len())),
        None => Err(invalid!("input {i} is missing")),
    }
}

/// Output `i`'s bytes, checked to be `len` long.
pub(crate) fn output<'b>(
    outputs: &'b mut [TensorMut<'_>],
    i: usize,
    len: usize,
) -> Result<&'b mut [u8], KernelError> {
    match outputs.get_mut(i) {
        Some(t) if t.bytes.len() == len => Ok(&mut *t.bytes),
        Some(t) => Err(invalid!("output {i} has {} bytes, expected {len}", t.bytes.len())),
        None => Err(invalid!("output {i} is missing")),
    }
}

pub(crate) fn cast<T: Pod>(bytes: &[u8]) -> Result<&[T], KernelError> {
    bytemuck::try_cast_slice(bytes).map_err(|_| invalid!("tensor bytes are misaligned"))
}

pub(crate) fn cast_mut<T: Pod>(bytes: &mut [u8]) -> Result<&mut [T], KernelError> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| invalid!("tensor bytes are misaligned"))
}

/// Runs `$body` with `$t` bound to the unsigned integer type of `$size` bytes, so that byte
/// moves of any dtype compile to word moves.
macro_rules! by_size {
    ($size:expr, $t:ident => $body:expr) => {
        match $size {
            1 => {
                type $t = u8;
                $body
            }
            2 => {
                type $t = u16;
                $body
            }
            4 => {
                type $t = u32;
                $body
            }
            8 => {
                type $t = u64;
                $body
            }
            s => Err($crate::invalid!("no element type is {s} bytes wide")),
        }
    };
}
pub(crate) use by_size;

/// The arithmetic the family needs (CumSum, CumProd, scatter reductions): integers wrap,
/// floats follow IEEE.
pub(crate) trait Numeric: Pod + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
}
macro_rules! numeric_impl {
    (float: $($t:ty),*) => { $(impl Numeric for $t {
        const ZERO: Self = 0.0;
        const ONE: Self = 1.0;
        fn add(self, o: Self) -> Self { self + o }
        fn mul(self, o: Self) -> Self { self * o }
    })* };
    (int: $($t:ty),*) => { $(impl Numeric for $t {
        const ZERO: Self = 0;
        const ONE: Self = 1;
        fn add(self, o: Self) -> Self { self.wrapping_add(o) }
        fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
    })* };
}
numeric_impl!(float: f32, f64);
numeric_impl!(int: i8, u8, i16, u16, i32, u32, i64, u64);
impl Numeric for half::f16 {
    const ZERO: Self = half::f16::ZERO;
    const ONE: Self = half::f16::ONE;
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}

/// Runs `$body` with `$t` bound to the Rust type of the numeric dtype `$dtype` (not bool).
macro_rules! by_numeric {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::I16 => {
                type $t = i16;
                $body
            }
            DType::U16 => {
                type $t = u16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::U64 => {
                type $t = u64;
                $body
            }
            DType::Bool => Err($crate::invalid!("no arithmetic on bool")),
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                Err($crate::invalid!("no arithmetic on 2- and 4-bit integers"))
            }
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1 => Err($crate::invalid!("no arithmetic on 8- and 4-bit floats")),
        }
    };
}
pub(crate) use by_numeric;

/// A scalar attribute (Pad's value, Range's bounds...): integers for integer and bool dtypes,
/// floats for float dtypes, so that neither loses precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scalar {
    Int(i64),
    Float(f64),
}

impl Scalar {
    pub(crate) fn attr(attrs: &Attrs, name: &str) -> Result<Scalar, KernelError> {
        match attrs.get(name) {
            Some(AttrValue::Int(v)) => Ok(Scalar::Int(*v)),
            Some(AttrValue::Float(v)) => Ok(Scalar::Float(*v)),
            Some(_) => Err(invalid!("attribute '{name}' should be a number")),
            None => Err(invalid!("attribute '{name}' is missing")),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Float(v) => v,
        }
    }

    fn as_i64(self) -> i64 {
        match self {
            Scalar::Int(v) => v,
            Scalar::Float(v) => v as i64,
        }
    }

    /// The value as one element of `dtype`, little-endian (integers wrap, floats round).
    pub(crate) fn encode(self, dtype: DType) -> Vec<u8> {
        let i = self.as_i64();
        match dtype {
            DType::F32 => (self.as_f64() as f32).to_le_bytes().to_vec(),
            DType::F64 => self.as_f64().to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(self.as_f64()).to_le_bytes().to_vec(),
            DType::Bool => vec![u8::from(self.as_f64() != 0.0)],
            DType::I8 => (i as i8).to_le_bytes().to_vec(),
            DType::U8 => (i as u8).to_le_bytes().to_vec(),
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => vec![sub_byte_int(i, dtype)],
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1 => vec![minifloat_bits(dtype, self.as_f64())],
            DType::I16 => (i as i16).to_le_bytes().to_vec(),
            DType::U16 => (i as u16).to_le_bytes().to_vec(),
            DType::I32 => (i as i32).to_le_bytes().to_vec(),
            DType::U32 => (i as u32).to_le_bytes().to_vec(),
            DType::I64 => i.to_le_bytes().to_vec(),
            DType::U64 => (i as u64).to_le_bytes().to_vec(),
        }
    }
}

/// `v` as a minifloat element of `dtype` (saturated, as Cast does by default).
pub(crate) fn minifloat_bits(dtype: DType, v: f64) -> u8 {
    crate::minifloat::Format::of(dtype).map_or(0, |f| f.encode(v, true))
}

/// `i` wrapped to the bits of `dtype`, a 2- or 4-bit integer, as its byte.
pub(crate) fn sub_byte_int(i: i64, dtype: DType) -> u8 {
    let bits = dtype.packed_bits().unwrap_or(8);
    wrap_to_bits(i, bits, matches!(dtype, DType::I4 | DType::I2))
}

/// `i` wrapped to `bits` bits, as a byte: sign-extended or not.
pub(crate) fn wrap_to_bits(i: i64, bits: u32, signed: bool) -> u8 {
    let low = (i as u8) & (0xff >> (8 - bits));
    if signed && low >= 1 << (bits - 1) { low | (0xff << bits) } else { low }
}

/// Fills `dst` with copies of one element's bytes.
pub(crate) fn fill(dst: &mut [u8], elem: &[u8]) -> Result<(), KernelError> {
    by_size!(elem.len(), T => {
        let v: T = bytemuck::pod_read_unaligned(elem);
        cast_mut::<T>(dst)?.fill(v);
        Ok(())
    })
}

/// Input `i`'s elements as i64 (indices, ids), checked to be `count` of them.
pub(crate) fn read_ints(
    inputs: &[TensorRef],
    i: usize,
    count: usize,
) -> Result<Vec<i64>, KernelError> {
    fn conv<T: Pod>(b: &[u8], f: impl Fn(T) -> i64) -> Result<Vec<i64>, KernelError> {
        Ok(cast::<T>(b)?.iter().map(|&v| f(v)).collect())
    }
    let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
    let b = input(inputs, i, count * t.dtype.size())?;
    match t.dtype {
        DType::I64 => conv::<i64>(b, |v| v),
        DType::I32 => conv::<i32>(b, i64::from),
        DType::I16 => conv::<i16>(b, i64::from),
        DType::I8 | DType::I4 | DType::I2 => conv::<i8>(b, i64::from),
        DType::U8 | DType::Bool | DType::U4 | DType::U2 => conv::<u8>(b, i64::from),
        DType::U16 => conv::<u16>(b, i64::from),
        DType::U32 => conv::<u32>(b, i64::from),
        DType::U64 => conv::<u64>(b, |v| v as i64),
        DType::F32 => conv::<f32>(b, |v| v as i64),
        DType::F64 => conv::<f64>(b, |v| v as i64),
        DType::F16 => conv::<half::f16>(b, |v| v.to_f64() as i64),
        d => match crate::minifloat::Format::of(d) {
            Some(f) => conv::<u8>(b, |v| f.decode(v) as i64),
            None => Err(invalid!("no integers in {d}")),
        },
    }
}

/// An index checked against `[-n, n)`, negative values counting from the end.
pub(crate) fn wrap_index(i: i64, n: usize) -> Result<usize, KernelError> {
    let n_i = n as i64;
    let j = if i < 0 { i + n_i } else { i };
    if (0..n_i).contains(&j) {
        Ok(j as usize)
    } else {
        Err(KernelError::Data(format!("index {i} is out of range for a dimension of {n}")))
    }
}

/// Every input and output has `dtype`.
fn same_dtype(cx: &OpCx) -> Result<DType, KernelError> {
    let dt =
        cx.inputs.first().map(|d| d.dtype).ok_or_else(|| invalid!("{} needs an input", cx.op))?;
    if let Some(d) = cx.inputs.iter().chain(cx.outputs).find(|d| d.dtype != dt) {
        return Err(invalid!("{} mixes {dt} and {}", cx.op, d.dtype));
    }
    Ok(dt)
}

// ---- copies: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout ----

/// Output 0 is input 0's bytes; an optional second output (Dropout's mask) is all true.
struct Passthrough {
    bytes: usize,
    mask: Option<usize>,
}

impl Kernel for Passthrough {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let src = input(inputs, 0, self.bytes)?;
        output(outputs, 0, self.bytes)?.copy_from_slice(src);
        if let Some(n) = self.mask {
            output(outputs, 1, n)?.fill(1);
        }
        Ok(())
    }
}

fn copy(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    same_dtype(cx)?;
    let (i, o) = (&cx.inputs[0], &cx.outputs[0]);
    if i.elements() != o.elements() {
        return Err(invalid!("{} cannot turn shape {:?} into {:?}", cx.op, i.shape, o.shape));
    }
    Ok(Box::new(Passthrough { bytes: i.bytes(), mask: None }))
}

/// BitCast: the bytes as they are, the output's type of the input's width.
fn bitcast(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=1, 1)?;
    let (i, o) = (&cx.inputs[0], &cx.outputs[0]);
    if i.shape != o.shape || i.bytes() != o.bytes() {
        return Err(invalid!("BitCast cannot turn {i:?} into {o:?}"));
    }
    Ok(Box::new(Passthrough { bytes: i.bytes(), mask: None }))
}

/// Inference Dropout: the identity, and a mask of ones when asked for.
fn dropout(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if cx.inputs.len() != 1 || !(1..=2).contains(&cx.outputs.len()) {
        return Err(invalid!("Dropout takes 1 input and 1 or 2 outputs"));
    }
    let (i, o) = (&cx.inputs[0], &cx.outputs[0]);
    if i != o {
        return Err(invalid!("Dropout output {o:?} differs from its input {i:?}"));
    }
    let mask = match cx.outputs.get(1) {
        Some(m) if m.dtype == DType::Bool && m.shape == i.shape => Some(m.bytes()),
        Some(m) => {
            return Err(invalid!("Dropout's mask should be bool {:?}, not {m:?}", i.shape));
        }
        None => None,
    };
    Ok(Box::new(Passthrough { bytes: i.bytes(), mask }))
}

// ---- Concat and Split: contiguous blocks along an axis ----

/// Concat and Split both interleave blocks: for each of `outer` rows, the joined tensor holds
/// one block of `parts[k]` bytes from each part in turn.
struct Blocks {
    outer: usize,
    parts: Vec<usize>,
    concat: bool,
}

impl Blocks {
    fn new(cx: &OpCx, joined: &[usize], pieces: &[&[usize]]) -> Result<Blocks, KernelError> {
        let axis = usize::try_from(cx.attrs.int("axis")?)
            .ok()
            .filter(|&a| a < joined.len())
            .ok_or_else(|| invalid!("{} axis is out of range for rank {}", cx.op, joined.len()))?;
        let esize = same_dtype(cx)?.size();
        let inner: usize = joined[axis + 1..].iter().product();
        let mut total = 0;
        for p in pieces {
            let same_elsewhere = p.len() == joined.len()
                && p.iter().zip(joined).enumerate().all(|(d, (a, b))| d == axis || a == b);
            if !same_elsewhere {
                return Err(invalid!("{} part {p:?} does not fit {joined:?}", cx.op));
            }
            total += p[axis];
        }
        if total != joined[axis] {
            return Err(invalid!(
                "{} parts add up to {total} along axis {axis}, not {}",
                cx.op,
                joined[axis]
            ));
        }
        Ok(Blocks {
            outer: joined[..axis].iter().product(),
            parts: pieces.iter().map(|p| p[axis] * inner * esize).collect(),
            concat: cx.op == "Concat",
        })
    }
}

impl Kernel for Blocks {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let row: usize = self.parts.iter().sum();
        let total = row * self.outer;
        let sizes = |k: usize| self.parts[k] * self.outer;
        if self.concat {
            let dst = output(outputs, 0, total)?;
            let srcs = (0..self.parts.len())
                .map(|k| input(inputs, k, sizes(k)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut at = 0;
            for o in 0..self.outer {
                for (src, &n) in srcs.iter().zip(&self.parts) {
                    dst[at..at + n].copy_from_slice(&src[o * n..(o + 1) * n]);
                    at += n;
                }
            }
        } else {
            let src = input(inputs, 0, total)?;
            let mut at = 0;
            for o in 0..self.outer {
                for (k, &n) in self.parts.iter().enumerate() {
                    output(outputs, k, sizes(k))?[o * n..(o + 1) * n]
                        .copy_from_slice(&src[at..at + n]);
                    at += n;
                }
            }
        }
        Ok(())
    }
}

fn concat(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    cx.expect_arity(1..=usize::MAX, 1)?;
    let pieces: Vec<&[usize]> = cx.inputs.iter().map(|d| d.shape.as_slice()).collect();
    Ok(Box::new(Blocks::new(cx, &cx.outputs[0].shape, &pieces)?))
}

fn split(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if cx.inputs.len() != 1 || cx.outputs.is_empty() {
        return Err(invalid!("Split takes 1 input and at least 1 output"));
    }
    let pieces: Vec<&[usize]> = cx.outputs.iter().map(|d| d.shape.as_slice()).collect();
    Ok(Box::new(Blocks::new(cx, &cx.inputs[0].shape, &pieces)?))
}

#[cfg(test)]
mod tests;
