/* test_mpi_pieces.c - test_mpi_comm.c with messages split into pieces of 1000 bytes (the
   real limit is 1 GiB, for MPI's int counts): the same bits when one block travels as
   many messages, pieces not a multiple of the element size included. */
#define ZERO_MPI_PIECE_BYTES 1000
#include "tests/mpi/test_mpi_comm.c"
