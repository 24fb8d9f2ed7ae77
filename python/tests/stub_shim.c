/* A stand-in for libslo_probe_cupti.so with the same ABI; it only logs its calls.
 * The tests build it when a C compiler is present, to check the ctypes declarations against a
 * real shared object. stub_log() returns the log; stub_set_rc() sets release/reacquire results.
 * Including the shim's header makes the compiler check every signature below against it
 * (cupti-shim/tests/c_header.rs checks that every declared function is defined). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "../../cupti-shim/include/slo_probe_shim.h"

#ifndef STUB_VERSION
#define STUB_VERSION 1
#endif

static char log_buf[65536];
static size_t log_len;
static int32_t release_rc, reacquire_rc;
static uint32_t status_bits = 1; /* tracing */
static uint32_t next_id = 1;

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(log_buf + log_len, sizeof log_buf - log_len, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof log_buf - log_len) log_len += (size_t)n;
}

const char *stub_log(void) { return log_buf; }
void stub_set_rc(int32_t release, int32_t reacquire) { release_rc = release; reacquire_rc = reacquire; }

int32_t slo_probe_shim_version(void) { return STUB_VERSION; }
void slo_probe_step_begin(uint64_t step) { say("begin %llu;", (unsigned long long)step); }
void slo_probe_step_end(uint64_t step) { say("end %llu;", (unsigned long long)step); }
uint32_t slo_probe_intern_op(const char *name) { say("intern %s;", name); return next_id++; }
void slo_probe_op_push(uint32_t id) { say("push %u;", id); }
void slo_probe_op_pop(void) { say("pop;"); }
int32_t slo_probe_cupti_release(void) {
    say("release;");
    if (release_rc == 0) status_bits = 16; /* released */
    return release_rc;
}
int32_t slo_probe_cupti_reacquire(void) {
    say("reacquire;");
    if (reacquire_rc == 0) status_bits = 1;
    return reacquire_rc;
}
uint32_t slo_probe_status(void) { return status_bits; }
void slo_probe_request_diagnostic(uint32_t steps) { say("diagnostic %u;", steps); }
static uint64_t depth_word = 0x0000007800050100ull; /* depth 0, reason sample, window 5, period 120 */
int32_t slo_probe_request_depth(uint32_t depth, uint32_t steps) {
    say("depth %u %u;", depth, steps);
    if (depth > 2) return -1;
    depth_word = (depth_word & ~0xffffull) | depth | (depth ? 3u << 8 : 0); /* reason script */
    return 0;
}
uint64_t slo_probe_depth(void) { return depth_word; }
size_t slo_probe_debug_counters(uint64_t *out, size_t n) {
    for (size_t i = 0; i < n && i < 2; i++) out[i] = i + 1;
    return 2;
}
void slo_probe_flush(void) { say("flush;"); }
int32_t InitializeInjection(void) { return 1; }
