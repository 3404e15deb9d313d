//! Vulkan kernels of the matmul family (ops: ops/src/matmul/cpu.rs): MatMul with numpy's
//! batch broadcasting and 1-D operands, and Gemm (transA, transB, alpha, beta, C broadcast),
//! both with fused post-ops, and Einsum (`einsum.wgsl`: one invocation per output element).
//!
//! Both ops become one [`Problem`]: `Y[b, i, j] = alpha * Σ_k A[b, i, k] B[b, k, j]
//! (+ beta * C[i, j])`, each operand addressed through strides passed as push-constant
//! params, then the post-ops (the `post_op` hook). Two kernel files compute it:
//! - `blocked.wgsl` (CPU-type devices such as lavapipe, and skinny problems anywhere): each
//!   invocation holds a block of Y in registers (up to 16 x 16 on CPU-type devices, 4 x 4 on
//!   GPUs; the block's size is an override) and reads A and B straight from memory, as 16-byte
//!   vectors wherever the layout allows ([`Read`], also overrides); no workgroup memory, which
//!   is slow on CPU-type devices (/work/shared/FACTS.md).
//! - `tiled.wgsl` (GPUs): a workgroup stages BM x BK tiles of A and BK x BN tiles of B in
//!   workgroup memory; each invocation computes 4 x 4 elements strided across the tile, so
//!   neighbouring invocations read neighbouring words of the tiles and of Y.
//!
//! A MatMul or Gemm that dequantizes its own 8-bit B (`crate::dequantizes_b`) runs
//! `dequantized.wgsl` on both device classes: B is read as packed bytes and dequantized in
//! registers (see [`dequantized`]).
//!
//! A or B larger than one binding may be (a fully connected weight of several hundred MB) is
//! cut into pieces of the product, one dispatch each, that read windows of the operands through
//! chunk bindings ([`pieces`]): along its rows, its columns or K; the pieces of K add into Y.

use crate::no_kernel;
use crate::vulkan::post::PostOps;
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, MAX_BINDING_BYTES, MAX_GROUPS, NoKernel,
    Operand, Slot, Spec, Wgsl,
};
use crate::wgsl;
use ingot_schema::DType;
use std::ops::Range;

static BLOCKED: Wgsl = wgsl!("matmul/blocked.wgsl");
static TILED: Wgsl = wgsl!("matmul/tiled.wgsl");
static EINSUM: Wgsl = wgsl!("matmul/einsum.wgsl");
static DEQUANTIZED: Wgsl = wgsl!("matmul/dequantized.wgsl");

/// The kernel files, for tests that validate each alone.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 4] = [&BLOCKED, &TILED, &EINSUM, &DEQUANTIZED];

/// `add_c` with Gemm's C.
const ADD_C: &str = "fn add_c(v: f32, i: u32, j: u32) -> f32 {
    return v + p.beta * c[p.c + p.c0 + i * p.c_rs + j * p.c_cs];
}";

/// `blocked.wgsl`'s Y accessors for an f32 Y.
const STORE_Y_F32: &str = "fn store_y(i: u32, v: vec4<f32>, count: u32) {
    for (var q = 0u; q < count; q++) {
        y[p.y + i + q] = v[q];
    }
}";
const LOAD_Y_F32: &str = "fn load_y(i: u32) -> vec4<f32> {
    return vec4<f32>(y[p.y + i], y[p.y + i + 1u], y[p.y + i + 2u], y[p.y + i + 3u]);
}";

/// Einsum's second operand.
const OPERAND1: &str = "fn operand1(o: u32) -> f32 {
    return x1[p.x1 + o];
}";

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    // B's dequantization is one more input of the product's own, after C.
    let q = usize::from(crate::dequantizes_b(cx.attrs));
    // A float16 B beside float32 operands (`crate::takes_f16_weights`).
    let half_b = q == 0
        && cx.op != "Einsum"
        && cx.inputs.first().is_some_and(|a| a.desc.dtype == DType::F32)
        && cx.inputs.get(1).is_some_and(|b| b.desc.dtype == DType::F16);
    // Everything is f32 but a narrow B (checked where it is read).
    let other = cx.inputs.iter().enumerate().filter(|&(i, _)| (q == 0 && !half_b) || i != 1);
    if let Some((_, o)) =
        other.chain(cx.outputs.iter().enumerate()).find(|(_, o)| o.desc.dtype != DType::F32)
    {
        return Err(cx.dtype(o.desc.dtype));
    }
    if cx.outputs.len() != 1 {
        return Err(no_kernel!("{} with {} outputs", cx.op, cx.outputs.len()));
    }
    if cx.op == "Einsum" {
        return einsum(cx);
    }
    let post = PostOps::new(cx, q + if cx.op == "Gemm" { 3 } else { 2 })?;
    let own = cx
        .inputs
        .len()
        .checked_sub(post.bindings().len())
        .ok_or_else(|| no_kernel!("{} lacks its post-op operands", cx.op))?;
    if let Some(k) = cx.in_place().filter(|&k| k < own) {
        return Err(no_kernel!("{} written over its input {k}", cx.op));
    }
    let p = match cx.op {
        "MatMul" if own == 2 + q => Problem::matmul(cx)?,
        "Gemm" if own == 2 + q || own == 3 + q => Problem::gemm(cx, own == 3 + q)?,
        op => return Err(no_kernel!("no Vulkan kernel for {op} with {own} inputs")),
    };
    let out = &cx.outputs[0];
    if out.desc.elements() == 0 {
        return Ok(Vec::new());
    }
    if p.k == 0 {
        return Err(no_kernel!("{} with an empty inner dimension", cx.op));
    }
    if out.desc.elements() != p.batch() * p.m * p.n {
        return Err(no_kernel!("{} output {:?} does not fit", cx.op, out.desc.shape));
    }
    // Every index is a u32 in WGSL.
    if cx.inputs.iter().chain(cx.outputs).any(|o| o.desc.elements() >= 1 << 31) {
        return Err(no_kernel!("{} operands too large for 32-bit indices", cx.op));
    }
    if q == 1 || half_b {
        let dq = (q == 1).then(|| own - 1);
        return dequantized(cx, &p.flattened(), &post, dq, None).map(|d| vec![d]);
    }
    let p = p.flattened().one_row();
    if p.batch.len() > 2 {
        return Err(no_kernel!(
            "{} with {} batch dimensions that do not merge (2 at most)",
            cx.op,
            p.batch.len()
        ));
    }
    let pieces = pieces(cx, &p)?;
    if pieces.len() > 1 && pieces.iter().any(|w| w.k.start > 0) && cx.in_place().is_some() {
        return Err(no_kernel!(
            "{} in place with K in pieces (the first piece would overwrite the residual)",
            cx.op
        ));
    }
    let whole = pieces.len() == 1;
    pieces
        .iter()
        .map(|w| {
            let piece = p.piece(w);
            let windows = match whole {
                true => None,
                false => Some((p.a_window(w), p.b_window(w))),
            };
            let tiles = cx.class == DeviceClass::Gpu
                && piece.m >= 16
                && piece.n >= 16
                && piece.k >= 16
                && piece.batch() <= MAX_GROUPS as usize;
            match tiles {
                true => tiled(cx, &piece, &post, windows),
                false => register_blocked(cx, &piece, &post, windows),
            }
        })
        .collect()
}

/// A Conv that is one matrix product read through strides (conv/vulkan.rs picks them: one
/// input channel, one dimension, no padding or dilation, a long window; an audio front end's
/// STFT is 258 windows of 256 taps at a few positions): `Y[n, m, p] = B[m] + Σ_k W[m, k]
/// X[n, p·stride + k]`, W read as A and X as B with strides 1 along k and `stride` along p, so
/// nothing is copied. `sizes` are the batch, output channels, taps, positions, the input's
/// width and the stride.
pub(crate) fn strided_conv(
    cx: &KernelCx,
    post: &PostOps,
    [batch, m, k, positions, width, stride]: [usize; 6],
    bias: bool,
) -> Result<Dispatch, NoKernel> {
    if cx.inputs[..2].iter().any(|o| o.desc.bytes() as u64 > MAX_BINDING_BYTES) {
        return Err(no_kernel!("{} {}: an operand over one binding", cx.op, cx.name));
    }
    let p = Problem {
        batch: if batch > 1 { vec![(batch, 0, width)] } else { Vec::new() },
        m,
        n: positions,
        k,
        a_input: 1,
        b_input: 0,
        a: (k, 1),
        b: (1, stride),
        alpha: 1.0,
        c: bias.then_some((1.0, 1, 0)),
        ldy: positions,
        y0: 0,
        c0: 0,
        flags: 0,
    }
    .one_row();
    match cx.class == DeviceClass::Gpu && p.m >= 16 && p.n >= 16 && p.k >= 16 {
        true => tiled(cx, &p, post, None),
        false => register_blocked(cx, &p, post, None),
    }
}

/// One (possibly batched) matrix product: its sizes and strides, pushed as params.
#[derive(Clone, Debug)]
struct Problem {
    /// Output batch dimensions, outer first, merged where both operands allow: (size, A's
    /// stride, B's stride), 0 where the operand broadcasts.
    batch: Vec<(usize, usize, usize)>,
    m: usize,
    n: usize,
    k: usize,
    /// The inputs read as A and B (swapped by [`Problem::one_row`]).
    a_input: usize,
    b_input: usize,
    /// A's strides of i and k, B's of k and j, in floats.
    a: (usize, usize),
    b: (usize, usize),
    alpha: f32,
    /// Gemm's C: beta, stride of i, stride of j (0 where broadcast).
    c: Option<(f32, usize, usize)>,
    /// Y[b, i, j] is element y0 + (b * m + i) * ldy + j of Y; C[i, j] element c0 + ... of C.
    ldy: usize,
    y0: usize,
    c0: usize,
    /// Bits of `blocked.wgsl`'s `flags` (pieces of K).
    flags: u32,
}

impl Problem {
    fn matmul(cx: &KernelCx) -> Result<Problem, NoKernel> {
        let (sa, sb) = (&cx.inputs[0].desc.shape, &cx.inputs[1].desc.shape);
        let split = |s: &[usize], row: bool| -> Result<(Vec<usize>, usize, usize), NoKernel> {
            match s {
                [] => Err(no_kernel!("MatMul of a scalar")),
                [v] if row => Ok((vec![], 1, *v)),
                [v] => Ok((vec![], *v, 1)),
                [batch @ .., r, c] => Ok((batch.to_vec(), *r, *c)),
            }
        };
        let ((ba, m, k), (bb, kb, n)) = (split(sa, true)?, split(sb, false)?);
        if k != kb {
            return Err(no_kernel!("MatMul of {sa:?} and {sb:?}"));
        }
        let rank = ba.len().max(bb.len());
        let dim = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
        let mut shape = Vec::with_capacity(rank);
        for i in 0..rank {
            let (da, db) = (dim(&ba, i), dim(&bb, i));
            if da != db && da != 1 && db != 1 {
                return Err(no_kernel!("MatMul batch dimensions of {sa:?} and {sb:?}"));
            }
            shape.push(da.max(db));
        }
        // Contiguous strides of each operand's own batch dims, 0 where it broadcasts.
        let strides = |s: &[usize], matrix: usize| {
            let mut out = vec![0; rank];
            let mut stride = matrix;
            for i in (0..rank).rev() {
                let d = dim(s, i);
                if d != 1 {
                    out[i] = stride;
                }
                stride *= d;
            }
            out
        };
        let (a_batch, b_batch) = (strides(&ba, m * k), strides(&bb, k * n));
        // Dims of size 1 go; neighbours merge where both operands step through them alike.
        let mut batch: Vec<(usize, usize, usize)> = Vec::new();
        for ((&d, &sa), &sb) in shape.iter().zip(&a_batch).zip(&b_batch) {
            if d == 1 {
                continue;
            }
            match batch.last_mut() {
                Some(last) if last.1 == sa * d && last.2 == sb * d => *last = (last.0 * d, sa, sb),
                _ => batch.push((d, sa, sb)),
            }
        }
        Ok(Problem {
            batch,
            m,
            n,
            k,
            a_input: 0,
            b_input: 1,
            a: (k, 1),
            // A 1-D B is one column: no column stride.
            b: (n, usize::from(sb.len() > 1)),
            alpha: 1.0,
            c: None,
            ldy: n,
            y0: 0,
            c0: 0,
            flags: 0,
        })
    }

    fn gemm(cx: &KernelCx, with_c: bool) -> Result<Problem, NoKernel> {
        let int = |name| cx.attrs.int(name).map_err(|e| no_kernel!("{e}"));
        let float = |name| cx.attrs.float(name).map_err(|e| no_kernel!("{e}"));
        let (ta, tb) = (int("transA")? != 0, int("transB")? != 0);
        let (sa, sb) = (&cx.inputs[0].desc.shape, &cx.inputs[1].desc.shape);
        let (&[a0, a1], &[b0, b1]) = (sa.as_slice(), sb.as_slice()) else {
            return Err(no_kernel!("Gemm of {sa:?} and {sb:?}"));
        };
        let ((m, k), (kb, n)) =
            (if ta { (a1, a0) } else { (a0, a1) }, if tb { (b1, b0) } else { (b0, b1) });
        if k != kb {
            return Err(no_kernel!("Gemm of {sa:?} and {sb:?}"));
        }
        // The strides of a logical R x C matrix stored as [R, C], or as [C, R] when transposed.
        let strides = |t: bool, r: usize, c: usize| if t { (1, r) } else { (c, 1) };
        let c = if with_c {
            let shape = &cx.inputs[2].desc.shape;
            let (cr, cc) = match **shape {
                [] => (1, 1),
                [cc] => (1, cc),
                [cr, cc] => (cr, cc),
                _ => return Err(no_kernel!("Gemm's C of shape {shape:?}")),
            };
            if !(cr == 1 || cr == m) || !(cc == 1 || cc == n) {
                return Err(no_kernel!("Gemm's C of shape {shape:?}"));
            }
            let rs = if cr == 1 { 0 } else { cc };
            Some((float("beta")?, rs, usize::from(cc != 1)))
        } else {
            None
        };
        Ok(Problem {
            batch: Vec::new(),
            m,
            n,
            k,
            a_input: 0,
            b_input: 1,
            // A is (M, K) read at [i, k]; B is (K, N) read at [k, j].
            a: strides(ta, m, k),
            b: strides(tb, k, n),
            alpha: float("alpha")?,
            c,
            ldy: n,
            y0: 0,
            c0: 0,
            flags: 0,
        })
    }

    fn batch(&self) -> usize {
        self.batch.iter().map(|d| d.0).product()
    }

    /// The innermost batch dimension folded into M where B broadcasts over it and A steps
    /// through it by whole matrices (Y always does): one matrix with more rows.
    fn flattened(mut self) -> Problem {
        while let Some(&(d, sa, 0)) = self.batch.last() {
            if sa != self.m * self.a.0 {
                break;
            }
            self.m *= d;
            self.batch.pop();
        }
        self
    }

    /// A product with one column and several rows as the product with one row it is
    /// transposed (Yᵀ = Bᵀ Aᵀ, the same floats): the register blocks then hold four columns
    /// of useful sums instead of one.
    fn one_row(self) -> Problem {
        if self.n != 1 || self.m == 1 {
            return self;
        }
        Problem {
            batch: self.batch.iter().map(|&(d, sa, sb)| (d, sb, sa)).collect(),
            m: 1,
            n: self.m,
            a_input: self.b_input,
            b_input: self.a_input,
            // One row: its stride is never used.
            a: (0, self.b.0),
            b: (self.a.1, self.a.0),
            c: self.c.map(|(beta, rs, cs)| (beta, cs, rs)),
            ldy: self.m,
            ..self
        }
    }

    /// The piece `w` of the product, its A and B read from windows that start at their
    /// element (w.i.start, w.k.start) and (w.k.start, w.j.start); a whole product reads them
    /// whole.
    fn piece(&self, w: &Piece) -> Problem {
        let mut flags = 0;
        if w.k.start > 0 {
            flags |= ACCUMULATE;
        }
        if w.k.end < self.k {
            flags |= PARTIAL;
        }
        Problem {
            batch: self.batch.clone(),
            m: w.i.len(),
            n: w.j.len(),
            k: w.k.len(),
            y0: self.y0 + w.i.start * self.ldy + w.j.start,
            c0: self.c.map_or(0, |(_, rs, cs)| w.i.start * rs + w.j.start * cs),
            flags,
            ..self.clone()
        }
    }

    /// The elements of A that piece `w` reads.
    fn a_window(&self, w: &Piece) -> Range<usize> {
        let first = w.i.start * self.a.0 + w.k.start * self.a.1;
        first..first + (w.i.len() - 1) * self.a.0 + (w.k.len() - 1) * self.a.1 + 1
    }

    fn b_window(&self, w: &Piece) -> Range<usize> {
        let first = w.k.start * self.b.0 + w.j.start * self.b.1;
        first..first + (w.k.len() - 1) * self.b.0 + (w.j.len() - 1) * self.b.1 + 1
    }

    /// The push-constant words after the binding offsets (`blocked.wgsl`'s `Params`).
    fn params(&self) -> Vec<u32> {
        let ((d0, a0, b0), (d1, a1, b1)) = match self.batch[..] {
            [] => ((1, 0, 0), (1, 0, 0)),
            [inner] => ((1, 0, 0), inner),
            [outer, inner] => (outer, inner),
            _ => unreachable!("at most two batch dimensions"),
        };
        let (beta, c_rs, c_cs) = self.c.unwrap_or((0.0, 0, 0));
        let words = [
            self.m,
            self.n,
            self.k,
            d0 * d1,
            d1,
            a0,
            a1,
            b0,
            b1,
            self.a.0,
            self.a.1,
            self.b.0,
            self.b.1,
            self.ldy,
            self.y0,
            self.c0,
            c_rs,
            c_cs,
        ];
        let mut v: Vec<u32> = words.iter().map(|&w| w as u32).collect();
        v.extend([self.alpha.to_bits(), beta.to_bits(), self.flags]);
        v
    }

    fn label(&self, op: &str, kernel: String) -> String {
        format!("{}_{kernel}_{}x{}x{}x{}", op.to_lowercase(), self.batch(), self.m, self.n, self.k)
    }
}

/// `flags`: add onto the sums Y holds; store the sums, nothing else.
const ACCUMULATE: u32 = 1;
const PARTIAL: u32 = 2;

/// A piece of the product: rows i, columns j, steps k.
#[derive(Clone, Debug, PartialEq)]
struct Piece {
    i: Range<usize>,
    j: Range<usize>,
    k: Range<usize>,
}

/// The product as one piece, or, when A or B is larger than one binding may be, as pieces
/// whose windows of A and B each fit one: a large A is cut along its rows (or along K when
/// stored transposed), a large B along its columns when stored transposed (a fully connected
/// weight), else along K. Piece lengths are multiples of 4 (vector reads stay aligned) and as
/// even as that allows.
fn pieces(cx: &KernelCx, p: &Problem) -> Result<Vec<Piece>, NoKernel> {
    let all = Piece { i: 0..p.m, j: 0..p.n, k: 0..p.k };
    let big = |input: usize| cx.inputs[input].desc.bytes() as u64 > MAX_BINDING_BYTES;
    let (big_a, big_b) = (big(p.a_input), big(p.b_input));
    if !big_a && !big_b {
        return Ok(vec![all]);
    }
    if !p.batch.is_empty() {
        return Err(no_kernel!(
            "{} of {} matrices with an operand over one binding",
            cx.op,
            p.batch()
        ));
    }
    // How long the dimensions of a piece may be for a window with stride `outer` along one
    // and 1 along the other to fit one binding: (outer dimension, inner dimension).
    let fit = |outer: usize, inner_len: usize| -> (usize, usize) {
        let floats = (MAX_BINDING_BYTES / 4) as usize;
        match inner_len > floats {
            true => (1, floats),
            false => ((floats - inner_len) / outer.max(1) + 1, inner_len),
        }
    };
    let (mut i_max, mut j_max, mut k_max) = (p.m, p.n, p.k);
    let strided = || no_kernel!("{} of a strided operand over one binding", cx.op);
    if big_a {
        (i_max, k_max) = match p.a {
            (rs, 1) => fit(rs, p.k),
            (1, cs) => {
                let (k, i) = fit(cs, p.m);
                (i, k)
            }
            _ => return Err(strided()),
        };
    }
    if big_b {
        let (j, k) = match p.b {
            (1, cs) => fit(cs, p.k),
            (rs, 1) => {
                let (k, j) = fit(rs, p.n);
                (j, k)
            }
            _ => return Err(strided()),
        };
        (j_max, k_max) = (j, k_max.min(k));
    }
    let split = |len: usize, max: usize| -> Result<Vec<Range<usize>>, NoKernel> {
        if max >= len {
            return Ok(std::iter::once(0..len).collect());
        }
        let max = max / 4 * 4;
        if max == 0 {
            return Err(no_kernel!("{} rows too long for one binding", cx.op));
        }
        let step = len.div_ceil(len.div_ceil(max)).next_multiple_of(4);
        Ok((0..len).step_by(step).map(|s| s..(s + step).min(len)).collect())
    };
    let (is, js, ks) = (split(p.m, i_max)?, split(p.n, j_max)?, split(p.k, k_max)?);
    let mut out = Vec::with_capacity(is.len() * js.len() * ks.len());
    for i in &is {
        for j in &js {
            for k in &ks {
                out.push(Piece { i: i.clone(), j: j.clone(), k: k.clone() });
            }
        }
    }
    Ok(out)
}

/// How the register-blocked kernel reads one operand (`blocked.wgsl`'s A_MODE, B_MODE).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Read {
    /// One float at a time.
    Scalar = 0,
    /// vec4s along k (four k steps of one row of A or column of B).
    AlongK = 1,
    /// vec4s along the output's rows of A (i) or columns of B (j), one k at a time.
    Across = 2,
    /// B's rows, contiguous but not 16-byte aligned (N not a multiple of 4): the aligned
    /// vec4s that cover a row's block, shifted by the row's offset, which is a constant for
    /// each of four consecutive k.
    Shifted = 3,
}

/// A and B's bindings (whole, or the windows of a piece), then Y, C and the post-op operands.
/// A MatMul with post-op operands binds the first of them in C's slot, which it never reads.
fn bindings(
    cx: &KernelCx,
    p: &Problem,
    post: &PostOps,
    windows: Option<(Range<usize>, Range<usize>)>,
    [a_ty, b_ty, y_ty]: [&'static str; 3],
) -> Vec<Binding> {
    let operand = |name: &str, input: usize, ty: &'static str, window: Option<Range<usize>>| {
        let Some(w) = window else {
            return Binding::input(name, input, ty);
        };
        let bytes = cx.inputs[input].desc.bytes() as u64;
        let end = (w.end as u64 * 4).next_multiple_of(u64::from(element_bytes(ty)));
        Binding::chunk(name, Slot::Input(input), ty, w.start as u64 * 4..end.min(bytes))
    };
    let (wa, wb) = windows.unzip();
    let mut v = vec![
        operand("a", p.a_input, a_ty, wa),
        operand("b", p.b_input, b_ty, wb),
        Binding::output("y", 0, y_ty),
    ];
    v.extend(c_and_post_bindings(p, post));
    v
}

/// C's binding (or, for a MatMul with post-op operands, the first of them in C's slot, which
/// it never reads), then the post-op operands'.
fn c_and_post_bindings(p: &Problem, post: &PostOps) -> Vec<Binding> {
    let post = post.bindings();
    let mut v = Vec::with_capacity(post.len() + 1);
    if p.c.is_some() {
        v.push(Binding::input("c", 2, "f32"));
    } else if let Some(first) = post.first() {
        v.push(Binding { name: "c".into(), ..first.clone() });
    }
    v.extend(post);
    v
}

fn element_bytes(ty: &str) -> u32 {
    if ty.starts_with("vec4") { 16 } else { 4 }
}

/// The hooks the kernel files share: C and the post-ops (read from `slots` slots r0, r1..).
fn hooks(spec: Spec, p: &Problem, post: &PostOps, slots: usize) -> Result<Spec, NoKernel> {
    let spec = spec.hook("post_op", post.hook_in(slots)?);
    Ok(match p.c {
        Some(_) => spec.hook("add_c", ADD_C),
        None => spec,
    })
}

/// The block of Y one invocation of [`register_blocked`] holds: (rows, groups of 4
/// columns), as large as the device class takes while the problem still gives enough
/// invocations, and balanced so that the tail block wastes little.
fn block_shape(p: &Problem, class: DeviceClass) -> (usize, usize) {
    // CPU-type devices: each loaded value should feed many multiply-adds (spilled
    // accumulators cost far less than loads there); GPUs: few registers per invocation.
    let (mut rm_max, mut cg_max) = match class {
        DeviceClass::Cpu => (16, 4),
        _ => (4, 1),
    };
    let balanced = |len: usize, max: usize| len.div_ceil(len.div_ceil(max).max(1)).max(1);
    let groups = p.n.div_ceil(4);
    loop {
        let mut rm = balanced(p.m, rm_max);
        // A read as vec4s across its rows needs whole groups of 4 rows.
        if p.a.0 == 1 && p.m.is_multiple_of(4) {
            rm = rm.next_multiple_of(4);
        }
        let cg = balanced(groups, cg_max);
        let blocks = p.batch() * p.m.div_ceil(rm) * groups.div_ceil(cg);
        if blocks >= MIN_BLOCKS || (rm_max <= 4 && cg_max <= 1) {
            return (rm, cg);
        }
        if rm_max > 4 && (rm_max >= 4 * cg_max || cg_max == 1) {
            rm_max /= 2;
        } else {
            cg_max /= 2;
        }
    }
}

/// Invocations below which [`block_shape`] makes blocks smaller: a CPU-type device runs
/// 8 lanes per core, and wants a few SIMD batches per core.
const MIN_BLOCKS: usize = 32;

/// `blocked.wgsl`: each invocation computes rows i0..i0+RM and columns j0..j0+4CG of one
/// batch's Y in registers ([`block_shape`]), held as CG vec4s per row.
///
/// On CPU-type devices every load from a storage buffer costs a loop over the SIMD lanes
/// whatever its width, so the kernel reads vec4s wherever the layout allows and holds a
/// block large enough that each loaded value feeds several multiply-adds.
fn register_blocked(
    cx: &KernelCx,
    p: &Problem,
    post: &PostOps,
    windows: Option<(Range<usize>, Range<usize>)>,
) -> Result<Dispatch, NoKernel> {
    let (rm, cg) = block_shape(p, cx.class);
    let k4 = p.k.is_multiple_of(4);
    // Where an operand starts: 16-byte aligned if its tensor is and its window starts on a
    // whole vec4.
    let aligned = |o: &Operand, window: Option<&Range<usize>>| {
        o.aligned16() && window.is_none_or(|w| w.start.is_multiple_of(4))
    };
    let (wa, wb) = (windows.as_ref().map(|w| &w.0), windows.as_ref().map(|w| &w.1));
    let (a_op, b_op, y_op) = (&cx.inputs[p.a_input], &cx.inputs[p.b_input], &cx.outputs[0]);
    let batch4 = |a: bool| p.batch.iter().all(|d| if a { d.1 } else { d.2 }.is_multiple_of(4));
    let a_vec = |stride: usize| aligned(a_op, wa) && batch4(true) && stride.is_multiple_of(4);
    let b_vec = |stride: usize| aligned(b_op, wb) && batch4(false) && stride.is_multiple_of(4);
    // A is read along k when its rows are contiguous, across rows when its columns are.
    let a_read = if p.a.1 == 1 && k4 && a_vec(p.a.0) {
        Read::AlongK
    } else if p.a.0 == 1 && rm.is_multiple_of(4) && p.m.is_multiple_of(4) && a_vec(p.a.1) {
        Read::Across
    } else {
        Read::Scalar
    };
    let b_read = if p.b.1 == 1 && p.n.is_multiple_of(4) && b_vec(p.b.0) {
        Read::Across
    } else if p.b.0 == 1 && k4 && b_vec(p.b.1) {
        Read::AlongK
    } else if p.b.1 == 1 && k4 && b_vec(0) {
        Read::Shifted
    } else {
        Read::Scalar
    };
    let y_vec = p.n.is_multiple_of(4)
        && p.ldy.is_multiple_of(4)
        && p.y0.is_multiple_of(4)
        && y_op.aligned16();
    let ty = |v: bool| if v { "vec4<f32>" } else { "f32" };
    let types = [ty(a_read != Read::Scalar), ty(b_read != Read::Scalar), ty(y_vec)];
    let bindings = bindings(cx, p, post, windows, types);
    let total = p.batch() * p.m.div_ceil(rm) * p.n.div_ceil(4 * cg);
    // Small workgroups on CPU-type devices: few, large blocks still spread over the cores.
    let wg = match cx.class {
        DeviceClass::Cpu => 8,
        _ => 64,
    };
    let grid = Grid::new(total as u64, wg)?;
    let mut spec = Spec::new(&BLOCKED)
        .alias("AE", types[0])
        .alias("BE", types[1])
        .alias("YE", types[2])
        .set("RM", rm as u32)
        .set("CG", cg as u32)
        .set("KU", if k4 { 4 } else { 1 })
        .set("A_MODE", a_read as u32)
        .set("B_MODE", b_read as u32)
        .set(
            "B_SHIFT",
            match b_read {
                Read::Shifted => (p.b.0 % 4) as u32,
                _ => 0,
            },
        )
        .set("WG", wg);
    if !y_vec {
        spec = spec.hook("store_y", STORE_Y_F32).hook("load_y", LOAD_Y_F32);
    }
    let spec = hooks(spec, p, post, 2)?;
    spec.dispatch(p.label(cx.op, format!("rb{rm}x{}", 4 * cg)), grid.groups, bindings, p.params())
}

/// `tiled.wgsl`: a workgroup of BN/4 x BM/4 invocations computes a BM x BN tile of one
/// batch's Y (BM, BN = 32 or 64), staging BK = 16 steps of A and B at a time.
fn tiled(
    cx: &KernelCx,
    p: &Problem,
    post: &PostOps,
    windows: Option<(Range<usize>, Range<usize>)>,
) -> Result<Dispatch, NoKernel> {
    let bm = if p.m > 32 { 64 } else { 32 };
    let bn = if p.n > 32 { 64 } else { 32 };
    let bindings = bindings(cx, p, post, windows, ["f32"; 3]);
    let groups = [p.n.div_ceil(bn), p.m.div_ceil(bm), p.batch()];
    if groups.iter().any(|&g| g > MAX_GROUPS as usize) {
        return Err(no_kernel!("{} too large for one dispatch", cx.op));
    }
    let spec = Spec::new(&TILED)
        .set("BM", bm as u32)
        .set("BN", bn as u32)
        .set("A_K", p.a.1 == 1)
        .set("B_K", p.b.0 == 1);
    let spec = hooks(spec, p, post, 2)?;
    spec.dispatch(
        p.label(cx.op, format!("tile{bm}x{bn}")),
        groups.map(|g| g as u32),
        bindings,
        p.params(),
    )
}

/// `MatMulIntegerToFloat` (the quantize family's; canonical form in ops/src/quantize/mod.rs):
/// `dequantized.wgsl` with A's levels read as B's are, both minus their zero points (A's one
/// value, B's one or one per column), the sums not scaled; then the post-ops.
pub(crate) fn integer_to_float(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let post = PostOps::new(cx, 4)?;
    if cx.inputs.len() != 4 + post.bindings().len() || cx.outputs.len() != 1 {
        return Err(no_kernel!("{} with {} inputs", cx.op, cx.inputs.len()));
    }
    if let Some(k) = cx.in_place().filter(|&k| k < 4) {
        return Err(no_kernel!("{} written over its input {k}", cx.op));
    }
    if let Some(o) = cx.inputs[4..].iter().chain(cx.outputs).find(|o| o.desc.dtype != DType::F32) {
        return Err(cx.dtype(o.desc.dtype));
    }
    let p = Problem::matmul(cx)?;
    let out = &cx.outputs[0];
    if out.desc.elements() == 0 {
        return Ok(Vec::new());
    }
    if p.k == 0 || out.desc.elements() != p.batch() * p.m * p.n {
        return Err(no_kernel!(
            "{} of {:?} into {:?}",
            cx.op,
            cx.inputs[0].desc.shape,
            out.desc.shape
        ));
    }
    if cx.inputs.iter().chain(cx.outputs).any(|o| o.desc.elements() >= 1 << 31) {
        return Err(no_kernel!("{} operands too large for 32-bit indices", cx.op));
    }
    let [a, _, za, zb] = [0, 1, 2, 3].map(|i| &cx.inputs[i]);
    let a_signed = signed_levels(a.desc.dtype).ok_or_else(|| cx.dtype(a.desc.dtype))?;
    let per_column = zb.desc.elements() == p.n && zb.desc.shape.last() == Some(&p.n);
    if za.desc.elements() != 1 || (zb.desc.elements() != 1 && !per_column) {
        return Err(no_kernel!(
            "{}: zero points of {:?} and {:?}",
            cx.op,
            za.desc.shape,
            zb.desc.shape
        ));
    }
    if [a, za, zb].iter().any(|o| !o.byte_offset.is_multiple_of(4)) {
        return Err(no_kernel!("{}: an 8-bit operand that does not start on a word", cx.op));
    }
    let integer = IntegerA { zero: 2, signed: a_signed, per_column: per_column && p.n > 1 };
    dequantized(cx, &p.flattened(), &post, Some(3), Some(integer)).map(|d| vec![d])
}

/// 8-bit A, for `dequantized.wgsl` (MatMulIntegerToFloat): its zero point (one value) is input
/// `zero`; B's zero points (one, or one per column) take the place of B's table; no scales.
#[derive(Clone, Copy, Debug)]
struct IntegerA {
    zero: usize,
    signed: bool,
    per_column: bool,
}

/// Whether 8-bit `dtype` is signed, or None for other types.
fn signed_levels(dtype: DType) -> Option<bool> {
    match dtype {
        DType::I8 => Some(true),
        DType::U8 => Some(false),
        _ => None,
    }
}

/// `dequantized.wgsl`: a product of float32 A and an 8-bit B with its dequantization (input
/// `dq`: scales, then zero points, per column), of float32 A and a float16 B (no `dq`), or of
/// 8-bit A and B with their zero points (`integer`; input `dq` is then B's zero points), one
/// invocation per block of RM rows and 4 columns of one batch's Y. B's values are unpacked
/// from its words in registers, four at a time where B's layout allows (four k of a column of
/// a [N, K] B, or four columns of a row of a [K, N] B), minus the zero points, and the sums
/// scaled per column: the weight stays a quarter (a half) of the bytes on the device and is
/// never written out as floats. 8-bit A is read the same way.
fn dequantized(
    cx: &KernelCx,
    p: &Problem,
    post: &PostOps,
    dq: Option<usize>,
    integer: Option<IntegerA>,
) -> Result<Dispatch, NoKernel> {
    let (a_op, b_op) = (&cx.inputs[p.a_input], &cx.inputs[p.b_input]);
    let half = dq.is_none();
    let signed = match half {
        true => false,
        false => signed_levels(b_op.desc.dtype)
            .ok_or_else(|| no_kernel!("{} dequantizing a {} B", cx.op, b_op.desc.dtype))?,
    };
    let fits = |dq: usize| cx.inputs[dq].desc.shape == crate::dequantization_shape(p.n);
    if integer.is_none() && dq.is_some_and(|dq| !fits(dq)) {
        return Err(no_kernel!("{}: B's dequantization does not fit its columns", cx.op));
    }
    if p.batch.len() > 2 {
        return Err(no_kernel!("{} of {} batch dimensions (2 at most)", cx.op, p.batch.len()));
    }
    if cx.inputs[..2].iter().any(|o| o.desc.bytes() as u64 > MAX_BINDING_BYTES) {
        return Err(no_kernel!("{} {}: an operand over one binding", cx.op, cx.name));
    }
    if !b_op.byte_offset.is_multiple_of(4) {
        return Err(no_kernel!("{} of a narrow B that does not start on a word", cx.op));
    }
    let k4 = p.k.is_multiple_of(4);
    let batch4 = |a: bool| p.batch.iter().all(|d| if a { d.1 } else { d.2 }.is_multiple_of(4));
    // Float A as vec4s needs 16-byte alignment; 8-bit A's words start on one (checked above).
    let a_aligned = integer.is_some() || a_op.aligned16();
    let a_vec = k4 && p.a.1 == 1 && p.a.0.is_multiple_of(4) && a_aligned && batch4(true);
    let b_mode = if k4 && p.b.0 == 1 && p.b.1.is_multiple_of(4) && batch4(false) {
        1
    } else if p.b.1 == 1 && p.b.0.is_multiple_of(4) && p.n.is_multiple_of(4) && batch4(false) {
        2
    } else {
        0
    };
    // Rows per invocation: as many as the device class holds well while there are still
    // enough invocations.
    let groups = p.batch() * p.n.div_ceil(4);
    let mut rm = match cx.class {
        DeviceClass::Cpu => 8,
        _ => 4,
    };
    while rm > 1 && groups * p.m.div_ceil(rm) < MIN_BLOCKS {
        rm /= 2;
    }
    let rm = p.m.div_ceil(p.m.div_ceil(rm));
    let wg = match cx.class {
        DeviceClass::Cpu => 8,
        _ => 64,
    };
    let grid = Grid::new((groups * p.m.div_ceil(rm)) as u64, wg)?;
    let a_ty = match (integer, a_vec) {
        (Some(_), _) => "u32",
        (None, true) => "vec4<f32>",
        (None, false) => "f32",
    };
    let mut bindings = vec![
        Binding::input("a", p.a_input, a_ty),
        Binding::input("b", p.b_input, "u32"),
        Binding::output("y", 0, "f32"),
    ];
    let mut spec = Spec::new(&DEQUANTIZED).alias("AE", a_ty);
    match (integer, dq) {
        (Some(a), Some(dq)) => {
            bindings.push(Binding::input("dq", dq, "u32"));
            bindings.push(Binding::input("c", a.zero, "u32"));
            bindings.extend(post.bindings());
            spec = integer_hooks(spec, a, signed);
        }
        (None, Some(dq)) => {
            bindings.push(Binding::input("dq", dq, "f32"));
            bindings.extend(c_and_post_bindings(p, post));
        }
        (_, None) => {
            // Slots are positional: dq's, which the hooks never read, holds B again.
            bindings.push(Binding::input("dq", p.b_input, "f32"));
            bindings.extend(c_and_post_bindings(p, post));
            spec = half_hooks(spec);
        }
    }
    let spec = spec
        .set("RM", rm as u32)
        .set("KU", if k4 { 4 } else { 1 })
        .set("A_VEC", a_vec)
        .set("B_MODE", b_mode)
        .set("B_SIGNED", signed)
        .set("WG", wg);
    let spec = hooks(spec, p, post, 3)?;
    spec.dispatch(p.label(cx.op, format!("dq{rm}x4")), grid.groups, bindings, p.params())
}

/// The hooks of `dequantized.wgsl` for a float16 B: two values to a word, each widened
/// exactly by `elementwise/f16.wgsl`'s `h2f`; no scales or zero points.
fn half_hooks(spec: Spec) -> Spec {
    spec.library(&crate::elementwise::vulkan::F16)
        .hook(
            "quad",
            "fn quad(e: u32) -> vec4<f32> {
    let lo = b[p.b + e / 2u];
    let hi = b[p.b + e / 2u + 1u];
    return vec4<f32>(h2f(lo & 0xffffu), h2f(lo >> 16u), h2f(hi & 0xffffu), h2f(hi >> 16u));
}",
        )
        .hook(
            "level",
            "fn level(e: u32) -> f32 {
    return h2f((b[p.b + e / 2u] >> (16u * (e & 1u))) & 0xffffu);
}",
        )
        .hook(
            "column_scales",
            "fn column_scales(j: vec4<u32>) -> vec4<f32> {\n    return vec4<f32>(1.0);\n}",
        )
        .hook(
            "column_zeros",
            "fn column_zeros(j: vec4<u32>) -> vec4<f32> {\n    return vec4<f32>(0.0);\n}",
        )
}

/// The hooks of `dequantized.wgsl` for 8-bit A: A's levels minus its zero point (slot c), no
/// scales, B's zero points as bytes (slot dq), one per column or one for all.
fn integer_hooks(spec: Spec, a: IntegerA, b_signed: bool) -> Spec {
    let a_signed = a.signed;
    let zero = |j: &str| match a.per_column {
        true => format!("byte_level(dq[p.dq + {j} / 4u], {j}, {b_signed})"),
        false => format!("byte_level(dq[p.dq], 0u, {b_signed})"),
    };
    let zeros = format!(
        "fn column_zeros(j: vec4<u32>) -> vec4<f32> {{\n    return vec4<f32>({}, {}, {}, {});\n}}",
        zero("j.x"),
        zero("j.y"),
        zero("j.z"),
        zero("j.w")
    );
    let quad = format!(
        "fn a_quad(i: u32, k: u32, ab: u32) -> vec4<f32> {{
    let zero = byte_level(c[p.c], 0u, {a_signed});
    let e = ab + i * p.a_rs + k * p.a_cs;
    if (A_VEC) {{
        return word_levels(a[p.a + e / 4u], {a_signed}) - zero;
    }}
    var v = vec4<f32>(byte_level(a[p.a + e / 4u], e, {a_signed}) - zero, 0.0, 0.0, 0.0);
    if (KU == 4u) {{
        for (var s = 1u; s < 4u; s++) {{
            let es = e + s * p.a_cs;
            v[s] = byte_level(a[p.a + es / 4u], es, {a_signed}) - zero;
        }}
    }}
    return v;
}}"
    );
    spec.alias("DQ", "u32")
        .alias("CE", "u32")
        .hook(
            "column_scales",
            "fn column_scales(j: vec4<u32>) -> vec4<f32> {\n    return vec4<f32>(1.0);\n}",
        )
        .hook("column_zeros", zeros)
        .hook("a_quad", quad)
}

/// Einsum from its canonical labels (ops/src/matmul/cpu.rs): one invocation per output
/// element, looping over the labels that are summed (`einsum.wgsl`). A label's stride in an
/// operand is the sum of the strides of the operand's axes that carry it (a repeated label is a
/// diagonal), 0 where the operand has it with size 1 (broadcast).
fn einsum(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    if !(1..=2).contains(&cx.inputs.len()) {
        return Err(no_kernel!("Einsum with {} inputs", cx.inputs.len()));
    }
    if cx.in_place().is_some() {
        return Err(no_kernel!("Einsum in place"));
    }
    let labels = |name: &str| cx.attrs.ints(name).map_err(|e| no_kernel!("{e}"));
    let mut operands = Vec::with_capacity(2);
    for (i, x) in cx.inputs.iter().enumerate() {
        operands.push((labels(&format!("input{i}_labels"))?, &x.desc.shape));
    }
    let out_labels = labels("output_labels")?;
    // Label -> size, in label order (deterministic).
    let mut sizes = std::collections::BTreeMap::new();
    for (ls, shape) in &operands {
        if ls.len() != shape.len() {
            return Err(no_kernel!("Einsum labels {ls:?} for shape {shape:?}"));
        }
        for (&l, &d) in ls.iter().zip(shape.iter()) {
            let s = sizes.entry(l).or_insert(d);
            if *s == 1 {
                *s = d;
            } else if d != 1 && d != *s {
                return Err(no_kernel!("Einsum label {l} has sizes {s} and {d}"));
            }
        }
    }
    let size = |l: &i64| sizes.get(l).copied().ok_or_else(|| no_kernel!("Einsum label {l}"));
    let shape = out_labels.iter().map(size).collect::<Result<Vec<_>, _>>()?;
    let y = &cx.outputs[0];
    if y.desc.shape != shape {
        return Err(no_kernel!("Einsum makes {shape:?}, the step declares {:?}", y.desc.shape));
    }
    let n = y.desc.elements();
    if n == 0 {
        return Ok(Vec::new());
    }
    if cx.inputs.iter().any(|x| x.desc.elements() == 0) {
        return Err(no_kernel!("Einsum of an empty operand"));
    }
    let summed: Vec<i64> = sizes.keys().copied().filter(|l| !out_labels.contains(l)).collect();
    // Each operand's stride for each of `of` labels.
    let strides_of = |k: usize, of: &[i64]| -> Vec<usize> {
        let (ls, shape) = &operands[k];
        let st = row_major(shape);
        of.iter()
            .map(|l| {
                ls.iter()
                    .zip(shape.iter())
                    .zip(&st)
                    .filter(|((m, d), _)| *m == l && **d != 1)
                    .map(|(_, s)| s)
                    .sum()
            })
            .collect()
    };
    // (size, stride in x0, stride in x1) per dimension, merged, padded to `rank` outer first.
    let dims = |labels: &[i64], rank: usize, what: &str| -> Result<Vec<[usize; 3]>, NoKernel> {
        let sizes = labels.iter().map(size).collect::<Result<Vec<_>, _>>()?;
        let s0 = strides_of(0, labels);
        let s1 = match operands.len() {
            2 => strides_of(1, labels),
            _ => vec![0; labels.len()],
        };
        let mut merged: Vec<[usize; 3]> = Vec::new();
        for ((&d, &a), &b) in sizes.iter().zip(&s0).zip(&s1) {
            if d == 1 {
                continue;
            }
            match merged.last_mut() {
                Some(last) if last[1] == a * d && last[2] == b * d => {
                    *last = [last[0] * d, a, b];
                }
                _ => merged.push([d, a, b]),
            }
        }
        if merged.len() > rank {
            return Err(no_kernel!(
                "Einsum with {} {what} dimensions that do not merge ({rank} at most)",
                merged.len()
            ));
        }
        let mut padded = vec![[1, 0, 0]; rank - merged.len()];
        padded.extend(merged);
        Ok(padded)
    };
    let o = dims(out_labels, 4, "output")?;
    let u = dims(&summed, 3, "summed")?;
    let mut bindings = vec![Binding::input("x0", 0, "f32"), Binding::output("y", 0, "f32")];
    if operands.len() == 2 {
        bindings.push(Binding::input("x1", 1, "f32"));
    }
    let grid = Grid::new(n as u64, 64)?;
    let mut params = vec![n, o[1][0], o[2][0], o[3][0], u[0][0], u[1][0], u[2][0]];
    for x in 1..3 {
        params.extend(o.iter().map(|d| d[x]));
        params.extend(u.iter().map(|d| d[x]));
    }
    let total: usize = u.iter().map(|d| d[0]).product();
    let mut spec = Spec::new(&EINSUM).set("WG", grid.workgroup);
    if operands.len() == 2 {
        spec = spec.hook("operand1", OPERAND1);
    }
    Ok(vec![spec.dispatch(
        format!("einsum_{n}x{total}"),
        grid.groups,
        bindings,
        params.iter().map(|&v| v as u32).collect(),
    )?])
}

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::compile;
    use ingot_schema::{AttrValue, Attrs, DType};

    /// A dispatch for a snapshot: how it launches, what it binds and pushes, its overrides, and
    /// the lines of its source that specialisation changed from `file` (aliases and hooks).
    pub(crate) fn specialised(d: &Dispatch, file: &Wgsl) -> String {
        let mut s = format!("{}\ngroups {:?}\n", d.label, d.groups);
        for b in &d.bindings {
            s.push_str(&format!("binding {}: {} {:?}", b.name, b.ty, b.slot));
            if let Some(c) = &b.chunk {
                s.push_str(&format!(" bytes {c:?}"));
            }
            s.push('\n');
        }
        s.push_str(&format!("params {:?}\n", d.params));
        for (name, value) in &d.overrides {
            s.push_str(&format!("override {name} = {value}\n"));
        }
        let original: std::collections::HashSet<&str> = file.source.lines().collect();
        for line in d.wgsl.lines().filter(|l| !original.contains(l)) {
            s.push_str(&format!("+ {line}\n"));
        }
        s
    }

    fn f32s(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape.to_vec())
    }

    fn post(attrs: Attrs, ops: &str) -> Attrs {
        attrs
            .with("post_ops", AttrValue::Text(ops.into()))
            .with("post_params", AttrValue::Floats(vec![]))
    }

    fn gemm_attrs(ta: i64, tb: i64, alpha: f64, beta: f64) -> Attrs {
        Attrs::new()
            .with("transA", AttrValue::Int(ta))
            .with("transB", AttrValue::Int(tb))
            .with("alpha", AttrValue::Float(alpha))
            .with("beta", AttrValue::Float(beta))
    }

    /// Lowers `op` for both device classes (see `lower_f32_all_classes`: every dispatch is
    /// compiled), `skew` bytes off 16-byte alignment.
    fn lower_all(
        op: &str,
        attrs: &Attrs,
        inputs: &[&[usize]],
        out: &[usize],
        skew: u64,
    ) -> Vec<Dispatch> {
        crate::vulkan::lower_f32_all_classes(lower, op, attrs, inputs, &[out], skew)
    }

    fn overrides(d: &Dispatch) -> Vec<(&'static str, f64)> {
        d.overrides.clone()
    }

    fn set(d: &Dispatch, name: &str) -> f64 {
        d.overrides
            .iter()
            .find(|o| o.0 == name)
            .unwrap_or_else(|| panic!("{} has no override {name}", d.label))
            .1
    }

    #[test]
    fn every_kernel_file_compiles_alone() {
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
        // Optional slots count when overrides leave them unread: the params follow all six.
        let c = compile(BLOCKED.source, &[("RM", 8.0)]).unwrap();
        assert_eq!((c.slots, c.push_words), (6, 27));
    }

    /// Lowers a MatMul (B stored [K, N]) or a Gemm with transB (B stored [N, K]) of an int8
    /// B with its dequantization, for both device classes.
    fn dequantizing(gemm: bool, a: &[usize], k: usize, n: usize, skew: u64) -> Vec<Dispatch> {
        narrow_b(DType::I8, gemm, a, k, n, skew)
    }

    /// [`dequantizing`] of a B of `dtype`: int8 with its dequantization, or float16.
    fn narrow_b(
        dtype: DType,
        gemm: bool,
        a: &[usize],
        k: usize,
        n: usize,
        skew: u64,
    ) -> Vec<Dispatch> {
        let quantized = AttrValue::Int(i64::from(dtype != DType::F16));
        let (op, attrs, b) = match gemm {
            true => ("Gemm", post(gemm_attrs(0, 1, 1.0, 1.0), ""), [n, k]),
            false => ("MatMul", post(Attrs::new(), ""), [k, n]),
        };
        let attrs = attrs.with("dequantize_b", quantized);
        let mut y = a[..a.len() - 1].to_vec();
        y.push(n);
        let mut inputs = vec![f32s(a), TensorDesc::new(dtype, b.to_vec())];
        if dtype != DType::F16 {
            inputs.push(f32s(&crate::dequantization_shape(n)));
        }
        crate::vulkan::lower_all_classes(lower, op, &attrs, &inputs, &[f32s(&y)], skew)
    }

    #[test]
    fn integer_products_read_a_and_b_as_words_of_levels() {
        // Its scale, its bias and a residual, as a dynamically quantized transformer has them.
        let attrs = post(Attrs::new(), "Mul,Add,Add");
        // (A, B, B's zero point) -> (A_VEC, B_MODE, KU); A is uint8 (DynamicQuantizeLinear's).
        type Case<'a> = ((&'a [usize], &'a [usize], &'a [usize]), (f64, f64, f64));
        let cases: &[Case] = &[
            // Rows of A and B's rows as words; one zero point per column.
            ((&[1, 16, 64], &[64, 48], &[48]), (1.0, 2.0, 4.0)),
            // K not a multiple of 4: byte by byte; one zero point.
            ((&[5, 30], &[30, 6], &[]), (0.0, 0.0, 1.0)),
        ];
        for &((a, b, zb), (a_vec, b_mode, ku)) in cases {
            let mut y = a[..a.len() - 1].to_vec();
            y.push(b[1]);
            let inputs = [
                TensorDesc::new(DType::U8, a.to_vec()),
                TensorDesc::new(DType::I8, b.to_vec()),
                TensorDesc::new(DType::U8, vec![]),
                TensorDesc::new(DType::I8, zb.to_vec()),
                f32s(&[]),
                f32s(&[b[1]]),
                f32s(&y),
            ];
            let run = |op| {
                crate::vulkan::lower_all_classes(
                    crate::quantize::vulkan::lower,
                    op,
                    &attrs,
                    &inputs,
                    &[f32s(&y)],
                    0,
                )
            };
            for d in run("MatMulIntegerToFloat") {
                let got = (set(&d, "A_VEC"), set(&d, "B_MODE"), set(&d, "KU"));
                assert_eq!(got, (a_vec, b_mode, ku), "{}", d.label);
                // B's zero points in dq's slot, A's in C's, then the three post-op operands.
                let slots: Vec<(&str, &str, Slot)> =
                    d.bindings.iter().map(|b| (b.name.as_str(), b.ty, b.slot)).collect();
                assert_eq!(
                    slots[3..],
                    [
                        ("dq", "u32", Slot::Input(3)),
                        ("c", "u32", Slot::Input(2)),
                        ("r0", "f32", Slot::Input(4)),
                        ("r1", "f32", Slot::Input(5)),
                        ("r2", "f32", Slot::Input(6)),
                    ]
                );
            }
        }
        let d = crate::vulkan::lower_all_classes(
            crate::quantize::vulkan::lower,
            "MatMulIntegerToFloat",
            &attrs,
            &[
                TensorDesc::new(DType::U8, vec![1, 16, 64]),
                TensorDesc::new(DType::I8, vec![64, 48]),
                TensorDesc::new(DType::U8, vec![]),
                TensorDesc::new(DType::I8, vec![48]),
                f32s(&[]),
                f32s(&[48]),
                f32s(&[1, 16, 48]),
            ],
            &[f32s(&[1, 16, 48])],
            0,
        );
        insta::assert_snapshot!(specialised(&d[0], &DEQUANTIZED));
    }

    #[test]
    fn dequantizing_products_read_words_of_b_where_its_layout_allows() {
        // (Gemm, A, K, N, skew) -> B_MODE, KU, A_VEC
        type Case<'a> = ((bool, &'a [usize], usize, usize, u64), (f64, f64, f64));
        let cases: &[Case] = &[
            // Four columns of a [K, N] row in a word; A's rows as vec4s.
            ((false, &[2, 5, 64], 64, 48, 0), (2.0, 4.0, 1.0)),
            // Four k of a [N, K] column in a word.
            ((true, &[6, 32], 32, 40, 0), (1.0, 4.0, 1.0)),
            // A off its 16-byte alignment is read a float at a time.
            ((true, &[6, 32], 32, 40, 4), (1.0, 4.0, 0.0)),
            // K not a multiple of 4: one step at a time; [K, N] rows still in words.
            ((false, &[5, 33], 33, 32, 0), (2.0, 1.0, 0.0)),
            // Neither layout in words: byte by byte.
            ((true, &[6, 30], 30, 36, 0), (0.0, 1.0, 0.0)),
            ((false, &[3, 37], 37, 30, 0), (0.0, 1.0, 0.0)),
        ];
        for &((gemm, a, k, n, skew), (b_mode, ku, a_vec)) in cases {
            let d = dequantizing(gemm, a, k, n, skew);
            assert_eq!(d.len(), 2, "one dispatch per class");
            for d in &d {
                let got = [set(d, "B_MODE"), set(d, "KU"), set(d, "A_VEC")];
                assert_eq!(got, [b_mode, ku, a_vec], "{}", d.label);
                assert_eq!(d.bindings[1].ty, "u32");
                assert_eq!(d.bindings[3].name, "dq");
            }
            // A float16 B: the same layouts, two values to a word, no dequantization.
            for d in &narrow_b(DType::F16, gemm, a, k, n, skew) {
                let got = [set(d, "B_MODE"), set(d, "KU"), set(d, "A_VEC")];
                assert_eq!(got, [b_mode, ku, a_vec], "{}", d.label);
                assert_eq!(d.bindings[1].ty, "u32");
                assert_eq!(d.bindings[3].slot, Slot::Input(1), "{}: dq's slot holds B", d.label);
                assert!(
                    d.wgsl
                        .contains("fn quad(e: u32) -> vec4<f32> {\n    let lo = b[p.b + e / 2u];")
                );
            }
        }
        // A batch of A over one B is one matrix of more rows: 10 x 48. CPU-type devices take
        // blocks of 8 rows while that leaves 32 blocks, else 4: 36 blocks of 4 rows.
        let d = dequantizing(false, &[2, 5, 64], 64, 48, 0);
        assert_eq!(d[0].label, "matmul_dq4x4_1x10x48x64");
        let d8 = dequantizing(false, &[64, 64], 64, 48, 0);
        assert_eq!(d8[0].label, "matmul_dq8x4_1x64x48x64");
        assert_eq!(d8[1].label, "matmul_dq4x4_1x64x48x64");
        insta::assert_snapshot!(specialised(&d[0], &DEQUANTIZED));
    }

    #[test]
    fn matmul_shapes_compile() {
        let a = post(Attrs::new(), "");
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[1, 40, 120], &[120, 360], &[1, 40, 360]),
            (&[1, 8, 40, 15], &[1, 8, 15, 40], &[1, 8, 40, 40]),
            (&[2, 3, 5, 7], &[7, 6], &[2, 3, 5, 6]),
            (&[3, 1, 4, 8], &[2, 8, 4], &[3, 2, 4, 4]),
            (&[8], &[8, 5], &[5]),
            (&[3, 8], &[8], &[3]),
            (&[8], &[8], &[]),
            (&[2, 1, 3, 8], &[4, 8, 1], &[2, 4, 3, 1]),
            (&[33, 64], &[64, 70], &[33, 70]),
            (&[2, 64, 48], &[2, 48, 40], &[2, 64, 40]),
        ];
        for &(sa, sb, sy) in cases {
            for skew in [0, 4] {
                for d in lower_all("MatMul", &a, &[sa, sb], sy, skew) {
                    // Every module stays under 64 KiB of SPIR-V, the largest block included.
                    let words = compile(&d.wgsl, &d.overrides).unwrap().spirv.len();
                    assert!(words * 4 <= 64 << 10, "{}: {} bytes", d.label, words * 4);
                }
            }
        }
        // Batch dimensions that do not merge: three is one too many.
        let d = lower_all("MatMul", &a, &[&[3, 1, 4, 8], &[2, 8, 4]], &[3, 2, 4, 4], 0);
        assert_eq!(d[0].params[3..9], [6, 2, 32, 0, 0, 32], "batch 6 = 3 x 2");
        let three = [f32s(&[2, 1, 2, 3, 4]), f32s(&[1, 3, 2, 4, 5])];
        let inputs = three.map(|d| Operand::arena(d, 0));
        let outputs = [Operand::arena(f32s(&[2, 3, 2, 3, 5]), 4096)];
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "MatMul",
            name: "m",
            attrs: &a,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).unwrap_err().0.contains("3 batch dimensions"));
    }

    #[test]
    fn register_blocks_read_vectors_where_aligned() {
        let a = post(Attrs::new(), "");
        let d = lower_all("MatMul", &a, &[&[1, 40, 120], &[120, 360]], &[1, 40, 360], 0);
        // 40 rows as 3 blocks of 14, 90 groups of 4 columns as 23 blocks of 4 groups.
        assert_eq!(d[0].label, "matmul_rb14x16_1x40x360x120");
        assert!(d[0].bindings.iter().all(|b| b.ty == "vec4<f32>"));
        assert_eq!(d[0].groups, [9, 1, 1], "69 blocks, 8 per workgroup");
        assert_eq!(
            overrides(&d[0]),
            [
                ("RM", 14.0),
                ("CG", 4.0),
                ("KU", 4.0),
                ("A_MODE", 1.0),
                ("B_MODE", 2.0),
                ("B_SHIFT", 0.0),
                ("WG", 8.0)
            ]
        );
        assert_eq!(d[1].label, "matmul_tile64x64_1x40x360x120");
        let d = lower_all("MatMul", &a, &[&[1, 40, 120], &[120, 360]], &[1, 40, 360], 4);
        assert!(d[0].bindings.iter().all(|b| b.ty == "f32"), "misaligned");
        assert_eq!((set(&d[0], "A_MODE"), set(&d[0], "B_MODE")), (0.0, 0.0));
        // Rows of B not 16-byte aligned: the covering vec4s, shifted by 1 float a row.
        let d = lower_all("MatMul", &a, &[&[40, 120], &[120, 6625]], &[40, 6625], 0);
        let types: Vec<&str> = d[0].bindings.iter().map(|b| b.ty).collect();
        assert_eq!(types, ["vec4<f32>", "vec4<f32>", "f32"]);
        assert_eq!((set(&d[0], "B_MODE"), set(&d[0], "B_SHIFT")), (3.0, 1.0));
        // A transposed (vec4 across rows), B transposed (vec4 along k).
        let g = post(gemm_attrs(1, 1, 1.0, 1.0), "");
        let d = lower_all("Gemm", &g, &[&[8, 12], &[16, 8]], &[12, 16], 0);
        assert_eq!((set(&d[0], "A_MODE"), set(&d[0], "B_MODE")), (2.0, 1.0));
        assert_eq!(set(&d[0], "RM") % 4.0, 0.0, "whole groups of 4 rows");
    }

    #[test]
    fn one_column_is_computed_as_one_row() {
        let a = post(Attrs::new(), "");
        // Y = A b as yᵀ = bᵀ Aᵀ: A's rows become the columns of the block, read along k.
        let d = lower_all("MatMul", &a, &[&[64, 32], &[32, 1]], &[64, 1], 0);
        assert_eq!(d[0].label, "matmul_rb1x4_1x1x64x32");
        let names: Vec<(&str, Slot)> =
            d[0].bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
        assert_eq!(names, [("a", Slot::Input(1)), ("b", Slot::Input(0)), ("y", Slot::Output(0))]);
        assert_eq!((set(&d[0], "A_MODE"), set(&d[0], "B_MODE")), (1.0, 1.0));
        // m, n, k; A's strides (i unused, k), B's (k, j).
        assert_eq!(d[0].params[..3], [1, 64, 32]);
        assert_eq!(d[0].params[9..13], [0, 1, 1, 32]);
    }

    #[test]
    fn gemm_variants_compile() {
        for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            for c in [&[][..], &[16], &[12, 1], &[1, 16], &[12, 16]] {
                let g = post(gemm_attrs(ta, tb, 0.5, 2.0), "Relu");
                let sa: &[usize] = if ta == 1 { &[20, 12] } else { &[12, 20] };
                let sb: &[usize] = if tb == 1 { &[16, 20] } else { &[20, 16] };
                let d = lower_all("Gemm", &g, &[sa, sb, c], &[12, 16], 0);
                let (alpha, beta) = (d[0].params[18], d[0].params[19]);
                assert_eq!((alpha, beta), (0.5f32.to_bits(), 2.0f32.to_bits()));
            }
            let g = post(gemm_attrs(ta, tb, 1.0, 1.0), "");
            lower_all("Gemm", &g, &[&[7, 7], &[7, 7]], &[7, 7], 0);
        }
    }

    #[test]
    fn a_residual_may_be_the_output() {
        let attrs = post(gemm_attrs(0, 1, 1.0, 1.0), "Add,Relu,Mul");
        let desc = |s: &[usize]| f32s(s);
        let inputs = [
            Operand::arena(desc(&[64, 32]), 0),
            Operand::weight(desc(&[48, 32]), 0),
            Operand::weight(desc(&[48]), 1),
            Operand::arena(desc(&[64, 48]), 8192),
            Operand::weight(desc(&[1]), 2),
        ];
        let outputs = [Operand::arena(desc(&[64, 48]), 8192)];
        for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
            let cx = KernelCx {
                class,
                op: "Gemm",
                name: "g",
                attrs: &attrs,
                inputs: &inputs,
                outputs: &outputs,
            };
            assert_eq!(cx.in_place(), Some(3));
            let d = lower(&cx).unwrap();
            compile(&d[0].wgsl, &d[0].overrides).unwrap();
            let names: Vec<&str> = d[0].bindings.iter().map(|b| b.name.as_str()).collect();
            assert_eq!(names, ["a", "b", "y", "c", "r0", "r1"]);
            let file = if class == DeviceClass::Cpu { &BLOCKED } else { &TILED };
            insta::assert_snapshot!(
                format!("gemm_residual_{class:?}").to_lowercase(),
                specialised(&d[0], file)
            );
        }
        // A MatMul's residual: C's slot binds it too, never read.
        let attrs = post(Attrs::new(), "Add");
        let inputs = [
            Operand::arena(desc(&[64, 32]), 0),
            Operand::weight(desc(&[32, 48]), 0),
            Operand::arena(desc(&[64, 48]), 8192),
        ];
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "MatMul",
            name: "m",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        let d = lower(&cx).unwrap();
        compile(&d[0].wgsl, &d[0].overrides).unwrap();
        let slots: Vec<(&str, Slot)> =
            d[0].bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
        assert_eq!(
            slots,
            [
                ("a", Slot::Input(0)),
                ("b", Slot::Input(1)),
                ("y", Slot::Output(0)),
                ("c", Slot::Input(2)),
                ("r0", Slot::Input(2))
            ]
        );
        // Over A instead: no kernel.
        let outputs = [Operand::arena(desc(&[64, 48]), 0)];
        let inputs = [Operand::arena(desc(&[64, 48]), 0), Operand::weight(desc(&[48, 48]), 0)];
        let attrs = post(Attrs::new(), "");
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "MatMul",
            name: "m",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).is_err());
    }

    #[test]
    fn specialised_sources() {
        // The attention products of PP-OCR's recognizer, and its classifier head (shifted B).
        let a = post(Attrs::new(), "");
        let d = lower_all("MatMul", &a, &[&[1, 8, 40, 15], &[1, 8, 15, 40]], &[1, 8, 40, 40], 0);
        insta::assert_snapshot!("attention_cpu", specialised(&d[0], &BLOCKED));
        insta::assert_snapshot!("attention_gpu", specialised(&d[1], &BLOCKED));
        let d = lower_all("MatMul", &a, &[&[1, 40, 120], &[120, 6625]], &[1, 40, 6625], 0);
        insta::assert_snapshot!("shifted_cpu", specialised(&d[0], &BLOCKED));
    }

    #[test]
    fn large_problems_spread_over_two_grid_dimensions() {
        let a = post(Attrs::new(), "");
        let d = lower_all("MatMul", &a, &[&[8192, 4], &[4, 16400]], &[8192, 16400], 0);
        assert_eq!(d[0].groups, [65535, 2, 1], "512 x 1025 blocks, 8 per workgroup");
        // 70000 rows of one column: one row of 70000 columns, skinny on GPUs too.
        let d = lower_all("MatMul", &a, &[&[70000, 1, 4], &[4, 1]], &[70000, 1, 1], 0);
        assert_eq!(d[1].label, "matmul_rb1x4_1x1x70000x4", "GPU: skinny, no tiles");
        assert_eq!(d[1].groups, [274, 1, 1], "17500 blocks, 64 per workgroup");
    }

    #[test]
    fn operands_larger_than_one_binding_are_cut_into_pieces() {
        let slots = |d: &Dispatch| -> Vec<(String, Option<Range<u64>>)> {
            d.bindings.iter().map(|b| (b.name.clone(), b.chunk.clone())).collect()
        };
        let flags = |d: &Dispatch| *d.params.last().unwrap();
        // VGG19's fc6: 1 x 25088 by a transposed 4096 x 25088 weight (411041792 bytes): four
        // pieces of 1024 columns, 102760448 bytes of B each.
        let g = post(gemm_attrs(0, 1, 1.0, 1.0), "Relu");
        let d = lower_all("Gemm", &g, &[&[1, 25088], &[4096, 25088], &[4096]], &[1, 4096], 0);
        assert_eq!(d.len(), 8, "four pieces for each class");
        for (q, d) in d.iter().enumerate() {
            let piece = (q % 4) as u64;
            let b = piece * 102_760_448..(piece + 1) * 102_760_448;
            assert_eq!(
                slots(d),
                [
                    ("a".into(), Some(0..100_352)),
                    ("b".into(), Some(b)),
                    ("y".into(), None),
                    ("c".into(), None)
                ]
            );
            // n, y0 and c0: the piece's columns.
            assert_eq!(d.params[1], 1024);
            assert_eq!(
                (d.params[14], d.params[15]),
                (1024 * q as u32 % 4096, 1024 * q as u32 % 4096)
            );
            assert_eq!(flags(d), 0);
        }
        insta::assert_snapshot!("fc_piece_cpu", specialised(&d[1], &BLOCKED));
        // B [K, N] over one binding: K in two pieces, the second adding onto the first.
        let m = post(Attrs::new(), "");
        let d = lower_all("MatMul", &m, &[&[2, 40000], &[40000, 1024]], &[2, 1024], 0);
        assert_eq!(d.len(), 4);
        assert_eq!(
            d.iter().map(flags).collect::<Vec<_>>(),
            [PARTIAL, ACCUMULATE, PARTIAL, ACCUMULATE]
        );
        assert_eq!(d[1].bindings[1].chunk, Some(81_920_000..163_840_000));
        // A's columns 20000.. of both rows.
        assert_eq!(d[1].bindings[0].chunk, Some(80_000..320_000));
        // The same, N not a multiple of 4 (shifted rows); skewed, B read in floats.
        for skew in [0, 4] {
            let d = lower_all("MatMul", &m, &[&[32, 40000], &[40000, 1023]], &[32, 1023], skew);
            assert_eq!(d.len(), 4);
            assert_eq!(set(&d[0], "B_MODE"), if skew == 0 { 3.0 } else { 0.0 });
        }
        // A over one binding: its rows in two pieces; GPUs tile each.
        let d = lower_all("MatMul", &m, &[&[40000, 900], &[900, 40]], &[40000, 40], 0);
        assert_eq!(d.len(), 4);
        assert_eq!(d[1].bindings[0].chunk, Some(72_000_000..144_000_000));
        assert_eq!(d[1].params[14], 20000 * 40, "y0: the second piece's first row");
        assert_eq!(d[3].label, "matmul_tile64x64_1x20000x40x900");
        // In place over a residual with K in pieces: the first piece would overwrite it.
        let attrs = post(Attrs::new(), "Add");
        let inputs = [
            Operand::arena(f32s(&[2, 40000]), 0),
            Operand::weight(f32s(&[40000, 1024]), 0),
            Operand::arena(f32s(&[2, 1024]), 1 << 20),
        ];
        let outputs = [Operand::arena(f32s(&[2, 1024]), 1 << 20)];
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "MatMul",
            name: "m",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).unwrap_err().0.contains("in place with K in pieces"));
    }

    #[test]
    fn unsupported_configurations_have_no_kernel() {
        let i64s = |s: &[usize]| Operand::arena(TensorDesc::new(DType::I64, s.to_vec()), 0);
        let attrs = post(Attrs::new(), "");
        let inputs = [i64s(&[2, 2]), i64s(&[2, 2])];
        let outputs = [i64s(&[2, 2])];
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "MatMul",
            name: "m",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).is_err());
    }

    #[test]
    fn einsum_sums_the_labels_left_out() {
        let labels = |a: &[i64], b: &[i64], y: &[i64]| {
            Attrs::new()
                .with("input0_labels", AttrValue::Ints(a.to_vec()))
                .with("input1_labels", AttrValue::Ints(b.to_vec()))
                .with("output_labels", AttrValue::Ints(y.to_vec()))
        };
        // bij,bjk->bik: output (b, i, k) = (2, 3, 5), strides in x0 (12, 4, 0) and x1
        // (20, 0, 1); j (4) summed, strides 1 and 5.
        let d = lower_all(
            "Einsum",
            &labels(&[0, 1, 2], &[0, 2, 3], &[0, 1, 3]),
            &[&[2, 3, 4], &[2, 4, 5]],
            &[2, 3, 5],
            0,
        );
        assert_eq!(
            d[0].params,
            [
                30, 2, 3, 5, 1, 1, 4, // count, o1..o3, u0..u2
                0, 12, 4, 0, 0, 0, 1, // x0
                0, 20, 0, 1, 0, 0, 5, // x1
            ]
        );
        insta::assert_snapshot!("einsum_two", specialised(&d[0], &EINSUM));
        // ii-> (a diagonal, summed to a scalar), one operand: stride 3 + 1.
        let diag = Attrs::new()
            .with("input0_labels", AttrValue::Ints(vec![0, 0]))
            .with("output_labels", AttrValue::Ints(vec![]));
        let d = lower_all("Einsum", &diag, &[&[3, 3]], &[], 0);
        assert_eq!(d[0].params[..7], [1, 1, 1, 1, 1, 1, 3]);
        assert_eq!(d[0].params[7..14], [0, 0, 0, 0, 0, 0, 4]);
        assert_eq!(d[0].bindings.len(), 2, "no second operand");
    }
}
