/* fuzz_manifest.c — libFuzzer target: a container's manifest.json as it is
 * opened by the public API (container.c's validation, kimi_manifest.c's K3
 * fields, the memory plan, the engine and verify).
 *
 *   FERRY_FUZZ_CONTAINERS=DIR[:DIR...] fuzz_manifest [libFuzzer options]
 *
 * At start-up each DIR (a real tiny container: its trunk.bin and expert banks)
 * is mirrored into a scratch directory without its manifest. Each input is
 * written there as manifest.json and opened in every mirror: the memory plan,
 * the engine (and, when it opens, a one-token evaluation) and, when the engine
 * opened, a full verify. Every refusal must name itself with a code and a
 * message; anything else — a crash, a sanitizer report, a leak, a hang — is a
 * finding. */
#include "fuzz_util.h"

#include "../include/ferry.h"

#define MAX_CONTAINERS 4

static char scratch[MAX_CONTAINERS][4096];
static int n_scratch;

static void cleanup(void) {
    for (int i = 0; i < n_scratch; i++) fz_remove_tree(scratch[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char dir[4096];
    for (int i = 0; i < MAX_CONTAINERS && fz_env_item("FERRY_FUZZ_CONTAINERS", i, dir, sizeof dir); i++) {
        fz_scratch(scratch[n_scratch], sizeof scratch[n_scratch]);
        fz_mirror(dir, scratch[n_scratch], "", NULL, 1);
        n_scratch++;
    }
    if (n_scratch == 0) {
        fprintf(stderr, "fuzz_manifest: set FERRY_FUZZ_CONTAINERS to one or more tiny containers\n");
        exit(2);
    }
    atexit(cleanup);
    return 0;
}

static void require_error(ferry_status s, const ferry_error *err) {
    if (s != FERRY_OK && (err->code != (int)s || err->message[0] == '\0')) {
        fprintf(stderr, "fuzz_manifest: status %d came with code %d and message '%s'\n", s, err->code,
                err->message);
        abort();
    }
}

static void open_one(const char *dir) {
    ferry_error err;
    ferry_memory_plan plan;
    ferry_status s = ferry_container_plan(dir, 16, 1, &plan, &err);
    require_error(s, &err);
    ferry_open_options opts;
    ferry_open_options_init(&opts);
    opts.n_threads = 1;
    opts.n_readers = 1;
    opts.n_ctx = 8;
    opts.verify_reads = 1;
    ferry_engine *e = NULL;
    s = ferry_engine_open(dir, &opts, &e, &err);
    require_error(s, &err);
    if (s != FERRY_OK) {
        if (e) { fprintf(stderr, "fuzz_manifest: a failed open returned an engine\n"); abort(); }
        return;
    }
    ferry_model_info info;
    ferry_engine_info(e, &info);
    ferry_session *ses = NULL;
    s = ferry_session_new(e, 8, &ses, &err);
    require_error(s, &err);
    if (s == FERRY_OK) {
        int32_t tok[2] = {info.vocab > 3 ? 3 : 0, info.vocab - 1};
        require_error(ferry_session_eval(ses, tok, 2, NULL, 0, &err), &err);
        ferry_session_free(ses);
    }
    ferry_engine_close(e);
    require_error(ferry_verify(dir, NULL, NULL, &err), &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int i = 0; i < n_scratch; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/manifest.json", scratch[i]);
        fz_write_file(path, data, size);
        open_one(scratch[i]);
    }
    return 0;
}
