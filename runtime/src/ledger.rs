//! The ledger: every device allocation and free, in order, with running and peak bytes per
//! kind and in total. Backends record into it; tests compare it with the plan's schedule.

use ingot_schema::proto;
use std::collections::BTreeSet;
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
        Ledger { book: Arc::default(), device: "host".into() }
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
        Ledger { book: Arc::clone(&self.book), device: device.into() }
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
        Entry { kind, bytes, label, device: Arc::clone(&self.device) }
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
        self.book().events.iter().filter(|e| &*e.device == device).fold(0, |held, e| {
            match e.action {
                Action::Allocate => held + e.bytes,
                Action::Free => held - e.bytes,
            }
        })
    }
}

/// What an allocation of the plan is for.
fn kind(a: &proto::Allocation) -> MemoryKind {
    match proto::AllocationKind::try_from(a.kind) {
        Ok(proto::AllocationKind::Weight) => MemoryKind::Weight,
        Ok(proto::AllocationKind::Arena) => MemoryKind::Arena,
        Ok(proto::AllocationKind::Io) => MemoryKind::Io,
        Ok(proto::AllocationKind::Boundary) => MemoryKind::Boundary,
        _ => MemoryKind::Other,
    }
}

/// The load-time events the plan's allocation schedule predicts, in order: each entry
/// allocated; with `staged` uploads, each weight's staging buffer allocated and freed right
/// after it.
pub fn planned_events(plan: &proto::Plan, staged: bool) -> Vec<(Action, MemoryKind, u64)> {
    let mut events = Vec::with_capacity(plan.allocations.len() * 3);
    for a in &plan.allocations {
        let kind = kind(a);
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
/// allocates its arena only. The boundary buffer comes last. Every Vulkan submodel allocates
/// the weights its schedule lists; the runtime shares one upload of each bank entry between
/// them, which [`planned_events_shared`] predicts.
pub fn planned_events_placed(
    variant: &proto::Variant,
    on_vulkan: &[bool],
    staged: bool,
) -> Vec<(Action, MemoryKind, u64)> {
    placed(variant, on_vulkan, staged, None, &as_planned)
}

/// [`planned_events_placed`] on a Vulkan device where the bank entries in `resident` are
/// already uploaded (by another submodel, variant or session of the same bundle): those are
/// shared, not allocated. Adds the entries it allocates to `resident`, so that calling it for
/// each session in the order they are created predicts the ledger they share.
pub fn planned_events_shared(
    variant: &proto::Variant,
    on_vulkan: &[bool],
    staged: bool,
    resident: &mut BTreeSet<u32>,
) -> Vec<(Action, MemoryKind, u64)> {
    placed(variant, on_vulkan, staged, Some(resident), &as_planned)
}

/// The bytes a device allocates for a buffer of `bytes` of `kind` for submodel `k`: a Vulkan
/// driver rounds each buffer's memory up to a granularity of its own, which a plan made ahead
/// of time cannot know.
pub type AllocatedBytes<'a> = &'a dyn Fn(usize, MemoryKind, u64) -> u64;

/// Every allocation as large as the plan asks.
fn as_planned(_: usize, _: MemoryKind, bytes: u64) -> u64 {
    bytes
}

/// [`planned_events_shared`] with each allocation at the bytes its device allocates for it:
/// the ledger of a session on real devices, event by event.
pub fn planned_events_sized(
    variant: &proto::Variant,
    on_vulkan: &[bool],
    staged: bool,
    resident: &mut BTreeSet<u32>,
    sizes: AllocatedBytes,
) -> Vec<(Action, MemoryKind, u64)> {
    placed(variant, on_vulkan, staged, Some(resident), sizes)
}

fn placed(
    variant: &proto::Variant,
    on_vulkan: &[bool],
    staged: bool,
    mut resident: Option<&mut BTreeSet<u32>>,
    sizes: AllocatedBytes,
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
        let on_vulkan = on_vulkan.get(k).copied().unwrap_or(false);
        let allocations = allocations.iter().filter(|a| match kind(a) {
            MemoryKind::Weight if on_vulkan => match resident.as_deref_mut() {
                Some(resident) => resident.insert(a.weight),
                None => true,
            },
            MemoryKind::Arena => true,
            _ => on_vulkan,
        });
        let planned = planned_events(&only(allocations), staged);
        events.extend(planned.into_iter().map(|(a, kind, bytes)| (a, kind, sizes(k, kind, bytes))));
    }
    let rest = plan.allocations.get(covered..).unwrap_or_default();
    events.extend(planned_events(&only(rest), staged));
    events
}

/// A plan of these allocations only.
fn only<'a>(allocations: impl IntoIterator<Item = &'a proto::Allocation>) -> proto::Plan {
    proto::Plan { allocations: allocations.into_iter().cloned().collect(), ..Default::default() }
}

/// The peak of [`planned_events`]: at most weights + max(arena + io, largest weight).
pub fn planned_peak(plan: &proto::Plan, staged: bool) -> u64 {
    peak_of(planned_events(plan, staged))
}

/// The most bytes held at once over `events` (e.g. several sessions' planned events, one
/// after the other).
pub fn peak_of(events: impl IntoIterator<Item = (Action, MemoryKind, u64)>) -> u64 {
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
        assert_eq!(ledger.total(), Usage { current: 140, peak: 200 });
        assert_eq!(ledger.usage(MemoryKind::Staging), Usage { current: 0, peak: 100 });
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

    #[test]
    fn shared_weights_are_planned_once_per_device() {
        use proto::AllocationKind::*;
        let entry = |kind: proto::AllocationKind, bytes, weight| proto::Allocation {
            kind: kind as i32,
            bytes,
            weight,
            ..Default::default()
        };
        let sub = |first, count| proto::Submodel {
            first_allocation: first,
            allocation_count: count,
            ..Default::default()
        };
        // Vulkan, CPU, Vulkan: weight 0 is read by submodels 0 and 2, weight 1 by 1 and 2.
        let variant = proto::Variant {
            plan: Some(proto::Plan {
                allocations: vec![
                    entry(Weight, 8, 0),
                    entry(Arena, 16, 0),
                    entry(Io, 4, 0),
                    entry(Weight, 12, 1),
                    entry(Arena, 32, 0),
                    entry(Weight, 8, 0),
                    entry(Weight, 12, 1),
                    entry(Arena, 20, 0),
                    entry(Io, 4, 0),
                    entry(Boundary, 64, 0),
                ],
                ..Default::default()
            }),
            submodels: vec![sub(0, 3), sub(3, 2), sub(5, 4)],
            ..Default::default()
        };
        let placed = [true, false, true];
        use Action::{Allocate as A, Free as F};
        use MemoryKind::{Arena as Ar, Boundary as B, Staging as S, Weight as W};
        const IO: MemoryKind = MemoryKind::Io;
        // Each submodel's own weights, as the schedule lists them.
        assert_eq!(
            planned_events_placed(&variant, &placed, false),
            [
                (A, W, 8),
                (A, Ar, 16),
                (A, IO, 4),
                (A, Ar, 32),
                (A, W, 8),
                (A, W, 12),
                (A, Ar, 20),
                (A, IO, 4),
                (A, B, 64)
            ]
        );
        // Shared: submodel 2 finds weight 0 resident and uploads weight 1 (the CPU read it
        // from the bundle), staged.
        let mut resident = BTreeSet::new();
        let first = planned_events_shared(&variant, &placed, true, &mut resident);
        assert_eq!(
            first,
            [
                (A, W, 8),
                (A, S, 8),
                (F, S, 8),
                (A, Ar, 16),
                (A, IO, 4),
                (A, Ar, 32),
                (A, W, 12),
                (A, S, 12),
                (F, S, 12),
                (A, Ar, 20),
                (A, IO, 4),
                (A, B, 64)
            ]
        );
        assert_eq!(resident, BTreeSet::from([0, 1]));
        // A second session of the bundle uploads nothing.
        let second = planned_events_shared(&variant, &placed, true, &mut resident);
        assert!(second.iter().all(|e| e.1 != W && e.1 != S), "{second:?}");
        assert_eq!(second.len(), 6);
        // Both: 20 weight bytes once, and 68 of arenas, 8 of IO and 64 of boundary each (the
        // staging buffers come and go below that).
        assert_eq!(peak_of(first.into_iter().chain(second)), 20 + 2 * (68 + 8 + 64));
    }
}
