//! Elementwise ops: unary functions and activations, `Clip`, `Cast`, binary arithmetic,
//! comparisons and logic with numpy broadcasting, the variadic `Max`/`Min`/`Sum`/`Mean`, and
//! `Where`.
//!
//! Canonical attributes (filled in by `ops/src/elementwise/mod.rs`):
//! - `LeakyRelu`, `Elu`, `Celu`, `ThresholdedRelu`: `alpha`; `Selu`: `alpha`, `gamma`;
//!   `HardSigmoid`: `alpha`, `beta`; `Gelu`: `approximate` (`none` or `tanh`); `Shrink`:
//!   `bias`, `lambd`;
//!   `IsInf`: `detect_negative`, `detect_positive`; `Mod`: `fmod`; `BitShift`: `direction`
//!   (`LEFT` or `RIGHT`).
//! - `Clip`: `min` and `max` (float or int; ±inf when unbounded); one input, or with
//!   `min_input`/`max_input` set, the bounds computed at run time after it (one value each).
//! - `Cast`: `to` (ONNX type code), which must be the output's type. `CastLike` casts its first
//!   input to the output's type (the compiler lowers it to `Cast`).
//!
//! Types: arithmetic, comparisons, `Clip`, `Max`/`Min`/`Sum`/`Mean`, `Abs`/`Neg`/`Sign`/`Relu`
//! on every numeric type (f32, f64, f16, 8- to 64-bit integers); the float functions on f32,
//! f64 and f16 (computed in f32); `Pow` with an f32/f64/f16/i32/i64 base and any numeric
//! exponent; `BitShift` and the `Bitwise*` ops on integers; logic on bool; `Equal`, `Where` and `Cast` on every type.
//!
//! Element semantics (wrapping integers, casts, NaN) are in `elementwise/scalar.rs`; the
//! broadcasting plan is in `elementwise/broadcast.rs`.

use crate::cpu::parallel::for_each_chunk;
use crate::cpu::{Kernel, KernelError, OpCx};
use crate::invalid;
use crate::minifloat::{Format, Rounding};
use crate::tensor::{Element, TensorMut, TensorRef};
use broadcast::Broadcast;
use half::f16;
use ingot_schema::{AttrValue, Attrs, DType};
use scalar::{Float, Num, Scalar, Wide};
use std::marker::PhantomData;

mod broadcast;
mod scalar;

pub(crate) use scalar::{erf_f32, exp_f32, tanh_f32};

const COMPARE: &[&str] = &["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"];

/// Elements a unary map hands to one task: enough to be worth another thread.
const MAP_TASK: usize = 1 << 15;

/// Ops of this family whose kernels are not built on `Map` or `Binary` and so do not run in
/// place: Pow, the variadic ops and Where.
const NOT_IN_PLACE: &[&str] = &["Pow", "Max", "Min", "Sum", "Mean", "Where"];

/// Whether `op` runs in place ([`Kernel::run_in_place`]) over any of its inputs: every op of
/// this family built on the `Map` and `Binary` kernels.
pub(super) fn in_place(op: &str, _: &Attrs, k: usize) -> bool {
    // Clip's bounds computed at run time (inputs 1, 2) are single values, read first.
    !(NOT_IN_PLACE.contains(&op) || (op == "Clip" && k > 0))
}

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    match cx.op {
        "Cast" | "CastLike" => cast(cx),
        "Clip" => clip(cx),
        "Max" | "Min" | "Sum" | "Mean" => variadic(cx),
        "Where" => where_(cx),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "PRelu" | "SwiGLU" | "BitShift" | "And"
        | "Or" | "Xor" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" => binary(cx),
        op if COMPARE.contains(&op) => binary(cx),
        _ => unary(cx),
    }
}

/// Runs `$body` with the type `$T` bound to the element type of `$dt`, one of those listed.
macro_rules! with_type {
    ($dt:expr, $cx:expr, |$T:ident| $body:expr, [$($d:ident => $t:ty),*]) => {
        match $dt {
            $(DType::$d => {
                type $T = $t;
                $body
            })*
            #[allow(unreachable_patterns)]
            other => Err($cx.dtype_error(other)),
        }
    };
}
/// Every type with arithmetic.
macro_rules! numeric {
    ($dt:expr, $cx:expr, |$T:ident| $body:expr) => {
        with_type!($dt, $cx, |$T| $body, [F32 => f32, F64 => f64, F16 => f16, I8 => i8,
            U8 => u8, I16 => i16, U16 => u16, I32 => i32, U32 => u32, I64 => i64, U64 => u64])
    };
}
/// The integer types.
macro_rules! integers {
    ($dt:expr, $cx:expr, |$T:ident| $body:expr) => {
        with_type!($dt, $cx, |$T| $body, [I8 => i8, U8 => u8, I16 => i16, U16 => u16,
            I32 => i32, U32 => u32, I64 => i64, U64 => u64])
    };
}
/// The float types.
macro_rules! floats {
    ($dt:expr, $cx:expr, |$T:ident| $body:expr) => {
        with_type!($dt, $cx, |$T| $body, [F32 => f32, F64 => f64, F16 => f16])
    };
}
/// Every type; bool as its 0/1 bytes.
macro_rules! any_type {
    ($dt:expr, $cx:expr, |$T:ident| $body:expr) => {
        with_type!($dt, $cx, |$T| $body, [F32 => f32, F64 => f64, F16 => f16, I8 => i8,
            U8 => u8, I16 => i16, U16 => u16, I32 => i32, U32 => u32, I64 => i64, U64 => u64,
            Bool => u8])
    };
}

type Prepared = Result<Box<dyn Kernel>, KernelError>;

// ---- checks and tensor access ----

/// Errors unless the output has `dtype`.
fn expect_output(cx: &OpCx, dtype: DType) -> Result<(), KernelError> {
    let y = &cx.outputs[0];
    if y.dtype != dtype {
        return Err(invalid!("{} produces {dtype}, but its output is declared {}", cx.op, y.dtype));
    }
    Ok(())
}

/// Checks a one-input op: its output has `dtype` and the input's shape. Returns the length.
fn same_shape(cx: &OpCx, dtype: DType) -> Result<usize, KernelError> {
    expect_output(cx, dtype)?;
    let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
    if y.shape != x.shape {
        return Err(invalid!(
            "{} maps shape {:?} to itself, but its output is declared {:?}",
            cx.op,
            x.shape,
            y.shape
        ));
    }
    Ok(x.elements())
}

fn input<'a, T: Element>(inputs: &[TensorRef<'a>], i: usize) -> Result<&'a [T], KernelError> {
    let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
    Ok(t.as_slice()?)
}

fn output<'a, T: Element>(outputs: &'a mut [TensorMut<'_>]) -> Result<&'a mut [T], KernelError> {
    let t = outputs.first_mut().ok_or_else(|| invalid!("the output is missing"))?;
    Ok(t.as_slice_mut()?)
}

/// Input `i`'s raw elements of `T`'s size, whatever its type (for ops that only move values).
fn input_bits<'a, T: bytemuck::Pod>(
    inputs: &[TensorRef<'a>],
    i: usize,
) -> Result<&'a [T], KernelError> {
    let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
    bytemuck::try_cast_slice(t.bytes).map_err(|_| invalid!("input {i} is misaligned"))
}

fn output_bits<'a, T: bytemuck::Pod>(
    outputs: &'a mut [TensorMut<'_>],
) -> Result<&'a mut [T], KernelError> {
    let t = outputs.first_mut().ok_or_else(|| invalid!("the output is missing"))?;
    bytemuck::try_cast_slice_mut(t.bytes).map_err(|_| invalid!("the output is misaligned"))
}

// ---- kernels ----

/// Whether an op's loops over elements of `T` are compiled for that op, its function inlined
/// into vectorised loops: for f32, what models compute in. Over any other type an op shares
/// its type signature's loops, which call the op's function per element through a pointer:
/// those types carry shape arithmetic, masks and indices, small tensors, and compiled per op
/// and type (400 kernels) they made 1.5 MB of an app binary.
const fn compiled_per_op<T: Element>() -> bool {
    matches!(T::DTYPE, DType::F32)
}

/// A unary function's loops over a block of elements: all an op compiles of its own. The
/// kernel around them (checks, chunks, threads) is compiled once per pair of types.
trait MapLoops<A, O>: Send + Sync {
    /// `y[i] = f(x[i])`.
    fn map(&self, x: &[A], y: &mut [O]);
    /// `y[i] = f(y[i] read as an A)`; the types have one size.
    fn map_in_place(&self, y: &mut [O]);
}

impl<A: Element, O: Element, F: Fn(A) -> O + Send + Sync> MapLoops<A, O> for F {
    fn map(&self, x: &[A], y: &mut [O]) {
        map_loop(self, x, y)
    }

    fn map_in_place(&self, y: &mut [O]) {
        for y in y.iter_mut() {
            *y = self(bytemuck::cast(*y));
        }
    }
}

/// `y[i] = f(x[i])`, compiled for the wider vector units too: the baseline's SSE2 runs a
/// standalone Sigmoid (a QDQ model's SiLU, which its round trips keep out of the conv) at
/// half the speed of AVX2.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512vl+avx2+fma+avx",
    "x86_64+avx2+fma+avx",
    "aarch64+neon"
))]
fn map_loop<A: Element, O: Element, F: Fn(A) -> O>(f: &F, x: &[A], y: &mut [O]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = f(x);
    }
}

/// `y = f(x)`, element by element.
struct Map<A, O> {
    len: usize,
    f: Box<dyn MapLoops<A, O>>,
}

fn map<A: Element, O: Element>(
    len: usize,
    f: impl Fn(A) -> O + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    let f: Box<dyn MapLoops<A, O>> = if compiled_per_op::<A>() {
        Box::new(f)
    } else {
        let f: Box<dyn Fn(A) -> O + Send + Sync> = Box::new(f);
        Box::new(f)
    };
    Box::new(Map { len, f })
}

impl<A: Element, O: Element> Kernel for Map<A, O> {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = input::<A>(inputs, 0)?;
        let y = output::<O>(outputs)?;
        check_len(self.len, x.len(), y.len())?;
        for_each_chunk(y, MAP_TASK, &|t, y| self.f.map(&x[t * MAP_TASK..], y));
        Ok(())
    }

    fn run_in_place(
        &self,
        aliased: usize,
        _inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        if aliased != 0 || size_of::<A>() != size_of::<O>() {
            return Err(invalid!("cannot run in place over input {aliased}"));
        }
        let y = output::<O>(outputs)?;
        check_len(self.len, y.len(), y.len())?;
        // The output holds the input's bits: read each element as the input type.
        for_each_chunk(y, MAP_TASK, &|_, y| self.f.map_in_place(y));
        Ok(())
    }
}

/// Errors unless a map's input and output have the `len` elements it was prepared for. Not
/// generic: every map shares it.
fn check_len(len: usize, x: usize, y: usize) -> Result<(), KernelError> {
    if x != len || y != len {
        return Err(invalid!("prepared for {len} elements, got {x} -> {y}"));
    }
    Ok(())
}

/// A binary function's loops over a block, each operand the block's length or one element
/// that repeats (see [`Broadcast::blocks`]): all an op compiles of its own.
trait ZipLoops<A, B, O>: Send + Sync {
    /// `y[i] = f(a[i], b[i])`.
    fn zip(&self, a: &[A], b: &[B], y: &mut [O]);
    /// `y[i] = f(y[i] read as an A, b[i])`; A and O have one size.
    fn zip_over_a(&self, y: &mut [O], b: &[B]);
    /// `y[i] = f(a[i], y[i] read as a B)`; B and O have one size.
    fn zip_over_b(&self, a: &[A], y: &mut [O]);
}

impl<A: Element, B: Element, O: Element, F: Fn(A, B) -> O + Send + Sync> ZipLoops<A, B, O> for F {
    fn zip(&self, a: &[A], b: &[B], y: &mut [O]) {
        zip_block(a, b, y, self);
    }

    fn zip_over_a(&self, y: &mut [O], b: &[B]) {
        match b {
            &[b] => y.iter_mut().for_each(|y| *y = self(bytemuck::cast(*y), b)),
            b => (y.iter_mut().zip(b)).for_each(|(y, &b)| *y = self(bytemuck::cast(*y), b)),
        }
    }

    fn zip_over_b(&self, a: &[A], y: &mut [O]) {
        match a {
            &[a] => y.iter_mut().for_each(|y| *y = self(a, bytemuck::cast(*y))),
            a => (y.iter_mut().zip(a)).for_each(|(y, &a)| *y = self(a, bytemuck::cast(*y))),
        }
    }
}

/// `y = f(a, b)` with `a` and `b` broadcast.
struct Binary<A, B, O> {
    bc: Broadcast<2>,
    f: Box<dyn ZipLoops<A, B, O>>,
}

fn binary_kernel<A: Element, B: Element, O: Element>(
    bc: Broadcast<2>,
    f: impl Fn(A, B) -> O + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    Box::new(Binary { bc, f: zip_loops(f) })
}

/// `f`'s loops: its own ([`compiled_per_op`]), or its type signature's calling it.
fn zip_loops<A: Element, B: Element, O: Element>(
    f: impl Fn(A, B) -> O + Send + Sync + 'static,
) -> Box<dyn ZipLoops<A, B, O>> {
    if compiled_per_op::<A>() {
        Box::new(f)
    } else {
        let f: Box<dyn Fn(A, B) -> O + Send + Sync> = Box::new(f);
        Box::new(f)
    }
}

impl<A: Element, B: Element, O: Element> Kernel for Binary<A, B, O> {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let (a, b) = (input::<A>(inputs, 0)?, input::<B>(inputs, 1)?);
        let y = output::<O>(outputs)?;
        self.bc.check([a.len(), b.len()], y.len())?;
        for ([ra, rb], ry) in self.bc.blocks() {
            self.f.zip(&a[ra], &b[rb], &mut y[ry]);
        }
        Ok(())
    }

    /// The aliased operand has the output's shape (the planner only aliases equal types), so
    /// its blocks are the output's: each element is read, then overwritten.
    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        let y = output::<O>(outputs)?;
        match aliased {
            0 if size_of::<A>() == size_of::<O>() => {
                let b = input::<B>(inputs, 1)?;
                self.bc.check([y.len(), b.len()], y.len())?;
                for ([_, rb], ry) in self.bc.blocks() {
                    self.f.zip_over_a(&mut y[ry], &b[rb]);
                }
            }
            1 if size_of::<B>() == size_of::<O>() => {
                let a = input::<A>(inputs, 0)?;
                self.bc.check([a.len(), y.len()], y.len())?;
                for ([ra, _], ry) in self.bc.blocks() {
                    self.f.zip_over_b(&a[ra], &mut y[ry]);
                }
            }
            _ => return Err(invalid!("cannot run in place over input {aliased}")),
        }
        Ok(())
    }
}

/// `y = f(a, b)` over a checked plan.
#[inline(always)]
fn zip_broadcast<A: Element, B: Copy, O: Copy>(
    bc: &Broadcast<2>,
    a: &[A],
    b: &[B],
    y: &mut [O],
    f: &impl Fn(A, B) -> O,
) {
    for ([ra, rb], ry) in bc.blocks() {
        zip_block(&a[ra], &b[rb], &mut y[ry], f);
    }
}

/// `y = f(a, b)` over one block, each operand the block's length or one repeated element: a
/// loop the compiler vectorises per case where `f` is inlined ([`compiled_per_op`]), else one
/// loop for all.
#[inline(always)]
fn zip_block<A: Element, B: Copy, O: Copy>(a: &[A], b: &[B], y: &mut [O], f: &impl Fn(A, B) -> O) {
    if !compiled_per_op::<A>() {
        let (sa, sb) = (step(a), step(b));
        for (i, y) in y.iter_mut().enumerate() {
            *y = f(a[i * sa], b[i * sb]);
        }
        return;
    }
    match (a, b) {
        (&[a], &[b]) => y.fill(f(a, b)),
        (&[a], b) => y.iter_mut().zip(b).for_each(|(y, &b)| *y = f(a, b)),
        (a, &[b]) => y.iter_mut().zip(a).for_each(|(y, &a)| *y = f(a, b)),
        (a, b) => {
            for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                *y = f(a, b);
            }
        }
    }
}

// ---- unary ----

fn unary(cx: &OpCx) -> Prepared {
    cx.expect_arity(1..=1, 1)?;
    let dt = cx.inputs[0].dtype;
    let bool_out = matches!(cx.op, "Not" | "IsNaN" | "IsInf");
    let len = same_shape(cx, if bool_out { DType::Bool } else { dt })?;
    match cx.op {
        "Abs" => numeric!(dt, cx, |T| Ok(map(len, <T as Num>::abs))),
        "Neg" => numeric!(dt, cx, |T| Ok(map(len, <T as Num>::neg))),
        "Sign" => numeric!(dt, cx, |T| Ok(map(len, <T as Num>::sign))),
        "Relu" => numeric!(dt, cx, |T| Ok(map(len, |x: T| Num::max(x, T::ZERO)))),
        "Not" if dt == DType::Bool => Ok(map(len, |x: u8| (x == 0) as u8)),
        "Not" => Err(cx.dtype_error(dt)),
        "BitwiseNot" => integers!(dt, cx, |T| Ok(map(len, |x: T| !x))),
        "IsNaN" => floats!(dt, cx, |T| Ok(map(len, |x: T| Num::is_nan(x) as u8))),
        "IsInf" => {
            let neg = cx.attrs.int("detect_negative")? != 0;
            let pos = cx.attrs.int("detect_positive")? != 0;
            floats!(dt, cx, |T| Ok(map(len, move |x: T| {
                (Num::is_infinite(x) && if x > T::ZERO { pos } else { neg }) as u8
            })))
        }
        op => match dt {
            DType::F32 => float_unary::<f32>(op, cx.attrs, Direct(len)),
            DType::F64 => float_unary::<f64>(op, cx.attrs, Direct(len)),
            DType::F16 => float_unary::<f32>(op, cx.attrs, ViaF32(len)),
            other => Err(cx.dtype_error(other)),
        },
    }
}

/// Where a float function's kernel reads and writes its elements.
trait Sink<F> {
    fn build(self, f: impl Fn(F) -> F + Send + Sync + 'static) -> Box<dyn Kernel>;
}

/// Elements of the function's own type.
struct Direct(usize);
impl<F: Float> Sink<F> for Direct {
    fn build(self, f: impl Fn(F) -> F + Send + Sync + 'static) -> Box<dyn Kernel> {
        map(self.0, f)
    }
}

/// f16 elements, computed in f32.
struct ViaF32(usize);
impl Sink<f32> for ViaF32 {
    fn build(self, f: impl Fn(f32) -> f32 + Send + Sync + 'static) -> Box<dyn Kernel> {
        via_f32(self.0, Box::new(f))
    }
}

/// The one f16 map kernel of every float function, called through a pointer.
fn via_f32(len: usize, f: Box<dyn Fn(f32) -> f32 + Send + Sync>) -> Box<dyn Kernel> {
    map(len, move |x: f16| f16::from_f32(f(x.to_f32())))
}

fn float_unary<F: Float>(op: &str, attrs: &Attrs, sink: impl Sink<F>) -> Prepared {
    let attr = |name: &str| -> Result<F, KernelError> { Ok(F::of(attrs.float(name)? as f64)) };
    let (zero, half, one) = (F::ZERO, F::of(0.5), F::of(1.0));
    // ln(1 + e^x) without overflow.
    let softplus = move |x: F| x.max(zero) + (-x.abs()).exp().ln_1p();
    Ok(match op {
        "Ceil" => sink.build(F::ceil),
        "Floor" => sink.build(F::floor),
        "Round" => sink.build(F::round),
        "Sqrt" => sink.build(F::sqrt),
        "Reciprocal" => sink.build(F::recip),
        "Exp" => sink.build(F::exp),
        "Log" => sink.build(F::ln),
        "Sin" => sink.build(F::sin),
        "Cos" => sink.build(F::cos),
        "Tan" => sink.build(F::tan),
        "Asin" => sink.build(F::asin),
        "Acos" => sink.build(F::acos),
        "Atan" => sink.build(F::atan),
        "Sinh" => sink.build(F::sinh),
        "Cosh" => sink.build(F::cosh),
        "Tanh" => sink.build(F::tanh),
        "Asinh" => sink.build(F::asinh),
        "Acosh" => sink.build(F::acosh),
        "Atanh" => sink.build(F::atanh),
        "Erf" => sink.build(F::erf),
        "Sigmoid" => sink.build(move |x: F| one / (one + (-x).exp())),
        "Softplus" => sink.build(softplus),
        "Softsign" => sink.build(move |x: F| x / (one + x.abs())),
        "Mish" => sink.build(move |x: F| x * softplus(x).tanh()),
        "HardSwish" => {
            let sixth = F::of(1.0 / 6.0);
            sink.build(move |x: F| x * (x * sixth + half).max(zero).min(one))
        }
        // x · sigmoid(αx), as one division: no NaN where exp overflows (x / inf is 0).
        "Swish" => {
            let alpha = attr("alpha")?;
            sink.build(move |x: F| x / (one + (-(alpha * x)).exp()))
        }
        "HardSigmoid" => {
            let (alpha, beta) = (attr("alpha")?, attr("beta")?);
            sink.build(move |x: F| (alpha * x + beta).max(zero).min(one))
        }
        "LeakyRelu" => {
            let alpha = attr("alpha")?;
            sink.build(move |x: F| if x < zero { alpha * x } else { x })
        }
        "ThresholdedRelu" => {
            let alpha = attr("alpha")?;
            sink.build(move |x: F| if x > alpha { x } else { zero })
        }
        "Shrink" => {
            let (bias, lambd) = (attr("bias")?, attr("lambd")?);
            sink.build(move |x: F| {
                if x < -lambd {
                    x + bias
                } else if x > lambd {
                    x - bias
                } else {
                    zero
                }
            })
        }
        "Elu" => {
            let alpha = attr("alpha")?;
            sink.build(move |x: F| if x < zero { alpha * (x.exp() - one) } else { x })
        }
        "Selu" => {
            let (alpha, gamma) = (attr("alpha")?, attr("gamma")?);
            sink.build(move |x: F| gamma * if x > zero { x } else { alpha * (x.exp() - one) })
        }
        "Celu" => {
            let alpha = attr("alpha")?;
            sink.build(move |x: F| x.max(zero) + (alpha * ((x / alpha).exp() - one)).min(zero))
        }
        "Gelu" => match attrs.text("approximate")? {
            "none" => {
                let r = F::of(std::f64::consts::FRAC_1_SQRT_2);
                sink.build(move |x: F| half * x * (one + (x * r).erf()))
            }
            "tanh" => {
                let k = F::of((2.0 / std::f64::consts::PI).sqrt());
                let c = F::of(0.044715);
                sink.build(move |x: F| half * x * (one + (k * (x + c * x * x * x)).tanh()))
            }
            other => return Err(invalid!("Gelu: unknown approximation '{other}'")),
        },
        op => return Err(KernelError::UnknownOp(op.to_string())),
    })
}

/// Attribute `name` as a bound: an int or a float, kept exact for either.
fn bound(attrs: &Attrs, name: &str) -> Result<Wide, KernelError> {
    match attrs.get(name) {
        Some(AttrValue::Int(v)) => Ok(Wide::I(*v)),
        Some(AttrValue::Float(v)) => Ok(Wide::F(*v)),
        _ => Ok(Wide::F(attrs.float(name)? as f64)), // the getter's error
    }
}

fn clip(cx: &OpCx) -> Prepared {
    // Bounds computed at run time follow x, min first (ops/src/elementwise/mod.rs).
    let flag = |name: &str| cx.attrs.int(name).is_ok_and(|v| v != 0);
    let (min_input, max_input) = (flag("min_input"), flag("max_input"));
    let n_in = 1 + usize::from(min_input) + usize::from(max_input);
    cx.expect_arity(n_in..=n_in, 1)?;
    let dt = cx.inputs[0].dtype;
    let len = same_shape(cx, dt)?;
    if let Some(b) = cx.inputs[1..].iter().find(|b| b.dtype != dt || b.elements() != 1) {
        return Err(invalid!("Clip bounds are one {dt} value, got {} {:?}", b.dtype, b.shape));
    }
    let (lo, hi) = (bound(cx.attrs, "min")?, bound(cx.attrs, "max")?);
    numeric!(dt, cx, |T| {
        let (lo, hi) = (T::from_wide(lo), T::from_wide(hi));
        if n_in == 1 {
            return Ok(map(len, move |x: T| clip_to(x, lo, hi)));
        }
        let lo = if min_input { Bound::Input(1) } else { Bound::Fixed(lo) };
        let hi = if max_input { Bound::Input(n_in - 1) } else { Bound::Fixed(hi) };
        Ok(Box::new(ClipAtRunTime { len, lo, hi }))
    })
}

/// NaN passes through; with min > max everything becomes max, as ONNX says.
fn clip_to<T: PartialOrd>(x: T, lo: T, hi: T) -> T {
    let x = if x < lo { lo } else { x };
    if x > hi { hi } else { x }
}

/// A bound of Clip: its attribute, or the one element of an input.
#[derive(Clone, Copy)]
enum Bound<T> {
    Fixed(T),
    Input(usize),
}

/// Clip with a bound computed at run time, read before the elements are.
struct ClipAtRunTime<T> {
    len: usize,
    lo: Bound<T>,
    hi: Bound<T>,
}

impl<T: Scalar> ClipAtRunTime<T> {
    fn bounds(&self, inputs: &[TensorRef]) -> Result<(T, T), KernelError> {
        let value = |b: Bound<T>| match b {
            Bound::Fixed(v) => Ok(v),
            Bound::Input(i) => input::<T>(inputs, i)?
                .first()
                .copied()
                .ok_or_else(|| invalid!("Clip's bound (input {i}) is empty")),
        };
        Ok((value(self.lo)?, value(self.hi)?))
    }

    /// This run's clip as a map kernel, made as [`map`] makes it (a small allocation per
    /// run, for a rare form of the op).
    fn map(&self, inputs: &[TensorRef]) -> Result<Box<dyn Kernel>, KernelError> {
        let (lo, hi) = self.bounds(inputs)?;
        Ok(map(self.len, move |x: T| clip_to(x, lo, hi)))
    }
}

impl<T: Scalar> Kernel for ClipAtRunTime<T> {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        self.map(inputs)?.run(inputs, outputs)
    }

    fn run_in_place(
        &self,
        aliased: usize,
        inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        self.map(inputs)?.run_in_place(aliased, inputs, outputs)
    }
}

fn cast(cx: &OpCx) -> Prepared {
    let n_in = if cx.op == "CastLike" { 2 } else { 1 };
    cx.expect_arity(n_in..=n_in, 1)?;
    let (src, dst) = (cx.inputs[0].dtype, cx.outputs[0].dtype);
    if cx.op == "Cast" {
        let to = cx.attrs.int("to")?;
        if i32::try_from(to).ok().and_then(DType::from_onnx_code) != Some(dst) {
            return Err(invalid!("Cast to type code {to}, but its output is {dst}"));
        }
    }
    let len = same_shape(cx, dst)?;
    if cx.attrs.int_or("bfloat16", 0)? != 0 {
        if (src, dst) != (DType::F32, DType::F32) {
            return Err(invalid!("a cast to bfloat16 takes and gives float, not {src} -> {dst}"));
        }
        return Ok(map(len, round_to_bf16));
    }
    match (src, dst) {
        (DType::F16, DType::F32) => return Ok(Box::new(HalfCast { len, widen: true })),
        (DType::F32, DType::F16) => return Ok(Box::new(HalfCast { len, widen: false })),
        _ => {}
    }
    if src == DType::F32 && dst.packed_bits().is_none() && !dst.is_minifloat() {
        return match dst {
            DType::Bool => Ok(map(len, |x: f32| (x != 0.0) as u8)),
            _ => any_type!(dst, cx, |B| Ok(map(len, |x: f32| B::from_wide(x.to_wide())))),
        };
    }
    // Bool is stored as 0/1 bytes, so as a source it converts like u8; the 2- and 4-bit
    // integers as their bytes, i8 and u8.
    let storage = match src {
        DType::I4 | DType::I2 => DType::I8,
        DType::U4 | DType::U2 => DType::U8,
        t => t,
    };
    let widen = match Format::of(src) {
        Some(f) => (1, Widen::Minifloat(f)),
        None => any_type!(storage, cx, |A| Ok((size_of::<A>(), Widen::Typed(widen::<A>))))?,
    };
    let (saturate, rounding) =
        crate::minifloat::cast_mode(cx.attrs).map_err(|e| invalid!("{e}"))?;
    let narrow = match (dst, Format::of(dst)) {
        (DType::Bool, _) => (1, Narrow::Typed(narrow_bool)),
        (DType::I4, _) => (1, Narrow::Typed(narrow_sub_byte::<4, true>)),
        (DType::U4, _) => (1, Narrow::Typed(narrow_sub_byte::<4, false>)),
        (DType::I2, _) => (1, Narrow::Typed(narrow_sub_byte::<2, true>)),
        (DType::U2, _) => (1, Narrow::Typed(narrow_sub_byte::<2, false>)),
        (_, Some(f)) => (1, Narrow::Minifloat(f, saturate, rounding)),
        _ => any_type!(dst, cx, |B| Ok((size_of::<B>(), Narrow::Typed(narrow::<B>))))?,
    };
    let (dtypes, sizes) = ((src, dst), (widen.0, narrow.0));
    Ok(Box::new(Cast { len, dtypes, sizes, widen: widen.1, narrow: narrow.1 }))
}

/// A cast between float16 and float32, whole slices at a time: `half`'s slice conversions
/// use the CPU's conversion instructions (F16C, NEON's fp16) where it has them. The compiler
/// casts every f16 operand of a step that computes in f32 (`widen_f16`), so these run often.
struct HalfCast {
    len: usize,
    /// f16 -> f32 (else f32 -> f16, rounding to nearest even).
    widen: bool,
}

impl Kernel for HalfCast {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        use half::slice::HalfFloatSliceExt;
        if self.widen {
            let (x, y) = (input::<f16>(inputs, 0)?, output::<f32>(outputs)?);
            check_len(self.len, x.len(), y.len())?;
            for_each_chunk(y, MAP_TASK, &|t, y| {
                x[t * MAP_TASK..][..y.len()].convert_to_f32_slice(y)
            });
        } else {
            let (x, y) = (input::<f32>(inputs, 0)?, output::<f16>(outputs)?);
            check_len(self.len, x.len(), y.len())?;
            for_each_chunk(y, MAP_TASK, &|t, y| {
                y.convert_from_f32_slice(&x[t * MAP_TASK..][..y.len()])
            });
        }
        Ok(())
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as an f32: what a cast to bfloat16
/// keeps. NaN stays NaN; a value past bfloat16's largest rounds to infinity.
pub(crate) fn round_to_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

/// How a cast reads its source: a function per Rust type, or a minifloat format.
#[derive(Clone, Copy)]
enum Widen {
    Typed(fn(&[u8], &mut [Wide])),
    Minifloat(Format),
}

/// How a cast writes its destination; a minifloat with whether it saturates and how it
/// rounds.
#[derive(Clone, Copy)]
enum Narrow {
    Typed(fn(&[Wide], &mut [u8])),
    Minifloat(Format, bool, Rounding),
}

impl Widen {
    fn run(self, x: &[u8], w: &mut [Wide]) {
        match self {
            Widen::Typed(f) => f(x, w),
            Widen::Minifloat(format) => {
                for (&x, w) in x.iter().zip(w) {
                    *w = Wide::F(f64::from(format.decode(x)));
                }
            }
        }
    }
}

impl Narrow {
    fn run(self, w: &[Wide], y: &mut [u8]) {
        match self {
            Narrow::Typed(f) => f(w, y),
            Narrow::Minifloat(format, saturate, rounding) => {
                for (&w, y) in w.iter().zip(y) {
                    *y = format.encode_rounded(w.to_f64(), saturate, rounding);
                }
            }
        }
    }
}

/// `Cast` from a type other than f32 ([`compiled_per_op`]): through [`Wide`], as every
/// conversion of [`Scalar`] goes, a block at a time, so it is compiled once per source type
/// and once per destination type instead of once per pair.
struct Cast {
    len: usize,
    /// The source and destination types, and their bytes per element.
    dtypes: (DType, DType),
    sizes: (usize, usize),
    widen: Widen,
    narrow: Narrow,
}

/// Elements a cast converts per block, through a buffer on the stack.
const CAST_BLOCK: usize = 256;

/// Reads each `T` of `x`, packed bytes, as a [`Wide`].
fn widen<T: Scalar>(x: &[u8], w: &mut [Wide]) {
    for (x, w) in x.chunks_exact(size_of::<T>()).zip(w) {
        *w = bytemuck::pod_read_unaligned::<T>(x).to_wide();
    }
}

/// Writes each value of `w` into `y` as a `T`, packed bytes.
fn narrow<T: Scalar>(w: &[Wide], y: &mut [u8]) {
    for (&w, y) in w.iter().zip(y.chunks_exact_mut(size_of::<T>())) {
        y.copy_from_slice(bytemuck::bytes_of(&T::from_wide(w)));
    }
}

/// A cast to a `BITS`-bit integer (2 or 4), as ONNX's reference (ml_dtypes) computes it:
/// integers wrap to `BITS` bits; floats truncate toward zero, and one outside the type's range
/// (or NaN) gives 0 (ONNX leaves it undefined).
fn narrow_sub_byte<const BITS: u32, const SIGNED: bool>(w: &[Wide], y: &mut [u8]) {
    let levels = f64::from(1u32 << BITS);
    let (lo, hi) = if SIGNED { (-levels / 2.0, levels / 2.0 - 1.0) } else { (0.0, levels - 1.0) };
    for (&w, y) in w.iter().zip(y) {
        let i = match w {
            Wide::F(v) => {
                let t = v.trunc();
                if (lo..=hi).contains(&t) { t as i64 } else { 0 }
            }
            Wide::I(v) => v,
            Wide::U(v) => v as i64,
        };
        *y = crate::movement::cpu::wrap_to_bits(i, BITS, SIGNED);
    }
}

/// ONNX's cast to bool, as 0/1 bytes.
fn narrow_bool(w: &[Wide], y: &mut [u8]) {
    for (w, y) in w.iter().zip(y) {
        *y = w.is_nonzero() as u8;
    }
}

impl Cast {
    /// Errors unless run-time tensors have the types and sizes prepared for.
    fn check(
        &self,
        (x, x_bytes): (DType, usize),
        (y, y_bytes): (DType, usize),
    ) -> Result<(), KernelError> {
        let (from, to) = self.dtypes;
        if (x, y) != (from, to) {
            return Err(invalid!("prepared to cast {from} to {to}, got {x} to {y}"));
        }
        if (x_bytes, y_bytes) != (self.len * self.sizes.0, self.len * self.sizes.1) {
            return Err(invalid!(
                "prepared for {} elements, got {x_bytes} bytes of {x} -> {y_bytes} of {y}",
                self.len
            ));
        }
        Ok(())
    }

    /// Converts the packed elements of `x` into `y` a block at a time (`x` is `y` itself when
    /// `x` is `None`: each block is read whole before it is written).
    fn convert(&self, x: Option<&[u8]>, y: &mut [u8]) {
        let (sa, sb) = self.sizes;
        let mut w = [Wide::I(0); CAST_BLOCK];
        for (i, y) in y.chunks_mut(CAST_BLOCK * sb).enumerate() {
            let w = &mut w[..y.len() / sb];
            match x {
                Some(x) => self.widen.run(&x[i * CAST_BLOCK * sa..], w),
                None => self.widen.run(y, w),
            }
            self.narrow.run(w, y);
        }
    }
}

impl Kernel for Cast {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let x = input_bits::<u8>(inputs, 0)?;
        let x_dtype = inputs[0].dtype;
        let y_dtype = outputs.first().map_or(self.dtypes.1, |y| y.dtype);
        let y = output_bits::<u8>(outputs)?;
        self.check((x_dtype, x.len()), (y_dtype, y.len()))?;
        let (sa, sb) = self.sizes;
        for_each_chunk(y, MAP_TASK * sb, &|t, y| self.convert(Some(&x[t * MAP_TASK * sa..]), y));
        Ok(())
    }

    fn run_in_place(
        &self,
        aliased: usize,
        _inputs: &[TensorRef],
        outputs: &mut [TensorMut],
    ) -> Result<(), KernelError> {
        let s = self.sizes.0;
        if aliased != 0 || s != self.sizes.1 {
            return Err(invalid!("cannot run in place over input {aliased}"));
        }
        let y_dtype = outputs.first().map_or(self.dtypes.1, |y| y.dtype);
        let y = output_bits::<u8>(outputs)?;
        // The output holds the input's bytes.
        self.check((self.dtypes.0, y.len()), (y_dtype, y.len()))?;
        for_each_chunk(y, MAP_TASK * s, &|_, y| self.convert(None, y));
        Ok(())
    }
}

// ---- binary ----

fn binary(cx: &OpCx) -> Prepared {
    cx.expect_arity(2..=2, 1)?;
    let (a, b, y) = (&cx.inputs[0], &cx.inputs[1], &cx.outputs[0]);
    let bc = Broadcast::new([&a.shape, &b.shape], &y.shape)?;
    let (op, dt) = (cx.op, a.dtype);
    if op != "Pow" && b.dtype != dt {
        return Err(invalid!("{op} of {dt} and {}: the types must match", b.dtype));
    }
    let bool_out = COMPARE.contains(&op) || matches!(op, "And" | "Or" | "Xor");
    expect_output(cx, if bool_out { DType::Bool } else { dt })?;
    match op {
        "Pow" => pow(cx, bc, dt, b.dtype),
        // Swish(a) · b, Swish as its own kernel computes it.
        "SwiGLU" => {
            let alpha = cx.attrs.float("alpha")?;
            match dt {
                DType::F32 => Ok(binary_kernel(bc, move |a: f32, b: f32| {
                    a / (1.0 + (-(alpha * a)).exp()) * b
                })),
                DType::F64 => {
                    let alpha = f64::from(alpha);
                    Ok(binary_kernel(bc, move |a: f64, b: f64| {
                        a / (1.0 + (-(alpha * a)).exp()) * b
                    }))
                }
                other => Err(cx.dtype_error(other)),
            }
        }
        "And" | "Or" | "Xor" if dt != DType::Bool => Err(cx.dtype_error(dt)),
        "And" => Ok(binary_kernel(bc, |a: u8, b: u8| (a != 0 && b != 0) as u8)),
        "Or" => Ok(binary_kernel(bc, |a: u8, b: u8| (a != 0 || b != 0) as u8)),
        "Xor" => Ok(binary_kernel(bc, |a: u8, b: u8| ((a != 0) != (b != 0)) as u8)),
        "BitShift" => {
            let left = match cx.attrs.text("direction")? {
                "LEFT" => true,
                "RIGHT" => false,
                other => return Err(invalid!("BitShift: unknown direction '{other}'")),
            };
            integers!(dt, cx, |T| Ok(binary_kernel(bc, move |a: T, n: T| {
                // As the ONNX reference: a negative amount or one of the width or more
                // shifts everything out, leaving 0, or -1 for a negative value shifted right.
                let n = shift_amount(n);
                if left {
                    n.and_then(|n| a.checked_shl(n)).unwrap_or(0)
                } else {
                    n.and_then(|n| a.checked_shr(n)) // arithmetic for signed types
                        .unwrap_or_else(|| Num::min(Num::sign(a), 0))
                }
            })))
        }
        "BitwiseAnd" => integers!(dt, cx, |T| Ok(binary_kernel(bc, |a: T, b: T| a & b))),
        "BitwiseOr" => integers!(dt, cx, |T| Ok(binary_kernel(bc, |a: T, b: T| a | b))),
        "BitwiseXor" => integers!(dt, cx, |T| Ok(binary_kernel(bc, |a: T, b: T| a ^ b))),
        op if COMPARE.contains(&op) => any_type!(dt, cx, |T| compare::<T>(op, bc)),
        op => numeric!(dt, cx, |T| arith::<T>(op, cx.attrs, bc)),
    }
}

/// A shift amount as u32; `None` when negative.
fn shift_amount<T: Scalar>(n: T) -> Option<u32> {
    match n.to_wide() {
        Wide::U(v) => Some(u32::try_from(v).unwrap_or(u32::MAX)),
        Wide::I(v) => u64::try_from(v).ok().map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
        Wide::F(_) => None,
    }
}

fn arith<T: Num>(op: &str, attrs: &Attrs, bc: Broadcast<2>) -> Prepared {
    Ok(match op {
        "Add" => binary_kernel(bc, T::add),
        "Sub" => binary_kernel(bc, T::sub),
        "Mul" => binary_kernel(bc, T::mul),
        "Div" => binary_kernel(bc, T::div),
        "Mod" => match attrs.int("fmod")? {
            0 => binary_kernel(bc, |a: T, b: T| a.rem(b, false)),
            1 => binary_kernel(bc, |a: T, b: T| a.rem(b, true)),
            v => return Err(invalid!("Mod: fmod must be 0 or 1, got {v}")),
        },
        "PRelu" => binary_kernel(bc, |x: T, slope: T| if x < T::ZERO { x.mul(slope) } else { x }),
        op => return Err(KernelError::UnknownOp(op.to_string())),
    })
}

fn compare<T: Scalar>(op: &str, bc: Broadcast<2>) -> Prepared {
    Ok(match op {
        "Equal" => binary_kernel(bc, |a: T, b: T| (a == b) as u8),
        "Greater" => binary_kernel(bc, |a: T, b: T| (a > b) as u8),
        "GreaterOrEqual" => binary_kernel(bc, |a: T, b: T| (a >= b) as u8),
        "Less" => binary_kernel(bc, |a: T, b: T| (a < b) as u8),
        "LessOrEqual" => binary_kernel(bc, |a: T, b: T| (a <= b) as u8),
        op => return Err(KernelError::UnknownOp(op.to_string())),
    })
}

/// `Pow`: the result has the base's type; computed in f64 (exact for integer results that
/// fit), with `x * x` for the common square. The exponents are read as f64 first, so the
/// kernel is compiled per base type, not per pair of types.
struct Pow<T> {
    bc: Broadcast<2>,
    exponents: fn(&TensorRef) -> Result<Vec<f64>, KernelError>,
    _t: PhantomData<fn(T) -> T>,
}

fn pow(cx: &OpCx, bc: Broadcast<2>, base: DType, exp: DType) -> Prepared {
    fn as_f64<E: Scalar>(t: &TensorRef) -> Result<Vec<f64>, KernelError> {
        Ok(t.as_slice::<E>()?.iter().map(|e| e.to_wide().to_f64()).collect())
    }
    // The exponent may be any numeric type.
    let exponents = numeric!(exp, cx, |E| Ok(as_f64::<E> as fn(&TensorRef) -> _))?;
    // ONNX's base types.
    with_type!(base, cx, |T| Ok(Box::new(Pow::<T> { bc, exponents, _t: PhantomData })),
        [F32 => f32, F64 => f64, F16 => f16, I32 => i32, I64 => i64])
}

impl<T: Num> Kernel for Pow<T> {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let a = input::<T>(inputs, 0)?;
        let b = (self.exponents)(inputs.get(1).ok_or_else(|| invalid!("input 1 is missing"))?)?;
        let y = output::<T>(outputs)?;
        self.bc.check([a.len(), b.len()], y.len())?;
        if b == [2.0] {
            zip_broadcast(&self.bc, a, &b, y, &|x: T, _| x.mul(x));
        } else {
            zip_broadcast(&self.bc, a, &b, y, &|x: T, e: f64| {
                T::from_wide(Wide::F(x.to_wide().to_f64().powf(e)))
            });
        }
        Ok(())
    }
}

// ---- variadic ----

/// `Max`, `Min`, `Sum`, `Mean`: the first two inputs combine into the output, each further one
/// folds into it in place.
struct Variadic<T, F> {
    head: Head,
    rest: Vec<Broadcast<1>>,
    f: F,
    /// Divide by the number of inputs at the end.
    mean: bool,
    _t: PhantomData<fn(T) -> T>,
}

enum Head {
    /// A single input, copied (expanded) to the output.
    Copy(Broadcast<1>),
    Zip(Broadcast<2>),
}

fn variadic(cx: &OpCx) -> Prepared {
    let Some(dt) = cx.inputs.first().map(|x| x.dtype).filter(|_| cx.outputs.len() == 1) else {
        return Err(invalid!("{} takes 1 or more inputs and 1 output", cx.op));
    };
    if let Some(x) = cx.inputs.iter().find(|x| x.dtype != dt) {
        return Err(invalid!("{} of {dt} and {}: the types must match", cx.op, x.dtype));
    }
    expect_output(cx, dt)?;
    let out = &cx.outputs[0].shape;
    let (head, skip) = match cx.inputs {
        [a] => (Head::Copy(Broadcast::new([&a.shape], out)?), 1),
        [a, b, ..] => (Head::Zip(Broadcast::new([&a.shape, &b.shape], out)?), 2),
        [] => return Err(invalid!("{} needs an input", cx.op)),
    };
    let rest = cx.inputs[skip..]
        .iter()
        .map(|x| Broadcast::new([&x.shape], out))
        .collect::<Result<Vec<_>, _>>()?;
    fn kernel<T: Num>(
        head: Head,
        rest: Vec<Broadcast<1>>,
        mean: bool,
        f: impl Fn(T, T) -> T + Send + Sync + 'static,
    ) -> Prepared {
        if compiled_per_op::<T>() {
            Ok(Box::new(Variadic { head, rest, f, mean, _t: PhantomData }))
        } else {
            let f: Box<dyn Fn(T, T) -> T + Send + Sync> = Box::new(f);
            Ok(Box::new(Variadic { head, rest, f, mean, _t: PhantomData }))
        }
    }
    let mean = cx.op == "Mean";
    numeric!(dt, cx, |T| match cx.op {
        "Max" => kernel::<T>(head, rest, mean, Num::max),
        "Min" => kernel::<T>(head, rest, mean, Num::min),
        _ => kernel::<T>(head, rest, mean, Num::add),
    })
}

impl<T: Num, F: Fn(T, T) -> T + Send + Sync> Kernel for Variadic<T, F> {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let xs = (0..inputs.len()).map(|i| input::<T>(inputs, i)).collect::<Result<Vec<_>, _>>()?;
        let y = output::<T>(outputs)?;
        let skip = match (&self.head, &xs[..]) {
            (Head::Copy(bc), [a, ..]) => {
                bc.check([a.len()], y.len())?;
                for ([ra], ry) in bc.blocks() {
                    match &a[ra] {
                        &[v] => y[ry].fill(v),
                        a => y[ry].copy_from_slice(a),
                    }
                }
                1
            }
            (Head::Zip(bc), [a, b, ..]) => {
                bc.check([a.len(), b.len()], y.len())?;
                zip_broadcast(bc, a, b, y, &self.f);
                2
            }
            _ => return Err(invalid!("too few inputs")),
        };
        if xs.len() != skip + self.rest.len() {
            return Err(invalid!(
                "prepared for {} inputs, got {}",
                skip + self.rest.len(),
                xs.len()
            ));
        }
        for (bc, x) in self.rest.iter().zip(&xs[skip..]) {
            bc.check([x.len()], y.len())?;
            for ([rx], ry) in bc.blocks() {
                let y = &mut y[ry];
                match &x[rx] {
                    &[v] => y.iter_mut().for_each(|y| *y = (self.f)(*y, v)),
                    x => y.iter_mut().zip(x).for_each(|(y, &x)| *y = (self.f)(*y, x)),
                }
            }
        }
        if self.mean {
            let n = T::from_wide(Wide::U(xs.len() as u64));
            y.iter_mut().for_each(|y| *y = y.div(n));
        }
        Ok(())
    }
}

// ---- Where ----

/// `Where` only moves values, so it works on raw elements of the value type's size.
struct Where<T> {
    bc: Broadcast<3>,
    _t: PhantomData<fn(T) -> T>,
}

fn where_(cx: &OpCx) -> Prepared {
    cx.expect_arity(3..=3, 1)?;
    let [c, x, y] = [&cx.inputs[0], &cx.inputs[1], &cx.inputs[2]];
    if c.dtype != DType::Bool {
        return Err(invalid!("Where: the condition is {}, not bool", c.dtype));
    }
    if y.dtype != x.dtype {
        return Err(invalid!("Where of {} and {}: the types must match", x.dtype, y.dtype));
    }
    expect_output(cx, x.dtype)?;
    let bc = Broadcast::new([&c.shape, &x.shape, &y.shape], &cx.outputs[0].shape)?;
    Ok(match x.dtype.size() {
        1 => Box::new(Where::<u8> { bc, _t: PhantomData }),
        2 => Box::new(Where::<u16> { bc, _t: PhantomData }),
        4 => Box::new(Where::<u32> { bc, _t: PhantomData }),
        _ => Box::new(Where::<u64> { bc, _t: PhantomData }),
    })
}

impl<T: bytemuck::Pod + Send + Sync> Kernel for Where<T> {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let c = input::<u8>(inputs, 0)?;
        let (a, b) = (input_bits::<T>(inputs, 1)?, input_bits::<T>(inputs, 2)?);
        let y = output_bits::<T>(outputs)?;
        self.bc.check([c.len(), a.len(), b.len()], y.len())?;
        for ([rc, ra, rb], ry) in self.bc.blocks() {
            let (c, a, b, y) = (&c[rc], &a[ra], &b[rb], &mut y[ry]);
            if c.len() == y.len() && a.len() == y.len() && b.len() == y.len() {
                for (((y, &c), &a), &b) in y.iter_mut().zip(c).zip(a).zip(b) {
                    *y = if c != 0 { a } else { b };
                }
            } else {
                // Each input is contiguous or one repeated element: step 1 or 0.
                let (sc, sa, sb) = (step(c), step(a), step(b));
                for (i, y) in y.iter_mut().enumerate() {
                    *y = if c[i * sc] != 0 { a[i * sa] } else { b[i * sb] };
                }
            }
        }
        Ok(())
    }
}

fn step<X>(s: &[X]) -> usize {
    (s.len() > 1) as usize
}

#[cfg(test)]
mod tests;
