//! Seeded random inputs for `run --random-inputs` and `bench`: the same seed gives the same
//! tensors on every machine.

use anyhow::{Result, bail};
use ingot_runtime::{Tensor, TensorDesc};
use ingot_schema::DType;

#[derive(clap::Args, Clone, Debug)]
pub struct RandomArgs {
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Range of random float inputs: LO,HI (uniform in [LO, HI)).
    #[arg(long, value_name = "LO,HI", default_value = "0,1", allow_hyphen_values = true,
          value_parser = parse_range::<f64>)]
    pub float_range: (f64, f64),
    /// Range of random integer inputs: LO,HI (uniform in [LO, HI], both included; keep it
    /// within the model's bounds, e.g. a vocabulary for token ids). Bool inputs are 0 or 1.
    #[arg(long, value_name = "LO,HI", default_value = "0,1", allow_hyphen_values = true,
          value_parser = parse_range::<i64>)]
    pub int_range: (i64, i64),
}

fn parse_range<T: std::str::FromStr + PartialOrd + Copy>(s: &str) -> Result<(T, T)> {
    let parsed = s
        .split_once(',')
        .and_then(|(lo, hi)| Some((lo.trim().parse::<T>().ok()?, hi.trim().parse::<T>().ok()?)));
    match parsed {
        Some((lo, hi)) if lo <= hi => Ok((lo, hi)),
        Some(_) => bail!("'{s}': LO must not be above HI"),
        None => bail!("'{s}' should look like LO,HI (two numbers)"),
    }
}

/// xorshift64*: plenty for test inputs, and the same stream everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Mixed so that seeds 0, 1, 2... start far apart (and never at the fixed point 0).
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03 | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl RandomArgs {
    /// One tensor per description, drawn in order from one stream.
    pub fn tensors(&self, descs: &[&TensorDesc]) -> Result<Vec<Tensor>> {
        let mut rng = Rng::new(self.seed);
        descs.iter().map(|d| self.tensor(d, &mut rng)).collect()
    }

    fn tensor(&self, desc: &TensorDesc, rng: &mut Rng) -> Result<Tensor> {
        let n = desc.elements();
        let shape = desc.shape.clone();
        let (lo, hi) = self.float_range;
        let mut float = || lo + (hi - lo) * rng.unit();
        let t = match desc.dtype {
            DType::F32 => {
                Tensor::from_vec(shape, &(0..n).map(|_| float() as f32).collect::<Vec<_>>())
            }
            DType::F64 => Tensor::from_vec(shape, &(0..n).map(|_| float()).collect::<Vec<_>>()),
            DType::F16 => {
                let v: Vec<half::f16> = (0..n).map(|_| half::f16::from_f64(float())).collect();
                Tensor::from_vec(shape, &v)
            }
            DType::Bool => Tensor::from_bools(
                shape,
                &(0..n).map(|_| rng.next() >> 63 == 1).collect::<Vec<_>>(),
            ),
            dtype => {
                // Integers: [lo, hi] clamped to what the type holds.
                let (min, max) = int_bounds(dtype);
                let lo = self.int_range.0.clamp(min, max);
                let hi = self.int_range.1.clamp(min, max);
                let span = (hi - lo) as u64 + 1;
                let v: Vec<i64> = (0..n).map(|_| lo + (rng.next() % span) as i64).collect();
                return integers(desc, &v);
            }
        };
        Ok(t?)
    }
}

fn int_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        // Ranges are given as i64: u64 inputs stay within its positive half.
        _ => (if dtype == DType::U64 { 0 } else { i64::MIN }, i64::MAX),
    }
}

/// `values` (within the type's bounds) as a tensor of `desc`'s integer type.
fn integers(desc: &TensorDesc, values: &[i64]) -> Result<Tensor> {
    let shape = desc.shape.clone();
    macro_rules! cast {
        ($t:ty) => {
            Tensor::from_vec(shape, &values.iter().map(|&v| v as $t).collect::<Vec<$t>>())
        };
    }
    Ok(match desc.dtype {
        DType::I8 => cast!(i8),
        DType::U8 => cast!(u8),
        DType::I16 => cast!(i16),
        DType::U16 => cast!(u16),
        DType::I32 => cast!(i32),
        DType::U32 => cast!(u32),
        DType::I64 => cast!(i64),
        DType::U64 => cast!(u64),
        other => bail!("no random {other} inputs"),
    }?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(seed: u64, float_range: (f64, f64), int_range: (i64, i64)) -> RandomArgs {
        RandomArgs { seed, float_range, int_range }
    }

    #[test]
    fn values_stay_in_their_ranges_and_repeat_with_the_seed() {
        let f = TensorDesc::new(DType::F32, vec![1000]);
        let i = TensorDesc::new(DType::I64, vec![1000]);
        let u = TensorDesc::new(DType::U8, vec![1000]);
        let a = args(7, (-2.0, 3.0), (5, 9));
        let t = a.tensors(&[&f, &i, &u]).unwrap();
        let floats = t[0].as_slice::<f32>().unwrap();
        assert!(floats.iter().all(|&v| (-2.0..3.0).contains(&v)));
        assert!(floats.iter().any(|&v| v < -1.5) && floats.iter().any(|&v| v > 2.5));
        let ints = t[1].as_slice::<i64>().unwrap();
        for k in 5..=9 {
            assert!(ints.contains(&k), "{k} never drawn");
        }
        assert!(ints.iter().all(|v| (5..=9).contains(v)));
        assert!(t[2].as_slice::<u8>().unwrap().iter().all(|v| (5..=9).contains(v)));
        assert_eq!(a.tensors(&[&f, &i, &u]).unwrap(), t, "the same seed, the same tensors");
        assert_ne!(args(8, (-2.0, 3.0), (5, 9)).tensors(&[&f]).unwrap()[0], t[0]);
        // A negative range clamps to an unsigned type's zero.
        let z = args(1, (0.0, 1.0), (-5, -1)).tensors(&[&u]).unwrap();
        assert!(z[0].as_slice::<u8>().unwrap().iter().all(|&v| v == 0));
    }

    #[test]
    fn ranges_parse_and_explain() {
        assert_eq!(parse_range::<f64>("-1, 1").unwrap(), (-1.0, 1.0));
        assert_eq!(parse_range::<i64>("0,30000").unwrap(), (0, 30000));
        assert!(parse_range::<i64>("3,1").is_err());
        assert!(parse_range::<i64>("3").is_err());
        assert!(parse_range::<i64>("a,b").is_err());
    }
}
