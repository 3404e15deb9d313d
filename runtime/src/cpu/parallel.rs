//! How kernels share out work: over the rayon pool the CPU executable runs them on (one per
//! session, started once), and with scratch memory that each pool thread keeps between runs.
//!
//! Work is always cut at the same places whatever the thread count (chunks of fixed size,
//! halves of fixed ranges), and each piece computes its elements as the whole would: results
//! are the same bits on 1 thread or 16.

use super::KernelError;
use ndarray::{ArrayViewMut2, Axis};
use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

thread_local! {
    /// This thread's scratch buffers, a stack: a buffer grows to the largest need at its depth
    /// and stays, so a pool thread allocates during the first run only.
    static SCRATCH_F32: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
}

/// The element types kernels take scratch memory in.
pub trait Scratch: Copy + Default + 'static {
    fn stack() -> &'static LocalKey<RefCell<Vec<Vec<Self>>>>;
}

impl Scratch for f32 {
    fn stack() -> &'static LocalKey<RefCell<Vec<Vec<f32>>>> {
        &SCRATCH_F32
    }
}

impl Scratch for f64 {
    fn stack() -> &'static LocalKey<RefCell<Vec<Vec<f64>>>> {
        &SCRATCH_F64
    }
}

/// Runs `f` over `len` elements of this thread's scratch (their contents are left over from
/// earlier use). The buffer is taken off the thread's stack, not borrowed, so nesting is safe
/// and allocation-free once warm: a kernel's inner scratch (a GEMM's packing inside a conv's
/// im2col) and a task a waiting join runs here each take the next buffer down, and the
/// buffers come back in the order they left.
pub fn with_scratch<T: Scratch, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    let mut buf = T::stack()
        .with_borrow_mut(|stack| stack.pop())
        .unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    let result = f(&mut buf[..len]);
    T::stack().with_borrow_mut(|stack| stack.push(buf));
    result
}

/// Work on one block of columns: `(its columns in the whole, the block)`.
pub type BlockFn<'f> =
    dyn Fn(Range<usize>, ArrayViewMut2<f32>) -> Result<(), KernelError> + Sync + 'f;

/// Calls `f(columns, block)` for consecutive blocks of `chunk` columns of `c` (the last may
/// be narrower), in parallel: the blocks are disjoint views of `c`.
pub fn column_blocks(c: ArrayViewMut2<f32>, chunk: usize, f: &BlockFn) -> Result<(), KernelError> {
    split(0, c, chunk.max(1), f)
}

fn split(
    first: usize,
    c: ArrayViewMut2<f32>,
    chunk: usize,
    f: &BlockFn,
) -> Result<(), KernelError> {
    let width = c.ncols();
    let blocks = width.div_ceil(chunk);
    if blocks <= 1 {
        return f(first..first + width, c);
    }
    let mid = blocks / 2 * chunk;
    let (left, right) = c.split_at(Axis(1), mid);
    let (a, b) = rayon::join(
        || split(first, left, chunk, f),
        || split(first + mid, right, chunk, f),
    );
    a.and(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn column_blocks_cover_every_column_once() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let mut c = Array2::<f32>::zeros((3, 23));
        pool.install(|| {
            column_blocks(c.view_mut(), 5, &|cols, mut block| {
                assert!(cols.len() <= 5 && cols.start % 5 == 0);
                assert_eq!(block.ncols(), cols.len());
                for (j, mut column) in cols.zip(block.columns_mut()) {
                    column += j as f32 + 1.0;
                }
                Ok(())
            })
        })
        .unwrap();
        for row in c.rows() {
            assert_eq!(row.to_vec(), (1..=23).map(|j| j as f32).collect::<Vec<_>>());
        }
        // An error in any block is the result.
        let failed = column_blocks(c.view_mut(), 4, &|cols, _| match cols.start {
            8 => Err(crate::invalid!("block 8")),
            _ => Ok(()),
        });
        assert!(failed.is_err());
    }

    #[test]
    fn nested_scratch_is_a_separate_buffer() {
        with_scratch(4, |outer: &mut [f32]| {
            outer.fill(1.0);
            with_scratch(8, |inner: &mut [f32]| inner.fill(2.0));
            assert_eq!(outer, [1.0; 4]);
        });
        // Both buffers are kept, each at its depth: the same nesting finds them again.
        with_scratch(4, |outer: &mut [f32]| {
            assert_eq!(outer, [1.0; 4]);
            with_scratch(8, |inner: &mut [f32]| assert_eq!(inner, [2.0; 8]));
        });
    }
}
