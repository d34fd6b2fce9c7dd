//! With the `mpi` feature: compiles `src/train/collective/in_place.c`, which exports the MPI
//! library's `MPI_IN_PLACE` (a macro whose value differs between MPI libraries) to the in-place
//! all-reduce of `train::collective::mpi`. Finds the library as the `mpi` crate does.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "mpi")]
    in_place();
}

#[cfg(feature = "mpi")]
fn in_place() {
    const SOURCE: &str = "src/train/collective/in_place.c";
    println!("cargo:rerun-if-changed={SOURCE}");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errors) => {
            let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
            panic!(
                "feature `mpi`: no MPI library found (scripts/setup.sh --with-mpi installs \
                 one): {}",
                reasons.join("; ")
            );
        }
    };
    let mut build = cc::Build::new();
    build.file(SOURCE);
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for dir in &lib.include_paths {
                build.include(dir);
            }
        }
    }
    build.compile("syncmem_mpi_in_place");
}
