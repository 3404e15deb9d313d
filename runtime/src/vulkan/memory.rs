//! Buffers, each with its own memory allocation, recorded in the ledger with the exact
//! `allocationSize` the device was asked for.

use super::VulkanError;
use super::context::Context;
use crate::ledger::{Entry, Ledger, MemoryKind};
use ash::vk;
use std::ptr::NonNull;

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
    /// Creates a buffer of `bytes` (> 0) with memory of `kind` placed per `placement`.
    pub fn allocate(
        cx: &Context,
        ledger: &Ledger,
        kind: MemoryKind,
        bytes: u64,
        label: String,
        placement: Placement,
    ) -> Result<Buffer, VulkanError> {
        let fail = |reason: String| VulkanError::Allocation {
            device: cx.info.to_string(),
            kind,
            bytes,
            label: label.clone(),
            reason,
        };
        let size = bytes
            .checked_next_multiple_of(4)
            .filter(|&s| s <= cx.max_allocation)
            .ok_or_else(|| VulkanError::Limits {
                device: cx.info.to_string(),
                limit: "maxMemoryAllocationSize",
                value: cx.max_allocation,
                need: bytes,
                what: format!("{kind} buffer '{label}'"),
            })?;
        let usage = match placement {
            Placement::Device => {
                vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_DST
            }
            Placement::Host => vk::BufferUsageFlags::STORAGE_BUFFER,
            Placement::Staging => vk::BufferUsageFlags::TRANSFER_SRC,
        };
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let device = &cx.device;
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
        match this.bind(cx, ledger, kind, &label, placement) {
            Ok(()) => Ok(this),
            Err(reason) => {
                this.free(cx, ledger);
                Err(fail(reason))
            }
        }
    }

    /// Allocates and binds the memory (and maps it for host placements).
    fn bind(
        &mut self,
        cx: &Context,
        ledger: &Ledger,
        kind: MemoryKind,
        label: &str,
        placement: Placement,
    ) -> Result<(), String> {
        use vk::MemoryPropertyFlags as F;
        let device = &cx.device;
        // SAFETY: a query of a live buffer.
        let needs = unsafe { device.get_buffer_memory_requirements(self.buffer) };
        let host = F::HOST_VISIBLE | F::HOST_COHERENT;
        let bits = needs.memory_type_bits;
        let found = match placement {
            Placement::Device => cx
                .memory_type(bits, F::DEVICE_LOCAL)
                .or_else(|| cx.memory_type(bits, F::empty())),
            Placement::Host => cx
                .memory_type(bits, F::DEVICE_LOCAL | host)
                .or_else(|| cx.memory_type(bits, host)),
            Placement::Staging => cx.memory_type(bits, host),
        };
        let (type_index, flags) =
            found.ok_or_else(|| format!("no memory type fits (allowed types {bits:#b})"))?;
        let info = vk::MemoryAllocateInfo::default()
            .allocation_size(needs.size)
            .memory_type_index(type_index);
        // SAFETY: a plain allocation on the live device.
        self.memory = unsafe { device.allocate_memory(&info, None) }
            .map_err(|r| format!("vkAllocateMemory: {r}"))?;
        self.entry = Some(ledger.allocate(kind, needs.size, label));
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
            cx.device
                .map_memory(self.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
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
