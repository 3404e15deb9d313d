//! Conv, ConvTranspose, ConvInteger, DeformConv (`deform.rs`) and Col2Im (`col2im.rs`: the
//! inverse of im2col): attribute defaults, padding rules and shape inference;
//! the kernels are in `ops/src/conv/cpu.rs` (ConvInteger's exact int32 one in
//! `cpu/integer.rs`). ConvInteger's canonical form: Conv's window attributes and `group`, plus
//! `x_zero_point` and `w_zero_point` (1 where the model gives that input), its inputs X, W and
//! the zero points given; W's zero point is one value or one per output channel.
//!
//! Canonical attributes are exactly what the kernels read: `kernel_shape` (taken from the
//! weights when absent), `strides`, `dilations`, `group` and explicit `pads` (all begins, then
//! all ends). `auto_pad` is resolved into `pads` here; ConvTranspose's `output_shape` and
//! `output_padding` are folded into its pads too (an end pad may then be negative: the output
//! is longer than the full transposed conv and the extra positions hold only the bias). An
//! absent bias leaves two inputs. The pool family shares [`canonical_window`].
//!
//! **Post-ops** (the `fuse` pass fills them; `lower` writes them empty): `post_ops` (text, op
//! names separated by commas in the order they apply: the activations `Relu`, `LeakyRelu`,
//! `Clip`, `Sigmoid`, `HardSigmoid`, `HardSwish`, `Tanh`, `Swish` and the binary `Add`, `Sub`, `RSub`,
//! `Mul`; empty for none) and `post_params` (floats: the activations' parameters in order,
//! Clip min and max, LeakyRelu alpha, HardSigmoid alpha and beta). Each binary post-op reads
//! the next extra input after X, W and B; B is then always present. An extra input is f32 with
//! the output's shape, or holds one element. The runtime side, and why a leading `Add` lets
//! the step run over its operand, is `ops/src/cpu/post.rs`. Gemm and MatMul
//! (`matmul.rs`) take post-ops the same way.
//!
//! **8-bit weights** (the compiler's `dequantize_in_gemm` writes them; [`dequantizes_w`]): a
//! Conv with `dequantize_w = 1` reads W as int8 or uint8 and dequantizes it as it multiplies.
//! Its own inputs are then X, W and, in B's place, W's table: float32 `[3, M]`
//! ([`weight_table_shape`]), per output channel a scale (row 0), a zero point (row 1) and the
//! bias (row 2); `w = (q - zero) * scale` as DequantizeLinear computes it. One input for the
//! three keeps the op's inputs and the Vulkan kernels' bindings as they are.
//!
//! **Float16 weights** ([`crate::takes_f16_weights`]; the compiler's `widen_f16` leaves a constant
//! f16 W so): a float32 Conv may read W as float16, which its kernels widen exactly as they
//! load it (the CPU's GEMM as it packs a block of W's rows, Vulkan's `weight` hooks), so an
//! f16 model's weights stay f16 in memory and no step widens them each run.
//!
//! **Scaled input channels** (the compiler's `channel_scales` writes them; [`scales_x`]): a
//! Conv with `scale_x = 1` computes `conv(X * S)` for S float32 `[N, C, 1, ..]`, one factor
//! per image and input channel: a squeeze-and-excitation block's product, which then needs no
//! step and no tensor of its own. Its inputs are X, W, B (always) and S, then the post-ops'
//! operands; only a 1x1 conv with stride 1, no padding, one group and float weights, with at
//! most one post-op operand, takes it ([`can_scale_x`]: the Vulkan kernels' slots for S and
//! the operands).

pub(crate) mod col2im;
pub(crate) mod cpu;
pub(crate) mod deform;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: crate::cpu::post::in_place_after_add,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::cpu::post;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::registry::{Family, OpDef};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("Conv", lower_conv, infer_conv),
    OpDef::new("ConvTranspose", lower_conv_transpose, infer_conv_transpose),
    OpDef::new("Col2Im", col2im::lower, col2im::infer),
    OpDef::new("DeformConv", deform::lower, deform::infer),
    OpDef::new("QLinearConv", lower_qlinear_conv, infer_qlinear_conv).cpu_only(
        "the exact int32 conv and its requantization run on the CPU; no Vulkan kernel yet",
    ),
    OpDef::new("ConvInteger", lower_conv_integer, infer_conv_integer).cpu_only(
        "its int32 sums run on the CPU; dynamic quantization's ConvInteger cast to float becomes \
         a Conv of 8-bit W (the compiler's integer_products pass), which Vulkan runs",
    ),
];

/// Whether a Conv reads 8-bit weights and dequantizes them itself (see the module's text).
pub fn dequantizes_w(attrs: &Attrs) -> bool {
    attrs.int_or("dequantize_w", 0).is_ok_and(|v| v != 0)
}

/// Whether a Conv computes `conv(X * S)` with its fourth input S (see the module's text).
pub fn scales_x(attrs: &Attrs) -> bool {
    attrs.int_or("scale_x", 0).is_ok_and(|v| v != 0)
}

/// Whether a Conv of canonical `attrs` and weights of shape `w` may take [`scales_x`]: 1x1,
/// stride 1, unpadded, one group, float weights, at most one post-op operand.
pub fn can_scale_x(attrs: &Attrs, w: &TensorDesc) -> bool {
    let all =
        |name: &str, value: i64| attrs.ints(name).is_ok_and(|v| v.iter().all(|&k| k == value));
    w.dtype == DType::F32
        && w.shape.iter().skip(2).all(|&k| k == 1)
        && attrs.int("group").is_ok_and(|g| g == 1)
        && all("strides", 1)
        && all("pads", 0)
        && !dequantizes_w(attrs)
        && post::extra_inputs(attrs).is_ok_and(|n| n <= 1)
}

/// The shape of a [`dequantizes_w`] Conv's table for `m` output channels: scales, zero points
/// and the bias.
pub fn weight_table_shape(m: usize) -> [usize; 2] {
    [3, m]
}

/// The sliding-window attributes of a conv or pool node, with defaults filled in.
struct WindowAttrs {
    pub kernel: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    /// `NOTSET` (also for an empty string), `VALID`, `SAME_UPPER` or `SAME_LOWER`.
    pub auto_pad: String,
    /// Explicit `pads`, zeros when absent (meaningful only for `NOTSET`).
    pub pads: Vec<i64>,
}

impl WindowAttrs {
    /// Reads the attributes for `rank` spatial dims; `kernel` stands in for `kernel_shape`.
    pub fn read(node: &Node, rank: usize, kernel: Option<&[usize]>) -> OpResult<Self> {
        let a = &node.attrs;
        let kernel = match (a.ints_opt("kernel_shape")?, kernel) {
            (Some(k), _) => k.to_vec(),
            (None, Some(k)) => k.iter().map(|&k| k as i64).collect(),
            (None, None) => return Err(op_err!("kernel_shape is required")),
        };
        let ones = || vec![1; rank];
        let strides = a.ints_opt("strides")?.map_or_else(ones, <[i64]>::to_vec);
        let dilations = a.ints_opt("dilations")?.map_or_else(ones, <[i64]>::to_vec);
        let pads = a.ints_opt("pads")?.map_or_else(|| vec![0; 2 * rank], <[i64]>::to_vec);
        let auto_pad = match a.text_or("auto_pad", "NOTSET")? {
            "" => "NOTSET",
            p @ ("NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER") => p,
            other => return Err(op_err!("auto_pad '{other}' is not one ONNX defines")),
        }
        .to_string();
        for (what, v, len) in [
            ("kernel_shape", &kernel, rank),
            ("strides", &strides, rank),
            ("dilations", &dilations, rank),
            ("pads", &pads, 2 * rank),
        ] {
            if v.len() != len {
                return Err(op_err!(
                    "{what} {v:?} should have {len} values for {rank} spatial dims"
                ));
            }
            if what != "pads" && v.iter().any(|&x| x < 1) {
                return Err(op_err!("{what} {v:?} must be positive"));
            }
        }
        if pads.iter().any(|&p| p < 0) {
            return Err(op_err!("pads {pads:?} must not be negative"));
        }
        Ok(Self { kernel, strides, dilations, auto_pad, pads })
    }

    /// `(kernel - 1) * dilation + 1` along spatial dim `d`.
    pub fn extent(&self, d: usize) -> i128 {
        extent(self.kernel[d], self.dilations[d])
    }

    /// Explicit pads for `input` extents: `pads` for NOTSET, zeros for VALID, and for SAME_*
    /// whatever makes the output `ceil(input / stride)` long (the odd pixel at the end for
    /// SAME_UPPER, at the beginning for SAME_LOWER).
    pub fn resolved_pads(&self, input: &[usize]) -> OpResult<Vec<i64>> {
        let rank = input.len();
        Ok(match self.auto_pad.as_str() {
            "NOTSET" => self.pads.clone(),
            "VALID" => vec![0; 2 * rank],
            same => {
                let mut pads = vec![0; 2 * rank];
                for (d, &len) in input.iter().enumerate() {
                    let (len, s) = (len as i128, i128::from(self.strides[d]));
                    let out = (len + s - 1) / s;
                    let total = ((out - 1) * s + self.extent(d) - len).max(0);
                    let (begin, end) = split(total, same == "SAME_UPPER")?;
                    (pads[d], pads[rank + d]) = (begin, end);
                }
                pads
            }
        })
    }

    /// Writes the canonical `kernel_shape`, `strides`, `dilations` and `pads`; drops `auto_pad`.
    pub fn store(&self, node: &mut Node, pads: Vec<i64>) {
        let a = &mut node.attrs;
        a.remove("auto_pad");
        a.set("kernel_shape", AttrValue::Ints(self.kernel.clone()));
        a.set("strides", AttrValue::Ints(self.strides.clone()));
        a.set("dilations", AttrValue::Ints(self.dilations.clone()));
        a.set("pads", AttrValue::Ints(pads));
    }
}

/// `(kernel - 1) * dilation + 1`, in i128 like all window arithmetic here, so that no
/// attribute value overflows it; results are converted back with a check.
fn extent(kernel: i64, dilation: i64) -> i128 {
    (i128::from(kernel) - 1) * i128::from(dilation) + 1
}

/// Splits a total padding into (begin, end), the odd one at the end if `upper`, rounding
/// down as ONNX's reference does (Python `//`, also for negative totals).
fn split(total: i128, upper: bool) -> OpResult<(i64, i64)> {
    let half = total.div_euclid(2);
    let (begin, end) = if upper { (half, total - half) } else { (total - half, half) };
    let pad = |p: i128| i64::try_from(p).map_err(|_| op_err!("a padding of {p} is too large"));
    Ok((pad(begin)?, pad(end)?))
}

/// Canonical window attributes for an op over `input` spatial extents: defaults filled,
/// auto_pad resolved into pads. Returns whether auto_pad chose the pads.
pub(super) fn canonical_window(
    node: &mut Node,
    input: &[usize],
    kernel: Option<&[usize]>,
) -> OpResult<bool> {
    let w = WindowAttrs::read(node, input.len(), kernel)?;
    w.store(node, w.resolved_pads(input)?);
    Ok(w.auto_pad != "NOTSET")
}

/// The canonical window of a lowered node, for shape inference.
pub(super) struct Window {
    pub kernel: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub pads: Vec<i64>,
}

impl Window {
    pub fn of(node: &Node, rank: usize) -> OpResult<Self> {
        let a = &node.attrs;
        let w = Self {
            kernel: a.ints("kernel_shape")?.to_vec(),
            strides: a.ints("strides")?.to_vec(),
            dilations: a.ints("dilations")?.to_vec(),
            pads: a.ints("pads")?.to_vec(),
        };
        let positive = |v: &[i64]| v.len() == rank && v.iter().all(|&x| x > 0);
        if !positive(&w.kernel)
            || !positive(&w.strides)
            || !positive(&w.dilations)
            || w.pads.len() != 2 * rank
        {
            return Err(op_err!(
                "kernel_shape {:?}, strides {:?}, dilations {:?} and pads {:?} do not fit \
                 {rank} spatial dims",
                w.kernel,
                w.strides,
                w.dilations,
                w.pads
            ));
        }
        Ok(w)
    }

    /// Checks `kernel_shape` against the weights W [_, _, k..].
    fn matching(self, w: &[usize]) -> OpResult<Self> {
        if self.kernel.iter().zip(&w[2..]).any(|(&k, &wk)| k != wk as i64) {
            return Err(op_err!("kernel_shape {:?} differs from W {w:?}", self.kernel));
        }
        Ok(self)
    }

    pub fn extent(&self, d: usize) -> i128 {
        extent(self.kernel[d], self.dilations[d])
    }

    /// The padded input length along `d` that windows may cover.
    pub fn padded(&self, input: &[usize], d: usize) -> i128 {
        input[d] as i128 + i128::from(self.pads[d]) + i128::from(self.pads[input.len() + d])
    }

    /// Output extents of a strided window: `floor` (or, with `ceil`, `ceil` without a last
    /// window that starts past the input and its begin padding) of
    /// `(padded - extent) / stride + 1`.
    pub fn output(&self, input: &[usize], ceil: bool) -> OpResult<Vec<usize>> {
        (0..input.len())
            .map(|d| {
                let room = self.padded(input, d) - self.extent(d);
                let s = i128::from(self.strides[d]);
                if room < 0 {
                    return Err(op_err!(
                        "the window ({} with dilation {}) is larger than the padded input ({}) \
                         along spatial dim {d}",
                        self.kernel[d],
                        self.dilations[d],
                        self.padded(input, d)
                    ));
                }
                let mut out = if ceil { (room + s - 1) / s } else { room / s } + 1;
                if ceil && (out - 1) * s >= input[d] as i128 + i128::from(self.pads[d]) {
                    out -= 1;
                }
                usize::try_from(out).map_err(|_| op_err!("an output of {out} is too large"))
            })
            .collect()
    }
}

/// X [N, C, ..] and W of the same rank, at least 3.
fn conv_operands<'a>(
    x: Option<&'a TensorDesc>,
    w: Option<&'a TensorDesc>,
) -> OpResult<(&'a [usize], &'a [usize])> {
    let (Some(x), Some(w)) = (x, w) else {
        return Err(op_err!("X and W are required"));
    };
    if x.shape.len() < 3 || w.shape.len() != x.shape.len() {
        return Err(op_err!("X {:?} and W {:?} need the same rank, at least 3", x.shape, w.shape));
    }
    Ok((&x.shape, &w.shape))
}

/// The attributes of no post-ops, which `lower` gives every op that can take some.
pub(super) fn no_post_ops() -> Attrs {
    Attrs::new()
        .with("post_ops", AttrValue::Text(String::new()))
        .with("post_params", AttrValue::Floats(Vec::new()))
}

/// Splits the inputs of a node that takes post-ops into its own inputs and its post-ops'
/// operands; with operands, the node must have all `max` of its own inputs.
pub(super) fn post_operands<'a, 'b>(
    node: &Node,
    inputs: &'a [&'b TensorDesc],
    max: usize,
) -> OpResult<(&'a [&'b TensorDesc], &'a [&'b TensorDesc])> {
    let extra = post::extra_inputs(&node.attrs)?;
    match inputs.len().checked_sub(extra) {
        Some(own) if extra == 0 || own == max => Ok(inputs.split_at(own)),
        _ => Err(op_err!(
            "post-ops '{}' read {extra} extra inputs after all {max} of the op's own; the \
             node has {} inputs",
            node.attrs.text("post_ops")?,
            inputs.len()
        )),
    }
}

/// Checks the output and post-op operands of a node with post-ops: f32, each operand of the
/// output's shape, of one element, or (the products) a block of its trailing dims.
pub(super) fn check_post_operands(
    node: &Node,
    operands: &[&TensorDesc],
    out: &TensorDesc,
) -> OpResult<()> {
    if node.attrs.text("post_ops")?.is_empty() {
        return Ok(());
    }
    if out.dtype != DType::F32 {
        return Err(op_err!("post-ops run on f32 only, the output is {}", out.dtype));
    }
    let columns = post::takes_column_blocks(&node.op);
    let fits = |r: &TensorDesc| {
        r.shape == out.shape
            || r.elements() == 1
            || (columns && post::broadcasts(&r.shape, &out.shape))
    };
    match operands.iter().find(|r| r.dtype != DType::F32 || !fits(r)) {
        Some(r) => Err(op_err!(
            "a post-op operand is {} {:?}; it must be f32 of the output's shape {:?}, hold \
             one element, or (a product) a block of its trailing dims",
            r.dtype,
            r.shape,
            out.shape
        )),
        None => Ok(()),
    }
}

/// The canonical window attributes `canonical_window` left on `node`, and its `group`: the
/// attributes every conv of the family starts from.
pub(crate) fn window_and_group(node: &Node) -> OpResult<Attrs> {
    let mut attrs = Attrs::new().with("group", AttrValue::Int(node.attrs.int_or("group", 1)?));
    for name in ["kernel_shape", "strides", "dilations", "pads"] {
        if let Some(v) = node.attrs.get(name) {
            attrs.set(name, v.clone());
        }
    }
    Ok(attrs)
}

/// Fills `group`, keeps only the canonical attributes, writes empty post-ops and drops an
/// absent bias.
fn lower_group_and_bias(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let mut attrs = window_and_group(node)?;
    for (name, v) in no_post_ops().iter() {
        attrs.set(name, v.clone());
    }
    node.attrs = attrs;
    node.inputs.truncate(if cx.has_input(2) { 3 } else { 2 });
    Ok(())
}

fn lower_conv(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let (x, w) = conv_operands(cx.input(0).ok(), cx.input(1).ok())?;
    canonical_window(node, &x[2..], Some(&w[2..]))?;
    lower_group_and_bias(node, cx)
}

/// ConvInteger: Conv's window attributes and `group`, and `x_zero_point`, `w_zero_point` (1
/// where the model gives that input); its inputs X, W and the zero points given, in order.
fn lower_conv_integer(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if node.inputs.len() > 4 {
        return Err(op_err!("ConvInteger takes X, W and two optional zero points"));
    }
    let (x, w) = conv_operands(cx.input(0).ok(), cx.input(1).ok())?;
    canonical_window(node, &x[2..], Some(&w[2..]))?;
    let given = |i: usize| AttrValue::Int(i64::from(cx.has_input(i)));
    node.attrs =
        window_and_group(node)?.with("x_zero_point", given(2)).with("w_zero_point", given(3));
    node.inputs.retain(Option::is_some);
    Ok(())
}

/// QLinearConv: ConvInteger's window attributes and `group`, and `bias` (1 where B is given);
/// its inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point and B
/// where given.
fn lower_qlinear_conv(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if (0..8).any(|i| !cx.has_input(i)) || node.inputs.len() > 9 {
        return Err(op_err!("QLinearConv takes its eight quantization operands and an optional B"));
    }
    let (x, w) = conv_operands(cx.input(0).ok(), cx.input(3).ok())?;
    canonical_window(node, &x[2..], Some(&w[2..]))?;
    node.attrs = window_and_group(node)?.with("bias", AttrValue::Int(i64::from(cx.has_input(8))));
    node.inputs.retain(Option::is_some);
    Ok(())
}

/// The ConvInteger a QLinearConv's product is: its attributes, with both zero points given.
pub(crate) fn qlinear_product_attrs(attrs: &Attrs) -> Attrs {
    let mut product = attrs.clone();
    product.remove("bias");
    product.set("x_zero_point", AttrValue::Int(1));
    product.set("w_zero_point", AttrValue::Int(1));
    product
}

/// y_zero_point's type, of the integer conv's shape; scales float, B int32 [M].
fn infer_qlinear_conv(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let bias = node.attrs.int("bias")? != 0;
    if inputs.len() != 8 + usize::from(bias) {
        return Err(op_err!(
            "QLinearConv has {} inputs, its attributes say {}",
            inputs.len(),
            8 + usize::from(bias)
        ));
    }
    let product = Node { attrs: qlinear_product_attrs(&node.attrs), ..node.clone() };
    let y = infer_conv_integer(&product, &[inputs[0], inputs[3], inputs[2], inputs[5]])?;
    let m = y[0].shape[1];
    for (k, what, per_channel) in
        [(1, "x_scale", false), (4, "w_scale", true), (6, "y_scale", false)]
    {
        let s = inputs[k];
        if !s.dtype.is_float() || !(s.elements() == 1 || (per_channel && s.shape == [m])) {
            return Err(op_err!("{what} is {} {:?}", s.dtype, s.shape));
        }
    }
    let yz = inputs[7];
    if !matches!(yz.dtype, DType::I8 | DType::U8) || yz.elements() != 1 {
        return Err(op_err!("y_zero_point is {} {:?}: one int8 or uint8", yz.dtype, yz.shape));
    }
    if bias && (inputs[8].dtype != DType::I32 || inputs[8].shape != [m]) {
        return Err(op_err!("B is {} {:?}: int32 [{m}]", inputs[8].dtype, inputs[8].shape));
    }
    Ok(vec![TensorDesc::new(yz.dtype, y[0].shape.clone())])
}

fn infer_conv_integer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let given = |name: &str| node.attrs.int(name).map(|v| v != 0);
    let (xz, wz) = (given("x_zero_point")?, given("w_zero_point")?);
    let want = 2 + usize::from(xz) + usize::from(wz);
    if inputs.len() != want {
        return Err(op_err!("ConvInteger has {} inputs, its attributes say {want}", inputs.len()));
    }
    let (x, w) = conv_operands(inputs.first().copied(), inputs.get(1).copied())?;
    let m = check_channels(
        node,
        &inputs[..2],
        |g| w[1].checked_mul(g) == Some(x[1]) && w[0] % g == 0,
        |_| w[0],
    )?;
    for (k, what, per_channel) in [(0, "X", false), (1, "W", true)] {
        let operand = inputs[k];
        if !matches!(operand.dtype, DType::I8 | DType::U8) {
            return Err(op_err!("{what} must be int8 or uint8, got {}", operand.dtype));
        }
        let zero = match k {
            0 => xz.then(|| inputs[2]),
            _ => wz.then(|| inputs[want - 1]),
        };
        if let Some(z) = zero {
            let fits = z.elements() == 1 || (per_channel && z.shape == [m]);
            if z.dtype != operand.dtype || !fits {
                return Err(op_err!(
                    "{what}'s zero point is {} {:?}: one {}{}",
                    z.dtype,
                    z.shape,
                    operand.dtype,
                    if per_channel { " or one per output channel" } else { "" }
                ));
            }
        }
    }
    let win = Window::of(node, x.len() - 2)?.matching(w)?;
    let spatial = win.output(&x[2..], false)?;
    Ok(vec![TensorDesc::new(DType::I32, [&[x[0], m][..], &spatial].concat())])
}

fn lower_conv_transpose(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let (x, w) = conv_operands(cx.input(0).ok(), cx.input(1).ok())?;
    let input = &x[2..];
    let rank = input.len();
    let win = WindowAttrs::read(node, rank, Some(&w[2..]))?;
    let a = &node.attrs;
    let output_padding =
        a.ints_opt("output_padding")?.map_or_else(|| vec![0; rank], <[i64]>::to_vec);
    if output_padding.len() != rank {
        return Err(op_err!("output_padding {output_padding:?} should have {rank} values"));
    }
    // Some exporters write output_shape with N and C in front: the spatial part is the tail.
    let output_shape = match a.ints_opt("output_shape")? {
        Some(s) if s.len() >= rank => Some(s[s.len() - rank..].to_vec()),
        Some(s) => return Err(op_err!("output_shape {s:?} has fewer than {rank} values")),
        None => None,
    };
    // The full transposed conv is stride * (in - 1) + output_padding + extent long; pads crop it.
    let full = |d: usize| {
        i128::from(win.strides[d]) * (input[d] as i128 - 1)
            + i128::from(output_padding[d])
            + win.extent(d)
    };
    let mut pads = match (&output_shape, win.auto_pad.as_str()) {
        (None, "NOTSET") => win.pads.clone(),
        (None, "VALID") => vec![0; 2 * rank],
        _ => {
            // ONNX: a given output_shape (or input * stride for SAME_*) fixes the total
            // padding; SAME_UPPER puts the odd pixel at the end, everything else at the start.
            let mut pads = vec![0; 2 * rank];
            for d in 0..rank {
                let target = match &output_shape {
                    Some(s) => i128::from(s[d]),
                    None => input[d] as i128 * i128::from(win.strides[d]),
                };
                let (begin, end) = split(full(d) - target, win.auto_pad == "SAME_UPPER")?;
                (pads[d], pads[rank + d]) = (begin, end);
            }
            pads
        }
    };
    // Canonical: output_padding is more room at the end, i.e. less end padding.
    for (d, &op) in output_padding.iter().enumerate() {
        let end = &mut pads[rank + d];
        *end = end
            .checked_sub(op)
            .ok_or_else(|| op_err!("output_padding {output_padding:?} is too large"))?;
    }
    win.store(node, pads);
    lower_group_and_bias(node, cx)
}

/// Checks `group` against the channels and the bias; returns the output channels.
fn check_channels(
    node: &Node,
    inputs: &[&TensorDesc],
    x_channels_per_group: impl Fn(usize) -> bool,
    out_channels: impl Fn(usize) -> usize,
) -> OpResult<usize> {
    let group = usize::try_from(node.attrs.int("group")?)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| op_err!("group must be positive"))?;
    let m = out_channels(group);
    if !x_channels_per_group(group) {
        return Err(op_err!(
            "X {:?} and W {:?} do not match with group {group}",
            inputs[0].shape,
            inputs[1].shape
        ));
    }
    if let Some(b) = inputs.get(2)
        && b.shape != [m]
    {
        return Err(op_err!("bias {:?} should hold {m} values", b.shape));
    }
    Ok(m)
}

fn infer_conv(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let scaled = scales_x(&node.attrs);
    let (inputs, operands) = post_operands(node, inputs, 3 + usize::from(scaled))?;
    let inputs = match (dequantizes_w(&node.attrs), scaled) {
        (true, _) => weight_table(inputs)?,
        (false, true) => channel_scales(node, inputs)?,
        (false, false) => inputs,
    };
    let (x, w) = conv_operands(inputs.first().copied(), inputs.get(1).copied())?;
    let m = check_channels(
        node,
        inputs,
        |g| w[1].checked_mul(g) == Some(x[1]) && w[0] % g == 0,
        |_| w[0],
    )?;
    let win = Window::of(node, x.len() - 2)?.matching(w)?;
    let spatial = win.output(&x[2..], false)?;
    let shape = [&[x[0], m][..], &spatial].concat();
    let out = TensorDesc::new(inputs[0].dtype, shape);
    check_post_operands(node, operands, &out)?;
    Ok(vec![out])
}

/// Checks a [`scales_x`] Conv's S against X and the conv against [`can_scale_x`]; X, W and B,
/// which the rest of inference checks.
fn channel_scales<'a, 'b>(
    node: &Node,
    own: &'a [&'b TensorDesc],
) -> OpResult<&'a [&'b TensorDesc]> {
    let [x, w, _, s] = own else {
        return Err(op_err!("a Conv that scales X's channels takes X, W, B and the scales"));
    };
    if !can_scale_x(&node.attrs, w) {
        return Err(op_err!(
            "only a 1x1 conv with stride 1, no padding, one group, float weights and at most \
             one post-op operand scales X's channels"
        ));
    }
    let want: Vec<usize> =
        x.shape.iter().enumerate().map(|(d, &e)| if d < 2 { e } else { 1 }).collect();
    if s.dtype != DType::F32 || s.shape != want {
        return Err(op_err!(
            "the channel scales are {} {:?}, not float32 {want:?} (one per image and channel of X)",
            s.dtype,
            s.shape
        ));
    }
    Ok(&own[..3])
}

/// Checks a [`dequantizes_w`] Conv's X, W and table against each other; X and W, whose shapes
/// the rest of inference checks.
fn weight_table<'a, 'b>(own: &'a [&'b TensorDesc]) -> OpResult<&'a [&'b TensorDesc]> {
    let [x, w, dq] = own else {
        return Err(op_err!("a Conv of 8-bit weights takes X, W and W's table"));
    };
    if x.dtype != DType::F32 || !matches!(w.dtype, DType::I8 | DType::U8) {
        return Err(op_err!("a Conv of 8-bit weights reads int8 or uint8 W beside float32 X"));
    }
    let m = w.shape.first().copied().unwrap_or(0);
    if dq.dtype != DType::F32 || dq.shape != weight_table_shape(m) {
        return Err(op_err!(
            "W's table is {} {:?}, not float32 [3, {m}] (scales, zero points and bias per \
             output channel)",
            dq.dtype,
            dq.shape
        ));
    }
    Ok(&own[..2])
}

fn infer_conv_transpose(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (inputs, operands) = post_operands(node, inputs, 3)?;
    let (x, w) = conv_operands(inputs.first().copied(), inputs.get(1).copied())?;
    let m = check_channels(
        node,
        inputs,
        |g| x[1] == w[0] && x[1] % g == 0,
        // Saturating: an absurd group makes a count no bias or later check accepts.
        |g| w[1].saturating_mul(g),
    )?;
    let win = Window::of(node, x.len() - 2)?.matching(w)?;
    let input = &x[2..];
    let spatial = (0..input.len())
        .map(|d| {
            let out = i128::from(win.strides[d]) * (input[d] as i128 - 1) + win.extent(d)
                - i128::from(win.pads[d])
                - i128::from(win.pads[input.len() + d]);
            usize::try_from(out).map_err(|_| op_err!("pads {:?} crop the whole output", win.pads))
        })
        .collect::<OpResult<Vec<_>>>()?;
    let shape = [&[x[0], m][..], &spatial].concat();
    let out = TensorDesc::new(inputs[0].dtype, shape);
    check_post_operands(node, operands, &out)?;
    Ok(vec![out])
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use ingot_schema::DType;

    pub fn node(op: &str, n_inputs: usize, n_outputs: usize, attrs: Attrs) -> Node {
        Node {
            name: String::new(),
            op: op.to_string(),
            domain: String::new(),
            inputs: (0..n_inputs).map(Some).collect(),
            outputs: (n_inputs..n_inputs + n_outputs).collect(),
            attrs,
        }
    }

    pub fn f32(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape)
    }

    /// Lowers `node` with these inputs (`None` omitted) at opset 21, then infers its outputs.
    pub fn lower_and_infer(
        def: &OpDef,
        node: &mut Node,
        inputs: &[Option<&TensorDesc>],
    ) -> Vec<TensorDesc> {
        node.inputs.resize(inputs.len(), None);
        for (slot, given) in node.inputs.iter_mut().zip(inputs) {
            if given.is_none() {
                *slot = None;
            }
        }
        let cx = LowerCx { opset: 21, inputs: inputs.to_vec(), consts: vec![None; inputs.len()] };
        (def.lower)(node, &cx).unwrap();
        let present: Vec<&TensorDesc> =
            node.inputs.iter().zip(inputs).filter_map(|(i, d)| i.and(*d)).collect();
        (def.infer)(node, &present).unwrap()
    }

    pub fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    fn text(s: &str) -> AttrValue {
        AttrValue::Text(s.to_string())
    }

    #[test]
    fn conv_same_padding_puts_the_odd_pixel_where_asked() {
        // Height 6, kernel 2 with dilation 2 (extent 3), stride 2: out = ceil(6 / 2) = 3,
        // total padding (3 - 1) * 2 + 3 - 6 = 1.
        let (x, w) = (f32(&[1, 2, 6, 5]), f32(&[4, 2, 2, 1]));
        for (mode, pads) in [("SAME_UPPER", [0, 0, 1, 0]), ("SAME_LOWER", [1, 0, 0, 0])] {
            let attrs = Attrs::new()
                .with("auto_pad", text(mode))
                .with("strides", ints(&[2, 1]))
                .with("dilations", ints(&[2, 1]));
            let mut n = node("Conv", 3, 1, attrs);
            let out = lower_and_infer(&OPS[0], &mut n, &[Some(&x), Some(&w), None]);
            assert_eq!(out, [f32(&[1, 4, 3, 5])]);
            assert_eq!(n.inputs.len(), 2, "the absent bias is dropped");
            let expected = no_post_ops()
                .with("kernel_shape", ints(&[2, 1]))
                .with("strides", ints(&[2, 1]))
                .with("dilations", ints(&[2, 1]))
                .with("pads", ints(&pads))
                .with("group", AttrValue::Int(1));
            assert_eq!(n.attrs, expected, "{mode}");
        }
    }

    #[test]
    fn conv_shapes_follow_the_spec() {
        // test_conv_with_strides_and_asymmetric_padding: 7x5 input, 3x3 kernel, stride 2,
        // pads [1, 0, 1, 0] -> 4x2; grouped with bias keeps three inputs.
        let (x, w, b) = (f32(&[1, 1, 7, 5]), f32(&[1, 1, 3, 3]), f32(&[1]));
        let attrs = Attrs::new().with("strides", ints(&[2, 2])).with("pads", ints(&[1, 0, 1, 0]));
        let mut n = node("Conv", 3, 1, attrs);
        let out = lower_and_infer(&OPS[0], &mut n, &[Some(&x), Some(&w), Some(&b)]);
        assert_eq!(out, [f32(&[1, 1, 4, 2])]);
        assert_eq!(n.inputs.len(), 3);

        let (x, w) = (f32(&[2, 6, 9]), f32(&[4, 3, 3]));
        let mut n = node(
            "Conv",
            2,
            1,
            Attrs::new().with("group", AttrValue::Int(2)).with("auto_pad", text("VALID")),
        );
        assert_eq!(lower_and_infer(&OPS[0], &mut n, &[Some(&x), Some(&w)]), [f32(&[2, 4, 7])]);

        let bad = node("Conv", 2, 1, n.attrs.clone().with("group", AttrValue::Int(3)));
        assert!(infer_conv(&bad, &[&x, &w]).is_err(), "6 channels, group 3, W wants 3 per group");
    }

    #[test]
    fn conv_transpose_output_shape_and_output_padding_become_pads() {
        // ONNX's test_convtranspose_output_shape / _pad / _kernel_shape all give [1, 2, 10, 8]
        // for a 3x3 input, 3x3 kernel, strides [3, 2]: the full result is 9x7, and the extra
        // row and column are end pads of -1.
        let (x, w) = (f32(&[1, 1, 3, 3]), f32(&[1, 2, 3, 3]));
        let strides = ("strides", ints(&[3, 2]));
        let cases = [
            Attrs::new().with(strides.0, strides.1.clone()).with("output_shape", ints(&[10, 8])),
            Attrs::new().with(strides.0, strides.1.clone()).with("output_padding", ints(&[1, 1])),
            Attrs::new()
                .with(strides.0, strides.1.clone())
                .with("output_shape", ints(&[10, 8]))
                .with("output_padding", ints(&[1, 1]))
                .with("kernel_shape", ints(&[3, 3])),
        ];
        for attrs in cases {
            let mut n = node("ConvTranspose", 2, 1, attrs);
            assert_eq!(
                lower_and_infer(&OPS[1], &mut n, &[Some(&x), Some(&w)]),
                [f32(&[1, 2, 10, 8])]
            );
            assert_eq!(n.attrs.ints("pads").unwrap(), &[0, 0, -1, -1]);
            assert!(!n.attrs.contains("output_shape") && !n.attrs.contains("output_padding"));
        }
    }

    #[test]
    fn conv_transpose_same_and_explicit_pads() {
        // test_convtranspose_autopad_same: SAME_UPPER, stride 2 -> 6x6, crop one at the end.
        let (x, w) = (f32(&[1, 1, 3, 3]), f32(&[1, 2, 3, 3]));
        let attrs =
            Attrs::new().with("auto_pad", text("SAME_UPPER")).with("strides", ints(&[2, 2]));
        let mut n = node("ConvTranspose", 2, 1, attrs);
        assert_eq!(lower_and_infer(&OPS[1], &mut n, &[Some(&x), Some(&w)]), [f32(&[1, 2, 6, 6])]);
        assert_eq!(n.attrs.ints("pads").unwrap(), &[0, 0, 1, 1]);
        // test_convtranspose_pads: strides [3, 2], pads [1, 2, 1, 2] -> 7x3.
        let attrs = Attrs::new().with("strides", ints(&[3, 2])).with("pads", ints(&[1, 2, 1, 2]));
        let mut n = node("ConvTranspose", 2, 1, attrs);
        assert_eq!(lower_and_infer(&OPS[1], &mut n, &[Some(&x), Some(&w)]), [f32(&[1, 2, 7, 3])]);
        // Grouped: W is [C, M / group, k..].
        let (x, w, b) = (f32(&[1, 4, 2, 2]), f32(&[4, 3, 2, 2]), f32(&[6]));
        let mut n = node("ConvTranspose", 3, 1, Attrs::new().with("group", AttrValue::Int(2)));
        let out = lower_and_infer(&OPS[1], &mut n, &[Some(&x), Some(&w), Some(&b)]);
        assert_eq!(out, [f32(&[1, 6, 3, 3])]);
    }

    #[test]
    fn post_op_operands_follow_the_bias() {
        // A Conv with "Add,Relu,Mul": X, W, B, then R (the output's shape) and a scalar.
        let (x, w, b) = (f32(&[1, 2, 5, 5]), f32(&[4, 2, 3, 3]), f32(&[4]));
        let mut n = node("Conv", 3, 1, Attrs::new());
        lower_and_infer(&OPS[0], &mut n, &[Some(&x), Some(&w), Some(&b)]);
        assert_eq!(n.attrs.text("post_ops").unwrap(), "", "lower writes no post-ops");
        n.attrs.set("post_ops", text("Add,Relu,Mul"));
        let (r, one) = (f32(&[1, 4, 3, 3]), f32(&[1]));
        assert_eq!(infer_conv(&n, &[&x, &w, &b, &r, &one]).unwrap(), std::slice::from_ref(&r));
        assert!(infer_conv(&n, &[&x, &w, &r, &one]).is_err(), "B must be present");
        assert!(infer_conv(&n, &[&x, &w, &b, &b, &one]).is_err(), "no broadcasting");
        let ints64 = TensorDesc::new(DType::I64, vec![1, 4, 3, 3]);
        assert!(infer_conv(&n, &[&x, &w, &b, &ints64, &one]).is_err());
        n.attrs.set("post_ops", text("Swish"));
        assert!(infer_conv(&n, &[&x, &w, &b]).is_err(), "unknown post-op");
    }
}
