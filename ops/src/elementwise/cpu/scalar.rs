//! What the elementwise kernels need from one element: conversion ([`Scalar`]), arithmetic
//! ([`Num`]) and float functions ([`Float`]), implemented once per element type.
//!
//! Integer arithmetic follows C on two's complement: it wraps instead of trapping, and a
//! division or remainder by zero gives 0 (ONNX leaves it undefined; a model must not crash the
//! process). f16 computes in f32 and rounds once per operation.

use crate::tensor::Element;
use half::f16;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Any element value, wide enough to convert to every element type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Wide {
    F(f64),
    I(i64),
    U(u64),
}

impl Wide {
    /// ONNX's cast to bool: anything but zero is true (NaN too, as in C).
    pub fn is_nonzero(self) -> bool {
        match self {
            Wide::F(v) => v != 0.0,
            Wide::I(v) => v != 0,
            Wide::U(v) => v != 0,
        }
    }
    pub fn to_f64(self) -> f64 {
        match self {
            Wide::F(v) => v,
            Wide::I(v) => v as f64,
            Wide::U(v) => v as f64,
        }
    }
}

/// An element type with ONNX Cast semantics: float to integer truncates toward zero
/// (saturating; NaN gives 0), integer to integer wraps, float to float rounds to nearest even.
pub(super) trait Scalar: Element + PartialOrd + Send + Sync + 'static {
    fn to_wide(self) -> Wide;
    fn from_wide(w: Wide) -> Self;
}

macro_rules! scalar_native {
    ($($t:ty => $wide:ident as $via:ty),*) => {$(
        impl Scalar for $t {
            #[inline(always)]
            fn to_wide(self) -> Wide {
                Wide::$wide(self as $via)
            }
            #[inline(always)]
            fn from_wide(w: Wide) -> Self {
                match w {
                    Wide::F(v) => v as $t,
                    Wide::I(v) => v as $t,
                    Wide::U(v) => v as $t,
                }
            }
        }
    )*};
}
scalar_native!(f32 => F as f64, f64 => F as f64, i8 => I as i64, i16 => I as i64,
    i32 => I as i64, i64 => I as i64, u8 => U as u64, u16 => U as u64, u32 => U as u64,
    u64 => U as u64);

impl Scalar for f16 {
    fn to_wide(self) -> Wide {
        Wide::F(self.to_f64())
    }
    fn from_wide(w: Wide) -> Self {
        f16::from_f64(w.to_f64())
    }
}

/// Arithmetic on one element type.
pub(super) trait Num: Scalar {
    const ZERO: Self;
    fn add(self, b: Self) -> Self;
    fn sub(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    fn div(self, b: Self) -> Self;
    /// The remainder with the sign of the dividend when `fmod` (C's fmod), else with the sign
    /// of the divisor (Python's `%`).
    fn rem(self, b: Self, fmod: bool) -> Self;
    /// Maximum and minimum; a NaN operand gives NaN.
    fn max(self, b: Self) -> Self;
    fn min(self, b: Self) -> Self;
    fn abs(self) -> Self;
    fn neg(self) -> Self;
    /// -1, 0 or 1 (NaN stays NaN).
    fn sign(self) -> Self;
    fn is_nan(self) -> bool;
    fn is_infinite(self) -> bool;
}

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn add(self, b: Self) -> Self { self + b }
            #[inline(always)]
            fn sub(self, b: Self) -> Self { self - b }
            #[inline(always)]
            fn mul(self, b: Self) -> Self { self * b }
            #[inline(always)]
            fn div(self, b: Self) -> Self { self / b }
            #[inline(always)]
            fn rem(self, b: Self, fmod: bool) -> Self {
                let r = self % b;
                if !fmod && r != 0.0 && (r < 0.0) != (b < 0.0) { r + b } else { r }
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self { if self > b || self.is_nan() { self } else { b } }
            #[inline(always)]
            fn min(self, b: Self) -> Self { if self < b || self.is_nan() { self } else { b } }
            #[inline(always)]
            fn abs(self) -> Self { <$t>::abs(self) }
            #[inline(always)]
            fn neg(self) -> Self { -self }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0.0 { 1.0 } else if self < 0.0 { -1.0 } else { self }
            }
            #[inline(always)]
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            #[inline(always)]
            fn is_infinite(self) -> bool { <$t>::is_infinite(self) }
        }
    )*};
}
num_float!(f32, f64);

macro_rules! num_int {
    ($($t:ty: $signed:literal),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0;
            #[inline(always)]
            fn add(self, b: Self) -> Self { self.wrapping_add(b) }
            #[inline(always)]
            fn sub(self, b: Self) -> Self { self.wrapping_sub(b) }
            #[inline(always)]
            fn mul(self, b: Self) -> Self { self.wrapping_mul(b) }
            #[inline(always)]
            fn div(self, b: Self) -> Self { if b == 0 { 0 } else { self.wrapping_div(b) } }
            #[inline(always)]
            fn rem(self, b: Self, fmod: bool) -> Self {
                if b == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(b);
                // `r ^ b < 0`: the signs differ (never for unsigned types).
                if $signed && !fmod && r != 0 && (r ^ b) < Self::ZERO { r.wrapping_add(b) } else { r }
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self { Ord::max(self, b) }
            #[inline(always)]
            fn min(self, b: Self) -> Self { Ord::min(self, b) }
            #[inline(always)]
            fn abs(self) -> Self { if self < Self::ZERO { self.wrapping_neg() } else { self } }
            #[inline(always)]
            fn neg(self) -> Self { self.wrapping_neg() }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0 { 1 } else if self == 0 { 0 } else { Self::ZERO.wrapping_sub(1) }
            }
            #[inline(always)]
            fn is_nan(self) -> bool { false }
            #[inline(always)]
            fn is_infinite(self) -> bool { false }
        }
    )*};
}
num_int!(i8: true, i16: true, i32: true, i64: true, u8: false, u16: false, u32: false,
    u64: false);

/// f16 arithmetic: each operation in f32, rounded once.
impl Num for f16 {
    const ZERO: Self = f16::ZERO;
    fn add(self, b: Self) -> Self {
        via_f32(self, b, Num::add)
    }
    fn sub(self, b: Self) -> Self {
        via_f32(self, b, Num::sub)
    }
    fn mul(self, b: Self) -> Self {
        via_f32(self, b, Num::mul)
    }
    fn div(self, b: Self) -> Self {
        via_f32(self, b, Num::div)
    }
    fn rem(self, b: Self, fmod: bool) -> Self {
        via_f32(self, b, |a, b| a.rem(b, fmod))
    }
    fn max(self, b: Self) -> Self {
        via_f32(self, b, Num::max)
    }
    fn min(self, b: Self) -> Self {
        via_f32(self, b, Num::min)
    }
    fn abs(self) -> Self {
        f16::from_bits(self.to_bits() & 0x7fff)
    }
    fn neg(self) -> Self {
        -self
    }
    fn sign(self) -> Self {
        f16::from_f32(self.to_f32().sign())
    }
    fn is_nan(self) -> bool {
        f16::is_nan(self)
    }
    fn is_infinite(self) -> bool {
        f16::is_infinite(self)
    }
}

fn via_f32(a: f16, b: f16, f: impl Fn(f32, f32) -> f32) -> f16 {
    f16::from_f32(f(a.to_f32(), b.to_f32()))
}

/// The float functions of the activation ops (f32 and f64; f16 kernels compute in f32).
/// Arithmetic is through the operators, so formulas read as written.
pub(super) trait Float:
    Num
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    fn of(v: f64) -> Self;
    fn ceil(self) -> Self;
    fn floor(self) -> Self;
    /// Round half to even, as ONNX's Round.
    fn round(self) -> Self;
    fn sqrt(self) -> Self;
    fn recip(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tan(self) -> Self;
    fn asin(self) -> Self;
    fn acos(self) -> Self;
    fn atan(self) -> Self;
    fn sinh(self) -> Self;
    fn cosh(self) -> Self;
    fn tanh(self) -> Self;
    fn asinh(self) -> Self;
    fn acosh(self) -> Self;
    fn atanh(self) -> Self;
    fn erf(self) -> Self;
}

macro_rules! float {
    ($($t:ty: $exp:path, $erf:path, $tanh:path),*) => {$(
        impl Float for $t {
            #[inline(always)]
            fn of(v: f64) -> Self { v as $t }
            #[inline(always)]
            fn round(self) -> Self { <$t>::round_ties_even(self) }
            #[inline(always)]
            fn exp(self) -> Self { $exp(self) }
            #[inline(always)]
            fn erf(self) -> Self { $erf(self) }
            #[inline(always)]
            fn tanh(self) -> Self { $tanh(self) }
            float!(@forward $t: ceil floor sqrt recip ln ln_1p sin cos tan asin acos atan
                sinh cosh asinh acosh atanh);
        }
    )*};
    (@forward $t:ty: $($f:ident)*) => {$(
        #[inline(always)]
        fn $f(self) -> Self { <$t>::$f(self) }
    )*};
}
float!(f32: exp_f32, erf_f32, tanh_f32, f64: f64::exp, erf, f64::tanh);

/// tanh in f32 without a branch or a libm call, so that loops over it (Tanh, GELU's tanh
/// form, Mish, recurrent cells) vectorise; within 1.3 ulp of the exact value. Below 0.55 its Taylor series to
/// x¹⁹ (the terms shrink by (2x/π)² < 0.13 each, the next is under 3e-9 of x); above,
/// 1 - 2 / (e^2a + 1), where nothing cancels badly (the quotient is at most 1/2). Both are
/// computed and one selected; NaN stays NaN and ±inf gives ±1.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    // The series' coefficients 2^2n (2^2n - 1) B_2n / (2n)!, from x¹⁹ down.
    const TAYLOR: [f64; 10] = [
        -443_861_162.0 / 1_856_156_927_625.0,
        6_404_582.0 / 10_854_718_875.0,
        -929_569.0 / 638_512_875.0,
        21_844.0 / 6_081_075.0,
        -1_382.0 / 155_925.0,
        62.0 / 2_835.0,
        -17.0 / 315.0,
        2.0 / 15.0,
        -1.0 / 3.0,
        1.0,
    ];
    let near = a * TAYLOR.iter().fold(0.0f32, |p, &c| p * z + c as f32);
    let far = 1.0 - 2.0 / (exp_f32(2.0 * a) + 1.0);
    let r = if a < 0.55 { near } else { far };
    if x < 0.0 { -r } else { r }
}

/// erf in f32 without a branch or a libm call, so that loops over it (Erf, Gelu) vectorise;
/// within a few ulp. Below 0.5 its Taylor series to x¹³ (the next term is under 1e-9);
/// above, 1 - erfc with Numerical Recipes' Chebyshev fit erfc(a) = t·e^(-a² + P(t)),
/// t = 1 / (1 + a/2), fractional error under 1.2e-7 for every a. Both are computed and one
/// selected; NaN stays NaN and ±inf gives ±1.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    // 2/√π Σ (-1)ⁿ z^n / (n! (2n + 1)), from n = 6 down.
    let mut p = 2.0 / 1.772_453_9 / (720.0 * 13.0);
    for c in [-1.0 / (120.0 * 11.0), 1.0 / (24.0 * 9.0), -1.0 / (6.0 * 7.0), 0.1, -1.0 / 3.0, 1.0] {
        p = p * z + c * (2.0 / 1.772_453_9);
    }
    let near = a * p;
    let t = 1.0 / (1.0 + 0.5 * a);
    // Numerical Recipes' coefficients, highest power first, as published (in f64).
    const ERFC: [f64; 10] = [
        0.170_872_77,
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_68,
        -1.265_512_23,
    ];
    let q = ERFC.iter().fold(0.0f32, |q, &c| q * t + c as f32);
    let far = 1.0 - t * exp_f32(q - z);
    let r = if a < 0.5 { near } else { far };
    if x < 0.0 { -r } else { r }
}

/// e^x in f32 without a libm call, so that loops over it (Exp, Sigmoid, Elu...) vectorise;
/// within 2 ulp of the exact value, with ±inf, NaN, overflow and underflow as libm gives them.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 355.0 / 512.0; // few bits, so `n * LN2_HI` is exact
    const LN2_LO: f32 = -2.121_944_4e-4; // ln 2 - LN2_HI
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding then subtracting it rounds
    // Beyond this range the result is 0 or inf anyway; clamping keeps NaN.
    let x = x.clamp(-104.0, 89.0);
    // n = round(x / ln 2); `v` lies in [2^23, 2^24), where the bits count in units of 1.
    let v = x * std::f32::consts::LOG2_E + ROUND;
    let n = v - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO; // |r| <= ln(2) / 2
    // The Taylor series of e^r to degree 7: the remainder is below 1e-8.
    let mut p = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    // Scale by 2^n in two halves, each a normal float over the whole range. Integer n comes
    // from the bits (a float-to-int cast does not vectorise); nothing here can overflow, and
    // wrapping ops keep overflow checks out of the loop in builds with debug assertions.
    let n = v.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32).wrapping_shl(23));
    p * pow2(n >> 1) * pow2(n.wrapping_sub(n >> 1))
}

/// The error function, to double precision.
pub(super) fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        // erf(a) = 2/sqrt(pi) e^-a² Σ 2ⁿ a^(2n+1) / (1·3·…·(2n+1)): all terms positive, so
        // nothing cancels; it needs about 2a² + 20 terms.
        let (mut term, mut sum, a2) = (a, a, a * a);
        for n in 1..80 {
            term *= 2.0 * a2 / (2 * n + 1) as f64;
            sum += term;
            if term < sum * 1e-17 {
                break;
            }
        }
        std::f64::consts::FRAC_2_SQRT_PI * (-a2).exp() * sum
    } else if a < 6.0 {
        // erfc(a) = e^-a² / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + …)))),
        // a continued fraction that converges fast for a ≥ 3.
        let mut f = a;
        for n in (1..60).rev() {
            f = a + n as f64 / 2.0 / f;
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
    } else if a.is_nan() {
        return x;
    } else {
        1.0 // erfc(6) < 3e-17
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_python() {
        // import math; [(x, math.erf(x)) for x in (1e-9, 0.1, 0.5, 0.9, 1.5, 2.5, 2.99, 3.0,
        //                                         4.5, 5.99, 7.0, -0.7)]
        let cases = [
            (1e-9, 1.1283791670955127e-09),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (0.9, 0.7969082124228322),
            (1.5, 0.9661051464753108),
            (2.5, 0.999593047982555),
            (2.99, 0.9999764743969194),
            (3.0, 0.9999779095030014),
            (4.5, 0.9999999998033839),
            (5.99, 1.0),
            (7.0, 1.0),
            (-0.7, -0.6778011938374184),
        ];
        for (x, want) in cases {
            let got = erf(x);
            assert!((got - want).abs() <= 2e-15, "erf({x}) = {got}, want {want}");
        }
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(0.0), 0.0);
    }

    #[test]
    fn fast_erf_is_within_four_ulp() {
        let mut worst = (0.0f64, 0.0f32);
        let mut x = -6.0f32;
        while x < 6.0 {
            let want = erf(x as f64);
            let got = erf_f32(x) as f64;
            // One f32 ulp of `want` (erf is never subnormal here but at 0).
            let ulp = (want.abs() * f64::from(f32::EPSILON)).max(f64::from(f32::MIN_POSITIVE));
            let err = (got - want).abs() / ulp;
            if err > worst.0 {
                worst = (err, x);
            }
            x += 0.000_37;
        }
        assert!(worst.0 <= 4.0, "worst error {} ulp at {}", worst.0, worst.1);
        for tiny in [1e-30f32, -3e-8, 1e-3] {
            let want = erf(tiny as f64);
            assert!((erf_f32(tiny) as f64 - want).abs() <= want.abs() * 2.4e-7, "erf({tiny})");
        }
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!((erf_f32(f32::INFINITY), erf_f32(f32::NEG_INFINITY)), (1.0, -1.0));
        assert_eq!(erf_f32(0.0), 0.0);
    }

    #[test]
    fn fast_tanh_is_within_two_ulp() {
        let mut worst = (0.0f64, 0.0f32);
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = (x as f64).tanh();
            let got = tanh_f32(x) as f64;
            let ulp = (want.abs() * f64::from(f32::EPSILON)).max(f64::from(f32::MIN_POSITIVE));
            let err = (got - want).abs() / ulp;
            if err > worst.0 {
                worst = (err, x);
            }
            x += 0.000_31;
        }
        assert!(worst.0 <= 2.0, "worst error {} ulp at {}", worst.0, worst.1);
        for tiny in [1e-30f32, -3e-8, 1e-3, 0.549_999, 0.55] {
            let want = (tiny as f64).tanh();
            assert!((tanh_f32(tiny) as f64 - want).abs() <= want.abs() * 2.4e-7, "tanh({tiny})");
        }
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!((tanh_f32(f32::INFINITY), tanh_f32(f32::NEG_INFINITY)), (1.0, -1.0));
        assert_eq!((tanh_f32(100.0), tanh_f32(-100.0)), (1.0, -1.0));
        assert_eq!(tanh_f32(0.0), 0.0);
    }

    #[test]
    fn fast_exp_is_within_two_ulp() {
        let mut worst = 0.0f64;
        let mut x = -103.0f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            // One f32 ulp of `want`, down to the smallest subnormal.
            let ulp = (want.abs() * f64::from(f32::EPSILON)).max(f64::from(f32::from_bits(1)));
            worst = worst.max((got - want).abs() / ulp);
            x += 0.000_73;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.72).is_finite());
    }

    #[test]
    fn integer_division_and_remainder_follow_c_and_python() {
        assert_eq!(Num::div(-7i32, 2), -3, "truncates toward zero");
        assert_eq!(Num::div(7i64, 0), 0, "no trap on zero");
        assert_eq!(Num::div(i32::MIN, -1), i32::MIN, "wraps");
        // numpy: np.mod(-7, 3) = 2, np.mod(7, -3) = -2; np.fmod(-7, 3) = -1, np.fmod(7, -3) = 1
        assert_eq!((-7i32).rem(3, false), 2);
        assert_eq!(7i32.rem(-3, false), -2);
        assert_eq!((-7i32).rem(3, true), -1);
        assert_eq!(7i32.rem(-3, true), 1);
        assert_eq!(7u8.rem(3, false), 1);
        assert_eq!((-7.5f32).rem(2.0, false), 0.5);
        assert_eq!((-7.5f32).rem(2.0, true), -1.5);
    }

    #[test]
    fn casts_follow_onnx() {
        assert_eq!(i32::from_wide((-2.7f32).to_wide()), -2);
        assert_eq!(u8::from_wide(300i32.to_wide()), 44, "wraps like C");
        assert_eq!(i8::from_wide(1e10f64.to_wide()), i8::MAX, "saturates");
        assert!(f32::NAN.to_wide().is_nonzero());
        assert!(!(-0.0f32).to_wide().is_nonzero());
        let h = f16::from_wide(0.1f32.to_wide());
        assert_eq!(h.to_bits(), 0x2e66);
        assert_eq!(u64::from_wide(u64::MAX.to_wide()), u64::MAX);
    }
}
