//! Control flow: `If` nodes, as PyTorch exports write them.
//!
//! - A condition that folds at compile time (a test on an input's shape) inlines the branch
//!   it picks: the bundle holds no trace of the other.
//! - A condition known only at run time compiles both branches into submodels of their own
//!   that run only when taken, and picks each output; both backends give the taken branch's
//!   values for either condition, and never run the other (one that would fail does not).
//! - Branches read values of the graph around them, nest, and are checked like any graph.
//!
//! Expected values are the branches' arithmetic done here on the inputs (exact in f32).

use anyhow::{Context, Result, bail, ensure};
use ingot_compiler::{CompileOptions, compile_graph};
use ingot_runtime::{Device, Tensor};
use ingot_schema::DType;
use ingot_schema::container::{FORMAT_MAJOR, FORMAT_MINOR};
use ingot_tests::model::{OnnxModel, attr_graph, attr_int, attr_ints};
use ingot_tests::paths::scratch_dir;
use ingot_tests::{check_validation, compile, run, session_on, validation_seen, vulkan};
use std::path::{Path, PathBuf};

const X: [f32; 6] = [-1.5, 0.0, 2.0, 3.25, -4.0, 5.5];

fn x() -> Tensor {
    Tensor::from_vec(vec![2, 3], &X).expect("6 values for [2, 3]")
}

/// A branch giving `y` [2, 3] from `node` over outer values.
fn branch(op: &str, inputs: &[&str]) -> OnnxModel {
    OnnxModel::new(17).node(&format!("{op}_in_branch"), op, inputs, &["y_branch"], vec![]).output(
        "y_branch",
        DType::F32,
        &[2, 3],
    )
}

/// x f32 [2, 3]; r = Relu(x), read only inside the branches; the condition is `cond_of`'s
/// nodes; then: y = r * two, else: y = r + one.
fn if_model(cond: impl FnOnce(OnnxModel) -> OnnxModel) -> OnnxModel {
    let two = Tensor::from_vec(vec![], &[2.0f32]).expect("scalar");
    let one = Tensor::from_vec(vec![], &[1.0f32]).expect("scalar");
    let m = OnnxModel::new(17)
        .input("x", DType::F32, &[2, 3])
        .initializer("two", &two)
        .initializer("one", &one)
        .node("relu", "Relu", &["x"], &["r"], vec![]);
    cond(m)
        .if_node("if", "cond", "y", &branch("Mul", &["r", "two"]), &branch("Add", &["r", "one"]))
        .output("y", DType::F32, &[2, 3])
}

/// cond = (dim 1 of x's shape == `width`): folds once shapes are known.
fn shape_test(width: i64) -> impl FnOnce(OnnxModel) -> OnnxModel {
    move |m| {
        let one = Tensor::from_vec(vec![], &[1i64]).expect("scalar");
        let width = Tensor::from_vec(vec![], &[width]).expect("scalar");
        m.initializer("dim_index", &one)
            .initializer("width", &width)
            .node("shape", "Shape", &["x"], &["shape"], vec![])
            .node("dim", "Gather", &["shape", "dim_index"], &["dim"], vec![])
            .node("test", "Equal", &["dim", "width"], &["cond"], vec![])
    }
}

fn then_values() -> Vec<f32> {
    X.iter().map(|v| v.max(0.0) * 2.0).collect()
}

fn else_values() -> Vec<f32> {
    X.iter().map(|v| v.max(0.0) + 1.0).collect()
}

fn write(model: &OnnxModel, name: &str) -> Result<PathBuf> {
    let path = scratch_dir(&format!("control_flow_{name}")).join("model.onnx");
    model.write(&path)?;
    Ok(path)
}

/// The ops of the compiled graph, in order.
fn compiled_ops(path: &Path) -> Result<Vec<String>> {
    let c = compile_graph(path, &CompileOptions::default())?;
    Ok(c.graph.nodes.iter().map(|n| n.op.clone()).collect())
}

/// Runs `inputs` on the CPU and on Vulkan (lavapipe, under the validation layer) and checks
/// that both give `expected` exactly.
fn runs_give(bundle: &[u8], inputs: &[Tensor], expected: &[f32]) -> Result<()> {
    runs_give_all(bundle, inputs, &[expected.to_vec()])
}

/// [`runs_give`] for every output: output `k` is `expected[k]`.
fn runs_give_all(bundle: &[u8], inputs: &[Tensor], expected: &[Vec<f32>]) -> Result<()> {
    for device in [Device::Cpu, vulkan()] {
        let name = format!("{device:?}");
        let seen = validation_seen();
        let mut session = session_on(bundle, device)?;
        let outputs = run(&mut session, inputs).with_context(|| name.clone())?;
        check_validation(seen)?;
        for (k, (output, expected)) in outputs.iter().zip(expected).enumerate() {
            let got = output.to_vec::<f32>()?;
            ensure!(got == *expected, "{name}, output {k}: got {got:?}, expected {expected:?}");
        }
    }
    Ok(())
}

/// Profiles `inputs` on the CPU and on Vulkan and checks that output 0 is `expected` exactly;
/// returns, per device, the names of the steps that ran.
fn profiled_runs_give(
    bundle: &[u8],
    inputs: &[Tensor],
    expected: &[f32],
) -> Result<Vec<(String, Vec<String>)>> {
    let mut ran = Vec::new();
    for device in [Device::Cpu, vulkan()] {
        let name = format!("{device:?}");
        let seen = validation_seen();
        let mut session = session_on(bundle, device)?;
        let (outputs, profile) = session.profile(inputs).with_context(|| name.clone())?;
        check_validation(seen)?;
        let got = outputs[0].to_vec::<f32>()?;
        ensure!(got == expected, "{name}: got {got:?}, expected {expected:?}");
        ran.push((name, profile.into_iter().map(|s| s.name).collect()));
    }
    Ok(ran)
}

#[test]
fn an_if_on_a_shape_test_is_inlined_and_the_other_branch_dropped() -> Result<()> {
    for (width, expected, kept, dropped) in
        [(3, then_values(), "Mul", "Add"), (4, else_values(), "Add", "Mul")]
    {
        let path = write(&if_model(shape_test(width)), &format!("shape_{width}"))?;
        let ops = compiled_ops(&path)?;
        ensure!(
            ops.iter().any(|op| op == kept)
                && !ops.iter().any(|op| op == dropped || op == "Where" || op == "If"),
            "width {width}: compiled ops {ops:?} should hold {kept} and no {dropped}, Where, If"
        );
        runs_give(&compile(&path, &[])?, &[x()], &expected)?;
    }
    Ok(())
}

#[test]
fn an_if_decided_at_run_time_gives_the_taken_branch() -> Result<()> {
    let model = if_model(|m| m.input("cond", DType::Bool, &[]));
    let bundle = compile(&write(&model, "run_time")?, &[])?;
    for (cond, expected) in [(true, then_values()), (false, else_values())] {
        let cond = Tensor::from_bools(Vec::<usize>::new(), &[cond])?;
        runs_give(&bundle, &[x(), cond], &expected)?;
    }
    Ok(())
}

#[test]
fn a_run_time_if_runs_only_the_branch_taken() -> Result<()> {
    // then: rows of x picked by `idx` (an index out of range fails a CPU run); else: Relu(x).
    let gather = OnnxModel::new(17)
        .node("pick_rows", "Gather", &["x", "idx"], &["y_branch"], vec![attr_int("axis", 0)])
        .output("y_branch", DType::F32, &[2, 3]);
    let model = OnnxModel::new(17)
        .input("x", DType::F32, &[2, 3])
        .input("cond", DType::Bool, &[])
        .input("idx", DType::I64, &[2])
        .if_node("if", "cond", "y", &gather, &branch("Relu", &["x"]))
        .output("y", DType::F32, &[2, 3]);
    let path = write(&model, "taken_only")?;
    let plan = ingot_compiler::plan_text(&path, &CompileOptions::default())?;
    for line in ["runs when 'cond' is true", "runs when 'cond' is false"] {
        ensure!(plan.matches(line).count() == 1, "the plan should hold {line:?} once:\n{plan}");
    }
    let bundle = compile(&path, &[])?;
    let rows_swapped: Vec<f32> = [&X[3..], &X[..3]].concat();
    let relu: Vec<f32> = X.iter().map(|v| v.max(0.0)).collect();
    for (cond, idx, expected, ran, skipped) in [
        (true, [1i64, 0], rows_swapped, "pick_rows", "Relu_in_branch"),
        (false, [5, 7], relu, "Relu_in_branch", "pick_rows"),
    ] {
        let inputs = [
            x(),
            Tensor::from_bools(Vec::<usize>::new(), &[cond])?,
            Tensor::from_vec(vec![2], &idx)?,
        ];
        for (device, steps) in profiled_runs_give(&bundle, &inputs, &expected)? {
            ensure!(
                steps.iter().any(|s| s == ran) && !steps.iter().any(|s| s == skipped),
                "{device}, cond {cond}: the steps run {steps:?} should hold {ran} and not {skipped}"
            );
        }
    }
    Ok(())
}

/// `m` as a branch giving `y_inner` from an `If` on `cond`: then r * two, else r + one.
fn inner_if(m: OnnxModel, cond: &str) -> OnnxModel {
    let (then, other) = (branch("Mul", &["r", "two"]), branch("Add", &["r", "one"]));
    m.if_node("inner_if", cond, "y_inner", &then, &other).output("y_inner", DType::F32, &[2, 3])
}

#[test]
fn ifs_nest() -> Result<()> {
    // then: (if inner (folds to false): r * two, else: r + one); else: r * two.
    let no = Tensor::from_bools(Vec::<usize>::new(), &[false])?;
    let inner = inner_if(OnnxModel::new(17).initializer("inner_cond", &no), "inner_cond");
    let two = Tensor::from_vec(vec![], &[2.0f32])?;
    let one = Tensor::from_vec(vec![], &[1.0f32])?;
    let model = OnnxModel::new(17)
        .input("x", DType::F32, &[2, 3])
        .input("cond", DType::Bool, &[])
        .initializer("two", &two)
        .initializer("one", &one)
        .node("relu", "Relu", &["x"], &["r"], vec![])
        .if_node("outer_if", "cond", "y", &inner, &branch("Mul", &["r", "two"]))
        .output("y", DType::F32, &[2, 3]);
    let bundle = compile(&write(&model, "nested")?, &[])?;
    for (cond, expected) in [(true, else_values()), (false, then_values())] {
        let cond = Tensor::from_bools(Vec::<usize>::new(), &[cond])?;
        runs_give(&bundle, &[x(), cond], &expected)?;
    }
    Ok(())
}

#[test]
fn run_time_ifs_nest_and_each_level_runs_only_its_branch() -> Result<()> {
    // if outer: (if inner: r * two else: r + one) else: Neg(r), both conditions inputs.
    let inner = inner_if(OnnxModel::new(17), "inner");
    let model = OnnxModel::new(17)
        .input("x", DType::F32, &[2, 3])
        .input("outer", DType::Bool, &[])
        .input("inner", DType::Bool, &[])
        .initializer("two", &Tensor::from_vec(vec![], &[2.0f32])?)
        .initializer("one", &Tensor::from_vec(vec![], &[1.0f32])?)
        .node("relu", "Relu", &["x"], &["r"], vec![])
        .if_node("outer_if", "outer", "y", &inner, &branch("Neg", &["r"]))
        .output("y", DType::F32, &[2, 3]);
    let path = write(&model, "nested_run_time")?;
    let plan = ingot_compiler::plan_text(&path, &CompileOptions::default())?;
    let both = "runs when 'outer' is true and 'inner' is true";
    ensure!(plan.contains(both), "the plan should hold {both:?}:\n{plan}");
    let bundle = compile(&path, &[])?;
    let negated: Vec<f32> = X.iter().map(|v| -v.max(0.0)).collect();
    for (outer, inner, expected, ran) in [
        (true, true, then_values(), "Mul_in_branch"),
        (true, false, else_values(), "Add_in_branch"),
        (false, true, negated.clone(), "Neg_in_branch"),
        (false, false, negated, "Neg_in_branch"),
    ] {
        let flag = |b: bool| Tensor::from_bools(Vec::<usize>::new(), &[b]);
        let inputs = [x(), flag(outer)?, flag(inner)?];
        for (device, steps) in profiled_runs_give(&bundle, &inputs, &expected)? {
            let branches: Vec<&String> =
                steps.iter().filter(|s| s.ends_with("_in_branch")).collect();
            ensure!(
                branches == [ran],
                "{device}, outer {outer}, inner {inner}: branch steps run {branches:?}, expected \
                 [{ran}]"
            );
        }
    }
    Ok(())
}

/// acc = x; each iteration i: acc = acc * 2 + i, and -acc is its scan output. The trip count
/// is `trip_count`; the body's condition is `i < 3` when `stop_early`, else passed through.
fn loop_model(trip_count: Option<i64>, stop_early: bool) -> OnnxModel {
    let mut body = OnnxModel::new(17)
        .input("i", DType::I64, &[])
        .input("c_in", DType::Bool, &[])
        .input("acc", DType::F32, &[3])
        .node("to_float", "Cast", &["i"], &["i_f"], vec![attr_int("to", 1)])
        .node("double", "Mul", &["acc", "two"], &["doubled"], vec![])
        .node("add_i", "Add", &["doubled", "i_f"], &["acc_out"], vec![])
        .node("negate", "Neg", &["acc_out"], &["y"], vec![]);
    body = if stop_early {
        body.node("test", "Less", &["i", "three"], &["c_out"], vec![])
    } else {
        body.node("pass", "Identity", &["c_in"], &["c_out"], vec![])
    };
    let body = body.output("c_out", DType::Bool, &[]).output("acc_out", DType::F32, &[3]).output(
        "y",
        DType::F32,
        &[3],
    );
    let mut m = OnnxModel::new(17)
        .input("x", DType::F32, &[3])
        .initializer("two", &Tensor::from_vec(vec![], &[2.0f32]).expect("scalar"))
        .initializer("three", &Tensor::from_vec(vec![], &[3i64]).expect("scalar"))
        .initializer("yes", &Tensor::from_bools(Vec::<usize>::new(), &[true]).expect("scalar"));
    m = match trip_count {
        Some(n) => m.initializer("m", &Tensor::from_vec(vec![], &[n]).expect("scalar")),
        None => m.input("m", DType::I64, &[]),
    };
    m.node("loop", "Loop", &["m", "yes", "x"], &["final", "ys"], vec![attr_graph("body", &body)])
        .output("final", DType::F32, &[3])
        .output("ys", DType::F32, &[4, 3])
}

#[test]
fn a_loop_with_a_known_trip_count_or_condition_is_unrolled() -> Result<()> {
    let x = [0.5f32, -1.0, 2.0];
    let mut acc = x.to_vec();
    let mut ys = Vec::new();
    for i in 0..4 {
        acc = acc.iter().map(|a| a * 2.0 + i as f32).collect();
        ys.extend(acc.iter().map(|a| -a));
    }
    // Four iterations either way: the trip count, or the condition turning false after i = 3.
    for (name, model) in
        [("count", loop_model(Some(4), false)), ("cond", loop_model(Some(10), true))]
    {
        let path = write(&model, &format!("loop_{name}"))?;
        ensure!(!compiled_ops(&path)?.iter().any(|op| op == "Loop"), "{name}: a Loop is left");
        let input = Tensor::from_vec(vec![3], &x)?;
        runs_give_all(&compile(&path, &[])?, &[input], &[acc.clone(), ys.clone()])
            .with_context(|| name)?;
    }
    Ok(())
}

#[test]
fn a_long_loop_runs_as_a_repeated_submodel_and_stacks_its_scan_outputs() -> Result<()> {
    let x = [0.5f32, -1.0, 2.0];
    // 300 iterations, past what Ingot unrolls, or 4 where the condition ends it early: the
    // scan output holds as many rows as iterations ran.
    for stop_early in [false, true] {
        let mut acc = x.to_vec();
        let mut ys = Vec::new();
        for i in 0..300 {
            acc = acc.iter().map(|a| a * 2.0 + i as f32).collect();
            ys.extend(acc.iter().map(|a| -a));
            if stop_early && i >= 3 {
                break;
            }
        }
        let name = format!("loop_long_{stop_early}");
        let path = write(&loop_model(Some(300), stop_early), &name)?;
        let ops = compiled_ops(&path)?;
        ensure!(ops.iter().filter(|op| *op == "Neg").count() == 1, "{name}: one body: {ops:?}");
        let input = Tensor::from_vec(vec![3], &x)?;
        runs_give_all(&compile(&path, &[])?, &[input], &[acc, ys]).with_context(|| name)?;
    }
    Ok(())
}

#[test]
fn a_run_time_loop_with_scan_outputs_and_no_bound_names_the_node_and_the_option() -> Result<()> {
    let parts = [
        "'loop' (Loop)",
        "trip count (input 0) is computed at run time",
        "--max-loop-iterations N",
    ];
    compile_fails(&loop_model(None, false), "loop_run_time", &parts)
}

#[test]
fn a_run_time_loop_stacks_scan_outputs_up_to_its_bound_and_refuses_to_run_past_it() -> Result<()> {
    let path = write(&loop_model(None, false), "loop_run_time_bounded")?;
    let options =
        CompileOptions { verify: true, max_loop_iterations: Some(8), ..CompileOptions::default() };
    // The plan holds 8 rows and says where the rows that ran are counted.
    let plan = ingot_compiler::plan_text(&path, &options)?;
    let stacked = plan.lines().find(|l| l.trim_start().starts_with("ys ")).unwrap_or_default();
    let rows = "\u{2264}8x3 (length in loop@loop.iteration)";
    ensure!(stacked.ends_with(rows), "'ys' planned for 8 rows: {stacked:?}\n{plan}");
    let bundle = ingot_compiler::compile_file(&path, &options)?;
    let x = [0.5f32, -1.0, 2.0];
    for m in [0i64, 1, 5, 8] {
        let mut acc = x.to_vec();
        let mut ys = Vec::new();
        for i in 0..m {
            acc = acc.iter().map(|a| a * 2.0 + i as f32).collect();
            ys.extend(acc.iter().map(|a| -a));
        }
        let inputs = [Tensor::from_vec(vec![3], &x)?, Tensor::from_vec(vec![], &[m])?];
        runs_give_all(&bundle, &inputs, &[acc, ys]).with_context(|| format!("m = {m}"))?;
        let mut session = session_on(&bundle, Device::Cpu)?;
        let shape = run(&mut session, &inputs)?[1].shape().to_vec();
        ensure!(shape == [m as usize, 3], "m = {m}: ys is {shape:?}");
    }
    // A ninth iteration has no row: the run stops with an error naming the loop, on both
    // backends.
    let inputs = [Tensor::from_vec(vec![3], &x)?, Tensor::from_vec(vec![], &[9i64])?];
    for device in [Device::Cpu, vulkan()] {
        let mut session = session_on(&bundle, device.clone())?;
        let Err(err) = session.run(&inputs) else { bail!("{device:?}: 9 iterations ran") };
        let message = err.to_string();
        let want = "Loop 'loop' would run more than the 8 iterations its scan outputs were";
        ensure!(message.contains(want), "{device:?}: {message}");
    }
    Ok(())
}

/// acc [3] = x; each iteration i: acc = i - acc, for `m` iterations, `m` a graph input: no
/// scan outputs, so the body runs as a repeated submodel, however many iterations it makes.
fn counted_loop(grow: bool) -> OnnxModel {
    OnnxModel::new(17)
        .input("x", DType::F32, &[3])
        .input("m", DType::I64, &[])
        .initializer("yes", &Tensor::from_bools(Vec::<usize>::new(), &[true]).expect("scalar"))
        .node("loop", "Loop", &["m", "yes", "x"], &["final"], vec![counted_body(grow)])
        .output("final", DType::F32, &[3])
}

/// The body of [`counted_loop`], as its attribute.
fn counted_body(grow: bool) -> onnx_protobuf::AttributeProto {
    let body = OnnxModel::new(17)
        .input("i", DType::I64, &[])
        .input("c_in", DType::Bool, &[])
        .input("acc", DType::F32, &[3])
        .node("to_float", "Cast", &["i"], &["i_f"], vec![attr_int("to", 1)])
        .node("flip", "Sub", &["i_f", "acc"], &["flipped"], vec![])
        .node("pass", "Identity", &["c_in"], &["c_out"], vec![]);
    let body = if grow {
        body.node("grow", "Concat", &["flipped", "acc"], &["acc_out"], vec![attr_int("axis", 0)])
    } else {
        body.node("keep", "Identity", &["flipped"], &["acc_out"], vec![])
    };
    let body = body.output("c_out", DType::Bool, &[]).output("acc_out", DType::F32, &[3]);
    attr_graph("body", &body)
}

#[test]
fn a_loop_whose_trip_count_is_known_only_at_run_time_runs_its_body_that_many_times() -> Result<()> {
    let path = write(&counted_loop(false), "loop_counted")?;
    let ops = compiled_ops(&path)?;
    let subs = ops.iter().filter(|op| *op == "Sub").count();
    ensure!(subs == 1 && !ops.iter().any(|op| op == "Loop"), "one body, no Loop: {ops:?}");
    let plan = ingot_compiler::plan_text(&path, &CompileOptions::default())?;
    // Its condition starts true and the body passes it through: the loop has none.
    let line = "  'loop' runs submodels 1..2 while 'loop@loop.iteration' < 'loop@loop.trip_count'; \
                carries 'loop@loop.next1' -> 'loop@loop.state0'";
    ensure!(plan.lines().any(|l| l == line), "the plan shows the loop as\n{line}\n{plan}");
    let bundle = compile(&path, &[])?;
    // A runtime of format 2 would run the body once: the bundle says it needs format 3.
    let version = ingot_runtime::Bundle::from_bytes(&bundle)?.format_version();
    ensure!(version == (FORMAT_MAJOR, FORMAT_MINOR), "format {version:?}");
    let x = [0.5f32, -1.0, 2.0];
    // 300 is past what Ingot would unroll.
    for m in [0i64, 1, 5, 300] {
        let mut acc = x.to_vec();
        for i in 0..m {
            acc = acc.iter().map(|a| i as f32 - a).collect();
        }
        let inputs = [Tensor::from_vec(vec![3], &x)?, Tensor::from_vec(vec![], &[m])?];
        runs_give_all(&bundle, &inputs, &[acc]).with_context(|| format!("m = {m}"))?;
    }
    Ok(())
}

#[test]
fn a_run_time_loop_in_a_run_time_branch_runs_only_when_it_is_taken() -> Result<()> {
    // then: the counted loop over x; else: -x. The loop's trip count is an input too.
    let then = OnnxModel::new(17)
        .node("loop", "Loop", &["m", "yes", "x"], &["y_then"], vec![counted_body(false)])
        .output("y_then", DType::F32, &[3]);
    let other = OnnxModel::new(17).node("negate", "Neg", &["x"], &["y_else"], vec![]).output(
        "y_else",
        DType::F32,
        &[3],
    );
    let model = OnnxModel::new(17)
        .input("x", DType::F32, &[3])
        .input("m", DType::I64, &[])
        .input("cond", DType::Bool, &[])
        .initializer("yes", &Tensor::from_bools(Vec::<usize>::new(), &[true])?)
        .if_node("if", "cond", "y", &then, &other)
        .output("y", DType::F32, &[3]);
    let bundle = compile(&write(&model, "loop_in_branch")?, &[])?;
    let x = [0.5f32, -1.0, 2.0];
    for (cond, m) in [(true, 7i64), (false, 7), (true, 0)] {
        let expected: Vec<f32> = if cond {
            let mut acc = x.to_vec();
            for i in 0..m {
                acc = acc.iter().map(|a| i as f32 - a).collect();
            }
            acc
        } else {
            x.iter().map(|a| -a).collect()
        };
        let inputs = [
            Tensor::from_vec(vec![3], &x)?,
            Tensor::from_vec(vec![], &[m])?,
            Tensor::from_bools(Vec::<usize>::new(), &[cond])?,
        ];
        runs_give(&bundle, &inputs, &expected).with_context(|| format!("cond {cond}, m {m}"))?;
    }
    Ok(())
}

/// acc [3] = x, steps = 0; while `go` at first, then while acc[0] < `limit`, at most 1000
/// times: acc += 1.5, steps += 1.
fn while_loop() -> OnnxModel {
    let scalar = |v: f32| Tensor::from_vec(vec![], &[v]).expect("scalar");
    let body = OnnxModel::new(17)
        .input("i", DType::I64, &[])
        .input("c_in", DType::Bool, &[])
        .input("acc", DType::F32, &[3])
        .input("n", DType::F32, &[])
        .node("add", "Add", &["acc", "step"], &["acc_out"], vec![])
        .node("count", "Add", &["n", "one"], &["steps_out"], vec![])
        .node("first", "Gather", &["acc_out", "zero"], &["head"], vec![attr_int("axis", 0)])
        .node("test", "Less", &["head", "limit"], &["c_out"], vec![])
        .output("c_out", DType::Bool, &[])
        .output("acc_out", DType::F32, &[3])
        .output("steps_out", DType::F32, &[]);
    OnnxModel::new(17)
        .input("x", DType::F32, &[3])
        .input("go", DType::Bool, &[])
        .input("limit", DType::F32, &[])
        .initializer("m", &Tensor::from_vec(vec![], &[1000i64]).expect("scalar"))
        .initializer("none", &scalar(0.0))
        .initializer("step", &scalar(1.5))
        .initializer("one", &scalar(1.0))
        .initializer("zero", &Tensor::from_vec(vec![], &[0i64]).expect("scalar"))
        .node(
            "loop",
            "Loop",
            &["m", "go", "x", "none"],
            &["final", "steps"],
            vec![attr_graph("body", &body)],
        )
        .output("final", DType::F32, &[3])
        .output("steps", DType::F32, &[])
}

#[test]
fn a_loop_whose_condition_is_computed_at_run_time_runs_until_it_is_false() -> Result<()> {
    let bundle = compile(&write(&while_loop(), "loop_while")?, &[])?;
    let x = [0.5f32, -1.0, 2.0];
    // The condition ends it after 3 iterations (0.5 -> 2 -> 3.5 -> 5); a false one at the
    // start runs none; a limit never reached leaves the trip count to end it.
    for (go, limit, iterations) in [(true, 5.0f32, 3), (false, 5.0, 0), (true, 1e6, 1000)] {
        let acc: Vec<f32> = x.iter().map(|a| a + 1.5 * iterations as f32).collect();
        let inputs = [
            Tensor::from_vec(vec![3], &x)?,
            Tensor::from_bools(Vec::<usize>::new(), &[go])?,
            Tensor::from_vec(vec![], &[limit])?,
        ];
        runs_give_all(&bundle, &inputs, &[acc, vec![iterations as f32]])
            .with_context(|| format!("go {go}, limit {limit}"))?;
    }
    Ok(())
}

#[test]
fn a_run_time_loop_whose_carried_value_changes_shape_names_the_node() -> Result<()> {
    let parts = ["'loop' (Loop)", "keep their type", "f32 [3] before an iteration and f32 [6]"];
    compile_fails(&counted_loop(true), "loop_grows", &parts)
}

/// A Scan body of `opset`: state s [2] and row [2] in; s_out = s + row, y = s_out * row out.
fn sum_body(opset: i64) -> OnnxModel {
    OnnxModel::new(opset)
        .input("s", DType::F32, &[2])
        .input("row", DType::F32, &[2])
        .node("sum", "Add", &["s", "row"], &["s_out"], vec![])
        .node("product", "Mul", &["s_out", "row"], &["y"], vec![])
        .output("s_out", DType::F32, &[2])
        .output("y", DType::F32, &[2])
}

/// A Scan of `steps` rows: s = s + row over the rows of xs taken last to first; y = s * row,
/// stacked on axis 1, last to first where `reversed_out`.
fn scan_runs(steps: usize, reversed_out: bool) -> Result<()> {
    let body = sum_body(17);
    let model = OnnxModel::new(17)
        .input("s0", DType::F32, &[2])
        .input("xs", DType::F32, &[steps, 2])
        .node(
            "scan",
            "Scan",
            &["s0", "xs"],
            &["s_final", "ys"],
            vec![
                attr_graph("body", &body),
                attr_int("num_scan_inputs", 1),
                attr_ints("scan_input_directions", &[1]),
                attr_ints("scan_output_directions", &[i64::from(reversed_out)]),
                attr_ints("scan_output_axes", &[1]),
            ],
        )
        .output("s_final", DType::F32, &[2])
        .output("ys", DType::F32, &[2, steps]);
    let s0 = [1.0f32, -2.0];
    // Halves: every sum and product here is exact in f32.
    let xs: Vec<f32> = (0..2 * steps).map(|i| ((i * 5) % 7) as f32 * 0.5 - 1.5).collect();
    let mut s = s0.to_vec();
    let mut ys = vec![0.0f32; 2 * steps];
    for t in 0..steps {
        let row = &xs[(steps - 1 - t) * 2..(steps - t) * 2];
        let at = if reversed_out { steps - 1 - t } else { t };
        for j in 0..2 {
            s[j] += row[j];
            ys[j * steps + at] = s[j] * row[j];
        }
    }
    let inputs = [Tensor::from_vec(vec![2], &s0)?, Tensor::from_vec(vec![steps, 2], &xs)?];
    let name = format!("scan_{steps}_{reversed_out}");
    let path = write(&model, &name)?;
    let ops = compiled_ops(&path)?;
    let copies = ops.iter().filter(|op| *op == "Add").count();
    let expected = if steps > 256 { 1 } else { steps };
    ensure!(copies == expected, "{name}: {copies} copies of the body, expected {expected}");
    runs_give_all(&compile(&path, &[])?, &inputs, &[s, ys]).with_context(|| name)
}

#[test]
fn a_scan_runs_its_body_per_step_in_either_direction_and_stacks_on_any_axis() -> Result<()> {
    scan_runs(3, false)?;
    scan_runs(3, true)
}

#[test]
fn a_long_scan_runs_as_a_repeated_submodel() -> Result<()> {
    scan_runs(300, false)?;
    scan_runs(300, true)
}

/// An opset-8 Scan over a batch of 2: `sequence_lens` (omitted, or the constant `lens`),
/// s [2, 2] and xs [2, 3, 2] scanned last to first; s = s + row, y = s * row.
fn batched_scan(lens: Option<&[i32]>) -> OnnxModel {
    let body = sum_body(8);
    let mut m =
        OnnxModel::new(8).input("s0", DType::F32, &[2, 2]).input("xs", DType::F32, &[2, 3, 2]);
    if let Some(lens) = lens {
        m = m.initializer("lens", &Tensor::from_vec(vec![2], lens).expect("two lengths"));
    }
    let lens_name = if lens.is_some() { "lens" } else { "" };
    m.node(
        "scan",
        "Scan",
        &[lens_name, "s0", "xs"],
        &["s_final", "ys"],
        vec![
            attr_graph("body", &body),
            attr_int("num_scan_inputs", 1),
            attr_ints("directions", &[1]),
        ],
    )
    .output("s_final", DType::F32, &[2, 2])
    .output("ys", DType::F32, &[2, 3, 2])
}

#[test]
fn an_opset_8_scan_runs_its_body_per_batch_element() -> Result<()> {
    let s0 = [1.0f32, -2.0, 0.5, 4.0];
    let xs = [0.5f32, 1.5, -3.0, 2.0, 4.0, -0.25, 1.0, 1.0, 2.0, -1.0, -0.5, 3.0];
    let (mut finals, mut ys) = (Vec::new(), vec![0.0f32; 12]);
    for e in 0..2 {
        let mut s = s0[e * 2..e * 2 + 2].to_vec();
        // Iteration i reads row 2 - i; its output is stacked at i (opset 8 reverses inputs).
        for i in 0..3 {
            for j in 0..2 {
                let row = xs[e * 6 + (2 - i) * 2 + j];
                s[j] += row;
                ys[e * 6 + i * 2 + j] = s[j] * row;
            }
        }
        finals.extend(s);
    }
    let inputs = [Tensor::from_vec(vec![2, 2], &s0)?, Tensor::from_vec(vec![2, 3, 2], &xs)?];
    for (name, lens) in [("batched_scan", None), ("batched_scan_lens", Some(&[3, 3][..]))] {
        let bundle = compile(&write(&batched_scan(lens), name)?, &[])?;
        runs_give_all(&bundle, &inputs, &[finals.clone(), ys.clone()]).context(name)?;
    }
    // Sequences shorter than the scanned axis would need a ragged unroll.
    let parts = ["'scan' (Scan)", "sequence_lens is not the constant 3"];
    compile_fails(&batched_scan(Some(&[3, 2])), "batched_scan_short", &parts)
}

/// x f32 [2, 3], r = Relu(x); if (cond, a run-time input) then Relu(r) else `other`, whose
/// output `y_branch` reads `r`.
fn run_time_if(other: OnnxModel) -> OnnxModel {
    OnnxModel::new(17)
        .input("x", DType::F32, &[2, 3])
        .input("cond", DType::Bool, &[])
        .node("relu", "Relu", &["x"], &["r"], vec![])
        .if_node("if", "cond", "y", &branch("Relu", &["r"]), &other)
        .output("y", DType::F32, &[2, 3])
}

/// Compiling `model` fails with a message that holds each of `parts`.
fn compile_fails(model: &OnnxModel, name: &str, parts: &[&str]) -> Result<()> {
    let Err(err) = compile(&write(model, name)?, &[]) else {
        bail!("{name}: compiled");
    };
    let message = format!("{err:#}");
    for part in parts {
        ensure!(message.contains(part), "{name}: message lacks {part:?}: {message}");
    }
    Ok(())
}

#[test]
fn a_run_time_if_whose_branches_differ_in_shape_names_the_node() -> Result<()> {
    let shape = Tensor::from_vec(vec![2], &[3i64, 2])?;
    let reshaped = OnnxModel::new(17)
        .initializer("new_shape", &shape)
        .node("reshape", "Reshape", &["r", "new_shape"], &["y_branch"], vec![])
        .output("y_branch", DType::F32, &[3, 2]);
    let parts = ["'if' (If)", "run time", "[2, 3]", "[3, 2]", "--constant-input"];
    compile_fails(&run_time_if(reshaped), "shapes_differ", &parts)
}

#[test]
fn an_error_in_a_branch_of_a_run_time_if_says_why_the_branch_was_compiled() -> Result<()> {
    // The else branch reshapes [2, 3] to [4, 2]: an error whichever branch the data takes.
    let shape = Tensor::from_vec(vec![2], &[4i64, 2])?;
    let bad = OnnxModel::new(17)
        .initializer("bad_shape", &shape)
        .node("bad_reshape", "Reshape", &["r", "bad_shape"], &["y_branch"], vec![])
        .output("y_branch", DType::F32, &[4, 2]);
    let parts = ["'bad_reshape' (Reshape)", "in a branch of 'if' (If)", "--constant-input"];
    compile_fails(&run_time_if(bad), "bad_branch", &parts)
}

#[test]
fn an_unsupported_op_inside_a_branch_is_named_with_its_branch() -> Result<()> {
    let odd = OnnxModel::new(17).node("odd", "NoSuchOp", &["r"], &["y_branch"], vec![]).output(
        "y_branch",
        DType::F32,
        &[2, 3],
    );
    let part = "node 'odd' (NoSuchOp, domain ai.onnx, opset 17) in else_branch of node 'if'";
    compile_fails(&run_time_if(odd), "unsupported", &[part])
}
