//! `ingot inspect BUNDLE [--kernels] [--json] [-o FILE]`

use crate::args::shape_text;
use anyhow::{Context, Result};
use ingot_runtime::Bundle;
use ingot_runtime::bundle::{caller_outputs, tensor_desc};
use ingot_schema::proto::{self, storage::Kind};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle to describe.
    bundle: PathBuf,
    /// List the kernels instead: one line per SPIR-V module with its bytes, workgroup size
    /// and the steps that use it, largest first, and the totals beside the weights.
    #[arg(long)]
    kernels: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Write the report to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub fn main(args: Args) -> Result<()> {
    let bundle = Bundle::open(&args.bundle)
        .with_context(|| format!("cannot open {}", args.bundle.display()))?;
    // Opening leaves weights to be checked at first use; inspecting a bundle checks them all.
    for index in 0..bundle.manifest().weights.len() {
        bundle.weight(index).with_context(|| format!("{} is corrupt", args.bundle.display()))?;
    }
    let report = if args.kernels { kernels(&bundle) } else { describe(&bundle) };
    let text = if args.json {
        crate::report::json_text(&report)?
    } else if args.kernels {
        kernels_text(&report)
    } else {
        text(&report)
    };
    crate::report::emit(&text, args.output.as_deref())
}

/// Everything inspect reports, as JSON (the text form is rendered from it).
pub fn describe(bundle: &Bundle) -> serde_json::Value {
    let m = bundle.manifest();
    let (major, minor) = bundle.format_version();
    let weights_bytes: u64 = m.weights.iter().map(|w| w.length).sum();
    let variants: Vec<_> = m
        .variants
        .iter()
        .map(|v| {
            let io = |list: &[u32]| -> Vec<serde_json::Value> {
                list.iter()
                    .map(|&t| {
                        let d = tensor_desc(&v.tensors[t as usize]);
                        json!({"name": v.tensors[t as usize].name, "dtype": d.dtype.name(), "shape": d.shape})
                    })
                    .collect()
            };
            let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
            for s in &v.steps {
                *ops.entry(s.op.as_str()).or_default() += 1;
            }
            let plan = v.plan.clone().unwrap_or_default();
            let referenced: u64 = referenced_entries(v)
                .iter()
                .filter_map(|&w| m.weights.get(w as usize))
                .map(|w| w.length)
                .sum();
            // Steps with no Vulkan kernel, grouped by the reason; steps that have one but sit
            // in a submodel that needs the CPU carry none.
            let mut no_vulkan: BTreeMap<&str, usize> = BTreeMap::new();
            for s in v.steps.iter().filter(|s| s.vulkan.is_empty()) {
                let why = match s.no_vulkan_kernel.as_str() {
                    "" => "in a submodel that needs the CPU",
                    why => why,
                };
                *no_vulkan.entry(why).or_default() += 1;
            }
            let dispatches: usize = v
                .steps
                .iter()
                .filter_map(|s| s.vulkan.first())
                .map(|d| d.dispatches.len())
                .sum();
            json!({
                "name": v.name,
                "referenced_weight_bytes": referenced,
                "inputs": io(&v.inputs),
                "outputs": io(&v.outputs[..caller_outputs(v)]),
                // The variant's outputs the session keeps to itself: counts of bounded
                // outputs, and what run-time loops carry.
                "held": io(&v.outputs[caller_outputs(v)..]),
                "loops": v.loops.len(),
                "steps": v.steps.len(),
                "ops": ops,
                "arena_bytes": plan.arena_bytes,
                "lower_bound_bytes": plan.lower_bound_bytes,
                "strategy": plan.strategy,
                "vulkan_steps": v.steps.len() - no_vulkan.values().sum::<usize>(),
                "vulkan_dispatches": dispatches,
                "no_vulkan_kernel": no_vulkan,
                "boundary_bytes": plan.boundary_bytes,
                "submodels": ingot_compiler::plan::render::submodels_json(v),
            })
        })
        .collect();
    // Without the bank, every weight tensor of every variant would be stored.
    let stored_without_dedup: u64 = m
        .variants
        .iter()
        .flat_map(|v| &v.tensors)
        .filter_map(|t| match t.storage.as_ref().and_then(|s| s.kind.as_ref()) {
            Some(Kind::Weight(w)) => m.weights.get(*w as usize).map(|w| w.length),
            _ => None,
        })
        .sum();
    // Entries grouped by the set of variants that read them.
    let mut sharing: BTreeMap<Vec<&str>, (usize, u64)> = BTreeMap::new();
    let readers: Vec<BTreeSet<u32>> = m.variants.iter().map(referenced_entries).collect();
    for (w, weight) in m.weights.iter().enumerate() {
        let names: Vec<&str> = m
            .variants
            .iter()
            .zip(&readers)
            .filter(|(_, r)| r.contains(&(w as u32)))
            .map(|(v, _)| v.name.as_str())
            .collect();
        let group = sharing.entry(names).or_default();
        group.0 += 1;
        group.1 += weight.length;
    }
    let sharing: Vec<_> = sharing
        .into_iter()
        .map(|(variants, (entries, bytes))| json!({"variants": variants, "entries": entries, "bytes": bytes}))
        .collect();
    // Entries and bytes by element type: what `--f16-weights` or int8 weights made of the bank.
    let mut types: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for weight in &m.weights {
        let dtype =
            proto::DataType::try_from(weight.dtype).ok().and_then(ingot_schema::DType::from_proto);
        let group = types.entry(dtype.map_or("unknown", |d| d.name())).or_default();
        group.0 += 1;
        group.1 += weight.length;
    }
    let types: Vec<_> = types
        .into_iter()
        .map(
            |(dtype, (entries, bytes))| json!({"dtype": dtype, "entries": entries, "bytes": bytes}),
        )
        .collect();
    let sections: Vec<_> = bundle
        .sections()
        .map(|(kind, r)| json!({"kind": kind, "offset": r.start, "bytes": r.len()}))
        .collect();
    json!({
        "format_version": format!("{major}.{minor}"),
        "producer": m.producer,
        "file_bytes": bundle.file_len(),
        "weights": m.weights.len(),
        "weights_bytes": weights_bytes,
        "unique_weight_bytes": weights_bytes,
        "weight_bytes_without_dedup": stored_without_dedup,
        "dedup_saved_bytes": stored_without_dedup.saturating_sub(weights_bytes),
        "weight_sharing": sharing,
        "weight_types": types,
        "kernels": m.kernels.len(),
        "variants": variants,
        "sections": sections,
    })
}

/// A SPIR-V module larger than this is one a driver takes long to compile at first launch; the
/// kernel listing counts them.
const LARGE_KERNEL_BYTES: u64 = 64 * 1024;

/// Every kernel module: its bytes, workgroup size, and which steps of which variants (and
/// device classes) dispatch it; with the totals against the weights.
pub fn kernels(bundle: &Bundle) -> serde_json::Value {
    let m = bundle.manifest();
    let mut users: Vec<BTreeSet<String>> = vec![BTreeSet::new(); m.kernels.len()];
    for v in &m.variants {
        for (i, s) in v.steps.iter().enumerate() {
            for entry in &s.vulkan {
                let class =
                    proto::DeviceClass::try_from(entry.device_class).map_or("?", |c| match c {
                        proto::DeviceClass::Any => "any",
                        proto::DeviceClass::Gpu => "gpu",
                        proto::DeviceClass::Cpu => "cpu",
                    });
                for d in &entry.dispatches {
                    if let Some(u) = users.get_mut(d.kernel as usize) {
                        u.insert(format!("{}:{i} {} ({class})", v.name, s.op));
                    }
                }
            }
        }
    }
    let mut modules: Vec<serde_json::Value> = m
        .kernels
        .iter()
        .zip(users)
        .enumerate()
        .map(|(k, (kernel, users))| {
            json!({
                "kernel": k,
                "name": kernel.name,
                "bytes": kernel.length,
                "workgroup_size": kernel.workgroup_size,
                "bindings": kernel.bindings,
                "params": kernel.params,
                "steps": users,
            })
        })
        .collect();
    modules.sort_by_key(|k| std::cmp::Reverse(k["bytes"].as_u64().unwrap_or(0)));
    let total: u64 = m.kernels.iter().map(|k| k.length).sum();
    let weights: u64 = m.weights.iter().map(|w| w.length).sum();
    json!({
        "kernels": m.kernels.len(),
        "kernel_bytes": total,
        "largest_kernel_bytes": m.kernels.iter().map(|k| k.length).max().unwrap_or(0),
        "kernels_over_64k": m.kernels.iter().filter(|k| k.length > LARGE_KERNEL_BYTES).count(),
        "weight_bytes": weights,
        "modules": modules,
    })
}

fn kernels_text(r: &serde_json::Value) -> String {
    let mut s = String::new();
    for k in r["modules"].as_array().into_iter().flatten() {
        let steps: Vec<&str> =
            k["steps"].as_array().into_iter().flatten().filter_map(|s| s.as_str()).collect();
        let shown = steps.iter().take(4).copied().collect::<Vec<_>>().join(", ");
        let more = match steps.len() {
            n if n > 4 => format!(" and {} more", n - 4),
            _ => String::new(),
        };
        s.push_str(&format!(
            "kernel {:>4}  {:>8} bytes  wg {:<12} {}  <- {shown}{more}\n",
            k["kernel"],
            k["bytes"],
            k["workgroup_size"].to_string(),
            k["name"].as_str().unwrap_or("")
        ));
    }
    let (total, weights) =
        (r["kernel_bytes"].as_u64().unwrap_or(0), r["weight_bytes"].as_u64().unwrap_or(0));
    s.push_str(&format!(
        "{} kernels, {total} bytes of SPIR-V (largest {}, {} over 64 KiB), {:.1}% of the \
         {weights} bytes of weights\n",
        r["kernels"],
        r["largest_kernel_bytes"],
        r["kernels_over_64k"],
        100.0 * total as f64 / weights.max(1) as f64
    ));
    s
}

/// The bank entries a variant's tensors refer to.
fn referenced_entries(v: &proto::Variant) -> BTreeSet<u32> {
    v.tensors
        .iter()
        .filter_map(|t| match t.storage.as_ref().and_then(|s| s.kind.as_ref()) {
            Some(Kind::Weight(w)) => Some(*w),
            _ => None,
        })
        .collect()
}

fn text(r: &serde_json::Value) -> String {
    let mut s = String::new();
    let line = |s: &mut String, l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(
        &mut s,
        format!(
            "format {}  ({})",
            r["format_version"].as_str().unwrap_or("?"),
            r["producer"].as_str().unwrap_or("")
        ),
    );
    line(
        &mut s,
        format!(
            "file {} bytes, {} weights ({} bytes), {} kernels",
            r["file_bytes"], r["weights"], r["weights_bytes"], r["kernels"]
        ),
    );
    line(
        &mut s,
        format!(
            "weight bank: {} unique bytes, {} without dedup, {} saved",
            r["unique_weight_bytes"], r["weight_bytes_without_dedup"], r["dedup_saved_bytes"]
        ),
    );
    let types: Vec<String> = (r["weight_types"].as_array().into_iter().flatten())
        .map(|t| {
            format!(
                "{} {} entries, {} bytes",
                t["dtype"].as_str().unwrap_or(""),
                t["entries"],
                t["bytes"]
            )
        })
        .collect();
    line(&mut s, format!("  by type: {}", types.join("; ")));
    for g in r["weight_sharing"].as_array().into_iter().flatten() {
        let names: Vec<&str> =
            g["variants"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
        let who = if names.is_empty() { "no variant".to_string() } else { names.join(", ") };
        line(&mut s, format!("  read by {who}: {} entries, {} bytes", g["entries"], g["bytes"]));
    }
    for v in r["variants"].as_array().into_iter().flatten() {
        line(
            &mut s,
            format!(
                "variant {}: {} steps, {} weight bytes, arena {} bytes (lower bound {}, {})",
                v["name"].as_str().unwrap_or(""),
                v["steps"],
                v["referenced_weight_bytes"],
                v["arena_bytes"],
                v["lower_bound_bytes"],
                v["strategy"].as_str().unwrap_or("")
            ),
        );
        for (kind, key) in [("input", "inputs"), ("output", "outputs"), ("held", "held")] {
            for io in v[key].as_array().into_iter().flatten() {
                let shape: Vec<usize> = io["shape"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_u64())
                    .map(|d| d as usize)
                    .collect();
                line(
                    &mut s,
                    format!(
                        "  {kind} {} {} {}",
                        io["name"].as_str().unwrap_or(""),
                        io["dtype"].as_str().unwrap_or(""),
                        shape_text(&shape)
                    ),
                );
            }
        }
        let ops: Vec<String> =
            v["ops"].as_object().into_iter().flatten().map(|(k, n)| format!("{k} x{n}")).collect();
        line(&mut s, format!("  ops: {}", ops.join(", ")));
        line(
            &mut s,
            format!(
                "  vulkan: {} of {} steps have kernels ({} dispatches)",
                v["vulkan_steps"], v["steps"], v["vulkan_dispatches"]
            ),
        );
        for (why, n) in v["no_vulkan_kernel"].as_object().into_iter().flatten() {
            line(&mut s, format!("    no kernel x{n}: {why}"));
        }
        let loops = match v["loops"].as_u64() {
            Some(1) => ", 1 run-time loop".to_string(),
            Some(n) if n > 1 => format!(", {n} run-time loops"),
            _ => String::new(),
        };
        line(
            &mut s,
            format!(
                "  submodels: {} (boundary buffer {} bytes){loops}",
                v["submodels"].as_array().map_or(0, Vec::len),
                v["boundary_bytes"]
            ),
        );
        for sub in v["submodels"].as_array().into_iter().flatten() {
            let list = |key: &str| -> String {
                let names: Vec<&str> =
                    sub[key].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
                names.join(", ")
            };
            let devices = list("devices");
            let first = sub["first_step"].as_u64().unwrap_or(0);
            let end = first + sub["step_count"].as_u64().unwrap_or(0);
            line(
                &mut s,
                format!(
                    "    steps {first}..{end} on {devices}: arena {} bytes; in: {}; out: {}",
                    sub["arena_bytes"],
                    list("inputs"),
                    list("outputs")
                ),
            );
            if let Some(why) = sub["no_vulkan_kernel"].as_str().filter(|w| !w.is_empty()) {
                line(&mut s, format!("      needs the CPU: {why}"));
            }
        }
    }
    for sec in r["sections"].as_array().into_iter().flatten() {
        line(
            &mut s,
            format!(
                "section {:<9} offset {:>10}  {:>10} bytes",
                sec["kind"].as_str().unwrap_or(""),
                sec["offset"],
                sec["bytes"]
            ),
        );
    }
    s
}
