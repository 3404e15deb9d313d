//! The bundle container: a fixed header, a section table, and 64 KiB-aligned sections.
//!
//! ```text
//! offset 0   header (64 bytes, little endian)
//!            magic "INGOTBND" | major u16 | minor u16 | section count u32 | file length u64
//!            | table crc32 u32 | 32 reserved bytes (zero) | header crc32 u32 (of bytes 0..60)
//! offset 64  section table: per section 32 bytes
//!            kind u32 | reserved u32 | offset u64 | length u64 | crc32 u32 | reserved u32
//! then       sections, each starting at a multiple of SECTION_ALIGN, zero padding between
//! ```
//!
//! Sections are aligned so that a mapped bundle hands out weights without copying. Every
//! number is validated by [`Container::parse`] before anything uses it.

use std::io::{self, Write};
use std::ops::Range;

pub const MAGIC: [u8; 8] = *b"INGOTBND";
/// Bumped when an old runtime would misread a new bundle. 3: a variant may run submodels
/// once an iteration of a Loop decided at run time, which a runtime of major 2 would run once.
pub const FORMAT_MAJOR: u16 = 3;
/// Bumped for additions an old runtime may ignore. 2.1: each weight carries its own CRC-32 in
/// the manifest, so a runtime may check weights one by one before their first use instead of
/// the whole weights section at open (every 3.x has them).
pub const FORMAT_MINOR: u16 = 0;
/// The oldest format this runtime reads, and the one the writer gives a bundle that needs
/// nothing newer (no run-time loop), so that runtimes of major 2 still read it.
pub const COMPATIBLE: (u16, u16) = (2, 1);
pub const SECTION_ALIGN: u64 = 64 * 1024;
/// Weight offsets in the weights section are multiples of this, so typed views need no copy.
pub const WEIGHT_ALIGN: u64 = 64;
const HEADER_LEN: usize = 64;
const ENTRY_LEN: usize = 32;
const MAX_SECTIONS: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SectionKind {
    Manifest,
    Kernels,
    Weights,
}

impl SectionKind {
    const fn code(self) -> u32 {
        match self {
            SectionKind::Manifest => 1,
            SectionKind::Kernels => 2,
            SectionKind::Weights => 3,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(SectionKind::Manifest),
            2 => Some(SectionKind::Kernels),
            3 => Some(SectionKind::Weights),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            SectionKind::Manifest => "manifest",
            SectionKind::Kernels => "kernels",
            SectionKind::Weights => "weights",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContainerError {
    #[error("not an Ingot bundle: the file is {len} bytes, shorter than the 64-byte header")]
    TooShort { len: usize },
    #[error("not an Ingot bundle: bad magic bytes at offset 0")]
    BadMagic,
    #[error(
        "bundle format {found_major}.{found_minor} is not supported by this runtime, which reads formats {oldest_major}.x to {newest_major}.x"
    )]
    UnsupportedVersion { found_major: u16, found_minor: u16, oldest_major: u16, newest_major: u16 },
    #[error("bundle header is corrupt (checksum mismatch at bytes 0..64)")]
    HeaderChecksum,
    #[error("bundle is truncated: header says {expected} bytes, file has {actual}")]
    Truncated { expected: u64, actual: u64 },
    #[error("bundle declares {0} sections; at most {MAX_SECTIONS} are allowed")]
    TooManySections(u32),
    #[error("bundle section table is corrupt (checksum mismatch at bytes 64..{end})")]
    TableChecksum { end: usize },
    #[error("bundle section {index} has unknown kind {code}")]
    UnknownSection { index: usize, code: u32 },
    #[error("bundle has two {0} sections")]
    DuplicateSection(&'static str),
    #[error("bundle {kind} section at {offset}..+{length} is outside the file or misplaced")]
    SectionBounds { kind: &'static str, offset: u64, length: u64 },
    #[error("bundle {kind} section (bytes {offset}..{end}) is corrupt: checksum mismatch")]
    SectionChecksum { kind: &'static str, offset: u64, end: u64 },
    #[error("bundle has no {0} section")]
    MissingSection(&'static str),
}

/// A validated section: its kind and byte range in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub kind: SectionKind,
    pub range: Range<usize>,
    /// The CRC-32 the table records for the section's bytes.
    pub crc32: u32,
}

impl Section {
    /// Checks the section's bytes of `file` (the file it was parsed from) against its CRC.
    fn verify(&self, file: &[u8]) -> Result<(), ContainerError> {
        if crc32fast::hash(&file[self.range.clone()]) == self.crc32 {
            return Ok(());
        }
        Err(ContainerError::SectionChecksum {
            kind: self.kind.name(),
            offset: self.range.start as u64,
            end: self.range.end as u64,
        })
    }
}

/// The parsed, validated layout of a bundle file. Holds ranges, not bytes.
#[derive(Clone, Debug)]
pub struct Container {
    pub major: u16,
    pub minor: u16,
    pub sections: Vec<Section>,
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Container {
    /// Validates the header, the section table and every section's bounds and checksum.
    pub fn parse(file: &[u8]) -> Result<Container, ContainerError> {
        Self::parse_checking(file, |_| true)
    }

    /// As [`Container::parse`], but checks the checksum of only the sections `check` picks;
    /// [`Container::verify`] checks another later (or the caller checks its parts itself).
    pub fn parse_checking(
        file: &[u8],
        check: impl Fn(SectionKind) -> bool,
    ) -> Result<Container, ContainerError> {
        if file.len() < HEADER_LEN {
            return Err(ContainerError::TooShort { len: file.len() });
        }
        if file[0..8] != MAGIC {
            return Err(ContainerError::BadMagic);
        }
        let (major, minor) = (le_u16(file, 8), le_u16(file, 10));
        // The version is checked before the checksum so that a future bundle, whose header may
        // be laid out differently, is reported as such rather than as corrupt.
        if !(COMPATIBLE.0..=FORMAT_MAJOR).contains(&major) {
            return Err(ContainerError::UnsupportedVersion {
                found_major: major,
                found_minor: minor,
                oldest_major: COMPATIBLE.0,
                newest_major: FORMAT_MAJOR,
            });
        }
        if crc32fast::hash(&file[0..60]) != le_u32(file, 60) {
            return Err(ContainerError::HeaderChecksum);
        }
        let file_len = le_u64(file, 16);
        if file_len != file.len() as u64 {
            return Err(ContainerError::Truncated {
                expected: file_len,
                actual: file.len() as u64,
            });
        }
        let count = le_u32(file, 12);
        if count > MAX_SECTIONS {
            return Err(ContainerError::TooManySections(count));
        }
        let table_end = HEADER_LEN + count as usize * ENTRY_LEN;
        if table_end > file.len() {
            return Err(ContainerError::Truncated {
                expected: table_end as u64,
                actual: file.len() as u64,
            });
        }
        if crc32fast::hash(&file[HEADER_LEN..table_end]) != le_u32(file, 24) {
            return Err(ContainerError::TableChecksum { end: table_end });
        }
        let mut sections: Vec<Section> = Vec::with_capacity(count as usize);
        let mut previous_end = table_end as u64;
        for index in 0..count as usize {
            let e = HEADER_LEN + index * ENTRY_LEN;
            let code = le_u32(file, e);
            let kind = SectionKind::from_code(code)
                .ok_or(ContainerError::UnknownSection { index, code })?;
            if sections.iter().any(|s| s.kind == kind) {
                return Err(ContainerError::DuplicateSection(kind.name()));
            }
            let (offset, length) = (le_u64(file, e + 8), le_u64(file, e + 16));
            let end = offset.checked_add(length);
            let misplaced = offset % SECTION_ALIGN != 0 || offset < previous_end;
            match end {
                Some(end) if !misplaced && end <= file.len() as u64 => previous_end = end,
                _ => {
                    return Err(ContainerError::SectionBounds {
                        kind: kind.name(),
                        offset,
                        length,
                    });
                }
            }
            let section = Section {
                kind,
                range: offset as usize..(offset + length) as usize,
                crc32: le_u32(file, e + 24),
            };
            if check(kind) {
                section.verify(file)?;
            }
            sections.push(section);
        }
        Ok(Container { major, minor, sections })
    }

    /// Checks the checksum of section `kind`, where the bundle has one.
    pub fn verify(&self, file: &[u8], kind: SectionKind) -> Result<(), ContainerError> {
        self.section(kind).map_or(Ok(()), |s| s.verify(file))
    }

    pub fn section(&self, kind: SectionKind) -> Option<&Section> {
        self.sections.iter().find(|s| s.kind == kind)
    }

    pub fn require(&self, kind: SectionKind) -> Result<&Section, ContainerError> {
        self.section(kind).ok_or(ContainerError::MissingSection(kind.name()))
    }
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(SECTION_ALIGN) * SECTION_ALIGN
}

/// Writes a container of format [`COMPATIBLE`] holding `sections` in the given order.
pub fn write(out: &mut impl Write, sections: &[(SectionKind, &[u8])]) -> io::Result<()> {
    let table_end = (HEADER_LEN + sections.len() * ENTRY_LEN) as u64;
    let mut offset = align_up(table_end);
    let mut entries = Vec::with_capacity(sections.len());
    for (kind, bytes) in sections {
        entries.push((*kind, offset, bytes.len() as u64, crc32fast::hash(bytes)));
        offset = align_up(offset + bytes.len() as u64);
    }
    let file_len = entries.last().map_or(table_end, |&(_, start, len, _)| start + len);
    out.write_all(&header_and_table(&entries, file_len, COMPATIBLE))?;
    let mut written = table_end;
    for ((_, bytes), &(_, start, _, _)) in sections.iter().zip(&entries) {
        write_zeros(out, start - written)?;
        out.write_all(bytes)?;
        written = start + bytes.len() as u64;
    }
    Ok(())
}

/// The header and the section table for sections (kind, offset, length, CRC32) of a file of
/// `file_len` bytes.
fn header_and_table(
    entries: &[(SectionKind, u64, u64, u32)],
    file_len: u64,
    (major, minor): (u16, u16),
) -> Vec<u8> {
    let mut table = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for &(kind, offset, length, crc) in entries {
        table.extend_from_slice(&kind.code().to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
        table.extend_from_slice(&offset.to_le_bytes());
        table.extend_from_slice(&length.to_le_bytes());
        table.extend_from_slice(&crc.to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
    }
    let mut header = [0u8; HEADER_LEN];
    header[0..8].copy_from_slice(&MAGIC);
    header[8..10].copy_from_slice(&major.to_le_bytes());
    header[10..12].copy_from_slice(&minor.to_le_bytes());
    header[12..16].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    header[16..24].copy_from_slice(&file_len.to_le_bytes());
    header[24..28].copy_from_slice(&crc32fast::hash(&table).to_le_bytes());
    let crc = crc32fast::hash(&header[0..60]);
    header[60..64].copy_from_slice(&crc.to_le_bytes());
    [&header[..], &table].concat()
}

/// What [`write_to`] writes as a section: bytes, or a function that writes them (`len` of them).
pub enum Source<'a> {
    Bytes(SectionKind, &'a [u8]),
    Stream {
        kind: SectionKind,
        len: u64,
        write: &'a mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    },
}

/// Writes what [`write`] writes, byte for byte, without holding the sections in memory: the
/// header and table are written last (after a seek back), once every section's checksum is
/// known. A streamed section must write exactly `len` bytes. The header says `version`.
pub fn write_to<W: Write + io::Seek>(
    out: &mut W,
    version: (u16, u16),
    sections: &mut [Source],
) -> io::Result<()> {
    let table_end = (HEADER_LEN + sections.len() * ENTRY_LEN) as u64;
    write_zeros(out, table_end)?;
    let mut written = table_end;
    let mut entries = Vec::with_capacity(sections.len());
    for section in sections.iter_mut() {
        let start = align_up(written);
        write_zeros(out, start - written)?;
        let mut crc = Crc { out: &mut *out, hasher: crc32fast::Hasher::new(), bytes: 0 };
        let (kind, want) = match section {
            Source::Bytes(kind, bytes) => {
                crc.write_all(bytes)?;
                (*kind, bytes.len() as u64)
            }
            Source::Stream { kind, len, write } => {
                write(&mut crc)?;
                (*kind, *len)
            }
        };
        if crc.bytes != want {
            return Err(io::Error::other(format!(
                "section {} wrote {} bytes, said {want}",
                kind.name(),
                crc.bytes
            )));
        }
        entries.push((kind, start, want, crc.hasher.finalize()));
        written = start + want;
    }
    out.seek(io::SeekFrom::Start(0))?;
    out.write_all(&header_and_table(&entries, written, version))?;
    out.seek(io::SeekFrom::Start(written))?;
    Ok(())
}

/// Passes bytes on, counting them into a CRC32.
struct Crc<'a, W: Write> {
    out: &'a mut W,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Crc<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn write_zeros(out: &mut impl Write, mut n: u64) -> io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let chunk = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..chunk])?;
        n -= chunk as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_writes_the_same_bytes() {
        let manifest = b"manifest bytes".as_slice();
        let weights: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let mut whole = Vec::new();
        write(&mut whole, &[(SectionKind::Manifest, manifest), (SectionKind::Weights, &weights)])
            .unwrap();
        let mut stream = |w: &mut dyn Write| {
            for chunk in weights.chunks(4096) {
                w.write_all(chunk)?;
            }
            Ok(())
        };
        let mut streamed = io::Cursor::new(Vec::new());
        write_to(
            &mut streamed,
            COMPATIBLE,
            &mut [
                Source::Bytes(SectionKind::Manifest, manifest),
                Source::Stream {
                    kind: SectionKind::Weights,
                    len: weights.len() as u64,
                    write: &mut stream,
                },
            ],
        )
        .unwrap();
        assert_eq!(streamed.into_inner(), whole);
        // A stream that writes other than it said is an error.
        let mut short = |w: &mut dyn Write| w.write_all(b"abc");
        let mut out = io::Cursor::new(Vec::new());
        let wrong = [Source::Stream { kind: SectionKind::Weights, len: 4, write: &mut short }];
        assert!(write_to(&mut out, COMPATIBLE, &mut { wrong }).is_err());
    }

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        write(
            &mut out,
            &[
                (SectionKind::Manifest, b"manifest bytes".as_slice()),
                (SectionKind::Weights, &[7u8; 100]),
            ],
        )
        .unwrap();
        out
    }

    #[test]
    fn round_trip_aligns_sections() {
        let file = sample();
        let c = Container::parse(&file).unwrap();
        assert_eq!(c.sections.len(), 2);
        let m = c.require(SectionKind::Manifest).unwrap();
        assert_eq!(m.range, 65536..65536 + 14);
        assert_eq!(&file[m.range.clone()], b"manifest bytes");
        let w = c.require(SectionKind::Weights).unwrap();
        assert_eq!(w.range.start % SECTION_ALIGN as usize, 0);
        assert_eq!(file.len(), w.range.end);
        assert!(c.section(SectionKind::Kernels).is_none());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let file = sample();
        for len in [0, 10, 63, 64, 100, 65536, file.len() - 1] {
            assert!(Container::parse(&file[..len]).is_err(), "len {len}");
        }
    }

    #[test]
    fn a_flipped_byte_anywhere_that_matters_is_caught() {
        let file = sample();
        let c = Container::parse(&file).unwrap();
        let mut positions = vec![0, 9, 13, 17, 30, 61, 64, 72, 80];
        positions.extend(c.sections.iter().map(|s| s.range.start + 3));
        for at in positions {
            let mut bad = file.clone();
            bad[at] ^= 0x10;
            assert!(Container::parse(&bad).is_err(), "flip at {at} not caught");
        }
    }

    #[test]
    fn future_major_names_both_versions() {
        let mut file = sample();
        file[8..10].copy_from_slice(&7u16.to_le_bytes());
        let err = Container::parse(&file).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "bundle format 7.{} is not supported by this runtime, which reads formats \
                 {}.x to {FORMAT_MAJOR}.x",
                COMPATIBLE.1, COMPATIBLE.0
            )
        );
    }
}
