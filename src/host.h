/* Host device declarations (section of zero.h): zero_device_ops on the CPU.

   Every op runs synchronously on the calling thread (or on 'threads' workers it joins
   before returning), so queues are only names: events are real objects, record / wait /
   sync return ZERO_OK at once, native_queue() is NULL, and reserve is NULL (no arena). Memory comes
   from the allocator, 64-byte aligned; the device keeps a table of its live allocations,
   so freeing a pointer it did not allocate returns ZERO_ERROR_INVALID_ARGUMENT instead of
   crashing. Every op validates its arguments (NULL with numel > 0, unknown dtype, queue
   out of range) and returns an error rather than crash. The device is safe to use from
   several threads at once (allocation is locked; kernels share no state).

   Kernels (docs/backends.md): add, scale and cast compute in fp32 (fp64 for F64) and round
   once to the dtype, to nearest even; sumsq adds the squares in fp64 in an order fixed by
   numel alone (8 lanes over i mod 8 within blocks of ZERO_HOST_SUMSQ_BLOCK elements, the
   lanes combined in a fixed tree, the blocks in order), so its bits do not depend on the
   SIMD path or the thread count. */

/* Elements per block of sumsq; part of the definition of its result. */
#define ZERO_HOST_SUMSQ_BLOCK 65536

typedef struct zero_host_device_desc {
    zero_allocator allocator; /* all NULL = ZERO_MALLOC / ZERO_FREE                    */
    zero_simd simd;           /* AUTO = the best the CPU has; others must be supported */
    int threads;              /* worker threads for large kernels; 0 or 1 = the caller */
} zero_host_device_desc;

/* A new host device. desc NULL = defaults. INVALID_ARGUMENT: threads < 0;
   UNSUPPORTED: a simd path this CPU or build lacks. */
ZERODEF zero_result zero_host_device_create(const zero_host_device_desc *desc, zero_device **out);

/* Any backend's device: dev->ops->destroy(dev). NULL is ignored. The host device frees
   allocations still live at that point. */
ZERODEF void zero_device_destroy(zero_device *dev);

/* What a host device holds now: bytes requested per category (bytes[ZERO_MEM_COUNT], may be
   NULL) and the number of live allocations (may be NULL). INVALID_ARGUMENT when dev is not a
   host device. */
ZERODEF zero_result zero_host_device_stats(zero_device *dev, size_t *bytes, size_t *allocations);
