//! The `myjob` binary: everything lives in the library, see `cli::main`.

fn main() -> std::process::ExitCode {
    myjob::cli::main()
}
