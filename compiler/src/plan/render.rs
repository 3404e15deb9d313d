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
    /// A data-dependent length: the dim, and the tensor that counts it.
    bound: Option<(usize, &'a str)>,
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
                bound: t.bound.as_ref().map(|b| {
                    let count = v.tensors.get(b.count as usize).map_or("?", |c| c.name.as_str());
                    (b.axis as usize, count)
                }),
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

/// A shape with dim `bounded` marked as an upper bound: `≤300x3`.
fn bounded_shape_text(shape: &[u64], bounded: Option<usize>) -> String {
    match bounded {
        Some(axis) if axis < shape.len() => {
            let dims: Vec<String> = (shape.iter().enumerate())
                .map(|(d, n)| if d == axis { format!("≤{n}") } else { n.to_string() })
                .collect();
            dims.join("x")
        }
        _ => shape_text(shape),
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

/// What can run a submodel: Vulkan and the CPU, or only the CPU and its first step that has
/// no Vulkan kernel.
fn submodel_devices<'a>(
    v: &'a proto::Variant,
    sub: &proto::Submodel,
) -> (&'static str, Option<&'a proto::Step>) {
    let steps = sub.first_step as usize..(sub.first_step + sub.step_count) as usize;
    let why =
        v.steps.get(steps).unwrap_or_default().iter().find(|s| !s.no_vulkan_kernel.is_empty());
    match why {
        Some(step) => ("cpu", Some(step)),
        None => ("vulkan, cpu", None),
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
        if let Some(step) = why {
            let (name, why) = (&step.name, &step.no_vulkan_kernel);
            let _ = writeln!(out, "      no Vulkan kernel for '{name}': {why}");
        }
        if !sub.guard.is_empty() {
            let _ = writeln!(out, "      runs when {}", conditions(v, &sub.guard).join(" and "));
        }
        let _ = writeln!(out, "      in:  {}", names(v, &sub.inputs).join(", "));
        let _ = writeln!(out, "      out: {}", names(v, &sub.outputs).join(", "));
    }
}

/// A run-time loop as people read it: its submodels, what ends it, what it carries.
fn loop_line(v: &proto::Variant, l: &proto::Loop) -> String {
    let name = |t: u32| v.tensors.get(t as usize).map_or("?", |t| t.name.as_str());
    let end = l.first_submodel + l.submodel_count;
    let mut ends = Vec::new();
    if let Some(t) = l.trip_count {
        ends.push(format!("'{}' < '{}'", name(l.iteration), name(t)));
    }
    if let Some(c) = l.condition {
        ends.push(format!("'{}' is true", name(c)));
    }
    let carried: Vec<String> =
        l.carried.iter().map(|c| format!("'{}' -> '{}'", name(c.next), name(c.state))).collect();
    let when = match l.guard.is_empty() {
        true => String::new(),
        false => format!(" when {}", conditions(v, &l.guard).join(" and ")),
    };
    format!(
        "'{}' runs submodels {}..{end}{when} while {}; carries {}",
        l.name,
        l.first_submodel,
        if ends.is_empty() { "ever".into() } else { ends.join(" and ") },
        if carried.is_empty() { "nothing".into() } else { carried.join(", ") }
    )
}

/// A submodel's guard as people read it: `'cond' is true`, one per condition.
fn conditions(v: &proto::Variant, guard: &[proto::Condition]) -> Vec<String> {
    let name = |t: u32| v.tensors.get(t as usize).map_or("?", |t| t.name.as_str());
    guard.iter().map(|c| format!("'{}' is {}", name(c.tensor), c.holds)).collect()
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
    if !v.loops.is_empty() {
        let _ = writeln!(out, "\nloops:");
        for l in &v.loops {
            let _ = writeln!(out, "  {}", loop_line(v, l));
        }
    }
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
            "  {:<24} {span:>11} {:>12}  {place}  {} {}{}",
            r.name,
            r.bytes,
            r.dtype,
            bounded_shape_text(r.shape, r.bound.map(|b| b.0)),
            r.bound.map_or(String::new(), |(_, count)| format!(" (length in {count})"))
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

/// The version of the JSON plan's layout: `schema_version` at its top level. Adding a field
/// keeps it; renaming, removing or changing the meaning of one bumps it.
pub const JSON_SCHEMA_VERSION: u32 = 1;

/// The plan as JSON, with the field names tools rely on. Each step has its `op`, the fused
/// `post_ops` in the order they run, and the `label` the text shows (`Conv+HardSwish`); all
/// three come from the same `Step` helpers as the text, so they cannot disagree.
pub fn json(v: &proto::Variant) -> serde_json::Value {
    let rows = rows(v);
    let p = v.plan.clone().unwrap_or_default();
    let weights: u64 = rows.iter().filter(|r| r.storage == "weight").map(|r| r.bytes).sum();
    let steps: Vec<_> = v
        .steps
        .iter()
        .map(|s| {
            json!({
                "op": s.op,
                "post_ops": s.post_ops(),
                "label": s.op_label(),
                "name": s.name,
                "inputs": names(v, &s.inputs),
                "outputs": names(v, &s.outputs),
            })
        })
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
                "bound": r.bound.map(|(axis, count)| json!({"axis": axis, "count": count})),
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
        "schema_version": JSON_SCHEMA_VERSION,
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
        "loops": v.loops.iter().map(|l| json!({
            "name": l.name,
            "first_submodel": l.first_submodel,
            "submodel_count": l.submodel_count,
            "iteration": v.tensors.get(l.iteration as usize).map(|t| &t.name),
            "trip_count": l.trip_count.and_then(|t| v.tensors.get(t as usize)).map(|t| &t.name),
            "condition": l.condition.and_then(|t| v.tensors.get(t as usize)).map(|t| &t.name),
            "runs_when": conditions(v, &l.guard),
            "carried": l.carried.iter().map(|c| json!({
                "state": v.tensors.get(c.state as usize).map(|t| &t.name),
                "next": v.tensors.get(c.next as usize).map(|t| &t.name),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
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
                "no_vulkan_kernel": why.map_or("", |s| s.no_vulkan_kernel.as_str()),
                "arena_bytes": sub.arena_bytes,
                "lower_bound_bytes": sub.lower_bound_bytes,
                "strategy": sub.strategy,
                "inputs": names(v, &sub.inputs),
                "outputs": names(v, &sub.outputs),
                "runs_when": conditions(v, &sub.guard),
                "first_allocation": sub.first_allocation,
                "allocation_count": sub.allocation_count,
            })
        })
        .collect()
}

/// Byte units for sizes people read: the axis of the SVG and its labels.
const UNITS: [(&str, u64); 4] = [("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)];

/// The largest unit that `bytes` fills at least once (bytes for anything under 1 KiB).
fn unit_for(bytes: u64) -> (&'static str, u64) {
    UNITS.iter().rev().copied().find(|&(_, size)| bytes >= size).unwrap_or(UNITS[0])
}

/// `value / 10^decimals` written out with trailing zeros (and a bare point) trimmed: `15, 1`
/// is "1.5", `20, 1` is "2".
fn decimal(value: u128, decimals: u32) -> String {
    let scale = 10u128.pow(decimals);
    let frac = format!("{:0width$}", value % scale, width = decimals as usize);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() { format!("{}", value / scale) } else { format!("{}.{frac}", value / scale) }
}

/// A size as people read it: three significant digits at most in the largest unit it fills,
/// trailing zeros trimmed ("768 KiB", "1.5 MiB", "12.3 MiB", "100 B").
pub fn human_bytes(bytes: u64) -> String {
    let (unit, size) = unit_for(bytes);
    if size == 1 {
        return format!("{bytes} B");
    }
    let value = bytes as f64 / size as f64;
    let decimals = if value < 10.0 {
        2
    } else if value < 100.0 {
        1
    } else {
        0
    };
    let text = format!("{value:.decimals$}");
    let text =
        if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    format!("{text} {unit}")
}

/// One tick of the byte axis: where it sits, in bytes, and its text.
#[derive(Debug, Clone, PartialEq)]
struct Tick {
    bytes: f64,
    text: String,
}

/// The steps an axis may use, as `m × 10^e`: 1, 2 and 5 at every power of ten from `10^lo`.
fn nice_steps(lo: i32) -> impl Iterator<Item = (u128, i32)> {
    (lo..=18).flat_map(|e| [1u128, 2, 5].into_iter().map(move |m| (m, e)))
}

/// The ticks of a byte axis from 0 to `max`: multiples of 1, 2 or 5 × 10^k of the largest
/// unit that `max` fills (B, KiB, MiB or GiB), the finest such step that gives at most 10
/// ticks (which gives at least 4 whenever `max` is 3 units or more; bytes are never split).
/// Exact integer arithmetic decides which ticks fit, so a tick at `max` itself is kept.
fn byte_ticks(max: u64) -> Vec<Tick> {
    let max = max.max(1);
    let (unit, size) = unit_for(max);
    let lo = if size == 1 { 0 } else { -1 };
    // A tick k·m·10^e units fits when k·m·10^e·size <= max; both sides times 10^-e for e < 0.
    let fits = |m: u128, e: i32| -> u128 {
        let (num, den) = if e >= 0 {
            (max as u128, m * 10u128.pow(e as u32) * size as u128)
        } else {
            (max as u128 * 10u128.pow(e.unsigned_abs()), m * size as u128)
        };
        num / den + 1
    };
    let (m, e) = nice_steps(lo).find(|&(m, e)| fits(m, e) <= 10).unwrap_or((1, 18));
    (0..fits(m, e))
        .map(|k| {
            let (value, decimals) =
                if e >= 0 { (k * m * 10u128.pow(e as u32), 0) } else { (k * m, e.unsigned_abs()) };
            let bytes = (value * size as u128) as f64 / 10f64.powi(decimals as i32);
            let text = if k == 0 {
                "0".to_string()
            } else {
                format!("{} {unit}", decimal(value, decimals))
            };
            Tick { bytes, text }
        })
        .collect()
}

/// The ticks of the step axis: multiples of 1, 2 or 5 × 10^k steps, at most 10 of them.
fn step_ticks(steps: usize) -> Vec<usize> {
    let steps = steps as u128;
    let (m, e) =
        nice_steps(0).find(|&(m, e)| steps / (m * 10u128.pow(e as u32)) < 10).unwrap_or((1, 18));
    let step = (m * 10u128.pow(e as u32)) as usize;
    (0..=steps as usize).step_by(step).collect()
}

/// `hsl(h, s%, l%)` as 8-bit sRGB: CSS Color 4's conversion in exact integer arithmetic,
/// rounded half up, so the same numbers give the same bytes everywhere. Renderers that do not
/// read `hsl()` (CairoSVG draws it black) all read `rgb()`.
fn hsl_to_rgb(hue: u32, saturation: u32, lightness: u32) -> [u8; 3] {
    let (h, s, l) =
        (i64::from(hue % 360), i64::from(saturation.min(100)), i64::from(lightness.min(100)));
    // CSS: f(n) = l - a * clamp(min(k - 3, 9 - k), -1, 1), k = (n + h/30) mod 12,
    // a = s * min(l, 1 - l); here in degrees (k * 30) and percent.
    let a = s * l.min(100 - l);
    let den = 100 * 100 * 30;
    let channel = |n: i64| {
        let k = (n * 30 + h) % 360;
        let f = (k - 90).min(270 - k).clamp(-30, 30);
        let num = l * 100 * 30 - a * f;
        ((2 * num * 255 + den) / (2 * den)) as u8
    };
    [channel(0), channel(8), channel(4)]
}

/// A colour as SVG text: `rgb(r,g,b)`.
fn rgb([r, g, b]: [u8; 3]) -> String {
    format!("rgb({r},{g},{b})")
}

/// The fill of the `i`-th tensor: hues a golden angle apart, so that neighbours differ, and
/// light enough that black text on it reads.
fn tensor_fill(i: usize) -> String {
    rgb(hsl_to_rgb((i * 137 % 360) as u32, 60, 75))
}

/// The fill of the `i`-th weight: blue-grey in four shades, so that neighbours differ.
fn weight_fill(i: usize) -> String {
    rgb(hsl_to_rgb(210, 25, 58 + (i % 4) as u32 * 7))
}

/// How many of the largest arena tensors get a label on their box.
const LABELLED: usize = 12;
/// Labels: font size, line height, and a width per character above the average of tensor
/// names in DejaVu Sans or Helvetica (lowercase, digits and dots: about 0.52 em), so that an
/// estimated fit is a real one; a clip path keeps a label inside its box whatever the font.
const LABEL_FONT: f64 = 10.0;
const LABEL_LINE: f64 = 12.0;
const LABEL_CHAR: f64 = 0.6 * LABEL_FONT;

/// `s` cut to at most `n` characters, with an ellipsis where it was cut.
fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else if n == 0 {
        String::new()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// The lines of a label that fit a `w` × `h` box: "name size" on one line, else the name and
/// the size on two, else a truncated name and the size, else a truncated name; none when not
/// even four characters fit.
fn fit_label(name: &str, size: &str, w: f64, h: f64) -> Vec<String> {
    let chars = ((w - 4.0) / LABEL_CHAR).floor().max(0.0) as usize;
    let lines = ((h - 2.0) / LABEL_LINE).floor().max(0.0) as usize;
    let size_len = size.chars().count();
    if lines == 0 || chars < 4 {
        return vec![];
    }
    let one = format!("{name} {size}");
    if one.chars().count() <= chars {
        vec![one]
    } else if lines >= 2 && size_len <= chars {
        vec![truncate(name, chars), size.to_string()]
    } else if size_len + 5 <= chars {
        vec![format!("{} {size}", truncate(name, chars - size_len - 1))]
    } else {
        vec![truncate(name, chars)]
    }
}

/// The label of a `w` × `h` box and whether it is turned upright: across when that shows the
/// whole of it, else whichever way shows more of it (across on a tie).
fn place_label(name: &str, size: &str, w: f64, h: f64) -> (Vec<String>, bool) {
    let shown = |lines: &[String]| -> usize {
        lines.iter().map(|l| l.chars().filter(|&c| c != '…').count()).sum()
    };
    let across = fit_label(name, size, w, h);
    let full = name.chars().count() + size.chars().count();
    if shown(&across) >= full {
        return (across, false);
    }
    let upright = fit_label(name, size, h, w);
    if shown(&upright) > shown(&across) { (upright, true) } else { (across, false) }
}

/// The plan as an SVG picture that reads without hovering (as a PNG too): arena roots as boxes
/// (step across, offset up) with the largest labelled by name and size, the lower bound as a
/// dashed line, and the weights as one stacked column beside the arena on the same byte scale.
/// Ticks are round values in one unit. Colours are plain `rgb()`; every box keeps a `<title>`
/// tooltip with its exact bytes, offset and steps.
pub fn svg(v: &proto::Variant) -> String {
    let rows = rows(v);
    let p = v.plan.clone().unwrap_or_default();
    let weights: Vec<&Row> = rows.iter().filter(|r| r.storage == "weight").collect();
    let weights_total: u64 = weights.iter().map(|r| r.bytes).sum();
    let steps = v.steps.len().max(1) as f64;
    let (left, top, plot_w, plot_h) = (90.0, 56.0, 1100.0, 520.0);
    let (gap, weight_w) = (30.0, 44.0);
    let wx = left + plot_w + gap;
    // One scale for the arena and the weights, so that the weights column is to scale.
    let scale_top = p.arena_bytes.max(p.lower_bound_bytes).max(weights_total).max(1);
    let ticks = byte_ticks(scale_top);
    let x = |s: f64| left + s / steps * plot_w;
    let y = |b: f64| top + plot_h - b / scale_top as f64 * plot_h;
    let width = wx + weight_w + 40.0;
    let height = top + plot_h + 56.0;
    let (ink, grid, frame, bound) =
        (rgb([0, 0, 0]), rgb([225, 225, 225]), rgb([136, 136, 136]), rgb([204, 0, 0]));
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12" fill="{ink}">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="{}"/>"#, rgb([255, 255, 255]));
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="14">{}: arena {}, lower bound {} (ratio {:.4}), weights {}</text>"#,
        escape(&v.name),
        human_bytes(p.arena_bytes),
        human_bytes(p.lower_bound_bytes),
        ratio(p.arena_bytes, p.lower_bound_bytes),
        human_bytes(weights_total),
    );
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="38" fill="{}">{} steps, {} tensors, strategy {}, schedule {}; arena {} bytes, lower bound {} bytes, weights {} bytes</text>"#,
        rgb([85, 85, 85]),
        v.steps.len(),
        rows.len(),
        escape(&p.strategy),
        escape(&p.schedule),
        p.arena_bytes,
        p.lower_bound_bytes,
        weights_total,
    );
    let _ = writeln!(
        out,
        r#"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="{}"/>"#,
        rgb([250, 250, 250])
    );
    // Byte axis: grid lines across the arena and the weights, labels on the left.
    for t in &ticks {
        let ty = y(t.bytes);
        let _ = writeln!(
            out,
            r#"<line x1="{left}" y1="{ty:.2}" x2="{:.2}" y2="{ty:.2}" stroke="{grid}" stroke-width="1"/><line x1="{:.2}" y1="{ty:.2}" x2="{left}" y2="{ty:.2}" stroke="{frame}"/><text x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"#,
            wx + weight_w,
            left - 4.0,
            left - 7.0,
            ty + 4.0,
            t.text
        );
    }
    // Arena roots.
    let arena: Vec<(usize, &Row)> =
        rows.iter().enumerate().filter(|(_, r)| r.storage == "arena").collect();
    let mut boxes = Vec::new();
    for &(i, r) in &arena {
        let (Some(offset), Some(first), Some(last)) = (r.offset, r.first, r.last) else {
            continue;
        };
        let (x0, x1) = (x(first as f64), x(last as f64 + 1.0));
        let (y0, y1) = (y((offset + r.bytes) as f64), y(offset as f64));
        let (w, h) = ((x1 - x0).max(0.5), (y1 - y0).max(0.5));
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.2}" y="{y0:.2}" width="{w:.2}" height="{h:.2}" fill="{}" stroke="{}" stroke-width="0.3"><title>{} {} ({} bytes) @{offset}, steps {first}..{last}</title></rect>"#,
            tensor_fill(i),
            rgb([51, 51, 51]),
            escape(r.name),
            human_bytes(r.bytes),
            r.bytes
        );
        boxes.push((i, r, x0, y0, w, h));
    }
    // Labels on the largest boxes that fit one (turned upright in a tall narrow box), clipped
    // to their box.
    let mut largest = boxes.clone();
    largest.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    for &(i, r, x0, y0, w, h) in largest.iter().take(LABELLED) {
        let (lines, upright) = place_label(r.name, &human_bytes(r.bytes), w, h);
        if lines.is_empty() {
            continue;
        }
        let (cx, cy) = (x0 + w / 2.0, y0 + h / 2.0);
        let first_base = cy - LABEL_LINE * (lines.len() as f64 - 1.0) / 2.0 + LABEL_FONT * 0.35;
        let turn = if upright {
            format!(r#" transform="rotate(-90 {cx:.2} {cy:.2})""#)
        } else {
            String::new()
        };
        let _ = write!(
            out,
            r#"<clipPath id="label{i}"><rect x="{x0:.2}" y="{y0:.2}" width="{w:.2}" height="{h:.2}"/></clipPath><g clip-path="url(#label{i})" font-size="{LABEL_FONT}" text-anchor="middle"><g{turn}>"#
        );
        for (k, line) in lines.iter().enumerate() {
            let _ = write!(
                out,
                r#"<text x="{cx:.2}" y="{:.2}">{}</text>"#,
                first_base + LABEL_LINE * k as f64,
                escape(line)
            );
        }
        let _ = writeln!(out, "</g></g>");
    }
    let _ = writeln!(
        out,
        r#"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="{frame}"/>"#
    );
    let yb = y(p.lower_bound_bytes as f64);
    let _ = writeln!(
        out,
        r#"<line x1="{left}" y1="{yb:.2}" x2="{:.2}" y2="{yb:.2}" stroke="{bound}" stroke-dasharray="6,4"/><text x="{:.2}" y="{:.2}" fill="{bound}" text-anchor="end">lower bound {}</text>"#,
        left + plot_w,
        left + plot_w - 4.0,
        yb - 4.0,
        human_bytes(p.lower_bound_bytes)
    );
    // Step axis.
    for s in step_ticks(v.steps.len()) {
        let sx = x(s as f64);
        let _ = writeln!(
            out,
            r#"<line x1="{sx:.2}" y1="{}" x2="{sx:.2}" y2="{}" stroke="{frame}"/><text x="{sx:.2}" y="{}" text-anchor="middle">{s}</text>"#,
            top + plot_h,
            top + plot_h + 4.0,
            top + plot_h + 18.0,
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.2}" y="{}" text-anchor="middle">step</text><text transform="translate(16 {:.2}) rotate(-90)" text-anchor="middle">arena offset</text>"#,
        left + plot_w / 2.0,
        top + plot_h + 40.0,
        top + plot_h / 2.0
    );
    // Weights: one column, stacked in allocation order, on the arena's scale.
    let mut acc = 0u64;
    for (i, r) in weights.iter().enumerate() {
        let (y0, y1) = (y((acc + r.bytes) as f64), y(acc as f64));
        let _ = writeln!(
            out,
            r#"<rect x="{wx}" y="{y0:.2}" width="{weight_w}" height="{:.2}" fill="{}"><title>{} {} ({} bytes)</title></rect>"#,
            y1 - y0,
            weight_fill(i),
            escape(r.name),
            human_bytes(r.bytes),
            r.bytes
        );
        acc += r.bytes;
    }
    let wmid = wx + weight_w / 2.0;
    let _ = writeln!(
        out,
        r#"<text x="{wmid:.2}" y="{}" text-anchor="middle">weights</text><text x="{wmid:.2}" y="{}" text-anchor="middle">{}</text>"#,
        top + plot_h + 18.0,
        top + plot_h + 34.0,
        human_bytes(weights_total)
    );
    let _ = writeln!(out, "</svg>");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(max: u64) -> Vec<String> {
        byte_ticks(max).into_iter().map(|t| t.text).collect()
    }

    #[test]
    fn byte_ticks_are_round_values_in_one_unit() {
        // PP-OCR det's arena at 1x3x480x480 is 12873696 bytes (12.3 MiB): every 2 MiB.
        assert_eq!(
            texts(12_873_696),
            ["0", "2 MiB", "4 MiB", "6 MiB", "8 MiB", "10 MiB", "12 MiB"]
        );
        assert_eq!(byte_ticks(12_873_696)[6].bytes, (12u64 << 20) as f64);
        // A tick at the top itself is kept; halves are written with one decimal.
        assert_eq!(
            texts(3 << 20),
            ["0", "0.5 MiB", "1 MiB", "1.5 MiB", "2 MiB", "2.5 MiB", "3 MiB"]
        );
        assert_eq!(byte_ticks(3 << 20)[3].bytes, (3u64 << 19) as f64);
        assert_eq!(
            texts(3 << 19),
            ["0", "0.2 MiB", "0.4 MiB", "0.6 MiB", "0.8 MiB", "1 MiB", "1.2 MiB", "1.4 MiB"]
        );
        assert_eq!(byte_ticks(3 << 19)[1].bytes, (1u64 << 20) as f64 / 5.0);
        assert_eq!(
            texts(700 << 10),
            ["0", "100 KiB", "200 KiB", "300 KiB", "400 KiB", "500 KiB", "600 KiB", "700 KiB"]
        );
        assert_eq!(texts(1023 << 10)[1..3], ["200 KiB", "400 KiB"]);
        assert_eq!(texts(600), ["0", "100 B", "200 B", "300 B", "400 B", "500 B", "600 B"]);
        assert_eq!(texts(5 << 30), ["0", "1 GiB", "2 GiB", "3 GiB", "4 GiB", "5 GiB"]);
        // Bytes are never split: a one-byte plan has two ticks.
        assert_eq!(texts(0), ["0", "1 B"]);
    }

    #[test]
    fn byte_ticks_number_four_to_ten_and_stay_in_range() {
        let mut max = 3u64;
        while max < 1 << 40 {
            let ticks = byte_ticks(max);
            assert!((4..=10).contains(&ticks.len()), "{max}: {} ticks", ticks.len());
            assert!(ticks.last().unwrap().bytes <= max as f64, "{max}");
            let unit = ticks[1].text.rsplit(' ').next().unwrap();
            assert!(ticks[1..].iter().all(|t| t.text.ends_with(&format!(" {unit}"))), "{max}");
            max = max * 7 / 5 + 1;
        }
    }

    #[test]
    fn step_ticks_are_round() {
        assert_eq!(step_ticks(0), [0]);
        assert_eq!(step_ticks(9), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(step_ticks(10), [0, 2, 4, 6, 8, 10]);
        assert_eq!(step_ticks(237), [0, 50, 100, 150, 200]);
    }

    #[test]
    fn human_bytes_keeps_three_digits() {
        assert_eq!(human_bytes(100), "100 B");
        assert_eq!(human_bytes(768 << 10), "768 KiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
        assert_eq!(human_bytes(12_873_696), "12.3 MiB");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
    }

    #[test]
    fn hsl_converts_to_exact_rgb() {
        assert_eq!(hsl_to_rgb(0, 100, 50), [255, 0, 0]);
        assert_eq!(hsl_to_rgb(120, 100, 25), [0, 128, 0]);
        assert_eq!(hsl_to_rgb(240, 100, 50), [0, 0, 255]);
        assert_eq!(hsl_to_rgb(0, 0, 100), [255, 255, 255]);
        assert_eq!(hsl_to_rgb(30, 100, 50), [255, 128, 0]);
        assert_eq!(hsl_to_rgb(210, 30, 60), [122, 153, 184]);
        // The palette: tensor 0, tensor 1 (hue 137), the first weight.
        assert_eq!(tensor_fill(0), "rgb(230,153,153)");
        assert_eq!(tensor_fill(1), "rgb(153,230,175)");
        assert_eq!(weight_fill(0), "rgb(121,148,175)");
    }

    #[test]
    fn labels_fit_their_box_or_are_left_out() {
        assert_eq!(fit_label("conv1", "1.5 MiB", 200.0, 20.0), ["conv1 1.5 MiB"]);
        assert_eq!(
            fit_label("a_long_tensor_name", "1.5 MiB", 80.0, 40.0),
            ["a_long_tens…", "1.5 MiB"]
        );
        assert_eq!(fit_label("a_long_tensor_name", "1.5 MiB", 100.0, 14.0), ["a_long_… 1.5 MiB"]);
        assert_eq!(fit_label("a_long_tensor_name", "1.5 MiB", 40.0, 14.0), ["a_lon…"]);
        assert!(fit_label("conv1", "1.5 MiB", 20.0, 40.0).is_empty());
        assert!(fit_label("conv1", "1.5 MiB", 200.0, 8.0).is_empty());
        // A tall narrow box turns its label upright; one that shows it all across keeps it so.
        assert_eq!(
            place_label("p2o.Mul.163", "5.27 MiB", 21.0, 200.0),
            (vec!["p2o.Mul.163 5.27 MiB".to_string()], true)
        );
        assert_eq!(
            place_label("conv1", "1.5 MiB", 200.0, 200.0),
            (vec!["conv1 1.5 MiB".to_string()], false)
        );
        assert_eq!(place_label("conv1", "1.5 MiB", 8.0, 8.0), (vec![], false));
    }

    fn variant() -> proto::Variant {
        let f32 = proto::DataType::F32 as i32;
        let tensor = |name: &str, kind| proto::Tensor {
            name: name.into(),
            dtype: f32,
            shape: vec![1, 4, 8, 8],
            storage: Some(proto::Storage { kind: Some(kind) }),
            bound: None,
        };
        let post = proto::Attribute {
            name: "post_ops".into(),
            value: Some(proto::attribute::Value::Text("Add,HardSwish".into())),
        };
        proto::Variant {
            name: "main".into(),
            tensors: vec![
                tensor("x", Kind::Input(0)),
                tensor("w", Kind::Weight(0)),
                tensor("a", Kind::Arena(0)),
                tensor("y", Kind::Output(0)),
            ],
            steps: vec![
                proto::Step {
                    op: "Conv".into(),
                    name: "conv".into(),
                    inputs: vec![0, 1, 0],
                    outputs: vec![2],
                    attributes: vec![post],
                    ..Default::default()
                },
                proto::Step {
                    op: "Relu".into(),
                    name: "relu".into(),
                    inputs: vec![2],
                    outputs: vec![3],
                    ..Default::default()
                },
            ],
            plan: Some(proto::Plan {
                arena_bytes: 1024,
                lower_bound_bytes: 1024,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn json_steps_name_their_fused_post_ops_as_the_text_does() {
        let v = variant();
        let j = json(&v);
        assert_eq!(j["schema_version"], JSON_SCHEMA_VERSION);
        assert_eq!(j["steps"][0]["op"], "Conv");
        assert_eq!(j["steps"][0]["post_ops"], serde_json::json!(["Add", "HardSwish"]));
        assert_eq!(j["steps"][0]["label"], "Conv+Add+HardSwish");
        assert_eq!(j["steps"][1]["post_ops"], serde_json::json!([]));
        assert_eq!(j["steps"][1]["label"], "Relu");
        assert!(text(&v).contains("Conv+Add+HardSwish (x, w, x) -> a"));
        assert_eq!(serde_json::to_string(&j).unwrap(), serde_json::to_string(&json(&v)).unwrap());
    }

    #[test]
    fn each_cpu_submodel_names_its_own_step_without_a_kernel() {
        // Both steps lack a kernel for the same reason, each in its own submodel.
        let mut v = variant();
        for step in &mut v.steps {
            step.no_vulkan_kernel = "4 post-op operands".into();
        }
        let sub = |first_step| proto::Submodel { first_step, step_count: 1, ..Default::default() };
        v.submodels = vec![sub(0), sub(1)];
        let mut out = String::new();
        submodel_lines(&mut out, &v);
        let named: Vec<&str> = out.lines().filter(|l| l.contains("no Vulkan kernel")).collect();
        assert_eq!(
            named,
            [
                "      no Vulkan kernel for 'conv': 4 post-op operands",
                "      no Vulkan kernel for 'relu': 4 post-op operands"
            ]
        );
    }

    #[test]
    fn svg_uses_rgb_round_ticks_and_labels() {
        let v = variant();
        let svg = svg(&v);
        assert!(!svg.contains("hsl("), "{svg}");
        assert!(svg.contains(r#"fill="rgb("#));
        // Arena 1 KiB and weights 1 KiB share one scale: the weights column is full height.
        assert!(svg.contains(">1 KiB</text>"), "{svg}");
        assert!(svg.contains(">a 1 KiB</text>"), "{svg}");
        assert!(svg.contains("<title>a 1 KiB (1024 bytes) @0, steps 0..1</title>"), "{svg}");
        assert_eq!(svg, super::svg(&v));
    }
}
