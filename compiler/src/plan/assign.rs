//! Offset assignment: plain records in (bytes, first step, last step), offsets out.
//!
//! Every strategy places items one by one into the best-fitting gap among the items already
//! placed that are live at the same time; they differ in the order they place items. The
//! planner runs them all and keeps the smallest arena.

/// An arena root to place: `bytes` (already aligned) live over steps `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub bytes: u64,
    pub first: usize,
    pub last: usize,
}

impl Interval {
    fn overlaps_in_time(&self, other: &Interval) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// An offset strategy. Offsets are multiples of the alignment the bytes were rounded to.
pub trait Strategy {
    fn name(&self) -> &'static str;
    fn assign(&self, items: &[Interval]) -> Vec<u64>;
}

/// Largest first (TFLite's and ExecuTorch's default ordering).
#[derive(Clone, Copy, Debug)]
pub struct GreedyBySize;

/// In order of first use, largest first among equals: a linear scan over time.
#[derive(Clone, Copy, Debug)]
pub struct GreedyByFirstUse;

/// Longest-lived first: long lifetimes settle at the bottom, short ones fill around them.
#[derive(Clone, Copy, Debug)]
pub struct GreedyByLifetime;

/// The busiest step first (TFLite's greedy-by-breadth): the values live at the peak are placed
/// together, largest first, so the peak itself packs tightly; then the next busiest step.
#[derive(Clone, Copy, Debug)]
pub struct GreedyByBreadth;

/// Every strategy, in the order ties are broken.
pub const STRATEGIES: &[&dyn Strategy] =
    &[&GreedyBySize, &GreedyByBreadth, &GreedyByFirstUse, &GreedyByLifetime];

impl Strategy for GreedyBySize {
    fn name(&self) -> &'static str {
        "greedy-by-size"
    }
    fn assign(&self, items: &[Interval]) -> Vec<u64> {
        // Ties broken by first use, then index: the result must not depend on sort stability.
        best_fit(items, |i| (std::cmp::Reverse(i.bytes), i.first, 0))
    }
}

impl Strategy for GreedyByFirstUse {
    fn name(&self) -> &'static str {
        "greedy-by-first-use"
    }
    fn assign(&self, items: &[Interval]) -> Vec<u64> {
        best_fit(items, |i| (std::cmp::Reverse(0), i.first, u64::MAX - i.bytes))
    }
}

impl Strategy for GreedyByLifetime {
    fn name(&self) -> &'static str {
        "greedy-by-lifetime"
    }
    fn assign(&self, items: &[Interval]) -> Vec<u64> {
        best_fit(items, |i| {
            (std::cmp::Reverse((i.last - i.first) as u64), i.first, u64::MAX - i.bytes)
        })
    }
}

impl Strategy for GreedyByBreadth {
    fn name(&self) -> &'static str {
        "greedy-by-breadth"
    }
    fn assign(&self, items: &[Interval]) -> Vec<u64> {
        let steps = items.iter().map(|i| i.last + 1).max().unwrap_or(0);
        let mut breadth = vec![0u64; steps];
        let mut live: Vec<Vec<usize>> = vec![Vec::new(); steps];
        for (k, i) in items.iter().enumerate() {
            for s in i.first..=i.last {
                breadth[s] += i.bytes;
                live[s].push(k);
            }
        }
        let mut busiest: Vec<usize> = (0..steps).collect();
        busiest.sort_by_key(|&s| (std::cmp::Reverse(breadth[s]), s));
        let mut seen = vec![false; items.len()];
        let mut order = Vec::with_capacity(items.len());
        for s in busiest {
            let mut here: Vec<usize> = live[s].iter().copied().filter(|&k| !seen[k]).collect();
            here.sort_by_key(|&k| (std::cmp::Reverse(items[k].bytes), items[k].first, k));
            for k in here {
                seen[k] = true;
                order.push(k);
            }
        }
        place_in_order(items, &order)
    }
}

/// Places items in the order of `key` (then index), each into the smallest gap that fits it
/// among the placed items live at the same time, or on top of them.
fn best_fit<K: Ord>(items: &[Interval], key: impl Fn(&Interval) -> K) -> Vec<u64> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (key(&items[i]), i));
    place_in_order(items, &order)
}

/// Places items in `order`, each into the smallest gap that fits it among the placed items
/// live at the same time, or on top of them.
///
/// Placed items are indexed by blocks of steps, so finding the ones live during an item's
/// lifetime looks at its own blocks only: planning stays near-linear on long graphs.
fn place_in_order(items: &[Interval], order: &[usize]) -> Vec<u64> {
    const BLOCK: usize = 32;
    let steps = items.iter().map(|i| i.last + 1).max().unwrap_or(0);
    let mut blocks: Vec<Vec<usize>> = vec![Vec::new(); steps.div_ceil(BLOCK)];
    let mut stamp = vec![usize::MAX; items.len()];
    let mut offsets = vec![0u64; items.len()];
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for (n, &i) in order.iter().enumerate() {
        let item = &items[i];
        busy.clear();
        for block in &blocks[item.first / BLOCK..=item.last / BLOCK] {
            for &p in block {
                // `stamp` dedupes items that span several of this item's blocks.
                if stamp[p] != n && items[p].overlaps_in_time(item) {
                    stamp[p] = n;
                    busy.push((offsets[p], offsets[p] + items[p].bytes));
                }
            }
        }
        busy.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut cursor = 0u64;
        for &(start, end) in &busy {
            if start > cursor {
                let gap = start - cursor;
                if gap >= item.bytes && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        offsets[i] = best.map_or(cursor, |(_, offset)| offset);
        for block in &mut blocks[item.first / BLOCK..=item.last / BLOCK] {
            block.push(i);
        }
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(bytes: u64, first: usize, last: usize) -> Interval {
        Interval { bytes, first, last }
    }

    fn peak(items: &[Interval], offsets: &[u64]) -> u64 {
        items.iter().zip(offsets).map(|(i, o)| o + i.bytes).max().unwrap_or(0)
    }

    #[test]
    fn disjoint_lifetimes_share_offset_zero() {
        let items = [iv(64, 0, 1), iv(64, 2, 3), iv(32, 4, 4)];
        for s in STRATEGIES {
            assert_eq!(s.assign(&items), vec![0, 0, 0], "{}", s.name());
        }
    }

    #[test]
    fn by_size_stacks_and_fills_the_best_gap() {
        // a and c are live together; b overlaps both and goes on top; d (live with c only)
        // takes the hole a leaves below c.
        let items = [iv(100, 0, 2), iv(50, 1, 3), iv(80, 2, 4), iv(16, 4, 5)];
        assert_eq!(GreedyBySize.assign(&items), vec![0, 180, 100, 0]);
    }

    #[test]
    fn by_first_use_places_in_time_order() {
        // a [0,1] 32, b [1,2] 64, c [2,3] 32: a at 0, b on top of a at 32, c fits below b at 0.
        let items = [iv(32, 0, 1), iv(64, 1, 2), iv(32, 2, 3)];
        assert_eq!(GreedyByFirstUse.assign(&items), vec![0, 32, 0]);
    }

    #[test]
    fn every_strategy_keeps_live_items_apart() {
        // A pseudo-random table (fixed LCG), checked pairwise.
        let mut seed = 12345u64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let items: Vec<Interval> = (0..200)
            .map(|_| {
                let first = next(100) as usize;
                iv(16 * (1 + next(64)), first, first + next(10) as usize)
            })
            .collect();
        for s in STRATEGIES {
            let offsets = s.assign(&items);
            for a in 0..items.len() {
                for b in a + 1..items.len() {
                    let (x, y) = (&items[a], &items[b]);
                    let apart =
                        offsets[a] + x.bytes <= offsets[b] || offsets[b] + y.bytes <= offsets[a];
                    assert!(!x.overlaps_in_time(y) || apart, "{}: {a} and {b} overlap", s.name());
                }
            }
            assert!(peak(&items, &offsets) >= super::super::liveness::lower_bound(&items));
        }
    }
}
