//! The loader, the instance and the device: created once per [`DeviceChoice`] and shared by
//! every executable that asks for the same choice (a process may hold hundreds of small
//! executables), freed when the last of them drops.

use super::executable::{Resident, WeightKey};
use super::layout::{Unpicked, pick};
use super::memory::Residency;
use super::{DeviceChoice, DeviceInfo, VulkanError};
use ash::vk;
use ingot_schema::proto::DeviceClass;
use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::ThreadId;

/// The Vulkan version Ingot's kernels need (SPIR-V 1.3).
const API_VERSION: u32 = vk::API_VERSION_1_1;

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// The environment variable that turns the validation layer on: `1` for its core checks,
/// `sync` for synchronization validation too (about 10x slower on lavapipe; the 1.3.239 layer
/// also misses stores through naga's chained access chains, so it cannot see every hazard).
pub const VALIDATION_ENV: &str = "INGOT_VULKAN_VALIDATION";

/// What `INGOT_VULKAN_VALIDATION` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validation {
    Off,
    Core,
    Sync,
}

pub fn validation_requested() -> Validation {
    match std::env::var(VALIDATION_ENV).as_deref() {
        Ok("1") => Validation::Core,
        Ok("sync") => Validation::Sync,
        _ => Validation::Off,
    }
}

/// A lock that survives a panic of another holder: every value behind these locks stays
/// consistent between statements.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each message with the thread it was reported on: the layer calls back on the thread of the
/// Vulkan call it checks.
static MESSAGES: Mutex<Vec<(ThreadId, String)>> = Mutex::new(Vec::new());

pub fn validation_messages(this_thread_only: bool) -> Vec<String> {
    let here = std::thread::current().id();
    let messages = lock(&MESSAGES);
    let mine = messages.iter().filter(|(t, _)| !this_thread_only || *t == here);
    mine.map(|(_, m)| m.clone()).collect()
}

/// The debug messenger's callback: stores the message. Must not panic (it is called from C).
unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: the layer passes callback data (or null) that is valid for the duration of this
    // call, with a NUL-terminated message or a null pointer; we copy the text out.
    let text = unsafe { data.as_ref().and_then(|d| d.message_as_c_str()) }
        .map_or_else(String::new, |m| m.to_string_lossy().into_owned());
    let level = if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        "error"
    } else {
        "warning"
    };
    lock(&MESSAGES).push((std::thread::current().id(), format!("{level}: {text}")));
    vk::FALSE
}

fn messenger_info() -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    use vk::DebugUtilsMessageSeverityFlagsEXT as S;
    use vk::DebugUtilsMessageTypeFlagsEXT as T;
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(S::WARNING | S::ERROR)
        .message_type(T::GENERAL | T::VALIDATION | T::PERFORMANCE)
        .pfn_user_callback(Some(on_message))
}

/// `major.minor.patch` of a packed Vulkan version.
fn version_text(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

/// The loader and an instance, with the validation layer's messenger when asked for.
pub struct Instance {
    // Declared (and so dropped) after `instance`'s destruction in `Drop`: it holds the library.
    entry: ash::Entry,
    instance: ash::Instance,
    messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every child object (devices) was destroyed by its owner, which holds this
        // instance; the messenger belongs to this instance.
        unsafe {
            if let Some((utils, messenger)) = &self.messenger {
                utils.destroy_debug_utils_messenger(*messenger, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

/// A physical device and what Ingot needs to know to choose it.
pub struct Physical {
    pub handle: vk::PhysicalDevice,
    pub info: DeviceInfo,
    api_version: u32,
    /// A queue family with compute.
    queue_family: Option<u32>,
    /// Its timestamps' valid bits (0: it has none).
    timestamp_bits: u32,
}

impl Physical {
    /// Why Ingot cannot use this device, if it cannot.
    fn unusable(&self) -> Option<String> {
        if self.api_version < API_VERSION {
            Some(format!(
                "supports Vulkan {}; Ingot needs {}",
                self.info.api_version,
                version_text(API_VERSION)
            ))
        } else if self.queue_family.is_none() {
            Some("has no compute queue".into())
        } else {
            None
        }
    }
}

impl Instance {
    pub fn new(validation: Validation) -> Result<Instance, VulkanError> {
        // `INGOT_VULKAN_LOADER` names another loader library (a path that does not exist
        // stands in for a machine without Vulkan).
        let path = std::env::var_os("INGOT_VULKAN_LOADER");
        // SAFETY: opening libvulkan runs its initialisation code; the library stays loaded as
        // long as `entry` lives, which outlives every object made from it.
        let entry = match &path {
            Some(path) => unsafe { ash::Entry::load_from(path) },
            None => unsafe { ash::Entry::load() },
        }
        .map_err(|e| {
            let which = path.as_ref().map_or("libvulkan".into(), |p| p.to_string_lossy());
            VulkanError::Loader(format!("cannot load {which}: {e}"))
        })?;
        let instance_error =
            |what: &str, r: vk::Result| VulkanError::Instance(format!("{what}: {r}"));
        // SAFETY: plain queries of the loader.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(|r| instance_error("vkEnumerateInstanceVersion", r))?
            .unwrap_or(vk::API_VERSION_1_0);
        if version < API_VERSION {
            return Err(VulkanError::Instance(format!(
                "the Vulkan loader supports {}; Ingot needs {}",
                version_text(version),
                version_text(API_VERSION)
            )));
        }
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        let mut sync_validation = false;
        if validation != Validation::Off {
            // SAFETY: plain queries of the loader.
            let (available, layer_extensions) = unsafe {
                (
                    entry.enumerate_instance_layer_properties(),
                    entry.enumerate_instance_extension_properties(Some(VALIDATION_LAYER)),
                )
            };
            let available = available.map_err(|r| instance_error("listing layers", r))?;
            if !available.iter().any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER)) {
                return Err(VulkanError::Instance(format!(
                    "{} asks for the validation layer {}, which the loader does not find \
                     (Debian package: vulkan-validationlayers)",
                    VALIDATION_ENV,
                    VALIDATION_LAYER.to_string_lossy()
                )));
            }
            let layer_extensions =
                layer_extensions.map_err(|r| instance_error("listing layer extensions", r))?;
            let has = |name: &CStr| {
                layer_extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(name))
            };
            if !has(ash::ext::debug_utils::NAME) {
                return Err(VulkanError::Instance(
                    "the validation layer does not provide VK_EXT_debug_utils".into(),
                ));
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
            // Synchronization validation checks the barriers the executable records.
            sync_validation = validation == Validation::Sync;
            if sync_validation && !has(ash::ext::validation_features::NAME) {
                return Err(VulkanError::Instance(
                    "the validation layer does not provide VK_EXT_validation_features (for \
                     synchronization validation)"
                        .into(),
                ));
            }
            if sync_validation {
                extensions.push(ash::ext::validation_features::NAME.as_ptr());
            }
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"ingot")
            .engine_name(c"ingot")
            .api_version(API_VERSION);
        let enabled = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut features =
            vk::ValidationFeaturesEXT::default().enabled_validation_features(&enabled);
        // Chained into the create info, the messenger also sees instance creation itself.
        let mut instance_messenger = messenger_info();
        let mut info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        if validation != Validation::Off {
            info = info.push_next(&mut instance_messenger);
        }
        if sync_validation {
            info = info.push_next(&mut features);
        }
        // SAFETY: `info` and everything it points to live until the call returns.
        let instance = unsafe { entry.create_instance(&info, None) }
            .map_err(|r| instance_error("vkCreateInstance", r))?;
        let mut this = Instance { entry, instance, messenger: None };
        if validation != Validation::Off {
            let utils = ash::ext::debug_utils::Instance::new(&this.entry, &this.instance);
            // SAFETY: the instance was created with VK_EXT_debug_utils enabled; the callback
            // is a plain function that lives forever.
            let messenger = unsafe { utils.create_debug_utils_messenger(&messenger_info(), None) }
                .map_err(|r| instance_error("vkCreateDebugUtilsMessengerEXT", r))?;
            this.messenger = Some((utils, messenger));
        }
        Ok(this)
    }

    /// Every physical device, in enumeration order.
    pub fn physical_devices(&self) -> Result<Vec<Physical>, VulkanError> {
        // SAFETY: queries of a live instance; the handles it returns belong to it.
        let handles = unsafe { self.instance.enumerate_physical_devices() }.map_err(|r| {
            // A driver without its hardware reports ERROR_INITIALIZATION_FAILED here.
            VulkanError::Device(format!("vkEnumeratePhysicalDevices: {r}"))
        })?;
        let mut out = Vec::with_capacity(handles.len());
        for (index, handle) in handles.into_iter().enumerate() {
            // SAFETY: `handle` was just enumerated from this instance.
            let (props, families) = unsafe {
                (
                    self.instance.get_physical_device_properties(handle),
                    self.instance.get_physical_device_queue_family_properties(handle),
                )
            };
            let kind = match props.device_type {
                vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
                vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
                vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
                vk::PhysicalDeviceType::CPU => "cpu",
                _ => "other",
            };
            let name = props
                .device_name_as_c_str()
                .map_or_else(|_| "(unnamed)".into(), |n| n.to_string_lossy().into_owned());
            let compute = families
                .iter()
                .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0);
            let queue_family = compute.map(|f| f as u32);
            let timestamp_bits = compute.map_or(0, |f| families[f].timestamp_valid_bits);
            out.push(Physical {
                handle,
                info: DeviceInfo {
                    index,
                    name,
                    kind,
                    api_version: version_text(props.api_version),
                },
                api_version: props.api_version,
                queue_family,
                timestamp_bits,
            });
        }
        Ok(out)
    }
}

/// The physical device `choice` names among `devices`. `vulkan` ([`DeviceChoice::Best`])
/// picks a GPU only; where the loader reports CPU-type devices alone, its error says so and
/// how to name one.
fn choose(devices: Vec<Physical>, choice: &DeviceChoice) -> Result<Physical, VulkanError> {
    let n = devices.len();
    let reported = || {
        let names: Vec<String> = devices
            .iter()
            .map(|p| match p.unusable() {
                Some(why) => format!("{} (unusable: {why})", p.info),
                None => p.info.to_string(),
            })
            .collect();
        let list = if names.is_empty() { "none".into() } else { names.join(", ") };
        let s = if n == 1 { "" } else { "s" };
        format!("the loader reports {n} device{s}: {list}")
    };
    let kinds: Vec<(&str, bool)> =
        devices.iter().map(|p| (p.info.kind, p.unusable().is_none())).collect();
    let found = match pick(&kinds, choice) {
        Ok(found) => found,
        Err(Unpicked::CpuTypeOnly(cpus)) => {
            let names: Vec<String> = cpus.iter().map(|&i| devices[i].info.to_string()).collect();
            let (only, which) = match cpus.len() {
                1 => ("a CPU-type device", "it"),
                _ => ("CPU-type devices", "the first"),
            };
            let mut message = format!(
                "no usable Vulkan GPU, only {only} ({}), which `vulkan` passes over for \
                 Ingot's CPU backend; name vulkan:cpu to use {which}",
                names.join(", ")
            );
            // The others, unusable, and why.
            if cpus.len() < n {
                message = format!("{message}; {}", reported());
            }
            return Err(VulkanError::Device(message));
        }
        Err(Unpicked::None) => {
            let wanted = match choice {
                DeviceChoice::Best if n == 0 => "no usable Vulkan device".to_string(),
                DeviceChoice::Best => {
                    "no usable Vulkan GPU (discrete, integrated or virtual)".to_string()
                }
                DeviceChoice::CpuType => {
                    "no usable CPU-type Vulkan device (vulkan:cpu)".to_string()
                }
                DeviceChoice::Index(i) => match n {
                    0 => format!("no Vulkan device {i} (vulkan:{i}): there are none"),
                    1 => format!("no Vulkan device {i} (vulkan:{i}): only vulkan:0 exists"),
                    n => format!(
                        "no Vulkan device {i} (vulkan:{i}): vulkan:0 to vulkan:{} exist",
                        n - 1
                    ),
                },
            };
            return Err(VulkanError::Device(format!("{wanted}; {}", reported())));
        }
    };
    let chosen = devices.into_iter().nth(found);
    match chosen {
        Some(p) => match p.unusable() {
            Some(why) => Err(VulkanError::Device(format!("{} {why}", p.info))),
            None => Ok(p),
        },
        None => Err(VulkanError::Device(format!("no device {found}"))),
    }
}

/// The descriptor set layout and pipeline layout of kernels with a given number of bindings.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub set: vk::DescriptorSetLayout,
    pub pipeline: vk::PipelineLayout,
}

/// A logical device with one compute queue, and what executables share on it.
pub struct Context {
    pub device: ash::Device,
    pub info: DeviceInfo,
    /// Which kernel variants suit it.
    pub class: DeviceClass,
    pub limits: vk::PhysicalDeviceLimits,
    /// `maxMemoryAllocationSize` (Vulkan 1.1).
    pub max_allocation: u64,
    pub memory: vk::PhysicalDeviceMemoryProperties,
    pub queue_family: u32,
    /// The valid bits of the queue's timestamps; 0 where it cannot write them.
    pub timestamp_bits: u32,
    queue: Mutex<vk::Queue>,
    pub pipeline_cache: vk::PipelineCache,
    /// The header this device's and driver's pipeline cache data starts with.
    pub cache_header: [u8; 32],
    /// By binding count.
    layouts: Mutex<Vec<((u32, u32), Layout)>>,
    /// The weights resident on this device, by (bundle, weight index): every executable of one
    /// bundle shares them (see `executable::Resident`).
    pub resident: Residency<WeightKey, Resident>,
    /// Kept alive for the device; dropped after `Drop::drop` destroyed the device.
    _instance: Instance,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the last executable using this device is gone (it held an Arc), and it waited
        // for its work; these objects were created from this device.
        unsafe {
            let _ = self.device.device_wait_idle();
            for (_, l) in lock(&self.layouts).drain(..) {
                self.device.destroy_pipeline_layout(l.pipeline, None);
                self.device.destroy_descriptor_set_layout(l.set, None);
            }
            self.device.destroy_pipeline_cache(self.pipeline_cache, None);
            self.device.destroy_device(None);
        }
    }
}

type Shared = Vec<(DeviceChoice, Validation, Weak<Context>)>;
static SHARED: Mutex<Shared> = Mutex::new(Vec::new());

impl Context {
    /// The process's context for `choice` (and the current validation setting), created on
    /// first use.
    pub fn shared(choice: &DeviceChoice) -> Result<Arc<Context>, VulkanError> {
        let validation = validation_requested();
        // Held while creating, so that concurrent callers share one device.
        let mut shared = lock(&SHARED);
        shared.retain(|(_, _, w)| w.strong_count() > 0);
        let existing = shared
            .iter()
            .filter(|(c, v, _)| c == choice && *v == validation)
            .find_map(|(_, _, w)| w.upgrade());
        if let Some(context) = existing {
            return Ok(context);
        }
        let context = Arc::new(Context::new(choice, validation)?);
        shared.push((choice.clone(), validation, Arc::downgrade(&context)));
        Ok(context)
    }

    fn new(choice: &DeviceChoice, validation: Validation) -> Result<Context, VulkanError> {
        let instance = Instance::new(validation)?;
        let physical = choose(instance.physical_devices()?, choice)?;
        let Some(queue_family) = physical.queue_family else {
            return Err(VulkanError::Device(format!("{} has no compute queue", physical.info)));
        };
        let vi = &instance.instance;
        let handle = physical.handle;
        let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut maintenance3);
        // SAFETY: the device supports Vulkan 1.1 (checked by `choose`), so the properties2
        // query and its Maintenance3 chain are valid.
        let (supported, memory) = unsafe {
            vi.get_physical_device_properties2(handle, &mut props2);
            (
                vi.get_physical_device_features(handle),
                vi.get_physical_device_memory_properties(handle),
            )
        };
        let limits = props2.properties.limits;
        let p = &props2.properties;
        let cache_header =
            super::pipeline_cache::header(p.vendor_id, p.device_id, p.pipeline_cache_uuid);
        let max_allocation = maintenance3.max_memory_allocation_size;
        // Integer and double widths kernels may use, where the device has them.
        let features = vk::PhysicalDeviceFeatures::default()
            .shader_int16(supported.shader_int16 == vk::TRUE)
            .shader_int64(supported.shader_int64 == vk::TRUE)
            .shader_float64(supported.shader_float64 == vk::TRUE);
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];
        let info =
            vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_features(&features);
        let device_error = |what: &str, r: vk::Result| {
            VulkanError::Device(format!("{}: {what}: {r}", physical.info))
        };
        // SAFETY: `info` and what it points to live until the call returns; the queue family
        // exists with at least one queue.
        let device = unsafe { vi.create_device(handle, &info, None) }
            .map_err(|r| device_error("vkCreateDevice", r))?;
        // SAFETY: queue 0 of `queue_family` was requested above.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        // SAFETY: a plain create on the live device.
        let pipeline_cache =
            unsafe { device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None) };
        let pipeline_cache = match pipeline_cache {
            Ok(cache) => cache,
            Err(r) => {
                // SAFETY: nothing else was created from the device.
                unsafe { device.destroy_device(None) };
                return Err(device_error("vkCreatePipelineCache", r));
            }
        };
        let class = if physical.info.kind == "cpu" { DeviceClass::Cpu } else { DeviceClass::Gpu };
        Ok(Context {
            device,
            info: physical.info,
            class,
            limits,
            max_allocation,
            memory,
            queue_family,
            timestamp_bits: physical.timestamp_bits,
            queue: Mutex::new(queue),
            pipeline_cache,
            cache_header,
            layouts: Mutex::new(Vec::new()),
            resident: Residency::default(),
            _instance: instance,
        })
    }

    /// The layouts of kernels with `bindings` storage buffers (set 0, bindings 0..n) and a
    /// push-constant block of `words` words, created on first use.
    pub fn layout(&self, bindings: u32, words: u32) -> Result<Layout, vk::Result> {
        let mut layouts = lock(&self.layouts);
        if let Some((_, l)) = layouts.iter().find(|(n, _)| *n == (bindings, words)) {
            return Ok(*l);
        }
        let slots: Vec<vk::DescriptorSetLayoutBinding> = (0..bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&slots);
        // SAFETY: plain creates on the live device; `info` lives until the call returns.
        let set = unsafe { self.device.create_descriptor_set_layout(&info, None) }?;
        let push = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(4 * words)];
        let sets = [set];
        let info =
            vk::PipelineLayoutCreateInfo::default().set_layouts(&sets).push_constant_ranges(&push);
        // SAFETY: as above; on failure the set layout is destroyed, nothing uses it yet.
        let pipeline = match unsafe { self.device.create_pipeline_layout(&info, None) } {
            Ok(p) => p,
            Err(r) => {
                // SAFETY: the set layout was created above and nothing uses it yet.
                unsafe { self.device.destroy_descriptor_set_layout(set, None) };
                return Err(r);
            }
        };
        let layout = Layout { set, pipeline };
        layouts.push(((bindings, words), layout));
        Ok(layout)
    }

    /// Submits `commands` to the queue, to signal `fence` when done.
    pub fn submit(&self, commands: vk::CommandBuffer, fence: vk::Fence) -> Result<(), vk::Result> {
        let buffers = [commands];
        let submit = [vk::SubmitInfo::default().command_buffers(&buffers)];
        let queue = lock(&self.queue);
        // SAFETY: the queue is externally synchronised by its lock; the command buffer is
        // recorded and not pending (its owner waited for its last submission).
        unsafe { self.device.queue_submit(*queue, &submit, fence) }
    }

    /// Waits until the device is idle (taking the queue, which vkDeviceWaitIdle requires).
    pub fn wait_idle(&self) -> Result<(), vk::Result> {
        let _queue = lock(&self.queue);
        // SAFETY: every queue of the device (there is one) is held.
        unsafe { self.device.device_wait_idle() }
    }

    /// The first memory type allowed by `allowed` (a memoryTypeBits mask) that has all of
    /// `flags`. Drivers list types from the fastest, so the first match is the one to use.
    pub fn memory_type(
        &self,
        allowed: u32,
        flags: vk::MemoryPropertyFlags,
    ) -> Option<(u32, vk::MemoryPropertyFlags)> {
        let count = (self.memory.memory_type_count as usize).min(vk::MAX_MEMORY_TYPES);
        self.memory.memory_types[..count]
            .iter()
            .enumerate()
            .find(|(i, t)| allowed & (1 << i) != 0 && t.property_flags.contains(flags))
            .map(|(i, t)| (i as u32, t.property_flags))
    }

    /// The error for a failed submission or wait.
    pub fn submit_error(&self, stage: &'static str, result: vk::Result) -> VulkanError {
        if result == vk::Result::ERROR_DEVICE_LOST {
            VulkanError::DeviceLost { device: self.info.to_string(), stage }
        } else {
            VulkanError::Submit { device: self.info.to_string(), stage, result }
        }
    }
}
