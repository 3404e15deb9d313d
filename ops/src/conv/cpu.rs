//! Conv and ConvTranspose in float32, for 1, 2 and 3 spatial dimensions.
//!
//! Conv picks one of four paths in `prepare`: 1x1 stride-1 unpadded convs multiply the
//! weights with the input directly (one GEMM per group); convs with one input channel per
//! group (depthwise) sweep each padded input plane flat (see [`Padded`]); other 1-D and 2-D
//! convs run as implicit GEMM, a chunk of output rows at a time reading its patches in place
//! from a padded band of input rows (see [`Band`]); the rest (3-D convs, windows narrower
//! than their stride) copy input patches into a bounded scratch matrix (im2col, a chunk of
//! output rows at a time), laid out as the GEMM's packed panels so the product does not copy
//! it again, and multiply.
//! ConvTranspose multiplies Wᵀ·X for a chunk of input rows and adds the columns into the
//! output (col2im).
//!
//! 1D and 2D geometries are lifted to 3D with leading unit dimensions, so one loop nest serves
//! all ranks (the pool family shares [`Window`]).
//!
//! Canonical attributes: `kernel_shape`, `strides`, `dilations`, `pads` (all begins, then all
//! ends), `group`, and the post-ops `post_ops`, `post_params` (see [`crate::cpu::post`]): inputs X,
//! W, an optional bias B (present when post-ops read extra inputs), then one extra input per
//! binary post-op. Post-ops are applied to each block of output as soon as it is complete: a
//! chunk of columns (pointwise), a plane (depthwise), a chunk of rows (implicit, im2col), a group's
//! planes (ConvTranspose). With a leading `Add`, the output starts as the residual and
//! everything accumulates onto it (the bias too: every path adds it as it writes its sums),
//! so the step can run over the residual's bytes.
//!
//! A Conv of 8-bit weights (`crate::dequantizes_w`) hands its GEMMs W as integers with a
//! scale and zero point per output channel, which the GEMM dequantizes a block of rows at a
//! time ([`OperandA::Dequantized`]); the depthwise path, whose weights are a few values per
//! channel, dequantizes them whole into a scratch first. A Conv of float16 weights
//! (`crate::takes_f16_weights`) widens them whole into a scratch once a run: A is packed again
//! for every block of columns, and widening it each time cost more than the one pass.
//!
//! A Conv that scales X's channels (`crate::scales_x`, pointwise only) multiplies each image
//! by its weights scaled along the input channels, `W · (s ⊙ X) = (W diag s) · X`: the
//! scaled weights are M x C products per image, where scaling X would be C x pixels.

use crate::cpu::gemm::{
    COLUMN_UNIT, Dequantized, Float, Layout, Narrow, OperandA, OperandB, Panels, Shifted, Start,
    gemm, gemm_operands,
};
use crate::cpu::parallel::{self, column_blocks, for_each_chunk, try_for_each_chunk, with_scratch};
use crate::cpu::post::PostOps;
use crate::cpu::{Kernel, KernelError, OpCx, input, input_f32, output_mut};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use half::f16;
use half::slice::HalfFloatSliceExt;
use ingot_schema::DType;
use multiversion::target::match_target;
use ndarray::{ArrayViewMut2, Axis};
use std::ops::Range;

/// Floats of im2col/col2im scratch per chunk: large enough for the GEMM to reach full speed on a
/// wide chunk, small enough that big images do not need a matrix the size of the image.
const SCRATCH_FLOATS: usize = 1 << 19;

/// Floats of an implicit GEMM chunk's band and sums together: half of im2col's scratch, as
/// each thread holds its own (8 threads on 2 cores held 41 MiB on PP-OCR det with im2col's).
const BAND_FLOATS: usize = 1 << 18;

/// Pointwise convs multiply a chunk of about this many output floats per GEMM call, so that it
/// is still in cache when its post-ops run; but at least [`MIN_COLUMNS`] columns, below which
/// repacking the weights for every call costs more than the cache saves (measured on PP-OCR).
const CHUNK_FLOATS: usize = 1 << 16;
const MIN_COLUMNS: usize = 2048;

mod integer;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "Conv" => Ok(Box::new(Conv::new(cx)?)),
        "ConvInteger" => Ok(Box::new(integer::ConvInteger::new(cx)?)),
        "QLinearConv" => Ok(Box::new(integer::QLinearConv::new(cx)?)),
        "ConvTranspose" => Ok(Box::new(ConvTranspose::new(cx)?)),
        "Col2Im" => super::col2im::prepare(cx),
        "DeformConv" => super::deform::prepare(cx),
        op => Err(KernelError::UnknownOp(op.to_string())),
    }
}

/// Spatial dimensions of the lifted geometry.
pub(crate) const DIMS: usize = 3;

/// Bounds that keep window arithmetic far from overflow: strides, dilations and pads up to
/// 2^30, extents of inputs, outputs and dilated kernels up to 2^40.
const ATTR_LIMIT: usize = 1 << 30;
const EXTENT_LIMIT: usize = 1 << 40;

/// The spatial geometry of a sliding-window op, lifted to [`DIMS`] dimensions.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    /// Spatial dimensions before lifting.
    pub rank: usize,
    pub input: [usize; DIMS],
    pub output: [usize; DIMS],
    pub kernel: [usize; DIMS],
    pub strides: [usize; DIMS],
    pub dilations: [usize; DIMS],
    pub pads_begin: [isize; DIMS],
    pub pads_end: [isize; DIMS],
}

impl Window {
    /// Reads `strides`, `dilations` and `pads` for the given spatial extents (without N, C).
    pub fn new(
        cx: &OpCx,
        input: &[usize],
        kernel: &[usize],
        output: &[usize],
    ) -> Result<Self, KernelError> {
        let rank = input.len();
        if !(1..=DIMS).contains(&rank) || kernel.len() != rank || output.len() != rank {
            return Err(invalid!(
                "{}: spatial shapes {input:?} (input), {kernel:?} (kernel), {output:?} (output) \
                 must have the same rank, 1 to {DIMS}",
                cx.op
            ));
        }
        let strides = cx.attrs.ints("strides")?;
        let dilations = cx.attrs.ints("dilations")?;
        let pads = cx.attrs.ints("pads")?;
        if strides.len() != rank || dilations.len() != rank || pads.len() != 2 * rank {
            return Err(invalid!(
                "{}: strides {strides:?}, dilations {dilations:?} and pads {pads:?} do not match \
                 {rank} spatial dimensions",
                cx.op
            ));
        }
        let positive = |v: &[i64], what: &str| -> Result<Vec<usize>, KernelError> {
            v.iter()
                .map(|&x| usize::try_from(x).ok().filter(|&x| x > 0 && x <= ATTR_LIMIT))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid!("{}: {what} {v:?} must be in 1..=2^30", cx.op))
        };
        let signed = pads
            .iter()
            .map(|&p| isize::try_from(p).ok().filter(|p| p.unsigned_abs() <= ATTR_LIMIT))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid!("{}: pads {pads:?} are out of range", cx.op))?;
        if kernel.contains(&0) {
            return Err(invalid!("{}: kernel {kernel:?} is empty", cx.op));
        }
        let win = Self {
            rank,
            input: lift(input, 1),
            output: lift(output, 1),
            kernel: lift(kernel, 1),
            strides: lift(&positive(strides, "strides")?, 1),
            dilations: lift(&positive(dilations, "dilations")?, 1),
            pads_begin: lift(&signed[..rank], 0),
            pads_end: lift(&signed[rank..], 0),
        };
        let extents = (0..DIMS).all(|d| {
            let kernel = (win.kernel[d] - 1).checked_mul(win.dilations[d]);
            [Some(win.input[d]), Some(win.output[d]), kernel]
                .iter()
                .all(|e| e.is_some_and(|e| e < EXTENT_LIMIT))
        });
        if !extents {
            return Err(invalid!(
                "{}: input {input:?}, kernel {kernel:?} with dilations {dilations:?} or output \
                 {output:?} is too large",
                cx.op
            ));
        }
        Ok(win)
    }

    /// The extent of the dilated kernel along lifted dimension `d`.
    pub fn extent(&self, d: usize) -> usize {
        (self.kernel[d] - 1) * self.dilations[d] + 1
    }

    /// Where tap `k` of the window of position 0 lands along `d` (may be negative).
    pub fn offset(&self, d: usize, k: usize) -> isize {
        (k * self.dilations[d]) as isize - self.pads_begin[d]
    }

    /// Checks the output extents against `expected(self, d)` for each real dimension.
    pub fn check_output(
        &self,
        op: &str,
        expected: impl Fn(&Self, usize) -> Option<usize>,
    ) -> Result<(), KernelError> {
        for d in DIMS - self.rank..DIMS {
            let want = expected(self, d);
            if want != Some(self.output[d]) {
                return Err(invalid!(
                    "{op}: output extent {} along spatial axis {} should be {}",
                    self.output[d],
                    d + self.rank - DIMS,
                    want.map_or("negative".to_string(), |w| w.to_string())
                ));
            }
        }
        Ok(())
    }

    /// `floor((in + pads - extent) / stride) + 1`, the Conv output extent along `d`.
    pub fn conv_output(&self, d: usize) -> Option<usize> {
        let room = self.input[d] as isize + self.pads_begin[d] + self.pads_end[d]
            - self.extent(d) as isize;
        (room >= 0).then(|| room as usize / self.strides[d] + 1)
    }

    pub fn input_size(&self) -> usize {
        self.input.iter().product()
    }
    pub fn output_size(&self) -> usize {
        self.output.iter().product()
    }
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }
    /// Tap `t` of the window (taps in row-major order) as a position in the kernel.
    pub fn tap(&self, t: usize) -> [usize; DIMS] {
        let [_, kh, kw] = self.kernel;
        [t / (kh * kw), t / kw % kh, t % kw]
    }
    /// `(input_size, output_size, taps)`.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.input_size(), self.output_size(), self.taps())
    }
}

/// `v` padded at the front with `fill` to [`DIMS`] entries (`v.len() <= DIMS`).
fn lift<T: Copy>(v: &[T], fill: T) -> [T; DIMS] {
    let mut out = [fill; DIMS];
    out[DIMS - v.len()..].copy_from_slice(v);
    out
}

/// The indices `i < count` with `0 <= i * stride + offset < limit`.
pub(crate) fn span(count: usize, limit: usize, stride: usize, offset: isize) -> Range<usize> {
    let lo = if offset >= 0 { 0 } else { offset.unsigned_abs().div_ceil(stride) };
    let top = limit as isize - 1 - offset;
    let hi = if top < 0 { 0 } else { (top as usize / stride + 1).min(count) };
    lo.min(hi)..hi
}

/// Position `i * stride + offset` along one dimension, if it lies in `0..limit`.
fn at(i: usize, stride: usize, offset: isize, limit: usize) -> Option<usize> {
    usize::try_from((i * stride) as isize + offset).ok().filter(|&p| p < limit)
}

/// Every input and output is f32, but W (input 1) where a Conv reads it narrow: 8-bit where
/// it dequantizes it, or float16.
fn all_f32(cx: &OpCx, transposed: bool) -> Result<(), KernelError> {
    let quantized = !transposed && crate::dequantizes_w(cx.attrs);
    let narrow_w = |i: usize, d: &crate::TensorDesc| {
        i == 1
            && match d.dtype {
                DType::I8 | DType::U8 => quantized,
                DType::F16 => !transposed && !quantized,
                _ => false,
            }
    };
    let mut descs = cx.inputs.iter().enumerate().filter(|&(i, d)| !narrow_w(i, d)).map(|(_, d)| d);
    match descs.by_ref().chain(cx.outputs).find(|d| d.dtype != DType::F32) {
        Some(d) => Err(cx.dtype_error(d.dtype)),
        None => Ok(()),
    }
}

/// Channel counts shared by Conv and ConvTranspose.
#[derive(Clone, Debug)]
struct Channels {
    batch: usize,
    groups: usize,
    /// Input channels per group.
    cin: usize,
    /// Output channels per group.
    cout: usize,
    bias: bool,
}

impl Channels {
    /// Reads `group` and checks X [N, C, ..], W, bias [M] and Y [N, M, ..]; the op has `own`
    /// inputs of its own (2, 3 with the bias, 4 with channel scales too).
    fn new(cx: &OpCx, transposed: bool, own: usize) -> Result<Self, KernelError> {
        all_f32(cx, transposed)?;
        let quantized = !transposed && crate::dequantizes_w(cx.attrs);
        let (x, w, y) = (&cx.inputs[0].shape, &cx.inputs[1].shape, &cx.outputs[0].shape);
        let rank = x.len();
        if rank < 3 || w.len() != rank || y.len() != rank {
            return Err(invalid!(
                "{}: input {x:?}, weights {w:?} and output {y:?} need the same rank, at least 3",
                cx.op
            ));
        }
        let groups = usize::try_from(cx.attrs.int("group")?)
            .ok()
            .filter(|&g| g > 0 && x[1] % g == 0)
            .ok_or_else(|| invalid!("{}: group does not divide {} channels", cx.op, x[1]))?;
        let cin = x[1] / groups;
        // Conv weights are [M, C/group, k..]; ConvTranspose weights are [C, M/group, k..].
        let (w_in, cout, w_ok) = if transposed {
            (w[0], w[1], true)
        } else {
            (w[1] * groups, w[0] / groups, w[0] % groups == 0)
        };
        if !w_ok || w_in != x[1] || y[0] != x[0] || y[1] != cout * groups {
            return Err(invalid!(
                "{}: input {x:?}, weights {w:?}, group {groups} and output {y:?} do not match",
                cx.op
            ));
        }
        let bias = own >= 3;
        let table = crate::weight_table_shape(cout * groups);
        if quantized && (!bias || cx.inputs[2].dtype != DType::F32 || cx.inputs[2].shape != table) {
            return Err(invalid!(
                "{}: 8-bit weights {w:?} need their table, float32 {table:?} (scales, zero \
                 points, bias)",
                cx.op,
            ));
        }
        if bias && !quantized && cx.inputs[2].shape != [cout * groups] {
            return Err(invalid!(
                "{}: bias {:?} should hold {} values",
                cx.op,
                cx.inputs[2].shape,
                cout * groups
            ));
        }
        if cx.attrs.ints("kernel_shape")? != w[2..].iter().map(|&k| k as i64).collect::<Vec<_>>() {
            return Err(invalid!("{}: kernel_shape does not match weights {w:?}", cx.op));
        }
        Ok(Self { batch: x[0], groups, cin, cout, bias })
    }

    /// Starts the output: each plane at its channel's bias (or zero), added to the residual
    /// of a leading `Add` post-op (already in `y` when running in place). Without a bias and
    /// with a residual, only the residual is written.
    fn init_output(
        &self,
        y: &mut [f32],
        bias: Option<&[f32]>,
        plane: usize,
        post: &Post,
    ) -> Result<(), KernelError> {
        // In parallel, whole planes per task.
        let plane = plane.max(1);
        let planes = (INIT_TASK_FLOATS / plane).max(1);
        try_for_each_chunk(y, planes * plane, &|t, yt| {
            self.start_planes(yt, t * planes * plane, bias, plane, post)
        })
    }

    /// [`Self::init_output`] on whole planes `yt`, the output's elements from `at`.
    fn start_planes(
        &self,
        yt: &mut [f32],
        at: usize,
        bias: Option<&[f32]>,
        plane: usize,
        post: &Post,
    ) -> Result<(), KernelError> {
        let (m, plane) = (self.cout * self.groups, plane.max(1));
        let accumulate = post.ops.accumulates();
        if accumulate {
            // The residual a leading Add starts from, unless the output was written over it.
            let residual = match post.extras.first() {
                Some(_) if post.in_place => None,
                Some(r) if r.len() == 1 => Some(*r),
                Some(r) => Some(
                    r.get(at..at + yt.len())
                        .ok_or_else(|| invalid!("the residual does not match the output"))?,
                ),
                None => None,
            };
            post.ops.start(yt, residual.as_slice(), post.in_place)?;
        }
        for (i, yp) in yt.chunks_exact_mut(plane).enumerate() {
            match (bias.and_then(|b| b.get((at / plane + i) % m)), accumulate) {
                (Some(&b), true) => yp.iter_mut().for_each(|v| *v += b),
                (Some(&b), false) => yp.fill(b),
                (None, true) => {}
                (None, false) => yp.fill(0.0),
            }
        }
        Ok(())
    }
}

/// The post-ops of one run, with their operands.
struct Post<'a> {
    ops: &'a PostOps,
    extras: Vec<&'a [f32]>,
    in_place: bool,
}

impl<'a> Post<'a> {
    /// Reads the extra inputs after the `own` ones; `aliased` is the input written over.
    fn new(
        ops: &'a PostOps,
        inputs: &[TensorRef<'a>],
        own: usize,
        len: usize,
        aliased: Option<usize>,
    ) -> Result<Self, KernelError> {
        Ok(Self {
            ops,
            extras: ops.operands(inputs, own, len, aliased)?,
            in_place: aliased.is_some(),
        })
    }

    /// Applies the post-ops to `rows` runs of `width` elements, `stride` apart, the first at
    /// element `at` of `y` (whose first element is element `base` of the output).
    fn apply(
        &self,
        y: &mut [f32],
        base: usize,
        at: usize,
        (rows, width, stride): (usize, usize, usize),
    ) -> Result<(), KernelError> {
        if !self.ops.applies() {
            return Ok(());
        }
        for r in 0..rows {
            let start = at + r * stride;
            let run = y
                .get_mut(start..start + width)
                .ok_or_else(|| invalid!("a post-op block lies outside the output"))?;
            self.ops.apply(run, base + start, &self.extras)?;
        }
        Ok(())
    }
}

impl Post<'_> {
    /// Applies the post-ops to each row of `block`, a block of the output whose first element
    /// is element `first` of the output and whose rows are `row_stride` elements apart.
    fn apply_rows(
        &self,
        mut block: ArrayViewMut2<f32>,
        first: usize,
        row_stride: usize,
    ) -> Result<(), KernelError> {
        if !self.ops.applies() {
            return Ok(());
        }
        // A large block (a whole small image's output in one GEMM) in halves on the pool: on
        // one thread, the second core sat idle for the pass (28x28 layers scaled 1.35x).
        let (rows, cols) = block.dim();
        if rows >= 2 && rows * cols > POST_TASK_FLOATS {
            let mid = rows / 2;
            let (top, bottom) = block.split_at(Axis(0), mid);
            let (a, b) = parallel::join(
                || self.apply_rows(top, first, row_stride),
                || self.apply_rows(bottom, first + mid * row_stride, row_stride),
            );
            return a.and(b);
        }
        for (r, mut row) in block.rows_mut().into_iter().enumerate() {
            let run =
                row.as_slice_mut().ok_or_else(|| invalid!("a post-op row is not contiguous"))?;
            self.ops.apply(run, first + r * row_stride, &self.extras)?;
        }
        Ok(())
    }
}

/// Floats of output one task of [`Post::apply_rows`] finishes.
const POST_TASK_FLOATS: usize = 1 << 15;

/// Runs `run(aliased)` for `run_in_place`, which only the residual of a leading `Add` allows.
fn in_place(
    post: &PostOps,
    own: usize,
    aliased: usize,
    run: impl FnOnce(Option<usize>) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    if post.accumulates() && aliased == own {
        run(Some(aliased))
    } else {
        Err(invalid!("cannot run in place over input {aliased}"))
    }
}

#[derive(Clone, Debug)]
enum ConvPath {
    /// 1x1 kernel, stride 1, no padding: Y_g = W_g · X_g.
    Pointwise,
    /// One input channel per group: each input plane copied into a zero-padded plane split
    /// into its stride phases (see [`Padded`]) and swept flat.
    Depthwise { padded: Padded, taps: Vec<usize> },
    /// Implicit GEMM: a chunk of output rows at a time, the input rows it reads copied once
    /// into a padded band (see [`Band`]) that the GEMM reads each tap's patches from in place.
    Implicit(Band),
    /// im2col `rows` output rows at a time, then GEMM.
    Im2col { rows: usize, taps: Vec<Tap> },
}

/// Where one tap of the window reads, worked out once so that im2col divides nothing per run.
#[derive(Clone, Debug)]
struct Tap {
    /// Where the tap of output position 0 lands along each lifted dimension.
    offsets: [isize; DIMS],
    /// The output columns whose tap lands inside the input row.
    inside: Range<usize>,
}

struct Conv {
    ch: Channels,
    win: Window,
    path: ConvPath,
    lens: [usize; 3],
    post: PostOps,
    /// Inputs before the post-ops' operands.
    own: usize,
    /// W's type where it is 8-bit: the third input is then its table.
    quantized: Option<DType>,
    /// Whether W is float16.
    half: bool,
    /// Whether the fourth input scales X's channels (`crate::scales_x`).
    scaled: bool,
}

impl Conv {
    fn new(cx: &OpCx) -> Result<Self, KernelError> {
        let quantized = crate::dequantizes_w(cx.attrs).then(|| cx.inputs[1].dtype);
        let scaled = crate::scales_x(cx.attrs);
        let own = match (quantized, scaled) {
            (Some(_), false) => 3..=3,
            (None, true) => 4..=4,
            (None, false) => 2..=3,
            (Some(_), true) => return Err(invalid!("Conv: 8-bit weights scale no channels")),
        };
        let (post, own) = PostOps::new(cx, own)?;
        let ch = Channels::new(cx, false, own)?;
        let (x, w, y) = (&cx.inputs[0], &cx.inputs[1], &cx.outputs[0]);
        let win = Window::new(cx, &x.shape[2..], &w.shape[2..], &y.shape[2..])?;
        win.check_output(cx.op, Window::conv_output)?;
        let pointwise = win.kernel == [1; DIMS]
            && win.strides == [1; DIMS]
            && win.pads_begin == [0; DIMS]
            && win.pads_end == [0; DIMS];
        let path = if pointwise {
            ConvPath::Pointwise
        } else if ch.cin == 1 {
            let padded = Padded::new(&win);
            ConvPath::Depthwise { padded, taps: padded.taps(&win) }
        } else if let Some(band) = Band::new(&win, ch.cin, ch.cout) {
            ConvPath::Implicit(band)
        } else {
            let row = ch.cin * win.taps() * win.output[DIMS - 1];
            let taps = (0..win.taps()).map(|t| {
                let offsets: [isize; DIMS] = std::array::from_fn(|d| win.offset(d, win.tap(t)[d]));
                let inside = span(win.output[2], win.input[2], win.strides[2], offsets[2]);
                Tap { offsets, inside }
            });
            ConvPath::Im2col { rows: (SCRATCH_FLOATS / row.max(1)).max(1), taps: taps.collect() }
        };
        if scaled {
            let (pointwise, s) = (matches!(path, ConvPath::Pointwise), &cx.inputs[3]);
            if !pointwise
                || ch.groups != 1
                || s.dtype != DType::F32
                || s.elements() != ch.batch * ch.cin
            {
                return Err(invalid!(
                    "Conv: channel scales {} {:?} need a 1x1 conv in one group and one float32 \
                     per image and channel of X {:?}",
                    s.dtype,
                    s.shape,
                    x.shape
                ));
            }
        }
        let lens = [x.elements(), w.elements(), y.elements()];
        let half = cx.inputs[1].dtype == DType::F16;
        Ok(Self { lens, ch, win, path, post, own, quantized, half, scaled })
    }
}

/// One output plane of a depthwise conv over a padded input plane, `conv(xp, wk)`, as
/// one 1-D conv along the plane's sub-planes read flat (see [`Padded`]): output (z, y, x) is
/// computed at flat position `q = (z·p1 + y)·p2 + x` and tap `t` reads `q + offset[t]`, so
/// register blocks run the length of the plane whatever its stride and however narrow its
/// rows (7x7 planes too). Positions past a row's end are computed into `flat` and dropped;
/// `xp` holds `FLAT_BLOCK` zeros past the padded plane. The sums are written as the GEMM
/// writes its own, `sum + start` for output channel `m` of `start` (its bias and any
/// residual already in `yp`). Compiled for the wider vector units and FMA too (the baseline
/// x86-64 target has SSE2 only); each version sums the taps in order from zero, fused where
/// the GEMM's microkernel is, so the depthwise and the GEMM paths give the same bits.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn depthwise(
    win: &Window,
    xp: &[f32],
    planes: &DepthwisePlanes,
    wk: &[f32],
    (start, m): (&Start<f32>, usize),
    yp: &mut [f32],
    flat: &mut [f32],
) {
    let fused = match_target! {
        "x86_64+fma" => true,
        "aarch64+neon" => true,
        _ => false,
    };
    let [od, oh, ow] = win.output;
    let [_, p1, p2] = planes.padded.phase;
    let taps = (planes.taps, wk);
    let len = planes.padded.flat_len(win);
    let mut block = [0.0f32; FLAT_BLOCK];
    let flat = if len >= FLAT_BLOCK {
        // Blocks of FLAT_BLOCK, the last moved back to end at the end (recomputing a few).
        let flat = &mut flat[..len];
        for j in (0..len).step_by(FLAT_BLOCK) {
            flat_block::<FLAT_BLOCK>(fused, xp, taps, j.min(len - FLAT_BLOCK), flat);
        }
        &*flat
    } else {
        // A short plane (7x7: 61 positions) in one block on the stack, its reads running into
        // the block of zeros past the padded plane's end.
        flat_block::<FLAT_BLOCK>(fused, xp, taps, 0, &mut block);
        &block[..len]
    };
    for (r, yrow) in yp.chunks_exact_mut(ow).enumerate() {
        let q = (r / oh * p1 + r % oh) * p2;
        start.finish_run(m, 1.0, &flat[q..][..ow], yrow);
    }
    debug_assert_eq!(yp.len(), od * oh * ow);
}

/// Floats of the im2col matrix one task fills.
const IM2COL_TASK_FLOATS: usize = 1 << 14;

/// Floats of output one task of [`Channels::init_output`] starts.
const INIT_TASK_FLOATS: usize = 1 << 15;

/// Floats of a flat depthwise plane one register block computes (four AVX-512 vectors).
pub(crate) const FLAT_BLOCK: usize = 64;

/// `flat[j0..j0 + N] = Σ_t w_t · xp[j0 + offset_t ..][..N]`, the sums kept in registers.
#[inline(always)]
fn flat_block<const N: usize>(
    fused: bool,
    xp: &[f32],
    (offsets, weights): (&[usize], &[f32]),
    j0: usize,
    flat: &mut [f32],
) {
    let mut acc = [0.0f32; N];
    for (&off, &w) in offsets.iter().zip(weights) {
        let xs: &[f32; N] = xp[j0 + off..][..N].try_into().unwrap();
        for (a, &x) in acc.iter_mut().zip(xs) {
            *a = if fused { w.mul_add(x, *a) } else { *a + w * x };
        }
    }
    flat[j0..][..N].copy_from_slice(&acc);
}

impl Conv {
    /// Copies the input patches of output rows `rows` (lifted rows: D x H) into `panels`: the
    /// im2col matrix (one row per (channel, tap), one column per output position) written as
    /// the GEMM's [`Panels`], so the product reads it without packing it again.
    fn im2col(&self, taps: &[Tap], xg: &[f32], rows: Range<usize>, panels: &mut [f32]) {
        let ow = self.win.output[DIMS - 1];
        let (first, width) = (rows.start * ow, rows.len() * ow);
        let nr = f32::panel_width();
        let panel_len = self.ch.cin * self.win.taps() * nr;
        // In parallel, whole panels per task: the chunks of output rows that column blocks
        // hand out are too few on small images to keep every thread busy.
        let per_task = (IM2COL_TASK_FLOATS / panel_len.max(1)).max(1);
        let task = |t: usize, chunk: &mut [f32]| {
            for (p, panel) in chunk.chunks_exact_mut(panel_len).enumerate() {
                let j = (t * per_task + p) * nr;
                let columns = first + j..first + width.min(j + nr);
                im2col_panel(&self.win, taps, self.ch.cin, xg, columns, panel);
            }
        };
        for_each_chunk(panels, per_task * panel_len.max(1), &task);
    }
}

/// One panel of [`Conv::im2col`]: output positions `columns` (lifted D x H x W, flat) of
/// every (channel, tap) row, `panel.len() / rows` values per row, zeros past the last column.
/// Compiled for the wider vector units too (stride-2 copies deinterleave, which SSE2 does in
/// narrow steps).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn im2col_panel(
    win: &Window,
    taps: &[Tap],
    cin: usize,
    xg: &[f32],
    columns: Range<usize>,
    panel: &mut [f32],
) {
    let [_, oh, ow] = win.output;
    let [id, ih, _] = win.input;
    let [sd, sh, sw] = win.strides;
    let plane = win.input_size();
    let nr = panel.len() / (cin * taps.len());
    // The same tap of consecutive channels: panel rows `channel_stride` values apart.
    let channel_stride = taps.len() * nr;
    debug_assert!(nr <= ZEROS.len() && columns.len() <= nr);
    if columns.len() < nr {
        for row in panel.chunks_exact_mut(nr) {
            copy_short(&mut row[columns.len()..], &ZEROS);
        }
    }
    // A run of the panel's columns on one output row, then each tap of it for every channel.
    let mut pos = columns.start;
    while pos < columns.end {
        let (r, x0) = (pos / ow, pos % ow);
        let xs = x0..ow.min(x0 + columns.end - pos);
        let j = pos - columns.start;
        let (zo, yo) = (r / oh, r % oh);
        for (t, tap) in taps.iter().enumerate() {
            let [oz, oy, off] = tap.offsets;
            let (z, y) = (at(zo, sd, oz, id), at(yo, sh, oy, ih));
            let inside = &tap.inside;
            let valid = inside.start.clamp(xs.start, xs.end)..inside.end.clamp(xs.start, xs.end);
            // Columns `cols` of this tap's row, for every channel.
            let rows = |cols: Range<usize>| {
                let first = t * nr + j + cols.start - xs.start;
                (0..cin)
                    .map(move |c| first + c * channel_stride..)
                    .map(move |r| r.start..r.start + cols.len())
            };
            let (Some(z), Some(y), false) = (z, y, valid.is_empty()) else {
                rows(xs.clone()).for_each(|r| copy_short(&mut panel[r], &ZEROS));
                continue;
            };
            for pad in [xs.start..valid.start, valid.end..xs.end] {
                if !pad.is_empty() {
                    rows(pad).for_each(|r| copy_short(&mut panel[r], &ZEROS));
                }
            }
            let from =
                (z * ih + y) * win.input[DIMS - 1] + (valid.start * sw).wrapping_add_signed(off);
            for (c, r) in rows(valid).enumerate() {
                let src = &xg[c * plane + from..];
                match sw {
                    1 => copy_short(&mut panel[r], src),
                    _ => fold_strided(&mut panel[r], src, sw, |_, v| v),
                }
            }
        }
        pos += xs.len();
    }
}

/// Zeros for [`copy_short`]: a panel is never wider.
const ZEROS: [f32; 64] = [0.0; 64];

/// `dst = src[..dst.len()]` for the short runs of a panel row (at most its width), in copies
/// of fixed length that overlap at the end: a call to `memcpy` per run cost more than the run.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32]) {
        let n = dst.len();
        for (d, s) in dst.chunks_exact_mut(N).zip(src.chunks_exact(N)) {
            *<&mut [f32; N]>::try_from(d).unwrap() = s.try_into().unwrap();
        }
        *<&mut [f32; N]>::try_from(&mut dst[n - N..]).unwrap() = src[n - N..].try_into().unwrap();
    }
    let src = &src[..dst.len()];
    match dst.len() {
        16.. => fixed::<16>(dst, src),
        8.. => fixed::<8>(dst, src),
        4.. => fixed::<4>(dst, src),
        0 => {}
        n => [0, n / 2, n - 1].into_iter().for_each(|i| dst[i] = src[i]),
    }
}

/// `dst[j] = f(dst[j], src[j * stride])` for every j (`src` must be long enough).
#[inline(always)]
pub(crate) fn fold_strided<T: Copy>(
    dst: &mut [T],
    src: &[T],
    stride: usize,
    f: impl Fn(T, T) -> T,
) {
    match stride {
        1 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = f(*d, s);
            }
        }
        // Whole pairs vectorise; `step_by` does not.
        2 => {
            let whole = dst.len().min(src.len() / 2);
            for (d, pair) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f(*d, pair[0]);
            }
            for (j, d) in dst.iter_mut().enumerate().skip(whole) {
                *d = f(*d, src[2 * j]);
            }
        }
        _ => {
            for (d, &s) in dst.iter_mut().zip(src.iter().step_by(stride)) {
                *d = f(*d, s);
            }
        }
    }
}

/// A depthwise conv's input plane, zero-padded so that every tap of every output lands
/// inside it, and split into its stride phases along every dimension: sub-plane (i, j, k)
/// holds the padded positions (z, y, x) with `z % sd == i`, `y % sh == j`, `x % sw == k`, at
/// (z / sd, y / sh, x / sw) of a `p0 x p1 x p2` block. Tap (a, b, c) of output (z, y, x) is
/// then at the output's own position in the tap's sub-plane, moved by the same amount for
/// every output: any stride is a stride-1 conv read flat.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Padded {
    strides: [usize; DIMS],
    /// Extents of a sub-plane.
    pub phase: [usize; DIMS],
}

impl Padded {
    pub fn new(win: &Window) -> Self {
        let extent = |d: usize| (win.output[d].max(1) - 1) * win.strides[d] + win.extent(d);
        Self {
            strides: win.strides,
            phase: std::array::from_fn(|d| extent(d).div_ceil(win.strides[d])),
        }
    }

    fn sub_len(&self) -> usize {
        self.phase.iter().product()
    }

    pub fn len(&self) -> usize {
        self.sub_len() * self.strides.iter().product::<usize>()
    }

    /// Where padded position `p` is stored.
    #[inline(always)]
    pub fn index(&self, p: [usize; DIMS]) -> usize {
        let ([_, s1, s2], [_, p1, p2]) = (self.strides, self.phase);
        // Divisions only for strides past 2: this runs once per row copied in.
        let split = |d: usize| match self.strides[d] {
            1 => (0, p[d]),
            2 => (p[d] & 1, p[d] >> 1),
            s => (p[d] % s, p[d] / s),
        };
        let [(i, z), (j, y), (k, x)] = std::array::from_fn(split);
        ((i * s1 + j) * s2 + k) * self.sub_len() + (z * p1 + y) * p2 + x
    }

    /// Where each tap of `win` reads in the plane, from an output's own flat position.
    pub fn taps(&self, win: &Window) -> Vec<usize> {
        let tap = |t: usize| {
            let at = win.tap(t);
            self.index(std::array::from_fn(|d| at[d] * win.dilations[d]))
        };
        (0..win.taps()).map(tap).collect()
    }

    /// Floats of the flat scratch a plane is computed in: every flat position from the first
    /// output's to the last one's.
    pub fn flat_len(&self, win: &Window) -> usize {
        let [od, oh, ow] = win.output;
        let [_, p1, p2] = self.phase;
        match od * oh * ow {
            0 => 0,
            _ => ((od - 1) * p1 + oh - 1) * p2 + ow,
        }
    }

    /// Stores `row`, padded columns `x..` of a row, into its sub-planes: `dst` starts where
    /// the row's column 0 is stored, and the sub-plane of each next phase is `sub_len` further.
    #[inline(always)]
    fn scatter(&self, row: &[f32], x: usize, dst: &mut [f32]) {
        let sub = self.sub_len();
        match self.strides[DIMS - 1] {
            1 => copy_short(&mut dst[x..][..row.len()], row),
            2 => {
                // Pairs of (even, odd) columns go to the two sub-planes; a leading odd column
                // and a trailing even one are stored alone.
                let lead = (x % 2).min(row.len());
                let body = &row[lead..];
                let (even, odd) = dst.split_at_mut(sub);
                let at = (x + lead) / 2;
                for ((e, o), pair) in
                    even[at..].iter_mut().zip(&mut odd[at..]).zip(body.chunks_exact(2))
                {
                    (*e, *o) = (pair[0], pair[1]);
                }
                if lead == 1 {
                    odd[x / 2] = row[0];
                }
                if let (1, Some(&last)) = (body.len() % 2, row.last()) {
                    even[(x + row.len() - 1) / 2] = last;
                }
            }
            s => {
                for (i, &v) in row.iter().enumerate() {
                    dst[(x + i) % s * sub + (x + i) / s] = v;
                }
            }
        }
    }

    /// Copies the input plane `xp` in; the padding of `out` must already be zero.
    #[inline(always)]
    fn fill(&self, win: &Window, xp: &[f32], out: &mut [f32]) {
        let [_, ih, iw] = win.input;
        let extent = |d: usize| self.phase[d] * self.strides[d];
        let range = |d: usize| span(extent(d), win.input[d], 1, -win.pads_begin[d]);
        let src = |p: usize, d: usize| p.wrapping_add_signed(-win.pads_begin[d]);
        let (zs, ys, xs) = (range(0), range(1), range(2));
        if xs.is_empty() {
            return;
        }
        for z in zs {
            for y in ys.clone() {
                let row = &xp[(src(z, 0) * ih + src(y, 1)) * iw..][..iw];
                let row = &row[src(xs.start, 2)..][..xs.len()];
                self.scatter(row, xs.start, &mut out[self.index([z, y, 0])..]);
            }
        }
    }
}

/// [`Padded::fill`], compiled for the wider vector units too (a stride-2 plane's phases
/// deinterleave its rows, which SSE2 does in narrow steps).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
pub(crate) fn fill_padded(padded: Padded, win: &Window, xp: &[f32], out: &mut [f32]) {
    padded.fill(win, xp, out);
}

impl Kernel for Conv {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        self.compute(inputs, outputs, None)
    }

    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        in_place(&self.post, self.own, aliased, |a| self.compute(inputs, outputs, a))
    }
}

impl Conv {
    /// Runs the conv; `aliased` is the input the output was written over, if any.
    fn compute(
        &self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        aliased: Option<usize>,
    ) -> Result<(), KernelError> {
        let w = self.weights(inputs, self.lens[1])?;
        match w {
            // Widened whole, once a run: the GEMMs would widen a block of them again for every
            // block of columns (a 3x3 conv at 160x160 packs its weights 25 times).
            Weights::Half(_) => {
                w.floats(|w| self.compute_with(Weights::Float(w), inputs, outputs, aliased))
            }
            _ => self.compute_with(w, inputs, outputs, aliased),
        }
    }

    /// [`Conv::compute`] with W as `w`.
    fn compute_with(
        &self,
        w: Weights,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        aliased: Option<usize>,
    ) -> Result<(), KernelError> {
        let [xn, _, yn] = self.lens;
        let x = input_f32(inputs, 0, xn)?;
        let m = self.ch.cout * self.ch.groups;
        let bias = match (self.ch.bias, self.quantized) {
            (true, None) => Some(input_f32(inputs, 2, m)?),
            // The table's last row.
            (true, Some(_)) => Some(&input_f32(inputs, 2, 3 * m)?[2 * m..]),
            (false, _) => None,
        };
        let post = Post::new(&self.post, inputs, self.own, yn, aliased)?;
        let y = output_mut::<f32>(outputs, 0, yn)?;
        let Channels { groups, cin, cout, .. } = self.ch;
        let (in_plane, out_plane, taps) = self.win.sizes();
        // Every path adds the bias as it writes its sums, over the residual if any: only the
        // residual is written first.
        let accumulate = post.ops.accumulates();
        if accumulate && !post.in_place {
            self.ch.init_output(y, None, out_plane, &post)?;
        }
        if y.is_empty() {
            return Ok(());
        }
        let beta = if accumulate { 1.0 } else { 0.0 };
        if let ConvPath::Depthwise { padded, ref taps } = self.path {
            let planes = DepthwisePlanes { padded, taps };
            let start = Start { beta, bias };
            return w.floats(|w| self.depthwise_planes((x, w, start), y, &post, planes));
        }
        let start = |g: usize| Start { beta, bias: bias.map(|b| &b[g * cout..][..cout]) };
        let ow = self.win.output[DIMS - 1].max(1);
        // One block of the output per (image, group), in parallel; pointwise and im2col
        // blocks split again into chunks of columns.
        let block = cout * out_plane;
        try_for_each_chunk(y, block, &|ng, yg| {
            let g = ng % groups;
            let xg = &x[ng * cin * in_plane..][..cin * in_plane];
            let wg = |k: usize| w.rows(g * cout..(g + 1) * cout, k);
            let base = ng * block;
            let yv = ArrayViewMut2::from_shape((cout, out_plane), yg)
                .map_err(|e| invalid!("conv output block: {e}"))?;
            match self.path {
                ConvPath::Pointwise => {
                    let scaled = self.scaled_weights(w, inputs, ng)?;
                    let wg = |k: usize| match &scaled {
                        Some(w) => Weights::Float(w).rows(0..cout, k),
                        None => wg(k),
                    };
                    let cols = (CHUNK_FLOATS / cout.max(1)).max(MIN_COLUMNS);
                    column_blocks(yv, (cols, COLUMN_UNIT), &|c, mut yc| {
                        let lb = Layout::new(cin, c.len(), in_plane, 1);
                        let b = OperandB::Matrix(lb.view("B", &xg[c.start..])?);
                        gemm_operands(1.0, wg(cin)?, b, start(g), yc.view_mut())?;
                        post.apply_rows(yc, base + c.start, out_plane)
                    })
                }
                ConvPath::Depthwise { .. } => Err(invalid!("depthwise convs run by plane")),
                ConvPath::Implicit(ref band) => {
                    column_blocks(yv, (band.chunk_rows * ow, ow), &|c, yc| {
                        let rows = c.start / ow..c.end.div_ceil(ow);
                        let finish = Finish {
                            start: start(g),
                            post: &post,
                            first: base + c.start,
                            stride: out_plane,
                        };
                        self.implicit(band, xg, wg(cin * taps)?, rows, yc, &finish)
                    })
                }
                ConvPath::Im2col { rows, taps: ref tap_list } => {
                    column_blocks(yv, (rows * ow, ow), &|c, mut yc| {
                        let rows = c.start / ow..c.end.div_ceil(ow);
                        let k = cin * taps;
                        with_scratch(Panels::<f32>::len(k, c.len()), |col| {
                            self.im2col(tap_list, xg, rows, col);
                            let b = OperandB::Panels(Panels::new(col, k, c.len())?);
                            gemm_operands(1.0, wg(k)?, b, start(g), yc.view_mut())
                        })?;
                        post.apply_rows(yc, base + c.start, out_plane)
                    })
                }
            }
        })
    }
}

impl Conv {
    /// The weights of a conv that scales X's channels, scaled by image `n`'s factors, or
    /// None for any other conv.
    fn scaled_weights(
        &self,
        w: Weights,
        inputs: &[TensorRef],
        n: usize,
    ) -> Result<Option<Vec<f32>>, KernelError> {
        if !self.scaled {
            return Ok(None);
        }
        let cin = self.ch.cin;
        let s = &input_f32(inputs, 3, self.ch.batch * cin)?[n * cin..][..cin];
        let scaled = |w: &[f32]| -> Vec<f32> {
            w.chunks(cin.max(1)).flat_map(|row| row.iter().zip(s).map(|(w, s)| w * s)).collect()
        };
        Ok(Some(w.floats(scaled)))
    }

    /// W as the step holds it: float32, float16, or 8-bit with its dequantization.
    fn weights<'a>(
        &self,
        inputs: &[TensorRef<'a>],
        len: usize,
    ) -> Result<Weights<'a>, KernelError> {
        let Some(dtype) = self.quantized else {
            return Ok(match self.half {
                true => Weights::Half(input(inputs, 1, len)?),
                false => Weights::Float(input_f32(inputs, 1, len)?),
            });
        };
        let m = self.ch.cout * self.ch.groups;
        let levels = match dtype {
            DType::I8 => Levels::I8(input(inputs, 1, len)?),
            _ => Levels::U8(input(inputs, 1, len)?),
        };
        let table = input_f32(inputs, 2, 3 * m)?;
        let (scale, zero) = (&table[..m], &table[m..2 * m]);
        Ok(Weights::Quantized { levels, scale, zero })
    }
}

/// A conv's weights, [M, C/group, k..]: float32, float16, or 8-bit integers with a scale and
/// zero point per output channel (row).
#[derive(Clone, Copy)]
enum Weights<'a> {
    Float(&'a [f32]),
    Half(&'a [f16]),
    Quantized { levels: Levels<'a>, scale: &'a [f32], zero: &'a [f32] },
}

#[derive(Clone, Copy)]
enum Levels<'a> {
    I8(&'a [i8]),
    U8(&'a [u8]),
}

impl<'a> Weights<'a> {
    /// Output channels `rows`, of `k` values each, as a GEMM's A.
    fn rows(self, rows: Range<usize>, k: usize) -> Result<OperandA<'a, f32>, KernelError> {
        let at = rows.start * k..rows.end * k;
        let err = |e| invalid!("conv weights of {k} per channel: {e}");
        match self {
            Weights::Float(w) => {
                let a = ndarray::ArrayView2::from_shape((rows.len(), k), &w[at]).map_err(err)?;
                Ok(OperandA::Matrix(a))
            }
            // Aᵀ: k x rows, each column an output channel's contiguous values.
            Weights::Half(_) => Err(invalid!("float16 weights are widened before their GEMMs")),
            Weights::Quantized { levels, scale, zero } => {
                use ndarray::ShapeBuilder;
                let shape = (k, rows.len()).strides((1, k));
                let values = match levels {
                    Levels::I8(q) => {
                        Narrow::I8(ndarray::ArrayView2::from_shape(shape, &q[at]).map_err(err)?)
                    }
                    Levels::U8(q) => {
                        Narrow::U8(ndarray::ArrayView2::from_shape(shape, &q[at]).map_err(err)?)
                    }
                };
                let (scale, zero) = (&scale[rows.clone()], &zero[rows]);
                Ok(OperandA::Dequantized(Dequantized::new(values, scale, zero)?))
            }
        }
    }

    /// `f` of the weights as float32: narrow ones widened whole into a scratch first.
    fn floats<R>(self, f: impl FnOnce(&[f32]) -> R) -> R {
        let (levels, scale, zero) = match self {
            Weights::Float(w) => return f(w),
            Weights::Half(h) => {
                return with_scratch(h.len(), |w: &mut [f32]| {
                    h.convert_to_f32_slice(w);
                    f(w)
                });
            }
            Weights::Quantized { levels, scale, zero } => (levels, scale, zero),
        };
        let value =
            |i: usize, q: i32, per_row: usize| (q as f32 - zero[i / per_row]) * scale[i / per_row];
        let len = match levels {
            Levels::I8(q) => q.len(),
            Levels::U8(q) => q.len(),
        };
        let per_row = (len / scale.len().max(1)).max(1);
        with_scratch(len, |w: &mut [f32]| {
            match levels {
                Levels::I8(q) => w
                    .iter_mut()
                    .zip(q)
                    .enumerate()
                    .for_each(|(i, (v, &q))| *v = value(i, q.into(), per_row)),
                Levels::U8(q) => w
                    .iter_mut()
                    .zip(q)
                    .enumerate()
                    .for_each(|(i, (v, &q))| *v = value(i, q.into(), per_row)),
            }
            f(w)
        })
    }
}

impl Conv {
    /// The depthwise path: each (image, group) block is its input plane, copied into a padded
    /// plane, against its `cout` filters; each output plane is written once, its sums plus
    /// the bias (and the residual already there). Blocks go in tasks of several: small planes
    /// (7x7) otherwise paid a task, two scratch buffers and a zeroed padding each, 1.3 GMAC/s
    /// on shufflenet's last stage. The tap offsets are worked out in `prepare`: per plane,
    /// they cost as much as a 7x7 plane's sums.
    fn depthwise_planes(
        &self,
        (x, w, start): (&[f32], &[f32], Start<f32>),
        y: &mut [f32],
        post: &Post,
        planes: DepthwisePlanes,
    ) -> Result<(), KernelError> {
        let Channels { groups, cin, cout, .. } = self.ch;
        let padded = planes.padded;
        let (in_plane, out_plane, taps) = self.win.sizes();
        let block = (cout * out_plane).max(1);
        let per_task = (DEPTHWISE_TASK_FLOATS / block).max(1);
        let task = |t: usize, yt: &mut [f32]| {
            // A block of zeros past the padded plane for a short flat plane to read into.
            with_scratch(padded.len() + FLAT_BLOCK, |scratch| {
                // The scratch is shared with other kernels: its padding must be zeroed (once:
                // every plane writes the same interior).
                scratch.fill(0.0);
                with_scratch(padded.flat_len(&self.win), |flat| {
                    for (i, yg) in yt.chunks_exact_mut(block).enumerate() {
                        let ng = t * per_task + i;
                        let base = ng * block;
                        let xg = &x[ng * cin * in_plane..][..cin * in_plane];
                        let wg = &w[ng % groups * cout * taps..][..cout * taps];
                        fill_padded(padded, &self.win, xg, scratch);
                        for (m, yp) in yg.chunks_exact_mut(out_plane.max(1)).enumerate() {
                            let wk = &wg[m * taps..][..taps];
                            let plane = (&start, ng % groups * cout + m);
                            depthwise(&self.win, scratch, &planes, wk, plane, yp, flat);
                            post.apply(yp, base + m * out_plane, 0, (1, out_plane, 0))?;
                        }
                    }
                    Ok(())
                })
            })
        };
        try_for_each_chunk(y, per_task * block, &task)
    }
}

impl Conv {
    /// Output rows `rows` of one group, `yc`, by implicit GEMM: the band of input rows they
    /// read is filled, the GEMM sums the taps at every flat band position of the chunk (a row
    /// of `p2` positions per output row, of which the first `ow` are outputs) into a scratch,
    /// and the outputs are finished from it (see [`Conv::finish_implicit`]).
    fn implicit(
        &self,
        band: &Band,
        xg: &[f32],
        wg: OperandA<f32>,
        rows: Range<usize>,
        yc: ArrayViewMut2<f32>,
        finish: &Finish,
    ) -> Result<(), KernelError> {
        let (cin, cout) = (self.ch.cin, self.ch.cout);
        let ow = self.win.output[DIMS - 1];
        let p2 = band.padded.phase[DIMS - 1];
        let n = (rows.len() - 1) * p2 + ow;
        let rows_max = band.offsets.iter().max().copied().unwrap_or(0);
        let band_len = (cin * band.padded.len()).max(rows_max + Shifted::<f32>::width(n));
        with_scratch(band_len, |data| {
            fill_band(band, &self.win, xg, rows.start, data);
            with_scratch(cout * n, |sums| {
                let b = OperandB::Shifted(Shifted::new(data, &band.offsets, n)?);
                let sums_view = ArrayViewMut2::from_shape((cout, n), &mut *sums)
                    .map_err(|e| invalid!("implicit conv sums: {e}"))?;
                gemm_operands(1.0, wg, b, Start::scaled(0.0), sums_view)?;
                self.finish_implicit((sums, n, p2), 0, yc, finish)
            })
        })
    }

    /// Finishes output channels `m0..` of an implicit GEMM chunk: each output row's sums onto
    /// the output as the GEMM finishes its own (`sum + start`), then the post-ops on the
    /// channel's rows while they are in L1 (a pass of its own read them back from L2). Large
    /// chunks in halves on the pool, as [`Post::apply_rows`] does.
    fn finish_implicit(
        &self,
        (sums, n, p2): (&[f32], usize, usize),
        m0: usize,
        mut yc: ArrayViewMut2<f32>,
        finish: &Finish,
    ) -> Result<(), KernelError> {
        let (channels, cols) = yc.dim();
        if channels >= 2 && channels * cols > POST_TASK_FLOATS {
            let mid = channels / 2;
            let (top, bottom) = yc.split_at(Axis(0), mid);
            let (a, b) = parallel::join(
                || self.finish_implicit((sums, n, p2), m0, top, finish),
                || self.finish_implicit((&sums[mid * n..], n, p2), m0 + mid, bottom, finish),
            );
            return a.and(b);
        }
        let ow = self.win.output[DIMS - 1];
        for (i, (mut yrow, srow)) in yc.rows_mut().into_iter().zip(sums.chunks_exact(n)).enumerate()
        {
            let yrow = yrow
                .as_slice_mut()
                .ok_or_else(|| invalid!("a conv output row is not contiguous"))?;
            for (r, yr) in yrow.chunks_exact_mut(ow).enumerate() {
                finish.start.finish_run(m0 + i, 1.0, &srow[r * p2..][..ow], yr);
            }
            if finish.post.ops.applies() {
                let at = finish.first + (m0 + i) * finish.stride;
                finish.post.ops.apply(yrow, at, &finish.post.extras)?;
            }
        }
        Ok(())
    }
}

/// How an implicit GEMM chunk's outputs are finished: the GEMM's start (bias, residual), then
/// the post-ops, the chunk's first element being element `first` of the output and its
/// channels `stride` elements apart.
struct Finish<'a> {
    start: Start<'a, f32>,
    post: &'a Post<'a>,
    first: usize,
    stride: usize,
}

/// The input rows a chunk of output rows reads, zero-padded and split into stride phases as a
/// depthwise conv's plane is (see [`Padded`]), one band per input channel: sub-plane rows
/// `y0..y0 + rows` of every phase for the chunk whose first output row is `y0`. Tap t of
/// output (y, x) of the chunk then reads its channel's band at flat position
/// `(y - y0)·p2 + x` moved by the tap's offset, the same for every output: the patches of
/// (channel, tap) are a window of the band, the row `offsets[c·taps + t]` of a [`Shifted`] B.
/// For 1-D and 2-D convs (3-D ones take im2col).
#[derive(Clone, Debug)]
struct Band {
    /// One channel's band: sub-planes of `1 x rows x p2`, `p2` the padded plane's phase width.
    padded: Padded,
    /// Output rows per chunk.
    chunk_rows: usize,
    /// Where each (channel, tap) row of the GEMM's B starts in the bands.
    offsets: Vec<usize>,
}

impl Band {
    fn new(win: &Window, cin: usize, cout: usize) -> Option<Self> {
        // A window narrower than its stride skips input (a 1x1 stride-2 conv reads a quarter
        // of it): im2col copies only what is read, a band all of it.
        let skips = (1..DIMS).any(|d| win.extent(d) < win.strides[d]);
        if win.output[0] != 1 || win.input[0] != 1 || win.kernel[0] != 1 || skips {
            return None;
        }
        let plane = Padded::new(win);
        let [_, sh, sw] = win.strides;
        let p2 = plane.phase[DIMS - 1];
        // The band and the sums of a chunk in about as much scratch as im2col takes.
        let per_row = (cin * sh * sw + cout) * p2;
        let chunk_rows = (BAND_FLOATS / per_row.max(1)).clamp(1, win.output[1].max(1));
        let reach = (win.extent(1) - 1) / sh;
        let padded = Padded { strides: win.strides, phase: [1, chunk_rows + reach, p2] };
        let taps = padded.taps(win);
        let offsets = (0..cin).flat_map(|c| taps.iter().map(move |&t| c * padded.len() + t));
        Some(Self { padded, chunk_rows, offsets: offsets.collect() })
    }
}

/// Fills the bands of the chunk whose first output row is `y0`: zeros, then the input rows
/// that land in them. Compiled for the wider vector units too (a stride-2 band's phases
/// deinterleave its rows).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn fill_band(band: &Band, win: &Window, xg: &[f32], y0: usize, data: &mut [f32]) {
    let padded = band.padded;
    let [_, ih, iw] = win.input;
    let [_, sh, sw] = win.strides;
    let [_, rows, p2] = padded.phase;
    data.fill(0.0);
    // The padded columns that hold input, and the input columns they hold.
    let xs = span(p2 * sw, iw, 1, -win.pads_begin[2]);
    if xs.is_empty() {
        return;
    }
    let first = xs.start.wrapping_add_signed(-win.pads_begin[2]);
    let plane = ih * iw;
    for (c, dst) in data.chunks_exact_mut(padded.len()).take(xg.len() / plane.max(1)).enumerate() {
        for py in 0..rows * sh {
            let Some(iy) = at(y0 * sh + py, 1, -win.pads_begin[1], ih) else {
                continue;
            };
            let row = &xg[c * plane + iy * iw + first..][..xs.len()];
            padded.scatter(row, xs.start, &mut dst[padded.index([0, py, 0])..]);
        }
    }
}

/// A depthwise conv's padded planes and where each tap reads in them, from an output's own
/// flat position.
struct DepthwisePlanes<'a> {
    padded: Padded,
    taps: &'a [usize],
}

/// Output floats one depthwise task computes.
const DEPTHWISE_TASK_FLOATS: usize = 1 << 12;

struct ConvTranspose {
    ch: Channels,
    win: Window,
    /// Input rows (lifted D x H) per GEMM + col2im chunk.
    rows: usize,
    lens: [usize; 3],
    post: PostOps,
    /// Inputs before the post-ops' operands.
    own: usize,
}

impl ConvTranspose {
    fn new(cx: &OpCx) -> Result<Self, KernelError> {
        let (post, own) = PostOps::new(cx, 2..=3)?;
        let ch = Channels::new(cx, true, own)?;
        let (x, w, y) = (&cx.inputs[0], &cx.inputs[1], &cx.outputs[0]);
        let win = Window::new(cx, &x.shape[2..], &w.shape[2..], &y.shape[2..])?;
        // out = stride * (in - 1) + extent - pads; output_padding is folded into the end pad.
        win.check_output(cx.op, |w, d| {
            let out = (w.strides[d] as isize).checked_mul(w.input[d] as isize - 1)?
                + w.extent(d) as isize
                - w.pads_begin[d]
                - w.pads_end[d];
            usize::try_from(out).ok()
        })?;
        let row = ch.cout * win.taps() * win.input[DIMS - 1];
        Ok(Self {
            rows: (SCRATCH_FLOATS / row.max(1)).max(1),
            lens: [x.elements(), w.elements(), y.elements()],
            ch,
            win,
            post,
            own,
        })
    }

    /// Adds the columns of input rows `rows` into the output planes `yg` of one group.
    fn col2im(&self, col: &[f32], rows: Range<usize>, yg: &mut [f32]) {
        let win = &self.win;
        let [od, oh, ow] = win.output;
        let [_, ih, iw] = win.input;
        let [sd, sh, sw] = win.strides;
        let (taps, plane) = (win.taps(), win.output_size());
        let width = rows.len() * iw;
        for (i, crow) in col.chunks_exact(width).enumerate() {
            let (m, t) = (i / taps, i % taps);
            let [a, b, k] = win.tap(t);
            let yp = &mut yg[m * plane..][..plane];
            let off = win.offset(2, k);
            let valid = span(iw, ow, sw, off);
            if valid.is_empty() {
                continue;
            }
            for (r, seg) in rows.clone().zip(crow.chunks_exact(iw)) {
                let z = at(r / ih, sd, win.offset(0, a), od);
                let yy = at(r % ih, sh, win.offset(1, b), oh);
                let (Some(z), Some(yy)) = (z, yy) else {
                    continue;
                };
                let yrow = &mut yp[(z * oh + yy) * ow..][..ow];
                let start = (valid.start * sw).wrapping_add_signed(off);
                for (d, s) in yrow[start..].iter_mut().step_by(sw).zip(&seg[valid.clone()]) {
                    *d += *s;
                }
            }
        }
    }
}

impl Kernel for ConvTranspose {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        self.compute(inputs, outputs, None)
    }

    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        in_place(&self.post, self.own, aliased, |a| self.compute(inputs, outputs, a))
    }
}

impl ConvTranspose {
    /// Runs the transposed conv; `aliased` is the input the output was written over, if any.
    fn compute(
        &self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        aliased: Option<usize>,
    ) -> Result<(), KernelError> {
        let [xn, wn, yn] = self.lens;
        let x = input_f32(inputs, 0, xn)?;
        let w = input_f32(inputs, 1, wn)?;
        let bias = match self.ch.bias {
            true => Some(input_f32(inputs, 2, self.ch.cout * self.ch.groups)?),
            false => None,
        };
        let post = Post::new(&self.post, inputs, self.own, yn, aliased)?;
        let y = output_mut::<f32>(outputs, 0, yn)?;
        let Channels { batch, groups, cin, cout, .. } = self.ch;
        let (in_plane, out_plane, taps) = self.win.sizes();
        self.ch.init_output(y, bias, out_plane, &post)?;
        if y.is_empty() {
            return Ok(());
        }
        let iw = self.win.input[DIMS - 1];
        let total = in_plane / iw.max(1);
        // Column matrix rows: (output channel, tap); W_g is [cin, cout * taps], used transposed.
        let mk = cout * taps;
        let mut col = vec![0.0; mk * self.rows * iw];
        for n in 0..batch {
            for g in 0..groups {
                let xg = &x[(n * groups + g) * cin * in_plane..][..cin * in_plane];
                let wg = &w[g * cin * mk..][..cin * mk];
                let base = (n * groups + g) * cout * out_plane;
                let yg = &mut y[base..][..cout * out_plane];
                for r0 in (0..total).step_by(self.rows) {
                    let r1 = (r0 + self.rows).min(total);
                    let width = (r1 - r0) * iw;
                    let col = &mut col[..mk * width];
                    gemm(
                        1.0,
                        wg,
                        Layout::new(mk, cin, 1, mk),
                        &xg[r0 * iw..],
                        Layout::new(cin, width, in_plane, 1),
                        0.0,
                        col,
                        Layout::row_major(mk, width),
                    )?;
                    self.col2im(col, r0..r1, yg);
                }
                post.apply(yg, base, 0, (1, cout * out_plane, 0))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cpu::eval;
    use crate::cpu::post::BINARY;
    use crate::cpu::post::tests::{assert_close, same_in_place, unfused, with_post};
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs};

    /// Exact binary fractions, so sums are exact: `((i * 37 + seed) % 13 - 6) / 4`. The
    /// expected values below come from onnxruntime 1.31 on the same data:
    /// ```python
    /// def ramp(shape, seed):
    ///     n = int(np.prod(shape))
    ///     return ((((np.arange(n) * 37 + seed) % 13).astype(np.float32) - 6) * 0.25).reshape(shape)
    /// # run(op, inputs, **attrs) builds a one-node opset-19 model and runs it in onnxruntime.
    /// ```
    pub(crate) fn ramp(shape: &[usize], seed: usize) -> Tensor {
        let n = shape.iter().product::<usize>();
        let v: Vec<f32> = (0..n).map(|i| ((i * 37 + seed) % 13) as f32 * 0.25 - 1.5).collect();
        Tensor::from_vec(shape.to_vec(), &v).unwrap()
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// Canonical attributes; `pads` as ONNX orders them (all begins, then all ends).
    pub(crate) fn attrs(
        kernel: &[i64],
        strides: &[i64],
        dilations: &[i64],
        pads: &[i64],
        group: i64,
    ) -> Attrs {
        Attrs::new()
            .with("kernel_shape", ints(kernel))
            .with("strides", ints(strides))
            .with("dilations", ints(dilations))
            .with("pads", ints(pads))
            .with("group", AttrValue::Int(group))
            .with("post_ops", AttrValue::Text(String::new()))
            .with("post_params", AttrValue::Floats(Vec::new()))
    }

    fn check(op: &str, attrs: &Attrs, inputs: &[&Tensor], shape: &[usize], expected: &[f32]) {
        let out = eval(op, attrs, inputs, &[TensorDesc::new(DType::F32, shape)]).unwrap();
        let got = out[0].as_slice::<f32>().unwrap();
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!((g - e).abs() <= 1e-5, "{op} element {i}: got {g}, expected {e}");
        }
    }

    #[test]
    fn conv_2d_with_padding_by_hand() {
        // The ONNX operator docs' example: 0..25 as 5x5, a 3x3 kernel of ones, pads 1.
        let x = Tensor::from_vec(vec![1, 1, 5, 5], &(0..25).map(|v| v as f32).collect::<Vec<_>>())
            .unwrap();
        let w = Tensor::from_vec(vec![1, 1, 3, 3], &[1.0f32; 9]).unwrap();
        let expected = [
            12., 21., 27., 33., 24., 33., 54., 63., 72., 51., 63., 99., 108., 117., 81., 93., 144.,
            153., 162., 111., 72., 111., 117., 123., 84.,
        ];
        let a = attrs(&[3, 3], &[1, 1], &[1, 1], &[1, 1, 1, 1], 1);
        check("Conv", &a, &[&x, &w], &[1, 1, 5, 5], &expected);
    }

    #[test]
    fn conv_grouped_strided_dilated_asymmetric_pads_with_bias() {
        // run("Conv", [ramp((1,4,5,6),1), ramp((6,2,3,2),2), ramp((6,),3)], group=2,
        //     strides=[2,1], dilations=[1,2], pads=[1,0,0,1])
        let expected = [
            -3.0, -1.4375, 0.125, -2.375, 1.9375, 0.1875, -0.875, -4.375, -0.5625, -4.1875,
            -0.1875, -6.3125, 1.375, 0.125, -1.125, 0.0, 0.8125, -8.125, 0.8125, -1.3125, 1.8125,
            -1.4375, 1.8125, 1.8125, 3.125, -1.0, 1.6875, -2.125, 1.375, 1.5625, -4.0625, 2.0625,
            2.5, -0.3125, 1.0625, 3.625, -4.0, 1.375, 3.5, -0.375, -0.1875, -1.75, 1.5625, 1.625,
            0.5625, 1.375, 0.5, -2.8125, 2.8125, 0.25, 0.4375, -1.5, 1.4375, 1.125, 0.0625, 0.75,
            5.0, 1.9375, -1.125, -1.5625,
        ];
        let (x, w, b) = (ramp(&[1, 4, 5, 6], 1), ramp(&[6, 2, 3, 2], 2), ramp(&[6], 3));
        let a = attrs(&[3, 2], &[2, 1], &[1, 2], &[1, 0, 0, 1], 2);
        check("Conv", &a, &[&x, &w, &b], &[1, 6, 2, 5], &expected);
    }

    #[test]
    fn conv_depthwise_strided_with_bias() {
        // run("Conv", [ramp((1,2,5,5),4), ramp((2,1,3,3),5), ramp((2,),6)], group=2,
        //     strides=[2,2], pads=[1,1,1,1])
        let expected = [
            -0.875, -0.75, 1.875, 0.875, 2.0625, -2.4375, -1.8125, -1.0625, 2.125, 1.25, -0.6875,
            -2.125, -3.5, 2.875, -1.375, -2.25, 2.875, -1.1875,
        ];
        let (x, w, b) = (ramp(&[1, 2, 5, 5], 4), ramp(&[2, 1, 3, 3], 5), ramp(&[2], 6));
        let a = attrs(&[3, 3], &[2, 2], &[1, 1], &[1, 1, 1, 1], 2);
        check("Conv", &a, &[&x, &w, &b], &[1, 2, 3, 3], &expected);
    }

    #[test]
    fn conv_depthwise_with_channel_multiplier() {
        // run("Conv", [ramp((1,2,4,4),7), ramp((4,1,5,5),8)], group=2, pads=[2,2,2,2])
        let expected = [
            -1.125, 2.0, -4.875, -3.875, -0.1875, 4.625, 6.6875, -0.875, -1.0, -0.5, 1.5625, 3.625,
            -0.375, -0.9375, -2.75, -3.0, 0.125, -4.875, -4.4375, -2.4375, 3.875, 6.6875, -1.8125,
            -3.0625, -1.8125, 1.5625, 2.0, 3.875, 0.0, -2.75, -1.3125, 0.8125, 6.75, 5.8125,
            2.9375, -0.1875, -4.6875, 0.0, -1.0, 0.6875, -2.5625, -6.625, -5.1875, 2.4375, 3.25,
            5.0625, -2.5, -6.0, 2.875, 2.9375, -2.375, -2.25, 1.75, -1.0, 3.6875, 4.125, -4.25,
            -5.1875, 3.5625, 3.4375, 3.375, -2.5, -6.8125, -4.0625,
        ];
        let (x, w) = (ramp(&[1, 2, 4, 4], 7), ramp(&[4, 1, 5, 5], 8));
        let a = attrs(&[5, 5], &[1, 1], &[1, 1], &[2, 2, 2, 2], 2);
        check("Conv", &a, &[&x, &w], &[1, 4, 4, 4], &expected);
    }

    #[test]
    fn depthwise_3d_agrees_with_im2col() {
        // Stride 1 reads the padded volume flat across planes as well as rows.
        let x = ramp(&[1, 1, 4, 5, 6], 28);
        let w = ramp(&[1, 1, 3, 3, 3], 29);
        let x2 = Tensor::from_vec(
            vec![1, 2, 4, 5, 6],
            &[x.as_slice::<f32>().unwrap(), &[0.0; 120]].concat(),
        )
        .unwrap();
        let w2 = Tensor::from_vec(
            vec![1, 2, 3, 3, 3],
            &[w.as_slice::<f32>().unwrap(), &[9.0; 27]].concat(),
        )
        .unwrap();
        let a = attrs(&[3, 3, 3], &[1, 1, 1], &[1, 1, 1], &[1, 0, 1, 1, 0, 1], 1);
        let desc = [TensorDesc::new(DType::F32, vec![1, 1, 4, 3, 6])];
        let direct = eval("Conv", &a, &[&x, &w], &desc).unwrap();
        let gemm = eval("Conv", &a, &[&x2, &w2], &desc).unwrap();
        assert_eq!(direct, gemm);
    }

    #[test]
    fn depthwise_path_agrees_with_im2col() {
        // A one-channel conv runs the depthwise path; the same conv with a second, all-zero
        // input channel runs im2col + GEMM. Widths cover register blocks and their borders;
        // at stride 1, planes of 19 and 26 flat positions (shorter than a block) too.
        for (k, stride, dilation, pad, width) in [
            (3, 1, 1, 1, 37),
            (3, 1, 1, 1, 2),
            (3, 1, 1, 1, 1),
            (3, 2, 1, 1, 70),
            (5, 1, 2, 4, 41),
            (5, 2, 1, 2, 16),
            (3, 3, 1, 0, 50),
        ] {
            let x = ramp(&[1, 1, 7, width], 26);
            let w = ramp(&[2, 1, k, k], 27);
            let x2 = Tensor::from_vec(
                vec![1, 2, 7, width],
                &[x.as_slice::<f32>().unwrap(), &vec![0.0; 7 * width]].concat(),
            )
            .unwrap();
            let w2 = Tensor::from_vec(
                vec![2, 2, k, k],
                &w.as_slice::<f32>()
                    .unwrap()
                    .chunks(k * k)
                    .flat_map(|c| [c.to_vec(), vec![9.0; k * k]].concat())
                    .collect::<Vec<_>>(),
            )
            .unwrap();
            let (k, s, d, p) = (k as i64, stride as i64, dilation as i64, pad as i64);
            let a = attrs(&[k, k], &[s, s], &[d, d], &[p, p, p, p], 1);
            let extent = (k as usize - 1) * dilation + 1;
            let out = |len: usize| (len + 2 * pad - extent) / stride + 1;
            let desc = [TensorDesc::new(DType::F32, vec![1, 2, out(7), out(width)])];
            let direct = eval("Conv", &a, &[&x, &w], &desc).unwrap();
            let gemm = eval("Conv", &a, &[&x2, &w2], &desc).unwrap();
            assert_eq!(direct, gemm, "kernel {k}, stride {s}, dilation {d}, width {width}");
        }
    }

    #[test]
    fn conv_pointwise_grouped_batched() {
        // run("Conv", [ramp((2,4,2,3),9), ramp((2,2,1,1),10), ramp((2,),11)], group=2)
        let expected = [
            2.5, 1.75, 1.0, 0.25, -0.5, 2.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, -0.875, 3.25, 2.5,
            1.75, 1.0, 0.25, 1.125, 1.375, 0.0, 0.25, 0.5, 0.75,
        ];
        let (x, w, b) = (ramp(&[2, 4, 2, 3], 9), ramp(&[2, 2, 1, 1], 10), ramp(&[2], 11));
        let a = attrs(&[1, 1], &[1, 1], &[1, 1], &[0, 0, 0, 0], 2);
        check("Conv", &a, &[&x, &w, &b], &[2, 2, 2, 3], &expected);
    }

    #[test]
    fn conv_1d_dilated_strided() {
        // run("Conv", [ramp((1,2,9),12), ramp((3,2,3),13)], dilations=[2], strides=[2], pads=[1,2])
        let expected =
            [2.25, -2.75, -0.875, 3.3125, 2.125, -2.875, -0.875, 3.625, -1.25, -3.0, 2.375, -0.125];
        let (x, w) = (ramp(&[1, 2, 9], 12), ramp(&[3, 2, 3], 13));
        let a = attrs(&[3], &[2], &[2], &[1, 2], 1);
        check("Conv", &a, &[&x, &w], &[1, 3, 4], &expected);
    }

    #[test]
    fn conv_3d() {
        // run("Conv", [ramp((1,2,3,3,3),14), ramp((2,2,2,2,2),15)], pads=[0,1,0,1,0,1],
        //     strides=[1,2,1])
        let expected = [
            -1.25, 2.6875, 2.8125, -7.0, -4.75, 1.5625, 2.5, 6.4375, -1.4375, 4.3125, 9.0, -1.375,
            -1.875, -3.125, -1.25, -2.25, -3.5, -1.4375, -2.8125, -2.625, -1.1875, 1.625, 4.5,
            -2.1875, -1.125, -0.9375, -0.375, -2.5625, -2.9375, 0.125, 4.125, 1.0, -0.875, 4.25,
            0.875, -1.0,
        ];
        let (x, w) = (ramp(&[1, 2, 3, 3, 3], 14), ramp(&[2, 2, 2, 2, 2], 15));
        let a = attrs(&[2, 2, 2], &[1, 2, 1], &[1, 1, 1], &[0, 1, 0, 1, 0, 1], 1);
        check("Conv", &a, &[&x, &w], &[1, 2, 3, 2, 3], &expected);
    }

    /// A 2-D conv (implicit GEMM) against the same conv run as the first of two independent
    /// depth slices of a 3-D one (im2col): both sum (channel, tap) in the same order, so with
    /// fewer than 256 of them (one block of the GEMM's k) the bits agree.
    fn implicit_matches_im2col(
        (c, m, h, w): (usize, usize, usize, usize),
        (kh, kw): (usize, usize),
        (strides, dilations): ([usize; 2], [usize; 2]),
        pads: [isize; 4],
        chunks: bool,
    ) {
        let [sh, sw] = strides;
        let out = |len: usize, k: usize, d: usize, p: isize, s: usize| {
            ((len as isize + p - ((k - 1) * d + 1) as isize) / s as isize + 1) as usize
        };
        let (oh, ow) = (
            out(h, kh, dilations[0], pads[0] + pads[2], sh),
            out(w, kw, dilations[1], pads[1] + pads[3], sw),
        );
        let win = Window {
            rank: 2,
            input: [1, h, w],
            output: [1, oh, ow],
            kernel: [1, kh, kw],
            strides: [1, sh, sw],
            dilations: [1, dilations[0], dilations[1]],
            pads_begin: [0, pads[0], pads[1]],
            pads_end: [0, pads[2], pads[3]],
        };
        let band = Band::new(&win, c, m).expect("the 2-D conv takes implicit GEMM");
        assert_eq!(band.chunk_rows < oh, chunks, "{band:?}");
        let (x, wt, b) = (ramp(&[1, c, h, w], 40), ramp(&[m, c, kh, kw], 41), ramp(&[m], 42));
        let i64s = |v: &[usize]| v.iter().map(|&v| v as i64).collect::<Vec<_>>();
        let p = pads.map(|p| p as i64);
        let a2 = attrs(&i64s(&[kh, kw]), &i64s(&strides), &i64s(&dilations), &p, 1);
        let planar =
            eval("Conv", &a2, &[&x, &wt, &b], &[TensorDesc::new(DType::F32, vec![1, m, oh, ow])])
                .unwrap();
        // Depth 2: the input's channels each followed by a plane of other values.
        let xs = x.as_slice::<f32>().unwrap();
        let x3: Vec<f32> =
            xs.chunks(h * w).flat_map(|p| [p.to_vec(), vec![0.5; h * w]].concat()).collect();
        let x3 = Tensor::from_vec(vec![1, c, 2, h, w], &x3).unwrap();
        let w3 = Tensor::from_vec(vec![m, c, 1, kh, kw], wt.as_slice::<f32>().unwrap()).unwrap();
        let a3 = attrs(
            &i64s(&[1, kh, kw]),
            &i64s(&[1, sh, sw]),
            &i64s(&[1, dilations[0], dilations[1]]),
            &[0, p[0], p[1], 0, p[2], p[3]],
            1,
        );
        let desc = [TensorDesc::new(DType::F32, vec![1, m, 2, oh, ow])];
        let volume = eval("Conv", &a3, &[&x3, &w3, &b], &desc).unwrap();
        let first_slices: Vec<f32> = (volume[0].as_slice::<f32>().unwrap().chunks(oh * ow))
            .step_by(2)
            .flatten()
            .copied()
            .collect();
        assert_eq!(planar[0].as_slice::<f32>().unwrap(), &first_slices[..]);
    }

    #[test]
    fn implicit_gemm_matches_im2col() {
        // Several chunks of rows, at stride 1 and 2 (a band's phases start on a chunk's row).
        implicit_matches_im2col((3, 4, 300, 600), (3, 3), ([1, 1], [1, 1]), [1, 1, 1, 1], true);
        implicit_matches_im2col((4, 3, 500, 400), (3, 3), ([2, 2], [1, 1]), [1, 1, 0, 0], true);
        // Dilated, wider than tall, and asymmetric or negative pads.
        implicit_matches_im2col((2, 5, 9, 13), (5, 3), ([1, 1], [2, 1]), [4, 1, 3, 2], false);
        implicit_matches_im2col((3, 2, 10, 12), (3, 3), ([1, 1], [1, 1]), [-1, 0, 1, -2], false);
        // Stride 3, a row of one output, a column of one, and a kernel as wide as the input.
        implicit_matches_im2col((2, 3, 11, 50), (3, 3), ([3, 3], [1, 1]), [0, 0, 0, 0], false);
        implicit_matches_im2col((2, 3, 3, 20), (3, 2), ([1, 1], [1, 1]), [0, 0, 0, 0], false);
        implicit_matches_im2col((2, 3, 20, 3), (2, 3), ([1, 1], [1, 1]), [0, 0, 0, 0], false);
        // 1-D as PP-OCR's recognizer and audio models have them (lifted to one row).
        implicit_matches_im2col((8, 6, 1, 99), (1, 5), ([1, 2], [1, 3]), [0, 4, 0, 4], false);
    }

    #[test]
    fn conv_im2col_in_several_chunks_matches_one_chunk() {
        // A 3-D conv (im2col: 2-D ones take implicit GEMM) wide enough to be split into row
        // chunks must agree with a per-row reference computed by the depthwise path on one
        // channel at a time (group = C).
        let (c, d, h, w) = (2, 2, 70, 600);
        let x = ramp(&[1, c, d, h, w], 21);
        let wt = ramp(&[1, c, 1, 3, 3], 22);
        let a = attrs(&[1, 3, 3], &[1, 1, 1], &[1, 1, 1], &[0, 1, 1, 0, 1, 1], 1);
        let desc = [TensorDesc::new(DType::F32, vec![1, 1, d, h, w])];
        let full = eval("Conv", &a, &[&x, &wt], &desc).unwrap();
        let dw_desc = [TensorDesc::new(DType::F32, vec![1, c, d, h, w])];
        let wdw = Tensor::from_vec(vec![c, 1, 1, 3, 3], wt.as_slice::<f32>().unwrap()).unwrap();
        let adw = attrs(&[1, 3, 3], &[1, 1, 1], &[1, 1, 1], &[0, 1, 1, 0, 1, 1], c as i64);
        let per_channel = eval("Conv", &adw, &[&x, &wdw], &dw_desc).unwrap();
        let pc = per_channel[0].as_slice::<f32>().unwrap();
        let plane = d * h * w;
        let summed: Vec<f32> = (0..plane).map(|i| pc[i] + pc[plane + i]).collect();
        assert!(SCRATCH_FLOATS < c * 9 * plane, "the test must span several chunks");
        assert_eq!(full[0].as_slice::<f32>().unwrap(), &summed[..]);
    }

    #[test]
    fn conv_transpose_grouped_strided_dilated_output_padding_with_bias() {
        // run("ConvTranspose", [ramp((1,4,2,3),16), ramp((4,1,3,2),17), ramp((2,),18)],
        //     group=2, strides=[2,3], output_padding=[1,1], pads=[1,0,0,1], dilations=[1,2])
        // Canonical pads fold output_padding into the end pads: [1, 0, 0 - 1, 1 - 1].
        let expected = [
            1.5, -0.25, -1.9375, 2.875, -0.25, -3.3125, -0.625, -0.25, -0.625, -2.125, -0.25,
            -2.625, -2.625, -0.25, -2.125, -0.6875, -0.25, -0.8125, -3.3125, -0.25, 2.875, -1.9375,
            -0.25, 1.5, -0.5625, -0.25, 0.125, 1.75, -0.25, 0.625, 0.875, -0.25, 0.25, 0.0, -0.25,
            -0.125, -0.25, -0.25, -0.25, -0.25, -0.25, -0.25, -0.25, -0.25, -0.25, -0.5, -0.75,
            -0.375, 0.375, -0.75, 1.0, 1.25, -0.75, 2.375, -1.4375, -0.75, -1.3125, -2.125, -0.75,
            -2.625, -3.625, -0.75, -3.125, -1.125, -0.75, -1.125, -2.6875, -0.75, -3.8125, -1.8125,
            -0.75, -2.4375, -1.125, -0.75, -1.125, 2.375, -0.75, 1.25, 1.0, -0.75, 0.375, -0.75,
            -0.75, -0.75, -0.75, -0.75, -0.75, -0.75, -0.75, -0.75,
        ];
        let (x, w, b) = (ramp(&[1, 4, 2, 3], 16), ramp(&[4, 1, 3, 2], 17), ramp(&[2], 18));
        let a = attrs(&[3, 2], &[2, 3], &[1, 2], &[1, 0, -1, 0], 2);
        check("ConvTranspose", &a, &[&x, &w, &b], &[1, 2, 5, 9], &expected);
    }

    #[test]
    fn conv_transpose_1d_cropped() {
        // run("ConvTranspose", [ramp((1,1,3),19), ramp((1,2,3),20)], strides=[2], output_shape=[6])
        // total padding 2*(3-1) + 3 - 6 = 1, split as pads [1, 0].
        let expected = [0.0, -0.125, 0.125, 0.125, 0.25, 0.75, 0.0, 0.625, -0.75, 0.75, -1.5, -1.0];
        let (x, w) = (ramp(&[1, 1, 3], 19), ramp(&[1, 2, 3], 20));
        let a = attrs(&[3], &[2], &[1], &[1, 0], 1);
        check("ConvTranspose", &a, &[&x, &w], &[1, 2, 6], &expected);
    }

    #[test]
    fn conv_transpose_is_the_adjoint_of_conv_across_chunks() {
        // <Conv(x), y> = <x, ConvTranspose(y)> with the same weights, strides, dilations and
        // pads; the sizes make both im2col and col2im run in several chunks.
        let (h, w, h2, w2) = (201, 703, 101, 352);
        let a = attrs(&[3, 3], &[2, 2], &[1, 1], &[1, 1, 1, 1], 1);
        let (x, y, wt) =
            (ramp(&[1, 2, h, w], 23), ramp(&[1, 3, h2, w2], 24), ramp(&[3, 2, 3, 3], 25));
        let conv = eval("Conv", &a, &[&x, &wt], &[TensorDesc::new(DType::F32, vec![1, 3, h2, w2])]);
        let convt =
            eval("ConvTranspose", &a, &[&y, &wt], &[TensorDesc::new(DType::F32, vec![1, 2, h, w])]);
        let dot = |p: &Tensor, q: &Tensor| -> f64 {
            let (p, q) = (p.as_slice::<f32>().unwrap(), q.as_slice::<f32>().unwrap());
            p.iter().zip(q).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let (lhs, rhs) = (dot(&conv.unwrap()[0], &y), dot(&x, &convt.unwrap()[0]));
        assert!(SCRATCH_FLOATS < 3 * 9 * h2 * w2, "col2im must span several chunks");
        assert!((lhs - rhs).abs() <= 1e-6 * lhs.abs().max(1.0), "{lhs} vs {rhs}");
    }

    #[test]
    fn kernels_wider_than_the_input() {
        // By hand: a length-1 input under a 5-tap kernel with pads 2 sees only the centre tap.
        let t = |shape: &[usize], v: &[f32]| Tensor::from_vec(shape.to_vec(), v).unwrap();
        let a = attrs(&[5], &[1], &[1], &[2, 2], 1);
        let out = [TensorDesc::new(DType::F32, vec![1, 1, 1])];
        let w = t(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
        let y = eval("Conv", &a, &[&t(&[1, 1, 1], &[2.]), &w], &out).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &[6.0], "depthwise path");
        let w2 = t(&[1, 2, 5], &[1., 2., 3., 4., 5., 10., 11., 12., 13., 14.]);
        let y = eval("Conv", &a, &[&t(&[1, 2, 1], &[2., 3.]), &w2], &out).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &[42.0], "im2col path");
        // ConvTranspose: output 0 gets tap k from input 0 when k - 2 == 0.
        let a = attrs(&[3], &[1], &[1], &[2, 0], 1);
        let w = t(&[1, 1, 3], &[1., 2., 3.]);
        let y = eval("ConvTranspose", &a, &[&t(&[1, 1, 1], &[2.]), &w], &out).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &[6.0]);
    }

    #[test]
    fn rejects_mismatched_shapes_and_types() {
        let (x, w) = (ramp(&[1, 4, 5, 5], 0), ramp(&[2, 3, 3, 3], 0));
        let a = attrs(&[3, 3], &[1, 1], &[1, 1], &[0, 0, 0, 0], 1);
        let out = [TensorDesc::new(DType::F32, vec![1, 2, 3, 3])];
        assert!(eval("Conv", &a, &[&x, &w], &out).is_err(), "channels differ");
        let w = ramp(&[2, 4, 3, 3], 0);
        let bad_out = [TensorDesc::new(DType::F32, vec![1, 2, 4, 3])];
        assert!(eval("Conv", &a, &[&x, &w], &bad_out).is_err(), "output extent");
        let xi = Tensor::from_vec(vec![1, 4, 5, 5], &[0i32; 100]).unwrap();
        assert!(matches!(eval("Conv", &a, &[&xi, &w], &out), Err(KernelError::DType { .. })));
        assert!(eval("Conv", &a, &[&x, &w], &out).is_ok());
        // Pads far out of range are an error, not an overflow.
        let far = attrs(&[3, 3], &[1, 1], &[1, 1], &[i64::MIN, 0, 0, 0], 1);
        assert!(eval("Conv", &far, &[&x, &w], &out).is_err());
        let far = attrs(&[3, 3], &[1, 1], &[1, 1 << 62], &[0, 0, 0, 0], 1);
        assert!(eval("Conv", &far, &[&x, &w], &out).is_err());
    }

    /// The chains each geometry is checked with: every activation, every binary op, and
    /// chains mixing them (a leading Add runs in place).
    const CHAINS: &[(&str, &[f64])] = &[
        ("Relu", &[]),
        ("LeakyRelu", &[0.1]),
        ("Clip", &[-0.5, 0.75]),
        ("Sigmoid", &[]),
        ("HardSigmoid", &[0.2, 0.5]),
        ("HardSwish", &[]),
        ("Tanh", &[]),
        ("Swish", &[0.75]),
        ("Sub", &[]),
        ("RSub", &[]),
        ("Mul", &[]),
        ("Add", &[]),
        ("Add,Relu", &[]),
        ("HardSwish,Mul,Add", &[]),
        ("Add,Clip,Sub,Sigmoid", &[0.0, 6.0]),
        ("Add,Swish", &[1.0]),
    ];

    /// Runs `op` with each chain of post-ops fused and compares with the op followed by the
    /// elementwise kernels; a full-shape operand R for the first binary op, then one-element
    /// operands. A leading Add is also run in place over R.
    fn check_post_ops(op: &str, a: &Attrs, inputs: &[&Tensor], out: &[usize], chains: &[&str]) {
        let desc = TensorDesc::new(DType::F32, out);
        let plain = eval(op, a, inputs, std::slice::from_ref(&desc)).unwrap().remove(0);
        let zero_bias;
        let mut own = inputs.to_vec();
        if own.len() == 2 {
            zero_bias = Tensor::zeros(TensorDesc::new(DType::F32, vec![out[1]]));
            own.push(&zero_bias);
        }
        let residual = ramp(out, 40);
        let scalars = [
            Tensor::from_vec(vec![1], &[0.75f32]).unwrap(),
            Tensor::from_vec(vec![1, 1], &[-0.25f32]).unwrap(),
        ];
        for &(ops, params) in CHAINS.iter().filter(|(c, _)| chains.contains(c)) {
            let n = ops.split(',').filter(|o| BINARY.contains(o)).count();
            let extras: Vec<&Tensor> = [&residual].into_iter().chain(&scalars).take(n).collect();
            let all: Vec<&Tensor> = own.iter().copied().chain(extras.iter().copied()).collect();
            let fused_attrs = with_post(a.clone(), ops, params);
            let fused =
                eval(op, &fused_attrs, &all, std::slice::from_ref(&desc)).unwrap().remove(0);
            let want = unfused(plain.clone(), ops, params, &extras);
            assert_close(&fused, &want, 1e-6, &format!("{op} + {ops}"));
            if ops.starts_with("Add") {
                same_in_place(op, &fused_attrs, &all, &desc, 3);
            }
        }
    }

    /// (kernel, strides, dilations, pads, group, x, w) of every path a conv of narrow weights
    /// takes: pointwise grouped; more output channels than a block of A's rows (128); one pixel
    /// (an SE block's 1x1 convs); one output channel; depthwise; implicit GEMM; im2col (3-D).
    type NarrowCase = (
        &'static [i64],
        &'static [i64],
        &'static [i64],
        &'static [i64],
        i64,
        &'static [usize],
        &'static [usize],
    );
    const NARROW_CASES: [NarrowCase; 7] = [
        (&[1, 1], &[1, 1], &[1, 1], &[0; 4], 2, &[2, 4, 3, 5], &[6, 2, 1, 1]),
        (&[1, 1], &[1, 1], &[1, 1], &[0; 4], 1, &[1, 40, 9, 9], &[150, 40, 1, 1]),
        (&[1, 1], &[1, 1], &[1, 1], &[0; 4], 1, &[1, 96, 1, 1], &[200, 96, 1, 1]),
        (&[3, 3], &[1, 1], &[1, 1], &[1; 4], 1, &[1, 5, 6, 7], &[1, 5, 3, 3]),
        (&[3, 3], &[2, 1], &[1, 1], &[1, 1, 1, 1], 2, &[1, 2, 5, 6], &[4, 1, 3, 3]),
        (&[3, 2], &[2, 1], &[1, 2], &[1, 0, 0, 1], 1, &[1, 4, 5, 6], &[3, 4, 3, 2]),
        (
            &[1, 3, 2],
            &[1, 2, 1],
            &[1, 1, 2],
            &[0, 1, 0, 0, 0, 1],
            1,
            &[1, 4, 2, 5, 6],
            &[3, 4, 1, 3, 2],
        ),
    ];

    #[test]
    fn int8_weights_give_the_bits_of_their_float_values_on_every_path() {
        for (kernel, strides, dilations, pads, group, xs, ws) in NARROW_CASES {
            let a = attrs(kernel, strides, dilations, pads, group);
            let (x, m) = (ramp(xs, 1), ws[0]);
            let per_row = ws.iter().product::<usize>() / m;
            let levels: Vec<i32> = (0..m * per_row).map(|i| ((i * 53 + 7) % 251) as i32).collect();
            let scale: Vec<f32> = (0..m).map(|r| 0.01 + r as f32 * 1e-3).collect();
            let zero: Vec<f32> = (0..m).map(|r| (r % 7) as f32 - 3.0).collect();
            let bias = ramp(&[m], 3);
            let mut table = scale.clone();
            table.extend(&zero);
            table.extend(bias.as_slice::<f32>().unwrap());
            let table = Tensor::from_vec(vec![3, m], &table).unwrap();
            for signed in [true, false] {
                let level = |i: usize| if signed { levels[i] - 125 } else { levels[i] };
                let float: Vec<f32> = (0..m * per_row)
                    .map(|i| (level(i) - zero[i / per_row] as i32) as f32 * scale[i / per_row])
                    .collect();
                let w = Tensor::from_vec(ws.to_vec(), &float).unwrap();
                let q = match signed {
                    true => Tensor::from_vec(
                        ws.to_vec(),
                        &(0..m * per_row).map(|i| level(i) as i8).collect::<Vec<_>>(),
                    ),
                    false => Tensor::from_vec(
                        ws.to_vec(),
                        &(0..m * per_row).map(|i| level(i) as u8).collect::<Vec<_>>(),
                    ),
                }
                .unwrap();
                let out = conv_shape(&a, xs, ws);
                let want = eval("Conv", &a, &[&x, &w, &bias], std::slice::from_ref(&out)).unwrap();
                let qa = a.clone().with("dequantize_w", AttrValue::Int(1));
                let got = eval("Conv", &qa, &[&x, &q, &table], std::slice::from_ref(&out)).unwrap();
                assert_eq!(got, want, "{kernel:?} {xs:?} {ws:?} signed {signed}");
                // Over a residual, in place: the residual follows the table.
                let residual = ramp(&out.shape, 40);
                let fused = with_post(qa, "Add,Relu", &[]);
                same_in_place("Conv", &fused, &[&x, &q, &table, &residual], &out, 3);
            }
        }
        // The table must hold a scale, zero point and bias per output channel.
        let a =
            attrs(&[1, 1], &[1, 1], &[1, 1], &[0; 4], 1).with("dequantize_w", AttrValue::Int(1));
        let (x, b) = (ramp(&[1, 2, 2, 2], 1), ramp(&[3], 2));
        let q = Tensor::from_vec(vec![3, 2, 1, 1], &[1i8; 6]).unwrap();
        let out = TensorDesc::new(DType::F32, vec![1, 3, 2, 2]);
        let short = Tensor::from_vec(vec![2, 3], &[1.0f32; 6]).unwrap();
        assert!(eval("Conv", &a, &[&x, &q, &short], std::slice::from_ref(&out)).is_err());
        assert!(eval("Conv", &a, &[&x, &q, &b], std::slice::from_ref(&out)).is_err());
        assert!(eval("Conv", &a, &[&x, &q], std::slice::from_ref(&out)).is_err());
    }

    #[test]
    fn float16_weights_give_the_bits_of_their_widened_values_on_every_path() {
        for (kernel, strides, dilations, pads, group, xs, ws) in NARROW_CASES {
            let a = attrs(kernel, strides, dilations, pads, group);
            let (x, bias) = (ramp(xs, 1), ramp(&[ws[0]], 3));
            let n = ws.iter().product::<usize>();
            // Values that round in float16: the float W is exactly what widening gives.
            let halves: Vec<f16> =
                (0..n).map(|i| f16::from_f32(((i * 53 + 7) % 251) as f32 / 97.0 - 1.3)).collect();
            let h = Tensor::from_vec(ws.to_vec(), &halves).unwrap();
            let widened: Vec<f32> = halves.iter().map(|v| v.to_f32()).collect();
            let w = Tensor::from_vec(ws.to_vec(), &widened).unwrap();
            let out = conv_shape(&a, xs, ws);
            let want = eval("Conv", &a, &[&x, &w, &bias], std::slice::from_ref(&out)).unwrap();
            let got = eval("Conv", &a, &[&x, &h, &bias], std::slice::from_ref(&out)).unwrap();
            assert_eq!(got, want, "{kernel:?} {xs:?} {ws:?}");
            let residual = ramp(&out.shape, 40);
            let fused = with_post(a, "Add,Relu", &[]);
            same_in_place("Conv", &fused, &[&x, &h, &bias, &residual], &out, 3);
        }
        // Only W may be float16 beside float32: an f16 bias is the widened step's (an error of
        // dtype f16, which the CPU then widens whole).
        let a = attrs(&[1, 1], &[1, 1], &[1, 1], &[0; 4], 1);
        let x = ramp(&[1, 2, 2, 2], 1);
        let h = Tensor::from_vec(vec![3, 2, 1, 1], &[f16::ONE; 6]).unwrap();
        let hb = Tensor::from_vec(vec![3], &[f16::ONE; 3]).unwrap();
        let out = TensorDesc::new(DType::F32, vec![1, 3, 2, 2]);
        let cx_of = |inputs: &[TensorDesc], op| {
            let cx = OpCx { op, attrs: &a, inputs, outputs: std::slice::from_ref(&out) };
            Conv::new(&cx).map(|_| ())
        };
        assert!(cx_of(&[x.desc().clone(), h.desc().clone()], "Conv").is_ok());
        let bias_f16 = [x.desc().clone(), h.desc().clone(), hb.desc().clone()];
        assert!(matches!(cx_of(&bias_f16, "Conv"), Err(KernelError::DType { .. })));
    }

    /// The output of a Conv with attributes `a` over X and W of these shapes.
    fn conv_shape(a: &Attrs, xs: &[usize], ws: &[usize]) -> TensorDesc {
        let (s, d, p) =
            (a.ints("strides").unwrap(), a.ints("dilations").unwrap(), a.ints("pads").unwrap());
        let r = xs.len() - 2;
        let spatial = (0..r).map(|i| {
            let reach = (ws[i + 2] as i64 - 1) * d[i] + 1;
            ((xs[i + 2] as i64 + p[i] + p[i + r] - reach) / s[i] + 1) as usize
        });
        TensorDesc::new(DType::F32, [xs[0], ws[0]].into_iter().chain(spatial).collect::<Vec<_>>())
    }

    #[test]
    fn post_ops_agree_with_the_unfused_ops_on_every_path() {
        let all: Vec<&str> = CHAINS.iter().map(|(c, _)| *c).collect();
        // Pointwise, grouped, with a bias, batched.
        let a = attrs(&[1, 1], &[1, 1], &[1, 1], &[0, 0, 0, 0], 2);
        let (x, w, b) = (ramp(&[2, 4, 3, 5], 1), ramp(&[6, 2, 1, 1], 2), ramp(&[6], 3));
        check_post_ops("Conv", &a, &[&x, &w, &b], &[2, 6, 3, 5], &all);
        // Depthwise with a channel multiplier, no bias.
        let a = attrs(&[3, 3], &[2, 1], &[1, 1], &[1, 1, 1, 1], 2);
        let (x, w) = (ramp(&[1, 2, 5, 6], 4), ramp(&[4, 1, 3, 3], 5));
        check_post_ops("Conv", &a, &[&x, &w], &[1, 4, 3, 6], &all);
        // Implicit GEMM, strided and dilated.
        let a = attrs(&[3, 2], &[2, 1], &[1, 2], &[1, 0, 0, 1], 1);
        let (x, w, b) = (ramp(&[1, 4, 5, 6], 6), ramp(&[3, 4, 3, 2], 7), ramp(&[3], 8));
        check_post_ops("Conv", &a, &[&x, &w, &b], &[1, 3, 2, 5], &all);
        // im2col: the same as a 3-D conv.
        let a = attrs(&[1, 3, 2], &[1, 2, 1], &[1, 1, 2], &[0, 1, 0, 0, 0, 1], 1);
        let (x, w, b) = (ramp(&[1, 4, 2, 5, 6], 6), ramp(&[3, 4, 1, 3, 2], 7), ramp(&[3], 8));
        check_post_ops("Conv", &a, &[&x, &w, &b], &[1, 3, 2, 2, 5], &all);
        // ConvTranspose, grouped, strided, cropped.
        let a = attrs(&[3, 2], &[2, 3], &[1, 2], &[1, 0, -1, 0], 2);
        let (x, w, b) = (ramp(&[1, 4, 2, 3], 16), ramp(&[4, 1, 3, 2], 17), ramp(&[2], 18));
        check_post_ops("ConvTranspose", &a, &[&x, &w, &b], &[1, 2, 5, 9], &all);
    }

    #[test]
    fn post_ops_agree_across_chunks() {
        // Pointwise with more columns than one GEMM chunk holds, and implicit GEMM in several
        // row chunks, each finished in halves (see implicit_gemm_matches_im2col).
        let chains = ["Add,Clip,Sub,Sigmoid", "HardSwish,Mul,Add"];
        let a = attrs(&[1, 1], &[1, 1], &[1, 1], &[0, 0, 0, 0], 1);
        let (x, w) = (ramp(&[1, 2, 90, 120], 9), ramp(&[8, 2, 1, 1], 10));
        const { assert!(MIN_COLUMNS < 90 * 120 && CHUNK_FLOATS / 8 < 90 * 120) };
        check_post_ops("Conv", &a, &[&x, &w], &[1, 8, 90, 120], &chains);
        let a = attrs(&[3, 3], &[1, 1], &[1, 1], &[1, 1, 1, 1], 1);
        let (x, w) = (ramp(&[1, 2, 300, 600], 21), ramp(&[2, 2, 3, 3], 22));
        let win = Window {
            rank: 2,
            input: [1, 300, 600],
            output: [1, 300, 600],
            kernel: [1, 3, 3],
            strides: [1; DIMS],
            dilations: [1; DIMS],
            pads_begin: [0, 1, 1],
            pads_end: [0, 1, 1],
        };
        let band = Band::new(&win, 2, 2).unwrap();
        assert!(band.chunk_rows < 300 && 2 * band.chunk_rows * 600 > POST_TASK_FLOATS);
        check_post_ops("Conv", &a, &[&x, &w], &[1, 2, 300, 600], &chains);
        // Depthwise planes in several tasks, with a bias.
        let a = attrs(&[3, 3], &[1, 1], &[1, 1], &[1, 1, 1, 1], 40);
        let (x, w, b) = (ramp(&[2, 40, 9, 9], 23), ramp(&[40, 1, 3, 3], 24), ramp(&[40], 25));
        const { assert!(DEPTHWISE_TASK_FLOATS < 2 * 40 * 81) };
        check_post_ops("Conv", &a, &[&x, &w, &b], &[2, 40, 9, 9], &chains);
    }

    #[test]
    fn depthwise_in_several_tasks_matches_a_dense_conv() {
        // 2 images x 40 channels of 9x9 planes: more than one task's worth. The same conv as
        // a dense one whose weights are zero off the diagonal runs im2col + GEMM.
        let (c, taps) = (40, 9);
        let a = attrs(&[3, 3], &[1, 1], &[1, 1], &[1, 1, 1, 1], c as i64);
        let (x, w, b) = (ramp(&[2, c, 9, 9], 23), ramp(&[c, 1, 3, 3], 24), ramp(&[c], 25));
        let wv = w.as_slice::<f32>().unwrap();
        let mut dense = vec![0.0f32; c * c * taps];
        for m in 0..c {
            dense[(m * c + m) * taps..][..taps].copy_from_slice(&wv[m * taps..][..taps]);
        }
        let dense = Tensor::from_vec(vec![c, c, 3, 3], &dense).unwrap();
        let desc = [TensorDesc::new(DType::F32, vec![2, c, 9, 9])];
        const { assert!(DEPTHWISE_TASK_FLOATS < 2 * 40 * 81) };
        let depthwise = eval("Conv", &a, &[&x, &w, &b], &desc).unwrap().remove(0);
        let a = attrs(&[3, 3], &[1, 1], &[1, 1], &[1, 1, 1, 1], 1);
        let gemm = eval("Conv", &a, &[&x, &dense, &b], &desc).unwrap().remove(0);
        assert_close(&depthwise, &gemm, 1e-6, "depthwise against dense");
    }

    #[test]
    fn scaled_channels_are_the_conv_of_the_product() {
        let scaled = |a: Attrs| a.with("scale_x", AttrValue::Int(1));
        let a = attrs(&[1, 1], &[1, 1], &[1, 1], &[0, 0, 0, 0], 1);
        // Two images, each with its own factors; more columns than one GEMM chunk holds.
        for (images, pixels) in [(2, 5 * 3), (1, 96 * 48)] {
            let (x, w, b) = (ramp(&[images, 6, pixels], 1), ramp(&[4, 6, 1], 2), ramp(&[4], 3));
            let s = ramp(&[images, 6, 1], 5);
            let out = [TensorDesc::new(DType::F32, vec![images, 4, pixels])];
            let a1 = attrs(&[1], &[1], &[1], &[0, 0], 1);
            let desc = TensorDesc::new(DType::F32, vec![images, 6, pixels]);
            let xs = eval("Mul", &Attrs::new(), &[&x, &s], &[desc]).unwrap().remove(0);
            let want = eval("Conv", &a1, &[&xs, &w, &b], &out).unwrap().remove(0);
            let got = eval("Conv", &scaled(a1.clone()), &[&x, &w, &b, &s], &out).unwrap();
            assert_close(&got[0], &want, 1e-6, "scaled");
            // With a residual, in place over it.
            let r = ramp(&[images, 4, pixels], 7);
            let add = scaled(with_post(a1.clone(), "Add,Relu", &[]));
            let all = [&x, &w, &b, &s, &r];
            let fused = same_in_place("Conv", &add, &all, &out[0], 4);
            let want = unfused(want, "Add,Relu", &[], &[&r]);
            assert_close(&fused, &want, 1e-6, "scaled, then Add and Relu");
        }
        // Only on pointwise convs in one group, with one factor per image and channel.
        let (x, w, b) = (ramp(&[1, 4, 3, 3], 1), ramp(&[2, 4, 1, 1], 2), ramp(&[2], 3));
        let out = [TensorDesc::new(DType::F32, vec![1, 2, 3, 3])];
        let s = ramp(&[1, 4, 1, 1], 5);
        assert!(eval("Conv", &scaled(a.clone()), &[&x, &w, &b, &s], &out).is_ok());
        assert!(eval("Conv", &scaled(a.clone()), &[&x, &w, &b], &out).is_err(), "no scales");
        let short = ramp(&[1, 2, 1, 1], 5);
        assert!(eval("Conv", &scaled(a), &[&x, &w, &b, &short], &out).is_err(), "two factors");
        let a3 = attrs(&[3, 3], &[1, 1], &[1, 1], &[1, 1, 1, 1], 1);
        let w3 = ramp(&[2, 4, 3, 3], 2);
        assert!(eval("Conv", &scaled(a3), &[&x, &w3, &b, &s], &out).is_err(), "3x3");
    }

    #[test]
    fn post_op_operands_are_checked() {
        let a = attrs(&[1, 1], &[1, 1], &[1, 1], &[0, 0, 0, 0], 1);
        let (x, w, b) = (ramp(&[1, 2, 3, 3], 1), ramp(&[2, 2, 1, 1], 2), ramp(&[2], 3));
        let out = [TensorDesc::new(DType::F32, vec![1, 2, 3, 3])];
        let add = with_post(a, "Add", &[]);
        let r = ramp(&[1, 2, 3, 3], 4);
        assert!(eval("Conv", &add, &[&x, &w, &b, &r], &out).is_ok());
        assert!(eval("Conv", &add, &[&x, &w, &r], &out).is_err(), "the bias is required");
        let short = ramp(&[1, 2, 3, 1], 4);
        assert!(eval("Conv", &add, &[&x, &w, &b, &short], &out).is_err(), "no broadcast");
    }
}
