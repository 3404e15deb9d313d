//! A RotaryEmbedding step's sizes, from its operands' shapes and canonical attributes: what
//! inference, the CPU kernel and the Vulkan kernel all check and read, parsed in one place so
//! the three cannot disagree.

use ingot_schema::Attrs;

/// How X's elements map to (batch, head, token, element of the head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    /// Elements per head; the first `rot` of them rotate, the rest pass through.
    pub head: usize,
    /// The rotated elements of a head (even): `rot / 2` pairs, one cache column each.
    pub rot: usize,
    /// X is [batch, seq, heads * head] (3-D) rather than [batch, heads, seq, head].
    pub seq_major: bool,
    /// Pairs are (2k, 2k + 1) rather than (k, k + rot / 2).
    pub interleaved: bool,
    /// The caches' rows when position_ids pick them (the caches are [positions, rot / 2]);
    /// `None` when the caches hold a row per token ([batch, seq, rot / 2]).
    pub positions: Option<usize>,
}

impl Geometry {
    /// The geometry of a canonical step whose inputs have `shapes` (X, cos_cache, sin_cache
    /// and, if given, position_ids).
    pub fn new(attrs: &Attrs, shapes: &[&[usize]]) -> Result<Geometry, String> {
        let int = |name| attrs.int(name).map_err(|e| e.to_string());
        let (x, cos, sin, ids) = match shapes {
            [x, cos, sin] => (x, cos, sin, None),
            [x, cos, sin, ids] => (x, cos, sin, Some(ids)),
            _ => return Err(format!("RotaryEmbedding takes 3 or 4 inputs, got {}", shapes.len())),
        };
        let heads = int("num_heads")?;
        let heads = usize::try_from(heads)
            .ok()
            .filter(|&h| h > 0)
            .ok_or_else(|| format!("num_heads must be positive, got {heads}"))?;
        let (batch, seq, head, seq_major) = match **x {
            [b, h, s, d] if h == heads => (b, s, d, false),
            [_, h, _, _] => {
                return Err(format!("num_heads is {heads} but the 4-D input has {h} heads"));
            }
            [b, s, hidden] if hidden % heads == 0 => (b, s, hidden / heads, true),
            [_, _, hidden] => {
                return Err(format!("hidden size {hidden} is not a multiple of {heads} heads"));
            }
            _ => return Err(format!("X must be 3-D or 4-D, got shape {x:?}")),
        };
        let rot = int("rotary_embedding_dim")?;
        let rot =
            usize::try_from(rot).ok().filter(|&r| r <= head && r % 2 == 0).ok_or_else(|| {
                format!("rotary_embedding_dim {rot} must be even and at most the head size {head}")
            })?;
        let half = rot / 2;
        let positions = match ids {
            Some(ids) => {
                if **ids != [batch, seq] {
                    return Err(format!(
                        "position_ids has shape {ids:?}, expected [{batch}, {seq}] (batch, sequence)"
                    ));
                }
                Some(cos.first().copied().unwrap_or(0))
            }
            None => None,
        };
        let expected = match positions {
            Some(p) => vec![p, half],
            None => vec![batch, seq, half],
        };
        for (name, cache) in [("cos_cache", cos), ("sin_cache", sin)] {
            if **cache != expected {
                let rows = match positions {
                    Some(_) => "positions",
                    None => "batch, sequence",
                };
                return Err(format!(
                    "{name} has shape {cache:?}, expected {expected:?} ({rows}, rotary_embedding_dim / 2)"
                ));
            }
        }
        let interleaved = int("interleaved")? != 0;
        Ok(Geometry { batch, seq, heads, head, rot, seq_major, interleaved, positions })
    }

    /// Elements of X (and Y).
    pub fn elements(&self) -> usize {
        self.batch * self.heads * self.seq * self.head
    }

    /// Rows (one head of one token, `head` elements each) between consecutive tokens of a
    /// batch entry: 1 when X is [batch, heads, seq, head], `heads` when [batch, seq, hidden].
    pub fn token_stride(&self) -> usize {
        if self.seq_major { self.heads } else { 1 }
    }

    /// The token (`b * seq + s`, the cache row or position_ids index) of row `r` of X.
    pub fn token(&self, r: usize) -> usize {
        (r / (self.heads * self.seq)) * self.seq + (r / self.token_stride()) % self.seq
    }
}

/// For the family's tests: canonical attributes.
#[cfg(test)]
pub(super) fn canonical(interleaved: bool, heads: usize, rot: usize) -> Attrs {
    use ingot_schema::AttrValue;
    Attrs::new()
        .with("interleaved", AttrValue::Int(i64::from(interleaved)))
        .with("num_heads", AttrValue::Int(heads as i64))
        .with("rotary_embedding_dim", AttrValue::Int(rot as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(heads: usize, rot: usize, interleaved: bool) -> Attrs {
        canonical(interleaved, heads, rot)
    }

    #[test]
    fn tokens_of_rows_in_both_layouts() {
        // [2, 3, 4, 8]: rows (b, h, s), s fastest.
        let g =
            Geometry::new(&attrs(3, 8, false), &[&[2, 3, 4, 8], &[2, 4, 4], &[2, 4, 4]]).unwrap();
        let tokens: Vec<usize> = (0..24).map(|r| g.token(r)).collect();
        let heads_major: Vec<usize> =
            (0..2).flat_map(|b| (0..3).flat_map(move |_| (0..4).map(move |s| b * 4 + s))).collect();
        assert_eq!(tokens, heads_major);
        // [2, 4, 24] with 3 heads: rows (b, s, h), h fastest.
        let g = Geometry::new(&attrs(3, 8, false), &[&[2, 4, 24], &[2, 4, 4], &[2, 4, 4]]).unwrap();
        assert!(g.seq_major);
        let tokens: Vec<usize> = (0..24).map(|r| g.token(r)).collect();
        let seq_major: Vec<usize> = (0..8).flat_map(|t| [t; 3]).collect();
        assert_eq!(tokens, seq_major);
    }

    #[test]
    fn shapes_must_agree() {
        let ok = |a: &Attrs, s: &[&[usize]]| Geometry::new(a, s);
        let a = attrs(4, 4, true);
        let g = ok(&a, &[&[2, 4, 3, 8], &[50, 2], &[50, 2], &[2, 3]]).unwrap();
        assert_eq!((g.rot, g.positions, g.interleaved), (4, Some(50), true));
        let err = ok(&a, &[&[2, 4, 3, 8], &[50, 4], &[50, 4], &[2, 3]]).unwrap_err();
        assert!(err.contains("cos_cache has shape [50, 4], expected [50, 2]"), "{err}");
        let err = ok(&a, &[&[2, 4, 3, 8], &[50, 2], &[50, 2], &[3, 2]]).unwrap_err();
        assert!(err.contains("position_ids"), "{err}");
        let err = ok(&a, &[&[2, 4, 3, 8], &[2, 3, 2], &[2, 3, 3]]).unwrap_err();
        assert!(err.contains("sin_cache"), "{err}");
        assert!(ok(&attrs(4, 5, false), &[&[2, 4, 3, 8], &[2, 3, 2], &[2, 3, 2]]).is_err(), "odd");
        assert!(
            ok(&attrs(4, 10, false), &[&[2, 4, 3, 8], &[2, 3, 5], &[2, 3, 5]]).is_err(),
            "wide"
        );
        assert!(
            ok(&attrs(3, 4, false), &[&[2, 4, 3, 8], &[2, 3, 2], &[2, 3, 2]]).is_err(),
            "heads"
        );
        assert!(ok(&attrs(5, 4, false), &[&[2, 3, 32], &[2, 3, 2], &[2, 3, 2]]).is_err(), "hidden");
        assert!(ok(&attrs(4, 4, false), &[&[2, 3], &[2, 3, 2], &[2, 3, 2]]).is_err(), "rank");
    }
}
