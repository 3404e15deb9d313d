//! Planner figures (not a timed test): for the PP-OCR models (when fetched under
//! target/models by tools/fetch_models.sh) and synthetic graphs of 1000 and 20000 nodes, the
//! naive bytes, the lower bound as each mechanism is added, the arena, arena / bound, and the
//! planning time. Targets (issue 3): arena / bound <= 1.01 on every model; planning under
//! 100 ms at 1000 nodes and under 2 s at 20000.
//!
//! Run: `cargo bench -p ingot-compiler --bench plan`

use ingot_compiler::ir::{Graph, Node};
use ingot_compiler::plan::{self, Stats, Target};
use ingot_compiler::{CompileOptions, compile_graph};
use ingot_ops::TensorDesc;
use ingot_schema::{AttrValue, Attrs, DType};
use std::path::PathBuf;

/// A CNN-like graph of `blocks` residual blocks (about five nodes each): pointwise op, reshape
/// views, a branch, an add, and every eighth block a four-way channel concat. Sizes vary with a
/// fixed pseudo-random sequence, so the graph is the same on every run.
fn synthetic(nodes: usize) -> Graph {
    let mut g = Graph { opset: 17, ..Default::default() };
    let mut seed = 7u64;
    let mut next = |m: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    let t = |c: usize, hw: usize| Some(TensorDesc::new(DType::F32, vec![1, c, hw, hw]));
    let add = |g: &mut Graph, op: &str, inputs: &[usize], outputs: &[usize], attrs: Attrs| {
        g.nodes.push(Node {
            name: format!("n{}", g.nodes.len()),
            op: op.into(),
            domain: String::new(),
            inputs: inputs.iter().map(|&i| Some(i)).collect(),
            outputs: outputs.to_vec(),
            attrs,
        })
    };
    let hw = 16;
    let mut c = 8;
    let x = g.add_value("x", t(c, hw));
    g.inputs = vec![x];
    let mut cur = x;
    let mut b = 0;
    while g.nodes.len() + 6 < nodes {
        let wide = 8 * (1 + next(8) as usize);
        let a = g.add_value(format!("a{b}"), t(wide, hw));
        let r = g.add_value(format!("r{b}"), t(wide, hw));
        let e = g.add_value(format!("e{b}"), t(c, hw));
        let s = g.add_value(format!("s{b}"), t(c, hw));
        add(&mut g, "Expand", &[cur], &[a], Attrs::new());
        add(&mut g, "Reshape", &[a], &[r], Attrs::new());
        add(&mut g, "ReduceSum", &[r], &[e], Attrs::new());
        add(&mut g, "Add", &[cur, e], &[s], Attrs::new());
        cur = s;
        if b % 8 == 7 {
            let parts: Vec<usize> =
                (0..4).map(|k| g.add_value(format!("p{b}_{k}"), t(c, hw))).collect();
            for &p in &parts {
                add(&mut g, "Exp", &[cur], &[p], Attrs::new());
            }
            c *= 4;
            let cat = g.add_value(format!("cat{b}"), t(c, hw));
            add(&mut g, "Concat", &parts, &[cat], Attrs::new().with("axis", AttrValue::Int(1)));
            c /= 4;
            let down = g.add_value(format!("d{b}"), t(c, hw));
            add(&mut g, "ReduceMean", &[cat], &[down], Attrs::new());
            cur = down;
        }
        b += 1;
    }
    let y = g.add_value("y", t(c, hw));
    add(&mut g, "Exp", &[cur], &[y], Attrs::new());
    g.outputs = vec![y];
    g
}

fn main() {
    println!("{}", Stats::header());
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/models");
    for (file, shape) in [
        ("ch_PP-OCRv4_det_infer.onnx", vec![1, 3, 224, 224]),
        ("ch_PP-OCRv4_rec_infer.onnx", vec![1, 3, 48, 320]),
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", vec![1, 3, 48, 192]),
    ] {
        let path = models.join(file);
        if !path.exists() {
            println!("{file}: not fetched (run tools/fetch_models.sh)");
            continue;
        }
        let options =
            CompileOptions { input_shapes: vec![("x".into(), shape)], ..CompileOptions::default() };
        match compile_graph(&path, &options) {
            Ok(c) => println!("{}", plan::stats(&c.graph, Target::cpu()).row(file)),
            Err(e) => println!("{file}: {e}"),
        }
    }
    for nodes in [1000, 20000] {
        let g = synthetic(nodes);
        let name = format!("synthetic, {} nodes", g.nodes.len());
        println!("{}", plan::stats(&g, Target::cpu()).row(&name));
    }
}
