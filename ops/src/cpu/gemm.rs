//! The one matrix product of the CPU kernels (conv, MatMul/Gemm/Einsum, the recurrent cells):
//! `C = alpha·A·B + beta·C` on strided matrices inside slices, in safe Rust.
//!
//! It is the classic blocked product (Goto; BLIS): B is packed `KC x NC` at a time into panels
//! `NR` columns wide, A is read in place `MR` rows at a time, and a microkernel keeps an
//! `MR x NR` tile of C in vector registers through `KC` multiply-adds. The microkernel is
//! plain Rust over fixed-size arrays, which LLVM turns into vector FMAs; `multiversion`
//! compiles the product for AVX-512, AVX2+FMA and NEON and picks one at run time, with a tile
//! shaped to that register file (AVX-512: 8 x 32 floats in 16 of its 32 registers). Rows are
//! in panels of 8 or 6 because conv weights have 8k rows far more often than 16k (the tile of
//! matrixmultiply, used before, wasted a third of its work on 24-row weights).
//!
//! B may also come already packed ([`Panels`], which a conv's im2col writes directly): the
//! product then reads its panels in place; or as 8-bit integers with a scale and zero point
//! per column, or as float16 ([`Dequantized`]), widened where a float B would be packed or
//! read; or as
//! rows read in place at their own offsets of one slice ([`Shifted`]: a conv's implicit
//! GEMM). A product with one row or one column of C is a vector product instead (see
//! [`vector_product`]): nothing is packed.
//!
//! Every element of C is summed in the same order (k ascending, one `KC` block after the
//! other; a vector product's fixed lanes) whatever the tile, the blocking of M and N, and the
//! thread count.

use super::parallel::{self, Scratch, with_scratch};
use half::f16;
use half::slice::HalfFloatSliceExt;
use multiversion::multiversion;
use multiversion::target::match_target;
use ndarray::{
    ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis, Ix2, ShapeBuilder, StrideShape, s,
};
use std::ops::{Add, Mul, Range};

use crate::cpu::KernelError;
use crate::invalid;

/// Products smaller than this many multiply-adds run as one piece: below it, splitting costs
/// more (each part packs its own share of the operands) than a second core gains.
const PARALLEL_WORK: usize = 1 << 21;

/// Depth of a packed block: an A panel (`MR x KC`) stays in L1 while B panels stream by.
const KC: usize = 256;
/// Rows of A packed at a time (`MC x KC`, 128 KiB of floats, in L2).
const MC: usize = 128;
/// Columns of B packed at a time (`KC x NC`, 1 MiB of floats, in L2).
const NC: usize = 1024;

/// Where a `rows x cols` matrix sits in a slice: element (i, j) at `i * rs + j * cs`.
/// A stride of 0 repeats elements (a broadcast operand); C must not repeat any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Layout {
    pub fn new(rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Self { rows, cols, rs, cs }
    }

    pub fn row_major(rows: usize, cols: usize) -> Self {
        Self::new(rows, cols, cols, 1)
    }

    pub(crate) fn shape(&self) -> Result<StrideShape<Ix2>, KernelError> {
        // ndarray reads strides as isize: a larger one would turn negative.
        if isize::try_from(self.rs.max(self.cs)).is_err() {
            return Err(invalid!("gemm strides are too large: {self:?}"));
        }
        Ok((self.rows, self.cols).strides((self.rs, self.cs)))
    }

    /// The matrix in `values`, or an error naming operand `what` where it does not fit.
    pub(crate) fn view<'a, T>(
        &self,
        what: &str,
        values: &'a [T],
    ) -> Result<ArrayView2<'a, T>, KernelError> {
        let len = values.len();
        ArrayView2::from_shape(self.shape()?, values).map_err(|e| {
            invalid!("gemm operand {what} ({len} elements) does not fit {self:?}: {e}")
        })
    }

    /// [`Layout::view`] for writing.
    pub(crate) fn view_mut<'a, T>(
        &self,
        what: &str,
        values: &'a mut [T],
    ) -> Result<ArrayViewMut2<'a, T>, KernelError> {
        let len = values.len();
        ArrayViewMut2::from_shape(self.shape()?, values).map_err(|e| {
            invalid!("gemm operand {what} ({len} elements) does not fit {self:?}: {e}")
        })
    }
}

/// What the product adds to: `beta·C` (C unread when beta is 0), plus `bias[i]` on row i when
/// given. A conv's bias added as C is written saves the pass that would write it first.
#[derive(Clone, Copy, Debug)]
pub struct Start<'a, T> {
    pub beta: T,
    pub bias: Option<&'a [T]>,
}

impl<'a, T: Float> Start<'a, T> {
    pub fn scaled(beta: T) -> Self {
        Self { beta, bias: None }
    }

    /// The start of rows `from..` of C.
    fn rows_from(self, from: usize) -> Self {
        Self { bias: self.bias.map(|b| &b[from..]), ..self }
    }

    /// C's new value on row `row`: `sum + (beta·c + bias)`, c unread when beta is 0.
    #[inline(always)]
    fn finish(&self, sum: T, c: T, row: usize) -> T {
        let bias = self.bias.map(|b| b[row]);
        match (self.beta == T::ZERO, bias) {
            (true, None) => sum,
            (false, None) => sum + self.beta * c,
            (true, Some(b)) => sum + b,
            (false, Some(b)) => sum + (self.beta * c + b),
        }
    }

    /// [`Self::finish`] over a run of row `row`: `c[j] = finish(alpha·sums[j], c[j], row)`,
    /// the bias and beta looked up once (per element, the lookups cost more than the adds).
    #[inline(always)]
    pub(crate) fn finish_run(&self, row: usize, alpha: T, sums: &[T], c: &mut [T]) {
        let (beta, pairs) = (self.beta, c.iter_mut().zip(sums));
        match (beta == T::ZERO, self.bias.map(|b| b[row])) {
            (true, None) => pairs.for_each(|(c, &x)| *c = alpha * x),
            (false, None) => pairs.for_each(|(c, &x)| *c = alpha * x + beta * *c),
            (true, Some(b)) => pairs.for_each(|(c, &x)| *c = alpha * x + b),
            (false, Some(b)) => pairs.for_each(|(c, &x)| *c = alpha * x + (beta * *c + b)),
        }
    }
}

/// B already in the layout the product packs it to: panels of `nr` columns (the tile's width,
/// [`Float::panel_width`]), each holding all `k` rows, `k x nr` values row-major, zeros past
/// B's last column. A conv's im2col writes its patches straight into it, sparing the product
/// the copy that would pack them (64x576x3136, one thread: 49 GMAC/s packing B, 72 without).
#[derive(Clone, Copy, Debug)]
pub struct Panels<'a, T> {
    data: &'a [T],
    k: usize,
    n: usize,
    nr: usize,
}

impl<'a, T: Float> Panels<'a, T> {
    /// The values a `k x n` B takes as panels.
    pub fn len(k: usize, n: usize) -> usize {
        n.div_ceil(T::panel_width()) * T::panel_width() * k
    }

    pub fn new(data: &'a [T], k: usize, n: usize) -> Result<Self, KernelError> {
        if data.len() != Self::len(k, n) {
            return Err(invalid!("{} values are not the panels of a {k} x {n} matrix", data.len()));
        }
        let nr = T::panel_width();
        Ok(Self { data, k, n, nr })
    }

    /// Columns `..mid` and `mid..`; `mid` is a whole number of panels.
    fn split_at(self, mid: usize) -> (Self, Self) {
        debug_assert_eq!(mid % self.nr, 0, "columns are cut between panels");
        let (left, right) = self.data.split_at(mid * self.k);
        let n = self.n;
        (Self { data: left, n: mid, ..self }, Self { data: right, n: n - mid, ..self })
    }

    /// Rows `rows` of panel `p`.
    #[inline(always)]
    fn block(&self, p: usize, rows: Range<usize>) -> &'a [T] {
        &self.data[(p * self.k + rows.start) * self.nr..][..rows.len() * self.nr]
    }
}

/// A B kept narrow: 8-bit integers with one scale and zero point per column, element (k, j)
/// `(q[k, j] - zero[j]) * scale[j]` in float32 as `DequantizeLinear` computes it; or float16,
/// widened exactly. The product widens it a block at a time where it would pack or read a float
/// B, so the weight stays a quarter (a half) of the bytes in memory and no float copy of it is
/// ever whole.
#[derive(Clone, Copy, Debug)]
pub struct Dequantized<'a> {
    values: Narrow<'a>,
    /// Per column; empty for float16, which has none.
    scale: &'a [f32],
    /// Whole numbers, as floats: `q - zero` is exact.
    zero: &'a [f32],
}

/// The values of a [`Dequantized`] B.
#[derive(Clone, Copy, Debug)]
pub enum Narrow<'a> {
    I8(ArrayView2<'a, i8>),
    U8(ArrayView2<'a, u8>),
    F16(ArrayView2<'a, f16>),
}

impl<'a> Dequantized<'a> {
    /// 8-bit `values` (not [`Narrow::F16`]) with their scales and zero points per column.
    pub fn new(values: Narrow<'a>, scale: &'a [f32], zero: &'a [f32]) -> Result<Self, KernelError> {
        let (k, n) = values.dim();
        if matches!(values, Narrow::F16(_)) {
            return Err(invalid!("a float16 B has no scales or zero points"));
        }
        if scale.len() != n || zero.len() != n {
            return Err(invalid!(
                "a {k} x {n} quantized B needs {n} scales and zero points, got {} and {}",
                scale.len(),
                zero.len()
            ));
        }
        Ok(Self { values, scale, zero })
    }

    /// A float16 B.
    pub fn half(values: ArrayView2<'a, f16>) -> Self {
        Self { values: Narrow::F16(values), scale: &[], zero: &[] }
    }

    fn dim(&self) -> (usize, usize) {
        self.values.dim()
    }

    /// Rows `rows` and columns `cols`.
    fn slice(self, rows: Range<usize>, cols: Range<usize>) -> Self {
        let values = match self.values {
            Narrow::I8(v) => Narrow::I8(v.slice_move(s![rows, cols.clone()])),
            Narrow::U8(v) => Narrow::U8(v.slice_move(s![rows, cols.clone()])),
            Narrow::F16(v) => return Self::half(v.slice_move(s![rows, cols])),
        };
        Self { values, scale: &self.scale[cols.clone()], zero: &self.zero[cols] }
    }

    /// Whether its columns are contiguous (a weight stored as [N, K]).
    fn columns_contiguous(&self) -> bool {
        let (k, n) = self.dim();
        let strides = match self.values {
            Narrow::I8(v) => [v.strides()[0], v.strides()[1]],
            Narrow::U8(v) => [v.strides()[0], v.strides()[1]],
            Narrow::F16(v) => [v.strides()[0], v.strides()[1]],
        };
        k > 1 && n > 0 && strides[0] == 1
    }

    /// Writes the dequantized values into `to`, element (k, j) at `k * rs + j * cs`.
    fn write<T: Float>(&self, to: &mut [T], rs: usize, cs: usize) {
        match self.values {
            Narrow::I8(v) => dequantize_into(v, self.scale, self.zero, to, rs, cs),
            Narrow::U8(v) => dequantize_into(v, self.scale, self.zero, to, rs, cs),
            Narrow::F16(v) => widen_into(v, to, rs, cs),
        }
    }
}

impl Narrow<'_> {
    fn dim(&self) -> (usize, usize) {
        match self {
            Narrow::I8(v) => v.dim(),
            Narrow::U8(v) => v.dim(),
            Narrow::F16(v) => v.dim(),
        }
    }
}

/// `to[k * rs + j * cs] = h[k, j]` widened (exact), a contiguous run of `h` at a time: straight
/// into `to` where the run lands contiguous (packing B's panel rows, A's block columns), else
/// through a buffer on the stack.
#[inline(always)]
fn widen_into<T: Float>(h: ArrayView2<f16>, to: &mut [T], rs: usize, cs: usize) {
    const RUN: usize = 64;
    let (lines, step, stride) = match h.nrows() > 1 && h.strides()[0] == 1 {
        true => (h.columns(), cs, rs),
        false => (h.rows(), rs, cs),
    };
    let mut wide = [T::ZERO; RUN];
    for (line, values) in lines.into_iter().enumerate() {
        let dst = &mut to[line * step..];
        match (values.to_slice(), stride) {
            (Some(values), 1) => T::widen(values, &mut dst[..values.len()]),
            (Some(values), _) => {
                for (c, run) in values.chunks(RUN).enumerate() {
                    let wide = &mut wide[..run.len()];
                    T::widen(run, wide);
                    for (i, &v) in wide.iter().enumerate() {
                        dst[(c * RUN + i) * stride] = v;
                    }
                }
            }
            (None, _) => {
                for (i, &v) in values.iter().enumerate() {
                    dst[i * stride] = T::from_f32(v.to_f32());
                }
            }
        }
    }
}

/// An 8-bit integer of a quantized B.
trait Level: Copy {
    fn int(self) -> i32;
}

impl Level for i8 {
    #[inline(always)]
    fn int(self) -> i32 {
        i32::from(self)
    }
}

impl Level for u8 {
    #[inline(always)]
    fn int(self) -> i32 {
        i32::from(self)
    }
}

/// `to[k * rs + j * cs] = (q[k, j] - zero[j]) * scale[j]`: the difference is exact in float32,
/// so this is DequantizeLinear's value to the bit. Along q's contiguous axis, so that the
/// loops vectorise where `to` is contiguous the same way.
#[inline(always)]
fn dequantize_into<Q: Level, T: Float>(
    q: ArrayView2<Q>,
    scale: &[f32],
    zero: &[f32],
    to: &mut [T],
    rs: usize,
    cs: usize,
) {
    let value = |q: Q, z: f32, s: f32| T::from_f32((q.int() as f32 - z) * s);
    if q.nrows() > 1 && q.strides()[0] == 1 {
        for (j, column) in q.columns().into_iter().enumerate() {
            let (z, s, dst) = (zero[j], scale[j], &mut to[j * cs..]);
            match (column.to_slice(), rs) {
                (Some(column), 1) => {
                    for (d, &q) in dst[..column.len()].iter_mut().zip(column) {
                        *d = value(q, z, s);
                    }
                }
                _ => {
                    for (k, &q) in column.iter().enumerate() {
                        dst[k * rs] = value(q, z, s);
                    }
                }
            }
        }
        return;
    }
    for (k, row) in q.rows().into_iter().enumerate() {
        let dst = &mut to[k * rs..];
        match (row.to_slice(), cs) {
            (Some(row), 1) => {
                let dst = &mut dst[..row.len()];
                for (((d, &q), &z), &s) in dst.iter_mut().zip(row).zip(zero).zip(scale) {
                    *d = value(q, z, s);
                }
            }
            _ => {
                for (j, &q) in row.iter().enumerate() {
                    dst[j * cs] = value(q, zero[j], scale[j]);
                }
            }
        }
    }
}

/// A B whose rows are windows of one slice: element (k, j) is `data[rows[k] + j]`. A conv
/// reads its patches this way from a zero-padded copy of its input (implicit GEMM): row k,
/// a (channel, tap), is the channel's padded plane moved by the tap's offset, so nothing is
/// copied per tap and the microkernel loads each row's vectors where they lie.
#[derive(Clone, Copy, Debug)]
pub struct Shifted<'a, T> {
    data: &'a [T],
    rows: &'a [usize],
    n: usize,
}

impl<'a, T: Float> Shifted<'a, T> {
    /// Checks that every row's window, `n` rounded up to whole panels, lies inside `data`:
    /// the microkernel reads whole panels (the columns past `n` are computed and dropped).
    pub fn new(data: &'a [T], rows: &'a [usize], n: usize) -> Result<Self, KernelError> {
        let end = rows.iter().max().map_or(0, |&r| r + Self::width(n));
        if end > data.len() {
            return Err(invalid!(
                "{n} columns from row offsets up to {end} overrun {} values",
                data.len()
            ));
        }
        Ok(Self { data, rows, n })
    }

    /// The values past a row's start that a product of `n` columns reads.
    pub fn width(n: usize) -> usize {
        n.div_ceil(T::panel_width()) * T::panel_width()
    }

    /// Columns `..mid` and `mid..`; `mid` is a whole number of panels, so the right part's
    /// windows end where the whole's did.
    fn split_at(self, mid: usize) -> (Self, Self) {
        debug_assert_eq!(mid % T::panel_width(), 0, "columns are cut between panels");
        let right = Self { data: &self.data[mid..], n: self.n - mid, ..self };
        (Self { n: mid, ..self }, right)
    }
}

/// The B of a product: a matrix, packed a block at a time as the product goes; panels
/// packed before; 8-bit integers dequantized a block at a time; or rows read in place.
#[derive(Clone, Copy, Debug)]
pub enum OperandB<'a, T> {
    Matrix(ArrayView2<'a, T>),
    Panels(Panels<'a, T>),
    Dequantized(Dequantized<'a>),
    Shifted(Shifted<'a, T>),
}

impl<'a, T: Float> OperandB<'a, T> {
    /// `(k, n)`.
    fn dim(&self) -> (usize, usize) {
        match self {
            Self::Matrix(b) => b.dim(),
            Self::Panels(b) => (b.k, b.n),
            Self::Dequantized(b) => b.dim(),
            Self::Shifted(b) => (b.rows.len(), b.n),
        }
    }

    fn split_columns(self, mid: usize) -> (Self, Self) {
        match self {
            Self::Matrix(b) => {
                let (l, r) = b.split_at(Axis(1), mid);
                (Self::Matrix(l), Self::Matrix(r))
            }
            Self::Panels(b) => {
                let (l, r) = b.split_at(mid);
                (Self::Panels(l), Self::Panels(r))
            }
            Self::Dequantized(b) => {
                let (k, n) = b.dim();
                (Self::Dequantized(b.slice(0..k, 0..mid)), Self::Dequantized(b.slice(0..k, mid..n)))
            }
            Self::Shifted(b) => {
                let (l, r) = b.split_at(mid);
                (Self::Shifted(l), Self::Shifted(r))
            }
        }
    }
}

/// The A of a product: a matrix read in place, or 8-bit integers with a scale and zero point
/// per row (a conv's int8 weights, per output channel), dequantized a block at a time into the
/// copy the product makes of a block of A whose rows are not contiguous.
#[derive(Clone, Copy, Debug)]
pub enum OperandA<'a, T> {
    Matrix(ArrayView2<'a, T>),
    /// Held as Aᵀ: its columns, each with its scale and zero point, are A's rows.
    Dequantized(Dequantized<'a>),
}

impl<T: Float> OperandA<'_, T> {
    /// `(m, k)`.
    fn dim(&self) -> (usize, usize) {
        match self {
            Self::Matrix(a) => a.dim(),
            Self::Dequantized(t) => (t.dim().1, t.dim().0),
        }
    }

    fn split_rows(self, mid: usize) -> (Self, Self) {
        match self {
            Self::Matrix(a) => {
                let (l, r) = a.split_at(Axis(0), mid);
                (Self::Matrix(l), Self::Matrix(r))
            }
            Self::Dequantized(t) => {
                let (k, m) = t.dim();
                (Self::Dequantized(t.slice(0..k, 0..mid)), Self::Dequantized(t.slice(0..k, mid..m)))
            }
        }
    }

    /// Whether each row's elements are contiguous, so that the microkernel reads them in place.
    fn rows_in_place(&self) -> bool {
        match self {
            Self::Matrix(a) => a.nrows() == 0 || a.row(0).as_slice().is_some(),
            Self::Dequantized(_) => false,
        }
    }
}

/// The element types of the product.
pub trait Float:
    Copy
    + Default
    + PartialEq
    + Send
    + Sync
    + Add<Output = Self>
    + Mul<Output = Self>
    + Scratch
    + std::fmt::Debug
{
    const ZERO: Self;

    /// The nearest value of this type (a dequantized B's elements are float32).
    fn from_f32(v: f32) -> Self;

    /// `to[i] = h[i]` widened (exact): F16C's or the FP16 unit's conversions where the CPU
    /// has them.
    fn widen(h: &[f16], to: &mut [Self]);

    /// `self * a + b`, rounded once.
    fn fused(self, a: Self, b: Self) -> Self;

    /// The blocked product with `tile`'s shape ([`packed_tile`]). Inlined into each version
    /// of [`packed_on`], where `tile` is that version's constant: each holds one tile's code.
    fn tiled(
        tile: Tile,
        fused: bool,
        ab: Operands<Self>,
        c: ArrayViewMut2<Self>,
        scratch: Buffers<Self>,
    );

    /// The columns of that tile: the width of B's packed panels.
    fn panel_width() -> usize;

    /// Whether products of this type run code compiled for the wider vector units too (f32),
    /// or the baseline's alone (f64: no deployed model computes in it, and its versions were
    /// 60 KB of every app binary).
    const VERSIONED: bool;
}

/// A `Float` impl whose tiles (`MR` rows, `NV` vectors of `W` lanes) are listed once: the
/// product runs with them and B's panels are packed to their width.
macro_rules! float_with_tiles {
    ($t:ty, $widen:ident, versioned: $versioned:literal, $($tile:ident => $mr:literal x $w:literal x $nv:literal),* $(,)?) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const VERSIONED: bool = $versioned;

            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }

            fn widen(h: &[f16], to: &mut [Self]) {
                h.$widen(to);
            }

            #[inline(always)]
            fn fused(self, a: Self, b: Self) -> Self {
                self.mul_add(a, b)
            }

            #[inline(always)]
            fn tiled(tile: Tile, fused: bool, ab: Operands<$t>, c: ArrayViewMut2<$t>, scratch: Buffers<$t>) {
                match tile {
                    $(Tile::$tile => packed_tile::<$t, $mr, $w, $nv>(fused, ab, c, scratch),)*
                }
            }

            fn panel_width() -> usize {
                let tile = if $versioned { Tile::for_this_cpu() } else { Tile::Baseline };
                match tile {
                    $(Tile::$tile => $w * $nv,)*
                }
            }
        }
    };
}

float_with_tiles!(f32, convert_to_f32_slice, versioned: true,
    Avx512 => 8 x 16 x 2, Avx2 => 6 x 8 x 2, Neon => 6 x 4 x 4, Baseline => 4 x 4 x 2);
// f64 runs the baseline tile alone; the others are listed for a complete `Tile` match.
float_with_tiles!(f64, convert_to_f64_slice, versioned: false,
    Avx512 => 4 x 2 x 2, Avx2 => 4 x 2 x 2, Neon => 4 x 2 x 2, Baseline => 4 x 2 x 2);

/// What a product `C = alpha·A·B + start` reads: `(alpha, A, B, start)`.
pub(crate) type Operands<'a, 'b, 'c, T> = (T, OperandA<'a, T>, OperandB<'b, T>, Start<'c, T>);

/// A product's scratch: a row-major copy of A's block, and B's packed panels.
pub(crate) type Buffers<'a, 'b, T> = (&'a mut [T], &'b mut [T]);

/// The register files the microkernel's tile is shaped for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tile {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Neon,
    Baseline,
}

impl Tile {
    /// The tile of the [`packed_on`] version this CPU runs: the same targets, so the same
    /// choice, and B's panels are packed to the width that version reads.
    #[multiversion(targets(
        "x86_64+avx512f+avx512vl+avx2+fma+avx",
        "x86_64+avx2+fma+avx",
        "aarch64+neon"
    ))]
    fn for_this_cpu() -> Tile {
        match_target! {
            "x86_64+avx512f+avx512vl+avx2+fma+avx" => Tile::Avx512,
            "x86_64+avx2+fma+avx" => Tile::Avx2,
            "aarch64+neon" => Tile::Neon,
            _ => Tile::Baseline,
        }
    }
}

/// `C = alpha·A·B + beta·C`. With `beta == 0` the old contents of C are not read.
#[allow(clippy::too_many_arguments)] // BLAS's own argument list, each operand beside its layout
pub fn gemm<T: Float>(
    alpha: T,
    a: &[T],
    la: Layout,
    b: &[T],
    lb: Layout,
    beta: T,
    c: &mut [T],
    lc: Layout,
) -> Result<(), KernelError> {
    gemm_into(alpha, (a, la), (b, lb), Start::scaled(beta), lc.view_mut("C", c)?)
}

/// `C = alpha·A·B + start` into a view of C (a block of a larger matrix that parallel work
/// split off).
pub fn gemm_into<T: Float>(
    alpha: T,
    (a, la): (&[T], Layout),
    (b, lb): (&[T], Layout),
    start: Start<T>,
    mut c: ArrayViewMut2<T>,
) -> Result<(), KernelError> {
    let Some(a) = operand_a(a, la, (lb.rows, lb.cols), &start, &mut c)? else {
        return Ok(());
    };
    product(alpha, OperandA::Matrix(a), OperandB::Matrix(lb.view("B", b)?), start, c);
    Ok(())
}

/// [`gemm_into`] with a [`Dequantized`] B.
pub fn gemm_dequantized<T: Float>(
    alpha: T,
    a: (&[T], Layout),
    b: Dequantized,
    start: Start<T>,
    c: ArrayViewMut2<T>,
) -> Result<(), KernelError> {
    gemm_operand(alpha, a, OperandB::Dequantized(b), start, c)
}

/// The product with a B that is already checked against itself (not a matrix, whose view
/// [`gemm_into`] makes only once the shapes chain).
fn gemm_operand<T: Float>(
    alpha: T,
    (a, la): (&[T], Layout),
    b: OperandB<T>,
    start: Start<T>,
    mut c: ArrayViewMut2<T>,
) -> Result<(), KernelError> {
    let Some(a) = operand_a(a, la, b.dim(), &start, &mut c)? else {
        return Ok(());
    };
    product(alpha, OperandA::Matrix(a), b, start, c);
    Ok(())
}

/// `C = alpha·A·B + start` with any A and B: a conv's weights, float or 8-bit
/// ([`OperandA::Dequantized`]), against its patches.
pub fn gemm_operands<T: Float>(
    alpha: T,
    a: OperandA<T>,
    b: OperandB<T>,
    start: Start<T>,
    mut c: ArrayViewMut2<T>,
) -> Result<(), KernelError> {
    let ((m, ka), (k, n)) = (a.dim(), b.dim());
    if ka != k || (m, n) != c.dim() {
        return Err(invalid!("gemm shapes do not chain: {m} x {ka} x {k} x {n} -> {:?}", c.dim()));
    }
    if start.bias.is_some_and(|b| b.len() != m) {
        return Err(invalid!("gemm bias does not hold one value per row of a {m} x {k} A"));
    }
    if k == 0 {
        for (i, mut row) in c.rows_mut().into_iter().enumerate() {
            row.map_inplace(|cv| *cv = start.finish(T::ZERO, *cv, i));
        }
        return Ok(());
    }
    product(alpha, a, b, start, c);
    Ok(())
}

/// A as a view once the operands are checked against each other; `None` when the sum is
/// empty (k = 0), which this writes into C itself: ndarray has no view of an empty operand
/// with strides.
fn operand_a<'a, T: Float>(
    a: &'a [T],
    la: Layout,
    (k, n): (usize, usize),
    start: &Start<T>,
    c: &mut ArrayViewMut2<T>,
) -> Result<Option<ArrayView2<'a, T>>, KernelError> {
    if la.cols != k || (la.rows, n) != c.dim() {
        return Err(invalid!("gemm shapes do not chain: {la:?} x {k} x {n} -> {:?}", c.dim()));
    }
    if start.bias.is_some_and(|b| b.len() != la.rows) {
        return Err(invalid!("gemm bias does not hold one value per row of {la:?}"));
    }
    if k == 0 {
        for (i, mut row) in c.rows_mut().into_iter().enumerate() {
            row.map_inplace(|cv| *cv = start.finish(T::ZERO, *cv, i));
        }
        return Ok(None);
    }
    Ok(Some(la.view("A", a)?))
}

/// `C = alpha·A·B + start` on the current thread pool: C is cut along its longer side into
/// one piece per thread while pieces are worth a core. Each piece reads all of the operand
/// not cut (A's rows in place, B packed), so the cut that repeats less is the one across the
/// longer side. The pieces are disjoint views, so this is safe Rust, and each element of C is
/// summed in the same order however C is cut, so results never depend on the pool.
fn product<T: Float>(
    alpha: T,
    a: OperandA<T>,
    b: OperandB<T>,
    start: Start<T>,
    c: ArrayViewMut2<T>,
) {
    let threads = parallel::threads();
    let b = match b {
        // One panel is a matrix with rows `nr` apart.
        OperandB::Panels(p) if p.n <= p.nr => {
            let shape = (p.k, p.n).strides((p.nr, 1));
            OperandB::Matrix(ArrayView2::from_shape(shape, p.data).expect("one whole panel"))
        }
        b => b,
    };
    match (c.dim(), a, b) {
        // One row: every output is on row 0.
        ((1, _), OperandA::Matrix(a), OperandB::Matrix(b)) => {
            vector_product(alpha, (a.row(0), b), (start, 0), c.index_axis_move(Axis(0), 0), threads)
        }
        // One column: output i is on row i.
        ((_, 1), OperandA::Matrix(a), OperandB::Matrix(b)) => vector_product(
            alpha,
            (b.column(0), a.t()),
            (start, 1),
            c.index_axis_move(Axis(1), 0),
            threads,
        ),
        ((1, _), OperandA::Matrix(a), OperandB::Dequantized(b)) => vector_dequantized(
            alpha,
            a.row(0),
            b,
            (start, 0),
            c.index_axis_move(Axis(0), 0),
            threads,
        ),
        // One column of B: dequantized whole, then read as a float one.
        ((_, 1), OperandA::Matrix(a), OperandB::Dequantized(b)) => {
            with_scratch(b.dim().0, |column: &mut [T]| {
                b.write(column, 1, 0);
                vector_product(
                    alpha,
                    (ArrayView1::from(&*column), a.t()),
                    (start, 1),
                    c.index_axis_move(Axis(1), 0),
                    threads,
                )
            })
        }
        // One row of an 8-bit A: dequantized whole, then read as a float one.
        ((1, _), OperandA::Dequantized(at), OperandB::Matrix(b)) => {
            with_scratch(at.dim().0, |row: &mut [T]| {
                at.write(row, 1, 0);
                vector_product(
                    alpha,
                    (ArrayView1::from(&*row), b),
                    (start, 0),
                    c.index_axis_move(Axis(0), 0),
                    threads,
                )
            })
        }
        // One column with an 8-bit A: Aᵀ is a dequantized B whose columns are the outputs.
        ((_, 1), OperandA::Dequantized(at), OperandB::Matrix(b)) => vector_dequantized(
            alpha,
            b.column(0),
            at,
            (start, 1),
            c.index_axis_move(Axis(1), 0),
            threads,
        ),
        (_, a, b) => split(alpha, a, b, start, c, threads),
    }
}

/// Columns of a dequantized B that one vector-product slab holds (a multiple of
/// [`VECTOR_UNIT`], where pieces are cut).
const SLAB: usize = VECTOR_UNIT;

/// [`vector_product`] of one row of C with a [`Dequantized`] B: the outputs cut between
/// threads as there, then `SLAB` columns of B at a time dequantized into a buffer laid out
/// as a float B would be (columns contiguous where B's are), so that each output is summed
/// as the float product sums it.
fn vector_dequantized<T: Float>(
    alpha: T,
    x: ArrayView1<T>,
    b: Dequantized,
    (start, step): (Start<T>, usize),
    mut out: ArrayViewMut1<T>,
    pieces: usize,
) {
    let (k, n) = b.dim();
    let units = n / VECTOR_UNIT;
    if pieces >= 2 && units >= 2 && k * n >= VECTOR_PARALLEL_WORK {
        let (p1, p2) = (pieces / 2, pieces - pieces / 2);
        let mid = (units * p1 / pieces).max(1) * VECTOR_UNIT;
        let (o1, o2) = out.split_at(Axis(0), mid);
        let (b1, b2) = (b.slice(0..k, 0..mid), b.slice(0..k, mid..n));
        let s2 = start.rows_from(mid * step);
        parallel::join(
            || vector_dequantized(alpha, x, b1, (start, step), o1, p1),
            || vector_dequantized(alpha, x, b2, (s2, step), o2, p2),
        );
        return;
    }
    let by_columns = b.columns_contiguous();
    with_scratch(k * SLAB, |slab: &mut [T]| {
        for (i, out) in out.axis_chunks_iter_mut(Axis(0), SLAB).enumerate() {
            let w = out.len();
            let part = b.slice(0..k, i * SLAB..i * SLAB + w);
            let (rs, cs) = if by_columns { (1, k) } else { (SLAB, 1) };
            part.write(slab, rs, cs);
            let mat = ArrayView2::from_shape((k, w).strides((rs, cs)), &*slab)
                .expect("a slab holds SLAB columns of k values");
            let start = start.rows_from(i * SLAB * step);
            vector_product(alpha, (x, mat), (start, step), out, 1);
        }
    });
}

/// Vector products below this many multiply-adds run as one piece.
const VECTOR_PARALLEL_WORK: usize = 1 << 17;

/// Outputs of a vector product are cut at multiples of this.
const VECTOR_UNIT: usize = 64;

/// `out = alpha·x·mat + start`: a product with one row of C (a fully connected layer at
/// batch 1) or one column (with `mat` = Aᵀ), output j on row `j·step` of `start`. Each output
/// is one dot product of `x` with a column of `mat`, read once: packing would copy all of
/// `mat` to use each value once, which made the classifier of a ResNet the slowest layer per
/// multiply-add by 20x. Outputs are cut into one piece per thread; each is summed whole by
/// one piece, so threads change no bit.
fn vector_product<T: Float>(
    alpha: T,
    (x, mat): (ArrayView1<T>, ArrayView2<T>),
    (start, step): (Start<T>, usize),
    out: ArrayViewMut1<T>,
    pieces: usize,
) {
    let n = out.len();
    let units = n / VECTOR_UNIT;
    if pieces < 2 || units < 2 || mat.len() < VECTOR_PARALLEL_WORK {
        if T::VERSIONED {
            vector_on(alpha, (x, mat), (start, step), out);
        } else {
            vector_body(false, alpha, (x, mat), (start, step), out);
        }
        return;
    }
    let (p1, p2) = (pieces / 2, pieces - pieces / 2);
    let mid = (units * p1 / pieces).max(1) * VECTOR_UNIT;
    let (o1, o2) = out.split_at(Axis(0), mid);
    let (m1, m2) = mat.split_at(Axis(1), mid);
    let s2 = start.rows_from(mid * step);
    parallel::join(
        || vector_product(alpha, (x, m1), (start, step), o1, p1),
        || vector_product(alpha, (x, m2), (s2, step), o2, p2),
    );
}

/// Outputs a row-wise vector product sums at a time, in a buffer that stays in L1.
const ROW_BLOCK: usize = 256;

/// [`vector_body`] compiled for the wider vector units too, for f32 ([`Float::VERSIONED`]).
#[multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn vector_on<T: Float>(
    alpha: T,
    operands: (ArrayView1<T>, ArrayView2<T>),
    start: (Start<T>, usize),
    out: ArrayViewMut1<T>,
) {
    let fused = match_target! {
        "x86_64+fma" => true,
        "aarch64+neon" => true,
        _ => false,
    };
    vector_body(fused, alpha, operands, start, out);
}

/// The vector product's loops, inlined where they run.
#[inline(always)]
fn vector_body<T: Float>(
    fused: bool,
    alpha: T,
    (x, mat): (ArrayView1<T>, ArrayView2<T>),
    (start, step): (Start<T>, usize),
    mut out: ArrayViewMut1<T>,
) {
    let mad = |a: T, b: T, sum: T| if fused { a.fused(b, sum) } else { a * b + sum };
    let finish = |j: usize, o: &mut T, sum: T| *o = start.finish(alpha * sum, *o, j * step);
    let columns_contiguous = mat.ncols() == 0 || mat.column(0).as_slice().is_some();
    let rows_contiguous = mat.nrows() == 0 || mat.row(0).as_slice().is_some();
    match x.as_slice() {
        // A weight stored as [N, K]: one contiguous dot product per output.
        Some(xs) if columns_contiguous => {
            for (j, (o, column)) in out.iter_mut().zip(mat.columns()).enumerate() {
                finish(j, o, dot(mad, xs, column.to_slice().unwrap_or_default()));
            }
        }
        // [K, N]: rows of `mat` scaled and summed into a block of outputs at a time.
        _ if rows_contiguous => {
            for (jb, mut block) in out.axis_chunks_iter_mut(Axis(0), ROW_BLOCK).enumerate() {
                let mut sums = [T::ZERO; ROW_BLOCK];
                let sums = &mut sums[..block.len()];
                for (&xv, row) in x.iter().zip(mat.rows()) {
                    let row = &row.to_slice().unwrap_or_default()[jb * ROW_BLOCK..];
                    for (s, &m) in sums.iter_mut().zip(row) {
                        *s = mad(xv, m, *s);
                    }
                }
                for (j, (o, &s)) in block.iter_mut().zip(&*sums).enumerate() {
                    finish(jb * ROW_BLOCK + j, o, s);
                }
            }
        }
        _ => {
            for (j, (o, column)) in out.iter_mut().zip(mat.columns()).enumerate() {
                let sum = (x.iter().zip(column)).fold(T::ZERO, |s, (&a, &b)| mad(a, b, s));
                finish(j, o, sum);
            }
        }
    }
}

/// Lanes of a dot product's partial sums: four AVX-512 vectors of f32, so four chains of
/// multiply-adds overlap.
const DOT_LANES: usize = 64;

/// `Σ x·y` in `DOT_LANES` partial sums (the tail into the first of them), then the partial
/// sums added in halves: in order, one after the other, they took longer than the products
/// of a 544-long row.
#[inline(always)]
fn dot<T: Float>(mad: impl Fn(T, T, T) -> T, x: &[T], y: &[T]) -> T {
    let mut lanes = [T::ZERO; DOT_LANES];
    let (xs, ys) = (x.chunks_exact(DOT_LANES), y.chunks_exact(DOT_LANES));
    let tail = (xs.remainder().iter()).zip(ys.remainder());
    for (xc, yc) in xs.zip(ys) {
        for ((l, &a), &b) in lanes.iter_mut().zip(xc).zip(yc) {
            *l = mad(a, b, *l);
        }
    }
    for (l, (&a, &b)) in lanes.iter_mut().zip(tail) {
        *l = mad(a, b, *l);
    }
    let mut width = DOT_LANES;
    while width > 1 {
        width /= 2;
        let (low, high) = lanes.split_at_mut(width);
        for (l, &h) in low.iter_mut().zip(&*high) {
            *l = *l + h;
        }
    }
    lanes[0]
}

/// Columns are cut at multiples of this, a multiple of every tile's width: pieces then hold
/// whole panels, and a partial panel is never computed twice.
pub(crate) const COLUMN_UNIT: usize = 32;

fn split<T: Float>(
    alpha: T,
    a: OperandA<T>,
    b: OperandB<T>,
    start: Start<T>,
    c: ArrayViewMut2<T>,
    pieces: usize,
) {
    let (m, n) = c.dim();
    let work = m.saturating_mul(n).saturating_mul(a.dim().1);
    let (axis, units, unit) = match n.div_ceil(COLUMN_UNIT) {
        units if m < n && units >= 2 => (Axis(1), units, COLUMN_UNIT),
        _ => (Axis(0), m, 1),
    };
    if pieces < 2 || work < PARALLEL_WORK || units < 2 {
        packed(alpha, a, b, start, c);
        return;
    }
    // Uneven thread counts get proportional shares: 3 threads cut at a third.
    let (p1, p2) = (pieces / 2, pieces - pieces / 2);
    let mid = (units * p1 / pieces).max(1) * unit;
    let (c1, c2) = c.split_at(axis, mid);
    let ((a1, b1, s1), (a2, b2, s2)) = if axis == Axis(0) {
        let (a1, a2) = a.split_rows(mid);
        ((a1, b, start), (a2, b, start.rows_from(mid)))
    } else {
        let (b1, b2) = b.split_columns(mid);
        ((a, b1, start), (a, b2, start))
    };
    parallel::join(
        move || split(alpha, a1, b1, s1, c1, p1),
        move || split(alpha, a2, b2, s2, c2, p2),
    );
}

/// The blocked product with this CPU's tile ([`Float::tiled`]), its buffers taken from this
/// thread's scratch: B's packed panels, a row-major copy of A's block where A's rows are not
/// contiguous, and one of C where C's are not.
fn packed<T: Float>(
    alpha: T,
    a: OperandA<T>,
    b: OperandB<T>,
    start: Start<T>,
    mut c: ArrayViewMut2<T>,
) {
    let (m, n) = c.dim();
    let k = a.dim().1;
    let nr = T::panel_width();
    let kc = k.min(KC);
    let b_len = match b {
        OperandB::Matrix(_) | OperandB::Dequantized(_) => {
            n.min(NC / nr * nr).div_ceil(nr) * nr * kc
        }
        OperandB::Panels(_) | OperandB::Shifted(_) => 0,
    };
    let a_len = if a.rows_in_place() { 0 } else { m.min(MC) * kc };
    with_scratch(b_len, |pb: &mut [T]| {
        with_scratch(a_len, |pa: &mut [T]| {
            if n <= 1 || c.strides()[1] == 1 {
                return packed_here::<T>((alpha, a, b, start), c, (pa, pb));
            }
            with_scratch(m * n, |pc: &mut [T]| {
                let mut copy = ArrayViewMut2::from_shape((m, n), pc).expect("m x n floats");
                copy.assign(&c);
                packed_here::<T>((alpha, a, b, start), copy.view_mut(), (pa, pb));
                c.assign(&copy);
            })
        })
    })
}

/// The rows of A one MC block holds, plus a panel's worth past it for a partial last panel.
const A_ROWS: usize = MC + 8;

/// The blocked product in the version this CPU runs, or in the baseline code for a type not
/// [`Float::VERSIONED`]. Not inlined: `packed` calls it twice, and the baseline product
/// would be inlined at both.
#[inline(never)]
fn packed_here<T: Float>(ab: Operands<T>, c: ArrayViewMut2<T>, scratch: Buffers<T>) {
    if T::VERSIONED {
        packed_on(ab, c, scratch);
    } else {
        T::tiled(Tile::Baseline, false, ab, c, scratch);
    }
}

/// The blocked product, compiled for the wider vector units too; each version runs its own
/// tile, the one [`Tile::for_this_cpu`] names when that version runs.
#[multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn packed_on<T: Float>(ab: Operands<T>, c: ArrayViewMut2<T>, scratch: Buffers<T>) {
    // One rounding per multiply-add where the CPU has the instruction; the tile that suits
    // this version's registers (what `Tile::for_this_cpu` names when it runs).
    let (fused, tile) = match_target! {
        "x86_64+avx512f+avx512vl+avx2+fma+avx" => (true, Tile::Avx512),
        "x86_64+avx2+fma+avx" => (true, Tile::Avx2),
        "aarch64+neon" => (true, Tile::Neon),
        _ => (false, Tile::Baseline),
    };
    T::tiled(tile, fused, ab, c, scratch);
}

/// The blocked product with an `MR x (W·NV)` tile (`NV` vectors of `W` lanes per row); C's
/// rows are contiguous. Inlined into the [`packed_on`] version that runs it.
#[inline(always)]
fn packed_tile<T: Float, const MR: usize, const W: usize, const NV: usize>(
    fused: bool,
    (alpha, a, b, start): Operands<T>,
    mut c: ArrayViewMut2<T>,
    (pa, pb): Buffers<T>,
) {
    let (m, n) = c.dim();
    let k = a.dim().1;
    let nr = W * NV;
    // The rows of a partial panel past C's last row read zeros.
    let zeros = [T::ZERO; KC];
    // Blocks of whole panels, so only the last panel of C's edge is partial.
    let nc_max = NC / nr * nr;
    for jc in (0..n).step_by(nc_max) {
        let nc = nc_max.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let panels = nc.div_ceil(nr);
            // This block's panels and their rows in it.
            let b_block = match b {
                OperandB::Matrix(b) => {
                    let pb = &mut pb[..panels * nr * kc];
                    pack_b(b.slice(s![pc..pc + kc, jc..jc + nc]), nr, pb);
                    Block::Panels(Panels { data: &*pb, k: kc, n: nc, nr }, 0..kc)
                }
                OperandB::Panels(b) => Block::Panels(b.split_at(jc).1, pc..pc + kc),
                OperandB::Dequantized(b) => {
                    let pb = &mut pb[..panels * nr * kc];
                    pack_dequantized(b.slice(pc..pc + kc, jc..jc + nc), nr, pb);
                    Block::Panels(Panels { data: &*pb, k: kc, n: nc, nr }, 0..kc)
                }
                OperandB::Shifted(b) => Block::Shifted(&b.data[jc..], &b.rows[pc..pc + kc]),
            };
            // The first block of k brings in the start; the later ones add to C.
            let first = (pc == 0).then_some(start);
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                // A is read in place, one stream per row of the panel: packing it (as BLIS
                // does) costs as much as the product when C has few columns (a late conv
                // layer's 7x7 pixels against 2048 x 4608 weights).
                let block = match a {
                    OperandA::Matrix(a) => {
                        let block = a.slice_move(s![ic..ic + mc, pc..pc + kc]);
                        if mc > 0 && block.row(0).to_slice().is_none() {
                            copy_rows(block, &mut pa[..mc * kc]);
                        }
                        Some(block)
                    }
                    // Row i of the block at `i * kc`, as a copied block's.
                    OperandA::Dequantized(at) => {
                        at.slice(pc..pc + kc, ic..ic + mc).write(&mut pa[..mc * kc], 1, kc);
                        None
                    }
                };
                let copied = &*pa;
                let a_rows: [&[T]; A_ROWS] = std::array::from_fn(|i| match i < mc {
                    true => (block.as_ref().and_then(|b| b.row(i).to_slice()))
                        .unwrap_or_else(|| &copied[i * kc..][..kc]),
                    false => &zeros[..kc],
                });
                // C's rows are contiguous (`packed` saw to it).
                let mut c_block = c.slice_mut(s![ic..ic + mc, jc..jc + nc]);
                let mut c_rows = c_block.rows_mut().into_iter().map(|r| r.into_slice());
                let mut c_rows: [&mut [T]; MC] =
                    std::array::from_fn(|_| c_rows.next().flatten().unwrap_or_default());
                // A's rows stay in L1 while B's block streams past them from L2, two vectors
                // per k in order. The other way round (B's panel in L1, A's rows streaming)
                // ran at 80% of this speed: A's scattered rows evicted B's panel.
                for i0 in (0..mc).step_by(MR) {
                    let rows = i0..(i0 + MR).min(mc);
                    for jp in 0..panels {
                        let b_panel = b_block.panel(jp, nr);
                        let cols = jp * nr..((jp + 1) * nr).min(nc);
                        let a_panel: &[&[T]; MR] = a_rows[i0..i0 + MR].try_into().unwrap();
                        let (c_tile, start) = (&mut c_rows[rows.clone()], first);
                        let start = start.map(|s| s.rows_from(ic + i0));
                        if cols.len() <= W {
                            // A last panel no wider than one vector (14x14 images end with
                            // 4 columns of 32): one vector of the tile does its sums.
                            let acc = tile_sums::<T, MR, W, 1, NV>(fused, a_panel, b_panel);
                            store(&acc, c_tile, cols, alpha, start);
                        } else {
                            let acc = tile_sums::<T, MR, W, NV, NV>(fused, a_panel, b_panel);
                            store(&acc, c_tile, cols, alpha, start);
                        }
                    }
                }
            }
        }
    }
}

/// One block of B (`kc` rows, the block's columns) as the microkernel reads it.
enum Block<'a, T> {
    /// Packed panels, and the rows of each that the block holds.
    Panels(Panels<'a, T>, Range<usize>),
    /// A [`Shifted`] B from the block's first column: its data and the block's row offsets.
    Shifted(&'a [T], &'a [usize]),
}

/// One panel of a [`Block`].
enum Panel<'a, T> {
    Packed(&'a [T]),
    Shifted(&'a [T], &'a [usize]),
}

impl<'a, T: Float> Block<'a, T> {
    #[inline(always)]
    fn panel(&self, p: usize, nr: usize) -> Panel<'a, T> {
        match self {
            Self::Panels(panels, rows) => Panel::Packed(panels.block(p, rows.clone())),
            Self::Shifted(data, rows) => Panel::Shifted(&data[p * nr..], rows),
        }
    }
}

/// The tile's sums over one panel of B, read where it lies.
#[inline(always)]
fn tile_sums<T: Float, const MR: usize, const W: usize, const NV: usize, const S: usize>(
    fused: bool,
    a_rows: &[&[T]; MR],
    b: Panel<T>,
) -> [[[T; W]; NV]; MR] {
    match b {
        Panel::Packed(panel) => microkernel::<T, MR, W, NV, S>(fused, a_rows, panel),
        Panel::Shifted(data, rows) => {
            microkernel_shifted::<T, MR, W, NV>(fused, a_rows, data, rows)
        }
    }
}

/// `W` lanes of a vector register. The wrapper is what LLVM needs to see a tile row as
/// registers: over bare nested arrays it vectorizes across rows instead, with gathers.
#[derive(Clone, Copy)]
struct Lanes<T, const W: usize>([T; W]);

/// `MR x (W·NV)` sums over `MR` rows of A (`kc` values each) and the first `NV` vectors of
/// a packed B panel (`W·S` values per k), held in registers. Needs opt-level 3 (the
/// workspace sets it for this crate).
#[inline(always)]
fn microkernel<T: Float, const MR: usize, const W: usize, const NV: usize, const S: usize>(
    fused: bool,
    a_rows: &[&[T]; MR],
    b_panel: &[T],
) -> [[[T; W]; NV]; MR] {
    let mut acc = [[Lanes([T::ZERO; W]); NV]; MR];
    // Four values of k per turn of the loop, so that its counters take fewer of the issue
    // slots the multiply-adds need; then the last few one at a time.
    let kc = b_panel.len() / (W * S);
    let (whole, rest) = b_panel.split_at(kc / UNROLL * UNROLL * W * S);
    let load = |b: &[T], u: usize| lanes::<T, W, NV>(&b[u * S * W..]);
    steps::<T, MR, W, NV, UNROLL, _>(
        fused,
        a_rows,
        0,
        whole.chunks_exact(UNROLL * W * S),
        load,
        &mut acc,
    );
    let done = kc / UNROLL * UNROLL;
    steps::<T, MR, W, NV, 1, _>(fused, a_rows, done, rest.chunks_exact(W * S), load, &mut acc);
    acc.map(|row| row.map(|v| v.0))
}

/// [`microkernel`] over a [`Shifted`] B: B's row k is `NV` vectors at `data[rows[k]..]`.
#[inline(always)]
fn microkernel_shifted<T: Float, const MR: usize, const W: usize, const NV: usize>(
    fused: bool,
    a_rows: &[&[T]; MR],
    data: &[T],
    rows: &[usize],
) -> [[[T; W]; NV]; MR] {
    let mut acc = [[Lanes([T::ZERO; W]); NV]; MR];
    let load = |r: &[usize], u: usize| lanes::<T, W, NV>(&data[r[u]..]);
    let whole = rows.chunks_exact(UNROLL);
    let (done, rest) = (rows.len() / UNROLL * UNROLL, whole.remainder());
    steps::<T, MR, W, NV, UNROLL, _>(fused, a_rows, 0, whole, load, &mut acc);
    steps::<T, MR, W, NV, 1, _>(fused, a_rows, done, rest.chunks_exact(1), load, &mut acc);
    acc.map(|row| row.map(|v| v.0))
}

/// The first `NV` vectors of `b`.
#[inline(always)]
fn lanes<T: Float, const W: usize, const NV: usize>(b: &[T]) -> [Lanes<T, W>; NV] {
    let b = &b[..W * NV];
    std::array::from_fn(|v| Lanes(b[v * W..][..W].try_into().unwrap()))
}

/// Values of k per turn of the microkernel's loop.
const UNROLL: usize = 4;

/// Adds the products of k in `from..` (`U` values per turn, `turns` yielding what `load`
/// reads B's row of each from) to the sums.
#[inline(always)]
fn steps<T: Float, const MR: usize, const W: usize, const NV: usize, const U: usize, B: Copy>(
    fused: bool,
    a_rows: &[&[T]; MR],
    from: usize,
    turns: impl Iterator<Item = B>,
    load: impl Fn(B, usize) -> [Lanes<T, W>; NV],
    acc: &mut [[Lanes<T, W>; NV]; MR],
) {
    const { assert!(MR <= 8, "rows! below writes out 8 rows") };
    // One iterator over B's turns and the 8 rows zipped: LLVM then runs it on one index with
    // no bounds check per row (rows past MR repeat the last one; their loads are dead).
    let row = |i: usize| a_rows[i.min(MR - 1)][from..].chunks_exact(U);
    let turns = turns
        .zip(row(0))
        .zip(row(1))
        .zip(row(2))
        .zip(row(3))
        .zip(row(4))
        .zip(row(5))
        .zip(row(6))
        .zip(row(7));
    for ((((((((b_turn, x0), x1), x2), x3), x4), x5), x6), x7) in turns {
        let a = [x0, x1, x2, x3, x4, x5, x6, x7];
        #[allow(clippy::needless_range_loop)] // u picks B's row and a value of each A row
        for u in 0..U {
            let b = load(b_turn, u);
            // The rows are written out: given a loop over them, LLVM may vectorize across
            // rows (gathering and scattering the sums) instead of keeping each in registers.
            macro_rules! rows {
                ($($i:literal)*) => {$(
                    if $i < MR {
                        for v in 0..NV {
                            multiply_add(fused, a[$i][u], &b[v], &mut acc[$i][v]);
                        }
                    }
                )*};
            }
            rows!(0 1 2 3 4 5 6 7);
        }
    }
}

/// `sum += a·b` over one vector's lanes.
#[inline(always)]
fn multiply_add<T: Float, const W: usize>(
    fused: bool,
    a: T,
    b: &Lanes<T, W>,
    sum: &mut Lanes<T, W>,
) {
    for (s, &bv) in sum.0.iter_mut().zip(&b.0) {
        *s = if fused { a.fused(bv, *s) } else { a * bv + *s };
    }
}

/// Writes a tile's sums into `cols` of C's `rows`: onto the `first` start for the first block
/// of k, `C + alpha·sum` for the later ones. Sums past C's edge (fewer rows, fewer columns)
/// are dropped.
#[inline(always)]
fn store<T: Float, const MR: usize, const W: usize, const NV: usize>(
    acc: &[[[T; W]; NV]; MR],
    rows: &mut [&mut [T]],
    cols: Range<usize>,
    alpha: T,
    first: Option<Start<T>>,
) {
    let finish = |r: usize, sums: &[T], row: &mut [T]| match first {
        Some(start) => start.finish_run(r, alpha, sums, row),
        None => (row.iter_mut().zip(sums)).for_each(|(c, &x)| *c = *c + alpha * x),
    };
    for (r, (sums, row)) in acc.iter().zip(rows).enumerate() {
        let row = &mut row[cols.clone()];
        if row.len() == W * NV {
            // A whole tile row, a vector at a time: each run's length is known to LLVM,
            // which then writes it with no loop.
            for (sums, row) in sums.iter().zip(row.chunks_exact_mut(W)) {
                let row: &mut [T; W] = row.try_into().unwrap();
                finish(r, sums, row);
            }
        } else {
            finish(r, &sums.as_flattened()[..row.len()], row);
        }
    }
}

/// Packs a `kc x nc` block of B into panels of `nr` columns, each `kc` rows of `nr` values
/// (zeros past B's last column). Reads B along whichever of its axes is contiguous.
#[inline(always)]
fn pack_b<T: Float>(b: ArrayView2<T>, nr: usize, pb: &mut [T]) {
    let (kc, nc) = b.dim();
    let panel_len = nr * kc;
    if panel_len == 0 {
        return;
    }
    if nc % nr != 0 {
        // The last panel's columns past B's edge.
        let last = &mut pb[nc / nr * panel_len..][..panel_len];
        for row in last.chunks_exact_mut(nr) {
            row[nc % nr..].fill(T::ZERO);
        }
    }
    if b.row(0).as_slice().is_some() {
        // Panel after panel, each written front to back while B's rows are read `nr` values
        // at a time. Row after row (one stream read, one written per panel) ran 15-20% slower
        // on products with few rows of A, where packing B is a large part of the work.
        let rows: [&[T]; KC] = std::array::from_fn(|i| match i < kc {
            true => b.row(i).to_slice().unwrap_or_default(),
            false => &[],
        });
        let (whole, last) = pb[..nc.div_ceil(nr) * panel_len].split_at_mut(nc / nr * panel_len);
        for (p, panel) in whole.chunks_exact_mut(panel_len).enumerate() {
            for (row, dst) in rows[..kc].iter().zip(panel.chunks_exact_mut(nr)) {
                // A copy of constant length (nr is the tile's width here) compiles to a few
                // vector moves, not a call to memmove.
                dst.copy_from_slice(&row[p * nr..][..nr]);
            }
        }
        for (row, dst) in rows[..kc].iter().zip(last.chunks_exact_mut(nr)) {
            dst[..nc % nr].copy_from_slice(&row[nc / nr * nr..]);
        }
        return;
    }
    // B transposed in memory (a weight as [N, K]), or strided both ways: a column at a time.
    for (j, column) in b.columns().into_iter().enumerate() {
        let panel = &mut pb[j / nr * panel_len..][..panel_len];
        let dst = panel[j % nr..].iter_mut().step_by(nr);
        // The same copy; over a slice when the column is one, which iterates faster.
        match column.to_slice() {
            Some(column) => dst.zip(column).for_each(|(d, &v)| *d = v),
            None => dst.zip(column).for_each(|(d, &v)| *d = v),
        }
    }
}

/// [`pack_b`] of a [`Dequantized`] block: each panel's columns dequantized into it, zeros
/// past B's last column.
#[inline(always)]
fn pack_dequantized<T: Float>(b: Dequantized, nr: usize, pb: &mut [T]) {
    let (kc, nc) = b.dim();
    let panel_len = nr * kc;
    if let Narrow::F16(h) = b.values
        && nc <= NC
        && h.strides()[1] == 1
    {
        // Float16 rows widened whole, one conversion each, then cut into the panels: widening
        // a panel's `nr` values at a time cost a call per row of every panel.
        let mut wide = [T::ZERO; NC];
        let wide = &mut wide[..nc];
        let rows = h.rows().into_iter().filter_map(|row| row.to_slice());
        for (k, row) in rows.enumerate() {
            T::widen(row, wide);
            for (p, run) in wide.chunks(nr).enumerate() {
                let dst = &mut pb[p * panel_len + k * nr..][..nr];
                dst[..run.len()].copy_from_slice(run);
                dst[run.len()..].fill(T::ZERO);
            }
        }
        return;
    }
    for (p, panel) in pb[..nc.div_ceil(nr) * panel_len].chunks_exact_mut(panel_len).enumerate() {
        let cols = p * nr..((p + 1) * nr).min(nc);
        if cols.len() < nr {
            for row in panel.chunks_exact_mut(nr) {
                row[cols.len()..].fill(T::ZERO);
            }
        }
        b.slice(0..kc, cols).write(panel, nr, 1);
    }
}

/// Copies a block of A whose rows are not contiguous (A transposed in memory) row by row.
#[inline(always)]
fn copy_rows<T: Float>(a: ArrayView2<T>, to: &mut [T]) {
    for (row, dst) in a.rows().into_iter().zip(to.chunks_exact_mut(a.ncols())) {
        row.iter().zip(dst).for_each(|(&v, d)| *d = v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(a: &[f32], la: Layout) -> OperandA<'_, f32> {
        OperandA::Matrix(la.view("A", a).unwrap())
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    #[test]
    fn threads_split_the_product_and_change_no_bit() {
        // 256 x 700 x 200: above the threshold; odd thread counts make uneven halves.
        let (m, k, n) = (256, 700, 200);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0).collect();
        let run = |threads, m, n| {
            let mut c = vec![1.0f32; m * n];
            let (la, lb) = (Layout::row_major(m, k), Layout::row_major(k, n));
            pool(threads)
                .install(|| {
                    gemm(
                        1.0,
                        &a[..m * k],
                        la,
                        &b[..k * n],
                        lb,
                        0.5,
                        &mut c,
                        Layout::row_major(m, n),
                    )
                })
                .unwrap();
            c
        };
        assert!(m * n * k >= PARALLEL_WORK);
        let one = run(1, m, n);
        assert_eq!(run(2, m, n), one);
        assert_eq!(run(3, m, n), one);
        // Wider than tall: split by columns.
        let wide = |threads| {
            let b: Vec<f32> = (0..k * 2100).map(|i| (i % 13) as f32).collect();
            let mut c = vec![0.0f32; 24 * 2100];
            let (la, lb) = (Layout::row_major(24, k), Layout::row_major(k, 2100));
            pool(threads)
                .install(|| {
                    gemm(1.0, &a[..24 * k], la, &b, lb, 0.0, &mut c, Layout::row_major(24, 2100))
                })
                .unwrap();
            c
        };
        assert!(24 * k * 2100 >= PARALLEL_WORK);
        assert_eq!(wide(4), wide(1));
        // The same with B's rows read in place, in reverse order (a [`Shifted`] B).
        let shifted = |threads| {
            let data: Vec<f32> = (0..k * 2100 + 32).map(|i| (i % 13) as f32).collect();
            let rows: Vec<usize> = (0..k).rev().map(|r| r * 2100).collect();
            let b = Shifted::new(&data, &rows, 2100).unwrap();
            let mut c = vec![0.0f32; 24 * 2100];
            let cv = Layout::row_major(24, 2100).view_mut("C", &mut c).unwrap();
            let product = || {
                let a = matrix(&a[..24 * k], Layout::row_major(24, k));
                gemm_operands(1.0, a, OperandB::Shifted(b), Start::scaled(0.0), cv)
            };
            pool(threads).install(product).unwrap();
            c
        };
        assert_eq!(shifted(4), shifted(1));
        // A 1x1 product cannot split: still right.
        assert_eq!(run(8, 1, 1), run(1, 1, 1));
        // One row of C (B read as [K, N], then as [N, K]): outputs cut between threads.
        let n = 3000;
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0).collect();
        assert!(k * n >= VECTOR_PARALLEL_WORK);
        for lb in [Layout::row_major(k, n), Layout::new(k, n, 1, k)] {
            let row = |threads| {
                let mut c = vec![1.0f32; n];
                let lc = Layout::row_major(1, n);
                let product =
                    || gemm(1.0, &a[..k], Layout::row_major(1, k), &b, lb, 0.5, &mut c, lc);
                pool(threads).install(product).unwrap();
                c
            };
            let one = row(1);
            assert_eq!(row(2), one, "{lb:?}");
            assert_eq!(row(3), one, "{lb:?}");
        }
    }

    /// `alpha·A·B + beta·C + bias` (bias[i] on row i) by the definition, in f64.
    fn reference(
        alpha: f64,
        (a, la): (&[f32], Layout),
        (b, lb): (&[f32], Layout),
        (beta, bias): (f64, Option<&[f32]>),
        (c, lc): (&[f32], Layout),
    ) -> Vec<f32> {
        let mut out = c.to_vec();
        for i in 0..lc.rows {
            for j in 0..lc.cols {
                let sum: f64 = (0..la.cols)
                    .map(|p| {
                        f64::from(a[i * la.rs + p * la.cs]) * f64::from(b[p * lb.rs + j * lb.cs])
                    })
                    .sum();
                let at = i * lc.rs + j * lc.cs;
                let bias = bias.map_or(0.0, |b| f64::from(b[i]));
                out[at] = (alpha * sum + beta * f64::from(c[at]) + bias) as f32;
            }
        }
        out
    }

    /// B written as panels of `nr` columns, element by element.
    fn panels_of(b: ArrayView2<f32>, nr: usize) -> Vec<f32> {
        let (k, n) = b.dim();
        let mut data = vec![0.0; n.div_ceil(nr) * nr * k];
        for ((i, j), &v) in b.indexed_iter() {
            data[(j / nr * k + i) * nr + j % nr] = v;
        }
        data
    }

    fn view(l: Layout, values: &mut [f32]) -> ArrayViewMut2<'_, f32> {
        ArrayViewMut2::from_shape(l.shape().unwrap(), values).unwrap()
    }

    #[test]
    fn every_edge_of_the_blocking_matches_the_definition() {
        // Small integers: every sum is exact in f32, so the packed product must equal the
        // definition bit for bit. Each tile shape runs here (the code of this CPU's clone),
        // on sizes that straddle the tiles (n = 33 and 40 end in a panel one vector wide, which
        // a narrower tile sums), KC, MC and NC; A and B are also read transposed,
        // C has a row stride wider than its rows, and a bias may start each row.
        // B is also given as panels, of each tile's width.
        // Each tile in its own scratch (as `packed` gives it, rows of C contiguous).
        fn product(
            tile: Tile,
        ) -> impl Fn(f32, ArrayView2<f32>, OperandB<f32>, Start<f32>, ArrayViewMut2<f32>) {
            move |alpha, a, b, start, c| {
                let (mut pa, mut pb) = (vec![0.0; MC * KC], vec![0.0; NC * KC]);
                f32::tiled(
                    tile,
                    false,
                    (alpha, OperandA::Matrix(a), b, start),
                    c,
                    (&mut pa, &mut pb),
                );
            }
        }
        let tiles = [
            (product(Tile::Avx512), 32),
            (product(Tile::Avx2), 16),
            (product(Tile::Neon), 16),
            (product(Tile::Baseline), 8),
        ];
        let value = |i: usize| ((i * 7 + 3) % 9) as f32 - 4.0;
        for (m, k, n) in [
            (1, 1, 1),
            (7, 3, 33),
            (9, 257, 17),
            (130, 520, 40),
            (3, 300, 1100),
            // One row or one column of C: the vector product, both ways round.
            (1, 300, 700),
            (70, 300, 1),
        ] {
            let a: Vec<f32> = (0..m * k).map(value).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(i + 5)).collect();
            let lc = Layout::new(m, n, n + 3, 1);
            let c: Vec<f32> = (0..m * (n + 3)).map(|i| value(i + 1)).collect();
            let bias: Vec<f32> = (0..m).map(|i| value(i + 2)).collect();
            for (la, lb) in [
                (Layout::row_major(m, k), Layout::row_major(k, n)),
                (Layout::new(m, k, 1, m), Layout::new(k, n, 1, k)),
            ] {
                let starts = [(1.0, 0.0, None), (2.0, 0.5, None), (1.0, 1.0, None)]
                    .into_iter()
                    .chain([(1.0, 0.0, Some(&bias[..])), (2.0, 1.0, Some(&bias[..]))]);
                for (alpha, beta, bias) in starts {
                    let (ab, bb) = ((&a[..], la), (&b[..], lb));
                    let want = reference(alpha.into(), ab, bb, (beta.into(), bias), (&c, lc));
                    let at = |got: &[f32]| got.iter().zip(&want).position(|(g, w)| g != w);
                    let mut got = c.clone();
                    let start = Start { beta, bias };
                    gemm_into(alpha, ab, bb, start, view(lc, &mut got)).unwrap();
                    assert_eq!(at(&got), None, "{m}x{k}x{n} {la:?} {lb:?} {start:?}");
                    let av = ArrayView2::from_shape(la.shape().unwrap(), &a).unwrap();
                    let bv = ArrayView2::from_shape(lb.shape().unwrap(), &b).unwrap();
                    for (t, (tile, nr)) in tiles.iter().enumerate() {
                        let nr = *nr;
                        let mut got = c.clone();
                        tile(alpha, av, OperandB::Matrix(bv), start, view(lc, &mut got));
                        assert_eq!(at(&got), None, "tile {t}: {m}x{k}x{n} {la:?} {lb:?}");
                        let data = panels_of(bv, nr);
                        let panels = OperandB::Panels(Panels { data: &data, k, n, nr });
                        let mut got = c.clone();
                        tile(alpha, av, panels, start, view(lc, &mut got));
                        assert_eq!(at(&got), None, "tile {t} panels: {m}x{k}x{n} {la:?}");
                        // B's rows read in place, each from its own offset (whole panels
                        // past the last column are read and dropped).
                        let data = [&b[..], &[f32::NAN; 32]].concat();
                        let rows: Vec<usize> = (0..k).map(|r| r * lb.rs).collect();
                        let shifted = OperandB::Shifted(Shifted { data: &data, rows: &rows, n });
                        if lb.cs == 1 {
                            let mut got = c.clone();
                            tile(alpha, av, shifted, start, view(lc, &mut got));
                            assert_eq!(at(&got), None, "tile {t} shifted: {m}x{k}x{n} {la:?}");
                        }
                    }
                }
            }
        }
        // With k = 0 the sum is empty: C = beta·C.
        let mut c = [3.0f32, -1.0];
        let l = Layout::row_major(1, 2);
        gemm(1.0, &[], Layout::row_major(1, 0), &[], Layout::row_major(0, 2), 2.0, &mut c, l)
            .unwrap();
        assert_eq!(c, [6.0, -2.0]);
    }

    #[test]
    fn multiplies_strided_operands_and_accumulates() {
        // A = [[1, 2], [3, 4]] stored transposed; B = [[5], [6]]; C starts at [[1], [1]] with
        // its rows two apart. By hand: C = 2·A·B + C = [[2·17 + 1], [2·39 + 1]].
        let a = [1.0, 3.0, 2.0, 4.0];
        let mut c = [1.0f32, -7.0, 1.0];
        let (la, lb, lc) =
            (Layout::new(2, 2, 1, 2), Layout::row_major(2, 1), Layout::new(2, 1, 2, 1));
        gemm(2.0, &a, la, &[5.0, 6.0], lb, 1.0, &mut c, lc).unwrap();
        assert_eq!(c, [35.0, -7.0, 79.0]);
        let mut c64 = [1.0f64, -7.0, 1.0];
        let a64 = a.map(f64::from);
        gemm(1.0, &a64, la, &[5.0, 6.0], lb, 0.0, &mut c64, lc).unwrap();
        assert_eq!(c64, [17.0, -7.0, 39.0]);
    }

    #[test]
    fn broadcasts_zero_strides_in_the_inputs() {
        // A's rows are one row [1, 2] repeated, B is one column [3] repeated: every element of
        // C is 1·3 + 2·3 = 9.
        let mut c = [0.0f32; 6];
        let (la, lb) = (Layout::new(3, 2, 0, 1), Layout::new(2, 2, 0, 0));
        gemm(1.0, &[1.0, 2.0], la, &[3.0], lb, 0.0, &mut c[..6], Layout::new(3, 2, 2, 1)).unwrap();
        assert_eq!(c, [9.0; 6]);
    }

    #[test]
    fn misfits_are_errors_not_panics() {
        let l = Layout::row_major(2, 2);
        let mut c = [0.0f32; 4];
        // Too short, shapes that do not chain, C repeating an element, a stride past isize.
        assert!(gemm(1.0, &[0.0; 3], l, &[0.0; 4], l, 0.0, &mut c, l).is_err());
        let wide = Layout::row_major(2, 3);
        assert!(gemm(1.0, &[0.0; 6], wide, &[0.0; 4], l, 0.0, &mut c, l).is_err());
        let aliased = Layout::new(2, 2, 1, 1);
        assert!(gemm(1.0, &[0.0; 4], l, &[0.0; 4], l, 0.0, &mut c, aliased).is_err());
        let huge = Layout::new(2, 2, usize::MAX, 1);
        assert!(gemm(1.0, &[0.0; 4], huge, &[0.0; 4], l, 0.0, &mut c, l).is_err());
        // Panels: too few values for the matrix, or a matrix that does not chain.
        let len = Panels::<f32>::len(2, 2);
        assert!(Panels::new(&vec![0.0; len - 1], 2, 2).is_err());
        let b = vec![0.0; Panels::<f32>::len(3, 2)];
        let b = Panels::new(&b, 3, 2).unwrap();
        let start = Start::scaled(0.0);
        let a = matrix(&[0.0; 4], l);
        assert!(gemm_operands(1.0, a, OperandB::Panels(b), start, view(l, &mut c)).is_err());
        // Shifted: a row's window (whole panels) past the data, or rows that do not chain.
        let width = Shifted::<f32>::width(2);
        assert!(Shifted::new(&vec![0.0f32; width + 2], &[0, 3], 2).is_err());
        let data = vec![0.0; width + 2];
        let b = Shifted::new(&data, &[0, 1, 2], 2).unwrap();
        assert!(gemm_operands(1.0, a, OperandB::Shifted(b), start, view(l, &mut c)).is_err());
    }

    #[test]
    fn panels_are_the_product_of_the_matrix_on_any_pool() {
        // Wide enough to be cut by columns between threads, tall enough to be cut by rows,
        // and one panel's worth (read as a matrix).
        let value = |i: usize| ((i * 7 + 3) % 9) as f32 - 4.0;
        for (m, k, n) in [(24, 300, 2100), (300, 200, 70), (5, 40, 3)] {
            let a: Vec<f32> = (0..m * k).map(value).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(i + 5)).collect();
            let (la, lb, lc) =
                (Layout::row_major(m, k), Layout::row_major(k, n), Layout::row_major(m, n));
            let bias: Vec<f32> = (0..m).map(value).collect();
            let start = Start { beta: 0.0, bias: Some(&bias[..]) };
            let mut want = vec![0.0; m * n];
            gemm_into(1.0, (&a, la), (&b, lb), start, view(lc, &mut want)).unwrap();
            let bv = ArrayView2::from_shape(lb.shape().unwrap(), &b).unwrap();
            let data = panels_of(bv, f32::panel_width());
            for threads in [1, 2, 3] {
                let mut got = vec![0.0; m * n];
                let panels = Panels::new(&data, k, n).unwrap();
                let (a, b) = (matrix(&a, la), OperandB::Panels(panels));
                let product = || gemm_operands(1.0, a, b, start, view(lc, &mut got));
                pool(threads).install(product).unwrap();
                assert_eq!(got, want, "{m}x{k}x{n} on {threads} threads");
            }
        }
    }

    #[test]
    fn dequantized_b_is_the_product_of_its_float_values_to_the_bit() {
        // A vector product cut between threads, one column of C, the packed product cut by
        // rows and by columns, partial panels, a contraction longer than one block; B stored
        // [K, N] and [N, K]; int8 and uint8.
        let shapes =
            [(1, 300, 3000), (1, 7, 5), (5, 1, 9), (37, 300, 75), (9, 600, 1), (64, 520, 900)];
        for (m, k, n) in shapes {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let ints: Vec<i32> = (0..k * n).map(|i| (i * 53 % 251) as i32).collect();
            let scale: Vec<f32> = (0..n).map(|j| 0.01 + j as f32 * 1e-3).collect();
            let zero: Vec<f32> = (0..n).map(|j| (j % 7) as f32 - 3.0).collect();
            let (la, lc) = (Layout::row_major(m, k), Layout::row_major(m, n));
            for transposed in [false, true] {
                let lb = if transposed { Layout::new(k, n, 1, k) } else { Layout::row_major(k, n) };
                let signed: Vec<i8> = ints.iter().map(|&v| (v - 125) as i8).collect();
                let unsigned: Vec<u8> = ints.iter().map(|&v| v as u8).collect();
                let bias: Vec<f32> = (0..m).map(|i| i as f32 - 2.0).collect();
                let start = Start { beta: 0.5, bias: Some(&bias[..]) };
                let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
                for is_signed in [true, false] {
                    // The float B: DequantizeLinear's values, element (r, j) at r·rs + j·cs.
                    let level = |i: usize| match is_signed {
                        true => i32::from(signed[i]),
                        false => i32::from(unsigned[i]),
                    };
                    let mut b = vec![0.0f32; k * n];
                    for (r, j) in (0..k).flat_map(|r| (0..n).map(move |j| (r, j))) {
                        let at = r * lb.rs + j * lb.cs;
                        b[at] = (level(at) - zero[j] as i32) as f32 * scale[j];
                    }
                    let mut want = c0.clone();
                    gemm_into(0.75, (&a, la), (&b, lb), start, view(lc, &mut want)).unwrap();
                    for threads in [1, 3] {
                        let values = match is_signed {
                            true => Narrow::I8(
                                ArrayView2::from_shape(lb.shape().unwrap(), &signed[..]).unwrap(),
                            ),
                            false => Narrow::U8(
                                ArrayView2::from_shape(lb.shape().unwrap(), &unsigned[..]).unwrap(),
                            ),
                        };
                        let quantized = Dequantized::new(values, &scale, &zero).unwrap();
                        let mut got = c0.clone();
                        let product = || {
                            gemm_dequantized(0.75, (&a, la), quantized, start, view(lc, &mut got))
                        };
                        pool(threads).install(product).unwrap();
                        let what =
                            format!("{m}x{k}x{n}, B {lb:?}, signed {is_signed}, {threads} threads");
                        assert_eq!(got, want, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn dequantized_a_is_the_product_of_its_float_values_to_the_bit() {
        // A conv's int8 weights, one scale and zero point per row: one row of C, one column,
        // the packed product cut by rows and by columns, more rows than a block of A, a
        // contraction longer than one block; B a matrix and panels; int8 and uint8.
        let shapes =
            [(1, 300, 3000), (1, 7, 5), (5, 1, 9), (37, 300, 75), (9, 600, 1), (200, 520, 90)];
        for (m, k, n) in shapes {
            let ints: Vec<i32> = (0..m * k).map(|i| (i * 53 % 251) as i32).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let scale: Vec<f32> = (0..m).map(|i| 0.01 + i as f32 * 1e-3).collect();
            let zero: Vec<f32> = (0..m).map(|i| (i % 7) as f32 - 3.0).collect();
            let lc = Layout::row_major(m, n);
            let signed: Vec<i8> = ints.iter().map(|&v| (v - 125) as i8).collect();
            let unsigned: Vec<u8> = ints.iter().map(|&v| v as u8).collect();
            let bias: Vec<f32> = (0..m).map(|i| i as f32 - 2.0).collect();
            let start = Start { beta: 0.5, bias: Some(&bias[..]) };
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
            let nr = f32::panel_width();
            // Panel p's row r at (p·k + r)·nr, zeros past B's last column.
            let panels: Vec<f32> = (0..Panels::<f32>::len(k, n))
                .map(|i| (i / nr / k, i / nr % k, i % nr))
                .map(|(p, r, l)| if p * nr + l < n { b[r * n + p * nr + l] } else { 0.0 })
                .collect();
            for is_signed in [true, false] {
                let level = |i: usize| match is_signed {
                    true => i32::from(signed[i]),
                    false => i32::from(unsigned[i]),
                };
                let a: Vec<f32> = (0..m * k)
                    .map(|i| (level(i) - zero[i / k] as i32) as f32 * scale[i / k])
                    .collect();
                // Aᵀ: k x m, columns contiguous.
                let at = (k, m).strides((1, k));
                let values = match is_signed {
                    true => Narrow::I8(ArrayView2::from_shape(at, &signed[..]).unwrap()),
                    false => Narrow::U8(ArrayView2::from_shape(at, &unsigned[..]).unwrap()),
                };
                let quantized =
                    OperandA::Dequantized(Dequantized::new(values, &scale, &zero).unwrap());
                let matrix = OperandB::Matrix(ArrayView2::from_shape((k, n), &b[..]).unwrap());
                let packed = OperandB::Panels(Panels::new(&panels, k, n).unwrap());
                for (threads, b) in [(1, matrix), (3, matrix), (2, packed)] {
                    // The float A with the same B, on one thread.
                    let mut want = c0.clone();
                    let float = OperandA::Matrix(ArrayView2::from_shape((m, k), &a[..]).unwrap());
                    gemm_operands(0.75, float, b, start, view(lc, &mut want)).unwrap();
                    let mut got = c0.clone();
                    let product = || gemm_operands(0.75, quantized, b, start, view(lc, &mut got));
                    pool(threads).install(product).unwrap();
                    let what = format!("{m}x{k}x{n}, signed {is_signed}, {threads} threads, {b:?}");
                    assert_eq!(got, want, "{}", &what[..what.len().min(80)]);
                }
            }
        }
    }

    #[test]
    fn float16_operands_are_the_product_of_their_widened_values_to_the_bit() {
        // A float16 B stored [K, N] and [N, K] (a vector product cut between threads, the
        // packed product, partial panels, K past one block), and a float16 Aᵀ (a conv's W).
        let shapes = [(1, 300, 3000), (1, 7, 5), (5, 1, 9), (37, 300, 75), (9, 600, 1)];
        for (m, k, n) in shapes {
            let halves = |len: usize, seed: usize| -> Vec<f16> {
                (0..len).map(|i| f16::from_f32(((i * seed % 211) as f32 - 105.0) / 9.0)).collect()
            };
            let (ha, hb) = (halves(m * k, 37), halves(k * n, 53));
            let wide = |h: &[f16]| -> Vec<f32> { h.iter().map(|v| v.to_f32()).collect() };
            let (a, b) = (wide(&ha), wide(&hb));
            let lc = Layout::row_major(m, n);
            let bias: Vec<f32> = (0..m).map(|i| i as f32 - 2.0).collect();
            let start = Start { beta: 0.5, bias: Some(&bias[..]) };
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
            for transposed in [false, true] {
                let lb = if transposed { Layout::new(k, n, 1, k) } else { Layout::row_major(k, n) };
                let la = Layout::row_major(m, k);
                let mut want = c0.clone();
                gemm_into(0.75, (&a, la), (&b, lb), start, view(lc, &mut want)).unwrap();
                for threads in [1, 3] {
                    let half = Dequantized::half(
                        ArrayView2::from_shape(lb.shape().unwrap(), &hb[..]).unwrap(),
                    );
                    let mut got = c0.clone();
                    let product =
                        || gemm_dequantized(0.75, (&a, la), half, start, view(lc, &mut got));
                    pool(threads).install(product).unwrap();
                    assert_eq!(got, want, "{m}x{k}x{n}, B {lb:?}, {threads} threads");
                }
            }
            // Aᵀ: k x m, columns contiguous, as a conv hands its weights.
            let at = (k, m).strides((1, k));
            let half = OperandA::Dequantized(Dequantized::half(
                ArrayView2::from_shape(at, &ha[..]).unwrap(),
            ));
            let float = OperandA::Matrix(ArrayView2::from_shape((m, k), &a[..]).unwrap());
            let bm = OperandB::Matrix(ArrayView2::from_shape((k, n), &b[..]).unwrap());
            let mut want = c0.clone();
            gemm_operands(0.75, float, bm, start, view(lc, &mut want)).unwrap();
            let mut got = c0.clone();
            pool(2).install(|| gemm_operands(0.75, half, bm, start, view(lc, &mut got))).unwrap();
            assert_eq!(got, want, "{m}x{k}x{n}, float16 A");
        }
        let h = [f16::ZERO; 6];
        let values = Narrow::F16(ArrayView2::from_shape((2, 3), &h[..]).unwrap());
        assert!(Dequantized::new(values, &[1.0; 3], &[0.0; 3]).is_err(), "float16 has no scales");
    }

    #[test]
    fn dequantized_b_needs_a_scale_and_zero_point_per_column() {
        let q = [0i8; 6];
        let values = Narrow::I8(ArrayView2::from_shape((2, 3), &q[..]).unwrap());
        assert!(Dequantized::new(values, &[1.0; 2], &[0.0; 3]).is_err());
        assert!(Dequantized::new(values, &[1.0; 3], &[0.0; 1]).is_err());
        assert!(Dequantized::new(values, &[1.0; 3], &[0.0; 3]).is_ok());
    }
}
