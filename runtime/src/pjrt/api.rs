//! A thin, safe layer over the PJRT C API: plugin loading, clients, device
//! buffers, compiled executables. Every handle frees what it owns on drop
//! (errors during teardown are freed and ignored, never panicked on), and
//! every handle is `Send + Sync`: PJRT clients, buffers and executables are
//! thread-safe objects, and we only hand out shared references to them.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use half::{bf16, f16};
use trace_ir::{DType, Error, Result};

use super::ffi::{self, struct_size, ErrPtr, PjrtApi};
use crate::host_data::HostData;

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::backend("pjrt", msg)
}

/// Calls the API entry `$field` with `$args` (a `&mut` to an args struct
/// whose `struct_size` is set) and turns a returned `PJRT_Error` into ours.
macro_rules! call {
    ($plugin:expr, $field:ident, $args:expr) => {{
        let plugin: &Plugin = $plugin;
        match plugin.api().$field {
            None => Err(err(format!(
                "plugin {} does not implement {}",
                plugin.path.display(),
                stringify!($field)
            ))),
            Some(f) => {
                // SAFETY: `f` comes from the plugin's API table, which was
                // checked to be large enough to hold this entry, and the
                // args struct is fully initialised with its size set.
                let e = unsafe { f($args) };
                plugin.check(e, stringify!($field))
            }
        }
    }};
}

/// Zeroed args of type `$t` with `struct_size` set to our size up to `$last`.
macro_rules! args {
    ($t:ty, $last:ident) => {{
        // SAFETY: every args struct is plain C data (integers, raw pointers,
        // nullable function pointers) for which all-zero is a valid value.
        let mut a: $t = unsafe { std::mem::zeroed() };
        a.struct_size = struct_size!($t, $last);
        a
    }};
}

/// A loaded and initialised PJRT plugin. Plugins are loaded once per
/// process and never unloaded (XLA plugins do not support it).
pub struct Plugin {
    pub path: PathBuf,
    api: *const PjrtApi,
    /// `(major, minor)` of the PJRT API the plugin was built with.
    pub api_version: (i32, i32),
    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`, ...).
    pub attributes: Vec<(String, String)>,
    /// A stable hash of the library file, computed on first use.
    file_hash: OnceLock<std::result::Result<(u64, u64), String>>,
    _lib: libloading::Library,
}

// SAFETY: the API table is immutable after load and the PJRT C API is
// thread-safe; the library handle is only kept alive.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &self.api_version)
            .field("attributes", &self.attributes)
            .finish()
    }
}

static PLUGINS: OnceLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> = OnceLock::new();

impl Plugin {
    /// Loads (once per process) and initialises the plugin at `path`.
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        let key = path
            .canonicalize()
            .map_err(|e| err(format!("cannot load PJRT plugin {}: {e}", path.display())))?;
        let registry = PLUGINS.get_or_init(|| Mutex::new(HashMap::new()));
        let mut plugins = registry.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plugins.get(&key) {
            return Ok(p.clone());
        }
        let plugin = Arc::new(Plugin::open(&key)?);
        plugins.insert(key, plugin.clone());
        Ok(plugin)
    }

    fn open(path: &Path) -> Result<Plugin> {
        let ours = format!("{}.{}", ffi::API_MAJOR, ffi::API_MINOR);
        let shown = path.display();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains("libtpu"))
            && std::env::var_os("TPU_SKIP_MDS_QUERY").is_none()
        {
            // Without it libtpu queries the cloud metadata server for over a
            // minute on machines that are not TPU VMs; discovery must not hang.
            std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
        }
        // SAFETY: loading a shared library runs its initialisers; the path
        // was chosen by the user or found where PJRT plugins are installed.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| err(format!("cannot load PJRT plugin {shown}: {e}")))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: libloading::Symbol<ffi::GetPjrtApiFn> = unsafe { lib.get(b"GetPjrtApi\0") }.map_err(|e| {
            err(format!("{shown} is not a PJRT plugin (no GetPjrtApi symbol: {e}); deferfuse speaks PJRT API {ours}"))
        })?;
        // SAFETY: see above; the function takes no arguments.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(err(format!("PJRT plugin {shown}: GetPjrtApi returned null")));
        }
        // SAFETY: `api` points to the plugin's static API table; its leading
        // fields (size, extension, version) exist in every API version.
        let (size, version) = unsafe { ((*api).struct_size, (*api).pjrt_api_version) };
        let (major, minor) = (version.major_version, version.minor_version);
        if major != ffi::API_MAJOR || size < ffi::api_size_needed() {
            return Err(err(format!(
                "PJRT plugin {shown} speaks PJRT API {major}.{minor} (API table of {size} bytes), \
                 which is incompatible with the PJRT API {ours} deferfuse was built for \
                 (needs major {} and a table of at least {} bytes)",
                ffi::API_MAJOR,
                ffi::api_size_needed()
            )));
        }
        let mut plugin = Plugin {
            path: path.to_path_buf(),
            api,
            api_version: (major, minor),
            attributes: Vec::new(),
            file_hash: OnceLock::new(),
            _lib: lib,
        };
        let mut init = args!(ffi::PJRT_Plugin_Initialize_Args, extension_start);
        call!(&plugin, PJRT_Plugin_Initialize, &mut init).map_err(|e| {
            err(format!("PJRT plugin {shown} (API {major}.{minor}) failed to initialise: {e}"))
        })?;
        plugin.attributes = plugin.read_attributes().unwrap_or_default();
        Ok(plugin)
    }

    fn api(&self) -> &PjrtApi {
        // SAFETY: checked non-null at load; the table lives as long as the
        // library, which lives as long as `self`.
        unsafe { &*self.api }
    }

    /// `(hash, length)` of the library file: two builds of a plugin with
    /// equal version attributes still differ here. Computed once (about
    /// 50 ms for a 250 MB plugin), and only when the on-disk cache asks.
    pub fn file_hash(&self) -> Result<(u64, u64)> {
        self.file_hash
            .get_or_init(|| {
                stable_file_hash(&self.path)
                    .map_err(|e| format!("cannot hash {}: {e}", self.path.display()))
            })
            .clone()
            .map_err(err)
    }

    /// An attribute by name, e.g. `xla_version`.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn read_attributes(&self) -> Result<Vec<(String, String)>> {
        let mut a = args!(ffi::PJRT_Plugin_Attributes_Args, num_attributes);
        call!(self, PJRT_Plugin_Attributes, &mut a)?;
        let mut out = Vec::with_capacity(a.num_attributes);
        for i in 0..a.num_attributes {
            // SAFETY: the plugin returned an array of `num_attributes` named
            // values that live as long as the process.
            let v = unsafe { &*a.attributes.add(i) };
            let name = unsafe { lossy(v.name, v.name_size) };
            // SAFETY: `type_` says which union member is set.
            let value = unsafe {
                match v.type_ {
                    ffi::NAMED_VALUE_STRING => lossy(v.value.string_value, v.value_size),
                    ffi::NAMED_VALUE_INT64 => v.value.int64_value.to_string(),
                    ffi::NAMED_VALUE_INT64_LIST => {
                        let p = v.value.int64_array_value;
                        let items: Vec<String> = if p.is_null() {
                            Vec::new()
                        } else {
                            std::slice::from_raw_parts(p, v.value_size)
                                .iter()
                                .map(|x| x.to_string())
                                .collect()
                        };
                        items.join(".")
                    }
                    ffi::NAMED_VALUE_FLOAT => v.value.float_value.to_string(),
                    ffi::NAMED_VALUE_BOOL => v.value.bool_value.to_string(),
                    t => format!("<value of type {t}>"),
                }
            };
            out.push((name, value));
        }
        Ok(out)
    }

    /// Turns a returned error into ours (with the plugin's message) and frees it.
    fn check(&self, e: ErrPtr, what: &str) -> Result<()> {
        if e.is_null() {
            return Ok(());
        }
        let msg = self.take_error(e);
        Err(err(format!("{what}: {msg}")))
    }

    /// The message of `e`; frees `e`.
    fn take_error(&self, e: ErrPtr) -> String {
        let api = self.api();
        let mut msg = String::from("(no message)");
        if let Some(f) = api.PJRT_Error_Message {
            let mut a = args!(ffi::PJRT_Error_Message_Args, message_size);
            a.error = e;
            // SAFETY: `e` is a live error returned by this plugin.
            unsafe { f(&mut a) };
            // SAFETY: the message lives as long as `e`, which is freed below.
            msg = unsafe { lossy(a.message, a.message_size) };
        }
        self.destroy_error(e);
        msg
    }

    fn destroy_error(&self, e: ErrPtr) {
        if e.is_null() {
            return;
        }
        if let Some(f) = self.api().PJRT_Error_Destroy {
            let mut a = args!(ffi::PJRT_Error_Destroy_Args, error);
            a.error = e;
            // SAFETY: `e` is a live error returned by this plugin, freed once.
            unsafe { f(&mut a) };
        }
    }

    /// Waits for `event` (if any) and frees it; returns its error status.
    fn await_event(&self, event: *mut ffi::PJRT_Event, what: &str) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = args!(ffi::PJRT_Event_Await_Args, event);
        a.event = event;
        let status = call!(self, PJRT_Event_Await, &mut a);
        let mut d = args!(ffi::PJRT_Event_Destroy_Args, event);
        d.event = event;
        let destroyed = call!(self, PJRT_Event_Destroy, &mut d);
        status.map_err(|e| err(format!("{what}: {e}")))?;
        destroyed
    }

    /// Calls a teardown entry, ignoring (but freeing) any error.
    fn quietly(&self, e: ErrPtr) {
        self.destroy_error(e);
    }
}

/// The stable hash of a file's bytes, and its length.
fn stable_file_hash(path: &Path) -> std::io::Result<(u64, u64)> {
    trace_ir::signature::stable_hash64_of_reader(std::fs::File::open(path)?)
}

/// A string the plugin returned (pointer and length; not NUL-terminated).
unsafe fn lossy(p: *const c_char, len: usize) -> String {
    if p.is_null() {
        return String::new();
    }
    if len == 0 {
        return CStr::from_ptr(p).to_string_lossy().into_owned();
    }
    String::from_utf8_lossy(std::slice::from_raw_parts(p as *const u8, len)).into_owned()
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field.
fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field << 3 | 2));
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `CompileOptionsProto { executable_build_options: { device_ordinal: -1,
/// num_replicas: 1, num_partitions: 1 }, env_option_overrides: overrides }`,
/// serialized by hand (empty options abort the process inside XLA:
/// `replica_count > 0`). The overrides set XLA debug options by name on top
/// of the plugin's defaults, as `XLA_FLAGS` would.
pub fn compile_options(overrides: &[(&str, super::OptionValue)]) -> Vec<u8> {
    let mut build = Vec::new();
    build.push(1 << 3); // device_ordinal = 1, varint
    varint(&mut build, -1i64 as u64);
    build.push(4 << 3); // num_replicas = 4
    varint(&mut build, 1);
    build.push(5 << 3); // num_partitions = 5
    varint(&mut build, 1);
    let mut out = Vec::new();
    bytes_field(&mut out, 3, &build); // executable_build_options = 3
    for (name, value) in overrides {
        // OptionOverrideProto { oneof { string_field = 1; bool_field = 2; } }
        let mut value_msg = Vec::new();
        match value {
            super::OptionValue::Str(v) => bytes_field(&mut value_msg, 1, v.as_bytes()),
            super::OptionValue::Bool(b) => {
                value_msg.push(2 << 3);
                varint(&mut value_msg, u64::from(*b));
            }
        }
        // A map entry { key = 1; value = 2 } of env_option_overrides = 7.
        let mut entry = Vec::new();
        bytes_field(&mut entry, 1, name.as_bytes());
        bytes_field(&mut entry, 2, &value_msg);
        bytes_field(&mut out, 7, &entry);
    }
    out
}

/// A PJRT client on the plugin's first addressable device.
pub struct Client {
    plugin: Arc<Plugin>,
    raw: *mut ffi::PJRT_Client,
    device: *mut ffi::PJRT_Device,
    pub platform_name: String,
    pub platform_version: String,
}

// SAFETY: PJRT clients are thread-safe; the device pointer is owned by the client.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.plugin.path)
            .field("platform_name", &self.platform_name)
            .field("platform_version", &self.platform_version)
            .finish()
    }
}

impl Client {
    pub fn new(plugin: Arc<Plugin>) -> Result<Arc<Client>> {
        let mut a = args!(ffi::PJRT_Client_Create_Args, kv_try_get_user_arg);
        call!(&plugin, PJRT_Client_Create, &mut a).map_err(|e| {
            err(format!("cannot create a client of PJRT plugin {}: {e}", plugin.path.display()))
        })?;
        if a.client.is_null() {
            return Err(err("PJRT_Client_Create returned no client"));
        }
        // From here on the client is freed by Drop on every path.
        let mut client = Client {
            plugin,
            raw: a.client,
            device: ptr::null_mut(),
            platform_name: String::new(),
            platform_version: String::new(),
        };
        let mut d = args!(ffi::PJRT_Client_AddressableDevices_Args, num_addressable_devices);
        d.client = client.raw;
        call!(&client.plugin, PJRT_Client_AddressableDevices, &mut d)?;
        if d.num_addressable_devices == 0 || d.addressable_devices.is_null() {
            return Err(err(format!(
                "PJRT plugin {} has no addressable device",
                client.plugin.path.display()
            )));
        }
        // SAFETY: the array has `num_addressable_devices` entries owned by the client.
        client.device = unsafe { *d.addressable_devices };
        client.platform_name = client.string(|p| &p.PJRT_Client_PlatformName).unwrap_or_default();
        client.platform_version =
            client.string(|p| &p.PJRT_Client_PlatformVersion).unwrap_or_default();
        Ok(Arc::new(client))
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    fn string(
        &self,
        entry: impl Fn(&PjrtApi) -> &ffi::Fn<ffi::PJRT_Client_String_Args>,
    ) -> Result<String> {
        let Some(f) = *entry(self.plugin.api()) else {
            return Ok(String::new());
        };
        let mut a = args!(ffi::PJRT_Client_String_Args, value_size);
        a.client = self.raw;
        // SAFETY: live client, initialised args.
        let e = unsafe { f(&mut a) };
        self.plugin.check(e, "PJRT_Client_Platform")?;
        // SAFETY: the string is owned by the client.
        Ok(unsafe { lossy(a.value, a.value_size) })
    }

    /// Compiles a StableHLO module (MLIR text) for one device with
    /// serialized `CompileOptionsProto` `options` ([`compile_options`]).
    pub fn compile(self: &Arc<Self>, mlir: &str, options: &[u8]) -> Result<LoadedExecutable> {
        let format = b"mlir";
        let mut program = args!(ffi::PJRT_Program, format_size);
        program.code = mlir.as_ptr() as *mut c_char;
        program.code_size = mlir.len();
        program.format = format.as_ptr() as *const c_char;
        program.format_size = format.len();
        let mut a = args!(ffi::PJRT_Client_Compile_Args, executable);
        a.client = self.raw;
        a.program = &program;
        a.compile_options = options.as_ptr() as *const c_char;
        a.compile_options_size = options.len();
        call!(&self.plugin, PJRT_Client_Compile, &mut a)?;
        LoadedExecutable::wrap(self, a.executable)
    }

    /// Loads an executable that [`LoadedExecutable::serialize`] wrote.
    pub fn deserialize(self: &Arc<Self>, bytes: &[u8]) -> Result<LoadedExecutable> {
        let mut a = args!(
            ffi::PJRT_Executable_DeserializeAndLoad_Args,
            overridden_serialized_compile_options_size
        );
        a.client = self.raw;
        a.serialized_executable = bytes.as_ptr() as *const c_char;
        a.serialized_executable_size = bytes.len();
        call!(&self.plugin, PJRT_Executable_DeserializeAndLoad, &mut a)?;
        LoadedExecutable::wrap(self, a.loaded_executable)
    }

    /// Copies host data into a new device buffer of shape `dims`.
    pub fn upload(self: &Arc<Self>, data: &HostData, dims: &[usize]) -> Result<DeviceBuffer> {
        let n: usize = dims.iter().product();
        if n != data.len() {
            return Err(err(format!("upload: {} values for shape {dims:?}", data.len())));
        }
        let dims64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let (ptr, _) = data.bytes();
        let mut a = args!(ffi::PJRT_Client_BufferFromHostBuffer_Args, buffer);
        a.client = self.raw;
        a.data = ptr.cast::<c_void>();
        a.type_ = buffer_type(data.dtype());
        a.dims = dims64.as_ptr();
        a.num_dims = dims64.len();
        a.host_buffer_semantics = ffi::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
        a.device = self.device;
        call!(&self.plugin, PJRT_Client_BufferFromHostBuffer, &mut a)?;
        let buffer =
            DeviceBuffer { client: self.clone(), raw: a.buffer, dtype: data.dtype(), numel: n };
        // The data was copied during the call; the event still has to be freed.
        self.plugin.await_event(a.done_with_host_buffer, "upload")?;
        if buffer.raw.is_null() {
            return Err(err("PJRT_Client_BufferFromHostBuffer returned no buffer"));
        }
        Ok(buffer)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(f) = self.plugin.api().PJRT_Client_Destroy {
            let mut a = args!(ffi::PJRT_Client_Destroy_Args, client);
            a.client = self.raw;
            // SAFETY: every buffer and executable holds an `Arc<Client>`, so
            // none outlives this call; the client is freed once.
            let e = unsafe { f(&mut a) };
            self.plugin.quietly(e);
        }
    }
}

fn buffer_type(d: DType) -> std::ffi::c_int {
    match d {
        DType::Bool => ffi::BUFFER_TYPE_PRED,
        DType::I32 => ffi::BUFFER_TYPE_S32,
        DType::I64 => ffi::BUFFER_TYPE_S64,
        DType::BF16 => ffi::BUFFER_TYPE_BF16,
        DType::F16 => ffi::BUFFER_TYPE_F16,
        DType::F32 => ffi::BUFFER_TYPE_F32,
    }
}

/// An array on the device. Freed on drop.
pub struct DeviceBuffer {
    client: Arc<Client>,
    raw: *mut ffi::PJRT_Buffer,
    pub dtype: DType,
    pub numel: usize,
}

// SAFETY: PJRT buffers are thread-safe; we only read them.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("dtype", &self.dtype)
            .field("numel", &self.numel)
            .finish()
    }
}

impl crate::buffer::DeviceData for DeviceBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl DeviceBuffer {
    /// The client (and so the device) the buffer lives on.
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Copies the buffer back to the host.
    pub fn to_host(&self) -> Result<HostData> {
        let n = self.numel;
        Ok(match self.dtype {
            DType::Bool => {
                let v: Vec<u8> = self.read(n)?;
                HostData::Bool(v.into_iter().map(|b| b != 0).collect())
            }
            DType::I32 => HostData::I32(self.read(n)?),
            DType::I64 => HostData::I64(self.read(n)?),
            DType::BF16 => HostData::BF16(self.read::<bf16>(n)?),
            DType::F16 => HostData::F16(self.read::<f16>(n)?),
            DType::F32 => HostData::F32(self.read(n)?),
        })
    }

    /// `n` elements of a plain-old-data type whose every bit pattern is valid.
    fn read<T: Copy + Default>(&self, n: usize) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        let bytes = std::mem::size_of_val(out.as_slice());
        if bytes == 0 {
            return Ok(out);
        }
        let mut a = args!(ffi::PJRT_Buffer_ToHostBuffer_Args, event);
        a.src = self.raw;
        a.dst = out.as_mut_ptr() as *mut c_void;
        a.dst_size = bytes;
        let plugin = &self.client.plugin;
        call!(plugin, PJRT_Buffer_ToHostBuffer, &mut a)?;
        plugin.await_event(a.event, "download")?;
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let plugin = &self.client.plugin;
        if let Some(f) = plugin.api().PJRT_Buffer_Destroy {
            let mut a = args!(ffi::PJRT_Buffer_Destroy_Args, buffer);
            a.buffer = self.raw;
            // SAFETY: the buffer is live and freed once.
            let e = unsafe { f(&mut a) };
            plugin.quietly(e);
        }
    }
}

/// A compiled program loaded on the client's device. Freed on drop.
pub struct LoadedExecutable {
    client: Arc<Client>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    num_outputs: usize,
}

// SAFETY: PJRT executables may be executed from several threads at once.
unsafe impl Send for LoadedExecutable {}
unsafe impl Sync for LoadedExecutable {}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable").field("num_outputs", &self.num_outputs).finish()
    }
}

/// A `PJRT_Executable` view of a loaded executable, freed on drop.
struct ExecutableView<'a> {
    plugin: &'a Plugin,
    raw: *mut ffi::PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.plugin.api().PJRT_Executable_Destroy {
            let mut a = args!(ffi::PJRT_Executable_Destroy_Args, executable);
            a.executable = self.raw;
            // SAFETY: the view was returned by GetExecutable and is freed once.
            let e = unsafe { f(&mut a) };
            self.plugin.quietly(e);
        }
    }
}

impl LoadedExecutable {
    fn wrap(
        client: &Arc<Client>,
        raw: *mut ffi::PJRT_LoadedExecutable,
    ) -> Result<LoadedExecutable> {
        if raw.is_null() {
            return Err(err("the plugin returned no executable"));
        }
        let mut exe = LoadedExecutable { client: client.clone(), raw, num_outputs: 0 };
        let view = exe.view()?;
        let mut a = args!(ffi::PJRT_Executable_NumOutputs_Args, num_outputs);
        a.executable = view.raw;
        call!(&client.plugin, PJRT_Executable_NumOutputs, &mut a)?;
        drop(view);
        exe.num_outputs = a.num_outputs;
        Ok(exe)
    }

    fn view(&self) -> Result<ExecutableView<'_>> {
        let plugin = &*self.client.plugin;
        let mut a = args!(ffi::PJRT_LoadedExecutable_GetExecutable_Args, executable);
        a.loaded_executable = self.raw;
        call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut a)?;
        if a.executable.is_null() {
            return Err(err("PJRT_LoadedExecutable_GetExecutable returned nothing"));
        }
        Ok(ExecutableView { plugin, raw: a.executable })
    }

    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// The plugin's serialization of the executable (for the on-disk cache).
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let view = self.view()?;
        let plugin = &*self.client.plugin;
        let mut a = args!(ffi::PJRT_Executable_Serialize_Args, serialized_executable_deleter);
        a.executable = view.raw;
        call!(plugin, PJRT_Executable_Serialize, &mut a)?;
        let bytes = if a.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: the bytes live until the deleter runs below.
            unsafe {
                std::slice::from_raw_parts(a.serialized_bytes as *const u8, a.serialized_bytes_size)
            }
            .to_vec()
        };
        if let (Some(deleter), false) =
            (a.serialized_executable_deleter, a.serialized_executable.is_null())
        {
            // SAFETY: called once, as the header requires.
            unsafe { deleter(a.serialized_executable) };
        }
        Ok(bytes)
    }

    /// Runs on `inputs` (one per program argument) and returns the outputs,
    /// still on the device.
    pub fn execute(&self, inputs: &[&DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
        let plugin = &*self.client.plugin;
        let args_list: Vec<*mut ffi::PJRT_Buffer> = inputs.iter().map(|b| b.raw).collect();
        let lists: [*const *mut ffi::PJRT_Buffer; 1] = [args_list.as_ptr()];
        let mut outs: Vec<*mut ffi::PJRT_Buffer> = vec![ptr::null_mut(); self.num_outputs.max(1)];
        let out_lists: [*mut *mut ffi::PJRT_Buffer; 1] = [outs.as_mut_ptr()];
        let mut done: [*mut ffi::PJRT_Event; 1] = [ptr::null_mut()];
        let mut options = args!(ffi::PJRT_ExecuteOptions, incarnation_ids);
        let mut a = args!(ffi::PJRT_LoadedExecutable_Execute_Args, execute_device);
        a.executable = self.raw;
        a.options = &mut options;
        a.argument_lists = lists.as_ptr();
        a.num_devices = 1;
        a.num_args = args_list.len();
        a.output_lists = out_lists.as_ptr();
        a.device_complete_events = done.as_mut_ptr();
        call!(plugin, PJRT_LoadedExecutable_Execute, &mut a)?;
        // Own the outputs first, so they are freed even if the run failed.
        let outputs: Vec<*mut ffi::PJRT_Buffer> = outs.into_iter().take(self.num_outputs).collect();
        let owned: Vec<Option<DeviceBuffer>> = outputs
            .into_iter()
            .map(|raw| {
                (!raw.is_null()).then(|| DeviceBuffer {
                    client: self.client.clone(),
                    raw,
                    dtype: DType::F32,
                    numel: 0,
                })
            })
            .collect();
        plugin.await_event(done[0], "execute")?;
        owned
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                b.ok_or_else(|| err(format!("execute returned no buffer for output {i}")))
            })
            .collect()
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let plugin = &self.client.plugin;
        if let Some(f) = plugin.api().PJRT_LoadedExecutable_Destroy {
            let mut a = args!(ffi::PJRT_LoadedExecutable_Destroy_Args, executable);
            a.executable = self.raw;
            // SAFETY: the executable is live and freed once.
            let e = unsafe { f(&mut a) };
            plugin.quietly(e);
        }
    }
}

impl DeviceBuffer {
    /// Sets what an execution output holds (the plugin does not tell us
    /// without more calls; the lowering knows).
    pub(crate) fn set_meta(&mut self, dtype: DType, numel: usize) {
        self.dtype = dtype;
        self.numel = numel;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn compile_options_bytes() {
        assert_eq!(
            super::compile_options(&[]),
            vec![
                0x1a, 0x0f, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x20,
                0x01, 0x28, 0x01
            ]
        );
    }

    #[test]
    fn compile_options_carry_overrides_as_map_entries() {
        use crate::pjrt::OptionValue;
        let bytes = super::compile_options(&[
            ("ab", OptionValue::Bool(false)),
            ("c", OptionValue::Str("X")),
        ]);
        let tail = &bytes[17..];
        // field 7, entry { key "ab", value { bool_field false } }
        assert_eq!(&tail[..10], &[0x3a, 0x08, 0x0a, 0x02, b'a', b'b', 0x12, 0x02, 0x10, 0x00]);
        // field 7, entry { key "c", value { string_field "X" } }
        assert_eq!(&tail[10..], &[0x3a, 0x08, 0x0a, 0x01, b'c', 0x12, 0x03, 0x0a, 0x01, b'X']);
    }
}
