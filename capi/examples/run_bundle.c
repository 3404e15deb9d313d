/*
 * run_bundle: runs a compiled Ingot bundle through the C API (include/ingot.h).
 *
 *   run_bundle [--devices LIST] [--variant NAME] [--threads N] [--pipeline-cache FILE]
 *              [--from-memory | --from-fd] BUNDLE OUT_DIR INPUT.npy...
 *
 * Opens the bundle (mapped; read into memory first with --from-memory; through an open file
 * descriptor, as an Android app opens an asset, with --from-fd), makes a session with options
 * (devices LIST, default the library's vulkan,cpu; N CPU threads, default one per core;
 * Vulkan pipelines kept in FILE between runs),
 * prints the placement report and the inputs and outputs, reads input i from the i-th .npy
 * file (little-endian, C order, the dtype and shape the bundle declares), runs twice in place
 * (ingot_session_run_into: once on this thread, once on a worker thread, as an app's
 * inference thread would), checks both runs agree, and writes output i to
 * OUT_DIR/output_<i>.npy.
 * capi/run_example.sh builds it and runs it on a PP-OCR model.
 */
/* open, fstat, close and pthreads beside -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "ingot.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The .npy type string of each IngotDType. */
static const struct {
    int32_t dtype;
    const char *descr;
} DESCRS[] = {
    {INGOT_DTYPE_F32, "<f4"}, {INGOT_DTYPE_U8, "|u1"},  {INGOT_DTYPE_I8, "|i1"},
    {INGOT_DTYPE_U16, "<u2"}, {INGOT_DTYPE_I16, "<i2"}, {INGOT_DTYPE_I32, "<i4"},
    {INGOT_DTYPE_I64, "<i8"}, {INGOT_DTYPE_BOOL, "|b1"}, {INGOT_DTYPE_F16, "<f2"},
    {INGOT_DTYPE_F64, "<f8"}, {INGOT_DTYPE_U32, "<u4"}, {INGOT_DTYPE_U64, "<u8"},
};

static const char *descr_of(int32_t dtype) {
    for (size_t i = 0; i < sizeof DESCRS / sizeof DESCRS[0]; i++) {
        if (DESCRS[i].dtype == dtype) return DESCRS[i].descr;
    }
    return "?";
}

/* Reads the whole file at `path` into a malloc'd buffer; NULL (with a message) on failure. */
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    long size;
    if (!f || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(data = malloc(size > 0 ? (size_t)size : 1)) || fread(data, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "run_bundle: cannot read %s\n", path);
        free(data);
        data = NULL;
    } else {
        *len = (size_t)size;
    }
    if (f) fclose(f);
    return data;
}

/* The value after `'key':` in a .npy header dict, or NULL. */
static const char *npy_field(const char *header, const char *key) {
    const char *at = strstr(header, key);
    if (!at) return NULL;
    at += strlen(key);
    while (*at == ' ') at++;
    return at;
}

/* Reads a .npy file that must hold exactly the tensor `info` describes. Returns its data
 * (malloc'd), or NULL with a message. */
static void *read_npy(const char *path, const IngotTensorInfo *info) {
    size_t len = 0, offset, header_len, rank = 0;
    unsigned char *file = read_file(path, &len);
    char header[4096], expected[8];
    void *data = NULL;
    if (!file) return NULL;
    if (len < 12 || memcmp(file, "\x93NUMPY", 6) != 0) goto bad;
    if (file[6] == 1) { /* version 1: u16 header length; 2 and 3: u32 */
        header_len = file[8] | (size_t)file[9] << 8;
        offset = 10;
    } else {
        header_len = file[8] | (size_t)file[9] << 8 | (size_t)file[10] << 16 | (size_t)file[11] << 24;
        offset = 12;
    }
    if (header_len >= sizeof header || offset + header_len > len) goto bad;
    memcpy(header, file + offset, header_len);
    header[header_len] = '\0';
    offset += header_len;

    snprintf(expected, sizeof expected, "'%s'", descr_of(info->dtype));
    const char *descr = npy_field(header, "'descr':");
    const char *order = npy_field(header, "'fortran_order':");
    const char *shape = npy_field(header, "'shape':");
    if (!descr || strncmp(descr, expected, strlen(expected)) != 0) {
        fprintf(stderr, "run_bundle: %s: the input needs dtype %s\n", path, expected);
        goto fail;
    }
    if (!order || strncmp(order, "False", 5) != 0 || !shape || *shape != '(') goto bad;
    for (const char *p = shape + 1; *p != ')';) {
        char *end;
        unsigned long long dim = strtoull(p, &end, 10);
        if (end == p) goto bad;
        if (rank >= info->rank || dim != info->dims[rank]) {
            fprintf(stderr, "run_bundle: %s: shape %.*s does not match the input's\n", path,
                    (int)(strchr(shape, ')') ? strchr(shape, ')') - shape + 1 : 1), shape);
            goto fail;
        }
        rank++;
        for (p = end; *p == ',' || *p == ' ';) p++;
    }
    if (rank != info->rank || len - offset != info->bytes) {
        fprintf(stderr, "run_bundle: %s does not match the input's shape\n", path);
        goto fail;
    }
    data = malloc(info->bytes ? info->bytes : 1);
    if (data) memcpy(data, file + offset, info->bytes);
    free(file);
    return data;
bad:
    fprintf(stderr, "run_bundle: %s is not a little-endian, C-order .npy file\n", path);
fail:
    free(file);
    return NULL;
}

/* Writes `info`'s tensor from `data` to a .npy file (version 1.0). Returns 0 on success. */
static int write_npy(const char *path, const IngotTensorInfo *info, const void *data) {
    char shape[512] = "", header[1024];
    size_t used = 0;
    for (size_t i = 0; i < info->rank && used < sizeof shape; i++) {
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%zu", i ? ", " : "",
                                 info->dims[i]);
    }
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }",
                     descr_of(info->dtype), shape, info->rank == 1 ? "," : "");
    if (n < 0 || used >= sizeof shape) return -1;
    /* Pad with spaces and a newline so that the data starts on a 64-byte boundary. */
    size_t header_len = (size_t)n + 1;
    header_len += (64 - (10 + header_len) % 64) % 64;
    if (header_len >= sizeof header) return -1;
    memset(header + n, ' ', header_len - (size_t)n - 1);
    header[header_len - 1] = '\n';
    unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                  (unsigned char)(header_len & 0xff), (unsigned char)(header_len >> 8)};
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(preamble, 1, 10, f) == 10 && fwrite(header, 1, header_len, f) == header_len &&
             fwrite(data, 1, info->bytes, f) == info->bytes;
    if (f && fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}

static void print_info(const char *kind, const IngotTensorInfo *info) {
    printf("%s %s: %s [", kind, info->name, descr_of(info->dtype));
    for (size_t d = 0; d < info->rank; d++) printf("%s%zu", d ? ", " : "", info->dims[d]);
    printf("] (%zu bytes, %zu per element)\n", info->bytes, ingot_dtype_size(info->dtype));
}

/* Ingot's log records, to stderr (an Android app would call __android_log_write here). The
 * placement they report is also printed below, from ingot_session_placement. */
static void log_to_stderr(int32_t level, const char *message, void *user) {
    static const char *const names[] = {"?", "error", "warning", "info", "debug", "trace"};
    fprintf(stderr, "%s: %s: %s\n", (const char *)user,
            names[level >= 1 && level <= 5 ? level : 0], message);
}

/* One run in place, as a thread body: the session may run on any thread, one call at a time. */
typedef struct {
    IngotSession *session;
    void **inputs, **outputs;
    size_t *input_bytes, *output_bytes, n_inputs, n_outputs;
    IngotStatus status;
    char error[512];
} Run;

static void *run_into(void *arg) {
    Run *run = arg;
    run->status = ingot_session_run_into(run->session, (const void *const *)run->inputs,
                                         run->input_bytes, run->n_inputs, run->outputs,
                                         run->output_bytes, run->n_outputs);
    /* ingot_last_error is per thread: keep this thread's message. */
    snprintf(run->error, sizeof run->error, "%s", ingot_last_error());
    return NULL;
}

/* Prints what failed and the library's message, and jumps to the cleanup. */
#define CHECK(call, what)                                                            \
    do {                                                                             \
        if ((call) != INGOT_OK) {                                                    \
            fprintf(stderr, "run_bundle: %s: %s\n", (what), ingot_last_error());     \
            goto done;                                                               \
        }                                                                            \
    } while (0)

int main(int argc, char **argv) {
    const char *devices = NULL, *variant = NULL, *bundle_path = NULL, *out_dir = NULL;
    const char *pipeline_cache = NULL;
    int from_memory = 0, from_fd = 0, first_input = argc, status = 1;
    size_t threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc) {
            devices = argv[++i];
        } else if (strcmp(argv[i], "--variant") == 0 && i + 1 < argc) {
            variant = argv[++i];
        } else if (strcmp(argv[i], "--pipeline-cache") == 0 && i + 1 < argc) {
            pipeline_cache = argv[++i];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--from-memory") == 0) {
            from_memory = 1;
        } else if (strcmp(argv[i], "--from-fd") == 0) {
            from_fd = 1;
        } else if (!bundle_path) {
            bundle_path = argv[i];
        } else if (!out_dir) {
            out_dir = argv[i];
        } else {
            first_input = i;
            break;
        }
    }
    if (!bundle_path || !out_dir) {
        fprintf(stderr, "usage: run_bundle [--devices LIST] [--variant NAME] [--threads N] "
                        "[--pipeline-cache FILE] [--from-memory | --from-fd] BUNDLE OUT_DIR "
                        "INPUT.npy...\n");
        return 2;
    }

    IngotBundle *bundle = NULL;
    IngotSessionOptions *options = NULL;
    IngotSession *session = NULL;
    char *text = NULL;
    size_t n_inputs = 0, n_outputs = 0, n_submodels = 0;
    IngotTensorInfo *inputs = NULL, *outputs = NULL;
    void **input_data = NULL, **output_data = NULL, **worker_data = NULL;
    size_t *input_bytes = NULL, *output_bytes = NULL;

    printf("ingot %s\n", ingot_version());
    CHECK(ingot_set_log_callback(log_to_stderr, "run_bundle"), "log callback");
    if (from_memory) {
        /* E.g. an asset or an embedded array; the library copies it, so it is freed at once. */
        size_t len = 0;
        unsigned char *bytes = read_file(bundle_path, &len);
        if (!bytes) goto done;
        IngotStatus opened = ingot_bundle_from_memory(bytes, len, &bundle);
        free(bytes);
        CHECK(opened, bundle_path);
    } else if (from_fd) {
        /* An Android app gets (fd, offset, length) from AAsset_openFileDescriptor64; here the
         * bundle is the whole file. Ingot keeps its own duplicate, so ours is closed at once. */
        int fd = open(bundle_path, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            fprintf(stderr, "run_bundle: cannot open %s\n", bundle_path);
            if (fd >= 0) close(fd);
            goto done;
        }
        IngotStatus opened = ingot_bundle_open_fd(fd, 0, (uint64_t)st.st_size, &bundle);
        close(fd);
        CHECK(opened, bundle_path);
    } else {
        CHECK(ingot_bundle_open(bundle_path, &bundle), bundle_path);
    }
    CHECK(ingot_session_options_new(&options), "options");
    CHECK(ingot_session_options_set_devices(options, devices), "devices");
    CHECK(ingot_session_options_set_variant(options, variant), "variant");
    CHECK(ingot_session_options_set_threads(options, threads), "threads");
    CHECK(ingot_session_options_set_pipeline_cache(options, pipeline_cache), "pipeline cache");
    CHECK(ingot_session_new_with_options(bundle, options, &session), "session");
    ingot_session_options_free(options);
    options = NULL;
    ingot_bundle_free(bundle); /* the session keeps what it needs */
    bundle = NULL;

    CHECK(ingot_session_placement(session, &text), "placement");
    fputs(text, stdout);
    ingot_string_free(text);
    text = NULL;
    CHECK(ingot_session_submodel_count(session, &n_submodels), "submodels");
    for (size_t k = 0; k < n_submodels; k++) {
        CHECK(ingot_session_submodel_device(session, k, &text), "submodel device");
        printf("submodel %zu runs on %s\n", k, text);
        ingot_string_free(text);
        text = NULL;
    }

    CHECK(ingot_session_input_count(session, &n_inputs), "inputs");
    CHECK(ingot_session_output_count(session, &n_outputs), "outputs");
    if ((size_t)(argc - first_input) != n_inputs) {
        fprintf(stderr, "run_bundle: the bundle takes %zu inputs, %d given\n", n_inputs,
                argc - first_input);
        goto done;
    }
    inputs = calloc(n_inputs + 1, sizeof *inputs);
    input_data = calloc(n_inputs + 1, sizeof *input_data);
    input_bytes = calloc(n_inputs + 1, sizeof *input_bytes);
    outputs = calloc(n_outputs + 1, sizeof *outputs);
    output_data = calloc(n_outputs + 1, sizeof *output_data);
    worker_data = calloc(n_outputs + 1, sizeof *worker_data);
    output_bytes = calloc(n_outputs + 1, sizeof *output_bytes);
    if (!inputs || !input_data || !input_bytes || !outputs || !output_data || !worker_data ||
        !output_bytes)
        goto done;
    for (size_t i = 0; i < n_inputs; i++) {
        CHECK(ingot_session_input_info(session, i, &inputs[i]), "input info");
        print_info("input", &inputs[i]);
        input_data[i] = read_npy(argv[first_input + (int)i], &inputs[i]);
        input_bytes[i] = inputs[i].bytes;
        if (!input_data[i]) goto done;
    }
    for (size_t j = 0; j < n_outputs; j++) {
        CHECK(ingot_session_output_info(session, j, &outputs[j]), "output info");
        print_info("output", &outputs[j]);
        /* malloc's alignment suits every element type, as run_into needs. */
        output_data[j] = malloc(outputs[j].bytes ? outputs[j].bytes : 1);
        worker_data[j] = malloc(outputs[j].bytes ? outputs[j].bytes : 1);
        output_bytes[j] = outputs[j].bytes;
        if (!output_data[j] || !worker_data[j]) goto done;
    }

    /* Once here, once on a worker thread; the session is used by one thread at a time. */
    Run here = {session, input_data, output_data, input_bytes, output_bytes, n_inputs, n_outputs,
                INGOT_OK, ""};
    Run worker = here;
    worker.outputs = worker_data;
    pthread_t thread;
    run_into(&here);
    if (here.status != INGOT_OK) {
        fprintf(stderr, "run_bundle: run: %s\n", here.error);
        goto done;
    }
    if (pthread_create(&thread, NULL, run_into, &worker) != 0 || pthread_join(thread, NULL) != 0) {
        fprintf(stderr, "run_bundle: cannot run a worker thread\n");
        goto done;
    }
    if (worker.status != INGOT_OK) {
        fprintf(stderr, "run_bundle: run on a worker thread: %s\n", worker.error);
        goto done;
    }
    for (size_t j = 0; j < n_outputs; j++) {
        if (memcmp(output_data[j], worker_data[j], output_bytes[j]) != 0) {
            fprintf(stderr, "run_bundle: output %zu differs between the two runs\n", j);
            goto done;
        }
    }
    printf("ran twice in place (this thread, then a worker): the outputs agree\n");
    for (size_t j = 0; j < n_outputs; j++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/output_%zu.npy", out_dir, j);
        if (write_npy(path, &outputs[j], output_data[j]) != 0) {
            fprintf(stderr, "run_bundle: cannot write %s\n", path);
            goto done;
        }
        printf("wrote %s\n", path);
    }
    status = 0;

done:
    for (size_t i = 0; input_data && i < n_inputs; i++) free(input_data[i]);
    for (size_t j = 0; output_data && j < n_outputs; j++) free(output_data[j]);
    for (size_t j = 0; worker_data && j < n_outputs; j++) free(worker_data[j]);
    free(worker_data);
    free(inputs);
    free(input_data);
    free(input_bytes);
    free(outputs);
    free(output_data);
    free(output_bytes);
    ingot_string_free(text);
    ingot_session_free(session);
    ingot_session_options_free(options);
    ingot_bundle_free(bundle);
    return status;
}
