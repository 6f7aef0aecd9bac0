/* cudasim.h - the harness's internal API (C++17), for the simulations built on the runtime
   (nccl.h, cublas_v2.h) and for the harness's own tests. Not part of CUDA's API.

   The runtime itself is tests/cudasim/cudasim.cpp; tests/cudasim/README.md describes the
   model. This interface is kept stable: a change is written down in README.md. */
#ifndef CUDASIM_H
#define CUDASIM_H

#include <cuda_runtime.h>

#include <functional>
#include <stddef.h>
#include <string>

namespace cudasim {

/* The calling host thread's device (cudaSetDevice), or, on a stream's worker thread while it
   runs an op, the stream's device. */
int current_device();

/* Queues fn on stream s (0 = the legacy stream, cudaStreamLegacy, cudaStreamPerThread:
   resolved as CUDA does, for the current device). fn runs later on the stream's worker,
   after all work queued on s before it (and, for the legacy stream and blocking streams,
   the implicit legacy-stream ordering) and after any cudaStreamWaitEvent before it. A
   non-success return becomes the stream's (and device's) sticky error, as an asynchronous
   fault would; 'what' names the op in that message. Returns an error (and sets the last
   error) only when s is invalid or the device already has a sticky error. */
cudaError_t enqueue(cudaStream_t s, const char *what, std::function<cudaError_t()> fn);

/* True if [p, p + bytes) is readable and writable by a kernel or an asynchronous copy on
   'device': inside one allocation of that device (cudaMalloc), or inside pinned host memory
   (cudaHostAlloc / cudaMallocHost). Otherwise records an error (fail(), code
   cudaErrorIllegalAddress) naming 'who' (the kernel or call) and 'arg' and returns false.
   bytes = 0 checks only that p is inside (or one past the end of) such memory. */
bool check_access(int device, const void *p, size_t bytes, const char *who, const char *arg);

/* The device whose cudaMalloc holds p, or -1 (host memory, pinned or not, or unknown). */
int device_of(const void *p);

/* Records error e with a message (printf-style): the calling thread's last error (what
   cudaGetLastError returns), cudaGetErrorString(e) then ends with the message, and the
   message is printed to stderr as "cudasim: ..." (unless CUDASIM_QUIET=1). On a stream
   worker running an op, e also becomes that stream's sticky error. */
void fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The device of stream s (0, cudaStreamLegacy, cudaStreamPerThread: the current device's),
   or -1 (with the error recorded) when s is not a live stream. */
int stream_device(cudaStream_t s);

/* ---- for tests and the other simulations ---- */

/* The last message fail() recorded in this process ("" when none). */
std::string last_message();

/* Number of simulated devices (CUDASIM_DEVICES, default 4). */
int device_count();

/* Waits until every stream of every device has run all its queued work (no error check). */
void drain_all();

} // namespace cudasim

#endif
