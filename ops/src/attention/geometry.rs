//! An Attention step's sizes, from its operands' shapes and canonical attributes: what
//! inference and the CPU kernel both check and read, parsed in one place so they cannot
//! disagree.

use ingot_schema::Attrs;

/// How Q, K, V, the caches and the mask map to (batch, head, token, element of the head).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    /// Query tokens (S).
    pub q_seq: usize,
    /// Key/value tokens given this step (L); `past + kv_new` are attended (T).
    pub kv_new: usize,
    /// Cached tokens in past_key/past_value (P), 0 without them.
    pub past: usize,
    /// Elements per head of Q and K.
    pub head: usize,
    /// Elements per head of V (and Y).
    pub v_head: usize,
    /// Q, K, V and Y are [batch, seq, heads * head] (3-D) rather than 4-D.
    pub seq_major: bool,
    /// attn_mask's shape right-aligned to [batch, q_heads, q_seq, columns], 1 where it
    /// broadcasts; its columns may be fewer than T (the rest are masked).
    pub mask: Option<[usize; 4]>,
    pub nonpad: bool,
}

impl Geometry {
    /// The geometry of a canonical step whose present inputs have `shapes` (Q, K, V, then
    /// attn_mask, past_key and past_value, nonpad_kv_seqlen as the `has_*` flags say).
    pub fn new(attrs: &Attrs, shapes: &[&[usize]]) -> Result<Geometry, String> {
        let int = |name: &str| attrs.int(name).map_err(|e| e.to_string());
        let (has_mask, has_past, has_nonpad) = (
            int("has_attn_mask")? != 0,
            int("has_past_kv")? != 0,
            int("has_nonpad_kv_seqlen")? != 0,
        );
        let expected =
            3 + usize::from(has_mask) + 2 * usize::from(has_past) + usize::from(has_nonpad);
        if shapes.len() != expected {
            return Err(format!("Attention expects {expected} inputs here, got {}", shapes.len()));
        }
        let heads = |name: &str| -> Result<usize, String> {
            let n = int(name)?;
            usize::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name} must be positive, got {n}"))
        };
        let (q_heads, kv_heads) = (heads("q_num_heads")?, heads("kv_num_heads")?);
        let (q, k, v) = (shapes[0], shapes[1], shapes[2]);
        let split = |name: &str, hidden: usize, n: usize| -> Result<usize, String> {
            if !hidden.is_multiple_of(n) {
                return Err(format!(
                    "{name}'s hidden size {hidden} is not a multiple of {n} heads"
                ));
            }
            Ok(hidden / n)
        };
        let (batch, q_seq, kv_new, head, k_head, v_head, seq_major) = match (q, k, v) {
            ([b, s, hq], [bk, l, hk], [bv, lv, hv]) => {
                if [bk, bv] != [b, b] || lv != l {
                    return Err(format!(
                        "Q {q:?}, K {k:?} and V {v:?} disagree on batch or key/value length"
                    ));
                }
                let hq = split("Q", *hq, q_heads)?;
                let hk = split("K", *hk, kv_heads)?;
                let hv = split("V", *hv, kv_heads)?;
                (*b, *s, *l, hq, hk, hv, true)
            }
            ([b, h, s, d], [bk, hk, l, dk], [bv, hv, lv, dv]) => {
                if [bk, bv] != [b, b] || lv != l || *h != q_heads || [hk, hv] != [&kv_heads; 2] {
                    return Err(format!(
                        "Q {q:?}, K {k:?} and V {v:?} disagree on batch, heads ({q_heads} query, \
                         {kv_heads} key/value) or key/value length"
                    ));
                }
                (*b, *s, *l, *d, *dk, *dv, false)
            }
            _ => {
                return Err(format!(
                    "Q, K and V must be all 3-D or all 4-D, got {q:?}, {k:?} and {v:?}"
                ));
            }
        };
        if k_head != head {
            return Err(format!("Q's head size {head} differs from K's {k_head}"));
        }
        if !q_heads.is_multiple_of(kv_heads) {
            return Err(format!(
                "{q_heads} query heads are not a multiple of {kv_heads} key/value heads"
            ));
        }
        let mut at = 3;
        let mut next = || {
            at += 1;
            shapes[at - 1]
        };
        let mask_shape = has_mask.then(&mut next);
        let past = match has_past.then(|| (next(), next())) {
            None => 0,
            Some((pk, pv)) => {
                let p = pk.get(2).copied().unwrap_or(0);
                if *pk != [batch, kv_heads, p, head] || *pv != [batch, kv_heads, p, v_head] {
                    return Err(format!(
                        "past_key {pk:?} and past_value {pv:?} must be [{batch}, {kv_heads}, \
                         past, {head}] and [{batch}, {kv_heads}, past, {v_head}]"
                    ));
                }
                p
            }
        };
        if has_nonpad {
            let n = next();
            if *n != [batch] {
                return Err(format!("nonpad_kv_seqlen has shape {n:?}, expected [{batch}]"));
            }
        }
        let total = past + kv_new;
        let mask = match mask_shape {
            None => None,
            Some(m) if m.is_empty() || m.len() > 4 => {
                return Err(format!("attn_mask must have rank 1 to 4, got shape {m:?}"));
            }
            Some(m) => {
                let mut full = [1; 4];
                full[4 - m.len()..].copy_from_slice(m);
                let target = [batch, q_heads, q_seq];
                let fits = full[..3].iter().zip(target).all(|(&d, t)| d == 1 || d == t);
                if !fits || full[3] > total {
                    return Err(format!(
                        "attn_mask {m:?} does not broadcast to [{batch}, {q_heads}, {q_seq}, \
                         {total}] (batch, heads, query length, at most the key/value length)"
                    ));
                }
                Some(full)
            }
        };
        Ok(Geometry {
            batch,
            q_heads,
            kv_heads,
            q_seq,
            kv_new,
            past,
            head,
            v_head,
            seq_major,
            mask,
            nonpad: has_nonpad,
        })
    }

    /// Attended key/value tokens (T).
    pub fn total(&self) -> usize {
        self.past + self.kv_new
    }

    fn layout(&self, heads: usize, seq: usize, head: usize) -> Vec<usize> {
        if self.seq_major {
            vec![self.batch, seq, heads * head]
        } else {
            vec![self.batch, heads, seq, head]
        }
    }

    /// Shapes of Q, K, V and Y in the model's layout.
    pub fn q_shape(&self) -> Vec<usize> {
        self.layout(self.q_heads, self.q_seq, self.head)
    }
    pub fn k_shape(&self) -> Vec<usize> {
        self.layout(self.kv_heads, self.kv_new, self.head)
    }
    pub fn v_shape(&self) -> Vec<usize> {
        self.layout(self.kv_heads, self.kv_new, self.v_head)
    }
    pub fn y_shape(&self) -> Vec<usize> {
        self.layout(self.q_heads, self.q_seq, self.v_head)
    }

    /// present_key, present_value and qk_matmul_output (always 4-D).
    pub fn present_key_shape(&self) -> Vec<usize> {
        vec![self.batch, self.kv_heads, self.total(), self.head]
    }
    pub fn present_value_shape(&self) -> Vec<usize> {
        vec![self.batch, self.kv_heads, self.total(), self.v_head]
    }
    pub fn qk_shape(&self) -> Vec<usize> {
        vec![self.batch, self.q_heads, self.q_seq, self.total()]
    }

    /// Offset of element 0 of (batch b, head h, token t) in a tensor of this layout with
    /// `heads` heads of `head` elements over `seq` tokens, and the stride between tokens.
    pub fn row(&self, heads: usize, seq: usize, head: usize, b: usize, h: usize) -> (usize, usize) {
        if self.seq_major {
            ((b * seq * heads + h) * head, heads * head)
        } else {
            ((b * heads + h) * seq * head, head)
        }
    }
}

/// For the family's tests: canonical attributes with the given flags and heads, defaults
/// elsewhere.
#[cfg(test)]
pub(super) fn canonical(mask: bool, past: bool, nonpad: bool, heads: (i64, i64)) -> Attrs {
    use ingot_schema::AttrValue::{Float, Int};
    Attrs::new()
        .with("has_attn_mask", Int(mask.into()))
        .with("has_past_kv", Int(past.into()))
        .with("has_nonpad_kv_seqlen", Int(nonpad.into()))
        .with("q_num_heads", Int(heads.0))
        .with("kv_num_heads", Int(heads.1))
        .with("is_causal", Int(0))
        .with("qk_matmul_output_mode", Int(0))
        .with("scale", Float(0.5))
        .with("softcap", Float(0.0))
        .with("softmax_precision", Int(1))
        .with("left_window_size", Int(-1))
        .with("right_window_size", Int(-1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_and_caches() {
        let a = canonical(true, true, false, (9, 3));
        let g = Geometry::new(
            &a,
            &[&[2, 4, 72], &[2, 6, 24], &[2, 6, 30], &[4, 18], &[2, 3, 12, 8], &[2, 3, 12, 10]],
        )
        .unwrap();
        assert_eq!((g.head, g.v_head, g.total(), g.seq_major), (8, 10, 18, true));
        assert_eq!(g.mask, Some([1, 1, 4, 18]));
        assert_eq!(g.y_shape(), [2, 4, 90]);
        assert_eq!(g.present_value_shape(), [2, 3, 18, 10]);
        assert_eq!(g.row(9, 4, 8, 1, 2), ((4 * 9 + 2) * 8, 72));
        let a = canonical(false, false, true, (4, 2));
        let g = Geometry::new(&a, &[&[2, 4, 1, 8], &[2, 2, 8, 8], &[2, 2, 8, 8], &[2]]).unwrap();
        assert_eq!((g.q_seq, g.total(), g.nonpad, g.seq_major), (1, 8, true, false));
        assert_eq!(g.row(4, 1, 8, 1, 3), ((4 + 3) * 8, 8));
    }

    #[test]
    fn shapes_must_agree() {
        let ok = |a: &Attrs, s: &[&[usize]]| Geometry::new(a, s);
        let plain = canonical(false, false, false, (3, 3));
        let err = ok(&plain, &[&[2, 3, 4, 8], &[2, 3, 6, 4], &[2, 3, 6, 8]]).unwrap_err();
        assert!(err.contains("head size 8 differs from K's 4"), "{err}");
        let err = ok(&plain, &[&[2, 4, 25], &[2, 6, 24], &[2, 6, 24]]).unwrap_err();
        assert!(err.contains("25 is not a multiple of 3"), "{err}");
        let err =
            ok(&canonical(false, false, false, (4, 3)), &[&[2, 4, 32], &[2, 6, 24], &[2, 6, 24]])
                .unwrap_err();
        assert!(err.contains("not a multiple of 3 key/value heads"), "{err}");
        let err = ok(&plain, &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 5, 8]]).unwrap_err();
        assert!(err.contains("disagree"), "{err}");
        let masked = canonical(true, false, false, (3, 3));
        let err = ok(&masked, &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8], &[3, 6]]).unwrap_err();
        assert!(err.contains("does not broadcast"), "{err}");
        let err = ok(&masked, &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8], &[4, 7]]).unwrap_err();
        assert!(err.contains("does not broadcast"), "{err}");
        let past = canonical(false, true, false, (3, 3));
        let err =
            ok(&past, &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8], &[2, 3, 5, 8], &[2, 3, 4, 8]])
                .unwrap_err();
        assert!(err.contains("past_key"), "{err}");
        assert!(ok(&past, &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8]]).is_err(), "arity");
    }
}
