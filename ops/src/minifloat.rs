//! The float types of 8 bits or fewer: the float8s of opset 19 (`FLOAT8E4M3FN`,
//! `FLOAT8E4M3FNUZ`, `FLOAT8E5M2`, `FLOAT8E5M2FNUZ`), opset 24's `FLOAT8E8M0` (a power of
//! two, MX formats' block scale) and opset 23's `FLOAT4E2M1`, converted to and from wider
//! types here as ONNX's reference converts them:
//! - round to nearest, ties to even; with `saturate` (Cast's default) a value past the
//!   largest finite one, infinities included, becomes that largest one; without, it becomes
//!   infinity where the format has one (E5M2) and NaN elsewhere. "FN" formats have no
//!   infinity, "UZ" ones no negative zero and a single NaN, 0x80.
//! - E2M1 has neither infinity nor NaN: a value past ±6 becomes ±6, and NaN the code of -0
//!   (0x8), as ml_dtypes converts it.
//! - E8M0 is an unsigned exponent (2^(e-127), 0xFF NaN, no zero): a value takes its
//!   exponent's, its sign and mantissa rounded away as Cast's `round_mode` says (`up` by
//!   default); NaN and infinities become 0xFF.

use ingot_schema::{Attrs, DType};

/// One minifloat format's layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Format {
    /// Bits in all: 8, or 4 for E2M1 (a byte's low nibble).
    width: u32,
    mantissa_bits: i32,
    bias: i32,
    specials: Specials,
    /// The largest finite value.
    max: f64,
}

/// Which codes a format spends on infinity and NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Specials {
    /// E5M2: the top exponent holds infinity and NaNs, as in IEEE 754.
    Ieee,
    /// E4M3FN: no infinity; all ones but the sign is NaN.
    AllOnesNan,
    /// FNUZ: no infinity, no negative zero; 0x80 (the negative zero's code) is the one NaN.
    UnsignedZero,
    /// E2M1: no infinity, no NaN.
    Neither,
    /// E8M0: no sign, no mantissa, no zero; 0xFF is NaN.
    ExponentOnly,
}

/// How Cast to FLOAT8E8M0 drops a value's mantissa (its `round_mode`); every other format
/// rounds to nearest even.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    Up,
    Down,
    Nearest,
}

/// How a Cast writes a minifloat, from its canonical attributes: whether values past the range
/// saturate (opset 19's `saturate`, default 1) and how FLOAT8E8M0 rounds (opset 24's
/// `round_mode`, default `up`). The CPU kernel and the Vulkan lowering both read it here.
pub(crate) fn cast_mode(attrs: &Attrs) -> Result<(bool, Rounding), String> {
    let saturate = attrs.int_or("saturate", 1).map_err(|e| e.to_string())? != 0;
    let mode = attrs.text_or("round_mode", "up").map_err(|e| e.to_string())?;
    let rounding =
        Rounding::parse(mode).ok_or_else(|| format!("round_mode '{mode}' is not supported"))?;
    Ok((saturate, rounding))
}

impl Rounding {
    /// Cast's `round_mode` attribute.
    pub fn parse(mode: &str) -> Option<Rounding> {
        match mode {
            "up" => Some(Rounding::Up),
            "down" => Some(Rounding::Down),
            "nearest" => Some(Rounding::Nearest),
            _ => None,
        }
    }
}

/// The minifloat types, and their formats in the same order.
pub const TYPES: [DType; 6] = [
    DType::F8E4M3FN,
    DType::F8E4M3FNUZ,
    DType::F8E5M2,
    DType::F8E5M2FNUZ,
    DType::F8E8M0,
    DType::F4E2M1,
];
pub const FORMATS: [Format; 6] = [
    Format { width: 8, mantissa_bits: 3, bias: 7, specials: Specials::AllOnesNan, max: 448.0 },
    Format { width: 8, mantissa_bits: 3, bias: 8, specials: Specials::UnsignedZero, max: 240.0 },
    Format { width: 8, mantissa_bits: 2, bias: 15, specials: Specials::Ieee, max: 57344.0 },
    Format { width: 8, mantissa_bits: 2, bias: 16, specials: Specials::UnsignedZero, max: 57344.0 },
    Format {
        width: 8,
        mantissa_bits: 0,
        bias: 127,
        specials: Specials::ExponentOnly,
        max: 1.7014118346046923e38,
    },
    Format { width: 4, mantissa_bits: 1, bias: 1, specials: Specials::Neither, max: 6.0 },
];

impl Format {
    /// The format of a minifloat type, `None` for any other type.
    pub fn of(dtype: DType) -> Option<Format> {
        TYPES.iter().position(|&d| d == dtype).map(|i| FORMATS[i])
    }

    fn exponent_bits(self) -> i32 {
        self.width as i32 - 1 - self.mantissa_bits
    }

    fn sign_bit(self) -> u8 {
        1 << (self.width - 1)
    }

    fn nan(self, negative: bool) -> u8 {
        let sign = u8::from(negative) << (self.width - 1);
        match self.specials {
            Specials::UnsignedZero => 0x80,
            Specials::Ieee => 0x7e | sign,
            Specials::AllOnesNan => 0x7f | sign,
            // ml_dtypes (ONNX's reference) gives NaN the sign bit alone: -0.
            Specials::Neither => self.sign_bit(),
            Specials::ExponentOnly => 0xff,
        }
    }

    /// The value of `bits` (the low `width` bits).
    pub fn decode(self, bits: u8) -> f32 {
        if self.specials == Specials::ExponentOnly {
            return if bits == 0xff { f32::NAN } else { 2f64.powi(i32::from(bits) - 127) as f32 };
        }
        let bits = bits & (0xff >> (8 - self.width));
        let m_bits = self.mantissa_bits;
        let negative = bits & self.sign_bit() != 0;
        let exponent = i32::from((bits & (self.sign_bit() - 1)) >> m_bits);
        let mantissa = i32::from(bits) & ((1 << m_bits) - 1);
        let top = (1 << self.exponent_bits()) - 1;
        match self.specials {
            Specials::UnsignedZero if bits == 0x80 => return f32::NAN,
            Specials::Ieee if exponent == top => {
                let inf = if mantissa == 0 { f32::INFINITY } else { f32::NAN };
                return if negative { -inf } else { inf };
            }
            Specials::AllOnesNan if bits & 0x7f == 0x7f => return f32::NAN,
            _ => {}
        }
        let magnitude = if exponent == 0 {
            f64::from(mantissa) * 2f64.powi(1 - self.bias - m_bits)
        } else {
            (1.0 + f64::from(mantissa) / f64::from(1 << m_bits)) * 2f64.powi(exponent - self.bias)
        };
        (if negative { -magnitude } else { magnitude }) as f32
    }

    /// `x` in this format (see the module's rules), rounded to nearest even.
    pub fn encode(self, x: f64, saturate: bool) -> u8 {
        self.encode_rounded(x, saturate, Rounding::Nearest)
    }

    /// `x` in this format; `rounding` applies to E8M0 only, which rounds as ONNX's reference
    /// does, on `x` as an f32.
    pub fn encode_rounded(self, x: f64, saturate: bool, rounding: Rounding) -> u8 {
        if self.specials == Specials::ExponentOnly {
            return encode_e8m0(x as f32, saturate, rounding);
        }
        let negative = x.is_sign_negative();
        let sign = if negative { self.sign_bit() } else { 0 };
        if x.is_nan() {
            return self.nan(negative);
        }
        let overflow = || match (saturate, self.specials) {
            (true, _) | (_, Specials::Neither) => sign | self.encode(self.max, false),
            (false, Specials::Ieee) => sign | 0x7c,
            (false, _) => self.nan(negative),
        };
        let a = x.abs();
        if a.is_infinite() {
            return overflow();
        }
        let m_bits = self.mantissa_bits;
        let min_exponent = 1 - self.bias;
        // The exponent of a's binade, no lower than the normals' (subnormals share its step).
        let exponent =
            if a == 0.0 { min_exponent } else { (a.log2().floor() as i32).max(min_exponent) };
        let step = 2f64.powi(exponent - m_bits);
        let q = (a / step).round_ties_even() * step;
        // log2's floor can be one off near a power of two: the rounding above is still right,
        // as both neighbouring binades' steps divide q.
        if q > self.max {
            return overflow();
        }
        if q == 0.0 {
            return if self.specials == Specials::UnsignedZero { 0 } else { sign };
        }
        let e = (q.log2().floor() as i32).clamp(min_exponent - 1, 64);
        let e = if 2f64.powi(e + 1) <= q {
            e + 1
        } else if 2f64.powi(e) > q {
            e - 1
        } else {
            e
        };
        let bits = if e < min_exponent {
            (q / 2f64.powi(min_exponent - m_bits)) as u8
        } else {
            let field = (e + self.bias) as u8;
            let mantissa = ((q / 2f64.powi(e) - 1.0) * f64::from(1 << m_bits)) as u8;
            (field << m_bits) | mantissa
        };
        sign | bits
    }

    /// A WGSL expression of the f32 value of `bits` (a u32 expression holding one value),
    /// calling `elementwise/float.wgsl`.
    #[cfg(feature = "wgsl")]
    pub(crate) fn wgsl_decode(self, bits: &str) -> String {
        let specials = match self.specials {
            Specials::ExponentOnly => return format!("e8m0_decode({bits})"),
            Specials::Ieee => 0,
            Specials::AllOnesNan => 1,
            Specials::UnsignedZero => 2,
            Specials::Neither => 3,
        };
        let (m, bias, sign) = (self.mantissa_bits, self.bias, self.sign_bit());
        format!("mf_decode({bits}, {m}u, {bias}i, {sign}u, {specials}u)")
    }

    /// A WGSL expression of the u32 code of `x` (an f32 expression) as [`Format::encode_rounded`]
    /// gives it, calling `elementwise/float.wgsl`. The codes of NaN, infinity and zero come from
    /// `encode_rounded` itself, so both sides agree on them.
    #[cfg(feature = "wgsl")]
    pub(crate) fn wgsl_encode(self, x: &str, saturate: bool, rounding: Rounding) -> String {
        if self.specials == Specials::ExponentOnly {
            let mode = match rounding {
                Rounding::Up => 0,
                Rounding::Down => 1,
                Rounding::Nearest => 2,
            };
            return format!("e8m0_encode({x}, {saturate}, {mode}u)");
        }
        let codes = |v: f64| {
            let [p, n] = [v, -v].map(|v| self.encode_rounded(v, saturate, rounding));
            format!("vec2<u32>({p}u, {n}u)")
        };
        let (m, bias, sign) = (self.mantissa_bits, self.bias, self.sign_bit());
        let top = self.max as f32;
        format!(
            "mf_encode({x}, {m}u, {bias}i, {sign}u, {top:?}, {}, {}, {})",
            codes(f64::NAN),
            codes(f64::INFINITY),
            codes(0.0)
        )
    }
}

/// `x`'s f32 exponent field, its mantissa rounded away by `rounding` (the sign is dropped):
/// `onnx.numpy_helper.to_float8e8m0`, bit for bit.
fn encode_e8m0(x: f32, saturate: bool, rounding: Rounding) -> u8 {
    let bits = x.to_bits();
    let exponent = (bits >> 23) & 0xff;
    if exponent == 0xff {
        return 0xff;
    }
    let round_up = match rounding {
        Rounding::Down => false,
        Rounding::Up => bits & 0x7f_ffff != 0,
        Rounding::Nearest => {
            let (guard, round, sticky) =
                (bits & 0x40_0000 != 0, bits & 0x20_0000 != 0, bits & 0x1f_ffff != 0);
            guard && (round || sticky || exponent > 0)
        }
    };
    let exponent =
        if round_up && !(saturate && exponent == 0xfe) { exponent + 1 } else { exponent };
    exponent as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_value_round_trips() {
        for dtype in TYPES {
            let f = Format::of(dtype).unwrap();
            let mut largest = 0f32;
            for bits in 0..=(0xff >> (8 - f.width)) as u8 {
                let v = f.decode(bits);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                largest = largest.max(v);
                let back = f.encode(f64::from(v), true);
                // -0 is 0 in the unsigned-zero formats.
                let want = if f.specials == Specials::UnsignedZero && v == 0.0 { 0 } else { bits };
                assert_eq!(back, want, "{dtype}: {bits:#04x} = {v}");
            }
            assert_eq!(f64::from(largest), f.max, "{dtype}");
        }
    }

    #[test]
    fn rounding_saturation_and_specials() {
        let e4m3 = Format::of(DType::F8E4M3FN).unwrap();
        // 100 is halfway between 96 (mantissa 100b) and 104 (101b): the even one.
        assert_eq!(e4m3.decode(e4m3.encode(100.0, true)), 96.0);
        assert_eq!(e4m3.decode(e4m3.encode(1e6, true)), 448.0);
        assert_eq!(e4m3.decode(e4m3.encode(f64::NEG_INFINITY, true)), -448.0);
        assert!(e4m3.decode(e4m3.encode(1e6, false)).is_nan());
        // 464 is halfway between 448 and the NaN code's 480: 448.
        assert_eq!(e4m3.decode(e4m3.encode(464.0, false)), 448.0);
        // The smallest subnormal, 2^-9, and half of it (a tie, to even: 0).
        assert_eq!(e4m3.encode(2f64.powi(-9), true), 0x01);
        assert_eq!(e4m3.encode(2f64.powi(-10), true), 0x00);
        let e5m2 = Format::of(DType::F8E5M2).unwrap();
        assert_eq!(e5m2.decode(e5m2.encode(1e6, false)), f32::INFINITY);
        assert_eq!(e5m2.decode(e5m2.encode(-1e6, true)), -57344.0);
        assert_eq!(e5m2.decode(0x7c), f32::INFINITY);
        let fnuz = Format::of(DType::F8E5M2FNUZ).unwrap();
        assert_eq!(fnuz.encode(-0.0, true), 0);
        assert_eq!(fnuz.encode(f64::NAN, true), 0x80);
        assert!(fnuz.decode(0x80).is_nan());
        assert_eq!(fnuz.encode(1e6, false), 0x80);
    }

    #[test]
    fn float4_saturates_and_has_no_nan() {
        let e2m1 = Format::of(DType::F4E2M1).unwrap();
        let values: Vec<f32> = (0..16).map(|b| e2m1.decode(b)).collect();
        let magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        assert_eq!(values[..8], magnitudes);
        assert_eq!(values[8..].iter().map(|v| -v).collect::<Vec<_>>(), magnitudes);
        // Ties to even (0.25 -> 0, 0.75 -> 1, 5 -> 4), past the range to ±6 whether or not
        // saturating, NaN to -0 and -0 kept: ONNX's test_cast_FLOAT_to_FLOAT4E2M1.
        let x = [0.48, 0.25, 0.75, 1.05, -3.5, 5.0, -8.0, 1e6, f64::INFINITY, f64::NAN, -0.0];
        let got: Vec<u8> = x.iter().map(|&x| e2m1.encode(x, true)).collect();
        assert_eq!(got, [0x1, 0x0, 0x2, 0x2, 0xe, 0x6, 0xf, 0x7, 0x7, 0x8, 0x8]);
        assert_eq!(e2m1.encode(-1e6, false), 0xf);
    }

    #[test]
    fn e8m0_is_an_exponent_rounded_as_asked() {
        let e8m0 = Format::of(DType::F8E8M0).unwrap();
        assert_eq!(e8m0.decode(127), 1.0);
        assert_eq!(e8m0.decode(0), 2f32.powi(-127));
        assert!(e8m0.decode(0xff).is_nan());
        // ONNX's test_cast_e8m0_FLOAT_to_FLOAT8E8M0, rounding up.
        let x = [0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0];
        let up: Vec<u8> = x.iter().map(|&x| e8m0.encode_rounded(x, true, Rounding::Up)).collect();
        assert_eq!(up, [0x00, 0x7c, 0x7d, 0x7e, 0x80, 0x80, 0x81, 0x82]);
        let down = |x: f64| e8m0.encode_rounded(x, true, Rounding::Down);
        assert_eq!((down(1.9), down(-2.0)), (127, 128), "the sign is dropped");
        let nearest = |x: f64| e8m0.encode_rounded(x, true, Rounding::Nearest);
        assert_eq!((nearest(1.4), nearest(1.5), nearest(3.0)), (127, 128, 129));
        // The largest exponent saturates or becomes NaN; infinity is NaN either way.
        let big = f64::from(f32::MAX);
        assert_eq!(e8m0.encode_rounded(big, true, Rounding::Up), 0xfe);
        assert_eq!(e8m0.encode_rounded(big, false, Rounding::Up), 0xff);
        assert_eq!(e8m0.encode(f64::INFINITY, true), 0xff);
    }
}
