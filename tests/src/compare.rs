//! Output comparison: numpy's `allclose` rule, with a report of the worst element.
//!
//! Floats pass where `|got - want| <= atol + rtol * |want|` (NaN equals NaN, an infinity only
//! itself), as `numpy.testing.assert_allclose` checks, which is what ONNX's backend test runner
//! uses. Integers and bools must be equal. Dtype and shape must be equal too.

use ingot_runtime::Tensor;
use ingot_schema::DType;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    pub const fn new(rtol: f64, atol: f64) -> Self {
        Self { rtol, atol }
    }
}

/// One element of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    pub index: Vec<usize>,
    pub got: f64,
    pub want: f64,
}

impl Element {
    pub fn abs_err(&self) -> f64 {
        (self.got - self.want).abs()
    }
    pub fn rel_err(&self) -> f64 {
        self.abs_err() / self.want.abs()
    }
}

/// The result of comparing two tensors of the same dtype and shape.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub dtype: DType,
    pub tolerance: Tolerance,
    pub exact: bool,
    pub elements: usize,
    pub mismatches: usize,
    /// The element furthest outside (or closest to the edge of) the tolerance; `None` when the
    /// tensors are empty.
    pub worst: Option<Element>,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = if self.exact {
            "exact".to_string()
        } else {
            let Tolerance { rtol, atol } = self.tolerance;
            format!("rtol {rtol:e}, atol {atol:e}")
        };
        if self.passed() {
            write!(f, "{} elements match ({rule})", self.elements)?;
        } else {
            write!(f, "{} of {} elements differ ({rule})", self.mismatches, self.elements)?;
        }
        if let Some(w) = &self.worst {
            // f32 values as f32, so that they print in their shortest form.
            let value = |v: f64| match self.dtype {
                DType::F32 | DType::F16 => (v as f32).to_string(),
                _ => v.to_string(),
            };
            write!(
                f,
                "; worst at {:?}: got {}, want {} (abs err {:.3e}, rel err {:.3e})",
                w.index,
                value(w.got),
                value(w.want),
                w.abs_err(),
                w.rel_err()
            )?;
        }
        Ok(())
    }
}

/// Compares `got` with `want`; `Err` when their dtypes or shapes differ.
pub fn compare(got: &Tensor, want: &Tensor, tol: Tolerance) -> Result<Comparison, String> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Err(format!(
            "got {} {:?}, want {} {:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    let exact = !got.dtype().is_float();
    let (g, w) = (values(got)?, values(want)?);
    let mut mismatches = 0;
    // Badness of an element: how far it is outside the tolerance, as a multiple of it.
    let mut worst: Option<(f64, usize)> = None;
    for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
        // Exact types (float8 too: its casts round exactly) still let NaN match NaN.
        let same = g == w || (g.is_nan() && w.is_nan());
        let badness =
            if exact { if same { 0.0 } else { (g - w).abs() } } else { float_badness(g, w, tol) };
        let bad = if exact { !same } else { badness > 1.0 };
        mismatches += usize::from(bad);
        if worst.is_none_or(|(b, _)| badness > b) {
            worst = Some((badness, i));
        }
    }
    Ok(Comparison {
        dtype: got.dtype(),
        tolerance: tol,
        exact,
        elements: g.len(),
        mismatches,
        worst: worst.map(|(_, i)| Element {
            index: unravel(i, got.shape()),
            got: g[i],
            want: w[i],
        }),
    })
}

/// `Ok` when `got` matches `want`, else a one-line description of the difference.
pub fn allclose(got: &Tensor, want: &Tensor, tol: Tolerance) -> Result<(), String> {
    let c = compare(got, want, tol)?;
    if c.passed() { Ok(()) } else { Err(c.to_string()) }
}

/// `|g - w| / (atol + rtol |w|)`: above 1 fails. NaN matches NaN, an infinity only itself.
fn float_badness(g: f64, w: f64, tol: Tolerance) -> f64 {
    if g.is_nan() || w.is_nan() {
        return if g.is_nan() && w.is_nan() { 0.0 } else { f64::INFINITY };
    }
    if g.is_infinite() || w.is_infinite() {
        return if g == w { 0.0 } else { f64::INFINITY };
    }
    let allowed = tol.atol + tol.rtol * w.abs();
    let err = (g - w).abs();
    if allowed > 0.0 {
        err / allowed
    } else if err == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

/// Every element as f64 (exact for all integers up to 2^53, which test data stays within).
fn values(t: &Tensor) -> Result<Vec<f64>, String> {
    macro_rules! conv {
        ($t:ty, $f:expr) => {
            t.as_slice::<$t>().map_err(|e| e.to_string())?.iter().map($f).collect()
        };
    }
    Ok(match t.dtype() {
        DType::F32 => conv!(f32, |&x| f64::from(x)),
        DType::F64 => conv!(f64, |&x| x),
        DType::F16 => conv!(half::f16, |&x| x.to_f64()),
        DType::I8 | DType::I4 | DType::I2 => conv!(i8, |&x| f64::from(x)),
        DType::I16 => conv!(i16, |&x| f64::from(x)),
        DType::I32 => conv!(i32, |&x| f64::from(x)),
        DType::I64 => conv!(i64, |&x| x as f64),
        DType::U8 | DType::Bool | DType::U4 | DType::U2 => conv!(u8, |&x| f64::from(x)),
        DType::U16 => conv!(u16, |&x| f64::from(x)),
        DType::U32 => conv!(u32, |&x| f64::from(x)),
        DType::U64 => conv!(u64, |&x| x as f64),
        d @ (DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1) => {
            let f =
                ingot_ops::minifloat::Format::of(d).ok_or("a minifloat type without a format")?;
            conv!(u8, |&x| f64::from(f.decode(x)))
        }
    })
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            index[i] = flat % d;
            flat /= d;
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    #[test]
    fn tolerance_is_atol_plus_rtol_times_want() {
        let tol = Tolerance::new(1e-3, 1e-5);
        let want = f32s(&[2], &[1000.0, 0.0]);
        // 1000 * 1e-3 + 1e-5 = 1.00001 allowed at [0]; 1e-5 at [1].
        assert!(allclose(&f32s(&[2], &[1000.9, 0.000_009]), &want, tol).is_ok());
        let c = compare(&f32s(&[2], &[1001.5, 0.0]), &want, tol).unwrap();
        assert_eq!((c.mismatches, c.worst.unwrap().index), (1, vec![0]));
    }

    #[test]
    fn worst_element_is_reported_with_its_index() {
        let want = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let got = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.5, 6.1]);
        let c = compare(&got, &want, Tolerance::new(1e-3, 0.0)).unwrap();
        assert_eq!(c.mismatches, 2);
        let w = c.worst.clone().unwrap();
        assert_eq!((w.index, w.got, w.want), (vec![1, 1], 5.5, 5.0));
        assert_eq!(
            c.to_string(),
            "2 of 6 elements differ (rtol 1e-3, atol 0e0); worst at [1, 1]: got 5.5, want 5 \
             (abs err 5.000e-1, rel err 1.000e-1)"
        );
    }

    #[test]
    fn nan_inf_ints_bools_dtype_and_shape() {
        let tol = Tolerance::new(1e-3, 1e-7);
        let special = f32s(&[3], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert!(allclose(&special, &special, tol).is_ok());
        let swapped = f32s(&[3], &[f32::NAN, f32::NEG_INFINITY, f32::INFINITY]);
        assert!(allclose(&swapped, &special, tol).is_err());
        assert!(allclose(&f32s(&[1], &[f32::NAN]), &f32s(&[1], &[0.0]), tol).is_err());

        let ints = Tensor::from_vec(vec![2], &[1000i64, 7]).unwrap();
        let off_by_one = Tensor::from_vec(vec![2], &[1001i64, 7]).unwrap();
        assert!(allclose(&off_by_one, &ints, Tolerance::new(1e-2, 1.0)).is_err());
        let bools = Tensor::from_bools(vec![2], &[true, false]).unwrap();
        assert!(allclose(&bools, &bools, tol).is_ok());
        assert!(
            allclose(&Tensor::from_bools(vec![2], &[true, true]).unwrap(), &bools, tol).is_err()
        );

        let as_i32 = Tensor::from_vec(vec![2], &[1000i32, 7]).unwrap();
        assert!(compare(&as_i32, &ints, tol).is_err(), "dtype must match");
        assert!(compare(&f32s(&[1, 3], &[0.0; 3]), &f32s(&[3], &[0.0; 3]), tol).is_err());
    }
}
