//! MatMul, Gemm and Einsum: attribute defaults, shape rules, and Einsum's equation turned into
//! integer labels so that the runtime (`ops/src/matmul/cpu.rs`) never parses it.
//!
//! Canonical Gemm: `transA`, `transB`, `alpha`, `beta`, with C only when the model gives one
//! (or when post-ops read extra inputs).
//! Canonical Gemm and MatMul also have `post_ops` and `post_params`, written empty here and
//! filled by the `fuse` pass, as for Conv (see `conv.rs`): each binary post-op reads the next
//! extra input after A and B (MatMul) or A, B and C (Gemm).
//! Canonical Einsum: `input0_labels`, `input1_labels` (two operands) and `output_labels`, one
//! label per axis with the ellipsis expanded for the operands' ranks and implicit output made
//! explicit; `equation` stays for people reading the bundle. One or two operands.

pub(crate) mod cpu;
mod det;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: crate::cpu::post::in_place_after_add,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::conv::{check_post_operands, no_post_ops, post_operands};
use crate::lower::{LowerCx, OpResult, broadcast_shapes, op_err};
use crate::registry::{Family, OpDef};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("MatMul", lower_matmul, infer_matmul),
    OpDef::new("Gemm", lower_gemm, infer_gemm),
    OpDef::new("Einsum", lower_einsum, infer_einsum),
    OpDef::new("Det", det::lower, det::infer)
        .cpu_only("Det has no Vulkan kernel: it runs on the CPU as a submodel of its own"),
];

/// Whether a MatMul or Gemm dequantizes its own 8-bit B (`dequantize_b` = 1; the compiler's
/// `dequantize_in_gemm` pass makes them): float32 A (and C, and output), int8 or uint8 B, and
/// one more input of its own, last (after Gemm's C, before post-op operands): B's
/// dequantization, float32 `[2, N]`, row 0 the scales and row 1 the zero points (whole numbers
/// in B's range), one of each per column of the product. Both backends read it and never
/// expand B.
pub fn dequantizes_b(attrs: &Attrs) -> bool {
    attrs.int_or("dequantize_b", 0).is_ok_and(|v| v != 0)
}

/// The shape of a [`dequantizes_b`] product's dequantization input for `n` columns.
pub fn dequantization_shape(n: usize) -> [usize; 2] {
    [2, n]
}

/// All inputs share one element type, which the output takes, except a [`dequantizes_b`]
/// product's 8-bit B and a float16 B beside float32 operands (`crate::takes_f16_weights`).
fn same_dtype(node: &Node, inputs: &[&TensorDesc]) -> OpResult<DType> {
    let first = inputs.first().ok_or_else(|| op_err!("{} needs inputs", node.op))?.dtype;
    let b = inputs.get(1).map(|d| d.dtype);
    let quantized_b = dequantizes_b(&node.attrs);
    if quantized_b && (first != DType::F32 || !matches!(b, Some(DType::I8 | DType::U8))) {
        return Err(op_err!("a dequantized B is int8 or uint8 beside float32 operands"));
    }
    let half_b = first == DType::F32 && b == Some(DType::F16);
    let narrow_b = quantized_b || half_b;
    let others = inputs.iter().enumerate().filter(|&(i, _)| !(narrow_b && i == 1));
    match others.map(|(_, d)| d).find(|d| d.dtype != first) {
        Some(d) => Err(op_err!("inputs mix {first} and {}", d.dtype)),
        None => Ok(first),
    }
}

/// Splits off a [`dequantizes_b`] product's dequantization input (the last of `own`) and
/// checks its shape for `n` columns.
fn dequantization<'a, 'b>(
    node: &Node,
    own: &'a [&'b TensorDesc],
    n: usize,
) -> OpResult<&'a [&'b TensorDesc]> {
    if !dequantizes_b(&node.attrs) {
        return Ok(own);
    }
    let (dq, rest) = own.split_last().filter(|(_, rest)| rest.len() >= 2).ok_or_else(|| {
        op_err!("{} of an 8-bit B takes B's dequantization after its operands", node.op)
    })?;
    if dq.shape != dequantization_shape(n) {
        return Err(op_err!(
            "{}: B's dequantization is {:?}, not [2, {n}] (scales and zero points per column)",
            node.op,
            dq.shape
        ));
    }
    Ok(rest)
}

fn lower_matmul(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    node.attrs = no_post_ops();
    Ok(())
}

/// Numpy's matmul shape: 1-D operands are promoted and the added dimension dropped; batch
/// dimensions broadcast.
fn infer_matmul(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (own, operands) = post_operands(node, inputs, 2 + usize::from(dequantizes_b(&node.attrs)))?;
    let dtype = same_dtype(node, own)?;
    let [a, b, ..] = own else {
        return Err(op_err!("MatMul takes 2 inputs, got {}", own.len()));
    };
    let out = TensorDesc::new(dtype, matmul_shape(&a.shape, &b.shape)?);
    let product = dequantization(node, own, out.shape.last().copied().unwrap_or(1))?;
    if product.len() != 2 {
        return Err(op_err!("MatMul takes 2 inputs, got {}", product.len()));
    }
    check_post_operands(node, operands, &out)?;
    Ok(vec![out])
}

/// Numpy's matmul shape of `sa` times `sb` (MatMul, and the quantize family's integer products).
pub(crate) fn matmul_shape(sa: &[usize], sb: &[usize]) -> OpResult<Vec<usize>> {
    if sa.is_empty() || sb.is_empty() {
        return Err(op_err!("MatMul operands must have a dimension, got {sa:?} and {sb:?}"));
    }
    let (ba, k) = (&sa[..sa.len().saturating_sub(2)], sa[sa.len() - 1]);
    let (bb, kb) = match sb {
        [k] => (&sb[..0], *k),
        [batch @ .., k, _] => (batch, *k),
        [] => unreachable!("checked above"),
    };
    if k != kb {
        return Err(op_err!("MatMul of {sa:?} and {sb:?}: inner dimensions differ"));
    }
    let mut shape = broadcast_shapes(&[ba, bb])?;
    if let [.., m, _] = sa {
        shape.push(*m);
    }
    if let [.., _, n] = sb {
        shape.push(*n);
    }
    Ok(shape)
}

fn lower_gemm(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    let a = &node.attrs;
    node.attrs = no_post_ops()
        .with("transA", AttrValue::Int(a.int_or("transA", 0)?))
        .with("transB", AttrValue::Int(a.int_or("transB", 0)?))
        .with("alpha", AttrValue::Float(f64::from(a.float_or("alpha", 1.0)?)))
        .with("beta", AttrValue::Float(f64::from(a.float_or("beta", 1.0)?)));
    // Without C the product is all there is.
    if node.inputs.get(2).is_some_and(Option::is_none) {
        node.inputs.truncate(2);
    }
    Ok(())
}

fn infer_gemm(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let (own, operands) = post_operands(node, inputs, 3 + usize::from(dequantizes_b(&node.attrs)))?;
    let dtype = same_dtype(node, own)?;
    let (ta, tb) = (node.attrs.int("transA")? != 0, node.attrs.int("transB")? != 0);
    let (Some(a), Some(b)) = (own.first(), own.get(1)) else {
        return Err(op_err!("Gemm takes 2 or 3 inputs, got {}", own.len()));
    };
    let (&[a0, a1], &[b0, b1]) = (a.shape.as_slice(), b.shape.as_slice()) else {
        return Err(op_err!("Gemm takes 2-D A and B, got {:?} and {:?}", a.shape, b.shape));
    };
    let ((m, k), (kb, n)) =
        (if ta { (a1, a0) } else { (a0, a1) }, if tb { (b1, b0) } else { (b0, b1) });
    if k != kb {
        return Err(op_err!("Gemm of {:?} and {:?}: inner dimensions differ", a.shape, b.shape));
    }
    if let Some(c) = dequantization(node, own, n)?.get(2) {
        let fits = c.shape.len() <= 2
            && c.shape.iter().rev().zip([n, m]).all(|(&d, want)| d == 1 || d == want);
        if !fits {
            return Err(op_err!(
                "Gemm's C of shape {:?} does not broadcast to [{m}, {n}]",
                c.shape
            ));
        }
    }
    let out = TensorDesc::new(dtype, vec![m, n]);
    check_post_operands(node, operands, &out)?;
    Ok(vec![out])
}

/// An Einsum equation as integer labels per operand and for the output.
#[derive(Debug, PartialEq)]
struct Labels {
    inputs: Vec<Vec<i64>>,
    output: Vec<i64>,
}

/// One term's subscripts: letters, and where its ellipsis stands if it has one.
fn parse_term(term: &str) -> OpResult<(Vec<u8>, Option<usize>)> {
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut rest = term.as_bytes();
    while let Some((&c, tail)) = rest.split_first() {
        if rest.starts_with(b"...") && ellipsis.is_none() {
            ellipsis = Some(letters.len());
            rest = &rest[3..];
        } else if c.is_ascii_alphabetic() {
            letters.push(c);
            rest = tail;
        } else {
            return Err(op_err!("Einsum term '{term}' has an unexpected '{}'", c as char));
        }
    }
    Ok((letters, ellipsis))
}

/// Parses `equation` for operands of the given ranks. Letters become their ASCII codes and
/// ellipsis axes codes from 256 (aligned to the right, as they broadcast), then all labels are
/// renumbered densely in order of first appearance.
fn einsum_labels(equation: &str, ranks: &[usize]) -> OpResult<Labels> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(op_err!(
            "Einsum '{equation}' names {} operands, the node has {}",
            terms.len(),
            ranks.len()
        ));
    }
    let ell = |j: usize| 256 + j as i64;
    let mut inputs = Vec::with_capacity(terms.len());
    let mut ell_rank = 0;
    let parsed: Vec<_> = terms.iter().map(|t| parse_term(t)).collect::<OpResult<_>>()?;
    for ((letters, ellipsis), &rank) in parsed.iter().zip(ranks) {
        let extra = rank.checked_sub(letters.len()).filter(|&e| e == 0 || ellipsis.is_some());
        let extra = extra.ok_or_else(|| {
            op_err!("Einsum '{equation}': a term has {} letters for rank {rank}", letters.len())
        })?;
        ell_rank = ell_rank.max(extra);
        inputs.push((letters, *ellipsis, extra));
    }
    let inputs: Vec<Vec<i64>> = inputs
        .into_iter()
        .map(|(letters, ellipsis, extra)| {
            let at = ellipsis.unwrap_or(letters.len());
            let mut l: Vec<i64> = letters[..at].iter().map(|&c| i64::from(c)).collect();
            l.extend((ell_rank - extra..ell_rank).map(ell));
            l.extend(letters[at..].iter().map(|&c| i64::from(c)));
            l
        })
        .collect();
    let output: Vec<i64> = match rhs {
        Some(rhs) => {
            let (letters, ellipsis) = parse_term(rhs)?;
            let at = ellipsis.unwrap_or(letters.len());
            let mut l: Vec<i64> = letters[..at].iter().map(|&c| i64::from(c)).collect();
            if ellipsis.is_some() {
                l.extend((0..ell_rank).map(ell));
            }
            l.extend(letters[at..].iter().map(|&c| i64::from(c)));
            for (i, x) in l.iter().enumerate() {
                if l[..i].contains(x) || !inputs.iter().flatten().any(|y| y == x) {
                    return Err(op_err!(
                        "Einsum '{equation}': output label {} is repeated or in no input",
                        *x as u8 as char
                    ));
                }
            }
            l
        }
        // Implicit output: the ellipsis axes, then letters used once, in alphabetical (ASCII)
        // order, as numpy does.
        None => {
            let all: Vec<i64> = inputs.iter().flatten().copied().collect();
            let mut once: Vec<i64> = all
                .iter()
                .copied()
                .filter(|&x| x < 256 && all.iter().filter(|&&y| y == x).count() == 1)
                .collect();
            once.sort_unstable();
            (0..ell_rank).map(ell).chain(once).collect()
        }
    };
    // Dense renumbering keeps the runtime's per-label tables small.
    let mut order: Vec<i64> = Vec::new();
    let mut dense = |x: i64| match order.iter().position(|&y| y == x) {
        Some(p) => p as i64,
        None => {
            order.push(x);
            order.len() as i64 - 1
        }
    };
    let inputs: Vec<Vec<i64>> =
        inputs.into_iter().map(|l| l.into_iter().map(&mut dense).collect()).collect();
    let output = output.into_iter().map(&mut dense).collect();
    Ok(Labels { inputs, output })
}

fn lower_einsum(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let n = node.inputs.len();
    if !(1..=2).contains(&n) {
        return Err(op_err!("Einsum with {n} operands is not supported (1 or 2)"));
    }
    let ranks: Vec<usize> =
        (0..n).map(|i| cx.input(i).map(|d| d.shape.len())).collect::<OpResult<_>>()?;
    let equation = node.attrs.text("equation")?.to_string();
    let labels = einsum_labels(&equation, &ranks)?;
    let mut attrs = Attrs::new()
        .with("equation", AttrValue::Text(equation))
        .with("output_labels", AttrValue::Ints(labels.output));
    for (i, l) in labels.inputs.into_iter().enumerate() {
        attrs.set(&format!("input{i}_labels"), AttrValue::Ints(l));
    }
    node.attrs = attrs;
    Ok(())
}

fn infer_einsum(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let dtype = same_dtype(node, inputs)?;
    let mut sizes: Vec<(i64, usize)> = Vec::new();
    for (i, d) in inputs.iter().enumerate() {
        let labels = node.attrs.ints(&format!("input{i}_labels"))?;
        if labels.len() != d.shape.len() {
            return Err(op_err!(
                "Einsum input {i} of shape {:?} has {} labels",
                d.shape,
                labels.len()
            ));
        }
        for (&l, &n) in labels.iter().zip(&d.shape) {
            match sizes.iter_mut().find(|(x, _)| *x == l) {
                None => sizes.push((l, n)),
                Some((_, s)) if *s == 1 => *s = n,
                Some((_, s)) if n == 1 || n == *s => {}
                Some((_, s)) => {
                    return Err(op_err!(
                        "Einsum label {l} has sizes {s} and {n} (shapes {:?})",
                        d.shape
                    ));
                }
            }
        }
    }
    let shape = node
        .attrs
        .ints("output_labels")?
        .iter()
        .map(|l| {
            sizes
                .iter()
                .find(|(x, _)| x == l)
                .map(|&(_, s)| s)
                .ok_or_else(|| op_err!("Einsum output label {l} is in no input"))
        })
        .collect::<OpResult<Vec<usize>>>()?;
    Ok(vec![TensorDesc::new(dtype, shape)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_schema::DType;

    fn node(op: &str, n_in: usize, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            domain: String::new(),
            inputs: (0..n_in).map(Some).collect(),
            outputs: vec![n_in],
            attrs,
        }
    }

    /// Lowers then infers, as the compiler's passes do.
    fn shape_of(mut n: Node, opset: i64, inputs: &[&[usize]]) -> OpResult<(Node, Vec<usize>)> {
        let descs: Vec<TensorDesc> =
            inputs.iter().map(|s| TensorDesc::new(DType::F32, s.to_vec())).collect();
        let cx = LowerCx {
            opset,
            inputs: n.inputs.iter().map(|i| i.map(|i| &descs[i])).collect(),
            consts: vec![None; n.inputs.len()],
        };
        let def = OPS.iter().find(|d| d.name == n.op).unwrap();
        (def.lower)(&mut n, &cx)?;
        let present: Vec<&TensorDesc> = n.present_inputs().map(|i| &descs[i]).collect();
        let out = (def.infer)(&n, &present)?.remove(0).shape;
        Ok((n, out))
    }

    #[test]
    fn matmul_shapes_follow_numpy() {
        let mm = |a: &[usize], b: &[usize]| {
            shape_of(node("MatMul", 2, Attrs::new()), 13, &[a, b]).map(|r| r.1)
        };
        assert_eq!(mm(&[3, 1, 3, 4], &[1, 2, 4, 2]).unwrap(), [3, 2, 3, 2]);
        assert_eq!(mm(&[1, 40, 120], &[120, 360]).unwrap(), [1, 40, 360]);
        assert_eq!(mm(&[4], &[2, 4, 1]).unwrap(), [2, 1]);
        assert_eq!(mm(&[1, 2, 4, 3], &[3]).unwrap(), [1, 2, 4]);
        assert_eq!(mm(&[3], &[3]).unwrap(), Vec::<usize>::new());
        assert!(mm(&[2, 3], &[2, 3]).is_err());
        assert!(mm(&[2, 2, 3], &[3, 3, 1]).is_err());
    }

    #[test]
    fn gemm_fills_defaults_and_drops_an_absent_c() {
        let mut n = node("Gemm", 3, Attrs::new().with("transB", AttrValue::Int(1)));
        n.inputs[2] = None;
        let (n, shape) = shape_of(n, 13, &[&[2, 3], &[4, 3]]).unwrap();
        assert_eq!(shape, [2, 4]);
        assert_eq!(n.inputs.len(), 2);
        assert_eq!(n.attrs.int("transA"), Ok(0));
        assert_eq!(n.attrs.float("alpha"), Ok(1.0));
        assert_eq!(n.attrs.float("beta"), Ok(1.0));
        let with_c =
            |c: &[usize]| shape_of(node("Gemm", 3, Attrs::new()), 13, &[&[2, 3], &[3, 4], c]);
        assert!(with_c(&[4]).is_ok() && with_c(&[2, 1]).is_ok() && with_c(&[]).is_ok());
        assert!(with_c(&[3]).is_err() && with_c(&[1, 2, 4]).is_err());
    }

    fn labels(eq: &str, ranks: &[usize]) -> (Vec<Vec<i64>>, Vec<i64>) {
        let l = einsum_labels(eq, ranks).unwrap();
        (l.inputs, l.output)
    }

    #[test]
    fn einsum_equations_become_dense_labels() {
        assert_eq!(labels("ij,jk->ik", &[2, 2]), (vec![vec![0, 1], vec![1, 2]], vec![0, 2]));
        assert_eq!(
            labels("bhid, bhjd -> bhij", &[4, 4]),
            (vec![vec![0, 1, 2, 3], vec![0, 1, 4, 3]], vec![0, 1, 2, 4])
        );
        // Ellipses align right: A's two batch axes, B's one (the inner of A's).
        assert_eq!(
            labels("...ij,...jk->...ik", &[4, 3]),
            (vec![vec![0, 1, 2, 3], vec![1, 3, 4]], vec![0, 1, 2, 4])
        );
        assert_eq!(labels("...ii ->...i", &[3]), (vec![vec![0, 1, 1]], vec![0, 1]));
        // Implicit output: letters used once, in ASCII order (B before a).
        assert_eq!(labels("ba,aB", &[2, 2]), (vec![vec![0, 1], vec![1, 2]], vec![2, 0]));
        assert_eq!(labels("i,i", &[1, 1]), (vec![vec![0], vec![0]], vec![]));
        assert_eq!(labels("->", &[0]), (vec![vec![]], vec![]));
        assert!(einsum_labels("ij->k", &[2]).is_err());
        assert!(einsum_labels("ij->ii", &[2]).is_err());
        assert!(einsum_labels("ijk->i", &[2]).is_err());
        assert!(einsum_labels("ij,jk", &[2]).is_err());
        assert!(einsum_labels("i$->i", &[2]).is_err());
    }

    #[test]
    fn einsum_lowers_and_infers() {
        let eq = |e: &str| Attrs::new().with("equation", AttrValue::Text(e.into()));
        let (n, shape) =
            shape_of(node("Einsum", 2, eq("...ij,...jk")), 12, &[&[5, 2, 3], &[1, 3, 4]]).unwrap();
        assert_eq!(shape, [5, 2, 4]);
        assert_eq!(n.attrs.ints("output_labels").unwrap(), [0, 1, 3]);
        assert_eq!(shape_of(node("Einsum", 1, eq("ij->ji")), 12, &[&[3, 4]]).unwrap().1, [4, 3]);
        assert!(shape_of(node("Einsum", 2, eq("ij,jk->ik")), 12, &[&[2, 3], &[4, 5]]).is_err());
        assert!(shape_of(node("Einsum", 3, eq("i,i,i->")), 12, &[&[2], &[2], &[2]]).is_err());
    }

    #[test]
    fn post_op_operands_follow_the_own_inputs() {
        let f = |s: &[usize]| TensorDesc::new(DType::F32, s.to_vec());
        let (a, b, c, y) = (f(&[2, 3]), f(&[3, 4]), f(&[4]), f(&[2, 4]));
        let (n, _) = shape_of(node("MatMul", 2, Attrs::new()), 13, &[&[2, 3], &[3, 4]]).unwrap();
        assert_eq!(n.attrs, no_post_ops());
        let with = |op: &str, ops: &str| {
            let mut n = node(op, 0, no_post_ops());
            n.attrs.set("post_ops", AttrValue::Text(ops.into()));
            if op == "Gemm" {
                for (k, v) in [("transA", 0), ("transB", 0)] {
                    n.attrs.set(k, AttrValue::Int(v));
                }
                for k in ["alpha", "beta"] {
                    n.attrs.set(k, AttrValue::Float(1.0));
                }
            }
            n
        };
        assert_eq!(
            infer_matmul(&with("MatMul", "Add"), &[&a, &b, &y]).unwrap(),
            std::slice::from_ref(&y)
        );
        assert!(infer_matmul(&with("MatMul", "Add"), &[&a, &b]).is_err());
        // A bias along the columns is a block of the trailing dims; a column of rows is not.
        assert!(infer_matmul(&with("MatMul", "Relu,Mul"), &[&a, &b, &c]).is_ok());
        assert!(infer_matmul(&with("MatMul", "Relu,Mul"), &[&a, &b, &f(&[2, 1])]).is_err());
        let gemm = with("Gemm", "Sub,Tanh");
        assert_eq!(infer_gemm(&gemm, &[&a, &b, &c, &y]).unwrap(), std::slice::from_ref(&y));
        assert!(infer_gemm(&gemm, &[&a, &b, &y]).is_err(), "C must be present");
    }
}
