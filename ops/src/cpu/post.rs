//! Post-ops: elementwise work that the compiler's `fuse` pass moves into Conv, ConvTranspose,
//! Gemm and MatMul. The kernels apply them to each block of their output right after writing
//! it, while the block is still in cache, instead of running one more step over the tensor.
//!
//! Canonical attributes, present on every node of those ops (empty when nothing is fused):
//! - `post_ops` (text): op names separated by commas, in the order they apply. Activations:
//!   `Relu`, `LeakyRelu`, `Clip`, `Sigmoid`, `HardSigmoid`, `HardSwish`, `Tanh`, `Swish`
//!   (SiLU with alpha 1: what the fuse pass makes of `x * Sigmoid(x)`), `Gelu`. Binary ops
//!   with an operand R: `Add` (y + R), `Sub` (y - R), `RSub` (R - y), `Mul` (y · R).
//! - `post_params` (floats): the activations' parameters, in order: `Clip` min, max;
//!   `LeakyRelu` alpha; `HardSigmoid` alpha, beta; `Swish` alpha; `Gelu` 0 (exact) or 1
//!   (the tanh approximation).
//! - Each binary op reads the next extra input after the op's own inputs (Conv and
//!   ConvTranspose: X, W, B; Gemm: A, B, C; MatMul: A, B; MatMulIntegerToFloat: A, B and their
//!   zero points); with extra inputs the bias (C) is always present. R has the output's
//!   shape, holds one element, or (the products, [`takes_column_blocks`]) is a
//!   block of the output's trailing dims (a bias along the columns, `[N]` or `[1, .., N]`;
//!   an attention mask `[S, S]`): element `e` of the output reads `R[e mod len(R)]` in each
//!   case.
//!
//! Output, operands and arithmetic are float32. A leading `Add` is not applied after the
//! product: the output starts as R (plus the bias) and the product accumulates onto it. That
//! is what lets the planner write the output over R ([`in_place_input`]): `run_in_place` finds
//! R already in the output.

use super::{KernelError, OpCx};
use crate::elementwise::cpu::{erf_f32, exp_f32, tanh_f32};
use crate::invalid;
use crate::tensor::{Element, TensorRef};
use ingot_schema::{Attrs, DType};
use std::ops::RangeInclusive;

/// The activations, each with how many values it takes from `post_params`.
pub const ACTIVATIONS: &[(&str, usize)] = &[
    ("Relu", 0),
    ("LeakyRelu", 1),
    ("Clip", 2),
    ("Sigmoid", 0),
    ("HardSigmoid", 2),
    ("HardSwish", 0),
    ("Tanh", 0),
    ("Swish", 1),
    ("Gelu", 1),
];

/// The binary post-ops; each reads one extra input.
pub const BINARY: &[&str] = &["Add", "Sub", "RSub", "Mul"];

/// The ops that take post-ops, with the count of their own inputs when extra inputs follow.
pub const HOSTS: &[(&str, usize)] =
    &[("Conv", 3), ("ConvTranspose", 3), ("Gemm", 3), ("MatMul", 2), ("MatMulIntegerToFloat", 4)];

/// Whether a post-op operand of `op` may be a block of the output's trailing dims (a bias
/// along the columns, an attention mask): the products, whose engine starts and applies such
/// a block; the convs read a residual by element.
pub fn takes_column_blocks(op: &str) -> bool {
    matches!(op, "MatMul" | "Gemm" | "MatMulIntegerToFloat")
}

/// How many extra inputs the post-ops in `attrs` read (an error if they do not parse).
pub fn extra_inputs(attrs: &Attrs) -> Result<usize, KernelError> {
    Ok(PostOps::parse(attrs)?.extras)
}

/// The input of `op` that its output may be written over: R of a leading `Add` post-op.
pub fn in_place_input(op: &str, attrs: &Attrs) -> Option<usize> {
    let (_, own) = HOSTS.iter().find(|(host, _)| *host == op)?;
    let first = attrs.text("post_ops").ok()?.split(',').next()?;
    // A product that dequantizes its B has B's dequantization among its own inputs, a conv
    // that scales X's channels the scales.
    let more = crate::dequantizes_b(attrs) || crate::scales_x(attrs);
    (first == "Add").then_some(own + usize::from(more))
}

/// Whether the output of `op` may be written over input `k`: R of a leading `Add` (the
/// registry's in-place rule for the post-op hosts).
pub(crate) fn in_place_after_add(op: &str, attrs: &Attrs, k: usize) -> bool {
    in_place_input(op, attrs) == Some(k)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Relu,
    LeakyRelu(f32),
    Clip(f32, f32),
    Sigmoid,
    HardSigmoid(f32, f32),
    HardSwish,
    Tanh,
    Swish(f32),
    /// GELU, exact or (true) its tanh approximation.
    Gelu(bool),
    /// A binary op and the extra input (counted from the first extra one) it reads.
    Binary(Binary, usize),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Binary {
    Add,
    Sub,
    RSub,
    Mul,
}

/// The post-ops of one step, parsed once in `prepare`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PostOps {
    steps: Vec<Step>,
    extras: usize,
}

impl PostOps {
    fn parse(attrs: &Attrs) -> Result<PostOps, KernelError> {
        let names = attrs.text("post_ops")?;
        let params = attrs.floats("post_params")?;
        let mut values = params.iter().map(|&v| v as f32);
        let mut param = || {
            values.next().ok_or_else(|| {
                invalid!("post_params {params:?} has too few values for post_ops '{names}'")
            })
        };
        let mut extras = 0;
        let mut operand = |op| {
            extras += 1;
            Step::Binary(op, extras - 1)
        };
        let mut steps = Vec::new();
        for name in (!names.is_empty()).then(|| names.split(',')).into_iter().flatten() {
            steps.push(match name {
                "Relu" => Step::Relu,
                "LeakyRelu" => Step::LeakyRelu(param()?),
                "Clip" => Step::Clip(param()?, param()?),
                "Sigmoid" => Step::Sigmoid,
                "HardSigmoid" => Step::HardSigmoid(param()?, param()?),
                "HardSwish" => Step::HardSwish,
                "Tanh" => Step::Tanh,
                "Swish" => Step::Swish(param()?),
                "Gelu" => match param()? {
                    0.0 => Step::Gelu(false),
                    1.0 => Step::Gelu(true),
                    v => return Err(invalid!("Gelu post-op with parameter {v} (0 or 1)")),
                },
                "Add" => operand(Binary::Add),
                "Sub" => operand(Binary::Sub),
                "RSub" => operand(Binary::RSub),
                "Mul" => operand(Binary::Mul),
                other => return Err(invalid!("unknown post-op '{other}' in '{names}'")),
            });
        }
        if values.next().is_some() {
            return Err(invalid!(
                "post_params {params:?} has more values than post_ops '{names}' takes"
            ));
        }
        Ok(PostOps { steps, extras })
    }

    /// Reads the post-ops of `cx` and checks its output and extra inputs. `own` is how many
    /// inputs the op itself takes; with extra inputs it must take the most. Returns the
    /// post-ops and the count of the op's own inputs.
    pub fn new(cx: &OpCx, own: RangeInclusive<usize>) -> Result<(PostOps, usize), KernelError> {
        let post = Self::parse(cx.attrs)?;
        let n_own = cx
            .inputs
            .len()
            .checked_sub(post.extras)
            .filter(|n| own.contains(n) && (post.extras == 0 || n == own.end()));
        let (Some(n_own), [y]) = (n_own, cx.outputs) else {
            return Err(invalid!(
                "{} takes {own:?} inputs (all of them with post-op operands) plus {} for its \
                 post-ops, and 1 output; got {} and {}",
                cx.op,
                post.extras,
                cx.inputs.len(),
                cx.outputs.len()
            ));
        };
        if !post.steps.is_empty() && y.dtype != DType::F32 {
            return Err(cx.dtype_error(y.dtype));
        }
        let columns = takes_column_blocks(cx.op);
        for r in &cx.inputs[n_own..] {
            let fits = r.shape == y.shape
                || r.elements() == 1
                || (columns && broadcasts(&r.shape, &y.shape));
            if r.dtype != DType::F32 || !fits {
                return Err(invalid!(
                    "{}: a post-op operand is {} {:?}; it must be f32 of the output's shape {:?}, \
                     hold one element, or (MatMul, Gemm) hold a block of its trailing dims",
                    cx.op,
                    r.dtype,
                    r.shape,
                    y.shape
                ));
            }
        }
        Ok((post, n_own))
    }

    /// Whether the output starts as the first extra input (a leading `Add`).
    pub fn accumulates(&self) -> bool {
        matches!(self.steps.first(), Some(Step::Binary(Binary::Add, _)))
    }

    /// Whether anything is left to apply after the product.
    pub fn applies(&self) -> bool {
        self.steps.len() > usize::from(self.accumulates())
    }

    /// The extra inputs, after the `own` inputs, each of `len` elements, one, or a block of
    /// the output's trailing dims (what `prepare` checked). The one the output was written over (`aliased`, an input
    /// index) is left empty: it is in the output.
    pub fn operands<'a, T: Element>(
        &self,
        inputs: &[TensorRef<'a>],
        own: usize,
        len: usize,
        aliased: Option<usize>,
    ) -> Result<Vec<&'a [T]>, KernelError> {
        (own..own + self.extras)
            .map(|i| {
                if aliased == Some(i) {
                    return Ok(&[][..]);
                }
                let t = inputs.get(i).ok_or_else(|| invalid!("post-op operand {i} is missing"))?;
                let s = t.as_slice::<T>()?;
                if s.is_empty() || !len.is_multiple_of(s.len()) {
                    return Err(invalid!(
                        "post-op operand {i} has {} elements, which do not tile {len}",
                        s.len()
                    ));
                }
                Ok(s)
            })
            .collect()
    }

    /// Sets `y` to what the product accumulates onto: R for a leading `Add` (left as it is
    /// when the output was written over R), zero otherwise. The kernel adds its bias after.
    pub fn start<T: Copy + Default>(
        &self,
        y: &mut [T],
        extras: &[&[T]],
        in_place: bool,
    ) -> Result<(), KernelError> {
        if !self.accumulates() {
            y.fill(T::default());
        } else if !in_place {
            match extras.first() {
                Some(&&[r]) => y.fill(r),
                // R, or a block of the trailing dims: repeated over the leading ones.
                Some(r) if !r.is_empty() && y.len().is_multiple_of(r.len()) => {
                    y.chunks_exact_mut(r.len()).for_each(|row| row.copy_from_slice(r))
                }
                _ => return Err(invalid!("the residual does not match the output")),
            }
        }
        Ok(())
    }

    /// Applies every post-op but a leading `Add` to `y`, the output's elements from `at`.
    pub fn apply(&self, y: &mut [f32], at: usize, extras: &[&[f32]]) -> Result<(), KernelError> {
        apply_steps(&self.steps[usize::from(self.accumulates())..], y, at, extras)
    }
}

/// Applies `steps` to `y`, the output's elements from `at`. Compiled for the wider vector
/// units too (the baseline x86-64 target has SSE2 only); every version computes the same bits.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn apply_steps(
    steps: &[Step],
    y: &mut [f32],
    at: usize,
    extras: &[&[f32]],
) -> Result<(), KernelError> {
    {
        let (zero, one) = (0.0f32, 1.0f32);
        for step in steps {
            match *step {
                Step::Relu => map(y, |x| max(x, zero)),
                Step::LeakyRelu(alpha) => map(y, |x| if x < zero { alpha * x } else { x }),
                Step::Clip(lo, hi) => map(y, |x| {
                    let x = if x < lo { lo } else { x };
                    if x > hi { hi } else { x }
                }),
                // The elementwise kernels' exp: it vectorises, libm's does not.
                Step::Sigmoid => map(y, |x| one / (one + exp_f32(-x))),
                Step::HardSigmoid(alpha, beta) => map(y, |x| min(max(alpha * x + beta, zero), one)),
                Step::HardSwish => {
                    let sixth = (1.0f64 / 6.0) as f32;
                    map(y, |x| x * min(max(x * sixth + 0.5, zero), one))
                }
                Step::Tanh => map(y, tanh_f32),
                Step::Swish(alpha) => map(y, |x| x / (one + exp_f32(-(alpha * x)))),
                // As the elementwise Gelu computes it, so that fusing changes no bit.
                Step::Gelu(false) => {
                    let r = std::f32::consts::FRAC_1_SQRT_2;
                    map(y, |x| 0.5 * x * (one + erf_f32(x * r)))
                }
                Step::Gelu(true) => {
                    let k = (2.0 / std::f64::consts::PI).sqrt() as f32;
                    let c = 0.044715f64 as f32;
                    map(y, |x| 0.5 * x * (one + tanh_f32(k * (x + c * x * x * x))))
                }
                Step::Binary(op, k) => {
                    let r = extras
                        .get(k)
                        .copied()
                        .ok_or_else(|| invalid!("post-op operand {k} is missing"))?;
                    match op {
                        Binary::Add => zip(y, at, r, |y, r| y + r)?,
                        Binary::Sub => zip(y, at, r, |y, r| y - r)?,
                        Binary::RSub => zip(y, at, r, |y, r| r - y)?,
                        Binary::Mul => zip(y, at, r, |y, r| y * r)?,
                    }
                }
            }
        }
        Ok(())
    }
}

// NaN propagates through Relu, HardSigmoid and HardSwish as in the elementwise kernels.
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b || a.is_nan() { a } else { b }
}

#[inline(always)]
fn min(a: f32, b: f32) -> f32 {
    if a < b || a.is_nan() { a } else { b }
}

#[inline(always)]
fn map(y: &mut [f32], f: impl Fn(f32) -> f32) {
    for v in y {
        *v = f(*v);
    }
}

/// `y[i] = f(y[i], r[(at + i) mod len(r)])`: `r` has the output's elements, one, or a block
/// of its trailing dims (repeated over the leading ones).
#[inline(always)]
fn zip(
    y: &mut [f32],
    at: usize,
    r: &[f32],
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), KernelError> {
    match r {
        &[r] => map(y, |v| f(v, r)),
        [] => return Err(invalid!("a post-op operand is empty")),
        r => {
            // From the element of the block `at` falls on, block after block.
            let mut j = at % r.len();
            let mut rest = &mut y[..];
            while !rest.is_empty() {
                let n = (r.len() - j).min(rest.len());
                let (run, tail) = rest.split_at_mut(n);
                for (v, &r) in run.iter_mut().zip(&r[j..j + n]) {
                    *v = f(*v, r);
                }
                (rest, j) = (tail, 0);
            }
        }
    }
    Ok(())
}

/// Whether a post-op operand of shape `r` serves an output of shape `y` of MatMul or Gemm:
/// the same shape, one element, or a block of y's trailing dims repeated over the leading
/// ones (r, its leading ones dropped, ends y's shape: a bias `[N]` or `[1, .., N]`, an
/// attention mask `[S, S]` or `[1, 1, S, S]`, a position bias `[H, S, S]`), as numpy
/// broadcasts it. Element `e` of the output reads `R[e mod len(R)]` in each case.
pub fn broadcasts(r: &[usize], y: &[usize]) -> bool {
    let ones = r.iter().take_while(|&&d| d == 1).count();
    r.len() <= y.len() && y.ends_with(&r[ones..])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cpu::{eval, prepare};
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::AttrValue;

    /// `base` with the post-ops `ops` and their `params`.
    pub(crate) fn with_post(base: Attrs, ops: &str, params: &[f64]) -> Attrs {
        base.with("post_ops", AttrValue::Text(ops.into()))
            .with("post_params", AttrValue::Floats(params.to_vec()))
    }

    fn attrs(ops: &str, params: &[f64]) -> Attrs {
        with_post(Attrs::new(), ops, params)
    }

    /// `y` through the post-ops run as separate steps by the elementwise kernels: what the fused
    /// kernels must agree with.
    pub(crate) fn unfused(y: Tensor, ops: &str, params: &[f64], extras: &[&Tensor]) -> Tensor {
        let (mut params, mut extras) = (params.iter(), extras.iter());
        let mut param = |a: Attrs, name: &str| {
            let v = *params.next().expect("a parameter per post-op attribute");
            a.with(name, AttrValue::Float(v))
        };
        let mut y = y;
        for op in ops.split(',').filter(|op| !op.is_empty()) {
            let desc = [y.desc().clone()];
            let none = Attrs::new();
            let out = match op {
                "LeakyRelu" | "Swish" => eval(op, &param(none, "alpha"), &[&y], &desc),
                "Clip" => {
                    let a = param(none, "min");
                    eval(op, &param(a, "max"), &[&y], &desc)
                }
                "HardSigmoid" => {
                    let a = param(none, "alpha");
                    eval(op, &param(a, "beta"), &[&y], &desc)
                }
                "Gelu" => {
                    // Its form as the post-op's parameter: 1 is the tanh approximation.
                    let form = param(none, "form").float("form").unwrap();
                    let form = if form == 1.0 { "tanh" } else { "none" };
                    let a = Attrs::new().with("approximate", AttrValue::Text(form.into()));
                    eval(op, &a, &[&y], &desc)
                }
                "Add" | "Sub" | "Mul" | "RSub" => {
                    let r = *extras.next().expect("an operand per binary post-op");
                    match op {
                        "RSub" => eval("Sub", &none, &[r, &y], &desc),
                        op => eval(op, &none, &[&y, r], &desc),
                    }
                }
                op => eval(op, &none, &[&y], &desc),
            };
            y = out.unwrap().remove(0);
        }
        y
    }

    /// Runs `op` as usual and in place over input `aliased` (the output starting out as that
    /// input); the two must agree bit for bit. Returns the output.
    pub(crate) fn same_in_place(
        op: &str,
        attrs: &Attrs,
        inputs: &[&Tensor],
        out: &TensorDesc,
        aliased: usize,
    ) -> Tensor {
        let descs: Vec<TensorDesc> = inputs.iter().map(|t| t.desc().clone()).collect();
        let outputs = std::slice::from_ref(out);
        let kernel = prepare(&OpCx { op, attrs, inputs: &descs, outputs }).unwrap();
        let normal = eval(op, attrs, inputs, outputs).unwrap().remove(0);
        let mut y = inputs[aliased].clone();
        let mut views: Vec<TensorRef> = inputs.iter().map(|t| t.view()).collect();
        views[aliased].bytes = &[];
        kernel.run_in_place(aliased, &views, &mut [y.view_mut()]).unwrap();
        assert_eq!(y, normal, "{op} {attrs:?}: in place differs");
        let other = (aliased + 1) % inputs.len();
        assert!(
            kernel.run_in_place(other, &views, &mut [y.view_mut()]).is_err(),
            "only the residual may be written over"
        );
        normal
    }

    /// Asserts `got` is within `tol` (relative, absolute near zero) of `want`.
    pub(crate) fn assert_close(got: &Tensor, want: &Tensor, tol: f32, what: &str) {
        assert_eq!(got.desc(), want.desc(), "{what}");
        let (g, w) = (got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= tol * w.abs().max(1.0),
                "{what}: element {i} is {g}, expected {w}"
            );
        }
    }

    #[test]
    fn parses_names_params_and_operands() {
        let a = attrs("Clip,Add,LeakyRelu,Mul", &[0.0, 6.0, 0.1]);
        let post = PostOps::parse(&a).unwrap();
        assert_eq!(post.extras, 2);
        assert!(!post.accumulates());
        assert_eq!(extra_inputs(&attrs("", &[])).unwrap(), 0);
        assert!(PostOps::parse(&attrs("Clip", &[0.0])).is_err(), "too few params");
        assert!(PostOps::parse(&attrs("Relu", &[1.0])).is_err(), "too many params");
        assert!(PostOps::parse(&attrs("Gelu", &[])).is_err(), "unknown op");
        assert!(PostOps::parse(&Attrs::new()).is_err(), "attributes are required");
    }

    #[test]
    fn only_the_residual_of_a_leading_add_is_in_place() {
        assert_eq!(in_place_input("Conv", &attrs("Add,Relu", &[])), Some(3));
        assert_eq!(in_place_input("MatMul", &attrs("Add", &[])), Some(2));
        let dequantizes = attrs("Add", &[]).with("dequantize_b", AttrValue::Int(1));
        assert_eq!(in_place_input("MatMul", &dequantizes), Some(3));
        assert_eq!(in_place_input("Conv", &attrs("Relu,Add", &[])), None);
        assert_eq!(in_place_input("Conv", &attrs("", &[])), None);
        assert_eq!(in_place_input("Einsum", &attrs("Add", &[])), None);
    }

    #[test]
    fn checks_operands_against_the_output() {
        let y = TensorDesc::new(DType::F32, vec![1, 2, 3]);
        let ok = [
            TensorDesc::new(DType::F32, vec![2, 2]),
            TensorDesc::new(DType::F32, vec![2, 2]),
            y.clone(),
            TensorDesc::new(DType::F32, vec![1]),
        ];
        let a = attrs("Add,Mul", &[]);
        let cx =
            |inputs| OpCx { op: "MatMul", attrs: &a, inputs, outputs: std::slice::from_ref(&y) };
        assert_eq!(PostOps::new(&cx(&ok), 2..=2).unwrap().1, 2);
        assert!(PostOps::new(&cx(&ok[..3]), 2..=2).is_err(), "one operand short");
        let mut bad = ok.clone();
        bad[2] = TensorDesc::new(DType::F32, vec![1, 2, 1]);
        assert!(PostOps::new(&cx(&bad), 2..=2).is_err(), "no broadcasting");
    }

    #[test]
    fn applies_in_order_with_operands_at_the_block_offset() {
        // By hand, on the block y = [-2, 0.5, 4] starting at element 1 of the output:
        // Clip(-1, 3) -> [-1, 0.5, 3]; RSub with r[1..4] = [1, 2, 3] -> [2, 1.5, 0];
        // LeakyRelu(0.5) leaves it; Mul by the one element 2 -> [4, 3, 0];
        // HardSigmoid(0.25, 0) -> [1, 0.75, 0]; HardSwish -> [2/3, 0.75 * 0.625, 0].
        let post = PostOps::parse(&attrs(
            "Clip,RSub,LeakyRelu,Mul,HardSigmoid,HardSwish",
            &[-1.0, 3.0, 0.5, 0.25, 0.0],
        ))
        .unwrap();
        let mut y = [-2.0, 0.5, 4.0];
        post.apply(&mut y, 1, &[&[0.0, 1.0, 2.0, 3.0], &[2.0]]).unwrap();
        let want = [2.0 / 3.0, 0.75 * 0.625, 0.0];
        for (g, w) in y.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{y:?} vs {want:?}");
        }
        assert!(post.apply(&mut y, 2, &[&[], &[2.0]]).is_err(), "an empty operand");
        // An operand of one value per column repeats over the rows: the block at element 6 of
        // rows of 4 reads columns 2, 3, 0, 1.
        let add = PostOps::parse(&attrs("Relu,Add", &[])).unwrap();
        let mut y = [0.0f32; 4];
        add.apply(&mut y, 6, &[&[10.0, 20.0, 30.0, 40.0]]).unwrap();
        assert_eq!(y, [30.0, 40.0, 10.0, 20.0]);
    }

    #[test]
    fn a_leading_add_starts_the_output_and_is_not_applied_again() {
        let post = PostOps::parse(&attrs("Add,Sigmoid,Tanh", &[])).unwrap();
        assert!(post.accumulates() && post.applies());
        let r = [1.0f32, -1.0];
        let mut y = [9.0f32; 2];
        post.start(&mut y, &[&r], false).unwrap();
        assert_eq!(y, r);
        post.start(&mut y, &[&[]], true).unwrap();
        assert_eq!(y, r, "in place: R is already there");
        post.apply(&mut y, 0, &[&[]]).unwrap();
        // tanh(sigmoid(±1)) = tanh(0.7310586), tanh(0.26894142)
        for (g, w) in y.iter().zip([0.623_712_5, 0.262_639_6]) {
            assert!((g - w).abs() < 1e-6, "{y:?}");
        }
        let mut z = [5.0f32; 2];
        PostOps::default().start(&mut z, &[], false).unwrap();
        assert_eq!(z, [0.0; 2]);
    }
}
