//! The one engine behind MatMul, Gemm and Einsum: a strided, batched product
//! `C[..] += alpha * Σ A[..] * B[..]` over a list of axes.
//!
//! Every axis is an index with an extent and an element stride in A, in B and in C (0 where
//! the index does not address that operand or where the operand is broadcast along it). What
//! an axis is follows from its strides: in A, B and C it is a batch axis, in A and C a row
//! (M), in B and C a column (N), not in C a contraction (K). Axes that are one index in
//! disguise (the outer stride is the inner stride times the inner extent, in all three
//! operands) are merged, then the largest M, N and K axes become one GEMM call, run by the
//! shared [`gemm`] on floats, and every other axis is looped around it. So broadcast
//! batches, transposed operands and diagonals cost no copies, and contraction axes left
//! outside the GEMM accumulate because every call adds to C.

use crate::cpu::KernelError;
use crate::cpu::gemm::{self, Layout};
use crate::invalid;
use crate::tensor::Element;
use half::f16;

/// One index of the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis {
    pub size: usize,
    pub a: usize,
    pub b: usize,
    pub c: usize,
}

impl Axis {
    pub fn new(size: usize, a: usize, b: usize, c: usize) -> Axis {
        Axis { size, a, b, c }
    }

    /// An index of extent 1: addresses nothing.
    const UNIT: Axis = Axis { size: 1, a: 0, b: 0, c: 0 };

    /// Whether `outer` steps exactly over whole runs of `self`, so both are one index.
    fn absorbs(&self, outer: &Axis) -> bool {
        [(self.a, outer.a), (self.b, outer.b), (self.c, outer.c)]
            .into_iter()
            .all(|(inner, o)| self.size.checked_mul(inner) == Some(o))
    }
}

/// A product's axes arranged for execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    m: Axis,
    n: Axis,
    k: Axis,
    /// Looped around the GEMM, the last one fastest.
    outer: Vec<Axis>,
    /// Some axis has extent 0: there is nothing to add.
    empty: bool,
}

impl Plan {
    pub fn new(axes: &[Axis]) -> Plan {
        let empty = axes.iter().any(|a| a.size == 0);
        let mut axes: Vec<Axis> = axes.iter().copied().filter(|a| a.size > 1).collect();
        // Merge pairs that are one index: (i, j) where axis j steps over whole runs of axis i.
        while let Some((i, j)) = (0..axes.len())
            .flat_map(|i| (0..axes.len()).map(move |j| (i, j)))
            .find(|&(i, j)| i != j && axes[i].absorbs(&axes[j]))
        {
            axes[i].size *= axes[j].size;
            axes.remove(j);
        }
        let mut take = |role: fn(&Axis) -> bool| {
            let best = (0..axes.len())
                .filter(|&i| role(&axes[i]))
                .max_by_key(|&i| (axes[i].size, std::cmp::Reverse(i)));
            best.map_or(Axis::UNIT, |i| axes.remove(i))
        };
        let m = take(|x| x.a != 0 && x.b == 0 && x.c != 0);
        let n = take(|x| x.a == 0 && x.b != 0 && x.c != 0);
        let k = take(|x| x.c == 0);
        Plan { m, n, k, outer: axes, empty }
    }

    /// How many elements of A, B and C the product reaches (the largest offset plus one).
    pub fn extents(&self) -> [usize; 3] {
        if self.empty {
            return [0; 3];
        }
        let all = [&self.m, &self.n, &self.k].into_iter().chain(&self.outer);
        let mut ext = [1usize; 3];
        for x in all {
            let span = x.size.saturating_sub(1);
            ext[0] = ext[0].saturating_add(span.saturating_mul(x.a));
            ext[1] = ext[1].saturating_add(span.saturating_mul(x.b));
            ext[2] = ext[2].saturating_add(span.saturating_mul(x.c));
        }
        ext
    }

    /// `c += alpha * product(a, b)`, then `done(block, at)` on each block of C once it is
    /// final (`block` is `c[at..at + block.len()]`): after every GEMM call when each call
    /// fills its own contiguous block, else once on all of C.
    pub fn run<T: Scalar>(
        &self,
        alpha: T,
        a: &[T],
        b: &[T],
        c: &mut [T],
        done: impl FnMut(&mut [T], usize) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        self.run_calls(c, |call, c| T::gemm(call, alpha, a, b, c), done)
    }

    /// [`Plan::run`] with a [`Quantized`] B, which the GEMM dequantizes as it goes.
    pub fn run_dequantized<T: Scalar>(
        &self,
        alpha: T,
        a: &[T],
        b: &Quantized,
        c: &mut [T],
        done: impl FnMut(&mut [T], usize) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        self.run_calls(c, |call, c| T::gemm_dequantized(call, alpha, a, b, c), done)
    }

    /// Runs `gemm` on each call of the plan, then `done` as [`Plan::run`] says.
    fn run_calls<T>(
        &self,
        c: &mut [T],
        mut gemm: impl FnMut(&Call, &mut [T]) -> Result<(), KernelError>,
        mut done: impl FnMut(&mut [T], usize) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        if self.empty {
            return done(c, 0);
        }
        let per_call = self.blocks_per_call();
        let calls: usize = self.outer.iter().map(|x| x.size).product();
        let mut idx = vec![0usize; self.outer.len()];
        let mut call = Call {
            m: self.m.size,
            n: self.n.size,
            k: self.k.size,
            a: Mat::new(0, self.m.a, self.k.a),
            b: Mat::new(0, self.k.b, self.n.b),
            c: Mat::new(0, self.m.c, self.n.c),
        };
        for _ in 0..calls {
            gemm(&call, c)?;
            if per_call {
                let (at, len) = (call.c.off, call.m * call.n);
                let block = c
                    .get_mut(at..at + len)
                    .ok_or_else(|| invalid!("a product block lies outside C"))?;
                done(block, at)?;
            }
            // Odometer step over the outer axes, keeping the three offsets in step.
            for (i, x) in idx.iter_mut().zip(&self.outer).rev() {
                *i += 1;
                call.a.off += x.a;
                call.b.off += x.b;
                call.c.off += x.c;
                if *i < x.size {
                    break;
                }
                *i = 0;
                call.a.off -= x.a * x.size;
                call.b.off -= x.b * x.size;
                call.c.off -= x.c * x.size;
            }
        }
        if !per_call {
            done(c, 0)?;
        }
        Ok(())
    }

    /// Whether every GEMM call writes its own block of C, contiguous row by row, and leaves it
    /// final: no contraction is looped outside the calls.
    fn blocks_per_call(&self) -> bool {
        let (m, n) = (&self.m, &self.n);
        let rows = n.size == 1 || n.c == 1;
        let contiguous = rows && (m.size == 1 || m.c == n.size);
        contiguous && self.outer.iter().all(|x| x.c != 0)
    }
}

/// A matrix inside a slice: first element and row/column strides.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    off: usize,
    rs: usize,
    cs: usize,
}

impl Mat {
    fn new(off: usize, rs: usize, cs: usize) -> Mat {
        Mat { off, rs, cs }
    }

    /// Whether a `rows x cols` matrix lies inside a slice of `len` elements.
    fn fits(&self, rows: usize, cols: usize, len: usize) -> bool {
        let last = (rows - 1)
            .checked_mul(self.rs)
            .zip((cols - 1).checked_mul(self.cs))
            .and_then(|(r, c)| r.checked_add(c)?.checked_add(self.off));
        last.is_some_and(|l| l < len)
    }

    fn idx(&self, r: usize, c: usize) -> usize {
        self.off + r * self.rs + c * self.cs
    }

    /// The shared GEMM's view of the matrix, from `off` on.
    fn layout(&self, rows: usize, cols: usize) -> Layout {
        Layout::new(rows, cols, self.rs, self.cs)
    }
}

/// One GEMM: `C (m x n) += alpha * A (m x k) * B (k x n)`.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: Mat,
}

impl Call {
    /// Every element the call addresses lies inside its slice (what `simple_gemm` indexes;
    /// the shared GEMM checks its own views). Sizes are non-zero when this is asked.
    fn check(&self, a: usize, b: usize, c: usize) -> Result<(), KernelError> {
        let ok = self.a.fits(self.m, self.k, a)
            && self.b.fits(self.k, self.n, b)
            && self.c.fits(self.m, self.n, c);
        if ok {
            Ok(())
        } else {
            Err(invalid!(
                "product operands are smaller than their shapes say ({a}, {b} and {c} elements)"
            ))
        }
    }

    fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.k == 0
    }
}

/// Small products with a short contraction and contiguous rows in B and C (or one column) skip
/// the shared GEMM, whose packing and full tiles cost more than they save there: attention's
/// per-head [40, 15] x [15, 40] ran 2x faster with plain loops (measured against the GEMM
/// library used before `gemm.rs` had its own), 16x16x16 and anything with a longer contraction
/// faster through the GEMM.
fn prefer_simple(call: &Call) -> bool {
    call.k < 16
        && call.m * call.n * call.k <= 32 * 32 * 32
        && (call.n == 1 || (call.b.cs == 1 && call.c.cs == 1))
}

/// `c += alpha * a * b` with plain loops: row updates that vectorize when B's and C's rows are
/// contiguous, element by element otherwise. The caller has checked the call.
fn simple_gemm<T: Scalar>(call: &Call, alpha: T, a: &[T], b: &[T], c: &mut [T]) {
    let (m, n, k) = (call.m, call.n, call.k);
    for i in 0..m {
        for p in 0..k {
            let av = alpha.mul(a[call.a.idx(i, p)]);
            if call.b.cs == 1 && call.c.cs == 1 {
                let (bi, ci) = (call.b.idx(p, 0), call.c.idx(i, 0));
                for (o, &bv) in c[ci..ci + n].iter_mut().zip(&b[bi..bi + n]) {
                    *o = o.add(av.mul(bv));
                }
            } else {
                for j in 0..n {
                    let o = &mut c[call.c.idx(i, j)];
                    *o = o.add(av.mul(b[call.b.idx(p, j)]));
                }
            }
        }
    }
}

/// A B of 8-bit integers, one scale and zero point per column of the product (the calls'
/// columns are B's: the plan loops no axis of B outside them, checked when prepared); or of
/// float16 values, with neither.
#[derive(Clone, Copy, Debug)]
pub struct Quantized<'a> {
    pub levels: Levels<'a>,
    pub scale: &'a [f32],
    /// Whole numbers, as floats.
    pub zero: &'a [f32],
}

/// The values of a [`Quantized`] B.
#[derive(Clone, Copy, Debug)]
pub enum Levels<'a> {
    I8(&'a [i8]),
    U8(&'a [u8]),
    F16(&'a [f16]),
}

impl Levels<'_> {
    fn len(&self) -> usize {
        match self {
            Levels::I8(v) => v.len(),
            Levels::U8(v) => v.len(),
            Levels::F16(v) => v.len(),
        }
    }
}

impl Plan {
    /// Whether every call reads the same B, whose columns are the calls' columns: what a
    /// [`Quantized`] B's per-column scales need.
    pub fn b_is_one_matrix(&self) -> bool {
        self.outer.iter().all(|x| x.b == 0)
    }
}

/// Element types the engine multiplies.
pub trait Scalar: Element + Default {
    fn one() -> Self;
    fn from_f32(v: f32) -> Self;
    fn mul(self, other: Self) -> Self;
    fn add(self, other: Self) -> Self;
    /// `c += alpha * a * b` for one call.
    fn gemm(
        call: &Call,
        alpha: Self,
        a: &[Self],
        b: &[Self],
        c: &mut [Self],
    ) -> Result<(), KernelError>;
    /// `c += alpha * a * dequantized(b)` for one call; floats only.
    fn gemm_dequantized(
        _call: &Call,
        _alpha: Self,
        _a: &[Self],
        _b: &Quantized,
        _c: &mut [Self],
    ) -> Result<(), KernelError> {
        Err(invalid!("only float products dequantize an 8-bit B"))
    }
}

macro_rules! float_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            fn one() -> Self {
                1.0
            }
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            fn mul(self, other: Self) -> Self {
                self * other
            }
            fn add(self, other: Self) -> Self {
                self + other
            }
            fn gemm(
                call: &Call,
                alpha: Self,
                a: &[Self],
                b: &[Self],
                c: &mut [Self],
            ) -> Result<(), KernelError> {
                if call.is_empty() {
                    return Ok(());
                }
                call.check(a.len(), b.len(), c.len())?;
                if prefer_simple(call) {
                    simple_gemm(call, alpha, a, b, c);
                    return Ok(());
                }
                // `check` proved each offset lies inside its slice.
                let (m, n, k) = (call.m, call.n, call.k);
                gemm::gemm(
                    alpha,
                    &a[call.a.off..],
                    call.a.layout(m, k),
                    &b[call.b.off..],
                    call.b.layout(k, n),
                    1.0,
                    &mut c[call.c.off..],
                    call.c.layout(m, n),
                )
            }
            fn gemm_dequantized(
                call: &Call,
                alpha: Self,
                a: &[Self],
                b: &Quantized,
                c: &mut [Self],
            ) -> Result<(), KernelError> {
                if call.is_empty() {
                    return Ok(());
                }
                call.check(a.len(), b.levels.len(), c.len())?;
                let (m, n, k) = (call.m, call.n, call.k);
                let lb = call.b.layout(k, n);
                let levels = match b.levels {
                    Levels::I8(v) => gemm::Narrow::I8(lb.view("B", &v[call.b.off..])?),
                    Levels::U8(v) => gemm::Narrow::U8(lb.view("B", &v[call.b.off..])?),
                    Levels::F16(v) => gemm::Narrow::F16(lb.view("B", &v[call.b.off..])?),
                };
                let b = match levels {
                    gemm::Narrow::F16(h) => gemm::Dequantized::half(h),
                    _ => gemm::Dequantized::new(levels, b.scale, b.zero)?,
                };
                let c = call.c.layout(m, n).view_mut("C", &mut c[call.c.off..])?;
                let a = (&a[call.a.off..], call.a.layout(m, k));
                gemm::gemm_dequantized(alpha, a, b, gemm::Start::scaled(1.0), c)
            }
        }
    };
}
float_scalar!(f32);
float_scalar!(f64);

// Integer products are for ids and shapes, small: plain loops, wrapping like numpy.
macro_rules! int_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            fn one() -> Self {
                1
            }
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            fn mul(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn gemm(
                call: &Call,
                alpha: Self,
                a: &[Self],
                b: &[Self],
                c: &mut [Self],
            ) -> Result<(), KernelError> {
                if !call.is_empty() {
                    call.check(a.len(), b.len(), c.len())?;
                    simple_gemm(call, alpha, a, b, c);
                }
                Ok(())
            }
        }
    };
}
int_scalar!(i32);
int_scalar!(i64);

#[cfg(test)]
mod tests {
    use super::*;

    fn ax(size: usize, a: usize, b: usize, c: usize) -> Axis {
        Axis::new(size, a, b, c)
    }

    #[test]
    fn broadcast_batch_folds_into_rows() {
        // [2,3,4] x [4,5]: the batch axis of A steps over whole runs of its rows.
        let plan = Plan::new(&[ax(2, 12, 0, 15), ax(3, 4, 0, 5), ax(5, 0, 1, 1), ax(4, 1, 5, 0)]);
        assert_eq!(plan.m, ax(6, 4, 0, 5));
        assert!(plan.outer.is_empty());
        assert_eq!(plan.extents(), [24, 20, 30]);
    }

    #[test]
    fn looped_contraction_accumulates() {
        // C[i] = Σ_jk A[i,j,k] B[j,k] with A, B as 2x2x2 and 2x2 of 1..: j and k are both
        // contractions, one is looped. By hand: A[0]=[1,2,3,4], A[1]=[5,6,7,8], B=[1,2,3,4]
        // C[0] = 1+4+9+16 = 30, C[1] = 5+12+21+32 = 70.
        let merged = Plan::new(&[ax(2, 4, 0, 1), ax(2, 2, 2, 0), ax(2, 1, 1, 0)]);
        assert_eq!((merged.k, merged.outer.len()), (ax(4, 1, 1, 0), 0));
        // Keep the contractions apart to exercise the outer loop.
        let plan = Plan { k: ax(2, 1, 1, 0), outer: vec![ax(2, 2, 2, 0)], ..merged };
        let a: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        let b = [1.0f32, 2.0, 3.0, 4.0];
        let mut c = [0.0f32; 2];
        let mut blocks = Vec::new();
        let done = |b: &mut [f32], at| {
            blocks.push((at, b.to_vec()));
            Ok(())
        };
        plan.run(1.0, &a, &b, &mut c, done).unwrap();
        assert_eq!(c, [30.0, 70.0]);
        assert_eq!(blocks, [(0, vec![30.0, 70.0])], "one block, after the looped contraction");
        let mut ci = [0i64; 2];
        let ai: Vec<i64> = (1..=8).collect();
        plan.run(1, &ai, &[1, 2, 3, 4], &mut ci, |_, _| Ok(())).unwrap();
        assert_eq!(ci, [30, 70]);
    }

    #[test]
    fn short_operands_are_an_error_not_a_panic() {
        let plan = Plan::new(&[ax(2, 2, 0, 2), ax(2, 0, 1, 1), ax(2, 1, 2, 0)]);
        let mut c = [0.0f32; 4];
        assert!(plan.run(1.0, &[1.0; 3], &[1.0; 4], &mut c, |_, _| Ok(())).is_err());
        let mut ci = [0i32; 4];
        assert!(plan.run(1, &[1; 4], &[1; 4], &mut ci[..3], |_, _| Ok(())).is_err());
    }
}
