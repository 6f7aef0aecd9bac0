/* test_mpi_pieces.c - test_mpi_comm.c with messages split into pieces of 1000 bytes (the
   real limit is 1 GiB, for MPI's int counts): the same bits when one block travels as
   many messages, pieces not a multiple of the element size included. Its packets go
   through MPI (ZERO_MPI_SHM 0), so that transport runs too: test_mpi_comm's go through
   shared memory where the node allows it. */
#define ZERO_MPI_PIECE_BYTES 1000
#define ZERO_MPI_SHM 0
#include "tests/mpi/test_mpi_comm.c"
