//! Vulkan kernels of the spectral family (ops: ops/src/spectral/cpu.rs): DFT and STFT of
//! float32 signals, both `dft.wgsl` (one invocation per output value; the signal's layout and
//! framing are params, the direction, the parts and the window overrides). The device sums in
//! f32 where the CPU sums in f64: outputs agree to f32 rounding of sums of `length` terms.

use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, Spec, Wgsl};
use crate::wgsl;

static DFT: Wgsl = wgsl!("spectral/dft.wgsl");

/// The kernel file, for tests that validate it alone.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 1] = [&DFT];

const WG: u32 = 64;

/// Where a step's signals are and what it makes of them.
struct Signals {
    mode: u32,
    parts: usize,
    /// Output values (pairs, or reals for the one-sided inverse).
    count: usize,
    n: usize,
    length: usize,
    bins: usize,
    inner: usize,
    frames: usize,
    image_stride: usize,
    frame_stride: usize,
    t_stride: usize,
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    if cx.in_place().is_some() {
        return Err(no_kernel!("{} in place", cx.op));
    }
    let x = &cx.inputs[0].desc;
    let int = |name: &str| {
        cx.attrs.int(name).map(|v| v as usize).map_err(|e| no_kernel!("{}: {e}", cx.op))
    };
    let s = match cx.op {
        "DFT" => {
            let rank = x.shape.len();
            let axis = int("axis")?;
            if axis + 1 >= rank {
                return Err(no_kernel!("DFT axis {axis} of {:?}", x.shape));
            }
            let (length, inverse, onesided) =
                (int("length")?, int("inverse")? != 0, int("onesided")? != 0);
            let parts = x.shape[rank - 1];
            let (outer, n_axis) = (x.shape[..axis].iter().product::<usize>(), x.shape[axis]);
            let inner = x.shape[axis + 1..rank - 1].iter().product::<usize>();
            let mode = match (inverse, onesided) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            };
            let bins = if onesided && !inverse { length / 2 + 1 } else { length };
            Signals {
                mode,
                parts,
                count: outer * bins * inner,
                // The one-sided inverse reads bins; the others at most `length` samples.
                n: if mode == 2 { n_axis } else { n_axis.min(length) },
                length,
                bins,
                inner,
                frames: 1,
                image_stride: n_axis * inner * parts,
                frame_stride: 0,
                t_stride: inner * parts,
            }
        }
        "STFT" => {
            let &[batch, len, parts] = &x.shape[..] else {
                return Err(no_kernel!("STFT of {:?}", x.shape));
            };
            let (step, length) = (int("frame_step")?, int("frame_length")?);
            if step == 0 || length == 0 || length > len {
                return Err(no_kernel!("STFT frames of {length} every {step} of {len}"));
            }
            let frames = 1 + (len - length) / step;
            let bins = if int("onesided")? != 0 { length / 2 + 1 } else { length };
            Signals {
                mode: 0,
                parts,
                count: batch * frames * bins,
                n: length,
                length,
                bins,
                inner: 1,
                frames,
                image_stride: len * parts,
                frame_stride: step * parts,
                t_stride: parts,
            }
        }
        op => return Err(no_kernel!("no Vulkan kernel for {op}")),
    };
    if s.count == 0 {
        return Ok(Vec::new());
    }
    if cx.outputs[0].desc.elements() != s.count * if s.mode == 2 { 1 } else { 2 } {
        return Err(no_kernel!("{} output {:?}", cx.op, cx.outputs[0].desc));
    }
    if x.elements() as u64 >= 1 << 31 || (s.length as u64).pow(2) >= 1 << 30 {
        return Err(no_kernel!("{}: sizes too large for u32 indices", cx.op));
    }
    let window = cx.inputs.len() > 1;
    let mut bindings = vec![Binding::input("x", 0, "f32"), Binding::output("y", 0, "f32")];
    if window {
        bindings.push(Binding::input("window", 1, "f32"));
    }
    let params = [
        s.count,
        s.n,
        s.length,
        s.bins,
        s.inner,
        s.frames,
        s.image_stride,
        s.frame_stride,
        s.t_stride,
    ]
    .map(|v| v as u32)
    .to_vec();
    let grid = Grid::new(s.count as u64, WG)?;
    let mut spec = Spec::new(&DFT).set("WG", WG).set("MODE", s.mode).set("PARTS", s.parts as u32);
    if window {
        spec = spec.set("WINDOW", true);
    }
    let label = format!("{}_{}", cx.op.to_lowercase(), s.length);
    Ok(vec![spec.dispatch(label, grid.groups, bindings, params)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vulkan::{compile, lower_f32_all_classes, valid};
    use ingot_schema::{AttrValue, Attrs};

    #[test]
    fn every_kernel_file_compiles_alone() {
        crate::vulkan::assert_all_files_listed("spectral", &FILES);
        for file in FILES {
            compile(file.source, &[]).unwrap_or_else(|e| panic!("{}:\n{e}", file.path));
        }
    }

    #[test]
    fn dft_directions_and_stft_windows() {
        let dft = |inverse: i64, onesided: i64| {
            Attrs::new()
                .with("axis", AttrValue::Int(1))
                .with("length", AttrValue::Int(10))
                .with("inverse", AttrValue::Int(inverse))
                .with("onesided", AttrValue::Int(onesided))
        };
        let cases: [(Attrs, &[usize], &[usize]); 4] = [
            (dft(0, 0), &[1, 10, 3, 1], &[1, 10, 3, 2]),
            (dft(0, 1), &[1, 10, 3, 1], &[1, 6, 3, 2]),
            (dft(1, 0), &[1, 10, 3, 2], &[1, 10, 3, 2]),
            (dft(1, 1), &[1, 6, 3, 2], &[1, 10, 3, 1]),
        ];
        for (attrs, x, y) in cases {
            valid(&lower_f32_all_classes(lower, "DFT", &attrs, &[x], &[y], 0));
        }
        let stft = Attrs::new()
            .with("frame_step", AttrValue::Int(8))
            .with("frame_length", AttrValue::Int(16))
            .with("onesided", AttrValue::Int(1));
        let shapes: [&[usize]; 2] = [&[1, 128, 1], &[16]];
        let d = lower_f32_all_classes(lower, "STFT", &stft, &shapes, &[&[1, 15, 9, 2]], 0);
        valid(&d);
        assert_eq!(d[0].params[..6], [15 * 9, 16, 16, 9, 1, 15]);
    }
}
