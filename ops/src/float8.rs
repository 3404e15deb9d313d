//! The float8 types of opset 19 (`FLOAT8E4M3FN`, `FLOAT8E4M3FNUZ`, `FLOAT8E5M2`,
//! `FLOAT8E5M2FNUZ`): one byte each, converted to and from wider types here, as ONNX's
//! reference (ml_dtypes) converts them: round to nearest, ties to even; with `saturate` (Cast's
//! default) a value past the largest finite one, infinities included, becomes that largest
//! one; without, it becomes infinity where the format has one (E5M2) and NaN elsewhere.
//! "FN" formats have no infinity, "UZ" ones no negative zero and a single NaN, 0x80.

use ingot_schema::DType;

/// One float8 format's layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Format {
    mantissa_bits: i32,
    bias: i32,
    /// E5M2: the top exponent holds infinity and NaNs, as in IEEE 754.
    ieee_top: bool,
    /// FNUZ: no negative zero; 0x80 is the one NaN.
    unsigned_zero: bool,
    /// The largest finite value.
    max: f64,
}

/// The float8 types, and their formats in the same order.
pub const TYPES: [DType; 4] =
    [DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ];
pub const FORMATS: [Format; 4] = [
    Format { mantissa_bits: 3, bias: 7, ieee_top: false, unsigned_zero: false, max: 448.0 },
    Format { mantissa_bits: 3, bias: 8, ieee_top: false, unsigned_zero: true, max: 240.0 },
    Format { mantissa_bits: 2, bias: 15, ieee_top: true, unsigned_zero: false, max: 57344.0 },
    Format { mantissa_bits: 2, bias: 16, ieee_top: true, unsigned_zero: true, max: 57344.0 },
];

impl Format {
    /// The format of a float8 type, `None` for any other type.
    pub fn of(dtype: DType) -> Option<Format> {
        TYPES.iter().position(|&d| d == dtype).map(|i| FORMATS[i])
    }

    fn exponent_bits(self) -> i32 {
        7 - self.mantissa_bits
    }

    fn nan(self, negative: bool) -> u8 {
        match (self.unsigned_zero, self.ieee_top) {
            (true, _) => 0x80,
            (false, true) => 0x7e | (u8::from(negative) << 7),
            (false, false) => 0x7f | (u8::from(negative) << 7),
        }
    }

    /// The value of `bits`.
    pub fn decode(self, bits: u8) -> f32 {
        let m_bits = self.mantissa_bits;
        let negative = bits & 0x80 != 0;
        let exponent = i32::from((bits & 0x7f) >> m_bits);
        let mantissa = i32::from(bits) & ((1 << m_bits) - 1);
        let top = (1 << self.exponent_bits()) - 1;
        if self.unsigned_zero && bits == 0x80 {
            return f32::NAN;
        }
        if !self.unsigned_zero && self.ieee_top && exponent == top {
            let inf = if mantissa == 0 { f32::INFINITY } else { f32::NAN };
            return if negative { -inf } else { inf };
        }
        if !self.unsigned_zero && !self.ieee_top && bits & 0x7f == 0x7f {
            return f32::NAN;
        }
        let magnitude = if exponent == 0 {
            f64::from(mantissa) * 2f64.powi(1 - self.bias - m_bits)
        } else {
            (1.0 + f64::from(mantissa) / f64::from(1 << m_bits)) * 2f64.powi(exponent - self.bias)
        };
        (if negative { -magnitude } else { magnitude }) as f32
    }

    /// `x` in this format (see the module's rules).
    pub fn encode(self, x: f64, saturate: bool) -> u8 {
        let negative = x.is_sign_negative();
        let sign = u8::from(negative) << 7;
        if x.is_nan() {
            return self.nan(negative);
        }
        let overflow = || match (saturate, self.ieee_top && !self.unsigned_zero) {
            (true, _) => sign | self.encode(self.max, false),
            (false, true) => sign | 0x7c,
            (false, false) => self.nan(negative),
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
            return if self.unsigned_zero { 0 } else { sign };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_value_round_trips() {
        for dtype in TYPES {
            let f = Format::of(dtype).unwrap();
            let mut largest = 0f32;
            for bits in 0..=255u8 {
                let v = f.decode(bits);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                largest = largest.max(v);
                let back = f.encode(f64::from(v), true);
                // -0 is 0 in the unsigned-zero formats.
                let want = if f.unsigned_zero && v == 0.0 { 0 } else { bits };
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
}
