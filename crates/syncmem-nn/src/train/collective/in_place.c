/* MPI_IN_PLACE for the in-place all-reduce of collective/mpi.rs: a macro of mpi.h whose value
 * differs between MPI libraries (Open MPI, MPICH), so it is taken from the library's header at
 * build time (build.rs) instead of being written down in Rust. */
#include <mpi.h>

void *const syncmem_mpi_in_place = MPI_IN_PLACE;
