//! Vulkan kernels of the matmul family (ops: ops/src/matmul/cpu.rs): MatMul with numpy's
//! batch broadcasting and 1-D operands, and Gemm (transA, transB, alpha, beta, C broadcast),
//! both with fused post-ops, and Einsum (a plain kernel: one invocation per output element).
//!
//! Both ops become one [`Problem`]: `Y[b, i, j] = alpha * Σ_k A[b, i, k] B[b, k, j]
//! (+ beta * C[i, j])`, each operand addressed through literal strides, then the post-ops.
//! Two kernels compute it:
//! - [`register_blocked`] (CPU-type devices such as lavapipe, and skinny problems anywhere):
//!   each invocation holds a block of Y in registers (up to 16 x 16 on CPU-type devices, 4 x 4
//!   on GPUs) and reads A and B straight from memory, as 16-byte vectors wherever the layout
//!   allows; no workgroup memory, which is slow on CPU-type devices (/work/shared/FACTS.md).
//! - [`tiled`] (GPUs): a workgroup stages BM x BK tiles of A and BK x BN tiles of B in
//!   workgroup memory; each invocation computes 4 x 4 elements strided across the tile, so
//!   neighbouring invocations read neighbouring words of the tiles and of Y.
//!
//! A or B larger than one binding may be (a fully connected weight of several hundred MB) is
//! read through chunk bindings and its `load_a`/`load_b` accessor ([`InputBinding`]).

use crate::no_kernel;
use crate::vulkan::post::PostOps;
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, MAX_GROUPS, NoKernel, f32_lit,
};
use crate::vulkan::{InputBinding, Operand, header};
use std::fmt::Write;

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    if cx.outputs.len() != 1 {
        return Err(no_kernel!("{} with {} outputs", cx.op, cx.outputs.len()));
    }
    if cx.op == "Einsum" {
        return einsum(cx);
    }
    let post = PostOps::new(cx, if cx.op == "Gemm" { 3 } else { 2 })?;
    let own = cx
        .inputs
        .len()
        .checked_sub(post.bindings().len())
        .ok_or_else(|| no_kernel!("{} lacks its post-op operands", cx.op))?;
    if let Some(k) = cx.in_place().filter(|&k| k < own) {
        return Err(no_kernel!("{} written over its input {k}", cx.op));
    }
    let p = match cx.op {
        "MatMul" if own == 2 => Problem::matmul(cx)?,
        "Gemm" if own == 2 || own == 3 => Problem::gemm(cx, own == 3)?,
        op => return Err(no_kernel!("no Vulkan kernel for {op} with {own} inputs")),
    };
    let out = &cx.outputs[0];
    if out.desc.elements() == 0 {
        return Ok(Vec::new());
    }
    if p.k == 0 {
        return Err(no_kernel!("{} with an empty inner dimension", cx.op));
    }
    if out.desc.elements() != p.batch * p.m * p.n {
        return Err(no_kernel!(
            "{} output {:?} does not fit",
            cx.op,
            out.desc.shape
        ));
    }
    // Every index is a u32 in WGSL.
    if cx
        .inputs
        .iter()
        .chain(cx.outputs)
        .any(|o| o.desc.elements() >= 1 << 31)
    {
        return Err(no_kernel!(
            "{} operands too large for 32-bit indices",
            cx.op
        ));
    }
    let tiles = cx.class == DeviceClass::Gpu
        && p.m >= 16
        && p.n >= 16
        && p.k >= 16
        && p.batch <= MAX_GROUPS as usize;
    let d = if tiles {
        tiled(cx, &p, &post)?
    } else {
        register_blocked(cx, &p, &post)?
    };
    Ok(vec![d])
}

/// One (possibly batched) matrix product, every layout a literal.
#[derive(Debug)]
struct Problem {
    /// Output batch shape, flattened count.
    batch_shape: Vec<usize>,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Layout,
    b: Layout,
    alpha: f32,
    /// Gemm's C: beta, row stride, column stride (0 where broadcast).
    c: Option<(f32, usize, usize)>,
}

/// Where element (b, r, c) of an operand is: `Σ batch index * batch stride + r * rows +
/// c * cols` (r, c are i, k for A and k, j for B).
#[derive(Debug)]
struct Layout {
    /// One stride per output batch dimension (0 where the operand broadcasts).
    batch: Vec<usize>,
    rows: usize,
    cols: usize,
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
        let mut batch_shape = Vec::with_capacity(rank);
        for i in 0..rank {
            let (da, db) = (dim(&ba, i), dim(&bb, i));
            if da != db && da != 1 && db != 1 {
                return Err(no_kernel!("MatMul batch dimensions of {sa:?} and {sb:?}"));
            }
            batch_shape.push(da.max(db));
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
        Ok(Problem {
            batch: batch_shape.iter().product(),
            a: Layout {
                batch: strides(&ba, m * k),
                rows: k,
                cols: 1,
            },
            b: Layout {
                batch: strides(&bb, k * n),
                rows: n,
                // A 1-D B is one column: no column stride (it then reads as k-contiguous).
                cols: usize::from(sb.len() > 1),
            },
            batch_shape,
            m,
            n,
            k,
            alpha: 1.0,
            c: None,
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
        let ((m, k), (kb, n)) = (
            if ta { (a1, a0) } else { (a0, a1) },
            if tb { (b1, b0) } else { (b0, b1) },
        );
        if k != kb {
            return Err(no_kernel!("Gemm of {sa:?} and {sb:?}"));
        }
        // A logical R x C matrix stored as [R, C], or as [C, R] when transposed.
        let layout = |t: bool, r: usize, c: usize| Layout {
            batch: vec![],
            rows: if t { 1 } else { c },
            cols: if t { r } else { 1 },
        };
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
            batch_shape: vec![],
            batch: 1,
            m,
            n,
            k,
            // A is (M, K) read at [i, k]; B is (K, N) read at [k, j].
            a: layout(ta, m, k),
            b: layout(tb, k, n),
            alpha: float("alpha")?,
            c,
        })
    }
}

impl Layout {
    /// The WGSL u32 expression of the offset of batch `bi` (a u32 expression).
    fn batch_offset(&self, batch_shape: &[usize], bi: &str) -> String {
        index_offset(bi, batch_shape, &self.batch)
    }

    /// Whether every batch stride is a multiple of 4 floats.
    fn batch_vec4(&self) -> bool {
        self.batch.iter().all(|s| s.is_multiple_of(4))
    }
}

/// The WGSL u32 expression of the offset, under `strides`, of the row-major index `i` (a u32
/// expression) of `shape`.
fn index_offset(i: &str, shape: &[usize], strides: &[usize]) -> String {
    let total: usize = shape.iter().product();
    let mut terms = Vec::new();
    let mut inner = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != 0 {
            let q = match inner {
                1 => i.to_string(),
                _ => format!("({i} / {inner}u)"),
            };
            let q = match inner * d == total {
                true => q,
                false => format!("({q} % {d}u)"),
            };
            terms.push(if s == 1 { q } else { format!("{q} * {s}u") });
        }
        inner *= d;
    }
    match terms.is_empty() {
        true => "0u".into(),
        false => terms.join(" + "),
    }
}

/// A u32 literal.
fn u(v: usize) -> String {
    format!("{v}u")
}

/// `base + expr * stride`, leaving out what is zero or one.
fn plus(base: &str, expr: &str, stride: usize) -> String {
    match stride {
        0 => base.to_string(),
        1 => format!("{base} + {expr}"),
        s => format!("{base} + {expr} * {s}u"),
    }
}

/// A and B as arrays of `f32` or `vec4<f32>`, in chunks when larger than one binding may be
/// (a large weight): each chunk holds whole elements, which is all the accessor needs.
fn operands(
    cx: &KernelCx,
    a_vec: bool,
    b_vec: bool,
) -> Result<(InputBinding, InputBinding), NoKernel> {
    let read = |name, k, vec: bool| {
        let (ty, unit) = if vec { ("vec4<f32>", 16) } else { ("f32", 4) };
        InputBinding::new(name, k, ty, &cx.inputs[k], unit)
    };
    Ok((read("a", 0, a_vec)?, read("b", 1, b_vec)?))
}

/// The bindings: A, B, C when present, the post-op operands, Y.
fn bindings(
    p: &Problem,
    post: &PostOps,
    a: &InputBinding,
    b: &InputBinding,
    y: &'static str,
) -> Vec<Binding> {
    let mut v = [&a.bindings[..], &b.bindings[..]].concat();
    if p.c.is_some() {
        v.push(Binding::input("c", 2, "f32"));
    }
    v.extend(post.bindings());
    v.push(Binding::output("y", 0, y));
    v
}

/// The statements that turn the sum `acc` of element (i, j) at linear output index `idx` into
/// its final value `v` (alpha, beta * C, post-ops).
fn epilogue(
    p: &Problem,
    post: &PostOps,
    acc: &str,
    v: &str,
    i: &str,
    j: &str,
    idx: &str,
) -> String {
    let mut s = String::new();
    let scaled = if p.alpha == 1.0 {
        acc.to_string()
    } else {
        format!("{acc} * {}", f32_lit(p.alpha))
    };
    let _ = write!(s, "var {v} = {scaled}");
    if let Some((beta, rs, cs)) = p.c {
        let at = plus(&plus("offsets.c", i, rs), j, cs);
        let _ = write!(s, " + {} * c[{at}]", f32_lit(beta));
    }
    s.push_str(";\n");
    s.push_str(&post.apply(v, idx));
    s
}

/// How the kernel reads one operand.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Read {
    /// One float at a time.
    Scalar,
    /// vec4s along k (four k steps of one row of A or column of B).
    AlongK,
    /// vec4s along the output's rows of A (i) or columns of B (j), one k at a time.
    Across,
    /// B's rows, contiguous but not 16-byte aligned (N not a multiple of 4): the aligned
    /// vec4s that cover a row's block, shifted by the row's offset, which is a constant for
    /// each of four consecutive k.
    Shifted,
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
        if p.a.rows == 1 && p.m.is_multiple_of(4) {
            rm = rm.next_multiple_of(4);
        }
        let cg = if p.n == 1 {
            1
        } else {
            balanced(groups, cg_max)
        };
        let blocks = p.batch * p.m.div_ceil(rm) * groups.div_ceil(cg);
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

/// Each invocation computes rows i0..i0+RM and columns j0..j0+RN of one batch's Y in
/// registers ([`block_shape`]): RN is 1 (for N = 1) or 4 CG columns, held as CG vec4s.
///
/// On CPU-type devices every load from a storage buffer costs a loop over the SIMD lanes
/// whatever its width, so the kernel reads vec4s wherever the layout allows and holds a
/// block large enough that each loaded value feeds several multiply-adds.
fn register_blocked(cx: &KernelCx, p: &Problem, post: &PostOps) -> Result<Dispatch, NoKernel> {
    let (a_op, b_op, y_op) = (&cx.inputs[0], &cx.inputs[1], &cx.outputs[0]);
    let (rm, cg) = block_shape(p, cx.class);
    let rn = if p.n == 1 { 1 } else { 4 * cg };
    let k4 = p.k.is_multiple_of(4);
    let vec = |o: &Operand, l: &Layout, stride: usize| {
        o.aligned16() && l.batch_vec4() && stride.is_multiple_of(4)
    };
    // A is read along k when its rows are contiguous, across rows when its columns are.
    let a_read = if p.a.cols == 1 && k4 && vec(a_op, &p.a, p.a.rows) {
        Read::AlongK
    } else if p.a.rows == 1
        && rm.is_multiple_of(4)
        && p.m.is_multiple_of(4)
        && vec(a_op, &p.a, p.a.cols)
    {
        Read::Across
    } else {
        Read::Scalar
    };
    let b_read = if p.b.cols == 1 && rn >= 4 && p.n.is_multiple_of(4) && vec(b_op, &p.b, p.b.rows) {
        Read::Across
    } else if p.b.rows == 1 && k4 && vec(b_op, &p.b, p.b.cols) {
        Read::AlongK
    } else if p.b.cols == 1 && rn >= 4 && k4 && b_op.aligned16() && p.b.batch_vec4() {
        Read::Shifted
    } else {
        Read::Scalar
    };
    let y_vec = rn >= 4 && p.n.is_multiple_of(4) && y_op.aligned16();
    let ty = |v: bool| if v { "vec4<f32>" } else { "f32" };
    let (a, b) = operands(cx, a_read != Read::Scalar, b_read != Read::Scalar)?;
    let bindings = bindings(p, post, &a, &b, ty(y_vec));
    let (ao, bo) = (a.base(), b.base());
    let (mb, nb) = (p.m.div_ceil(rm), p.n.div_ceil(rn));
    let total = p.batch * mb * nb;
    // Small workgroups on CPU-type devices: few, large blocks still spread over the cores.
    let wg = match cx.class {
        DeviceClass::Cpu => 8,
        _ => 64,
    };
    let grid = Grid::new(total as u64, wg)?;
    let ku = if k4 { 4 } else { 1 };
    let acc_ty = ty(rn >= 4);
    let comp = ["x", "y", "z", "w"];

    let mut s = header(&bindings) + &a.accessor + &b.accessor;
    let _ = writeln!(s, "\n{} {{", grid.entry());
    let _ = writeln!(s, "    let t = {};", grid.index());
    let _ = writeln!(s, "    if (t >= {}) {{ return; }}", u(total));
    let _ = writeln!(s, "    let j0 = (t % {}) * {};", u(nb), u(rn));
    let _ = writeln!(s, "    let i0 = ((t / {}) % {}) * {};", u(nb), u(mb), u(rm));
    let _ = writeln!(s, "    let bi = t / {};", u(nb * mb));
    let _ = writeln!(
        s,
        "    let ab = {};",
        p.a.batch_offset(&p.batch_shape, "bi")
    );
    let _ = writeln!(
        s,
        "    let bb = {};",
        p.b.batch_offset(&p.batch_shape, "bi")
    );
    // Row/column starts, clamped to the matrix: the tail block recomputes the last rows or
    // columns and does not store them.
    let row = |r: usize| format!("min(i0 + {}, {})", u(r), u(p.m - 1));
    let col = |c: usize| format!("min(j0 + {}, {})", u(c), u(p.n - 1));
    match a_read {
        Read::AlongK => {
            for r in 0..rm {
                let at = plus("ab", &row(r), p.a.rows);
                let _ = writeln!(s, "    let ar{r} = {ao} + ({at}) / 4u;");
            }
        }
        Read::Across => {
            let _ = writeln!(s, "    let ar = {ao} + (ab + i0) / 4u;");
        }
        // (A is never read shifted.)
        Read::Scalar | Read::Shifted => {
            for r in 0..rm {
                let at = plus(&format!("{ao} + ab"), &row(r), p.a.rows);
                let _ = writeln!(s, "    let ar{r} = {at};");
            }
        }
    }
    match b_read {
        Read::Across => {
            for h in 0..cg {
                let j = format!("min(j0 + {}, {})", u(4 * h), u(p.n - 4));
                let _ = writeln!(s, "    let bc{h} = {bo} + (bb + {j}) / 4u;");
            }
        }
        Read::AlongK => {
            for c in 0..rn {
                let at = plus("bb", &col(c), p.b.cols);
                let _ = writeln!(s, "    let bc{c} = {bo} + ({at}) / 4u;");
            }
        }
        Read::Shifted => {
            let _ = writeln!(s, "    let bq = {bo} + (bb + j0) / 4u;");
            // The block's last vec4s may pass the end of B (their columns are not stored).
            let last = b_op.desc.elements() / 4 - 1;
            let _ = writeln!(s, "    let blast = {bo} + {};", u(last));
        }
        Read::Scalar => {
            for c in 0..rn {
                let at = plus(&format!("{bo} + bb"), &col(c), p.b.cols);
                let _ = writeln!(s, "    let bc{c} = {at};");
            }
        }
    }
    for r in 0..rm {
        for h in 0..cg {
            let _ = writeln!(s, "    var acc{r}_{h} = {acc_ty}(0.0);");
        }
    }
    let _ = writeln!(s, "    for (var kk = 0u; kk < {}; kk++) {{", u(p.k / ku));
    let _ = writeln!(s, "        let k = kk * {};", u(ku));
    let kt = |t: usize| match t {
        0 => "k".to_string(),
        t => format!("(k + {})", u(t)),
    };
    if a_read == Read::AlongK {
        for r in 0..rm {
            let _ = writeln!(s, "        let av{r} = {};", a.at(&format!("ar{r} + kk")));
        }
    }
    if b_read == Read::AlongK {
        for c in 0..rn {
            let _ = writeln!(s, "        let bv{c} = {};", b.at(&format!("bc{c} + kk")));
        }
    }
    for t in 0..ku {
        // Row k + t of B starts `shift` floats into a vec4 (k is a multiple of 4).
        let (first, shift) = ((t * p.b.rows) / 4, (t * p.b.rows) % 4);
        if b_read == Read::Shifted {
            for q in 0..cg + usize::from(shift > 0) {
                let at = plus("bq", "kk", p.b.rows);
                let at = format!("min({at} + {}, blast)", u(first + q));
                let _ = writeln!(s, "        let q{t}_{q} = {};", b.at(&at));
            }
        }
        // B's row at k + t over the block's columns: vec4s (or one float).
        for h in 0..cg {
            let cols = (4 * h..(4 * h + 4).min(rn)).collect::<Vec<_>>();
            let b_row = match b_read {
                Read::Across => b.at(&plus(&format!("bc{h}"), &kt(t), p.b.rows / 4)),
                Read::Shifted if shift == 0 => format!("q{t}_{h}"),
                Read::Shifted => (4 * h + shift..4 * h + shift + 4)
                    .map(|i| format!("q{t}_{}.{}", i / 4, comp[i % 4]))
                    .collect::<Vec<_>>()
                    .join(", "),
                Read::AlongK => cols
                    .iter()
                    .map(|c| format!("bv{c}.{}", comp[t]))
                    .collect::<Vec<_>>()
                    .join(", "),
                Read::Scalar => cols
                    .iter()
                    .map(|c| b.at(&plus(&format!("bc{c}"), &kt(t), p.b.rows)))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let b_row = match b_read {
                Read::Shifted if shift == 0 => b_row,
                Read::AlongK | Read::Scalar | Read::Shifted if rn >= 4 => {
                    format!("vec4<f32>({b_row})")
                }
                _ => b_row,
            };
            let _ = writeln!(s, "        let b{t}_{h} = {b_row};");
        }
        if a_read == Read::Across {
            for g in 0..rm / 4 {
                let at = plus("ar", &kt(t), p.a.cols / 4);
                let at = format!("{at} + {}", u(g));
                let _ = writeln!(s, "        let a{t}_{g} = {};", a.at(&at));
            }
        }
        for r in 0..rm {
            let a = match a_read {
                Read::AlongK => format!("av{r}.{}", comp[t]),
                Read::Across => format!("a{t}_{}.{}", r / 4, comp[r % 4]),
                Read::Scalar | Read::Shifted => a.at(&plus(&format!("ar{r}"), &kt(t), p.a.cols)),
            };
            for h in 0..cg {
                let _ = writeln!(s, "        acc{r}_{h} += {a} * b{t}_{h};");
            }
        }
    }
    s.push_str("    }\n");
    // The epilogue, row by row, column group by group.
    let _ = writeln!(s, "    let yb = bi * {};", u(p.m * p.n));
    for r in 0..rm {
        let _ = writeln!(s, "    if (i0 + {} < {}) {{", u(r), u(p.m));
        let _ = writeln!(s, "        let i = i0 + {};", u(r));
        let _ = writeln!(s, "        let yr = yb + i * {};", u(p.n));
        for h in 0..cg {
            let c0 = 4 * h;
            if y_vec {
                // N is a multiple of 4: a group is wholly inside or outside.
                let _ = writeln!(s, "        if (j0 + {} < {}) {{", u(c0), u(p.n));
            }
            let mut values = Vec::new();
            for c in c0..(c0 + 4).min(rn) {
                let acc = match rn {
                    1 => format!("acc{r}_{h}"),
                    _ => format!("acc{r}_{h}.{}", comp[c - c0]),
                };
                let (j, idx) = (format!("(j0 + {})", u(c)), format!("(yr + j0 + {})", u(c)));
                let body = epilogue(p, post, &acc, &format!("v{c}"), "i", &j, &idx);
                if y_vec {
                    s.push_str(&indent(&body, 3));
                } else {
                    let _ = writeln!(s, "        if (j0 + {} < {}) {{", u(c), u(p.n));
                    s.push_str(&indent(&body, 3));
                    let _ = writeln!(s, "            y[offsets.y + {idx}] = v{c};");
                    s.push_str("        }\n");
                }
                values.push(format!("v{c}"));
            }
            if y_vec {
                let _ = writeln!(
                    s,
                    "            y[offsets.y + (yr + j0 + {}) / 4u] = vec4<f32>({});",
                    u(c0),
                    values.join(", ")
                );
                s.push_str("        }\n");
            }
        }
        s.push_str("    }\n");
    }
    s.push_str("}\n");
    Ok(Dispatch {
        label: format!(
            "{}_rb{rm}x{rn}_{}x{}x{}x{}",
            cx.op.to_lowercase(),
            p.batch,
            p.m,
            p.n,
            p.k
        ),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    })
}

/// Einsum from its canonical labels (ops/src/matmul/cpu.rs): one invocation per output
/// element, looping over the labels that are summed. A label's stride in an operand is the
/// sum of the strides of the operand's axes that carry it (a repeated label is a diagonal),
/// 0 where the operand has it with size 1 (broadcast).
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
    let size = |l: &i64| {
        sizes
            .get(l)
            .copied()
            .ok_or_else(|| no_kernel!("Einsum label {l}"))
    };
    let shape = out_labels.iter().map(size).collect::<Result<Vec<_>, _>>()?;
    let y = &cx.outputs[0];
    if y.desc.shape != shape {
        return Err(no_kernel!(
            "Einsum makes {shape:?}, the step declares {:?}",
            y.desc.shape
        ));
    }
    let n = y.desc.elements();
    if n == 0 {
        return Ok(Vec::new());
    }
    if cx.inputs.iter().any(|x| x.desc.elements() == 0) {
        return Err(no_kernel!("Einsum of an empty operand"));
    }
    let summed: Vec<i64> = sizes
        .keys()
        .copied()
        .filter(|l| !out_labels.contains(l))
        .collect();
    let summed_shape = summed.iter().map(size).collect::<Result<Vec<_>, _>>()?;
    let names = ["x0", "x1"];
    let mut bindings: Vec<Binding> = (0..operands.len())
        .map(|i| Binding::input(names[i], i, "f32"))
        .collect();
    bindings.push(Binding::output("y", 0, "f32"));
    let grid = Grid::new(n as u64, 64)?;
    let mut s = header(&bindings);
    let _ = writeln!(s, "\n{} {{", grid.entry());
    let _ = writeln!(s, "    let i = {};", grid.index());
    let _ = writeln!(s, "    if (i >= {}) {{ return; }}", u(n));
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
    let total: usize = summed_shape.iter().product();
    let mut product = Vec::new();
    for (k, name) in names.iter().enumerate().take(operands.len()) {
        let at = index_offset("i", &shape, &strides_of(k, out_labels));
        let _ = writeln!(s, "    let o{k} = offsets.{name} + {at};");
        let inner = index_offset("j", &summed_shape, &strides_of(k, &summed));
        product.push(format!("{name}[o{k} + {inner}]"));
    }
    let _ = writeln!(s, "    var acc = 0.0;");
    let _ = writeln!(s, "    for (var j = 0u; j < {}; j++) {{", u(total));
    let _ = writeln!(s, "        acc += {};\n    }}", product.join(" * "));
    s.push_str("    y[offsets.y + i] = acc;\n}\n");
    Ok(vec![Dispatch {
        label: format!("einsum_{n}x{total}"),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
}

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Indents every line of `s` by `level` * 4 spaces.
fn indent(s: &str, level: usize) -> String {
    let pad = " ".repeat(level * 4);
    s.lines()
        .map(|l| format!("{pad}{}\n", l.trim_start()))
        .collect()
}

/// Shared-memory tiles: a workgroup of TX x TY invocations computes a BM x BN tile of one
/// batch's Y (BM = 4 TY, BN = 4 TX), staging BK steps of A and B at a time; invocation
/// (tx, ty) owns rows ty + r TY and columns tx + c TX, r and c in 0..4.
fn tiled(cx: &KernelCx, p: &Problem, post: &PostOps) -> Result<Dispatch, NoKernel> {
    let bm = if p.m > 32 { 64 } else { 32 };
    let bn = if p.n > 32 { 64 } else { 32 };
    let bk = 16;
    let (tx, ty) = (bn / 4, bm / 4);
    let threads = tx * ty;
    let (a, b) = operands(cx, false, false)?;
    let bindings = bindings(p, post, &a, &b, "f32");
    let groups = [p.n.div_ceil(bn), p.m.div_ceil(bm), p.batch];
    if groups.iter().any(|&g| g > MAX_GROUPS as usize) {
        return Err(no_kernel!("{} too large for one dispatch", cx.op));
    }
    let mut s = header(&bindings) + &a.accessor + &b.accessor;
    let _ = writeln!(s, "var<workgroup> ta: array<f32, {}>;", bk * bm);
    let _ = writeln!(s, "var<workgroup> tb: array<f32, {}>;", bk * bn);
    let _ = writeln!(
        s,
        "\n@compute @workgroup_size({tx}, {ty})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, \
         @builtin(local_invocation_id) lid: vec3<u32>) {{"
    );
    let _ = writeln!(s, "    let tid = lid.y * {} + lid.x;", u(tx));
    let _ = writeln!(s, "    let bi = wg.z;");
    let _ = writeln!(s, "    let m0 = wg.y * {};", u(bm));
    let _ = writeln!(s, "    let n0 = wg.x * {};", u(bn));
    let _ = writeln!(
        s,
        "    let ab = {} + {};",
        a.base(),
        p.a.batch_offset(&p.batch_shape, "bi")
    );
    let _ = writeln!(
        s,
        "    let bb = {} + {};",
        b.base(),
        p.b.batch_offset(&p.batch_shape, "bi")
    );
    for r in 0..4 {
        let _ = writeln!(s, "    var acc{r} = vec4<f32>(0.0);");
    }
    let _ = writeln!(
        s,
        "    for (var k0 = 0u; k0 < {}; k0 += {}) {{",
        u(p.k),
        u(bk)
    );
    // Each tile is loaded with consecutive invocations on consecutive addresses: along the
    // operand's contiguous dimension.
    let load = |s: &mut String,
                tile: &str,
                src: &InputBinding,
                base: &str,
                l: &Layout,
                outer: usize,
                is_a: bool| {
        // (outer index, k): A is (i, k), B is (j, k) in its layout's (cols, rows) terms.
        let (o_stride, k_stride) = if is_a {
            (l.rows, l.cols)
        } else {
            (l.cols, l.rows)
        };
        let along_k = k_stride == 1;
        let limit = if is_a { p.m } else { p.n };
        let start = if is_a { "m0" } else { "n0" };
        for q in 0..(outer * bk / threads) {
            let _ = writeln!(s, "        {{");
            let _ = writeln!(s, "            let l = tid + {};", u(q * threads));
            if along_k {
                let _ = writeln!(
                    s,
                    "            let o = l / {}; let kq = l % {};",
                    u(bk),
                    u(bk)
                );
            } else {
                let _ = writeln!(
                    s,
                    "            let o = l % {}; let kq = l / {};",
                    u(outer),
                    u(outer)
                );
            }
            let _ = writeln!(s, "            let go = {start} + o; let gk = k0 + kq;");
            let at = plus(
                &plus(base, &format!("min(go, {})", u(limit - 1)), o_stride),
                &format!("min(gk, {})", u(p.k - 1)),
                k_stride,
            );
            let _ = writeln!(
                s,
                "            {tile}[kq * {} + o] = select(0.0, {}, go < {} && gk < {});",
                u(outer),
                src.at(&at),
                u(limit),
                u(p.k)
            );
            let _ = writeln!(s, "        }}");
        }
    };
    load(&mut s, "ta", &a, "ab", &p.a, bm, true);
    load(&mut s, "tb", &b, "bb", &p.b, bn, false);
    s.push_str("        workgroupBarrier();\n");
    let _ = writeln!(s, "        for (var kq = 0u; kq < {}; kq++) {{", u(bk));
    let row: Vec<String> = (0..4)
        .map(|r| format!("ta[kq * {} + lid.y + {}]", u(bm), u(r * ty)))
        .collect();
    let col: Vec<String> = (0..4)
        .map(|c| format!("tb[kq * {} + lid.x + {}]", u(bn), u(c * tx)))
        .collect();
    let _ = writeln!(s, "            let av = vec4<f32>({});", row.join(", "));
    let _ = writeln!(s, "            let bv = vec4<f32>({});", col.join(", "));
    let comp = ["x", "y", "z", "w"];
    for (r, c) in comp.iter().enumerate() {
        let _ = writeln!(s, "            acc{r} += av.{c} * bv;");
    }
    s.push_str("        }\n        workgroupBarrier();\n    }\n");
    let _ = writeln!(s, "    let yb = bi * {};", u(p.m * p.n));
    for r in 0..4 {
        let _ = writeln!(s, "    {{");
        let _ = writeln!(s, "        let i = m0 + lid.y + {};", u(r * ty));
        for (c, comp) in comp.iter().enumerate() {
            let _ = writeln!(s, "        {{");
            let _ = writeln!(s, "            let j = n0 + lid.x + {};", u(c * tx));
            let _ = writeln!(s, "            let idx = yb + i * {} + j;", u(p.n));
            let _ = writeln!(s, "            if (i < {} && j < {}) {{", u(p.m), u(p.n));
            let body = epilogue(p, post, &format!("acc{r}.{comp}"), "v", "i", "j", "idx");
            s.push_str(&indent(&body, 4));
            let _ = writeln!(s, "                y[offsets.y + idx] = v;");
            s.push_str("            }\n        }\n");
        }
        s.push_str("    }\n");
    }
    s.push_str("}\n");
    Ok(Dispatch {
        label: format!(
            "{}_tile{bm}x{bn}_{}x{}x{}x{}",
            cx.op.to_lowercase(),
            p.batch,
            p.m,
            p.n,
            p.k
        ),
        wgsl: s,
        groups: groups.map(|g| g as u32),
        bindings,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::compile;
    use ingot_schema::{AttrValue, Attrs, DType};

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

    /// Lowers `op` for both device classes (see `lower_f32_all_classes`), `skew` bytes off
    /// 16-byte alignment.
    fn lower_all(
        op: &str,
        attrs: &Attrs,
        inputs: &[&[usize]],
        out: &[usize],
        skew: u64,
    ) -> Vec<Dispatch> {
        crate::vulkan::lower_f32_all_classes(lower, op, attrs, inputs, &[out], skew)
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
        ];
        for &(sa, sb, sy) in cases {
            for skew in [0, 4] {
                lower_all("MatMul", &a, &[sa, sb], sy, skew);
            }
        }
    }

    #[test]
    fn register_blocks_read_vectors_where_aligned() {
        let a = post(Attrs::new(), "");
        let d = lower_all(
            "MatMul",
            &a,
            &[&[1, 40, 120], &[120, 360]],
            &[1, 40, 360],
            0,
        );
        // 40 rows as 3 blocks of 14, 90 groups of 4 columns as 23 blocks of 4 groups.
        assert_eq!(d[0].label, "matmul_rb14x16_1x40x360x120");
        assert!(d[0].bindings.iter().all(|b| b.ty == "vec4<f32>"));
        assert_eq!(d[0].groups, [9, 1, 1], "69 blocks, 8 per workgroup");
        assert_eq!(d[1].label, "matmul_tile64x64_1x40x360x120");
        let d = lower_all(
            "MatMul",
            &a,
            &[&[1, 40, 120], &[120, 360]],
            &[1, 40, 360],
            4,
        );
        assert!(d[0].bindings.iter().all(|b| b.ty == "f32"), "misaligned");
        // Rows of B not 16-byte aligned: the covering vec4s, shifted.
        let d = lower_all("MatMul", &a, &[&[40, 120], &[120, 6625]], &[40, 6625], 0);
        let types: Vec<&str> = d[0].bindings.iter().map(|b| b.ty).collect();
        assert_eq!(types, ["vec4<f32>", "vec4<f32>", "f32"]);
        assert!(
            d[0].wgsl
                .contains("vec4<f32>(q1_0.y, q1_0.z, q1_0.w, q1_1.x)"),
            "row k + 1 starts 1 float in"
        );
        // A transposed (vec4 across rows), B transposed (vec4 along k).
        let g = post(gemm_attrs(1, 1, 1.0, 1.0), "");
        let d = lower_all("Gemm", &g, &[&[8, 12], &[16, 8]], &[12, 16], 0);
        assert!(d[0].wgsl.contains("let a0_0 = a[") && d[0].wgsl.contains("let bv3 = b["));
    }

    #[test]
    fn gemm_variants_compile() {
        for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            for c in [&[][..], &[16], &[12, 1], &[1, 16], &[12, 16]] {
                let g = post(gemm_attrs(ta, tb, 0.5, 2.0), "Relu");
                let sa: &[usize] = if ta == 1 { &[20, 12] } else { &[12, 20] };
                let sb: &[usize] = if tb == 1 { &[16, 20] } else { &[20, 16] };
                let d = lower_all("Gemm", &g, &[sa, sb, c], &[12, 16], 0);
                assert!(d[0].wgsl.contains("f32(0.5)") && d[0].wgsl.contains("f32(2.0)"));
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
            compile(&d[0].wgsl, &[]).unwrap();
            let names: Vec<&str> = d[0].bindings.iter().map(|b| b.name.as_str()).collect();
            assert_eq!(names, ["a", "b", "c", "r0", "r1", "y"]);
            assert!(d[0].wgsl.contains("r1[offsets.r1]"), "scalar operand");
        }
        // Over A instead: no kernel.
        let outputs = [Operand::arena(desc(&[64, 48]), 0)];
        let inputs = [
            Operand::arena(desc(&[64, 48]), 0),
            Operand::weight(desc(&[48, 48]), 0),
        ];
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
    fn large_problems_spread_over_two_grid_dimensions() {
        let a = post(Attrs::new(), "");
        let d = lower_all("MatMul", &a, &[&[8192, 4], &[4, 16400]], &[8192, 16400], 0);
        assert_eq!(
            d[0].groups,
            [65535, 2, 1],
            "512 x 1025 blocks, 8 per workgroup"
        );
        assert!(d[0].wgsl.contains("gid.y"));
        let d = lower_all("MatMul", &a, &[&[70000, 1, 4], &[4, 1]], &[70000, 1, 1], 0);
        assert_eq!(
            d[1].label, "matmul_rb1x1_70000x1x1x4",
            "GPU: skinny, no tiles"
        );
    }

    #[test]
    fn weights_larger_than_one_binding_are_read_in_chunks() {
        let names =
            |d: &Dispatch| -> Vec<String> { d.bindings.iter().map(|b| b.name.clone()).collect() };
        // VGG19's fc6: 1 x 25088 by a transposed 4096 x 25088 weight (411041792 bytes, 4
        // chunks of vec4s along k).
        let g = post(gemm_attrs(0, 1, 1.0, 1.0), "Relu");
        let d = lower_all(
            "Gemm",
            &g,
            &[&[1, 25088], &[4096, 25088], &[4096]],
            &[1, 4096],
            0,
        );
        for d in &d {
            assert_eq!(names(d), ["a", "b_0", "b_1", "b_2", "b_3", "c", "y"]);
            assert_eq!(d.bindings[4].chunk, Some(308_281_344..411_041_792));
            assert!(d.wgsl.contains("fn load_b(i: u32) -> vec4<f32>"));
            assert!(!d.wgsl.contains("b["), "B is only read through load_b");
        }
        // B along its rows, scalar (misaligned), and not a multiple of 4 wide (shifted);
        // A over one binding too; the GPU class tiles the large problems.
        let m = post(Attrs::new(), "");
        for (sa, sb, sy) in [
            (&[2, 40000][..], &[40000, 1024][..], &[2, 1024][..]),
            (&[32, 40000], &[40000, 1023], &[32, 1023]),
            (&[40000, 900], &[900, 40], &[40000, 40]),
        ] {
            for skew in [0, 4] {
                let d = lower_all("MatMul", &m, &[sa, sb], sy, skew);
                assert!(
                    d.iter().all(|d| d.bindings.len() == 4),
                    "{:?}",
                    names(&d[0])
                );
            }
        }
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
        // bij,bjk->bik
        let d = lower_all(
            "Einsum",
            &labels(&[0, 1, 2], &[0, 2, 3], &[0, 1, 3]),
            &[&[2, 3, 4], &[2, 4, 5]],
            &[2, 3, 5],
            0,
        );
        assert!(
            d[0].wgsl.contains("for (var j = 0u; j < 4u; j++)"),
            "{}",
            d[0].wgsl
        );
        assert!(d[0].wgsl.contains("x0[o0 + j * 1u]") || d[0].wgsl.contains("x0[o0 + j]"));
        // ii-> (a diagonal, summed to a scalar), one operand.
        let diag = Attrs::new()
            .with("input0_labels", AttrValue::Ints(vec![0, 0]))
            .with("output_labels", AttrValue::Ints(vec![]));
        let d = lower_all("Einsum", &diag, &[&[3, 3]], &[], 0);
        assert!(d[0].wgsl.contains("x0[o0 + j * 4u]"), "{}", d[0].wgsl);
    }
}
