//! A checked, safe front to `matrixmultiply::sgemm`: the one `unsafe` call of the conv family.

use crate::cpu::KernelError;
use crate::invalid;

/// Where the elements of an `rows x cols` matrix sit in a slice: (i, j) at `i * rs + j * cs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Layout {
    pub fn row_major(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The slice length the matrix needs: one past its last element.
    fn span(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1
        }
    }

    /// Whether no two elements share a position (required of the output).
    fn distinct(&self) -> bool {
        let nested = |outer: usize, outer_stride: usize, inner: usize, inner_stride: usize| {
            (inner <= 1 || inner_stride > 0)
                && (outer <= 1 || outer_stride > (inner - 1) * inner_stride)
        };
        self.rows == 0
            || self.cols == 0
            || nested(self.rows, self.rs, self.cols, self.cs)
            || nested(self.cols, self.cs, self.rows, self.rs)
    }

    fn strides(&self) -> Result<(isize, isize), KernelError> {
        let s = |v: usize| isize::try_from(v).map_err(|_| invalid!("gemm stride {v} is too large"));
        Ok((s(self.rs)?, s(self.cs)?))
    }
}

/// `C = A·B + beta·C`. With `beta == 0` the old contents of C are not read.
pub fn sgemm(
    a: &[f32],
    la: Layout,
    b: &[f32],
    lb: Layout,
    beta: f32,
    c: &mut [f32],
    lc: Layout,
) -> Result<(), KernelError> {
    if la.cols != lb.rows || la.rows != lc.rows || lb.cols != lc.cols {
        return Err(invalid!(
            "gemm shapes do not chain: {la:?} x {lb:?} -> {lc:?}"
        ));
    }
    if la.span() > a.len() || lb.span() > b.len() || lc.span() > c.len() || !lc.distinct() {
        return Err(invalid!(
            "gemm operands do not fit their buffers ({}, {}, {} elements for {la:?}, {lb:?}, {lc:?})",
            a.len(),
            b.len(),
            c.len()
        ));
    }
    if lc.span() == 0 {
        return Ok(());
    }
    let ((rsa, csa), (rsb, csb), (rsc, csc)) = (la.strides()?, lb.strides()?, lc.strides()?);
    // SAFETY: every element (i, j) read from A and B and written to C lies inside its slice
    // (checked against `span` above), C's elements are pairwise distinct, and `c` is borrowed
    // mutably so it cannot overlap `a` or `b`. matrixmultiply reads A and B only when k > 0,
    // in which case they are non-empty.
    #[allow(unsafe_code)]
    unsafe {
        matrixmultiply::sgemm(
            la.rows,
            la.cols,
            lb.cols,
            1.0,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            rsc,
            csc,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiplies_strided_operands_and_accumulates() {
        // A = [[1, 2], [3, 4]] stored transposed; B = [[5], [6]]; C starts at [[1], [1]].
        let a = [1.0, 3.0, 2.0, 4.0];
        let la = Layout {
            rows: 2,
            cols: 2,
            rs: 1,
            cs: 2,
        };
        let mut c = [1.0, -7.0, 1.0];
        let lc = Layout {
            rows: 2,
            cols: 1,
            rs: 2,
            cs: 1,
        };
        sgemm(
            &a,
            la,
            &[5.0, 6.0],
            Layout::row_major(2, 1),
            1.0,
            &mut c,
            lc,
        )
        .unwrap();
        assert_eq!(c, [18.0, -7.0, 40.0]);
    }

    #[test]
    fn refuses_out_of_bounds_and_aliasing_outputs() {
        let l = Layout::row_major(2, 2);
        let mut c = [0.0; 4];
        assert!(sgemm(&[0.0; 3], l, &[0.0; 4], l, 0.0, &mut c, l).is_err());
        let aliased = Layout {
            rows: 2,
            cols: 2,
            rs: 1,
            cs: 1,
        };
        assert!(sgemm(&[0.0; 4], l, &[0.0; 4], l, 0.0, &mut c, aliased).is_err());
    }
}
