/* slo_probe_shim.h: the C ABI of libslo_probe_cupti.so, the CUPTI shim of slo-probe.
 *
 * The one description of the shim's exported functions. The shim (cupti-shim/src/lib.rs), the
 * python client's ctypes table (python/slo_probe/__init__.py: _ABI and _OPTIONAL_ABI) and the
 * test stub (python/tests/stub_shim.c) must match it; cupti-shim/tests/c_header.rs checks all
 * three on every `cargo test`. One declaration per line, each with a one-line comment.
 *
 * Every function is safe to call from any thread at any time, also before CUDA is initialised
 * and in a forked child (where it does nothing). Only slo_probe_cupti_release,
 * slo_probe_cupti_reacquire and slo_probe_flush block (they flush CUPTI); nothing else takes a
 * lock that a CUDA thread could wait on. ABI version 1.
 */
#ifndef SLO_PROBE_SHIM_H
#define SLO_PROBE_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called by the CUDA driver once, during cuInit, when CUDA_INJECTION64_PATH names the shim; 1 = ok. */
int32_t InitializeInjection(void);

/* ABI version of the slo_probe_* functions (1). */
int32_t slo_probe_shim_version(void);
/* Marks the start of training iteration `step`. */
void slo_probe_step_begin(uint64_t step);
/* Marks the end of training iteration `step`. */
void slo_probe_step_end(uint64_t step);
/* Id (> 0) of operator `name` (UTF-8, NUL-terminated), created on first use; 0 on failure. */
uint32_t slo_probe_intern_op(const char *name);
/* Pushes operator `id` on the calling thread's operator stack (its launches go to the top op). */
void slo_probe_op_push(uint32_t id);
/* Pops the calling thread's operator stack (no effect when empty). */
void slo_probe_op_pop(void);
/* Hands CUPTI to another tool (torch.profiler): flushes and unsubscribes; 0 on success. Blocks. */
int32_t slo_probe_cupti_release(void);
/* Takes CUPTI back after slo_probe_cupti_release; 0 on success. Blocks. */
int32_t slo_probe_cupti_reacquire(void);
/* The shim's STATUS_* bits (common/src/ring.rs): 1 tracing, 2 connected, 4 lost race, 8 diagnostic, 16 released, 32 kernels. */
uint32_t slo_probe_status(void);
/* Asks for node-level CUDA-graph tracing (depth 2) during the next `steps` iterations. */
void slo_probe_request_diagnostic(uint32_t steps);
/* Asks for depth 0 timing / 1 kernels / 2 nodes for `steps` iterations (0: until the next request); 0 ok, -1 bad depth. */
int32_t slo_probe_request_depth(uint32_t depth, uint32_t steps);
/* Depth word: depth bits 0-7 (0xff off), reason 8-15, window 16-31, period 32-62, bit 63 = ms (ring.rs decode_shim_depth). */
uint64_t slo_probe_depth(void);
/* Copies up to `n` debug counters into `out`; returns how many exist. */
size_t slo_probe_debug_counters(uint64_t *out, size_t n);
/* Flushes CUPTI's buffers and the shim's queue into the ring (scripts and tests). Blocks. */
void slo_probe_flush(void);

#ifdef __cplusplus
}
#endif

#endif /* SLO_PROBE_SHIM_H */
