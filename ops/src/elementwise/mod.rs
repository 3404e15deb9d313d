//! Elementwise ops: attribute defaults, constant `Clip` bounds, `CastLike` to `Cast`, and the
//! broadcasting shape rules. The kernels, and the list of canonical attributes, are in
//! `ops/src/elementwise/cpu.rs`. Attributes a kernel does not read are dropped.

pub(crate) mod cpu;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: cpu::in_place,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, broadcast_shapes, op_err};
use crate::registry::{Family, OpDef};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("Abs", lower_attrs, same),
    OpDef::new("Neg", lower_attrs, same),
    OpDef::new("Sign", lower_attrs, same),
    OpDef::new("Relu", lower_attrs, same),
    OpDef::new("Ceil", lower_attrs, same),
    OpDef::new("Floor", lower_attrs, same),
    OpDef::new("Round", lower_attrs, same),
    OpDef::new("Sqrt", lower_attrs, same),
    OpDef::new("Reciprocal", lower_attrs, same),
    OpDef::new("Exp", lower_attrs, same),
    OpDef::new("Log", lower_attrs, same),
    OpDef::new("Sin", lower_attrs, same),
    OpDef::new("Cos", lower_attrs, same),
    OpDef::new("Tan", lower_attrs, same),
    OpDef::new("Asin", lower_attrs, same),
    OpDef::new("Acos", lower_attrs, same),
    OpDef::new("Atan", lower_attrs, same),
    OpDef::new("Sinh", lower_attrs, same),
    OpDef::new("Cosh", lower_attrs, same),
    OpDef::new("Tanh", lower_attrs, same),
    OpDef::new("Asinh", lower_attrs, same),
    OpDef::new("Acosh", lower_attrs, same),
    OpDef::new("Atanh", lower_attrs, same),
    OpDef::new("Sigmoid", lower_attrs, same),
    OpDef::new("Erf", lower_attrs, same),
    OpDef::new("LeakyRelu", lower_attrs, same),
    OpDef::new("Elu", lower_attrs, same),
    OpDef::new("Selu", lower_attrs, same),
    OpDef::new("Celu", lower_attrs, same),
    OpDef::new("HardSigmoid", lower_attrs, same),
    OpDef::new("HardSwish", lower_attrs, same),
    OpDef::new("Softplus", lower_attrs, same),
    OpDef::new("Softsign", lower_attrs, same),
    OpDef::new("Mish", lower_attrs, same),
    OpDef::new("Swish", lower_attrs, same),
    OpDef::new("Gelu", lower_attrs, same),
    OpDef::new("ThresholdedRelu", lower_attrs, same),
    OpDef::new("Shrink", lower_attrs, same),
    OpDef::new("Not", lower_attrs, same),
    OpDef::new("IsNaN", lower_attrs, to_bool),
    OpDef::new("IsInf", lower_attrs, to_bool),
    OpDef::new("Clip", lower_clip, same),
    OpDef::new("Cast", lower_cast, cast),
    // Lowered to Cast; the pass infers with this entry, so it reads `to` like Cast.
    OpDef::new("CastLike", lower_cast, cast).cpu_only("lowering turns CastLike into Cast"),
    OpDef::new("Add", lower_attrs, broadcast),
    OpDef::new("Sub", lower_attrs, broadcast),
    OpDef::new("Mul", lower_attrs, broadcast),
    OpDef::new("Div", lower_attrs, broadcast),
    OpDef::new("Pow", lower_attrs, pow),
    OpDef::new("Mod", lower_attrs, broadcast),
    OpDef::new("PRelu", lower_attrs, prelu),
    // Opset 28's gated activation of two inputs of one shape: Swish(A) · B.
    OpDef::new("SwiGLU", lower_attrs, same_shapes),
    OpDef::new("BitShift", lower_attrs, broadcast),
    OpDef::new("BitwiseAnd", lower_attrs, broadcast),
    OpDef::new("BitwiseOr", lower_attrs, broadcast),
    OpDef::new("BitwiseXor", lower_attrs, broadcast),
    OpDef::new("BitwiseNot", lower_attrs, same),
    OpDef::new("Equal", lower_attrs, compare),
    OpDef::new("Greater", lower_attrs, compare),
    OpDef::new("GreaterOrEqual", lower_attrs, compare),
    OpDef::new("Less", lower_attrs, compare),
    OpDef::new("LessOrEqual", lower_attrs, compare),
    OpDef::new("And", lower_attrs, logical),
    OpDef::new("Or", lower_attrs, logical),
    OpDef::new("Xor", lower_attrs, logical),
    OpDef::new("Max", lower_attrs, broadcast),
    OpDef::new("Min", lower_attrs, broadcast),
    OpDef::new("Sum", lower_sum, broadcast),
    OpDef::new("Mean", lower_attrs, broadcast),
    OpDef::new("Where", lower_attrs, where_),
];

/// An attribute the kernel reads: its ONNX default, or `Required`.
enum Spec {
    Float(f32),
    Int(i64),
    Text(&'static str, &'static [&'static str]),
    Required(&'static [&'static str]),
}
use Spec::*;

/// The attributes each op's kernel reads, with their defaults (the same in opsets 11..=21).
/// Text attributes list their allowed values.
const ATTRS: &[(&str, &[(&str, Spec)])] = &[
    ("LeakyRelu", &[("alpha", Float(0.01))]),
    ("Elu", &[("alpha", Float(1.0))]),
    ("Celu", &[("alpha", Float(1.0))]),
    ("ThresholdedRelu", &[("alpha", Float(1.0))]),
    ("Shrink", &[("bias", Float(0.0)), ("lambd", Float(0.5))]),
    ("Selu", &[("alpha", Float(1.673_263_2)), ("gamma", Float(1.050_701))]),
    ("HardSigmoid", &[("alpha", Float(0.2)), ("beta", Float(0.5))]),
    ("Swish", &[("alpha", Float(1.0))]),
    ("SwiGLU", &[("alpha", Float(1.0))]),
    ("Gelu", &[("approximate", Text("none", &["none", "tanh"]))]),
    ("IsInf", &[("detect_negative", Int(1)), ("detect_positive", Int(1))]),
    ("Mod", &[("fmod", Int(0))]),
    ("BitShift", &[("direction", Required(&["LEFT", "RIGHT"]))]),
];

/// Keeps the attributes the kernel reads, with defaults filled in; drops the rest.
fn lower_attrs(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    let wanted = ATTRS.iter().find(|(op, _)| *op == node.op).map_or(&[][..], |(_, a)| a);
    let mut attrs = Attrs::new();
    for (name, spec) in wanted {
        let a = &node.attrs;
        let value = match spec {
            Float(d) => AttrValue::Float(f64::from(a.float_or(name, *d)?)),
            Int(d) => AttrValue::Int(a.int_or(name, *d)?),
            Text(d, allowed) => text(a.text_or(name, d)?, name, allowed)?,
            Required(allowed) => text(a.text(name)?, name, allowed)?,
        };
        attrs.set(name, value);
    }
    node.attrs = attrs;
    Ok(())
}

fn text(v: &str, name: &str, allowed: &[&str]) -> OpResult<AttrValue> {
    if !allowed.contains(&v) {
        return Err(op_err!("{name} must be one of {allowed:?}, got '{v}'"));
    }
    Ok(AttrValue::Text(v.to_string()))
}

/// Bounds become the attributes `min` and `max` (±inf when absent). From opset 11 they are
/// optional inputs, which must be constant; integer inputs keep integer bounds, exactly.
fn lower_clip(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let x = cx.input(0)?.clone();
    let int = !x.dtype.is_float();
    // A bound computed at run time (a spectrogram's floor, max(x) - 80 dB) stays an input.
    let at_run_time = |i: usize| {
        cx.opset >= 11 && cx.has_input(i) && cx.consts.get(i).copied().flatten().is_none()
    };
    let bound = |i: usize, name: &str, unbounded: f64| -> OpResult<AttrValue> {
        if cx.opset < 11 {
            let v = node.attrs.float_or(name, unbounded as f32)?;
            return Ok(AttrValue::Float(f64::from(v)));
        }
        let many = |n: usize| op_err!("{name} must be one value, got {n}");
        if at_run_time(i) {
            let b = cx.input(i)?;
            if b.dtype != x.dtype || b.elements() != 1 {
                return Err(op_err!(
                    "{name} must be one {} value, got {} {:?}",
                    x.dtype,
                    b.dtype,
                    b.shape
                ));
            }
            // Unused: the input is read instead.
            return Ok(AttrValue::Float(unbounded));
        }
        Ok(if int {
            match cx.const_ints(i, name)?.as_deref() {
                None => AttrValue::Float(unbounded),
                Some(&[v]) => AttrValue::Int(v),
                Some(v) => return Err(many(v.len())),
            }
        } else {
            match cx.const_floats(i, name)?.as_deref() {
                None => AttrValue::Float(unbounded),
                Some(&[v]) => AttrValue::Float(v),
                Some(v) => return Err(many(v.len())),
            }
        })
    };
    let min = bound(1, "min", f64::NEG_INFINITY)?;
    let max = bound(2, "max", f64::INFINITY)?;
    let mut attrs = Attrs::new().with("min", min).with("max", max);
    let mut inputs = vec![node.inputs[0]];
    for (i, flag) in [(1, "min_input"), (2, "max_input")] {
        if at_run_time(i) {
            attrs = attrs.with(flag, AttrValue::Int(1));
            inputs.push(node.inputs[i]);
        }
    }
    node.attrs = attrs;
    node.inputs = inputs;
    Ok(())
}

/// A Sum of two is an Add, which the fusion pass folds into the op before it (the residual of
/// a conv, as Caffe2-converted ResNets write it).
fn lower_sum(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_attrs(node, cx)?;
    if node.inputs.len() == 2 {
        node.op = "Add".into();
    }
    Ok(())
}

/// ONNX's type code of bfloat16, which the importer reads as f32.
const BFLOAT16: i64 = 16;

/// `Cast` keeps `to`, `saturate` where `to` is a float of 8 bits or fewer (the only ones it
/// affects) and `round_mode` where it is FLOAT8E8M0 (checked); `CastLike` becomes a `Cast` to
/// its second input's type. A cast to bfloat16 is a cast to f32 with
/// `bfloat16 = 1`: the value rounded to bfloat16's precision (Ingot carries bfloat16 in f32).
fn lower_cast(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let to = if node.op == "CastLike" {
        i64::from(cx.input(1)?.dtype.onnx_code())
    } else {
        node.attrs.int("to")?
    };
    node.attrs = if to == BFLOAT16 {
        let f32_code = i64::from(DType::F32.onnx_code());
        Attrs::new().with("to", AttrValue::Int(f32_code)).with("bfloat16", AttrValue::Int(1))
    } else if dtype_of(to)?.is_minifloat() {
        // Opset 19: whether values past the format's range saturate (the default).
        let saturate = if cx.opset >= 19 { node.attrs.int_or("saturate", 1)? } else { 1 };
        let attrs =
            Attrs::new().with("to", AttrValue::Int(to)).with("saturate", AttrValue::Int(saturate));
        if dtype_of(to)? != DType::F8E8M0 {
            attrs
        } else {
            // Opset 24: how the mantissa is dropped, `up` by default.
            let mode = node.attrs.text_or("round_mode", "up")?.to_string();
            if crate::minifloat::Rounding::parse(&mode).is_none() {
                return Err(op_err!("round_mode '{mode}' is not up, down or nearest"));
            }
            attrs.with("round_mode", AttrValue::Text(mode))
        }
    } else {
        Attrs::new().with("to", AttrValue::Int(to))
    };
    node.op = "Cast".into();
    node.inputs.truncate(1);
    Ok(())
}

fn dtype_of(code: i64) -> OpResult<DType> {
    i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| op_err!("cast to ONNX type {code} is not supported"))
}

// ---- shape inference ----

/// The inputs, after checking their count.
fn arity<'a, 'b>(
    inputs: &'a [&'b TensorDesc],
    n: std::ops::RangeInclusive<usize>,
) -> OpResult<&'a [&'b TensorDesc]> {
    if !n.contains(&inputs.len()) {
        return Err(op_err!("takes {n:?} inputs, got {}", inputs.len()));
    }
    Ok(inputs)
}

fn same(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    Ok(vec![arity(inputs, 1..=1)?[0].clone()])
}

/// Two float inputs of one type and shape (no broadcasting): that type and shape.
fn same_shapes(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let &[a, b] = inputs else {
        return Err(op_err!("takes 2 inputs, got {}", inputs.len()));
    };
    if a != b || !a.dtype.is_float() {
        return Err(op_err!(
            "inputs {} {:?} and {} {:?} must be one float type and shape",
            a.dtype,
            a.shape,
            b.dtype,
            b.shape
        ));
    }
    Ok(vec![a.clone()])
}

fn to_bool(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arity(inputs, 1..=1)?[0];
    Ok(vec![TensorDesc::new(DType::Bool, x.shape.clone())])
}

fn cast(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = arity(inputs, 1..=1)?[0];
    let to = dtype_of(node.attrs.int("to")?)?;
    Ok(vec![TensorDesc::new(to, x.shape.clone())])
}

/// The broadcast shape of `inputs`, which must all have one type; that type.
fn broadcast_same(inputs: &[&TensorDesc]) -> OpResult<(DType, Vec<usize>)> {
    let dtype = inputs.first().ok_or_else(|| op_err!("needs an input"))?.dtype;
    if let Some(x) = inputs.iter().find(|x| x.dtype != dtype) {
        return Err(op_err!("inputs of types {dtype} and {} must have one type", x.dtype));
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(|x| x.shape.as_slice()).collect();
    Ok((dtype, broadcast_shapes(&shapes)?))
}

/// Binary ops (two inputs) and variadic ones (one or more), broadcasting.
fn broadcast(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let n = if matches!(node.op.as_str(), "Max" | "Min" | "Sum" | "Mean") {
        1..=usize::MAX
    } else {
        2..=2
    };
    let (dtype, shape) = broadcast_same(arity(inputs, n)?)?;
    Ok(vec![TensorDesc::new(dtype, shape)])
}

fn compare(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (_, shape) = broadcast_same(arity(inputs, 2..=2)?)?;
    Ok(vec![TensorDesc::new(DType::Bool, shape)])
}

fn logical(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (dtype, shape) = broadcast_same(arity(inputs, 2..=2)?)?;
    if dtype != DType::Bool {
        return Err(op_err!("takes bool inputs, got {dtype}"));
    }
    Ok(vec![TensorDesc::new(DType::Bool, shape)])
}

/// The exponent may have another type than the base; the result has the base's.
fn pow(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let &[x, e] = arity(inputs, 2..=2)? else {
        return Err(op_err!("takes 2 inputs"));
    };
    let shape = broadcast_shapes(&[&x.shape, &e.shape])?;
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

/// The slope broadcasts to X (one way): Y is shaped like X.
fn prelu(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let &[x, slope] = arity(inputs, 2..=2)? else {
        return Err(op_err!("takes 2 inputs"));
    };
    if broadcast_same(inputs)?.1 != x.shape {
        return Err(op_err!("the slope {:?} does not broadcast to X {:?}", slope.shape, x.shape));
    }
    Ok(vec![x.clone()])
}

fn where_(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let &[c, x, y] = arity(inputs, 3..=3)? else {
        return Err(op_err!("takes 3 inputs"));
    };
    if c.dtype != DType::Bool {
        return Err(op_err!("the condition must be bool, got {}", c.dtype));
    }
    let (dtype, _) = broadcast_same(&[x, y])?;
    let shape = broadcast_shapes(&[&c.shape, &x.shape, &y.shape])?;
    Ok(vec![TensorDesc::new(dtype, shape)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Constant;
    use crate::Tensor;
    use crate::lookup;
    use std::sync::Arc;

    fn node(op: &str, n_inputs: usize, attrs: Attrs) -> Node {
        Node {
            name: String::new(),
            op: op.into(),
            domain: String::new(),
            inputs: (0..n_inputs).map(Some).collect(),
            outputs: vec![n_inputs],
            attrs,
        }
    }

    /// Lowers `n` with the given input types and constants (`None`: omitted input).
    fn lower(
        n: &mut Node,
        opset: i64,
        inputs: &[Option<&TensorDesc>],
        consts: &[Option<&dyn Constant>],
    ) -> OpResult<()> {
        n.inputs = inputs.iter().enumerate().map(|(i, t)| t.map(|_| i)).collect();
        let cx = LowerCx { opset, inputs: inputs.to_vec(), consts: consts.to_vec() };
        (lookup(&n.op).expect("op is registered").def.lower)(n, &cx)
    }

    fn infer(n: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
        (lookup(&n.op).expect("op is registered").def.infer)(n, inputs)
    }

    fn desc(dtype: DType, shape: &[usize]) -> TensorDesc {
        TensorDesc::new(dtype, shape)
    }

    fn scalar<T: crate::Element>(v: T) -> Arc<Tensor> {
        Arc::new(Tensor::from_vec(Vec::<usize>::new(), &[v]).unwrap())
    }

    #[test]
    #[allow(clippy::excessive_precision)] // the Selu defaults, digit for digit as ONNX gives them
    fn defaults_are_filled_and_unread_attributes_dropped() {
        let x = desc(DType::F32, &[2]);
        let mut n = node("LeakyRelu", 1, Attrs::new());
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        assert_eq!(n.attrs, Attrs::new().with("alpha", AttrValue::Float(f64::from(0.01f32))));

        let mut n = node("Selu", 1, Attrs::new().with("gamma", AttrValue::Float(2.0)));
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        // The ONNX defaults are these exact float32 values.
        assert_eq!(n.attrs.get("alpha"), Some(&AttrValue::Float(1.67326319217681884765625)));
        assert_eq!(n.attrs.get("gamma"), Some(&AttrValue::Float(2.0)));
        let mut n = node("Selu", 1, Attrs::new());
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        assert_eq!(n.attrs.get("gamma"), Some(&AttrValue::Float(1.05070102214813232421875)));

        let mut n = node("Relu", 1, Attrs::new().with("consumed_inputs", AttrValue::Ints(vec![])));
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        assert!(n.attrs.is_empty());

        let mut n = node("IsInf", 1, Attrs::new().with("detect_negative", AttrValue::Int(0)));
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        assert_eq!(
            n.attrs,
            Attrs::new()
                .with("detect_negative", AttrValue::Int(0))
                .with("detect_positive", AttrValue::Int(1))
        );

        let mut n = node("Gelu", 1, Attrs::new());
        lower(&mut n, 20, &[Some(&x)], &[None]).unwrap();
        assert_eq!(n.attrs.text("approximate").unwrap(), "none");
        let mut n =
            node("Gelu", 1, Attrs::new().with("approximate", AttrValue::Text("erf".into())));
        assert!(lower(&mut n, 20, &[Some(&x)], &[None]).is_err());

        let mut n = node("BitShift", 2, Attrs::new());
        assert!(
            lower(&mut n, 13, &[Some(&x), Some(&x)], &[None, None]).is_err(),
            "direction is required"
        );

        let mut n = node("Mod", 2, Attrs::new());
        lower(&mut n, 13, &[Some(&x), Some(&x)], &[None, None]).unwrap();
        assert_eq!(n.attrs.int("fmod").unwrap(), 0);
    }

    #[test]
    fn clip_bounds_become_attributes() {
        let x = desc(DType::F32, &[4]);
        let s = desc(DType::F32, &[]);
        let lo = scalar(-1.5f32);
        // Opset 13, min given, max omitted.
        let mut n = node("Clip", 3, Attrs::new());
        lower(&mut n, 13, &[Some(&x), Some(&s), None], &[None, Some(&lo), None]).unwrap();
        assert_eq!(
            n.attrs,
            Attrs::new()
                .with("min", AttrValue::Float(-1.5))
                .with("max", AttrValue::Float(f64::INFINITY))
        );
        assert_eq!(n.inputs, vec![Some(0)]);
        // No bounds at all.
        let mut n = node("Clip", 1, Attrs::new());
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        assert_eq!(n.attrs.float("min").unwrap(), f32::NEG_INFINITY);
        assert_eq!(n.attrs.float("max").unwrap(), f32::INFINITY);
        // Opset 6: attributes.
        let mut n = node("Clip", 1, Attrs::new().with("max", AttrValue::Float(6.0)));
        lower(&mut n, 6, &[Some(&x)], &[None]).unwrap();
        assert_eq!(n.attrs.float("min").unwrap(), f32::NEG_INFINITY);
        assert_eq!(n.attrs.float("max").unwrap(), 6.0);
        // Integer bounds stay integers.
        let xi = desc(DType::I64, &[4]);
        let si = desc(DType::I64, &[]);
        let hi = scalar(i64::MAX - 1);
        let mut n = node("Clip", 3, Attrs::new());
        lower(&mut n, 13, &[Some(&xi), None, Some(&si)], &[None, None, Some(&hi)]).unwrap();
        assert_eq!(n.attrs.get("max"), Some(&AttrValue::Int(i64::MAX - 1)));
        // A bound computed at run time stays an input, flagged; the constant one is an
        // attribute.
        let mut n = node("Clip", 3, Attrs::new());
        lower(&mut n, 13, &[Some(&x), Some(&s), Some(&s)], &[None, None, Some(&lo)]).unwrap();
        assert_eq!(
            n.attrs,
            Attrs::new()
                .with("min", AttrValue::Float(f64::NEG_INFINITY))
                .with("max", AttrValue::Float(-1.5))
                .with("min_input", AttrValue::Int(1))
        );
        assert_eq!(n.inputs, vec![Some(0), Some(1)]);
        // It must be one value of x's type.
        let mut n = node("Clip", 2, Attrs::new());
        let two = desc(DType::F32, &[2]);
        assert!(lower(&mut n, 13, &[Some(&x), Some(&two)], &[None, None]).is_err());
    }

    #[test]
    fn cast_like_becomes_cast() {
        let x = desc(DType::F32, &[2, 3]);
        let like = desc(DType::I64, &[1]);
        let mut n = node("CastLike", 2, Attrs::new().with("saturate", AttrValue::Int(1)));
        lower(&mut n, 19, &[Some(&x), Some(&like)], &[None, None]).unwrap();
        assert_eq!(n.op, "Cast");
        assert_eq!(n.inputs, vec![Some(0)]);
        assert_eq!(n.attrs, Attrs::new().with("to", AttrValue::Int(7)));
        assert_eq!(infer(&n, &[&x]).unwrap(), vec![desc(DType::I64, &[2, 3])]);

        let mut n = node("Cast", 1, Attrs::new().with("to", AttrValue::Int(8)));
        assert!(lower(&mut n, 13, &[Some(&x)], &[None]).is_err(), "STRING is not a type we run");

        // To bfloat16: to f32, rounded.
        let mut n = node("Cast", 1, Attrs::new().with("to", AttrValue::Int(16)));
        lower(&mut n, 13, &[Some(&x)], &[None]).unwrap();
        let rounded =
            Attrs::new().with("to", AttrValue::Int(1)).with("bfloat16", AttrValue::Int(1));
        assert_eq!(n.attrs, rounded);
        assert_eq!(infer(&n, &[&x]).unwrap(), vec![desc(DType::F32, &[2, 3])]);
    }

    #[test]
    fn shapes_broadcast_and_types_follow_the_op() {
        let n = |op: &str| node(op, 2, Attrs::new());
        let a = desc(DType::F32, &[2, 1, 3]);
        let b = desc(DType::F32, &[4, 1]);
        assert_eq!(infer(&n("Add"), &[&a, &b]).unwrap(), vec![desc(DType::F32, &[2, 4, 3])]);
        assert_eq!(infer(&n("Less"), &[&a, &b]).unwrap(), vec![desc(DType::Bool, &[2, 4, 3])]);
        let i = desc(DType::I64, &[3]);
        assert!(infer(&n("Mul"), &[&a, &i]).is_err(), "types must match");
        assert_eq!(infer(&n("Pow"), &[&a, &i]).unwrap(), vec![desc(DType::F32, &[2, 1, 3])]);
        assert!(infer(&n("Add"), &[&a, &desc(DType::F32, &[2])]).is_err());
        assert!(infer(&n("And"), &[&a, &a]).is_err(), "logic takes bools");

        let chw = desc(DType::F32, &[1, 3, 4, 4]);
        let slope = desc(DType::F32, &[3, 1, 1]);
        assert_eq!(infer(&n("PRelu"), &[&chw, &slope]).unwrap(), vec![chw.clone()]);
        assert!(infer(&n("PRelu"), &[&slope, &chw]).is_err(), "only the slope broadcasts");

        let sum = node("Sum", 3, Attrs::new());
        let s = desc(DType::F32, &[]);
        assert_eq!(infer(&sum, &[&a, &b, &s]).unwrap(), vec![desc(DType::F32, &[2, 4, 3])]);
        assert_eq!(infer(&sum, &[&s]).unwrap(), vec![s.clone()]);

        let w = node("Where", 3, Attrs::new());
        let c = desc(DType::Bool, &[4, 1]);
        let x = desc(DType::I64, &[3]);
        assert_eq!(infer(&w, &[&c, &x, &x]).unwrap(), vec![desc(DType::I64, &[4, 3])]);
        assert!(infer(&w, &[&x, &x, &x]).is_err(), "the condition is bool");

        let isnan = node("IsNaN", 1, Attrs::new());
        assert_eq!(infer(&isnan, &[&a]).unwrap(), vec![desc(DType::Bool, &[2, 1, 3])]);
        assert!(infer(&node("Relu", 1, Attrs::new()), &[&a, &a]).is_err());
    }
}
