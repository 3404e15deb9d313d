//! Vulkan kernels of the pool family (ops: ops/src/pool/cpu.rs): MaxPool, AveragePool and
//! LpPool over 1 to 3 spatial dimensions, float32, and the global pools.
//!
//! A windowed pool runs `window.wgsl`: one invocation per output element, looping over its
//! window; shapes, strides, dilations and pads are push-constant params, and so are the window
//! sizes on GPUs (one module for every window), while CPU-type devices get them as overrides
//! so that the taps unroll as they did when every bound was a literal. A tap outside the input
//! is skipped (checked only when some window can leave the input), so padding is never read.
//! AveragePool divides by the taps inside the input, or with `count_include_pad` by the taps
//! inside the input or its padding: in ceil mode a window may run past the end padding, and
//! those taps count for nothing, as on the CPU. The global pools are reductions over the
//! spatial axes ([`super::reduce::Reduction`]). MaxPool's Indices output is written as two u32
//! words per int64; int8/uint8 MaxPool has no kernel. RoiAlign runs `roi_align.wgsl`, one
//! invocation per output element, float32; MaxUnpool `unpool.wgsl`, a zero fill and then a
//! scatter of X.

use crate::no_kernel;
use crate::reduce::vulkan::{Fold, MAX_TRIPS, Out, Reduction, Space, Stage};
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, NoKernel, Spec, Wgsl, f32_lit,
};
use crate::wgsl;
use ingot_schema::DType;

static WINDOW: Wgsl = wgsl!("pool/window.wgsl");
static ROI_ALIGN: Wgsl = wgsl!("pool/roi_align.wgsl");
static UNPOOL: Wgsl = wgsl!("pool/unpool.wgsl");

/// The family's kernel files.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 3] = [&WINDOW, &ROI_ALIGN, &UNPOOL];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    match cx.op {
        "RoiAlign" => return roi_align(cx),
        "MaxUnpool" => return max_unpool(cx),
        _ => {}
    }
    let outputs = if cx.op == "MaxPool" { 1..=2 } else { 1..=1 };
    if cx.inputs.len() != 1 || !outputs.contains(&cx.outputs.len()) {
        return Err(no_kernel!(
            "{} with {} inputs and {} outputs",
            cx.op,
            cx.inputs.len(),
            cx.outputs.len()
        ));
    }
    for o in [&cx.inputs[0], &cx.outputs[0]] {
        if o.desc.dtype != DType::F32 {
            return Err(cx.dtype(o.desc.dtype));
        }
    }
    // Pools never run in place on the CPU, so the plan never asks for it.
    if cx.in_place().is_some() {
        return Err(no_kernel!("{} in place", cx.op));
    }
    let (x, y) = (&cx.inputs[0].desc, &cx.outputs[0].desc);
    if x.shape.len() < 2 || y.shape.len() != x.shape.len() || x.shape[..2] != y.shape[..2] {
        return Err(no_kernel!(
            "{}: input {:?} and output {:?} do not match",
            cx.op,
            x.shape,
            y.shape
        ));
    }
    let reduce = Reduce::new(cx)?;
    if cx.op.starts_with("Global") { global(cx, reduce) } else { window(cx, reduce) }
}

#[derive(Clone, Copy, Debug)]
enum Reduce {
    Max,
    Average {
        include_pad: bool,
    },
    /// `(Σ|x|^p)^(1/p)`.
    Lp(u32),
}

impl Reduce {
    fn new(cx: &KernelCx) -> Result<Reduce, NoKernel> {
        let int = |name| cx.attrs.int(name).map_err(|e| no_kernel!("{e}"));
        Ok(match cx.op.trim_start_matches("Global") {
            "MaxPool" => Reduce::Max,
            "AveragePool" => Reduce::Average {
                include_pad: cx.op == "AveragePool" && int("count_include_pad")? != 0,
            },
            _ => {
                let p = int("p")?;
                Reduce::Lp(
                    u32::try_from(p)
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| no_kernel!("{}: p = {p}", cx.op))?,
                )
            }
        })
    }

    /// The fold of the window or plane. Max starts from f32::MIN and ignores NaN, as the CPU.
    fn fold(self) -> Fold {
        match self {
            Reduce::Max => Fold {
                init: f32_lit(f32::MIN),
                term: "$v".into(),
                combine: "select($a, $b, $b > $a)".into(),
            },
            Reduce::Average { .. } => Fold::sum("f32", "$v"),
            Reduce::Lp(p) => Fold::sum("f32", &lp_term(p)),
        }
    }

    /// The result from the fold `acc` over `count` taps (a WGSL f32).
    fn finish(self, acc: &str, count: &str) -> String {
        match self {
            Reduce::Max | Reduce::Lp(1) => acc.into(),
            Reduce::Average { .. } => format!("{acc} / {count}"),
            Reduce::Lp(2) => format!("sqrt({acc})"),
            Reduce::Lp(p) => format!("pow({acc}, {})", f32_lit(1.0 / p as f32)),
        }
    }
}

/// `|v|^p` as products (the CPU's `powi`) for small p.
fn lp_term(p: u32) -> String {
    match p {
        1 => "abs($v)".into(),
        2 => "$v * $v".into(),
        3..=8 => vec!["abs($v)"; p as usize].join(" * "),
        _ => format!("pow(abs($v), {})", f32_lit(p as f32)),
    }
}

fn global(cx: &KernelCx, reduce: Reduce) -> Result<Vec<Dispatch>, NoKernel> {
    let shape = &cx.inputs[0].desc.shape;
    let axes: Vec<usize> = (2..shape.len()).collect();
    Reduction {
        space: Space::new(shape, &axes),
        ty: "f32",
        stages: vec![Stage::Fold(reduce.fold())],
        out: Out::Value(reduce.finish("s0", "f32(n)")),
    }
    .lower(cx, &cx.op.to_lowercase())
}

/// The window of one spatial dimension.
#[derive(Clone, Copy, Debug)]
struct Dim {
    input: u64,
    output: u64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad_begin: u64,
    pad_end: u64,
}

impl Dim {
    /// A dimension of size 1 that a pool over fewer than 3 dimensions starts with.
    const NONE: Dim =
        Dim { input: 1, output: 1, kernel: 1, stride: 1, dilation: 1, pad_begin: 0, pad_end: 0 };

    /// Where the last tap of the last window lies, in padded coordinates.
    fn last_tap(&self) -> u64 {
        self.output.saturating_sub(1) * self.stride + (self.kernel - 1) * self.dilation
    }

    /// Whether some tap of some window lies outside the input.
    fn leaves_input(&self) -> bool {
        self.pad_begin > 0 || self.last_tap() >= self.input
    }

    /// The padded size: padding before, input, padding after.
    fn room(&self) -> u64 {
        self.pad_begin + self.input + self.pad_end
    }

    /// Whether some tap of some window lies past the end padding (ceil mode).
    fn leaves_padding(&self) -> bool {
        self.last_tap() >= self.room()
    }
}

/// The workgroup size of the windowed pools.
const WG: u32 = 64;

fn window(cx: &KernelCx, reduce: Reduce) -> Result<Vec<Dispatch>, NoKernel> {
    let (x, y) = (&cx.inputs[0].desc, &cx.outputs[0].desc);
    let rank = x.shape.len() - 2;
    let ints = |name| cx.attrs.ints(name).map_err(|e| no_kernel!("{e}"));
    let (kernel, strides, dilations, pads) =
        (ints("kernel_shape")?, ints("strides")?, ints("dilations")?, ints("pads")?);
    if !(1..=3).contains(&rank)
        || kernel.len() != rank
        || strides.len() != rank
        || dilations.len() != rank
        || pads.len() != 2 * rank
    {
        return Err(no_kernel!("{}: window attributes do not match rank {rank}", cx.op));
    }
    // Every value below stays far inside i32, and the divisions of the output index exact
    // (`Spec::divmod`).
    const LIMIT: u64 = 1 << 24;
    let small = |v: i64, min: i64| {
        u64::try_from(v)
            .ok()
            .filter(|&v| v >= min as u64 && v < LIMIT)
            .ok_or_else(|| no_kernel!("{}: window value {v}", cx.op))
    };
    // Three dimensions, outermost first: the pool's own after size-1 ones.
    let mut dims = vec![Dim::NONE; 3 - rank];
    for d in 0..rank {
        dims.push(Dim {
            input: small(x.shape[d + 2] as i64, 0)?,
            output: small(y.shape[d + 2] as i64, 0)?,
            kernel: small(kernel[d], 1)?,
            stride: small(strides[d], 1)?,
            dilation: small(dilations[d], 1)?,
            pad_begin: small(pads[d], 0)?,
            pad_end: small(pads[d + rank], 0)?,
        });
    }
    if x.elements() as u64 >= u64::from(u32::MAX) / 2
        || y.elements() as u64 >= u64::from(u32::MAX) / 2
    {
        return Err(no_kernel!("{}: tensors too large for u32 indices", cx.op));
    }
    // The nested loops' iterations: k0 + k0 * k1 + k0 * k1 * k2.
    let trips = dims
        .iter()
        .scan(1u64, |taps, d| {
            *taps = taps.saturating_mul(d.kernel);
            Some(*taps)
        })
        .fold(0u64, u64::saturating_add);
    if trips > MAX_TRIPS {
        return Err(no_kernel!("{}: a window of {kernel:?}", cx.op));
    }
    let n = y.elements() as u64;
    if n == 0 {
        return Ok(Vec::new());
    }
    if x.elements() == 0 {
        // Windows of padding alone; an empty tensor cannot be bound.
        return Err(no_kernel!("{} of an empty input", cx.op));
    }
    // MaxPool's Indices: `Some(column_major)`.
    let indices = match cx.outputs.get(1) {
        Some(i) if i.desc.dtype != DType::I64 || i.desc.shape != y.shape => {
            return Err(no_kernel!("MaxPool Indices {:?}", i.desc));
        }
        Some(_) => Some(cx.attrs.int("storage_order").map_err(|e| no_kernel!("{e}"))? != 0),
        None => None,
    };
    let grid = Grid::new(n, WG)?;
    let mut bindings = vec![Binding::input("x", 0, "f32"), Binding::output("y", 0, "f32")];
    let mut spec = reduce.fold().hooks(Spec::new(&WINDOW).divmod(), 0, "f32").hook(
        "finish",
        format!(
            "fn finish(acc: f32, count: f32) -> f32 {{\n    return {};\n}}",
            reduce.finish("acc", "count")
        ),
    );
    if let Some(column_major) = indices {
        bindings.push(Binding::output("ind", 1, "u32"));
        // An int64: the flat input index, or -1 where the window holds no input.
        spec = spec
            .hook(
                "store_index",
                "fn store_index(o: u32, index: u32, found: bool) {\n    \
                 ind[p.ind + 2u * o] = select(0xffffffffu, index, found);\n    \
                 ind[p.ind + 2u * o + 1u] = select(0xffffffffu, 0u, found);\n}",
            )
            .set("INDEXED", true)
            .set("COLUMN_MAJOR", column_major);
    }
    // AveragePool's divisor: the window's size, the taps inside the input (counted as they
    // are visited), or those inside the input or its padding (a product of per-dimension
    // counts).
    let count = match reduce {
        Reduce::Average { include_pad: false } if dims.iter().any(Dim::leaves_input) => 1,
        Reduce::Average { include_pad: true } if dims.iter().any(Dim::leaves_padding) => 2,
        _ => 0,
    };
    let fields: [fn(&Dim) -> u64; 7] = [
        |d| d.input,
        |d| d.output,
        |d| d.kernel,
        |d| d.stride,
        |d| d.dilation,
        |d| d.pad_begin,
        Dim::room,
    ];
    let mut label = format!("{}_{rank}d", cx.op.to_lowercase());
    if cx.class == DeviceClass::Cpu {
        // The geometry as literals: the taps unroll and the index arithmetic folds.
        let vectors: Vec<String> = fields
            .iter()
            .enumerate()
            .map(|(i, field)| {
                let (ty, suffix) = if i < 5 { ("u32", "u") } else { ("i32", "i") };
                let v: Vec<String> = dims.iter().map(|d| format!("{}{suffix}", field(d))).collect();
                format!("vec3<{ty}>({})", v.join(", "))
            })
            .collect();
        spec = spec.hook(
            "geometry",
            format!(
                "fn geometry() -> Geometry {{\n    return Geometry({});\n}}",
                vectors.join(", ")
            ),
        );
        let windows: Vec<String> = dims[3 - rank..].iter().map(|d| d.kernel.to_string()).collect();
        label += &format!("_k{}", windows.join("x"));
    }
    let mut params = vec![n, x.shape[2..].iter().product::<usize>() as u64];
    for field in fields {
        params.extend(dims.iter().map(field));
    }
    spec.set("WG", WG)
        .set("RANK", rank as u32)
        .set("CLIP", dims.iter().any(Dim::leaves_input))
        .set("COUNT", count)
        .dispatch(label, grid.groups, bindings, params.into_iter().map(|w| w as u32).collect())
        .map(|d| vec![d])
}

/// RoiAlign, float32: one invocation per output element.
fn roi_align(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let ([x, rois, batch], [y]) = (cx.inputs, cx.outputs) else {
        return Err(no_kernel!("RoiAlign with {} inputs", cx.inputs.len()));
    };
    for o in [x, rois, y] {
        if o.desc.dtype != DType::F32 {
            return Err(cx.dtype(o.desc.dtype));
        }
    }
    let op =
        super::roi_align::RoiAlign::parse(cx.attrs).map_err(|e| no_kernel!("RoiAlign: {e}"))?;
    let (&[n, c, h, w], &[r, ..]) = (x.desc.shape.as_slice(), y.desc.shape.as_slice()) else {
        return Err(no_kernel!("RoiAlign of X {:?}", x.desc.shape));
    };
    // An empty tensor cannot be bound.
    if x.desc.elements() == 0 || h == 0 || w == 0 || batch.desc.dtype != DType::I64 {
        return Err(no_kernel!("RoiAlign of X {:?}", x.desc.shape));
    }
    let count = y.desc.elements() as u64;
    if count == 0 {
        return Ok(Vec::new());
    }
    let bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::input("rois", 1, "f32"),
        Binding::input("batch", 2, "u32"),
        Binding::output("y", 0, "f32"),
    ];
    let spec = Spec::new(&ROI_ALIGN).set("HALF_PIXEL", op.half_pixel).set("MAX", op.max);
    let size = |v: usize| v as u32;
    let params = vec![
        count as u32,
        size(n),
        size(c),
        size(h),
        size(w),
        size(op.out_h),
        size(op.out_w),
        size(op.sampling_ratio),
        op.spatial_scale.to_bits(),
    ];
    Ok(vec![spec.flat(format!("roi_align_{r}x{c}"), count, bindings, params)?])
}

/// MaxUnpool, float32, of up to 3 spatial dims: zeros, then X scattered.
fn max_unpool(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let ([x, indices], [y]) = (cx.inputs, cx.outputs) else {
        return Err(no_kernel!("MaxUnpool with {} inputs", cx.inputs.len()));
    };
    for o in [x, y] {
        if o.desc.dtype != DType::F32 {
            return Err(cx.dtype(o.desc.dtype));
        }
    }
    let (inner, out) =
        super::unpool::shapes(cx.attrs, &x.desc.shape).map_err(|e| no_kernel!("MaxUnpool: {e}"))?;
    if indices.desc.dtype != DType::I64 || out.len() > 5 || cx.in_place().is_some() {
        return Err(no_kernel!("MaxUnpool to {out:?}"));
    }
    let lead = |v: &[usize]| -> Vec<u32> {
        std::iter::repeat_n(1, 5 - v.len()).chain(v.iter().map(|&d| d as u32)).collect()
    };
    let total = inner.iter().product::<usize>() as u32;
    let mut d = Vec::new();
    for (scatter, count) in [(false, y.desc.elements()), (true, x.desc.elements())] {
        if count == 0 {
            continue;
        }
        let mut bindings = vec![Binding::output("y", 0, "f32")];
        if scatter {
            bindings.extend([Binding::input("x", 0, "f32"), Binding::input("ix", 1, "u32")]);
        }
        let mut params = vec![count as u32, total];
        params.extend(lead(&inner));
        params.extend(lead(&out));
        let label = format!("max_unpool_{}_{count}", if scatter { "scatter" } else { "zero" });
        let spec = Spec::new(&UNPOOL).set("SCATTER", scatter);
        d.push(spec.flat(label, count as u64, bindings, params)?);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::reduce::vulkan::tests::specialised;
    use crate::vulkan::valid;
    use crate::vulkan::{Operand, compile, lower_f32_all_classes};
    use ingot_schema::{AttrValue, Attrs};

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    fn window_attrs(kernel: &[i64], strides: &[i64], pads: &[i64], dil: &[i64]) -> Attrs {
        Attrs::new()
            .with("kernel_shape", ints(kernel))
            .with("strides", ints(strides))
            .with("pads", ints(pads))
            .with("dilations", ints(dil))
            .with("ceil_mode", AttrValue::Int(0))
            .with("count_include_pad", AttrValue::Int(0))
            .with("storage_order", AttrValue::Int(0))
            .with("p", AttrValue::Int(3))
    }

    /// Both classes' dispatches, each compiled and checked against its module.
    fn run(op: &str, attrs: &Attrs, x: &[usize], y: &[usize]) -> Vec<Dispatch> {
        let d = lower_f32_all_classes(lower, op, attrs, &[x], &[y], 0);
        valid(&d);
        d
    }

    fn override_of(d: &Dispatch, name: &str) -> Option<f64> {
        d.overrides.iter().find(|o| o.0 == name).map(|o| o.1)
    }

    #[test]
    fn every_file_is_a_valid_module() {
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
    }

    #[test]
    fn windowed_pools_compile() {
        // PP-OCR: rec's AveragePool 3x2 stride 3x2, cls's MaxPool 2x2 stride 2. No window
        // leaves the input: no bounds checks, the window's size as the divisor; CPU-type
        // devices get the window as constants, GPUs one module for every window.
        let a = window_attrs(&[3, 2], &[3, 2], &[0; 4], &[1, 1]);
        let d = run("AveragePool", &a, &[1, 480, 3, 80], &[1, 480, 1, 40]);
        for d in &d {
            assert_eq!(override_of(d, "CLIP"), Some(0.0));
            assert_eq!(override_of(d, "COUNT"), Some(0.0));
            assert_eq!(d.groups, [300, 1, 1]);
        }
        assert_eq!(d[0].label, "averagepool_2d_k3x2");
        let geometry = |d: &Dispatch| {
            let line = d.wgsl.lines().find(|l| l.starts_with("    return Geometry(vec3"));
            line.map(str::trim).map(str::to_string)
        };
        assert_eq!(
            geometry(&d[0]).as_deref(),
            Some(
                "return Geometry(vec3<u32>(1u, 3u, 80u), vec3<u32>(1u, 1u, 40u), \
                 vec3<u32>(1u, 3u, 2u), vec3<u32>(1u, 3u, 2u), vec3<u32>(1u, 1u, 1u), \
                 vec3<i32>(0i, 0i, 0i), vec3<i32>(1i, 3i, 80i));"
            )
        );
        assert_eq!(d[1].label, "averagepool_2d");
        assert_eq!(geometry(&d[1]), None);
        let a = window_attrs(&[2, 2], &[2, 2], &[0; 4], &[1, 1]);
        run("MaxPool", &a, &[1, 8, 24, 96], &[1, 8, 12, 48]);
        // Padded, dilated, 1-D and 3-D, with and without the padding in the count.
        let a = window_attrs(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1])
            .with("count_include_pad", AttrValue::Int(1));
        let d = run("AveragePool", &a, &[1, 2, 4, 5], &[1, 2, 3, 3]);
        // The last window leaves the padding (rows 0..6 padded, the third window's last tap
        // is row 6): taps counted per dimension.
        assert_eq!(override_of(&d[0], "COUNT"), Some(2.0));
        let a = window_attrs(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1]);
        let d = run("AveragePool", &a, &[1, 2, 5, 5], &[1, 2, 3, 3]);
        assert_eq!(override_of(&d[0], "COUNT"), Some(1.0));
        assert_eq!(override_of(&d[0], "CLIP"), Some(1.0));
        let a = window_attrs(&[3], &[1], &[1, 1], &[2]);
        for op in ["MaxPool", "AveragePool", "LpPool"] {
            run(op, &a, &[1, 1, 9], &[1, 1, 7]);
        }
        let a = window_attrs(&[2, 2, 3], &[1, 2, 1], &[0, 1, 1, 1, 0, 0], &[1, 1, 1]);
        for op in ["MaxPool", "AveragePool", "LpPool"] {
            let d = run(op, &a, &[1, 1, 3, 3, 4], &[1, 1, 3, 2, 3]);
            // Params: outputs, plane, then per dimension input, output, window, stride,
            // dilation, padding before, padded size.
            assert_eq!(
                d[1].params,
                [18, 36, 3, 3, 4, 3, 2, 3, 2, 2, 3, 1, 2, 1, 1, 1, 1, 0, 1, 1, 4, 4, 5]
            );
        }
        // More outputs than one row of workgroups.
        let a = window_attrs(&[1, 1], &[1, 1], &[0; 4], &[1, 1]);
        let d = run("MaxPool", &a, &[1, 1, 65535, 65], &[1, 1, 65535, 65]);
        assert_eq!(d[0].groups, [65535, 2, 1]);
        // A window too large for one invocation's loops.
        let a = window_attrs(&[300, 300], &[1, 1], &[0; 4], &[1, 1]);
        let xd = TensorDesc::new(DType::F32, [1, 1, 300, 300]);
        let yd = TensorDesc::new(DType::F32, [1, 1, 1, 1]);
        let inputs = [Operand::arena(xd, 0)];
        let outputs = [Operand::arena(yd, 1 << 20)];
        let cx = KernelCx {
            class: DeviceClass::Cpu,
            op: "MaxPool",
            name: "p",
            attrs: &a,
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).is_err());
    }

    #[test]
    fn global_pools_and_max_pool_indices_compile() {
        let a = Attrs::new().with("p", AttrValue::Int(2));
        for op in ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"] {
            let d = run(op, &a, &[1, 16, 56, 56], &[1, 16, 1, 1]);
            assert_eq!(d[1].label, format!("{}_wg64_v4", op.to_lowercase()));
            assert_eq!(d[1].groups, [16, 1, 1]);
        }
        for storage_order in [0, 1] {
            let a = window_attrs(&[2, 2], &[2, 2], &[0; 4], &[1, 1])
                .with("storage_order", AttrValue::Int(storage_order));
            let xd = TensorDesc::new(DType::F32, [1, 1, 4, 4]);
            let yd = TensorDesc::new(DType::F32, [1, 1, 2, 2]);
            let inputs = [Operand::arena(xd, 0)];
            let outputs = [
                Operand::arena(yd, 64),
                Operand::arena(TensorDesc::new(DType::I64, [1, 1, 2, 2]), 128),
            ];
            for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
                let cx = KernelCx {
                    class,
                    op: "MaxPool",
                    name: "p",
                    attrs: &a,
                    inputs: &inputs,
                    outputs: &outputs,
                };
                let d = lower(&cx).unwrap();
                valid(&d);
                assert_eq!(d[0].bindings[2], Binding::output("ind", 1, "u32"));
                assert_eq!(override_of(&d[0], "COLUMN_MAJOR"), Some(storage_order as f64));
                if (class, storage_order) == (DeviceClass::Cpu, 1) {
                    insta::assert_snapshot!("maxpool_indices_cpu", specialised(&d[0]));
                }
            }
        }
    }

    #[test]
    fn roi_align_binds_its_three_inputs_and_takes_its_modes_by_override() {
        let xd = TensorDesc::new(DType::F32, [2, 3, 8, 8]);
        let inputs = [
            Operand::arena(xd, 0),
            Operand::arena(TensorDesc::new(DType::F32, [5, 4]), 1536),
            Operand::arena(TensorDesc::new(DType::I64, [5]), 1616),
        ];
        let outputs = [Operand::arena(TensorDesc::new(DType::F32, [5, 3, 2, 2]), 1664)];
        for (transform, mode) in [("half_pixel", "avg"), ("output_half_pixel", "max")] {
            let a = Attrs::new()
                .with("coordinate_transformation_mode", AttrValue::Text(transform.into()))
                .with("mode", AttrValue::Text(mode.into()))
                .with("output_height", AttrValue::Int(2))
                .with("output_width", AttrValue::Int(2))
                .with("sampling_ratio", AttrValue::Int(0))
                .with("spatial_scale", AttrValue::Float(0.25));
            for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
                let cx = KernelCx {
                    class,
                    op: "RoiAlign",
                    name: "r",
                    attrs: &a,
                    inputs: &inputs,
                    outputs: &outputs,
                };
                let d = lower(&cx).unwrap();
                valid(&d);
                assert_eq!(d.len(), 1);
                assert_eq!(d[0].bindings[2], Binding::input("batch", 2, "u32"));
                assert_eq!(override_of(&d[0], "MAX"), Some(f64::from(u8::from(mode == "max"))));
                // count, images, channels, h, w, out_h, out_w, ratio, scale's bits
                assert_eq!(d[0].params, [60, 2, 3, 8, 8, 2, 2, 0, 0.25f32.to_bits()]);
            }
        }
    }

    #[test]
    fn max_unpool_zeros_then_scatters() {
        let a = Attrs::new()
            .with("kernel_shape", AttrValue::Ints(vec![2, 2]))
            .with("strides", AttrValue::Ints(vec![2, 2]))
            .with("pads", AttrValue::Ints(vec![0; 4]))
            .with("output_shape", AttrValue::Ints(vec![1, 2, 5, 5]));
        let inputs = [
            Operand::arena(TensorDesc::new(DType::F32, [1, 2, 2, 2]), 0),
            Operand::arena(TensorDesc::new(DType::I64, [1, 2, 2, 2]), 64),
        ];
        let outputs = [Operand::arena(TensorDesc::new(DType::F32, [1, 2, 5, 5]), 128)];
        for class in [DeviceClass::Cpu, DeviceClass::Gpu] {
            let cx = KernelCx {
                class,
                op: "MaxUnpool",
                name: "u",
                attrs: &a,
                inputs: &inputs,
                outputs: &outputs,
            };
            let d = lower(&cx).unwrap();
            valid(&d);
            assert_eq!(d.len(), 2);
            assert_eq!((d[0].bindings.len(), d[1].bindings.len()), (1, 3));
            // count, the unpooled elements, its shape and the output's, led by ones
            assert_eq!(d[0].params, [50, 32, 1, 1, 2, 4, 4, 1, 1, 2, 5, 5]);
            assert_eq!(d[1].params[0], 8);
        }
    }

    #[test]
    fn specialised_sources() {
        // AveragePool counting the padding in ceil mode, on GPUs: every window size from the
        // params.
        let a = window_attrs(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1])
            .with("count_include_pad", AttrValue::Int(1));
        let d = run("AveragePool", &a, &[1, 2, 4, 5], &[1, 2, 3, 3]);
        insta::assert_snapshot!("averagepool_include_pad_gpu", specialised(&d[1]));
    }
}
