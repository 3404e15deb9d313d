//! What each planning mechanism is worth on one graph: the lower bound with nothing shared,
//! then with views, with in-place writes, and with reordering, beside the final arena.

use super::{Target, plan};
use crate::ir::Graph;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Stats {
    pub steps: usize,
    /// Every activation in its own buffer.
    pub naive_bytes: u64,
    /// Lower bounds, each mechanism added to the one before.
    pub bound_plain: u64,
    pub bound_views: u64,
    pub bound_in_place: u64,
    pub bound_reordered: u64,
    pub arena_bytes: u64,
    pub strategy: &'static str,
    pub schedule: &'static str,
    /// Time of the full plan (every schedule and strategy).
    pub planning: Duration,
}

impl Stats {
    /// Column names for [`Stats::row`].
    pub fn header() -> String {
        format!(
            "{:<40} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7} {:>9}",
            "graph",
            "steps",
            "naive",
            "bound",
            "+views",
            "+in-place",
            "+reorder",
            "arena",
            "ratio",
            "plan ms"
        )
    }

    /// One table line: the figures for the graph called `name`.
    pub fn row(&self, name: &str) -> String {
        format!(
            "{:<40} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7.4} {:>9.2}",
            name,
            self.steps,
            self.naive_bytes,
            self.bound_plain,
            self.bound_views,
            self.bound_in_place,
            self.bound_reordered,
            self.arena_bytes,
            self.ratio(),
            self.planning.as_secs_f64() * 1e3
        )
    }

    pub fn ratio(&self) -> f64 {
        if self.bound_reordered == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.bound_reordered as f64
        }
    }
}

pub fn stats(g: &Graph, target: Target) -> Stats {
    let plain = Target { can_run_in_place: &|_, _, _| false, views: false, reorder: false };
    let views = Target { views: true, ..plain };
    let in_place = Target { reorder: false, ..target };
    let start = Instant::now();
    let full = plan(g, target);
    let planning = start.elapsed();
    Stats {
        steps: full.steps().count(),
        naive_bytes: full.naive_bytes,
        bound_plain: plan(g, plain).lower_bound_bytes,
        bound_views: plan(g, views).lower_bound_bytes,
        bound_in_place: plan(g, in_place).lower_bound_bytes,
        bound_reordered: full.lower_bound_bytes,
        arena_bytes: full.arena_bytes,
        strategy: full.strategy,
        schedule: full.schedule,
        planning,
    }
}
