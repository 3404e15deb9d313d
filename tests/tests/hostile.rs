//! Hostile input gets a clear error, never a panic or an abort.
//!
//! - Bundles: small models are compiled, then their manifests get thousands of structured
//!   mutations (indices, storages, shapes, dtypes, weights, the plan, attributes, op names, steps
//!   added, removed and reordered) and are written back into valid containers; the bytes of the
//!   manifest and of the whole file are flipped and cut. Each case is opened, given a session
//!   and run with inputs of the shapes the session declares.
//! - ONNX models: the `ModelProto` of small models is mutated the same way (attributes, names,
//!   dims, initializers, op types, opsets, cycles) and its bytes flipped and cut; each case is
//!   compiled and, when that succeeds, run.
//! - Wrong inputs at run time (beyond `bad_input.rs`): several inputs, zero-size shapes.
//!
//! Every stage must return `Ok` or `Err`; a panic fails the test and names the case. Mutations
//! come from a fixed-seed xorshift generator, so a failure reproduces on the next run. An abort
//! (a failed allocation) kills the test binary instead; to find its case, and for longer runs:
//!
//! - `INGOT_HOSTILE_TRACE=1` prints every case before it runs, and how it failed
//!   (with `-- --nocapture --test-threads 1`);
//! - `INGOT_HOSTILE_CASE=N` runs only case N of the mutation tests;
//! - `INGOT_HOSTILE_SCALE=K` runs K times as many mutation cases.

use ingot_compiler::CompileError;
use ingot_compiler::passes::PassError;
use ingot_runtime::{Bundle, IoInfo, Session, SessionOptions, Tensor, TensorDesc};
use ingot_schema::container::{self, Container};
use ingot_schema::proto::{self, Manifest, attribute::Value, storage::Kind};
use ingot_schema::{DType, SectionKind};
use ingot_tests::model::{OnnxModel, attr_float, attr_graph, attr_int, attr_ints, attr_string};
use ingot_tests::paths::scratch_dir;
use ingot_tests::{catch_panic, compile};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_shape_proto::dimension;
use onnx_protobuf::{AttributeProto, ModelProto, NodeProto, TensorProto, type_proto};
use prost::Message as _;
use protobuf::{EnumOrUnknown, Message as _};
use std::path::Path;
use std::sync::Arc;

const OPSET: i64 = 17;

/// Sizes in bytes that a case may not reach (in any tensor, or the arena) to be run: large
/// enough that they may be allocated, on a big machine or one that overcommits memory, and then
/// touched. Larger sizes are tried: they exceed any address space (x86-64 and AArch64 user
/// space is at most 2^56 bytes), so a case that asks for one must fail cleanly.
const TOO_LARGE: std::ops::Range<u128> = (64 << 20)..(1 << 57);

// ---------------------------------------------------------------------------------------------
// Deterministic randomness.

/// xorshift64*: small, fast and the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // A zero state would stay zero; mix the seed so nearby seeds diverge at once.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A count or size near `near`, or one of the values that break naive arithmetic. Large
    /// values are far beyond any memory (so that a case that accepts them must fail to
    /// allocate, not succeed slowly); moderate ones stay small.
    fn wild_u64(&mut self, near: u64) -> u64 {
        match self.below(10) {
            0 => 0,
            1 => 1,
            2 => near.wrapping_add(1),
            3 => near.wrapping_sub(1),
            4 => near.wrapping_add(self.pick(&[4, 8, 64, 4096])),
            5 => near.wrapping_mul(2),
            6 => self.next() % near.saturating_mul(2).saturating_add(16),
            7 => self.pick(&[1 << 40, 1 << 58, 1 << 62, 1 << 63]),
            8 => self.pick(&[u64::MAX, u64::MAX - 7, i64::MAX as u64, u32::MAX as u64 + 1]),
            _ => self.pick(&[3, 7, 100, 1000]),
        }
    }

    fn wild_i64(&mut self, near: i64) -> i64 {
        match self.below(10) {
            0 => self.pick(&[0, 1, -1]),
            1 => near.wrapping_add(1),
            2 => near.wrapping_sub(1),
            3 => near.wrapping_neg(),
            4 => near.wrapping_mul(2),
            5 => self.below(21) as i64 - 10,
            6 => self.pick(&[i64::MAX, i64::MIN, i64::MIN + 1, i64::MAX - 1]),
            7 => self.pick(&[1 << 40, 1 << 58, -(1 << 40), 1 << 62, -(1 << 62)]),
            8 => self.pick(&[i32::MAX as i64, i32::MIN as i64, u32::MAX as i64]),
            _ => self.pick(&[3, 7, 100, 1000, -1000]),
        }
    }

    fn wild_f64(&mut self, near: f64) -> f64 {
        match self.below(8) {
            0 => self.pick(&[0.0, -0.0, 1.0, -1.0, 0.5]),
            1 => self.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
            2 => self.pick(&[1e30, -1e30, 1e-30, f64::MAX, f64::MIN_POSITIVE]),
            3 => near * 2.0,
            4 => -near,
            5 => near + 1.0,
            6 => self.pick(&[3.0, 7.0, 100.0, 1e9]),
            _ => (self.below(2001) as f64 - 1000.0) / 100.0,
        }
    }

    /// An index into a list of `len`: usually valid, sometimes just past it, sometimes absurd.
    fn wild_index(&mut self, len: usize) -> u32 {
        match self.below(8) {
            0 => len as u32,
            1 => len as u32 + 1,
            2 => u32::MAX,
            _ => self.below(len.max(1)) as u32,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The models.

fn f32s(shape: &[usize], rng: &mut Rng) -> Tensor {
    let n = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| (rng.below(2001) as f32 - 1000.0) / 500.0).collect();
    Tensor::from_vec(shape.to_vec(), &data).unwrap()
}

fn i64s(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), data).unwrap()
}

/// Conv, pool, batch norm, a residual add, global pool, Gemm, softmax.
fn conv_net() -> OnnxModel {
    let rng = &mut Rng::new(1);
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[1, 3, 8, 8])
        .initializer("w1", &f32s(&[4, 3, 3, 3], rng))
        .initializer("b1", &f32s(&[4], rng))
        .initializer("w2", &f32s(&[4, 1, 3, 3], rng))
        .initializer("bn_scale", &f32s(&[4], rng))
        .initializer("bn_bias", &f32s(&[4], rng))
        .initializer("bn_mean", &f32s(&[4], rng))
        .initializer("bn_var", &Tensor::from_vec(vec![4], &[1.0f32, 0.5, 2.0, 1.5]).unwrap())
        .initializer("wg", &f32s(&[3, 4], rng))
        .initializer("bg", &f32s(&[3], rng))
        .node(
            "conv1",
            "Conv",
            &["x", "w1", "b1"],
            &["c1"],
            vec![
                attr_ints("pads", &[1, 1, 1, 1]),
                attr_ints("strides", &[1, 1]),
                attr_ints("kernel_shape", &[3, 3]),
            ],
        )
        .node("relu1", "Relu", &["c1"], &["r1"], vec![])
        .node(
            "pool1",
            "MaxPool",
            &["r1"],
            &["p1"],
            vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2])],
        )
        .node(
            "dw",
            "Conv",
            &["p1", "w2"],
            &["c2"],
            vec![attr_int("group", 4), attr_ints("pads", &[1, 1, 1, 1])],
        )
        .node(
            "bn",
            "BatchNormalization",
            &["c2", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
            &["n2"],
            vec![attr_float("epsilon", 1e-5)],
        )
        .node("residual", "Add", &["n2", "p1"], &["res"], vec![])
        .node("gap", "GlobalAveragePool", &["res"], &["g"], vec![])
        .node("flatten", "Flatten", &["g"], &["f"], vec![attr_int("axis", 1)])
        .node("fc", "Gemm", &["f", "wg", "bg"], &["logits"], vec![attr_int("transB", 1)])
        .node("softmax", "Softmax", &["logits"], &["y"], vec![attr_int("axis", -1)])
        .output("y", DType::F32, &[1, 3])
}

/// Views and copies: reshape, outer-axis slices, concat, transpose, split, squeeze, gather,
/// pad, a reduction.
fn views_and_concat() -> OnnxModel {
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 3, 4])
        .initializer("shape", &i64s(&[2], &[6, 4]))
        .initializer("s0_starts", &i64s(&[1], &[0]))
        .initializer("s0_ends", &i64s(&[1], &[3]))
        .initializer("s1_starts", &i64s(&[1], &[3]))
        .initializer("s1_ends", &i64s(&[1], &[6]))
        .initializer("axes0", &i64s(&[1], &[0]))
        .initializer("split", &i64s(&[2], &[2, 2]))
        .initializer("indices", &i64s(&[2], &[1, 0]))
        .initializer("pads", &i64s(&[4], &[0, 1, 0, 1]))
        .node("reshape", "Reshape", &["x", "shape"], &["r"], vec![])
        .node("top", "Slice", &["r", "s0_starts", "s0_ends", "axes0"], &["s0"], vec![])
        .node("bottom", "Slice", &["r", "s1_starts", "s1_ends", "axes0"], &["s1"], vec![])
        .node("relu", "Relu", &["s0"], &["a"], vec![])
        .node("neg", "Neg", &["s1"], &["b"], vec![])
        .node("concat", "Concat", &["a", "b"], &["c"], vec![attr_int("axis", 0)])
        .node("transpose", "Transpose", &["c"], &["t"], vec![attr_ints("perm", &[1, 0])])
        .node("split", "Split", &["t", "split"], &["t0", "t1"], vec![attr_int("axis", 0)])
        .node("unsqueeze", "Unsqueeze", &["t0", "axes0"], &["u"], vec![])
        .node("squeeze", "Squeeze", &["u", "axes0"], &["sq"], vec![])
        .node("mul", "Mul", &["sq", "t1"], &["m"], vec![])
        .node("gather", "Gather", &["m", "indices"], &["g"], vec![attr_int("axis", 0)])
        .node("pad", "Pad", &["g", "pads"], &["pd"], vec![attr_string("mode", "constant")])
        .node(
            "mean",
            "ReduceMean",
            &["pd"],
            &["rm"],
            vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)],
        )
        .output("pd", DType::F32, &[2, 8])
        .output("rm", DType::F32, &[2])
}

/// Several inputs (one of them integer ids) and outputs, one of which is also read by other
/// steps, one a graph input passed through, one an integer.
fn multi_output() -> OnnxModel {
    let rng = &mut Rng::new(2);
    OnnxModel::new(OPSET)
        .input("a", DType::F32, &[2, 4])
        .input("b", DType::F32, &[4])
        .input("ids", DType::I64, &[3])
        .initializer("w", &f32s(&[4, 3], rng))
        .initializer("emb", &f32s(&[5, 4], rng))
        .initializer("gamma", &f32s(&[4], rng))
        .initializer("beta", &f32s(&[4], rng))
        .initializer("halves", &i64s(&[2], &[2, 2]))
        .node("add", "Add", &["a", "b"], &["sum"], vec![])
        .node("sigmoid", "Sigmoid", &["sum"], &["sig"], vec![])
        .node("split", "Split", &["sum", "halves"], &["h0", "h1"], vec![attr_int("axis", 1)])
        .node("matmul", "MatMul", &["a", "w"], &["mm"], vec![])
        .node("embed", "Gather", &["emb", "ids"], &["e"], vec![attr_int("axis", 0)])
        .node(
            "argmax",
            "ArgMax",
            &["sum"],
            &["am"],
            vec![attr_int("axis", 1), attr_int("keepdims", 0)],
        )
        .node(
            "layernorm",
            "LayerNormalization",
            &["a", "gamma", "beta"],
            &["ln"],
            vec![attr_int("axis", -1), attr_float("epsilon", 1e-5)],
        )
        .output("sum", DType::F32, &[2, 4])
        .output("sig", DType::F32, &[2, 4])
        .output("h0", DType::F32, &[2, 2])
        .output("h1", DType::F32, &[2, 2])
        .output("mm", DType::F32, &[2, 3])
        .output("e", DType::F32, &[3, 4])
        .output("a", DType::F32, &[2, 4])
        .output("am", DType::I64, &[2])
        .output("ln", DType::F32, &[2, 4])
}

/// The other families: resize, average pool, instance norm, transposed conv, reductions, clip,
/// tile, depth-to-space, cumsum, cast, where-free comparisons.
fn assorted() -> OnnxModel {
    let rng = &mut Rng::new(3);
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[1, 2, 4, 4])
        .initializer("scales", &Tensor::from_vec(vec![4], &[1.0f32, 1.0, 2.0, 2.0]).unwrap())
        .initializer("in_scale", &f32s(&[2], rng))
        .initializer("in_bias", &f32s(&[2], rng))
        .initializer("wt", &f32s(&[2, 4, 2, 2], rng))
        .initializer("sum_axes", &i64s(&[2], &[2, 3]))
        .initializer("lo", &Tensor::from_vec(vec![], &[-0.5f32]).unwrap())
        .initializer("hi", &Tensor::from_vec(vec![], &[0.5f32]).unwrap())
        .initializer("repeats", &i64s(&[4], &[1, 1, 2, 2]))
        .initializer("cum_axis", &i64s(&[], &[3]))
        .node(
            "resize",
            "Resize",
            &["x", "", "scales"],
            &["up"],
            vec![attr_string("mode", "nearest")],
        )
        .node(
            "avgpool",
            "AveragePool",
            &["up"],
            &["ap"],
            vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2])],
        )
        .node(
            "instnorm",
            "InstanceNormalization",
            &["ap", "in_scale", "in_bias"],
            &["inorm"],
            vec![attr_float("epsilon", 1e-5)],
        )
        .node(
            "deconv",
            "ConvTranspose",
            &["inorm", "wt"],
            &["dc"],
            vec![attr_ints("strides", &[2, 2])],
        )
        .node("clip", "Clip", &["dc", "lo", "hi"], &["cl"], vec![])
        .node("reducesum", "ReduceSum", &["cl", "sum_axes"], &["rs"], vec![attr_int("keepdims", 1)])
        .node("tile", "Tile", &["rs", "repeats"], &["tl"], vec![])
        .node(
            "d2s",
            "DepthToSpace",
            &["cl"],
            &["ds"],
            vec![attr_int("blocksize", 2), attr_string("mode", "CRD")],
        )
        .node("cumsum", "CumSum", &["ds", "cum_axis"], &["cs"], vec![])
        .node("less", "Less", &["cs", "hi"], &["mask"], vec![])
        .node("cast", "Cast", &["mask"], &["mf"], vec![attr_int("to", 1)])
        .node("logsoftmax", "LogSoftmax", &["mf"], &["ls"], vec![attr_int("axis", 3)])
        .output("tl", DType::F32, &[1, 4, 2, 2])
        .output("ls", DType::F32, &[1, 1, 16, 16])
}

/// A GRU over a short sequence (both outputs kept).
fn recurrent() -> OnnxModel {
    let rng = &mut Rng::new(4);
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[3, 1, 4])
        .initializer("W", &f32s(&[1, 9, 4], rng))
        .initializer("R", &f32s(&[1, 9, 3], rng))
        .initializer("B", &f32s(&[1, 18], rng))
        .node("gru", "GRU", &["x", "W", "R", "B"], &["y", "y_h"], vec![attr_int("hidden_size", 3)])
        .output("y", DType::F32, &[3, 1, 1, 3])
        .output("y_h", DType::F32, &[1, 1, 3])
}

/// Index-driven ops (gathers, scatters, one-hot), Trilu, Expand, Where, Einsum, and
/// ConstantOfShape and Range (folded at compile time).
fn indexing() -> OnnxModel {
    let rng = &mut Rng::new(5);
    let f = |v: f32| Tensor::from_vec(vec![], &[v]).unwrap();
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 3, 4])
        .initializer("ge_idx", &i64s(&[2, 3, 2], &[0, 3, 1, 2, 2, 1, 3, 0, 0, 0, 1, 1]))
        .initializer("gnd_idx", &i64s(&[2, 1], &[1, 0]))
        .initializer("snd_idx", &i64s(&[1, 1], &[0]))
        .initializer("snd_upd", &f32s(&[1, 3, 4], rng))
        .initializer("se_idx", &i64s(&[2, 3, 1], &[0, 1, 2, 3, 2, 1]))
        .initializer("se_upd", &f32s(&[2, 3, 1], rng))
        .initializer("oh_idx", &i64s(&[3], &[0, 2, 1]))
        .initializer("depth", &i64s(&[], &[4]))
        .initializer("oh_values", &Tensor::from_vec(vec![2], &[0.0f32, 1.0]).unwrap())
        .initializer("k", &i64s(&[], &[1]))
        .initializer("expand_to", &i64s(&[3], &[2, 3, 4]))
        .initializer("cos_shape", &i64s(&[3], &[2, 3, 4]))
        .initializer("start", &f(0.0))
        .initializer("limit", &f(4.0))
        .initializer("delta", &f(1.0))
        .node(
            "gather_elements",
            "GatherElements",
            &["x", "ge_idx"],
            &["ge"],
            vec![attr_int("axis", 2)],
        )
        .node("gather_nd", "GatherND", &["x", "gnd_idx"], &["gnd"], vec![])
        .node("scatter_nd", "ScatterND", &["gnd", "snd_idx", "snd_upd"], &["snd"], vec![])
        .node(
            "scatter_elements",
            "ScatterElements",
            &["snd", "se_idx", "se_upd"],
            &["se"],
            vec![attr_int("axis", 2), attr_string("reduction", "add")],
        )
        .node(
            "one_hot",
            "OneHot",
            &["oh_idx", "depth", "oh_values"],
            &["oh"],
            vec![attr_int("axis", -1)],
        )
        .node("trilu", "Trilu", &["oh", "k"], &["tri"], vec![attr_int("upper", 1)])
        .node("expand", "Expand", &["tri", "expand_to"], &["ex"], vec![])
        .node("greater", "Greater", &["se", "ex"], &["cond"], vec![])
        .node("where", "Where", &["cond", "se", "ex"], &["wh"], vec![])
        .node(
            "einsum",
            "Einsum",
            &["wh", "x"],
            &["es"],
            vec![attr_string("equation", "bij,bkj->bik")],
        )
        .node(
            "constant_of_shape",
            "ConstantOfShape",
            &["cos_shape"],
            &["half"],
            vec![ingot_tests::model::attr_tensor(
                "value",
                &Tensor::from_vec(vec![1], &[0.5f32]).unwrap(),
            )],
        )
        .node("range", "Range", &["start", "limit", "delta"], &["r"], vec![])
        .node("add_half", "Add", &["wh", "half"], &["wh2"], vec![])
        .node("add_range", "Add", &["wh2", "r"], &["y"], vec![])
        .output("ge", DType::F32, &[2, 3, 2])
        .output("es", DType::F32, &[2, 3, 3])
        .output("y", DType::F32, &[2, 3, 4])
}

/// The norm, pool, reduce and activation kernels the other models do not use.
fn norms_and_reductions() -> OnnxModel {
    let rng = &mut Rng::new(6);
    let f = |v: f32| Tensor::from_vec(vec![], &[v]).unwrap();
    OnnxModel::new(18)
        .input("x", DType::F32, &[1, 4, 6, 6])
        .initializer("gn_scale", &f32s(&[2], rng))
        .initializer("gn_bias", &f32s(&[2], rng))
        .initializer("hw", &i64s(&[2], &[2, 3]))
        .initializer("channels", &i64s(&[1], &[1]))
        .initializer("up", &Tensor::from_vec(vec![4], &[1.0f32, 1.0, 1.5, 1.5]).unwrap())
        .initializer("down", &i64s(&[4], &[1, 4, 4, 4]))
        .initializer("lo", &f(-0.5))
        .initializer("hi", &f(0.5))
        .initializer("three", &f(3.0))
        .node("lrn", "LRN", &["x"], &["lrn"], vec![attr_int("size", 3), attr_float("alpha", 1e-3)])
        .node(
            "groupnorm",
            "GroupNormalization",
            &["lrn", "gn_scale", "gn_bias"],
            &["gn"],
            vec![attr_int("num_groups", 2)],
        )
        .node(
            "mvn",
            "MeanVarianceNormalization",
            &["gn"],
            &["mvn"],
            vec![attr_ints("axes", &[0, 2, 3])],
        )
        .node(
            "lppool",
            "LpPool",
            &["mvn"],
            &["lp"],
            vec![
                attr_int("p", 2),
                attr_ints("kernel_shape", &[2, 2]),
                attr_ints("strides", &[2, 2]),
            ],
        )
        .node("global_lp", "GlobalLpPool", &["lp"], &["glp"], vec![])
        .node("global_max", "GlobalMaxPool", &["mvn"], &["gmp"], vec![])
        .node("sum", "Sum", &["glp", "gmp"], &["pooled"], vec![])
        .node("linear", "Resize", &["mvn", "", "up"], &["lin"], vec![attr_string("mode", "linear")])
        .node(
            "cubic",
            "Resize",
            &["lin", "", "", "down"],
            &["cub"],
            vec![attr_string("mode", "cubic"), attr_int("antialias", 1)],
        )
        .node("elu", "Elu", &["cub"], &["elu"], vec![attr_float("alpha", 0.5)])
        .node("hard_sigmoid", "HardSigmoid", &["elu"], &["hs"], vec![attr_float("alpha", 0.3)])
        .node("leaky", "LeakyRelu", &["hs"], &["lk"], vec![attr_float("alpha", 0.1)])
        .node("clip", "Clip", &["lk", "lo", "hi"], &["cl"], vec![])
        .node("mod", "Mod", &["cl", "three"], &["md"], vec![attr_int("fmod", 1)])
        .node("prod", "ReduceProd", &["md", "hw"], &["rp"], vec![])
        .node("l2", "ReduceL2", &["md", "hw"], &["rl2"], vec![])
        .node(
            "logsumexp",
            "ReduceLogSumExp",
            &["md", "channels"],
            &["lse"],
            vec![attr_int("keepdims", 0)],
        )
        .node(
            "argmin",
            "ArgMin",
            &["md"],
            &["am"],
            vec![attr_int("axis", 3), attr_int("select_last_index", 1)],
        )
        .node("hardmax", "Hardmax", &["md"], &["hm"], vec![attr_int("axis", 1)])
        .node("max", "Max", &["rp", "rl2", "pooled"], &["mx"], vec![])
        .output("mx", DType::F32, &[1, 4, 1, 1])
        .output("lse", DType::F32, &[1, 4, 4])
        .output("am", DType::I64, &[1, 4, 4, 1])
        .output("hm", DType::F32, &[1, 4, 4, 4])
}

/// An LSTM with peepholes, then a plain RNN.
fn recurrent_lstm() -> OnnxModel {
    let rng = &mut Rng::new(7);
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[3, 2, 4])
        .initializer("W", &f32s(&[1, 12, 4], rng))
        .initializer("R", &f32s(&[1, 12, 3], rng))
        .initializer("B", &f32s(&[1, 24], rng))
        .initializer("P", &f32s(&[1, 9], rng))
        .initializer("Wr", &f32s(&[2, 2, 3], rng))
        .initializer("Rr", &f32s(&[2, 2, 2], rng))
        .initializer("axes", &i64s(&[1], &[1]))
        .node(
            "lstm",
            "LSTM",
            &["x", "W", "R", "B", "", "", "", "P"],
            &["y", "y_h", "y_c"],
            vec![attr_int("hidden_size", 3)],
        )
        .node("squeeze", "Squeeze", &["y", "axes"], &["ys"], vec![])
        .node(
            "rnn",
            "RNN",
            &["ys", "Wr", "Rr"],
            &["yr"],
            vec![attr_int("hidden_size", 2), attr_string("direction", "bidirectional")],
        )
        .output("yr", DType::F32, &[3, 2, 2, 2])
        .output("y_c", DType::F32, &[1, 2, 3])
}

/// An `If` decided at run time around a `Loop` with a constant trip count, then a `Scan`:
/// what the control-flow expansion and the importer's subgraph handling read.
fn control_flow() -> OnnxModel {
    let rng = &mut Rng::new(8);
    let branch = |op: &str| {
        OnnxModel::new(OPSET).node(&format!("{op}_b"), op, &["x"], &["t"], vec![]).output(
            "t",
            DType::F32,
            &[2, 3],
        )
    };
    let loop_body = OnnxModel::new(OPSET)
        .input("i", DType::I64, &[])
        .input("c", DType::Bool, &[])
        .input("acc", DType::F32, &[2, 3])
        .node("step", "Add", &["acc", "w"], &["acc_out"], vec![])
        .node("keep", "Identity", &["c"], &["c_out"], vec![])
        .node("scanned", "Neg", &["acc_out"], &["acc_scan"], vec![])
        .output("c_out", DType::Bool, &[])
        .output("acc_out", DType::F32, &[2, 3])
        .output("acc_scan", DType::F32, &[2, 3]);
    let scan_body = OnnxModel::new(OPSET)
        .input("s", DType::F32, &[3])
        .input("row", DType::F32, &[3])
        .node("sum", "Add", &["s", "row"], &["s_out"], vec![])
        .node("scaled", "Mul", &["s_out", "row"], &["s_scan"], vec![])
        .output("s_out", DType::F32, &[3])
        .output("s_scan", DType::F32, &[3]);
    let yes = Tensor::from_bools(Vec::<usize>::new(), &[true]).expect("one bool");
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[2, 3])
        .input("cond", DType::Bool, &[])
        .initializer("w", &f32s(&[2, 3], rng))
        .initializer("s0", &f32s(&[3], rng))
        .initializer("trips", &i64s(&[], &[3]))
        .initializer("yes", &yes)
        .if_node("if", "cond", "y", &branch("Relu"), &branch("Neg"))
        .node(
            "loop",
            "Loop",
            &["trips", "yes", "y"],
            &["z", "zs"],
            vec![attr_graph("body", &loop_body)],
        )
        .node(
            "scan",
            "Scan",
            &["s0", "z"],
            &["s_final", "ss"],
            vec![attr_graph("body", &scan_body), attr_int("num_scan_inputs", 1)],
        )
        .output("zs", DType::F32, &[3, 2, 3])
        .output("s_final", DType::F32, &[3])
        .output("ss", DType::F32, &[2, 3])
}

fn models() -> Vec<(&'static str, OnnxModel)> {
    vec![
        ("conv_net", conv_net()),
        ("views_and_concat", views_and_concat()),
        ("multi_output", multi_output()),
        ("assorted", assorted()),
        ("recurrent", recurrent()),
        ("indexing", indexing()),
        ("norms_and_reductions", norms_and_reductions()),
        ("recurrent_lstm", recurrent_lstm()),
        ("control_flow", control_flow()),
    ]
}

// ---------------------------------------------------------------------------------------------
// Running a case.

/// How far a case got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Compiling the ONNX model failed (ONNX cases only).
    CompileError,
    OpenError,
    SessionError,
    RunError,
    Ran,
    /// Not run: it would allocate more than the limits above.
    TooLarge,
}

/// The cases `0..n`; only the case `INGOT_HOSTILE_CASE` names (to reproduce one), or
/// `INGOT_HOSTILE_SCALE` times as many (for a longer search).
fn cases(n: u64) -> Vec<u64> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match (var("INGOT_HOSTILE_CASE"), var("INGOT_HOSTILE_SCALE")) {
        (Some(case), _) => vec![case],
        (None, scale) => (0..n * scale.unwrap_or(1)).collect(),
    }
}

/// Prints `line` when `INGOT_HOSTILE_TRACE` is set: every case before it runs, and how it
/// failed, so that a case that aborts the process (which no test can catch) can be found.
fn trace(line: impl std::fmt::Display) {
    if std::env::var_os("INGOT_HOSTILE_TRACE").is_some() {
        eprintln!("{line}");
    }
}

/// `stage`, after tracing `error`.
fn traced(stage: Stage, error: impl std::fmt::Display) -> Stage {
    trace(format_args!("  {stage:?}: {error}"));
    stage
}

/// Tallies of stages, and the cases that panicked.
#[derive(Default)]
struct Tally {
    counts: std::collections::BTreeMap<Stage, usize>,
    panics: Vec<String>,
}

impl Tally {
    /// Runs the case described by `what`.
    fn case(&mut self, what: String, run: impl FnOnce() -> Result<Stage, String>) {
        trace(&what);
        match run() {
            Ok(stage) => *self.counts.entry(stage).or_default() += 1,
            Err(panic) => self.panics.push(format!("{what}: {panic}")),
        }
    }

    /// Prints the tallies and fails listing every panic.
    fn finish(self, test: &str) {
        let total: usize = self.counts.values().sum::<usize>() + self.panics.len();
        eprintln!("{test}: {total} cases: {:?}", self.counts);
        assert!(
            self.panics.is_empty(),
            "{test}: {} of {total} cases panicked:\n  {}",
            self.panics.len(),
            self.panics.join("\n  ")
        );
    }
}

/// Values for an input: small numbers (integers in 0..3, so that they are valid ids for the
/// models above).
fn input_value(info: &IoInfo, rng: &mut Rng) -> Tensor {
    let mut t = Tensor::zeros(info.desc.clone());
    let bytes = t.bytes_mut();
    let size = info.desc.dtype.size();
    for chunk in bytes.chunks_mut(size) {
        let small = rng.below(3) as u8;
        match info.desc.dtype {
            DType::F32 => {
                chunk.copy_from_slice(&((rng.below(2001) as f32 - 1000.0) / 500.0).to_le_bytes())
            }
            DType::F64 => {
                chunk.copy_from_slice(&((rng.below(2001) as f64 - 1000.0) / 500.0).to_le_bytes())
            }
            DType::F16 => chunk.copy_from_slice(&half::f16::from_f32(small as f32).to_le_bytes()),
            // Integers and bools: `small` in the lowest byte, little endian.
            DType::Bool => chunk[0] = small & 1,
            _ => chunk[0] = small,
        }
    }
    t
}

/// Whether the first variant has a tensor or an arena whose size is in [`TOO_LARGE`].
fn too_large(m: &Manifest) -> bool {
    let Some(v) = m.variants.first() else {
        return false;
    };
    let arena = v.plan.as_ref().map_or(0, |p| p.arena_bytes);
    let tensors = v.tensors.iter().map(|t| {
        let size = ingot_runtime::bundle::tensor_desc(t).dtype.size() as u128;
        t.shape.iter().fold(size, |acc, &d| acc.saturating_mul(u128::from(d)))
    });
    std::iter::once(u128::from(arena)).chain(tensors).any(|bytes| TOO_LARGE.contains(&bytes))
}

/// Sessions on the CPU alone: the Vulkan backend hands the bundle's SPIR-V to the driver, which
/// trusts it like code (no SPIR-V validator in the runtime), so hostile kernel bytes are out of
/// its scope; the manifest checks that guard it are unit-tested in runtime/src/bundle.rs.
fn cpu_only() -> SessionOptions {
    SessionOptions { devices: vec![ingot_runtime::Device::Cpu], ..SessionOptions::default() }
}

/// Opens `bytes`, creates a session and runs it with inputs of the declared types; returns how
/// far it got, or the panic.
fn open_and_run(bytes: &[u8], seed: u64) -> Result<Stage, String> {
    catch_panic(|| {
        let bundle = match Bundle::from_bytes(bytes) {
            Ok(bundle) => bundle,
            Err(e) => return traced(Stage::OpenError, e),
        };
        if too_large(bundle.manifest()) {
            return Stage::TooLarge;
        }
        let mut session = match Session::new(Arc::new(bundle), cpu_only()) {
            Ok(session) => session,
            Err(e) => return traced(Stage::SessionError, e),
        };
        // Inputs are made here: a huge one is not (outputs are the session's to refuse).
        let input_bytes = session.inputs().iter().try_fold(0usize, |acc, i| {
            let elements = i.desc.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            acc.checked_add(elements?.checked_mul(i.desc.dtype.size())?)
        });
        if input_bytes.is_none_or(|b| TOO_LARGE.start <= b as u128) {
            return Stage::TooLarge;
        }
        let rng = &mut Rng::new(seed);
        let inputs: Vec<Tensor> =
            session.inputs().iter().map(|info| input_value(info, rng)).collect();
        match session.run(&inputs) {
            Ok(outputs) => {
                let declared: Vec<&TensorDesc> =
                    session.outputs().iter().map(|o| &o.desc).collect();
                let got: Vec<&TensorDesc> = outputs.iter().map(Tensor::desc).collect();
                assert_eq!(got, declared, "run returned outputs other than declared");
                Stage::Ran
            }
            Err(e) => traced(Stage::RunError, e),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Bundles.

/// A compiled model, taken apart: its manifest, kernels and weights sections.
struct Compiled {
    name: &'static str,
    manifest: Manifest,
    kernels: Vec<u8>,
    weights: Vec<u8>,
}

fn compiled_models(dir: &Path) -> Vec<Compiled> {
    models()
        .into_iter()
        .map(|(name, model)| {
            let path = dir.join(format!("{name}.onnx"));
            model.write(&path).unwrap();
            let bytes = compile(&path, &[]).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            // The unmutated bundle runs.
            assert_eq!(open_and_run(&bytes, 0), Ok(Stage::Ran), "{name}");
            let c = Container::parse(&bytes).unwrap();
            let section =
                |kind| c.section(kind).map_or(&[][..], |s| &bytes[s.range.clone()]).to_vec();
            Compiled {
                name,
                manifest: Manifest::decode(section(SectionKind::Manifest).as_slice()).unwrap(),
                kernels: section(SectionKind::Kernels),
                weights: section(SectionKind::Weights),
            }
        })
        .collect()
}

/// A valid container holding `manifest` bytes and `weights`.
fn bundle_bytes(manifest: &[u8], kernels: &[u8], weights: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    container::write(
        &mut out,
        &[
            (SectionKind::Manifest, manifest),
            (SectionKind::Kernels, kernels),
            (SectionKind::Weights, weights),
        ],
    )
    .unwrap();
    out
}

const DTYPE_CODES: &[i32] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 99, -1];

const TEXTS: &[&str] = &[
    "",
    "constant",
    "reflect",
    "edge",
    "wrap",
    "nearest",
    "linear",
    "cubic",
    "NOTSET",
    "SAME_UPPER",
    "SAME_LOWER",
    "VALID",
    "half_pixel",
    "asymmetric",
    "align_corners",
    "round_prefer_floor",
    "floor",
    "DCR",
    "CRD",
    "Sigmoid,Tanh,Tanh",
    "Relu",
    "forward",
    "reverse",
    "bidirectional",
    "none",
    "tanh",
    "\u{0}",
    "bogus",
];

/// Attribute names kernels read, for attributes added out of nowhere.
const ATTR_NAMES: &[&str] = &[
    "axis",
    "axes",
    "pads",
    "kernel_shape",
    "strides",
    "dilations",
    "group",
    "perm",
    "keepdims",
    "mode",
    "alpha",
    "beta",
    "epsilon",
    "transA",
    "transB",
    "split",
    "starts",
    "ends",
    "steps",
    "shape",
    "to",
    "value",
    "blocksize",
    "hidden_size",
    "direction",
    "output_padding",
    "auto_pad",
    "ceil_mode",
    "count_include_pad",
    "scales",
    "sizes",
];

fn wild_attr_value(rng: &mut Rng) -> Option<Value> {
    Some(match rng.below(6) {
        0 => Value::Int(rng.wild_i64(1)),
        1 => Value::Float(rng.wild_f64(1.0)),
        2 => Value::Text(rng.pick(TEXTS).to_string()),
        3 => Value::Ints(proto::Ints {
            values: (0..rng.below(6)).map(|_| rng.wild_i64(2)).collect(),
        }),
        4 => Value::Floats(proto::Floats {
            values: (0..rng.below(6)).map(|_| rng.wild_f64(1.0)).collect(),
        }),
        _ => return None,
    })
}

/// Mutates one attribute value in place, keeping its kind.
fn mutate_value(value: &mut Option<Value>, rng: &mut Rng) -> String {
    match value {
        Some(Value::Int(i)) => {
            let old = *i;
            *i = rng.wild_i64(old);
            format!("int {old} -> {i}")
        }
        Some(Value::Float(f)) => {
            let old = *f;
            *f = rng.wild_f64(old);
            format!("float {old} -> {f}")
        }
        Some(Value::Text(s)) => {
            let old = std::mem::replace(s, rng.pick(TEXTS).to_string());
            format!("text {old:?} -> {s:?}")
        }
        Some(Value::Ints(v)) => {
            let old = v.values.clone();
            let v = &mut v.values;
            match rng.below(5) {
                0 if !v.is_empty() => {
                    let k = rng.below(v.len());
                    v[k] = rng.wild_i64(v[k]);
                }
                1 => v.push(rng.wild_i64(1)),
                2 => {
                    v.pop();
                }
                3 => v.clear(),
                _ => {
                    for x in v.iter_mut() {
                        *x = rng.wild_i64(*x);
                    }
                }
            }
            format!("ints {old:?} -> {v:?}")
        }
        Some(Value::Floats(v)) => {
            let old = v.values.clone();
            let v = &mut v.values;
            match rng.below(4) {
                0 if !v.is_empty() => {
                    let k = rng.below(v.len());
                    v[k] = rng.wild_f64(v[k]);
                }
                1 => v.push(rng.wild_f64(1.0)),
                2 => {
                    v.pop();
                }
                _ => v.clear(),
            }
            format!("floats {old:?} -> {v:?}")
        }
        None => {
            *value = wild_attr_value(rng);
            format!("no value -> {value:?}")
        }
    }
}

fn mutate_attributes(step: &mut proto::Step, rng: &mut Rng) -> String {
    let attrs = &mut step.attributes;
    if attrs.is_empty() || rng.one_in(6) {
        let name = rng.pick(ATTR_NAMES).to_string();
        let value = wild_attr_value(rng);
        let what = format!("add attribute {name} = {value:?}");
        attrs.push(proto::Attribute { name, value });
        return what;
    }
    let k = rng.below(attrs.len());
    let a = &mut attrs[k];
    match rng.below(10) {
        0 => {
            let old = std::mem::replace(&mut a.value, wild_attr_value(rng));
            format!("attribute {}: {old:?} -> {:?}", a.name, a.value)
        }
        1 => {
            let name = attrs.remove(k).name;
            format!("remove attribute {name}")
        }
        2 => {
            let old = std::mem::replace(&mut a.name, rng.pick(ATTR_NAMES).to_string());
            format!("rename attribute {old} -> {}", a.name)
        }
        _ => format!("attribute {}: {}", a.name, mutate_value(&mut a.value, rng)),
    }
}

fn wild_storage(rng: &mut Rng, v: &proto::Variant) -> Option<proto::Storage> {
    let n = v.tensors.len();
    let arena = v.plan.as_ref().map_or(0, |p| p.arena_bytes);
    let boundary = v.plan.as_ref().map_or(0, |p| p.boundary_bytes);
    let kind = match rng.below(8) {
        6 => Kind::Boundary(rng.wild_u64(boundary) & !7),
        0 => Kind::Input(rng.wild_index(v.inputs.len())),
        1 => Kind::Output(rng.wild_index(v.outputs.len())),
        2 => Kind::Weight(rng.wild_index(4)),
        3 => Kind::Arena(rng.wild_u64(arena / 2) & !7),
        4 => Kind::Arena(rng.wild_u64(arena)),
        5 => Kind::View(proto::View { of: rng.wild_index(n), byte_offset: rng.wild_u64(0) }),
        _ => {
            return if rng.one_in(2) { None } else { Some(proto::Storage { kind: None }) };
        }
    };
    Some(proto::Storage { kind: Some(kind) })
}

/// One structured mutation of the first variant (or of the manifest); returns what it did.
fn mutate_manifest(m: &mut Manifest, rng: &mut Rng) -> String {
    let n_weights = m.weights.len();
    let Some(v) = m.variants.first_mut() else {
        return "no variant left".into();
    };
    let n = v.tensors.len();
    let ops = ingot_ops::supported_ops();
    // Weighted towards what reaches kernels: attributes, shapes and op names.
    match rng.below(40) {
        0..=11 if !v.steps.is_empty() => {
            let s = rng.below(v.steps.len());
            let step = &mut v.steps[s];
            let what = mutate_attributes(step, rng);
            format!("step {s} '{}' ({}): {what}", step.name, step.op)
        }
        12..=17 if n > 0 => {
            let t = rng.below(n);
            let tensor = &mut v.tensors[t];
            let old = tensor.shape.clone();
            let shape = &mut tensor.shape;
            match rng.below(8) {
                0 => shape.push(rng.pick(&[0, 1, 2])),
                1 => {
                    shape.pop();
                }
                2 if !shape.is_empty() => {
                    let k = rng.below(shape.len());
                    shape[k] = rng.pick(&[0, 1]);
                }
                // The same bytes in another shape: the bundle stays valid, and only the kernels
                // can tell that the shapes of a step no longer agree.
                3 => shape.reverse(),
                4 if shape.len() > 1 => {
                    let k = rng.below(shape.len() - 1);
                    let merged = shape[k].saturating_mul(shape[k + 1]);
                    shape.splice(k..k + 2, [merged]);
                }
                _ if !shape.is_empty() => {
                    let k = rng.below(shape.len());
                    shape[k] = rng.wild_u64(shape[k]);
                }
                _ => shape.push(rng.wild_u64(1)),
            }
            format!("tensor {t} '{}' shape {old:?} -> {shape:?}", tensor.name)
        }
        18..=19 if n > 0 => {
            let t = rng.below(n);
            let tensor = &mut v.tensors[t];
            let old = tensor.dtype;
            tensor.dtype = rng.pick(DTYPE_CODES);
            format!("tensor {t} '{}' dtype {old} -> {}", tensor.name, tensor.dtype)
        }
        20..=22 if !v.steps.is_empty() => {
            let s = rng.below(v.steps.len());
            let step = &mut v.steps[s];
            let old = std::mem::take(&mut step.op);
            step.op = if rng.one_in(8) {
                rng.pick(&["", "Frobnicate", "relu", "Conv\u{0}"]).to_string()
            } else {
                rng.pick(&ops).to_string()
            };
            format!("step {s} '{}' op {old} -> {}", step.name, step.op)
        }
        23..=25 if !v.steps.is_empty() => {
            let s = rng.below(v.steps.len());
            let step = &mut v.steps[s];
            let outputs = rng.one_in(3);
            let list = if outputs { &mut step.outputs } else { &mut step.inputs };
            let what = if list.is_empty() || rng.one_in(4) {
                let t = rng.wild_index(n);
                list.push(t);
                format!("push {t}")
            } else if rng.one_in(4) {
                format!("remove {}", list.remove(rng.below(list.len())))
            } else {
                let k = rng.below(list.len());
                let old = list[k];
                list[k] = rng.wild_index(n);
                format!("slot {k}: {old} -> {}", list[k])
            };
            let side = if outputs { "outputs" } else { "inputs" };
            format!("step {s} '{}' ({}) {side}: {what}", step.name, step.op)
        }
        26..=27 if n > 0 => {
            let t = rng.below(n);
            let storage = wild_storage(rng, v);
            let tensor = &mut v.tensors[t];
            let old = std::mem::replace(&mut tensor.storage, storage);
            format!("tensor {t} '{}' storage {old:?} -> {:?}", tensor.name, tensor.storage)
        }
        28 if n > 0 => {
            // Nudge what is already there: arena offsets and views stay plausible.
            let t = rng.below(n);
            let tensor = &mut v.tensors[t];
            let what = match tensor.storage.as_mut().and_then(|s| s.kind.as_mut()) {
                Some(Kind::Arena(off) | Kind::Boundary(off)) => {
                    let old = *off;
                    *off = rng.wild_u64(old);
                    format!("arena or boundary offset {old} -> {off}")
                }
                Some(Kind::View(view)) => {
                    let old = *view;
                    if rng.one_in(2) {
                        view.byte_offset = rng.wild_u64(view.byte_offset);
                    } else {
                        view.of = rng.wild_index(n);
                    }
                    format!("view {old:?} -> {view:?}")
                }
                Some(Kind::Input(k) | Kind::Output(k) | Kind::Weight(k)) => {
                    let old = *k;
                    *k = rng.wild_index(old as usize + 1);
                    format!("storage index {old} -> {k}")
                }
                None => "nothing (no storage)".into(),
            };
            format!("tensor {t} '{}' {what}", tensor.name)
        }
        29 if n_weights > 0 => {
            let w = rng.below(n_weights);
            let weight = &mut m.weights[w];
            let old = weight.clone();
            match rng.below(4) {
                0 => weight.offset = rng.wild_u64(weight.offset),
                1 => weight.length = rng.wild_u64(weight.length),
                2 => weight.dtype = rng.pick(DTYPE_CODES),
                _ => {
                    if let Some(d) = weight.shape.first_mut() {
                        *d = rng.wild_u64(*d);
                    }
                }
            }
            format!("weight {w} {old:?} -> {weight:?}")
        }
        30..=31 => {
            let Some(plan) = v.plan.as_mut() else {
                return "nothing (no plan)".into();
            };
            match rng.below(6) {
                0 => {
                    let old = plan.arena_bytes;
                    plan.arena_bytes = rng.wild_u64(old);
                    format!("arena_bytes {old} -> {}", plan.arena_bytes)
                }
                1 => {
                    let old = plan.boundary_bytes;
                    plan.boundary_bytes = rng.wild_u64(old);
                    format!("boundary_bytes {old} -> {}", plan.boundary_bytes)
                }
                5 if !v.submodels.is_empty() => {
                    let k = rng.below(v.submodels.len());
                    let sub = &mut v.submodels[k];
                    let what = match rng.below(6) {
                        0 => {
                            sub.arena_bytes = rng.wild_u64(sub.arena_bytes);
                            "arena_bytes"
                        }
                        1 => {
                            sub.first_step = rng.wild_index(sub.first_step as usize + 1);
                            "first_step"
                        }
                        2 => {
                            sub.step_count = rng.wild_index(sub.step_count as usize + 1);
                            "step_count"
                        }
                        3 => {
                            sub.inputs.push(rng.wild_index(n));
                            "inputs"
                        }
                        4 => {
                            sub.outputs.clear();
                            "outputs"
                        }
                        _ => {
                            sub.allocation_count =
                                rng.wild_index(sub.allocation_count as usize + 2);
                            "allocation_count"
                        }
                    };
                    format!("submodel {k} {what} -> {sub:?}")
                }
                2 => {
                    let old = plan.alignment;
                    plan.alignment =
                        rng.pick(&[0, 1, 2, 3, 4, 8, 16, 24, 32, 128, 1 << 63, u64::MAX]);
                    format!("alignment {old} -> {}", plan.alignment)
                }
                3 if !plan.allocations.is_empty() => {
                    let k = rng.below(plan.allocations.len());
                    let a = &mut plan.allocations[k];
                    a.kind = rng.pick(&[0, 1, 2, 3, 4, -1]);
                    a.weight = rng.wild_index(n_weights);
                    format!("allocation {k} -> {a:?}")
                }
                _ => {
                    v.plan = None;
                    "remove the plan".into()
                }
            }
        }
        32..=34 if !v.steps.is_empty() => {
            let s = rng.below(v.steps.len());
            match rng.below(4) {
                0 => format!("remove step {s} '{}'", v.steps.remove(s).name),
                1 => {
                    let copy = v.steps[s].clone();
                    let at = rng.below(v.steps.len() + 1);
                    v.steps.insert(at, copy);
                    format!("copy step {s} to {at}")
                }
                2 => {
                    let other = rng.below(v.steps.len());
                    v.steps.swap(s, other);
                    format!("swap steps {s} and {other}")
                }
                _ => {
                    let op = rng.pick(&ops).to_string();
                    let inputs = (0..rng.below(4)).map(|_| rng.wild_index(n)).collect();
                    let outputs = (0..1 + rng.below(2)).map(|_| rng.wild_index(n)).collect();
                    let mut step = proto::Step {
                        op,
                        name: "intruder".into(),
                        inputs,
                        outputs,
                        attributes: Vec::new(),
                        ..Default::default()
                    };
                    for _ in 0..rng.below(3) {
                        mutate_attributes(&mut step, rng);
                    }
                    let what = format!("insert step {step:?} at {s}");
                    v.steps.insert(s, step);
                    what
                }
            }
        }
        35 if n > 0 => {
            let t = rng.below(n);
            if rng.one_in(2) {
                format!("remove tensor {t} '{}'", v.tensors.remove(t).name)
            } else {
                let copy = v.tensors[t].clone();
                v.tensors.push(copy);
                format!("copy tensor {t} to the end")
            }
        }
        36..=37 => {
            let outputs = rng.one_in(2);
            let list = if outputs { &mut v.outputs } else { &mut v.inputs };
            let what = match rng.below(4) {
                0 if !list.is_empty() => format!("remove {}", list.remove(rng.below(list.len()))),
                1 if !list.is_empty() => {
                    let k = rng.below(list.len());
                    list.push(list[k]);
                    format!("repeat slot {k}")
                }
                2 if list.len() > 1 => {
                    let k = rng.below(list.len() - 1);
                    list.swap(k, k + 1);
                    format!("swap slots {k} and {}", k + 1)
                }
                _ => {
                    let t = rng.wild_index(n);
                    list.push(t);
                    format!("push {t}")
                }
            };
            let side = if outputs { "outputs" } else { "inputs" };
            format!("variant {side}: {what}")
        }
        _ => match rng.below(4) {
            0 => {
                let copy = v.clone();
                m.variants.push(copy);
                "duplicate the variant (same name)".into()
            }
            1 => {
                m.variants.clear();
                "remove every variant".into()
            }
            2 => {
                let k = rng.below(n_weights.max(1));
                if n_weights > 0 && rng.one_in(2) {
                    m.weights.remove(k);
                    format!("remove weight {k}")
                } else {
                    m.weights.clear();
                    "remove every weight".into()
                }
            }
            _ => {
                v.name = rng.pick(&["", "main", "other"]).into();
                format!("rename the variant '{}'", v.name)
            }
        },
    }
}

/// Thousands of structured manifest mutations: none may panic.
#[test]
fn mutated_manifests_fail_cleanly() {
    let dir = scratch_dir("hostile/manifests");
    let bases = compiled_models(&dir);
    let mut tally = Tally::default();
    for case in cases(40_000) {
        let base = &bases[case as usize % bases.len()];
        let rng = &mut Rng::new(case);
        let mut manifest = base.manifest.clone();
        let mutations: Vec<String> =
            (0..1 + rng.below(3)).map(|_| mutate_manifest(&mut manifest, rng)).collect();
        let bytes = bundle_bytes(&manifest.encode_to_vec(), &base.kernels, &base.weights);
        tally.case(format!("case {case} ({}): {}", base.name, mutations.join("; ")), || {
            open_and_run(&bytes, case)
        });
    }
    tally.finish("mutated_manifests_fail_cleanly");
}

/// Manifests that are consistent in every index but claim memory nothing uses, or views whose
/// elements are misaligned, are refused when the bundle is opened.
#[test]
fn wasteful_or_misaligned_manifests_are_refused_at_open() {
    let dir = scratch_dir("hostile/manifest_rules");
    let bases = compiled_models(&dir);
    let open = |m: &Manifest, base: &Compiled| {
        let bytes = bundle_bytes(&m.encode_to_vec(), &base.kernels, &base.weights);
        Bundle::from_bytes(&bytes).map(|_| ()).map_err(|e| e.to_string())
    };
    for base in &bases {
        let mut m = base.manifest.clone();
        let plan = m.variants[0].plan.as_mut().unwrap();
        plan.arena_bytes += plan.alignment;
        let e = open(&m, base).unwrap_err();
        assert!(e.contains("arena"), "{}: {e}", base.name);

        let mut m = base.manifest.clone();
        let view = m.variants[0].tensors.iter_mut().find_map(|t| {
            match t.storage.as_mut().and_then(|s| s.kind.as_mut()) {
                Some(Kind::View(v)) if t.dtype == proto::DataType::F32 as i32 => Some(v),
                _ => None,
            }
        });
        if let Some(view) = view {
            view.byte_offset += 2;
            let e = open(&m, base).unwrap_err();
            assert!(e.contains("misaligns") || e.contains("exceeds"), "{}: {e}", base.name);
        }
    }
}

/// Bytes of the manifest flipped, inserted, cut (re-wrapped so the checksums hold, so that they
/// reach the protobuf decoder and the validator), and of the whole file (caught by the
/// container's checksums).
#[test]
fn corrupt_manifest_and_bundle_bytes_fail_cleanly() {
    let dir = scratch_dir("hostile/bundle_bytes");
    let bases = compiled_models(&dir);
    let mut tally = Tally::default();
    for case in 0..3000u64 {
        let base = &bases[case as usize % bases.len()];
        let rng = &mut Rng::new(case ^ 0xB0B);
        let mut manifest = base.manifest.encode_to_vec();
        let mut what = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(manifest.len());
            match rng.below(5) {
                0 => {
                    manifest.truncate(at);
                    what.push(format!("cut at {at}"));
                }
                1 => {
                    let byte = rng.next() as u8;
                    manifest.insert(at, byte);
                    what.push(format!("insert {byte:#x} at {at}"));
                }
                _ if !manifest.is_empty() => {
                    let bit = 1u8 << rng.below(8);
                    manifest[at] ^= bit;
                    what.push(format!("flip bit {bit:#x} at {at}"));
                }
                _ => {}
            }
        }
        let bytes = bundle_bytes(&manifest, &base.kernels, &base.weights);
        let what = format!("case {case} ({}): manifest bytes {}", base.name, what.join(", "));
        tally.case(what, || open_and_run(&bytes, case));
    }
    for base in &bases {
        let file = bundle_bytes(&base.manifest.encode_to_vec(), &base.kernels, &base.weights);
        let rng = &mut Rng::new(file.len() as u64);
        let mut cuts: Vec<usize> = (0..200).map(|_| rng.below(file.len())).collect();
        cuts.extend([0, 1, 63, 64, 65, 95, 96, file.len() - 1]);
        for len in cuts {
            tally.case(format!("{} cut to {len} bytes", base.name), || {
                open_and_run(&file[..len], 0)
            });
        }
        for _ in 0..300 {
            let mut bad = file.clone();
            let at = rng.below(bad.len());
            bad[at] ^= 1 << rng.below(8);
            tally.case(format!("{}: a bit flipped at byte {at}", base.name), || {
                open_and_run(&bad, 0)
            });
        }
    }
    tally.finish("corrupt_manifest_and_bundle_bytes_fail_cleanly");
}

// ---------------------------------------------------------------------------------------------
// ONNX models.

const ONNX_OPS: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "BatchNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "Gemm",
    "MatMul",
    "Relu",
    "Add",
    "Mul",
    "Softmax",
    "Flatten",
    "Reshape",
    "Slice",
    "Concat",
    "Transpose",
    "Split",
    "Squeeze",
    "Unsqueeze",
    "Gather",
    "Pad",
    "ReduceMean",
    "ReduceSum",
    "ArgMax",
    "Resize",
    "Clip",
    "Tile",
    "Expand",
    "DepthToSpace",
    "CumSum",
    "Cast",
    "LogSoftmax",
    "GRU",
    "LSTM",
    "Shape",
    "ConstantOfShape",
    "Range",
    "Einsum",
    "Where",
    "Constant",
    "Frobnicate",
];

/// Every value name the graph mentions.
fn value_names(m: &ModelProto) -> Vec<String> {
    let g = &m.graph;
    let mut names: Vec<String> = g.input.iter().map(|v| v.name.clone()).collect();
    names.extend(g.initializer.iter().map(|t| t.name.clone()));
    names.extend(g.node.iter().flat_map(|n| n.output.iter().cloned()));
    names
}

fn mutate_tensor(t: &mut TensorProto, rng: &mut Rng) -> String {
    match rng.below(7) {
        0 if !t.dims.is_empty() => {
            let k = rng.below(t.dims.len());
            let old = t.dims[k];
            t.dims[k] = rng.wild_i64(old);
            format!("dim {k} {old} -> {}", t.dims[k])
        }
        1 => {
            let old = t.data_type;
            t.data_type = rng.pick(DTYPE_CODES);
            format!("data_type {old} -> {}", t.data_type)
        }
        2 => {
            let len = rng.below(t.raw_data.len() + 9);
            t.raw_data.resize(len, 0x41);
            format!("raw_data resized to {len}")
        }
        3 => {
            // The same values in a typed field, maybe not the one the type uses.
            let raw = std::mem::take(&mut t.raw_data);
            match rng.below(3) {
                0 => t.float_data = raw.chunks(4).map(|_| 1.0).collect(),
                1 => t.int64_data = raw.chunks(8).map(|_| 1).collect(),
                _ => t.int32_data = raw.chunks(4).map(|_| 1).collect(),
            }
            "data moved to a typed field".into()
        }
        4 => {
            t.data_location = EnumOrUnknown::from_i32(rng.pick(&[1, 2, -1]));
            let mut entry = onnx_protobuf::StringStringEntryProto::new();
            entry.key = "location".into();
            entry.value = rng.pick(&["missing.bin", "../escape.bin", "/etc/passwd", ""]).into();
            t.external_data.push(entry);
            format!("external data at {:?}", t.external_data)
        }
        5 => {
            t.dims.push(rng.wild_i64(1));
            format!("dims -> {:?}", t.dims)
        }
        _ => {
            t.dims.pop();
            format!("dims -> {:?}", t.dims)
        }
    }
}

fn mutate_onnx_attr(n: &mut NodeProto, rng: &mut Rng) -> String {
    if n.attribute.is_empty() || rng.one_in(6) {
        let name = rng.pick(ATTR_NAMES);
        let a = match rng.below(4) {
            0 => attr_int(name, rng.wild_i64(1)),
            1 => attr_ints(name, &[rng.wild_i64(1), rng.wild_i64(2)]),
            2 => attr_float(name, rng.wild_f64(1.0) as f32),
            _ => attr_string(name, rng.pick(TEXTS)),
        };
        n.attribute.push(a);
        return format!("add attribute {name}");
    }
    let k = rng.below(n.attribute.len());
    let a: &mut AttributeProto = &mut n.attribute[k];
    let name = a.name.clone();
    match rng.below(8) {
        0 => {
            let code = rng.pick(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 99]);
            a.type_ = EnumOrUnknown::from_i32(code);
            format!("attribute {name} type -> {code}")
        }
        1 => {
            n.attribute.remove(k);
            format!("remove attribute {name}")
        }
        2 => {
            let copy = a.clone();
            n.attribute.push(copy);
            format!("repeat attribute {name}")
        }
        _ => match a.type_.enum_value() {
            Ok(AttributeType::INT) => {
                let old = a.i;
                a.i = rng.wild_i64(old);
                format!("attribute {name}: {old} -> {}", a.i)
            }
            Ok(AttributeType::INTS) => {
                let old = a.ints.clone();
                match rng.below(4) {
                    0 if !a.ints.is_empty() => {
                        let j = rng.below(a.ints.len());
                        a.ints[j] = rng.wild_i64(a.ints[j]);
                    }
                    1 => a.ints.push(rng.wild_i64(1)),
                    2 => {
                        a.ints.pop();
                    }
                    _ => {
                        for x in a.ints.iter_mut() {
                            *x = rng.wild_i64(*x);
                        }
                    }
                }
                format!("attribute {name}: {old:?} -> {:?}", a.ints)
            }
            Ok(AttributeType::FLOAT) => {
                let old = a.f;
                a.f = rng.wild_f64(f64::from(old)) as f32;
                format!("attribute {name}: {old} -> {}", a.f)
            }
            Ok(AttributeType::STRING) => {
                a.s = rng.pick(TEXTS).as_bytes().to_vec();
                format!("attribute {name} -> {:?}", String::from_utf8_lossy(&a.s))
            }
            Ok(AttributeType::TENSOR) if a.t.is_some() => {
                let what = mutate_tensor(a.t.mut_or_insert_default(), rng);
                format!("attribute {name} tensor: {what}")
            }
            _ => {
                a.s = vec![0xff, 0xfe];
                format!("attribute {name} gets invalid UTF-8")
            }
        },
    }
}

fn set_dim(d: &mut onnx_protobuf::tensor_shape_proto::Dimension, rng: &mut Rng) -> String {
    d.value = match rng.below(6) {
        0 => Some(dimension::Value::DimParam("N".into())),
        1 => None,
        2 => Some(dimension::Value::DimValue(rng.pick(&[-1, i64::MIN, 1 << 40, i64::MAX]))),
        3 => Some(dimension::Value::DimValue(0)),
        _ => Some(dimension::Value::DimValue(rng.pick(&[1, 2, 3, 5, 16]))),
    };
    format!("{:?}", d.value)
}

/// One structured mutation of an ONNX model; returns what it did.
fn mutate_onnx(m: &mut ModelProto, rng: &mut Rng) -> String {
    let names = value_names(m);
    let g = m.graph.mut_or_insert_default();
    let nodes = g.node.len();
    match rng.below(30) {
        0..=9 if nodes > 0 => {
            let i = rng.below(nodes);
            let what = mutate_onnx_attr(&mut g.node[i], rng);
            format!("node {i} ({}): {what}", g.node[i].op_type)
        }
        10..=11 if nodes > 0 => {
            let i = rng.below(nodes);
            let n = &mut g.node[i];
            let old = std::mem::take(&mut n.op_type);
            n.op_type = rng.pick(ONNX_OPS).into();
            if rng.one_in(10) {
                n.domain = "com.microsoft".into();
            }
            format!("node {i} op {old} -> {} (domain {:?})", n.op_type, n.domain)
        }
        12..=14 if nodes > 0 => {
            let i = rng.below(nodes);
            let n = &mut g.node[i];
            let name = match rng.below(4) {
                0 => String::new(),
                1 => "nowhere".into(),
                _ => names[rng.below(names.len())].clone(),
            };
            if n.input.is_empty() || rng.one_in(4) {
                n.input.push(name.clone());
                format!("node {i} ({}) reads {name:?} too", n.op_type)
            } else {
                let k = rng.below(n.input.len());
                let old = std::mem::replace(&mut n.input[k], name.clone());
                format!("node {i} ({}) input {k} {old:?} -> {name:?}", n.op_type)
            }
        }
        15 if nodes > 0 => {
            let i = rng.below(nodes);
            let n = &mut g.node[i];
            let name = match rng.below(3) {
                0 => String::new(),
                _ => names[rng.below(names.len())].clone(),
            };
            if n.output.is_empty() || rng.one_in(3) {
                n.output.push(name.clone());
                format!("node {i} ({}) writes {name:?} too", n.op_type)
            } else {
                let k = rng.below(n.output.len());
                let old = std::mem::replace(&mut n.output[k], name.clone());
                format!("node {i} ({}) output {k} {old:?} -> {name:?}", n.op_type)
            }
        }
        16 if nodes > 1 => {
            // A cycle: an early node reads a later node's output.
            let i = rng.below(nodes - 1);
            let j = i + 1 + rng.below(nodes - i - 1);
            let Some(out) = g.node[j].output.first().cloned() else {
                return "nothing (no output)".into();
            };
            if let Some(first) = g.node[i].input.first_mut() {
                *first = out.clone();
            }
            format!("node {i} reads node {j}'s output {out}")
        }
        17..=18 if !g.input.is_empty() => {
            let k = rng.below(g.input.len());
            let vi = &mut g.input[k];
            let name = vi.name.clone();
            let Some(type_proto::Value::TensorType(t)) =
                vi.type_.mut_or_insert_default().value.as_mut()
            else {
                return format!("nothing (input {name} is not a tensor)");
            };
            match rng.below(5) {
                0 => {
                    t.elem_type = rng.pick(DTYPE_CODES);
                    format!("input {name} elem_type -> {}", t.elem_type)
                }
                1 => {
                    t.shape.mut_or_insert_default().dim.pop();
                    format!("input {name} loses a dim")
                }
                2 => {
                    t.shape = protobuf::MessageField::none();
                    format!("input {name} loses its shape")
                }
                _ => {
                    let dims = &mut t.shape.mut_or_insert_default().dim;
                    if dims.is_empty() {
                        return format!("nothing (input {name} is a scalar)");
                    }
                    let d = rng.below(dims.len());
                    format!("input {name} dim {d} -> {}", set_dim(&mut dims[d], rng))
                }
            }
        }
        19 => {
            let list = if rng.one_in(2) { &mut g.input } else { &mut g.output };
            if list.is_empty() {
                return "nothing (empty list)".into();
            }
            let k = rng.below(list.len());
            match rng.below(3) {
                0 => format!("remove graph input/output {}", list.remove(k).name),
                1 => {
                    let copy = list[k].clone();
                    list.push(copy);
                    format!("repeat graph input/output {}", list[k].name)
                }
                _ => {
                    let old =
                        std::mem::replace(&mut list[k].name, names[rng.below(names.len())].clone());
                    format!("graph input/output {old} renamed {}", list[k].name)
                }
            }
        }
        20..=24 if !g.initializer.is_empty() => {
            let k = rng.below(g.initializer.len());
            match rng.below(8) {
                0 => format!("remove initializer {}", g.initializer.remove(k).name),
                1 => {
                    let copy = g.initializer[k].clone();
                    g.initializer.push(copy);
                    format!("repeat initializer {}", g.initializer[k].name)
                }
                _ => {
                    let t = &mut g.initializer[k];
                    let what = mutate_tensor(t, rng);
                    format!("initializer {}: {what}", t.name)
                }
            }
        }
        25 => {
            let opset = m.opset_import.first_mut();
            match opset {
                Some(o) if !rng.one_in(5) => {
                    let old = o.version;
                    o.version =
                        rng.pick(&[-1, 0, 1, 6, 7, 9, 10, 11, 12, 13, 18, 21, 22, 28, 29, 1000]);
                    format!("opset {old} -> {}", o.version)
                }
                _ => {
                    m.opset_import.clear();
                    "no opset".into()
                }
            }
        }
        26..=27 if nodes > 0 => {
            let i = rng.below(nodes);
            match rng.below(3) {
                0 => format!("remove node {i} ({})", g.node.remove(i).op_type),
                1 => {
                    let copy = g.node[i].clone();
                    g.node.push(copy);
                    format!("repeat node {i}")
                }
                _ => {
                    let j = rng.below(nodes);
                    g.node.swap(i, j);
                    format!("swap nodes {i} and {j}")
                }
            }
        }
        _ => {
            // A Constant node, with a wild value, feeding some node.
            let mut c = NodeProto::new();
            c.op_type = "Constant".into();
            c.output.push("intruder".into());
            let mut value = TensorProto::new();
            value.data_type = rng.pick(&[1, 7, 6, 9]);
            value.dims = vec![rng.pick(&[0, 1, 2, 4])];
            let what = mutate_tensor(&mut value, rng);
            c.attribute.push(AttributeProto {
                name: "value".into(),
                type_: AttributeType::TENSOR.into(),
                t: protobuf::MessageField::some(value),
                ..Default::default()
            });
            g.node.insert(0, c);
            if nodes > 0 {
                let i = 1 + rng.below(nodes);
                let n = &mut g.node[i];
                if n.input.is_empty() {
                    n.input.push("intruder".into());
                } else {
                    let k = rng.below(n.input.len());
                    n.input[k] = "intruder".into();
                }
            }
            format!("a Constant ({what}) feeding a node")
        }
    }
}

/// Compiles the model at `path` and, when that works, opens and runs the bundle.
/// A panic, an invalid memory plan or a broken IR are compiler bugs, whatever the model, and so
/// fail the case (the verifier runs in tests; a release build would write the plan).
fn compile_and_run(path: &Path, seed: u64) -> Result<Stage, String> {
    match catch_panic(|| compile(path, &[]))? {
        Ok(bytes) => open_and_run(&bytes, seed),
        Err(e) => {
            let internal = e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<CompileError>(),
                    Some(CompileError::Plan(_) | CompileError::Pass(PassError::Graph(_)))
                )
            });
            if internal {
                return Err(format!("compiler bug: {e:#}"));
            }
            Ok(traced(Stage::CompileError, format!("{e:#}")))
        }
    }
}

/// Thousands of structured mutations of ONNX models: compile never panics, and neither does
/// running what it accepts.
#[test]
fn mutated_onnx_models_fail_cleanly() {
    let dir = scratch_dir("hostile/onnx");
    let bases: Vec<(&str, ModelProto)> =
        models().into_iter().map(|(n, m)| (n, m.proto())).collect();
    let path = dir.join("case.onnx");
    let mut tally = Tally::default();
    for case in cases(10_000) {
        let (name, base) = &bases[case as usize % bases.len()];
        let rng = &mut Rng::new(case ^ 0x0FF1CE);
        let mut model = base.clone();
        let mutations: Vec<String> =
            (0..1 + rng.below(3)).map(|_| mutate_onnx(&mut model, rng)).collect();
        std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
        tally.case(format!("case {case} ({name}): {}", mutations.join("; ")), || {
            compile_and_run(&path, case)
        });
    }
    tally.finish("mutated_onnx_models_fail_cleanly");
}

/// Flipped bits and cuts anywhere in the serialized ONNX file.
#[test]
fn corrupt_onnx_bytes_fail_cleanly() {
    let dir = scratch_dir("hostile/onnx_bytes");
    let path = dir.join("case.onnx");
    let mut tally = Tally::default();
    for (name, model) in models() {
        let bytes = model.to_bytes();
        let rng = &mut Rng::new(bytes.len() as u64);
        for case in 0..300 {
            let mut bad = bytes.clone();
            let what = if case % 4 == 0 {
                let len = rng.below(bad.len());
                bad.truncate(len);
                format!("cut to {len} bytes")
            } else {
                let mut flips = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(bad.len());
                    bad[at] ^= 1 << rng.below(8);
                    flips.push(at);
                }
                format!("bits flipped at {flips:?}")
            };
            std::fs::write(&path, &bad).unwrap();
            tally.case(format!("{name}: {what}"), || compile_and_run(&path, case));
        }
    }
    tally.finish("corrupt_onnx_bytes_fail_cleanly");
}

// ---------------------------------------------------------------------------------------------
// Wrong inputs, zero sizes, huge sizes.

/// The error of `f`, which must neither panic nor succeed.
fn error_of<T, E: std::fmt::Display>(what: &str, f: impl FnOnce() -> Result<T, E>) -> String {
    match catch_panic(f) {
        Err(panic) => panic!("{what}: {panic}"),
        Ok(Ok(_)) => panic!("{what}: succeeded, expected an error"),
        Ok(Err(e)) => format!("{e:#}"),
    }
}

fn session_of(dir: &Path, name: &str, model: &OnnxModel) -> Session {
    let path = dir.join(format!("{name}.onnx"));
    model.write(&path).unwrap();
    let bytes = compile(&path, &[]).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    Session::new(Arc::new(Bundle::from_bytes(&bytes).unwrap()), cpu_only()).unwrap()
}

/// A session with several inputs refuses each wrong one by name: swapped, of the wrong integer
/// width, a scalar for a tensor, a zero-size tensor; the right ones still run after.
#[test]
fn wrong_inputs_of_a_multi_input_session() {
    let dir = scratch_dir("hostile/wrong_inputs");
    let mut session = session_of(&dir, "multi_output", &multi_output());
    let rng = &mut Rng::new(7);
    let good: Vec<Tensor> = session.inputs().iter().map(|i| input_value(i, rng)).collect();
    let names: Vec<String> = session.inputs().iter().map(|i| i.name.clone()).collect();
    assert_eq!(names, ["a", "b", "ids"]);

    let swapped = vec![good[1].clone(), good[0].clone(), good[2].clone()];
    let message = error_of("swapped inputs", || session.run(&swapped));
    assert!(message.contains("'a'"), "{message}");

    let ids_i32 = Tensor::from_vec(vec![3], &[0i32, 1, 2]).unwrap();
    let message = error_of("i32 ids", || session.run(&[good[0].clone(), good[1].clone(), ids_i32]));
    assert!(message.contains("'ids'") && message.contains("i32"), "{message}");

    let scalar = Tensor::from_vec(vec![], &[1.0f32]).unwrap();
    let message = error_of("scalar b", || session.run(&[good[0].clone(), scalar, good[2].clone()]));
    assert!(message.contains("'b'"), "{message}");

    for shape in [vec![0, 4], vec![2, 0], vec![0, 0]] {
        let empty = Tensor::zeros(TensorDesc::new(DType::F32, shape.clone()));
        let message =
            error_of("zero-size a", || session.run(&[empty, good[1].clone(), good[2].clone()]));
        assert!(message.contains("'a'"), "{shape:?}: {message}");
    }

    let mut too_many = good.clone();
    too_many.push(good[2].clone());
    let message = error_of("four inputs", || session.run(&too_many));
    assert!(message.contains("expected 3 inputs"), "{message}");

    let outputs = session.run(&good).unwrap();
    assert_eq!(outputs.len(), session.outputs().len());
}

/// Ids out of range at run time are an error of the Gather step, not a panic.
#[test]
fn out_of_range_ids_at_run_time() {
    let dir = scratch_dir("hostile/ids");
    let mut session = session_of(&dir, "multi_output", &multi_output());
    let rng = &mut Rng::new(8);
    let mut inputs: Vec<Tensor> = session.inputs().iter().map(|i| input_value(i, rng)).collect();
    for bad in [5i64, -6, i64::MAX, i64::MIN] {
        inputs[2] = Tensor::from_vec(vec![3], &[0i64, bad, 1]).unwrap();
        let message = error_of(&format!("id {bad}"), || session.run(&inputs));
        assert!(message.contains("embed"), "id {bad}: {message}");
    }
    // Negative ids count from the end, as in ONNX.
    inputs[2] = Tensor::from_vec(vec![3], &[0i64, -5, -1]).unwrap();
    session.run(&inputs).unwrap();
}

/// Models whose tensors are empty (a zero dim) compile and run, or fail cleanly.
#[test]
fn zero_size_tensors() {
    let dir = scratch_dir("hostile/zero_size");
    let path = dir.join("model.onnx");
    let mut tally = Tally::default();
    for (name, model) in models() {
        let proto = model.proto();
        for k in 0..proto.graph.input.len() {
            let dims = proto.graph.input[k]
                .type_
                .as_ref()
                .and_then(|t| match &t.value {
                    Some(type_proto::Value::TensorType(t)) => Some(t.shape.dim.len()),
                    _ => None,
                })
                .unwrap_or(0);
            for d in 0..dims {
                let mut m = proto.clone();
                let g = m.graph.mut_or_insert_default();
                if let Some(type_proto::Value::TensorType(t)) =
                    g.input[k].type_.mut_or_insert_default().value.as_mut()
                {
                    t.shape.mut_or_insert_default().dim[d].value =
                        Some(dimension::Value::DimValue(0));
                }
                // The declared outputs keep their shapes: the compiler's inferred ones win.
                std::fs::write(&path, m.write_to_bytes().unwrap()).unwrap();
                tally.case(format!("{name}: input {k} dim {d} = 0"), || compile_and_run(&path, 0));
            }
        }
    }
    tally.finish("zero_size_tensors");
}

/// An output far larger than memory is an error when the session runs (or is created), not an
/// abort; so is constant folding one at compile time.
#[test]
fn outputs_larger_than_memory_are_errors() {
    let dir = scratch_dir("hostile/huge");
    let path = dir.join("expand.onnx");
    let huge: i64 = 1 << 58; // 1 EiB of f32: more than any address space
    let shape = i64s(&[2], &[huge, 1]);
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[1, 1])
        .initializer("shape", &shape)
        .node("expand", "Expand", &["x", "shape"], &["y"], vec![])
        .output("y", DType::F32, &[huge as usize, 1])
        .write(&path)
        .unwrap();
    let bytes = compile(&path, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let x = Tensor::from_vec(vec![1, 1], &[1.0f32]).unwrap();
    let message = error_of("run", || {
        let mut session = Session::new(Arc::new(Bundle::from_bytes(&bytes)?), cpu_only())?;
        session.run(std::slice::from_ref(&x)).map_err(anyhow::Error::from)
    });
    assert!(message.contains("allocate"), "{message}");

    // The same with a constant input: folding it would need that much at compile time.
    let folded = dir.join("folded.onnx");
    OnnxModel::new(OPSET)
        .input("x", DType::F32, &[1, 1])
        .initializer("one", &Tensor::from_vec(vec![1, 1], &[1.0f32]).unwrap())
        .initializer("shape", &shape)
        .node("expand", "Expand", &["one", "shape"], &["big"], vec![])
        .node("add", "Add", &["x", "big"], &["y"], vec![])
        .output("y", DType::F32, &[huge as usize, 1])
        .write(&folded)
        .unwrap();
    let message = error_of("compile", || compile(&folded, &[]));
    assert!(message.contains("expand"), "{message}");
}

/// Found by `mutated_onnx_models_fail_cleanly` (case 3593, a graph output renamed): a Concat
/// input that is also a graph output. The plan must not have its producer write into the
/// concat (its bytes go to the caller's output); the verifier catches the plan that does, a
/// build without the verifier writes it and the concat's output misses that part.
#[test]
fn a_concat_input_that_is_also_a_graph_output() {
    let dir = scratch_dir("hostile/concat_output");
    let mut session = session_of(
        &dir,
        "model",
        &OnnxModel::new(OPSET)
            .input("x", DType::F32, &[1, 2])
            .node("relu", "Relu", &["x"], &["a"], vec![])
            .node("neg", "Neg", &["x"], &["b"], vec![])
            .node("concat", "Concat", &["a", "b"], &["c"], vec![attr_int("axis", 0)])
            .node("transpose", "Transpose", &["c"], &["t"], vec![attr_ints("perm", &[1, 0])])
            .output("t", DType::F32, &[2, 2])
            .output("b", DType::F32, &[1, 2]),
    );
    let x = Tensor::from_vec(vec![1, 2], &[1.0f32, -2.0]).unwrap();
    let outputs = session.run(&[x]).unwrap();
    // a = [1, 0], b = [-1, 2], c = [[1, 0], [-1, 2]], t = c transposed.
    assert_eq!(outputs[0].to_vec::<f32>().unwrap(), [1.0, -1.0, 0.0, 2.0]);
    assert_eq!(outputs[1].to_vec::<f32>().unwrap(), [-1.0, 2.0]);
}
