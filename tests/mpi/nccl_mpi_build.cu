/* nccl_mpi_build.cu - compile-only check (make mpi, where nvcc is present): zero_mpi.h with
   the CUDA device and the NCCL comm in one nvcc translation unit. Under mpirun on GPUs it
   would: take NCCL's unique id through MPI (zero_mpi_nccl_unique_id, no TCP bootstrap),
   create the NCCL comm, and create an MPI comm over device memory where the MPI library
   is CUDA-aware (zero_mpi_cuda_aware), then all-reduce one buffer over each. Not run in CI
   (no GPU); see docs/mpi.md. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#define ZERO_NCCL_IMPLEMENTATION
#define ZERO_MPI_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "zero_nccl.h"
#include "zero_mpi.h"

#include <stdio.h>

#define TRY(call)                                                                            \
    do {                                                                                     \
        r = (call);                                                                          \
        if (r != ZERO_OK) goto done;                                                         \
    } while (0)

int main(int argc, char **argv)
{
    unsigned char id[ZERO_NCCL_ID_BYTES];
    zero_nccl_desc nd;
    zero_mpi_desc md;
    zero_cuda_desc cd;
    zero_device *dev = NULL;
    zero_comm *nccl = NULL, *mpi = NULL;
    zero_result r = ZERO_OK;
    int rank = 0, world = 1;
    void *buf = NULL;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    memset(&cd, 0, sizeof cd);
    TRY(zero_cuda_device_create(&cd, &dev));
    TRY(zero_mpi_nccl_unique_id(MPI_COMM_WORLD, 0, id, 0));
    memset(&nd, 0, sizeof nd);
    nd.unique_id = id;
    nd.rank = rank;
    nd.world = world;
    TRY(zero_nccl_create(&nd, &nccl));
    TRY(dev->ops->alloc(dev, 1024 * sizeof(float), ZERO_MEM_SCRATCH, &buf));
    TRY(dev->ops->fill_zero(dev, ZERO_QUEUE_COMM, buf, 1024 * sizeof(float)));
    TRY(nccl->ops->all_reduce(nccl, buf, buf, 1024, ZERO_F32, ZERO_OP_SUM,
                              dev->ops->native_queue(dev, ZERO_QUEUE_COMM)));
    TRY(dev->ops->sync(dev, ZERO_QUEUE_COMM));
    if (zero_mpi_cuda_aware()) {
        memset(&md, 0, sizeof md);
        md.device = dev;
        TRY(zero_mpi_create(&md, &mpi));
        TRY(mpi->ops->all_reduce(mpi, buf, buf, 1024, ZERO_F32, ZERO_OP_SUM, NULL));
    } else if (rank == 0) {
        printf("MPI is not CUDA-aware: device-memory MPI comm not tried\n");
    }
done:
    if (r != ZERO_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, zero_result_string(r), zero_last_error());
    zero_comm_destroy(mpi);
    zero_comm_destroy(nccl);
    if (buf) dev->ops->free(dev, buf);
    zero_device_destroy(dev);
    MPI_Finalize();
    return r == ZERO_OK ? 0 : 1;
}
