/*
 * ingot.h: the C API of the Ingot runtime (Rust crate ingot-capi, library libingot.a / .so).
 *
 * Open a bundle that `ingot compile MODEL.onnx -o MODEL.ingot` wrote, make a session on a
 * device list, look at its inputs and outputs, and run it on your own buffers:
 *
 *     IngotBundle *bundle;
 *     IngotSession *session;
 *     if (ingot_bundle_open("model.ingot", &bundle) != INGOT_OK) {
 *         fprintf(stderr, "%s\n", ingot_last_error());
 *         return 1;
 *     }
 *     IngotStatus status = ingot_session_new(bundle, "vulkan,cpu", NULL, &session);
 *     ingot_bundle_free(bundle);  // the session keeps what it needs
 *     if (status != INGOT_OK) { ... }
 *     IngotTensorInfo in, out;
 *     ingot_session_input_info(session, 0, &in);    // in.bytes: the buffer size to pass
 *     ingot_session_output_info(session, 0, &out);
 *     ...
 *     ingot_session_run(session, &in_ptr, &in.bytes, 1, &out_ptr, &out.bytes, 1);
 *     ingot_session_free(session);
 *
 * Link: libingot.so, or libingot.a plus the system libraries Rust needs
 * (Linux: -ldl -lgcc_s -lutil -lrt -lpthread -lm -lc). capi/examples/run_bundle.c is a
 * complete program; capi/run_example.sh builds and runs it.
 *
 * Conventions
 * - Errors: every function that can fail returns an IngotStatus. On failure,
 *   ingot_last_error() returns a message for the calling thread. Every function that returns
 *   an IngotStatus replaces that message (with "" on success); the *_free functions leave it
 *   alone, so they may be called while handling an error.
 * - Pointers: a pointer argument must not be NULL unless its function says so; a NULL
 *   where one is required is INGOT_INVALID_ARGUMENT, never a crash. An out-parameter
 *   receiving a handle or a string is set to NULL when the call fails.
 * - Strings passed in are NUL-terminated UTF-8 (file paths: any bytes on Unix). A string
 *   returned as `char *` belongs to the caller: free it with ingot_string_free. A
 *   `const char *` belongs to Ingot, for as long as the function that returned it says.
 * - Panics: no Rust panic crosses this boundary; an internal error (a bug in Ingot, please
 *   report it) is INGOT_INTERNAL. This holds for the library as built by Cargo (panic=unwind).
 * - Threads: a bundle may be shared between threads (ingot_session_new from several threads
 *   at once). A session, and an options handle, may be used from any thread, one call at a
 *   time: a session made on one thread may run on another (a worker), but two threads must
 *   not call into the same session at once. Messages from ingot_last_error() are per thread.
 * - Tensors are dense, row-major, little-endian; booleans are one byte (0 or 1) per element.
 */
#ifndef INGOT_H
#define INGOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a call returns. */
typedef enum IngotStatus {
    INGOT_OK = 0,
    /* A NULL where a pointer is required, an index out of range, a wrong number of buffers
     * or a wrong byte length, a string that is not UTF-8. */
    INGOT_INVALID_ARGUMENT = 1,
    /* The bundle cannot be read, or is not a valid bundle (corrupt, truncated, another
     * format version). Opening checks everything but the weights, each of which is checked
     * when a session first needs it: so ingot_session_new* may return this too. */
    INGOT_BUNDLE = 2,
    /* The session cannot be made: an unknown device name or variant, an empty device list,
     * no device in the list can run a submodel. */
    INGOT_SESSION = 3,
    /* Running failed on every device the list allowed. */
    INGOT_RUN = 4,
    /* A bug in Ingot, caught at the boundary. */
    INGOT_INTERNAL = 5,
    /* The input data is invalid for the model (an index out of range for a Gather, say):
     * no device would run it, so none was tried after the first; the session stays usable. */
    INGOT_DATA = 6
} IngotStatus;

/* Element types, numbered like ONNX's TensorProto.DataType. */
typedef enum IngotDType {
    INGOT_DTYPE_F32 = 1,
    INGOT_DTYPE_U8 = 2,
    INGOT_DTYPE_I8 = 3,
    INGOT_DTYPE_U16 = 4,
    INGOT_DTYPE_I16 = 5,
    INGOT_DTYPE_I32 = 6,
    INGOT_DTYPE_I64 = 7,
    INGOT_DTYPE_BOOL = 9,
    INGOT_DTYPE_F16 = 10,
    INGOT_DTYPE_F64 = 11,
    INGOT_DTYPE_U32 = 12,
    INGOT_DTYPE_U64 = 13,
    /* float8, one byte per element. */
    INGOT_DTYPE_F8E4M3FN = 17,
    INGOT_DTYPE_F8E4M3FNUZ = 18,
    INGOT_DTYPE_F8E5M2 = 19,
    INGOT_DTYPE_F8E5M2FNUZ = 20,
    /* 4-bit integers, one byte per element (ONNX files pack two): INT4 sign-extended. */
    INGOT_DTYPE_U4 = 21,
    INGOT_DTYPE_I4 = 22,
    /* FLOAT4E2M1 in the low nibble of a byte; FLOAT8E8M0 (a power of two) a byte. */
    INGOT_DTYPE_F4E2M1 = 23,
    INGOT_DTYPE_F8E8M0 = 24,
    /* 2-bit integers, one byte per element (ONNX files pack four): INT2 sign-extended. */
    INGOT_DTYPE_U2 = 25,
    INGOT_DTYPE_I2 = 26
} IngotDType;

/* A compiled model, opened and validated. */
typedef struct IngotBundle IngotBundle;

/* One variant of a bundle, prepared on devices, ready to run. */
typedef struct IngotSession IngotSession;

/* An input or output of a session. `name` and `dims` belong to the session and live as long
 * as it does. */
typedef struct IngotTensorInfo {
    const char *name;
    int32_t dtype;      /* an IngotDType */
    size_t rank;        /* the number of dims; 0 for a scalar */
    const size_t *dims; /* rank entries */
    size_t bytes;       /* product of dims times the element size: the buffer to pass */
} IngotTensorInfo;

/* ---- Library ---------------------------------------------------------------------------- */

/* The library's version, e.g. "0.1.0". A static string. */
const char *ingot_version(void);

/* The message of this thread's last failed call; "" if the last call succeeded. Valid until
 * the next ingot_ call on this thread. Never NULL. */
const char *ingot_last_error(void);

/* Bytes per element of an IngotDType; 0 for a code Ingot does not know. */
size_t ingot_dtype_size(int32_t dtype);

/* ---- Logging ---------------------------------------------------------------------------- */

/* Levels of a log record. */
typedef enum IngotLogLevel {
    INGOT_LOG_ERROR = 1,
    INGOT_LOG_WARNING = 2,
    INGOT_LOG_INFO = 3,
    INGOT_LOG_DEBUG = 4,
    INGOT_LOG_TRACE = 5
} IngotLogLevel;

/* Receives one log record: its level (an IngotLogLevel), the message (valid during the
 * call only) and the `user` pointer given with the callback. It is called on the thread of
 * the ingot_ call that made the record, before that call returns, so it may run on any
 * thread that uses Ingot; it may call ingot_set_log_callback, no other ingot_ function. */
typedef void (*IngotLogCallback)(int32_t level, const char *message, void *user);

/* Sends Ingot's log records to `callback` (Android: __android_log_write; iOS: os_log): where
 * each submodel of a new session runs and why a device was skipped (INGOT_LOG_INFO), a
 * device that failed during a run (INGOT_LOG_WARNING). Every level is delivered; filter in
 * the callback. NULL stops them; none are sent until a callback is set (Ingot never prints).
 * INGOT_INVALID_ARGUMENT where the process already has another Rust `log` logger. */
IngotStatus ingot_set_log_callback(IngotLogCallback callback, void *user);

/* ---- Bundles ---------------------------------------------------------------------------- */

/* Opens the bundle file at `path`. The file is mapped, not read: weights are used in place,
 * and the file must not change while the bundle or a session made from it is alive.
 * INGOT_BUNDLE if it cannot be read or is not valid. */
IngotStatus ingot_bundle_open(const char *path, IngotBundle **out);

/* Opens the bundle stored in the `length` bytes at `offset` of the open file `fd`: a bundle
 * inside a larger file, such as an Android asset stored uncompressed in the APK
 * (AAsset_openFileDescriptor64 gives fd, offset and length). Where `offset` is a multiple of
 * 64 the range is mapped, as ingot_bundle_open maps a file; elsewhere (an APK's assets are
 * aligned to 4 bytes unless it was zipaligned to more) it is read into memory once, and an
 * info record says so. Ingot duplicates `fd`: close yours whenever you like; its file
 * position is not moved. INGOT_BUNDLE where the range lies past the end of the file or holds
 * no valid bundle; INGOT_INVALID_ARGUMENT for a negative fd (and on non-Unix systems). */
IngotStatus ingot_bundle_open_fd(int32_t fd, uint64_t offset, uint64_t length, IngotBundle **out);

/* Opens a bundle from `len` bytes at `data` (an asset, an embedded array). The bytes are
 * copied once, so `data` may be freed as soon as this returns. */
IngotStatus ingot_bundle_from_memory(const void *data, size_t len, IngotBundle **out);

/* Opens a bundle from `len` bytes at `data` without copying them: weights are used where
 * they lie. Lifetime rule: the bytes must stay allocated and unchanged until the bundle AND
 * every session made from it are freed (a session keeps using them after
 * ingot_bundle_free). `data` must start at a multiple of 64 bytes (aligned_alloc(64, ...),
 * posix_memalign, an array declared _Alignas(64)); else INGOT_BUNDLE, with nothing kept. */
IngotStatus ingot_bundle_from_borrowed_memory(const void *data, size_t len, IngotBundle **out);

/* Frees a bundle. Sessions made from it stay valid (they share it). NULL is a no-op. */
void ingot_bundle_free(IngotBundle *bundle);

/* ---- Sessions --------------------------------------------------------------------------- */

/* Makes a session of the bundle's variant `variant` (NULL: the first variant; a
 * single-model bundle has one, "main") on the devices `devices` names, tried in order per
 * submodel: a comma-separated list of "cpu", "vulkan" (the best Vulkan GPU: discrete,
 * integrated, then virtual; never a CPU-type device), "vulkan:N" (by index, any type),
 * "vulkan:cpu" (a CPU-type Vulkan device such as lavapipe, used only where named: Ingot's
 * CPU backend is faster). NULL means the default list, "vulkan,cpu", which runs on the CPU
 * where the only Vulkan devices are CPU-type. A device that cannot run a submodel is skipped
 * (the placement report says why); INGOT_SESSION when no device of the list can. */
IngotStatus ingot_session_new(const IngotBundle *bundle, const char *devices,
                              const char *variant, IngotSession **out);

/* Options for ingot_session_new_with_options: an opaque handle with one setter per option,
 * each returning INGOT_INVALID_ARGUMENT for a NULL handle. */
typedef struct IngotSessionOptions IngotSessionOptions;

/* Makes options with the defaults: the default device list ("vulkan,cpu"), the bundle's first
 * variant, one CPU thread per physical core, spinning on. */
IngotStatus ingot_session_options_new(IngotSessionOptions **out);

/* Frees options. Sessions made with them are not affected. NULL is a no-op. */
void ingot_session_options_free(IngotSessionOptions *options);

/* The devices to try for each submodel, in order, named as for ingot_session_new; NULL: the
 * default list. An unknown name is INGOT_SESSION, and the list stays as it was. */
IngotStatus ingot_session_options_set_devices(IngotSessionOptions *options, const char *devices);

/* The variant to run; NULL: the bundle's first. An unknown name fails in
 * ingot_session_new_with_options (INGOT_SESSION). */
IngotStatus ingot_session_options_set_variant(IngotSessionOptions *options, const char *variant);

/* The threads the CPU backend runs a submodel on, the calling thread included; 0 (the
 * default): one per physical core, fewer where the process may use fewer CPUs. */
IngotStatus ingot_session_options_set_threads(IngotSessionOptions *options, size_t threads);

/* Nonzero (the default): while a CPU submodel runs, idle threads spin a while for work before
 * they sleep (fastest on an otherwise idle device). 0: they sleep at once (kinder to an app's
 * other threads, and faster on a busy device). */
IngotStatus ingot_session_options_set_spin(IngotSessionOptions *options, int32_t spin);

/* A file that keeps the Vulkan pipelines compiled for the device between runs of the app
 * (a path in its cache directory; NULL, the default: none). Read before a submodel's
 * pipelines are made and written after where it changed, so a later start skips compiling
 * kernels. Best effort: a missing, unreadable or foreign file (another device or driver
 * version) is ignored and replaced, a failed write is a warning record; neither fails the
 * session. Use one file per device. */
IngotStatus ingot_session_options_set_pipeline_cache(IngotSessionOptions *options,
                                                     const char *path);

/* Makes a session of `bundle` with `options` (NULL: the defaults). `options` may be changed or
 * freed afterwards. Errors as for ingot_session_new. */
IngotStatus ingot_session_new_with_options(const IngotBundle *bundle,
                                           const IngotSessionOptions *options,
                                           IngotSession **out);

/* Frees a session and its device memory. NULL is a no-op. */
void ingot_session_free(IngotSession *session);

/* The number of inputs and outputs. */
IngotStatus ingot_session_input_count(const IngotSession *session, size_t *count);
IngotStatus ingot_session_output_count(const IngotSession *session, size_t *count);

/* Input or output `index` (0-based, in the model's order). */
IngotStatus ingot_session_input_info(const IngotSession *session, size_t index,
                                     IngotTensorInfo *info);
IngotStatus ingot_session_output_info(const IngotSession *session, size_t index,
                                      IngotTensorInfo *info);

/* Output `index` as the last run wrote it. Where the length along a dim depends on the data
 * (NonMaxSuppression's boxes), ingot_session_output_info gives the upper bound, the size of
 * the buffer to pass, and a run writes the entries it filled at the start of the buffer,
 * densely: this gives their dims and bytes (`dims` valid until the next run). For any other
 * output it equals ingot_session_output_info. */
IngotStatus ingot_session_output_result_info(const IngotSession *session, size_t index,
                                             IngotTensorInfo *info);

/* Runs the session. `inputs[i]` points to `input_bytes[i]` bytes holding input i;
 * `outputs[j]` to `output_bytes[j]` writable bytes for output j. The counts must equal the
 * session's input and output counts and each byte length the tensor's `bytes` exactly
 * (else INGOT_INVALID_ARGUMENT, before anything runs). Buffers need no particular
 * alignment; inputs are copied in, and each output is written whole only when the run
 * succeeds (on failure the output buffers are untouched). An output buffer must not
 * overlap another. A buffer pointer may be NULL only when its length is 0, an array only
 * when its count is 0. */
IngotStatus ingot_session_run(IngotSession *session,
                              const void *const *inputs, const size_t *input_bytes,
                              size_t input_count,
                              void *const *outputs, const size_t *output_bytes,
                              size_t output_count);

/* Runs the session as ingot_session_run does, on the same arguments, but in place: the inputs
 * are read and the outputs written where they lie, with no copy and no tensor memory
 * allocated per run (the call for a per-frame loop). In addition to ingot_session_run's
 * rules: each buffer must be aligned to its element size (malloc's is), and no output may
 * overlap an input or another output (both checked: INGOT_INVALID_ARGUMENT). When the run
 * fails, output buffers may hold part of a result. */
IngotStatus ingot_session_run_into(IngotSession *session,
                                   const void *const *inputs, const size_t *input_bytes,
                                   size_t input_count,
                                   void *const *outputs, const size_t *output_bytes,
                                   size_t output_count);

/* The placement report, as `ingot run` prints it: one line per submodel with the device it
 * runs on, and every device skipped with the stage and the reason. It can change after a
 * run (a submodel whose device failed moves to the next device of the list). Free the
 * string with ingot_string_free. */
IngotStatus ingot_session_placement(const IngotSession *session, char **out);

/* The number of submodels, and the device submodel `index` runs on now ("cpu",
 * "vulkan:0 (llvmpipe ...)"). Free the string with ingot_string_free. */
IngotStatus ingot_session_submodel_count(const IngotSession *session, size_t *count);
IngotStatus ingot_session_submodel_device(const IngotSession *session, size_t index,
                                          char **out);

/* Frees a string an ingot_ function returned as `char *`. NULL is a no-op. */
void ingot_string_free(char *string);

#ifdef __cplusplus
}
#endif

#endif /* INGOT_H */
