//! Vulkan kernels of Attention (ops: attention/cpu.rs), float32 operands, a float32 or bool
//! attn_mask and an int64 nonpad_kv_seqlen: one invocation per query row
//! (`attention.wgsl`, which says how), on the geometry the CPU kernel reads; present_key and
//! present_value, where the step has them, are one dispatch each of `present.wgsl`. One
//! module per set of flags (layout, mask, caches, causal, window, soft-cap, qk output);
//! sizes are params. A softmax asked for in float64 has no kernel (few devices have f64).

use super::geometry::Geometry;
use crate::no_kernel;
use crate::vulkan::{Binding, DeviceClass, Dispatch, Grid, KernelCx, NoKernel, Spec, Wgsl};
use crate::wgsl;
use ingot_schema::DType;

static ATTENTION: Wgsl = wgsl!("attention/attention.wgsl");
static PRESENT: Wgsl = wgsl!("attention/present.wgsl");

/// The kernel files, for tests that validate each alone.
#[cfg(test)]
pub(crate) static FILES: [&Wgsl; 2] = [&ATTENTION, &PRESENT];

/// Invocations per workgroup: few rows spread over a CPU-type device's threads only as
/// several workgroups (lavapipe runs a workgroup on one thread, 8 lanes at a time: llama_prefill's
/// Attention steps, 64 rows, 1.33 -> 0.89 ms with 16), while a GPU wants whole warps.
fn workgroup(class: DeviceClass) -> u32 {
    match class {
        DeviceClass::Cpu => 16,
        _ => 64,
    }
}

/// Invocations per workgroup of the cache copies.
const COPY_WG: u32 = 64;

/// ONNX's number of float64, as softmax_precision names it.
const DOUBLE: i64 = 11;

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    if cx.op != "Attention" {
        return Err(no_kernel!("no Vulkan kernel for {}", cx.op));
    }
    let attr = |name| cx.attrs.int(name).map_err(|e| no_kernel!("{}: {e}", cx.op));
    let shapes: Vec<&[usize]> = cx.inputs.iter().map(|o| o.desc.shape.as_slice()).collect();
    let g = Geometry::new(cx.attrs, &shapes).map_err(|e| no_kernel!("{}: {e}", cx.op))?;
    if cx.outputs.is_empty() || cx.outputs.len() > 4 {
        return Err(no_kernel!("{} with {} outputs", cx.op, cx.outputs.len()));
    }
    if attr("softmax_precision")? == DOUBLE {
        return Err(no_kernel!("{} with its softmax in float64", cx.op));
    }
    // Which input each optional operand is.
    let mask_at = g.mask.map(|_| 3);
    let past_at = (attr("has_past_kv")? != 0).then_some(3 + usize::from(g.mask.is_some()));
    let nonpad_at = g.nonpad.then(|| cx.inputs.len() - 1);
    let floats = [Some(0), Some(1), Some(2), past_at, past_at.map(|p| p + 1)];
    let float_operands = floats.iter().flatten().map(|&i| &cx.inputs[i]).chain(cx.outputs);
    if let Some(o) = float_operands.clone().find(|o| o.desc.dtype != DType::F32) {
        return Err(cx.dtype(o.desc.dtype));
    }
    let mask = mask_at.map(|i| &cx.inputs[i]);
    let mask_kind = match mask.map(|m| m.desc.dtype) {
        None => 0,
        Some(DType::F32) => 1,
        Some(DType::Bool) => 2,
        Some(t) => return Err(cx.dtype(t)),
    };
    let nonpad = nonpad_at.map(|i| &cx.inputs[i]);
    if let Some(n) = nonpad.filter(|n| n.desc.dtype != DType::I64) {
        return Err(cx.dtype(n.desc.dtype));
    }
    if let Some(o) = mask.iter().chain(&nonpad).find(|o| o.byte_offset % 4 != 0) {
        return Err(no_kernel!(
            "{}: a packed operand at byte {} is not word-aligned",
            cx.op,
            o.byte_offset
        ));
    }
    if float_operands.chain(mask).any(|o| o.desc.elements() >= 1 << 31) {
        return Err(no_kernel!("{} too large for 32-bit indices", cx.op));
    }
    let past = past_at.filter(|_| g.past > 0);
    let mut dispatches = Vec::new();
    for (output, input, size) in [(1, 1, g.head), (2, 2, g.v_head)] {
        if output < cx.outputs.len() {
            let cache = past.map(|p| p + input - 1);
            dispatches.extend(present(&g, (input, cache, output), size)?);
        }
    }
    let rows = g.batch * g.q_heads * g.q_seq;
    if rows == 0 || g.v_head == 0 && cx.outputs.len() < 4 {
        return Ok(dispatches);
    }
    let qk = match (cx.outputs.len(), attr("qk_matmul_output_mode")?) {
        (4, 0 | 1) => 1,
        (4, mode) => mode as u32,
        _ => 0,
    };
    let (left, right) = (attr("left_window_size")?, attr("right_window_size")?);
    let softcap = cx.attrs.float("softcap").map_err(|e| no_kernel!("{}: {e}", cx.op))?;
    let scale = cx.attrs.float("scale").map_err(|e| no_kernel!("{}: {e}", cx.op))?;
    let mut bindings = vec![
        Binding::input("q", 0, "f32"),
        Binding::input("k", 1, "f32"),
        Binding::input("v", 2, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    // Slots 4 to 8; one the step leaves out binds Q, unread, unless no later slot is bound.
    let optional = [
        mask_at.map(|i| Binding::input("mask", i, "u32")),
        past.map(|p| Binding::input("past_key", p, "f32")),
        past.map(|p| Binding::input("past_value", p + 1, "f32")),
        nonpad_at.map(|i| Binding::input("nonpad", i, "u32")),
        (qk > 0).then(|| Binding::output("qk", 3, "f32")),
    ];
    let last = optional.iter().rposition(Option::is_some).map_or(0, |k| k + 1);
    for (k, b) in optional.into_iter().take(last).enumerate() {
        bindings.push(b.unwrap_or_else(|| Binding::input(&format!("unused{k}"), 0, "f32")));
    }
    let [mask_batch, mask_heads, mask_queries, mask_columns] = g.mask.unwrap_or([1; 4]);
    let params: Vec<u32> = [
        rows,
        g.q_seq,
        g.q_heads,
        g.q_heads / g.kv_heads,
        g.total(),
        g.past,
        g.head,
        g.v_head,
        mask_batch,
        mask_heads,
        mask_queries,
        mask_columns.max(1),
    ]
    .iter()
    .map(|&v| v as u32)
    .chain([
        ((scale as f64).sqrt() as f32).to_bits(),
        softcap.to_bits(),
        left as i32 as u32,
        right as i32 as u32,
    ])
    .collect();
    let wg = workgroup(cx.class);
    let mut spec = Spec::new(&ATTENTION)
        .set("WG", wg)
        .set("SEQ_MAJOR", g.seq_major)
        .set("CAUSAL", attr("is_causal")? != 0)
        .set("MASK", mask_kind)
        .set("PAST", past.is_some())
        .set("NONPAD", g.nonpad)
        .set("SOFTCAP", softcap > 0.0)
        .set("WINDOW", left >= 0 || right >= 0)
        .set("QK", qk);
    if g.q_seq < 1 << 24 && g.q_heads < 1 << 24 {
        spec = spec.divmod();
    }
    let label = format!(
        "attention_{}x{}x{}x{}_t{}{}",
        g.batch,
        g.q_heads,
        g.q_seq,
        g.head,
        g.total(),
        if g.kv_heads < g.q_heads { format!("_gqa{}", g.kv_heads) } else { String::new() }
    );
    let grid = Grid::new(rows as u64, wg)?;
    dispatches.push(spec.dispatch(label, grid.groups, bindings, params)?);
    Ok(dispatches)
}

/// present_key (`size` = the head size) or present_value: output `output` from the step's
/// input `new` and, where the step has a cache with rows in it, input `cache`.
fn present(
    g: &Geometry,
    (new, cache, output): (usize, Option<usize>, usize),
    size: usize,
) -> Result<Option<Dispatch>, NoKernel> {
    let count = g.batch * g.kv_heads * g.total() * size;
    if count == 0 {
        return Ok(None);
    }
    let mut bindings =
        vec![Binding::input("new_rows", new, "f32"), Binding::output("present", output, "f32")];
    bindings.extend(cache.map(|c| Binding::input("cache", c, "f32")));
    let params = [count, size, g.total(), g.past, g.kv_heads].iter().map(|&v| v as u32).collect();
    let mut spec = Spec::new(&PRESENT)
        .set("WG", COPY_WG)
        .set("SEQ_MAJOR", g.seq_major)
        .set("PAST", cache.is_some());
    if [size, g.total(), g.kv_heads].iter().all(|&d| d < 1 << 24) {
        spec = spec.divmod();
    }
    let what = if output == 1 { "key" } else { "value" };
    let label = format!("attention_present_{what}_{}x{}x{}x{size}", g.batch, g.kv_heads, g.total());
    let grid = Grid::new(count as u64, COPY_WG)?;
    spec.dispatch(label, grid.groups, bindings, params).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::attention::geometry::canonical;
    use crate::matmul::vulkan::tests::specialised;
    use crate::vulkan::{DeviceClass, Operand, Slot, compile, lower_all_classes};
    use ingot_schema::{AttrValue, Attrs};

    /// Lowers for both device classes (`inputs` with their types, f32 outputs) and checks
    /// every dispatch against its compiled module.
    fn lower_all(a: &Attrs, inputs: &[(&[usize], DType)], outputs: &[&[usize]]) -> Vec<Dispatch> {
        let ins: Vec<TensorDesc> =
            inputs.iter().map(|(s, t)| TensorDesc::new(*t, s.to_vec())).collect();
        let outs: Vec<TensorDesc> =
            outputs.iter().map(|s| TensorDesc::new(DType::F32, s.to_vec())).collect();
        lower_all_classes(lower, "Attention", a, &ins, &outs, 0)
    }

    fn set(d: &Dispatch, name: &str) -> f64 {
        d.overrides.iter().find(|o| o.0 == name).unwrap_or_else(|| panic!("{name}")).1
    }

    #[test]
    fn every_kernel_file_compiles_alone() {
        crate::vulkan::assert_all_files_listed("attention", &FILES);
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
    }

    #[test]
    fn a_plain_step_binds_four_slots() {
        let a = canonical(false, false, false, (4, 2));
        let f = DType::F32;
        let d = lower_all(
            &a,
            &[(&[2, 4, 3, 8], f), (&[2, 2, 5, 8], f), (&[2, 2, 5, 6], f)],
            &[&[2, 4, 3, 6]],
        );
        assert_eq!(d.len(), 2, "one dispatch per class");
        assert_eq!(d[0].wgsl, d[1].wgsl, "one source for both classes");
        assert_eq!(d[0].label, "attention_2x4x3x8_t5_gqa2");
        assert_eq!(d[0].bindings.len(), 4);
        assert_eq!((d[0].groups, d[1].groups), ([2, 1, 1], [1, 1, 1]), "24 rows, by 16 or 64");
        let sqrt_half = (0.5f64.sqrt() as f32).to_bits();
        assert_eq!(
            d[0].params,
            [24, 3, 4, 2, 5, 0, 8, 6, 1, 1, 1, 1, sqrt_half, 0, u32::MAX, u32::MAX]
        );
        for (name, value) in [("MASK", 0.0), ("PAST", 0.0), ("QK", 0.0), ("CAUSAL", 0.0)] {
            assert_eq!(set(&d[0], name), value, "{name}");
        }
    }

    #[test]
    fn caches_and_a_bool_mask_fill_the_slots_between() {
        // 3-D with a bool mask and caches, all four outputs, causal, probabilities out.
        let a = canonical(true, true, false, (3, 3))
            .with("is_causal", AttrValue::Int(1))
            .with("qk_matmul_output_mode", AttrValue::Int(3));
        let f = DType::F32;
        let d = lower_all(
            &a,
            &[
                (&[2, 4, 24], f),
                (&[2, 6, 24], f),
                (&[2, 6, 30], f),
                (&[4, 18], DType::Bool),
                (&[2, 3, 12, 8], f),
                (&[2, 3, 12, 10], f),
            ],
            &[&[2, 4, 30], &[2, 3, 18, 8], &[2, 3, 18, 10], &[2, 3, 4, 18]],
        );
        assert_eq!(d.len(), 6, "present key, present value and the attention, per class");
        assert_eq!(d[0].label, "attention_present_key_2x3x18x8");
        assert_eq!(d[0].params, [2 * 3 * 18 * 8, 8, 18, 12, 3]);
        assert_eq!((set(&d[0], "SEQ_MAJOR"), set(&d[0], "PAST")), (1.0, 1.0));
        let slots: Vec<_> = d[2].bindings.iter().map(|b| (b.name.as_str(), b.slot)).collect();
        assert_eq!(
            slots,
            [
                ("q", Slot::Input(0)),
                ("k", Slot::Input(1)),
                ("v", Slot::Input(2)),
                ("y", Slot::Output(0)),
                ("mask", Slot::Input(3)),
                ("past_key", Slot::Input(4)),
                ("past_value", Slot::Input(5)),
                ("unused3", Slot::Input(0)),
                ("qk", Slot::Output(3)),
            ]
        );
        assert_eq!((set(&d[2], "MASK"), set(&d[2], "QK"), set(&d[2], "CAUSAL")), (2.0, 3.0, 1.0));
        insta::assert_snapshot!("bool_mask_caches_probabilities", specialised(&d[2], &ATTENTION));
    }

    #[test]
    fn unsupported_steps_have_no_kernel() {
        let f = |t: DType, s: &[usize]| Operand::arena(TensorDesc::new(t, s.to_vec()), 0);
        let run = |a: &Attrs, t: DType| {
            let ins = [f(t, &[1, 1, 2, 4]), f(t, &[1, 1, 3, 4]), f(t, &[1, 1, 3, 4])];
            let outs = [f(t, &[1, 1, 2, 4])];
            let cx = KernelCx {
                class: DeviceClass::Gpu,
                op: "Attention",
                name: "n",
                attrs: a,
                inputs: &ins,
                outputs: &outs,
            };
            lower(&cx).unwrap_err().0
        };
        let a = canonical(false, false, false, (1, 1));
        assert_eq!(run(&a, DType::F16), "Attention on f16");
        let wide = a.with("softmax_precision", AttrValue::Int(11));
        assert_eq!(run(&wide, DType::F32), "Attention with its softmax in float64");
    }
}
