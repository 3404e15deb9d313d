//! The one matrix product of the CPU kernels (conv, MatMul/Gemm/Einsum, the recurrent cells):
//! `C = alpha·A·B + beta·C` on strided matrices inside slices. It runs on `ndarray`'s
//! `general_mat_mul`, which hands the strides straight to `matrixmultiply`, so the speed is the
//! library's and this file is safe Rust: ndarray checks each view against its slice, and a
//! layout that does not fit is an error here, never a panic or an out-of-bounds access.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, Axis, Ix2, LinalgScalar, ShapeBuilder, StrideShape};

use crate::cpu::KernelError;
use crate::invalid;

/// Products smaller than this many multiply-adds run as one piece: below it, splitting costs
/// more (each part packs its own share of the operands) than a second core gains.
const PARALLEL_WORK: usize = 1 << 21;

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

    fn shape(&self) -> Result<StrideShape<Ix2>, KernelError> {
        // ndarray reads strides as isize: a larger one would turn negative.
        if isize::try_from(self.rs.max(self.cs)).is_err() {
            return Err(invalid!("gemm strides are too large: {self:?}"));
        }
        Ok((self.rows, self.cols).strides((self.rs, self.cs)))
    }
}

/// The element types with a fast product underneath (matrixmultiply's sgemm and dgemm).
pub trait Float: LinalgScalar + Send + Sync {}
impl Float for f32 {}
impl Float for f64 {}

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
    let c_len = c.len();
    let cv = ArrayViewMut2::from_shape(lc.shape()?, c)
        .map_err(|e| invalid!("gemm operand C ({c_len} elements) does not fit {lc:?}: {e}"))?;
    gemm_into(alpha, (a, la), (b, lb), beta, cv)
}

/// [`gemm`] into a view of C (a block of a larger matrix that parallel work split off).
pub fn gemm_into<T: Float>(
    alpha: T,
    (a, la): (&[T], Layout),
    (b, lb): (&[T], Layout),
    beta: T,
    c: ArrayViewMut2<T>,
) -> Result<(), KernelError> {
    if la.cols != lb.rows || (la.rows, lb.cols) != c.dim() {
        return Err(invalid!(
            "gemm shapes do not chain: {la:?} x {lb:?} -> {:?}",
            c.dim()
        ));
    }
    let misfit = |name: &'static str, len: usize, l: Layout| {
        move |e| invalid!("gemm operand {name} ({len} elements) does not fit {l:?}: {e}")
    };
    let av = ArrayView2::from_shape(la.shape()?, a).map_err(misfit("A", a.len(), la))?;
    let bv = ArrayView2::from_shape(lb.shape()?, b).map_err(misfit("B", b.len(), lb))?;
    product(alpha, av, bv, beta, c);
    Ok(())
}

/// `C = alpha·A·B + beta·C` on the current thread pool: C is halved along its longer side
/// (A's rows or B's columns with it) while the halves are worth a core. The halves are
/// disjoint views, so this is safe Rust, and each element is computed exactly as one piece
/// would compute it (the same sums in the same order), so results never depend on the pool.
fn product<T: Float>(alpha: T, a: ArrayView2<T>, b: ArrayView2<T>, beta: T, c: ArrayViewMut2<T>) {
    let (m, n) = c.dim();
    let work = m.saturating_mul(n).saturating_mul(a.ncols());
    let axis = if m >= n { Axis(0) } else { Axis(1) };
    let len = c.len_of(axis);
    if rayon::current_num_threads() < 2 || work < PARALLEL_WORK || len < 2 {
        let mut c = c;
        general_mat_mul(alpha, &a, &b, beta, &mut c);
        return;
    }
    let mid = len / 2;
    let (c1, c2) = c.split_at(axis, mid);
    let ((a1, b1), (a2, b2)) = if axis == Axis(0) {
        let (a1, a2) = a.split_at(Axis(0), mid);
        ((a1, b.view()), (a2, b))
    } else {
        let (b1, b2) = b.split_at(Axis(1), mid);
        ((a.view(), b1), (a, b2))
    };
    rayon::join(
        move || product(alpha, a1, b1, beta, c1),
        move || product(alpha, a2, b2, beta, c2),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn threads_split_the_product_and_change_no_bit() {
        // 256 x 700 x 200: above the threshold; odd thread counts make uneven halves.
        let (m, k, n) = (256, 700, 200);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0)
            .collect();
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
                    gemm(
                        1.0,
                        &a[..24 * k],
                        la,
                        &b,
                        lb,
                        0.0,
                        &mut c,
                        Layout::row_major(24, 2100),
                    )
                })
                .unwrap();
            c
        };
        assert!(24 * k * 2100 >= PARALLEL_WORK);
        assert_eq!(wide(4), wide(1));
        // A 1x1 product cannot split: still right.
        assert_eq!(run(8, 1, 1), run(1, 1, 1));
    }

    #[test]
    fn multiplies_strided_operands_and_accumulates() {
        // A = [[1, 2], [3, 4]] stored transposed; B = [[5], [6]]; C starts at [[1], [1]] with
        // its rows two apart. By hand: C = 2·A·B + C = [[2·17 + 1], [2·39 + 1]].
        let a = [1.0, 3.0, 2.0, 4.0];
        let mut c = [1.0f32, -7.0, 1.0];
        let (la, lb, lc) = (
            Layout::new(2, 2, 1, 2),
            Layout::row_major(2, 1),
            Layout::new(2, 1, 2, 1),
        );
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
        gemm(
            1.0,
            &[1.0, 2.0],
            la,
            &[3.0],
            lb,
            0.0,
            &mut c[..6],
            Layout::new(3, 2, 2, 1),
        )
        .unwrap();
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
    }
}
