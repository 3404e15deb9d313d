//! Vulkan kernels of the norm family (ops: ops/src/norm/cpu.rs): BatchNormalization
//! (inference), InstanceNormalization, GroupNormalization, LayerNormalization (with its
//! optional Mean and InvStdDev outputs), RMSNormalization, LRN and MeanVarianceNormalization,
//! float32.
//!
//! Instance, Group, Layer, RMS and MeanVariance normalization are one row kernel
//! (`rows.wgsl`): the input is walked as rows (the indices the statistics are per) of elements
//! (the indices they are over), each row's mean and variance computed in two passes (mean,
//! then the mean square deviation from it; RMS: no mean, override `RMS`), then every element
//! normalized and mapped (hooks). Short rows take one invocation each; long rows one workgroup
//! each, the partial sums of its invocations added in workgroup memory. BatchNormalization and
//! LRN (`batch_norm.wgsl`, `lrn.wgsl`) are one invocation per element, on a grid of (plane,
//! channel, batch).

use crate::no_kernel;
use crate::vulkan::{
    Binding, DeviceClass, Dispatch, Grid, KernelCx, MAX_GROUPS, NoKernel, Spec, Wgsl,
};
use crate::wgsl;

static BATCH_NORM: Wgsl = wgsl!("norm/batch_norm.wgsl");
static LRN: Wgsl = wgsl!("norm/lrn.wgsl");
static ROWS: Wgsl = wgsl!("norm/rows.wgsl");

/// The kernel files, for tests that validate each alone.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 3] = [&BATCH_NORM, &LRN, &ROWS];

/// `rows.wgsl`'s hooks: Instance/GroupNormalization's per-channel factors, Layer and
/// RMSNormalization's per-element scale (and LayerNormalization's bias), its statistics
/// outputs.
const CHANNEL_FACTORS: &str = "fn run_factors(inv: f32, s: u32, sb: u32) -> vec2<f32> {
    return vec2<f32>(inv * scale[p.scale + s], bias[p.bias + sb]);
}";
const CHANNEL: &str = "fn normalize(v: f32, mean: f32, f: vec2<f32>, s: u32, sb: u32) -> f32 {
    return (v - mean) * f.x + f.y;
}";
const LAYER: &str = "fn normalize(v: f32, mean: f32, f: vec2<f32>, s: u32, sb: u32) -> f32 {
    return (v - mean) * f.x * scale[p.scale + s];
}";
const LAYER_BIAS: &str = "fn normalize(v: f32, mean: f32, f: vec2<f32>, s: u32, sb: u32) -> f32 {
    return (v - mean) * f.x * scale[p.scale + s] + bias[p.bias + sb];
}";
const STATS: [&str; 2] = [
    "fn store_stats(r: u32, mean: f32, inv: f32) {
    mean_out[p.mean_out + r] = mean;
}",
    "fn store_stats(r: u32, mean: f32, inv: f32) {
    mean_out[p.mean_out + r] = mean;
    inv_out[p.inv_out + r] = inv;
}",
];

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    let x = &cx.inputs.first().ok_or_else(|| no_kernel!("{} without inputs", cx.op))?.desc;
    let (out, inputs) = (cx.outputs.len(), cx.inputs.len());
    let arity = match cx.op {
        "BatchNormalization" => inputs == 5 && out == 1,
        "InstanceNormalization" | "GroupNormalization" => inputs == 3 && out == 1,
        "LayerNormalization" => (2..=3).contains(&inputs) && (1..=3).contains(&out),
        "RMSNormalization" => inputs == 2 && out == 1,
        _ => inputs == 1 && out == 1,
    };
    if !arity || cx.outputs[0].desc.shape != x.shape {
        return Err(no_kernel!("{} with {inputs} inputs and {out} outputs", cx.op));
    }
    if cx.inputs.iter().chain(cx.outputs).any(|o| o.desc.elements() >= 1 << 31) {
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
        "LRN" => lrn(cx, int("size")?, [float("alpha")?, float("beta")?, float("bias")?]),
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
        false => Err(no_kernel!("{} input {i} of shape {:?}", cx.op, cx.inputs[i].desc.shape)),
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

/// Dimensions as (size, strides...), outer first, with those of size 1 left out and
/// neighbours merged where every stride allows.
fn merge<const S: usize>(
    dims: impl IntoIterator<Item = (usize, [usize; S])>,
) -> Vec<(usize, [usize; S])> {
    let mut merged: Vec<(usize, [usize; S])> = Vec::new();
    for (size, st) in dims.into_iter().filter(|d| d.0 != 1) {
        match merged.last_mut() {
            Some(last) if (0..S).all(|k| last.1[k] == st[k] * size) => {
                *last = (last.0 * size, st);
            }
            _ => merged.push((size, st)),
        }
    }
    merged
}

/// A per-element kernel's dispatch on the grid (plane / 64, channel, batch), each dimension
/// cut at the most workgroups a dispatch may have (the kernel loops over the rest); `FITS`
/// when none was cut.
fn over_planes(
    spec: Spec,
    label: String,
    [batch, c, inner]: [usize; 3],
    bindings: Vec<Binding>,
    params: Vec<u32>,
) -> Result<Vec<Dispatch>, NoKernel> {
    let full = [inner.div_ceil(64), c, batch];
    let max = MAX_GROUPS as usize;
    let fits = full.iter().all(|&g| g <= max);
    let groups = full.map(|g| g.clamp(1, max) as u32);
    Ok(vec![spec.set("FITS", fits).dispatch(label, groups, bindings, params)?])
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
    let mut bindings: Vec<Binding> =
        names.iter().enumerate().map(|(i, name)| Binding::input(name, i, "f32")).collect();
    bindings.push(Binding::output("y", 0, "f32"));
    let params = [inner as u32, c as u32, batch as u32, epsilon.to_bits()];
    over_planes(
        Spec::new(&BATCH_NORM),
        format!("batchnorm_{n}_{c}"),
        [batch, c, inner],
        bindings,
        params.to_vec(),
    )
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
    let bindings = vec![Binding::input("x", 0, "f32"), Binding::output("y", 0, "f32")];
    let (before, after) = ((size - 1) / 2, size / 2);
    let mut params: Vec<u32> =
        [spatial, c, batch, before, after].iter().map(|&v| v as u32).collect();
    params.extend([bias, alpha / size as f32, beta].map(f32::to_bits));
    over_planes(
        Spec::new(&LRN),
        format!("lrn_{n}_{c}_{size}"),
        [batch, c, spatial],
        bindings,
        params,
    )
}

/// How a normalized element is mapped.
enum Affine {
    /// MeanVarianceNormalization: `(x - mean) / (sqrt(var) + 1e-9)`.
    None,
    /// Instance/GroupNormalization: scale and bias per channel (or per group), one run each.
    PerChannel,
    /// Layer and RMSNormalization: scale (and bias) broadcast over the row.
    PerElement { bias: bool },
}

/// The rows of a row kernel and what it does with them (`rows.wgsl`'s params).
struct RowNorm {
    rows: usize,
    /// Row r starts at (r / r1) * rs.0 + (r % r1) * rs.1.
    r1: usize,
    rs: (usize, usize),
    /// The runs of a row and the elements of a run: (count, x stride, scale stride, bias
    /// stride).
    outer: [usize; 4],
    inner: [usize; 4],
    /// Scale and bias start at (r % groups) * s_row.
    groups: usize,
    s_row: usize,
    /// Added to the variance before its square root (None: MVN's `sqrt(var) + 1e-9`).
    epsilon: Option<f32>,
    /// Whether the mean is subtracted (all but RMSNormalization).
    centered: bool,
    affine: Affine,
}

impl RowNorm {
    fn new(cx: &KernelCx) -> Result<RowNorm, NoKernel> {
        let shape = &cx.inputs[0].desc.shape;
        let float = |name| cx.attrs.float(name).map_err(|e| no_kernel!("{e}"));
        // (outer, inner) from up to two merged dimensions (size, [x, scale, bias strides]).
        let runs = |dims: &[(usize, [usize; 3])]| -> Result<([usize; 4], [usize; 4]), NoKernel> {
            let run = |d: &(usize, [usize; 3])| [d.0, d.1[0], d.1[1], d.1[2]];
            match dims {
                [] => Ok(([1, 0, 0, 0], [1, 0, 0, 0])),
                [inner] => Ok(([1, 0, 0, 0], run(inner))),
                [outer, inner] => Ok((run(outer), run(inner))),
                _ => Err(no_kernel!(
                    "{} with rows of {} dimensions that do not merge (2 at most)",
                    cx.op,
                    dims.len()
                )),
            }
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
                let per_row = c / groups;
                let s = usize::from(!per_group);
                RowNorm {
                    rows: n * groups,
                    r1: 1,
                    rs: (per_row * spatial, 0),
                    outer: [per_row, spatial, s, s],
                    inner: [spatial, 1, 0, 0],
                    groups,
                    s_row: if per_group { 1 } else { per_row },
                    epsilon: Some(float("epsilon")?),
                    centered: true,
                    affine: Affine::PerChannel,
                }
            }
            "LayerNormalization" | "RMSNormalization" => {
                let axis = cx.attrs.int("axis").map_err(|e| no_kernel!("{e}"))?;
                let axis = usize::try_from(axis)
                    .ok()
                    .filter(|&a| a < shape.len())
                    .ok_or_else(|| no_kernel!("{} axis {axis}", cx.op))?;
                let row = &shape[axis..];
                let rows: usize = shape[..axis].iter().product();
                // A parameter's strides: its own on the row's dims it has, 0 elsewhere.
                let param = |i: usize| -> Result<Vec<usize>, NoKernel> {
                    let Some(p) = cx.inputs.get(i).map(|o| &o.desc.shape) else {
                        return Ok(vec![0; row.len()]);
                    };
                    let pad = row
                        .len()
                        .checked_sub(p.len())
                        .ok_or_else(|| no_kernel!("{} input {i} of {p:?}", cx.op))?;
                    let ps = strides(p);
                    row.iter()
                        .enumerate()
                        .map(|(d, &size)| match d.checked_sub(pad) {
                            Some(j) if p[j] == size => Ok(ps[j]),
                            Some(j) if p[j] == 1 => Ok(0),
                            None => Ok(0),
                            Some(_) => Err(no_kernel!("{} input {i} of {p:?}", cx.op)),
                        })
                        .collect()
                };
                for o in &cx.outputs[1..] {
                    if o.desc.elements() != rows {
                        return Err(no_kernel!("{} statistics {:?}", cx.op, o.desc.shape));
                    }
                }
                let (xs, ss, bs) = (strides(row), param(1)?, param(2)?);
                let dims = merge((0..row.len()).map(|d| (row[d], [xs[d], ss[d], bs[d]])));
                let (outer, inner) = runs(&dims)?;
                let len = row.iter().product();
                RowNorm {
                    rows,
                    r1: 1,
                    rs: (len, 0),
                    outer,
                    inner,
                    groups: 1,
                    s_row: 0,
                    epsilon: Some(float("epsilon")?),
                    centered: cx.op == "LayerNormalization",
                    affine: Affine::PerElement { bias: cx.inputs.len() == 3 },
                }
            }
            "MeanVarianceNormalization" => {
                let axes = cx.attrs.ints("axes").map_err(|e| no_kernel!("{e}"))?;
                if axes.iter().any(|&a| usize::try_from(a).map_or(true, |a| a >= shape.len())) {
                    return Err(no_kernel!("MeanVarianceNormalization axes {axes:?}"));
                }
                let st = strides(shape);
                let dims = |reduced: bool| {
                    merge(
                        (0..shape.len())
                            .filter(|&d| axes.contains(&(d as i64)) == reduced)
                            .map(|d| (shape[d], [st[d], 0, 0])),
                    )
                };
                let (kept, reduced) = (dims(false), dims(true));
                let (r1, rs) = match kept[..] {
                    [] => (1, (0, 0)),
                    [(_, [s, ..])] => (1, (s, 0)),
                    [(_, [s0, ..]), (d1, [s1, ..])] => (d1, (s0, s1)),
                    _ => {
                        return Err(no_kernel!(
                            "MeanVarianceNormalization with {} kept dimensions that do not \
                             merge (2 at most)",
                            kept.len()
                        ));
                    }
                };
                let (outer, inner) = runs(&reduced)?;
                RowNorm {
                    rows: kept.iter().map(|d| d.0).product(),
                    r1,
                    rs,
                    outer,
                    inner,
                    groups: 1,
                    s_row: 0,
                    epsilon: None,
                    centered: true,
                    affine: Affine::None,
                }
            }
            op => return Err(no_kernel!("no Vulkan kernel for {op}")),
        })
    }

    fn len(&self) -> usize {
        self.outer[0] * self.inner[0]
    }

    /// The push-constant words after the binding offsets.
    fn params(&self) -> Vec<u32> {
        let [oc, ox, os, ob] = self.outer;
        let [ic, ix, is, ib] = self.inner;
        let words = [
            self.rows,
            self.r1,
            self.rs.0,
            self.rs.1,
            oc,
            ox,
            os,
            ob,
            ic,
            ix,
            is,
            ib,
            self.groups,
            self.s_row,
        ];
        let mut v: Vec<u32> = words.iter().map(|&w| w as u32).collect();
        v.push(self.epsilon.unwrap_or(0.0).to_bits());
        v
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
const ROW_GROUP: u32 = 64;

fn row_norm(cx: &KernelCx, rn: &RowNorm) -> Result<Vec<Dispatch>, NoKernel> {
    let mut bindings = vec![Binding::input("x", 0, "f32"), Binding::output("y", 0, "f32")];
    let stats = cx.outputs.len() - 1;
    let mut spec =
        Spec::new(&ROWS).set("MVN", matches!(rn.affine, Affine::None)).set("RMS", !rn.centered);
    match rn.affine {
        Affine::None => {}
        Affine::PerChannel => {
            bindings.push(Binding::input("scale", 1, "f32"));
            bindings.push(Binding::input("bias", 2, "f32"));
            spec = spec.hook("run_factors", CHANNEL_FACTORS).hook("normalize", CHANNEL);
        }
        Affine::PerElement { bias } => {
            bindings.push(Binding::input("scale", 1, "f32"));
            // Without a bias, the statistics still take their slots after its own, which
            // then holds the scale again (never read).
            if bias || stats > 0 {
                bindings.push(Binding::input("bias", if bias { 2 } else { 1 }, "f32"));
            }
            spec = spec.hook("normalize", if bias { LAYER_BIAS } else { LAYER });
        }
    }
    if stats > 0 {
        for (k, name) in ["mean_out", "inv_out"].iter().enumerate().take(stats) {
            bindings.push(Binding::output(name, k + 1, "f32"));
        }
        spec = spec.hook("store_stats", STATS[stats - 1]);
    }
    // One invocation per row, or a workgroup per row whose invocations take every
    // ROW_GROUP-th element from their index.
    let long = rn.len() >= long_row(cx.class);
    let (groups, wg) = if long {
        // The grid may have a few more workgroups than rows, which compute the last row
        // again and store nothing (barriers need every invocation).
        let gy = rn.rows.div_ceil(MAX_GROUPS as usize);
        let gx = rn.rows.div_ceil(gy);
        if gy > MAX_GROUPS as usize {
            return Err(no_kernel!("{} rows are too many", rn.rows));
        }
        ([gx as u32, gy as u32, 1], ROW_GROUP)
    } else {
        // Small workgroups on CPU-type devices spread few rows over the cores.
        let wg = if cx.class == DeviceClass::Cpu { 8 } else { 64 };
        (Grid::new(rn.rows as u64, wg)?.groups, wg)
    };
    let label = match long {
        true => format!("{}_wg_{}x{}", cx.op.to_lowercase(), rn.rows, rn.len()),
        false => format!("{}_{}x{}", cx.op.to_lowercase(), rn.rows, rn.len()),
    };
    let spec = spec.set("WG", wg).set("LONG", long);
    Ok(vec![spec.dispatch(label, groups, bindings, rn.params())?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::matmul::vulkan::tests::specialised;
    use crate::vulkan::{Operand, compile};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn f32s(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape.to_vec())
    }

    /// Lowers `op` for both device classes (see `lower_f32_all_classes`: every dispatch is
    /// compiled).
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
    }

    #[test]
    fn dims_merge_where_every_stride_allows() {
        assert_eq!(merge([(2, [12]), (3, [4]), (4, [1])]), [(24, [1])], "contiguous");
        assert_eq!(merge([(2, [0, 12]), (3, [4, 4]), (4, [1, 1])]), [(2, [0, 12]), (12, [1, 1])]);
        assert_eq!(merge([(5, [60]), (1, [9]), (3, [4])]), [(5, [60]), (3, [4])]);
        assert_eq!(merge::<1>([(1, [3])]), []);
    }

    #[test]
    fn batch_norm_and_lrn_run_on_a_grid_of_planes() {
        let d = lower_all(
            "BatchNormalization",
            &eps(),
            &[&[2, 3, 4, 5], &[3], &[3], &[3], &[3]],
            &[&[2, 3, 4, 5]],
        );
        assert_eq!(d[0].groups, [1, 3, 2], "(plane, channel, batch)");
        assert_eq!(d[0].params, [20, 3, 2, 1e-5f32.to_bits()]);
        insta::assert_snapshot!("batch_norm", specialised(&d[0], &BATCH_NORM));
        let lrn = Attrs::new()
            .with("size", AttrValue::Int(3))
            .with("alpha", AttrValue::Float(1e-4))
            .with("beta", AttrValue::Float(0.75))
            .with("bias", AttrValue::Float(1.0));
        let d = lower_all("LRN", &lrn, &[&[1, 5, 7, 7]], &[&[1, 5, 7, 7]]);
        assert_eq!(d[0].groups, [1, 5, 1]);
        let alpha = (1e-4f32 / 3.0).to_bits();
        assert_eq!(d[0].params, [49, 5, 1, 1, 1, 1.0f32.to_bits(), alpha, 0.75f32.to_bits()]);
        // 2^24 elements: planes of 2^20 in 16384 workgroups.
        let d = lower_all(
            "BatchNormalization",
            &eps(),
            &[&[1, 16, 1024, 1024], &[16], &[16], &[16], &[16]],
            &[&[1, 16, 1024, 1024]],
        );
        assert_eq!(d[0].groups, [16384, 16, 1]);
        // Planes longer than the grid takes: the kernel loops over the rest.
        let d = lower_all(
            "BatchNormalization",
            &eps(),
            &[&[1, 1, 1 << 23], &[1], &[1], &[1], &[1]],
            &[&[1, 1, 1 << 23]],
        );
        assert_eq!(d[0].groups, [65535, 1, 1]);
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
        assert_eq!(d[0].groups, [5, 1, 1], "8 rows per workgroup on CPU-type devices");
        assert_eq!((set(&d[0], "WG"), set(&d[0], "LONG")), (8.0, 0.0));
        assert_eq!(d[1].label, "layernormalization_40x120", "GPU: 120 is short");
        insta::assert_snapshot!("layer_norm_cpu", specialised(&d[0], &ROWS));
        let d = lower_all(
            "InstanceNormalization",
            &eps(),
            &[&[2, 3, 300, 400], &[3], &[3]],
            &[&[2, 3, 300, 400]],
        );
        assert_eq!(d[0].label, "instancenormalization_wg_6x120000");
        assert_eq!(d[0].groups, [6, 1, 1]);
        assert_eq!((set(&d[0], "WG"), set(&d[0], "LONG")), (64.0, 1.0));
        insta::assert_snapshot!("instance_norm_long", specialised(&d[0], &ROWS));
        let groups = eps().with("num_groups", AttrValue::Int(2));
        for c in [4, 2] {
            lower_all(
                "GroupNormalization",
                &groups,
                &[&[2, 4, 3, 3], &[c], &[c]],
                &[&[2, 4, 3, 3]],
            );
            let d = lower_all(
                "GroupNormalization",
                &groups,
                &[&[2, 4, 40, 40], &[c], &[c]],
                &[&[2, 4, 40, 40]],
            );
            // Rows of 2 channels of 1600: scale and bias per channel (stride 1, rows 2 apart)
            // or per group (stride 0, rows 1 apart).
            let (s, row) = if c == 4 { (1, 2) } else { (0, 1) };
            assert_eq!(
                d[0].params,
                [4, 1, 3200, 0, 2, 1600, s, s, 1600, 1, 0, 0, 2, row, 1e-5f32.to_bits()]
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
        // Rows [2, 3]: x strides (3, 1), scale [3] (0, 1), bias [2, 3] (3, 1).
        let d = lower_all(
            "LayerNormalization",
            &layer,
            &[&[2, 2, 3], &[3], &[2, 3]],
            &[&[2, 2, 3], &[2, 1, 1], &[2, 1, 1]],
        );
        assert_eq!(d[0].params[4..12], [2, 3, 0, 3, 3, 1, 1, 1]);
        let names: Vec<&str> = d[0].bindings.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["x", "y", "scale", "bias", "mean_out", "inv_out"]);
        insta::assert_snapshot!("layer_norm_stats", specialised(&d[0], &ROWS));
        // No bias but a Mean output: the scale fills the bias's slot.
        let d = lower_all(
            "LayerNormalization",
            &layer,
            &[&[2, 2, 1500], &[1, 1500]],
            &[&[2, 2, 1500], &[2, 1, 1]],
        );
        let slots: Vec<_> = d[0].bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
        use crate::vulkan::Slot::{Input, Output};
        assert_eq!(
            slots,
            [
                ("x", Input(0)),
                ("y", Output(0)),
                ("scale", Input(1)),
                ("bias", Input(1)),
                ("mean_out", Output(1))
            ]
        );
        assert_eq!(set(&d[0], "LONG"), 1.0, "3000 elements");
    }

    #[test]
    fn rms_norm_is_layer_norm_uncentred() {
        let rms = eps().with("axis", AttrValue::Int(1));
        // Rows [3, 5] of scale [3, 5]: contiguous, one run.
        let d = lower_all("RMSNormalization", &rms, &[&[2, 3, 5], &[3, 5]], &[&[2, 3, 5]]);
        assert_eq!(d[0].label, "rmsnormalization_2x15");
        let names: Vec<&str> = d[0].bindings.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["x", "y", "scale"]);
        assert_eq!((set(&d[0], "RMS"), set(&d[0], "MVN")), (1.0, 0.0));
        insta::assert_snapshot!("rms_norm_cpu", specialised(&d[0], &ROWS));
        // Long rows (a workgroup each, on both classes) with a broadcast scale.
        let d = lower_all("RMSNormalization", &rms, &[&[4, 2, 1024], &[1, 1024]], &[&[4, 2, 1024]]);
        for d in &d {
            assert_eq!((set(d, "LONG"), set(d, "RMS")), (1.0, 1.0), "{}", d.label);
            assert_eq!(d.params[4..12], [2, 1024, 0, 0, 1024, 1, 1, 0]);
        }
        let layer = lower_all("LayerNormalization", &rms, &[&[2, 3, 5], &[3, 5]], &[&[2, 3, 5]]);
        assert_eq!(set(&layer[0], "RMS"), 0.0);
    }

    #[test]
    fn mvn_over_outer_and_inner_axes() {
        let axes = |a: Vec<i64>| Attrs::new().with("axes", AttrValue::Ints(a));
        // Rows are the 3 channels, 20 apart; each 2 runs (60 apart) of 20 elements.
        let d = lower_all(
            "MeanVarianceNormalization",
            &axes(vec![0, 2, 3]),
            &[&[2, 3, 4, 5]],
            &[&[2, 3, 4, 5]],
        );
        assert_eq!(d[0].params[..12], [3, 1, 20, 0, 2, 60, 0, 0, 20, 1, 0, 0]);
        assert_eq!(set(&d[0], "MVN"), 1.0);
        // Rows over two kept dimensions: (r / 2) * 4000 + (r % 2).
        let d = lower_all(
            "MeanVarianceNormalization",
            &axes(vec![1]),
            &[&[3, 2000, 2]],
            &[&[3, 2000, 2]],
        );
        assert_eq!(d[0].params[..12], [6, 2, 4000, 1, 1, 0, 0, 0, 2000, 2, 0, 0]);
        assert_eq!(set(&d[0], "LONG"), 1.0);
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
