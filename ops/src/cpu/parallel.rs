//! How kernels share out work: over the rayon pool the CPU executable runs them on (one per
//! session, started once), and with scratch memory that each pool thread keeps between runs.
//!
//! Work is always cut at the same places whatever the thread count (chunks of fixed size,
//! halves of fixed ranges), and each piece computes its elements as the whole would: results
//! are the same bits on 1 thread or 16.
//!
//! A session of one thread has no pool: its runs execute on the caller's thread ([`alone`]),
//! where [`join`] runs both halves in order and nothing reaches rayon's global pool. Handing
//! each run to a pool thread and back cost two context switches per run, a quarter of a
//! small transformer's run time.

use super::KernelError;
use bytemuck::Pod;
use ndarray::{ArrayViewMut2, Axis};
use rayon::Yield;
use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

thread_local! {
    /// This thread's scratch buffers, a stack: a buffer grows to the largest need at its depth
    /// and stays, so a pool thread allocates during the first run only.
    static SCRATCH_F32: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread runs its work [`alone`].
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// Scratch buffers that their owner keeps between runs on whatever thread calls it (a
/// session of one thread, which has no pool thread to keep them): [`alone`] lends them to
/// the calling thread for one run.
#[derive(Default)]
pub struct OwnScratch {
    f32: Vec<Vec<f32>>,
    f64: Vec<Vec<f64>>,
}

/// Runs `f` on this thread alone: kernels [`join`] in order and see one thread, and take
/// scratch memory from `scratch`, which gets it back with what it grew to, so that nothing
/// stays behind on the caller's thread when the owner is dropped.
pub fn alone<R>(scratch: &mut OwnScratch, f: impl FnOnce() -> R) -> R {
    /// Puts the thread's own state back however `f` ends.
    struct Lent<'s> {
        scratch: &'s mut OwnScratch,
        was_alone: bool,
    }
    impl Drop for Lent<'_> {
        fn drop(&mut self) {
            SCRATCH_F32.with_borrow_mut(|s| std::mem::swap(s, &mut self.scratch.f32));
            SCRATCH_F64.with_borrow_mut(|s| std::mem::swap(s, &mut self.scratch.f64));
            ALONE.set(self.was_alone);
        }
    }
    SCRATCH_F32.with_borrow_mut(|s| std::mem::swap(s, &mut scratch.f32));
    SCRATCH_F64.with_borrow_mut(|s| std::mem::swap(s, &mut scratch.f64));
    let _lent = Lent { scratch, was_alone: ALONE.replace(true) };
    f()
}

/// `rayon::join`, or `a` then `b` on a thread running [`alone`].
pub fn join<RA: Send, RB: Send>(
    a: impl FnOnce() -> RA + Send,
    b: impl FnOnce() -> RB + Send,
) -> (RA, RB) {
    match ALONE.get() {
        true => (a(), b()),
        false => rayon::join(a, b),
    }
}

/// How many threads the current work may spread over: the pool's, or 1 [`alone`].
pub fn threads() -> usize {
    match ALONE.get() {
        true => 1,
        false => rayon::current_num_threads(),
    }
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

/// How long an idle pool thread keeps looking for work before it parks: longer than the gap
/// between one step's parallel loops, shorter than the time slice a descheduled worker waits
/// for. A thread woken from sleep takes 20-30 µs to start (2-vCPU VM), which a run of small
/// ops paid at nearly every op when idle threads slept at once.
const SPIN: Duration = Duration::from_micros(200);

/// How often a parked thread looks for work all the same. A kernel may share out work long
/// after its step began (a recurrent cell's loop over time steps): the parked threads miss
/// rayon's own wake-up, and would otherwise leave that work to the others until the next step.
const PARKED_POLL: Duration = Duration::from_millis(1);

/// The pool's idle threads during one run (see [`with_threads_awake`]).
#[derive(Default)]
pub struct Awake {
    done: AtomicBool,
    /// Counts the steps started; a parked thread wakes when it moves.
    steps: AtomicU64,
    parked: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Awake {
    /// Marks the start of a step: parked threads spin again, since it may share out work.
    pub fn step(&self) {
        self.steps.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.wake.notify_all();
        }
    }

    fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }

    /// Thread `thread`'s part in a run whose steps run on thread `runner`, with `helpers`
    /// other threads taking work. A helper runs what it can steal, and after [`SPIN`] without
    /// any it parks until the next step starts or the run ends. The pool's other threads sit
    /// the run out, as does the runner here (it would wait for itself).
    fn keep_awake(&self, thread: usize, runner: Option<usize>, helpers: usize) {
        let Some(rank) = helper_rank(thread, runner) else { return };
        if rank >= helpers {
            return self.sit_out();
        }
        let mut seen = self.steps.load(Ordering::SeqCst);
        let mut idle_since = Instant::now();
        while !self.done.load(Ordering::Acquire) {
            if rayon::yield_now() == Some(Yield::Executed) {
                idle_since = Instant::now();
                continue;
            }
            let now = self.steps.load(Ordering::Acquire);
            if now != seen {
                (seen, idle_since) = (now, Instant::now());
            }
            if idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                // Still idle when it wakes without a new step: it polls once, parks again.
                self.park(seen);
            }
        }
    }

    /// Sleeps until a step after `seen` starts, the run ends, or [`PARKED_POLL`] passes.
    fn park(&self, seen: u64) {
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Counted before the step count is read again: `step` then either sees this thread
        // parked and wakes it, or moved the count first, and this thread does not sleep.
        self.parked.fetch_add(1, Ordering::SeqCst);
        let sleeping = |_: &mut ()| {
            !self.done.load(Ordering::SeqCst) && self.steps.load(Ordering::SeqCst) == seen
        };
        let waited = self.wake.wait_timeout_while(guard, PARKED_POLL, sleeping);
        drop(waited.unwrap_or_else(PoisonError::into_inner));
        self.parked.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sleeps until the run ends, holding no work: it only ever steals.
    fn sit_out(&self) {
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let running = |_: &mut ()| !self.done.load(Ordering::SeqCst);
        drop(self.wake.wait_while(guard, running).unwrap_or_else(PoisonError::into_inner));
    }
}

/// `thread`'s place among the pool's threads other than `runner`; `None` for the runner.
fn helper_rank(thread: usize, runner: Option<usize>) -> Option<usize> {
    match runner {
        Some(r) if r == thread => None,
        Some(r) if r < thread => Some(thread - 1),
        _ => Some(thread),
    }
}

/// Runs `f` on the current pool. With `spin`, as many of its other threads as there are
/// other CPUs this process may use stay awake while `f` runs: each takes work the moment it
/// appears, spins a while when there is none ([`SPIN`]), then parks until `f` marks the next
/// step ([`Awake::step`]). ONNX Runtime's pool spins between ops the same way. The rest of
/// the pool sits the run out: with more threads than cores, every thread the OS
/// descheduled while it held a piece of work stalled the step it belonged to, and spinners
/// took the cores the workers needed (PP-OCR rec on 2 cores: 5.8 ms at 2 threads, 190 ms at
/// 8). Without `spin`, idle threads sleep at once (rayon's own policy) and `f` gets `None`.
pub fn with_threads_awake<R: Send>(spin: bool, f: impl FnOnce(Option<&Awake>) -> R + Send) -> R {
    if !spin {
        return f(None);
    }
    // Read once: on Linux it reads the affinity mask and cgroup files.
    static CPUS: OnceLock<usize> = OnceLock::new();
    let cpus = *CPUS.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    run_awake(cpus - 1, f)
}

/// [`with_threads_awake`] with `helpers` threads beside the one running `f`.
fn run_awake<R: Send>(helpers: usize, f: impl FnOnce(Option<&Awake>) -> R + Send) -> R {
    let runner = rayon::current_thread_index();
    let awake = Awake::default();
    rayon::scope(|s| {
        // One job per thread: a broadcast job is never stolen, so none finds another.
        s.spawn_broadcast(|_, thread| awake.keep_awake(thread.index(), runner, helpers));
        // Ends the run for the helpers however `f` ends, or they would never let the scope end.
        let _finished = Finished(&awake);
        f(Some(&awake))
    })
}

struct Finished<'a>(&'a Awake);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// One task of a parallel loop: `run(its index, its part of each of the loop's two
/// buffers)`. A trait of its own rather than `dyn Fn`: a closure's `Fn` vtable also carries a
/// `FnOnce` shim, one per kernel closure.
trait Task: Sync {
    fn run(&self, t: usize, bufs: [&mut [u8]; 2]) -> Result<(), KernelError>;
}

impl<F: Fn(usize, [&mut [u8]; 2]) -> Result<(), KernelError> + Sync> Task for F {
    fn run(&self, t: usize, bufs: [&mut [u8]; 2]) -> Result<(), KernelError> {
        self(t, bufs)
    }
}

/// Every loop over chunks of memory goes through here, so rayon's join machinery is compiled
/// once, not once per kernel closure (it was 4.7 MB of a 9.9 MB app binary). Runs tasks
/// `tasks`, each with its slice of both buffers (`task_bytes` each, the last shorter or
/// empty), halving the range over the pool as rayon's own parallel iterators do: while
/// `splits` lasts (one per thread to begin with, halved at each level), and again when the
/// other half was stolen; then the tasks of a piece run in order. Chunks never move with the
/// thread count, only which thread runs them does.
fn run_tasks(
    tasks: Range<usize>,
    [a, b]: [&mut [u8]; 2],
    task_bytes: [usize; 2],
    task: &dyn Task,
    splits: usize,
) -> Result<(), KernelError> {
    if tasks.len() <= 1 || splits == 0 || ALONE.get() {
        let (mut a, mut b) = (a, b);
        for t in tasks {
            let (a_t, a_rest) = a.split_at_mut(task_bytes[0].min(a.len()));
            let (b_t, b_rest) = b.split_at_mut(task_bytes[1].min(b.len()));
            task.run(t, [a_t, b_t])?;
            (a, b) = (a_rest, b_rest);
        }
        return Ok(());
    }
    let half = tasks.len() / 2;
    let mid = tasks.start + half;
    let (a1, a2) = a.split_at_mut((half * task_bytes[0]).min(a.len()));
    let (b1, b2) = b.split_at_mut((half * task_bytes[1]).min(b.len()));
    let (first, second) = rayon::join_context(
        |_| run_tasks(tasks.start..mid, [a1, b1], task_bytes, task, splits / 2),
        |cx| {
            let splits = match cx.migrated() {
                true => (splits / 2).max(rayon::current_num_threads()),
                false => splits / 2,
            };
            run_tasks(mid..tasks.end, [a2, b2], task_bytes, task, splits)
        },
    );
    first.and(second)
}

/// Runs every task of a loop over the pool ([`run_tasks`]).
fn run_all(
    tasks: usize,
    bufs: [&mut [u8]; 2],
    task_bytes: [usize; 2],
    task: &dyn Task,
) -> Result<(), KernelError> {
    run_tasks(0..tasks, bufs, task_bytes, task, threads())
}

/// A task of a loop over chunks of `T`s: `run(its index, its chunk)`.
trait ChunkTask<T>: Sync {
    fn run(&self, t: usize, chunk: &mut [T]) -> Result<(), KernelError>;
}

impl<T, F: Fn(usize, &mut [T]) -> Result<(), KernelError> + Sync> ChunkTask<T> for F {
    fn run(&self, t: usize, chunk: &mut [T]) -> Result<(), KernelError> {
        self(t, chunk)
    }
}

/// Calls `f(t, chunk)` for chunk `t` of `y`, `chunk` elements each (the last may be shorter),
/// in parallel.
pub fn for_each_chunk<T: Pod>(y: &mut [T], chunk: usize, f: &(impl Fn(usize, &mut [T]) + Sync)) {
    let ok = try_for_each_chunk(y, chunk, &|t, c| {
        f(t, c);
        Ok(())
    });
    debug_assert!(ok.is_ok());
}

/// [`for_each_chunk`] for tasks that can fail: the first error (in task order) is the result.
pub fn try_for_each_chunk<T: Pod>(
    y: &mut [T],
    chunk: usize,
    f: &(impl Fn(usize, &mut [T]) -> Result<(), KernelError> + Sync),
) -> Result<(), KernelError> {
    chunks_of(y, chunk, f)
}

/// [`try_for_each_chunk`] compiled once per element type: only the task is the caller's.
fn chunks_of<T: Pod>(y: &mut [T], chunk: usize, f: &dyn ChunkTask<T>) -> Result<(), KernelError> {
    let chunk = chunk.max(1);
    let tasks = y.len().div_ceil(chunk);
    let bytes = bytemuck::cast_slice_mut(y);
    run_all(tasks, [bytes, &mut []], [chunk * size_of::<T>(), 0], &|t, [c, _]: [&mut [u8]; 2]| {
        f.run(t, bytemuck::cast_slice_mut(c))
    })
}

/// [`try_for_each_chunk`] over two buffers cut into the same number of chunks: task `t`
/// gets chunk `t` of `a` (`chunks.0` elements) and of `b` (`chunks.1`); a buffer with fewer
/// chunks than the other gives its later tasks empty slices.
pub fn try_for_each_chunk_pair<A: Pod, B: Pod>(
    (a, b): (&mut [A], &mut [B]),
    chunks: (usize, usize),
    f: &(impl Fn(usize, &mut [A], &mut [B]) -> Result<(), KernelError> + Sync),
) -> Result<(), KernelError> {
    let chunks = (chunks.0.max(1), chunks.1.max(1));
    let tasks = a.len().div_ceil(chunks.0).max(b.len().div_ceil(chunks.1));
    let task_bytes = [chunks.0 * size_of::<A>(), chunks.1 * size_of::<B>()];
    let bytes = [bytemuck::cast_slice_mut(a), bytemuck::cast_slice_mut(b)];
    run_all(tasks, bytes, task_bytes, &|t, [a, b]: [&mut [u8]; 2]| {
        f(t, bytemuck::cast_slice_mut(a), bytemuck::cast_slice_mut(b))
    })
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
    let (a, b) = join(|| split(first, left, chunk, f), || split(first + mid, right, chunk, f));
    a.and(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn alone_runs_everything_here_and_keeps_scratch_with_its_owner() {
        let here = std::thread::current().id();
        let lengths = || SCRATCH_F32.with_borrow(|s| s.iter().map(Vec::len).collect::<Vec<_>>());
        with_scratch(3, |s: &mut [f32]| s.fill(1.0));
        let (mine, mut own) = (lengths(), OwnScratch::default());
        let order = Mutex::new(Vec::new());
        let mut y = vec![0usize; 1000];
        alone(&mut own, || {
            assert_eq!(threads(), 1);
            assert_eq!(lengths(), Vec::<usize>::new(), "the owner's scratch, empty at first");
            let ran = |k| order.lock().unwrap().push((k, std::thread::current().id()));
            join(|| ran(1), || ran(2));
            for_each_chunk(&mut y, 10, &|t, c| {
                assert_eq!(std::thread::current().id(), here);
                c.fill(t);
            });
            with_scratch(4096, |s: &mut [f32]| s.fill(2.0));
        });
        assert_eq!(*order.lock().unwrap(), [(1, here), (2, here)]);
        assert!(y.iter().enumerate().all(|(i, &t)| t == i / 10));
        assert_eq!(own.f32.iter().map(Vec::len).collect::<Vec<_>>(), [4096]);
        assert_eq!(lengths(), mine, "the thread's own scratch is back");
        assert!(!ALONE.get());
    }

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
    fn chunks_cover_every_element_once_in_fixed_places() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        pool.install(|| {
            // 10 elements in chunks of 4: 4, 4 and 2, each told its index.
            let mut y = [0u16; 10];
            for_each_chunk(&mut y, 4, &|t, chunk| {
                assert_eq!(chunk.len(), if t == 2 { 2 } else { 4 });
                for (j, v) in chunk.iter_mut().enumerate() {
                    *v += (t * 4 + j) as u16 + 1;
                }
            });
            assert_eq!(y, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
            // Two buffers, chunk t of each to task t; the shorter one's later tasks get
            // nothing.
            let (mut a, mut b) = ([0f32; 6], [0i64; 2]);
            let pair = try_for_each_chunk_pair((&mut a, &mut b), (2, 1), &|t, a, b| {
                a.fill(t as f32);
                assert_eq!(b.len(), usize::from(t < 2));
                b.fill(t as i64 + 7);
                Ok(())
            });
            assert!(pair.is_ok());
            assert_eq!((a, b), ([0.0, 0.0, 1.0, 1.0, 2.0, 2.0], [7, 8]));
            // The first failing task in task order is the result, whichever ends first.
            let failed = try_for_each_chunk(&mut [0u8; 64], 1, &|t, _| match t {
                5 | 50 => Err(crate::invalid!("task {t}")),
                _ => Ok(()),
            });
            assert!(failed.unwrap_err().to_string().contains("task 5"));
            // Nothing to do: no task runs.
            for_each_chunk(&mut [0f64; 0], 8, &|_, _| panic!("a task for no elements"));
        });
    }

    /// How many threads took part in a loop that shares out 64 blocks of 1 ms; checks the
    /// result.
    fn share_out() -> usize {
        let mut c = Array2::<f32>::zeros((2, 64));
        let ran_on = std::sync::Mutex::new(std::collections::BTreeSet::new());
        column_blocks(c.view_mut(), (1, 1), &|cols, mut block| {
            ran_on.lock().unwrap().insert(rayon::current_thread_index());
            std::thread::sleep(Duration::from_millis(1));
            block.fill(cols.start as f32);
            Ok(())
        })
        .unwrap();
        assert!(c.rows().into_iter().all(|r| r.iter().copied().eq((0..64).map(|j| j as f32))));
        ran_on.into_inner().unwrap().len()
    }

    /// How many threads of a pool of `threads` took part in such a loop in a run with
    /// `helpers` beside the runner.
    fn threads_taking_part(threads: usize, helpers: usize) -> usize {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            run_awake(helpers, |awake| {
                awake.expect("spinning").step();
                share_out()
            })
        })
    }

    #[test]
    fn awake_threads_take_the_work_and_let_the_run_end() {
        for threads in 1..=3 {
            // Every thread took a share.
            assert_eq!(threads_taking_part(threads, threads - 1), threads);
            // A panic ends the run too: it reaches the caller instead of hanging the pool.
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.install(|| with_threads_awake(true, |_| panic!("a kernel bug")))
            }));
            assert!(panicked.is_err());
        }
    }

    #[test]
    fn threads_beyond_the_cpus_sit_the_run_out() {
        // A pool of 4 on one helper's worth of CPUs: the runner and one helper do the work,
        // and the two others, asleep, still let the run end.
        assert_eq!(threads_taking_part(4, 1), 2);
        assert_eq!(threads_taking_part(4, 0), 1);
        assert_eq!([0, 1, 2].map(|t| helper_rank(t, Some(1))), [Some(0), None, Some(1)]);
        assert_eq!(helper_rank(2, None), Some(2));
    }

    #[test]
    fn parked_threads_wake_for_the_next_step_or_poll_for_work() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let (polled, woken) = pool.install(|| {
            run_awake(2, |awake| {
                let awake = awake.expect("spinning");
                // With nothing shared out, the two idle threads park (however slowly a
                // loaded machine schedules them).
                let all_parked = || {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while awake.parked.load(Ordering::SeqCst) < 2 {
                        assert!(Instant::now() < deadline, "idle threads never parked");
                        std::thread::sleep(SPIN);
                    }
                };
                awake.step();
                all_parked();
                // Work shared out within the step: the parked threads find it by polling.
                let polled = share_out();
                all_parked();
                // The next step wakes them at once.
                awake.step();
                (polled, share_out())
            })
        });
        assert_eq!((polled, woken), (3, 3));
        // Without spinning there is nothing to wake: the pool's own sleep policy applies.
        pool.install(|| with_threads_awake(false, |awake| assert!(awake.is_none())));
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
