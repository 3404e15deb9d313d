//! Buffers, each with its own memory allocation, recorded in the ledger with the exact
//! `allocationSize` the device was asked for; and the residency table through which
//! executables share the buffers they can (weights).

use super::VulkanError;
use super::context::{Context, lock};
use crate::ledger::{Entry, Ledger, MemoryKind};
use ash::vk;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// Where a buffer's memory should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Device-local (weights, arena): fastest for kernels; maybe host-visible too.
    Device,
    /// Host-visible and coherent, preferably device-local (the IO buffer): mapped for its
    /// whole life.
    Host,
    /// Host-visible and coherent, the source of a transfer.
    Staging,
}

/// The host address of mapped memory.
struct Mapping(NonNull<u8>);

// SAFETY: the pointer is to device memory mapped for the whole life of its `Buffer`, which
// owns it; it is only dereferenced through `&mut Buffer` (one thread at a time).
unsafe impl Send for Mapping {}
// SAFETY: as above: no `&Buffer` method reads or writes through it.
unsafe impl Sync for Mapping {}

/// `bytes` rounded up to a multiple of `granularity` (0 and 1 leave it as it is).
fn rounded(bytes: u64, granularity: u64) -> u64 {
    bytes.next_multiple_of(granularity.max(1))
}

/// A buffer bound to an allocation of its own. Freed with [`Buffer::free`] (it needs the
/// device and the ledger), never by dropping.
pub struct Buffer {
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    /// Bytes of the buffer: the requested bytes rounded up to a whole word, so that a
    /// descriptor range ending on a word boundary stays inside it.
    size: u64,
    flags: vk::MemoryPropertyFlags,
    mapping: Option<Mapping>,
    entry: Option<Entry>,
}

impl Buffer {
    /// Creates a buffer of `bytes` (> 0) with memory of `kind` placed per `placement`, its
    /// memory rounded up to a multiple of `granularity` bytes (see
    /// [`VulkanOptions::allocation_granularity`](super::VulkanOptions::allocation_granularity)).
    pub fn allocate(
        cx: &Context,
        ledger: &Ledger,
        (kind, bytes, label): (MemoryKind, u64, String),
        placement: Placement,
        granularity: u64,
    ) -> Result<Buffer, VulkanError> {
        let fail = |reason: String| VulkanError::Allocation {
            device: cx.info.to_string(),
            kind,
            bytes,
            label: label.clone(),
            reason,
        };
        let size = Buffer::size(cx, kind, bytes, &label)?;
        let device = &cx.device;
        let info = Buffer::info(size, placement);
        // SAFETY: a plain create on the live device; `info` lives until the call returns.
        let buffer = unsafe { device.create_buffer(&info, None) }
            .map_err(|r| fail(format!("vkCreateBuffer: {r}")))?;
        let mut this = Buffer {
            buffer,
            memory: vk::DeviceMemory::null(),
            size,
            flags: vk::MemoryPropertyFlags::empty(),
            mapping: None,
            entry: None,
        };
        match this.bind(cx, ledger, (kind, label.as_str()), placement, granularity) {
            Ok(()) => Ok(this),
            Err(reason) => {
                this.free(cx, ledger);
                Err(fail(reason))
            }
        }
    }

    /// The memory [`Buffer::allocate`] would allocate for a buffer of `bytes` placed per
    /// `placement`, without allocating it (a buffer is made to ask the driver, and destroyed).
    pub fn allocated_bytes(
        cx: &Context,
        (kind, bytes): (MemoryKind, u64),
        placement: Placement,
        granularity: u64,
    ) -> Result<u64, VulkanError> {
        let size = Buffer::size(cx, kind, bytes, "")?;
        let info = Buffer::info(size, placement);
        let device = &cx.device;
        // SAFETY: a plain create on the live device, queried and destroyed at once; nothing
        // else ever sees the handle.
        let needs = unsafe {
            let buffer =
                device.create_buffer(&info, None).map_err(|r| VulkanError::Allocation {
                    device: cx.info.to_string(),
                    kind,
                    bytes,
                    label: "a size query".into(),
                    reason: format!("vkCreateBuffer: {r}"),
                })?;
            let needs = device.get_buffer_memory_requirements(buffer);
            device.destroy_buffer(buffer, None);
            needs
        };
        Ok(rounded(needs.size, granularity))
    }

    /// The bytes of a buffer of `bytes`: rounded up to a whole word, so that a descriptor
    /// range ending on a word boundary stays inside it.
    fn size(cx: &Context, kind: MemoryKind, bytes: u64, label: &str) -> Result<u64, VulkanError> {
        bytes.checked_next_multiple_of(4).filter(|&s| s <= cx.max_allocation).ok_or_else(|| {
            VulkanError::Limits {
                device: cx.info.to_string(),
                limit: "maxMemoryAllocationSize",
                value: cx.max_allocation,
                need: bytes,
                what: format!("{kind} buffer '{label}'"),
            }
        })
    }

    fn info(size: u64, placement: Placement) -> vk::BufferCreateInfo<'static> {
        let usage = match placement {
            Placement::Device => {
                vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_DST
            }
            Placement::Host => vk::BufferUsageFlags::STORAGE_BUFFER,
            Placement::Staging => vk::BufferUsageFlags::TRANSFER_SRC,
        };
        vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
    }

    /// Allocates and binds the memory (and maps it for host placements).
    fn bind(
        &mut self,
        cx: &Context,
        ledger: &Ledger,
        (kind, label): (MemoryKind, &str),
        placement: Placement,
        granularity: u64,
    ) -> Result<(), String> {
        use vk::MemoryPropertyFlags as F;
        let device = &cx.device;
        // SAFETY: a query of a live buffer.
        let needs = unsafe { device.get_buffer_memory_requirements(self.buffer) };
        let host = F::HOST_VISIBLE | F::HOST_COHERENT;
        let bits = needs.memory_type_bits;
        let found = match placement {
            Placement::Device => {
                cx.memory_type(bits, F::DEVICE_LOCAL).or_else(|| cx.memory_type(bits, F::empty()))
            }
            Placement::Host => {
                cx.memory_type(bits, F::DEVICE_LOCAL | host).or_else(|| cx.memory_type(bits, host))
            }
            Placement::Staging => cx.memory_type(bits, host),
        };
        let (type_index, flags) =
            found.ok_or_else(|| format!("no memory type fits (allowed types {bits:#b})"))?;
        let bytes = rounded(needs.size, granularity);
        let info =
            vk::MemoryAllocateInfo::default().allocation_size(bytes).memory_type_index(type_index);
        // SAFETY: a plain allocation on the live device.
        self.memory = unsafe { device.allocate_memory(&info, None) }
            .map_err(|r| format!("vkAllocateMemory: {r}"))?;
        self.entry = Some(ledger.allocate(kind, bytes, label));
        self.flags = flags;
        // SAFETY: the memory is new, of a type the buffer allows, and as large as it needs.
        unsafe { device.bind_buffer_memory(self.buffer, self.memory, 0) }
            .map_err(|r| format!("vkBindBufferMemory: {r}"))?;
        if placement != Placement::Device {
            self.mapping = Some(Mapping(self.map(cx)?));
        }
        Ok(())
    }

    /// Whether the host can write the memory directly (no staging, no flushes).
    pub fn host_coherent(&self) -> bool {
        use vk::MemoryPropertyFlags as F;
        self.flags.contains(F::HOST_VISIBLE | F::HOST_COHERENT)
    }

    fn map(&self, cx: &Context) -> Result<NonNull<u8>, String> {
        // SAFETY: the memory is host-visible, bound, and not mapped yet.
        let ptr = unsafe {
            cx.device.map_memory(self.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        }
        .map_err(|r| format!("vkMapMemory: {r}"))?;
        NonNull::new(ptr.cast::<u8>()).ok_or_else(|| "vkMapMemory returned null".into())
    }

    /// The mapped bytes of a host-placed buffer (empty for device placement).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &self.mapping {
            // SAFETY: the mapping covers the whole allocation, at least `size` bytes, stays
            // valid until `free`, and `&mut self` makes this the only access from the host.
            // Between submissions the device does not touch it (the owner waits for its fence).
            Some(m) => unsafe { std::slice::from_raw_parts_mut(m.0.as_ptr(), self.size as usize) },
            None => &mut [],
        }
    }

    /// Writes `bytes` at the start of a host-coherent buffer (through a temporary mapping if
    /// it is not mapped).
    pub fn write(&mut self, cx: &Context, bytes: &[u8]) -> Result<(), String> {
        let len = bytes.len().min(self.size as usize);
        if self.mapping.is_some() {
            self.bytes_mut()[..len].copy_from_slice(&bytes[..len]);
            return Ok(());
        }
        let ptr = self.map(cx)?;
        // SAFETY: the mapping covers at least `size` bytes; the device is not using this
        // memory (nothing was submitted with it yet); coherent memory needs no flush.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), len);
            cx.device.unmap_memory(self.memory);
        }
        Ok(())
    }

    /// Destroys the buffer and frees its memory (recorded in the ledger). The device must be
    /// done with it.
    pub fn free(mut self, cx: &Context, ledger: &Ledger) {
        let device = &cx.device;
        // SAFETY: the owner guarantees the device no longer uses the buffer; null handles are
        // ignored by destroy/free.
        unsafe {
            if self.mapping.take().is_some() {
                device.unmap_memory(self.memory);
            }
            device.destroy_buffer(self.buffer, None);
            if self.memory != vk::DeviceMemory::null() {
                device.free_memory(self.memory, None);
            }
        }
        if let Some(entry) = self.entry.take() {
            ledger.free(entry);
        }
    }
}

/// Values shared by key, each made by its first user and dropped with its last (the weights
/// resident on a device). The table holds only weak references: it never keeps a value alive.
pub struct Residency<K, T> {
    slots: Mutex<Slots<K, T>>,
}

/// One lock per key, held while its value is made, so that concurrent users of a key wait for
/// one maker instead of each making their own.
type Slot<T> = Arc<Mutex<Weak<T>>>;

struct Slots<K, T> {
    map: BTreeMap<K, Slot<T>>,
    /// Unused slots are dropped when the map reaches this size (amortised: a process that
    /// opens many bundles does not keep a slot per weight it ever held).
    prune_at: usize,
}

impl<K, T> Default for Residency<K, T> {
    fn default() -> Self {
        Residency { slots: Mutex::new(Slots { map: BTreeMap::new(), prune_at: 0 }) }
    }
}

impl<K: Ord, T> Residency<K, T> {
    /// The value resident under `key`, else the one `make` returns, which becomes resident.
    /// `make` runs without the table locked (other keys go on), while other users of `key`
    /// wait for it; if it fails, nothing is kept and the next user makes its own.
    pub fn get_or_make<E>(&self, key: K, make: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E> {
        let slot = {
            let mut slots = lock(&self.slots);
            if slots.map.len() >= slots.prune_at {
                // A slot is in use while someone holds a clone of it or its value lives. The
                // map's lock is the only way to a slot, so these slot locks are free.
                slots.map.retain(|_, s| Arc::strong_count(s) > 1 || lock(s).strong_count() > 0);
                slots.prune_at = 2 * slots.map.len().max(8);
            }
            Arc::clone(slots.map.entry(key).or_default())
        };
        let mut resident = lock(&slot);
        if let Some(value) = resident.upgrade() {
            return Ok(value);
        }
        let value = Arc::new(make()?);
        *resident = Arc::downgrade(&value);
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn a_value_is_made_by_its_first_user_and_dropped_with_its_last() {
        let table = Residency::default();
        let (made, dropped) = (AtomicUsize::new(0), Arc::new(AtomicUsize::new(0)));
        let get = || {
            table.get_or_make(7, || {
                made.fetch_add(1, SeqCst);
                Ok::<_, ()>(Counted(Arc::clone(&dropped)))
            })
        };
        let (a, b) = (get().unwrap(), get().unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(made.load(SeqCst), 1);
        drop(a);
        assert_eq!(dropped.load(SeqCst), 0);
        drop(b);
        assert_eq!(dropped.load(SeqCst), 1);
        // Gone: the next user makes it again.
        let _c = get().unwrap();
        assert_eq!(made.load(SeqCst), 2);
    }

    #[test]
    fn a_failed_make_keeps_nothing() {
        let table = Residency::default();
        assert_eq!(table.get_or_make(1, || Err("no memory")), Err("no memory"));
        let value = table.get_or_make(1, || Ok::<_, &str>(5)).unwrap();
        assert_eq!(*value, 5);
        // Other keys are other values.
        assert_eq!(*table.get_or_make(2, || Ok::<_, &str>(6)).unwrap(), 6);
        assert_eq!(*table.get_or_make(1, || Ok::<_, &str>(7)).unwrap(), 5);
    }

    #[test]
    fn concurrent_users_of_a_key_wait_for_one_maker() {
        let table = Residency::default();
        let made = AtomicUsize::new(0);
        let start = std::sync::Barrier::new(8);
        let values: Vec<Arc<u32>> = std::thread::scope(|s| {
            let users: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        table.get_or_make("w", || {
                            made.fetch_add(1, SeqCst);
                            // Long enough for every other thread to arrive meanwhile.
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Ok::<_, ()>(42)
                        })
                    })
                })
                .collect();
            users.into_iter().map(|u| u.join().unwrap().unwrap()).collect()
        });
        assert_eq!(made.load(SeqCst), 1);
        assert!(values.iter().all(|v| Arc::ptr_eq(v, &values[0])));
    }

    #[test]
    fn slots_of_dropped_values_are_pruned() {
        let table = Residency::default();
        let kept = table.get_or_make(0, || Ok::<_, ()>(0)).unwrap();
        for key in 1..1000 {
            drop(table.get_or_make(key, || Ok::<_, ()>(key)));
        }
        let slots = lock(&table.slots).map.len();
        assert!(slots <= 16, "{slots} slots for 1 live value");
        assert_eq!(*table.get_or_make(0, || Ok::<_, ()>(1)).unwrap(), *kept);
    }
}
