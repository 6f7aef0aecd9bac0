/* zt_mpi.h - zt.h for programs run under mpirun: every rank runs every test; a test fails
   when it failed on any rank; only rank 0 prints the "ok"/"FAIL" lines and the summary
   line (so tests/run.sh counts each program once, whatever the number of processes). */
#ifndef ZT_MPI_H
#define ZT_MPI_H
#include <mpi.h>
#include "tests/zt.h"

static int zm_rank, zm_world;

static inline void zm_init(int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &zm_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &zm_world);
}

#define ZM_RUN(fn)                                                                           \
    do {                                                                                     \
        int zm_f_, zm_s_, zm_all_f_ = 0, zm_all_s_ = 0;                                      \
        zt_cur_name = #fn;                                                                   \
        zt_cur_failures = 0;                                                                 \
        zt_cur_skipped = 0;                                                                  \
        fn();                                                                                \
        zm_f_ = zt_cur_failures;                                                             \
        zm_s_ = zt_cur_skipped;                                                              \
        MPI_Allreduce(&zm_f_, &zm_all_f_, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);              \
        MPI_Allreduce(&zm_s_, &zm_all_s_, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);              \
        if (zm_all_f_) {                                                                     \
            zt_failed++;                                                                     \
            if (zm_rank == 0) printf("FAIL %s (np %d)\n", #fn, zm_world);                    \
        } else if (zm_all_s_) {                                                              \
            zt_skipped++;                                                                    \
        } else {                                                                             \
            zt_passed++;                                                                     \
            if (zm_rank == 0) printf("ok   %s (np %d)\n", #fn, zm_world);                    \
        }                                                                                    \
        fflush(stdout);                                                                      \
        fflush(stderr);                                                                      \
    } while (0)

/* Rank 0 prints the summary line; returns the exit code (MPI finalised). */
static inline int zm_summary(void)
{
    fflush(stderr);
    if (zm_rank == 0) printf("zt: %d passed, %d failed, %d skipped\n", zt_passed, zt_failed, zt_skipped);
    fflush(stdout);
    MPI_Finalize();
    return zt_failed ? 1 : 0;
}
#endif
