//! How kernels share out work: over the rayon pool the CPU executable runs them on (one per
//! session, started once), and with scratch memory that each pool thread keeps between runs.
//!
//! Work is always cut at the same places whatever the thread count (chunks of fixed size,
//! halves of fixed ranges), and each piece computes its elements as the whole would: results
//! are the same bits on 1 thread or 16.

use super::KernelError;
use ndarray::{ArrayViewMut2, Axis};
use std::cell::Cell;
use std::ops::Range;

thread_local! {
    /// This thread's scratch floats: they grow to the largest need and stay, so a pool thread
    /// allocates during the first run only.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` over `len` floats of this thread's scratch (their contents are left over from
/// earlier use). Taking the buffer out, not borrowing it, makes nested use safe: a thread
/// waiting in a join may run another task that wants scratch, which then gets its own.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.take();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let result = f(&mut buf[..len]);
    let kept = SCRATCH.take();
    SCRATCH.set(if kept.capacity() > buf.capacity() {
        kept
    } else {
        buf
    });
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
        with_scratch(4, |outer| {
            outer.fill(1.0);
            with_scratch(8, |inner| inner.fill(2.0));
            assert_eq!(outer, [1.0; 4]);
        });
        // The larger buffer is kept for the next use.
        with_scratch(8, |again| assert_eq!(again.len(), 8));
    }
}
