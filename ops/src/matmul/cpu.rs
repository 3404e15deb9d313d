//! MatMul, Gemm and Einsum: each becomes a list of strided axes for one product engine
//! (`product.rs`), so all three share the same GEMM calls and none copies its operands.
//!
//! Canonical attributes: Gemm reads `transA`, `transB` (ints), `alpha`, `beta` (floats) and
//! has 2 inputs or 3 (with C); Gemm and MatMul read the post-ops `post_ops`, `post_params`
//! (see [`crate::cpu::post`]; C is present when post-ops read extra inputs, which follow A, B and
//! C), applied to each GEMM call's block of output when the calls fill separate contiguous
//! blocks, else to the whole output; with a leading `Add` the output starts as the residual
//! and the product accumulates onto it (so it may run in place over it). Einsum reads `input0_labels`, `input1_labels` (for a second
//! operand) and `output_labels`: one integer label per axis, with the equation's ellipsis
//! already expanded by the compiler, a repeated label in one operand meaning its diagonal.
//! Element types: f32, f64, i32, i64. A float32 MatMul or Gemm may have an int8 or uint8 B
//! followed by its dequantization (`crate::dequantizes_b`; the compiler's `dequantize_in_gemm`
//! pass): the GEMM dequantizes B as it packs it; or a float16 B (`crate::takes_f16_weights`;
//! the compiler's `widen_f16`), which it widens as it packs it.

use crate::cpu::post::PostOps;
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub(crate) mod product;
use product::{Axis, Levels, Plan, Quantized, Scalar};

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if cx.op == "Det" {
        return super::det::prepare(cx);
    }
    let quantized_b = cx.op != "Einsum" && crate::dequantizes_b(cx.attrs);
    // A float16 B beside a float32 A (`crate::takes_f16_weights`), widened as it is packed.
    let half_b = cx.op != "Einsum"
        && !quantized_b
        && cx.inputs.first().is_some_and(|a| a.dtype == DType::F32)
        && cx.inputs.get(1).is_some_and(|b| b.dtype == DType::F16);
    // B's dequantization is one more input of the product's own.
    let q = usize::from(quantized_b);
    let (post, own) = match cx.op {
        "Gemm" => PostOps::new(cx, 2 + q..=3 + q)?,
        "MatMul" => PostOps::new(cx, 2 + q..=2 + q)?,
        _ => {
            cx.expect_arity(1..=2, 1)?;
            (PostOps::default(), cx.inputs.len())
        }
    };
    let dtype = cx.inputs[0].dtype;
    if !matches!(dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
        return Err(cx.dtype_error(dtype));
    }
    let mixed = (cx.inputs.iter().enumerate())
        .filter(|&(i, _)| !((quantized_b || half_b) && i == 1))
        .map(|(_, d)| d)
        .chain(cx.outputs)
        .find(|d| d.dtype != dtype);
    if let Some(d) = mixed {
        return Err(invalid!("{} mixes {dtype} and {}", cx.op, d.dtype));
    }
    let shapes: Vec<&[usize]> = cx.inputs[..own - q].iter().map(|d| d.shape.as_slice()).collect();
    let (shape, axes, alpha, bias) = match cx.op {
        "MatMul" => {
            let (shape, axes) = matmul_axes(shapes[0], shapes[1])?;
            (shape, axes, 1.0, None)
        }
        "Gemm" => gemm_axes(cx, &shapes)?,
        "Einsum" => {
            let (shape, axes) = einsum_axes(cx, &shapes)?;
            (shape, axes, 1.0, None)
        }
        op => return Err(KernelError::UnknownOp(op.to_string())),
    };
    if cx.outputs[0].shape != shape {
        return Err(invalid!(
            "{} makes shape {shape:?}, the step declares {:?}",
            cx.op,
            cx.outputs[0].shape
        ));
    }
    let plan = Plan::new(&axes);
    let dequantize = match (quantized_b, half_b) {
        (true, _) => Some(Dequantize::new(cx, own - 1, &shape, &plan)?),
        (false, true) => Some(Dequantize { input: None, n: 0 }),
        (false, false) => None,
    };
    let [ea, eb, ec] = plan.extents();
    let unary = own == 1;
    let eb_max = if unary { 1 } else { cx.inputs[1].elements() };
    if ea > cx.inputs[0].elements() || eb > eb_max || ec > cx.outputs[0].elements() {
        return Err(invalid!("{} axes reach past its operands", cx.op));
    }
    Ok(Box::new(ProductKernel { dtype, plan, alpha, bias, unary, post, own, dequantize }))
}

/// A B that the GEMM widens as it packs it: 8-bit integers with their dequantization input
/// (`crate::dequantizes_b`: per column of the product, scales then zero points), or float16.
#[derive(Debug)]
struct Dequantize {
    /// The input holding the scales and zero points; none for float16.
    input: Option<usize>,
    n: usize,
}

impl Dequantize {
    fn new(cx: &OpCx, input: usize, shape: &[usize], plan: &Plan) -> Result<Self, KernelError> {
        let (b, y) = (&cx.inputs[1], &cx.outputs[0]);
        if !matches!(b.dtype, DType::I8 | DType::U8) || y.dtype != DType::F32 {
            return Err(invalid!(
                "{} dequantizes an int8 or uint8 B into float32, not {} into {}",
                cx.op,
                b.dtype,
                y.dtype
            ));
        }
        if b.shape.len() != 2 || !plan.b_is_one_matrix() {
            return Err(invalid!("{} dequantizes a 2-D B, not one of shape {:?}", cx.op, b.shape));
        }
        let n = shape.last().copied().unwrap_or(1);
        let dq = &cx.inputs[input];
        if dq.dtype != DType::F32 || dq.shape != crate::dequantization_shape(n) {
            return Err(invalid!(
                "{}: B's dequantization is {} {:?}, not float32 [2, {n}] (scales and zero \
                 points per column)",
                cx.op,
                dq.dtype,
                dq.shape
            ));
        }
        Ok(Self { input: Some(input), n })
    }

    /// B's values and their dequantization, from the step's inputs.
    fn operand<'a>(&self, inputs: &'a [TensorRef]) -> Result<Quantized<'a>, KernelError> {
        let Some(input) = self.input else {
            let b = inputs.get(1).ok_or_else(|| invalid!("missing the float16 B"))?;
            return Ok(Quantized { levels: Levels::F16(b.as_slice()?), scale: &[], zero: &[] });
        };
        let (Some(b), Some(dq)) = (inputs.get(1), inputs.get(input)) else {
            return Err(invalid!("missing the 8-bit B or its dequantization"));
        };
        let levels = match b.dtype {
            DType::I8 => Levels::I8(b.as_slice::<i8>()?),
            _ => Levels::U8(b.as_slice::<u8>()?),
        };
        let (scale, zero) = dq.as_slice::<f32>()?.split_at(self.n);
        Ok(Quantized { levels, scale, zero })
    }
}

/// A product plan plus what the output holds before the product is added to it.
struct ProductKernel {
    dtype: DType,
    plan: Plan,
    alpha: f32,
    /// Gemm's `beta * C`, broadcast to (M, N); the output starts at zero without it.
    bias: Option<Bias>,
    /// One operand: the second factor is the constant 1 (Einsum transposes, sums, diagonals).
    unary: bool,
    /// Post-ops (f32 only), whose operands follow the `own` inputs.
    post: PostOps,
    own: usize,
    /// B is 8-bit integers or float16, widened by the GEMM.
    dequantize: Option<Dequantize>,
}

/// Applies post-ops to a block of output at an element offset, for one element type.
type Apply<T> = fn(&PostOps, &mut [T], usize, &[&[T]]) -> Result<(), KernelError>;

impl Kernel for ProductKernel {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        self.compute(inputs, outputs, None)
    }

    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        if !self.post.accumulates() || aliased != self.own {
            return Err(invalid!("cannot run in place over input {aliased}"));
        }
        self.compute(inputs, outputs, Some(aliased))
    }
}

impl ProductKernel {
    /// Runs the product; `aliased` is the input the output was written over, if any.
    fn compute(
        &self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        aliased: Option<usize>,
    ) -> Result<(), KernelError> {
        // Post-ops exist only on f32 (checked in prepare); the other types have none to apply.
        fn none<T>(_: &PostOps, _: &mut [T], _: usize, _: &[&[T]]) -> Result<(), KernelError> {
            Ok(())
        }
        match self.dtype {
            DType::F32 => self.run_as::<f32>(inputs, outputs, aliased, PostOps::apply),
            DType::F64 => self.run_as::<f64>(inputs, outputs, aliased, none),
            DType::I32 => self.run_as::<i32>(inputs, outputs, aliased, none),
            DType::I64 => self.run_as::<i64>(inputs, outputs, aliased, none),
            d => Err(invalid!("product kernel prepared for unsupported {d}")),
        }
    }

    fn run_as<T: Scalar>(
        &self,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
        aliased: Option<usize>,
        apply: Apply<T>,
    ) -> Result<(), KernelError> {
        let input = |i: usize| {
            inputs
                .get(i)
                .ok_or_else(|| invalid!("missing input {i}"))?
                .as_slice::<T>()
                .map_err(KernelError::from)
        };
        let out =
            outputs.first_mut().ok_or_else(|| invalid!("missing output"))?.as_slice_mut::<T>()?;
        let one = [T::one()];
        let a = input(0)?;
        let b = match (&self.dequantize, self.unary) {
            (Some(_), _) | (None, true) => &one[..],
            (None, false) => input(1)?,
        };
        let quantized = match &self.dequantize {
            Some(d) => Some(d.operand(inputs)?),
            None => None,
        };
        let extras = self.post.operands::<T>(inputs, self.own, out.len(), aliased)?;
        let accumulate = self.post.accumulates();
        if accumulate || self.bias.is_none() {
            self.post.start(out, &extras, aliased.is_some())?;
        }
        if let Some(bias) = &self.bias {
            bias.fill(input(2)?, out, accumulate)?;
        }
        let post = self.post.applies();
        let done = |block: &mut [T], at| match post {
            true => apply(&self.post, block, at, &extras),
            false => Ok(()),
        };
        let alpha = T::from_f32(self.alpha);
        match &quantized {
            Some(b) => self.plan.run_dequantized(alpha, a, b, out, done),
            None => self.plan.run(alpha, a, b, out, done),
        }
    }
}

/// Gemm's C, unidirectionally broadcast to the (M, N) output: `out[i, j] = beta * C[i*rs + j*cs]`
/// (or `+=` onto a residual).
#[derive(Debug)]
struct Bias {
    beta: f32,
    m: usize,
    n: usize,
    rs: usize,
    cs: usize,
    len: usize,
}

impl Bias {
    fn fill<T: Scalar>(&self, c: &[T], out: &mut [T], add: bool) -> Result<(), KernelError> {
        if c.len() != self.len || out.len() != self.m * self.n {
            return Err(invalid!(
                "Gemm's C or output has the wrong size ({} and {} elements)",
                c.len(),
                out.len()
            ));
        }
        let beta = T::from_f32(self.beta);
        for (i, row) in out.chunks_exact_mut(self.n.max(1)).enumerate() {
            for (j, o) in row.iter_mut().enumerate() {
                let v = beta.mul(c[i * self.rs + j * self.cs]);
                *o = if add { o.add(v) } else { v };
            }
        }
        Ok(())
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// MatMul with numpy's rules: a 1-D operand is promoted to a matrix (a row for A, a column
/// for B) and the added dimension is left out of the result; batch dimensions broadcast.
pub(crate) fn matmul_axes(
    a: &[usize],
    b: &[usize],
) -> Result<(Vec<usize>, Vec<Axis>), KernelError> {
    // (batch dims, (rows, cols)); a vector is a row when it is A, a column when it is B.
    fn split(s: &[usize], row: bool) -> Result<(&[usize], (usize, usize)), KernelError> {
        match s {
            [] => Err(invalid!("MatMul operands need at least one dimension")),
            [v] if row => Ok((&[], (1, *v))),
            [v] => Ok((&[], (*v, 1))),
            [batch @ .., r, c] => Ok((batch, (*r, *c))),
        }
    }
    let (ba, (m, k)) = split(a, true)?;
    let (bb, (kb, n)) = split(b, false)?;
    if k != kb {
        return Err(invalid!("MatMul of {a:?} and {b:?}: inner dimensions differ"));
    }
    let rank = ba.len().max(bb.len());
    let dim = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
    let mut batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let (da, db) = (dim(ba, i), dim(bb, i));
        if da != db && da != 1 && db != 1 {
            return Err(invalid!("MatMul of {a:?} and {b:?}: batch dimensions do not broadcast"));
        }
        batch.push(if da == 1 { db } else { da });
    }
    // Batch axes, innermost first, with each operand's running contiguous stride.
    let mut axes = Vec::with_capacity(rank + 3);
    let (mut sa, mut sb, mut sc) = (m * k, k * n, m * n);
    for i in (0..rank).rev() {
        let (da, db) = (dim(ba, i), dim(bb, i));
        let stride = |d: usize, s: usize| if d == 1 { 0 } else { s };
        axes.push(Axis::new(batch[i], stride(da, sa), stride(db, sb), sc));
        (sa, sb, sc) = (sa * da, sb * db, sc * batch[i]);
    }
    axes.extend([Axis::new(m, k, 0, n), Axis::new(n, 0, 1, 1), Axis::new(k, 1, n, 0)]);
    let mut shape = batch;
    if a.len() > 1 {
        shape.push(m);
    }
    if b.len() > 1 {
        shape.push(n);
    }
    Ok((shape, axes))
}

type Product = (Vec<usize>, Vec<Axis>, f32, Option<Bias>);

/// Gemm: `alpha * op(A) * op(B) + beta * C`, op transposing when `transA`/`transB` is set.
fn gemm_axes(cx: &OpCx, shapes: &[&[usize]]) -> Result<Product, KernelError> {
    let (ta, tb) = (cx.attrs.int("transA")? != 0, cx.attrs.int("transB")? != 0);
    let (alpha, beta) = (cx.attrs.float("alpha")?, cx.attrs.float("beta")?);
    let (&[a0, a1], &[b0, b1]) = (shapes[0], shapes[1]) else {
        return Err(invalid!("Gemm takes 2-D A and B, got {:?} and {:?}", shapes[0], shapes[1]));
    };
    let ((m, k), (kb, n)) =
        (if ta { (a1, a0) } else { (a0, a1) }, if tb { (b1, b0) } else { (b0, b1) });
    if k != kb {
        return Err(invalid!(
            "Gemm of {:?} and {:?}: inner dimensions differ",
            shapes[0],
            shapes[1]
        ));
    }
    let axes = vec![
        Axis::new(m, if ta { 1 } else { k }, 0, n),
        Axis::new(n, 0, if tb { k } else { 1 }, 1),
        Axis::new(k, if ta { m } else { 1 }, if tb { 1 } else { n }, 0),
    ];
    let bias = match shapes.get(2) {
        None => None,
        Some(c) => {
            let (cr, cc) = match **c {
                [] => (1, 1),
                [cc] => (1, cc),
                [cr, cc] => (cr, cc),
                _ => return Err(invalid!("Gemm's C has rank {}, at most 2", c.len())),
            };
            if !(cr == 1 || cr == m) || !(cc == 1 || cc == n) {
                return Err(invalid!("Gemm's C of shape {c:?} does not broadcast to [{m}, {n}]"));
            }
            Some(Bias {
                beta,
                m,
                n,
                rs: if cr == 1 { 0 } else { cc },
                cs: if cc == 1 { 0 } else { 1 },
                len: cr * cc,
            })
        }
    };
    Ok((vec![m, n], axes, alpha, bias))
}

/// Einsum from its canonical labels: each label is one axis of the product, its stride in an
/// operand the sum of the strides of the operand's axes that carry it (a diagonal), or 0
/// where the operand has extent 1 along it (ellipsis broadcasting).
fn einsum_axes(cx: &OpCx, shapes: &[&[usize]]) -> Result<(Vec<usize>, Vec<Axis>), KernelError> {
    let mut operands: Vec<(&[i64], &[usize])> = Vec::with_capacity(3);
    for (i, &shape) in shapes.iter().enumerate() {
        operands.push((cx.attrs.ints(&format!("input{i}_labels"))?, shape));
    }
    let out_labels = cx.attrs.ints("output_labels")?;
    let all = operands.iter().flat_map(|(l, _)| l.iter()).chain(out_labels);
    // Labels are small indices; the bound keeps a hostile attribute from allocating much.
    let count = all.clone().try_fold(0usize, |n, &l| match usize::try_from(l) {
        Ok(l) if l < 4096 => Ok(n.max(l + 1)),
        _ => Err(invalid!("Einsum label {l} is out of range")),
    })?;
    let mut sizes: Vec<Option<usize>> = vec![None; count];
    for &(labels, shape) in &operands {
        if labels.len() != shape.len() {
            return Err(invalid!("Einsum operand of shape {shape:?} has {} labels", labels.len()));
        }
        for (&l, &d) in labels.iter().zip(shape) {
            let s = &mut sizes[l as usize];
            *s = match *s {
                None | Some(1) => Some(d),
                Some(prev) if d == 1 || d == prev => Some(prev),
                Some(prev) => return Err(invalid!("Einsum label {l} has sizes {prev} and {d}")),
            };
        }
    }
    let mut shape = Vec::with_capacity(out_labels.len());
    for (i, &l) in out_labels.iter().enumerate() {
        if out_labels[..i].contains(&l) {
            return Err(invalid!("Einsum output label {l} is repeated"));
        }
        shape.push(
            sizes[l as usize].ok_or_else(|| invalid!("Einsum output label {l} is in no input"))?,
        );
    }
    let label_strides = |labels: &[i64], shape: &[usize]| {
        let mut per_label = vec![0usize; count];
        for ((&l, &d), s) in labels.iter().zip(shape).zip(strides(shape)) {
            if d != 1 {
                per_label[l as usize] += s;
            }
        }
        per_label
    };
    let per_operand: Vec<Vec<usize>> = operands.iter().map(|&(l, s)| label_strides(l, s)).collect();
    let c = label_strides(out_labels, &shape);
    let b = |l: usize| per_operand.get(1).map_or(0, |s| s[l]);
    let axes = (0..count)
        .filter_map(|l| Some(Axis::new(sizes[l]?, per_operand[0][l], b(l), c[l])))
        .collect();
    Ok((shape, axes))
}

#[cfg(test)]
mod tests {
    use crate::cpu::eval;
    use crate::cpu::post::BINARY;
    use crate::cpu::post::tests::{assert_close, same_in_place, unfused};
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs, DType};

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    fn run(op: &str, attrs: &Attrs, inputs: &[&Tensor], out: &[usize]) -> Tensor {
        let dtype = inputs[0].dtype();
        eval(op, attrs, inputs, &[TensorDesc::new(dtype, out.to_vec())]).unwrap().remove(0)
    }

    fn seq(n: usize) -> Vec<f32> {
        (0..n).map(|v| v as f32).collect()
    }

    fn close(got: &Tensor, want: &[f32]) {
        let got = got.as_slice::<f32>().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn matmul_2d_by_hand() {
        // [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]
        let a = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f32s(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
        close(&run("MatMul", &mm(), &[&a, &b], &[2, 2]), &[19.0, 22.0, 43.0, 50.0]);
    }

    #[test]
    fn matmul_broadcast_batches() {
        // import numpy as np
        // a = np.arange(24, dtype=np.float32).reshape(3, 1, 2, 4)
        // b = np.arange(24, dtype=np.float32).reshape(1, 2, 4, 3)
        // print((a @ b).flatten().tolist())
        let a = f32s(&[3, 1, 2, 4], &seq(24));
        let b = f32s(&[1, 2, 4, 3], &seq(24));
        let want = [
            42.0, 48.0, 54.0, 114.0, 136.0, 158.0, 114.0, 120.0, 126.0, 378.0, 400.0, 422.0, 186.0,
            224.0, 262.0, 258.0, 312.0, 366.0, 642.0, 680.0, 718.0, 906.0, 960.0, 1014.0, 330.0,
            400.0, 470.0, 402.0, 488.0, 574.0, 1170.0, 1240.0, 1310.0, 1434.0, 1520.0, 1606.0,
        ];
        close(&run("MatMul", &mm(), &[&a, &b], &[3, 2, 2, 3]), &want);
    }

    #[test]
    fn matmul_vectors_drop_the_promoted_dims() {
        // [1,2,3] . [4,5,6] = 32; [1,2,3] @ [[0,1],[2,3],[4,5]] = [16, 22];
        // [[0,1,2],[3,4,5]] @ [1,2,3] = [8, 26]
        let v = f32s(&[3], &[1.0, 2.0, 3.0]);
        let w = f32s(&[3], &[4.0, 5.0, 6.0]);
        let m32 = f32s(&[3, 2], &seq(6));
        let m23 = f32s(&[2, 3], &seq(6));
        close(&run("MatMul", &mm(), &[&v, &w], &[]), &[32.0]);
        close(&run("MatMul", &mm(), &[&v, &m32], &[2]), &[16.0, 22.0]);
        close(&run("MatMul", &mm(), &[&m23, &v], &[2]), &[8.0, 26.0]);
    }

    #[test]
    fn empty_operands() {
        // A zero-length contraction gives zeros; a zero-length row axis gives nothing.
        let a = f32s(&[2, 0], &[]);
        let b = f32s(&[0, 3], &[]);
        close(&run("MatMul", &mm(), &[&a, &b], &[2, 3]), &[0.0; 6]);
        let a = f32s(&[0, 2], &[]);
        let b = f32s(&[2, 3], &seq(6));
        close(&run("MatMul", &mm(), &[&a, &b], &[0, 3]), &[]);
    }

    #[test]
    fn matmul_integers() {
        let a = Tensor::from_vec(vec![2, 2], &[1i64, 2, 3, 4]).unwrap();
        let b = Tensor::from_vec(vec![2, 1], &[5i64, 6]).unwrap();
        let c = run("MatMul", &mm(), &[&a, &b], &[2, 1]);
        assert_eq!(c.as_slice::<i64>().unwrap(), &[17, 39]);
    }

    #[test]
    fn matmul_rejects_bad_shapes() {
        let a = f32s(&[2, 3], &seq(6));
        let desc = [TensorDesc::new(DType::F32, vec![2, 2])];
        assert!(eval("MatMul", &mm(), &[&a, &a], &desc).is_err());
        let i = Tensor::from_vec(vec![2, 3], &[0i32; 6]).unwrap();
        assert!(eval("MatMul", &mm(), &[&a, &i], &desc).is_err());
    }

    /// Canonical MatMul attributes: no post-ops.
    fn mm() -> Attrs {
        post(Attrs::new(), "", &[])
    }

    fn post(attrs: Attrs, ops: &str, params: &[f64]) -> Attrs {
        attrs
            .with("post_ops", AttrValue::Text(ops.into()))
            .with("post_params", AttrValue::Floats(params.to_vec()))
    }

    fn gemm_attrs(ta: i64, tb: i64, alpha: f64, beta: f64) -> Attrs {
        post(Attrs::new(), "", &[])
            .with("transA", AttrValue::Int(ta))
            .with("transB", AttrValue::Int(tb))
            .with("alpha", AttrValue::Float(alpha))
            .with("beta", AttrValue::Float(beta))
    }

    #[test]
    fn gemm_transposes_scales_and_broadcasts_c() {
        // import numpy as np
        // a = np.arange(6, dtype=np.float32).reshape(3, 2)     # transA: A is a.T, 2x3
        // b = np.arange(12, dtype=np.float32).reshape(4, 3)    # transB: B is b.T, 3x4
        // c = np.array([[1], [2]], dtype=np.float32)           # (2, 1) broadcast to (2, 4)
        // print((0.5 * a.T @ b.T + 2.0 * c).flatten().tolist())
        let a = f32s(&[3, 2], &seq(6));
        let b = f32s(&[4, 3], &seq(12));
        let c = f32s(&[2, 1], &[1.0, 2.0]);
        let want = [7.0, 16.0, 25.0, 34.0, 10.5, 24.0, 37.5, 51.0];
        close(&run("Gemm", &gemm_attrs(1, 1, 0.5, 2.0), &[&a, &b, &c], &[2, 4]), &want);
        // Without C, B not transposed: print((a.T @ np.arange(6).reshape(3, 2)).flatten().tolist())
        let b32 = f32s(&[3, 2], &seq(6));
        close(
            &run("Gemm", &gemm_attrs(1, 0, 1.0, 1.0), &[&a, &b32], &[2, 2]),
            &[20.0, 26.0, 26.0, 35.0],
        );
    }

    fn einsum(inputs: &[&[i64]], out: &[i64]) -> Attrs {
        let mut attrs = Attrs::new().with("output_labels", AttrValue::Ints(out.to_vec()));
        for (i, l) in inputs.iter().enumerate() {
            attrs.set(&format!("input{i}_labels"), AttrValue::Ints(l.to_vec()));
        }
        attrs
    }

    #[test]
    fn einsum_attention_scores() {
        // "bhid,bhjd->bhij": q @ k^T per head.
        // import numpy as np
        // q = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
        // k = (np.arange(16, dtype=np.float32) - 8).reshape(1, 2, 2, 4)
        // print(np.einsum("bhid,bhjd->bhij", q, k).flatten().tolist())
        let q = f32s(&[1, 2, 3, 4], &seq(24));
        let k = f32s(&[1, 2, 2, 4], &seq(16).iter().map(|v| v - 8.0).collect::<Vec<_>>());
        let attrs = einsum(&[&[0, 1, 2, 3], &[0, 1, 4, 3]], &[0, 1, 2, 4]);
        let want =
            [-34.0, -10.0, -138.0, -50.0, -242.0, -90.0, 86.0, 302.0, 110.0, 390.0, 134.0, 478.0];
        close(&run("Einsum", &attrs, &[&q, &k], &[1, 2, 3, 2]), &want);
    }

    #[test]
    fn einsum_one_operand_forms() {
        // x = [[0,1,2],[3,4,5],[6,7,8]]: "ij->ji" transposes, "ij->i" sums rows = [3,12,21],
        // "ii->i" is the diagonal [0,4,8], "ii->" the trace 12.
        let x = f32s(&[3, 3], &seq(9));
        let t = run("Einsum", &einsum(&[&[0, 1]], &[1, 0]), &[&x], &[3, 3]);
        close(&t, &[0.0, 3.0, 6.0, 1.0, 4.0, 7.0, 2.0, 5.0, 8.0]);
        close(&run("Einsum", &einsum(&[&[0, 1]], &[0]), &[&x], &[3]), &[3.0, 12.0, 21.0]);
        close(&run("Einsum", &einsum(&[&[0, 0]], &[0]), &[&x], &[3]), &[0.0, 4.0, 8.0]);
        close(&run("Einsum", &einsum(&[&[0, 0]], &[]), &[&x], &[]), &[12.0]);
    }

    #[test]
    fn einsum_broadcast_ellipsis_and_f64() {
        // "...ij,...jk->...ik" with batches [2] and [1]: labels 0 for the batch.
        // a = arange(8).reshape(2,2,2), b = [[[1,0],[0,2]]] -> a[:, :, 0] and 2*a[:, :, 1]
        let a =
            Tensor::from_vec(vec![2, 2, 2], &(0..8).map(f64::from).collect::<Vec<_>>()).unwrap();
        let b = Tensor::from_vec(vec![1, 2, 2], &[1.0f64, 0.0, 0.0, 2.0]).unwrap();
        let attrs = einsum(&[&[0, 1, 2], &[0, 2, 3]], &[0, 1, 3]);
        let c = run("Einsum", &attrs, &[&a, &b], &[2, 2, 2]);
        assert_eq!(c.as_slice::<f64>().unwrap(), &[0.0, 2.0, 2.0, 6.0, 4.0, 10.0, 6.0, 14.0]);
    }

    #[test]
    fn einsum_rejects_inconsistent_labels() {
        let x = f32s(&[2, 3], &seq(6));
        let desc = [TensorDesc::new(DType::F32, vec![2])];
        assert!(eval("Einsum", &einsum(&[&[0, 0]], &[0]), &[&x], &desc).is_err());
        assert!(eval("Einsum", &einsum(&[&[0]], &[0]), &[&x], &desc).is_err());
    }

    /// `op` with post-ops `ops` against the op followed by the elementwise kernels; with a
    /// leading Add, also run in place over the residual (the first extra input).
    fn check_post(op: &str, base: &Attrs, own: &[&Tensor], extras: &[&Tensor], ops: &str) {
        let params: &[f64] = match ops {
            o if o.contains("Clip") => &[-1.0, 40.0],
            o if o.contains("HardSigmoid") => &[0.1, 0.4],
            o if o.split(',').any(|p| p == "Swish") => &[1.0],
            _ => &[],
        };
        let out = run(op, base, own, extras[0].shape());
        let attrs = post(base.clone(), ops, params);
        let n = ops.split(',').filter(|o| BINARY.contains(o)).count();
        let extras = &extras[..n];
        let all: Vec<&Tensor> = own.iter().chain(extras).copied().collect();
        let desc = out.desc().clone();
        let fused = eval(op, &attrs, &all, std::slice::from_ref(&desc)).unwrap().remove(0);
        let want = unfused(out, ops, params, extras);
        assert_close(&fused, &want, 1e-6, &format!("{op} + {ops}"));
        if ops.starts_with("Add") {
            same_in_place(op, &attrs, &all, &desc, own.len());
        }
    }

    #[test]
    fn post_ops_agree_with_the_unfused_ops() {
        let r = |shape: &[usize], k: f32| {
            let n = shape.iter().product();
            f32s(shape, &seq(n).iter().map(|v| (v * k) % 7.0 - 3.0).collect::<Vec<_>>())
        };
        let one = f32s(&[1], &[0.5]);
        // Batched MatMul: one GEMM call per batch, post-ops applied per call.
        let (a, b) = (r(&[2, 3, 4], 0.3), r(&[2, 4, 5], 0.7));
        let y = r(&[2, 3, 5], 1.1);
        for ops in ["Add", "Add,Relu,Mul", "Sigmoid,Sub", "Clip,RSub,Tanh"] {
            check_post("MatMul", &mm(), &[&a, &b], &[&y, &one], ops);
        }
        // A broadcast batch folds into one call; Gemm with C and transposes.
        let (a, b) = (r(&[3, 2, 4], 0.3), r(&[4, 5], 0.7));
        check_post("MatMul", &mm(), &[&a, &b], &[&r(&[3, 2, 5], 1.3)], "Add,HardSwish");
        let g = gemm_attrs(1, 1, 0.5, 2.0);
        let (a, b, c) = (r(&[4, 3], 0.3), r(&[5, 4], 0.7), r(&[5], 0.9));
        let y = r(&[3, 5], 1.7);
        for ops in ["Add,Relu", "HardSigmoid,Mul", "Add", "Add,Swish"] {
            check_post("Gemm", &g, &[&a, &b, &c], &[&y, &one], ops);
        }
    }

    #[test]
    fn a_bias_or_mask_of_trailing_dims_and_gelu_agree_with_the_unfused_ops() {
        let r = |shape: &[usize], k: f32| {
            let n = shape.iter().product();
            f32s(shape, &seq(n).iter().map(|v| (v * k) % 7.0 - 3.0).collect::<Vec<_>>())
        };
        let (a, b) = (r(&[2, 3, 4], 0.3), r(&[4, 5], 0.7));
        // A bias along the columns, and blocks of the trailing dims (an attention mask).
        for bias in [r(&[5], 0.9), r(&[1, 1, 5], 0.9), r(&[3, 5], 1.1), r(&[1, 3, 5], 1.3)] {
            for (ops, params) in [("Add,Gelu", [0.0]), ("Add,Gelu", [1.0]), ("Mul,Gelu", [1.0])] {
                let out = run("MatMul", &mm(), &[&a, &b], &[2, 3, 5]);
                let desc = [out.desc().clone()];
                let attrs = post(mm(), ops, &params);
                let fused = eval("MatMul", &attrs, &[&a, &b, &bias], &desc).unwrap().remove(0);
                let want = unfused(out, ops, &params, &[&bias]);
                // A leading Add starts the sums at the bias: another order of additions.
                let what = format!("{ops} {params:?} with a bias of {:?}", bias.shape());
                assert_close(&fused, &want, 1e-6, &what);
            }
        }
        // Along the rows (a [2, 3, 1] operand) is no bias: refused.
        let rows = post(mm(), "Add", &[]);
        let desc = [TensorDesc::new(DType::F32, vec![2, 3, 5])];
        assert!(eval("MatMul", &rows, &[&a, &b, &r(&[2, 3, 1], 0.9)], &desc).is_err());
        // Nor a block that is not the trailing dims.
        assert!(!crate::cpu::post::broadcasts(&[3, 1], &[2, 3, 5]));
        assert!(!crate::cpu::post::broadcasts(&[2, 1, 5], &[2, 3, 5]));
        assert!(!crate::cpu::post::broadcasts(&[1, 1, 3, 5], &[3, 5]), "a wider output");
    }

    #[test]
    fn post_ops_need_f32_and_c() {
        let relu = post(Attrs::new(), "Relu", &[]);
        let a = Tensor::from_vec(vec![2, 2], &[1.0f64, 2.0, 3.0, 4.0]).unwrap();
        let desc = [TensorDesc::new(DType::F64, vec![2, 2])];
        assert!(eval("MatMul", &relu, &[&a, &a], &desc).is_err());
        let x = f32s(&[2, 2], &seq(4));
        let desc = [TensorDesc::new(DType::F32, vec![2, 2])];
        let add = post(gemm_attrs(0, 0, 1.0, 1.0), "Add", &[]);
        assert!(eval("Gemm", &add, &[&x, &x, &x], &desc).is_err(), "C is required");
        assert!(eval("Gemm", &add, &[&x, &x, &x, &x], &desc).is_ok());
    }

    /// B's dequantization input: scales, then zero points.
    fn dequantization(scales: &[f32], zeros: &[f32]) -> Tensor {
        Tensor::from_vec(vec![2, scales.len()], &[scales, zeros].concat()).unwrap()
    }

    #[test]
    fn an_8_bit_b_is_dequantized_per_column() {
        // B = [[1, -2, 3], [-4, 5, -6]] (int8), scales [0.5, 1, 2], zero points [1, 0, -1]:
        // dequantized [[0, -2, 8], [-2.5, 5, -10]]; A = [[1, 2]] -> [[-5, 8, -12]].
        let a = f32s(&[1, 2], &[1.0, 2.0]);
        let b = Tensor::from_vec(vec![2, 3], &[1i8, -2, 3, -4, 5, -6]).unwrap();
        let dq = dequantization(&[0.5, 1.0, 2.0], &[1.0, 0.0, -1.0]);
        let attrs = post(Attrs::new(), "", &[]).with("dequantize_b", AttrValue::Int(1));
        close(&run("MatMul", &attrs, &[&a, &b, &dq], &[1, 3]), &[-5.0, 8.0, -12.0]);
        // One scale and zero point for the tensor, spread: (B - 1) * 0.5.
        let dq1 = dequantization(&[0.5; 3], &[1.0; 3]);
        close(&run("MatMul", &attrs, &[&a, &b, &dq1], &[1, 3]), &[-5.0, 2.5, -6.0]);
        // Gemm with B stored [N, K] (transB): the scales follow B's rows; with C after B.
        let bt = Tensor::from_vec(vec![3, 2], &[1i8, -4, -2, 5, 3, -6]).unwrap();
        let mut gemm = gemm_attrs(0, 1, 1.0, 1.0);
        gemm.set("dequantize_b", AttrValue::Int(1));
        close(&run("Gemm", &gemm, &[&a, &bt, &dq], &[1, 3]), &[-5.0, 8.0, -12.0]);
        let c = f32s(&[3], &[1.0, 2.0, 3.0]);
        close(&run("Gemm", &gemm, &[&a, &bt, &c, &dq], &[1, 3]), &[-4.0, 10.0, -9.0]);
    }

    #[test]
    fn a_float16_b_gives_the_bits_of_its_widened_values() {
        // A decode step's vector product, a block of rows, a batch of A against one B, and
        // Gemm with B stored [N, K] and a C; each against the same product of the f32 B.
        let halves = |n: usize| -> Vec<half::f16> {
            (0..n).map(|i| half::f16::from_f32(((i * 53 % 211) as f32 - 105.0) / 9.0)).collect()
        };
        let widened = |h: &Tensor| {
            let v: Vec<f32> = h.to_vec::<half::f16>().unwrap().iter().map(|v| v.to_f32()).collect();
            f32s(h.shape(), &v)
        };
        let attrs = post(Attrs::new(), "", &[]);
        for (a_shape, b_shape, out) in [
            (&[1, 300][..], &[300, 70][..], &[1, 70][..]),
            (&[37, 40], &[40, 75], &[37, 75]),
            (&[2, 3, 40], &[40, 9], &[2, 3, 9]),
        ] {
            let a = f32s(a_shape, &seq(a_shape.iter().product()));
            let h = Tensor::from_vec(b_shape.to_vec(), &halves(b_shape.iter().product())).unwrap();
            let want = run("MatMul", &attrs, &[&a, &widened(&h)], out);
            assert_eq!(run("MatMul", &attrs, &[&a, &h], out), want, "{a_shape:?} x {b_shape:?}");
        }
        let (a, c) = (f32s(&[4, 40], &seq(160)), f32s(&[9], &seq(9)));
        let h = Tensor::from_vec(vec![9, 40], &halves(360)).unwrap();
        let gemm = gemm_attrs(0, 1, 0.5, 2.0);
        let want = run("Gemm", &gemm, &[&a, &widened(&h), &c], &[4, 9]);
        assert_eq!(run("Gemm", &gemm, &[&a, &h, &c], &[4, 9]), want);
        // Only B: an f16 A is the widened step's (a dtype error the CPU answers by widening).
        let h_a = Tensor::from_vec(vec![4, 40], &halves(160)).unwrap();
        let cx_in = [h_a.desc().clone(), f32s(&[40, 9], &seq(360)).desc().clone()];
        let cx_out = [TensorDesc::new(DType::F32, vec![4, 9])];
        let cx = super::OpCx { op: "MatMul", attrs: &attrs, inputs: &cx_in, outputs: &cx_out };
        let refused = super::prepare(&cx).map(|_| ());
        assert!(matches!(refused, Err(super::KernelError::DType { dtype: DType::F16, .. })));
    }

    #[test]
    fn a_bad_8_bit_b_is_an_error() {
        let a = f32s(&[1, 2], &[1.0, 2.0]);
        let b = Tensor::from_vec(vec![2, 3], &[1i8, -2, 3, -4, 5, -6]).unwrap();
        let desc = [TensorDesc::new(DType::F32, vec![1, 3])];
        let attrs = post(Attrs::new(), "", &[]).with("dequantize_b", AttrValue::Int(1));
        // No dequantization; one for two columns; one per tensor; an f64 one; a float B with one.
        let short = dequantization(&[1.0; 2], &[0.0; 2]);
        let one = dequantization(&[1.0], &[0.0]);
        let wide = Tensor::from_vec(vec![2, 3], &[1.0f64; 6]).unwrap();
        let dq = dequantization(&[1.0; 3], &[0.0; 3]);
        assert!(eval("MatMul", &attrs, &[&a, &b], &desc).is_err());
        assert!(eval("MatMul", &attrs, &[&a, &b, &short], &desc).is_err());
        assert!(eval("MatMul", &attrs, &[&a, &b, &one], &desc).is_err());
        assert!(eval("MatMul", &attrs, &[&a, &b, &wide], &desc).is_err());
        assert!(eval("MatMul", &attrs, &[&a, &a, &dq], &desc).is_err());
        assert!(eval("MatMul", &attrs, &[&a, &b, &dq], &desc).is_ok());
    }
}
