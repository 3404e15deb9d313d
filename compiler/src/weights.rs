//! The weight bank: every weight of every variant of a bundle, stored once.
//!
//! An entry is keyed by the blake3 hash of its element type, shape and bytes, so two
//! initializers with equal content are one entry whatever their names, and whichever file or
//! variant they come from (an LLM's prefill and decode graphs each carry a full copy). The key
//! is the weight after the compiler's transforms (BN folding, per-channel scales), so a weight
//! transformed the same way in two variants is stored once too.

use crate::ir::Const;
use ingot_schema::proto;
use std::collections::BTreeMap;

/// Weight offsets in the weights section are multiples of this (the runtime checks it).
pub const ALIGN: usize = ingot_schema::container::WEIGHT_ALIGN as usize;

/// The bank keeps each entry's source constant (an Arc), not its bytes: the section is
/// streamed from the sources when the bundle is written, so compiling never holds every
/// weight in memory.
#[derive(Default)]
pub struct Bank {
    pub entries: Vec<proto::Weight>,
    sources: Vec<Const>,
    by_hash: BTreeMap<[u8; 32], u32>,
    len: u64,
}

/// blake3 over the dtype code, the rank, the dims and the bytes.
pub fn content_hash(c: &Const) -> [u8; 32] {
    let desc = c.desc();
    let mut h = blake3::Hasher::new();
    h.update(&(desc.dtype.to_proto() as i32).to_le_bytes());
    h.update(&(desc.shape.len() as u64).to_le_bytes());
    for &d in &desc.shape {
        h.update(&(d as u64).to_le_bytes());
    }
    h.update(c.bytes());
    *h.finalize().as_bytes()
}

impl Bank {
    /// The entry holding `c`'s content, added (and its bytes written) the first time.
    pub fn add(&mut self, c: &Const) -> u32 {
        let hash = content_hash(c);
        // While its pages are in: the runtime checks each weight against it before first use.
        let crc32 = crc32fast::hash(c.bytes());
        c.release_pages();
        if let Some(&index) = self.by_hash.get(&hash) {
            return index;
        }
        let offset = self.len.next_multiple_of(ALIGN as u64);
        let length = c.bytes().len() as u64;
        self.len = offset + length;
        let index = self.entries.len() as u32;
        self.entries.push(proto::Weight {
            dtype: c.desc().dtype.to_proto() as i32,
            shape: c.desc().shape.iter().map(|&d| d as u64).collect(),
            offset,
            length,
            content_hash: hash.to_vec(),
            crc32,
        });
        self.sources.push(c.clone());
        self.by_hash.insert(hash, index);
        index
    }

    /// Bytes of the weights section.
    pub fn section_len(&self) -> u64 {
        self.len
    }

    /// Writes the weights section: every entry at its offset, zeros between.
    pub fn write_section(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        const ZEROS: [u8; ALIGN] = [0; ALIGN];
        let mut at = 0;
        for (w, c) in self.entries.iter().zip(&self.sources) {
            out.write_all(&ZEROS[..(w.offset - at) as usize])?;
            out.write_all(c.bytes())?;
            c.release_pages();
            at = w.offset + w.length;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_ops::{Tensor, TensorDesc};
    use ingot_schema::DType;

    fn constant(shape: &[usize], values: &[f32]) -> Const {
        Const::owned(Tensor::from_vec(shape.to_vec(), values).unwrap())
    }

    #[test]
    fn equal_content_is_one_entry_and_shape_or_type_tell_apart() {
        let mut bank = Bank::default();
        let a = bank.add(&constant(&[2, 2], &[1.0, 2.0, 3.0, 4.0]));
        let same = bank.add(&constant(&[2, 2], &[1.0, 2.0, 3.0, 4.0]));
        let reshaped = bank.add(&constant(&[4], &[1.0, 2.0, 3.0, 4.0]));
        let bits = Const::owned(Tensor::zeros(TensorDesc::new(DType::I32, vec![4])));
        let zeros = bank.add(&constant(&[4], &[0.0; 4]));
        let ints = bank.add(&bits);
        assert_eq!((a, same, reshaped, zeros, ints), (0, 0, 1, 2, 3));
        assert_eq!(bank.entries.len(), 4);
        // Entries start aligned; the bytes are there once each.
        assert!(bank.entries.iter().all(|w| w.offset % ALIGN as u64 == 0));
        assert_eq!(bank.entries[1].offset, ALIGN as u64);
        assert_eq!(bank.entries[0].content_hash.len(), 32);
        let mut section = Vec::new();
        bank.write_section(&mut section).unwrap();
        assert_eq!(section.len() as u64, bank.section_len());
        assert_eq!(&section[..16], bytemuck::cast_slice::<f32, u8>(&[1.0, 2.0, 3.0, 4.0]));
        assert_eq!(&section[16..ALIGN], &[0; ALIGN][16..]);
    }
}
