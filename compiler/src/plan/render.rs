//! Plan printers: deterministic text for review and snapshots, JSON for tools, SVG for eyes.
//!
//! All three render a bundle variant (`proto::Variant`), so `ingot plan` prints the same thing
//! for a model it compiles and for a bundle it opens. No map iteration order, no floats
//! beyond fixed-precision ratios, no paths or times: the text changes only when the model or
//! the planner does.

use ingot_schema::DType;
use ingot_schema::proto::{self, storage::Kind};
use serde_json::json;
use std::fmt::Write;

/// One tensor: where it lives and when.
struct Row<'a> {
    name: &'a str,
    dtype: &'static str,
    shape: &'a [u64],
    bytes: u64,
    storage: &'static str,
    offset: Option<u64>,
    root: Option<&'a str>,
    first: Option<usize>,
    last: Option<usize>,
}

fn dtype_of(code: i32) -> Option<DType> {
    proto::DataType::try_from(code).ok().and_then(DType::from_proto)
}

fn rows(v: &proto::Variant) -> Vec<Row<'_>> {
    let n = v.tensors.len();
    let mut first: Vec<Option<usize>> = vec![None; n];
    let mut last: Vec<Option<usize>> = vec![None; n];
    for (s, step) in v.steps.iter().enumerate() {
        for &t in step.inputs.iter().chain(&step.outputs) {
            if let (Some(f), Some(l)) = (first.get_mut(t as usize), last.get_mut(t as usize)) {
                *f = Some(f.map_or(s, |f| f.min(s)));
                *l = Some(l.map_or(s, |l| l.max(s)));
            }
        }
    }
    // A root lives as long as any view of it.
    for (i, t) in v.tensors.iter().enumerate() {
        if let Some(Kind::View(view)) = t.storage.as_ref().and_then(|s| s.kind.as_ref()) {
            let r = view.of as usize;
            if r < n {
                first[r] = match (first[r], first[i]) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                last[r] = last[r].max(last[i]);
            }
        }
    }
    v.tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let dtype = dtype_of(t.dtype);
            let (storage, offset, root) = match t.storage.as_ref().and_then(|s| s.kind.as_ref()) {
                Some(Kind::Input(_)) => ("input", None, None),
                Some(Kind::Output(_)) => ("output", None, None),
                Some(Kind::Weight(_)) => ("weight", None, None),
                Some(Kind::Arena(o)) => ("arena", Some(*o), None),
                Some(Kind::Boundary(o)) => ("boundary", Some(*o), None),
                Some(Kind::View(view)) => (
                    "view",
                    Some(view.byte_offset),
                    v.tensors.get(view.of as usize).map(|r| r.name.as_str()),
                ),
                None => ("none", None, None),
            };
            Row {
                name: &t.name,
                dtype: dtype.map_or("?", DType::name),
                shape: &t.shape,
                bytes: t.shape.iter().product::<u64>() * dtype.map_or(0, |d| d.size() as u64),
                storage,
                offset,
                root,
                first: first[i],
                last: last[i],
            }
        })
        .collect()
}

/// A shape as `1x3x48x192` (`scalar` for rank 0).
pub fn shape_text(shape: &[u64]) -> String {
    if shape.is_empty() {
        "scalar".into()
    } else {
        shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
    }
}

fn ratio(arena: u64, bound: u64) -> f64 {
    if bound == 0 { 1.0 } else { arena as f64 / bound as f64 }
}

fn names<'a>(v: &'a proto::Variant, ts: &[u32]) -> Vec<&'a str> {
    ts.iter().map(|&t| v.tensors.get(t as usize).map_or("?", |t| t.name.as_str())).collect()
}

fn allocation_kind(a: &proto::Allocation) -> &'static str {
    match proto::AllocationKind::try_from(a.kind) {
        Ok(proto::AllocationKind::Weight) => "weight",
        Ok(proto::AllocationKind::Arena) => "arena",
        Ok(proto::AllocationKind::Io) => "io",
        Ok(proto::AllocationKind::Boundary) => "boundary",
        _ => "?",
    }
}

/// What can run a submodel: Vulkan and the CPU, or only the CPU and why.
fn submodel_devices<'a>(v: &'a proto::Variant, sub: &proto::Submodel) -> (&'static str, &'a str) {
    let steps = sub.first_step as usize..(sub.first_step + sub.step_count) as usize;
    let why =
        v.steps.get(steps).unwrap_or_default().iter().find(|s| !s.no_vulkan_kernel.is_empty());
    match why {
        Some(step) => ("cpu", &step.no_vulkan_kernel),
        None => ("vulkan, cpu", ""),
    }
}

/// One line per submodel: its steps, devices, arena, allocations and what crosses its edges.
pub fn submodel_lines(out: &mut String, v: &proto::Variant) {
    for (k, sub) in v.submodels.iter().enumerate() {
        let (devices, why) = submodel_devices(v, sub);
        let end = sub.first_step + sub.step_count;
        let alloc_end = sub.first_allocation + sub.allocation_count;
        let _ = writeln!(
            out,
            "  {k} steps {}..{end} on {devices}: arena {} bytes ({}), allocations {}..{alloc_end}",
            sub.first_step, sub.arena_bytes, sub.strategy, sub.first_allocation,
        );
        if !why.is_empty() {
            let step =
                v.steps.iter().find(|s| s.no_vulkan_kernel == why).map_or("?", |s| s.name.as_str());
            let _ = writeln!(out, "      no Vulkan kernel for '{step}': {why}");
        }
        let _ = writeln!(out, "      in:  {}", names(v, &sub.inputs).join(", "));
        let _ = writeln!(out, "      out: {}", names(v, &sub.outputs).join(", "));
    }
}

/// The plan as text: a summary, the steps, one line per tensor, the allocation schedule.
pub fn text(v: &proto::Variant) -> String {
    let rows = rows(v);
    let p = v.plan.clone().unwrap_or_default();
    let weights: u64 = rows.iter().filter(|r| r.storage == "weight").map(|r| r.bytes).sum();
    let views = rows.iter().filter(|r| r.storage == "view").count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "variant {}: {} steps, {} tensors ({views} views)",
        v.name,
        v.steps.len(),
        rows.len()
    );
    let _ = writeln!(
        out,
        "arena {} bytes, lower bound {} bytes, ratio {:.4}, naive {} bytes, weights {weights} bytes",
        p.arena_bytes,
        p.lower_bound_bytes,
        ratio(p.arena_bytes, p.lower_bound_bytes),
        p.naive_bytes,
    );
    let _ = writeln!(
        out,
        "strategy {}, schedule {}, alignment {}, boundary {} bytes",
        p.strategy, p.schedule, p.alignment, p.boundary_bytes
    );
    let _ = writeln!(out, "\nsubmodels:");
    submodel_lines(&mut out, v);
    let _ = writeln!(out, "\nsteps:");
    for (i, step) in v.steps.iter().enumerate() {
        let (ins, outs) = (names(v, &step.inputs), names(v, &step.outputs));
        let _ = writeln!(
            out,
            "  {i:>5} {} ({}) -> {}",
            step.op_label(),
            ins.join(", "),
            outs.join(", ")
        );
    }
    let _ = writeln!(out, "\ntensors:");
    let _ = writeln!(out, "  {:<24} {:>11} {:>12}  storage", "name", "steps", "bytes");
    for r in &rows {
        let span = match (r.first, r.last) {
            (Some(f), Some(l)) => format!("{f}..{l}"),
            _ => "-".into(),
        };
        let place = match (r.storage, r.offset, r.root) {
            ("arena", Some(o), _) => format!("arena @{o}"),
            ("boundary", Some(o), _) => format!("boundary @{o}"),
            ("view", Some(o), Some(root)) => format!("view of {root} +{o}"),
            (s, _, _) => s.to_string(),
        };
        let _ = writeln!(
            out,
            "  {:<24} {span:>11} {:>12}  {place}  {} {}",
            r.name,
            r.bytes,
            r.dtype,
            shape_text(r.shape)
        );
    }
    let _ = writeln!(out, "\nallocations:");
    for a in &p.allocations {
        let what = match allocation_kind(a) {
            "weight" => v
                .tensors
                .iter()
                .find(|t| matches!(t.storage.as_ref().and_then(|s| s.kind.as_ref()), Some(Kind::Weight(w)) if *w == a.weight))
                .map_or("?", |t| t.name.as_str()),
            _ => "",
        };
        let _ = writeln!(
            out,
            "  {:<7} {:>12}  running {:>12}  {what}",
            allocation_kind(a),
            a.bytes,
            a.running_bytes
        );
    }
    out
}

/// The plan as JSON, with the field names tools rely on.
pub fn json(v: &proto::Variant) -> serde_json::Value {
    let rows = rows(v);
    let p = v.plan.clone().unwrap_or_default();
    let weights: u64 = rows.iter().filter(|r| r.storage == "weight").map(|r| r.bytes).sum();
    let steps: Vec<_> = v
        .steps
        .iter()
        .map(|s| json!({"op": s.op, "name": s.name, "inputs": names(v, &s.inputs), "outputs": names(v, &s.outputs)}))
        .collect();
    let tensors: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "dtype": r.dtype,
                "shape": r.shape,
                "bytes": r.bytes,
                "storage": r.storage,
                "offset": r.offset,
                "root": r.root.unwrap_or(r.name),
                "first_step": r.first,
                "last_step": r.last,
            })
        })
        .collect();
    let schedule: Vec<_> = p
        .allocations
        .iter()
        .map(|a| json!({"kind": allocation_kind(a), "bytes": a.bytes, "running_bytes": a.running_bytes}))
        .collect();
    let submodels = submodels_json(v);
    json!({
        "variant": v.name,
        "arena_bytes": p.arena_bytes,
        "lower_bound_bytes": p.lower_bound_bytes,
        "naive_bytes": p.naive_bytes,
        "weights_bytes": weights,
        "strategy": p.strategy,
        "step_order": p.schedule,
        "alignment": p.alignment,
        "boundary_bytes": p.boundary_bytes,
        "submodels": submodels,
        "steps": steps,
        "tensors": tensors,
        "schedule": schedule,
    })
}

/// The submodels as JSON: steps, devices, arena, boundary tensors, allocations.
pub fn submodels_json(v: &proto::Variant) -> Vec<serde_json::Value> {
    v.submodels
        .iter()
        .map(|sub| {
            let (devices, why) = submodel_devices(v, sub);
            json!({
                "first_step": sub.first_step,
                "step_count": sub.step_count,
                "devices": devices.split(", ").collect::<Vec<_>>(),
                "no_vulkan_kernel": why,
                "arena_bytes": sub.arena_bytes,
                "lower_bound_bytes": sub.lower_bound_bytes,
                "strategy": sub.strategy,
                "inputs": names(v, &sub.inputs),
                "outputs": names(v, &sub.outputs),
                "first_allocation": sub.first_allocation,
                "allocation_count": sub.allocation_count,
            })
        })
        .collect()
}

/// The plan as an SVG picture: arena roots as boxes (step across, offset up), the lower bound
/// as a dashed line, and the weights as one stacked column beside the arena.
pub fn svg(v: &proto::Variant) -> String {
    let rows = rows(v);
    let p = v.plan.clone().unwrap_or_default();
    let steps = v.steps.len().max(1) as f64;
    let (left, top, plot_w, plot_h) = (70.0, 40.0, 1100.0, 520.0);
    let weight_w = 60.0;
    let arena_top = p.arena_bytes.max(p.lower_bound_bytes).max(1) as f64;
    let x = |s: f64| left + s / steps * plot_w;
    let y = |b: f64| top + plot_h - b / arena_top * plot_h;
    let mut out = String::new();
    let width = left + plot_w + weight_w + 150.0;
    let height = top + plot_h + 60.0;
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="14">{}: arena {} bytes, lower bound {} bytes (ratio {:.4}), {} steps, strategy {}, schedule {}</text>"#,
        escape(&v.name),
        p.arena_bytes,
        p.lower_bound_bytes,
        ratio(p.arena_bytes, p.lower_bound_bytes),
        v.steps.len(),
        escape(&p.strategy),
        escape(&p.schedule)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#888"/>"##
    );
    for (i, r) in rows.iter().enumerate() {
        let (Some(offset), Some(first), Some(last), "arena") =
            (r.offset, r.first, r.last, r.storage)
        else {
            continue;
        };
        let (x0, x1) = (x(first as f64), x(last as f64 + 1.0));
        let (y0, y1) = (y((offset + r.bytes) as f64), y(offset as f64));
        let hue = (i * 137) % 360; // golden-angle spread: neighbours get distinct colours
        let _ = writeln!(
            out,
            r##"<rect x="{x0:.2}" y="{y0:.2}" width="{:.2}" height="{:.2}" fill="hsl({hue},60%,70%)" stroke="#333" stroke-width="0.3"><title>{} {} bytes @{offset}, steps {first}..{last}</title></rect>"##,
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            escape(r.name),
            r.bytes
        );
    }
    let yb = y(p.lower_bound_bytes as f64);
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{yb:.2}" x2="{:.2}" y2="{yb:.2}" stroke="#c00" stroke-dasharray="6,4"/><text x="{:.2}" y="{:.2}" fill="#c00" text-anchor="end">lower bound</text>"##,
        left + plot_w,
        left + plot_w - 4.0,
        yb - 4.0
    );
    // Axes: bytes on the left, steps below.
    for k in 0..=4 {
        let b = arena_top * k as f64 / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.2}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y(b) + 4.0,
            b as u64
        );
        let s = (steps * k as f64 / 4.0).round();
        let _ = writeln!(
            out,
            r#"<text x="{:.2}" y="{}" text-anchor="middle">{}</text>"#,
            x(s),
            top + plot_h + 18.0,
            s as u64
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.2}" y="{}" text-anchor="middle">step</text>"#,
        left + plot_w / 2.0,
        top + plot_h + 40.0
    );
    // Weights: one column, stacked in allocation order, on its own scale.
    let weights: Vec<&Row> = rows.iter().filter(|r| r.storage == "weight").collect();
    let total: u64 = weights.iter().map(|r| r.bytes).sum();
    let wx = left + plot_w + 50.0;
    let mut acc = 0u64;
    for (i, r) in weights.iter().enumerate() {
        let h = plot_h * r.bytes as f64 / total.max(1) as f64;
        let y0 = top + plot_h - plot_h * (acc + r.bytes) as f64 / total.max(1) as f64;
        let shade = 40 + (i * 23) % 40;
        let _ = writeln!(
            out,
            r#"<rect x="{wx}" y="{y0:.2}" width="{}" height="{h:.2}" fill="hsl(210,30%,{shade}%)"><title>{} {} bytes</title></rect>"#,
            weight_w - 20.0,
            escape(r.name),
            r.bytes
        );
        acc += r.bytes;
    }
    let wmid = wx + (weight_w - 20.0) / 2.0;
    let _ = writeln!(
        out,
        r#"<text x="{wmid:.2}" y="{}" text-anchor="middle">weights</text><text x="{wmid:.2}" y="{}" text-anchor="middle">{total} bytes</text>"#,
        top + plot_h + 18.0,
        top + plot_h + 34.0
    );
    let _ = writeln!(out, "</svg>");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
