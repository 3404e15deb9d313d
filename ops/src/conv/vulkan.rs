//! Vulkan kernels of the conv family (ops: ops/src/conv/cpu.rs): Conv and ConvTranspose
//! in float32 for 1, 2 and 3 spatial dimensions, any group count, with fused post-ops.
//!
//! Geometries are lifted to 3-D with leading unit dimensions, as on the CPU; the literal unit
//! extents cost nothing once the driver folds them. Weights are read in their ONNX layout
//! (Conv `[M, C/group, k..]`, ConvTranspose `[C, M/group, k..]`). Four kernels:
//! - [`pointwise`] (1x1, stride 1, unpadded, one group; CPU-type devices): a GEMM
//!   `Y[m, p] = Σ_c W[m, c] X[c, p]`, each invocation a block of output channels x 16 pixels
//!   held in registers, X, W and Y accessed as 16-byte vectors where aligned.
//! - [`direct`] (depthwise convs everywhere, other convs on CPU-type devices): each invocation
//!   holds output channels x output rows x consecutive outputs; for each input channel it
//!   loads the input span of every input row those outputs reach once (aligned vectors where
//!   rows allow) and applies every tap that reads it. Depthwise convs take one channel and a
//!   larger spatial block.
//! - [`tiled`] (pointwise and general convs on GPUs, and shapes the others do not fit): an
//!   implicit GEMM whose workgroup stages 64x16 tiles of W and of the (never materialised)
//!   im2col matrix in workgroup memory.
//! - [`transposed_kernel`] (ConvTranspose): like [`direct`], but each output gathers from the
//!   input positions whose taps reach it; blocks start at a multiple of the stride, so which
//!   taps reach which column of the block is fixed when the kernel is made.
//!
//! On CPU-type devices (lavapipe) every load or store of an invocation is a loop over the SIMD
//! lanes, which costs far more than the arithmetic: the register-blocked kernels exist to do
//! as much arithmetic per load as registers allow, and none uses workgroup memory (FACTS.md).
//! Blocks whose rows or columns run past the output read clamped (valid) addresses and skip
//! the store. Post-ops are applied to each element right before it is stored, which also makes
//! running over the residual of a leading `Add` safe: nothing else reads the output.

use crate::no_kernel;
use crate::vulkan::post::PostOps;
use crate::vulkan::{Binding, DeviceClass, Dispatch, Grid, KernelCx, MAX_GROUPS, NoKernel, header};
use std::fmt::Write;

/// Spatial dimensions of the lifted geometry.
const DIMS: usize = 3;

/// Appends one formatted line of WGSL.
macro_rules! emit {
    ($s:expr, $($arg:tt)*) => {{
        let _ = writeln!($s, $($arg)*);
    }};
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    let post = PostOps::new(cx, 3)?;
    let operands = post.bindings().len();
    let own = cx
        .inputs
        .len()
        .checked_sub(operands)
        .filter(|&own| own == 3 || (own == 2 && operands == 0))
        .ok_or_else(|| no_kernel!("{} with {} inputs", cx.op, cx.inputs.len()))?;
    if let Some(k) = cx.in_place().filter(|&k| k < own) {
        return Err(no_kernel!("{} written over its input {k}", cx.op));
    }
    let transposed = match cx.op {
        "Conv" => false,
        "ConvTranspose" => true,
        op => return Err(no_kernel!("no Vulkan kernel for {op}")),
    };
    if cx.outputs.first().is_some_and(|y| y.desc.elements() == 0) {
        return Ok(Vec::new());
    }
    let geo = Geo::new(cx, transposed, own == 3)?;
    let gpu = cx.class == DeviceClass::Gpu;
    let d = if transposed {
        Some(transposed_kernel(cx, &geo, &post)?)
    } else if geo.cin == 1 {
        direct(cx, &geo, &post, DEPTHWISE)?
    } else if gpu {
        tiled(&geo, &post)
    } else if geo.pointwise() {
        Some(pointwise(cx, &geo, &post, POINTWISE)?)
    } else {
        direct(cx, &geo, &post, GENERAL)?
    };
    // The fallbacks: spans too wide for registers, or grids too large for the tiles.
    let d = match d.or_else(|| tiled(&geo, &post)) {
        Some(d) => d,
        None => direct(cx, &geo, &post, GENERAL)?
            .ok_or_else(|| no_kernel!("{} {}: no kernel fits its shapes", cx.op, cx.name))?,
    };
    Ok(vec![d])
}

/// The shapes and window of one step, lifted to [`DIMS`] spatial dimensions; every value fits
/// the 32-bit arithmetic of the kernels (checked in [`Geo::new`]).
#[derive(Clone, Debug)]
struct Geo {
    batch: u32,
    groups: u32,
    /// Input channels per group.
    cin: u32,
    /// Output channels per group.
    cout: u32,
    input: [u32; DIMS],
    output: [u32; DIMS],
    kernel: [u32; DIMS],
    strides: [u32; DIMS],
    dilations: [u32; DIMS],
    /// Padding at the start of each dimension (the end padding only sets the output extent).
    pads: [i32; DIMS],
    bias: bool,
}

/// Every index and coordinate the kernels compute stays below this.
const LIMIT: i64 = 1 << 31;

impl Geo {
    fn new(cx: &KernelCx, transposed: bool, bias: bool) -> Result<Geo, NoKernel> {
        let bad = |what: &str| no_kernel!("{} {}: {what}", cx.op, cx.name);
        let shape = |o: &crate::vulkan::Operand| -> Vec<i64> {
            o.desc.shape.iter().map(|&d| d as i64).collect()
        };
        let (x, w, y) = match (cx.inputs, cx.outputs.first()) {
            ([x, w, ..], Some(y)) => (shape(x), shape(w), shape(y)),
            _ => return Err(bad("missing operands")),
        };
        let rank = x.len().wrapping_sub(2);
        if !(1..=DIMS).contains(&rank) || w.len() != x.len() || y.len() != x.len() {
            return Err(bad("operands need the same rank, 3 to 5"));
        }
        if x.contains(&0) || w.contains(&0) {
            return Err(bad("empty input or weights"));
        }
        if cx
            .inputs
            .iter()
            .chain(cx.outputs)
            .any(|o| o.desc.elements() as i64 >= LIMIT)
        {
            return Err(bad("operands too large for 32-bit indices"));
        }
        let attr = |name: &str| -> Result<Vec<i64>, NoKernel> {
            cx.attrs
                .ints(name)
                .map(<[i64]>::to_vec)
                .map_err(|e| bad(&e.to_string()))
        };
        let (kernel, strides, dilations, pads) = (
            attr("kernel_shape")?,
            attr("strides")?,
            attr("dilations")?,
            attr("pads")?,
        );
        let groups = cx.attrs.int("group").map_err(|e| bad(&e.to_string()))?;
        let small = |v: &[i64], lo: i64| v.iter().all(|&v| v >= lo && v < 1 << 16);
        if kernel != w[2..]
            || strides.len() != rank
            || dilations.len() != rank
            || pads.len() != 2 * rank
            || !small(&strides, 1)
            || !small(&dilations, 1)
            || !small(&kernel, 1)
            || pads.iter().any(|p| p.abs() >= 1 << 20)
            || groups < 1
            || x[1] % groups != 0
        {
            return Err(bad("inconsistent attributes"));
        }
        let cin = x[1] / groups;
        let (w_in, cout) = if transposed {
            (w[0], w[1])
        } else {
            (w[1] * groups, w[0] / groups)
        };
        if w_in != x[1] || (!transposed && w[0] % groups != 0) || y[1] != cout * groups {
            return Err(bad("channels do not match"));
        }
        if bias && cx.inputs[2].desc.shape != [(cout * groups) as usize] {
            return Err(bad("bias does not match the output channels"));
        }
        for d in 0..rank {
            let extent = (kernel[d] - 1) * dilations[d] + 1;
            let out = if transposed {
                strides[d] * (x[d + 2] - 1) + extent - pads[d] - pads[rank + d]
            } else {
                let room = x[d + 2] + pads[d] + pads[rank + d] - extent;
                if room < 0 { -1 } else { room / strides[d] + 1 }
            };
            // Bounds the kernels' coordinate arithmetic in either direction.
            let reach = (x[d + 2] + y[d + 2]) * strides[d] + extent + pads[d].abs();
            if out != y[d + 2] || reach >= LIMIT {
                return Err(bad("output extents do not match the window"));
            }
        }
        let lift = |v: &[i64], fill: i64| -> [i64; DIMS] {
            let mut out = [fill; DIMS];
            out[DIMS - v.len()..].copy_from_slice(v);
            out
        };
        let u = |v: [i64; DIMS]| v.map(|v| v as u32);
        Ok(Geo {
            batch: x[0] as u32,
            groups: groups as u32,
            cin: cin as u32,
            cout: cout as u32,
            input: u(lift(&x[2..], 1)),
            output: u(lift(&y[2..], 1)),
            kernel: u(lift(&kernel, 1)),
            strides: u(lift(&strides, 1)),
            dilations: u(lift(&dilations, 1)),
            pads: lift(&pads[..rank], 0).map(|p| p as i32),
            bias,
        })
    }

    fn in_plane(&self) -> u32 {
        self.input.iter().product()
    }

    fn out_plane(&self) -> u32 {
        self.output.iter().product()
    }

    fn taps(&self) -> u32 {
        self.kernel.iter().product()
    }

    /// A 1x1 conv with stride 1 and no padding in one group: a plain GEMM.
    fn pointwise(&self) -> bool {
        self.groups == 1
            && self.kernel == [1; DIMS]
            && self.strides == [1; DIMS]
            && self.pads == [0; DIMS]
            && self.input == self.output
    }

    /// The bindings every kernel starts with: x, w, the bias, y (of the given element types),
    /// then the post-ops' operands.
    fn bindings(&self, post: &PostOps, [x_ty, w_ty, y_ty]: [&'static str; 3]) -> Vec<Binding> {
        let mut b = vec![Binding::input("x", 0, x_ty), Binding::input("w", 1, w_ty)];
        if self.bias {
            b.push(Binding::input("b", 2, "f32"));
        }
        b.push(Binding::output("y", 0, y_ty));
        b.extend(post.bindings());
        b
    }

    /// The WGSL expression of output channel `row`'s bias (a u32 expression, counted over
    /// all groups), or zero.
    fn bias_expr(&self, row: &str) -> String {
        if self.bias {
            format!("b[offsets.b + {row}]")
        } else {
            "0.0".into()
        }
    }
}

fn vec_type(v: bool) -> &'static str {
    if v { "vec4<f32>" } else { "f32" }
}

/// The outputs one invocation of a register-blocked kernel holds: `rows` output channels x
/// `ys` rows x `vecs` 4-wide vectors of consecutive positions; its accumulators are `lines()`
/// lines (channel-major) of `vecs` vectors.
#[derive(Clone, Copy, Debug)]
struct Block {
    rows: u32,
    /// Output rows (1 in [`pointwise`], whose positions are whole planes).
    ys: u32,
    vecs: u32,
}

impl Block {
    fn cols(self) -> u32 {
        4 * self.vecs
    }

    fn lines(self) -> u32 {
        self.rows * self.ys
    }
}

/// Block shapes per kernel, each field's candidates largest first; [`Shape::fit`] picks one
/// per step. Chosen by measurement on lavapipe, where every load and store costs a loop over
/// the SIMD lanes: the larger the block, the more arithmetic per load, until register spills
/// and JIT time grow (/work/shared/FACTS.md).
#[derive(Clone, Copy, Debug)]
struct Shape {
    rows: &'static [u32],
    ys: &'static [u32],
    vecs: &'static [u32],
}

const POINTWISE: Shape = Shape {
    rows: &[24, 16, 12, 8],
    ys: &[1],
    vecs: &[4],
};
const GENERAL: Shape = Shape {
    rows: &[8, 6, 4],
    ys: &[4, 3, 2],
    vecs: &[2],
};
const DEPTHWISE: Shape = Shape {
    rows: &[1],
    ys: &[8, 6, 4],
    vecs: &[4, 3, 2],
};
const TRANSPOSED: Shape = Shape {
    rows: &[8, 6, 4],
    ys: &[2],
    vecs: &[2],
};

impl Shape {
    /// The block for `channels` output channels per group, output rows of `cols` positions,
    /// `rows` of them.
    fn fit(self, channels: u32, rows: u32, cols: u32) -> Block {
        Block {
            rows: fit(self.rows, channels),
            ys: fit(self.ys, rows),
            vecs: fit(self.vecs, cols.div_ceil(4)),
        }
    }
}

/// The candidate that pads `extent` least (the first of equals), at most `extent`.
fn fit(candidates: &[u32], extent: u32) -> u32 {
    let extent = extent.max(1);
    let padding = |&c: &u32| extent.div_ceil(c) * c - extent;
    candidates
        .iter()
        .copied()
        .min_by_key(padding)
        .unwrap_or(1)
        .min(extent)
}

/// Invocations per workgroup of the register-blocked kernels: at most, and at least (a
/// multiple of the 8 SIMD lanes lavapipe runs at once).
const WORKGROUP: u32 = 64;
const MIN_WORKGROUP: u32 = 8;

/// The accumulator of row `i`, vector `j`.
fn acc(i: u32, j: u32) -> String {
    format!("a{i}_{j}")
}

/// Declares the accumulators, each line starting at its channel's bias (`row(i)`: channel
/// `i` of the block as a u32 expression).
fn init_block(s: &mut String, geo: &Geo, block: Block, row: impl Fn(u32) -> String) {
    for i in 0..block.rows {
        emit!(
            s,
            "    let bias{i} = vec4<f32>({});",
            geo.bias_expr(&row(i))
        );
    }
    for l in 0..block.lines() {
        for j in 0..block.vecs {
            emit!(s, "    var {} = bias{};", acc(l, j), l / block.ys);
        }
    }
}

/// Stores the accumulators: line `l`, column `c` is output element `at(l) + c`; line `l`
/// exists when `row_ok(l)` (None: always) and column `c` when `c < left` (None: always). With
/// `vec`, `at(l)` is a multiple of 4 and each vector lies wholly inside or outside the row.
fn store_block(
    s: &mut String,
    post: &PostOps,
    block: Block,
    vec: bool,
    row_ok: impl Fn(u32) -> Option<String>,
    at: impl Fn(u32) -> String,
    left: Option<&str>,
) {
    for i in 0..block.lines() {
        let ok = row_ok(i);
        if let Some(ok) = &ok {
            emit!(s, "    if ({ok}) {{");
        }
        emit!(s, "    {{ let e = {};", at(i));
        for j in 0..block.vecs {
            let a = acc(i, j);
            if vec {
                match left {
                    Some(left) => emit!(s, "    if ({}u < {left}) {{", 4 * j),
                    None => emit!(s, "    {{"),
                }
                emit!(s, "    var o = {a};");
                for (c, lane) in LANES.iter().enumerate() {
                    s.push_str(
                        &post.apply(&format!("o.{lane}"), &format!("e + {}u", 4 * j + c as u32)),
                    );
                }
                emit!(s, "    y[offsets.y + e / 4u + {j}u] = o;");
                emit!(s, "    }}");
            } else {
                for (c, lane) in LANES.iter().enumerate() {
                    let col = 4 * j + c as u32;
                    match left {
                        Some(left) => emit!(s, "    if ({col}u < {left}) {{"),
                        None => emit!(s, "    {{"),
                    }
                    emit!(s, "    var o = {a}.{lane};");
                    s.push_str(&post.apply("o", &format!("e + {col}u")));
                    emit!(s, "    y[offsets.y + e + {col}u] = o;");
                    emit!(s, "    }}");
                }
            }
        }
        emit!(s, "    }}");
        if ok.is_some() {
            emit!(s, "    }}");
        }
    }
}

/// Splits the invocation index `i` into the named coordinates, fastest first.
fn split_index(s: &mut String, parts: &[(&str, u32)]) {
    emit!(s, "    var t = i;");
    for (k, (name, extent)) in parts.iter().enumerate() {
        if k + 1 == parts.len() {
            emit!(s, "    let {name} = t;");
        } else {
            emit!(s, "    let {name} = t % {extent}u;");
            emit!(s, "    t = t / {extent}u;");
        }
    }
}

/// A register-blocked kernel's dispatch: `invocations` threads, `body` after the bounds check
/// of the linear index `i`. Small dispatches get small workgroups, so that every core of a
/// CPU-type device gets some.
fn blocked_dispatch(
    label: String,
    bindings: Vec<Binding>,
    invocations: u64,
    body: &str,
) -> Result<Dispatch, NoKernel> {
    let mut workgroup = WORKGROUP;
    while workgroup > MIN_WORKGROUP && invocations < 8 * u64::from(workgroup) {
        workgroup /= 2;
    }
    let grid = Grid::new(invocations, workgroup)?;
    let wgsl = format!(
        "{}\n{} {{\n    let i = {};\n    if (i >= {invocations}u) {{ return; }}\n{body}}}\n",
        header(&bindings),
        grid.entry(),
        grid.index()
    );
    Ok(Dispatch {
        label,
        wgsl,
        groups: grid.groups,
        bindings,
        ..Default::default()
    })
}

/// The 1x1 conv as a register-blocked GEMM over the pixels `p` of each image:
/// `Y[n, m, p] = B[m] + Σ_c W[m, c] X[n, c, p]`.
fn pointwise(cx: &KernelCx, geo: &Geo, post: &PostOps, shape: Shape) -> Result<Dispatch, NoKernel> {
    let (m, k, p) = (geo.cout, geo.cin, geo.out_plane());
    let block = shape.fit(m, 1, p);
    let (rows, cols) = (block.rows, block.cols());
    // 16-byte loads and stores need rows of whole vectors that start aligned.
    let x_vec = p.is_multiple_of(4) && cx.inputs[0].aligned16();
    let w_vec = k.is_multiple_of(4) && cx.inputs[1].aligned16();
    let y_vec = p.is_multiple_of(4) && cx.outputs[0].aligned16();
    let (pb, mb) = (p.div_ceil(cols), m.div_ceil(rows));
    let bindings = geo.bindings(post, [x_vec, w_vec, y_vec].map(vec_type));
    let mut s = String::new();
    split_index(&mut s, &[("pb", pb), ("mb", mb), ("n", geo.batch)]);
    emit!(s, "    let p0 = pb * {cols}u;");
    for i in 0..rows {
        emit!(s, "    let row{i} = min(mb * {rows}u + {i}u, {}u);", m - 1);
        let wk = if w_vec { k / 4 } else { k };
        emit!(s, "    let w{i}o = offsets.w + row{i} * {wk}u;");
    }
    init_block(&mut s, geo, block, |i| format!("row{i}"));
    // Columns past the image read its last vector (or pixel) instead.
    let ragged = !p.is_multiple_of(cols);
    let (lanes, unit) = if x_vec { (block.vecs, 4) } else { (cols, 1) };
    for c in 0..lanes {
        if ragged {
            emit!(
                s,
                "    let q{c} = min(p0 / {unit}u + {c}u, {}u);",
                p / unit - 1
            );
        } else {
            emit!(s, "    let q{c} = p0 / {unit}u + {c}u;");
        }
    }
    emit!(s, "    let xo = offsets.x + n * {}u;", k * p / unit);
    // One step of the reduction over input channel `c + kk`.
    let step = |s: &mut String, kk: u32, w: &dyn Fn(u32) -> String| {
        emit!(s, "    {{ let xc = xo + (c + {kk}u) * {}u;", p / unit);
        for j in 0..block.vecs {
            let v = if x_vec {
                format!("x[xc + q{j}]")
            } else {
                let l: Vec<String> = (0..4).map(|l| format!("x[xc + q{}]", 4 * j + l)).collect();
                format!("vec4<f32>({})", l.join(", "))
            };
            emit!(s, "    let x{j} = {v};");
        }
        for i in 0..rows {
            let wv = w(i);
            for j in 0..block.vecs {
                let a = acc(i, j);
                emit!(s, "    {a} = fma(vec4<f32>({wv}), x{j}, {a});");
            }
        }
        emit!(s, "    }}");
    };
    let k4 = k - k % 4;
    if k4 > 0 {
        emit!(s, "    for (var c = 0u; c < {k4}u; c += 4u) {{");
        for i in 0..rows {
            if w_vec {
                emit!(s, "    let wv{i} = w[w{i}o + c / 4u];");
            } else {
                emit!(
                    s,
                    "    let wv{i} = vec4<f32>(w[w{i}o + c], w[w{i}o + c + 1u], w[w{i}o + c + 2u], w[w{i}o + c + 3u]);"
                );
            }
        }
        for (kk, lane) in LANES.iter().enumerate() {
            step(&mut s, kk as u32, &|i| format!("wv{i}.{lane}"));
        }
        emit!(s, "    }}");
    }
    if k4 < k {
        emit!(s, "    for (var c = {k4}u; c < {k}u; c += 1u) {{");
        step(&mut s, 0, &|i| format!("w[w{i}o + c]"));
        emit!(s, "    }}");
    }
    let left = ragged.then(|| format!("{p}u - p0"));
    store_block(
        &mut s,
        post,
        block,
        y_vec,
        |i| (!m.is_multiple_of(rows)).then(|| format!("mb * {rows}u + {i}u < {m}u")),
        |i| format!("(n * {m}u + row{i}) * {p}u + p0"),
        left.as_deref(),
    );
    let invocations = u64::from(pb) * u64::from(mb) * u64::from(geo.batch);
    blocked_dispatch(
        format!("conv_pointwise_{m}x{k}x{p}"),
        bindings,
        invocations,
        &s,
    )
}

/// Direct convolution: each invocation holds `block.rows` output channels of one group x
/// `block.ys` output rows x `block.cols()` consecutive outputs along the rows. For each input
/// channel it walks the input rows those outputs reach, loads the span of each row once (as
/// aligned 16-byte vectors when rows allow) and applies every tap that reads it. None when
/// a span is too wide for registers.
fn direct(
    cx: &KernelCx,
    geo: &Geo,
    post: &PostOps,
    shape: Shape,
) -> Result<Option<Dispatch>, NoKernel> {
    let [od, oh, ow] = geo.output;
    let [id, ih, iw] = geo.input;
    let [kd, kh, kw] = geo.kernel;
    let [sd, sh, sw] = geo.strides;
    let [dd, dh, dw] = geo.dilations;
    let [pd, ph, pw] = geo.pads;
    let (cin, cout, groups) = (geo.cin, geo.cout, geo.groups);
    let block = shape.fit(cout, oh, ow);
    let Block { rows, ys, vecs } = block;
    let cols = block.cols();
    let span = (cols - 1) * sw + (kw - 1) * dw + 1;
    if span > MAX_SPAN {
        return Ok(None);
    }
    let (in_plane, out_plane, taps) = (geo.in_plane(), geo.out_plane(), geo.taps());
    // Vector loads need rows of whole vectors; `ox0 * sw` is then a multiple of 4 too.
    let x_vec = iw.is_multiple_of(4) && cx.inputs[0].aligned16();
    let y_vec = ow.is_multiple_of(4) && cx.outputs[0].aligned16();
    // Four input channels' weights are whole vectors of each row.
    let w_vec = cin.is_multiple_of(4) && kd == 1 && cx.inputs[1].aligned16();
    let unit = if x_vec { 4 } else { 1 };
    let (xb, yb, mb) = (ow.div_ceil(cols), oh.div_ceil(ys), cout.div_ceil(rows));
    let bindings = geo.bindings(post, [x_vec, w_vec, y_vec].map(vec_type));
    let mut s = String::new();
    split_index(
        &mut s,
        &[
            ("xb", xb),
            ("yb", yb),
            ("oz", od),
            ("mb", mb),
            ("g", groups),
            ("n", geo.batch),
        ],
    );
    emit!(s, "    let ox0 = xb * {cols}u;");
    emit!(s, "    let oy0 = yb * {ys}u;");
    for i in 0..rows {
        // Output channel over all groups; its weights start at w{i}o.
        emit!(
            s,
            "    let row{i} = g * {cout}u + min(mb * {rows}u + {i}u, {}u);",
            cout - 1
        );
        let row_len = if w_vec { cin * taps / 4 } else { cin * taps };
        emit!(s, "    let w{i}o = offsets.w + row{i} * {row_len}u;");
    }
    // Line l of the block is output channel l / ys, output row l % ys.
    init_block(&mut s, geo, block, |i| format!("row{i}"));
    // Where the span of input columns `ix0 + t` (t < span) is read from, and whether it lies
    // inside the row (else it is padding, read as zero).
    // ix0 = 4 * (ox0 * sw / 4) - pw: the span starts `lead` elements into vector `first`.
    let (first, lead) = ((-pw).div_euclid(4), (-pw).rem_euclid(4) as u32);
    let elem: Box<dyn Fn(u32) -> String> = if x_vec {
        let vectors = (lead + span).div_ceil(4);
        for k in 0..vectors {
            emit!(
                s,
                "    let vq{k} = i32(ox0 * {sw}u / 4u) + ({}i);",
                first + k as i32
            );
            emit!(s, "    let vv{k} = vq{k} >= 0i && vq{k} < {}i;", iw / 4);
            emit!(s, "    let vc{k} = u32(clamp(vq{k}, 0i, {}i));", iw / 4 - 1);
        }
        Box::new(move |t| format!("u{}.{}", (lead + t) / 4, LANES[((lead + t) % 4) as usize]))
    } else {
        emit!(s, "    let ix0 = i32(ox0 * {sw}u) - ({pw}i);");
        for t in 0..span {
            emit!(s, "    let c{t} = ix0 + {t}i;");
            emit!(s, "    let v{t} = c{t} >= 0i && c{t} < {iw}i;");
            emit!(s, "    let q{t} = u32(clamp(c{t}, 0i, {}i));", iw - 1);
        }
        Box::new(|t| format!("s{t}"))
    };
    emit!(
        s,
        "    let xg = offsets.x + (n * {groups}u + g) * {}u;",
        cin * in_plane / unit
    );
    // Input row j (from the block's first) feeds output row r through kernel row ky when
    // j = r * sh + ky * dh.
    let mut feeds: Vec<(u32, Vec<(u32, u32)>)> = Vec::new();
    for r in 0..ys {
        for ky in 0..kh {
            let j = r * sh + ky * dh;
            match feeds.iter_mut().find(|(k, _)| *k == j) {
                Some((_, f)) => f.push((r, ky)),
                None => feeds.push((j, vec![(r, ky)])),
            }
        }
    }
    feeds.sort_by_key(|(j, _)| *j);
    // The weights of `chunk` input channels: as vectors when they tile W's rows (the
    // channel's taps are then at static places in them), else one load per tap.
    let chunk = if w_vec { 4 } else { 1 };
    let weight = |i: u32, cc: u32, t: u32| -> String {
        if w_vec {
            let f = cc * taps + t;
            format!("wv{i}_{}.{}", f / 4, LANES[(f % 4) as usize])
        } else {
            format!("w{i}_{t}")
        }
    };
    emit!(s, "    for (var ci = 0u; ci < {cin}u; ci += {chunk}u) {{");
    for cc in 0..chunk {
        emit!(
            s,
            "    let xc{cc} = xg + (ci + {cc}u) * {}u;",
            in_plane / unit
        );
        if w_vec {
            // The vectors holding this channel's taps not loaded for the previous channel.
            for i in 0..rows {
                for k in (cc * taps).div_ceil(4)..((cc + 1) * taps).div_ceil(4) {
                    emit!(
                        s,
                        "    let wv{i}_{k} = w[w{i}o + ci / 4u * {taps}u + {k}u];"
                    );
                }
            }
        }
        emit!(s, "    for (var kz = 0u; kz < {kd}u; kz += 1u) {{");
        emit!(s, "    let iz = i32(oz * {sd}u + kz * {dd}u) - ({pd}i);");
        emit!(s, "    if (iz < 0i || iz >= {id}i) {{ continue; }}");
        if !w_vec {
            emit!(s, "    let wz = (ci * {kd}u + kz) * {}u;", kh * kw);
            for i in 0..rows {
                for t in 0..kh * kw {
                    emit!(s, "    let w{i}_{t} = w[w{i}o + wz + {t}u];");
                }
            }
        }
        for (j, uses) in &feeds {
            // Rows outside the input read a row inside and zero it (a branch costs more).
            emit!(s, "    {{ let iy = i32(oy0 * {sh}u + {j}u) - ({ph}i);");
            emit!(s, "    let ry = iy >= 0i && iy < {ih}i;");
            emit!(
                s,
                "    let xr = xc{cc} + (u32(iz) * {ih}u + u32(clamp(iy, 0i, {}i))) * {}u;",
                ih - 1,
                iw / unit
            );
            if x_vec {
                for k in 0..(lead + span).div_ceil(4) {
                    emit!(
                        s,
                        "    let u{k} = select(vec4<f32>(0.0), x[xr + vc{k}], vv{k} && ry);"
                    );
                }
            } else {
                for t in 0..span {
                    emit!(s, "    let s{t} = select(0.0, x[xr + q{t}], v{t} && ry);");
                }
            }
            for &(r, ky) in uses {
                for kx in 0..kw {
                    for v in 0..vecs {
                        let l: Vec<String> =
                            (0..4).map(|c| elem((4 * v + c) * sw + kx * dw)).collect();
                        emit!(s, "    {{ let xv = vec4<f32>({});", l.join(", "));
                        for i in 0..rows {
                            let a = acc(i * ys + r, v);
                            let wt = weight(i, cc, ky * kw + kx);
                            emit!(s, "    {a} = fma(vec4<f32>({wt}), xv, {a});");
                        }
                        emit!(s, "    }}");
                    }
                }
            }
            emit!(s, "    }}");
        }
        emit!(s, "    }}");
    }
    emit!(s, "    }}");
    let left = (!ow.is_multiple_of(cols)).then(|| format!("{ow}u - ox0"));
    store_block(
        &mut s,
        post,
        block,
        y_vec,
        |l| {
            let (i, r) = (l / ys, l % ys);
            let mut ok = Vec::new();
            if !cout.is_multiple_of(rows) {
                ok.push(format!("mb * {rows}u + {i}u < {cout}u"));
            }
            if !oh.is_multiple_of(ys) {
                ok.push(format!("oy0 + {r}u < {oh}u"));
            }
            (!ok.is_empty()).then(|| ok.join(" && "))
        },
        |l| {
            format!(
                "(n * {}u + row{}) * {out_plane}u + (oz * {oh}u + oy0 + {}u) * {ow}u + ox0",
                cout * groups,
                l / ys,
                l % ys
            )
        },
        left.as_deref(),
    );
    let invocations = [xb, yb, od, mb, groups, geo.batch]
        .iter()
        .map(|&v| u64::from(v))
        .product();
    let kind = if cin == 1 { "depthwise" } else { "direct" };
    blocked_dispatch(
        format!("conv_{kind}_{}x{}x{kd}x{kh}x{kw}", cout * groups, cin),
        bindings,
        invocations,
        &s,
    )
    .map(Some)
}

/// The widest input span (in elements) [`direct`] keeps in registers.
const MAX_SPAN: u32 = 64;

const LANES: [&str; 4] = ["x", "y", "z", "w"];

/// Tile sizes of [`tiled`]: output channels x positions x reduction, for 16x16 invocations
/// that each compute 4x4 outputs.
const TM: u32 = 64;
const TN: u32 = 64;
const TK: u32 = 16;

/// The implicit-GEMM kernel for GPUs: `Y_g[m, p] = Σ_k W_g[m, k] · col_g[k, p]` with
/// k = (input channel, tap), the im2col matrix `col` read from X on the fly. None when the
/// grid does not fit one dispatch (the caller falls back to a register-blocked kernel).
fn tiled(geo: &Geo, post: &PostOps) -> Option<Dispatch> {
    let [_, oh, ow] = geo.output;
    let [id, ih, iw] = geo.input;
    let [_, kh, kw] = geo.kernel;
    let [sd, sh, sw] = geo.strides;
    let [dd, dh, dw] = geo.dilations;
    let [pd, ph, pw] = geo.pads;
    let (cin, cout, groups) = (geo.cin, geo.cout, geo.groups);
    let (in_plane, p, taps) = (geo.in_plane(), geo.out_plane(), geo.taps());
    let k = cin * taps;
    let groups_xyz = [
        u64::from(p.div_ceil(TN)),
        u64::from(cout.div_ceil(TM)),
        u64::from(geo.batch) * u64::from(groups),
    ];
    if groups_xyz.iter().any(|&g| g > u64::from(MAX_GROUPS)) {
        return None;
    }
    let bindings = geo.bindings(post, ["f32"; 3]);
    let mut s = header(&bindings);
    emit!(s, "var<workgroup> ta: array<f32, {}>;", TM * TK);
    emit!(s, "var<workgroup> tb: array<f32, {}>;", TK * TN);
    // Element (kk, p) of image n's im2col matrix in group g, or 0 outside it.
    emit!(s, "fn col(n: u32, g: u32, kk: u32, p: u32) -> f32 {{");
    if geo.pointwise() {
        emit!(
            s,
            "    let at = (n * {groups}u + g) * {}u + min(kk, {}u) * {p}u + min(p, {}u);",
            cin * in_plane,
            k - 1,
            p - 1
        );
        emit!(
            s,
            "    return select(0.0, x[offsets.x + at], kk < {k}u && p < {p}u);"
        );
    } else {
        emit!(s, "    let ci = kk / {taps}u;");
        emit!(s, "    let t = kk % {taps}u;");
        emit!(
            s,
            "    let iz = i32((p / {}u) * {sd}u + (t / {}u) * {dd}u) - ({pd}i);",
            oh * ow,
            kh * kw
        );
        emit!(
            s,
            "    let iy = i32((p / {ow}u % {oh}u) * {sh}u + (t / {kw}u % {kh}u) * {dh}u) - ({ph}i);"
        );
        emit!(
            s,
            "    let ix = i32((p % {ow}u) * {sw}u + (t % {kw}u) * {dw}u) - ({pw}i);"
        );
        emit!(
            s,
            "    let ok = kk < {k}u && p < {p}u && iz >= 0i && iz < {id}i && iy >= 0i && iy < {ih}i && ix >= 0i && ix < {iw}i;"
        );
        emit!(
            s,
            "    let at = ((n * {groups}u + g) * {cin}u + min(ci, {}u)) * {in_plane}u + (u32(clamp(iz, 0i, {}i)) * {ih}u + u32(clamp(iy, 0i, {}i))) * {iw}u + u32(clamp(ix, 0i, {}i));",
            cin - 1,
            id - 1,
            ih - 1,
            iw - 1
        );
        emit!(s, "    return select(0.0, x[offsets.x + at], ok);");
    }
    emit!(s, "}}");
    emit!(s, "@compute @workgroup_size(16, 16)");
    emit!(
        s,
        "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>, @builtin(local_invocation_index) lx: u32) {{"
    );
    emit!(s, "    let n = wg.z / {groups}u;");
    emit!(s, "    let g = wg.z % {groups}u;");
    emit!(s, "    let m0 = wg.y * {TM}u;");
    emit!(s, "    let p0 = wg.x * {TN}u;");
    for i in 0..4 {
        emit!(s, "    var a{i} = vec4<f32>(0.0);");
    }
    emit!(s, "    for (var k0 = 0u; k0 < {k}u; k0 += {TK}u) {{");
    // 256 invocations stage 1024 elements of each tile, 4 each.
    for r in 0..(TM * TK / 256) {
        emit!(s, "    {{ let e = lx + {}u;", 256 * r);
        emit!(s, "    let am = m0 + e / {TK}u;");
        emit!(s, "    let ak = k0 + e % {TK}u;");
        emit!(
            s,
            "    ta[(e % {TK}u) * {TM}u + e / {TK}u] = select(0.0, w[offsets.w + (g * {cout}u + min(am, {}u)) * {k}u + min(ak, {}u)], am < {cout}u && ak < {k}u);",
            cout - 1,
            k - 1
        );
        emit!(s, "    tb[e] = col(n, g, k0 + e / {TN}u, p0 + e % {TN}u);");
        emit!(s, "    }}");
    }
    emit!(s, "    workgroupBarrier();");
    emit!(s, "    for (var kk = 0u; kk < {TK}u; kk += 1u) {{");
    emit!(
        s,
        "    let wa = vec4<f32>(ta[kk * {TM}u + li.y], ta[kk * {TM}u + li.y + 16u], ta[kk * {TM}u + li.y + 32u], ta[kk * {TM}u + li.y + 48u]);"
    );
    emit!(
        s,
        "    let xb = vec4<f32>(tb[kk * {TN}u + li.x], tb[kk * {TN}u + li.x + 16u], tb[kk * {TN}u + li.x + 32u], tb[kk * {TN}u + li.x + 48u]);"
    );
    for (i, lane) in LANES.iter().enumerate() {
        emit!(s, "    a{i} = fma(vec4<f32>(wa.{lane}), xb, a{i});");
    }
    emit!(s, "    }}");
    emit!(s, "    workgroupBarrier();");
    emit!(s, "    }}");
    // Invocation (x, y) holds rows y + 16 i and columns x + 16 j: neighbours store neighbours.
    for i in 0..4u32 {
        emit!(s, "    {{ let m = m0 + li.y + {}u;", 16 * i);
        emit!(s, "    if (m < {cout}u) {{");
        emit!(s, "    let r = g * {cout}u + m;");
        emit!(s, "    let bias = {};", geo.bias_expr("r"));
        for (j, lane) in LANES.iter().enumerate() {
            emit!(s, "    {{ let p = p0 + li.x + {}u;", 16 * j);
            emit!(s, "    if (p < {p}u) {{");
            emit!(s, "    let e = (n * {}u + r) * {p}u + p;", cout * groups);
            emit!(s, "    var o = a{i}.{lane} + bias;");
            s.push_str(&post.apply("o", "e"));
            emit!(s, "    y[offsets.y + e] = o;");
            emit!(s, "    }} }}");
        }
        emit!(s, "    }} }}");
    }
    emit!(s, "}}");
    Some(Dispatch {
        label: format!("conv_tiled_{}x{k}x{p}", cout * groups),
        wgsl: s,
        groups: groups_xyz.map(|g| g as u32),
        bindings,
        ..Default::default()
    })
}

/// ConvTranspose: output position o gathers input position i through tap k when
/// `o = i * stride + k * dilation - pad` along every dimension. An invocation holds
/// `block.rows` output channels x `block.cols()` consecutive outputs of one row, the first a
/// multiple of the stride: which taps reach each of them along the row, and from which input
/// column, is then known here; rows and depth are checked at run time.
fn transposed_kernel(cx: &KernelCx, geo: &Geo, post: &PostOps) -> Result<Dispatch, NoKernel> {
    let [od, oh, ow] = geo.output;
    let [id, ih, iw] = geo.input;
    let [kd, kh, kw] = geo.kernel;
    let [sd, sh, sw] = geo.strides;
    let [dd, dh, _] = geo.dilations;
    let [pd, ph, _] = geo.pads;
    let (cin, cout, groups) = (geo.cin, geo.cout, geo.groups);
    let (in_plane, out_plane) = (geo.in_plane(), geo.out_plane());
    // Blocks of whole vectors per stride phase keep the input span aligned; a span too wide
    // for registers takes the narrowest block.
    let preferred = match sw {
        1 | 2 | 4 => 4,
        3 => 3,
        _ => 1,
    };
    let plane_taps = kh * kw;
    let (block, lo, span) = [preferred, 1]
        .into_iter()
        .map(|vecs| {
            let block = Block {
                vecs,
                ..TRANSPOSED.fit(cout, oh, ow)
            };
            let (lo, span) = transposed_span(block.cols(), geo);
            (block, lo, span)
        })
        .find(|&(_, _, span)| span <= MAX_SPAN)
        .ok_or_else(|| no_kernel!("ConvTranspose {}: kernel too wide", cx.name))?;
    let (rows, ys, vecs, cols) = (block.rows, block.ys, block.vecs, block.cols());
    let x_vec = iw.is_multiple_of(4) && cols.is_multiple_of(4 * sw) && cx.inputs[0].aligned16();
    let w_vec = plane_taps.is_multiple_of(4) && cx.inputs[1].aligned16();
    let y_vec = ow.is_multiple_of(4) && cx.outputs[0].aligned16();
    let unit = if x_vec { 4 } else { 1 };
    let (xb, mb) = (ow.div_ceil(cols), cout.div_ceil(rows));
    let bindings = geo.bindings(post, [x_vec, w_vec, y_vec].map(vec_type));
    let reach = |c, kx| transposed_reach(c, kx, geo);
    let mut s = String::new();
    split_index(
        &mut s,
        &[
            ("xb", xb),
            ("yb", oh.div_ceil(ys)),
            ("oz", od),
            ("mb", mb),
            ("g", groups),
            ("n", geo.batch),
        ],
    );
    emit!(s, "    let ox0 = xb * {cols}u;");
    emit!(s, "    let oy0 = yb * {ys}u;");
    for i in 0..rows {
        // Output channel within the group, and where its weights start for input channel 0.
        emit!(s, "    let m{i} = min(mb * {rows}u + {i}u, {}u);", cout - 1);
        emit!(
            s,
            "    let w{i}o = offsets.w + (g * {}u + m{i}) * {}u;",
            cin * cout,
            kd * plane_taps / if w_vec { 4 } else { 1 }
        );
    }
    init_block(&mut s, geo, block, |i| format!("g * {cout}u + m{i}"));
    // Input column ox0 / sw + lo + t (t < span), as vectors or one by one.
    let (first, lead) = (lo.div_euclid(4), lo.rem_euclid(4) as u32);
    let vectors = (lead + span).div_ceil(4);
    if x_vec {
        for k in 0..vectors {
            emit!(
                s,
                "    let vq{k} = i32(ox0 / {}u) + ({}i);",
                4 * sw,
                first + k as i32
            );
            emit!(s, "    let vv{k} = vq{k} >= 0i && vq{k} < {}i;", iw / 4);
            emit!(s, "    let vc{k} = u32(clamp(vq{k}, 0i, {}i));", iw / 4 - 1);
        }
    } else {
        for t in 0..span {
            emit!(s, "    let c{t} = i32(ox0 / {sw}u) + ({}i);", lo + t as i32);
            emit!(s, "    let v{t} = c{t} >= 0i && c{t} < {iw}i;");
            emit!(s, "    let q{t} = u32(clamp(c{t}, 0i, {}i));", iw - 1);
        }
    }
    let elem = |off: i32| -> String {
        let t = (off - lo) as u32;
        if x_vec {
            format!("u{}.{}", (lead + t) / 4, LANES[((lead + t) % 4) as usize])
        } else {
            format!("s{t}")
        }
    };
    let weight = |i: u32, t: u32| -> String {
        if w_vec {
            format!("wv{i}_{}.{}", t / 4, LANES[(t % 4) as usize])
        } else {
            format!("wv{i}_{t}")
        }
    };
    emit!(
        s,
        "    let xg = offsets.x + (n * {groups}u + g) * {}u;",
        cin * in_plane / unit
    );
    emit!(s, "    for (var ci = 0u; ci < {cin}u; ci += 1u) {{");
    emit!(s, "    let xc = xg + ci * {}u;", in_plane / unit);
    emit!(s, "    for (var kz = 0u; kz < {kd}u; kz += 1u) {{");
    emit!(s, "    let tz = i32(oz) + ({pd}i) - i32(kz * {dd}u);");
    emit!(
        s,
        "    if (tz < 0i || tz % {sd}i != 0i || tz / {sd}i >= {id}i) {{ continue; }}"
    );
    let w_unit = if w_vec { 4 } else { 1 };
    emit!(
        s,
        "    let wz = ci * {}u + kz * {}u;",
        cout * kd * plane_taps / w_unit,
        plane_taps / w_unit
    );
    for i in 0..rows {
        for k in 0..if w_vec { plane_taps / 4 } else { plane_taps } {
            emit!(s, "    let wv{i}_{k} = w[w{i}o + wz + {k}u];");
        }
    }
    for (r, ky) in (0..ys).flat_map(|r| (0..kh).map(move |ky| (r, ky))) {
        // Rows no tap reaches are skipped: about all but one in `sh` of them.
        emit!(
            s,
            "    {{ let ty = i32(oy0 + {r}u) + ({ph}i) - {}i;",
            ky * dh
        );
        emit!(
            s,
            "    if (ty >= 0i && ty % {sh}i == 0i && ty / {sh}i < {ih}i) {{"
        );
        emit!(
            s,
            "    let xr = xc + (u32(tz / {sd}i) * {ih}u + u32(ty / {sh}i)) * {}u;",
            iw / unit
        );
        if x_vec {
            for k in 0..vectors {
                emit!(
                    s,
                    "    let u{k} = select(vec4<f32>(0.0), x[xr + vc{k}], vv{k});"
                );
            }
        } else {
            for t in 0..span {
                emit!(s, "    let s{t} = select(0.0, x[xr + q{t}], v{t});");
            }
        }
        for kx in 0..kw {
            for v in 0..vecs {
                // Columns this tap does not reach take zero.
                let lanes: Vec<String> = (4 * v..4 * v + 4)
                    .map(|c| reach(c, kx).map_or("0.0".into(), elem))
                    .collect();
                if lanes.iter().all(|l| l == "0.0") {
                    continue;
                }
                emit!(s, "    {{ let xv = vec4<f32>({});", lanes.join(", "));
                for i in 0..rows {
                    let a = acc(i * ys + r, v);
                    let wt = weight(i, ky * kw + kx);
                    emit!(s, "    {a} = fma(vec4<f32>({wt}), xv, {a});");
                }
                emit!(s, "    }}");
            }
        }
        emit!(s, "    }} }}");
    }
    emit!(s, "    }}\n    }}");
    let left = (!ow.is_multiple_of(cols)).then(|| format!("{ow}u - ox0"));
    store_block(
        &mut s,
        post,
        block,
        y_vec,
        |l| {
            let (i, r) = (l / ys, l % ys);
            let mut ok = Vec::new();
            if !cout.is_multiple_of(rows) {
                ok.push(format!("mb * {rows}u + {i}u < {cout}u"));
            }
            if !oh.is_multiple_of(ys) {
                ok.push(format!("oy0 + {r}u < {oh}u"));
            }
            (!ok.is_empty()).then(|| ok.join(" && "))
        },
        |l| {
            format!(
                "(n * {}u + g * {cout}u + m{}) * {out_plane}u + (oz * {oh}u + oy0 + {}u) * {ow}u + ox0",
                cout * groups,
                l / ys,
                l % ys
            )
        },
        left.as_deref(),
    );
    let invocations = [xb, oh.div_ceil(ys), od, mb, groups, geo.batch]
        .iter()
        .map(|&v| u64::from(v))
        .product();
    blocked_dispatch(
        format!(
            "conv_transpose_{}x{}x{kd}x{kh}x{kw}",
            cout * groups,
            cin * groups
        ),
        bindings,
        invocations,
        &s,
    )
}

/// The input column (relative to `ox0 / sw`) from which tap `kx` reaches output column
/// `ox0 + c` of a [`transposed_kernel`] block (`ox0` a multiple of the stride), if it does:
/// `c + pw - kx * dw = sw * off`.
fn transposed_reach(c: u32, kx: u32, geo: &Geo) -> Option<i32> {
    let sw = geo.strides[DIMS - 1] as i32;
    let t = c as i32 + geo.pads[DIMS - 1] - (kx * geo.dilations[DIMS - 1]) as i32;
    (t.rem_euclid(sw) == 0).then(|| t.div_euclid(sw))
}

/// The first input column (relative to `ox0 / sw`) a block of `cols` outputs reads, and how
/// many it reads.
fn transposed_span(cols: u32, geo: &Geo) -> (i32, u32) {
    let kw = geo.kernel[DIMS - 1];
    let offs = (0..cols).flat_map(|c| (0..kw).filter_map(move |kx| transposed_reach(c, kx, geo)));
    let (lo, hi) = offs.fold((i32::MAX, i32::MIN), |(lo, hi), o| (lo.min(o), hi.max(o)));
    // No tap reaching any column leaves the output at the bias.
    if lo > hi {
        (0, 0)
    } else {
        (lo, (hi - lo + 1) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{Operand, compile};
    use ingot_schema::{AttrValue, Attrs, DType};

    /// One conv step for the tests.
    struct Case {
        op: &'static str,
        x: Vec<usize>,
        w: Vec<usize>,
        y: Vec<usize>,
        strides: Vec<i64>,
        dilations: Vec<i64>,
        pads: Vec<i64>,
        group: i64,
        bias: bool,
        post: (&'static str, Vec<f64>),
        /// Residual operands (output-shaped), after the bias.
        residuals: usize,
        /// Output written over the first residual.
        in_place: bool,
        /// Byte offset of X in the arena (16-byte aligned or not).
        x_offset: u64,
    }

    impl Case {
        fn conv(x: &[usize], w: &[usize], y: &[usize]) -> Case {
            let rank = x.len() - 2;
            Case {
                op: "Conv",
                x: x.to_vec(),
                w: w.to_vec(),
                y: y.to_vec(),
                strides: vec![1; rank],
                dilations: vec![1; rank],
                pads: vec![0; 2 * rank],
                group: 1,
                bias: false,
                post: ("", Vec::new()),
                residuals: 0,
                in_place: false,
                x_offset: 0,
            }
        }

        fn lower(&self, class: DeviceClass) -> Result<Vec<Dispatch>, NoKernel> {
            let desc = |s: &[usize]| TensorDesc::new(DType::F32, s.to_vec());
            let y_bytes = desc(&self.y).bytes() as u64;
            let mut inputs = vec![
                Operand::arena(desc(&self.x), self.x_offset),
                Operand::weight(desc(&self.w), 0),
            ];
            let m = if self.op == "Conv" {
                self.w[0]
            } else {
                self.w[1] * self.group as usize
            };
            if self.bias || self.residuals > 0 {
                inputs.push(Operand::weight(desc(&[m]), 1));
            }
            // Arena: X at x_offset (< 1 MiB), the output and residuals from 1 MiB on.
            let out_at = 1 << 20;
            for r in 0..self.residuals as u64 {
                let at = if self.in_place && r == 0 {
                    out_at
                } else {
                    out_at + (r + 1) * y_bytes.next_multiple_of(16)
                };
                inputs.push(Operand::arena(desc(&self.y), at));
            }
            let outputs = [Operand::arena(desc(&self.y), out_at)];
            let kernel: Vec<i64> = self.w[2..].iter().map(|&k| k as i64).collect();
            let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
            let attrs = Attrs::new()
                .with("kernel_shape", ints(&kernel))
                .with("strides", ints(&self.strides))
                .with("dilations", ints(&self.dilations))
                .with("pads", ints(&self.pads))
                .with("group", AttrValue::Int(self.group))
                .with("post_ops", AttrValue::Text(self.post.0.into()))
                .with("post_params", AttrValue::Floats(self.post.1.clone()));
            let cx = KernelCx {
                class,
                op: self.op,
                name: "c",
                attrs: &attrs,
                inputs: &inputs,
                outputs: &outputs,
            };
            assert_eq!(cx.in_place().is_some(), self.in_place);
            lower(&cx)
        }

        /// Lowers for both classes, compiles every kernel and returns the dispatches.
        fn check(&self) -> [Vec<Dispatch>; 2] {
            [DeviceClass::Cpu, DeviceClass::Gpu].map(|class| {
                let d = self.lower(class).unwrap();
                for k in &d {
                    if let Err(e) = compile(&k.wgsl, &[]) {
                        panic!("{} does not compile: {e}\n{}", k.label, k.wgsl);
                    }
                }
                d
            })
        }
    }

    fn labels(d: &[Dispatch]) -> Vec<&str> {
        d.iter().map(|d| d.label.as_str()).collect()
    }

    /// The number in `wgsl` right after `before` (up to the next non-digit).
    fn number_after(wgsl: &str, before: &str) -> u64 {
        let at = wgsl.find(before).unwrap() + before.len();
        let digits: String = wgsl[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    }

    /// A register-blocked dispatch's grid covers its invocations with less than a workgroup
    /// to spare.
    fn assert_covers(d: &Dispatch) {
        let workgroup = number_after(&d.wgsl, "@workgroup_size(");
        let invocations = number_after(&d.wgsl, "if (i >= ");
        let launched = u64::from(d.groups[0]) * u64::from(d.groups[1]) * workgroup;
        assert!(launched >= invocations, "{}: {:?}", d.label, d.groups);
        let row = u64::from(d.groups[0]) * workgroup;
        assert!(
            launched - invocations < row.max(workgroup),
            "{}: {:?}",
            d.label,
            d.groups
        );
    }

    #[test]
    fn blocks_fit_the_extents() {
        assert_eq!(fit(&[24, 16, 12, 8], 240), 24);
        assert_eq!(fit(&[24, 16, 12, 8], 64), 16);
        assert_eq!(fit(&[24, 16, 12, 8], 6), 6);
        assert_eq!(fit(&[8, 6, 4], 12), 6);
        assert_eq!(fit(&[8, 6, 4], 7), 7);
        assert_eq!(fit(&[8, 6, 4], 0), 1);
    }

    #[test]
    fn pointwise_uses_vectors_where_aligned() {
        let mut c = Case::conv(&[1, 96, 28, 28], &[96, 96, 1, 1], &[1, 96, 28, 28]);
        c.bias = true;
        c.post = ("HardSigmoid,Relu", vec![0.2, 0.5]);
        let [cpu, gpu] = c.check();
        assert!(cpu[0].label.starts_with("conv_pointwise"));
        assert!(
            cpu[0]
                .wgsl
                .contains("var<storage, read> x: array<vec4<f32>>")
        );
        assert!(
            cpu[0]
                .wgsl
                .contains("var<storage, read_write> y: array<vec4<f32>>")
        );
        assert_covers(&cpu[0]);
        assert!(gpu[0].label.starts_with("conv_tiled"));
        assert_eq!(gpu[0].groups, [13, 2, 1]);
        assert!(gpu[0].wgsl.contains("workgroupBarrier"));
        assert!(!cpu[0].wgsl.contains("workgroup>"));
    }

    #[test]
    fn ragged_pointwise_reads_scalars() {
        // 7x7 pixels, 6 channels: partial vectors, rows and reduction steps; X misaligned.
        let mut c = Case::conv(&[2, 6, 7, 7], &[10, 6, 1, 1], &[2, 10, 7, 7]);
        c.x_offset = 4;
        let [cpu, _] = c.check();
        assert!(cpu[0].wgsl.contains("var<storage, read> x: array<f32>"));
        assert!(
            cpu[0]
                .wgsl
                .contains("var<storage, read_write> y: array<f32>")
        );
    }

    #[test]
    fn depthwise_and_general_convs() {
        let mut dw = Case::conv(&[1, 48, 56, 56], &[48, 1, 3, 3], &[1, 48, 28, 28]);
        (dw.strides, dw.pads, dw.group, dw.bias) = (vec![2, 2], vec![1, 1, 1, 1], 48, true);
        dw.post = ("HardSwish", Vec::new());
        let [cpu, gpu] = dw.check();
        assert_eq!(labels(&cpu), labels(&gpu));
        assert!(cpu[0].label.starts_with("conv_depthwise"));
        assert_eq!(
            cpu[0].wgsl, gpu[0].wgsl,
            "one depthwise kernel for all devices"
        );

        let mut full = Case::conv(&[1, 96, 56, 56], &[24, 96, 3, 3], &[1, 24, 56, 56]);
        full.pads = vec![1, 1, 1, 1];
        let [cpu, gpu] = full.check();
        assert!(cpu[0].label.starts_with("conv_direct"));
        assert!(gpu[0].label.starts_with("conv_tiled"));

        // Groups, dilations, asymmetric pads, a stride along one axis, odd channel counts.
        let mut g = Case::conv(&[2, 6, 9, 11], &[9, 2, 3, 2], &[2, 9, 5, 11]);
        (g.group, g.dilations, g.strides) = (3, vec![2, 1], vec![1, 1]);
        g.pads = vec![0, 1, 0, 0];
        g.check();
    }

    #[test]
    fn one_and_three_spatial_dimensions() {
        let mut c1 = Case::conv(&[1, 3, 17], &[5, 3, 4], &[1, 5, 8]);
        (c1.strides, c1.pads) = (vec![2], vec![1, 0]);
        c1.check();
        let mut c3 = Case::conv(&[1, 2, 5, 6, 7], &[4, 2, 3, 3, 3], &[1, 4, 5, 6, 7]);
        c3.pads = vec![1; 6];
        c3.check();
        // A kernel row too wide for registers is read tap by tap.
        let wide = Case::conv(&[1, 2, 1, 80], &[3, 2, 1, 60], &[1, 3, 1, 21]);
        let [cpu, _] = wide.check();
        assert!(cpu[0].label.starts_with("conv_tiled"));
    }

    #[test]
    fn conv_transpose() {
        let mut t = Case::conv(&[1, 24, 56, 56], &[24, 24, 2, 2], &[1, 24, 112, 112]);
        (t.op, t.strides, t.bias) = ("ConvTranspose", vec![2, 2], true);
        t.post = ("Sigmoid", Vec::new());
        let [cpu, gpu] = t.check();
        assert!(cpu[0].label.starts_with("conv_transpose"));
        assert_eq!(cpu[0].wgsl, gpu[0].wgsl);
        // Groups, dilation and output_padding (a negative end pad) in 1-D and 3-D.
        let mut t1 = Case::conv(&[1, 4, 5], &[4, 3, 3], &[1, 6, 14]);
        (t1.op, t1.strides, t1.dilations, t1.group) = ("ConvTranspose", vec![2], vec![2], 2);
        t1.pads = vec![1, -2];
        t1.check();
        // A kernel row too wide for registers has no kernel (the CPU runs it).
        let mut wide = Case::conv(&[1, 2, 1, 8], &[2, 2, 1, 90], &[1, 2, 1, 97]);
        wide.op = "ConvTranspose";
        assert!(wide.lower(DeviceClass::Cpu).is_err());
        let mut t3 = Case::conv(&[1, 1, 3, 4, 5], &[1, 2, 3, 3, 3], &[1, 2, 5, 9, 15]);
        (t3.op, t3.strides) = ("ConvTranspose", vec![1, 2, 3]);
        t3.check();
    }

    #[test]
    fn residual_add_in_place() {
        let mut transposed = Case::conv(&[1, 8, 6, 6], &[8, 4, 2, 2], &[1, 4, 12, 12]);
        (transposed.op, transposed.strides) = ("ConvTranspose", vec![2, 2]);
        let mut depthwise = Case::conv(&[1, 8, 6, 6], &[8, 1, 3, 3], &[1, 8, 6, 6]);
        (depthwise.group, depthwise.pads) = (8, vec![1; 4]);
        let cases = [
            Case::conv(&[1, 32, 24, 160], &[32, 32, 1, 1], &[1, 32, 24, 160]),
            Case::conv(&[1, 4, 7, 7], &[10, 4, 3, 3], &[1, 10, 5, 5]),
            transposed,
            depthwise,
        ];
        for mut c in cases {
            c.post = ("Add,Relu,Mul", Vec::new());
            (c.residuals, c.in_place) = (2, true);
            for d in c.check().iter().flatten() {
                // Residuals are read element by element, right before each store.
                assert!(d.wgsl.contains("r0[offsets.r0 + e"), "{}", d.label);
                assert_eq!(
                    d.bindings.last().unwrap().slot,
                    crate::vulkan::Slot::Input(4)
                );
            }
        }
    }

    #[test]
    fn large_outputs_spread_over_two_grid_dimensions() {
        let mut c = Case::conv(
            &[1, 256, 2048, 2048],
            &[256, 1, 3, 3],
            &[1, 256, 2048, 2048],
        );
        (c.group, c.pads) = (256, vec![1; 4]);
        let [cpu, _] = c.check();
        assert!(cpu[0].groups[1] > 1, "{:?}", cpu[0].groups);
        assert!(cpu[0].wgsl.contains("gid.y"));
        assert_covers(&cpu[0]);
    }

    #[test]
    fn what_has_no_kernel() {
        let c = Case::conv(&[1, 4, 8, 8], &[4, 4, 3, 3], &[1, 4, 6, 6]);
        let desc = |s: &[usize], dtype| TensorDesc::new(dtype, s.to_vec());
        let inputs = [
            Operand::arena(desc(&c.x, DType::F64), 0),
            Operand::weight(desc(&c.w, DType::F64), 0),
        ];
        let outputs = [Operand::arena(desc(&c.y, DType::F64), 1024)];
        let attrs = Attrs::new();
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "Conv",
            name: "c",
            attrs: &attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).is_err());
        // A wrong output extent is refused, never computed.
        let bad = Case::conv(&[1, 4, 8, 8], &[4, 4, 3, 3], &[1, 4, 7, 6]);
        assert!(bad.lower(DeviceClass::Cpu).is_err());
    }
}
