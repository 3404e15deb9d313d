//! Vulkan kernels of the pool family (ops: ops/src/pool/cpu.rs): MaxPool, AveragePool and
//! LpPool over 1 to 3 spatial dimensions, float32, and the global pools.
//!
//! A windowed pool is one invocation per output element, looping over its window with literal
//! bounds; a tap outside the input is skipped (checked only along dimensions where a window
//! can leave the input), so padding is never read. AveragePool divides by the taps inside the
//! input, or with `count_include_pad` by the taps inside the input or its padding: in ceil
//! mode a window may run past the end padding, and those taps count for nothing, as on the
//! CPU. The global pools are reductions over the spatial axes ([`super::reduce::Reduction`]).
//! MaxPool's Indices output is written as two u32 words per int64; int8/uint8 MaxPool has no
//! kernel.

use crate::no_kernel;
use crate::reduce::vulkan::{Fold, MAX_TRIPS, Out, Reduction, Space, Stage};
use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, f32_lit, header};
use ingot_schema::DType;
use std::fmt::Write;

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
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
    if cx.op.starts_with("Global") {
        global(cx, reduce)
    } else {
        window(cx, reduce)
    }
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
    let space = Space::new(shape, &axes);
    let count = f32_lit(space.count() as f32);
    Reduction {
        space,
        ty: "f32",
        stages: vec![Stage::Fold(reduce.fold())],
        out: Out::Value(reduce.finish("s0", &count)),
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
    /// Where the last tap of the last window lies, in padded coordinates.
    fn last_tap(&self) -> u64 {
        self.output.saturating_sub(1) * self.stride + (self.kernel - 1) * self.dilation
    }

    /// Whether some tap of some window lies outside the input.
    fn leaves_input(&self) -> bool {
        self.pad_begin > 0 || self.last_tap() >= self.input
    }

    /// Whether some tap of some window lies past the end padding (ceil mode).
    fn leaves_padding(&self) -> bool {
        self.last_tap() >= self.pad_begin + self.input + self.pad_end
    }
}

fn window(cx: &KernelCx, reduce: Reduce) -> Result<Vec<Dispatch>, NoKernel> {
    let (x, y) = (&cx.inputs[0].desc, &cx.outputs[0].desc);
    let rank = x.shape.len() - 2;
    let ints = |name| cx.attrs.ints(name).map_err(|e| no_kernel!("{e}"));
    let (kernel, strides, dilations, pads) = (
        ints("kernel_shape")?,
        ints("strides")?,
        ints("dilations")?,
        ints("pads")?,
    );
    if !(1..=3).contains(&rank)
        || kernel.len() != rank
        || strides.len() != rank
        || dilations.len() != rank
        || pads.len() != 2 * rank
    {
        return Err(no_kernel!(
            "{}: window attributes do not match rank {rank}",
            cx.op
        ));
    }
    // Every value below stays far inside i32.
    const LIMIT: u64 = 1 << 24;
    let small = |v: i64, min: i64| {
        u64::try_from(v)
            .ok()
            .filter(|&v| v >= min as u64 && v < LIMIT)
            .ok_or_else(|| no_kernel!("{}: window value {v}", cx.op))
    };
    let dims = (0..rank)
        .map(|d| {
            Ok(Dim {
                input: small(x.shape[d + 2] as i64, 0)?,
                output: small(y.shape[d + 2] as i64, 0)?,
                kernel: small(kernel[d], 1)?,
                stride: small(strides[d], 1)?,
                dilation: small(dilations[d], 1)?,
                pad_begin: small(pads[d], 0)?,
                pad_end: small(pads[d + rank], 0)?,
            })
        })
        .collect::<Result<Vec<_>, NoKernel>>()?;
    if x.elements() as u64 >= u64::from(u32::MAX) / 2 {
        return Err(no_kernel!("{}: input too large for u32 indices", cx.op));
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
        Some(_) => Some(
            cx.attrs
                .int("storage_order")
                .map_err(|e| no_kernel!("{e}"))?
                != 0,
        ),
        None => None,
    };
    let grid = Grid::new(n, 64)?;
    let mut bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    if indices.is_some() {
        bindings.push(Binding::output("ind", 1, "u32"));
    }
    let fold = reduce.fold();
    let mut s = header(&bindings);
    let _ = writeln!(
        s,
        "\n{} {{\n    let o = {};\n    if (o >= {n}u) {{ return; }}",
        grid.entry(),
        grid.index()
    );
    // Output digits, innermost first, then the plane (N * C).
    let mut place = 1;
    for (d, dim) in dims.iter().enumerate().rev() {
        let digit = if place == 1 {
            "o".into()
        } else {
            format!("(o / {place}u)")
        };
        let _ = writeln!(s, "    let o{d} = i32({digit} % {}u);", dim.output);
        place *= dim.output;
    }
    let plane: u64 = dims.iter().map(|d| d.input).product();
    let _ = writeln!(
        s,
        "    let p = o / {place}u;\n    let plane = offsets.x + p * {plane}u;\n    var acc = {};",
        fold.init
    );
    if indices.is_some() {
        s += "    var arg = -1i;\n";
    }
    // The divisor: taps inside the input (counted as they are visited), or inside the input
    // or its padding (a product of per-dimension counts).
    let count = match reduce {
        Reduce::Average { include_pad: false } if dims.iter().any(Dim::leaves_input) => {
            s += "    var taps = 0u;\n";
            "f32(taps)".to_string()
        }
        Reduce::Average { include_pad: true } if dims.iter().any(Dim::leaves_padding) => {
            // The k < kernel with o * stride + k * dilation < pad_begin + input + pad_end.
            let mut counts = Vec::new();
            for (d, dim) in dims.iter().enumerate() {
                let room = dim.pad_begin + dim.input + dim.pad_end;
                let mut taps = format!("{room}i - o{d} * {}i", dim.stride);
                if dim.dilation > 1 {
                    taps = format!("({taps} + {}i) / {}i", dim.dilation - 1, dim.dilation);
                }
                let _ = writeln!(s, "    let n{d} = clamp({taps}, 0i, {}i);", dim.kernel);
                counts.push(format!("n{d}"));
            }
            format!("f32({})", counts.join(" * "))
        }
        _ => f32_lit(dims.iter().map(|d| d.kernel).product::<u64>() as f32),
    };
    let mut indent = String::from("    ");
    // The tap's place in the plane: row-major, and column-major for storage_order 1.
    let (mut at, mut col) = (Vec::new(), Vec::new());
    let (mut inner, mut outer) = (plane, 1);
    for (d, dim) in dims.iter().enumerate() {
        inner /= dim.input.max(1);
        at.push(if inner == 1 {
            format!("u32(i{d})")
        } else {
            format!("u32(i{d}) * {inner}u")
        });
        col.push(format!("u32(i{d}) * {outer}u"));
        outer *= dim.input;
        let _ = writeln!(
            s,
            "{indent}for (var k{d} = 0i; k{d} < {}i; k{d}++) {{\n{indent}    let i{d} = o{d} * {}i + k{d} * {}i - {}i;",
            dim.kernel, dim.stride, dim.dilation, dim.pad_begin
        );
        indent += "    ";
        if dim.leaves_input() {
            let _ = writeln!(
                s,
                "{indent}if (i{d} < 0i || i{d} >= {}i) {{ continue; }}",
                dim.input
            );
        }
    }
    let at = at.join(" + ");
    let _ = writeln!(s, "{indent}let v = x[plane + {at}];");
    match indices {
        // The first tap inside the input, then strictly greater ones, as on the CPU.
        Some(column_major) => {
            let place = if column_major { col.join(" + ") } else { at };
            let _ = writeln!(
                s,
                "{indent}if (arg < 0i || v > acc) {{ acc = v; arg = i32({place}); }}"
            );
        }
        None => {
            let _ = writeln!(s, "{indent}acc = {};", fold.step("acc", "v"));
        }
    }
    if count == "f32(taps)" {
        let _ = writeln!(s, "{indent}taps += 1u;");
    }
    for _ in 0..rank {
        indent.truncate(indent.len() - 4);
        let _ = writeln!(s, "{indent}}}");
    }
    let _ = writeln!(
        s,
        "    y[offsets.y + o] = {};",
        reduce.finish("acc", &count)
    );
    if indices.is_some() {
        // An int64: the flat input index, or -1 where the window holds no input.
        let _ = writeln!(
            s,
            "    let found = arg >= 0i;\n    ind[offsets.ind + 2u * o] = select(0xffffffffu, p * {plane}u + u32(arg), found);\n    ind[offsets.ind + 2u * o + 1u] = select(0xffffffffu, 0u, found);"
        );
    }
    s += "}\n";
    let geometry: Vec<String> = dims.iter().map(|d| d.kernel.to_string()).collect();
    Ok(vec![Dispatch {
        label: format!("{}_{}_k{}", cx.op.to_lowercase(), n, geometry.join("x")),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{DeviceClass, Operand, compile};
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

    fn run(op: &str, attrs: &Attrs, x: &[usize], y: &[usize]) -> Result<Vec<Dispatch>, NoKernel> {
        let xd = TensorDesc::new(DType::F32, x);
        let inputs = [Operand::arena(xd.clone(), 0)];
        let outputs = [Operand::arena(
            TensorDesc::new(DType::F32, y),
            xd.bytes() as u64,
        )];
        let cx = KernelCx {
            class: DeviceClass::Gpu,
            op,
            name: "p",
            attrs,
            inputs: &inputs,
            outputs: &outputs,
        };
        let d = lower(&cx)?;
        for d in &d {
            if let Err(e) = compile(&d.wgsl, &[]) {
                panic!("{}:\n{}\n{e}", d.label, d.wgsl);
            }
        }
        Ok(d)
    }

    #[test]
    fn windowed_pools_compile() {
        // PP-OCR: rec's AveragePool 3x2 stride 3x2, cls's MaxPool 2x2 stride 2.
        let a = window_attrs(&[3, 2], &[3, 2], &[0; 4], &[1, 1]);
        let d = run("AveragePool", &a, &[1, 480, 3, 80], &[1, 480, 1, 40]).unwrap();
        assert!(!d[0].wgsl.contains("continue"), "{}", d[0].wgsl);
        let a = window_attrs(&[2, 2], &[2, 2], &[0; 4], &[1, 1]);
        run("MaxPool", &a, &[1, 8, 24, 96], &[1, 8, 12, 48]).unwrap();
        // Padded, dilated, 1-D and 3-D, with and without the padding in the count.
        let a = window_attrs(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1])
            .with("count_include_pad", AttrValue::Int(1));
        let d = run("AveragePool", &a, &[1, 2, 4, 5], &[1, 2, 3, 3]).unwrap();
        assert!(d[0].wgsl.contains("clamp("), "{}", d[0].wgsl);
        let a = window_attrs(&[3], &[1], &[1, 1], &[2]);
        for op in ["MaxPool", "AveragePool", "LpPool"] {
            run(op, &a, &[1, 1, 9], &[1, 1, 7]).unwrap();
        }
        let a = window_attrs(&[2, 2, 3], &[1, 2, 1], &[0, 1, 1, 1, 0, 0], &[1, 1, 1]);
        for op in ["MaxPool", "AveragePool", "LpPool"] {
            run(op, &a, &[1, 1, 3, 3, 4], &[1, 1, 3, 2, 3]).unwrap();
        }
        // More outputs than one row of workgroups.
        let a = window_attrs(&[1, 1], &[1, 1], &[0; 4], &[1, 1]);
        let d = run("MaxPool", &a, &[1, 1, 65535, 65], &[1, 1, 65535, 65]).unwrap();
        assert_eq!(d[0].groups, [65535, 2, 1]);
    }

    #[test]
    fn global_pools_and_max_pool_indices_compile() {
        let a = Attrs::new().with("p", AttrValue::Int(2));
        for op in ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"] {
            run(op, &a, &[1, 16, 56, 56], &[1, 16, 1, 1]).unwrap();
        }
        let a = window_attrs(&[2, 2], &[2, 2], &[0; 4], &[1, 1]);
        let xd = TensorDesc::new(DType::F32, [1, 1, 4, 4]);
        let yd = TensorDesc::new(DType::F32, [1, 1, 2, 2]);
        let inputs = [Operand::arena(xd, 0)];
        let outputs = [
            Operand::arena(yd, 64),
            Operand::arena(TensorDesc::new(DType::I64, [1, 1, 2, 2]), 128),
        ];
        let cx = KernelCx {
            class: DeviceClass::Gpu,
            op: "MaxPool",
            name: "p",
            attrs: &a,
            inputs: &inputs,
            outputs: &outputs,
        };
        let d = lower(&cx).unwrap();
        compile(&d[0].wgsl, &[]).unwrap();
        assert_eq!(d[0].bindings[2], Binding::output("ind", 1, "u32"));
    }
}
