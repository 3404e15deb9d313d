//! Vulkan kernels of the conv family (ops: ops/src/conv/cpu.rs): Conv and ConvTranspose
//! in float32 for 1, 2 and 3 spatial dimensions, any group count, with fused post-ops.
//!
//! The kernels are WGSL files beside this one; a step picks one, specialises it (overrides for
//! the window, strides, register-block sizes, vector widths and workgroup size; aliases that
//! give the register blocks their exact lengths and the element types of vector loads and
//! stores; the hooks `bias`, `post_op` and `y_vector`) and passes
//! every shape as push-constant params, so one module serves every step with the same window
//! and block. Geometries are lifted to 3-D with leading unit dimensions, as on the CPU.
//! Weights are read in their ONNX layout (Conv `[M, C/group, k..]`, ConvTranspose
//! `[C, M/group, k..]`). Four kernels:
//! - `pointwise.wgsl` (1x1, stride 1, unpadded, one group; CPU-type devices): a GEMM
//!   `Y[m, p] = Σ_c W[m, c] X[c, p]`, each invocation a block of output channels x 16 pixels
//!   held in registers, X and W read and Y written as 16-byte vectors where aligned.
//! - `direct.wgsl` (depthwise convs everywhere, other convs on CPU-type devices): each
//!   invocation holds output channels x output rows x consecutive outputs; for each input
//!   channel it loads the input span of every input row those outputs reach once (aligned
//!   vectors where rows allow) and applies every tap that reads it. Depthwise convs take one
//!   channel and a larger spatial block.
//! - `tiled.wgsl` (pointwise and general convs on GPUs, and shapes the others do not fit): an
//!   implicit GEMM whose workgroup stages 64x16 tiles of W and of the (never materialised)
//!   im2col matrix in workgroup memory.
//! - `transposed.wgsl` (ConvTranspose): like `direct`, but each output gathers from the input
//!   positions whose taps reach it; blocks start at a multiple of the stride, so which taps
//!   reach which column of the block is fixed by the overrides. X spans and windows of W are
//!   read as vectors where aligned.
//!
//! A Conv of 8-bit weights (`crate::dequantizes_w`) runs the same kernels: W is bound as u32
//! words (four weights each), B's binding holds W's table (scales, zero points, bias per
//! output channel), and the hooks `weight` (and pointwise's `weights4`) dequantize each weight
//! as it is loaded, `(q - zero) * scale` as the CPU does, so the sums are those of the float
//! weights. Not the long-window product (`strided_conv`): such convs take the other kernels.
//! A Conv of float16 weights (`crate::takes_f16_weights`) runs them the same way, two weights
//! to a word, each widened exactly as it is loaded (`HALF_WEIGHT`) and B the plain bias.
//!
//! A Conv that scales X's channels (`crate::scales_x`: 1x1, stride 1, unpadded, one group)
//! runs `pointwise` or `tiled` with `SCALED` set: S is bound in the slot `r0` (the post-ops'
//! one operand then in `r1`) and the hook `x_scale` reads it, each X value multiplied by its
//! channel's factor as it is loaded.
//!
//! The register-blocked kernels (all but `tiled`) store Y as 16-byte vectors where its rows
//! are whole aligned vectors (`Y_VEC`), as the generated kernels did: on lavapipe a scalar
//! store costs about what a vector store does.
//!
//! On CPU-type devices (lavapipe) every load or store of an invocation is a loop over the SIMD
//! lanes, which costs far more than the arithmetic: the register-blocked kernels exist to do
//! as much arithmetic per load as registers allow, and none uses workgroup memory (FACTS.md).
//! Their blocks stay in registers only if the driver unrolls every loop over them: Mesa's NIR
//! unrolls a loop that indexes a local array of exactly its trip count (up to 32), so each
//! block array is retyped to its exact length and no loop over one runs past 32
//! ([`MAX_UNROLL`]). Blocks whose rows or columns run past the output read clamped (valid)
//! addresses and skip the store. Post-ops are applied to each element right before it is
//! stored, which also makes running over the residual of a leading `Add` safe: nothing else
//! reads the output.

use crate::matmul::vulkan::strided_conv;
use crate::no_kernel;
use crate::vulkan::post::PostOps;
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, MAX_GROUPS, NoKernel, Spec, Wgsl,
};
use crate::wgsl;
use ingot_schema::DType;

static POINTWISE: Wgsl = wgsl!("conv/pointwise.wgsl");
static DIRECT: Wgsl = wgsl!("conv/direct.wgsl");
static TILED: Wgsl = wgsl!("conv/tiled.wgsl");
static TRANSPOSED: Wgsl = wgsl!("conv/transposed.wgsl");
static COL2IM: Wgsl = wgsl!("conv/col2im.wgsl");
static DEFORM: Wgsl = wgsl!("conv/deform.wgsl");

/// Every kernel file of the family.
#[cfg(test)]
const FILES: [&Wgsl; 6] = [&POINTWISE, &DIRECT, &TILED, &TRANSPOSED, &COL2IM, &DEFORM];

/// Spatial dimensions of the lifted geometry.
const DIMS: usize = 3;

/// The bias hook for steps that have one (the files' default reads none).
const BIAS: &str = "fn bias(m: u32) -> f32 {\n    return b[p.b + m];\n}";

/// The output channels of all groups, as the files other than pointwise.wgsl's compute them.
const ALL_CHANNELS: &str = "p.cout * p.groups";

/// The hook of the register-blocked files that store Y as vectors (`Y_VEC`, `YT` a vector).
const Y_VECTOR: &str = "fn y_vector(o: vec4<f32>) -> YT {\n    return o;\n}";

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    match cx.op {
        "Col2Im" => return col2im(cx),
        "DeformConv" => return deform(cx),
        _ => {}
    }
    let quantized = cx.op == "Conv" && crate::dequantizes_w(cx.attrs);
    match (quantized, cx.inputs.get(1).map(|w| w.desc.dtype)) {
        (true, Some(DType::I8 | DType::U8)) | (false, Some(DType::F16)) if cx.op == "Conv" => {
            let others = cx.inputs.iter().enumerate().filter(|&(i, _)| i != 1).map(|(_, o)| o);
            if let Some(o) = others.chain(cx.outputs).find(|o| o.desc.dtype != DType::F32) {
                return Err(cx.dtype(o.desc.dtype));
            }
        }
        _ => cx.require_f32()?,
    }
    let scaled = cx.op == "Conv" && crate::scales_x(cx.attrs);
    let post = PostOps::new(cx, 3 + usize::from(scaled))?.after_slots(usize::from(scaled));
    let operands = post.bindings().len();
    let own = cx
        .inputs
        .len()
        .checked_sub(operands)
        .filter(|&own| {
            own == 3 + usize::from(scaled) || (own == 2 && operands == 0 && !quantized && !scaled)
        })
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
    let geo = Geo::new(cx, transposed, own >= 3, scaled)?;
    let gpu = cx.class == DeviceClass::Gpu;
    if scaled && !geo.pointwise() {
        return Err(no_kernel!("{} {}: channel scales on a conv that is not 1x1", cx.op, cx.name));
    }
    let d = if transposed {
        Some(transposed_kernel(cx, &geo, &post)?)
    } else if geo.long_window() && geo.weights == Weights::Float {
        let sizes =
            [geo.batch, geo.cout, geo.kernel[2], geo.output[2], geo.input[2], geo.strides[2]];
        Some(strided_conv(cx, &post, sizes.map(|v| v as usize), geo.bias)?)
    } else if geo.cin == 1 && !scaled {
        direct(cx, &geo, &post, DEPTHWISE)?
    } else if gpu {
        tiled(&geo, &post)?
    } else if geo.pointwise() {
        let one_pixel = geo.out_plane() == 1;
        pointwise(cx, &geo, &post, if one_pixel { ONE_PIXEL_BLOCK } else { POINTWISE_BLOCK })?
    } else {
        direct(cx, &geo, &post, GENERAL)?
    };
    // The fallbacks: blocks that cannot be unrolled, or grids too large for the tiles.
    let d = match d {
        Some(d) => d,
        None => match tiled(&geo, &post)? {
            Some(d) => d,
            None if scaled => return Err(no_kernel!("{} {}: too large a grid", cx.op, cx.name)),
            None => direct(cx, &geo, &post, GENERAL)?
                .ok_or_else(|| no_kernel!("{} {}: no kernel fits its shapes", cx.op, cx.name))?,
        },
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
    weights: Weights,
    /// Whether X's channels are scaled by the fourth input (bound as `r0`).
    scaled: bool,
}

/// How a step's W is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Weights {
    Float,
    /// Float16, two to a word, widened as they are loaded.
    Half,
    /// 8-bit integers, signed or not, with their table in B's binding.
    Quantized {
        signed: bool,
    },
}

/// Every index and coordinate the kernels compute stays below this.
const LIMIT: i64 = 1 << 31;

impl Geo {
    fn new(cx: &KernelCx, transposed: bool, bias: bool, scaled: bool) -> Result<Geo, NoKernel> {
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
        if cx.inputs.iter().chain(cx.outputs).any(|o| o.desc.elements() as i64 >= LIMIT) {
            return Err(bad("operands too large for 32-bit indices"));
        }
        let attr = |name: &str| -> Result<Vec<i64>, NoKernel> {
            cx.attrs.ints(name).map(<[i64]>::to_vec).map_err(|e| bad(&e.to_string()))
        };
        let (kernel, strides, dilations, pads) =
            (attr("kernel_shape")?, attr("strides")?, attr("dilations")?, attr("pads")?);
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
        let (w_in, cout) = if transposed { (w[0], w[1]) } else { (w[1] * groups, w[0] / groups) };
        if w_in != x[1] || (!transposed && w[0] % groups != 0) || y[1] != cout * groups {
            return Err(bad("channels do not match"));
        }
        let weights = match cx.inputs[1].desc.dtype {
            DType::I8 | DType::U8 => {
                Weights::Quantized { signed: cx.inputs[1].desc.dtype == DType::I8 }
            }
            DType::F16 => Weights::Half,
            _ => Weights::Float,
        };
        let b_shape = match weights {
            Weights::Float | Weights::Half => vec![(cout * groups) as usize],
            Weights::Quantized { .. } => {
                crate::weight_table_shape((cout * groups) as usize).to_vec()
            }
        };
        if bias && cx.inputs[2].desc.shape != b_shape {
            return Err(bad("bias does not match the output channels"));
        }
        // Narrow weights are read as words from W's start.
        if weights != Weights::Float && !cx.inputs[1].byte_offset.is_multiple_of(4) {
            return Err(bad("narrow weights that do not start on a word"));
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
            weights,
            scaled,
        })
    }

    fn out_plane(&self) -> u32 {
        self.output.iter().product()
    }

    /// One input channel, one dimension, a window longer than a register block unrolls, no
    /// padding or dilation: one matrix product read through strides (the window positions are
    /// columns of B), which the register-blocked kernels cannot unroll and the tiles mostly
    /// pad.
    fn long_window(&self) -> bool {
        let [.., width] = self.input;
        let [.., k] = self.kernel;
        let [.., stride] = self.strides;
        self.groups == 1
            && self.cin == 1
            && self.input[..2] == [1, 1]
            && self.kernel[..2] == [1, 1]
            && k > MAX_UNROLL
            && self.dilations == [1; DIMS]
            && self.pads == [0; DIMS]
            // No end padding either: every window lies inside the input.
            && self.output[2] == (width - k) / stride + 1
    }

    /// A 1x1 conv with stride 1 and no padding in one group: a plain GEMM.
    fn pointwise(&self) -> bool {
        self.groups == 1
            && self.kernel == [1; DIMS]
            && self.strides == [1; DIMS]
            && self.pads == [0; DIMS]
            && self.input == self.output
    }

    /// The bindings in the files' slot order: x, w, y (X, W and Y of the given element
    /// types), then the bias and the post-ops' operands, which only steps that have them bind.
    fn bindings(&self, post: &PostOps, [x_ty, w_ty, y_ty]: [&'static str; 3]) -> Vec<Binding> {
        let w_ty = if self.weights == Weights::Float { w_ty } else { "u32" };
        let mut b = vec![
            Binding::input("x", 0, x_ty),
            Binding::input("w", 1, w_ty),
            Binding::output("y", 0, y_ty),
        ];
        if self.bias {
            b.push(Binding::input("b", 2, "f32"));
        }
        if self.scaled {
            b.push(Binding::input("r0", 3, "f32"));
        }
        b.extend(post.bindings());
        b
    }

    /// `spec` of pointwise.wgsl or tiled.wgsl reading X's channel scales where the step has
    /// them; `channels` is the file's expression for X's channels per image.
    fn scales(&self, spec: Spec, channels: &str) -> Spec {
        if !self.scaled {
            return spec;
        }
        let hook = format!(
            "fn x_scale(n: u32, c: u32) -> f32 {{\n    return r0[p.r0 + n * {channels} + c];\n}}"
        );
        spec.hook("x_scale", hook).set("SCALED", true)
    }

    /// The push-constant params the direct and transposed kernels start with: channels per
    /// group, groups, input and output extents (depth, height, width).
    fn extents(&self) -> Vec<u32> {
        let mut params = vec![self.cin, self.cout, self.groups];
        params.extend(self.input);
        params.extend(self.output);
        params
    }

    /// `file` with the step's bias, post-ops and, for narrow weights, their loads; `channels`
    /// is the file's expression for the output channels of all groups.
    fn spec(&self, file: &'static Wgsl, post: &PostOps, channels: &str) -> Result<Spec, NoKernel> {
        let spec = Spec::new(file).hook("post_op", post.hook()?);
        let signed = match self.weights {
            Weights::Quantized { signed } => signed,
            Weights::Float | Weights::Half => {
                let spec = if self.bias { spec.hook("bias", BIAS) } else { spec };
                if self.weights == Weights::Float {
                    return Ok(spec);
                }
                let spec = (spec.alias("WT", "u32").hook("weight", HALF_WEIGHT))
                    .library(&crate::elementwise::vulkan::F16);
                // pointwise.wgsl also loads four weights of a row as two words.
                return Ok(match std::ptr::eq(file, &POINTWISE) {
                    true => spec.hook("weights4", HALF_WEIGHTS4),
                    false => spec,
                });
            }
        };
        // W's table: scales, zero points, bias.
        let (scale, zero) = ("b[p.b + m]".to_string(), format!("b[p.b + {channels} + m]"));
        let level = match signed {
            true => "f32(bitcast<i32>(byte << 24u) >> 24u)",
            false => "f32(byte)",
        };
        let levels = match signed {
            true => {
                "let s = bitcast<i32>(word);\n    let q = vec4<f32>(vec4<i32>(s << 24u, s << 16u, s << 8u, s) >> vec4<u32>(24u));"
            }
            false => {
                "let q = vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));"
            }
        };
        let row = format!(
            "fn weight_row(m: u32) -> vec2<f32> {{\n    return vec2<f32>({scale}, {zero});\n}}"
        );
        let weight = format!(
            "fn weight(e: u32, row: vec2<f32>) -> f32 {{\n    let byte = (w[p.w + e / 4u] >> (8u * (e % 4u))) & 255u;\n    return ({level} - row.y) * row.x;\n}}"
        );
        let weights4 = format!(
            "fn weights4(i: u32, row: vec2<f32>) -> vec4<f32> {{\n    let word = w[p.w + i];\n    {levels}\n    return (q - row.y) * row.x;\n}}"
        );
        let bias =
            format!("fn bias(m: u32) -> f32 {{\n    return b[p.b + 2u * {channels} + m];\n}}");
        let spec = spec
            .alias("WT", "u32")
            .hook("bias", bias)
            .hook("weight_row", row)
            .hook("weight", weight);
        // pointwise.wgsl also loads four weights of a row as one word.
        Ok(if std::ptr::eq(file, &POINTWISE) { spec.hook("weights4", weights4) } else { spec })
    }

    /// A register-blocked `file` with the step's bias and post-ops that stores Y as vectors
    /// where `y_vec`.
    fn blocked_spec(
        &self,
        (file, channels): (&'static Wgsl, &str),
        post: &PostOps,
        y_vec: bool,
    ) -> Result<Spec, NoKernel> {
        // Their index splits stay within divmod.wgsl's bounds (see MAX_INVOCATIONS).
        let spec = self
            .spec(file, post, channels)?
            .divmod()
            .alias("YT", vec_type(y_vec))
            .set("Y_VEC", y_vec);
        Ok(if y_vec { spec.hook("y_vector", Y_VECTOR) } else { spec })
    }
}

/// The `weight` and `weights4` hooks of float16 weights: W bound as u32 words, two halves
/// each, the lower first; element e is half e % 2 of word e / 2, widened exactly by
/// `elementwise/f16.wgsl`'s `h2f` (WGSL's unpack2x16float needs a capability not every device
/// has, and may flush subnormals).
const HALF_WEIGHT: &str = "fn weight(e: u32, row: vec2<f32>) -> f32 {
    return h2f((w[p.w + e / 2u] >> (16u * (e & 1u))) & 0xffffu);
}";
const HALF_WEIGHTS4: &str = "fn weights4(i: u32, row: vec2<f32>) -> vec4<f32> {
    let lo = w[p.w + 2u * i];
    let hi = w[p.w + 2u * i + 1u];
    return vec4<f32>(h2f(lo & 0xffffu), h2f(lo >> 16u), h2f(hi & 0xffffu), h2f(hi >> 16u));
}";

/// WGSL's name for the element type of a binding read as vectors or scalars.
fn vec_type(v: bool) -> &'static str {
    if v { "vec4<f32>" } else { "f32" }
}

/// `array<ty, len>`: the register-block aliases.
fn array(ty: &str, len: u32) -> String {
    format!("array<{ty}, {len}>")
}

/// The outputs one invocation of a register-blocked kernel holds: `rows` output channels x
/// `ys` rows x `vecs` 4-wide vectors of consecutive positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

    /// The accumulators' alias: `[rows][ys][vecs]` vectors.
    fn accumulators(self) -> String {
        array(&array(&array("vec4<f32>", self.vecs), self.ys), self.rows)
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

/// No 24-row block: on lavapipe it ran no faster than 16 rows (PP-OCR det, rec, cls and a
/// YOLOv8n-class detector, within 3%) and its JIT cost most of cold start (det 224's first
/// run 56 s with it, 39 s without; `tools/bench.sh --cold`).
const POINTWISE_BLOCK: Shape = Shape { rows: &[16, 12, 8], ys: &[1], vecs: &[4] };
/// An image of one pixel is a matrix-vector product: few rows per invocation, so that enough
/// invocations share it.
const ONE_PIXEL_BLOCK: Shape = Shape { rows: &[4], ys: &[1], vecs: &[1] };
const GENERAL: Shape = Shape { rows: &[8, 6, 4], ys: &[4, 3, 2], vecs: &[2] };
const DEPTHWISE: Shape = Shape { rows: &[1], ys: &[8, 6, 4], vecs: &[4, 3, 2] };
const TRANSPOSED_BLOCK: Shape = Shape { rows: &[8, 6, 4], ys: &[2], vecs: &[2] };

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
    candidates.iter().copied().min_by_key(padding).unwrap_or(1).min(extent)
}

/// The most iterations of a loop over a register block (and the longest block array) the
/// driver unrolls: Mesa's `max_unroll_iterations` for llvmpipe.
const MAX_UNROLL: u32 = 32;

/// Invocations per workgroup of the register-blocked kernels: at most, and at least (a
/// multiple of the 8 SIMD lanes lavapipe runs at once).
const WORKGROUP: u32 = 64;
const MIN_WORKGROUP: u32 = 8;

/// The register-blocked kernels split their invocation index with `vulkan/divmod.wgsl`, which
/// needs divisors below 2^24: fewer invocations than this keep every divisor there.
const MAX_INVOCATIONS: u64 = 1 << 24;

/// The grid of a register-blocked kernel: `invocations` threads. None when the index would be
/// too large to split.
///
/// On CPU-type devices every workgroup holds 8 invocations (one SIMD batch of lavapipe's
/// lanes; a workgroup runs on one core), so that steps alike but for their sizes share one
/// module, and every core gets some even of few invocations. lavapipe compiles each module
/// at its first dispatch: with the size chosen per step, the YOLOv8n-class detector made 14
/// more modules and its first run took 34-42 s instead of 13-14 (run time unchanged within
/// lavapipe's spread). Elsewhere workgroups of up to 64, smaller when there are few
/// invocations.
fn blocked_grid(invocations: u64, class: DeviceClass) -> Result<Option<Grid>, NoKernel> {
    if invocations >= MAX_INVOCATIONS {
        return Ok(None);
    }
    let mut workgroup = WORKGROUP;
    while workgroup > MIN_WORKGROUP
        && (class == DeviceClass::Cpu || invocations < 8 * u64::from(workgroup))
    {
        workgroup /= 2;
    }
    Grid::new(invocations, workgroup).map(Some)
}

/// The 1x1 conv as a register-blocked GEMM over the pixels `p` of each image:
/// `Y[n, m, p] = B[m] + Σ_c W[m, c] X[n, c, p]`. None when the grid is too large.
fn pointwise(
    cx: &KernelCx,
    geo: &Geo,
    post: &PostOps,
    shape: Shape,
) -> Result<Option<Dispatch>, NoKernel> {
    let (m, k, p) = (geo.cout, geo.cin, geo.out_plane());
    let block = shape.fit(m, 1, p);
    let (rows, vecs) = (block.rows, block.vecs);
    // 16-byte loads need rows of whole vectors that start aligned.
    let x_vec = p.is_multiple_of(4) && cx.inputs[0].aligned16();
    // 8-bit weights: a word is four of a row where rows are whole words (W starts on one).
    let w_vec = match geo.weights {
        Weights::Float => k.is_multiple_of(4) && cx.inputs[1].aligned16(),
        Weights::Half | Weights::Quantized { .. } => k.is_multiple_of(4),
    };
    let y_vec = p.is_multiple_of(4) && cx.outputs[0].aligned16();
    let (pb, mb) = (p.div_ceil(block.cols()), m.div_ceil(rows));
    let invocations = u64::from(pb) * u64::from(mb) * u64::from(geo.batch);
    let Some(grid) = blocked_grid(invocations, cx.class)? else {
        return Ok(None);
    };
    let spec = geo.blocked_spec((&POINTWISE, "p.m"), post, y_vec)?;
    let spec = if geo.weights == Weights::Float { spec.alias("WT", vec_type(w_vec)) } else { spec };
    geo.scales(spec, "p.k")
        .alias("XT", vec_type(x_vec))
        .alias("Rows", array("u32", rows))
        .alias("RowScales", array("vec2<f32>", rows))
        .alias("RowWeights", array("vec4<f32>", rows))
        .alias("Block", array(&array("vec4<f32>", vecs), rows))
        .alias("Vectors", array("vec4<f32>", vecs))
        .alias("Columns", array("u32", block.cols()))
        .hook("accumulate", accumulate(rows, vecs))
        .set("ONE_PIXEL", p == 1)
        .set("X_VEC", x_vec)
        .set("W_VEC", w_vec)
        .set("ROWS", rows)
        .set("VECS", vecs)
        .set("WG", grid.workgroup)
        .dispatch(
            format!("conv_pointwise_{m}x{k}x{p}"),
            grid.groups,
            geo.bindings(post, [x_vec, w_vec, y_vec].map(vec_type)),
            vec![m, k, p, pb, mb, invocations as u32],
        )
        .map(Some)
}

/// pointwise.wgsl's `accumulate` written out for a block of `rows` x `vecs`: every block
/// index a literal.
fn accumulate(rows: u32, vecs: u32) -> String {
    let mut f = String::from(
        "fn accumulate(acc: ptr<function, Block>, wv: ptr<function, RowWeights>, \
         xv: ptr<function, Vectors>, kk: u32) {\n",
    );
    for r in 0..rows {
        f += &format!("    let w{r} = vec4<f32>((*wv)[{r}][kk]);\n");
        for v in 0..vecs {
            f += &format!("    (*acc)[{r}][{v}] = fma(w{r}, (*xv)[{v}], (*acc)[{r}][{v}]);\n");
        }
    }
    f + "}"
}

/// Direct convolution: each invocation holds `block.rows` output channels of one group x
/// `block.ys` output rows x `block.cols()` consecutive outputs along the rows. For each input
/// channel it walks the input rows those outputs reach, loads the span of each row once (as
/// aligned 16-byte vectors when rows allow) and applies every tap that reads it. None when
/// the window or block cannot be unrolled, or the grid is too large.
fn direct(
    cx: &KernelCx,
    geo: &Geo,
    post: &PostOps,
    shape: Shape,
) -> Result<Option<Dispatch>, NoKernel> {
    let [_, oh, ow] = geo.output;
    let [_, _, iw] = geo.input;
    let [kd, kh, kw] = geo.kernel;
    let [sd, sh, sw] = geo.strides;
    let [dd, dh, dw] = geo.dilations;
    let [pd, ph, pw] = geo.pads;
    let (cin, cout, groups) = (geo.cin, geo.cout, geo.groups);
    let mut block = shape.fit(cout, oh, ow);
    let span = |b: Block| (b.cols() - 1) * sw + (kw - 1) * dw + 1;
    let rows_read = |b: Block| (b.ys - 1) * sh + (kh - 1) * dh + 1;
    // Narrower or shorter blocks where a span or the input rows would not unroll.
    while span(block) > MAX_UNROLL && block.vecs > 1 {
        block.vecs -= 1;
    }
    while rows_read(block) > MAX_UNROLL && block.ys > 1 {
        block.ys -= 1;
    }
    if span(block) > MAX_UNROLL || rows_read(block) > MAX_UNROLL || kh > MAX_UNROLL {
        return Ok(None);
    }
    let Block { rows, ys, vecs } = block;
    // Vector loads need rows of whole vectors; `ox0 * sw` is then a multiple of 4 too.
    let x_vec = iw.is_multiple_of(4) && cx.inputs[0].aligned16();
    let y_vec = ow.is_multiple_of(4) && cx.outputs[0].aligned16();
    // Where the span starts in its first vector.
    let lead = if x_vec { (-pw).rem_euclid(4) as u32 } else { 0 };
    let vectors = (lead + span(block)).div_ceil(4);
    let (xb, yb, mb) = (ow.div_ceil(block.cols()), oh.div_ceil(ys), cout.div_ceil(rows));
    let invocations =
        [xb, yb, geo.output[0], mb, groups, geo.batch].iter().map(|&v| u64::from(v)).product();
    let Some(grid) = blocked_grid(invocations, cx.class)? else {
        return Ok(None);
    };
    let mut params = geo.extents();
    params.extend([kd, sd, dd, pd as u32, ph as u32, pw as u32]);
    params.extend([xb, yb, mb, invocations as u32]);
    let kind = if cin == 1 { "depthwise" } else { "direct" };
    geo.blocked_spec((&DIRECT, ALL_CHANNELS), post, y_vec)?
        .alias("XT", vec_type(x_vec))
        .alias("Block", block.accumulators())
        .alias("Taps", array(&array(&array("f32", kw), kh), rows))
        .alias("Rows", array("u32", rows))
        .alias("RowScales", array("vec2<f32>", rows))
        .alias("InputRows", array("vec2<u32>", rows_read(block)))
        .alias("Span", array("f32", span(block)))
        .alias("SpanColumns", array("vec2<u32>", span(block)))
        .alias("SpanVectors", array("vec4<f32>", vectors))
        .alias("VectorColumns", array("vec2<u32>", vectors))
        .set("ROWS", rows)
        .set("YS", ys)
        .set("VECS", vecs)
        .set("KH", kh)
        .set("KW", kw)
        .set("SH", sh)
        .set("SW", sw)
        .set("DH", dh)
        .set("DW", dw)
        .set("X_VEC", x_vec)
        .set("LEAD", lead)
        .set("PLANAR", (kd, pd, geo.input[0], geo.output[0]) == (1, 0, 1, 1))
        .set("WG", grid.workgroup)
        .dispatch(
            format!("conv_{kind}_{}x{cin}x{kd}x{kh}x{kw}", cout * groups),
            grid.groups,
            geo.bindings(post, [x_vec, false, y_vec].map(vec_type)),
            params,
        )
        .map(Some)
}

/// Tile sizes of `tiled.wgsl`: output channels x positions, for 16x16 invocations that each
/// compute 4x4 outputs.
const TM: u32 = 64;
const TN: u32 = 64;

/// The implicit-GEMM kernel for GPUs: `Y_g[m, p] = Σ_k W_g[m, k] · col_g[k, p]` with
/// k = (input channel, tap), the im2col matrix `col` read from X on the fly. None when the
/// grid does not fit one dispatch (the caller falls back to a register-blocked kernel).
fn tiled(geo: &Geo, post: &PostOps) -> Result<Option<Dispatch>, NoKernel> {
    let [kd, kh, kw] = geo.kernel;
    let (cin, cout, groups) = (geo.cin, geo.cout, geo.groups);
    let p = geo.out_plane();
    let k = cin * kd * kh * kw;
    let groups_xyz = [
        u64::from(p.div_ceil(TN)),
        u64::from(cout.div_ceil(TM)),
        u64::from(geo.batch) * u64::from(groups),
    ];
    if groups_xyz.iter().any(|&g| g > u64::from(MAX_GROUPS)) {
        return Ok(None);
    }
    let mut params = geo.extents();
    params.extend(geo.strides);
    params.extend(geo.dilations);
    params.extend(geo.pads.map(|p| p as u32));
    geo.scales(geo.spec(&TILED, post, ALL_CHANNELS)?, "p.cin")
        .set("KD", kd)
        .set("KH", kh)
        .set("KW", kw)
        .dispatch(
            format!("conv_tiled_{}x{k}x{p}", cout * groups),
            groups_xyz.map(|g| g as u32),
            geo.bindings(post, ["f32"; 3]),
            params,
        )
        .map(Some)
}

/// ConvTranspose: output position o gathers input position i through tap k when
/// `o = i * stride + k * dilation - pad` along every dimension. An invocation holds
/// `block.rows` output channels x `block.ys` rows x `block.cols()` consecutive outputs of a
/// row, the first a multiple of the stride: which taps reach each of them along the row, and
/// from which input column, is then fixed by the overrides; rows and depth are checked at run
/// time.
fn transposed_kernel(cx: &KernelCx, geo: &Geo, post: &PostOps) -> Result<Dispatch, NoKernel> {
    let [_, oh, ow] = geo.output;
    let [kd, kh, kw] = geo.kernel;
    let [sd, sh, sw] = geo.strides;
    let [dd, dh, dw] = geo.dilations;
    let [pd, ph, pw] = geo.pads;
    let (cin, cout, groups) = (geo.cin, geo.cout, geo.groups);
    // Blocks of whole vectors per stride phase; a span too wide to unroll takes the narrowest
    // block.
    let preferred = match sw {
        1 | 2 | 4 => 4,
        3 => 3,
        _ => 1,
    };
    let (block, lo, span) = [preferred, 1]
        .into_iter()
        .map(|vecs| {
            let block = Block { vecs, ..TRANSPOSED_BLOCK.fit(cout, oh, ow) };
            let (lo, span) = transposed_span(block.cols(), geo);
            (block, lo, span)
        })
        .find(|&(_, _, span)| span <= MAX_UNROLL)
        .filter(|_| kh <= MAX_UNROLL && kw <= MAX_UNROLL)
        .ok_or_else(|| no_kernel!("ConvTranspose {}: kernel too wide", cx.name))?;
    let Block { rows, ys, vecs } = block;
    // Vector loads of X need rows of whole vectors and spans that start at a multiple of 4
    // (`ox0 / sw`, with `ox0` a multiple of `4 vecs`); of W, windows of whole vectors.
    let x_vec = geo.input[DIMS - 1].is_multiple_of(4)
        && vecs.is_multiple_of(sw)
        && cx.inputs[0].aligned16();
    let w_vec = (kh * kw).is_multiple_of(4) && cx.inputs[1].aligned16();
    let y_vec = ow.is_multiple_of(4) && cx.outputs[0].aligned16();
    // Where the span starts in its first vector.
    let lead = if x_vec { lo.rem_euclid(4) as u32 } else { 0 };
    let vectors = (lead + span).div_ceil(4).max(1);
    let (xb, yb, mb) = (ow.div_ceil(block.cols()), oh.div_ceil(ys), cout.div_ceil(rows));
    let invocations =
        [xb, yb, geo.output[0], mb, groups, geo.batch].iter().map(|&v| u64::from(v)).product();
    let grid = blocked_grid(invocations, cx.class)?
        .ok_or_else(|| no_kernel!("ConvTranspose {}: too many outputs", cx.name))?;
    let mut params = geo.extents();
    params.extend([kd, sd, dd, pd as u32, ph as u32]);
    params.extend([xb, yb, mb, invocations as u32]);
    geo.blocked_spec((&TRANSPOSED, ALL_CHANNELS), post, y_vec)?
        .alias("XT", vec_type(x_vec))
        .alias("WT", vec_type(w_vec))
        .alias("Block", block.accumulators())
        .alias("Taps", array(&array(&array("f32", kw), kh), rows))
        .alias("Rows", array("u32", rows))
        .alias("Span", array("f32", span.max(1)))
        .alias("SpanColumns", array("vec2<u32>", span.max(1)))
        .alias("SpanVectors", array("vec4<f32>", vectors))
        .alias("VectorColumns", array("vec2<u32>", vectors))
        .alias("TapVectors", array("vec4<f32>", (kh * kw).div_ceil(4)))
        .set("X_VEC", x_vec)
        .set("W_VEC", w_vec)
        .set("LEAD", lead)
        .set("ROWS", rows)
        .set("YS", ys)
        .set("VECS", vecs)
        .set("KH", kh)
        .set("KW", kw)
        .set("SH", sh)
        .set("SW", sw)
        .set("DH", dh)
        .set("DW", dw)
        .set("PW", pw)
        .set("LO", lo)
        .set("SPAN", span.max(1))
        .set("PLANAR", (kd, pd, geo.input[0], geo.output[0]) == (1, 0, 1, 1))
        .set("WG", grid.workgroup)
        .dispatch(
            format!("conv_transpose_{}x{}x{kd}x{kh}x{kw}", cout * groups, cin * groups),
            grid.groups,
            geo.bindings(post, [x_vec, w_vec, y_vec].map(vec_type)),
            params,
        )
}

/// The input column (relative to `ox0 / sw`) from which tap `kx` reaches output column
/// `ox0 + c` of a transposed block (`ox0` a multiple of the stride), if it does:
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
    if lo > hi { (0, 0) } else { (lo, (hi - lo + 1) as u32) }
}

/// Col2Im, float32, of up to three spatial dims: one invocation per output pixel.
fn col2im(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    let g = super::col2im::Geometry::new(cx.attrs).map_err(|e| no_kernel!("Col2Im: {e}"))?;
    let n = g.image.len();
    if n > 3 || cx.inputs.len() != 1 || cx.outputs.len() != 1 {
        return Err(no_kernel!("Col2Im of {n} spatial dims"));
    }
    let count = cx.outputs[0].desc.elements() as u64;
    if count == 0 {
        return Ok(Vec::new());
    }
    // Blocks that fit nowhere leave an empty input, which cannot be bound.
    if cx.inputs[0].desc.elements() == 0 {
        return Err(no_kernel!("Col2Im of an empty input"));
    }
    // Three dims, leading ones of extent one.
    let lead = |v: Vec<usize>, fill: usize| -> Vec<u32> {
        std::iter::repeat_n(fill, 3 - n).chain(v).map(|v| v as u32).collect()
    };
    let along = (0..n).map(|d| g.along(d)).collect();
    let k = g.block.iter().product::<usize>() as u32;
    let mut params = vec![count as u32, k, g.positions() as u32];
    params.extend(lead(g.image.clone(), 1));
    params.extend(lead(g.block.clone(), 1));
    params.extend(lead(g.strides.clone(), 1));
    params.extend(lead(g.dilations.clone(), 1));
    params.extend(lead(g.pads[..n].to_vec(), 0));
    params.extend(lead(along, 1));
    let bindings = vec![Binding::input("x", 0, "f32"), Binding::output("y", 0, "f32")];
    Ok(vec![Spec::new(&COL2IM).flat(format!("col2im_{count}"), count, bindings, params)?])
}

/// DeformConv, float32: one invocation per output element.
fn deform(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    let shapes: Vec<&[usize]> = cx.inputs.iter().map(|o| o.desc.shape.as_slice()).collect();
    let g = super::deform::Geometry::new(cx.attrs, &shapes)
        .map_err(|e| no_kernel!("DeformConv: {e}"))?;
    let count = cx.outputs[0].desc.elements() as u64;
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::input("w", 1, "f32"),
        Binding::input("offset", 2, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    // The bias and the mask, whichever are present, in order.
    for (k, input) in (3..cx.inputs.len()).enumerate() {
        bindings.push(Binding::input(["extra0", "extra1"][k], input, "f32"));
    }
    let sizes = [
        g.c,
        g.h,
        g.w,
        g.m,
        g.kh,
        g.kw,
        g.oh,
        g.ow,
        g.stride[0],
        g.stride[1],
        g.dilation[0],
        g.dilation[1],
        g.pad[0],
        g.pad[1],
        g.group,
        g.offset_group,
    ];
    let mut params = vec![count as u32];
    params.extend(sizes.iter().map(|&v| v as u32));
    let spec = Spec::new(&DEFORM).set("BIAS", g.bias).set("MASK", g.mask);
    Ok(vec![spec.flat(format!("deform_conv_{count}"), count, bindings, params)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{Operand, Slot, compile, lower_f32_all_classes, valid};
    use ingot_schema::{AttrValue, Attrs, DType};
    use std::fmt::Write as _;

    /// One conv step for the tests.
    #[derive(Clone)]
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
        /// W's type where it is 8-bit (with its table in B's place).
        quantized: Option<DType>,
        /// W float16 (the rest float32).
        half: bool,
        /// X's channels scaled by a fourth input, [N, C, 1, ..] (after B, which it needs).
        scaled: bool,
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
                quantized: None,
                half: false,
                scaled: false,
            }
        }

        /// The conv with 8-bit weights of `dtype`.
        fn quantized(mut self, dtype: DType) -> Case {
            self.quantized = Some(dtype);
            self
        }

        /// The conv with float16 weights.
        fn half(mut self) -> Case {
            self.half = true;
            self
        }

        fn attrs(&self) -> Attrs {
            let kernel: Vec<i64> = self.w[2..].iter().map(|&k| k as i64).collect();
            let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
            Attrs::new()
                .with("kernel_shape", ints(&kernel))
                .with("strides", ints(&self.strides))
                .with("dilations", ints(&self.dilations))
                .with("pads", ints(&self.pads))
                .with("group", AttrValue::Int(self.group))
                .with("post_ops", AttrValue::Text(self.post.0.into()))
                .with("post_params", AttrValue::Floats(self.post.1.clone()))
                .with("dequantize_w", AttrValue::Int(i64::from(self.quantized.is_some())))
                .with("scale_x", AttrValue::Int(i64::from(self.scaled)))
        }

        fn lower(&self, class: DeviceClass) -> Result<Vec<Dispatch>, NoKernel> {
            let desc = |s: &[usize]| TensorDesc::new(DType::F32, s.to_vec());
            let y_bytes = desc(&self.y).bytes() as u64;
            let mut inputs = vec![
                Operand::arena(desc(&self.x), self.x_offset),
                Operand::weight(
                    TensorDesc::new(
                        self.quantized.unwrap_or(if self.half { DType::F16 } else { DType::F32 }),
                        self.w.clone(),
                    ),
                    0,
                ),
            ];
            let m = if self.op == "Conv" { self.w[0] } else { self.w[1] * self.group as usize };
            if self.quantized.is_some() {
                inputs.push(Operand::weight(desc(&crate::weight_table_shape(m)), 1));
            } else if self.bias || self.residuals > 0 || self.scaled {
                inputs.push(Operand::weight(desc(&[m]), 1));
            }
            if self.scaled {
                let factors: Vec<usize> =
                    self.x.iter().enumerate().map(|(d, &e)| if d < 2 { e } else { 1 }).collect();
                inputs.push(Operand::arena(desc(&factors), 1 << 19));
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
            let attrs = self.attrs();
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

        /// Lowers for both classes, compiles every kernel with its overrides, checks that it
        /// takes the dispatch's bindings and params, and returns the dispatches.
        fn check(&self) -> [Vec<Dispatch>; 2] {
            [DeviceClass::Cpu, DeviceClass::Gpu].map(|class| {
                let d = self.lower(class).unwrap();
                for k in &d {
                    check_dispatch(k);
                }
                d
            })
        }
    }

    /// Checks `d` against its compiled module ([`valid`]), which is at most 64 KiB.
    fn check_dispatch(d: &Dispatch) {
        valid(std::slice::from_ref(d));
        let module = compile(&d.wgsl, &d.overrides).unwrap();
        assert!(module.spirv.len() * 4 <= 64 << 10, "{}: over 64 KiB", d.label);
    }

    fn labels(d: &[Dispatch]) -> Vec<&str> {
        d.iter().map(|d| d.label.as_str()).collect()
    }

    fn override_of(d: &Dispatch, name: &str) -> Option<f64> {
        d.overrides.iter().find(|o| o.0 == name).map(|o| o.1)
    }

    fn binding<'a>(d: &'a Dispatch, name: &str) -> &'a Binding {
        d.bindings.iter().find(|b| b.name == name).unwrap()
    }

    /// A register-blocked dispatch's grid covers its invocations (its last param) with less
    /// than a workgroup to spare.
    fn assert_covers(d: &Dispatch) {
        let workgroup = override_of(d, "WG").unwrap() as u64;
        let invocations = u64::from(*d.params.last().unwrap());
        let launched = u64::from(d.groups[0]) * u64::from(d.groups[1]) * workgroup;
        assert!(launched >= invocations, "{}: {:?}", d.label, d.groups);
        let row = u64::from(d.groups[0]) * workgroup;
        assert!(launched - invocations < row.max(workgroup), "{}: {:?}", d.label, d.groups);
    }

    /// A dispatch for a snapshot: how it is launched, then its module's source.
    fn describe(d: &Dispatch) -> String {
        let mut s = format!("label: {}\ngroups: {:?}\n", d.label, d.groups);
        let bindings: Vec<String> =
            d.bindings.iter().map(|b| format!("{} {:?} {}", b.name, b.slot, b.ty)).collect();
        let _ = writeln!(s, "bindings: {}", bindings.join(", "));
        let _ = writeln!(s, "params: {:?}", d.params);
        let overrides: Vec<String> = d.overrides.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let _ = writeln!(s, "overrides: {}\n", overrides.join(" "));
        s.push_str(&d.wgsl);
        s
    }

    #[test]
    fn int8_weights_are_read_as_words_on_every_kernel() {
        let pointwise = Case::conv(&[1, 16, 8, 8], &[24, 16, 1, 1], &[1, 24, 8, 8]);
        let ragged = Case::conv(&[1, 6, 8, 8], &[24, 6, 1, 1], &[1, 24, 8, 8]);
        let one_pixel = Case::conv(&[1, 32, 1, 1], &[8, 32, 1, 1], &[1, 8, 1, 1]);
        let general =
            Case { pads: vec![1; 4], ..Case::conv(&[1, 4, 6, 6], &[8, 4, 3, 3], &[1, 8, 6, 6]) };
        let depthwise = Case {
            group: 4,
            pads: vec![1; 4],
            ..Case::conv(&[1, 4, 6, 6], &[4, 1, 3, 3], &[1, 4, 6, 6])
        };
        // A long 1-D window, which float weights run as one strided product.
        let long = Case::conv(&[1, 1, 100], &[6, 1, 40], &[1, 6, 61]);
        for (case, dtype) in [
            (pointwise, DType::I8),
            (ragged, DType::U8),
            (one_pixel, DType::I8),
            (general, DType::U8),
            (depthwise, DType::I8),
            (long, DType::I8),
        ] {
            let case = case.quantized(dtype);
            for d in case.check().iter().flatten() {
                assert_eq!(binding(d, "w").ty, "u32", "{}", d.label);
                assert_eq!(binding(d, "b").slot, Slot::Input(2));
                assert!(
                    d.wgsl.contains("fn weight(e: u32, row: vec2<f32>) -> f32 {\n    let byte")
                );
            }
        }
        // One specialisation, pinned: the word loads and the table in B's binding.
        let cpu = Case::conv(&[1, 16, 8, 8], &[24, 16, 1, 1], &[1, 24, 8, 8])
            .quantized(DType::I8)
            .check();
        insta::assert_snapshot!("pointwise_int8", describe(&cpu[0][0]));
    }

    #[test]
    fn float16_weights_are_read_as_words_on_every_kernel() {
        let pointwise = Case::conv(&[1, 16, 8, 8], &[24, 16, 1, 1], &[1, 24, 8, 8]);
        let ragged = Case::conv(&[1, 6, 8, 8], &[24, 6, 1, 1], &[1, 24, 8, 8]);
        let general =
            Case { pads: vec![1; 4], ..Case::conv(&[1, 4, 6, 6], &[8, 4, 3, 3], &[1, 8, 6, 6]) };
        let depthwise = Case {
            group: 4,
            pads: vec![1; 4],
            bias: true,
            ..Case::conv(&[1, 4, 6, 6], &[4, 1, 3, 3], &[1, 4, 6, 6])
        };
        // A long 1-D window, which float weights run as one strided product.
        let long = Case::conv(&[1, 1, 100], &[6, 1, 40], &[1, 6, 61]);
        for case in [pointwise, ragged, general, depthwise, long] {
            for d in case.half().check().iter().flatten() {
                assert_eq!(binding(d, "w").ty, "u32", "{}", d.label);
                assert!(d.wgsl.contains(HALF_WEIGHT), "{}", d.label);
            }
        }
        // Vectors of four where a row is whole vectors; not a ConvTranspose's W.
        let cpu = Case::conv(&[1, 16, 8, 8], &[24, 16, 1, 1], &[1, 24, 8, 8]).half().check();
        assert!(cpu[0][0].wgsl.contains(HALF_WEIGHTS4));
        assert_eq!(override_of(&cpu[0][0], "W_VEC"), Some(1.0));
        let transposed =
            Case { op: "ConvTranspose", ..Case::conv(&[1, 4, 3, 3], &[4, 2, 2, 2], &[1, 2, 4, 4]) };
        assert!(transposed.half().lower(DeviceClass::Cpu).is_err());
    }

    #[test]
    fn every_file_compiles_alone() {
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}: {e}", file.path);
            }
        }
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
        assert_eq!(binding(&cpu[0], "x").ty, "vec4<f32>");
        assert_eq!(binding(&cpu[0], "w").ty, "vec4<f32>");
        assert_eq!(override_of(&cpu[0], "ROWS"), Some(16.0));
        assert_covers(&cpu[0]);
        insta::assert_snapshot!("pointwise", describe(&cpu[0]));
        assert!(gpu[0].label.starts_with("conv_tiled"));
        assert_eq!(gpu[0].groups, [13, 2, 1]);
        let [tiled_workgroup, cpu_workgroup] =
            [&gpu[0], &cpu[0]].map(|d| compile(&d.wgsl, &d.overrides).unwrap().workgroup_size);
        assert_eq!(tiled_workgroup, [16, 16, 1]);
        // CPU-type devices run workgroups of one SIMD batch, whatever the step's size.
        assert_eq!(cpu_workgroup, [8, 1, 1]);
        insta::assert_snapshot!("tiled", describe(&gpu[0]));
    }

    #[test]
    fn ragged_pointwise_reads_scalars() {
        // 7x7 pixels, 6 channels: partial vectors, rows and reduction steps; X misaligned.
        let mut c = Case::conv(&[2, 6, 7, 7], &[10, 6, 1, 1], &[2, 10, 7, 7]);
        c.x_offset = 4;
        let [cpu, _] = c.check();
        assert_eq!(binding(&cpu[0], "x").ty, "f32");
        assert_eq!(binding(&cpu[0], "w").ty, "f32");
        assert_eq!(override_of(&cpu[0], "X_VEC"), Some(0.0));
        // 10 channels in one block of 10 rows, 49 pixels in 4 blocks of 16, 2 images.
        assert_eq!(override_of(&cpu[0], "ROWS"), Some(10.0));
        assert_eq!(cpu[0].params, [10, 6, 49, 4, 1, 8]);
        assert_covers(&cpu[0]);
    }

    #[test]
    fn depthwise_and_general_convs() {
        let mut dw = Case::conv(&[1, 48, 56, 56], &[48, 1, 3, 3], &[1, 48, 28, 28]);
        (dw.strides, dw.pads, dw.group, dw.bias) = (vec![2, 2], vec![1, 1, 1, 1], 48, true);
        dw.post = ("HardSwish", Vec::new());
        let [cpu, gpu] = dw.check();
        assert_eq!(labels(&cpu), labels(&gpu));
        assert!(cpu[0].label.starts_with("conv_depthwise"));
        assert_eq!(cpu[0].wgsl, gpu[0].wgsl, "one depthwise kernel for all devices");
        // Its workgroups: one SIMD batch on CPU-type devices, 64 invocations on GPUs.
        assert_eq!(
            [override_of(&cpu[0], "WG"), override_of(&gpu[0], "WG")],
            [Some(8.0), Some(64.0)]
        );
        // Stride 2: four vectors would span 33 input columns, more than unroll; three span 25.
        assert_eq!(override_of(&cpu[0], "VECS"), Some(3.0));
        assert_eq!(binding(&cpu[0], "x").ty, "vec4<f32>");
        assert_covers(&cpu[0]);
        insta::assert_snapshot!("depthwise", describe(&cpu[0]));

        let mut full = Case::conv(&[1, 96, 56, 56], &[24, 96, 3, 3], &[1, 24, 56, 56]);
        full.pads = vec![1, 1, 1, 1];
        let [cpu, gpu] = full.check();
        assert!(cpu[0].label.starts_with("conv_direct"));
        assert!(gpu[0].label.starts_with("conv_tiled"));
        assert_covers(&cpu[0]);

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
        let [cpu, _] = c3.check();
        assert!(cpu[0].label.starts_with("conv_direct"));
        // The depth window is a run-time loop: kd, sd, dd, pd follow the extents.
        assert_eq!(&cpu[0].params[..13], [2, 4, 1, 5, 6, 7, 5, 6, 7, 3, 1, 1, 1]);
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
        assert_covers(&cpu[0]);
        insta::assert_snapshot!("transposed", describe(&cpu[0]));
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
                // The bias, then the residuals in the files' optional last slots.
                let slots: Vec<(&str, Slot)> =
                    d.bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
                assert_eq!(
                    slots[2..],
                    [
                        ("y", Slot::Output(0)),
                        ("b", Slot::Input(2)),
                        ("r0", Slot::Input(3)),
                        ("r1", Slot::Input(4))
                    ],
                    "{}",
                    d.label
                );
            }
        }
        // Residuals are read element by element, right before each store (post_op).
        let mut c = Case::conv(&[1, 8, 6, 6], &[8, 1, 3, 3], &[1, 8, 6, 6]);
        (c.group, c.pads, c.bias) = (8, vec![1; 4], true);
        (c.post, c.residuals, c.in_place) = (("Add,Relu,Mul", Vec::new()), 2, true);
        let d = c.lower(DeviceClass::Cpu).unwrap();
        let start = d[0].wgsl.find("fn post_op").unwrap();
        let end = start + d[0].wgsl[start..].find("\n}\n").unwrap() + 3;
        insta::assert_snapshot!("residual_post_op", &d[0].wgsl[start..end]);
    }

    #[test]
    fn scaled_channels_take_the_first_optional_slot() {
        let mut c = Case::conv(&[2, 16, 8, 8], &[24, 16, 1, 1], &[2, 24, 8, 8]);
        (c.scaled, c.post, c.residuals, c.in_place) = (true, ("Add,Relu", Vec::new()), 1, true);
        let [cpu, gpu] = c.check();
        for d in [&cpu[0], &gpu[0]] {
            // The scales in r0, the residual in r1.
            let slots: Vec<(&str, Slot)> =
                d.bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
            assert_eq!(
                slots[3..],
                [("b", Slot::Input(2)), ("r0", Slot::Input(3)), ("r1", Slot::Input(4))]
            );
            assert_eq!(override_of(d, "SCALED"), Some(1.0), "{}", d.label);
        }
        assert_eq!(
            (labels(&cpu), labels(&gpu)),
            (vec!["conv_pointwise_24x16x64"], vec!["conv_tiled_24x16x64"])
        );
        insta::assert_snapshot!("pointwise_scaled", describe(&cpu[0]));
        // Two operands besides the scales have no slot; a 3x3 conv takes no scales.
        let mut two = c.clone();
        (two.post, two.residuals, two.in_place) = (("Add,Mul", Vec::new()), 2, false);
        assert!(two.lower(DeviceClass::Cpu).is_err());
        let wide = Case {
            scaled: true,
            pads: vec![1; 4],
            ..Case::conv(&[1, 4, 6, 6], &[8, 4, 3, 3], &[1, 8, 6, 6])
        };
        assert!(wide.lower(DeviceClass::Gpu).is_err());
    }

    #[test]
    fn large_outputs_spread_over_two_grid_dimensions() {
        let mut c = Case::conv(&[1, 256, 2048, 2048], &[256, 1, 3, 3], &[1, 256, 2048, 2048]);
        (c.group, c.pads) = (256, vec![1; 4]);
        let [cpu, _] = c.check();
        assert!(cpu[0].groups[1] > 1, "{:?}", cpu[0].groups);
        assert_covers(&cpu[0]);
    }

    /// An STFT as a conv (one channel, 256-tap windows at stride 128): one matrix product
    /// through strides, X never copied; end padding (a last window past the input) keeps it
    /// off.
    #[test]
    fn long_windows_are_one_strided_product() {
        let mut c = Case::conv(&[2, 1, 832], &[258, 1, 256], &[2, 258, 5]);
        c.strides = vec![128];
        c.bias = true;
        for d in c.check() {
            assert_eq!(d.len(), 1);
            assert!(d[0].label.starts_with("conv_rb"), "{}", d[0].label);
            // m, n, k, batches, inner batches, A's and B's batch strides, A's strides of i and
            // k, B's of k and j: X read at 1 along the window and 128 along its positions.
            assert_eq!(d[0].params[..13], [258, 5, 256, 2, 2, 0, 0, 0, 832, 256, 1, 1, 128]);
        }
        let mut padded = Case::conv(&[1, 1, 832], &[258, 1, 256], &[1, 258, 6]);
        padded.strides = vec![128];
        padded.pads = vec![0, 64];
        for d in padded.check() {
            assert!(!d[0].label.starts_with("conv_rb"), "{}", d[0].label);
        }
    }

    #[test]
    fn what_has_no_kernel() {
        let c = Case::conv(&[1, 4, 8, 8], &[4, 4, 3, 3], &[1, 4, 6, 6]);
        let desc = |s: &[usize], dtype| TensorDesc::new(dtype, s.to_vec());
        let inputs =
            [Operand::arena(desc(&c.x, DType::F64), 0), Operand::weight(desc(&c.w, DType::F64), 0)];
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

    /// Representative steps of each kernel for both device classes, with and without a bias,
    /// at aligned and misaligned offsets: every dispatch compiles with its overrides and takes
    /// its bindings and params; steps of one window and block share one module whatever their
    /// extents and channel counts.
    #[test]
    fn representative_steps_compile_and_share_modules() {
        let steps: [(&str, Case); 7] = [
            ("pointwise", Case::conv(&[1, 16, 12, 20], &[24, 16, 1, 1], &[1, 24, 12, 20])),
            ("depthwise", {
                let mut c = Case::conv(&[1, 8, 15, 17], &[8, 1, 5, 5], &[1, 8, 15, 17]);
                (c.group, c.pads) = (8, vec![2; 4]);
                c
            }),
            ("general", {
                let mut c = Case::conv(&[1, 6, 10, 12], &[16, 6, 3, 3], &[1, 16, 5, 6]);
                (c.strides, c.pads) = (vec![2, 2], vec![1; 4]);
                c
            }),
            ("grouped", {
                let mut c = Case::conv(&[1, 8, 9, 9], &[8, 2, 3, 3], &[1, 8, 7, 7]);
                c.group = 4;
                c
            }),
            ("1-D", Case::conv(&[2, 3, 30], &[4, 3, 5], &[2, 4, 26])),
            ("3-D", Case::conv(&[1, 2, 4, 5, 6], &[3, 2, 2, 2, 2], &[1, 3, 3, 4, 5])),
            ("transposed", {
                let mut c = Case::conv(&[1, 4, 7, 9], &[4, 6, 3, 3], &[1, 6, 15, 19]);
                (c.op, c.strides) = ("ConvTranspose", vec![2, 2]);
                c
            }),
        ];
        for (what, case) in steps {
            for bias in [false, true] {
                let attrs = case.attrs();
                let m = if case.op == "Conv" { case.w[0] } else { case.w[1] * case.group as usize };
                let mut inputs = vec![&case.x[..], &case.w[..]];
                let b = [m];
                if bias {
                    inputs.push(&b);
                }
                for skew in [0, 4] {
                    let all =
                        lower_f32_all_classes(lower, case.op, &attrs, &inputs, &[&case.y], skew);
                    assert_eq!(all.len(), 2, "{what}");
                    for d in &all {
                        check_dispatch(d);
                    }
                }
            }
        }
        // Two depthwise steps of one window at different extents and channel counts: one
        // module.
        let dw = |c: usize, h: usize, w: usize| {
            let mut case = Case::conv(&[1, c, h, w], &[c, 1, 3, 3], &[1, c, h, w]);
            (case.group, case.pads, case.bias) = (c as i64, vec![1; 4], true);
            case.lower(DeviceClass::Cpu).unwrap().remove(0)
        };
        let (a, b) = (dw(32, 64, 64), dw(96, 48, 128));
        assert_eq!((&a.wgsl, &a.overrides), (&b.wgsl, &b.overrides));
        assert_ne!(a.params, b.params);
    }

    #[test]
    fn col2im_leads_with_dims_of_one() {
        // A 2-D image 5 x 4 from 2 x 3 blocks at strides 2 x 1, padded 1 above: 3 x 2
        // positions; the leading third dim has extent, block, stride and dilation one.
        let attrs = Attrs::new()
            .with("image_shape", AttrValue::Ints(vec![5, 4]))
            .with("block_shape", AttrValue::Ints(vec![2, 3]))
            .with("strides", AttrValue::Ints(vec![2, 1]))
            .with("dilations", AttrValue::Ints(vec![1, 1]))
            .with("pads", AttrValue::Ints(vec![1, 0, 0, 0]));
        let d = lower_f32_all_classes(lower, "Col2Im", &attrs, &[&[2, 12, 6]], &[&[2, 2, 5, 4]], 0);
        valid(&d);
        let along = [1, 3, 2];
        let want =
            [&[80, 6, 6][..], &[1, 5, 4], &[1, 2, 3], &[1, 2, 1], &[1, 1, 1], &[0, 1, 0], &along]
                .concat();
        for d in &d {
            assert_eq!(d.params, want);
        }
    }

    #[test]
    fn deform_conv_binds_the_bias_and_mask_it_has_in_order() {
        let attrs = |bias, mask| crate::conv::deform::tests::canonical(2, bias, mask);
        for (bias, mask) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut inputs: Vec<&[usize]> = vec![&[1, 4, 6, 6], &[6, 2, 3, 3], &[1, 36, 6, 6]];
            if bias {
                inputs.push(&[6]);
            }
            if mask {
                inputs.push(&[1, 18, 6, 6]);
            }
            let d = lower_f32_all_classes(
                lower,
                "DeformConv",
                &attrs(bias, mask),
                &inputs,
                &[&[1, 6, 6, 6]],
                0,
            );
            // `valid` checks that every slot a module reads is bound.
            valid(&d);
            let names: Vec<&str> = d[0].bindings.iter().map(|b| b.name.as_str()).collect();
            let extras = usize::from(bias) + usize::from(mask);
            assert_eq!(names, ["x", "w", "offset", "y", "extra0", "extra1"][..4 + extras]);
        }
    }
}
