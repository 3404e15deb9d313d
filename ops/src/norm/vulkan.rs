//! Vulkan kernels of the norm family (ops: ops/src/norm/cpu.rs): BatchNormalization
//! (inference), InstanceNormalization, GroupNormalization, LayerNormalization (with its
//! optional Mean and InvStdDev outputs), LRN and MeanVarianceNormalization, float32.
//!
//! Instance, Group, Layer and MeanVariance normalization are one row kernel: the input is
//! walked as rows (the indices the statistics are per) of elements (the indices they are
//! over), each row's mean and variance computed in two passes (mean, then the mean square
//! deviation from it), then every element normalized and mapped. Short rows take one
//! invocation each; long rows one workgroup each, the partial sums of its invocations added
//! in workgroup memory. BatchNormalization and LRN are one invocation per element.

use crate::no_kernel;
use crate::vulkan::header;
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, MAX_GROUPS, NoKernel, f32_lit,
};
use std::fmt::Write;

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    let x = &cx
        .inputs
        .first()
        .ok_or_else(|| no_kernel!("{} without inputs", cx.op))?
        .desc;
    let (out, inputs) = (cx.outputs.len(), cx.inputs.len());
    let arity = match cx.op {
        "BatchNormalization" => inputs == 5 && out == 1,
        "InstanceNormalization" | "GroupNormalization" => inputs == 3 && out == 1,
        "LayerNormalization" => (2..=3).contains(&inputs) && (1..=3).contains(&out),
        _ => inputs == 1 && out == 1,
    };
    if !arity || cx.outputs[0].desc.shape != x.shape {
        return Err(no_kernel!(
            "{} with {inputs} inputs and {out} outputs",
            cx.op
        ));
    }
    if cx
        .inputs
        .iter()
        .chain(cx.outputs)
        .any(|o| o.desc.elements() >= 1 << 31)
    {
        return Err(no_kernel!("{} too large for 32-bit indices", cx.op));
    }
    if x.elements() == 0 {
        return match out {
            1 => Ok(Vec::new()),
            _ => Err(no_kernel!("{} statistics of empty rows", cx.op)),
        };
    }
    let float = |name| cx.attrs.float(name).map_err(|e| no_kernel!("{e}"));
    let int = |name| cx.attrs.int(name).map_err(|e| no_kernel!("{e}"));
    match cx.op {
        "BatchNormalization" => batch_norm(cx, float("epsilon")?),
        "LRN" => lrn(
            cx,
            int("size")?,
            [float("alpha")?, float("beta")?, float("bias")?],
        ),
        _ => {
            if cx.in_place().is_some() {
                return Err(no_kernel!("{} in place", cx.op));
            }
            row_norm(cx, &RowNorm::new(cx)?)
        }
    }
}

/// (N, C, elements per channel) of an N x C x D1 x ... input.
fn channels(cx: &KernelCx) -> Result<(usize, usize, usize), NoKernel> {
    match cx.inputs[0].desc.shape.as_slice() {
        [n, c, rest @ ..] => Ok((*n, *c, rest.iter().product())),
        s => Err(no_kernel!("{} of rank {}", cx.op, s.len())),
    }
}

fn expect_len(cx: &KernelCx, i: usize, len: usize) -> Result<(), NoKernel> {
    match cx.inputs[i].desc.elements() == len {
        true => Ok(()),
        false => Err(no_kernel!(
            "{} input {i} of shape {:?}",
            cx.op,
            cx.inputs[i].desc.shape
        )),
    }
}

/// A u32 literal.
fn u(v: usize) -> String {
    format!("{v}u")
}

/// The WGSL u32 expression of the offset of the index `var` enumerates row-major over `dims`
/// (size, stride), outer first; dims that are contiguous with each other are merged.
fn offset(var: &str, dims: &[(usize, usize)]) -> String {
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for &(size, stride) in dims.iter().filter(|d| d.0 != 1) {
        match merged.last_mut() {
            Some(last) if last.1 == size * stride => *last = (last.0 * size, stride),
            _ => merged.push((size, stride)),
        }
    }
    let mut terms = Vec::new();
    let mut inner = 1;
    for (k, &(size, stride)) in merged.iter().enumerate().rev() {
        let mut i = if inner == 1 {
            var.to_string()
        } else {
            format!("({var} / {})", u(inner))
        };
        if k > 0 {
            i = format!("({i} % {})", u(size));
        }
        if stride != 0 {
            terms.push(if stride == 1 {
                i
            } else {
                format!("{i} * {}", u(stride))
            });
        }
        inner *= size;
    }
    match terms.is_empty() {
        true => "0u".into(),
        false => terms.join(" + "),
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `BatchNormalization`: `y = x * a + b` per channel, `a = scale / sqrt(var + epsilon)`,
/// `b = B - mean * a`, as the CPU kernel folds it. Each invocation reads only the element it
/// writes, so it may run in place.
fn batch_norm(cx: &KernelCx, epsilon: f32) -> Result<Vec<Dispatch>, NoKernel> {
    let (batch, c, inner) = channels(cx)?;
    for i in 1..5 {
        expect_len(cx, i, c)?;
    }
    let n = cx.inputs[0].desc.elements();
    let names = ["x", "scale", "bias", "mu", "sigma2"];
    let mut bindings: Vec<Binding> = names
        .iter()
        .enumerate()
        .map(|(i, name)| Binding::input(name, i, "f32"))
        .collect();
    bindings.push(Binding::output("y", 0, "f32"));
    let grid = Grid::new(n as u64, 64)?;
    let mut s = header(&bindings);
    let _ = writeln!(s, "\n{} {{", grid.entry());
    let _ = writeln!(s, "    let i = {};", grid.index());
    let _ = writeln!(s, "    if (i >= {}) {{ return; }}", u(n));
    let _ = writeln!(
        s,
        "    let ch = {};",
        offset("i", &[(batch, 0), (c, 1), (inner, 0)])
    );
    let _ = writeln!(
        s,
        "    let a = scale[offsets.scale + ch] / sqrt(sigma2[offsets.sigma2 + ch] + {});",
        f32_lit(epsilon)
    );
    s.push_str("    let b = bias[offsets.bias + ch] - mu[offsets.mu + ch] * a;\n");
    s.push_str("    y[offsets.y + i] = x[offsets.x + i] * a + b;\n}\n");
    Ok(vec![Dispatch {
        label: format!("batchnorm_{n}_{c}"),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
}

/// LRN: `y = x / (bias + alpha / size * Σ x²)^beta`, the sum over the channels
/// `c - floor((size-1)/2) ..= c + ceil((size-1)/2)` that exist, one invocation per element.
fn lrn(cx: &KernelCx, size: i64, [alpha, beta, bias]: [f32; 3]) -> Result<Vec<Dispatch>, NoKernel> {
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| no_kernel!("LRN size {size}"))?;
    if cx.in_place().is_some() {
        return Err(no_kernel!("LRN in place"));
    }
    let (batch, c, spatial) = channels(cx)?;
    let n = cx.inputs[0].desc.elements();
    let bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    let grid = Grid::new(n as u64, 64)?;
    let (before, after) = ((size - 1) / 2, size / 2);
    let mut s = header(&bindings);
    let _ = writeln!(s, "\n{} {{", grid.entry());
    let _ = writeln!(s, "    let i = {};", grid.index());
    let _ = writeln!(s, "    if (i >= {}) {{ return; }}", u(n));
    let _ = writeln!(
        s,
        "    let ch = {};",
        offset("i", &[(batch, 0), (c, 1), (spatial, 0)])
    );
    let _ = writeln!(s, "    let base = offsets.x + i - ch * {};", u(spatial));
    let _ = writeln!(s, "    let hi = min(ch + {}, {});", u(after + 1), u(c));
    let _ = writeln!(s, "    var sum = 0.0;");
    let _ = writeln!(
        s,
        "    for (var k = max(ch, {b}) - {b}; k < hi; k++) {{",
        b = u(before)
    );
    let _ = writeln!(s, "        let v = x[base + k * {}];", u(spatial));
    s.push_str("        sum += v * v;\n    }\n");
    let _ = writeln!(
        s,
        "    let d = pow({} + {} * sum, {});",
        f32_lit(bias),
        f32_lit(alpha / size as f32),
        f32_lit(beta)
    );
    s.push_str("    y[offsets.y + i] = x[offsets.x + i] / d;\n}\n");
    Ok(vec![Dispatch {
        label: format!("lrn_{n}_{c}_{size}"),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
}

/// How a normalized element is mapped.
enum Affine {
    /// MeanVarianceNormalization: `(x - mean) / (sqrt(var) + 1e-9)`.
    None,
    /// Instance/GroupNormalization: row `r` is group `r % groups` of consecutive channels of
    /// `spatial` elements; scale and bias per channel, or per group if `per_group`.
    PerChannel {
        groups: usize,
        spatial: usize,
        per_group: bool,
    },
    /// LayerNormalization: scale (and bias) broadcast over the row, the WGSL offset
    /// expressions of element `e` in them.
    PerElement { scale: String, bias: Option<String> },
}

/// The rows of a row kernel and what it does with them.
struct RowNorm {
    rows: usize,
    len: usize,
    /// WGSL offset expressions of row `r` and of element `e` within it.
    row_at: String,
    elem_at: String,
    /// Added to the variance before its square root (None: MVN's `sqrt(var) + 1e-9`).
    epsilon: Option<f32>,
    affine: Affine,
}

impl RowNorm {
    fn new(cx: &KernelCx) -> Result<RowNorm, NoKernel> {
        let shape = &cx.inputs[0].desc.shape;
        let float = |name| cx.attrs.float(name).map_err(|e| no_kernel!("{e}"));
        // Contiguous rows of `len` elements.
        let contiguous = |rows: usize, len: usize, epsilon, affine| RowNorm {
            rows,
            len,
            row_at: format!("r * {}", u(len)),
            elem_at: "e".into(),
            epsilon: Some(epsilon),
            affine,
        };
        Ok(match cx.op {
            "InstanceNormalization" | "GroupNormalization" => {
                let (n, c, spatial) = channels(cx)?;
                let groups = match cx.op {
                    "GroupNormalization" => {
                        let g = cx.attrs.int("num_groups").map_err(|e| no_kernel!("{e}"))?;
                        usize::try_from(g)
                            .ok()
                            .filter(|&g| g > 0 && c.is_multiple_of(g))
                            .ok_or_else(|| no_kernel!("num_groups {g} for {c} channels"))?
                    }
                    _ => c,
                };
                let per_group = cx.inputs[1].desc.elements() != c;
                for i in [1, 2] {
                    expect_len(cx, i, if per_group { groups } else { c })?;
                }
                let affine = Affine::PerChannel {
                    groups,
                    spatial,
                    per_group,
                };
                contiguous(n * groups, c / groups * spatial, float("epsilon")?, affine)
            }
            "LayerNormalization" => {
                let axis = cx.attrs.int("axis").map_err(|e| no_kernel!("{e}"))?;
                let axis = usize::try_from(axis)
                    .ok()
                    .filter(|&a| a < shape.len())
                    .ok_or_else(|| no_kernel!("LayerNormalization axis {axis}"))?;
                let row = &shape[axis..];
                let rows: usize = shape[..axis].iter().product();
                // A parameter's offset: its own strides on the row's dims it has, 0 elsewhere.
                let param = |i: usize| -> Result<String, NoKernel> {
                    let p = &cx.inputs[i].desc.shape;
                    let pad = row
                        .len()
                        .checked_sub(p.len())
                        .ok_or_else(|| no_kernel!("LayerNormalization input {i} of {p:?}"))?;
                    let ps = strides(p);
                    let mut dims = Vec::with_capacity(row.len());
                    for (d, &size) in row.iter().enumerate() {
                        let stride = match d.checked_sub(pad) {
                            Some(j) if p[j] == size => ps[j],
                            Some(j) if p[j] == 1 => 0,
                            None => 0,
                            Some(_) => {
                                return Err(no_kernel!("LayerNormalization input {i} of {p:?}"));
                            }
                        };
                        dims.push((size, stride));
                    }
                    Ok(offset("e", &dims))
                };
                for o in &cx.outputs[1..] {
                    if o.desc.elements() != rows {
                        return Err(no_kernel!(
                            "LayerNormalization statistics {:?}",
                            o.desc.shape
                        ));
                    }
                }
                let affine = Affine::PerElement {
                    scale: param(1)?,
                    bias: if cx.inputs.len() == 3 {
                        Some(param(2)?)
                    } else {
                        None
                    },
                };
                contiguous(rows, row.iter().product(), float("epsilon")?, affine)
            }
            "MeanVarianceNormalization" => {
                let axes = cx.attrs.ints("axes").map_err(|e| no_kernel!("{e}"))?;
                if axes
                    .iter()
                    .any(|&a| usize::try_from(a).map_or(true, |a| a >= shape.len()))
                {
                    return Err(no_kernel!("MeanVarianceNormalization axes {axes:?}"));
                }
                let st = strides(shape);
                let (mut kept, mut reduced) = (Vec::new(), Vec::new());
                for (d, (&size, &stride)) in shape.iter().zip(&st).enumerate() {
                    match axes.contains(&(d as i64)) {
                        true => reduced.push((size, stride)),
                        false => kept.push((size, stride)),
                    }
                }
                RowNorm {
                    rows: kept.iter().map(|d| d.0).product(),
                    len: reduced.iter().map(|d| d.0).product(),
                    row_at: offset("r", &kept),
                    elem_at: offset("e", &reduced),
                    epsilon: None,
                    affine: Affine::None,
                }
            }
            op => return Err(no_kernel!("no Vulkan kernel for {op}")),
        })
    }

    /// The loops that write every element of row `r` that the invocation takes: from
    /// `start`, every `step`-th.
    fn store(&self, start: &str, step: usize) -> String {
        let each = |from: &str, to: &str, y: &str, pad: &str| {
            format!(
                "{pad}    for (var e = {from}; e < {to}; e += {}) {{\n{pad}        let o = base + {};\n\
                 {pad}        y[offsets.y + o] = {y};\n{pad}    }}\n",
                u(step),
                self.elem_at
            )
        };
        let xv = "x[offsets.x + o]";
        match &self.affine {
            Affine::None => each(start, &u(self.len), &format!("({xv} - mean) * inv"), ""),
            Affine::PerElement { scale, bias } => {
                let mut y = format!("({xv} - mean) * inv * scale[offsets.scale + {scale}]");
                if let Some(b) = bias {
                    let _ = write!(y, " + bias[offsets.bias + {b}]");
                }
                each(start, &u(self.len), &y, "")
            }
            // Channel by channel, its scale and bias read once.
            Affine::PerChannel {
                groups,
                spatial,
                per_group,
            } => {
                let per_row = self.len / spatial.max(&1);
                let p = match per_group {
                    true => format!("r % {}", u(*groups)),
                    false => format!("(r % {}) * {} + ch", u(*groups), u(per_row)),
                };
                let sp = u(*spatial);
                format!(
                    "    for (var ch = 0u; ch < {}; ch++) {{\n        \
                     let sc = inv * scale[offsets.scale + {p}];\n        \
                     let sh = bias[offsets.bias + {p}];\n{}    }}\n",
                    u(per_row),
                    each(
                        &format!("ch * {sp} + {start}"),
                        &format!("(ch + 1u) * {sp}"),
                        &format!("({xv} - mean) * sc + sh"),
                        "    "
                    )
                )
            }
        }
    }

    /// `inv` from `vr`, the variance.
    fn inv(&self) -> String {
        match self.epsilon {
            Some(eps) => format!("1.0 / sqrt(vr + {})", f32_lit(eps)),
            None => format!("1.0 / (sqrt(vr) + {})", f32_lit(1e-9)),
        }
    }
}

/// Rows at least this long take a workgroup each.
fn long_row(class: DeviceClass) -> usize {
    match class {
        // Barriers and workgroup memory are slow on CPU-type devices.
        DeviceClass::Cpu => 1024,
        _ => 128,
    }
}

/// Invocations per workgroup of the long-row kernel.
const ROW_GROUP: usize = 64;

fn row_norm(cx: &KernelCx, rn: &RowNorm) -> Result<Vec<Dispatch>, NoKernel> {
    let mut bindings = vec![Binding::input("x", 0, "f32")];
    if !matches!(rn.affine, Affine::None) {
        bindings.push(Binding::input("scale", 1, "f32"));
    }
    if let Affine::PerChannel { .. } | Affine::PerElement { bias: Some(_), .. } = rn.affine {
        bindings.push(Binding::input("bias", 2, "f32"));
    }
    bindings.push(Binding::output("y", 0, "f32"));
    let stats = [("mean_out", "mean"), ("inv_out", "inv")];
    for (k, (name, _)) in stats.iter().enumerate().take(cx.outputs.len() - 1) {
        bindings.push(Binding::output(name, k + 1, "f32"));
    }
    let stores: String = stats
        .iter()
        .take(cx.outputs.len() - 1)
        .map(|(out, v)| format!("{out}[offsets.{out} + r] = {v}; "))
        .collect();
    let len = u(rn.len);
    let mut s = header(&bindings);
    // One invocation per row, or a workgroup per row whose invocations take every
    // ROW_GROUP-th element from their index.
    let long = rn.len >= long_row(cx.class);
    let (start, step) = if long { ("lid", ROW_GROUP) } else { ("0u", 1) };
    let groups = if long {
        // The grid may have a few more workgroups than rows, which compute the last row
        // again and store nothing (barriers need every invocation).
        let gy = rn.rows.div_ceil(MAX_GROUPS as usize);
        let gx = rn.rows.div_ceil(gy);
        if gy > MAX_GROUPS as usize {
            return Err(no_kernel!("{} rows are too many", rn.rows));
        }
        let _ = writeln!(s, "var<workgroup> red: array<f32, {ROW_GROUP}>;");
        let _ = writeln!(
            s,
            "\n@compute @workgroup_size({ROW_GROUP})\nfn main(@builtin(workgroup_id) wg: vec3<u32>, \
             @builtin(local_invocation_index) lid: u32) {{"
        );
        let _ = writeln!(s, "    let row = wg.x + wg.y * {};", u(gx));
        let _ = writeln!(s, "    let r = min(row, {});", u(rn.rows - 1));
        [gx as u32, gy as u32, 1]
    } else {
        // Small workgroups on CPU-type devices spread few rows over the cores.
        let wg = if cx.class == DeviceClass::Cpu { 8 } else { 64 };
        let grid = Grid::new(rn.rows as u64, wg)?;
        let _ = writeln!(s, "\n{} {{", grid.entry());
        let _ = writeln!(s, "    let r = {};", grid.index());
        let _ = writeln!(s, "    if (r >= {}) {{ return; }}", u(rn.rows));
        grid.groups
    };
    let _ = writeln!(s, "    let base = {};", rn.row_at);
    // Sums `v` (of `xv`) over the row into `total`.
    let sum = |s: &mut String, v: &str, total: &str| {
        let _ = writeln!(s, "    var {total}_part = 0.0;");
        let _ = writeln!(
            s,
            "    for (var e = {start}; e < {len}; e += {}) {{",
            u(step)
        );
        let _ = writeln!(s, "        let xv = x[offsets.x + base + {}];", rn.elem_at);
        let _ = writeln!(s, "        {total}_part += {v};\n    }}");
        if !long {
            let _ = writeln!(s, "    let {total} = {total}_part;");
            return;
        }
        let _ = writeln!(s, "    red[lid] = {total}_part;\n    workgroupBarrier();");
        let mut half = ROW_GROUP / 2;
        while half > 0 {
            let _ = writeln!(
                s,
                "    if (lid < {h}) {{ red[lid] += red[lid + {h}]; }}\n    workgroupBarrier();",
                h = u(half)
            );
            half /= 2;
        }
        let _ = writeln!(s, "    let {total} = red[0];\n    workgroupBarrier();");
    };
    // Two passes: the mean, then the mean square deviation from it.
    sum(&mut s, "xv", "total");
    let _ = writeln!(s, "    let mean = total / f32({len});");
    sum(&mut s, "(xv - mean) * (xv - mean)", "total_sq");
    let _ = writeln!(s, "    let vr = total_sq / f32({len});");
    let _ = writeln!(s, "    let inv = {};", rn.inv());
    if long {
        let _ = writeln!(s, "    if (row >= {}) {{ return; }}", u(rn.rows));
    }
    s.push_str(&rn.store(start, step));
    match (long, stores.is_empty()) {
        (_, true) => {}
        (true, false) => {
            let _ = writeln!(s, "    if (lid == 0u) {{ {stores}}}");
        }
        (false, false) => {
            let _ = writeln!(s, "    {stores}");
        }
    }
    s.push_str("}\n");
    let label = match long {
        true => format!("{}_wg_{}x{}", cx.op.to_lowercase(), rn.rows, rn.len),
        false => format!("{}_{}x{}", cx.op.to_lowercase(), rn.rows, rn.len),
    };
    Ok(vec![Dispatch {
        label,
        wgsl: s,
        groups,
        bindings,
        ..Default::default()
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::Operand;
    use ingot_schema::{AttrValue, Attrs, DType};

    fn f32s(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape.to_vec())
    }

    /// Lowers `op` for both device classes (see `lower_f32_all_classes`).
    fn lower_all(
        op: &str,
        attrs: &Attrs,
        inputs: &[&[usize]],
        outputs: &[&[usize]],
    ) -> Vec<Dispatch> {
        crate::vulkan::lower_f32_all_classes(lower, op, attrs, inputs, outputs, 0)
    }

    fn eps() -> Attrs {
        Attrs::new().with("epsilon", AttrValue::Float(1e-5))
    }

    #[test]
    fn offsets_merge_contiguous_dims() {
        assert_eq!(offset("e", &[(2, 12), (3, 4), (4, 1)]), "e");
        assert_eq!(offset("e", &[(2, 0), (3, 4), (4, 1)]), "(e % 12u)");
        assert_eq!(
            offset("r", &[(5, 60), (1, 9), (3, 4)]),
            "(r % 3u) * 4u + (r / 3u) * 60u"
        );
        assert_eq!(offset("e", &[(3, 0)]), "0u");
    }

    #[test]
    fn batch_norm_and_lrn_compile() {
        let d = lower_all(
            "BatchNormalization",
            &eps(),
            &[&[2, 3, 4, 5], &[3], &[3], &[3], &[3]],
            &[&[2, 3, 4, 5]],
        );
        assert!(
            d[0].wgsl.contains("let ch = ((i / 20u) % 3u);"),
            "{}",
            d[0].wgsl
        );
        let lrn = Attrs::new()
            .with("size", AttrValue::Int(3))
            .with("alpha", AttrValue::Float(1e-4))
            .with("beta", AttrValue::Float(0.75))
            .with("bias", AttrValue::Float(1.0));
        lower_all("LRN", &lrn, &[&[1, 5, 7, 7]], &[&[1, 5, 7, 7]]);
        // 2^24 elements: a two-dimensional grid.
        let d = lower_all(
            "BatchNormalization",
            &eps(),
            &[&[1, 16, 1024, 1024], &[16], &[16], &[16], &[16]],
            &[&[1, 16, 1024, 1024]],
        );
        assert_eq!(d[0].groups, [65535, 5, 1]);
    }

    #[test]
    fn short_rows_take_an_invocation_and_long_rows_a_workgroup() {
        let layer = eps().with("axis", AttrValue::Int(2));
        let d = lower_all(
            "LayerNormalization",
            &layer,
            &[&[1, 40, 120], &[120], &[120]],
            &[&[1, 40, 120]],
        );
        assert_eq!(d[0].label, "layernormalization_40x120");
        assert_eq!(
            d[0].groups,
            [5, 1, 1],
            "8 rows per workgroup on CPU-type devices"
        );
        assert_eq!(d[1].label, "layernormalization_40x120", "GPU: 120 is short");
        let d = lower_all(
            "InstanceNormalization",
            &eps(),
            &[&[2, 3, 300, 400], &[3], &[3]],
            &[&[2, 3, 300, 400]],
        );
        assert_eq!(d[0].label, "instancenormalization_wg_6x120000");
        assert_eq!(d[0].groups, [6, 1, 1]);
        assert!(d[0].wgsl.contains("workgroupBarrier"));
        let groups = eps().with("num_groups", AttrValue::Int(2));
        for c in [4, 2] {
            lower_all(
                "GroupNormalization",
                &groups,
                &[&[2, 4, 3, 3], &[c], &[c]],
                &[&[2, 4, 3, 3]],
            );
            lower_all(
                "GroupNormalization",
                &groups,
                &[&[2, 4, 40, 40], &[c], &[c]],
                &[&[2, 4, 40, 40]],
            );
        }
        // More rows than one grid dimension takes.
        let d = lower_all(
            "LayerNormalization",
            &eps().with("axis", AttrValue::Int(1)),
            &[&[70000, 2048], &[2048]],
            &[&[70000, 2048]],
        );
        assert_eq!(d[0].groups, [35000, 2, 1]);
    }

    #[test]
    fn layer_norm_broadcasts_parameters_and_writes_statistics() {
        let layer = eps().with("axis", AttrValue::Int(1));
        let d = lower_all(
            "LayerNormalization",
            &layer,
            &[&[2, 2, 3], &[3], &[2, 3]],
            &[&[2, 2, 3], &[2, 1, 1], &[2, 1, 1]],
        );
        assert!(
            d[0].wgsl.contains("scale[offsets.scale + (e % 3u)]"),
            "{}",
            d[0].wgsl
        );
        assert!(d[0].wgsl.contains("bias[offsets.bias + e]"));
        assert!(d[0].wgsl.contains("inv_out[offsets.inv_out + r] = inv;"));
        let names: Vec<&str> = d[0].bindings.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["x", "scale", "bias", "y", "mean_out", "inv_out"]);
        let d = lower_all(
            "LayerNormalization",
            &layer,
            &[&[2, 2, 1500], &[1, 1500]],
            &[&[2, 2, 1500], &[2, 1, 1]],
        );
        assert!(
            d[0].wgsl
                .contains("if (lid == 0u) { mean_out[offsets.mean_out + r] = mean; }")
        );
    }

    #[test]
    fn mvn_over_outer_and_inner_axes() {
        let axes = |a: Vec<i64>| Attrs::new().with("axes", AttrValue::Ints(a));
        let d = lower_all(
            "MeanVarianceNormalization",
            &axes(vec![0, 2, 3]),
            &[&[2, 3, 4, 5]],
            &[&[2, 3, 4, 5]],
        );
        assert!(d[0].wgsl.contains("let base = r * 20u;"), "{}", d[0].wgsl);
        assert!(d[0].wgsl.contains("(e % 20u) + (e / 20u) * 60u"));
        lower_all(
            "MeanVarianceNormalization",
            &axes(vec![1]),
            &[&[3, 2000, 2]],
            &[&[3, 2000, 2]],
        );
    }

    #[test]
    fn unsupported_configurations_have_no_kernel() {
        let a = Operand::arena(f32s(&[1, 4, 3]), 0);
        let p = Operand::weight(f32s(&[4]), 0);
        let inputs = [a.clone(), p.clone(), p];
        let outputs = [a];
        let cx = KernelCx {
            class: DeviceClass::Gpu,
            op: "InstanceNormalization",
            name: "n",
            attrs: &eps(),
            inputs: &inputs,
            outputs: &outputs,
        };
        assert!(lower(&cx).unwrap_err().0.contains("in place"));
    }
}
