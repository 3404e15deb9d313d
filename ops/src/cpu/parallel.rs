//! How kernels share out work: over the rayon pool the CPU executable runs them on (one per
//! session, started once), and with scratch memory that each pool thread keeps between runs.
//!
//! Work is always cut at the same places whatever the thread count (chunks of fixed size,
//! halves of fixed ranges), and each piece computes its elements as the whole would: results
//! are the same bits on 1 thread or 16.

use super::KernelError;
use ndarray::{ArrayViewMut2, Axis};
use rayon::Yield;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
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
    let mut buf = T::stack().with_borrow_mut(|stack| stack.pop()).unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    let result = f(&mut buf[..len]);
    T::stack().with_borrow_mut(|stack| stack.push(buf));
    result
}

/// Runs `f` on the current pool with its other threads awake: each spins, taking work the
/// moment it appears, until `f` returns. An idle rayon thread sleeps after some 20 µs and
/// takes 20-30 µs to wake (2-vCPU VM), which a run of small ops paid at nearly every op: a
/// shufflenet on 2 threads ran at one thread's speed in a third of its runs. ONNX Runtime's
/// pool spins between ops the same way; the threads go back to sleep when the run is over.
pub fn with_threads_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let runner = rayon::current_thread_index();
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        // One spinner per thread: a broadcast job is never stolen, so none finds another.
        s.spawn_broadcast(|_, thread| keep_awake(&done, thread.index(), runner));
        // Set however `f` ends, or the spinners would never let the scope end.
        let _finished = Finished(&done);
        f()
    })
}

/// Thread `thread`'s spin in [`with_threads_awake`]; none on the thread running `f`, which
/// would then wait for itself.
fn keep_awake(done: &AtomicBool, thread: usize, runner: Option<usize>) {
    if Some(thread) == runner {
        return;
    }
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(Yield::Executed) {
            std::hint::spin_loop();
        }
    }
}

struct Finished<'a>(&'a AtomicBool);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Work on one block of columns: `(its columns in the whole, the block)`.
pub type BlockFn<'f> =
    dyn Fn(Range<usize>, ArrayViewMut2<f32>) -> Result<(), KernelError> + Sync + 'f;

/// Calls `f(columns, block)` for consecutive blocks of `c`'s columns, in parallel: the blocks
/// are disjoint views of `c`. They are as few as keep each within `chunk` columns and all of
/// one width, a multiple of `unit`, but the last, which may be narrower: work is shared out
/// by halves of the blocks, and blocks cut at `chunk` (2048 + 1088 columns of a 56x56 image)
/// left one of two threads idle for a third of the time.
pub fn column_blocks(
    c: ArrayViewMut2<f32>,
    (chunk, unit): (usize, usize),
    f: &BlockFn,
) -> Result<(), KernelError> {
    let unit = unit.max(1);
    let chunk = (chunk / unit).max(1) * unit;
    let width = c.ncols();
    let blocks = width.div_ceil(chunk).max(1);
    split(0, c, width.div_ceil(blocks).div_ceil(unit) * unit, f)
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
    let (a, b) =
        rayon::join(|| split(first, left, chunk, f), || split(first + mid, right, chunk, f));
    a.and(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn column_blocks_cover_every_column_once() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let mut c = Array2::<f32>::zeros((3, 23));
        pool.install(|| {
            // Three blocks of at most 10 columns, in pairs: 8, 8 and 7 (not 10, 10 and 3).
            column_blocks(c.view_mut(), (10, 2), &|cols, mut block| {
                assert_eq!(cols.len(), if cols.start == 16 { 7 } else { 8 });
                assert_eq!(cols.start % 8, 0);
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
        let failed = column_blocks(c.view_mut(), (4, 1), &|cols, _| match cols.start {
            8 => Err(crate::invalid!("block 8")),
            _ => Ok(()),
        });
        assert!(failed.is_err());
    }

    #[test]
    fn awake_threads_take_the_work_and_let_the_run_end() {
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut c = Array2::<f32>::zeros((2, 64));
            let ran_on = std::sync::Mutex::new(std::collections::BTreeSet::new());
            pool.install(|| {
                with_threads_awake(|| {
                    column_blocks(c.view_mut(), (1, 1), &|cols, mut block| {
                        ran_on.lock().unwrap().insert(rayon::current_thread_index());
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        block.fill(cols.start as f32);
                        Ok(())
                    })
                })
            })
            .unwrap();
            assert!(c.rows().into_iter().all(|r| r.iter().copied().eq((0..64).map(|j| j as f32))));
            // Every thread took a share of 64 blocks of 1 ms.
            assert_eq!(ran_on.lock().unwrap().len(), threads);
            // A panic ends the spinning too: it reaches the caller instead of hanging the pool.
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.install(|| with_threads_awake(|| panic!("a kernel bug")))
            }));
            assert!(panicked.is_err());
        }
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
