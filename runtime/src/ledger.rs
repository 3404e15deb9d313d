//! The ledger: every device allocation and free, in order, with running and peak bytes per
//! kind and in total. Backends record into it; tests compare it with the plan's schedule.

use ingot_schema::proto;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// What an allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryKind {
    Weight,
    /// A host-visible buffer an upload passes through, freed right after it.
    Staging,
    Arena,
    /// A device's copy of a submodel's inputs and outputs.
    Io,
    /// The session's host buffer for tensors passed between submodels.
    Boundary,
    Other,
}

impl MemoryKind {
    pub const ALL: [MemoryKind; 6] = [
        MemoryKind::Weight,
        MemoryKind::Staging,
        MemoryKind::Arena,
        MemoryKind::Io,
        MemoryKind::Boundary,
        MemoryKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Weight => "weight",
            MemoryKind::Staging => "staging",
            MemoryKind::Arena => "arena",
            MemoryKind::Io => "io",
            MemoryKind::Boundary => "boundary",
            MemoryKind::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allocate,
    Free,
}

/// One allocation or free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEvent {
    pub action: Action,
    pub kind: MemoryKind,
    pub bytes: u64,
    /// What it is, e.g. the weight's index.
    pub label: String,
    /// Which device's memory: `cpu`, `vulkan:0`, or `host` for the session's own buffers.
    pub device: Arc<str>,
    /// Bytes allocated, all kinds, right after this event.
    pub total_bytes: u64,
}

/// Running and peak bytes of one kind (or of all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub current: u64,
    pub peak: u64,
}

#[derive(Debug, Default)]
struct Book {
    events: Vec<LedgerEvent>,
    kinds: [Usage; MemoryKind::ALL.len()],
    total: Usage,
}

/// A shared, append-only record of device memory. Cloning it gives another handle to the same
/// record; [`Ledger::on`] gives one whose allocations are marked as another device's.
#[derive(Clone, Debug)]
pub struct Ledger {
    book: Arc<Mutex<Book>>,
    device: Arc<str>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger {
            book: Arc::default(),
            device: "host".into(),
        }
    }
}

/// The receipt of one allocation: hand it back to [`Ledger::free`].
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    kind: MemoryKind,
    bytes: u64,
    label: String,
    device: Arc<str>,
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A handle to the same record whose allocations are `device`'s.
    pub fn on(&self, device: &str) -> Ledger {
        Ledger {
            book: Arc::clone(&self.book),
            device: device.into(),
        }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic while holding the lock cannot leave a half-written event: keep going.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an allocation of `bytes` (what the device was asked for).
    pub fn allocate(&self, kind: MemoryKind, bytes: u64, label: impl Into<String>) -> Entry {
        let label = label.into();
        let mut book = self.book();
        let usage = &mut book.kinds[kind.index()];
        usage.current += bytes;
        usage.peak = usage.peak.max(usage.current);
        book.total.current += bytes;
        book.total.peak = book.total.peak.max(book.total.current);
        let total_bytes = book.total.current;
        book.events.push(LedgerEvent {
            action: Action::Allocate,
            kind,
            bytes,
            label: label.clone(),
            device: Arc::clone(&self.device),
            total_bytes,
        });
        Entry {
            kind,
            bytes,
            label,
            device: Arc::clone(&self.device),
        }
    }

    /// Records that the allocation behind `entry` was freed.
    pub fn free(&self, entry: Entry) {
        let mut book = self.book();
        let usage = &mut book.kinds[entry.kind.index()];
        usage.current -= entry.bytes;
        book.total.current -= entry.bytes;
        let total_bytes = book.total.current;
        book.events.push(LedgerEvent {
            action: Action::Free,
            kind: entry.kind,
            bytes: entry.bytes,
            label: entry.label,
            device: entry.device,
            total_bytes,
        });
    }

    pub fn events(&self) -> Vec<LedgerEvent> {
        self.book().events.clone()
    }

    pub fn usage(&self, kind: MemoryKind) -> Usage {
        self.book().kinds[kind.index()]
    }

    pub fn total(&self) -> Usage {
        self.book().total
    }

    /// Bytes `device` holds now (allocated minus freed).
    pub fn held_on(&self, device: &str) -> u64 {
        self.book()
            .events
            .iter()
            .filter(|e| &*e.device == device)
            .fold(0, |held, e| match e.action {
                Action::Allocate => held + e.bytes,
                Action::Free => held - e.bytes,
            })
    }
}

/// The load-time events the plan's allocation schedule predicts, in order: each entry
/// allocated; with `staged` uploads, each weight's staging buffer allocated and freed right
/// after it.
pub fn planned_events(plan: &proto::Plan, staged: bool) -> Vec<(Action, MemoryKind, u64)> {
    let mut events = Vec::with_capacity(plan.allocations.len() * 3);
    for a in &plan.allocations {
        let kind = match proto::AllocationKind::try_from(a.kind) {
            Ok(proto::AllocationKind::Weight) => MemoryKind::Weight,
            Ok(proto::AllocationKind::Arena) => MemoryKind::Arena,
            Ok(proto::AllocationKind::Io) => MemoryKind::Io,
            Ok(proto::AllocationKind::Boundary) => MemoryKind::Boundary,
            _ => MemoryKind::Other,
        };
        events.push((Action::Allocate, kind, a.bytes));
        if staged && kind == MemoryKind::Weight {
            events.push((Action::Allocate, MemoryKind::Staging, a.bytes));
            events.push((Action::Free, MemoryKind::Staging, a.bytes));
        }
    }
    events
}

/// The load-time events of a variant whose submodel `k` runs on Vulkan if `on_vulkan[k]`, else
/// on the CPU, which reads weights from the mapped bundle and its inputs in place and so
/// allocates its arena only. The boundary buffer comes last.
pub fn planned_events_placed(
    variant: &proto::Variant,
    on_vulkan: &[bool],
    staged: bool,
) -> Vec<(Action, MemoryKind, u64)> {
    let Some(plan) = variant.plan.as_ref() else {
        return Vec::new();
    };
    let mut events = Vec::new();
    let mut covered = 0;
    for (k, sub) in variant.submodels.iter().enumerate() {
        let first = sub.first_allocation as usize;
        let range = first..first + sub.allocation_count as usize;
        let Some(allocations) = plan.allocations.get(range.clone()) else {
            continue;
        };
        covered = covered.max(range.end);
        let entries = proto::Plan {
            allocations: allocations.to_vec(),
            ..Default::default()
        };
        let planned = planned_events(&entries, staged);
        if on_vulkan.get(k).copied().unwrap_or(false) {
            events.extend(planned);
        } else {
            events.extend(planned.into_iter().filter(|e| e.1 == MemoryKind::Arena));
        }
    }
    let rest = proto::Plan {
        allocations: plan.allocations.get(covered..).unwrap_or_default().to_vec(),
        ..Default::default()
    };
    events.extend(planned_events(&rest, staged));
    events
}

/// The peak of [`planned_events_placed`].
pub fn planned_peak_placed(variant: &proto::Variant, on_vulkan: &[bool], staged: bool) -> u64 {
    peak_of(planned_events_placed(variant, on_vulkan, staged))
}

/// The peak of [`planned_events`]: at most weights + max(arena + io, largest weight).
pub fn planned_peak(plan: &proto::Plan, staged: bool) -> u64 {
    peak_of(planned_events(plan, staged))
}

fn peak_of(events: Vec<(Action, MemoryKind, u64)>) -> u64 {
    let (mut now, mut peak) = (0u64, 0u64);
    for (action, _, bytes) in events {
        match action {
            Action::Allocate => now += bytes,
            Action::Free => now -= bytes,
        }
        peak = peak.max(now);
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_and_peak_bytes_follow_the_events() {
        let ledger = Ledger::new();
        let w = ledger.allocate(MemoryKind::Weight, 100, "w0");
        let s = ledger.allocate(MemoryKind::Staging, 100, "w0");
        ledger.free(s);
        let a = ledger.allocate(MemoryKind::Arena, 40, "arena");
        assert_eq!(
            ledger.total(),
            Usage {
                current: 140,
                peak: 200
            }
        );
        assert_eq!(
            ledger.usage(MemoryKind::Staging),
            Usage {
                current: 0,
                peak: 100
            }
        );
        ledger.free(a);
        ledger.free(w);
        let events = ledger.events();
        let totals: Vec<u64> = events.iter().map(|e| e.total_bytes).collect();
        assert_eq!(totals, [100, 200, 100, 140, 100, 0]);
        assert_eq!(events[2].action, Action::Free);
        assert_eq!(ledger.total().current, 0);
    }

    #[test]
    fn the_planned_peak_holds_one_staging_buffer_at_a_time() {
        let entry = |kind: proto::AllocationKind, bytes| proto::Allocation {
            kind: kind as i32,
            bytes,
            ..Default::default()
        };
        use proto::AllocationKind::*;
        let plan = proto::Plan {
            allocations: vec![
                entry(Weight, 10),
                entry(Weight, 50),
                entry(Weight, 20),
                entry(Arena, 30),
                entry(Io, 5),
            ],
            ..Default::default()
        };
        assert_eq!(planned_peak(&plan, false), 115);
        // Staging the 50-byte weight: 10 + 50 + 50 = 110 < 115 at the end.
        assert_eq!(planned_peak(&plan, true), 115);
        let plan = proto::Plan {
            allocations: vec![entry(Weight, 10), entry(Weight, 80), entry(Arena, 30)],
            ..Default::default()
        };
        // 10 + 80 + 80 staging = 170 = W + max(A, largest weight).
        assert_eq!(planned_peak(&plan, true), 170);
        assert_eq!(planned_events(&plan, true).len(), 7);
    }
}
