//! Vulkan kernel of RotaryEmbedding (ops: ops/src/rotary/cpu.rs), float32 with int64
//! position_ids: one invocation per element of Y (`rotary.wgsl`, which says how), on the same
//! geometry as the CPU kernel. One module per (interleaved, position_ids given) pair; sizes
//! are params.

use super::geometry::Geometry;
use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, Spec, Wgsl};
use crate::wgsl;
use ingot_schema::DType;

static ROTARY: Wgsl = wgsl!("rotary/rotary.wgsl");

/// The kernel files, for tests that validate each alone.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 1] = [&ROTARY];

/// Invocations per workgroup.
const WG: u32 = 64;

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    if cx.op != "RotaryEmbedding" {
        return Err(no_kernel!("no Vulkan kernel for {}", cx.op));
    }
    if !(3..=4).contains(&cx.inputs.len()) || cx.outputs.len() != 1 {
        return Err(no_kernel!(
            "{} with {} inputs and {} outputs",
            cx.op,
            cx.inputs.len(),
            cx.outputs.len()
        ));
    }
    if let Some(o) = cx.inputs[..3].iter().chain(cx.outputs).find(|o| o.desc.dtype != DType::F32) {
        return Err(cx.dtype(o.desc.dtype));
    }
    if let Some(ids) = cx.inputs.get(3).filter(|o| o.desc.dtype != DType::I64) {
        return Err(cx.dtype(ids.desc.dtype));
    }
    let shapes: Vec<&[usize]> = cx.inputs.iter().map(|o| o.desc.shape.as_slice()).collect();
    let g = Geometry::new(cx.attrs, &shapes).map_err(|e| no_kernel!("{}: {e}", cx.op))?;
    if cx.outputs[0].desc.shape != cx.inputs[0].desc.shape {
        return Err(no_kernel!("{} with an output shaped unlike X", cx.op));
    }
    if cx.in_place().is_some() {
        return Err(no_kernel!("{} in place (each element reads its partner)", cx.op));
    }
    let count = g.elements();
    if count == 0 {
        return Ok(Vec::new());
    }
    if cx.inputs.iter().chain(cx.outputs).any(|o| o.desc.elements() >= 1 << 31) {
        return Err(no_kernel!("{} too large for 32-bit indices", cx.op));
    }
    // Empty caches with tokens to rotate: every position id is out of range, which the CPU
    // reports.
    if g.positions == Some(0) && g.rot > 0 {
        return Err(no_kernel!("{} with empty caches", cx.op));
    }
    let mut bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::input("cos_cache", 1, "f32"),
        Binding::input("sin_cache", 2, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    if g.positions.is_some() {
        bindings.push(Binding::input("ids", 3, "u32"));
    }
    let per_batch = g.heads * g.seq;
    let params: Vec<u32> = [
        count,
        g.head,
        g.rot,
        g.rot / 2,
        g.seq,
        per_batch,
        g.token_stride(),
        g.positions.unwrap_or(0),
    ]
    .iter()
    .map(|&v| v as u32)
    .collect();
    let mut spec = Spec::new(&ROTARY)
        .set("WG", WG)
        .set("INTERLEAVED", g.interleaved)
        .set("POSITIONS", g.positions.is_some());
    // Every divisor is positive here (count > 0) and count < 2^31.
    if [g.head, per_batch, g.token_stride(), g.seq].iter().all(|&d| d < 1 << 24) {
        spec = spec.divmod();
    }
    let label = format!(
        "rotaryembedding_{}{}_{}_r{}",
        if g.interleaved { "interleaved_" } else { "" },
        cx.inputs[0].desc.shape.iter().map(usize::to_string).collect::<Vec<_>>().join("x"),
        if g.positions.is_some() { "ids" } else { "tokens" },
        g.rot
    );
    let grid = Grid::new(count as u64, WG)?;
    Ok(vec![spec.dispatch(label, grid.groups, bindings, params)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::matmul::vulkan::tests::specialised;
    use crate::rotary::geometry::canonical as attrs;
    use crate::vulkan::{DeviceClass, Operand, Slot, compile, lower_all_classes};
    use ingot_schema::Attrs;

    /// Lowers for both device classes with operands one after the other in the arena (the
    /// fourth, position_ids, int64) and checks every dispatch against its compiled module.
    fn lower_all(a: &Attrs, inputs: &[&[usize]], x: &[usize]) -> Vec<Dispatch> {
        let ins: Vec<TensorDesc> = (inputs.iter().enumerate())
            .map(|(i, s)| TensorDesc::new(if i == 3 { DType::I64 } else { DType::F32 }, s.to_vec()))
            .collect();
        let outs = [TensorDesc::new(DType::F32, x.to_vec())];
        lower_all_classes(lower, "RotaryEmbedding", a, &ins, &outs, 0)
    }

    fn set(d: &Dispatch, name: &str) -> f64 {
        d.overrides.iter().find(|o| o.0 == name).unwrap_or_else(|| panic!("{name}")).1
    }

    #[test]
    fn every_kernel_file_compiles_alone() {
        crate::vulkan::assert_all_files_listed("rotary", &FILES);
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
    }

    #[test]
    fn position_ids_take_the_last_slot_only_when_given() {
        // The node tests' shapes: 4-D with position_ids, partial and interleaved.
        let d = lower_all(
            &attrs(true, 4, 4),
            &[&[2, 4, 3, 8], &[50, 2], &[50, 2], &[2, 3]],
            &[2, 4, 3, 8],
        );
        assert_eq!(d.len(), 2, "one dispatch per class");
        assert_eq!(d[0].wgsl, d[1].wgsl, "one module for both classes");
        assert_eq!(d[0].label, "rotaryembedding_interleaved_2x4x3x8_ids_r4");
        assert_eq!(d[0].groups, [3, 1, 1], "192 elements, 64 per workgroup");
        assert_eq!(d[0].params, [192, 8, 4, 2, 3, 12, 1, 50]);
        assert_eq!((set(&d[0], "INTERLEAVED"), set(&d[0], "POSITIONS")), (1.0, 1.0));
        let slots: Vec<_> = d[0].bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
        assert_eq!(
            slots,
            [
                ("x", Slot::Input(0)),
                ("cos_cache", Slot::Input(1)),
                ("sin_cache", Slot::Input(2)),
                ("y", Slot::Output(0)),
                ("ids", Slot::Input(3))
            ]
        );
        insta::assert_snapshot!("positions_interleaved", specialised(&d[0], &ROTARY));
        // 3-D without position_ids: four slots, the module never touches the fifth (`valid`
        // checks), tokens 4 rows apart.
        let d = lower_all(&attrs(false, 4, 8), &[&[2, 3, 32], &[2, 3, 4], &[2, 3, 4]], &[2, 3, 32]);
        assert_eq!(d[0].bindings.len(), 4);
        assert_eq!(d[0].params, [192, 8, 8, 4, 3, 12, 4, 0]);
        assert_eq!((set(&d[0], "INTERLEAVED"), set(&d[0], "POSITIONS")), (0.0, 0.0));
        // 2^24 elements: 2^18 workgroups, in rows of 65535.
        let d = lower_all(
            &attrs(false, 32, 64),
            &[&[1, 32, 4096, 128], &[8192, 32], &[8192, 32], &[1, 4096]],
            &[1, 32, 4096, 128],
        );
        assert_eq!(d[0].groups, [65535, 5, 1]);
    }

    #[test]
    fn unsupported_operands_have_no_kernel() {
        let f = |s: &[usize]| TensorDesc::new(DType::F32, s.to_vec());
        let x = Operand::arena(f(&[1, 1, 2, 4]), 0);
        let cache = Operand::arena(f(&[3, 2]), 64);
        let ids32 = Operand::arena(TensorDesc::new(DType::I32, vec![1, 2]), 128);
        let y = Operand::arena(f(&[1, 1, 2, 4]), 256);
        let a = attrs(false, 1, 4);
        let cx = |inputs, outputs| KernelCx {
            class: DeviceClass::Gpu,
            op: "RotaryEmbedding",
            name: "n",
            attrs: &a,
            inputs,
            outputs,
        };
        let ins = [x.clone(), cache.clone(), cache.clone(), ids32];
        assert_eq!(
            lower(&cx(&ins, std::slice::from_ref(&y))).unwrap_err().0,
            "RotaryEmbedding on i32"
        );
        let ins = [x.clone(), cache.clone(), cache];
        let err = lower(&cx(&ins, std::slice::from_ref(&y))).unwrap_err();
        assert!(err.0.contains("cos_cache has shape [3, 2]"), "{err}");
    }
}
