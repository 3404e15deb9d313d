//! Tensors as the runtime's callers and kernels see them.
//!
//! [`Tensor`] owns its bytes in 8-byte-aligned storage so that every element type can be
//! viewed in place; [`TensorRef`] and [`TensorMut`] borrow bytes from wherever a plan put them
//! (arena, mapped weights, caller buffers).

use bytemuck::Pod;
use ingot_schema::DType;

/// Shape and element type, without data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorDesc {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        Self { dtype, shape: shape.into() }
    }
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.elements() * self.dtype.size()
    }

    /// The type of a manifest tensor. An unknown dtype reads as bytes: the runtime refuses such
    /// a bundle before anything asks.
    pub fn of(t: &ingot_schema::proto::Tensor) -> TensorDesc {
        let dtype = ingot_schema::proto::DataType::try_from(t.dtype)
            .ok()
            .and_then(DType::from_proto)
            .unwrap_or(DType::U8);
        TensorDesc::new(dtype, t.shape.iter().map(|&d| d as usize).collect::<Vec<_>>())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TensorError {
    #[error("tensor holds {actual}, not {expected}")]
    WrongDType { expected: DType, actual: DType },
    #[error("tensor of shape {shape:?} and type {dtype} needs {expected} bytes, got {actual}")]
    WrongLength { shape: Vec<usize>, dtype: DType, expected: usize, actual: usize },
    #[error("tensor bytes are not aligned for {0}")]
    Misaligned(DType),
}

/// Plain element types that map to a [`DType`].
pub trait Element: Pod + Send + Sync {
    const DTYPE: DType;
}
macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32,
         u32 => U32, i64 => I64, u64 => U64, half::f16 => F16);

fn check<T: Element>(dtype: DType) -> Result<(), TensorError> {
    // Bool, the 2- and 4-bit integers and the minifloats are stored as their one-byte types
    // are, and may be read as them.
    let storage = match dtype {
        DType::Bool | DType::U4 | DType::U2 => DType::U8,
        d if d.is_minifloat() => DType::U8,
        DType::I4 | DType::I2 => DType::I8,
        d => d,
    };
    let ok = T::DTYPE == dtype || T::DTYPE == storage;
    if ok { Ok(()) } else { Err(TensorError::WrongDType { expected: T::DTYPE, actual: dtype }) }
}

/// An owned tensor.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    desc: TensorDesc,
    // u64 words keep the bytes 8-aligned; `len` is the exact byte length.
    words: Vec<u64>,
    len: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {:?})", self.desc.dtype, self.desc.shape)
    }
}

impl Tensor {
    /// A zero-filled tensor.
    pub fn zeros(desc: TensorDesc) -> Self {
        let len = desc.bytes();
        Self { desc, words: vec![0; len.div_ceil(8)], len }
    }

    /// A tensor from raw little-endian bytes.
    pub fn from_bytes(desc: TensorDesc, bytes: &[u8]) -> Result<Self, TensorError> {
        if bytes.len() != desc.bytes() {
            return Err(TensorError::WrongLength {
                expected: desc.bytes(),
                actual: bytes.len(),
                shape: desc.shape,
                dtype: desc.dtype,
            });
        }
        let mut t = Self::zeros(desc);
        t.bytes_mut().copy_from_slice(bytes);
        Ok(t)
    }

    /// A tensor from typed elements.
    pub fn from_vec<T: Element>(
        shape: impl Into<Vec<usize>>,
        data: &[T],
    ) -> Result<Self, TensorError> {
        Self::from_bytes(TensorDesc::new(T::DTYPE, shape), bytemuck::cast_slice(data))
    }

    /// A bool tensor (one byte per element).
    pub fn from_bools(shape: impl Into<Vec<usize>>, data: &[bool]) -> Result<Self, TensorError> {
        let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
        Self::from_bytes(TensorDesc::new(DType::Bool, shape), &bytes)
    }

    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }
    pub fn dtype(&self) -> DType {
        self.desc.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.desc.shape
    }
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        self.view().as_slice()
    }
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        self.as_slice().map(<[T]>::to_vec)
    }

    /// The elements as i64, for shape-like values of any integer type (`None` for floats).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        use DType::*;
        fn widen<T: Element + Into<i64>>(t: &Tensor) -> Option<Vec<i64>> {
            Some(t.as_slice::<T>().ok()?.iter().map(|&v| v.into()).collect())
        }
        match self.dtype() {
            I64 => self.to_vec::<i64>().ok(),
            I32 => widen::<i32>(self),
            U8 | Bool => widen::<u8>(self),
            I8 => widen::<i8>(self),
            U32 => widen::<u32>(self),
            I16 => widen::<i16>(self),
            U16 => widen::<u16>(self),
            U64 => Some(self.as_slice::<u64>().ok()?.iter().map(|&v| v as i64).collect()),
            _ => None,
        }
    }

    /// The elements as f64, for scalar values such as Clip bounds or Pad values.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        use DType::*;
        Some(match self.dtype() {
            F32 => self.as_slice::<f32>().ok()?.iter().map(|&v| f64::from(v)).collect(),
            F64 => self.to_vec::<f64>().ok()?,
            F16 => self.as_slice::<half::f16>().ok()?.iter().map(|v| v.to_f64()).collect(),
            _ => self.to_i64s()?.into_iter().map(|v| v as f64).collect(),
        })
    }
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef { dtype: self.desc.dtype, shape: &self.desc.shape, bytes: self.bytes() }
    }
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        let len = self.len;
        TensorMut {
            dtype: self.desc.dtype,
            shape: &self.desc.shape,
            bytes: &mut bytemuck::cast_slice_mut(&mut self.words)[..len],
        }
    }
}

/// Borrowed, read-only tensor bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl<'a> TensorRef<'a> {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
    /// The elements as `T`; errors if the dtype differs or the bytes are misaligned.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T], TensorError> {
        check::<T>(self.dtype)?;
        bytemuck::try_cast_slice(self.bytes).map_err(|_| TensorError::Misaligned(self.dtype))
    }
    pub fn to_tensor(&self) -> Tensor {
        let mut t = Tensor::zeros(TensorDesc::new(self.dtype, self.shape));
        t.bytes_mut().copy_from_slice(self.bytes);
        t
    }
}

/// Borrowed, writable tensor bytes.
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a mut [u8],
}

impl TensorMut<'_> {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
    /// The same bytes, borrowed again for a shorter while.
    pub fn reborrow(&mut self) -> TensorMut<'_> {
        TensorMut { dtype: self.dtype, shape: self.shape, bytes: self.bytes }
    }
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        check::<T>(self.dtype)?;
        bytemuck::try_cast_slice_mut(self.bytes).map_err(|_| TensorError::Misaligned(self.dtype))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_round_trip_and_dtype_check() {
        let t = Tensor::from_vec(vec![2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(t.bytes().len(), 16);
        assert!(matches!(t.as_slice::<i32>(), Err(TensorError::WrongDType { .. })));
        let odd = Tensor::from_vec(vec![3], &[1u8, 2, 3]).unwrap();
        assert_eq!(odd.bytes(), &[1, 2, 3]);
        assert!(Tensor::from_bytes(TensorDesc::new(DType::F32, vec![2]), &[0; 7]).is_err());
    }
}
